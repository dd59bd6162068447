//! Failure modes of the harness itself: whatever ends a run (success, a failed
//! lab, Ctrl-C, SIGTERM, a panic, SIGKILL of mqlab), nothing it started is
//! left running and its temporary directory is gone.

mod common;
use common::*;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mqlab::env::guard::marked_processes;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A run of mqlab in a private TMPDIR, with its stdout lines on a channel.
struct Run {
    child: Child,
    tmp: tempfile::TempDir,
    lines: mpsc::Receiver<String>,
    stderr: std::thread::JoinHandle<String>,
}

fn start(args: &[&str], env: &[(&str, &str)]) -> Run {
    let tmp = tempfile::tempdir().unwrap();
    let mut cmd = mqlab(args);
    cmd.current_dir(root())
        .env("TMPDIR", tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let (tx, lines) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let err = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            s.push_str(&l);
            s.push('\n');
        }
        s
    });
    Run {
        child,
        tmp,
        lines,
        stderr,
    }
}

impl Run {
    fn run_dir(&self) -> PathBuf {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(e) = std::fs::read_dir(self.tmp.path())
                .unwrap()
                .flatten()
                .find(|e| e.file_name().to_string_lossy().starts_with("mqlab-"))
            {
                return e.path();
            }
            assert!(Instant::now() < deadline, "no run directory appeared");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_for_line(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(90);
        while Instant::now() < deadline {
            if let Ok(l) = self.lines.recv_timeout(Duration::from_secs(1)) {
                if l.contains(needle) {
                    return;
                }
            }
        }
        panic!("no line containing `{needle}`");
    }

    fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    /// Waits for mqlab to exit, then for its processes and files to be gone.
    fn finish(mut self, run_dir: &Path) -> (i32, String) {
        let status = self.child.wait().unwrap();
        let stderr = self.stderr.join().unwrap();
        let code = status.code().unwrap_or(-1);
        assert_nothing_left(self.tmp.path(), run_dir, &stderr);
        (code, stderr)
    }
}

fn assert_nothing_left(tmp: &Path, run_dir: &Path, stderr: &str) {
    let mark = run_dir.to_string_lossy();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left = marked_processes(&mark);
        let files: Vec<_> = std::fs::read_dir(tmp)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        if left.is_empty() && files.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            let cmds: Vec<String> = left
                .iter()
                .map(|p| {
                    std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                        .unwrap_or_default()
                        .replace('\0', " ")
                })
                .collect();
            panic!("left behind: processes {cmds:?}, files {files:?}\nstderr:\n{stderr}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

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
        "consume = { queue = \"orders.routing.eu\", settle = 1 }",
        "consume = { queue = \"orders.routing.eu\", settle = 2, deadline_secs = 2 }",
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
