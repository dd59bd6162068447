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
