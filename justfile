# Conveniences on top of plain cargo; `cargo test` and `cargo run -- lab ...` work without just.

default:
    @just --list

# Run the whole test suite (the same command as CI)
test:
    cargo test

# Run one or more labs, e.g. `just lab consumer-crash`
lab +names:
    cargo run --release -- lab {{names}}

# Run every lab on one environment
all:
    cargo run --release -- lab --all

# Rewrite the stored snapshots from a fresh run
update +names:
    cargo run --release -- lab {{names}} --update

# List labs, consumer patterns, fault windows and counters
list:
    cargo run --quiet -- list

# Format and lint as CI does
lint:
    cargo fmt --check
    cargo clippy --all-targets -- -D warnings

# Print boot, cold and warm `lab --all`, explore and soak figures (MQLAB_BENCH_RUNS, default 3)
bench:
    cargo bench --bench suite

# Run the whole suite N times (`just flake-check 10 "--group cluster"` for the cluster labs); report every run that failed or whose transcripts differ from run 1
flake-check n="20" which="--all":
    #!/usr/bin/env bash
    set -uo pipefail
    cargo build --release --quiet
    out=$(mktemp -d /tmp/mqlab-flake.XXXXXX)
    bad=0
    for i in $(seq {{n}}); do
      if ! ./target/release/mqlab lab {{which}} --transcript-dir "$out/$i" > "$out/$i.out" 2>&1; then
        echo "run $i: FAILED (see $out/$i.out)"; bad=$((bad + 1))
      elif [ "$i" -gt 1 ] && ! diff -r "$out/1" "$out/$i" > "$out/$i.diff"; then
        echo "run $i: transcripts differ from run 1 (see $out/$i.diff)"; bad=$((bad + 1))
      else
        echo "run $i: identical ($(tail -1 "$out/$i.out"))"
      fi
    done
    echo "flake-check: {{n}} runs, $bad failed or differed; outputs in $out"
    [ "$bad" -eq 0 ]

# Regenerate docs/evidence from a real run of the seed labs, with the consumer-crash diagram rendered
evidence:
    #!/usr/bin/env bash
    set -euo pipefail
    cargo run --release --quiet -- lab consumer-crash retry-dlq routing --evidence docs/evidence
    mmdc=$(command -v mmdc || echo /opt/mqlab-tools/node_modules/.bin/mmdc)
    tmp=$(mktemp -d)
    awk '/^```mermaid/{f=1;next} /^```/{f=0} f' docs/evidence/consumer-crash.md > "$tmp/d.mmd"
    printf '{"executablePath":"/usr/bin/chromium","args":["--no-sandbox","--disable-gpu","--disable-background-networking","--no-first-run"]}' > "$tmp/p.json"
    "$mmdc" -q -p "$tmp/p.json" -i "$tmp/d.mmd" -o docs/evidence/consumer-crash.png -b white -s 1.5
    rm -rf "$tmp"
    echo "docs/evidence regenerated"

# Build the docs (docs/*.md) as a book into target/book (needs `cargo install mdbook` and the mermaid npm package, as .ci/run installs them)
docs:
    cp "${MQLAB_MERMAID_JS:-/opt/mqlab-tools/node_modules/mermaid/dist/mermaid.min.js}" docs/mermaid.min.js
    mdbook build docs
