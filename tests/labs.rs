//! The labs, run for real: the binary starts its own RabbitMQ and PostgreSQL,
//! runs every lab, and must match the stored snapshots, which must equal the
//! reference transcripts of the spec.

mod common;
use common::*;

/// A `mqlab lab` run with every output: transcripts, evidence, JUnit.
struct LabRun {
    out: tempfile::TempDir,
    evidence: tempfile::TempDir,
    junit: std::path::PathBuf,
    runs: Vec<String>,
}

/// `mqlab lab --all` with every output.
fn run_all() -> LabRun {
    run_these(&["--all"])
}

/// `mqlab lab <which>` with every output: transcripts, evidence, JUnit.
fn run_these(which: &[&str]) -> LabRun {
    let out = tempfile::tempdir().unwrap();
    let evidence = tempfile::tempdir().unwrap();
    let junit = evidence.path().join("junit.xml");
    let mut args = vec!["lab"];
    args.extend(which);
    args.extend([
        "--transcript-dir",
        out.path().to_str().unwrap(),
        "--evidence",
        evidence.path().to_str().unwrap(),
        "--junit",
        junit.to_str().unwrap(),
    ]);
    let (code, stdout, stderr) = run(mqlab(&args).current_dir(root()));
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains(" 0 failed ("), "{stdout}");
    // One transcript per run: every lab and every counterexample variant.
    let mut runs: Vec<String> = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| {
            e.unwrap()
                .path()
                .file_stem()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    runs.sort();
    LabRun {
        out,
        evidence,
        junit,
        runs,
    }
}

#[test]
fn every_lab_passes_and_matches_its_snapshot() {
    let all = run_all();
    let runs = &all.runs;
    // Exactly one run per stored one-node snapshot: a lab left out of
    // `--all`, or a run without a snapshot, fails here.
    let project = mqlab::lab::Project { root: root() };
    let mut expected: Vec<String> = std::fs::read_dir(root().join("snapshots"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".snap").map(str::to_string)
        })
        // Another generation's transcript of a run (`.rabbitmq-4.0`).
        .filter(|run| !run.contains(".rabbitmq-"))
        .filter(|run| {
            let lab = run.split('@').next().unwrap();
            !project.is_cluster(lab).unwrap()
        })
        .collect();
    expected.sort();
    assert_eq!(runs, &expected);
    check_evidence(all.evidence.path(), all.out.path(), runs);
    check_junit(&all.junit, all.evidence.path(), runs);
    check_rejudged(all.evidence.path(), runs);
    // Each transcript matched its snapshot: the exit code and ` 0 failed`
    // above say so (mqlab compares them itself; `snapshot_body` reads the
    // same files for the reference test below).
}

/// The outputs checked by the tools their readers use: the JUnit file
/// against its XSD with xmllint, the evidence's sequence diagrams rendered
/// by Mermaid. A run of a few labs whose diagrams draw most participants
/// (a killed consumer, the broker, the network, competing instances, an
/// order service's database, a DLQ, a downstream service, several queues),
/// not `--all`: every run's diagram, drawn from its snapshot by the same
/// code, is rendered by Mermaid in the book (tests/docs.rs,
/// `the_book_builds_and_renders`), and the default test above checks
/// `--all`'s JUnit and evidence themselves.
#[test]
#[ignore = "needs xmllint, mermaid-cli and chromium (.ci/run installs them)"]
fn evidence_passes_external_validators() {
    let all = run_these(&[
        "consumer-crash",
        "consumer-crash@no-inbox",
        "broker-restart",
        "connection-drop",
        "competing-consumers@check-then-insert",
        "outbox@direct",
        "retry-dlq",
        "effect-intents",
        "routing",
    ]);
    assert_eq!(all.runs.len(), 9, "{:?}", all.runs);
    let xmllint = require_tool("xmllint", &[]);
    let out = std::process::Command::new(xmllint)
        .args(["--noout", "--schema"])
        .arg(root().join("tests/data/junit.xsd"))
        .arg(&all.junit)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_mermaid(all.evidence.path(), &all.runs);
}

/// `mqlab check` re-judges each stored run offline to the same outcomes; a
/// tampered observation changes its verdict.
fn check_rejudged(dir: &std::path::Path, runs: &[String]) {
    let files: Vec<String> = runs
        .iter()
        .map(|r| dir.join(format!("{r}.json")).to_string_lossy().into_owned())
        .collect();
    let mut args = vec!["check"];
    args.extend(files.iter().map(String::as_str));
    let (code, stdout, stderr) = run(&mut mqlab(&args));
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(
        stdout.matches("as recorded)").count(),
        runs.len(),
        "{stdout}"
    );
    let path = dir.join("consumer-crash.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let tampered = text.replacen("\"crashExitCode\": 137", "\"crashExitCode\": 0", 1);
    assert_ne!(tampered, text);
    std::fs::write(&path, tampered).unwrap();
    let (code, stdout, _) = run(&mut mqlab(&["check", path.to_str().unwrap()]));
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("[assert] crashExitCode=0 FAIL"), "{stdout}");
    assert!(
        stdout.contains("DIFFERS from the recorded outcomes"),
        "{stdout}"
    );
}

/// The stored snapshots of the seed labs are the spec's reference transcripts,
/// line for line, followed by the checker's own `[check]` section.
#[test]
fn seed_snapshots_equal_the_reference_transcripts() {
    for entry in std::fs::read_dir(root().join("tests/reference")).unwrap() {
        let path = entry.unwrap().path();
        let lab = path.file_stem().unwrap().to_string_lossy().into_owned();
        assert!(
            root().join(format!("labs/{lab}.toml")).exists(),
            "the seed lab {lab} has a reference transcript and no lab file"
        );
        let reference = std::fs::read_to_string(&path).unwrap();
        let body = snapshot_body(&lab);
        let (transcript, checks): (Vec<&str>, Vec<&str>) =
            body.lines().partition(|l| !l.starts_with("[check] "));
        assert_eq!(transcript.join("\n"), reference.trim_end(), "{lab}");
        assert_eq!(
            checks,
            [
                "[check] lost=0 PASS",
                "[check] duplicatesApplied=0 PASS",
                "[check] unexpected=0 PASS"
            ],
            "{lab}"
        );
        assert!(
            body.trim_end().ends_with("[check] unexpected=0 PASS"),
            "checks come last: {lab}"
        );
    }
}

#[test]
fn a_tampered_snapshot_fails_the_lab_with_a_readable_diff() {
    let project = scratch_project();
    let snap = project.path().join("snapshots/consumer-crash.snap");
    let text = std::fs::read_to_string(&snap).unwrap();
    std::fs::write(
        &snap,
        text.replace(
            "[assert] redeliveredCount=1 PASS",
            "[assert] redeliveredCount=0 PASS",
        ),
    )
    .unwrap();
    let (code, stdout, stderr) = run(&mut mqlab(&[
        "lab",
        "consumer-crash",
        "--root",
        project.path().to_str().unwrap(),
    ]));
    assert_eq!(code, 1, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("-[assert] redeliveredCount=0 PASS"),
        "{stdout}"
    );
    assert!(
        stdout.contains("+[assert] redeliveredCount=1 PASS"),
        "{stdout}"
    );
    assert!(stderr.contains("transcript differs"), "{stderr}");
    assert!(project
        .path()
        .join("snapshots/consumer-crash.snap.new")
        .exists());
}

/// `--variant` runs one counterexample: its violations print as FAIL, yet the
/// run exits 0 because exactly the declared violations occurred.
#[test]
fn a_variant_confirms_its_counterexample() {
    let (code, stdout, stderr) =
        run(mqlab(&["lab", "consumer-crash", "--variant", "no-inbox"]).current_dir(root()));
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("[assert] duplicatesApplied=1 FAIL expected=0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("[check] duplicatesApplied=1 FAIL expected=0"),
        "{stdout}"
    );
    assert!(stdout.contains("counterexample confirmed"), "{stdout}");
}

/// A variant whose declared violation does not happen is a failed lab: here
/// the no-inbox variant is told to expect a duplicate that the crash at
/// `after-receive` (before any write) cannot produce.
#[test]
fn a_counterexample_that_does_not_happen_fails_the_lab() {
    let project = scratch_project();
    let lab = project.path().join("labs/consumer-crash.toml");
    let text = std::fs::read_to_string(&lab).unwrap();
    let moved = text.replace(
        "claim = \"Without the inbox row, the redelivery after the crash applies the business effect a second time.\"\npattern = \"no-inbox\"",
        "claim = \"x\"\npattern = \"no-inbox\"\nwindow = \"after-receive\"",
    );
    assert_ne!(moved, text);
    std::fs::write(&lab, moved).unwrap();
    let (code, stdout, stderr) = run(&mut mqlab(&[
        "lab",
        "consumer-crash@no-inbox",
        "--root",
        project.path().to_str().unwrap(),
    ]));
    assert_eq!(code, 1, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stderr.contains("counterexample"), "{stderr}");
}

fn record(dir: &std::path::Path, run: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{run}.json"))).unwrap())
        .unwrap()
}

/// The JSON validates against the committed schema, and every assertion the
/// evidence reports is a line of the run's transcript, as printed.
fn check_evidence(dir: &std::path::Path, transcripts: &std::path::Path, runs: &[String]) {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("docs/evidence/schema.json")).unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    for run in runs {
        let r = record(dir, run);
        let errors: Vec<String> = validator
            .iter_errors(&r)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{run}.json: {errors:?}");
        let transcript = std::fs::read_to_string(transcripts.join(format!("{run}.log"))).unwrap();
        let lines: Vec<&str> = transcript.lines().collect();
        assert_eq!(
            r["transcript"].as_array().unwrap().len(),
            lines.len(),
            "{run}"
        );
        for a in r["assertions"].as_array().unwrap() {
            let kind = match a["kind"].as_str().unwrap() {
                // A harness or broker fact is an `[assert]` line shown apart.
                "fact" | "broker-fact" => "assert",
                k @ ("assert" | "check") => k,
                _ => continue,
            };
            let printed = format!(
                "[{kind}] {}={} {}",
                a["name"].as_str().unwrap(),
                a["actual"].as_str().unwrap(),
                a["result"].as_str().unwrap()
            );
            assert!(
                lines.iter().any(|l| l.starts_with(&printed)),
                "{run}: `{printed}` is not in the transcript"
            );
        }
        let md = std::fs::read_to_string(dir.join(format!("{run}.md"))).unwrap();
        let json = std::fs::read_to_string(dir.join(format!("{run}.json"))).unwrap();
        for secret in ["amqp://", "postgres://", "mqlab:mqlab"] {
            assert!(
                !md.contains(secret) && !json.contains(secret),
                "`{secret}` in the evidence of {run}"
            );
        }
        for needle in [
            "| broker | RabbitMQ ",
            "| database | PostgreSQL ",
            "| client library | lapin ",
            "```mermaid\nsequenceDiagram",
        ] {
            assert!(md.contains(needle), "{run}.md lacks `{needle}`");
        }
    }
    let index = std::fs::read_to_string(dir.join("README.md")).unwrap();
    for run in runs {
        assert!(
            index.contains(&format!("[{run}]({run}.md)")),
            "index lacks {run}"
        );
    }
}

/// One testsuite per run and one testcase per assertion, read back as XML:
/// each suite's failure count is its run's failing assertions.
fn check_junit(file: &std::path::Path, dir: &std::path::Path, runs: &[String]) {
    let xml = std::fs::read_to_string(file).unwrap();
    let report = quick_junit::Report::deserialize_from_str(&xml).unwrap();
    assert_eq!(report.test_suites.len(), runs.len());
    for suite in &report.test_suites {
        let r = record(dir, suite.name.as_str());
        let assertions = r["assertions"].as_array().unwrap();
        assert_eq!(
            suite.test_cases.len(),
            assertions.len(),
            "{}",
            suite.name.as_str()
        );
        let failing = assertions.iter().filter(|a| a["ok"] == false).count();
        assert_eq!(suite.failures, failing, "{}", suite.name.as_str());
        assert_eq!(
            failing,
            0,
            "{}: every run of --all passes",
            suite.name.as_str()
        );
    }
}

/// Every sequence diagram parses and renders with Mermaid itself (mermaid-cli
/// driving Debian's chromium).
fn check_mermaid(dir: &std::path::Path, runs: &[String]) {
    let mmdc = require_tool("mmdc", &["/opt/mqlab-tools/node_modules/.bin/mmdc"]);
    let work = tempfile::tempdir().unwrap();
    let mut all = String::new();
    for run in runs {
        let md = std::fs::read_to_string(dir.join(format!("{run}.md"))).unwrap();
        let block = md
            .split("```mermaid\n")
            .nth(1)
            .unwrap()
            .split("```")
            .next()
            .unwrap();
        all.push_str(&format!("# {run}\n\n```mermaid\n{block}```\n\n"));
    }
    let input = work.path().join("all.md");
    std::fs::write(&input, all).unwrap();
    let config = work.path().join("puppeteer.json");
    std::fs::write(
        &config,
        r#"{"executablePath": "/usr/bin/chromium", "args": ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]}"#,
    )
    .unwrap();
    let out = std::process::Command::new(mmdc)
        .arg("-p")
        .arg(&config)
        .arg("-i")
        .arg(&input)
        .arg("-o")
        .arg(work.path().join("out.md"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mermaid rejected a diagram:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svgs = std::fs::read_dir(work.path())
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "svg"))
        .count();
    assert_eq!(svgs, runs.len(), "one rendered diagram per run");
}
