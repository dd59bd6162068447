//! Helpers for tests that run the real `mqlab` binary.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mqlab::env::guard::marked_processes;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn mqlab(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mqlab"));
    // The local environment unless a test asks for containers: CI exports
    // DOCKER_HOST and images, which `--env auto` would pick up.
    // Nor the mark of a test that runs an environment in-process
    // (`RunDir::create` sets it in this process): that test's cleanup would
    // take this mqlab for one of its own processes and kill it (seen: two
    // cluster tests at once, mqlab killed, exit -1).
    c.args(args)
        .env_remove("MQLAB_ROOT")
        .env_remove(mqlab::env::guard::RUN_VAR)
        .env("MQLAB_ENV", "local");
    c
}

pub fn run(cmd: &mut Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("mqlab runs");
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// A throwaway project root with copies of labs/, fixtures/ and snapshots/, to break on purpose.
pub fn scratch_project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for sub in ["labs", "fixtures", "snapshots"] {
        copy_dir(&root().join(sub), &dir.path().join(sub));
    }
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.path().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// The snapshot body (after insta's `---` header).
pub fn snapshot_body(lab: &str) -> String {
    let text = std::fs::read_to_string(root().join(format!("snapshots/{lab}.snap"))).unwrap();
    text.splitn(3, "---\n").nth(2).unwrap().to_string()
}

/// A run of mqlab in a private TMPDIR, with its stdout lines on a channel.
pub struct Run {
    child: Child,
    tmp: tempfile::TempDir,
    lines: mpsc::Receiver<String>,
    stderr: std::thread::JoinHandle<String>,
}

pub fn start(args: &[&str], env: &[(&str, &str)]) -> Run {
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
    pub fn run_dir(&self) -> PathBuf {
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

    /// Waits for a stdout line containing `needle`; fails at once when
    /// mqlab closes its stdout (it exited) and, either way, shows the last
    /// lines it printed, so a failed wait says where the run was.
    pub fn wait_for_line(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut seen: Vec<String> = Vec::new();
        let why = loop {
            match self.lines.recv_timeout(Duration::from_secs(1)) {
                Ok(l) if l.contains(needle) => return,
                Ok(l) => seen.push(l),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    break "mqlab closed its stdout (it exited)"
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if Instant::now() > deadline {
                break "90 s passed";
            }
        };
        let last = seen[seen.len().saturating_sub(15)..].join("\n");
        panic!("no line containing `{needle}`: {why}; its last lines:\n{last}");
    }

    pub fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    /// Waits for mqlab to exit, then for its processes and files to be gone.
    pub fn finish(mut self, run_dir: &Path) -> (i32, String) {
        let status = self.child.wait().unwrap();
        let stderr = self.stderr.join().unwrap();
        let code = status.code().unwrap_or(-1);
        assert_nothing_left(self.tmp.path(), run_dir, &stderr);
        (code, stderr)
    }
}

pub fn assert_nothing_left(tmp: &Path, run_dir: &Path, stderr: &str) {
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

/// A checking tool an `#[ignore = "needs ..."]` test runs (`MQLAB_<NAME>`,
/// the candidates, then PATH). Such a test runs only when asked
/// (`cargo test -- --ignored`, as `.ci/run` does after installing the
/// tools); then a missing tool fails it, never a silent pass.
pub fn require_tool(name: &str, candidates: &[&str]) -> PathBuf {
    candidates
        .iter()
        .map(PathBuf::from)
        .chain(std::env::var_os(format!("MQLAB_{}", name.to_uppercase())).map(PathBuf::from))
        .chain(
            std::env::var_os("PATH")
                .iter()
                .flat_map(std::env::split_paths)
                .map(|d| d.join(name)),
        )
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("this test needs `{name}` (.ci/run installs it)"))
}

/// The container images an `#[ignore]`d containers test needs (`.ci/run`
/// builds them and exports MQLAB_RABBITMQ_IMAGE and MQLAB_POSTGRES_IMAGE).
pub fn require_images() -> (String, String) {
    match (
        std::env::var("MQLAB_RABBITMQ_IMAGE"),
        std::env::var("MQLAB_POSTGRES_IMAGE"),
    ) {
        (Ok(r), Ok(p)) => (r, p),
        _ => panic!(
            "this test needs a container engine and MQLAB_RABBITMQ_IMAGE / MQLAB_POSTGRES_IMAGE (.ci/run prepares them)"
        ),
    }
}

/// The one-node runs of the project's labs that `keep` selects.
pub fn one_node_runs(keep: impl Fn(&mqlab::lab::Lab) -> bool) -> Vec<String> {
    let project = mqlab::lab::Project { root: root() };
    let mut runs = Vec::new();
    for lab in project.lab_names().unwrap() {
        for run in project.runs_of(&lab).unwrap() {
            let l = project.load(&run).unwrap();
            if !l.is_cluster() && keep(&l) {
                runs.push(run);
            }
        }
    }
    runs
}

/// Containers and networks labelled with the run, once the guard had 15 s.
pub fn labelled_left(dir: &std::path::Path) -> (usize, usize) {
    use testcontainers::bollard::query_parameters::{
        ListContainersOptionsBuilder, ListNetworksOptionsBuilder,
    };
    let label = format!("mqlab.run={}", dir.display());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let docker = mqlab::env::containers::engine().await.unwrap();
        let filters = std::collections::HashMap::from([("label".to_string(), vec![label.clone()])]);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let containers = ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build();
            let networks = ListNetworksOptionsBuilder::default()
                .filters(&filters)
                .build();
            let left = (
                docker
                    .list_containers(Some(containers))
                    .await
                    .map(|l| l.len()),
                docker.list_networks(Some(networks)).await.map(|l| l.len()),
            );
            match left {
                (Ok(0), Ok(0)) => return (0, 0),
                (Ok(c), Ok(n)) if Instant::now() > deadline => return (c, n),
                (Err(e), _) | (_, Err(e)) if Instant::now() > deadline => {
                    panic!("cannot list containers or networks: {e}")
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    })
}
