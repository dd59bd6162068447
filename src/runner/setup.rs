//! A run's setup and its links: the lab's database and vhost objects, the
//! proxy between the roles and the broker, the downstream service, the
//! harness's own connection, the URLs the roles are given, and the cluster
//! restored after a lab.

use super::*;
use crate::vocab::Durability;
use std::os::unix::fs::PermissionsExt;

/// How long the harness waits for a cluster node that refused its
/// connection: the default ready timeout (`--ready-timeout` is the
/// environment's, which the runner does not hold).
const REFUSING_NODE_PATIENCE: Duration = Duration::from_secs(60);

impl Ctx<'_> {
    pub(super) fn phase(&mut self, phase: &str) {
        self.log.sink.tell(&Event::Phase {
            run: &self.run,
            phase,
        });
    }

    /// The lab's own database and vhost objects, fresh.
    pub(super) async fn prepare(&mut self) -> Result<()> {
        self.phase("prepare");
        if self.lab.database != Durability::Fast {
            self.start_own_database().await?;
        }
        let db_name = self.database.clone();
        let mut admin =
            store::connect(&self.links.endpoints.pg_url(&self.links.endpoints.pg_admin)).await?;
        store::create_database(&mut admin, &db_name).await?;
        drop(admin);
        let mut db = store::connect(&self.links.endpoints.pg_url(&db_name)).await?;
        store::migrate(&mut db).await?;
        if let Some((own, _)) = &mut self.links.own_database {
            // The run's database and schema on disk, as the kernel's
            // writeback would have them seconds later: a power loss is
            // about the lab's steps, not its setup. The checkpoint first
            // writes out what is still in the server's memory (the
            // migrations' asynchronous commits under `async-commit`).
            sqlx::query("CHECKPOINT").execute(&mut db).await?;
            own.writeback()?;
            if self.lab.database == Durability::AsyncCommit && self.lab.has_database_fault() {
                own.hold_wal_writer().await?;
            }
        }
        let broker = self.connect_broker().await?;
        if self.shared_vhost {
            // Another run used this vhost: its queues of the same names go.
            broker.delete_queues(&self.lab.topology).await?;
        }
        broker.declare(&self.lab.topology).await?;
        self.sync_metadata().await?;
        std::fs::create_dir_all(&self.logs)?;
        self.links.conns = Some(Conns { broker, db });
        let addr = &self.links.endpoints.broker;
        let mut upstreams = vec![addr.socket().await?];
        for port in self.servers.node_ports.iter().skip(1) {
            upstreams.push(addr.at(*port).socket().await?);
        }
        let (proxy, events) =
            Proxy::start(upstreams, crate::broker::codec(self.lab.broker)).await?;
        self.links.role_endpoints.broker.port = proxy.port;
        self.links.proxy = Some((proxy, events));
        self.log.observed.events = Events(
            self.lab
                .steps
                .iter()
                .filter_map(|s| match &s.action {
                    Action::Publish(p) => Some(p.messages.iter()),
                    _ => None,
                })
                .flatten()
                .map(|m| {
                    (
                        m.meta.message_id.clone(),
                        store::event_id(m.body.as_bytes(), &m.meta.message_id),
                    )
                })
                .collect(),
        );
        // The waits a retried message owes, as the lab declares its tiers.
        self.log.observed.retry_tiers = self
            .lab
            .steps
            .iter()
            .find_map(|s| match &s.action {
                Action::Consume(c) => c.retry.as_ref().filter(|r| !r.tiers.is_empty()),
                _ => None,
            })
            .map(|r| r.tiers.iter().map(|(_, ttl)| *ttl).collect())
            .unwrap_or_default();
        // After the events: it names the messages it loses by their event.
        self.links.downstream = self.start_downstream().await?;
        Ok(())
    }

    /// The downstream service, when a consume step declares one: it loses
    /// the response to the first call for each event the steps name.
    pub(super) async fn start_downstream(&self) -> Result<Option<Downstream>> {
        let mut declared = false;
        let mut lose = BTreeSet::new();
        for s in &self.lab.steps {
            if let Action::Consume(Consume {
                downstream: Some(d),
                ..
            }) = &s.action
            {
                declared = true;
                lose.extend(
                    d.lose_response
                        .iter()
                        .map(|m| self.log.observed.events.of(m).to_string()),
                );
            }
        }
        match declared {
            true => Ok(Some(Downstream::start(lose).await?)),
            false => Ok(None),
        }
    }

    /// For a lab that kills a node: its declared queues on disk now, before
    /// any kill (node 1's log; a cluster's other nodes hold the same
    /// metadata in their own copies).
    pub(super) async fn sync_metadata(&self) -> Result<()> {
        match (self.lab.has_broker_fault(), self.env.owned()) {
            (true, Some(env)) => crate::faults::broker::declared(env, self.harness_node()).await,
            _ => Ok(()),
        }
    }

    /// The node the harness talks to: the first that is up and not cut off.
    pub(super) fn harness_node(&self) -> usize {
        (1..=self.servers.node_ports.len())
            .find(|n| !self.servers.nodes_down.contains(n) && !self.servers.nodes_cut.contains(n))
            .unwrap_or(1)
    }

    /// Resumes what the lab left paused, heals what it left cut off and
    /// restarts what it left down.
    /// Every step is tried; the first error is reported.
    pub(super) async fn restore_cluster(&mut self) -> Result<()> {
        let Some(env) = self.env.own() else {
            return Ok(());
        };
        let mut first: Option<anyhow::Error> = None;
        if self.servers.broker_paused {
            match env.resume_broker().await {
                Ok(()) => self.servers.broker_paused = false,
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        if !self.servers.nodes_cut.is_empty() {
            if let Err(e) = env.heal().await {
                first.get_or_insert(e);
            }
            self.servers.nodes_cut.clear();
        }
        for n in std::mem::take(&mut self.servers.nodes_down) {
            if let Err(e) = env.restart_node(n).await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// A role's broker URL: the proxy's listener for its node.
    pub(super) fn role_url(&self, node: usize) -> String {
        self.role_url_via(node, None)
    }

    /// A role's broker URL through `proxy` (None: the harness's proxy).
    pub(super) fn role_url_via(&self, node: usize, proxy: Option<&Proxy>) -> String {
        let addr = &self.links.role_endpoints.broker;
        let proxy = proxy.or(self.links.proxy.as_ref().map(|(p, _)| p));
        match proxy.and_then(|p| p.ports.get(node.wrapping_sub(1))) {
            Some(port) => addr.at(*port).url(&self.vhost),
            None => addr.url(&self.vhost),
        }
    }

    /// The run's own PostgreSQL, in the run's directory: the harness and
    /// the roles reach it instead of the environment's. Its durability is
    /// read back from the server (`fsync`, `full_page_writes`,
    /// `synchronous_commit`): a server that does not have it fails the run.
    async fn start_own_database(&mut self) -> Result<()> {
        let durability = self.lab.database;
        // Traversable by the user PostgreSQL runs as, whatever the umask.
        for d in [self.logs.parent(), Some(self.logs.as_path())]
            .into_iter()
            .flatten()
        {
            std::fs::create_dir_all(d)?;
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))?;
        }
        let dir = self.logs.join("postgres");
        let env = self.env.read();
        let own = env
            .own_database(durability, &dir, self.lab.has_database_fault())
            .await
            .context("the run's own PostgreSQL")?;
        for e in [&mut self.links.endpoints, &mut self.links.role_endpoints] {
            e.pg_host = "127.0.0.1".into();
            e.pg_port = own.port;
            e.pg_user = "postgres".into();
            e.pg_password = None;
            e.pg_admin = "postgres".into();
        }
        let cluster = format!(
            "the run's own cluster on 127.0.0.1:{}, `{durability}`",
            own.port
        );
        self.links.own_database = Some((own, cluster));
        let (fsync, full_pages, sync_commit) = crate::env::postgres::durability_at(
            &self.links.endpoints.pg_url(&self.links.endpoints.pg_admin),
        )
        .await?;
        let seen = (fsync.as_str(), full_pages.as_str(), sync_commit.as_str());
        if seen != crate::env::postgres::durability_of(durability) {
            bail!("the run's own PostgreSQL has fsync={fsync}, full_page_writes={full_pages}, synchronous_commit={sync_commit}: not `{durability}`");
        }
        if let Some((_, said)) = &mut self.links.own_database {
            said.push_str(&format!(
                ": fsync={fsync}, full_page_writes={full_pages}, synchronous_commit={sync_commit} (read from the server)"
            ));
        }
        Ok(())
    }

    /// After the last step, however the run ended: the cluster restored
    /// (an error of its own if that fails), the harness's links closed, the
    /// run's own PostgreSQL stopped (its version and what it was, for the
    /// evidence).
    pub(super) async fn end(&mut self, error: &mut Option<String>) -> Option<(String, String)> {
        // The next cluster lab starts on three healthy nodes, whatever this
        // one left cut off or down.
        if let Err(e) = self.restore_cluster().await {
            error.get_or_insert(format!("restoring the cluster after the lab: {e:#}"));
        }
        if let Some(c) = self.links.conns.take() {
            c.broker.close("done").await;
        }
        let Some((db, said)) = self.links.own_database.take() else {
            // A durable lab whose cluster never started: not the shared one.
            let d = self.lab.database;
            return (d != Durability::Fast).then(|| {
                (
                    String::new(),
                    format!("the run's own `{d}` cluster: it did not start"),
                )
            });
        };
        let version = db.version.clone();
        if let Err(e) = db.stop().await {
            error.get_or_insert(format!("{e:#}"));
        }
        Some((version, said))
    }

    /// The harness's own connection: to the first node that is up and in
    /// the majority (node 1 but in a cluster lab that stopped or cut it off).
    /// A cluster node that refuses it is waited for, and the wait said.
    pub(super) async fn connect_broker(&self) -> Result<Box<dyn Admin>> {
        let node = self.harness_node();
        let addr = &self.links.endpoints.broker;
        let port = self
            .servers
            .node_ports
            .get(node - 1)
            .copied()
            .unwrap_or(addr.port);
        let url = addr.at(port).url(&self.vhost);
        let first = crate::broker::admin(&url).await;
        let Err(e) = first else { return first };
        let refused = e.chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        });
        if self.servers.node_ports.len() < 2 || !refused {
            return Err(e);
        }
        // Seen once in containers, right after node 1's kill: node 2's
        // published port refused the harness (why is not known: a node
        // that sees itself in a minority pauses, pause_minority, but a
        // paused node's published port still accepts; the engine's
        // forwarding is the other suspect). The node's answer is waited
        // for, as its readiness is, and the wait is said.
        let waited = Instant::now();
        if !crate::env::nodes::answers_amqp(&url, waited + REFUSING_NODE_PATIENCE).await {
            return Err(e.context(format!(
                "node {node} took no connection for {} s after that",
                REFUSING_NODE_PATIENCE.as_secs()
            )));
        }
        eprintln!(
            "mqlab: {}: node {node} refused the harness's connection ({e:#}); it took one {:.1} s later",
            self.run,
            waited.elapsed().as_secs_f64()
        );
        crate::broker::admin(&url).await
    }

    pub(super) fn proxy(&self) -> &Proxy {
        &self
            .links
            .proxy
            .as_ref()
            .expect("prepared before any step")
            .0
    }

    /// PostgreSQL's ground truth now (a program's effects by the lab's query).
    pub(super) async fn ground(&mut self) -> Result<store::Ground> {
        let lab = self.lab;
        store::read_ground(&mut self.conns().db, lab.effects.as_deref()).await
    }

    pub(super) fn conns(&mut self) -> &mut Conns {
        self.links.conns.as_mut().expect("prepared before any step")
    }
}
