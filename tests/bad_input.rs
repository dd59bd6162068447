//! Bad input: one clear line, exit 2, within seconds, nothing started.

mod common;
use common::*;

fn expect_setup_error(cmd: &mut std::process::Command, needle: &str) {
    let started = std::time::Instant::now();
    let (code, stdout, stderr) = run(cmd);
    assert_eq!(code, 2, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stderr.contains(needle), "expected `{needle}` in:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        started.elapsed().as_secs() < 5,
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn unknown_lab() {
    expect_setup_error(
        mqlab(&["lab", "nope"]).current_dir(root()),
        "unknown lab `nope` (known: abandoned-transaction, backlog-drain, broker-pause,",
    );
}

#[test]
fn corrupt_snapshot_names_the_file() {
    let p = scratch_project();
    std::fs::write(
        p.path().join("snapshots/consumer-crash.snap"),
        "not a snapshot\n",
    )
    .unwrap();
    expect_setup_error(
        &mut mqlab(&[
            "lab",
            "consumer-crash",
            "--root",
            p.path().to_str().unwrap(),
        ]),
        "corrupt snapshot `",
    );
}

#[test]
fn malformed_lab_file_reports_file_and_line() {
    let p = scratch_project();
    let lab = p.path().join("labs/consumer-crash.toml");
    let text = std::fs::read_to_string(&lab).unwrap();
    std::fs::write(&lab, text.replace("[[queue]]", "[[queue]\n")).unwrap();
    expect_setup_error(
        &mut mqlab(&[
            "lab",
            "consumer-crash",
            "--root",
            p.path().to_str().unwrap(),
        ]),
        "consumer-crash.toml:10:",
    );
}

/// Semantic errors are all reported at once, one line each, with the file
/// position and the key path.
#[test]
fn semantic_errors_name_the_key_path() {
    let p = scratch_project();
    let lab = p.path().join("labs/consumer-crash.toml");
    let text = std::fs::read_to_string(&lab).unwrap();
    let broken = text
        .replace("message = \"mid-1\"", "message = \"mid-9\"")
        .replace("\"order-1003\"", "\"order-9999\"");
    std::fs::write(&lab, broken).unwrap();
    let (code, _, stderr) = run(&mut mqlab(&[
        "lab",
        "consumer-crash",
        "--root",
        p.path().to_str().unwrap(),
    ]));
    assert_eq!(code, 2);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines.iter().any(|l| l.contains("consumer-crash.toml:20:")
            && l.contains(": step[1].fault.message: `mid-9` is not published before this step")),
        "{stderr}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains(": step[0].publish.messages[2]: fixture `")),
        "{stderr}"
    );
}

/// A name the vocabulary does not know stops the parse at once, with its
/// position and key path.
#[test]
fn an_unknown_window_names_the_known_ones() {
    let p = scratch_project();
    let lab = p.path().join("labs/consumer-crash.toml");
    let text = std::fs::read_to_string(&lab).unwrap();
    std::fs::write(&lab, text.replace("after-commit-before-ack", "after-lunch")).unwrap();
    expect_setup_error(
        &mut mqlab(&[
            "lab",
            "consumer-crash",
            "--root",
            p.path().to_str().unwrap(),
        ]),
        ": step[1].fault.window: unknown fault window `after-lunch` (known: after-receive,",
    );
}

#[test]
fn missing_broker_binary_says_what_to_install() {
    expect_setup_error(
        mqlab(&["lab", "consumer-crash"])
            .current_dir(root())
            .env("MQLAB_RABBITMQ_BIN", "/nonexistent"),
        "apt-get install rabbitmq-server",
    );
}

#[test]
fn no_lab_named_is_a_usage_error() {
    expect_setup_error(mqlab(&["lab"]).current_dir(root()), "Usage");
}

/// A zero timeout would boot the servers and fail with the Erlang shell's
/// banner; it is a usage error before anything starts.
#[test]
fn a_zero_ready_timeout_is_refused() {
    for args in [
        &["lab", "consumer-crash", "--ready-timeout", "0"][..],
        &["env", "up", "--ready-timeout", "0"][..],
    ] {
        expect_setup_error(
            mqlab(args).current_dir(root()),
            "invalid value '0' for '--ready-timeout <SECS>': 0 is not in 1..",
        );
    }
}

/// A generation mqlab cannot start is refused before anything starts: on an
/// external broker (its own), in a container without a 4.0 image, an
/// unknown one; a missing 4.0 root says how to build it.
#[test]
fn a_rabbitmq_generation_that_cannot_be_run_is_refused() {
    for (args, needle) in [
        (
            &["lab", "consumer-crash", "--env", "containers", "--rabbitmq", "4.0"][..],
            "--rabbitmq 4.0 with --env containers needs a RabbitMQ 4.0 image: --rabbitmq-image REF or MQLAB_RABBITMQ_4_IMAGE",
        ),
        (
            &[
                "lab", "consumer-crash", "--env", "external", "--rabbitmq", "4.0",
                "--amqp-url", "amqp://u:p@127.0.0.1:1",
                "--management-url", "http://u:p@127.0.0.1:2",
                "--database-url", "postgres://u:p@127.0.0.1:3/db",
            ][..],
            "--rabbitmq 4.0 chooses the generation mqlab starts: an external broker's is its own",
        ),
        (
            &["lab", "consumer-crash", "--rabbitmq", "5.0"][..],
            "invalid value '5.0' for '--rabbitmq <GENERATION>'",
        ),
    ] {
        expect_setup_error(
            mqlab(args)
                .env_remove("MQLAB_RABBITMQ_IMAGE")
                .env_remove("MQLAB_RABBITMQ_4_IMAGE")
                .current_dir(root()),
            needle,
        );
    }
    expect_setup_error(
        mqlab(&["lab", "consumer-crash", "--env", "local", "--rabbitmq", "4.0"])
            .env("MQLAB_RABBITMQ_4_ROOT", "/nonexistent")
            .current_dir(root()),
        "RabbitMQ 4.0 needs its Debian trixie root, and `/nonexistent` holds none (hint: `scripts/rabbitmq-4-root.sh` builds it",
    );
}

#[test]
fn unknown_variant() {
    expect_setup_error(
        mqlab(&["lab", "consumer-crash", "--variant", "nope"]).current_dir(root()),
        "unknown variant `nope` of lab `consumer-crash` (known: ack-before-commit",
    );
}

#[test]
fn missing_database_binary_says_what_to_install() {
    expect_setup_error(
        mqlab(&["lab", "consumer-crash"])
            .current_dir(root())
            .env("MQLAB_PG_BIN", "/nonexistent"),
        "apt-get install postgresql",
    );
}

#[test]
fn a_requested_port_already_in_use() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port().to_string();
    expect_setup_error(
        mqlab(&["lab", "consumer-crash", "--amqp-port", &port]).current_dir(root()),
        &format!("port {port} on 127.0.0.1 is already in use (requested by --amqp-port)"),
    );
}

#[test]
#[ignore = "needs root (only root switches users to run PostgreSQL)"]
fn no_system_user_to_run_postgresql_as() {
    assert!(nix::unistd::geteuid().is_root(), "run as root");
    expect_setup_error(
        mqlab(&["lab", "consumer-crash"])
            .current_dir(root())
            .env("MQLAB_PG_USER", "mqlab-no-such-user"),
        "no `mqlab-no-such-user` system user to run PostgreSQL as",
    );
}

/// Credentials exist only in URLs handed to processes, never in what a run writes.
#[test]
fn no_credentials_in_snapshots() {
    for e in std::fs::read_dir(root().join("snapshots")).unwrap() {
        let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
        for secret in ["amqp://", "postgres://", "mqlab:mqlab", "password"] {
            assert!(!text.contains(secret), "`{secret}` in a snapshot");
        }
    }
}

#[test]
fn unwritable_evidence_directory() {
    expect_setup_error(
        mqlab(&[
            "lab",
            "consumer-crash",
            "--evidence",
            "/proc/mqlab-evidence",
        ])
        .current_dir(root()),
        "cannot create evidence directory `/proc/mqlab-evidence`",
    );
}

/// The example workflow users copy must be valid for GitHub Actions.
#[test]
#[ignore = "needs actionlint (.ci/run installs it)"]
fn the_example_workflow_passes_actionlint() {
    let actionlint = require_tool("actionlint", &[]);
    let out = std::process::Command::new(actionlint)
        .arg(root().join(".github/workflows/labs.yml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A fault on a step its target cannot act on: one line with the key path,
/// exit 2, before any server starts.
#[test]
fn a_fault_on_the_wrong_step_names_the_placements() {
    let p = scratch_project();
    let lab = p.path().join("labs/connection-drop.toml");
    let text = std::fs::read_to_string(&lab).unwrap();
    std::fs::write(
        &lab,
        text.replace(
            "target = \"network\", action = \"cut\"",
            "target = \"producer\", action = \"kill\"",
        ),
    )
    .unwrap();
    expect_setup_error(
        &mut mqlab(&[
            "lab",
            "connection-drop",
            "--root",
            p.path().to_str().unwrap(),
        ]),
        "connection-drop.toml:24:",
    );
    let (_, _, stderr) = run(&mut mqlab(&[
        "lab",
        "connection-drop",
        "--root",
        p.path().to_str().unwrap(),
    ]));
    assert!(
        stderr.contains(
            ": step[1].fault.action: `kill` of the producer does not belong on this step"
        ),
        "{stderr}"
    );
    assert_eq!(
        stderr.lines().filter(|l| l.starts_with("error: ")).count(),
        1,
        "{stderr}"
    );
}

#[test]
fn an_env_dir_that_is_not_a_kept_environment() {
    let tmp = tempfile::tempdir().unwrap();
    expect_setup_error(
        mqlab(&["lab", "routing", "--env-dir", tmp.path().to_str().unwrap()]).current_dir(root()),
        "is not an environment started by `mqlab env up`",
    );
    expect_setup_error(
        mqlab(&[
            "explore",
            "routing",
            "--env-dir",
            tmp.path().to_str().unwrap(),
        ])
        .current_dir(root()),
        "is not an environment started by `mqlab env up`",
    );
}

/// A cluster lab's mistakes are told before any node starts: a node count
/// other than 1 or 3, a node that does not exist, a node fault without its
/// node or with a window; a cluster lab mixed with one-node labs, or on an
/// environment that has no cluster.
#[test]
fn cluster_lab_mistakes() {
    let p = scratch_project();
    let lab = p.path().join("labs/quorum-leader-kill.toml");
    let text = std::fs::read_to_string(&lab).unwrap();
    let root_arg = p.path().to_str().unwrap().to_string();
    let cases = [
        ("nodes = 3", "nodes = 2", "`nodes = 2`: a lab runs on 1 node, or on a cluster of 3"),
        ("settle = 3, node = 2", "settle = 3, node = 4", "node 4 does not exist: the lab has 3"),
        (
            "fault = { target = \"node\", node = 1, action = \"kill\" }",
            "fault = { target = \"node\", action = \"kill\" }",
            "a `node` fault names its node",
        ),
        (
            "fault = { target = \"node\", node = 1, action = \"kill\" }",
            "fault = { target = \"node\", node = 1, action = \"hold\" }",
            "a node fault does `hold`, not one of: kill, restart, partition, heal",
        ),
        (
            "fault = { target = \"node\", node = 1, action = \"kill\" }",
            "fault = { target = \"node\", node = 1, action = \"kill\", window = \"after-commit-before-ack\" }",
            "a node fault in a step of its own happens between steps",
        ),
    ];
    // A heal of a node no step cut off (quorum-partition cuts node 1).
    let cut_lab = p.path().join("labs/quorum-partition.toml");
    let cut_text = std::fs::read_to_string(&cut_lab).unwrap();
    std::fs::write(
        &cut_lab,
        cut_text.replacen(
            "fault = { target = \"node\", node = 1, action = \"heal\" }",
            "fault = { target = \"node\", node = 2, action = \"heal\" }",
            1,
        ),
    )
    .unwrap();
    expect_setup_error(
        &mut mqlab(&["lab", "quorum-partition", "--root", &root_arg]),
        "node 2 is healed but no step before cuts it off",
    );
    std::fs::write(&cut_lab, &cut_text).unwrap();
    for (from, to, needle) in cases {
        assert!(text.contains(from), "{from}");
        std::fs::write(&lab, text.replacen(from, to, 1)).unwrap();
        expect_setup_error(
            &mut mqlab(&["lab", "quorum-leader-kill", "--root", &root_arg]),
            needle,
        );
    }
    std::fs::write(&lab, &text).unwrap();
    // A node killed at a producer's window it never passes.
    let failover = p.path().join("labs/publisher-confirm-failover.toml");
    let f_text = std::fs::read_to_string(&failover).unwrap();
    let from = "window = \"after-publish-before-confirm\", message = \"mid-100\"";
    assert!(f_text.contains(from));
    std::fs::write(
        &failover,
        f_text.replacen(from, "window = \"after-confirm\", message = \"mid-100\"", 1),
    )
    .unwrap();
    expect_setup_error(
        &mut mqlab(&["lab", "publisher-confirm-failover", "--root", &root_arg]),
        "`kill` of the node never passes window `after-confirm` (it passes: after-publish-before-confirm)",
    );
    std::fs::write(&failover, &f_text).unwrap();
    expect_setup_error(
        &mut mqlab(&["lab", "quorum-leader-kill", "routing", "--root", &root_arg]),
        "quorum-leader-kill runs on a three-node cluster and routing on one node",
    );
    expect_setup_error(
        &mut mqlab(&[
            "lab", "--group", "cluster", "--env", "external", "--root", &root_arg,
        ]),
        "the cluster labs kill and cut off nodes: not on --env external",
    );
    expect_setup_error(
        &mut mqlab(&["lab", "--group", "cluster", "--keep", "--root", &root_arg]),
        "not for the cluster labs",
    );
    expect_setup_error(
        &mut mqlab(&["explore", "quorum-leader-kill", "--root", &root_arg]),
        "runs on a three-node cluster: explore runs one-node labs",
    );
    // A node fault in a one-node lab.
    let one = p.path().join("labs/broker-restart.toml");
    let text = std::fs::read_to_string(&one).unwrap();
    std::fs::write(
        &one,
        text.replacen(
            "fault = { target = \"broker\", action = \"restart\" }",
            "fault = { target = \"node\", node = 1, action = \"kill\" }",
            1,
        ),
    )
    .unwrap();
    expect_setup_error(
        &mut mqlab(&["lab", "broker-restart", "--root", &root_arg]),
        "a `node` fault needs a cluster: set `nodes = 3`",
    );
}

/// A count's expectation that is no integer, bound or word it prints is
/// refused at load: one line, exit 2, before any server starts.
#[test]
fn a_count_expected_as_a_word_is_refused_at_load() {
    let p = scratch_project();
    let lab = p.path().join("labs/consumer-crash.toml");
    let text = std::fs::read_to_string(&lab).unwrap();
    let broken = text.replacen("duplicatesApplied = 0", "duplicatesApplied = \"zero\"", 1);
    assert_ne!(
        broken, text,
        "the lab no longer expects duplicatesApplied = 0"
    );
    std::fs::write(&lab, broken).unwrap();
    let started = std::time::Instant::now();
    let (code, stdout, stderr) = run(&mut mqlab(&[
        "lab",
        "consumer-crash",
        "--root",
        p.path().to_str().unwrap(),
    ]));
    assert_eq!(code, 2, "{stdout}{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains(
            ": expect.duplicatesApplied: `duplicatesApplied` is a count: an integer or a bound"
        ),
        "{stderr}"
    );
    assert!(
        !stderr.contains("environment ready"),
        "a server started: {stderr}"
    );
    eprintln!("refused in {:?}", started.elapsed());
}
