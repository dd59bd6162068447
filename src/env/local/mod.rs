//! The `local` environment: our own RabbitMQ node and PostgreSQL cluster as
//! child processes, on free 127.0.0.1 ports, in a temporary directory. The
//! machine's own services on 5672/5432 are never touched. The RabbitMQ
//! node's own parts are in [`rabbit`], PostgreSQL's in [`super::postgres`].

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::Signal;
use tokio::process::{Child, ChildStdin};

use super::nodes;
use super::rabbitmq::definitions_json;
use super::server::Server;
use super::{free_ports, Endpoints, EnvInfo, EnvOptions, Generation};
use super::{postgres, process};

mod rabbit;

pub(super) use rabbit::RabbitLaunch;
use rabbit::{definitions_file, Binaries};

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

/// The local environment of `opts.broker`, started: a RabbitMQ node and a
/// PostgreSQL (a second broker's server is an arm here).
pub async fn start(opts: &EnvOptions) -> Result<Box<dyn super::Environment>> {
    match opts.broker {
        crate::vocab::Broker::RabbitMq => Ok(Box::new(LocalEnv::start(opts).await?)),
    }
}

impl LocalEnv {
    pub async fn start(opts: &EnvOptions) -> Result<LocalEnv> {
        let started = Instant::now();
        let generation = opts.generation.unwrap_or(Generation::base_of(opts.broker));
        let bins = Binaries::find(generation)?;
        let owner = postgres::owner()?;
        let dir = opts.dir.join("env");
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        let ports = free_ports(5)?;
        let amqp_port = requested(opts.broker_port, "--amqp-port")?.unwrap_or(ports[0]);
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
            endpoints: Endpoints::loopback(super::rabbitmq::loopback(amqp_port), pg_port),
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

/// A kept environment: written for, and attached by, another mqlab.
impl LocalEnv {
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
            endpoints: Endpoints::loopback(super::rabbitmq::loopback(0), 0),
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
        let node = self.endpoints.broker.at(port);
        if nodes::answers_amqp(&node.url(&self.ready_probe.0), deadline).await {
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
        Box::pin(Server::kill(self, 1))
    }

    fn restart_broker(&mut self) -> super::EnvFuture<'_, ()> {
        Box::pin(nodes::restart(self, 1))
    }

    fn pause_broker(&self) -> super::EnvFuture<'_, ()> {
        Box::pin(Server::pause(self, 1))
    }

    fn resume_broker(&self) -> super::EnvFuture<'_, ()> {
        Box::pin(Server::resume(self, 1))
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

    fn await_leader<'a>(
        &'a self,
        gone: usize,
        vhost: &'a str,
        queue: &'a str,
        deadline: std::time::Instant,
    ) -> super::EnvFuture<'a, ()> {
        Box::pin(super::nodes::await_leader(
            self, gone, vhost, queue, deadline,
        ))
    }
}
