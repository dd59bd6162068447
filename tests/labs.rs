//! The labs, run for real: the binary starts its own RabbitMQ and PostgreSQL,
//! runs every lab, and must match the stored snapshots, which must equal the
//! reference transcripts of the spec.

mod common;
use common::*;

#[test]
fn every_lab_passes_and_matches_its_snapshot() {
    let out = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = run(mqlab(&[
        "lab",
        "--all",
        "--transcript-dir",
        out.path().to_str().unwrap(),
    ])
    .current_dir(root()));
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
    assert!(runs.len() >= 10, "{runs:?}");
    assert!(
        runs.iter().any(|r| r == "consumer-crash@no-inbox"),
        "{runs:?}"
    );
    for lab in runs {
        let transcript = std::fs::read_to_string(out.path().join(format!("{lab}.log"))).unwrap();
        insta::with_settings!({
            snapshot_path => root().join("snapshots"),
            prepend_module_to_snapshot => false,
            omit_expression => true,
        }, {
            insta::assert_snapshot!(lab.as_str(), transcript);
        });
    }
}

/// The stored snapshots of the seed labs are the spec's reference transcripts,
/// line for line, followed by the checker's own `[check]` section.
#[test]
fn seed_snapshots_equal_the_reference_transcripts() {
    for entry in std::fs::read_dir(root().join("tests/reference")).unwrap() {
        let path = entry.unwrap().path();
        let lab = path.file_stem().unwrap().to_string_lossy().into_owned();
        if !root().join(format!("labs/{lab}.toml")).exists() {
            continue; // a seed lab not yet written
        }
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
