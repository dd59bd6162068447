//! A three-node RabbitMQ cluster as child processes (labs with `nodes = 3`).
//! Each node has its own loopback address (127.A.B.n, A and B drawn per
//! cluster) for Erlang distribution, listening and connecting from it, so an
//! iptables chain of this cluster's own can cut one node off from the others
//! (a partition) without touching anything else on the machine. Node 1 and
//! PostgreSQL are the local environment's; nodes 2 and 3 are started from
//! node 1's launch and join it (classic_config peer discovery). AMQP
//! listeners stay on 127.0.0.1, one port per node.

use std::net::Ipv4Addr;
use std::process::Command as StdCommand;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::Signal;
use tokio::process::{Child, ChildStdin};

use super::local::{LocalEnv, RabbitLaunch};
use super::nodes::{self, Nodes, Server};
use super::process;
use super::{free_ports, EnvOptions};

/// Whether this machine can cut a node off: iptables answers, as root
/// (`iptables -S` needs CAP_NET_ADMIN). Checked before any server starts.
/// In containers the rules go into a node's namespace through nsenter.
pub fn can_partition(containers: bool) -> Result<()> {
    iptables(&["-S", "INPUT"])
        .context("a partition needs iptables (Debian: apt-get install iptables) and root")?;
    if containers {
        StdCommand::new("nsenter")
            .arg("--version")
            .output()
            .context("a partition in containers needs nsenter (Debian: util-linux)")?;
    }
    Ok(())
}

/// The cluster's addresses, chosen before node 1 starts.
#[derive(Clone, Debug)]
pub struct ClusterNet {
    pub ips: Vec<Ipv4Addr>,
}

impl ClusterNet {
    pub fn new(nodes: usize) -> ClusterNet {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let tag = crate::partition::fnv1a(&format!("{}-{nanos}", std::process::id()));
        // 127.A.B.n with A ≥ 2: clear of 127.0.0.1 and 127.0.1.1.
        let (a, b) = (2 + (tag % 250) as u8, ((tag >> 8) % 256) as u8);
        ClusterNet {
            ips: (1..=nodes as u8)
                .map(|n| Ipv4Addr::new(127, a, b, n))
                .collect(),
        }
    }

    pub fn node_name(&self, n: usize) -> String {
        format!("rabbit-{n}@{}", self.ips[n - 1])
    }

    /// Distribution on the node's own address, both ways; a short net tick
    /// so a partition is noticed within seconds (default: a minute).
    pub fn erl_args(&self, n: usize) -> String {
        let ip = self.ips[n - 1].octets();
        let tuple = format!("{{{},{},{},{}}}", ip[0], ip[1], ip[2], ip[3]);
        format!(
            "-kernel inet_dist_use_interface {tuple} -kernel inet_dist_connect_options [{{ip,{tuple}}}] -kernel net_ticktime 10"
        )
    }

    /// The iptables chain of this cluster.
    fn chain(&self) -> String {
        let o = self.ips[0].octets();
        format!("MQLAB-{}-{}", o[1], o[2])
    }
}

struct Peer {
    child: Option<Child>,
    /// Held open: the node halts when its stdin closes.
    stdin: Option<ChildStdin>,
    launch: RabbitLaunch,
    amqp_port: u16,
}

pub struct ClusterEnv {
    /// Node 1 and PostgreSQL.
    pub base: LocalEnv,
    peers: Vec<Peer>,
    net: ClusterNet,
    /// Created once, removed at the end (and by the guard after a SIGKILL).
    chain: Option<String>,
    /// The nodes cut off now, waited for when the cut heals.
    cut: Vec<usize>,
}

impl ClusterEnv {
    pub async fn start(opts: &EnvOptions) -> Result<ClusterEnv> {
        let net = opts
            .cluster
            .clone()
            .context("a cluster needs its addresses")?;
        let started = Instant::now();
        let base = LocalEnv::start(opts).await?;
        let mut env = ClusterEnv {
            base,
            peers: Vec::new(),
            net,
            chain: None,
            cut: Vec::new(),
        };
        let launch = env.base.launch().context("node 1 was not started")?.clone();
        let ports = free_ports(2 * (env.net.ips.len() - 1))?;
        for n in 2..=env.net.ips.len() {
            let (amqp_port, dist_port) = (ports[2 * (n - 2)], ports[2 * (n - 2) + 1]);
            let launch = env.peer_launch(&launch, n, amqp_port, dist_port)?;
            let (child, stdin) = launch.spawn()?;
            env.peers.push(Peer {
                child: Some(child),
                stdin,
                launch,
                amqp_port,
            });
        }
        opts.progress.say("RabbitMQ nodes 2 and 3 joining node 1");
        let deadline = Instant::now() + env.base.ready_timeout();
        for p in &env.peers {
            env.base.node_ready(p.amqp_port, deadline).await?;
        }
        env.base.info.ready = started.elapsed();
        env.base.info.broker_version = format!(
            "{} ({} nodes)",
            env.base.info.broker_version,
            env.net.ips.len()
        );
        Ok(env)
    }

    /// Node n's launch: node 1's, with its own name, ports, directories and
    /// address, joining node 1.
    fn peer_launch(
        &self,
        first: &RabbitLaunch,
        n: usize,
        amqp_port: u16,
        dist_port: u16,
    ) -> Result<RabbitLaunch> {
        let root = first
            .out
            .parent()
            .and_then(|log| log.parent())
            .and_then(|rabbit| rabbit.parent())
            .context("node 1's directory")?
            .join(format!("rabbit-{n}"));
        for d in ["etc", "mnesia", "log"] {
            std::fs::create_dir_all(root.join(d))?;
        }
        std::fs::write(
            root.join("etc/rabbitmq.conf"),
            format!(
                "log.console = false\n\
                 cluster_formation.peer_discovery_backend = classic_config\n\
                 cluster_formation.classic_config.nodes.1 = {}\n\
                 cluster_partition_handling = pause_minority\n",
                self.net.node_name(1)
            ),
        )?;
        let mut launch = first.clone();
        launch.set("RABBITMQ_NODENAME", self.net.node_name(n));
        launch.set("RABBITMQ_NODE_PORT", amqp_port.to_string());
        launch.set("RABBITMQ_DIST_PORT", dist_port.to_string());
        launch.set("RABBITMQ_CONFIG_FILE", root.join("etc/rabbitmq.conf"));
        launch.set("RABBITMQ_MNESIA_BASE", root.join("mnesia"));
        launch.set("RABBITMQ_LOG_BASE", root.join("log"));
        launch.set("RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS", self.net.erl_args(n));
        launch.out = root.join("log/server.out");
        launch.log = root.join(format!("log/{}.log", self.net.node_name(n)));
        Ok(launch)
    }

    pub fn nodes(&self) -> usize {
        self.net.ips.len()
    }

    /// Every node's AMQP port on 127.0.0.1, node 1 first.
    pub fn broker_ports(&self) -> Vec<u16> {
        std::iter::once(self.base.endpoints.broker.port)
            .chain(self.peers.iter().map(|p| p.amqp_port))
            .collect()
    }

    fn peer(&mut self, n: usize) -> Result<&mut Peer> {
        if n < 2 || n > self.nodes() {
            bail!("no node {n} in a {}-node cluster", self.nodes());
        }
        Ok(&mut self.peers[n - 2])
    }

    /// Node n, SIGKILLed (node 1 is the base's).
    async fn kill_node(&mut self, n: usize) -> Result<()> {
        if n == 1 {
            return self.base.kill_broker().await;
        }
        let p = self.peer(n)?;
        drop(p.stdin.take());
        let mut c = p.child.take().context("the node is not running")?;
        process::stop(&mut c, Signal::SIGKILL, Duration::from_secs(5)).await;
        Ok(())
    }

    /// Node m's launch, if it runs (not killed by the lab).
    fn running_launch(&self, m: usize) -> Option<&RabbitLaunch> {
        match m {
            1 => self.base.launch().filter(|_| self.base.is_running()),
            _ => self
                .peers
                .get(m - 2)
                .filter(|p| p.child.is_some())
                .map(|p| &p.launch),
        }
    }

    /// The chain, created on first use and hooked into INPUT; its name is
    /// written where the guard finds it after a SIGKILL.
    fn chain(&mut self) -> Result<String> {
        if let Some(c) = &self.chain {
            return Ok(c.clone());
        }
        let chain = self.net.chain();
        iptables(&["-N", &chain]).context(
            "a partition needs iptables and root (mqlab runs as root on the lab machines)",
        )?;
        self.chain = Some(chain.clone());
        std::fs::write(crate::env::guard::chain_file(self.run_dir()), &chain)?;
        iptables(&["-I", "INPUT", "-j", &chain])?;
        Ok(chain)
    }

    fn run_dir(&self) -> &std::path::Path {
        self.base.run_dir()
    }

    pub async fn stop(mut self) {
        if let Some(chain) = self.chain.take() {
            crate::env::guard::remove_chain(&chain);
        }
        for p in &mut self.peers {
            drop(p.stdin.take());
            if let Some(mut c) = p.child.take() {
                process::stop(&mut c, Signal::SIGKILL, Duration::from_secs(5)).await;
            }
        }
        let base = std::mem::replace(&mut self.base, LocalEnv::placeholder());
        base.stop().await;
    }
}

impl Drop for ClusterEnv {
    /// The panic path: nothing awaited, everything killed, the chain removed.
    fn drop(&mut self) {
        if let Some(chain) = self.chain.take() {
            crate::env::guard::remove_chain(&chain);
        }
        for p in &mut self.peers {
            drop(p.stdin.take());
            if let Some(c) = p.child.as_mut() {
                process::kill_now(c);
            }
        }
    }
}

impl Server for ClusterEnv {
    fn count(&self) -> usize {
        self.nodes()
    }

    async fn running(&self, n: usize) -> bool {
        self.running_launch(n).is_some()
    }

    async fn ready(&self, n: usize, deadline: Instant) -> Result<()> {
        self.base
            .node_ready(self.broker_ports()[n - 1], deadline)
            .await
    }

    fn ready_timeout(&self) -> Duration {
        self.base.ready_timeout()
    }

    async fn kill(&mut self, n: usize) -> Result<()> {
        self.kill_node(n).await
    }

    async fn start(&mut self, n: usize) -> Result<()> {
        if n == 1 {
            return Server::start(&mut self.base, 1).await;
        }
        let p = self.peer(n)?;
        let (child, stdin) = p.launch.spawn()?;
        p.child = Some(child);
        p.stdin = stdin;
        Ok(())
    }

    /// Node 1 only: the broker pause is a publish step's, on the node the
    /// producer is connected to; no lab pauses another node.
    async fn pause(&self, n: usize) -> Result<()> {
        if n != 1 {
            bail!("pausing node {n}: only node 1 is paused (a broker pause)");
        }
        self.base.pause_broker().await
    }

    async fn resume(&self, n: usize) -> Result<()> {
        if n != 1 {
            bail!("resuming node {n}: only node 1 is paused (a broker pause)");
        }
        self.base.resume_broker()
    }

    async fn version(&self, n: usize) -> Result<String> {
        let node = super::Environment::endpoints(&self.base)
            .broker
            .at(self.broker_ports()[n - 1]);
        crate::broker::rabbitmq::version(&node).await
    }
}

impl Nodes for ClusterEnv {
    fn name(&self, n: usize) -> String {
        self.net.node_name(n)
    }

    async fn eval(&self, n: usize, expr: &str) -> Result<String> {
        self.running_launch(n)
            .with_context(|| format!("node {n} is not running"))?
            .eval(expr)
            .await
    }

    /// Its AMQP listener on 127.0.0.1 refuses: the broker stopped serving.
    async fn stopped(&self, n: usize) -> Result<bool> {
        let port = self.broker_ports()[n - 1];
        Ok(tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err())
    }

    /// Both directions between node n's address and each other node's, in
    /// this cluster's own chain.
    async fn cut(&mut self, n: usize) -> Result<()> {
        let chain = self.chain()?;
        self.cut.push(n);
        let cut = self.net.ips[n - 1].to_string();
        for (i, ip) in self.net.ips.iter().enumerate() {
            if i + 1 == n {
                continue;
            }
            let other = ip.to_string();
            for (s, d) in [(&cut, &other), (&other, &cut)] {
                iptables(&["-A", &chain, "-s", s, "-d", d, "-j", "DROP"])?;
            }
        }
        Ok(())
    }

    /// The chain flushed: every cut at once.
    async fn uncut(&mut self) -> Result<Vec<usize>> {
        if let Some(chain) = &self.chain {
            iptables(&["-F", chain])?;
        }
        Ok(std::mem::take(&mut self.cut))
    }
}

fn iptables(args: &[&str]) -> Result<()> {
    // -w: wait for the xtables lock (the container engine may hold it).
    let out = StdCommand::new("iptables")
        .arg("-w")
        .args(args)
        .output()
        .context("cannot run iptables")?;
    if !out.status.success() {
        bail!(
            "iptables {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Node 1 is the base's; the waits are [`nodes`]'s over this cluster.
impl super::Environment for ClusterEnv {
    fn endpoints(&self) -> &super::Endpoints {
        &self.base.endpoints
    }

    fn info(&self) -> &super::EnvInfo {
        &self.base.info
    }

    fn broker_ports(&self) -> Vec<u16> {
        ClusterEnv::broker_ports(self)
    }

    fn stop(self: Box<Self>) -> futures_util::future::LocalBoxFuture<'static, ()> {
        Box::pin(ClusterEnv::stop(*self))
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
        Box::pin(nodes::sync_metadata(self, n))
    }

    fn set_policy<'a>(&'a self, p: &'a super::PolicyRequest<'a>) -> super::EnvFuture<'a, ()> {
        Box::pin(nodes::set_policy(self, p))
    }

    fn queue_held<'a>(
        &'a self,
        vhost: &'a str,
        queue: &'a str,
    ) -> super::EnvFuture<'a, super::nodes::Held> {
        Box::pin(nodes::held(self, vhost, queue))
    }

    fn queue_holds<'a>(&'a self, vhost: &'a str, queue: &'a str) -> super::EnvFuture<'a, u64> {
        Box::pin(nodes::holds(self, vhost, queue))
    }

    fn queue_home_down<'a>(
        &'a self,
        n: usize,
        vhost: &'a str,
        queue: &'a str,
        faulted: &'a [usize],
    ) -> super::EnvFuture<'a, Option<bool>> {
        Box::pin(async move {
            nodes::home_down(self, n, vhost, queue, faulted)
                .await
                .map(Some)
        })
    }

    fn await_leader<'a>(
        &'a self,
        gone: usize,
        vhost: &'a str,
        queue: &'a str,
        deadline: Instant,
    ) -> super::EnvFuture<'a, ()> {
        Box::pin(nodes::await_leader(self, gone, vhost, queue, deadline))
    }

    fn kill_node(&mut self, n: usize) -> super::EnvFuture<'_, ()> {
        Box::pin(ClusterEnv::kill_node(self, n))
    }

    fn restart_node(&mut self, n: usize) -> super::EnvFuture<'_, ()> {
        Box::pin(nodes::restart(self, n))
    }

    fn partition(&mut self, n: usize) -> super::EnvFuture<'_, ()> {
        Box::pin(nodes::partition(self, n))
    }

    fn heal(&mut self) -> super::EnvFuture<'_, ()> {
        Box::pin(nodes::heal(self))
    }
}
