//! The containers environment's three-node cluster: its peers, its node
//! faults through [`Nodes`], and a partition as iptables rules in the cut
//! node's own network namespace.

use super::*;

/// A three-node cluster in containers: node faults, as `ClusterEnv` has them
/// for local nodes. A partition is iptables rules in the cut node's own
/// network namespace (nsenter as root), gone with the container.
impl ContainersEnv {
    pub(super) async fn start_peers(
        &mut self,
        opts: &EnvOptions,
        rabbitmq: &str,
        run: &str,
        deadline: Instant,
    ) -> Result<()> {
        let c = self.cluster.as_ref().context("a cluster")?;
        let reqs: Vec<_> = (2..=c.names.len())
            .map(|n| rabbit_request(rabbitmq, opts, run, c.ports[n - 1], Some((c, n))))
            .collect();
        let started = futures_util::future::join_all(reqs.into_iter().map(|r| r.start())).await;
        let mut first_err = None;
        for r in started {
            match r {
                Ok(p) => self.cluster.as_mut().context("a cluster")?.peers.push(p),
                Err(e) => {
                    first_err.get_or_insert(anyhow::anyhow!(
                        "cannot start a container of image `{rabbitmq}`: {e}"
                    ));
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        for n in 2..=self.nodes() {
            self.node_ready(n, deadline).await?;
        }
        Ok(())
    }

    pub fn nodes(&self) -> usize {
        self.cluster.as_ref().map_or(1, |c| c.names.len())
    }

    pub fn broker_ports(&self) -> Vec<u16> {
        match &self.cluster {
            Some(c) => c.ports.clone(),
            None => vec![self.endpoints.broker.port],
        }
    }

    pub(super) fn node(&self, n: usize) -> Result<&ContainerAsync<GenericImage>> {
        match (n, &self.cluster) {
            (1, _) => self.broker(),
            (n, Some(c)) if n >= 2 && n <= c.names.len() => {
                c.peers.get(n - 2).context("the node's container is gone")
            }
            _ => bail!("no node {n} in a {}-node cluster", self.nodes()),
        }
    }

    pub(super) async fn node_ready(&self, n: usize, deadline: Instant) -> Result<()> {
        let node = self.endpoints.broker.at(self.broker_ports()[n - 1]);
        if nodes::answers_amqp(&node.url(&self.ready.0), deadline).await {
            return Ok(());
        }
        bail!(
            "RabbitMQ node {n} did not become ready in time; last lines of its log:\n{}",
            tail_logs(self.node(n)?).await
        )
    }

    pub(super) async fn is_up(&self, n: usize) -> bool {
        match self.node(n) {
            Ok(c) => c.is_running().await.unwrap_or(false),
            Err(_) => false,
        }
    }

    /// `rabbitmqctl eval` in node n's container.
    pub(super) async fn exec_eval(&self, n: usize, expr: &str) -> Result<String> {
        let mut r = self
            .node(n)?
            .exec(testcontainers::core::ExecCommand::new([
                "rabbitmqctl",
                "eval",
                expr,
            ]))
            .await
            .with_context(|| format!("rabbitmqctl eval in node {n}'s container"))?;
        let out = r.stdout_to_vec().await?;
        let err = r.stderr_to_vec().await?;
        let code = r.exit_code().await?;
        // rabbitmqctl warns that RABBITMQ_ERLANG_COOKIE is deprecated: that
        // line is not the answer.
        let out = String::from_utf8_lossy(&out)
            .lines()
            .filter(|l| !l.contains("RABBITMQ_ERLANG_COOKIE env variable support is deprecated"))
            .collect::<Vec<_>>()
            .join("\n")
            .trim()
            .to_string();
        if code != Some(0) {
            bail!(
                "`rabbitmqctl eval {expr}` in node {n}'s container failed ({code:?}): {out} {}",
                String::from_utf8_lossy(&err).trim()
            );
        }
        Ok(out)
    }

    /// The node's process id and its address on the cluster's network.
    pub(super) async fn pid_and_ip(&self, n: usize) -> Result<(i64, String)> {
        let c = self
            .cluster
            .as_ref()
            .context("a partition needs a cluster")?;
        let id = self.node(n)?.id().to_string();
        let info = c.docker.inspect_container(&id, None).await?;
        let pid = info.state.and_then(|s| s.pid).unwrap_or_default();
        let ip = info
            .network_settings
            .and_then(|s| s.networks)
            .and_then(|nets| nets.get(&c.network).cloned())
            .and_then(|e| e.ip_address)
            .unwrap_or_default();
        if pid <= 0 || ip.is_empty() {
            bail!(
                "node {n}'s container has no process or no address on `{}`",
                c.network
            );
        }
        Ok((pid, ip))
    }
}

impl Server for ContainersEnv {
    fn count(&self) -> usize {
        self.nodes()
    }

    async fn running(&self, n: usize) -> bool {
        self.is_up(n).await
    }

    async fn ready(&self, n: usize, deadline: Instant) -> Result<()> {
        self.node_ready(n, deadline).await
    }

    fn ready_timeout(&self) -> Duration {
        self.ready.1
    }

    /// Exit 137, as `docker kill` does it.
    async fn kill(&mut self, n: usize) -> Result<()> {
        self.node(n)?.stop_with_timeout(Some(0)).await?;
        Ok(())
    }

    /// The same container, with its data and host port. One the engine
    /// still reports running (or cannot say) is an error, not a restart.
    async fn start(&mut self, n: usize) -> Result<()> {
        let c = self.node(n)?;
        let running = c
            .is_running()
            .await
            .with_context(|| format!("asking the engine about node {n}'s container"))?;
        if running {
            bail!("node {n}'s container still runs: it was not killed, so it is not restarted");
        }
        c.start().await?;
        Ok(())
    }

    /// `docker pause`: the container's processes frozen (the cgroup freezer).
    async fn pause(&self, n: usize) -> Result<()> {
        self.node(n)?.pause().await?;
        Ok(())
    }

    async fn resume(&self, n: usize) -> Result<()> {
        self.node(n)?.unpause().await?;
        Ok(())
    }

    async fn version(&self, n: usize) -> Result<String> {
        let node = self.endpoints.broker.at(self.broker_ports()[n - 1]);
        crate::broker::version(&node).await
    }
}

impl Nodes for ContainersEnv {
    fn name(&self, n: usize) -> String {
        match &self.cluster {
            Some(c) => format!("rabbit@{}", c.names[n - 1]),
            None => "rabbit@localhost".into(),
        }
    }

    async fn eval(&self, n: usize, expr: &str) -> Result<String> {
        self.exec_eval(n, expr).await
    }

    /// The node says its broker is not running (a container's published
    /// port accepts whatever the broker does); no answer yet: not stopped.
    async fn stopped(&self, n: usize) -> Result<bool> {
        Ok(matches!(self.exec_eval(n, "rabbit:is_running().").await, Ok(a) if a == "false"))
    }

    /// Rules in node n's own network namespace, both directions, against
    /// each other node's address on the cluster's network.
    async fn cut(&mut self, n: usize) -> Result<()> {
        let (pid, _) = self.pid_and_ip(n).await?;
        let mut others = Vec::new();
        for m in (1..=self.nodes()).filter(|m| *m != n) {
            others.push(self.pid_and_ip(m).await?.1);
        }
        let c = self.cluster.as_mut().context("a cluster")?;
        c.cut.push((n, others.clone()));
        for other in &others {
            for rule in cut_rules(other) {
                in_netns(pid, &[&["-A"], &rule[..]].concat())?;
            }
        }
        Ok(())
    }

    async fn uncut(&mut self) -> Result<Vec<usize>> {
        let cut = match &self.cluster {
            Some(c) => c.cut.clone(),
            None => return Ok(Vec::new()),
        };
        for (n, others) in &cut {
            // A node that was killed (or restarted: a new namespace) since
            // has no rules left.
            if !self.is_up(*n).await {
                continue;
            }
            let (pid, _) = self.pid_and_ip(*n).await?;
            for other in others {
                for rule in cut_rules(other) {
                    let absent = in_netns(pid, &[&["-C"], &rule[..]].concat()).is_err();
                    if !absent {
                        in_netns(pid, &[&["-D"], &rule[..]].concat())?;
                    }
                }
            }
        }
        if let Some(c) = self.cluster.as_mut() {
            c.cut.clear();
        }
        Ok(cut.into_iter().map(|(n, _)| n).collect())
    }
}

impl Cluster {
    /// The run's network (labelled) and the nodes' names and ports.
    pub(super) async fn create(
        docker: &Docker,
        dir: &Path,
        nodes: usize,
        node1_port: u16,
    ) -> Result<Cluster> {
        let tag = format!("{:08x}", crate::partition::fnv1a(&dir.to_string_lossy()));
        let network = format!("mqlab-{tag}");
        let run = std::env::var(RUN_VAR).unwrap_or_default();
        let ports = std::iter::once(node1_port)
            .chain(free_ports(nodes - 1)?)
            .collect();
        docker
            .create_network(testcontainers::bollard::models::NetworkCreateRequest {
                name: network.clone(),
                labels: Some(HashMap::from([(RUN_LABEL.to_string(), run)])),
                ..Default::default()
            })
            .await
            .with_context(|| format!("cannot create the cluster's network `{network}`"))?;
        Ok(Cluster {
            docker: docker.clone(),
            names: (1..=nodes)
                .map(|n| format!("{network}-rabbit-{n}"))
                .collect(),
            network,
            ports,
            peers: Vec::new(),
            cut: Vec::new(),
        })
    }
}

/// The two rules that cut one peer's address off, both ways (without the
/// `-A`/`-C`/`-D` that adds, checks or deletes them).
pub(super) fn cut_rules(other: &str) -> [[&str; 6]; 2] {
    [
        ["INPUT", "-s", other, "-j", "DROP", "-w"],
        ["OUTPUT", "-d", other, "-j", "DROP", "-w"],
    ]
}

/// iptables in the network namespace of process `pid` (a container's).
/// The engine reports the pid; it must be a process of this machine in a
/// namespace of its own, or the rules would land in the host's (an engine
/// in a VM, or reached over the network): refused.
pub(super) fn in_netns(pid: i64, args: &[&str]) -> Result<()> {
    let theirs = std::fs::read_link(format!("/proc/{pid}/ns/net"));
    let ours = std::fs::read_link("/proc/self/ns/net");
    match (theirs, ours) {
        (Ok(t), Ok(o)) if t != o => {}
        _ => bail!(
            "the container's process {pid} is not in a network namespace of its own on this machine: a partition in containers needs a local engine"
        ),
    }
    // -w: with iptables-legacy, wait for the xtables lock, a file
    // (/run/xtables.lock) and not a namespace's, which the engine or a local
    // cluster's partition may hold; without -w it gives up at once. (The
    // nf_tables iptables of Debian 12 has no such lock: -w changes nothing.)
    let out = std::process::Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-n", "iptables", "-w"])
        .args(args)
        .output()
        .context("a partition in containers needs nsenter and iptables, as root")?;
    if !out.status.success() {
        bail!(
            "`nsenter -t {pid} -n iptables {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
