//! Child processes that cannot outlive the harness: each in its own process
//! group (a terminal's Ctrl-C reaches only the harness, which tears down in
//! order), with PR_SET_PDEATHSIG so that even a SIGKILL of the harness takes
//! them along.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// Spawns with stdout and stderr appended to `log`. Must be called from the
/// thread that lives as long as the run (the runtime's main thread): the
/// death signal fires when the spawning thread exits.
/// With `pipe_stdout`, stdout is a pipe for the caller to read instead.
pub fn spawn(cmd: &mut Command, log: &Path, pipe_stdout: bool) -> Result<Child> {
    spawn_with(cmd, log, pipe_stdout, false)
}

/// `kept`: the process is meant to outlive mqlab (`--keep`): no parent-death
/// signal, no kill on drop. It still carries the run's mark, so
/// `mqlab env down` finds it.
pub fn spawn_with(cmd: &mut Command, log: &Path, pipe_stdout: bool, kept: bool) -> Result<Child> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening `{}`", log.display()))?;
    let err = out.try_clone()?;
    if pipe_stdout {
        cmd.stdout(Stdio::piped());
    } else {
        cmd.stdout(Stdio::from(out));
    }
    cmd.stderr(Stdio::from(err))
        .process_group(0)
        .kill_on_drop(!kept);
    if !kept {
        // SAFETY: prctl is async-signal-safe; nothing is allocated in the child.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
    }
    let program = format!("{:?}", cmd.as_std().get_program());
    cmd.spawn()
        .with_context(|| format!("cannot start {program}"))
}

/// Sends `sig`, waits up to `grace`, then SIGKILLs the whole process group and reaps.
pub async fn stop(child: &mut Child, sig: Signal, grace: Duration) {
    let Some(pid) = child.id() else { return };
    let _ = signal::kill(Pid::from_raw(pid as i32), sig);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = signal::killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        let _ = child.wait().await;
    }
    // Stragglers in the group (backends, helpers) go too.
    let _ = signal::killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
}

/// A role's config, which holds the servers' credentials: a file only its
/// owner reads (an argument would show in `ps` to every user).
pub fn write_private(path: &Path, contents: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write `{}`", path.display()))?;
    f.write_all(contents.as_bytes())?;
    Ok(())
}

/// For Drop paths, where nothing can be awaited.
pub fn kill_now(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = signal::killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        let _ = signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
    }
    let _ = child.start_kill();
    let _ = child.try_wait();
}

/// The last `n` lines of a log file, for "did not become ready" errors.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Waits until process `pid` is stopped (`T` in `/proc/<pid>/stat`): a
/// SIGSTOP is delivered when the process is next scheduled, and a pause
/// that has not taken yet would let the broker answer.
pub async fn await_stopped(pid: u32, within: Duration) -> Result<()> {
    let deadline = std::time::Instant::now() + within;
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .with_context(|| format!("process {pid} is gone"))?;
        // The state follows the command name's closing parenthesis.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        if state == Some('T') {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!(
                "process {pid} is not stopped {within:?} after SIGSTOP (state {state:?})"
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `pid`'s state letter and parent, from `/proc/<pid>/stat` (None: gone).
fn stat(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name's closing parenthesis.
    let mut rest = stat.rsplit_once(") ")?.1.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let parent = rest.next()?.parse().ok()?;
    Some((state, parent))
}

/// SIGKILLs `child` and every child of it (a server that forks one process
/// per connection, in sessions of their own: PostgreSQL), as a power loss
/// kills them all at once; returns once each is dead (a zombie waiting to
/// be reaped by whoever adopted it has closed its files). The parent is
/// stopped first, so that it forks no child between the listing and the
/// kills.
pub async fn kill_tree(child: &mut Child) -> Result<()> {
    let Some(pid) = child.id() else {
        return Ok(()); // already reaped
    };
    let _ = signal::kill(Pid::from_raw(pid as i32), Signal::SIGSTOP);
    // A SIGSTOP takes when the process is next scheduled: a fork under
    // way would still give a child, so the listing waits for the stop.
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while stat(pid).is_some_and(|(state, _)| !matches!(state, 'T' | 'Z' | 'X'))
        && std::time::Instant::now() < until
    {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut all = vec![pid];
    for e in std::fs::read_dir("/proc")?.flatten() {
        if let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() {
            if stat(p).is_some_and(|(_, parent)| parent == pid) {
                all.push(p);
            }
        }
    }
    for p in all.iter().rev() {
        let _ = signal::kill(Pid::from_raw(*p as i32), Signal::SIGKILL);
    }
    child.wait().await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for p in &all[1..] {
        while stat(*p).is_some_and(|(state, _)| !matches!(state, 'Z' | 'X')) {
            if std::time::Instant::now() > deadline {
                anyhow::bail!("process {p} outlived its SIGKILL by 10 s");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    Ok(())
}

/// The children of `pid` whose command line starts with `prefix`
/// (`postgres: walwriter`).
pub fn children_named(pid: u32, prefix: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if stat(p).is_some_and(|(_, parent)| parent == pid) {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            if cmd.starts_with(prefix.as_bytes()) {
                out.push(p);
            }
        }
    }
    out
}
