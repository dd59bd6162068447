//! The `local` environment: our own RabbitMQ node and PostgreSQL cluster as
//! child processes, on free 127.0.0.1 ports, in a temporary directory. The
//! machine's own services on 5672/5432 are never touched.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::Signal;
use tokio::process::{Child, ChildStdin, Command};

use super::guard::RUN_VAR;
use super::nodes::{self, Nodes};
use super::{definitions_json, free_ports, Endpoints, EnvInfo, EnvOptions};
use super::{postgres, process};
use crate::broker::rabbitmq;

struct Binaries {
    rabbitmq_server: PathBuf,
    epmd: PathBuf,
    /// The generation's root the RabbitMQ binaries run in (4.0), or none
    /// (the host's own packages).
    root: Option<PathBuf>,
    pg_bin: PathBuf,
}

impl Binaries {
    fn find(generation: super::Generation) -> Result<Binaries> {
        let (rabbitmq_server, epmd, root) = match generation {
            super::Generation::V3_10 => {
                let (server, epmd) = host_rabbitmq()?;
                (server, epmd, None)
            }
            super::Generation::V4_0 => {
                // Its mount namespace and chroot need root.
                if !nix::unistd::geteuid().is_root() {
                    bail!("RabbitMQ 4.0 runs in its Debian trixie root through a mount namespace and chroot, which need root (or run with --rabbitmq 3.10)");
                }
                let root = super::rabbitmq_4_root();
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
fn host_rabbitmq() -> Result<(PathBuf, PathBuf)> {
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
const ROOTED: &str = r#"set -e
r=$1; d=$2; shift 2
mount -t proc proc "$r/proc"
mount --bind /dev "$r/dev"
mount -t tmpfs -o mode=1777 tmpfs "$r/tmp"
mkdir -p "$r$d"
mount --bind "$d" "$r$d"
exec chroot "$r" /bin/sh -c 'cd "$0" 2>/dev/null || cd /; exec "$@"' "$PWD" "$@""#;

/// `program` on the host, or inside `root` with `bind` visible there.
fn rooted(root: Option<&Path>, bind: &Path, program: &Path) -> Command {
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

pub struct LocalEnv {
    /// Inside the run directory; the run directory's owner removes it.
    dir: PathBuf,
    epmd: Option<Child>,
    rabbit: Option<Child>,
    /// Held open: RabbitMQ started with RABBITMQ_ALLOW_INPUT halts when it closes.
    rabbit_stdin: Option<ChildStdin>,
    rabbit_launch: Option<RabbitLaunch>,
    /// The first vhost, and the ready timeout: what a restart waits with.
    ready_probe: (String, Duration),
    postgres: Option<Child>,
    /// `--keep`: the servers outlive mqlab.
    keep: bool,
    /// A node another mqlab started (`--env-dir`): not our child, killed by
    /// its pid; `stop` lets go of everything instead of stopping it.
    rabbit_pid: Option<u32>,
    attached: bool,
    /// The `sleep` holding a kept node's stdin open: replaced at a restart.
    holder_pid: Option<u32>,
    /// Held while attached: one mqlab at a time per kept environment.
    _lock: Option<std::fs::File>,
    /// The vhosts created at boot (kept.json lists them for `--env-dir`).
    vhosts: Vec<String>,
    /// The management API's port, when enabled.
    pub management_port: Option<u16>,
    pub endpoints: Endpoints,
    pub info: EnvInfo,
}

/// How the node was started, kept to start it again after a kill (also by
/// another mqlab, from kept.json; a cluster's other nodes are derived from
/// node 1's).
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct RabbitLaunch {
    pub(super) program: PathBuf,
    /// The generation's root it runs in (4.0), with the run directory bound.
    #[serde(default)]
    pub(super) root: Option<(PathBuf, PathBuf)>,
    pub(super) envs: Vec<(String, std::ffi::OsString)>,
    pub(super) out: PathBuf,
    pub(super) log: PathBuf,
}

impl RabbitLaunch {
    /// Starts a node that is not kept (a cluster's node 2 or 3): its stdin a
    /// pipe held by the returned handle.
    pub(super) fn spawn(&self) -> Result<(Child, Option<ChildStdin>)> {
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
    pub(super) async fn eval(&self, expr: &str) -> Result<String> {
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

    pub(super) fn set(&mut self, key: &str, value: impl Into<std::ffi::OsString>) {
        let value = value.into();
        match self.envs.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.envs.push((key.to_string(), value)),
        }
    }
}

/// Where a kept environment is described; `env down` and `--env-dir`
/// refuse directories without it.
pub const KEPT_FILE: &str = "kept.json";

/// What a kept environment (`mqlab env up`, `mqlab lab --keep`) writes to
/// `DIR/kept.json`: enough for `--env-dir DIR` to connect, and to kill and
/// restart its broker.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Kept {
    pub dir: PathBuf,
    pub broker: String,
    pub database: String,
    pub broker_source: String,
    pub database_source: String,
    pub endpoints: Endpoints,
    pub vhosts: Vec<String>,
    #[serde(default)]
    pub management_port: Option<u16>,
    rabbit_pid: u32,
    #[serde(default)]
    holder_pid: Option<u32>,
    rabbit: RabbitLaunch,
    /// `DIR/kept.lock`, held by the mqlab attached to it.
    #[serde(skip)]
    pub lock: Option<std::fs::File>,
    /// For people: each lab run's URLs.
    #[serde(default)]
    pub runs: Vec<serde_json::Value>,
}

impl Kept {
    pub fn write(&self) -> Result<()> {
        let file = self.dir.join(KEPT_FILE);
        // Written whole then renamed: a reader never sees half a file.
        let tmp = file.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(self)?)?;
        std::fs::rename(&tmp, &file)?;
        Ok(())
    }
}

impl LocalEnv {
    pub async fn start(opts: &EnvOptions) -> Result<LocalEnv> {
        let started = Instant::now();
        let bins = Binaries::find(opts.rabbitmq.unwrap_or_default())?;
        let owner = postgres::owner()?;
        let dir = opts.dir.join("env");
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        let ports = free_ports(5)?;
        let amqp_port = requested(opts.amqp_port, "--amqp-port")?.unwrap_or(ports[0]);
        let pg_port = requested(opts.pg_port, "--pg-port")?.unwrap_or(ports[3]);
        let (dist_port, epmd_port) = (ports[1], ports[2]);
        let mut env = LocalEnv {
            dir,
            keep: opts.keep,
            rabbit_pid: None,
            attached: false,
            holder_pid: None,
            _lock: None,
            vhosts: opts.vhosts.clone(),
            management_port: opts.management.then_some(ports[4]),
            epmd: None,
            rabbit: None,
            rabbit_stdin: None,
            rabbit_launch: None,
            ready_probe: (
                opts.vhosts.first().cloned().unwrap_or_else(|| "/".into()),
                opts.ready_timeout,
            ),
            postgres: None,
            endpoints: Endpoints::loopback(amqp_port, pg_port),
            info: EnvInfo {
                kind: "local",
                broker_version: String::new(),
                broker_source: match &bins.root {
                    Some(root) => {
                        format!("{} in {}", bins.rabbitmq_server.display(), root.display())
                    }
                    None => bins.rabbitmq_server.display().to_string(),
                },
                db_version: String::new(),
                db_source: bins.pg_bin.join("postgres").display().to_string(),
                ready: Duration::ZERO,
            },
        };
        let root = env.dir.clone();
        let deadline = Instant::now() + opts.ready_timeout;
        let say = &opts.progress;
        env.spawn_rabbit(&bins, &root, opts, dist_port, epmd_port)?;
        say.say("RabbitMQ booting, PostgreSQL initdb");
        env.spawn_postgres(&bins, &root, pg_port, owner).await?;
        say.say("RabbitMQ booting, PostgreSQL starting");
        let (broker, db) = tokio::join!(
            async {
                let r = env.rabbit_ready(deadline).await;
                say.say("RabbitMQ ready");
                r
            },
            async {
                let r = env.postgres_ready(&root, deadline).await;
                say.say("PostgreSQL ready, RabbitMQ booting");
                r
            }
        );
        env.info.broker_version = broker?;
        env.info.db_version = db?;
        env.check_node_pid()?;
        env.info.ready = started.elapsed();
        Ok(env)
    }

    fn spawn_rabbit(
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
                self.endpoints.amqp_port.to_string().into(),
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
    fn write_rabbit_files(&self, base: &Path, opts: &EnvOptions) -> Result<()> {
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
        std::fs::write(base.join("etc/advanced.config"), super::ADVANCED_CONFIG)?;
        Ok(())
    }

    fn spawn_epmd(
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
    fn launch_rabbit(&mut self) -> Result<()> {
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

    /// The environment's PostgreSQL, fast (not durable): initdb, then the
    /// server on `port`.
    async fn spawn_postgres(
        &mut self,
        bins: &Binaries,
        root: &Path,
        port: u16,
        owner: Option<(u32, u32)>,
    ) -> Result<()> {
        let cluster = postgres::Cluster {
            bin: bins.pg_bin.clone(),
            base: root.join("pg"),
            log: root.join("pg.log"),
            port,
            owner,
            durability: postgres::Durability::Fast,
        };
        cluster.init().await?;
        self.postgres = Some(cluster.spawn(self.keep)?);
        Ok(())
    }

    /// Node 1 answers AMQP by `deadline`; its version.
    async fn rabbit_ready(&self, deadline: Instant) -> Result<String> {
        self.rabbit_answers(deadline).await?;
        rabbitmq::version(&self.endpoints.amqp_host, self.endpoints.amqp_port).await
    }

    /// Node 1 answers AMQP by `deadline`, or the error shows its log's end.
    async fn rabbit_answers(&self, deadline: Instant) -> Result<()> {
        let url = self.endpoints.amqp_url(&self.ready_probe.0);
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

    async fn postgres_ready(&self, root: &Path, deadline: Instant) -> Result<String> {
        let url = self.endpoints.pg_url(&self.endpoints.pg_admin);
        postgres::ready(&url, &root.join("pg.log"), deadline).await
    }

    /// Orderly teardown: RabbitMQ halts when its stdin closes; PostgreSQL gets
    /// a fast shutdown; then the directory goes.
    pub async fn stop(mut self) {
        if self.attached {
            return self.detach();
        }
        drop(self.rabbit_stdin.take());
        if let Some(mut c) = self.rabbit.take() {
            process::stop(&mut c, Signal::SIGKILL, Duration::from_secs(5)).await;
        }
        if let Some(mut c) = self.postgres.take() {
            process::stop(&mut c, Signal::SIGINT, Duration::from_secs(5)).await;
        }
        if let Some(mut c) = self.epmd.take() {
            process::stop(&mut c, Signal::SIGKILL, Duration::from_secs(5)).await;
        }
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
    fn mark(&self) -> &std::ffi::OsStr {
        self.rabbit_launch
            .as_ref()
            .and_then(|l| l.envs.iter().find(|(k, _)| k == RUN_VAR))
            .map(|(_, v)| v.as_os_str())
            .unwrap_or_default()
    }

    /// Records the restarted node's and holder's pids in kept.json.
    fn save_pids(&self) -> Result<()> {
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
    fn check_node_pid(&self) -> Result<()> {
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
    fn signal_broker(&self, sig: Signal) -> Result<u32> {
        let pid = self
            .rabbit
            .as_ref()
            .and_then(|c| c.id())
            .or(self.rabbit_pid)
            .context("the broker is not running")?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig)?;
        Ok(pid)
    }

    /// `--keep`: let go of the servers without stopping them.
    pub fn attached(&self) -> bool {
        self.attached
    }

    /// An environment of nothing: what a cluster leaves in place of the
    /// one it stops.
    pub(super) fn placeholder() -> LocalEnv {
        LocalEnv {
            dir: PathBuf::new(),
            epmd: None,
            rabbit: None,
            rabbit_stdin: None,
            rabbit_launch: None,
            ready_probe: (String::new(), Duration::ZERO),
            postgres: None,
            keep: false,
            rabbit_pid: None,
            attached: false,
            holder_pid: None,
            _lock: None,
            vhosts: Vec::new(),
            management_port: None,
            endpoints: Endpoints::loopback(0, 0),
            info: EnvInfo {
                kind: "local",
                broker_version: String::new(),
                broker_source: String::new(),
                db_version: String::new(),
                db_source: String::new(),
                ready: Duration::ZERO,
            },
        }
    }

    /// The run directory the environment lives in.
    pub(super) fn run_dir(&self) -> &Path {
        self.dir.parent().unwrap_or(&self.dir)
    }

    /// Whether the node runs (not killed by a lab).
    pub(super) fn is_running(&self) -> bool {
        self.rabbit.is_some() || self.rabbit_pid.is_some()
    }

    /// Node 1's launch, for a cluster's other nodes to copy.
    pub(super) fn launch(&self) -> Option<&RabbitLaunch> {
        self.rabbit_launch.as_ref()
    }

    /// Waits until a node answers AMQP on `port` (a cluster's node 2 or 3).
    pub(super) async fn node_ready(&self, port: u16, deadline: Instant) -> Result<()> {
        let mut e = self.endpoints.clone();
        e.amqp_port = port;
        if nodes::answers_amqp(&e.amqp_url(&self.ready_probe.0), deadline).await {
            return Ok(());
        }
        bail!("RabbitMQ node on port {port} did not become ready in time")
    }

    /// What `--env-dir` needs to reach this environment again.
    pub fn kept(&self) -> Result<Kept> {
        let pid = self
            .rabbit
            .as_ref()
            .and_then(|c| c.id())
            .or(self.rabbit_pid)
            .context("the broker is not running")?;
        Ok(Kept {
            dir: self.dir.parent().unwrap_or(&self.dir).to_path_buf(),
            broker: self.info.broker_version.clone(),
            database: self.info.db_version.clone(),
            broker_source: self.info.broker_source.clone(),
            database_source: self.info.db_source.clone(),
            endpoints: self.endpoints.clone(),
            vhosts: self.vhosts.clone(),
            management_port: self.management_port,
            rabbit_pid: pid,
            holder_pid: self.holder_pid,
            lock: None,
            rabbit: self
                .rabbit_launch
                .clone()
                .context("RabbitMQ was never configured")?,
            runs: Vec::new(),
        })
    }

    /// Connects to a kept environment: both servers must answer.
    pub async fn attach(kept: Kept, ready_timeout: Duration) -> Result<LocalEnv> {
        let started = Instant::now();
        let mut env = LocalEnv {
            dir: kept.dir.join("env"),
            epmd: None,
            rabbit: None,
            rabbit_stdin: None,
            rabbit_launch: Some(kept.rabbit),
            ready_probe: (
                kept.vhosts.first().cloned().unwrap_or_else(|| "/".into()),
                ready_timeout,
            ),
            postgres: None,
            keep: true,
            rabbit_pid: Some(kept.rabbit_pid),
            attached: true,
            holder_pid: kept.holder_pid,
            _lock: kept.lock,
            vhosts: kept.vhosts,
            management_port: kept.management_port,
            endpoints: kept.endpoints,
            info: EnvInfo {
                kind: "local",
                broker_version: String::new(),
                broker_source: kept.broker_source,
                db_version: String::new(),
                db_source: kept.database_source,
                ready: Duration::ZERO,
            },
        };
        let root = kept.dir.join("env");
        // A short wait: the servers are up already, or gone.
        let deadline = Instant::now() + Duration::from_secs(5);
        env.info.broker_version = env.rabbit_ready(deadline).await?;
        env.info.db_version = env.postgres_ready(&root, deadline).await?;
        env.info.ready = started.elapsed();
        Ok(env)
    }

    pub fn detach(mut self) {
        for c in [self.rabbit.take(), self.postgres.take(), self.epmd.take()]
            .into_iter()
            .flatten()
        {
            std::mem::forget(c);
        }
    }
}

/// One node: node 1.
impl Nodes for LocalEnv {
    fn count(&self) -> usize {
        1
    }

    fn name(&self, _n: usize) -> String {
        self.rabbit_launch
            .as_ref()
            .and_then(|l| l.envs.iter().find(|(k, _)| k == "RABBITMQ_NODENAME"))
            .map(|(_, v)| v.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    async fn running(&self, n: usize) -> bool {
        n == 1 && self.is_running()
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

    async fn ready(&self, _n: usize, deadline: Instant) -> Result<()> {
        self.rabbit_answers(deadline).await
    }

    async fn stopped(&self, _n: usize) -> Result<bool> {
        Ok(
            tokio::net::TcpStream::connect(("127.0.0.1", self.endpoints.amqp_port))
                .await
                .is_err(),
        )
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

    async fn cut(&mut self, _n: usize) -> Result<()> {
        bail!("a partition needs a cluster (a lab with `nodes = 3`)")
    }

    async fn uncut(&mut self) -> Result<Vec<usize>> {
        Ok(Vec::new())
    }
}

impl Drop for LocalEnv {
    /// The panic and early-return path: nothing can be awaited, so kill hard.
    fn drop(&mut self) {
        if self.attached {
            // Not ours to stop, even on a panic: `env down` does.
            for c in [self.rabbit.take(), self.postgres.take(), self.epmd.take()]
                .into_iter()
                .flatten()
            {
                std::mem::forget(c);
            }
            return;
        }
        drop(self.rabbit_stdin.take());
        for c in [&mut self.rabbit, &mut self.postgres, &mut self.epmd]
            .into_iter()
            .flatten()
        {
            process::kill_now(c);
        }
    }
}

/// The definitions the node imports at each boot, under its `base`.
fn definitions_file(base: &Path) -> PathBuf {
    base.join("etc/definitions.json")
}

/// Kills a kept node this process did not start (its whole process group)
/// and waits until it is gone (or a zombie: every port closed).
async fn kill_foreign(pid: u32, mark: &std::ffi::OsStr) -> Result<()> {
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
fn has_mark(pid: u32, mark: &std::ffi::OsStr) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let mut needle = format!("{RUN_VAR}=").into_bytes();
    needle.extend_from_slice(mark.as_bytes());
    std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .any(|v| v == needle.as_slice())
}

/// A port the user asked for must be free now, or the run stops before anything starts.
fn requested(port: Option<u16>, flag: &str) -> Result<Option<u16>> {
    if let Some(p) = port {
        std::net::TcpListener::bind(("127.0.0.1", p)).with_context(|| {
            format!("port {p} on 127.0.0.1 is already in use (requested by {flag})")
        })?;
    }
    Ok(port)
}

impl super::Environment for LocalEnv {
    fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    fn info(&self) -> &EnvInfo {
        &self.info
    }

    fn reused(&self) -> bool {
        self.attached()
    }

    fn stop(self: Box<Self>) -> futures_util::future::LocalBoxFuture<'static, ()> {
        Box::pin(LocalEnv::stop(*self))
    }

    fn into_local(self: Box<Self>) -> Option<Box<LocalEnv>> {
        Some(self)
    }

    fn kill_broker(&mut self) -> super::EnvFuture<'_, ()> {
        Box::pin(LocalEnv::kill_broker(self))
    }

    fn restart_broker(&mut self) -> super::EnvFuture<'_, ()> {
        Box::pin(nodes::restart(self, 1))
    }

    fn pause_broker(&self) -> super::EnvFuture<'_, ()> {
        Box::pin(LocalEnv::pause_broker(self))
    }

    fn resume_broker(&self) -> super::EnvFuture<'_, ()> {
        Box::pin(std::future::ready(LocalEnv::resume_broker(self)))
    }

    fn broker_setting(&self, s: crate::vocab::BrokerSetting) -> super::EnvFuture<'_, String> {
        Box::pin(async move {
            let answer = super::nodes::Nodes::eval(self, 1, &s.expression()).await?;
            Ok(s.value_of(&answer))
        })
    }

    fn sync_metadata(&self, n: usize) -> super::EnvFuture<'_, ()> {
        Box::pin(super::nodes::sync_metadata(self, n))
    }

    /// A kept or attached environment keeps them: the user looks at them.
    /// The definitions file then lists the others only: a restart imports
    /// it again, and would bring the deleted ones back.
    fn delete_vhosts<'a>(&'a self, vhosts: &'a [String]) -> super::EnvFuture<'a, ()> {
        if self.keep || self.attached {
            return Box::pin(async { Ok(()) });
        }
        // A restart waits until the first vhost takes a connection: kept.
        let gone: Vec<String> = vhosts
            .iter()
            .filter(|v| **v != self.ready_probe.0)
            .cloned()
            .collect();
        Box::pin(async move {
            super::nodes::delete_vhosts(self, &gone).await?;
            let left: Vec<String> = self
                .vhosts
                .iter()
                .filter(|v| !gone.contains(v))
                .cloned()
                .collect();
            std::fs::write(
                definitions_file(&self.dir.join("rabbit")),
                definitions_json(&left).to_string(),
            )?;
            Ok(())
        })
    }

    fn set_policy<'a>(&'a self, p: &'a super::PolicyRequest<'a>) -> super::EnvFuture<'a, ()> {
        Box::pin(super::nodes::set_policy(self, p))
    }

    fn queue_held<'a>(
        &'a self,
        vhost: &'a str,
        queue: &'a str,
    ) -> super::EnvFuture<'a, super::nodes::Held> {
        Box::pin(super::nodes::held(self, vhost, queue))
    }

    fn queue_holds<'a>(&'a self, vhost: &'a str, queue: &'a str) -> super::EnvFuture<'a, u64> {
        Box::pin(super::nodes::holds(self, vhost, queue))
    }
}
