//! `mqlab explore`: every fault point of a lab, judged by the checks alone.
//! consumer-crash holds at every point; its no-inbox variant fails exactly
//! where a message is processed twice.

mod common;
use common::*;

#[test]
fn consumer_crash_holds_at_every_point() {
    let evidence = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = run(mqlab(&[
        "explore",
        "consumer-crash",
        "--evidence",
        evidence.path().to_str().unwrap(),
    ])
    .current_dir(root()));
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("29 points in "), "{stdout}");
    assert!(
        stdout.contains(": 29 hold, 0 violate a check, 0 never reach their window, 0 errors"),
        "{stdout}"
    );
    let md = std::fs::read_to_string(evidence.path().join("explore-consumer-crash.md")).unwrap();
    assert!(
        md.contains("| `consumer/after-commit-before-ack` | ok | ok | ok |"),
        "{md}"
    );
}

#[test]
fn no_inbox_fails_where_a_redelivery_is_applied_again() {
    let (code, stdout, stderr) =
        run(mqlab(&["explore", "consumer-crash", "--variant", "no-inbox"]).current_dir(root()));
    assert_eq!(
        code, 0,
        "a counterexample that fails somewhere: stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let row = |name: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no row {name} in:\n{stdout}"))
            .to_string()
    };
    // Killed after the commit and before the ack: the redelivery is applied again.
    assert_eq!(
        row("consumer/after-commit-before-ack")
            .matches("duplicatesApplied=1")
            .count(),
        3,
        "{stdout}"
    );
    // Killed before the commit or after the ack: nothing to apply twice.
    assert_eq!(
        row("consumer/before-commit").matches("ok").count(),
        3,
        "{stdout}"
    );
    assert_eq!(
        row("consumer/after-ack").matches("ok").count(),
        3,
        "{stdout}"
    );
    // A producer resend after a lost confirm is a second copy the inbox would have skipped.
    assert_eq!(
        row("producer/after-publish-before-confirm")
            .matches("duplicatesApplied=1")
            .count(),
        3,
        "{stdout}"
    );
}

/// `--points 4 --seed 9` runs the very points the seed draws (the
/// library's `sample`, itself shown reproducible by a unit test): each
/// drawn row is in the printed matrix, and no other.
#[test]
fn a_sample_runs_the_points_its_seed_draws() {
    let (code, stdout, stderr) =
        run(
            mqlab(&["explore", "consumer-crash", "--points", "4", "--seed", "9"])
                .current_dir(root()),
        );
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("exploring consumer-crash: 4 of 29 fault points"),
        "{stderr}"
    );
    assert!(stdout.contains("4 points in "), "{stdout}");
    let lab = mqlab::lab::Project { root: root() }
        .load("consumer-crash")
        .unwrap();
    let drawn = mqlab::explore::sample(mqlab::explore::points(&lab), 4, 9);
    let want: std::collections::BTreeSet<&str> = drawn.iter().map(|p| p.row.as_str()).collect();
    // The matrix: a header line of columns, then a row per line, each
    // starting with its name (the lines before the summary).
    let rows: std::collections::BTreeSet<&str> = stdout
        .lines()
        .skip(1)
        .take_while(|l| !l.contains(" points in "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|r| r.contains('/'))
        .collect();
    assert_eq!(rows, want, "{stdout}");
}
