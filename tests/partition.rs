//! Runs split over CI jobs: `--partition K/N` shares and `mqlab report merge`.

mod common;
use common::*;

use std::collections::BTreeSet;
use std::path::Path;

/// Two small labs, five runs: the split is unit-tested (`partition.rs`); this
/// runs the real binary on shares of them rather than a second `--all`.
const LABS: [&str; 2] = ["routing", "unroutable"];

fn all_runs() -> BTreeSet<String> {
    let project = mqlab::lab::Project { root: root() };
    LABS.iter()
        .flat_map(|lab| project.runs_of(lab).unwrap())
        .collect()
}

fn runs_in(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".json").map(str::to_string)
        })
        .collect()
}

/// `lab <the runs of two labs> --partition 1/2` and `2/2` together run
/// exactly those runs, each once, and both pass; `report merge` joins their evidence
/// into one index and one JUnit report with every run.
#[test]
fn two_shares_run_every_lab_once_and_merge() {
    let tmp = tempfile::tempdir().unwrap();
    let all = all_runs();
    let mut shares = Vec::new();
    for k in 1..=2 {
        let dir = tmp.path().join(format!("share-{k}"));
        let share = format!("{k}/2");
        let mut args = vec!["lab"];
        args.extend(all.iter().map(String::as_str));
        args.extend(["--partition", &share, "--evidence", dir.to_str().unwrap()]);
        let (code, stdout, stderr) = run(mqlab(&args).current_dir(root()));
        assert_eq!(code, 0, "{stdout}\n{stderr}");
        shares.push(runs_in(&dir));
    }
    assert!(shares[0].is_disjoint(&shares[1]), "a run in both shares");
    let union: BTreeSet<String> = shares[0].union(&shares[1]).cloned().collect();
    assert_eq!(union, all);
    let diff = shares[0].len().abs_diff(shares[1].len());
    assert!(
        diff <= 1,
        "uneven shares: {} and {}",
        shares[0].len(),
        shares[1].len()
    );

    let out = tmp.path().join("merged");
    let (code, _, stderr) = run(&mut mqlab(&[
        "report",
        "merge",
        tmp.path().join("share-1").to_str().unwrap(),
        tmp.path().join("share-2").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(runs_in(&out), all);
    let index = std::fs::read_to_string(out.join("README.md")).unwrap();
    for run in &all {
        assert!(
            index.contains(&format!("[{run}]({run}.md)")),
            "{run} not in the index"
        );
        assert!(out.join(format!("{run}.md")).is_file());
    }
    let junit = std::fs::read_to_string(out.join("junit.xml")).unwrap();
    assert_eq!(junit.matches("<testsuite ").count(), all.len(), "{junit}");
    assert!(!junit.contains("<failure"), "{junit}");
}

/// The same evidence twice is not two shares of one suite: exit 2, one line.
/// A failed run in a share makes the merge exit 1.
#[test]
fn merge_refuses_overlaps_and_reports_failures() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    std::fs::create_dir_all(&a).unwrap();
    let record = std::fs::read_to_string(root().join("docs/evidence/routing.json")).unwrap();
    std::fs::write(a.join("routing.json"), &record).unwrap();
    let (code, _, stderr) = run(&mut mqlab(&[
        "report",
        "merge",
        a.to_str().unwrap(),
        a.to_str().unwrap(),
        "--out",
        tmp.path().join("out").to_str().unwrap(),
    ]));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("run `routing` on RabbitMQ 3.10.8 is in both"),
        "{stderr}"
    );

    let b = tmp.path().join("b");
    std::fs::create_dir_all(&b).unwrap();
    let failed = record
        .replace("\"exitCode\": 0", "\"exitCode\": 1")
        .replace("\"run\": \"routing\"", "\"run\": \"routing-failed\"");
    assert_ne!(failed, record);
    std::fs::write(b.join("routing-failed.json"), failed).unwrap();
    let (code, _, stderr) = run(&mut mqlab(&[
        "report",
        "merge",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--out",
        tmp.path().join("out").to_str().unwrap(),
    ]));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("1 failed: routing-failed"), "{stderr}");
    let (code, _, stderr) = run(&mut mqlab(&["lab", "--all", "--partition", "3/2"]));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("is not K/N"), "{stderr}");
}
