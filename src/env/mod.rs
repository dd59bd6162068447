//! Environment providers: where the broker and the database come from. The
//! runner only sees [`Endpoints`] and [`EnvInfo`], never how they were started.

pub mod cluster;
pub mod containers;
pub mod external;
pub mod guard;
pub mod local;
pub mod nodes;
pub mod postgres;
pub mod process;
pub mod rabbitmq;
pub mod server;

/// The generation a local node or a container runs (`--rabbitmq`).
pub use crate::vocab::Generation;
pub use rabbitmq::rabbitmq_4_root;

use std::time::Duration;

/// How to reach the servers. Credentials live here and in URLs only, never in
/// a transcript (nor in `{:?}`).
#[derive(Clone, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "EndpointsFile")]
pub struct Endpoints {
    /// The broker the labs run on; its URL for a namespace is the broker
    /// module's ([`crate::broker::Addr::url`]).
    pub broker: crate::broker::Addr,
    pub pg_host: String,
    pub pg_port: u16,
    pub pg_user: String,
    #[serde(default)]
    pub pg_password: Option<String>,
    /// The database the harness connects to to create the runs' ones.
    #[serde(default = "postgres_db")]
    pub pg_admin: String,
}

fn postgres_db() -> String {
    "postgres".into()
}

/// [`Endpoints`] as a kept environment's `kept.json` holds them: with a
/// `broker`, or with the flat `amqp_*` fields an older mqlab wrote (so that
/// `--env-dir` still attaches to an environment it kept).
#[derive(serde::Deserialize)]
struct EndpointsFile {
    broker: Option<crate::broker::Addr>,
    amqp_host: Option<String>,
    amqp_port: Option<u16>,
    amqp_user: Option<String>,
    amqp_password: Option<String>,
    pg_host: String,
    pg_port: u16,
    pg_user: String,
    #[serde(default)]
    pg_password: Option<String>,
    #[serde(default = "postgres_db")]
    pg_admin: String,
}

impl TryFrom<EndpointsFile> for Endpoints {
    type Error = &'static str;

    fn try_from(f: EndpointsFile) -> Result<Endpoints, Self::Error> {
        let broker = match (f.broker, f.amqp_host, f.amqp_port, f.amqp_user, f.amqp_password) {
            (Some(b), ..) => b,
            (None, Some(host), Some(port), Some(user), Some(password)) => crate::broker::Addr {
                broker: crate::vocab::Broker::RabbitMq,
                host,
                port,
                user,
                password,
            },
            _ => return Err("the endpoints name no broker (`broker`, or `amqp_host`, `amqp_port`, `amqp_user` and `amqp_password`)"),
        };
        Ok(Endpoints {
            broker,
            pg_host: f.pg_host,
            pg_port: f.pg_port,
            pg_user: f.pg_user,
            pg_password: f.pg_password,
            pg_admin: f.pg_admin,
        })
    }
}

impl std::fmt::Debug for Endpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoints")
            .field("broker", &self.broker)
            .field("pg", &format_args!("{}:{}", self.pg_host, self.pg_port))
            .finish_non_exhaustive()
    }
}

impl Endpoints {
    /// `broker`, and a PostgreSQL on 127.0.0.1 as `postgres` (trust auth).
    pub fn loopback(broker: crate::broker::Addr, pg_port: u16) -> Endpoints {
        Endpoints {
            broker,
            pg_host: "127.0.0.1".into(),
            pg_port,
            pg_user: "postgres".into(),
            pg_password: None,
            pg_admin: postgres_db(),
        }
    }

    /// The broker's URL for `namespace` (a vhost on RabbitMQ).
    pub fn broker_url(&self, namespace: &str) -> String {
        self.broker.url(namespace)
    }

    pub fn pg_url(&self, database: &str) -> String {
        let password = match &self.pg_password {
            Some(p) => format!(":{}", url_encode(p)),
            None => String::new(),
        };
        format!(
            "postgres://{}{password}@{}:{}/{}",
            url_encode(&self.pg_user),
            self.pg_host,
            self.pg_port,
            database
        )
    }
}

use crate::naming::url_encode;

/// What the evidence says about the servers: read from the running servers.
#[derive(Clone, Debug)]
pub struct EnvInfo {
    pub kind: &'static str,
    pub broker_version: String,
    pub broker_source: String,
    pub db_version: String,
    pub db_source: String,
    pub ready: Duration,
}

/// Where an environment reports its boot steps (a terminal's progress
/// line); silent by default.
#[derive(Clone, Default)]
pub struct Progress(Option<std::sync::Arc<Say>>);

type Say = dyn Fn(&str) + Send + Sync;

impl Progress {
    pub fn new(f: impl Fn(&str) + Send + Sync + 'static) -> Progress {
        Progress(Some(std::sync::Arc::new(f)))
    }

    pub fn say(&self, what: &str) {
        if let Some(f) = &self.0 {
            f(what);
        }
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress")
    }
}

#[derive(Clone, Debug)]
pub struct EnvOptions {
    /// The run directory: the environment keeps its servers' files under `env/`.
    pub dir: std::path::PathBuf,
    /// The broker it starts (the runs' own: one environment per broker).
    pub broker: crate::vocab::Broker,
    /// The broker generation asked for (`--rabbitmq`; None: a local
    /// node's default, a container's image's). The server must report it.
    pub generation: Option<Generation>,
    pub ready_timeout: Duration,
    /// Leave the servers running after mqlab exits (`--keep`).
    pub keep: bool,
    /// Ports the user asked for (`--amqp-port`, `--pg-port`); free ones are
    /// picked otherwise.
    pub broker_port: Option<u16>,
    pub pg_port: Option<u16>,
    /// One isolated vhost per lab run, created at broker boot.
    pub vhosts: Vec<String>,
    pub progress: Progress,
    /// Enable RabbitMQ's management plugin (HTTP API on a free 127.0.0.1
    /// port): `mqlab env up --management`, for `--env external` against it.
    pub management: bool,
    /// Start a cluster (`nodes = 3` labs): node 1 named and addressed for it.
    pub cluster: Option<cluster::ClusterNet>,
}

/// Free loopback ports, distinct, for servers this process is about to start.
///
/// A port the kernel hands out for `bind(0)` lies in its ephemeral range,
/// which is also where every outgoing connection takes its source port: a
/// client connecting anywhere in the seconds before RabbitMQ binds could take
/// it (seen in CI: `eaddrinuse` on a port chosen free). So the ports are
/// drawn below that range, from a random start, and each is leased by an
/// abstract unix socket (`@mqlab-port-<port>`, no file) bound until this
/// process exits, so that two mqlab processes starting at once never choose
/// the same one. Each is also checked free by binding it.
pub fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let range = lease_range(&std::fs::read_to_string(EPHEMERAL_RANGE).unwrap_or_default());
    let span = u32::from(range.end - range.start);
    let start = random_u32() % span;
    let mut leases = LEASES.lock().unwrap_or_else(|p| p.into_inner());
    let mut ports = Vec::new();
    for i in 0..span {
        if ports.len() == n {
            break;
        }
        let port = range.start + ((start + i) % span) as u16;
        if let Some(lease) = lease(port) {
            leases.push(lease);
            ports.push(port);
        }
    }
    if ports.len() < n {
        anyhow::bail!(
            "no {n} free ports on 127.0.0.1 in {}..{}",
            range.start,
            range.end
        );
    }
    Ok(ports)
}

/// The kernel's ephemeral port range: `low high`.
const EPHEMERAL_RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";

/// Ports leased by this process, held (locked) until it exits.
static LEASES: std::sync::Mutex<Vec<std::os::unix::net::UnixListener>> =
    std::sync::Mutex::new(Vec::new());

/// Where ports are drawn: from 10000 up to the start of the ephemeral range
/// (Linux's default starts it at 32768), or, when that range starts too low
/// to leave room, from its end to 65535.
fn lease_range(ephemeral: &str) -> std::ops::Range<u16> {
    let mut bounds = ephemeral.split_whitespace().map(|w| w.parse::<u16>().ok());
    match (bounds.next().flatten(), bounds.next().flatten()) {
        (Some(low), _) if low >= 12_000 => 10_000..low,
        (Some(_), Some(high)) if high <= 63_000 => high + 1..65_535,
        _ => 10_000..32_768,
    }
}

/// The port's lease, if no other process holds it, it is not one `rabbitmqctl`
/// uses for itself, and nothing listens on it now.
/// (The kernel frees an abstract socket when its process exits, however it
/// exits: nothing is left behind, in the temp dir or elsewhere.)
fn lease(port: u16) -> Option<std::os::unix::net::UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    if (35672..=35682).contains(&port) {
        return None;
    }
    let name =
        std::os::unix::net::SocketAddr::from_abstract_name(format!("mqlab-port-{port}")).ok()?;
    let held = std::os::unix::net::UnixListener::bind_addr(&name).ok()?;
    std::net::TcpListener::bind(("127.0.0.1", port)).ok()?;
    Some(held)
}

/// A random number from the standard library's per-process hash keys: enough
/// to spread concurrent processes over the range (the lease settles ties).
fn random_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() as u32
}

pub(super) fn not_ours() -> anyhow::Result<()> {
    anyhow::bail!(
        "the broker is the user's (--env external): mqlab cannot kill, restart or pause it"
    )
}

/// A boxed future of an environment's method: the trait is used as
/// `dyn Environment`, which native `async fn` in traits is not.
pub type EnvFuture<'a, T> = futures_util::future::LocalBoxFuture<'a, anyhow::Result<T>>;

/// Where the servers come from: one implementation per kind (local
/// processes, containers, a cluster of local nodes, the user's own). The
/// runner and the session see only this trait; a broker's servers are
/// [`server::Server`]s to the environments that start them, and the waits
/// on RabbitMQ's nodes are written once over [`nodes::Nodes`].
/// A fault an environment cannot do fails with a sentence (a lab that needs
/// one is refused or skipped before anything starts).
pub trait Environment {
    fn endpoints(&self) -> &Endpoints;
    fn info(&self) -> &EnvInfo;
    /// Prepended to every vhost and database name of a run: the external
    /// environment shares its servers with the user's own objects.
    fn prefix(&self) -> String {
        String::new()
    }
    /// Its vhosts may hold what earlier runs left (`--env-dir`).
    fn reused(&self) -> bool {
        false
    }
    /// Each broker node's port on 127.0.0.1, node 1 first.
    fn broker_ports(&self) -> Vec<u16> {
        vec![self.endpoints().broker.port]
    }
    /// Stops the servers and removes what they left.
    fn stop(self: Box<Self>) -> futures_util::future::LocalBoxFuture<'static, ()>;
    /// `--keep`: the local environment, to be left running; others cannot.
    fn into_local(self: Box<Self>) -> Option<Box<local::LocalEnv>> {
        None
    }
    fn kill_broker(&mut self) -> EnvFuture<'_, ()>;
    fn restart_broker(&mut self) -> EnvFuture<'_, ()>;
    /// Stops the broker (it answers nothing) until [`Environment::resume_broker`].
    fn pause_broker(&self) -> EnvFuture<'_, ()>;
    fn resume_broker(&self) -> EnvFuture<'_, ()>;
    /// The broker's metadata (declared queues) on disk now, before a lab
    /// kills it (see [`nodes::sync_metadata`]); in a cluster, node n's.
    fn sync_metadata(&self, n: usize) -> EnvFuture<'_, ()>;
    /// A broker setting as node 1 has it (`rabbitmqctl eval`), or why it
    /// cannot be read (a broker that is not mqlab's).
    fn broker_setting(&self, s: crate::vocab::BrokerSetting) -> EnvFuture<'_, String> {
        Box::pin(async move {
            anyhow::bail!(
                "mqlab cannot read `{s}` from a broker it did not start (it reads it with rabbitmqctl eval)"
            )
        })
    }
    /// A quorum queue has a leader on a node other than `gone` (a cluster's
    /// node killed mid-stream; 0: any leader, after a broker restart); a
    /// broker mqlab did not start: nothing to wait for.
    fn await_leader<'a>(
        &'a self,
        _gone: usize,
        _vhost: &'a str,
        _queue: &'a str,
        _deadline: std::time::Instant,
    ) -> EnvFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }
    /// Whether node n finds a classic queue's process on one of the nodes
    /// `faulted` and out of reach (see [`nodes::home_down`]); `None` where
    /// it cannot be asked, and the broker's answer to a read of the queue
    /// is awaited instead.
    fn queue_home_down<'a>(
        &'a self,
        _n: usize,
        _vhost: &'a str,
        _queue: &'a str,
        _faulted: &'a [usize],
    ) -> EnvFuture<'a, Option<bool>> {
        Box::pin(async { Ok(None) })
    }
    fn kill_node(&mut self, n: usize) -> EnvFuture<'_, ()> {
        match n {
            1 => self.kill_broker(),
            _ => needs_cluster("node 2 or 3"),
        }
    }
    fn restart_node(&mut self, n: usize) -> EnvFuture<'_, ()> {
        match n {
            1 => self.restart_broker(),
            _ => needs_cluster("node 2 or 3"),
        }
    }
    /// Cuts node n off and waits until it has paused (pause_minority).
    fn partition(&mut self, _n: usize) -> EnvFuture<'_, ()> {
        needs_cluster("a partition")
    }
    /// Ends every cut and waits until the nodes that were cut off answer again.
    fn heal(&mut self) -> EnvFuture<'_, ()> {
        needs_cluster("healing a partition")
    }
    /// Deletes the vhosts of runs that ended (see [`nodes::delete_vhosts`]),
    /// before the runs that restart the broker. Local nodes only: a
    /// container imports its definitions file again at a restart (and would
    /// bring them back), and a broker that is not mqlab's keeps them until
    /// the environment stops.
    fn delete_vhosts<'a>(&'a self, _vhosts: &'a [String]) -> EnvFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }
    /// What a classic queue's process holds: its messages delivered and
    /// not acked, and the stamp of its oldest (see [`nodes::held`]), or why
    /// they cannot be read.
    fn queue_held<'a>(&'a self, _vhost: &'a str, queue: &'a str) -> EnvFuture<'a, nodes::Held> {
        let e = anyhow::anyhow!(
            "mqlab cannot read the figures of `{queue}` from a broker it did not start (it reads them with rabbitmqctl eval)"
        );
        Box::pin(async move { Err(e) })
    }
    /// How many messages a queue still holds, dead-letters in waiting
    /// included (see [`nodes::holds`]), or why it cannot be read.
    fn queue_holds<'a>(&'a self, _vhost: &'a str, queue: &'a str) -> EnvFuture<'a, u64> {
        let e = anyhow::anyhow!(
            "mqlab cannot read what `{queue}` holds from a broker it did not start (it reads it with rabbitmqctl eval)"
        );
        Box::pin(async move { Err(e) })
    }
    /// A PostgreSQL of the run's own with `durability`, in `dir` (a lab's
    /// `database = "durable"`), from the machine's PostgreSQL binaries
    /// (see [`postgres::own`]).
    fn own_database<'a>(
        &'a self,
        durability: crate::vocab::Durability,
        dir: &'a std::path::Path,
        lazy: bool,
    ) -> EnvFuture<'a, postgres::Own> {
        Box::pin(postgres::own(durability, dir, lazy))
    }
    /// Sets a policy for one queue of `vhost` on the running broker and
    /// waits until the queue has it in force (see [`nodes::set_policy`]).
    fn set_policy<'a>(&'a self, p: &'a PolicyRequest<'a>) -> EnvFuture<'a, ()> {
        let e = anyhow::anyhow!(
            "mqlab cannot set the policy `{}` on a broker it did not start (it sets policies with rabbitmqctl eval)",
            p.name
        );
        Box::pin(async move { Err(e) })
    }
}

/// A policy a lab sets: its name, the one queue it applies to, and its
/// definition as JSON (`{"dead-letter-exchange":""}`).
pub struct PolicyRequest<'a> {
    pub vhost: &'a str,
    pub name: &'a str,
    pub queue: &'a str,
    pub definition: &'a str,
}

fn needs_cluster<'a>(what: &str) -> EnvFuture<'a, ()> {
    let e = anyhow::anyhow!("{what} needs a cluster (a lab with `nodes = 3`)");
    Box::pin(async move { Err(e) })
}

#[cfg(test)]
mod tests {
    /// A kept.json written before the broker had a module of its own
    /// (flat `amqp_*` fields) still reads, as the one written now does.
    #[test]
    fn endpoints_read_in_both_shapes() {
        let old = r#"{"amqp_host":"127.0.0.1","amqp_port":5,"amqp_user":"u","amqp_password":"p","pg_host":"127.0.0.1","pg_port":6,"pg_user":"postgres"}"#;
        let e: super::Endpoints = serde_json::from_str(old).unwrap();
        assert_eq!((e.broker.port, e.pg_port), (5, 6));
        assert_eq!(e.broker_url("v"), "amqp://u:p@127.0.0.1:5/v");
        let now = serde_json::to_string(&e).unwrap();
        let again: super::Endpoints = serde_json::from_str(&now).unwrap();
        assert_eq!(again.broker_url("v"), e.broker_url("v"));
        let none = r#"{"pg_host":"h","pg_port":6,"pg_user":"postgres"}"#;
        let e = serde_json::from_str::<super::Endpoints>(none).unwrap_err();
        assert!(e.to_string().contains("name no broker"), "{e}");
    }

    #[test]
    fn ports_are_drawn_outside_the_ephemeral_range() {
        assert_eq!(super::lease_range("32768\t60999\n"), 10_000..32_768);
        assert_eq!(super::lease_range("1024 60999"), 61_000..65_535);
        // Every port ephemeral: nothing to avoid, the default range it is.
        assert_eq!(super::lease_range("1024 65535"), 10_000..32_768);
        assert_eq!(super::lease_range(""), 10_000..32_768);
    }

    #[test]
    fn leased_ports_are_distinct_and_not_leased_twice() {
        let a = super::free_ports(5).unwrap();
        let b = super::free_ports(5).unwrap();
        let all: std::collections::BTreeSet<_> = a.iter().chain(&b).collect();
        assert_eq!(all.len(), 10);
        let range = std::fs::read_to_string(super::EPHEMERAL_RANGE).unwrap_or_default();
        assert!(all.iter().all(|p| super::lease_range(&range).contains(*p)));
    }
}
