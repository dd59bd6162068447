//! A lab as data: `labs/<name>.toml` read through a typed schema
//! ([`schema`]), then checked section by section ([`check`]) so that every
//! semantic error is reported at once, with its key path and position,
//! before anything starts.

mod check;
mod schema;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::expect::Expect;
use crate::transcript::MessageMeta;
use crate::vocab::{
    CounterRef, FaultAction, Handoff, InspectField, Pattern, Target, Then, Topology, Window,
};

pub use check::ErrorKind;

#[derive(Clone, Debug)]
pub struct Lab {
    pub name: String,
    /// Set for a counterexample run of the lab.
    pub variant: Option<String>,
    pub claim: String,
    /// The broker it runs against (its topology is that broker's).
    pub broker: crate::vocab::Broker,
    pub path: PathBuf,
    pub topology: Topology,
    pub steps: Vec<Step>,
    /// For a variant: assertion or check name → the value it must FAIL with.
    pub violations: BTreeMap<String, Expect>,
    /// For a variant: what it shows instead on another RabbitMQ generation.
    pub generations: BTreeMap<crate::vocab::Generation, GenerationDiff>,
    /// The SQL that reads a program's business effects (`(service, eventId)` rows).
    pub effects: Option<String>,
    /// 1, or 3 for a cluster lab.
    pub nodes: usize,
    /// Assertions fixed by how the lab runs: harness facts, not evidence.
    pub facts: Vec<String>,
    /// Assertions the broker fixes in every run: broker facts, not evidence.
    pub broker_facts: Vec<String>,
    /// Broker settings the lab's bounds rely on.
    pub settings: Vec<crate::vocab::BrokerSetting>,
    /// The PostgreSQL it runs on: the shared one, or one of the run's own.
    pub database: crate::vocab::Durability,
    /// The articles' topic the book lists it under.
    pub topic: Option<crate::vocab::Topic>,
    /// explore's clean run: the built-in consumer says each window it
    /// passes (never set by a lab file).
    pub announce_windows: bool,
}

/// A counterexample's declared difference on one RabbitMQ generation: its
/// violations there (replacing the variant's), checked against a snapshot
/// of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenerationDiff {
    /// The variant's claim there (`None`: the variant's own).
    pub claim: Option<String>,
    /// The broker change that causes it.
    pub cause: String,
    /// Where that change is named (a URL), or "cause not identified".
    pub source: String,
    pub violations: BTreeMap<String, Expect>,
}

impl Lab {
    /// The services of the consume steps that call the downstream service.
    pub fn downstream_callers(&self) -> BTreeSet<String> {
        self.steps
            .iter()
            .filter_map(|s| match &s.action {
                Action::Consume(c) if c.downstream.is_some() => Some(c.service.clone()),
                _ => None,
            })
            .collect()
    }

    /// The queues whose messages come to `queue` while a drain of it runs:
    /// no step consumes them, their dead-letter chain leads to `queue`,
    /// and what they hold expires (a queue TTL, or the lab's publishes with
    /// a per-message TTL routed to them): a delay queue, a retry tier. A
    /// drain owes what they hold.
    pub fn feeders_of(&self, queue: &str) -> Vec<&str> {
        let consumed = |q: &str| {
            self.steps
                .iter()
                .any(|s| matches!(&s.action, Action::Consume(c) if c.queue == q))
        };
        // Where the lab's messages with a per-message TTL are routed.
        let declared = self
            .topology
            .queues
            .iter()
            .map(|q| q.name.as_str())
            .collect();
        let expiring: BTreeSet<&str> = self
            .steps
            .iter()
            .filter_map(|s| match &s.action {
                Action::Publish(p) => Some(p),
                _ => None,
            })
            .flat_map(|p| {
                p.messages
                    .iter()
                    .filter(|m| m.expiration_ms.is_some())
                    .flat_map(|m| {
                        self.topology
                            .route(&p.exchange, &m.routing_key, &declared)
                            .unwrap_or_default()
                    })
            })
            .collect();
        self.topology
            .queues
            .iter()
            .map(|q| q.name.as_str())
            .filter(|q| *q != queue && !consumed(q))
            .filter(|q| self.topology.dead_letters_reach(q, queue) == Some(true))
            .filter(|q| {
                expiring.contains(q)
                    || self
                        .topology
                        .queues
                        .iter()
                        .any(|d| d.name == *q && d.arguments.contains_key("x-message-ttl"))
            })
            .collect()
    }

    /// Roughly how long the lab waits on a clock, in ms: the TTLs of its
    /// queues (retry tiers included) and messages, its confirm timeouts,
    /// and 1 s per await (most end on an event). Concurrent runs start the
    /// longest first, so that no long wait ends a suite alone.
    pub fn clock_ms(&self) -> u64 {
        let ttls =
            self.topology
                .queues
                .iter()
                .filter_map(|q| match q.arguments.get("x-message-ttl") {
                    Some(crate::vocab::ArgValue::Int(ms)) => Some((*ms).max(0) as u64),
                    _ => None,
                });
        let steps = self.steps.iter().map(|s| match &s.action {
            Action::Publish(p) => p.confirm_timeout_ms.unwrap_or(0).saturating_add(
                p.messages
                    .iter()
                    .filter_map(|m| m.expiration_ms)
                    .max()
                    .unwrap_or(0),
            ),
            Action::Await { .. } => 1000,
            _ => 0,
        });
        ttls.chain(steps).fold(0, u64::saturating_add)
    }

    /// Replaces the program of every consume step that runs one
    /// (`--consumer-cmd`); `false` when the lab has none.
    pub fn set_command(&mut self, command: &str) -> bool {
        let mut any = false;
        for s in &mut self.steps {
            if let Action::Consume(c) = &mut s.action {
                if c.command.is_some() {
                    c.command = Some(command.to_string());
                    // `commits_first` was declared of the lab's program.
                    c.commits_first = false;
                    any = true;
                }
            }
        }
        any
    }

    /// What the lab needs of its broker and environment, the most telling
    /// first (a refusal names that one).
    pub fn needs(&self) -> Vec<crate::vocab::Capability> {
        use crate::vocab::Capability::*;
        let mut needs = Vec::new();
        let mut need = |c, needed: bool| {
            if needed && !needs.contains(&c) {
                needs.push(c);
            }
        };
        need(BrokerFault, self.has_broker_fault());
        need(Policy, self.has_policy());
        need(QueueFigures, self.reads_queue_process());
        need(Setting, !self.settings.is_empty());
        need(QueueFigures, self.reads_queue_holds());
        need(OwnDatabase, self.database != crate::vocab::Durability::Fast);
        needs
    }

    /// Runs with the environment to itself, never beside another run: it
    /// faults the broker, or sets a policy or reads an unacked count
    /// through the environment.
    pub fn needs_environment(&self) -> bool {
        self.has_broker_fault() || self.has_policy() || self.reads_queue_process()
    }

    /// Reads a queue's own process at a kill (`unackedAtKill`,
    /// `oldestAgeShownAtKill`, with `rabbitmqctl eval`: not on a broker
    /// mqlab did not start).
    pub fn reads_queue_process(&self) -> bool {
        self.steps.iter().filter_map(|s| s.fault.as_ref()).any(|f| {
            f.asserts
                .iter()
                .any(|a| a.counter.counter.reads_queue_process())
        })
    }

    /// An await reads what its `from` queue holds, and so does a
    /// `heldAfter` counter (with `rabbitmqctl eval`: not on a broker mqlab
    /// did not start).
    pub fn reads_queue_holds(&self) -> bool {
        self.steps.iter().any(|s| {
            let fault = s.fault.iter().flat_map(|f| &f.asserts);
            matches!(&s.action, Action::Await { from: Some(_), .. })
                || (s.asserts.iter().chain(fault))
                    .any(|a| a.counter.counter == crate::vocab::Counter::HeldAfter)
        })
    }

    /// Sets a policy on the broker (with `rabbitmqctl eval`: not on a
    /// broker mqlab did not start).
    pub fn has_policy(&self) -> bool {
        self.steps
            .iter()
            .any(|s| matches!(s.action, Action::Policy { .. }))
    }

    /// A step kills, restarts or pauses the broker: such a run has the
    /// broker to itself (`--jobs`), and cannot run on a broker that is not
    /// mqlab's (`--env external`).
    pub fn has_broker_fault(&self) -> bool {
        self.steps.iter().any(|s| {
            matches!(s.action, Action::Broker(_) | Action::Node { .. })
                || s.fault
                    .as_ref()
                    .is_some_and(|f| f.target.acts_on_environment())
        })
    }

    /// A step's fault acts on the run's own database: it runs on the lazy
    /// file system.
    pub fn has_database_fault(&self) -> bool {
        self.steps.iter().any(|s| {
            s.fault
                .as_ref()
                .is_some_and(|f| f.target == crate::vocab::Target::Database)
        })
    }

    /// Runs on a three-node cluster (the `cluster` group).
    pub fn is_cluster(&self) -> bool {
        self.nodes > 1
    }

    /// A step cuts a node off: the lab needs iptables and root.
    pub fn has_partition(&self) -> bool {
        self.steps.iter().any(|s| {
            matches!(
                s.action,
                Action::Node {
                    action: FaultAction::Partition,
                    ..
                }
            )
        })
    }

    /// `lab` or `lab@variant`: the snapshot, vhost and database name.
    pub fn run_name(&self) -> String {
        match &self.variant {
            Some(v) => format!("{}@{v}", self.name),
            None => self.name.clone(),
        }
    }

    /// Every queue the lab declares, in order.
    pub fn queue_names(&self) -> impl Iterator<Item = &str> {
        self.topology.queues.iter().map(|q| q.name.as_str())
    }
}

#[derive(Clone, Debug)]
pub struct Step {
    pub action: Action,
    pub fault: Option<Fault>,
    pub asserts: Vec<Assertion>,
}

#[derive(Clone, Debug)]
pub enum Action {
    Publish(Publish),
    Consume(Consume),
    Inspect(Vec<InspectField>),
    /// A fault step of its own: the broker, between two steps.
    Broker(FaultAction),
    /// A fault step of its own: one cluster node (1-based), between two steps.
    Node {
        node: usize,
        action: FaultAction,
    },
    /// Declares exchanges and queues the lab marks `later`, or queues a
    /// `Delete` step deleted (the application declares its topology again).
    Declare(Vec<String>),
    /// An administrator deletes these queues, with every message they hold
    /// (article 002: persistence and replication do not cover it).
    Delete(Vec<String>),
    /// Waits until `queue` holds `depth` ready messages, at most
    /// `within_secs`, or until `from` (which dead-letters into `queue`)
    /// holds no message any more.
    Await {
        queue: String,
        depth: u32,
        within_secs: u64,
        from: Option<String>,
    },
    /// The consuming service's inbox purge: deletes the rows processed
    /// longer ago than the retention (article 002: the retention must cover
    /// the time in which an event can be replayed).
    PurgeInbox {
        service: String,
        retention_ms: u64,
    },
    /// A policy set (or changed) on the running broker for one queue, its
    /// definition as JSON: the queue's own arguments stay as declared.
    Policy {
        name: String,
        queue: String,
        definition: String,
    },
    /// An operator's DLQ replay (article 002: a DLQ needs an owner, an
    /// alert and a replay): every message `from` holds moved into `to`.
    Replay {
        from: String,
        to: String,
    },
}

impl Action {
    /// The phase name used in progress lines and deadline errors.
    pub fn phase(&self) -> String {
        match self {
            Action::Publish(p) => format!("publish({})", p.destination()),
            Action::Consume(c) => format!("consume({})", c.queue),
            Action::Inspect(_) => "inspect".into(),
            Action::Broker(a) => format!("broker({a})"),
            Action::Node { node, action } => format!("node{node}({action})"),
            Action::Declare(names) => format!("declare({})", names.join(", ")),
            Action::Delete(names) => format!("delete({})", names.join(", ")),
            Action::Await { queue, .. } => format!("await({queue})"),
            Action::PurgeInbox { .. } => "purge-inbox".into(),
            Action::Policy { name, .. } => format!("policy({name})"),
            Action::Replay { from, .. } => format!("replay({from})"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Publish {
    pub exchange: String,
    pub messages: Vec<Message>,
    pub deadline_secs: u64,
    pub confirm: bool,
    pub mandatory: bool,
    pub persistent: bool,
    /// Each message carries the `timestamp` property.
    pub timestamp: bool,
    /// Where a returned message is published (confirmed).
    pub park: Option<String>,
    pub confirm_timeout_ms: Option<u64>,
    /// A restarted producer sends again what it never saw confirmed, and a
    /// producer whose confirm timed out sends again (false: taken as done).
    pub resend: bool,
    /// A client-side batch of this many messages, sent when full and, with
    /// `flush`, at close.
    pub batch: Option<usize>,
    pub flush: bool,
    /// The cluster node it connects to, 1-based.
    pub node: usize,
    /// The producer is an order service: each order committed first, its
    /// event handed to the broker this way.
    pub orders: Option<Handoff>,
    /// The order service's reconciliation job rather than its requests.
    pub reconcile: bool,
    /// The outbox relay's next pass rather than the service's requests.
    pub relay: bool,
}

impl Publish {
    /// The windows `p`, a publish-step placement, can use on this step.
    pub fn windows_of(&self, p: &crate::vocab::Placement) -> Vec<Window> {
        use crate::vocab::{Windows, ORDER_SERVICE_WINDOWS, PRODUCER_WINDOWS};
        match p.windows {
            Windows::These(ws) => ws.to_vec(),
            // A reconciliation job, or a relay's pass alone, commits no order.
            Windows::ProducerPath if self.orders.is_some() && !self.reconcile && !self.relay => {
                ORDER_SERVICE_WINDOWS.to_vec()
            }
            Windows::ProducerPath => PRODUCER_WINDOWS.to_vec(),
            Windows::ConsumerPath | Windows::None => Vec::new(),
        }
    }

    /// The message the producer sends just before `message`, if any.
    pub fn message_before(&self, message: &str) -> Option<String> {
        self.messages
            .iter()
            .take_while(|m| m.meta.message_id != message)
            .last()
            .map(|m| m.meta.message_id.clone())
    }

    /// What the producer's lines call `destination`: the exchange, or the
    /// queue when publishing through the default exchange.
    pub fn destination(&self) -> &str {
        if self.exchange.is_empty() {
            self.messages
                .first()
                .map(|m| m.routing_key.as_str())
                .unwrap_or("")
        } else {
            &self.exchange
        }
    }

    /// Whether the step's confirm settings fit `p`, a publish-step
    /// placement: the one rule the lab checker and `explore` both apply.
    pub fn confirm_fits(&self, p: &crate::vocab::Placement) -> bool {
        let timeout = self.confirm_timeout_ms.is_some();
        !(p.needs_confirm && (!self.confirm || timeout)
            || p.needs_confirm_timeout && (!self.confirm || !timeout))
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub meta: MessageMeta,
    pub routing_key: String,
    pub fixture: String,
    pub body: String,
    /// A per-message TTL in ms (the `expiration` property).
    pub expiration_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retry {
    pub max_attempts: u32,
    /// The time budget from a message's first failure, in ms.
    pub max_duration_ms: Option<u64>,
    pub dlq: String,
    /// Retry queues and the TTL each holds a message for.
    pub tiers: Vec<(String, u64)>,
}

/// When a consumer stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// After this many distinct messages reached a final outcome.
    Count(usize),
    /// After as many as the queue holds when the step starts.
    Drain,
}

#[derive(Clone, Debug)]
pub struct Consume {
    pub queue: String,
    /// The consuming service: the inbox key's consumer part.
    pub service: String,
    pub pattern: Pattern,
    /// A program mqlab did not write, run with `sh -c`, instead of the
    /// built-in consumer.
    pub command: Option<String>,
    /// The program declared to commit before it acks (`commits_first`).
    pub commits_first: bool,
    pub prefetch: u16,
    pub settle: Settle,
    pub max_deliveries: Option<usize>,
    pub retry: Option<Retry>,
    pub deadline_secs: u64,
    /// Message id → how many of its first attempts fail transiently.
    pub transient_failures: BTreeMap<String, u32>,
    /// The cluster node it connects to, 1-based.
    pub node: usize,
    /// Competing consumers of the service: more than one only under a
    /// `rendezvous` fault.
    pub instances: usize,
    /// The downstream service the harness runs for the pattern to call.
    pub downstream: Option<Downstream>,
}

/// A consume step's downstream service: the consumer's timeout, and the
/// messages whose event's first call is applied and never answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Downstream {
    pub timeout_ms: u64,
    pub lose_response: Vec<String>,
}

impl Consume {
    /// Whether `p`, a consume-step placement, can go on this step (the
    /// proxy's connection cut needs the built-in consumer's own round trip
    /// and reconnect).
    pub fn admits(&self, p: &crate::vocab::Placement) -> bool {
        !(p.built_in_only && self.command.is_some())
    }

    /// The windows `p` can use on this step: its own, or the consumer's
    /// (a built-in pattern's derived windows, with its DLQ move's only when
    /// the step has a DLQ; or a program's).
    pub fn windows_of(&self, p: &crate::vocab::Placement) -> Vec<Window> {
        use crate::vocab::Windows;
        match p.windows {
            Windows::These(ws) => ws.to_vec(),
            Windows::ConsumerPath if self.command.is_some() => p.program_windows.to_vec(),
            Windows::ConsumerPath => self.pattern.def().windows_for(self.retry.is_some()),
            Windows::ProducerPath | Windows::None => Vec::new(),
        }
    }
}

/// A fault attached to a publish or consume step: at a window, for one message.
#[derive(Clone, Debug)]
pub struct Fault {
    pub target: Target,
    /// A `node` fault at a producer's window: the node killed there.
    pub node: Option<usize>,
    pub action: FaultAction,
    pub window: Window,
    /// At `before-commit` of a program: which of the message's `COMMIT`s is
    /// held (1: the first; 2: the window between its first and second).
    pub commit: usize,
    pub message: String,
    pub then: Then,
    pub kill_at_depth: Option<u32>,
    pub restart_settle: Option<usize>,
    /// The consumer started after the kill settles what the queue holds then
    /// (`mqlab explore`, where a kill can come at any message).
    pub restart_drain: bool,
    /// A rendezvous: the messages that carry the event of `message`
    /// (itself first), one per instance.
    pub copies: Vec<String>,
    pub asserts: Vec<Assertion>,
}

#[derive(Clone, Debug)]
pub struct Assertion {
    /// The name printed in `[assert] name=value`, as the lab spells it.
    pub name: String,
    pub counter: CounterRef,
    pub expected: Expect,
}

/// One problem in a lab file: where (key path and position) and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabError {
    /// `step[1].fault.message`, as the file's keys spell it.
    pub path: String,
    pub span: Option<Range<usize>>,
    pub kind: ErrorKind,
}

/// Every problem found in one lab file; displayed one line each as
/// `file:line:col: key.path: message (hint: ...)`.
#[derive(Debug)]
pub struct LabErrors {
    pub file: PathBuf,
    pub text: String,
    pub errors: Vec<LabError>,
}

impl LabErrors {
    pub fn lines(&self) -> Vec<String> {
        self.errors
            .iter()
            .map(|e| {
                let at = match &e.span {
                    Some(s) => {
                        let (l, c) = line_col(&self.text, s.start);
                        format!("{}:{l}:{c}", self.file.display())
                    }
                    None => self.file.display().to_string(),
                };
                let path = if e.path.is_empty() {
                    String::new()
                } else {
                    format!("{}: ", e.path)
                };
                let hint = e
                    .kind
                    .hint()
                    .map(|h| format!(" (hint: {h})"))
                    .unwrap_or_default();
                format!("{at}: {path}{}{hint}", e.kind)
            })
            .collect()
    }
}

impl fmt::Display for LabErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.lines().join("\n"))
    }
}

impl std::error::Error for LabErrors {}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    (line, col)
}

/// Where a project keeps its labs, fixtures and snapshots.
#[derive(Clone, Debug)]
pub struct Project {
    pub root: PathBuf,
}

impl Project {
    pub fn labs_dir(&self) -> PathBuf {
        self.root.join("labs")
    }
    pub fn fixtures_dir(&self) -> PathBuf {
        self.root.join("fixtures")
    }
    pub fn snapshots_dir(&self) -> PathBuf {
        self.root.join("snapshots")
    }

    /// Lab names, sorted, from the files present.
    pub fn lab_names(&self) -> anyhow::Result<Vec<String>> {
        let dir = self.labs_dir();
        let rd = std::fs::read_dir(&dir)
            .map_err(|e| anyhow::anyhow!("cannot read lab directory `{}`: {e}", dir.display()))?;
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            // the image pins of the containers environment, not a lab
            .filter(|p| p.file_stem().is_some_and(|s| s != "environment"))
            .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .collect();
        names.sort();
        Ok(names)
    }

    fn path_of(&self, name: &str) -> anyhow::Result<PathBuf> {
        let known = self.lab_names()?;
        if !known.iter().any(|k| k == name) {
            anyhow::bail!("unknown lab `{name}` (known: {})", known.join(", "));
        }
        Ok(self.labs_dir().join(format!("{name}.toml")))
    }

    /// Loads `lab` or `lab@variant`.
    pub fn load(&self, run: &str) -> anyhow::Result<Lab> {
        let (name, variant) = match run.split_once('@') {
            Some((n, v)) => (n, Some(v)),
            None => (run, None),
        };
        let path = self.path_of(name)?;
        Ok(load_file(&path, &self.fixtures_dir(), variant)?)
    }

    /// Whether a lab runs on a three-node cluster (`nodes = 3`): the
    /// `cluster` group, not in `--all`.
    pub fn is_cluster(&self, name: &str) -> anyhow::Result<bool> {
        let (raw, _) = check::parse(&self.path_of(name)?)?;
        Ok(raw.nodes.is_some_and(|n| *n.get_ref() > 1))
    }

    /// The lab followed by each of its variants, as run names.
    pub fn runs_of(&self, name: &str) -> anyhow::Result<Vec<String>> {
        Ok(std::iter::once(name.to_string())
            .chain(
                self.variants(name)?
                    .into_iter()
                    .map(|(v, _)| format!("{name}@{v}")),
            )
            .collect())
    }

    /// Variant names and claims of a lab, for `mqlab list`.
    pub fn variants(&self, name: &str) -> anyhow::Result<Vec<(String, String)>> {
        let path = self.path_of(name)?;
        let (raw, _) = check::parse(&path)?;
        Ok(raw.variant.into_iter().map(|(k, v)| (k, v.claim)).collect())
    }
}

/// Parses and checks one lab file (and a variant of it).
pub fn load_file(path: &Path, fixtures: &Path, variant: Option<&str>) -> Result<Lab, LabErrors> {
    let (raw, text) = check::parse(path)?;
    check::Checker::new(path, &text, fixtures)
        .lab(raw, variant)
        .map_err(|errors| LabErrors {
            file: path.to_path_buf(),
            text,
            errors,
        })
}

/// Checks a lab given as text (the unit tests' entry point).
pub fn from_str(
    text: &str,
    name: &str,
    fixtures: &Path,
    variant: Option<&str>,
) -> Result<Lab, LabErrors> {
    let path = PathBuf::from(format!("{name}.toml"));
    let raw = check::parse_text(&path, text)?;
    check::Checker::new(&path, text, fixtures)
        .lab(raw, variant)
        .map_err(|errors| LabErrors {
            file: path,
            text: text.to_string(),
            errors,
        })
}
