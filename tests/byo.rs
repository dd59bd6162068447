//! Bring your own consumer: the Python examples (pika + psycopg) and the
//! Node.js ones (amqplib + pg) run as black boxes; the safe one passes, the
//! ack-first one shows exactly its declared violations; a program that
//! cannot be run, or stops, fails its lab with one clear line. The examples
//! need a Python with pika and psycopg in MQLAB_PYTHON (`.ci/run` makes a
//! virtual environment from examples/python/requirements.txt) and
//! examples/node/node_modules (`.ci/run` runs `npm ci` there); the tests of
//! a program that fails run a shell command and need none.

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
    for run in ["ack-first", "auto-ack", "memory-dedup", "two-tx"] {
        assert!(
            stdout.contains(&format!(
                "{:<37}counterexample confirmed",
                format!("byo-consumer-crash@{run}")
            )),
            "{stdout}"
        );
    }
    assert!(
        stdout.contains("byo-competing-consumers              safe pattern holds"),
        "{stdout}"
    );
    // Its first message a resend acked with no statement, the order declared.
    assert!(
        stdout.contains("byo-cached-inbox                     safe pattern holds"),
        "{stdout}"
    );
    assert!(
        stdout.contains("byo-cached-inbox@memory-dedup        counterexample confirmed"),
        "{stdout}"
    );
    assert!(
        stdout.lines().any(|l| l.split_whitespace().eq([
            "byo-competing-consumers@check-then-insert",
            "counterexample",
            "confirmed"
        ]
        .into_iter()
        .chain(l.split_whitespace().last()))),
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
    let two = std::fs::read_to_string(out.path().join("byo-consumer-crash@two-tx.log")).unwrap();
    assert!(two.contains("what=commit commit=2 status=held"), "{two}");
    assert!(two.contains("[check] lost=1 FAIL"), "{two}");
    let auto = std::fs::read_to_string(out.path().join("byo-consumer-crash@auto-ack.log")).unwrap();
    assert!(auto.contains("autoAck=true status=delivered"), "{auto}");
    assert!(auto.contains("[check] lost=3 FAIL"), "{auto}");
    // Two instances: the second waits on the first one's inbox row, held
    // there; a check-then-insert program passes its SELECT in both.
    let log = |run: &str| std::fs::read_to_string(out.path().join(format!("{run}.log"))).unwrap();
    let crowd = log("byo-competing-consumers");
    assert!(
        crowd.contains("atWindow=consumer-1 onLock=consumer-2 status=injected"),
        "{crowd}"
    );
    assert!(
        crowd.contains("[check] duplicatesApplied=0 PASS"),
        "{crowd}"
    );
    let race = log("byo-competing-consumers@check-then-insert");
    assert!(race.contains("[check] duplicatesApplied=1 FAIL"), "{race}");
    // Its own prefetch (10) and a batch acked with `multiple`: the ack that
    // covers mid-1 and mid-2 held whole (neither acked before the kill);
    // acked before the batch's last COMMIT, mid-2 is lost.
    assert!(
        stdout.contains("byo-batched-acks                     safe pattern holds"),
        "{stdout}"
    );
    let batch = log("byo-batched-acks");
    let before_kill = batch.split("status=killed").next().unwrap_or_default();
    assert!(
        before_kill.contains("messageId=mid-2 destination=orders.byo-batched what=ack status=held"),
        "{batch}"
    );
    assert!(!before_kill.contains("status=acked"), "{batch}");
    assert!(batch.contains("[check] lost=0 PASS"), "{batch}");
    let early = log("byo-batched-acks@batch-acked-early");
    assert!(early.contains("what=commit status=held"), "{early}");
    assert!(early.contains("[check] lost=1 FAIL"), "{early}");
}

/// A Node.js that loads amqplib and pg from examples/node/node_modules
/// (`.ci/run` installs them with `npm ci`; the default `cargo test`
/// reaches no registry): `MQLAB_NODE`, or `node` on PATH.
fn node() -> String {
    let node = std::env::var("MQLAB_NODE").unwrap_or_else(|_| "node".into());
    let works = std::process::Command::new(&node)
        .args(["-e", "require('amqplib'); require('pg')"])
        .current_dir(root().join("examples/node"))
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        works,
        "this test needs Node.js ({node}) with amqplib and pg in examples/node/node_modules (.ci/run runs `npm ci` there)"
    );
    node
}

/// Every Node.js example run's stored transcript is the Python run's of
/// the same name, line for line: the black box sees the same deliveries,
/// COMMITs and acks from either program. No Node.js needed: it reads the
/// files `the_node_examples_pass_as_the_python_ones` runs against.
#[test]
fn the_node_snapshots_are_the_python_ones() {
    let dir = |lang: &str| root().join(format!("examples/{lang}/snapshots"));
    let mut runs = 0;
    for e in std::fs::read_dir(dir("node")).unwrap() {
        let name = e.unwrap().file_name();
        let read = |lang: &str| std::fs::read_to_string(dir(lang).join(&name)).unwrap();
        assert_eq!(read("node"), read("python"), "{name:?}");
        runs += 1;
    }
    assert_eq!(runs, 9, "one snapshot per Node.js example run");
}

/// The Node.js examples (amqplib and pg) are judged as the Python ones:
/// the safe consumer holds, each mistake is refuted by the same checks,
/// each run's transcript equal to its stored snapshot (Python's, by the
/// test above).
#[test]
#[ignore = "needs Node.js with amqplib and pg in examples/node/node_modules (.ci/run runs npm ci)"]
fn the_node_examples_pass_as_the_python_ones() {
    let out = tempfile::tempdir().unwrap();
    let node_root = root().join("examples/node");
    let (code, stdout, stderr) = run(mqlab(&[
        "lab",
        "--all",
        "--root",
        node_root.to_str().unwrap(),
        "--transcript-dir",
        out.path().to_str().unwrap(),
    ])
    .env("MQLAB_NODE", node()));
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let runs = [
        ("byo-consumer-crash", "safe pattern holds"),
        ("byo-consumer-crash@ack-first", "counterexample confirmed"),
        ("byo-consumer-crash@auto-ack", "counterexample confirmed"),
        (
            "byo-consumer-crash@memory-dedup",
            "counterexample confirmed",
        ),
        ("byo-consumer-crash@two-tx", "counterexample confirmed"),
        ("byo-competing-consumers", "safe pattern holds"),
        (
            "byo-competing-consumers@check-then-insert",
            "counterexample confirmed",
        ),
        ("byo-batched-acks", "safe pattern holds"),
        (
            "byo-batched-acks@batch-acked-early",
            "counterexample confirmed",
        ),
    ];
    for (run, verdict) in runs {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("{run} ")) && l.contains(verdict)),
            "{run}: {verdict}\n{stdout}"
        );
    }
    // Exit 0 above says each transcript matched the Node.js snapshot;
    // the_node_snapshots_are_the_python_ones says those are Python's.
    let count = std::fs::read_dir(out.path()).unwrap().count();
    assert_eq!(count, runs.len(), "one transcript per run");
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

/// A project of its own with the Python examples' labs, fixtures and
/// snapshots, for a test that edits a lab file.
fn examples_copy() -> tempfile::TempDir {
    let project = tempfile::tempdir().unwrap();
    for sub in ["labs", "fixtures", "snapshots"] {
        let to = project.path().join(sub);
        std::fs::create_dir_all(&to).unwrap();
        for e in std::fs::read_dir(examples().join(sub)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
    project
}

/// A program that never acks ends at the step's deadline with its output.
#[test]
fn a_program_that_never_acks() {
    let project = examples_copy();
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

/// A program that declares its own queue when it starts: with the
/// arguments the lab declares, it runs and passes; with others, the broker
/// refuses it and mqlab says so in one line, in the broker's words.
#[test]
#[ignore = "needs MQLAB_PYTHON, a Python with pika and psycopg (.ci/run makes it)"]
fn a_program_that_declares_its_own_queue() {
    let project = examples_copy();
    std::fs::copy(
        examples().join("consumer.py"),
        project.path().join("consumer.py"),
    )
    .unwrap();
    let lab = project.path().join("labs/byo-consumer-crash.toml");
    let text = std::fs::read_to_string(&lab).unwrap();
    let with_args = text.replacen(
        "name = \"orders.byo\"\n",
        "name = \"orders.byo\"\narguments = { \"x-max-length\" = 100 }\n",
        1,
    );
    assert_ne!(with_args, text);
    std::fs::write(&lab, with_args).unwrap();
    let declaring = |root: &std::path::Path, max: u32| {
        run(&mut mqlab(&[
            "lab",
            "byo-consumer-crash",
            "--root",
            root.to_str().unwrap(),
            "--consumer-cmd",
            &format!(
                "{} consumer.py safe --declare '{{\"x-max-length\": {max}}}'",
                python()
            ),
        ]))
    };
    // The lab's own arguments: the declaration is accepted, the lab holds
    // against the examples' snapshot (the kill's restarted process
    // declares again).
    let (code, stdout, stderr) = declaring(project.path(), 100);
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    // Other arguments, and arguments on a queue the lab declares with
    // none: refused, one line in the broker's words.
    for (root, max, current) in [
        (
            project.path().to_path_buf(),
            5,
            "received '5' but current is '100'",
        ),
        (
            examples(),
            100,
            "received the value '100' of type 'signedint' but current is none",
        ),
    ] {
        let (code, _, stderr) = declaring(&root, max);
        assert_eq!(code, 1, "{stderr}");
        let line = stderr
            .lines()
            .find(|l| l.contains("the broker refused the program"))
            .unwrap_or_else(|| panic!("no refusal line:\n{stderr}"));
        assert!(
            line.contains(
                "406 PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'orders.byo'"
            ) && line.contains(current)
                && line.contains("and the program exited with 1"),
            "{line}"
        );
        assert!(!stderr.contains("Traceback"), "{stderr}");
    }
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
        stdout.contains(": 22 hold, 0 violate a check, 6 never reach their window, 0 errors"),
        "{stdout}"
    );
    // One COMMIT per message: the second is never reached, said per message.
    assert_eq!(
        row("consumer/after-commit-1-before-commit-2")
            .matches('–')
            .count(),
        3,
        "{stdout}"
    );
}

/// explore on a program with its own prefetch (10) that acks in batches
/// (`multiple`): every window of every message reached or said unreachable,
/// no check violated, no deadline error; the same program acking its batch
/// before the batch's last COMMIT is refuted (`lost=1`) where it matters.
#[test]
#[ignore = "needs MQLAB_PYTHON, a Python with pika and psycopg (.ci/run makes it)"]
fn explore_follows_a_batch_acked_with_multiple() {
    let explore = |run: &str| {
        crate::run(
            mqlab(&["explore", run])
                .arg("--root")
                .arg(examples())
                .env("MQLAB_PYTHON", python()),
        )
    };
    let (code, stdout, stderr) = explore("byo-batched-acks");
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains(": 22 hold, 0 violate a check, 6 never reach their window, 0 errors"),
        "{stdout}"
    );
    let (code, stdout, stderr) = explore("byo-batched-acks@batch-acked-early");
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    for point in [
        "consumer/before-commit at mid-2: lost=1",
        "consumer/after-ack-before-commit at mid-2: lost=1",
        "consumer/after-ack at mid-1: lost=1",
    ] {
        assert!(
            stderr.contains(point) || stdout.contains(point),
            "{point}: {stdout}{stderr}"
        );
    }
    assert!(
        stdout.contains(": 19 hold, 3 violate a check, 6 never reach their window, 0 errors"),
        "{stdout}"
    );
}

/// explore on the example's broken modes, by the checker's verdict and with
/// no deadline error: a program with two transactions per message is
/// refuted between them, and explore goes on to a third COMMIT that never
/// comes; an autoAck program loses what the broker had sent it; a program
/// that skips by a set in memory settles its skips at their acks.
#[test]
#[ignore = "needs MQLAB_PYTHON, a Python with pika and psycopg (.ci/run makes it)"]
fn explore_refutes_two_transactions_and_auto_ack() {
    let explore = |mode: &str| {
        let (code, stdout, stderr) = run(mqlab(&["explore", "byo-consumer-crash"])
            .arg("--root")
            .arg(examples())
            .args(["--env", "local", "--consumer-cmd"])
            .arg(format!("\"$MQLAB_PYTHON\" consumer.py {mode}"))
            .env("MQLAB_PYTHON", python()));
        assert_eq!(code, 1, "stdout:\n{stdout}\nstderr:\n{stderr}");
        assert!(stdout.contains(", 0 errors"), "{stdout}");
        stdout
    };
    let row = |out: &str, name: &str| {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_default();
        line.split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ")
    };
    // (mode, row, its cells at mid-1 mid-2 mid-3)
    let expected: &[(&str, &[(&str, &str)])] = &[
        (
            "two-tx",
            &[
                (
                    "consumer/after-commit-1-before-commit-2",
                    "lost=1 lost=1 lost=1",
                ),
                ("consumer/after-commit-2-before-commit-3", "– – –"),
                ("consumer/after-commit-before-ack", "ok ok ok"),
            ],
        ),
        (
            "auto-ack",
            &[
                ("consumer/on-deliver", "lost=3 lost=2 lost=1"),
                ("consumer/before-commit", "lost=3 lost=2 lost=1"),
                // No ack to hold: said, not passed.
                ("consumer/after-commit-before-ack", "– – –"),
            ],
        ),
        (
            // Copies resent by the producer are skipped in memory, acked with
            // no statement: settled at their acks, no deadline; the restart
            // forgets.
            "memory-dedup",
            &[
                (
                    "consumer/after-commit-before-ack",
                    "duplicatesApplied=1 duplicatesApplied=1 duplicatesApplied=1",
                ),
                ("producer/after-publish-before-confirm", "ok ok ok"),
            ],
        ),
    ];
    for (mode, rows) in expected {
        let out = explore(mode);
        for (name, cells) in *rows {
            assert_eq!(row(&out, name), *cells, "{mode} {name}:\n{out}");
        }
    }
}

/// explore on two instances of a program: the lab's rendezvous is a point
/// of its own, refuting a check-then-insert program (and every other point
/// runs one instance).
#[test]
#[ignore = "needs MQLAB_PYTHON, a Python with pika and psycopg (.ci/run makes it)"]
fn explore_runs_the_rendezvous_of_two_instances() {
    let (code, stdout, stderr) = run(mqlab(&["explore", "byo-competing-consumers"])
        .arg("--root")
        .arg(examples())
        .args(["--env", "local", "--variant", "check-then-insert"])
        .env("MQLAB_PYTHON", python()));
    // A counterexample refuted at a point: what explore is asked to show.
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let row: Vec<&str> = stdout
        .lines()
        .find(|l| l.starts_with("consumer/rendezvous-before-commit "))
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .collect();
    assert_eq!(row, ["duplicatesApplied=1"], "{stdout}");
    assert!(stdout.contains(" 1 violate a check, "), "{stdout}");
    assert!(stdout.contains(", 0 errors"), "{stdout}");
}

/// A program that cannot get through the lab with no fault: explore says
/// so once, from its run with no fault, instead of at each of its points.
#[test]
fn explore_of_a_program_that_cannot_run_says_so_once() {
    let started = std::time::Instant::now();
    let (code, stdout, stderr) = run(mqlab(&["explore", "byo-consumer-crash"])
        .arg("--root")
        .arg(examples())
        .args(["--env", "local", "--consumer-cmd", "false"]));
    assert_eq!(code, 1, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stderr.contains(
            "the program fails the lab with no fault injected, so no point can be judged"
        ) && stderr.contains("the program exited with 1 "),
        "{stderr}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}
