//! The local environment's RabbitMQ node: its binaries (the host's, or a
//! generation's root), how it is launched and launched again, its broker
//! faults (kill, restart, pause) and node 1 as [`Nodes`] sees it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::Signal;
use tokio::process::{Child, ChildStdin, Command};

use super::{Kept, LocalEnv, KEPT_FILE};
use crate::broker::rabbitmq;
use crate::env::guard::RUN_VAR;
use crate::env::nodes::{self, Nodes, Server};
use crate::env::rabbitmq::definitions_json;
use crate::env::{postgres, process, EnvOptions};

pub(in crate::env) struct Binaries {
    pub(in crate::env) rabbitmq_server: PathBuf,
    pub(in crate::env) epmd: PathBuf,
    /// The generation's root the RabbitMQ binaries run in (4.0), or none
    /// (the host's own packages).
    pub(in crate::env) root: Option<PathBuf>,
    pub(in crate::env) pg_bin: PathBuf,
}

impl Binaries {
    pub(in crate::env) fn find(generation: crate::env::Generation) -> Result<Binaries> {
        let (rabbitmq_server, epmd, root) = match generation {
            crate::env::Generation::V3_10 => {
                let (server, epmd) = host_rabbitmq()?;
                (server, epmd, None)
            }
            crate::env::Generation::V4_0 => {
                // Its mount namespace and chroot need root.
                if !nix::unistd::geteuid().is_root() {
                    bail!("RabbitMQ 4.0 runs in its Debian trixie root through a mount namespace and chroot, which need root (or run with --rabbitmq 3.10)");
                }
                let root = crate::env::rabbitmq_4_root();
                if !root.join(".mqlab-ready").is_file() {
                    bail!(
                        "RabbitMQ 4.0 needs its Debian trixie root, and `{}` holds none (hint: `scripts/rabbitmq-4-root.sh` builds it in about a minute, or set MQLAB_RABBITMQ_4_ROOT)",
                        root.display()
                    );
                }
                let server = PathBuf::from("/usr/lib/rabbitmq/bin/rabbitmq-server");
                let epmd = PathBuf::from("/usr/bin/epmd");
                for p in [&server, &epmd] {
                    let inside = root.join(p.strip_prefix("/").unwrap_or(p));
                    if !inside.exists() {
                        bail!("the RabbitMQ 4.0 root lacks `{}` (hint: remove it and run `scripts/rabbitmq-4-root.sh` again)", inside.display());
                    }
                }
                (server, epmd, Some(root))
            }
        };
        let pg_bin = postgres::bindir()?;
        Ok(Binaries {
            rabbitmq_server,
            epmd,
            root,
            pg_bin,
        })
    }
}

/// The host's RabbitMQ (3.10 on Debian bookworm) and epmd.
pub(in crate::env) fn host_rabbitmq() -> Result<(PathBuf, PathBuf)> {
    let rabbit_dir = std::env::var_os("MQLAB_RABBITMQ_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/usr/lib/rabbitmq/bin".into());
    let rabbitmq_server = rabbit_dir.join("rabbitmq-server");
    if !rabbitmq_server.exists() {
        bail!(
            "RabbitMQ is not installed: `{}` is missing (hint: `apt-get install rabbitmq-server`, or set MQLAB_RABBITMQ_BIN)",
            rabbitmq_server.display()
        );
    }
    let epmd = ["/usr/bin/epmd", "/usr/lib/erlang/bin/epmd"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .context("Erlang's `epmd` is missing (hint: `apt-get install erlang-base`)")?;
    Ok((rabbitmq_server, epmd))
}

/// Runs its arguments inside a generation's root: a mount namespace of its
/// own (`unshare --mount`, no fork: the pid stays the program's, so signals
/// and /proc reads reach the node itself), where the root gets /proc, /dev,
/// a /tmp of its own and the run directory bound at the same path, then
/// `chroot`. The mounts go with the process: nothing is left mounted.
///
/// `chroot` moves to the root's `/`: the command goes back to its working
/// directory inside (the node's own, under the run directory: its crash
/// dumps land there, not in the shared root), or stays at `/` where that
/// directory is not visible inside. A run directory outside `/tmp` leaves
/// its empty mount point in the root.
pub(in crate::env) const ROOTED: &str = r#"set -e
r=$1; d=$2; shift 2
mount -t proc proc "$r/proc"
mount --bind /dev "$r/dev"
mount -t tmpfs -o mode=1777 tmpfs "$r/tmp"
mkdir -p "$r$d"
mount --bind "$d" "$r$d"
exec chroot "$r" /bin/sh -c 'cd "$0" 2>/dev/null || cd /; exec "$@"' "$PWD" "$@""#;

/// `program` on the host, or inside `root` with `bind` visible there.
pub(in crate::env) fn rooted(root: Option<&Path>, bind: &Path, program: &Path) -> Command {
    match root {
        None => Command::new(program),
        Some(r) => {
            let mut cmd = Command::new("unshare");
            cmd.args(["--mount", "--", "sh", "-c", ROOTED, "mqlab-rooted"])
                .arg(r)
                .arg(bind)
                .arg(program);
            cmd
        }
    }
}

/// How the node was started, kept to start it again after a kill (also by
/// another mqlab, from kept.json; a cluster's other nodes are derived from
/// node 1's).
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub(in crate::env) struct RabbitLaunch {
    pub(in crate::env) program: PathBuf,
    /// The generation's root it runs in (4.0), with the run directory bound.
    #[serde(default)]
    pub(in crate::env) root: Option<(PathBuf, PathBuf)>,
    pub(in crate::env) envs: Vec<(String, std::ffi::OsString)>,
    pub(in crate::env) out: PathBuf,
    pub(in crate::env) log: PathBuf,
}

impl RabbitLaunch {
    /// Starts a node that is not kept (a cluster's node 2 or 3): its stdin a
    /// pipe held by the returned handle.
    pub(in crate::env) fn spawn(&self) -> Result<(Child, Option<ChildStdin>)> {
        let mut cmd = self.command();
        let mut child = process::spawn_with(&mut cmd, &self.out, false, false)?;
        let stdin = child.stdin.take();
        Ok((child, stdin))
    }

    /// The node's command: its environment only, stdin a pipe, and its own
    /// directory as cwd (its crash dumps, MnesiaCore.* and erl_crash.dump,
    /// land there, not in the user's).
    fn command(&self) -> Command {
        let mut cmd = self.rooted(&self.program);
        cmd.env_clear()
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped());
        if let Some(dir) = self.out.parent() {
            cmd.current_dir(dir);
        }
        cmd
    }

    /// `rabbitmqctl eval EXPR` on this node: its printed result, trimmed.
    pub(in crate::env) async fn eval(&self, expr: &str) -> Result<String> {
        let ctl = self.program.with_file_name("rabbitmqctl");
        let mut cmd = self.rooted(&ctl);
        cmd.env_clear()
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .args(["eval", expr])
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
            .await
            .with_context(|| format!("`rabbitmqctl eval {expr}` did not answer within 30 s"))?
            .with_context(|| format!("cannot run {}", ctl.display()))?;
        if !out.status.success() {
            bail!(
                "`rabbitmqctl eval {expr}` failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    fn rooted(&self, program: &Path) -> Command {
        match &self.root {
            Some((root, bind)) => rooted(Some(root), bind, program),
            None => Command::new(program),
        }
    }

    pub(in crate::env) fn set(&mut self, key: &str, value: impl Into<std::ffi::OsString>) {
        let value = value.into();
        match self.envs.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.envs.push((key.to_string(), value)),
        }
    }
}

impl LocalEnv {
    pub(in crate::env) fn spawn_rabbit(
        &mut self,
        bins: &Binaries,
        root: &Path,
        opts: &EnvOptions,
        dist_port: u16,
        epmd_port: u16,
    ) -> Result<()> {
        let base = root.join("rabbit");
        let home = base.join("home");
        for d in ["home", "etc", "mnesia", "log"] {
            std::fs::create_dir_all(base.join(d))?;
        }
        self.write_rabbit_files(&base, opts)?;
        self.spawn_epmd(bins, &base, opts, epmd_port)?;

        let (node, erl_args) = match &opts.cluster {
            None => (
                "mqlab@localhost".to_string(),
                "-kernel inet_dist_use_interface {127,0,0,1}".to_string(),
            ),
            Some(c) => (c.node_name(1), c.erl_args(1)),
        };
        let mut envs: Vec<(&str, std::ffi::OsString)> = vec![
            ("PATH", std::env::var_os("PATH").unwrap_or_default()),
            ("HOME", home.into()),
            ("RABBITMQ_NODENAME", node.clone().into()),
            ("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1".into()),
            (
                "RABBITMQ_NODE_PORT",
                self.endpoints.broker.port.to_string().into(),
            ),
            ("RABBITMQ_DIST_PORT", dist_port.to_string().into()),
            ("ERL_EPMD_PORT", epmd_port.to_string().into()),
            ("RABBITMQ_CONF_ENV_FILE", "/dev/null".into()),
            (
                "RABBITMQ_CONFIG_FILE",
                base.join("etc/rabbitmq.conf").into(),
            ),
            (
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                base.join("etc/enabled_plugins").into(),
            ),
            (
                "RABBITMQ_ADVANCED_CONFIG_FILE",
                base.join("etc/advanced.config").into(),
            ),
            ("RABBITMQ_MNESIA_BASE", base.join("mnesia").into()),
            ("RABBITMQ_LOG_BASE", base.join("log").into()),
            ("RABBITMQ_ALLOW_INPUT", "1".into()),
            (RUN_VAR, std::env::var_os(RUN_VAR).unwrap_or_default()),
            ("RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS", erl_args.into()),
        ];
        if opts.cluster.is_some() {
            envs.push(("RABBITMQ_USE_LONGNAME", "true".into()));
        }
        self.rabbit_launch = Some(RabbitLaunch {
            program: bins.rabbitmq_server.clone(),
            root: bins.root.clone().map(|r| (r, opts.dir.clone())),
            envs: envs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            out: base.join("log/server.out"),
            log: base.join(format!("log/{node}.log")),
        });
        self.launch_rabbit()
    }

    /// The node's cookie, definitions, configuration and plugins, under `base`.
    pub(in crate::env) fn write_rabbit_files(&self, base: &Path, opts: &EnvOptions) -> Result<()> {
        let home = base.join("home");
        let cookie = home.join(".erlang.cookie");
        std::fs::write(&cookie, format!("MQLAB{}", std::process::id()))?;
        std::fs::set_permissions(&cookie, std::fs::Permissions::from_mode(0o400))?;
        let definitions = definitions_file(base);
        std::fs::write(&definitions, definitions_json(&opts.vhosts).to_string())?;
        let management = match self.management_port {
            Some(port) => format!("management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = {port}\n"),
            None => String::new(),
        };
        // A cluster's node 1 pauses in a minority, as its peers do (measured:
        // without it, node 1 cut off from the other two kept serving).
        let partitions = match &opts.cluster {
            Some(_) => "cluster_partition_handling = pause_minority\n",
            None => "",
        };
        std::fs::write(
            base.join("etc/rabbitmq.conf"),
            format!(
                "log.console = false\nload_definitions = {}\n{management}{partitions}",
                definitions.display()
            ),
        )?;
        let plugins = match self.management_port {
            Some(_) => "[rabbitmq_management].\n",
            None => "[].\n",
        };
        std::fs::write(base.join("etc/enabled_plugins"), plugins)?;
        std::fs::write(
            base.join("etc/advanced.config"),
            crate::env::rabbitmq::ADVANCED_CONFIG,
        )?;
        Ok(())
    }

    pub(in crate::env) fn spawn_epmd(
        &mut self,
        bins: &Binaries,
        base: &Path,
        opts: &EnvOptions,
        epmd_port: u16,
    ) -> Result<()> {
        // Our own epmd, in the foreground: otherwise beam starts `epmd -daemon`, which outlives us.
        let mut epmd = rooted(bins.root.as_deref(), &opts.dir, &bins.epmd);
        // A cluster's nodes each have their own loopback address (so that
        // iptables can cut one off): epmd answers on all of them.
        let mut addresses = vec!["127.0.0.1".to_string()];
        if let Some(c) = &opts.cluster {
            addresses.extend(c.ips.iter().map(|ip| ip.to_string()));
        }
        epmd.args([
            "-port",
            &epmd_port.to_string(),
            "-address",
            &addresses.join(","),
        ]);
        self.epmd = Some(process::spawn_with(
            &mut epmd,
            &base.join("log/epmd.out"),
            false,
            self.keep,
        )?);
        Ok(())
    }

    /// Starts the node from the stored launch (also after a kill: same ports,
    /// same data directory).
    pub(in crate::env) fn launch_rabbit(&mut self) -> Result<()> {
        let launch = self
            .rabbit_launch
            .as_ref()
            .context("RabbitMQ was never configured")?;
        let mut cmd = launch.command();
        if self.keep {
            // The node halts when its stdin closes: a `sleep` that carries the
            // run's mark holds the pipe open until `mqlab env down`.
            let (read, write) = nix::unistd::pipe()?;
            let mark = launch.envs.iter().find(|(k, _)| k == RUN_VAR);
            let holder = Command::new("sleep")
                .arg("infinity")
                // The node's mark, not this run's: `env down` of the node's
                // directory reaps it, and no other run's guard does.
                .envs(mark.map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(Stdio::from(write))
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .context("cannot start the holder of RabbitMQ's stdin")?;
            // The previous node's holder has nothing left to hold.
            if let (Some(old), Some((_, mark))) = (self.holder_pid.take(), mark) {
                if has_mark(old, mark) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(old as i32),
                        Signal::SIGKILL,
                    );
                }
            }
            self.holder_pid = holder.id();
            std::mem::forget(holder);
            cmd.stdin(Stdio::from(read));
        }
        let mut child = process::spawn_with(&mut cmd, &launch.out, false, self.keep)?;
        self.rabbit_stdin = child.stdin.take();
        self.rabbit = Some(child);
        Ok(())
    }

    /// Node 1 answers AMQP by `deadline`; its version.
    pub(in crate::env) async fn rabbit_ready(&self, deadline: Instant) -> Result<String> {
        self.rabbit_answers(deadline).await?;
        Server::version(self, 1).await
    }

    /// Node 1 answers AMQP by `deadline`, or the error shows its log's end.
    pub(in crate::env) async fn rabbit_answers(&self, deadline: Instant) -> Result<()> {
        let url = self.endpoints.broker_url(&self.ready_probe.0);
        if nodes::answers_amqp(&url, deadline).await {
            return Ok(());
        }
        let log = self
            .rabbit_launch
            .as_ref()
            .map(|l| l.log.as_path())
            .unwrap_or(Path::new(""));
        bail!(
            "RabbitMQ did not become ready within {} s; last lines of its log:\n{}\n{}",
            self.ready_probe.1.as_secs(),
            process::tail(log, 15),
            process::tail(&log.with_file_name("server.out"), 5)
        )
    }
}

/// Broker faults for labs: the node is killed, restarted on the same ports
/// and data directory, or frozen.
impl LocalEnv {
    pub async fn kill_broker(&mut self) -> Result<()> {
        if let Some(pid) = self.rabbit_pid.take() {
            return kill_foreign(pid, self.mark()).await;
        }
        drop(self.rabbit_stdin.take());
        let mut c = self.rabbit.take().context("the broker is not running")?;
        // Reap before anything polls the port: a dying beam still accepts for a moment.
        process::stop(&mut c, Signal::SIGKILL, Duration::from_secs(5)).await;
        Ok(())
    }

    /// The mark the node and its holder carry: the kept directory.
    pub(in crate::env) fn mark(&self) -> &std::ffi::OsStr {
        self.rabbit_launch
            .as_ref()
            .and_then(|l| l.envs.iter().find(|(k, _)| k == RUN_VAR))
            .map(|(_, v)| v.as_os_str())
            .unwrap_or_default()
    }

    /// Records the restarted node's and holder's pids in kept.json.
    pub(in crate::env) fn save_pids(&self) -> Result<()> {
        let fresh = self.kept()?;
        let file = fresh.dir.join(KEPT_FILE);
        let mut kept: Kept = serde_json::from_str(&std::fs::read_to_string(&file)?)?;
        kept.rabbit_pid = fresh.rabbit_pid;
        kept.holder_pid = fresh.holder_pid;
        kept.write()
    }

    /// Pauses and kills signal the node's pid: it must be `beam.smp` itself,
    /// not a wrapper (a stopped wrapper would let the broker answer on).
    /// The exec chain keeps it so (`RABBITMQ_ALLOW_INPUT` makes the start
    /// script exec the VM; the 4.0 root's wrappers exec too): checked here.
    pub(in crate::env) fn check_node_pid(&self) -> Result<()> {
        let Some(pid) = self.rabbit.as_ref().and_then(|c| c.id()) else {
            return Ok(());
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != "beam.smp" {
            bail!(
                "the broker's process {pid} is `{}`, not beam.smp: a pause or a kill of it would miss the node",
                comm.trim()
            );
        }
        Ok(())
    }

    /// SIGSTOP, and the node seen stopped: it answers nothing until resumed.
    pub async fn pause_broker(&self) -> Result<()> {
        let pid = self.signal_broker(Signal::SIGSTOP)?;
        process::await_stopped(pid, Duration::from_secs(5)).await
    }

    pub fn resume_broker(&self) -> Result<()> {
        self.signal_broker(Signal::SIGCONT).map(drop)
    }

    /// Signals the node; its pid.
    pub(in crate::env) fn signal_broker(&self, sig: Signal) -> Result<u32> {
        let pid = self
            .rabbit
            .as_ref()
            .and_then(|c| c.id())
            .or(self.rabbit_pid)
            .context("the broker is not running")?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig)?;
        Ok(pid)
    }
}

/// One server: node 1.
impl Server for LocalEnv {
    fn count(&self) -> usize {
        1
    }

    async fn running(&self, n: usize) -> bool {
        n == 1 && self.is_running()
    }

    async fn ready(&self, _n: usize, deadline: Instant) -> Result<()> {
        self.rabbit_answers(deadline).await
    }

    fn ready_timeout(&self) -> Duration {
        self.ready_probe.1
    }

    async fn kill(&mut self, _n: usize) -> Result<()> {
        self.kill_broker().await
    }

    /// A kept environment (`--keep`) records the new pids at once, not at
    /// the end: a run that dies later must not leave the next one a stale pid.
    async fn start(&mut self, _n: usize) -> Result<()> {
        self.launch_rabbit()?;
        if self.attached {
            self.save_pids()?;
        }
        Ok(())
    }

    async fn pause(&self, _n: usize) -> Result<()> {
        self.pause_broker().await
    }

    async fn resume(&self, _n: usize) -> Result<()> {
        self.resume_broker()
    }

    async fn version(&self, _n: usize) -> Result<String> {
        rabbitmq::version(&self.endpoints.broker).await
    }
}

/// One node: node 1.
impl Nodes for LocalEnv {
    fn name(&self, _n: usize) -> String {
        self.rabbit_launch
            .as_ref()
            .and_then(|l| l.envs.iter().find(|(k, _)| k == "RABBITMQ_NODENAME"))
            .map(|(_, v)| v.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    async fn eval(&self, n: usize, expr: &str) -> Result<String> {
        if n != 1 {
            bail!("no node {n}: one node runs");
        }
        self.rabbit_launch
            .as_ref()
            .context("RabbitMQ was never configured")?
            .eval(expr)
            .await
    }

    async fn stopped(&self, _n: usize) -> Result<bool> {
        Ok(
            tokio::net::TcpStream::connect(("127.0.0.1", self.endpoints.broker.port))
                .await
                .is_err(),
        )
    }

    async fn cut(&mut self, _n: usize) -> Result<()> {
        bail!("a partition needs a cluster (a lab with `nodes = 3`)")
    }

    async fn uncut(&mut self) -> Result<Vec<usize>> {
        Ok(Vec::new())
    }
}

/// The definitions the node imports at each boot, under its `base`.
pub(in crate::env) fn definitions_file(base: &Path) -> PathBuf {
    base.join("etc/definitions.json")
}

/// Kills a kept node this process did not start (its whole process group)
/// and waits until it is gone (or a zombie: every port closed).
pub(in crate::env) async fn kill_foreign(pid: u32, mark: &std::ffi::OsStr) -> Result<()> {
    let stat = format!("/proc/{pid}/stat");
    // The pid may have been reused since kept.json was written: only a
    // process carrying the environment's mark is its node.
    if !has_mark(pid, mark) {
        bail!("the kept broker (pid {pid}) is not running");
    }
    let p = nix::unistd::Pid::from_raw(pid as i32);
    let _ = nix::sys::signal::killpg(p, Signal::SIGKILL);
    let _ = nix::sys::signal::kill(p, Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = std::fs::read_to_string(&stat).unwrap_or_default();
        let dead = state
            .rsplit(')')
            .next()
            .map(|rest| rest.trim_start().starts_with('Z'))
            .unwrap_or(true);
        if state.is_empty() || dead {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the kept broker (pid {pid}) did not die after SIGKILL");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `pid` carries `MQLAB_RUN=<mark>` in its environment.
pub(in crate::env) fn has_mark(pid: u32, mark: &std::ffi::OsStr) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let mut needle = format!("{RUN_VAR}=").into_bytes();
    needle.extend_from_slice(mark.as_bytes());
    std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .any(|v| v == needle.as_slice())
}
