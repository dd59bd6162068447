//! Bring your own consumer: the Python examples (pika + psycopg) run as
//! black boxes; the safe one passes, the ack-first one shows exactly its
//! declared violations; a program that cannot be run, or stops, fails its
//! lab with one clear line. The examples need a Python with pika and
//! psycopg in MQLAB_PYTHON (`.ci/run` makes a virtual environment from
//! examples/python/requirements.txt); the tests of a program that fails
//! run a shell command and need none.

mod common;
use common::*;

use std::path::PathBuf;

fn examples() -> PathBuf {
    root().join("examples/python")
}

/// A Python that imports pika and psycopg: `MQLAB_PYTHON` (`.ci/run` makes
/// it from PyPI; the default `cargo test` reaches no registry, so the tests
/// that need it are `#[ignore]`d).
fn python() -> String {
    let p = std::env::var("MQLAB_PYTHON")
        .expect("this test needs MQLAB_PYTHON: a Python with pika and psycopg (.ci/run makes one)");
    let works = std::process::Command::new(&p)
        .args(["-c", "import pika, psycopg"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(works, "MQLAB_PYTHON={p} cannot import pika and psycopg");
    p
}

/// The examples' lab with the program of the lab file (which runs Python).
fn byo_python(args: &[&str]) -> std::process::Command {
    let mut c = byo(args);
    c.env("MQLAB_PYTHON", python());
    c
}

fn byo(args: &[&str]) -> std::process::Command {
    let mut v = vec!["lab"];
    v.extend_from_slice(args);
    let mut c = mqlab(&v);
    c.arg("--root").arg(examples());
    c
}

#[test]
#[ignore = "needs MQLAB_PYTHON, a Python with pika and psycopg (.ci/run makes it)"]
fn the_python_examples_pass_and_show_their_violations() {
    let evidence = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = run(&mut byo_python(&[
        "--all",
        "--evidence",
        evidence.path().to_str().unwrap(),
        "--transcript-dir",
        out.path().to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("byo-consumer-crash                   safe pattern holds"),
        "{stdout}"
    );
    assert!(
        stdout.contains("byo-consumer-crash@ack-first         counterexample confirmed"),
        "{stdout}"
    );
    // Their transcripts matched the stored snapshots: exit 0 says so.
    for run in ["byo-consumer-crash", "byo-consumer-crash@ack-first"] {
        assert!(evidence.path().join(format!("{run}.md")).is_file(), "{run}");
    }
    // What the harness saw, not what the program printed.
    let safe = std::fs::read_to_string(out.path().join("byo-consumer-crash.log")).unwrap();
    assert!(safe.contains("what=ack status=held"), "{safe}");
    assert!(safe.contains("[check] lost=0 PASS"), "{safe}");
    let unsafe_ =
        std::fs::read_to_string(out.path().join("byo-consumer-crash@ack-first.log")).unwrap();
    assert!(unsafe_.contains("what=commit status=held"), "{unsafe_}");
    assert!(unsafe_.contains("[check] lost=1 FAIL"), "{unsafe_}");
}

#[test]
fn a_program_that_is_not_found() {
    let (code, _, stderr) = run(&mut byo(&[
        "byo-consumer-crash",
        "--consumer-cmd",
        "no-such-consumer --flag",
    ]));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("the program exited with 127 after it settled 0 of 3"),
        "{stderr}"
    );
    assert!(stderr.contains("not found"), "{stderr}");
}

#[test]
fn a_program_that_exits_before_it_consumes() {
    let (code, _, stderr) = run(&mut byo(&[
        "byo-consumer-crash",
        "--consumer-cmd",
        "sh -c 'echo starting; echo no broker for me >&2; exit 3'",
    ]));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("the program exited with 3 after it settled 0 of 3"),
        "{stderr}"
    );
    assert!(stderr.contains("no broker for me"), "{stderr}");
}

/// A program that never acks ends at the step's deadline with its output.
#[test]
fn a_program_that_never_acks() {
    let project = tempfile::tempdir().unwrap();
    for sub in ["labs", "fixtures", "snapshots"] {
        let to = project.path().join(sub);
        std::fs::create_dir_all(&to).unwrap();
        for e in std::fs::read_dir(examples().join(sub)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
    let lab = project.path().join("labs/byo-consumer-crash.toml");
    let text = std::fs::read_to_string(&lab).unwrap();
    std::fs::write(
        &lab,
        text.replace(
            "settle = 3, command",
            "settle = 3, deadline_secs = 3, command",
        ),
    )
    .unwrap();
    let (code, _, stderr) = run(&mut mqlab(&[
        "lab",
        "byo-consumer-crash",
        "--root",
        project.path().to_str().unwrap(),
        "--consumer-cmd",
        "sh -c 'echo waiting forever; sleep 600'",
    ]));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("exceeded 3 s: the program settled 0 of 3"),
        "{stderr}"
    );
    assert!(stderr.contains("waiting forever"), "{stderr}");
}

#[test]
fn consumer_cmd_needs_a_lab_that_runs_a_program() {
    let (code, _, stderr) =
        run(mqlab(&["lab", "consumer-crash", "--consumer-cmd", "true"]).current_dir(root()));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("lab `consumer-crash` runs no program"),
        "{stderr}"
    );
}

/// explore on a program: every black-box window × every message; a safe
/// program never reaches after-ack-before-commit (reported, not passed).
#[test]
#[ignore = "needs MQLAB_PYTHON, a Python with pika and psycopg (.ci/run makes it)"]
fn explore_runs_every_window_against_the_program() {
    let (code, stdout, stderr) = run(mqlab(&["explore", "byo-consumer-crash"])
        .arg("--root")
        .arg(examples())
        .env("MQLAB_PYTHON", python()));
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let row = |name: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(
        row("consumer/after-ack-before-commit").matches('–').count(),
        3,
        "{stdout}"
    );
    assert_eq!(
        row("consumer/after-commit-before-ack")
            .matches("ok")
            .count(),
        3,
        "{stdout}"
    );
    assert!(
        stdout.contains(": 22 hold, 0 violate a check, 3 never reach their window, 0 errors"),
        "{stdout}"
    );
}
