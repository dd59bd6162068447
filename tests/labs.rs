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
    assert!(!stdout.contains(" FAIL"), "{stdout}");
    let labs: Vec<String> = std::fs::read_dir(root().join("labs"))
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
    assert!(!labs.is_empty());
    for lab in labs {
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

/// The stored snapshots of the seed labs are the spec's reference transcripts, line for line.
#[test]
fn seed_snapshots_equal_the_reference_transcripts() {
    for entry in std::fs::read_dir(root().join("tests/reference")).unwrap() {
        let path = entry.unwrap().path();
        let lab = path.file_stem().unwrap().to_string_lossy().into_owned();
        if !root().join(format!("labs/{lab}.toml")).exists() {
            continue; // a seed lab not yet written
        }
        let reference = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            snapshot_body(&lab).trim_end(),
            reference.trim_end(),
            "{lab}"
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
