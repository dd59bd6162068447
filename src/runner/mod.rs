//! Executes labs on a running environment. The only place that knows about
//! phases and faults: it spawns the roles, reads their lines into the
//! transcript, kills at the selected window, reads broker and database
//! state, judges the assertions, compares the snapshot, and says all of it
//! as [`Event`]s. A failure inside one lab (even its setup) fails that lab
//! only; the next lab runs.

//!
//! Split by concern, each an `impl Ctx` of its own: `roles` (role
//! processes), `publish` and `consume` (the steps under their placements),
//! `broker` (the run as fault families see it), `judge` (probes,
//! assertions, checks), `setup` (the run's objects, proxy and links);
//! this file holds the suite, one run's lifecycle and the step loop.
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use sqlx::PgConnection;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::mpsc;

use crate::broker::Admin;
use crate::checker::{self, Asserted, Events, History, LabVerdict, Observed, Outcome, Point};
use crate::env::{process, Endpoints, Environment};
use crate::events::{Event, Sink};
use crate::failure::Failure;
use crate::faults::blackbox::{BlackBox, Seen};
use crate::faults::downstream::Downstream;
use crate::faults::pgproxy::PgProxy;
use crate::faults::proxy::{Proxy, ProxyEvent};

use crate::lab::{Action, Assertion, Consume, Fault, Lab, Project, Publish, Settle};
use crate::naming::{database_for, vhost_for};
use crate::protocol::{
    ConsumerConfig, DownstreamConfig, FaultPoint, OrderService, OutMessage, ProducerConfig,
    RetryPolicy, RoleConfig, Tier,
};
use crate::record::{RunRecord, SnapshotResult};
use crate::snapshot;
use crate::store;
use crate::transcript::{self, Entry, FaultEvent, Observation, Record, Transcript};
use crate::vocab::{
    placement_of, BetweenSteps, Counter, FaultAction, Kind, OnConsume, OnPublish, Role, Site,
    Status, Target, Window,
};

mod broker;
mod consume;
mod crowd;
mod judge;
mod program;
mod publish;
mod roles;
pub use roles::{consumer_config, producer_config, RoleSite};
use roles::{exit_code, point_of};
use stage::StepStage;
mod setup;
mod stage;

/// Where a suite runs and what it may touch. The runner holds the
/// environment itself, not only its endpoints: a broker fault is a lab step.
pub struct Suite<'a> {
    pub project: &'a Project,
    pub env: &'a mut (dyn Environment + 'static),
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
    /// The broker settings the labs rely on, read once (`Default` to start).
    pub settings: BTreeMap<crate::vocab::BrokerSetting, std::result::Result<String, String>>,
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
    /// The broker settings the labs rely on, as read from the broker once
    /// before the suite (or why they could not be read).
    settings: BTreeMap<crate::vocab::BrokerSetting, std::result::Result<String, String>>,
    /// The generation of the broker, read from it (`None`: one no lab file
    /// can declare a difference for).
    generation: Option<crate::vocab::Generation>,
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
            node_ports: self.env.broker_ports(),
            settings: self.settings.clone(),
            generation: crate::vocab::Generation::of_version(&self.env.info().broker_version),
        }
    }

    /// The settings `labs` rely on, read from the broker once.
    async fn read_settings(&mut self, labs: &[Lab]) {
        for s in labs.iter().flat_map(|l| l.settings.iter().copied()) {
            if !self.settings.contains_key(&s) {
                let read = self
                    .env
                    .broker_setting(s)
                    .await
                    .map_err(|e| format!("{e:#}"));
                self.settings.insert(s, read);
            }
        }
    }

    /// Runs the labs; each ends in a [`RunRecord`], pushed as soon as it is
    /// over (an interrupted suite keeps what ended), and the records end in
    /// the labs' order.
    pub async fn run(&mut self, labs: &[Lab], records: &mut Vec<RunRecord>, sink: &mut dyn Sink) {
        self.read_settings(labs).await;
        let total = labs.len();
        let alone = Lab::needs_environment;
        let mut order: Vec<String> = labs.iter().map(Lab::run_name).collect();
        // Concurrency only pays with two runs to overlap; one run streams
        // its lines as they happen.
        let overlapping = labs.iter().filter(|l| !alone(l)).count() > 1;
        if self.jobs > 1 && self.vhost.is_none() && overlapping {
            let mut shared: Vec<(usize, &Lab)> =
                labs.iter().enumerate().filter(|(_, l)| !alone(l)).collect();
            // Longest waits first (stable: the labs' order otherwise): a
            // run that waits on TTLs started last would end the phase alone.
            shared.sort_by_key(|(_, l)| std::cmp::Reverse(l.clock_ms()));
            let params = self.params();
            let beside: &(dyn Environment + 'static) = &*self.env;
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
                        let record =
                            execute(params, EnvAccess::Shared(beside), lab, &mut held).await;
                        let mut out = sink.borrow_mut();
                        held.replay(&mut **out);
                        out.tell(&Event::LabFinished(&record));
                        finished.borrow_mut().push(record);
                    }
                }));
                futures_util::StreamExt::for_each_concurrent(runs, self.jobs, |f| f).await;
            }
            // A run that kills, restarts or pauses the broker comes next:
            // a restarted node recovers only the vhosts still there.
            if labs.iter().any(Lab::has_broker_fault) {
                let ended: Vec<String> = labs
                    .iter()
                    .filter(|l| !alone(l))
                    .map(|l| format!("{}{}", self.env.prefix(), vhost_for(&l.run_name())))
                    .collect();
                if let Err(e) = self.env.delete_vhosts(&ended).await {
                    // Not a verdict: a restart then recovers them too, slower.
                    eprintln!("mqlab: {e:#}");
                }
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
        self.read_settings(std::slice::from_ref(lab)).await;
        let params = self.params();
        execute(&params, EnvAccess::Own(&mut *self.env), lab, sink).await
    }
}

/// The broker settings `lab` relies on, as read (name, value), and why the
/// run is refused when one differs from what the lab's bounds need or could
/// not be read: a lab never reports a loss that is the broker's delay.
fn settings_of(
    read_from_broker: &BTreeMap<crate::vocab::BrokerSetting, std::result::Result<String, String>>,
    needed: &[crate::vocab::BrokerSetting],
) -> (Vec<(String, String)>, Option<String>) {
    let mut read = Vec::new();
    for s in needed {
        match read_from_broker.get(s) {
            Some(Ok(v)) if v == s.required() => read.push((s.name().to_string(), v.clone())),
            Some(Ok(v)) => {
                return (
                    read,
                    Some(format!(
                        "the broker's `{s}` is {v}; this lab's bounds rely on {} (mqlab sets it on its own brokers: see docs/environments.md)",
                        s.required()
                    )),
                )
            }
            Some(Err(e)) => return (read, Some(format!("{e}; this lab's bounds rely on `{s}` = {}", s.required()))),
            None => return (read, Some(format!("`{s}` was not read from the broker"))),
        }
    }
    (read, None)
}

/// The events of one run, kept until it ends (`--jobs`).
#[derive(Default)]
struct Held {
    events: Vec<HeldEvent>,
}

enum HeldEvent {
    Line(String),
    Outcome(Outcome),
    Snapshot(String, SnapshotResult, Option<String>),
}

impl Sink for Held {
    fn on(&mut self, event: &Event) -> Result<()> {
        match event {
            Event::Line(l) => self.events.push(HeldEvent::Line(l.to_string())),
            Event::Outcome(o) => self.events.push(HeldEvent::Outcome((*o).clone())),
            Event::SnapshotCompared {
                run,
                result,
                update_refused,
            } => self.events.push(HeldEvent::Snapshot(
                run.to_string(),
                (*result).clone(),
                update_refused.map(str::to_string),
            )),
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
                HeldEvent::Snapshot(run, result, update_refused) => {
                    sink.tell(&Event::SnapshotCompared {
                        run,
                        result,
                        update_refused: update_refused.as_deref(),
                    })
                }
            }
        }
    }
}

/// The environment as one run has it.
enum EnvAccess<'a> {
    /// To itself: the run faults the broker, sets a policy or reads a
    /// queue's process at a kill ([`Lab::needs_environment`]).
    Own(&'a mut (dyn Environment + 'static)),
    /// Beside concurrent runs: reads that change nothing (what a queue
    /// holds).
    Shared(&'a (dyn Environment + 'static)),
}

impl EnvAccess<'_> {
    fn own(&mut self) -> Option<&mut (dyn Environment + 'static)> {
        match self {
            EnvAccess::Own(env) => Some(&mut **env),
            EnvAccess::Shared(_) => None,
        }
    }

    fn owned(&self) -> Option<&(dyn Environment + 'static)> {
        match self {
            EnvAccess::Own(env) => Some(&**env),
            EnvAccess::Shared(_) => None,
        }
    }

    fn read(&self) -> &(dyn Environment + 'static) {
        match self {
            EnvAccess::Own(env) => &**env,
            EnvAccess::Shared(env) => *env,
        }
    }
}

/// One lab run, from its preparation to its snapshot comparison.
async fn execute(p: &Params<'_>, env: EnvAccess<'_>, lab: &Lab, sink: &mut dyn Sink) -> RunRecord {
    let started = Instant::now();
    let run = lab.run_name();
    let mut ctx = Ctx::new(p, env, lab, &run, sink);
    let (settings, refused) = settings_of(&p.settings, &lab.settings);
    let (mut failure, mut error) = match refused {
        Some(why) => (Some(Failure::Refused), Some(why)),
        None => match ctx.run_steps().await {
            Ok(()) => (None, None),
            Err(e) => (Some(Failure::of(&e)), Some(format!("{e:#}"))),
        },
    };
    let own_database = ctx.end(&mut error).await;
    if error.is_some() {
        failure.get_or_insert(Failure::Other);
    }
    // A difference the lab file declares for this generation: its
    // violations, and its own snapshot.
    let declared = p
        .generation
        .and_then(|g| Some((g, lab.generations.get(&g)?)));
    let violations = declared.map_or(&lab.violations, |(_, d)| &d.violations);
    let verdict = match &error {
        Some(e) => LabVerdict::Failed(e.clone()),
        None => checker::lab_verdict(&ctx.log.outcomes, lab.variant.as_ref().map(|_| violations)),
    };
    let (transcript, outcomes, mut history, power_lost) = (
        ctx.log.transcript,
        ctx.log.outcomes,
        ctx.log.history,
        ctx.log.power_lost,
    );
    history.lines = transcript.lines().to_vec();
    let passed = matches!(
        verdict,
        LabVerdict::Holds | LabVerdict::CounterexampleConfirmed
    );
    // A failed run is still compared: its diff shows where it went wrong.
    let snapshot_name = match declared {
        Some((g, _)) => g.snapshot(&run),
        None => run.clone(),
    };
    // The common snapshots are the base generation's transcripts: a run on
    // another generation rewrites only a snapshot its lab file declares.
    let may_update = declared.is_some() || p.generation.is_some_and(|g| g.is_base());
    let snapshot = compare_snapshot(p, lab, &snapshot_name, &transcript, passed && may_update);
    let refused = update_refused(passed, may_update, p.generation, lab.variant.as_deref());
    ctx.log.sink.tell(&Event::SnapshotCompared {
        run: &snapshot_name,
        result: &snapshot,
        update_refused: refused.as_deref(),
    });
    RunRecord {
        run,
        lab: lab.name.clone(),
        broker: lab.broker,
        variant: lab.variant.clone(),
        claim: declared
            .and_then(|(_, d)| d.claim.clone())
            .unwrap_or_else(|| lab.claim.clone()),
        violations: violations.clone(),
        transcript,
        outcomes,
        history,
        error,
        verdict,
        snapshot,
        duration: started.elapsed(),
        failure,
        facts: lab.facts.clone(),
        broker_facts: lab.broker_facts.clone(),
        settings,
        own_database,
        power_lost,
        declared: declared.map(|(g, d)| crate::record::DeclaredDifference {
            generation: g,
            cause: d.cause.clone(),
            source: d.source.clone(),
        }),
    }
}

/// Why `--update` would not rewrite a run's snapshot, said where a
/// mismatch is reported: "accept with --update" would do nothing there.
fn update_refused(
    passed: bool,
    may_update: bool,
    generation: Option<crate::vocab::Generation>,
    variant: Option<&str>,
) -> Option<String> {
    if may_update {
        return (!passed)
            .then(|| "the run failed: --update rewrites a passing run's snapshot only".into());
    }
    // The common snapshots are the base generation's transcripts.
    Some(match (generation, variant) {
        (None, _) => "--update writes snapshots on the broker's base generation and on a generation a lab file declares a difference for; this broker's version is neither".into(),
        (Some(g), Some(v)) => format!(
            "a difference on {} {g}: declare it in the lab file ([variant.{v}.{}.\"{g}\"], docs/writing-labs.md), then --update writes its own snapshot",
            g.broker().product(),
            g.broker()
        ),
        (Some(g), None) => format!(
            "the safe run differs on {} {g}: a finding, not a declaration (only a counterexample declares a difference per generation)",
            g.broker().product()
        ),
    })
}

/// The snapshot comparison of a finished run (none for `explore`'s points);
/// with `--update`, a differing snapshot is rewritten when `updatable` (the
/// run passed, on the generation the snapshot is for).
fn compare_snapshot(
    p: &Params<'_>,
    lab: &Lab,
    run: &str,
    transcript: &Transcript,
    updatable: bool,
) -> SnapshotResult {
    // Before the comparison: it leaves a differing run as `.snap.new`,
    // which a point of `explore` must not write into the project.
    if p.checks_only {
        return SnapshotResult::Skipped;
    }
    let path = snapshot::path_for(&p.project.snapshots_dir(), run);
    let lab_file = format!("labs/{}.toml", lab.name);
    let normalized = transcript.normalized();
    match snapshot::compare(&path, &lab_file, &normalized, p.update && updatable) {
        Ok(snapshot::Outcome::Matched) => SnapshotResult::Matched,
        Ok(snapshot::Outcome::Updated) => SnapshotResult::Updated,
        Ok(snapshot::Outcome::Mismatch(diff)) => SnapshotResult::Mismatch(diff),
        Err(e) => SnapshotResult::Error(format!("{e:#}")),
    }
}

impl<'a> Ctx<'a> {
    /// A run's context before its first step: its vhost and database
    /// (prefixed on `--env external`), no connection, no proxy yet.
    fn new(
        p: &'a Params<'a>,
        env: EnvAccess<'a>,
        lab: &'a Lab,
        run: &str,
        sink: &'a mut dyn Sink,
    ) -> Ctx<'a> {
        let endpoints = p.endpoints.clone();
        Ctx {
            lab,
            vhost: format!(
                "{}{}",
                p.prefix,
                p.vhost.clone().unwrap_or_else(|| vhost_for(run))
            ),
            database: database_for(&format!("{}{run}", p.prefix)),
            servers: Servers {
                node_ports: p.node_ports.clone(),
                ..Servers::default()
            },
            shared_vhost: p.vhost.is_some() || p.reused,
            run: run.to_string(),
            links: Links {
                role_endpoints: endpoints.clone(),
                endpoints,
                conns: None,
                proxy: None,
                downstream: None,
                own_database: None,
            },
            env,
            exe: p.exe,
            root: &p.project.root,
            logs: p.run_dir.join("roles").join(run),
            step: 0,
            log: RunLog {
                transcript: Transcript::default(),
                observed: Observed::default(),
                outcomes: Vec::new(),
                history: History::default(),
                power_lost: None,
                sink,
            },
            role_seq: 0,
            began: Instant::now(),
        }
    }
}

/// The harness's own connections to the lab's vhost and database.
struct Conns {
    broker: Box<dyn Admin>,
    db: PgConnection,
}

/// A run's state, in three parts besides what names the run: what the lab
/// did to the servers ([`Servers`], undone when it ends), its links to them
/// (connections, the proxy, the downstream service), and what it wrote
/// ([`RunLog`]). A step's own state (its deadline) is a stage's
/// ([`stage::StepStage`]).
struct Ctx<'a> {
    lab: &'a Lab,
    run: String,
    vhost: String,
    database: String,
    servers: Servers,
    /// Other runs used this vhost before: delete the lab's queues first.
    shared_vhost: bool,
    links: Links,
    /// The environment: to itself for a broker fault, shared (reads only)
    /// by a run beside concurrent runs.
    env: EnvAccess<'a>,
    exe: &'a Path,
    /// The project's directory: a program's working directory.
    root: &'a Path,
    logs: PathBuf,
    /// The index of the running step (journal files are per step).
    step: usize,
    log: RunLog<'a>,
    role_seq: usize,
    /// When the run began: a queue's stamp older than this is not its own.
    began: Instant,
}

/// A run's links to the servers: their endpoints, the harness's own
/// connections, the proxy the roles go through, the downstream service and
/// the run's own PostgreSQL; closed or stopped when the run ends.
struct Links {
    /// The servers themselves (the harness's own connections).
    endpoints: Endpoints,
    /// What roles connect to: the broker through the proxy.
    role_endpoints: Endpoints,
    conns: Option<Conns>,
    proxy: Option<(Proxy, mpsc::UnboundedReceiver<ProxyEvent>)>,
    /// The downstream service a consume step's pattern calls, for the run.
    downstream: Option<Downstream>,
    /// The run's own PostgreSQL (a lab's `database = "durable"`) and what
    /// the evidence says of it; stopped when the run ends.
    own_database: Option<(crate::env::postgres::Own, String)>,
}

/// The cluster nodes a lab holds down, and those it holds cut off.
type NodesFaulted = (BTreeSet<usize>, BTreeSet<usize>);

/// What a lab did to the servers, and has not undone yet: the runner
/// restores them when the run ends, whatever ended it.
#[derive(Default)]
struct Servers {
    /// Every node's broker port: the proxy's upstreams, node 1 first.
    node_ports: Vec<u16>,
    /// Cluster nodes killed by the lab, and not restarted yet.
    nodes_down: BTreeSet<usize>,
    /// Cluster nodes cut off by the lab, and not healed yet.
    nodes_cut: BTreeSet<usize>,
    /// Queues the broker answered "home node down" for, with the nodes
    /// down and cut off then: not asked again while those stay the same
    /// (RabbitMQ 4.0 takes about 60 s to give that answer).
    home_node_down: BTreeMap<String, NodesFaulted>,
    /// Classic queues whose process the harness's node was asked about
    /// (`Environment::queue_home_down`), with the nodes down and cut off
    /// then: asked once while those stay the same.
    home_asked: BTreeMap<String, NodesFaulted>,
    /// The broker paused by the lab and not resumed yet.
    broker_paused: bool,
    /// Queues marked `later` that a declare step has declared so far.
    declared_later: BTreeSet<String>,
}

/// What a run wrote: its transcript (and the sink that shows each line as
/// it comes), what the roles reported, the assertions and checks judged.
struct RunLog<'a> {
    transcript: Transcript,
    observed: Observed,
    outcomes: Vec<Outcome>,
    history: History,
    /// What a power loss dropped, file by file (the evidence's, not the
    /// transcript's: it differs from run to run); None without one.
    power_lost: Option<Vec<String>>,
    sink: &'a mut dyn Sink,
}

/// A step's deadline: when it ends, and what a run that passes it says
/// (`phase P exceeded N s`). One value instead of three through every wait
/// of the step.
#[derive(Clone, Copy)]
struct Deadline<'p> {
    phase: &'p str,
    at: Instant,
    secs: u64,
}

impl<'p> Deadline<'p> {
    fn new(phase: &'p str, secs: u64) -> Deadline<'p> {
        Deadline {
            phase,
            at: Instant::now() + Duration::from_secs(secs),
            secs,
        }
    }
}

/// A role process with its stdout lines (a program's output goes to its log only).
struct RoleProc {
    child: Child,
    lines: Option<Lines<BufReader<ChildStdout>>>,
    log: PathBuf,
}

impl Ctx<'_> {
    /// A fault step of its own, by its kind (`node`: 1-based, for a node's).
    #[deny(
        clippy::wildcard_enum_match_arm,
        clippy::match_wildcard_for_single_variants
    )] // a kind without its hook must not compile
    async fn between(&mut self, target: Target, action: FaultAction, node: usize) -> Result<()> {
        match between_steps(target, action)? {
            BetweenSteps::BrokerRestart => crate::faults::broker::between(self, action).await,
            BetweenSteps::Node(fault) => {
                crate::faults::node::between(self, node, action, fault).await
            }
        }
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
                Action::Broker(action) => self.between(Target::Broker, *action, 0).await?,
                Action::Node { node, action } => self.between(Target::Node, *action, *node).await?,
                Action::Declare(names) => {
                    self.conns()
                        .broker
                        .declare_later(&lab.topology, names)
                        .await?;
                    self.servers.declared_later.extend(names.iter().cloned());
                    self.sync_metadata().await?;
                }
                Action::Delete(names) => self.admin_delete(names).await?,
                Action::Await {
                    queue,
                    depth,
                    within_secs,
                    from,
                } => {
                    self.await_at_least(queue, *depth, *within_secs, from.as_deref())
                        .await?
                }
                Action::PurgeInbox {
                    service,
                    retention_ms,
                } => self.purge_inbox(service, *retention_ms).await?,
                Action::Policy {
                    name,
                    queue,
                    definition,
                } => self.set_policy(name, queue, definition).await?,
                Action::Replay { from, to } => self.replay(from, to).await?,
            }
            if let Some(rule) = self.proxy().armed() {
                self.proxy().disarm();
                return Err(Failure::unreachable(format!("phase {phase}: the network fault never happened ({rule:?}): the role never sent or received that frame")));
            }
            self.assert(&step.asserts).await?;
        }
        self.check().await
    }

    fn emit(&mut self, role: Role, body: &str) {
        let line = self.log.transcript.push(role, body).to_string();
        self.log.sink.tell(&Event::Line(&line));
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

/// The kind of a fault's placement at `site`, for the step's exhaustive
/// dispatch. The lab checker admits only the registry's placements, so
/// `None` is a bug, said as an error rather than a panic.
fn kind_at(target: Target, action: FaultAction, site: Site) -> Result<Kind> {
    placement_of(target, action, site)
        .map(|p| p.kind)
        .ok_or_else(|| {
            anyhow!(
                "`{action}` of the {target} has no placement {}",
                site.describe()
            )
        })
}

/// A publish step's fault with its kind.
fn on_publish(fault: Option<&Fault>) -> Result<Option<(&Fault, OnPublish)>> {
    let Some(f) = fault else { return Ok(None) };
    match kind_at(f.target, f.action, Site::Publish)? {
        Kind::Publish(k) => Ok(Some((f, k))),
        other @ (Kind::Consume(_) | Kind::Between(_)) => {
            bail!("a publish step's fault of kind {other:?}")
        }
    }
}

/// A consume step's fault with its kind.
fn on_consume(fault: Option<&Fault>) -> Result<Option<(&Fault, OnConsume)>> {
    let Some(f) = fault else { return Ok(None) };
    match kind_at(f.target, f.action, Site::Consume)? {
        Kind::Consume(k) => Ok(Some((f, k))),
        other @ (Kind::Publish(_) | Kind::Between(_)) => {
            bail!("a consume step's fault of kind {other:?}")
        }
    }
}

/// A step of its own's fault kind.
fn between_steps(target: Target, action: FaultAction) -> Result<BetweenSteps> {
    match kind_at(target, action, Site::Between)? {
        Kind::Between(k) => Ok(k),
        other @ (Kind::Publish(_) | Kind::Consume(_)) => {
            bail!("a between-steps fault of kind {other:?}")
        }
    }
}

#[cfg(test)]
mod tests;
