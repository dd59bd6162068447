//! The run directory, and a guard process that outlives the harness just long
//! enough to clean up after it. Every process a run starts carries
//! `MQLAB_RUN=<run dir>` in its environment; when the harness goes away,
//! however it goes (even SIGKILL), the guard's stdin closes and it kills every
//! process carrying that mark, then removes the directory.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The environment variable that marks a run's processes.
pub const RUN_VAR: &str = "MQLAB_RUN";

pub struct RunDir {
    path: PathBuf,
    guard: Option<(Child, ChildStdin)>,
}

impl RunDir {
    /// Creates the directory under the system temp dir (`TMPDIR`), marks this
    /// process (children inherit the mark) and starts the guard.
    pub fn create(exe: &Path) -> Result<RunDir> {
        let path = tempfile::Builder::new()
            .prefix("mqlab-")
            .tempdir()
            .context("creating the run directory")?
            .keep();
        // Traversable (PostgreSQL runs as another user), writable by us only.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        // Single-threaded at this point: the runtime starts after.
        std::env::set_var(RUN_VAR, &path);
        let mut run = RunDir { path, guard: None };
        let mut cmd = Command::new(exe);
        cmd.args(["guard", "--dir"])
            .arg(&run.path)
            .env_remove(RUN_VAR)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own group: a terminal's Ctrl-C must not take it down first.
            .process_group(0);
        let mut child = cmd.spawn().context("cannot start the cleanup guard")?;
        let stdin = child.stdin.take().context("guard stdin")?;
        run.guard = Some((child, stdin));
        Ok(run)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Normal end: remove what is left and let the guard go.
    pub fn close(mut self) {
        self.finish();
    }

    /// `--keep`: tell the guard to leave everything in place, and keep it.
    pub fn keep(mut self) -> PathBuf {
        if let Some((mut child, mut stdin)) = self.guard.take() {
            let _ = std::io::Write::write_all(&mut stdin, KEEP);
            drop(stdin);
            let _ = child.wait();
        }
        std::mem::take(&mut self.path)
    }

    fn finish(&mut self) {
        if self.path.as_os_str().is_empty() {
            return; // kept
        }
        reap(&self.path, Duration::from_secs(5));
        if let Some((mut child, stdin)) = self.guard.take() {
            drop(stdin);
            let _ = child.wait();
        }
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        self.finish();
    }
}

/// What the harness writes to the guard when the run is to be kept.
const KEEP: &[u8] = b"keep\n";

/// `mqlab guard --dir D`: waits for its stdin to close, then cleans up,
/// unless the harness said the run is kept.
pub fn guard_main(dir: &Path) -> i32 {
    let mut said = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut said);
    if said != KEEP {
        // Containers are not processes of ours: remove them through the
        // engine, before the directory, whose removal says the cleanup is done.
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(super::containers::remove_labelled(&dir.to_string_lossy()));
        }
        // A cluster's iptables chain is not a process either.
        if let Ok(chain) = std::fs::read_to_string(chain_file(dir)) {
            remove_chain(chain.trim());
        }
        reap(dir, Duration::from_secs(10));
    }
    0
}

/// Where a run that created an iptables chain (a cluster's partitions)
/// names it, for the guard.
pub fn chain_file(run_dir: &Path) -> PathBuf {
    run_dir.join("iptables-chain")
}

/// Unhooks and deletes a chain; each step may already be done.
pub fn remove_chain(chain: &str) {
    for args in [
        vec!["-D", "INPUT", "-j", chain],
        vec!["-F", chain],
        vec!["-X", chain],
    ] {
        let _ = Command::new("iptables")
            .arg("-w")
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Kills every process marked with this run, waits for them to go, then
/// removes the directory. The removal is retried until it succeeds: a
/// process killed by its parent-death signal at the same moment may have an
/// exited main thread (its environment already unreadable, so it no longer
/// counts as marked) while another thread finishes a `write` or `open` in
/// the directory, which makes one `remove_dir_all` fail with a new entry.
/// Once the directory itself is gone nothing can create files in it again.
/// A lazy file system's mount under it goes first (detached: a harness
/// killed while mounted left it dead, and every removal under a dead
/// mount fails).
pub fn reap(dir: &Path, patience: Duration) {
    crate::lazyfs::detach_fuse_mounts_under(dir);
    let mark = dir.to_string_lossy().into_owned();
    let deadline = Instant::now() + patience;
    loop {
        let pids = marked_processes(&mark);
        for pid in &pids {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        if pids.is_empty() {
            match std::fs::remove_dir_all(dir) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(_) => {}
            }
        }
        if Instant::now() > deadline {
            let _ = std::fs::remove_dir_all(dir);
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Live processes of the run in directory `mark`: those whose environment
/// carries `MQLAB_RUN=<mark>` (zombies have no environment left and are not
/// counted), and PostgreSQL processes working inside the directory. A PostgreSQL backend
/// is one of the second kind only: it writes its process title over its
/// environment, and it leaves the postmaster's process group (setsid), so
/// one stuck when its postmaster was killed (seen: a `CREATE DATABASE`
/// waiting forever on a lock of a dead process) is found by its working
/// directory, the cluster's data directory.
pub fn marked_processes(mark: &str) -> Vec<i32> {
    let needle = format!("{RUN_VAR}={mark}");
    let me = std::process::id() as i32;
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    // A PostgreSQL process only: a shell someone opened in the run
    // directory to read its logs is not the run's.
    let inside = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "postgres")
            && std::fs::read_link(format!("/proc/{pid}/cwd"))
                .is_ok_and(|cwd| works_in(&cwd.to_string_lossy(), mark))
    };
    rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
                .unwrap_or(false)
                || inside(*pid)
        })
        .collect()
}

/// Whether a working directory (as `/proc/<pid>/cwd` reads, ` (deleted)`
/// once removed) lies inside the run directory `dir`.
fn works_in(cwd: &str, dir: &str) -> bool {
    let cwd = cwd.strip_suffix(" (deleted)").unwrap_or(cwd);
    let dir = dir.trim_end_matches('/');
    !dir.is_empty()
        && cwd
            .strip_prefix(dir)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    /// A process counts as the run's when it works in the run directory or
    /// below it, the directory removed or not; a sibling with a longer name
    /// does not.
    #[test]
    fn a_working_directory_inside_the_run() {
        let run = "/tmp/x/mqlab-ab";
        assert!(super::works_in(
            "/tmp/x/mqlab-ab/env/pg/data (deleted)",
            run
        ));
        assert!(super::works_in("/tmp/x/mqlab-ab", run));
        assert!(super::works_in("/tmp/x/mqlab-ab/env", "/tmp/x/mqlab-ab/"));
        assert!(!super::works_in("/tmp/x/mqlab-abc/env", run));
        assert!(!super::works_in("/tmp/x", run));
        assert!(!super::works_in("/", ""));
    }
}
