//! Executes labs on a running environment. The only place that knows about
//! phases and faults: it spawns the roles, reads their lines into the
//! transcript, kills at the selected window, reads broker and database
//! state, judges the assertions, compares the snapshot, and says all of it
//! as [`Event`]s. A failure inside one lab (even its setup) fails that lab
//! only; the next lab runs.

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use lapin::Channel;
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use sqlx::PgConnection;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::mpsc;

use crate::checker::{self, Asserted, Events, History, LabVerdict, Observed, Outcome, Point};
use crate::env::{process, Endpoints, Environment};
use crate::events::{Event, Sink};
use crate::faults::blackbox::{BlackBox, Seen};
use crate::faults::pgproxy::PgProxy;
use crate::faults::proxy::{Proxy, ProxyEvent, Rule};
use crate::lab::{Action, Assertion, Consume, Fault, Lab, Project, Publish, Settle};
use crate::naming::{database_for, vhost_for};
use crate::protocol::{
    ConsumerConfig, Envelope, FaultPoint, OutMessage, ProducerConfig, RetryPolicy, RoleConfig, Tier,
};
use crate::record::{RunRecord, SnapshotResult};
use crate::snapshot;
use crate::store;
use crate::transcript::{Entry, Record, Transcript};
use crate::vocab::{Counter, FaultAction, Role, Status, Target, Window};

/// Where a suite runs and what it may touch. The runner holds the
/// environment itself, not only its endpoints: a broker fault is a lab step.
pub struct Suite<'a> {
    pub project: &'a Project,
    pub env: &'a mut Environment,
    pub exe: &'a Path,
    /// Role logs go under `run_dir/roles/<run>/`.
    pub run_dir: &'a Path,
    /// Rewrite the snapshot of a run that passed and differs.
    pub update: bool,
    /// Every run in this vhost (`mqlab explore`), each deleting the lab's
    /// queues first; else each run in its own (`vhost_for`).
    pub vhost: Option<String>,
    /// Judge the total-queue checks only: no snapshot (`mqlab explore`).
    pub checks_only: bool,
    /// Runs at once (`--jobs`): labs without a broker fault run
    /// concurrently, each in its own vhost and database; a lab with one
    /// has the environment to itself, after them.
    pub jobs: usize,
}

/// What one run needs besides its lab and the environment.
struct Params<'a> {
    project: &'a Project,
    exe: &'a Path,
    run_dir: &'a Path,
    update: bool,
    checks_only: bool,
    endpoints: Endpoints,
    vhost: Option<String>,
    /// The vhosts outlived earlier runs (`--env-dir`): each run deletes its
    /// lab's queues first (a broker crash can even bring acked messages back).
    reused: bool,
    /// Before every vhost and database name (`--env external`).
    prefix: String,
    /// Every node's AMQP port, node 1 first (one, but in a cluster).
    node_ports: Vec<u16>,
}

impl<'a> Suite<'a> {
    /// What a run needs of the suite; it borrows none of the suite itself,
    /// so the environment can be lent to the run beside it.
    fn params(&self) -> Params<'a> {
        Params {
            project: self.project,
            exe: self.exe,
            run_dir: self.run_dir,
            update: self.update,
            checks_only: self.checks_only,
            endpoints: self.env.endpoints().clone(),
            vhost: self.vhost.clone(),
            reused: self.env.reused(),
            prefix: self.env.prefix(),
            node_ports: self.env.amqp_ports(),
        }
    }

    /// Runs the labs; each ends in a [`RunRecord`], pushed as soon as it is
    /// over (an interrupted suite keeps what ended), and the records end in
    /// the labs' order.
    pub async fn run(&mut self, labs: &[Lab], records: &mut Vec<RunRecord>, sink: &mut dyn Sink) {
        let total = labs.len();
        let alone = Lab::has_broker_fault;
        let mut order: Vec<String> = labs.iter().map(Lab::run_name).collect();
        // Concurrency only pays with two runs to overlap; one run streams
        // its lines as they happen.
        let overlapping = labs.iter().filter(|l| !alone(l)).count() > 1;
        if self.jobs > 1 && self.vhost.is_none() && overlapping {
            let shared: Vec<(usize, &Lab)> =
                labs.iter().enumerate().filter(|(_, l)| !alone(l)).collect();
            let params = self.params();
            {
                let out = std::cell::RefCell::new(&mut *sink);
                let finished = std::cell::RefCell::new(&mut *records);
                let runs = futures_util::stream::iter(shared.into_iter().map(|(index, lab)| {
                    let (params, sink, finished) = (&params, &out, &finished);
                    async move {
                        let run = lab.run_name();
                        sink.borrow_mut().tell(&Event::LabStarted {
                            run: &run,
                            index,
                            total,
                        });
                        // A run's events wait for its end: concurrent runs' lines
                        // do not interleave.
                        let mut held = Held::default();
                        let record = execute(params, None, lab, &mut held).await;
                        let mut out = sink.borrow_mut();
                        held.replay(&mut **out);
                        out.tell(&Event::LabFinished(&record));
                        finished.borrow_mut().push(record);
                    }
                }));
                futures_util::StreamExt::for_each_concurrent(runs, self.jobs, |f| f).await;
            }
            for (index, lab) in labs.iter().enumerate().filter(|(_, l)| alone(l)) {
                self.run_logged(lab, index, total, records, sink).await;
            }
        } else {
            for (index, lab) in labs.iter().enumerate() {
                self.run_logged(lab, index, total, records, sink).await;
            }
            order.clear();
        }
        if !order.is_empty() {
            records.sort_by_key(|r| order.iter().position(|o| *o == r.run));
        }
    }

    async fn run_logged(
        &mut self,
        lab: &Lab,
        index: usize,
        total: usize,
        records: &mut Vec<RunRecord>,
        sink: &mut dyn Sink,
    ) {
        let run = lab.run_name();
        sink.tell(&Event::LabStarted {
            run: &run,
            index,
            total,
        });
        let record = self.run_one(lab, sink).await;
        sink.tell(&Event::LabFinished(&record));
        records.push(record);
    }

    /// One run, with the environment to itself: what `mqlab explore` calls
    /// for each point.
    pub async fn run_one(&mut self, lab: &Lab, sink: &mut dyn Sink) -> RunRecord {
        let params = self.params();
        execute(&params, Some(&mut *self.env), lab, sink).await
    }
}

/// The events of one run, kept until it ends (`--jobs`).
#[derive(Default)]
struct Held {
    events: Vec<HeldEvent>,
}

enum HeldEvent {
    Line(String),
    Outcome(Outcome),
    Snapshot(String, SnapshotResult),
}

impl Sink for Held {
    fn on(&mut self, event: &Event) -> Result<()> {
        match event {
            Event::Line(l) => self.events.push(HeldEvent::Line(l.to_string())),
            Event::Outcome(o) => self.events.push(HeldEvent::Outcome((*o).clone())),
            Event::SnapshotCompared { run, result } => self
                .events
                .push(HeldEvent::Snapshot(run.to_string(), (*result).clone())),
            _ => {}
        }
        Ok(())
    }
}

impl Held {
    fn replay(self, sink: &mut dyn Sink) {
        for e in &self.events {
            match e {
                HeldEvent::Line(l) => sink.tell(&Event::Line(l)),
                HeldEvent::Outcome(o) => sink.tell(&Event::Outcome(o)),
                HeldEvent::Snapshot(run, result) => {
                    sink.tell(&Event::SnapshotCompared { run, result })
                }
            }
        }
    }
}

/// One lab run, from its preparation to its snapshot comparison.
async fn execute(
    p: &Params<'_>,
    env: Option<&mut Environment>,
    lab: &Lab,
    sink: &mut dyn Sink,
) -> RunRecord {
    let started = Instant::now();
    let run = lab.run_name();
    let endpoints = p.endpoints.clone();
    let mut ctx = Ctx {
        lab,
        vhost: format!(
            "{}{}",
            p.prefix,
            p.vhost.clone().unwrap_or_else(|| vhost_for(&run))
        ),
        database: database_for(&format!("{}{run}", p.prefix)),
        node_ports: p.node_ports.clone(),
        nodes_down: BTreeSet::new(),
        nodes_cut: BTreeSet::new(),
        shared_vhost: p.vhost.is_some() || p.reused,
        unreachable: None,
        run: run.clone(),
        role_endpoints: endpoints.clone(),
        endpoints,
        env,
        exe: p.exe,
        root: &p.project.root,
        logs: p.run_dir.join("roles").join(&run),
        conns: None,
        proxy: None,
        step: 0,
        transcript: Transcript::default(),
        observed: Observed::default(),
        outcomes: Vec::new(),
        history: History::default(),
        sink,
        role_seq: 0,
    };
    let mut error = match ctx.run_steps().await {
        Ok(()) => None,
        Err(e) => Some(format!("{e:#}")),
    };
    // The next cluster lab starts on three healthy nodes, whatever this one
    // left cut off or down (and however it ended).
    if let Err(e) = ctx.restore_cluster().await {
        error.get_or_insert(format!("restoring the cluster after the lab: {e:#}"));
    }
    let unreachable = ctx.unreachable.take();
    if let Some(c) = ctx.conns.take() {
        let _ = c.amqp.close(200, "done".into()).await;
    }
    let verdict = match &error {
        Some(e) => LabVerdict::Failed(e.clone()),
        None => checker::lab_verdict(&ctx.outcomes, lab.variant.as_ref().map(|_| &lab.violations)),
    };
    let (transcript, outcomes, mut history) = (ctx.transcript, ctx.outcomes, ctx.history);
    history.lines = transcript.lines().to_vec();
    let passed = matches!(
        verdict,
        LabVerdict::Holds | LabVerdict::CounterexampleConfirmed
    );
    // A failed run is still compared: its diff shows where it went wrong.
    let path = snapshot::path_for(&p.project.snapshots_dir(), &run);
    let lab_file = format!("labs/{}.toml", lab.name);
    let normalized = transcript.normalized();
    let snapshot = match snapshot::compare(&path, &lab_file, &normalized, p.update && passed) {
        _ if p.checks_only => SnapshotResult::Skipped,
        Ok(snapshot::Outcome::Matched) => SnapshotResult::Matched,
        Ok(snapshot::Outcome::Updated) => SnapshotResult::Updated,
        Ok(snapshot::Outcome::Mismatch(diff)) => SnapshotResult::Mismatch(diff),
        Err(e) => SnapshotResult::Error(format!("{e:#}")),
    };
    ctx.sink.tell(&Event::SnapshotCompared {
        run: &run,
        result: &snapshot,
    });
    RunRecord {
        run,
        lab: lab.name.clone(),
        variant: lab.variant.clone(),
        claim: lab.claim.clone(),
        violations: lab.violations.clone(),
        transcript,
        outcomes,
        history,
        error,
        verdict,
        snapshot,
        duration: started.elapsed(),
        unreachable,
    }
}

/// The harness's own connections to the lab's vhost and database.
struct Conns {
    amqp: lapin::Connection,
    channel: Channel,
    db: PgConnection,
}

struct Ctx<'a> {
    lab: &'a Lab,
    run: String,
    vhost: String,
    database: String,
    /// Every node's AMQP port: the proxy's upstreams, node 1 first.
    node_ports: Vec<u16>,
    /// Cluster nodes killed by the lab, and not restarted yet.
    nodes_down: BTreeSet<usize>,
    /// Cluster nodes cut off by the lab, and not healed yet.
    nodes_cut: BTreeSet<usize>,
    /// Other runs used this vhost before: delete the lab's queues first.
    shared_vhost: bool,
    /// Why the fault's window was never reached, when it was not.
    unreachable: Option<String>,
    /// The servers themselves (the harness's own connections).
    endpoints: Endpoints,
    /// What roles connect to: the broker through the proxy.
    role_endpoints: Endpoints,
    /// The environment, for a broker fault; None for a run that shares it
    /// with concurrent runs (it has no broker step).
    env: Option<&'a mut Environment>,
    exe: &'a Path,
    /// The project's directory: a program's working directory.
    root: &'a Path,
    logs: PathBuf,
    conns: Option<Conns>,
    proxy: Option<(Proxy, mpsc::UnboundedReceiver<ProxyEvent>)>,
    /// The index of the running step (journal files are per step).
    step: usize,
    transcript: Transcript,
    observed: Observed,
    outcomes: Vec<Outcome>,
    history: History,
    sink: &'a mut dyn Sink,
    role_seq: usize,
}

/// A role process with its stdout lines (a program's output goes to its log only).
struct RoleProc {
    child: Child,
    lines: Option<Lines<BufReader<ChildStdout>>>,
    log: PathBuf,
}

impl Ctx<'_> {
    fn phase(&mut self, phase: &str) {
        self.sink.tell(&Event::Phase {
            run: &self.run,
            phase,
        });
    }

    /// The lab's own database and vhost objects, fresh.
    async fn prepare(&mut self) -> Result<()> {
        self.phase("prepare");
        let db_name = self.database.clone();
        let mut admin = store::connect(&self.endpoints.pg_url(&self.endpoints.pg_admin)).await?;
        store::create_database(&mut admin, &db_name).await?;
        drop(admin);
        let mut db = store::connect(&self.endpoints.pg_url(&db_name)).await?;
        store::migrate(&mut db).await?;
        let (amqp, channel) = self.connect_broker().await?;
        if self.shared_vhost {
            // Another run used this vhost: its queues of the same names go.
            crate::amqp::delete_queues(&channel, &self.lab.topology).await?;
        }
        crate::amqp::declare(&channel, &self.lab.topology).await?;
        self.sync_metadata().await?;
        std::fs::create_dir_all(&self.logs)?;
        self.conns = Some(Conns { amqp, channel, db });
        let upstream = format!("{}:{}", self.endpoints.amqp_host, self.endpoints.amqp_port)
            .parse()
            .context("the broker's address")?;
        let mut upstreams = vec![upstream];
        for port in self.node_ports.iter().skip(1) {
            upstreams.push(
                format!("{}:{port}", self.endpoints.amqp_host)
                    .parse()
                    .context("a node's address")?,
            );
        }
        let (proxy, events) = Proxy::start(upstreams).await?;
        self.role_endpoints.amqp_port = proxy.port;
        self.proxy = Some((proxy, events));
        self.observed.events = Events(
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
        Ok(())
    }

    /// For a lab that kills a node: its declared queues on disk now, before
    /// any kill (node 1's log; a cluster's other nodes hold the same
    /// metadata in their own copies).
    async fn sync_metadata(&self) -> Result<()> {
        match (self.lab.has_broker_fault(), self.env.as_deref()) {
            (true, Some(env)) => env.sync_metadata(self.harness_node()).await,
            _ => Ok(()),
        }
    }

    /// The node the harness talks to: the first that is up and not cut off.
    fn harness_node(&self) -> usize {
        (1..=self.node_ports.len())
            .find(|n| !self.nodes_down.contains(n) && !self.nodes_cut.contains(n))
            .unwrap_or(1)
    }

    /// Heals what the lab left cut off and restarts what it left down.
    /// Every step is tried; the first error is reported.
    async fn restore_cluster(&mut self) -> Result<()> {
        let Some(env) = self.env.as_mut() else {
            return Ok(());
        };
        let mut first: Option<anyhow::Error> = None;
        if !self.nodes_cut.is_empty() {
            if let Err(e) = env.heal().await {
                first.get_or_insert(e);
            }
            self.nodes_cut.clear();
        }
        for n in std::mem::take(&mut self.nodes_down) {
            if let Err(e) = env.restart_node(n).await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// A role's broker URL: the proxy's listener for its node.
    fn role_url(&self, node: usize) -> String {
        let mut e = self.role_endpoints.clone();
        if let Some(port) = self
            .proxy
            .as_ref()
            .and_then(|(proxy, _)| proxy.ports.get(node.wrapping_sub(1)))
        {
            e.amqp_port = *port;
        }
        e.amqp_url(&self.vhost)
    }

    /// The harness's own connection: to the first node that is up and in
    /// the majority (node 1 but in a cluster lab that stopped or cut it off).
    async fn connect_broker(&self) -> Result<(lapin::Connection, Channel)> {
        let node = self.harness_node();
        let mut e = self.endpoints.clone();
        e.amqp_port = self
            .node_ports
            .get(node - 1)
            .copied()
            .unwrap_or(e.amqp_port);
        let amqp = crate::amqp::connect(&e.amqp_url(&self.vhost)).await?;
        let channel = amqp.create_channel().await?;
        Ok((amqp, channel))
    }

    fn proxy(&self) -> &Proxy {
        &self.proxy.as_ref().expect("prepared before any step").0
    }

    /// PostgreSQL's ground truth now (a program's effects by the lab's query).
    async fn ground(&mut self) -> Result<store::Ground> {
        let lab = self.lab;
        store::read_ground(&mut self.conns().db, lab.effects.as_deref()).await
    }

    fn conns(&mut self) -> &mut Conns {
        self.conns.as_mut().expect("prepared before any step")
    }

    /// The steps in order, each followed by its assertions, then the checks;
    /// the first harness error ends the lab.
    async fn run_steps(&mut self) -> Result<()> {
        self.prepare().await?;
        let lab = self.lab;
        for (i, step) in lab.steps.iter().enumerate() {
            self.step = i;
            let phase = step.action.phase();
            self.phase(&phase);
            failpoint(&phase);
            match &step.action {
                Action::Publish(p) => self.publish(p, step.fault.as_ref(), &phase).await?,
                Action::Consume(c) => {
                    self.consume(c, step.fault.as_ref()).await?;
                    self.unnoticed_cut(&phase).await?;
                }
                Action::Inspect(fields) => self.inspect(fields).await?,
                Action::Broker(action) => self.broker(*action).await?,
                Action::Node { node, action } => self.node(*node, *action).await?,
                Action::Declare(names) => {
                    crate::amqp::declare_later(&self.conns().channel, &lab.topology, names).await?;
                    self.sync_metadata().await?;
                }
                Action::Await {
                    queue,
                    depth,
                    within_secs,
                } => self.await_at_least(queue, *depth, *within_secs).await?,
            }
            if let Some(rule) = self.proxy().armed() {
                self.proxy().disarm();
                let why = format!("phase {phase}: the network fault never happened ({rule:?}): the role never sent or received that frame");
                self.unreachable = Some(why.clone());
                bail!(why);
            }
            self.assert(&step.asserts).await?;
        }
        self.check().await
    }

    fn emit(&mut self, role: Role, body: &str) {
        let line = self.transcript.push(role, body).to_string();
        self.sink.tell(&Event::Line(&line));
    }

    fn spawn_role(&mut self, config: RoleConfig) -> Result<RoleProc> {
        let role = match &config {
            RoleConfig::Producer(_) => "producer",
            RoleConfig::Consumer(_) => "consumer",
        };
        self.role_seq += 1;
        let log = self.logs.join(format!("{}-{role}.log", self.role_seq));
        let file = self.logs.join(format!("{}-{role}.json", self.role_seq));
        process::write_private(&file, &Envelope::new(config).to_json())?;
        let mut cmd = Command::new(self.exe);
        cmd.arg("role")
            .arg("--config-file")
            .arg(&file)
            .env("RUST_LOG", "warn");
        let mut child = process::spawn(&mut cmd, &log, true)?;
        let stdout = child.stdout.take().context("role stdout")?;
        Ok(RoleProc {
            child,
            lines: Some(BufReader::new(stdout).lines()),
            log,
        })
    }

    /// The next stdout line of a role, or None at its exit; a deadline overrun
    /// kills it and names the phase.
    async fn next_line(
        &self,
        p: &mut RoleProc,
        phase: &str,
        deadline: Instant,
        secs: u64,
    ) -> Result<Option<String>> {
        let Some(lines) = p.lines.as_mut() else {
            return Ok(None);
        };
        match tokio::time::timeout_at(deadline.into(), lines.next_line()).await {
            Ok(line) => Ok(line?),
            Err(_) => {
                process::kill_now(&mut p.child);
                bail!(
                    "phase {phase} exceeded {secs} s; last lines of the role's log:\n{}",
                    process::tail(&p.log, 10)
                )
            }
        }
    }

    async fn wait_exit(
        &self,
        p: &mut RoleProc,
        phase: &str,
        deadline: Instant,
        secs: u64,
    ) -> Result<i32> {
        match tokio::time::timeout_at(deadline.into(), p.child.wait()).await {
            Ok(status) => Ok(exit_code(status?)),
            Err(_) => {
                process::kill_now(&mut p.child);
                bail!("phase {phase} exceeded {secs} s waiting for the role to exit")
            }
        }
    }

    fn producer_config(&self, p: &Publish, fault: Option<FaultPoint>) -> ProducerConfig {
        let faults = fault.into_iter().collect();
        ProducerConfig {
            lab: self.lab.name.clone(),
            amqp_url: self.role_url(p.node),
            exchange: p.exchange.clone(),
            destination: p.destination().to_string(),
            messages: p
                .messages
                .iter()
                .map(|m| OutMessage {
                    meta: m.meta.clone(),
                    routing_key: m.routing_key.clone(),
                    body: m.body.clone(),
                })
                .collect(),
            confirm: p.confirm,
            mandatory: p.mandatory,
            persistent: p.persistent,
            park: p.park.clone(),
            confirm_timeout_ms: p.confirm_timeout_ms,
            resend: p.resend,
            journal: self.logs.join(format!("producer-{}.journal", self.step)),
            faults,
            reconnect: false,
        }
    }

    async fn publish(&mut self, p: &Publish, fault: Option<&Fault>, phase: &str) -> Result<()> {
        let secs = p.deadline_secs;
        let deadline = Instant::now() + Duration::from_secs(secs);
        // Every publish-step placement of the registry, by name: a pair
        // the lab checker lets through and nothing here runs is an error.
        match fault.map(|f| (f, f.target, f.action)) {
            Some((f, Target::Node, FaultAction::Kill)) => {
                return self.publish_node_kill(p, f, phase, deadline, secs).await;
            }
            Some((f, Target::Producer, FaultAction::Kill)) => {
                let killed = self.producer_config(p, Some(point_of(f)));
                let mut proc = self.spawn_role(RoleConfig::Producer(killed))?;
                self.kill_at_marker(&mut proc, Role::Producer, f, phase, deadline, secs)
                    .await?;
                self.assert(&f.asserts).await?;
            }
            Some((f, Target::Network, FaultAction::Cut)) => {
                // The proxy drops the publish and cuts: the producer fails
                // waiting for its confirm, and a new one resumes from the journal.
                self.proxy().arm(Rule::CutOnPublish {
                    message: f.message.clone(),
                });
                let cfg = self.producer_config(p, None);
                let mut proc = self.spawn_role(RoleConfig::Producer(cfg))?;
                self.follow(&mut proc, Role::Producer, phase, deadline, secs, None)
                    .await?;
                let code = self.wait_exit(&mut proc, phase, deadline, secs).await?;
                if code == 0 {
                    bail!(
                        "phase {phase}: the producer finished; its publish of {} was never cut",
                        f.message
                    );
                }
                self.proxy_effect(phase, deadline).await?;
                self.proxy().release();
            }
            // The proxy holds the confirm; the producer times out and sends again.
            Some((f, Target::Network, FaultAction::Hold)) => self.proxy().arm(Rule::HoldConfirm {
                message: f.message.clone(),
            }),
            Some((_, target, action)) => {
                bail!("phase {phase}: `{action}` of the {target} has no runner on a publish step")
            }
            None => {}
        }
        // After a kill, the restarted producer reads the same journal.
        let cfg = self.producer_config(p, None);
        let mut proc = self.spawn_role(RoleConfig::Producer(cfg))?;
        self.follow(&mut proc, Role::Producer, phase, deadline, secs, None)
            .await?;
        self.expect_success(&mut proc, phase, deadline, secs)
            .await?;
        if let Some(f) = fault.filter(|f| f.target == Target::Network) {
            self.assert(&f.asserts).await?;
        }
        Ok(())
    }

    /// A node killed at the producer's window: the proxy holds the message's
    /// confirm (the broker has it, replicated), and once the producer's lines
    /// for the messages before it are in, the node dies. New connections wait
    /// at the proxy's gate until every quorum queue has a leader elsewhere;
    /// the producer, its connection broken, connects again (to a live node)
    /// and sends the message again, then the rest. The node stays down.
    async fn publish_node_kill(
        &mut self,
        p: &Publish,
        f: &Fault,
        phase: &str,
        deadline: Instant,
        secs: u64,
    ) -> Result<()> {
        let node = f.node.context("a node fault names its node")?;
        if self.env.is_none() {
            bail!("a node fault needs the environment to itself: this run shares it");
        }
        self.proxy().arm(Rule::HoldConfirm {
            message: f.message.clone(),
        });
        let mut cfg = self.producer_config(p, None);
        cfg.reconnect = true;
        let mut proc = self.spawn_role(RoleConfig::Producer(cfg))?;
        // The producer sends one message at a time: when the confirm before
        // the held one is logged, everything it logs until the kill is in.
        let before = p
            .messages
            .iter()
            .take_while(|m| m.meta.message_id != f.message)
            .last()
            .map(|m| m.meta.message_id.clone());
        if let Some(before) = before {
            self.follow_until(&mut proc, phase, deadline, secs, &before, Status::Confirmed)
                .await?;
        }
        let rx = &mut self.proxy.as_mut().expect("prepared before any step").1;
        match tokio::time::timeout_at(deadline.into(), rx.recv()).await {
            Ok(Some(ProxyEvent::Held { message })) if message == f.message => {}
            other => bail!(
                "phase {phase}: the proxy never held the confirm of {} ({other:?})",
                f.message
            ),
        }
        let line = Record::new(&self.lab.name)
            .with("target", Target::Node)
            .with("node", node)
            .with("action", f.action)
            .with("window", f.window)
            .with("messageId", &f.message)
            .status(Status::Injected);
        self.emit(Role::Fault, &line);
        self.proxy().hold_new();
        self.nodes_down.insert(node);
        self.env
            .as_mut()
            .context("checked above")?
            .kill_node(node)
            .await?;
        // Its connection broke: the producer says so about the held message.
        self.follow_until(
            &mut proc,
            phase,
            deadline,
            secs,
            &f.message,
            Status::ConnectionLost,
        )
        .await?;
        let quorum: Vec<String> = self
            .lab
            .topology
            .queues
            .iter()
            .filter(|q| q.is_quorum())
            .map(|q| q.name.clone())
            .collect();
        for q in &quorum {
            let env = self.env.as_ref().context("checked above")?;
            env.await_leader(node, &self.vhost, q, deadline).await?;
        }
        let (amqp, channel) = self.connect_broker().await?;
        let c = self.conns();
        let _ = c.amqp.close(200, "moving to a live node".into()).await;
        c.amqp = amqp;
        c.channel = channel;
        self.proxy().release();
        self.follow(&mut proc, Role::Producer, phase, deadline, secs, None)
            .await?;
        self.expect_success(&mut proc, phase, deadline, secs)
            .await?;
        self.assert(&f.asserts).await
    }

    /// The producer's exit, which must be 0.
    async fn expect_success(
        &mut self,
        proc: &mut RoleProc,
        phase: &str,
        deadline: Instant,
        secs: u64,
    ) -> Result<()> {
        let code = self.wait_exit(proc, phase, deadline, secs).await?;
        if code != 0 {
            bail!(
                "the producer exited with {code}; last lines of its log:\n{}",
                process::tail(&proc.log, 10)
            );
        }
        Ok(())
    }

    /// Emits the producer's lines up to and including `status` for `message`.
    async fn follow_until(
        &mut self,
        proc: &mut RoleProc,
        phase: &str,
        deadline: Instant,
        secs: u64,
        message: &str,
        status: Status,
    ) -> Result<()> {
        loop {
            let Some(line) = self.next_line(proc, phase, deadline, secs).await? else {
                bail!(
                    "the producer exited before it logged {message} {status}; last lines of its log:\n{}",
                    process::tail(&proc.log, 10)
                );
            };
            self.emit(Role::Producer, &line);
            let entry = Entry::parse(&format!("[{}] {line}", Role::Producer));
            let field = |k| entry.as_ref().and_then(|e| e.get(k));
            if field("messageId") == Some(message) && field("status") == Some(status.name()) {
                return Ok(());
            }
        }
    }

    /// Reads a role's lines until it exits (or, given a message, until its
    /// window marker for it; then `true`). The proxy's faults are written
    /// into the transcript just before the role's line that shows their
    /// effect, so lines come in the order of cause and effect, every run.
    async fn follow(
        &mut self,
        proc: &mut RoleProc,
        role: Role,
        phase: &str,
        deadline: Instant,
        secs: u64,
        until_marker: Option<&str>,
    ) -> Result<bool> {
        while let Some(line) = self.next_line(proc, phase, deadline, secs).await? {
            let entry = Entry::parse(&format!("[{role}] {line}"));
            let status = entry
                .as_ref()
                .and_then(|e| e.get("status"))
                .and_then(|s| s.parse::<Status>().ok());
            if matches!(
                status,
                Some(Status::ConnectionLost | Status::ConfirmTimeout)
            ) {
                self.proxy_effect(phase, deadline).await?;
            }
            self.emit(role, &line);
            if status == Some(Status::ConnectionLost) {
                self.after_cut(phase, deadline).await?;
            }
            if let (Some(m), Some(Status::CrashInjected)) = (until_marker, status) {
                if entry.as_ref().and_then(|e| e.get("messageId")) == Some(m) {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// The proxy acted: its `[fault]` line, from its event.
    async fn proxy_effect(&mut self, phase: &str, deadline: Instant) -> Result<()> {
        let rx = &mut self.proxy.as_mut().expect("prepared before any step").1;
        let Ok(Some(event)) = tokio::time::timeout_at(deadline.into(), rx.recv()).await else {
            bail!("phase {phase}: a role lost its connection or a confirm, and the proxy did not cause it");
        };
        let (action, window, message) = match &event {
            ProxyEvent::Cut { message } => {
                (FaultAction::Cut, Window::AfterCommitBeforeAck, message)
            }
            ProxyEvent::CutPublish { message } => {
                (FaultAction::Cut, Window::AfterPublishBeforeBroker, message)
            }
            ProxyEvent::Held { message } => (
                FaultAction::Hold,
                Window::AfterPublishBeforeConfirm,
                message,
            ),
        };
        let line = Record::new(&self.lab.name)
            .with("target", Target::Network)
            .with("action", action)
            .with("window", window)
            .with("messageId", message)
            .status(Status::Injected);
        self.emit(Role::Fault, &line);
        Ok(())
    }

    /// A cut the consumer never noticed (it had settled its last message and
    /// left before reading again): its `[fault]` line after the consumer's
    /// lines, and the proxy's gate opened for whatever connects next.
    async fn unnoticed_cut(&mut self, phase: &str) -> Result<()> {
        let pending = match self.proxy.as_mut() {
            Some((_, rx)) => !rx.is_empty(),
            None => false,
        };
        if pending {
            let deadline = Instant::now() + Duration::from_secs(30);
            self.proxy_effect(phase, deadline).await?;
            self.after_cut(phase, deadline).await?;
        }
        Ok(())
    }

    /// After a cut the broker must have dropped the old connection (and
    /// requeued its unacked message) before the consumer may connect again:
    /// the proxy holds new connections until then.
    async fn after_cut(&mut self, phase: &str, deadline: Instant) -> Result<()> {
        let queues: Vec<String> = self.lab.queue_names().map(str::to_string).collect();
        for q in &queues {
            self.await_consumers_gone(q, phase, deadline).await?;
        }
        self.proxy().release();
        Ok(())
    }

    /// Follows a role to its window marker, then kills it there.
    async fn kill_at_marker(
        &mut self,
        proc: &mut RoleProc,
        role: Role,
        f: &Fault,
        phase: &str,
        deadline: Instant,
        secs: u64,
    ) -> Result<()> {
        if !self
            .follow(proc, role, phase, deadline, secs, Some(&f.message))
            .await?
        {
            let code = self.wait_exit(proc, phase, deadline, secs).await?;
            self.unreachable = Some(format!(
                "the {role} never reached `{}` for {}",
                f.window, f.message
            ));
            bail!(
                "the {role} exited with {code} before reaching window `{}` for {}; last lines of its log:\n{}",
                f.window,
                f.message,
                process::tail(&proc.log, 10)
            );
        }
        self.kill_marked(proc, role, f, phase, deadline, secs).await
    }

    /// The role blocks at its marker: ground truth now, then SIGKILL, reap,
    /// and the crash recorded.
    async fn kill_marked(
        &mut self,
        proc: &mut RoleProc,
        role: Role,
        f: &Fault,
        phase: &str,
        deadline: Instant,
        secs: u64,
    ) -> Result<()> {
        // Ground truth at the moment of the kill, before anything can change it.
        self.observed.crash_business_rows =
            Some(store::business_rows_for(&mut self.conns().db, &f.message).await?);
        let pid = proc.child.id().context("role already reaped")?;
        signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL)?;
        let code = self.wait_exit(proc, phase, deadline, secs).await?;
        while let Some(line) = self.next_line(proc, phase, deadline, secs).await? {
            self.emit(role, &line);
        }
        self.observed.crash_exit_code = Some(code);
        Ok(())
    }

    /// A broker fault between steps: killed and started again on the same
    /// data. The harness reconnects and declares the topology again, as an
    /// application does when it connects.
    async fn broker(&mut self, action: FaultAction) -> Result<()> {
        let line = |lab: &str, status| {
            Record::new(lab)
                .with("target", Target::Broker)
                .with("action", action)
                .status(status)
        };
        self.emit(Role::Fault, &line(&self.lab.name, Status::Injected));
        self.env
            .as_mut()
            .context("a broker fault needs the environment to itself: this run shares it")?
            .restart_broker()
            .await?;
        let (amqp, channel) = self.connect_broker().await?;
        crate::amqp::declare(&channel, &self.lab.topology).await?;
        let c = self.conns();
        c.amqp = amqp;
        c.channel = channel;
        self.emit(Role::Fault, &line(&self.lab.name, Status::Healed));
        Ok(())
    }

    /// A cluster node's fault between steps. The harness moves its own
    /// connection to a node that is up and in the majority; the queues are
    /// not declared again (a classic queue whose node is down cannot be).
    async fn node(&mut self, node: usize, action: FaultAction) -> Result<()> {
        let line = |lab: &str, status| {
            Record::new(lab)
                .with("target", Target::Node)
                .with("node", node)
                .with("action", action)
                .status(status)
        };
        if self.env.is_none() {
            bail!("a node fault needs the environment to itself: this run shares it");
        }
        self.emit(Role::Fault, &line(&self.lab.name, Status::Injected));
        let env = self.env.as_mut().context("checked above")?;
        // Marked before the environment acts: a step that fails half way
        // still leaves the node to be restored after the lab.
        match action {
            FaultAction::Kill => {
                self.nodes_down.insert(node);
                env.kill_node(node).await?;
            }
            FaultAction::Restart => {
                env.restart_node(node).await?;
                self.nodes_down.remove(&node);
            }
            FaultAction::Partition => {
                self.nodes_cut.insert(node);
                env.partition(node).await?;
            }
            FaultAction::Heal => {
                // Every cut ends, whichever node the step names.
                env.heal().await?;
                self.nodes_cut.clear();
            }
            other => bail!("a node fault cannot `{other}`"),
        }
        let (amqp, channel) = self.connect_broker().await?;
        let c = self.conns();
        let _ = c.amqp.close(200, "moving to a live node".into()).await;
        c.amqp = amqp;
        c.channel = channel;
        if matches!(action, FaultAction::Restart | FaultAction::Heal) {
            self.emit(Role::Fault, &line(&self.lab.name, Status::Healed));
        }
        Ok(())
    }

    fn consumer_config(
        &self,
        c: &Consume,
        settle: usize,
        fault: Option<FaultPoint>,
    ) -> ConsumerConfig {
        let faults = fault.into_iter().collect();
        ConsumerConfig {
            lab: self.lab.name.clone(),
            amqp_url: self.role_url(c.node),
            database_url: self.endpoints.pg_url(&self.database),
            queue: c.queue.clone(),
            consumer: "consumer-1".into(),
            service: c.service.clone(),
            pattern: c.pattern,
            prefetch: c.prefetch,
            settle,
            max_deliveries: c.max_deliveries,
            retry: c.retry.as_ref().map(|r| RetryPolicy {
                max_attempts: r.max_attempts,
                dlq: r.dlq.clone(),
                tiers: r
                    .tiers
                    .iter()
                    .map(|(queue, ttl_ms)| Tier {
                        queue: queue.clone(),
                        ttl_ms: *ttl_ms,
                    })
                    .collect(),
            }),
            faults,
            reconnect: false,
            transient_failures: c.transient_failures.clone(),
        }
    }

    async fn consume(&mut self, c: &Consume, fault: Option<&Fault>) -> Result<()> {
        let phase = format!("consume({})", c.queue);
        let secs = c.deadline_secs;
        let deadline = Instant::now() + Duration::from_secs(secs);
        let settle = match c.settle {
            Settle::Count(n) => n,
            // What the queue holds now, each message once.
            Settle::Drain => {
                crate::amqp::queue_state(&self.conns().channel, &c.queue)
                    .await?
                    .0 as usize
            }
        };
        if let Some(command) = &c.command {
            return self
                .consume_program(c, command, settle, fault, &phase, deadline)
                .await;
        }
        let mut cfg = self.consumer_config(c, settle, None);
        match fault.map(|f| (f, f.target, f.action)) {
            Some((f, Target::Consumer, FaultAction::Kill)) => {
                let killed = self.consumer_config(c, settle, Some(point_of(f)));
                let mut proc = self.spawn_role(RoleConfig::Consumer(killed))?;
                if !self
                    .follow(
                        &mut proc,
                        Role::Consumer,
                        &phase,
                        deadline,
                        secs,
                        Some(&f.message),
                    )
                    .await?
                {
                    let code = self.wait_exit(&mut proc, &phase, deadline, secs).await?;
                    self.unreachable = Some(format!(
                        "the consumer never reached `{}` for {}",
                        f.window, f.message
                    ));
                    bail!(
                        "the consumer exited with {code} before reaching window `{}` for {}; last lines of its log:\n{}",
                        f.window,
                        f.message,
                        process::tail(&proc.log, 10)
                    );
                }
                if let Some(depth) = f.kill_at_depth {
                    self.await_depth(&c.queue, depth, &phase, deadline).await?;
                }
                self.kill_marked(&mut proc, Role::Consumer, f, &phase, deadline, secs)
                    .await?;
                self.assert(&f.asserts).await?;
                self.await_consumers_gone(&c.queue, &phase, deadline)
                    .await?;
                if let Some(n) = f.restart_settle {
                    cfg.settle = n;
                }
                if f.restart_drain {
                    cfg.settle = crate::amqp::queue_state(&self.conns().channel, &c.queue)
                        .await?
                        .0 as usize;
                }
            }
            Some((f, Target::Network, FaultAction::Cut)) => {
                // The proxy drops the ack and cuts; the same process reconnects.
                self.proxy().arm(Rule::CutOnAck {
                    message: f.message.clone(),
                });
                cfg.reconnect = true;
            }
            Some((_, target, action)) => {
                bail!("phase {phase}: `{action}` of the {target} has no runner on a consume step")
            }
            None => {}
        }
        let mut proc = self.spawn_role(RoleConfig::Consumer(cfg))?;
        self.follow(&mut proc, Role::Consumer, &phase, deadline, secs, None)
            .await?;
        let code = self.wait_exit(&mut proc, &phase, deadline, secs).await?;
        // A delivery in flight when the consumer closed goes back to the
        // queue when the broker removes the consumer, a moment after the
        // process is gone: the queue's state is read after that.
        self.await_consumers_gone(&c.queue, &phase, deadline)
            .await?;
        self.observed.consumer_exit_code = Some(code);
        if code != 0 {
            tracing::warn!(
                "consumer exited with {code}: {}",
                process::tail(&proc.log, 10)
            );
        }
        if let Some(f) = fault.filter(|f| f.target == Target::Network) {
            self.assert(&f.asserts).await?;
        }
        Ok(())
    }

    /// Waits until `queue` holds at least `depth` ready messages, or the time
    /// is up: then the step ends without an error, and the assertions after
    /// it say what the queue holds (what did not arrive within the bound).
    async fn await_at_least(&mut self, queue: &str, depth: u32, within_secs: u64) -> Result<()> {
        let until = Instant::now() + Duration::from_secs(within_secs);
        loop {
            let (ready, _) = crate::amqp::queue_state(&self.conns().channel, queue).await?;
            if ready >= depth || Instant::now() >= until {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A message waiting in a retry tier is in transit by design: it comes
    /// back to its work queue when its TTL ends. Queue state is read once no
    /// tier holds one (each waits at most its TTL), so that no read can catch
    /// a message between two queues.
    async fn await_tiers_empty(&mut self) -> Result<()> {
        let tiers: Vec<(String, u64)> = self
            .lab
            .steps
            .iter()
            .filter_map(|s| match &s.action {
                Action::Consume(c) => c.retry.as_ref(),
                _ => None,
            })
            .flat_map(|r| r.tiers.iter().cloned())
            .collect();
        for (q, ttl) in tiers {
            let deadline = Instant::now() + Duration::from_millis(ttl) + Duration::from_secs(10);
            self.await_depth(&q, 0, "reading the retry tiers", deadline)
                .await?;
        }
        Ok(())
    }

    /// A program mqlab did not write as the consumer (the role contract):
    /// its delivery, commit and ack for each message are seen through the
    /// two proxies and written as `[observe]` lines; at the fault's window
    /// the black box freezes both connections and the program is killed,
    /// then started again. It is done once it acked `settle` distinct
    /// messages: then it gets SIGTERM.
    async fn consume_program(
        &mut self,
        c: &Consume,
        command: &str,
        mut settle: usize,
        fault: Option<&Fault>,
        phase: &str,
        deadline: Instant,
    ) -> Result<()> {
        let secs = c.deadline_secs;
        if settle == 0 {
            return Ok(());
        }
        let (tx, mut seen) = mpsc::unbounded_channel();
        let bb = Arc::new(Mutex::new(BlackBox::new(tx)));
        let upstream = format!("{}:{}", self.endpoints.pg_host, self.endpoints.pg_port)
            .parse()
            .context("the database's address")?;
        let pg = PgProxy::start(upstream, bb.clone()).await?;
        self.proxy().watch(Some(bb.clone()));
        match fault.map(|f| (f, f.target, f.action)) {
            Some((f, Target::Consumer, FaultAction::Kill)) => {
                bb.lock().expect("black box").arm(f.window, &f.message)
            }
            Some((_, target, action)) => {
                bail!("phase {phase}: `{action}` of the {target} has no runner on a program's consume step")
            }
            None => {}
        }
        let result = async {
            let mut proc = self.spawn_program(c, command, pg.port)?;
            let mut acked = BTreeSet::new();
            loop {
                let event = tokio::select! {
                    e = seen.recv() => e.context("the proxies stopped")?,
                    status = proc.child.wait() => {
                        let code = exit_code(status?);
                        bail!(
                            "phase {phase}: the program exited with {code} after it settled {} of {settle} messages (acked, transaction ended); last lines of its output:\n{}",
                            acked.len(),
                            process::tail(&proc.log, 10)
                        );
                    }
                    _ = tokio::time::sleep_until(deadline.into()) => {
                        process::kill_now(&mut proc.child);
                        bail!(
                            "phase {phase} exceeded {secs} s: the program settled {} of {settle} messages (acked, transaction ended); last lines of its output:\n{}",
                            acked.len(),
                            process::tail(&proc.log, 10)
                        );
                    }
                };
                match event {
                    Seen::Delivered { message, redelivered } => {
                        let line = self
                            .observe_line(&message, &c.queue)
                            .with("redelivered", redelivered)
                            .status(Status::Delivered);
                        self.emit(Role::Observe, &line);
                    }
                    Seen::Committed { message } => {
                        let line = self.observe_line(&message, &c.queue).status(Status::Committed);
                        self.emit(Role::Observe, &line);
                    }
                    Seen::RolledBack { message } => {
                        let line = self.observe_line(&message, &c.queue).status(Status::RolledBack);
                        self.emit(Role::Observe, &line);
                    }
                    Seen::Held { message, what } => {
                        let line = self
                            .observe_line(&message, &c.queue)
                            .with("what", what)
                            .status(Status::Held);
                        self.emit(Role::Observe, &line);
                    }
                    Seen::Acked { message } => {
                        let line = self.observe_line(&message, &c.queue).status(Status::Acked);
                        self.emit(Role::Observe, &line);
                    }
                    Seen::Settled { message } => {
                        acked.insert(message);
                        if acked.len() >= settle {
                            process::stop(&mut proc.child, Signal::SIGTERM, Duration::from_secs(10)).await;
                            let code = match proc.child.try_wait()? {
                                Some(status) => exit_code(status),
                                None => -1,
                            };
                            self.observed.consumer_exit_code = Some(code);
                            return Ok(());
                        }
                    }
                    Seen::Unreachable { message, why } => {
                        process::kill_now(&mut proc.child);
                        let window = fault.map(|f| f.window.name()).unwrap_or("?");
                        let why = format!("window `{window}` is unreachable for this program at {message}: {why}");
                        self.unreachable = Some(why.clone());
                        bail!(why);
                    }
                    Seen::Fire { message } => {
                        // The window: both connections are frozen. What the
                        // database holds for the message now, then the kill.
                        let lab = self.lab;
                        let event = self.observed.events.of(&message).to_string();
                        let rows = store::program_rows_for(
                            &mut self.conns().db,
                            lab.effects.as_deref().unwrap_or_default(),
                            &event,
                        )
                        .await?;
                        self.observed.crash_business_rows = Some(rows);
                        let pid = proc.child.id().context("program already reaped")?;
                        signal::killpg(Pid::from_raw(pid as i32), Signal::SIGKILL).ok();
                        let code = exit_code(proc.child.wait().await?);
                        self.observed.crash_exit_code = Some(code);
                        let line = self
                            .observe_line(&message, &c.queue)
                            .with("exitCode", code)
                            .with("businessRows", rows)
                            .status(Status::Killed);
                        self.emit(Role::Observe, &line);
                        if let Some(f) = fault {
                            self.assert(&f.asserts).await?;
                        }
                        self.await_consumers_gone(&c.queue, phase, deadline).await?;
                        if fault.is_some_and(|f| f.restart_drain) {
                            // What is left to settle: what the queue holds now.
                            let (left, _) =
                                crate::amqp::queue_state(&self.conns().channel, &c.queue).await?;
                            settle = acked.len() + left as usize;
                            if acked.len() >= settle {
                                // Nothing is left for a new process.
                                return Ok(());
                            }
                        }
                        bb.lock().expect("black box").reset();
                        proc = self.spawn_program(c, command, pg.port)?;
                    }
                }
            }
        }
        .await;
        self.proxy().watch(None);
        result?;
        self.await_consumers_gone(&c.queue, phase, deadline).await
    }

    fn observe_line(&self, message: &str, queue: &str) -> Record {
        Record::new(&self.lab.name)
            .with("messageId", message)
            .with("destination", queue)
    }

    /// Starts the program (`sh -c`, in the project's directory) with the
    /// contract's environment: its connections go through the proxies.
    fn spawn_program(&mut self, c: &Consume, command: &str, pg_port: u16) -> Result<RoleProc> {
        self.role_seq += 1;
        let log = self.logs.join(format!("{}-program.log", self.role_seq));
        let mut db = self.endpoints.clone();
        db.pg_port = pg_port;
        // `exec`: the program itself is the process mqlab signals and reaps
        // (its exit status, not a shell's), with variables expanded.
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &format!("exec {command}")])
            .current_dir(self.root)
            .env(
                "MQLAB_CONTRACT",
                crate::protocol::PROGRAM_CONTRACT.to_string(),
            )
            .env("MQLAB_AMQP_URL", self.role_url(c.node))
            .env("MQLAB_DATABASE_URL", db.pg_url(&self.database))
            .env("MQLAB_QUEUE", &c.queue)
            .env("MQLAB_SERVICE", &c.service)
            .env("MQLAB_PREFETCH", "1")
            .env("MQLAB_RUN_ID", &self.run);
        let child = process::spawn(&mut cmd, &log, false)
            .with_context(|| format!("cannot start the program `{command}`"))?;
        Ok(RoleProc {
            child,
            lines: None,
            log,
        })
    }

    /// After a kill the broker requeues the dead channel's unacked messages
    /// when it removes its consumer; a new consumer started before that would
    /// see them out of order.
    async fn await_consumers_gone(
        &mut self,
        queue: &str,
        phase: &str,
        deadline: Instant,
    ) -> Result<()> {
        loop {
            let Some((_, consumers)) = self.queue_state(queue).await? else {
                return Ok(()); // its node is down: no consumer on it either
            };
            if consumers == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "phase {phase}: the broker still lists a consumer on `{queue}` after the kill"
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Ready messages and consumers of a queue; `None` when the broker says
    /// the queue's node is down or unreachable (a classic queue in a cluster
    /// lab), after which the harness's channel, closed by that error, is
    /// opened again.
    async fn queue_state(&mut self, queue: &str) -> Result<Option<(u32, u32)>> {
        match crate::amqp::queue_state(&self.conns().channel, queue).await {
            Ok(s) => Ok(Some(s)),
            Err(e) if format!("{e:#}").contains("is down or inaccessible") => {
                let c = self.conns();
                c.channel = c.amqp.create_channel().await?;
                Ok(None)
            }
            Err(e) => Err(anyhow!("{e:#}")),
        }
    }

    async fn await_depth(
        &mut self,
        queue: &str,
        depth: u32,
        phase: &str,
        deadline: Instant,
    ) -> Result<()> {
        loop {
            let (ready, _) = crate::amqp::queue_state(&self.conns().channel, queue).await?;
            if ready == depth {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("phase {phase}: `{queue}` holds {ready} ready messages, not {depth}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Judges one point of the history now, prints its lines and keeps it.
    fn judge(&mut self, point: Point, role: Role) {
        let entries = self.transcript.entries();
        for (outcome, line) in checker::judge(&point, &entries) {
            self.emit(role, &line);
            self.sink.tell(&Event::Outcome(&outcome));
            self.outcomes.push(outcome);
        }
        self.history.points.push(point);
    }

    /// The total-queue checks, from ground truth read now: `[check]` lines.
    async fn check(&mut self) -> Result<()> {
        self.await_tiers_empty().await?;
        let ground = self.ground().await?;
        let mut queued = BTreeSet::new();
        let queues: Vec<String> = self.lab.queue_names().map(str::to_string).collect();
        for q in &queues {
            let peeked = crate::amqp::peek(&self.conns().amqp, q).await?;
            queued.extend(
                peeked
                    .iter()
                    .map(|p| store::event_id(&p.body, &p.message_id)),
            );
        }
        let point = Point::Checks {
            after_line: self.transcript.lines().len(),
            ground,
            queued,
            events: self.observed.events.clone(),
        };
        self.judge(point, Role::Check);
        Ok(())
    }

    async fn inspect(&mut self, fields: &[crate::vocab::InspectField]) -> Result<()> {
        let ground = self.ground().await?;
        let mut r = Record::new(&self.lab.name);
        for f in fields {
            r = r.with(f.name(), ground.field(*f));
        }
        self.emit(Role::Inspect, &r.status(Status::Snapshot));
        Ok(())
    }

    /// Re-reads the broker and PostgreSQL, then evaluates: every value comes
    /// from an observation taken now.
    async fn assert(&mut self, asserts: &[Assertion]) -> Result<()> {
        if asserts.is_empty() {
            return Ok(());
        }
        self.await_tiers_empty().await?;
        self.observed.ground = self.ground().await?;
        let queues: Vec<String> = self.lab.queue_names().map(str::to_string).collect();
        for q in queues {
            // A queue on a node that is down is not read: a counter that
            // needs its depth says so.
            if let Some((ready, _)) = self.queue_state(&q).await? {
                self.observed.depths.insert(q, ready);
            }
        }
        // Only the queues a `dlqHeader` counter reads are peeked: a peek
        // requeues, which marks the messages redelivered.
        let read: BTreeSet<String> = asserts
            .iter()
            .filter(|a| a.counter.counter == Counter::DlqHeader)
            .filter_map(|a| {
                a.counter
                    .arg
                    .as_deref()?
                    .split_once('/')
                    .map(|(q, _)| q.to_string())
            })
            .collect();
        for q in read {
            let peeked = crate::amqp::peek(&self.conns().amqp, &q).await?;
            self.observed
                .dlq
                .insert(q, peeked.into_iter().map(|p| p.headers).collect());
        }
        let point = Point::Assert {
            after_line: self.transcript.lines().len(),
            observed: self.observed.clone(),
            assertions: asserts
                .iter()
                .map(|a| Asserted {
                    name: a.name.clone(),
                    counter: a.counter.clone(),
                    expected: a.expected.clone(),
                })
                .collect(),
        };
        self.judge(point, Role::Assert);
        Ok(())
    }
}

/// A named point where the harness itself can be made to panic
/// (`MQLAB_PANIC_AT=<phase>`), so that the tests can show a panicking harness
/// leaves nothing behind.
fn failpoint(phase: &str) {
    if std::env::var("MQLAB_PANIC_AT").is_ok_and(|p| p == phase) {
        panic!("failpoint MQLAB_PANIC_AT={phase}");
    }
}

/// 128 + signal for a killed process, as a shell reports it.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}

/// Where a role blocks for a fault.
fn point_of(f: &Fault) -> FaultPoint {
    FaultPoint {
        window: f.window,
        message: f.message.clone(),
    }
}
