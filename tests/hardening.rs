//! Failure modes of the harness itself: whatever ends a run (success, a failed
//! lab, Ctrl-C, SIGTERM, a panic, SIGKILL of mqlab), nothing it started is
//! left running and its temporary directory is gone.

mod common;
use common::*;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use mqlab::env::guard::marked_processes;
use nix::sys::signal::Signal;

#[test]
fn success_leaves_nothing_and_the_run_dir_is_private() {
    let run = start(&["lab", "routing"], &[]);
    let dir = run.run_dir();
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o002, 0, "run directory is world-writable: {mode:o}");
    let (code, stderr) = run.finish(&dir);
    assert_eq!(code, 0, "{stderr}");
}

/// A consume phase that cannot finish (it waits for a fourth message of
/// three) ends at its deadline with the phase named, exit 1.
#[test]
fn a_phase_deadline_fails_the_lab_and_leaves_nothing() {
    let project = scratch_project();
    let lab = project.path().join("labs/routing.toml");
    let text = std::fs::read_to_string(&lab).unwrap();
    let stuck = text.replace(
        "consume = { queue = \"orders.routing.eu\", service = \"eu-tax-service\", settle = \"drain\" }",
        "consume = { queue = \"orders.routing.eu\", service = \"eu-tax-service\", settle = 2, deadline_secs = 2 }",
    );
    assert_ne!(stuck, text);
    std::fs::write(&lab, stuck).unwrap();
    let run = start(
        &["lab", "routing", "--root", project.path().to_str().unwrap()],
        &[],
    );
    let dir = run.run_dir();
    let (code, stderr) = run.finish(&dir);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("phase consume(orders.routing.eu) exceeded 2 s"),
        "{stderr}"
    );
}

#[test]
fn ctrl_c_while_a_consumer_runs_tears_everything_down() {
    let run = start(&["lab", "consumer-crash"], &[]);
    let dir = run.run_dir();
    run.wait_for_line("[consumer]");
    run.signal(Signal::SIGINT);
    let (code, stderr) = run.finish(&dir);
    assert_eq!(code, 130, "{stderr}");
    assert!(stderr.contains("interrupted (SIGINT)"), "{stderr}");
}

#[test]
fn sigterm_while_the_broker_boots_tears_everything_down() {
    let run = start(&["lab", "consumer-crash"], &[]);
    let dir = run.run_dir();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !dir.join("env/rabbit/log").exists() {
        assert!(Instant::now() < deadline, "the broker never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    run.signal(Signal::SIGTERM);
    let (code, stderr) = run.finish(&dir);
    assert_eq!(code, 130, "{stderr}");
}

#[test]
fn a_panic_in_the_harness_is_one_line_and_leaves_nothing() {
    let run = start(&["lab", "consumer-crash"], &[("MQLAB_PANIC_AT", "inspect")]);
    let dir = run.run_dir();
    let (code, stderr) = run.finish(&dir);
    assert_eq!(code, 101, "{stderr}");
    assert!(
        stderr.contains("mqlab: internal error: failpoint MQLAB_PANIC_AT=inspect"),
        "{stderr}"
    );
    assert!(!stderr.contains("stack backtrace"), "{stderr}");
}

/// Nothing in mqlab runs after SIGKILL: the guard process and the children's
/// parent-death signal do the cleaning.
#[test]
fn sigkill_of_the_harness_leaves_nothing() {
    let run = start(&["lab", "consumer-crash"], &[]);
    let dir = run.run_dir();
    run.wait_for_line("[consumer]");
    run.signal(Signal::SIGKILL);
    let (code, _) = run.finish(&dir);
    assert_eq!(code, -1, "killed by a signal");
}

/// A lab whose database runs on the lazy file system (a power-loss lab),
/// interrupted with its mount up, by Ctrl-C and by SIGKILL of mqlab: no
/// FUSE mount is left (the run's teardown unmounts it; after a SIGKILL the
/// guard detaches it), nor its PostgreSQL, nor its files; also with the
/// database's WAL writer held (`@async-commit`), which sees no signal.
#[test]
fn a_power_loss_lab_interrupted_leaves_no_mount() {
    for (lab, sig, want) in [
        ("commit-durability", Signal::SIGINT, 130),
        ("commit-durability", Signal::SIGKILL, -1),
        ("commit-durability@async-commit", Signal::SIGINT, 130),
    ] {
        let run = start(&["lab", lab], &[]);
        let dir = run.run_dir();
        run.wait_for_line("[consumer]");
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        assert_eq!(
            mqlab::lazyfs::fuse_mounts_under(&mounts, &dir).len(),
            1,
            "the run's database is not on the lazy file system"
        );
        run.signal(sig);
        let (code, stderr) = run.finish(&dir);
        assert_eq!(code, want, "{lab} {sig}: {stderr}");
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        let left = mqlab::lazyfs::fuse_mounts_under(&mounts, &dir);
        assert!(left.is_empty(), "{lab} {sig}: left mounted: {left:?}");
    }
}

/// `--keep` leaves both servers reachable after mqlab exits; `mqlab env down`
/// stops them and removes the directory.
#[test]
fn keep_then_env_down() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, _, stderr) = run(mqlab(&["lab", "routing", "--keep"])
        .current_dir(root())
        .env("TMPDIR", tmp.path()));
    assert_eq!(code, 0, "{stderr}");
    let dir = stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("stop it with: mqlab env down "))
        .expect("the stop command is printed")
        .to_string();
    let port = |scheme: &str| -> u16 {
        let url = stderr
            .split_whitespace()
            .find(|w| w.starts_with(scheme))
            .unwrap();
        let hostport = url.rsplit_once('@').unwrap().1.split('/').next().unwrap();
        hostport.rsplit_once(':').unwrap().1.parse().unwrap()
    };
    for p in [port("amqp://"), port("postgres://")] {
        std::net::TcpStream::connect(("127.0.0.1", p)).expect("a kept server accepts connections");
    }
    assert!(!marked_processes(&dir).is_empty());
    let (code, _, stderr) = run(&mut mqlab(&["env", "down", &dir]));
    assert_eq!(code, 0, "{stderr}");
    assert_nothing_left(tmp.path(), Path::new(&dir), &stderr);
}

/// `mqlab env up` keeps an environment; labs run on it warm with
/// `--env-dir`, twice (the second run's vhosts hold what the first left, and
/// its broker is the one the first restarted); a lab that needs a vhost the
/// environment lacks is refused before anything runs; `env down` leaves
/// nothing.
#[test]
fn env_up_warm_runs_then_env_down() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = run(mqlab(&["env", "up"])
        .current_dir(root())
        .env("TMPDIR", tmp.path()));
    assert_eq!(code, 0, "{stderr}");
    let dir = stdout.trim().to_string();
    // `env down` even when an assertion below fails (again at the end).
    struct Down(String);
    impl Drop for Down {
        fn drop(&mut self) {
            let _ = mqlab(&["env", "down", &self.0]).output();
        }
    }
    let _down = Down(dir.clone());
    assert!(
        Path::new(&dir).join("kept.json").is_file(),
        "{stdout}\n{stderr}"
    );
    for _ in 0..2 {
        let (code, stdout, stderr) = run(mqlab(&[
            "lab",
            "broker-restart",
            "consumer-crash",
            "routing",
            "--env-dir",
            &dir,
        ])
        .current_dir(root())
        .env("TMPDIR", tmp.path()));
        assert_eq!(code, 0, "{stdout}\n{stderr}");
        assert!(stdout.contains("3 passed, 0 failed"), "{stdout}");
        assert!(stderr.contains(&format!("--env-dir {dir}")), "{stderr}");
    }
    // Another mqlab holds the environment: refused, exit 2, nothing run.
    let lock = std::fs::File::open(Path::new(&dir).join("kept.lock")).unwrap();
    lock.lock().unwrap();
    let (code, _, stderr) = run(mqlab(&["lab", "routing", "--env-dir", &dir]).current_dir(root()));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("another mqlab is running on the environment"),
        "{stderr}"
    );
    drop(lock);
    let scratch = scratch_project();
    let extra = scratch.path().join("labs/routing-copy.toml");
    let text = std::fs::read_to_string(scratch.path().join("labs/routing.toml")).unwrap();
    std::fs::write(
        &extra,
        text.replacen("name = \"routing\"", "name = \"routing-copy\"", 1),
    )
    .unwrap();
    std::fs::copy(
        scratch.path().join("snapshots/routing.snap"),
        scratch.path().join("snapshots/routing-copy.snap"),
    )
    .unwrap();
    let (code, _, stderr) = run(&mut mqlab(&[
        "lab",
        "routing-copy",
        "--env-dir",
        &dir,
        "--root",
        scratch.path().to_str().unwrap(),
    ]));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("has no vhost `routing-copy`"), "{stderr}");
    let (code, _, stderr) = run(&mut mqlab(&["env", "down", &dir]));
    assert_eq!(code, 0, "{stderr}");
    assert_nothing_left(tmp.path(), Path::new(&dir), &stderr);
}

/// SIGKILL of `mqlab lab --all` at 8 moments spread over its boot and its
/// first labs: every time, no marked process and no file is left. The
/// moments are the experiment's input, not a wait for something to happen:
/// by default a fixed sequence (the default `cargo test` is deterministic);
/// `MQLAB_KILL_SEED=<n>` draws them from a seed, `MQLAB_KILL_SEED=random`
/// from the clock, and the seed is printed to run the same moments again.
#[test]
fn sigkill_at_random_moments_leaves_nothing() {
    let seed = match std::env::var("MQLAB_KILL_SEED").ok().as_deref() {
        None => None,
        Some("random") => Some(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64,
        ),
        Some(s) => Some(s.parse().expect("MQLAB_KILL_SEED: a number or `random`")),
    };
    let moments: Vec<Duration> = match seed {
        // Spread over the boot (about 5 s on 2 idle cores) and the labs
        // that run first.
        None => [150, 700, 1_900, 3_100, 4_400, 5_600, 7_900, 11_300]
            .map(Duration::from_millis)
            .to_vec(),
        Some(seed) => {
            eprintln!("MQLAB_KILL_SEED={seed}");
            let mut x = seed | 1;
            (0..8)
                .map(|_| {
                    // xorshift: reproducible from the seed
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    Duration::from_millis(x % 12_000)
                })
                .collect()
        }
    };
    for (i, after) in moments.into_iter().enumerate() {
        let run = start(&["lab", "--all"], &[]);
        let dir = run.run_dir();
        std::thread::sleep(after);
        run.signal(Signal::SIGKILL);
        eprintln!("kill {i}: after {after:?}");
        let (code, _) = run.finish(&dir);
        assert_eq!(code, -1, "kill {i} after {after:?}: killed by a signal");
    }
}
