//! From the raw file to the validated [`Lab`]: one method per section, each
//! collecting typed errors, so one edit-run cycle shows every problem.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::Path;

use toml::Spanned;

use super::schema::{
    Expected, RawConsume, RawFault, RawFullMessage, RawLab, RawMessage, RawPublish, RawQueue,
    RawStep, RawVariant, Settle as RawSettle,
};
use super::{
    Action, Assertion, Consume, Downstream, Fault, GenerationDiff, Lab, LabError, LabErrors,
    Message, Publish, Retry, Settle, Step,
};
use crate::expect::Expect;
use crate::transcript::MessageMeta;
use crate::vocab::{
    check_queue_argument, ArgValue, Check, Counter, CounterRef, ExchangeDecl, FaultAction,
    Generation, Handoff, OnFailure, Pattern, QueueDecl, Shape, Site, Target, Then, Topology,
    Window, NOT_READ,
};
use crate::vocab::{placement_of, placements_of};

/// What is wrong, with a hint where the fix is known.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ErrorKind {
    #[error("{0}")]
    Parse(String),
    #[error("cannot read the file: {0}")]
    Read(String),
    #[error("`name` is `{name}` but the file is `{stem}.toml`")]
    NameMismatch { name: String, stem: String },
    #[error("unknown variant `{name}` of lab `{lab}` (known: {known})")]
    UnknownVariant {
        name: String,
        lab: String,
        known: String,
    },
    #[error("no exchange `{0}` is declared")]
    UnknownExchange(String),
    #[error("no queue `{0}` is declared")]
    UnknownQueue(String),
    #[error("`{from}` does not dead-letter straight into `{queue}`: `from` names the queue the awaited messages are dead-lettered from (its `x-dead-letter-exchange` and `x-dead-letter-routing-key` route to `{queue}`)")]
    AwaitFromNotDeadLettering { from: String, queue: String },
    #[error("a policy step waits for a classic queue to apply the policy; `{0}` is a {1} queue, which applies it later than it reports it")]
    PolicyOnClassicOnly(String, String),
    #[error("queue `{queue}` sets no argument `{argument}` to remove")]
    NotAnArgument { queue: String, argument: String },
    #[error("queue `{0}` is declared twice")]
    DuplicateQueue(String),
    #[error("a publish without confirms never sees a return or a nack: nothing would be parked")]
    ParkWithoutConfirm,
    #[error("only a `mandatory` publish is returned, and only a queue with `x-overflow = reject-publish` nacks one: nothing would be parked")]
    ParkWithoutMandatory,
    #[error("`{queue}` is not a retry tier of `{work}`: it needs an integer `x-message-ttl` and `x-dead-letter-routing-key = \"{work}\"`")]
    NotATier { queue: String, work: String },
    #[error("pattern `{0}` retries transient failures through tier queues: set `retry.tiers`")]
    NoTiers(Pattern),
    #[error("pattern `{0}` moves what it cannot retry to a DLQ: set `retry` (max_attempts, dlq)")]
    NoRetry(Pattern),
    #[error("pattern `{0}` blocks its queue with one consumer: drop `instances`")]
    BlockNeedsOneConsumer(Pattern),
    #[error(
        "pattern `{0}` calls a downstream service: set `downstream` (timeout_ms, lose_response)"
    )]
    NoDownstream(Pattern),
    #[error("an outbox relay keeps a nacked row in its outbox: `park` does not apply to a step with `orders = \"{0}\"`")]
    OutboxPark(Handoff),
    #[error("`relay = true` is an outbox relay's next pass: set `orders` to an outbox handoff (outbox, outbox-after-commit, outbox-mark-first), without `reconcile`")]
    RelayWithoutOutbox,
    #[error(
        "no publish step of this lab sets `orders`: a variant's `orders` would change nothing"
    )]
    OrdersWithoutOrderService,
    #[error("a reconciliation job is an order service's that publishes directly: set `orders = \"direct\"` on the step, and keep `resend`")]
    ReconcileWithoutOrders,
    #[error("a batch holds at least 2 messages (with 1 every send goes out at once)")]
    BatchSize,
    #[error("`batch` is a plain producer's client-side buffer: an order service (`orders`) commits each order and publishes it")]
    BatchWithOrders,
    #[error("`flush = false` is for a batching producer: set `batch` too")]
    FlushWithoutBatch,
    #[error("a batching producer keeps no journal across a restart (it would send everything again): no fault on a `batch` step")]
    BatchWithFault,
    #[error("no publish step of this lab sets `batch`: a variant's `flush` would change nothing")]
    NoBatchToFlush,
    #[error("a reconciliation job compares the orders with the built-in consumer's business rows: a program (`command`) keeps its own")]
    ReconcileWithProgram,
    #[error("no publish step of this lab sets `reconcile = true`: a variant's `reconcile = false` would change nothing")]
    NoReconcileToDrop,
    #[error("`orders = \"{0}\"` leaves the lab's relay passes (`relay = true`) without an outbox: set `relay = false` in the variant too")]
    VariantOrdersWithRelay(Handoff),
    #[error("no publish step of this lab sets `relay = true`: a variant's `relay = false` would change nothing")]
    NoRelayToDrop,
    #[error("`relay = true` is a later pass of the relay of an earlier publish step's outbox: no step before it commits orders with an outbox")]
    RelayWithoutEarlierOutbox,
    #[error("an order service without confirms marks or moves on as soon as a publish is written: a cut publish is seen only by its missing confirm, so set `confirm = true`")]
    CutWithoutConfirm,
    #[error("`outbox` is the safe handoff, but a counterexample hands its events over another way (direct, outbox-mark-first, outbox-after-commit)")]
    SafeHandoffInVariant,
    #[error("pattern `{0}` never calls a downstream service: drop `downstream`, or use a pattern that calls one ({1})")]
    DownstreamNeverCalled(Pattern, String),
    #[error("a program's behaviour is its own: `pattern`, `retry`, `transient_failures`, `max_deliveries` and `downstream` are for the built-in consumer")]
    ProgramHasNoPattern,
    #[error("a program's business effects are read from its database: set `effects` (SQL returning service and eventId per effect)")]
    NoEffectsQuery,
    #[error("{0}")]
    QueueArgument(String),
    #[error("a quorum queue is always durable")]
    QuorumNotDurable,
    #[error(
        "a step has exactly one of `publish`, `consume`, `inspect`, `declare`, `await`, `purge_inbox`, `policy` (or only a broker `fault`)"
    )]
    StepActions,
    #[error("an inspect step reads state; a fault belongs on a publish or consume step")]
    NoFaultOnInspect,
    #[error("`{0}` is not an exchange or queue marked `later = true`")]
    NotLater(String),
    #[error("no `routing_key` (set it on the message or the step)")]
    NoRoutingKey,
    #[error("fixture `{file}`: {why}")]
    Fixture { file: String, why: String },
    #[error(
        "`{action}` of the {target} does not belong on this step ({})",
        crate::vocab::placements_summary()
    )]
    FaultPlacement { target: Target, action: FaultAction },
    #[error("the {0} acts at a window, for one message: set `window` and `message`")]
    FaultNeedsWindowAndMessage(Target),
    #[error("`{action}` of the {target} never passes window `{window}` (it passes: {passes})")]
    WindowNotPassed {
        target: Target,
        action: FaultAction,
        window: Window,
        passes: String,
    },
    #[error("`{message}` is not one of this step's messages ({published})")]
    MessageNotInStep { message: String, published: String },
    #[error("`{then}` does not follow `{action}` of the {target}: `{follows}` does")]
    WrongThen {
        target: Target,
        action: FaultAction,
        then: Then,
        follows: Then,
    },
    #[error("`{0}` applies to a consumer kill only")]
    ConsumerOnly(&'static str),
    #[error("`{name}` is no assertion of this lab (its assertions: {known})")]
    UnknownFact { name: String, known: String },
    #[error("`{name}` is falsified by the variant `{variant}`: it is evidence of the claim, not a harness fact")]
    FactFalsified { name: String, variant: String },
    #[error("`commit` picks which of a program's COMMITs for the message `before-commit` holds (1: the first): it needs `window = \"before-commit\"` on a consume step that runs a program, and a value of 1 or more")]
    CommitOrdinal,
    #[error("`instances = {0}` runs competing consumers, whose order only a `rendezvous` or `stall` fault fixes: add one (`target = \"consumer\"`, `action = \"rendezvous\"` or `\"stall\"`), or drop `instances`")]
    InstancesNeedRendezvous(usize),
    #[error("a rendezvous holds one copy of the event per instance: set `instances` to 2 or more on the step")]
    RendezvousNeedsInstances,
    #[error("`instances = {instances}` needs as many copies of `{message}`'s event published before this step (found {copies}: {found})")]
    RendezvousCopies {
        message: String,
        instances: usize,
        copies: usize,
        found: String,
    },
    #[error(
        "competing consumers under a rendezvous take one message at a time: set `prefetch = 1`"
    )]
    RendezvousPrefetch,
    #[error("a stall holds the instance that takes the message while one other settles the rest of the queue: set `instances = 2`, `prefetch = 1` and `settle = \"drain\"` on the step")]
    StallInstances,
    #[error("a stall holds its instance before the message's commit and ack (after the ack the broker pushes it the next message; after the commit it completes nothing last): use `after-receive` or `before-commit`")]
    StallWindow,
    #[error(
        "`{0}` is read at a kill of the built-in consumer: assert it in that fault's `assert`"
    )]
    AtKillPlace(Counter),
    #[error("`{0}` reads a classic queue's own process: `{1}` is a quorum queue, whose figures are statistics its leader refreshes every few seconds")]
    ProcessOfQuorum(Counter, String),
    #[error("`oldestAgeShownAtKill` reads the oldest message a queue holds in memory: `{0}` sets `x-queue-mode`, whose lazy mode keeps its messages on disk (the answer would be `no` for stamped messages)")]
    AgeOfLazyQueue(String),
    #[error("`{0}` is `yes` or `no`")]
    YesOrNo(String),
    #[error(
        "`{name}` is a count: an integer or a bound (`{{ min = 1 }}`, `{{ max = 3 }}`){words}"
    )]
    NotACount { name: String, words: String },
    #[error("`{0}` prints a text (a list, a name): a bound cannot hold, expect it as written")]
    BoundOfText(String),
    #[error("`{0}`: a bound with no `max` and a `min` of 0 or less holds for every count: it cannot fail")]
    BoundCannotFail(String),
    #[error("`commits_first` declares the order of one program (`command`, one instance): the built-in consumer's is its pattern's, and instances keep the hold")]
    CommitsFirstOfOne,
    #[error("competing consumers under a rendezvous or a stall take one message at a time: a variant's `prefetch` cannot change it")]
    HeldPrefetch,
    #[error("a program consumes with prefetch 1 (MQLAB_PREFETCH): a variant's `prefetch` cannot change it")]
    ProgramPrefetch,
    #[error("the {0} is faulted inside a publish or consume step, not in a step of its own")]
    NotBetweenSteps(Target),
    #[error("a broker restart happens between steps: it has no window and no message")]
    BrokerHasNoWindow,
    #[error("a node fault in a step of its own happens between steps: it has no window, message, follow-up, kill_at_depth, restart_settle or assert of its own (assert on the step; a node killed at a producer's window goes on the publish step)")]
    NodeHasNoWindow,
    #[error("a `node` fault needs a cluster: set `nodes = 3` (a one-node lab's broker fault is `target = \"broker\"`)")]
    NodeFaultOneNode,
    #[error("node {0} is healed but no step before cuts it off (`action = \"partition\"`)")]
    HealWithoutCut(usize),
    #[error("node {node} is killed at the producer's window, but the producer talks to node {producer}: kill its own node (the publish step's `node`)")]
    NodeKillNotProducers { node: usize, producer: usize },
    #[error("`{action}` of the {target} acts on the built-in consumer's own frames, not on a program's (a program is faulted with `target = \"consumer\"`, `action = \"kill\"`)")]
    BuiltInConsumerOnly { target: Target, action: FaultAction },
    #[error("`{action}` of the {target} holds the confirm until the producer gives up on it: the publish step needs `confirm = true` and a `confirm_timeout_ms`")]
    HoldNeedsConfirmTimeout { target: Target, action: FaultAction },
    #[error("a node killed at the producer's window needs its confirm (`confirm = true`, no `confirm_timeout_ms`): the harness holds it until the kill")]
    NodeKillNeedsConfirm,
    #[error("`nodes = {0}`: a lab runs on 1 node, or on a cluster of 3")]
    Nodes(usize),
    #[error("node {node} does not exist: the lab has {nodes} (`nodes = 3` runs it on a cluster)")]
    NoSuchNode { node: usize, nodes: usize },
    #[error("a `node` fault names its node: `node = N`, 1 to 3")]
    NodeMissing,
    #[error("`node` belongs to a fault on target `node`, not `{0}`")]
    NodeNotForTarget(Target),
    #[error("a node fault does `{action}`, not one of: {known}")]
    NodeAction { action: FaultAction, known: String },
    #[error("`{message}` is not published before this step (published: {published})")]
    UnpublishedMessage { message: String, published: String },
    #[error("pattern `{pattern}` never reaches window `{window}` (it passes: {passes})")]
    WindowNotReached {
        pattern: Pattern,
        window: Window,
        passes: String,
    },
    #[error("`{name}`: {why}")]
    Counter { name: String, why: String },
    #[error("`{0}` has no expected value in [expect]")]
    NoExpectedValue(String),
    #[error("`{0}` is never asserted by a step")]
    ExpectedNeverAsserted(String),
    #[error("alias `{0}` is never asserted (no [expect] value)")]
    UnusedAlias(String),
    #[error("a counterexample declares at least one violation")]
    NoViolations,
    #[error("unknown {what} `{0}` (known: {known})", what = crate::vocab::Generation::WHAT, known = crate::vocab::Generation::names().join(", "))]
    UnknownGeneration(String),
    #[error(
        "{0} is the generation the stored snapshots come from: declare a difference on another one"
    )]
    BaseGeneration(crate::vocab::Generation),
    #[error("name the release note or doc page of the broker change (a URL), or say \"cause not identified\"")]
    NoSource,
    #[error("say which broker change causes the difference, in a sentence (or \"cause not identified\")")]
    NoCause,
    #[error("`{0}` is neither an assertion of this lab nor a check ({checks})", checks = Check::names().join(", "))]
    NotAnAssertion(String),
    #[error("`{0}` is a safe pattern, but a counterexample runs a consumer missing a safety step")]
    SafePatternInVariant(Pattern),
}

/// Whether `from` dead-letters straight into `queue` alone, as the file tells:
/// an await's `from` that does not (another queue's source, a chain through
/// a second queue, what the file cannot tell) would end the wait while a
/// message may still come, and a run that expects none would pass.
fn dead_letters_into(topology: &Topology, from: &str, queue: &str) -> bool {
    use crate::vocab::ArgValue;
    let Some(q) = topology.queues.iter().find(|q| q.name == from) else {
        return false;
    };
    let all: BTreeSet<&str> = topology.queues.iter().map(|q| q.name.as_str()).collect();
    match (
        q.arguments.get("x-dead-letter-exchange"),
        q.arguments.get("x-dead-letter-routing-key"),
    ) {
        // The dead-letter exchange routes its key to `queue` alone: a
        // second queue routed too could pass a copy on later.
        (Some(ArgValue::Str(x)), Some(ArgValue::Str(k))) => {
            from != queue
                && topology
                    .route(x, k, &all)
                    .is_some_and(|routed| routed.len() == 1 && routed.contains(queue))
        }
        _ => false,
    }
}

impl ErrorKind {
    pub fn hint(&self) -> Option<String> {
        match self {
            ErrorKind::SafePatternInVariant(_) => Some(format!(
                "unsafe patterns: {}",
                crate::vocab::PATTERNS
                    .iter()
                    .filter(|p| !p.safe)
                    .map(|p| p.pattern.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            ErrorKind::UnknownQueue(_) => Some("declare it in a [[queue]] table".into()),
            ErrorKind::UnknownExchange(_) => Some("declare it in an [[exchange]] table".into()),
            ErrorKind::NoExpectedValue(n) => Some(format!("add `{n} = <value>` under [expect]")),
            ErrorKind::QuorumNotDurable => Some("drop `durable = false`".into()),
            _ => None,
        }
    }
}

pub fn parse(path: &Path) -> Result<(RawLab, String), LabErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| LabErrors {
        file: path.to_path_buf(),
        text: String::new(),
        errors: vec![LabError {
            path: String::new(),
            span: None,
            kind: ErrorKind::Read(e.to_string()),
        }],
    })?;
    let raw = parse_text(path, &text)?;
    Ok((raw, text))
}

/// serde stops at the first error; its key path comes from
/// `serde_path_to_error`, its position from the TOML parser.
pub fn parse_text(path: &Path, text: &str) -> Result<RawLab, LabErrors> {
    let de = toml::Deserializer::new(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        // Spanned values show up as a private field in the path.
        let key = e
            .path()
            .to_string()
            .replace(".$__serde_spanned_private_value", "");
        let inner = e.into_inner();
        LabErrors {
            file: path.to_path_buf(),
            text: text.to_string(),
            errors: vec![LabError {
                path: if key == "." { String::new() } else { key },
                span: inner.span(),
                kind: ErrorKind::Parse(inner.message().trim().to_string()),
            }],
        }
    })
}

pub struct Checker<'a> {
    path: &'a Path,
    fixtures: &'a Path,
    errs: Vec<LabError>,
    /// The lab names an `effects` query.
    has_effects: bool,
    /// How many broker nodes the lab runs on.
    nodes: usize,
    /// Each message published so far and its eventId: a rendezvous holds
    /// the copies of one event.
    events: Vec<(String, String)>,
}

fn span<T>(s: &Spanned<T>) -> Option<Range<usize>> {
    Some(s.span())
}

impl<'a> Checker<'a> {
    pub fn new(path: &'a Path, _text: &'a str, fixtures: &'a Path) -> Checker<'a> {
        Checker {
            path,
            fixtures,
            errs: Vec::new(),
            has_effects: false,
            events: Vec::new(),
            nodes: 1,
        }
    }

    fn err(&mut self, path: impl Into<String>, span: Option<Range<usize>>, kind: ErrorKind) {
        self.errs.push(LabError {
            path: path.into(),
            span,
            kind,
        });
    }

    pub fn lab(mut self, raw: RawLab, variant: Option<&str>) -> Result<Lab, Vec<LabError>> {
        // The queues as written, before a variant's overrides.
        let written = raw.queues.clone();
        // The order-service steps as written, which a variant may leave out.
        let written_publish = |f: fn(&RawPublish) -> bool| {
            raw.steps.iter().any(|s| s.publish.as_ref().is_some_and(f))
        };
        let written_jobs = (
            written_publish(|p| p.reconcile),
            written_publish(|p| p.relay),
        );
        let (raw, variant_def) = match variant {
            None => (raw, None),
            Some(v) => match raw.variant.get(v).cloned() {
                Some(def) => (apply_variant(raw, &def), Some((v, def))),
                None => {
                    let known: Vec<_> = raw.variant.keys().cloned().collect();
                    self.err(
                        "",
                        None,
                        ErrorKind::UnknownVariant {
                            name: v.into(),
                            lab: raw.name.get_ref().clone(),
                            known: if known.is_empty() {
                                "none".into()
                            } else {
                                known.join(", ")
                            },
                        },
                    );
                    return Err(self.errs);
                }
            },
        };
        self.name(&raw);
        self.has_effects = raw.effects.is_some();
        if let Some(n) = &raw.nodes {
            match *n.get_ref() {
                1 | 3 => self.nodes = *n.get_ref(),
                other => self.err("nodes", span(n), ErrorKind::Nodes(other)),
            }
        }
        // A variant may aim its DLQ at a queue that does not exist: that is its point.
        let missing_ok: Option<String> = variant_def
            .as_ref()
            .and_then(|(_, d)| d.dlq.as_ref().map(|s| s.get_ref().clone()));
        let topology = self.topology(&raw);
        let steps = self.steps(&raw, &topology, missing_ok.as_deref());
        self.counters(&raw, &steps);
        let reconciles = steps
            .iter()
            .any(|s| matches!(&s.action, Action::Publish(p) if p.reconcile));
        let program = steps
            .iter()
            .any(|s| matches!(&s.action, Action::Consume(c) if c.command.is_some()));
        // A relay's later pass relays what an earlier step's outbox holds.
        let outbox_step = |p: &Publish| p.orders.is_some_and(Handoff::is_outbox) && !p.relay;
        let first_outbox = steps
            .iter()
            .position(|s| matches!(&s.action, Action::Publish(p) if outbox_step(p)));
        for (i, s) in steps.iter().enumerate() {
            if matches!(&s.action, Action::Publish(p) if p.relay && p.orders.is_some_and(Handoff::is_outbox))
                && first_outbox.is_none_or(|f| f > i)
            {
                self.err(
                    format!("step[{i}].publish.relay"),
                    None,
                    ErrorKind::RelayWithoutEarlierOutbox,
                );
            }
        }
        if reconciles && program {
            self.err("step", None, ErrorKind::ReconcileWithProgram);
        }
        let violations = match &variant_def {
            Some((name, def)) => {
                self.variant_keys(name, def, &raw, &written, written_jobs);
                self.variant(name, def, &steps)
            }
            None => (BTreeMap::new(), BTreeMap::new()),
        };
        let (violations, generations) = violations;
        let facts = self.facts(&raw, &steps);
        if !self.errs.is_empty() {
            return Err(self.errs);
        }
        Ok(Lab {
            name: raw.name.into_inner(),
            variant: variant.map(str::to_string),
            claim: raw.claim,
            broker: raw.broker,
            path: self.path.to_path_buf(),
            topology,
            steps,
            violations,
            generations,
            effects: raw.effects,
            nodes: self.nodes,
            facts,
            settings: raw.settings,
        })
    }

    /// A variant's keys that name the lab as written: its queues, the
    /// arguments it unsets, the reconciliation it drops.
    fn variant_keys(
        &mut self,
        name: &str,
        def: &RawVariant,
        raw: &RawLab,
        written: &[RawQueue],
        (written_reconciles, written_relays): (bool, bool),
    ) {
        let batches = raw
            .steps
            .iter()
            .any(|s| s.publish.as_ref().is_some_and(|p| p.batch.is_some()));
        if def.flush.is_some() && !batches {
            self.err(
                format!("variant.{name}.flush"),
                None,
                ErrorKind::NoBatchToFlush,
            );
        }
        if def.reconcile == Some(false) && !written_reconciles {
            self.err(
                format!("variant.{name}.reconcile"),
                None,
                ErrorKind::NoReconcileToDrop,
            );
        }
        // The variant's handoff, not the relay steps it reaches, is what to
        // change: said once, at the variant's key.
        if let Some(o) = def.orders.as_ref().filter(|o| !o.get_ref().is_outbox()) {
            if written_relays && def.relay != Some(false) {
                self.errs
                    .retain(|e| e.kind != ErrorKind::RelayWithoutOutbox);
                self.err(
                    format!("variant.{name}.orders"),
                    span(o),
                    ErrorKind::VariantOrdersWithRelay(*o.get_ref()),
                );
            }
        }
        let program = raw
            .steps
            .iter()
            .any(|s| s.consume.as_ref().is_some_and(|c| c.command.is_some()));
        let held = raw.steps.iter().any(|s| {
            s.fault.as_ref().is_some_and(|f| {
                matches!(
                    f.get_ref().action.get_ref(),
                    FaultAction::Rendezvous | FaultAction::Stall
                )
            })
        });
        if held && def.prefetch.is_some_and(|p| p.get() != 1) {
            // Said at the variant's key, not at the step it reaches.
            self.errs
                .retain(|e| e.kind != ErrorKind::RendezvousPrefetch);
            self.err(
                format!("variant.{name}.prefetch"),
                None,
                ErrorKind::HeldPrefetch,
            );
        }
        if program && def.prefetch.is_some_and(|p| p.get() != 1) {
            self.err(
                format!("variant.{name}.prefetch"),
                None,
                ErrorKind::ProgramPrefetch,
            );
        }
        if def.relay == Some(false) && !written_relays {
            self.err(
                format!("variant.{name}.relay"),
                None,
                ErrorKind::NoRelayToDrop,
            );
        }
        let named = def
            .arguments
            .keys()
            .map(|q| ("arguments", q))
            .chain(def.bind.keys().map(|q| ("bind", q)))
            .chain(def.unset.keys().map(|q| ("unset", q)));
        for (key, q) in named {
            if !raw.queues.iter().any(|r| r.name.get_ref() == q) {
                self.err(
                    format!("variant.{name}.{key}.{q}"),
                    None,
                    ErrorKind::UnknownQueue(q.clone()),
                );
            }
        }
        // In the lab as written: an argument it does not set cannot
        // be shown necessary by removing it.
        for (q, args) in &def.unset {
            let Some(declared) = written.iter().find(|r| r.name.get_ref() == q) else {
                continue;
            };
            for a in args.iter().filter(|a| !declared.arguments.contains_key(*a)) {
                self.err(
                    format!("variant.{name}.unset.{q}"),
                    None,
                    ErrorKind::NotAnArgument {
                        queue: q.clone(),
                        argument: a.clone(),
                    },
                );
            }
        }
    }

    /// `facts`: each names an assertion of the lab that no variant falsifies.
    fn facts(&mut self, raw: &RawLab, steps: &[Step]) -> Vec<String> {
        let named: Vec<&str> = steps
            .iter()
            .flat_map(|s| {
                s.asserts
                    .iter()
                    .chain(s.fault.iter().flat_map(|f| &f.asserts))
            })
            .map(|a| a.name.as_str())
            .collect();
        let mut out = Vec::new();
        for (i, f) in raw.facts.iter().enumerate() {
            let name = f.get_ref();
            if !named.contains(&name.as_str()) {
                self.err(
                    format!("facts[{i}]"),
                    span(f),
                    ErrorKind::UnknownFact {
                        name: name.clone(),
                        known: named.join(", "),
                    },
                );
            }
            if let Some((v, _)) = raw.variant.iter().find(|(_, v)| {
                v.violations.contains_key(name)
                    || v.rabbitmq.values().any(|d| d.violations.contains_key(name))
            }) {
                self.err(
                    format!("facts[{i}]"),
                    span(f),
                    ErrorKind::FactFalsified {
                        name: name.clone(),
                        variant: v.clone(),
                    },
                );
            }
            out.push(name.clone());
        }
        out
    }

    /// A publish step's `batch` (and its `flush`).
    fn batch(&mut self, key: &str, p: &RawPublish) -> Option<usize> {
        let Some(b) = &p.batch else {
            if !p.flush {
                self.err(
                    format!("{key}.publish.flush"),
                    None,
                    ErrorKind::FlushWithoutBatch,
                );
            }
            return None;
        };
        if *b.get_ref() < 2 {
            self.err(
                format!("{key}.publish.batch"),
                span(b),
                ErrorKind::BatchSize,
            );
        }
        if p.orders.is_some() {
            self.err(
                format!("{key}.publish.batch"),
                span(b),
                ErrorKind::BatchWithOrders,
            );
        }
        Some(*b.get_ref())
    }

    /// A `node = N` key: 1 by default, at most the lab's `nodes`.
    fn node(&mut self, key: String, n: &Option<Spanned<usize>>) -> usize {
        match n {
            None => 1,
            Some(v) if (1..=self.nodes).contains(v.get_ref()) => *v.get_ref(),
            Some(v) => {
                self.err(
                    key,
                    span(v),
                    ErrorKind::NoSuchNode {
                        node: *v.get_ref(),
                        nodes: self.nodes,
                    },
                );
                1
            }
        }
    }

    fn name(&mut self, raw: &RawLab) {
        let stem = self
            .path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if raw.name.get_ref() != &stem {
            self.err(
                "name",
                span(&raw.name),
                ErrorKind::NameMismatch {
                    name: raw.name.get_ref().clone(),
                    stem,
                },
            );
        }
    }

    fn topology(&mut self, raw: &RawLab) -> Topology {
        let exchanges: Vec<ExchangeDecl> = raw
            .exchanges
            .iter()
            .map(|x| ExchangeDecl {
                name: x.name.clone(),
                kind: x.kind,
                durable: x.durable,
                later: x.later,
            })
            .collect();
        let mut seen = BTreeSet::new();
        let mut queues = Vec::new();
        for (i, q) in raw.queues.iter().enumerate() {
            let key = format!("queue[{i}]");
            if !seen.insert(q.name.get_ref().as_str()) {
                self.err(
                    format!("{key}.name"),
                    span(&q.name),
                    ErrorKind::DuplicateQueue(q.name.get_ref().clone()),
                );
            }
            for (j, b) in q.bind.iter().enumerate() {
                if !exchanges.iter().any(|x| &x.name == b.exchange.get_ref()) {
                    self.err(
                        format!("{key}.bind[{j}].exchange"),
                        span(&b.exchange),
                        ErrorKind::UnknownExchange(b.exchange.get_ref().clone()),
                    );
                }
            }
            for (name, value) in &q.arguments {
                if let Err(why) = check_queue_argument(name, value.get_ref()) {
                    self.err(
                        format!("{key}.arguments.{name}"),
                        span(value),
                        ErrorKind::QueueArgument(why),
                    );
                }
            }
            let quorum = is_quorum(q);
            if quorum && !q.durable {
                self.err(
                    format!("{key}.durable"),
                    span(&q.name),
                    ErrorKind::QuorumNotDurable,
                );
            }
            queues.push(QueueDecl {
                name: q.name.get_ref().clone(),
                durable: q.durable,
                arguments: q
                    .arguments
                    .iter()
                    .map(|(k, v)| (k.clone(), v.get_ref().clone()))
                    .collect(),
                bindings: q
                    .bind
                    .iter()
                    .map(|b| (b.exchange.get_ref().clone(), b.key.clone()))
                    .collect(),
                later: q.later,
            });
        }
        Topology { exchanges, queues }
    }

    /// A step of its own kind, not a role's (`policy`, `purge_inbox`,
    /// `declare`, `await`): None when `s` is none of them; Some(None) when it is one
    /// and has an error.
    fn standalone(
        &mut self,
        key: &str,
        s: &RawStep,
        raw: &RawLab,
        topology: &Topology,
    ) -> Option<Option<Step>> {
        if s.policy.is_none()
            && s.purge_inbox.is_none()
            && s.declare.is_none()
            && s.await_depth.is_none()
        {
            return None;
        }
        if actions(s) > 1 {
            self.err(key.to_string(), None, ErrorKind::StepActions);
            return Some(None);
        }
        let action = if let Some(p) = &s.policy {
            self.policy(key, p, topology)
        } else if let Some(p) = &s.purge_inbox {
            Action::PurgeInbox {
                service: p.service.clone(),
                retention_ms: p.retention_ms,
            }
        } else if let Some(names) = &s.declare {
            self.declare(key, names, topology)
        } else {
            let a = s.await_depth.as_ref().expect("one of the four");
            for (field, q) in
                std::iter::once(("queue", &a.queue)).chain(a.from.iter().map(|f| ("from", f)))
            {
                if !topology.queues.iter().any(|t| &t.name == q.get_ref()) {
                    self.err(
                        format!("{key}.await.{field}"),
                        span(q),
                        ErrorKind::UnknownQueue(q.get_ref().clone()),
                    );
                }
            }
            if let Some(f) = &a.from {
                if topology.queues.iter().any(|t| &t.name == f.get_ref())
                    && !dead_letters_into(topology, f.get_ref(), a.queue.get_ref())
                {
                    self.err(
                        format!("{key}.await.from"),
                        span(f),
                        ErrorKind::AwaitFromNotDeadLettering {
                            from: f.get_ref().clone(),
                            queue: a.queue.get_ref().clone(),
                        },
                    );
                }
            }
            Action::Await {
                queue: a.queue.get_ref().clone(),
                depth: a.depth,
                within_secs: a.within_secs.get(),
                from: a.from.as_ref().map(|f| f.get_ref().clone()),
            }
        };
        let asserts = self.asserts(&format!("{key}.assert"), &s.assert, raw);
        Some(Some(Step {
            action,
            fault: None,
            asserts,
        }))
    }

    /// A `policy` step: its queue declared, and a classic one (a quorum or
    /// stream queue applies a policy after it reports it).
    fn policy(&mut self, key: &str, p: &super::schema::RawPolicy, topology: &Topology) -> Action {
        match topology
            .queues
            .iter()
            .find(|q| &q.name == p.queue.get_ref())
        {
            None => self.err(
                format!("{key}.policy.queue"),
                span(&p.queue),
                ErrorKind::UnknownQueue(p.queue.get_ref().clone()),
            ),
            Some(q) => {
                if let Some(ArgValue::Str(kind)) = q.arguments.get("x-queue-type") {
                    if kind != "classic" {
                        self.err(
                            format!("{key}.policy.queue"),
                            span(&p.queue),
                            ErrorKind::PolicyOnClassicOnly(q.name.clone(), kind.clone()),
                        );
                    }
                }
            }
        }
        Action::Policy {
            name: p.name.clone(),
            queue: p.queue.get_ref().clone(),
            definition: serde_json::to_string(&p.definition)
                .expect("a map of strings, numbers and booleans"),
        }
    }

    /// A `declare` step: each name a queue or exchange marked `later`.
    fn declare(&mut self, key: &str, names: &[Spanned<String>], topology: &Topology) -> Action {
        for (j, n) in names.iter().enumerate() {
            let later = topology
                .queues
                .iter()
                .any(|q| q.later && &q.name == n.get_ref())
                || topology
                    .exchanges
                    .iter()
                    .any(|x| x.later && &x.name == n.get_ref());
            if !later {
                self.err(
                    format!("{key}.declare[{j}]"),
                    span(n),
                    ErrorKind::NotLater(n.get_ref().clone()),
                );
            }
        }
        Action::Declare(names.iter().map(|n| n.get_ref().clone()).collect())
    }

    /// Long because it checks one section of the file key by key, in the
    /// file's order, so that errors come out in that order.
    fn steps(&mut self, raw: &RawLab, topology: &Topology, missing_ok: Option<&str>) -> Vec<Step> {
        let mut published: Vec<String> = Vec::new();
        let mut next_id = 1;
        let mut steps = Vec::new();
        for (i, s) in raw.steps.iter().enumerate() {
            let key = format!("step[{i}]");
            if let Some(step) = self.standalone(&key, s, raw, topology) {
                steps.extend(step);
                continue;
            }
            let action = match (&s.publish, &s.consume, &s.inspect) {
                (Some(p), None, None) => {
                    // Ids are positional: a message whose fixture is broken
                    // still has one, so a fault naming it is not a second error.
                    let n: usize = p.messages.iter().map(|m| m.get_ref().count()).sum();
                    published.extend((0..n).map(|j| format!("mid-{}", next_id + j)));
                    let p = self.publish(&key, p, raw, &mut next_id);
                    if let (Some(_), Some(f)) = (p.batch, &s.fault) {
                        self.err(format!("{key}.fault"), span(f), ErrorKind::BatchWithFault);
                    }
                    for m in &p.messages {
                        // As the consumer reads it (the message id if there is none).
                        let event = serde_json::from_str::<serde_json::Value>(&m.body)
                            .ok()
                            .and_then(|v| v.get("eventId")?.as_str().map(str::to_string))
                            .unwrap_or_else(|| m.meta.message_id.clone());
                        self.events.push((m.meta.message_id.clone(), event));
                    }
                    Action::Publish(p)
                }
                (None, Some(c), None) => {
                    Action::Consume(self.consume(&key, c, topology, missing_ok, &published))
                }
                (None, None, Some(fields)) => Action::Inspect(fields.clone()),
                (None, None, None) if s.fault.is_some() => {
                    let f = s.fault.as_ref().expect("checked");
                    if let Some(a) = self.broker_step(&key, f) {
                        let asserts = self.asserts(&format!("{key}.assert"), &s.assert, raw);
                        steps.push(Step {
                            action: a,
                            fault: None,
                            asserts,
                        });
                    }
                    continue;
                }
                _ => {
                    self.err(key, None, ErrorKind::StepActions);
                    continue;
                }
            };
            let fault = if matches!(action, Action::Inspect(_)) && s.fault.is_some() {
                self.err(
                    format!("{key}.fault"),
                    s.fault.as_ref().map(span).unwrap_or_default(),
                    ErrorKind::NoFaultOnInspect,
                );
                None
            } else {
                self.fault(&key, s, &action, &published, raw)
            };
            if let Action::Consume(c) = &action {
                let rendezvous = fault.as_ref().is_some_and(|f| {
                    matches!(f.action, FaultAction::Rendezvous | FaultAction::Stall)
                });
                if c.instances > 1 && !rendezvous {
                    self.err(
                        format!("{key}.consume.instances"),
                        s.consume
                            .as_ref()
                            .and_then(|c| c.instances.as_ref())
                            .and_then(span),
                        ErrorKind::InstancesNeedRendezvous(c.instances),
                    );
                }
            }
            let asserts = self.asserts(&format!("{key}.assert"), &s.assert, raw);
            steps.push(Step {
                action,
                fault,
                asserts,
            });
        }
        // A heal ends a partition of the same node made before it.
        let mut cut = BTreeSet::new();
        for (i, s) in raw.steps.iter().enumerate() {
            let Some(f) = s.fault.as_ref().map(|f| f.get_ref()) else {
                continue;
            };
            if *f.target.get_ref() != Target::Node {
                continue;
            }
            let Some(n) = f.node.as_ref().map(|n| *n.get_ref()) else {
                continue;
            };
            match f.action.get_ref() {
                FaultAction::Partition => {
                    cut.insert(n);
                }
                FaultAction::Heal if !cut.remove(&n) => self.err(
                    format!("step[{i}].fault.node"),
                    f.node.as_ref().and_then(span),
                    ErrorKind::HealWithoutCut(n),
                ),
                _ => {}
            }
        }
        steps
    }

    /// Long because it checks one section of the file key by key, in the
    /// file's order, so that errors come out in that order.
    fn publish(&mut self, key: &str, p: &RawPublish, raw: &RawLab, next_id: &mut usize) -> Publish {
        let mut messages = Vec::new();
        for (j, m) in p.messages.iter().enumerate() {
            let mkey = format!("{key}.publish.messages[{j}]");
            let (fixture, rk, count, expiration_ms) = match m.get_ref() {
                RawMessage::Fixture(f) => (f.clone(), p.routing_key.clone(), None, None),
                RawMessage::Full(RawFullMessage {
                    fixture,
                    routing_key,
                    count,
                    expiration_ms,
                }) => (
                    fixture.clone(),
                    routing_key.clone().or_else(|| p.routing_key.clone()),
                    *count,
                    expiration_ms.map(|n| n.get()),
                ),
            };
            let first = *next_id;
            *next_id += m.get_ref().count();
            let Some(routing_key) = rk else {
                self.err(mkey, span(m), ErrorKind::NoRoutingKey);
                continue;
            };
            for n in first..*next_id {
                let copy = count.map(|_| n - first + 1);
                match load_fixture(self.fixtures, &fixture, n, copy) {
                    Ok((meta, body)) => messages.push(Message {
                        meta,
                        routing_key: routing_key.clone(),
                        fixture: fixture.clone(),
                        body,
                        expiration_ms,
                    }),
                    Err(kind) => {
                        self.err(mkey, span(m), kind);
                        break;
                    }
                }
            }
        }
        let exchange = p
            .exchange
            .as_ref()
            .map(|x| x.get_ref().clone())
            .unwrap_or_default();
        if let Some(x) = &p.exchange {
            if !x.get_ref().is_empty() && !raw.exchanges.iter().any(|d| &d.name == x.get_ref()) {
                self.err(
                    format!("{key}.publish.exchange"),
                    span(x),
                    ErrorKind::UnknownExchange(x.get_ref().clone()),
                );
            }
        }
        let park = p.park.as_ref().map(|q| q.get_ref().clone());
        if let Some(q) = &p.park {
            if !raw.queues.iter().any(|d| d.name.get_ref() == q.get_ref()) {
                self.err(
                    format!("{key}.publish.park"),
                    span(q),
                    ErrorKind::UnknownQueue(q.get_ref().clone()),
                );
            }
            // A return (`mandatory`) or a nack (a full queue that rejects
            // publishes) is parked; the producer sees either in the confirm.
            if !p.confirm {
                self.err(
                    format!("{key}.publish.park"),
                    span(q),
                    ErrorKind::ParkWithoutConfirm,
                );
            } else if !parks_anything(p, &raw.queues) {
                self.err(
                    format!("{key}.publish.park"),
                    span(q),
                    ErrorKind::ParkWithoutMandatory,
                );
            }
        }
        if p.reconcile
            && (p.orders.as_ref().map(|o| *o.get_ref()) != Some(Handoff::Direct) || !p.resend)
        {
            self.err(
                format!("{key}.publish.reconcile"),
                None,
                ErrorKind::ReconcileWithoutOrders,
            );
        }
        if let Some(o) = p.orders.as_ref().filter(|o| o.get_ref().is_outbox()) {
            if p.park.is_some() {
                self.err(
                    format!("{key}.publish.orders"),
                    span(o),
                    ErrorKind::OutboxPark(*o.get_ref()),
                );
            }
        }
        if p.relay && (p.reconcile || !p.orders.as_ref().is_some_and(|o| o.get_ref().is_outbox())) {
            self.err(
                format!("{key}.publish.relay"),
                None,
                ErrorKind::RelayWithoutOutbox,
            );
        }
        Publish {
            exchange,
            messages,
            deadline_secs: p.deadline_secs.get(),
            confirm: p.confirm,
            mandatory: p.mandatory,
            persistent: p.persistent,
            timestamp: p.timestamp,
            park,
            confirm_timeout_ms: p.confirm_timeout_ms.map(|n| n.get()),
            resend: p.resend,
            batch: self.batch(key, p),
            flush: p.flush,
            node: self.node(format!("{key}.publish.node"), &p.node),
            orders: p.orders.as_ref().map(|o| *o.get_ref()),
            reconcile: p.reconcile,
            relay: p.relay,
        }
    }

    /// Long because it checks one section of the file key by key, in the
    /// file's order, so that errors come out in that order.
    fn consume(
        &mut self,
        key: &str,
        c: &RawConsume,
        topology: &Topology,
        missing_ok: Option<&str>,
        published: &[String],
    ) -> Consume {
        let declared = |q: &str| topology.queues.iter().any(|d| d.name == q);
        if !declared(c.queue.get_ref()) {
            self.err(
                format!("{key}.consume.queue"),
                span(&c.queue),
                ErrorKind::UnknownQueue(c.queue.get_ref().clone()),
            );
        }
        let mut tiers = Vec::new();
        if let Some(r) = &c.retry {
            let dlq = r.dlq.get_ref();
            if !declared(dlq) && missing_ok != Some(dlq.as_str()) {
                self.err(
                    format!("{key}.consume.retry.dlq"),
                    span(&r.dlq),
                    ErrorKind::UnknownQueue(dlq.clone()),
                );
            }
            for (j, t) in r.tiers.iter().enumerate() {
                let tkey = format!("{key}.consume.retry.tiers[{j}]");
                let Some(q) = topology.queues.iter().find(|q| &q.name == t.get_ref()) else {
                    self.err(tkey, span(t), ErrorKind::UnknownQueue(t.get_ref().clone()));
                    continue;
                };
                let back = q.arguments.get("x-dead-letter-routing-key")
                    == Some(&ArgValue::Str(c.queue.get_ref().clone()));
                match q.arguments.get("x-message-ttl") {
                    Some(ArgValue::Int(ttl)) if back => tiers.push((q.name.clone(), *ttl as u64)),
                    _ => self.err(
                        tkey,
                        span(t),
                        ErrorKind::NotATier {
                            queue: q.name.clone(),
                            work: c.queue.get_ref().clone(),
                        },
                    ),
                }
            }
        }
        let pattern = c.pattern.as_ref().map_or(Pattern::Inbox, |p| *p.get_ref());
        if let Some(d) = &c.commits_first {
            let instances = c.instances.as_ref().map_or(1, |n| n.get_ref().get());
            if c.command.is_none() || instances > 1 {
                self.err(
                    format!("{key}.consume.commits_first"),
                    span(d),
                    ErrorKind::CommitsFirstOfOne,
                );
            }
        }
        if let Some(cmd) = &c.command {
            let builtin_only = c.pattern.is_some()
                || c.retry.is_some()
                || !c.transient_failures.is_empty()
                || c.max_deliveries.is_some()
                || c.downstream.is_some();
            if builtin_only {
                self.err(
                    format!("{key}.consume.command"),
                    span(cmd),
                    ErrorKind::ProgramHasNoPattern,
                );
            }
            if !self.has_effects {
                self.err(
                    format!("{key}.consume.command"),
                    span(cmd),
                    ErrorKind::NoEffectsQuery,
                );
            }
        }
        let classified =
            c.command.is_none() && matches!(pattern.def().on_failure, OnFailure::Classified { .. });
        if classified && c.retry.as_ref().is_none_or(|r| r.tiers.is_empty()) {
            self.err(
                format!("{key}.consume.retry"),
                span(&c.queue),
                ErrorKind::NoTiers(pattern),
            );
        }
        let in_place = c.command.is_none() && pattern.def().on_failure == OnFailure::RetryInPlace;
        if in_place && c.retry.is_none() {
            self.err(
                format!("{key}.consume.retry"),
                span(&c.queue),
                ErrorKind::NoRetry(pattern),
            );
        }
        if let Some(n) = c
            .instances
            .as_ref()
            .filter(|n| in_place && n.get_ref().get() > 1)
        {
            self.err(
                format!("{key}.consume.instances"),
                span(n),
                ErrorKind::BlockNeedsOneConsumer(pattern),
            );
        }
        let calls = pattern.def().calls_downstream();
        match &c.downstream {
            None if calls && c.command.is_none() => self.err(
                format!("{key}.consume.downstream"),
                span(&c.queue),
                ErrorKind::NoDownstream(pattern),
            ),
            Some(d) if !calls && c.command.is_none() => self.err(
                format!("{key}.consume.downstream"),
                span(d),
                ErrorKind::DownstreamNeverCalled(pattern, Pattern::calling_downstream()),
            ),
            _ => {}
        }
        let lose = c.downstream.iter().flat_map(|d| &d.get_ref().lose_response);
        for m in lose {
            if !published.contains(m) {
                self.err(
                    format!("{key}.consume.downstream.lose_response"),
                    span(c.downstream.as_ref().expect("iterated")),
                    ErrorKind::UnpublishedMessage {
                        message: m.clone(),
                        published: published.join(", "),
                    },
                );
            }
        }
        for m in c.transient_failures.keys() {
            if !published.contains(m) {
                self.err(
                    format!("{key}.consume.transient_failures.{m}"),
                    span(&c.queue),
                    ErrorKind::UnpublishedMessage {
                        message: m.clone(),
                        published: published.join(", "),
                    },
                );
            }
        }
        Consume {
            queue: c.queue.get_ref().clone(),
            service: c.service.clone(),
            pattern,
            command: c.command.as_ref().map(|s| s.get_ref().clone()),
            commits_first: c.commits_first.as_ref().is_some_and(|b| *b.get_ref()),
            prefetch: c.prefetch.get(),
            settle: match c.settle {
                RawSettle::Count(n) => Settle::Count(n.get()),
                RawSettle::Drain => Settle::Drain,
            },
            max_deliveries: c.max_deliveries.map(|n| n.get()),
            retry: c.retry.as_ref().map(|r| Retry {
                max_attempts: r.max_attempts.get(),
                dlq: r.dlq.get_ref().clone(),
                tiers,
            }),
            deadline_secs: c.deadline_secs.get(),
            transient_failures: c
                .transient_failures
                .iter()
                .map(|(m, n)| (m.clone(), n.get()))
                .collect(),
            node: self.node(format!("{key}.consume.node"), &c.node),
            instances: c.instances.as_ref().map_or(1, |n| n.get_ref().get()),
            downstream: c.downstream.as_ref().map(|d| Downstream {
                timeout_ms: d.get_ref().timeout_ms.get(),
                lose_response: d.get_ref().lose_response.clone(),
            }),
        }
    }

    /// A fault on a publish or consume step: which targets and actions fit
    /// which step, which windows each passes, which message it names.
    /// Long because it checks one section of the file key by key, in the
    /// file's order, so that errors come out in that order.
    fn fault(
        &mut self,
        key: &str,
        s: &RawStep,
        action: &Action,
        published: &[String],
        raw: &RawLab,
    ) -> Option<Fault> {
        let spanned = s.fault.as_ref()?;
        let fkey = format!("{key}.fault");
        let f = spanned.get_ref();
        let (target, act) = (*f.target.get_ref(), *f.action.get_ref());
        // The step a target's action belongs on, and the windows it can use
        // there: the placement registry's, nowhere else.
        let site = match action {
            Action::Publish(_) => Some(Site::Publish),
            Action::Consume(_) => Some(Site::Consume),
            _ => None,
        };
        let placement = site.and_then(|site| placement_of(target, act, site));
        if let (Some(p), Action::Consume(c)) = (placement, action) {
            if !c.admits(p) {
                self.err(
                    format!("{fkey}.action"),
                    span(&f.action),
                    ErrorKind::BuiltInConsumerOnly {
                        target,
                        action: act,
                    },
                );
                return None;
            }
        }
        let Some(placement) = placement else {
            self.err(
                format!("{fkey}.action"),
                span(&f.action),
                ErrorKind::FaultPlacement {
                    target,
                    action: act,
                },
            );
            return None;
        };
        let windows: Vec<Window> = match action {
            Action::Consume(c) => c.windows_of(placement),
            Action::Publish(p) => p.windows_of(placement),
            // A publish-step placement always lists its windows.
            _ => Vec::new(),
        };
        let (Some(window), Some(message)) = (&f.window, &f.message) else {
            self.err(
                fkey,
                span(spanned),
                ErrorKind::FaultNeedsWindowAndMessage(target),
            );
            return None;
        };
        let window_value = *window.get_ref();
        if let (Action::Publish(p), Target::Network, FaultAction::Cut) = (action, target, act) {
            if p.orders.is_some() && !p.confirm {
                self.err(
                    format!("{fkey}.action"),
                    span(&f.action),
                    ErrorKind::CutWithoutConfirm,
                );
                return None;
            }
        }
        if !windows.contains(&window_value) {
            let passes = windows
                .iter()
                .map(|w| w.name())
                .collect::<Vec<_>>()
                .join(", ");
            let kind = match action {
                Action::Consume(c) if target == Target::Consumer && c.command.is_none() => {
                    ErrorKind::WindowNotReached {
                        pattern: c.pattern,
                        window: window_value,
                        passes,
                    }
                }
                _ => ErrorKind::WindowNotPassed {
                    target,
                    action: act,
                    window: window_value,
                    passes,
                },
            };
            self.err(format!("{fkey}.window"), span(window), kind);
        }
        // A publish step's fault names one of its own messages; a consume
        // step's, one published before it.
        let candidates: Vec<String> = match action {
            Action::Publish(p) => p
                .messages
                .iter()
                .map(|m| m.meta.message_id.clone())
                .collect(),
            _ => published.to_vec(),
        };
        if !candidates.contains(message.get_ref()) {
            let kind = match action {
                Action::Publish(_) => ErrorKind::MessageNotInStep {
                    message: message.get_ref().clone(),
                    published: candidates.join(", "),
                },
                _ => ErrorKind::UnpublishedMessage {
                    message: message.get_ref().clone(),
                    published: candidates.join(", "),
                },
            };
            self.err(format!("{fkey}.message"), span(message), kind);
        }
        let follows = placement.then;
        let then = match &f.then {
            Some(t) if *t.get_ref() != follows => {
                self.err(
                    format!("{fkey}.then"),
                    span(t),
                    ErrorKind::WrongThen {
                        target,
                        action: act,
                        then: *t.get_ref(),
                        follows,
                    },
                );
                follows
            }
            _ => follows,
        };
        // A held confirm needs a producer that gives up on it (the node
        // kill's own confirm rule is checked with its node, below).
        match action {
            Action::Publish(p) if placement.needs_confirm_timeout && !p.confirm_fits(placement) => {
                self.err(
                    fkey.clone(),
                    span(spanned),
                    ErrorKind::HoldNeedsConfirmTimeout {
                        target,
                        action: act,
                    },
                );
            }
            _ => {}
        }
        if f.kill_at_depth.is_some() && target != Target::Consumer {
            self.err(
                format!("{fkey}.kill_at_depth"),
                span(spanned),
                ErrorKind::ConsumerOnly("kill_at_depth"),
            );
        }
        if f.restart_settle.is_some() && target != Target::Consumer {
            self.err(
                format!("{fkey}.restart_settle"),
                span(spanned),
                ErrorKind::ConsumerOnly("restart_settle"),
            );
        }
        let node = match (&f.node, target) {
            (None, Target::Node) => {
                self.err(fkey.clone(), span(spanned), ErrorKind::NodeMissing);
                None
            }
            (Some(n), Target::Node) => {
                if self.nodes < 3 {
                    self.err(
                        format!("{fkey}.target"),
                        span(&f.target),
                        ErrorKind::NodeFaultOneNode,
                    );
                }
                let node = self.node(format!("{fkey}.node"), &f.node);
                // The kill must break the producer's own connection, and the
                // confirm the harness holds must exist and not time out.
                if let Action::Publish(p) = action {
                    if p.node != node {
                        self.err(
                            format!("{fkey}.node"),
                            span(n),
                            ErrorKind::NodeKillNotProducers {
                                node,
                                producer: p.node,
                            },
                        );
                    }
                    if !p.confirm_fits(placement) {
                        self.err(fkey.clone(), span(spanned), ErrorKind::NodeKillNeedsConfirm);
                    }
                }
                Some(node)
            }
            (Some(n), _) => {
                self.err(
                    format!("{fkey}.node"),
                    span(n),
                    ErrorKind::NodeNotForTarget(target),
                );
                None
            }
            (None, _) => None,
        };
        let program = matches!(action, Action::Consume(c) if c.command.is_some());
        let commit = match &f.commit {
            None => 1,
            Some(k) if *k.get_ref() >= 1 && program && window_value == Window::BeforeCommit => {
                *k.get_ref()
            }
            Some(k) => {
                self.err(format!("{fkey}.commit"), span(k), ErrorKind::CommitOrdinal);
                1
            }
        };
        let copies = match action {
            Action::Consume(c) if act == FaultAction::Rendezvous => {
                self.rendezvous(&fkey, spanned, c, message)
            }
            Action::Consume(c) if act == FaultAction::Stall => {
                if (c.instances, c.prefetch, c.settle) != (2, 1, Settle::Drain) {
                    self.err(fkey.clone(), span(spanned), ErrorKind::StallInstances);
                }
                if !matches!(window_value, Window::AfterReceive | Window::BeforeCommit) {
                    self.err(
                        format!("{fkey}.window"),
                        span(spanned),
                        ErrorKind::StallWindow,
                    );
                }
                vec![message.get_ref().clone()]
            }
            _ => Vec::new(),
        };
        let asserts = self.asserts(&format!("{fkey}.assert"), &f.assert, raw);
        let at_kill = asserts
            .iter()
            .map(|a| a.counter.counter)
            .find(|c| c.at_kill());
        let built_in = matches!(action, Action::Consume(c) if c.command.is_none());
        if let Some(c) =
            at_kill.filter(|_| (target, act) != (Target::Consumer, FaultAction::Kill) || !built_in)
        {
            self.err(
                format!("{fkey}.assert"),
                span(spanned),
                ErrorKind::AtKillPlace(c),
            );
        }
        Some(Fault {
            node,
            target,
            action: act,
            window: window_value,
            commit,
            message: message.get_ref().clone(),
            then,
            kill_at_depth: f.kill_at_depth,
            restart_settle: f.restart_settle,
            restart_drain: false,
            copies,
            asserts,
        })
    }

    /// A rendezvous's own rules: instances to hold, one message at a time
    /// each, and a copy of the event for every instance. The copies, in
    /// publish order from the named message on.
    fn rendezvous(
        &mut self,
        fkey: &str,
        spanned: &Spanned<RawFault>,
        c: &Consume,
        message: &Spanned<String>,
    ) -> Vec<String> {
        if c.instances < 2 {
            self.err(
                fkey.to_string(),
                span(spanned),
                ErrorKind::RendezvousNeedsInstances,
            );
            return Vec::new();
        }
        if c.prefetch != 1 {
            self.err(
                fkey.to_string(),
                span(spanned),
                ErrorKind::RendezvousPrefetch,
            );
        }
        let Some(event) = self
            .events
            .iter()
            .find(|(m, _)| m == message.get_ref())
            .map(|(_, e)| e.clone())
        else {
            // Not published: said once, by the message check.
            return Vec::new();
        };
        let copies: Vec<String> = self
            .events
            .iter()
            .skip_while(|(m, _)| m != message.get_ref())
            .filter(|(_, e)| *e == event)
            .map(|(m, _)| m.clone())
            .collect();
        if copies.len() < c.instances {
            self.err(
                format!("{fkey}.message"),
                span(message),
                ErrorKind::RendezvousCopies {
                    message: message.get_ref().clone(),
                    instances: c.instances,
                    copies: copies.len(),
                    found: copies.join(", "),
                },
            );
        }
        copies.into_iter().take(c.instances).collect()
    }

    /// A fault step of its own: a cluster node's, between two steps.
    fn node_step(&mut self, key: &str, spanned: &Spanned<RawFault>) -> Option<Action> {
        let f = spanned.get_ref();
        let fkey = format!("{key}.fault");
        let act = *f.action.get_ref();
        if placement_of(Target::Node, act, Site::Between).is_none() {
            let known = placements_of(Target::Node)
                .filter(|p| p.site == Site::Between)
                .map(|p| p.action.name())
                .collect::<Vec<_>>()
                .join(", ");
            self.err(
                format!("{fkey}.action"),
                span(&f.action),
                ErrorKind::NodeAction { action: act, known },
            );
        }
        if self.nodes < 3 {
            self.err(
                format!("{fkey}.target"),
                span(&f.target),
                ErrorKind::NodeFaultOneNode,
            );
        }
        let whole = span(spanned);
        let extra = [
            f.window.as_ref().map(|w| ("window", span(w))),
            f.commit.as_ref().map(|k| ("commit", span(k))),
            f.message.as_ref().map(|m| ("message", span(m))),
            f.then.as_ref().map(|t| ("then", span(t))),
            f.kill_at_depth.map(|_| ("kill_at_depth", whole.clone())),
            f.restart_settle.map(|_| ("restart_settle", whole.clone())),
            f.assert.first().map(|a| ("assert", span(a))),
        ];
        for (k, sp) in extra.into_iter().flatten() {
            self.err(format!("{fkey}.{k}"), sp, ErrorKind::NodeHasNoWindow);
        }
        let node = match &f.node {
            None => {
                self.err(fkey, span(spanned), ErrorKind::NodeMissing);
                return None;
            }
            Some(_) => self.node(format!("{fkey}.node"), &f.node),
        };
        Some(Action::Node { node, action: act })
    }

    /// A fault step of its own: only the broker (or a cluster node) acts
    /// between steps.
    fn broker_step(&mut self, key: &str, spanned: &Spanned<RawFault>) -> Option<Action> {
        let f = spanned.get_ref();
        let fkey = format!("{key}.fault");
        let (target, act) = (*f.target.get_ref(), *f.action.get_ref());
        if target == Target::Node {
            return self.node_step(key, spanned);
        }
        if let Some(n) = &f.node {
            self.err(
                format!("{fkey}.node"),
                span(n),
                ErrorKind::NodeNotForTarget(target),
            );
        }
        let Some(placement) = placement_of(target, act, Site::Between) else {
            let kind = if placements_of(target).any(|p| p.site == Site::Between) {
                ErrorKind::FaultPlacement {
                    target,
                    action: act,
                }
            } else {
                ErrorKind::NotBetweenSteps(target)
            };
            self.err(format!("{fkey}.target"), span(&f.target), kind);
            return None;
        };
        if let Some(w) = &f.window {
            self.err(
                format!("{fkey}.window"),
                span(w),
                ErrorKind::BrokerHasNoWindow,
            );
        }
        if let Some(m) = &f.message {
            self.err(
                format!("{fkey}.message"),
                span(m),
                ErrorKind::BrokerHasNoWindow,
            );
        }
        if let Some(t) = &f.then {
            if *t.get_ref() != placement.then {
                self.err(
                    format!("{fkey}.then"),
                    span(t),
                    ErrorKind::WrongThen {
                        target,
                        action: act,
                        then: *t.get_ref(),
                        follows: placement.then,
                    },
                );
            }
        }
        Some(Action::Broker(act))
    }

    fn asserts(&mut self, key: &str, names: &[Spanned<String>], raw: &RawLab) -> Vec<Assertion> {
        let mut out = Vec::new();
        for (j, n) in names.iter().enumerate() {
            let name = n.get_ref();
            let akey = format!("{key}[{j}]");
            let counter = match raw.counters.get(name) {
                Some(c) => c.get_ref().clone(),
                None => match name.parse::<CounterRef>() {
                    Ok(c) => c,
                    Err(why) => {
                        self.err(
                            akey,
                            span(n),
                            ErrorKind::Counter {
                                name: name.clone(),
                                why,
                            },
                        );
                        continue;
                    }
                },
            };
            let Some(expected) = raw.expect.get(name) else {
                self.err(akey, span(n), ErrorKind::NoExpectedValue(name.clone()));
                continue;
            };
            if let Some(kind) = misfit(name, counter.counter.shape(), expected.get_ref(), false) {
                self.err(format!("expect.{name}"), span(expected), kind);
            }
            if let Some(q) = counter
                .arg
                .as_ref()
                .filter(|_| counter.counter == Counter::OldestAgeShownAtKill)
                .filter(|q| lazy_queue(raw, q))
            {
                self.err(akey.clone(), span(n), ErrorKind::AgeOfLazyQueue(q.clone()));
            }
            // Read at the kill only: a step's assertion would find nothing.
            if counter.counter.at_kill() && !key.ends_with(".fault.assert") {
                self.err(
                    akey.clone(),
                    span(n),
                    ErrorKind::AtKillPlace(counter.counter),
                );
            }
            if let Some(q) = counter
                .arg
                .as_ref()
                .filter(|_| counter.counter.reads_queue_process())
                .filter(|q| quorum_queue(raw, q))
            {
                self.err(
                    akey.clone(),
                    span(n),
                    ErrorKind::ProcessOfQuorum(counter.counter, q.clone()),
                );
            }
            out.push(Assertion {
                name: name.clone(),
                counter,
                expected: expected.get_ref().expect(),
            });
        }
        out
    }

    /// Aliases and expected values must each be used: an unused one is a typo.
    fn counters(&mut self, raw: &RawLab, steps: &[Step]) {
        for (name, c) in &raw.counters {
            if !raw.expect.contains_key(name) {
                self.err(
                    format!("counters.{name}"),
                    span(c),
                    ErrorKind::UnusedAlias(name.clone()),
                );
            }
        }
        let asserted = asserted(steps);
        for (name, v) in &raw.expect {
            if !asserted.contains(name.as_str()) {
                self.err(
                    format!("expect.{name}"),
                    span(v),
                    ErrorKind::ExpectedNeverAsserted(name.clone()),
                );
            }
        }
    }

    /// A variant's violations, and what it shows instead on another
    /// generation.
    fn variant(
        &mut self,
        name: &str,
        v: &RawVariant,
        steps: &[Step],
    ) -> (
        BTreeMap<String, Expect>,
        BTreeMap<Generation, GenerationDiff>,
    ) {
        let key = format!("variant.{name}");
        let violations = self.violations(&key, &v.violations, steps);
        let mut generations = BTreeMap::new();
        for (g, diff) in &v.rabbitmq {
            let at = format!("{key}.rabbitmq.{g}");
            let generation = match g.parse::<Generation>() {
                Ok(Generation::V3_10) => {
                    self.err(
                        at.clone(),
                        None,
                        ErrorKind::BaseGeneration(Generation::V3_10),
                    );
                    continue;
                }
                Ok(generation) => generation,
                Err(_) => {
                    self.err(at.clone(), None, ErrorKind::UnknownGeneration(g.clone()));
                    continue;
                }
            };
            if diff.cause.trim().is_empty() {
                self.err(format!("{at}.cause"), None, ErrorKind::NoCause);
            }
            let source = diff.source.get_ref().trim();
            if !(source.starts_with("https://") || source == "cause not identified") {
                self.err(
                    format!("{at}.source"),
                    span(&diff.source),
                    ErrorKind::NoSource,
                );
            }
            let violations = self.violations(&at, &diff.violations, steps);
            generations.insert(
                generation,
                GenerationDiff {
                    claim: diff.claim.clone(),
                    cause: diff.cause.clone(),
                    source: source.to_string(),
                    violations,
                },
            );
        }
        if let Some(o) = &v.orders {
            let serves = steps
                .iter()
                .any(|s| matches!(&s.action, Action::Publish(p) if p.orders.is_some()));
            if !serves {
                self.err(
                    format!("{key}.orders"),
                    span(o),
                    ErrorKind::OrdersWithoutOrderService,
                );
            } else if *o.get_ref() == Handoff::Outbox {
                self.err(
                    format!("{key}.orders"),
                    span(o),
                    ErrorKind::SafeHandoffInVariant,
                );
            }
        }
        if let Some(p) = &v.pattern {
            if p.get_ref().def().safe {
                self.err(
                    format!("{key}.pattern"),
                    span(p),
                    ErrorKind::SafePatternInVariant(*p.get_ref()),
                );
            }
        }
        (violations, generations)
    }

    /// `violations` under `key`: at least one, each an assertion or a check.
    fn violations(
        &mut self,
        key: &str,
        declared: &BTreeMap<String, Spanned<Expected>>,
        steps: &[Step],
    ) -> BTreeMap<String, Expect> {
        if declared.is_empty() {
            self.err(format!("{key}.violations"), None, ErrorKind::NoViolations);
        }
        let asserted = asserted(steps);
        let shapes = shapes(steps);
        let mut violations = BTreeMap::new();
        for (k, val) in declared {
            let is_check = k.parse::<Check>().is_ok();
            // A check is a count, always read; an assertion may print the
            // word of a value not read.
            let shape = match is_check {
                true => Some((Shape::Count(&[]), false)),
                false => shapes.get(k.as_str()).map(|s| (*s, true)),
            };
            if let Some(kind) = shape.and_then(|(s, unread)| misfit(k, s, val.get_ref(), unread)) {
                self.err(format!("{key}.violations.{k}"), span(val), kind);
            }
            if !asserted.contains(k.as_str()) && !is_check {
                self.err(
                    format!("{key}.violations.{k}"),
                    span(val),
                    ErrorKind::NotAnAssertion(k.clone()),
                );
            }
            violations.insert(k.clone(), val.get_ref().expect());
        }
        violations
    }
}

/// How many actions a step names (a fault counts: a step of its own kind
/// takes none).
fn actions(s: &RawStep) -> usize {
    [
        s.publish.is_some(),
        s.consume.is_some(),
        s.inspect.is_some(),
        s.declare.is_some(),
        s.await_depth.is_some(),
        s.purge_inbox.is_some(),
        s.policy.is_some(),
        s.fault.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count()
}

/// A queue declared with `x-queue-type = "quorum"`.
fn is_quorum(q: &RawQueue) -> bool {
    q.arguments
        .get("x-queue-type")
        .is_some_and(|v| v.get_ref() == &ArgValue::Str("quorum".into()))
}

/// Whether the lab declares `name` as a quorum queue.
fn quorum_queue(raw: &RawLab, name: &str) -> bool {
    raw.queues
        .iter()
        .any(|q| q.name.get_ref() == name && is_quorum(q))
}

/// Whether the lab's queue `name` sets `x-queue-mode` (lazy on 3.x: its
/// messages kept on disk; ignored by 4.0).
fn lazy_queue(raw: &RawLab, name: &str) -> bool {
    raw.queues
        .iter()
        .any(|q| q.name.get_ref() == name && q.arguments.contains_key("x-queue-mode"))
}

/// What each assertion's counter prints, by the assertion's name.
fn shapes(steps: &[Step]) -> BTreeMap<&str, Shape> {
    assertions(steps)
        .map(|a| (a.name.as_str(), a.counter.counter.shape()))
        .collect()
}

fn yes_or_no(e: &Expected) -> bool {
    matches!(e, Expected::Str(s) if s == "yes" || s == "no")
}

/// Why `e` is no expectation a counter of `shape` can meet (None: it is);
/// `unread`: the word of a value not read is one too (a variant's
/// violation, which declares what the run printed).
fn misfit(name: &str, shape: Shape, e: &Expected, unread: bool) -> Option<ErrorKind> {
    match shape {
        Shape::YesNo => {
            let unread_word = unread && matches!(e, Expected::Str(s) if s == NOT_READ);
            (!yes_or_no(e) && !unread_word).then(|| ErrorKind::YesOrNo(name.to_string()))
        }
        Shape::Count(_) if matches!(e, Expected::Bound { min, max: None } if min.is_none_or(|m| m <= 0)) => {
            Some(ErrorKind::BoundCannotFail(name.to_string()))
        }
        Shape::Count(words) => {
            let word = |s: &str| words.contains(&s) || unread && s == NOT_READ;
            let fits = match e {
                Expected::Int(_) | Expected::Bound { .. } => true,
                Expected::Str(s) => word(s),
                Expected::Bool(_) => false,
            };
            let mut named: Vec<String> = words.iter().map(|w| format!("`{w}`")).collect();
            if unread {
                named.push(format!("`{NOT_READ}` (not read)"));
            }
            let words = match named.is_empty() {
                true => String::new(),
                false => format!(", or {}", named.join(", ")),
            };
            (!fits).then(|| ErrorKind::NotACount {
                name: name.to_string(),
                words,
            })
        }
        Shape::Text => {
            matches!(e, Expected::Bound { .. }).then(|| ErrorKind::BoundOfText(name.to_string()))
        }
    }
}

fn asserted(steps: &[Step]) -> BTreeSet<&str> {
    assertions(steps).map(|a| a.name.as_str()).collect()
}

/// Every assertion of the steps, their faults' included.
fn assertions(steps: &[Step]) -> impl Iterator<Item = &super::Assertion> {
    steps.iter().flat_map(|s| {
        s.asserts
            .iter()
            .chain(s.fault.iter().flat_map(|f| f.asserts.iter()))
    })
}

/// Applies a variant's overrides to every step and queue.
fn apply_variant(mut raw: RawLab, v: &RawVariant) -> RawLab {
    for step in &mut raw.steps {
        if let Some(c) = &mut step.consume {
            vary_consume(c, v);
        }
        if let Some(p) = &mut step.publish {
            vary_publish(p, v);
        }
        if let (Some(p), Some(r)) = (&mut step.purge_inbox, v.retention_ms) {
            p.retention_ms = r;
        }
        if let Some(f) = &mut step.fault {
            let (span, mut inner) = (f.span(), f.get_ref().clone());
            if let Some(w) = &v.window {
                inner.window = Some(w.clone());
            }
            if let Some(k) = &v.commit {
                inner.commit = Some(k.clone());
            }
            if v.kill_at_depth.is_some() {
                inner.kill_at_depth = v.kill_at_depth;
            }
            if v.restart_settle.is_some() {
                inner.restart_settle = v.restart_settle;
            }
            *f = Spanned::new(span, inner);
        }
    }
    if v.policy == Some(false) {
        raw.steps.retain(|s| s.policy.is_none());
    }
    if v.reconcile == Some(false) {
        raw.steps
            .retain(|s| !s.publish.as_ref().is_some_and(|p| p.reconcile));
    }
    if v.relay == Some(false) {
        raw.steps
            .retain(|s| !s.publish.as_ref().is_some_and(|p| p.relay));
    }
    vary_queues(&mut raw.queues, v);
    // A variant that takes away what a parking queue is for (confirms,
    // `mandatory`, the queue's reject-publish) takes the parking with it.
    let queues = raw.queues.clone();
    for p in raw.steps.iter_mut().filter_map(|s| s.publish.as_mut()) {
        if !p.confirm || !parks_anything(p, &queues) {
            p.park = None;
        }
    }
    raw.claim = v.claim.clone();
    raw
}

/// Whether a publish can be returned (`mandatory`) or nacked (a queue of
/// the lab rejects publishes when full): what a parking queue takes.
fn parks_anything(p: &RawPublish, queues: &[RawQueue]) -> bool {
    p.mandatory
        || queues.iter().any(|q| {
            q.arguments.get("x-overflow").is_some_and(
                |v| matches!(v.get_ref(), ArgValue::Str(s) if s.starts_with("reject-publish")),
            )
        })
}

fn vary_consume(c: &mut RawConsume, v: &RawVariant) {
    if let Some(p) = &v.pattern {
        c.pattern = Some(p.clone());
    }
    if let (Some(cmd), true) = (&v.command, c.command.is_some()) {
        c.command = Some(cmd.clone());
        // A declaration is of the program it was written for.
        c.commits_first = v.commits_first.clone();
    }
    if let Some(n) = v.settle {
        c.settle = RawSettle::Count(n);
    }
    if let Some(n) = v.prefetch {
        c.prefetch = n;
    }
    if v.max_deliveries.is_some() {
        c.max_deliveries = v.max_deliveries;
    }
    if let (Some(r), Some(dlq)) = (&mut c.retry, &v.dlq) {
        r.dlq = dlq.clone();
    }
}

fn vary_publish(p: &mut RawPublish, v: &RawVariant) {
    if let Some(x) = v.persistent {
        p.persistent = x;
    }
    if let Some(x) = v.confirm {
        p.confirm = x;
    }
    if let Some(x) = v.mandatory {
        p.mandatory = x;
    }
    if let Some(x) = v.resend {
        p.resend = x;
    }
    if let Some(x) = v.timestamp {
        p.timestamp = x;
    }
    // Only a batching step has a batch to send at close.
    if let (Some(x), true) = (v.flush, p.batch.is_some()) {
        p.flush = x;
    }
    if let (Some(x), true) = (&v.orders, p.orders.is_some() && !p.reconcile) {
        p.orders = Some(x.clone());
    }
    if v.park == Some(false) {
        p.park = None;
    }
}

/// Durability, arguments, bindings, and the classic variant of a quorum queue.
fn vary_queues(queues: &mut [RawQueue], v: &RawVariant) {
    if let Some(d) = v.durable {
        for q in queues.iter_mut() {
            q.durable = d;
        }
    }
    for q in queues.iter_mut() {
        if let Some(args) = v.arguments.get(q.name.get_ref()) {
            q.arguments.extend(args.clone());
        }
        if let Some(bind) = v.bind.get(q.name.get_ref()) {
            q.bind = bind.clone();
        }
        for a in v.unset.get(q.name.get_ref()).into_iter().flatten() {
            q.arguments.remove(a);
        }
    }
    if v.classic == Some(true) {
        for q in queues.iter_mut() {
            let quorum = q
                .arguments
                .get("x-queue-type")
                .is_some_and(|t| t.get_ref() == &ArgValue::Str("quorum".into()));
            if quorum {
                for k in [
                    "x-queue-type",
                    "x-dead-letter-strategy",
                    "x-delivery-limit",
                    "x-quorum-initial-group-size",
                ] {
                    q.arguments.remove(k);
                }
            }
        }
    }
}

/// Reads `fixtures/<name>.json`. The envelope fields the transcript shows must
/// be present; business fields may be missing on purpose (poison messages).
/// `copy` (k of a `count`) makes the k-th event of a series: `-k` appended
/// to its eventId and orderId.
fn load_fixture(
    dir: &Path,
    name: &str,
    n: usize,
    copy: Option<usize>,
) -> Result<(MessageMeta, String), ErrorKind> {
    let path = dir.join(format!("{name}.json"));
    let fail = |why: String| ErrorKind::Fixture {
        file: path.display().to_string(),
        why,
    };
    let body = std::fs::read_to_string(&path).map_err(|e| fail(e.to_string()))?;
    let mut v: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| fail(format!("not JSON: {e}")))?;
    let body = match copy {
        None => body,
        Some(k) => {
            for f in ["eventId", "orderId"] {
                let Some(x) = v.get_mut(f).and_then(|x| x.as_str().map(str::to_string)) else {
                    return Err(fail(format!("missing string field `{f}`")));
                };
                v[f] = serde_json::Value::String(format!("{x}-{k}"));
            }
            v.to_string()
        }
    };
    let field = |k: &str| -> Result<String, ErrorKind> {
        v.get(k)
            .and_then(|x| x.as_str())
            .map(str::to_string)
            .ok_or_else(|| fail(format!("missing string field `{k}`")))
    };
    let aggregate = field("orderId")?;
    field("eventId")?;
    Ok((
        MessageMeta {
            message_id: format!("mid-{n}"),
            event_type: field("eventType")?,
            schema_version: v
                .get("schemaVersion")
                .map(|s| s.to_string().trim_matches('"').to_string())
                .unwrap_or_else(|| "1".into()),
            trace_id: format!("trace-{n}"),
            correlation_id: aggregate.clone(),
            aggregate_id: aggregate,
        },
        body,
    ))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use crate::lab::Action;
    use crate::vocab::Then;

    fn fixtures() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
    }

    const BASE: &str = r#"
name = "t"
claim = "c"

[[queue]]
name = "q"

[[step]]
publish = { routing_key = "q", messages = ["order-1001", "order-1002"] }

[[step]]
consume = { queue = "q", settle = 2 }
fault = { target = "consumer", action = "kill", window = "after-commit-before-ack", message = "mid-1", then = "restart", assert = ["crashExitCode"] }
assert = ["rows"]

[counters]
rows = "businessRows"

[expect]
crashExitCode = 137
rows = 2

[variant.v]
claim = "v"
pattern = "no-inbox"
violations = { rows = 3 }
"#;

    /// A count expects an integer, a bound or a word it prints; a
    /// variant's violation may also declare a bound, or `unknown` for an
    /// assertion it could not read.
    #[test]
    fn typed_expectations_load() {
        for (from, to, variant) in [
            ("rows = 2\n", "rows = { min = 1 }\n", None),
            ("rows = 2\n", "rows = { min = 1, max = 2 }\n", None),
            (
                "violations = { rows = 3 }",
                "violations = { rows = { min = 3 }, lost = { max = 1 } }",
                Some("v"),
            ),
            (
                "violations = { rows = 3 }",
                "violations = { rows = \"unknown\" }",
                Some("v"),
            ),
        ] {
            let text = BASE.replacen(from, to, 1);
            assert_ne!(text, BASE, "{from}");
            let lab = super::super::from_str(&text, "t", &fixtures(), variant);
            assert!(lab.is_ok(), "{to}: {:?}", lab.err().map(|e| e.to_string()));
        }
        let lab = super::super::from_str(
            &BASE.replacen("rows = 2\n", "rows = { min = 1 }\n", 1),
            "t",
            &fixtures(),
            None,
        )
        .unwrap();
        let rows = lab.steps[1]
            .asserts
            .iter()
            .find(|a| a.name == "rows")
            .unwrap();
        assert_eq!(
            rows.expected,
            crate::expect::Expect::Within {
                min: Some(1),
                max: None
            }
        );
    }

    /// Every lab-file error, from a small edit of a valid lab: the edit, the
    /// variant to load, and the one line it must produce.
    #[test]
    fn every_error_message_from_a_snippet() {
        let cases: &[(&str, &str, Option<&str>, &str)] = &[
            (r#"name = "t""#, r#"name = "u""#, None, "t.toml:2:8: name: `name` is `u` but the file is `t.toml`"),
            (
                r#"name = "t""#,
                "name = \"t\"\nbroker = \"kafka\"",
                None,
                "broker: unknown broker `kafka` (known: rabbitmq)",
            ),
            (
                "rows = 2\n",
                "rows = \"two\"\n",
                None,
                "t.toml:21:8: expect.rows: `rows` is a count: an integer or a bound (`{ min = 1 }`, `{ max = 3 }`)",
            ),
            (
                "rows = 2\n",
                "rows = \"unknown\"\n",
                None,
                "expect.rows: `rows` is a count: an integer or a bound",
            ),
            (
                "violations = { rows = 3 }",
                "violations = { rows = true }",
                Some("v"),
                "variant.v.violations.rows: `rows` is a count: an integer or a bound (`{ min = 1 }`, `{ max = 3 }`), or `unknown` (not read)",
            ),
            (
                "violations = { rows = 3 }",
                "violations = { rows = 3, lost = \"unknown\" }",
                Some("v"),
                "variant.v.violations.lost: `lost` is a count: an integer or a bound (`{ min = 1 }`, `{ max = 3 }`)",
            ),
            (
                "rows = \"businessRows\"\n\n[expect]\ncrashExitCode = 137\nrows = 2\n",
                "rows = \"attempts:mid-1\"\n\n[expect]\ncrashExitCode = 137\nrows = { min = 1 }\n",
                None,
                "expect.rows: `rows` prints a text (a list, a name): a bound cannot hold",
            ),
            ("rows = 2\n", "rows = { min = 3, max = 1 }\n", None, "a bound whose `min` (3) is above its `max` (1)"),
            ("rows = 2\n", "rows = {}\n", None, "a bound names `min`, `max` or both"),
            (
                "rows = 2\n",
                "rows = { min = 0 }\n",
                None,
                "expect.rows: `rows`: a bound with no `max` and a `min` of 0 or less holds for every count: it cannot fail",
            ),
            (
                r#"window = "after-commit-before-ack""#,
                r#"window = "after-lunch""#,
                None,
                "t.toml:13:58: step[1].fault.window: unknown fault window `after-lunch` (known: after-receive,",
            ),
            (
                r#"messages = ["order-1001", "order-1002"] }"#,
                r#"messages = ["order-1001", "order-1002"], batch = 1 }"#,
                None,
                "step[0].publish.batch: a batch holds at least 2 messages",
            ),
            (
                r#"messages = ["order-1001", "order-1002"] }"#,
                "messages = [\"order-1001\", \"order-1002\"], batch = 10 }\nfault = { target = \"producer\", action = \"kill\", window = \"after-confirm\", message = \"mid-1\", then = \"restart\" }",
                None,
                "step[0].fault: a batching producer keeps no journal across a restart",
            ),
            (
                r#"consume = { queue = "q", settle = 2 }"#,
                r#"consume = { queue = "q", settle = 2, commits_first = true }"#,
                None,
                "step[1].consume.commits_first: `commits_first` declares the order of one program",
            ),
            (
                "[variant.v]",
                "[variant.v]\nflush = false",
                Some("v"),
                "variant.v.flush: no publish step of this lab sets `batch`",
            ),
            (
                r#"messages = ["order-1001", "order-1002"] }"#,
                r#"messages = ["order-1001", "order-1002"], flush = false }"#,
                None,
                "step[0].publish.flush: `flush = false` is for a batching producer: set `batch` too",
            ),
            (
                r#"settle = 2 }"#,
                r#"settle = 0 }"#,
                None,
                "step[1].consume.settle: `0`: settle is a positive number of messages, or \"drain\"",
            ),
            (
                r#"consume = { queue = "q""#,
                r#"consume = { queue = "r""#,
                None,
                "t.toml:12:21: step[1].consume.queue: no queue `r` is declared (hint: declare it in a [[queue]] table)",
            ),
            (
                r#"message = "mid-1""#,
                r#"message = "mid-9""#,
                None,
                "step[1].fault.message: `mid-9` is not published before this step (published: mid-1, mid-2)",
            ),
            (
                r#""order-1002"]"#,
                r#""order-9999"]"#,
                None,
                "step[0].publish.messages[1]: fixture `",
            ),
            (
                r#"routing_key = "q", "#,
                "",
                None,
                "t.toml:9:25: step[0].publish.messages[0]: no `routing_key` (set it on the message or the step)",
            ),
            (
                "rows = 2\n",
                "rows = { at_least = 2 }\n",
                None,
                "expect.rows: unknown key `at_least` in a bound: `min`, `max`",
            ),
            (
                "rows = 2\n",
                "rows = 2.5\n",
                None,
                "expect.rows: invalid type: floating point `2.5`, expected an integer, `true`/`false`, a string (what the assertion prints) or a bound",
            ),
            (
                r#"assert = ["rows"]"#,
                r#"assert = ["rows", "nope"]"#,
                None,
                "step[1].assert[1]: `nope`: unknown counter `nope` (known: confirmed,",
            ),
            (
                r#"assert = ["rows"]"#,
                r#"assert = ["rows", "confirmed"]"#,
                None,
                "step[1].assert[1]: `confirmed` has no expected value in [expect] (hint: add `confirmed = <value>` under [expect])",
            ),
            (r#"rows = 2"#, "rows = 2\nlost = 0", None, "expect.lost: `lost` is never asserted by a step"),
            (
                r#"rows = "businessRows""#,
                "rows = \"businessRows\"\nother = \"unique\"",
                None,
                "counters.other: alias `other` is never asserted (no [expect] value)",
            ),
            (
                r#"window = "after-commit-before-ack""#,
                r#"window = "after-inbox-commit""#,
                None,
                "step[1].fault.window: pattern `inbox` never reaches window `after-inbox-commit` (it passes: after-receive, before-commit, after-commit-before-ack, after-ack)",
            ),
            (
                r#"pattern = "no-inbox""#,
                r#"pattern = "inbox""#,
                Some("v"),
                "variant.v.pattern: `inbox` is a safe pattern, but a counterexample runs a consumer missing a safety step (hint: unsafe patterns: no-inbox,",
            ),
            (r#"violations = { rows = 3 }"#, "violations = {}", Some("v"), "variant.v.violations: a counterexample declares at least one violation"),
            (
                r#"violations = { rows = 3 }"#,
                "violations = { row = 3 }",
                Some("v"),
                "variant.v.violations.row: `row` is neither an assertion of this lab nor a check (lost, duplicatesApplied, unexpected)",
            ),
            (r#"claim = "v""#, r#"claim = "v""#, Some("w"), "t.toml: unknown variant `w` of lab `t` (known: v)"),
            (
                r#"violations = { rows = 3 }"#,
                "violations = { rows = 3 }\n[variant.v.rabbitmq.\"4.1\"]\ncause = \"c\"\nsource = \"https://x\"\nviolations = { rows = 4 }",
                Some("v"),
                "variant.v.rabbitmq.4.1: unknown RabbitMQ generation `4.1` (known: 3.10, 4.0)",
            ),
            (
                r#"violations = { rows = 3 }"#,
                "violations = { rows = 3 }\n[variant.v.rabbitmq.\"4.0\"]\ncause = \" \"\nsource = \"https://x\"\nviolations = { rows = 4 }",
                Some("v"),
                "variant.v.rabbitmq.4.0.cause: say which broker change causes the difference, in a sentence (or \"cause not identified\")",
            ),
            (
                r#"violations = { rows = 3 }"#,
                "violations = { rows = 3 }\n[variant.v.rabbitmq.\"3.10\"]\ncause = \"c\"\nsource = \"https://x\"\nviolations = { rows = 4 }",
                Some("v"),
                "variant.v.rabbitmq.3.10: 3.10 is the generation the stored snapshots come from: declare a difference on another one",
            ),
            (
                r#"violations = { rows = 3 }"#,
                "violations = { rows = 3 }\n[variant.v.rabbitmq.\"4.0\"]\ncause = \"c\"\nsource = \"a guess\"\nviolations = { rows = 4 }",
                Some("v"),
                "variant.v.rabbitmq.4.0.source: name the release note or doc page of the broker change (a URL), or say \"cause not identified\"",
            ),
            (
                r#"violations = { rows = 3 }"#,
                "violations = { rows = 3 }\n[variant.v.rabbitmq.\"4.0\"]\ncause = \"c\"\nsource = \"https://x\"\nviolations = {  }",
                Some("v"),
                "variant.v.rabbitmq.4.0.violations: a counterexample declares at least one violation",
            ),
            (
                r#"violations = { rows = 3 }"#,
                "violations = { rows = 3 }\n[variant.v.rabbitmq.\"4.0\"]\ncause = \"c\"\nsource = \"https://x\"\nviolations = { row = 4 }",
                Some("v"),
                "variant.v.rabbitmq.4.0.violations.row: `row` is neither an assertion of this lab nor a check (lost, duplicatesApplied, unexpected)",
            ),
            (
                "[[queue]]\nname = \"q\"",
                "[[queue]]\nname = \"q\"\narguments = { \"x-message-ttl\" = \"1s\" }",
                None,
                "queue[0].arguments.x-message-ttl: `x-message-ttl` takes a non-negative integer, not \"1s\"",
            ),
            (
                "[[queue]]\nname = \"q\"",
                "[[queue]]\nname = \"q\"\narguments = { \"x-mesage-ttl\" = 5 }",
                None,
                "queue[0].arguments.x-mesage-ttl: unknown queue argument `x-mesage-ttl` (known: x-message-ttl,",
            ),
            (
                "[[queue]]\nname = \"q\"",
                "[[queue]]\nname = \"q\"\ndurable = false\narguments = { \"x-queue-type\" = \"quorum\" }",
                None,
                "queue[0].durable: a quorum queue is always durable (hint: drop `durable = false`)",
            ),
            (
                "[[queue]]\nname = \"q\"",
                "[[queue]]\nname = \"q\"\n[[queue]]\nname = \"q\"",
                None,
                "queue[1].name: queue `q` is declared twice",
            ),
            (
                "[[queue]]\nname = \"q\"",
                "[[queue]]\nname = \"q\"\nbind = [{ exchange = \"x\", key = \"k\" }]",
                None,
                "queue[0].bind[0].exchange: no exchange `x` is declared",
            ),
            (
                r#"publish = { routing_key"#,
                r#"publish = { exchange = "x", routing_key"#,
                None,
                "step[0].publish.exchange: no exchange `x` is declared",
            ),
            (
                r#"target = "consumer""#,
                r#"target = "postman""#,
                None,
                "step[1].fault.target: unknown fault target `postman` (known: producer, consumer, broker, network, node)",
            ),
            (
                "[[step]]\nconsume = { queue = \"q\", settle = 2 }",
                "[[step]]\ninspect = [\"business_rows\"]\nconsume = { queue = \"q\", settle = 2 }",
                None,
                "step[1]: a step has exactly one of `publish`, `consume`, `inspect`",
            ),
            (r#"claim = "c""#, "claim = \"c\"\ncolour = \"red\"", None, "unknown field `colour`"),
            (
                r#"fault = { target = "consumer""#,
                r#"fault = { target = "producer""#,
                None,
                "step[1].fault.action: `kill` of the producer does not belong on this step",
            ),
            (
                r#"fault = { target = "consumer", action = "kill""#,
                r#"fault = { target = "network", action = "hold""#,
                None,
                "step[1].fault.action: `hold` of the network does not belong on this step",
            ),
            (
                r#"fault = { target = "consumer", action = "kill""#,
                r#"fault = { target = "network", action = "hold""#,
                None,
                "(producer: kill on a publish step; consumer: kill, rendezvous or stall (built-in consumer) on a consume step; broker: pause on a publish step, restart in a step of its own; network: cut (built-in consumer) on a consume step, cut or hold on a publish step; node: kill on a publish step, kill, restart, partition or heal in a step of its own)",
            ),
            (
                r#"settle = 2 }"#,
                r#"settle = 2, instances = 2 }"#,
                None,
                "t.toml:12:50: step[1].consume.instances: `instances = 2` runs competing consumers, whose order only a `rendezvous` or `stall` fault fixes",
            ),
            (
                "settle = 2 }\nfault = { target = \"consumer\", action = \"kill\", window = \"after-commit-before-ack\", message = \"mid-1\", then = \"restart\",",
                "settle = 2 }\nfault = { target = \"consumer\", action = \"rendezvous\", window = \"before-commit\", message = \"mid-1\",",
                None,
                "step[1].fault: a rendezvous holds one copy of the event per instance: set `instances` to 2 or more on the step",
            ),
            (
                "settle = 2 }\nfault = { target = \"consumer\", action = \"kill\", window = \"after-commit-before-ack\", message = \"mid-1\", then = \"restart\",",
                "settle = 2, instances = 2 }\nfault = { target = \"consumer\", action = \"rendezvous\", window = \"before-commit\", message = \"mid-1\",",
                None,
                "step[1].fault.message: `instances = 2` needs as many copies of `mid-1`'s event published before this step (found 1: mid-1)",
            ),
            (
                "settle = 2 }\nfault = { target = \"consumer\", action = \"kill\", window = \"after-commit-before-ack\", message = \"mid-1\", then = \"restart\",",
                "settle = 2, instances = 2, command = \"true\" }\nfault = { target = \"consumer\", action = \"rendezvous\", window = \"after-commit-before-ack\", message = \"mid-1\",",
                None,
                "t.toml:13:64: step[1].fault.window: `rendezvous` of the consumer never passes window `after-commit-before-ack` (it passes: before-commit)",
            ),
            (
                "settle = 2 }\nfault = { target = \"consumer\", action = \"kill\", window = \"after-commit-before-ack\", message = \"mid-1\", then = \"restart\",",
                "settle = 2, prefetch = 2, instances = 2 }\nfault = { target = \"consumer\", action = \"rendezvous\", window = \"before-commit\", message = \"mid-1\",",
                None,
                "step[1].fault: competing consumers under a rendezvous take one message at a time: set `prefetch = 1`",
            ),
            (
                r#"pattern = "no-inbox""#,
                "pattern = \"no-inbox\"\narguments = { \"nope\" = { \"x-overflow\" = \"drop-head\" } }",
                Some("v"),
                "variant.v.arguments.nope: no queue `nope` is declared",
            ),
            (
                "pattern = \"no-inbox\"",
                "pattern = \"no-inbox\"\nbind = { \"nope\" = [{ exchange = \"x\", key = \"k\" }] }",
                Some("v"),
                "variant.v.bind.nope: no queue `nope` is declared",
            ),
            (
                "pattern = \"no-inbox\"",
                "pattern = \"no-inbox\"\nunset = { \"q\" = [\"x-max-length\"] }",
                Some("v"),
                "variant.v.unset.q: queue `q` sets no argument `x-max-length` to remove",
            ),
            (
                "pattern = \"no-inbox\"",
                "pattern = \"no-inbox\"\nunset = { \"nope\" = [\"x-max-length\"] }",
                Some("v"),
                "variant.v.unset.nope: no queue `nope` is declared",
            ),
            (
                "[[step]]\nconsume",
                "[[step]]\npurge_inbox = { retention_ms = 0 }\nconsume",
                None,
                "step[1]: a step has exactly one of `publish`, `consume`, `inspect`, `declare`, `await`, `purge_inbox`, `policy` (or only a broker `fault`)",
            ),
            (
                "[[step]]\nconsume",
                "[[step]]\nawait = { queue = \"q\", depth = 1, within_secs = 1, from = \"nope\" }\n\n[[step]]\nconsume",
                None,
                "step[1].await.from: no queue `nope` is declared",
            ),
            (
                "name = \"q\"\n\n[[step]]\npublish",
                "name = \"q\"\n\n[[queue]]\nname = \"e\"\n\n[[queue]]\nname = \"d\"\n\n[[step]]\nawait = { queue = \"d\", depth = 1, within_secs = 1, from = \"q\" }\n\n[[step]]\npublish",
                None,
                "step[0].await.from: `q` does not dead-letter straight into `d`",
            ),
            (
                "name = \"q\"\n\n[[step]]\npublish",
                "name = \"q\"\narguments = { \"x-dead-letter-exchange\" = \"\", \"x-dead-letter-routing-key\" = \"e\" }\n\n[[queue]]\nname = \"e\"\narguments = { \"x-dead-letter-exchange\" = \"\", \"x-dead-letter-routing-key\" = \"d\" }\n\n[[queue]]\nname = \"d\"\n\n[[step]]\nawait = { queue = \"d\", depth = 1, within_secs = 1, from = \"q\" }\n\n[[step]]\npublish",
                None,
                "step[0].await.from: `q` does not dead-letter straight into `d`",
            ),
            (
                "name = \"q\"\n\n[[step]]\npublish",
                "name = \"q\"\narguments = { \"x-dead-letter-exchange\" = \"\", \"x-dead-letter-routing-key\" = \"d\" }\n\n[[queue]]\nname = \"e\"\n\n[[queue]]\nname = \"d\"\n\n[[step]]\nawait = { queue = \"d\", depth = 1, within_secs = 1, from = \"q\" }\n\n[[step]]\npublish",
                None,
                "(no error)",
            ),
            (
                "name = \"q\"\n\n[[step]]\npublish",
                "name = \"q\"\narguments = { \"x-dead-letter-exchange\" = \"x\", \"x-dead-letter-routing-key\" = \"k\" }\n\n[[exchange]]\nname = \"x\"\nkind = \"fanout\"\n\n[[queue]]\nname = \"e\"\nbind = [{ exchange = \"x\", key = \"k\" }]\n\n[[queue]]\nname = \"d\"\nbind = [{ exchange = \"x\", key = \"k\" }]\n\n[[step]]\nawait = { queue = \"d\", depth = 1, within_secs = 1, from = \"q\" }\n\n[[step]]\npublish",
                None,
                "step[0].await.from: `q` does not dead-letter straight into `d`",
            ),
            (
                "[[step]]\nconsume",
                "[[step]]\nawait = { queue = \"q\", depth = 1, within_secs = 1, from = \"q\" }\n\n[[step]]\nconsume",
                None,
                "step[1].await.from: `q` does not dead-letter straight into `q`",
            ),
            (
                "[[step]]\nconsume",
                "[[step]]\npolicy = { name = \"p\", queue = \"nope\", definition = { \"dead-letter-exchange\" = \"\" } }\n\n[[step]]\nconsume",
                None,
                "step[1].policy.queue: no queue `nope` is declared",
            ),
            (
                "name = \"q\"\n\n[[step]]\n",
                "name = \"q\"\narguments = { \"x-queue-type\" = \"quorum\" }\n\n[[step]]\npolicy = { name = \"p\", queue = \"q\", definition = { \"dead-letter-exchange\" = \"\" } }\n\n[[step]]\n",
                None,
                "step[0].policy.queue: a policy step waits for a classic queue to apply the policy; `q` is a quorum queue",
            ),
            (
                "[[step]]\nconsume",
                "[[step]]\npolicy = { name = \"p\", queue = \"q\", definition = { \"dead-letter-exchange\" = \"\" } }\nconsume",
                None,
                "step[1]: a step has exactly one of",
            ),
            (
                r#"claim = "c""#,
                "claim = \"c\"\nfacts = [\"nope\"]",
                None,
                "facts[0]: `nope` is no assertion of this lab (its assertions: rows, crashExitCode)",
            ),
            (
                r#"claim = "c""#,
                "claim = \"c\"\nfacts = [\"rows\"]",
                None,
                "facts[0]: `rows` is falsified by the variant `v`: it is evidence of the claim, not a harness fact",
            ),
            (
                r#"window = "after-commit-before-ack", message"#,
                r#"window = "after-commit-before-ack", commit = 2, message"#,
                None,
                "t.toml:13:94: step[1].fault.commit: `commit` picks which of a program's COMMITs for the message `before-commit` holds (1: the first): it needs `window = \"before-commit\"` on a consume step that runs a program, and a value of 1 or more",
            ),
            (
                "consume = { queue = \"q\", settle = 2 }\nfault = { target = \"consumer\", action = \"kill\"",
                "consume = { queue = \"q\", settle = 2, command = \"true\" }\nfault = { target = \"network\", action = \"cut\"",
                None,
                "t.toml:13:40: step[1].fault.action: `cut` of the network acts on the built-in consumer's own frames, not on a program's",
            ),
            (
                r#"publish = { routing_key = "q", messages = ["order-1001", "order-1002"] }"#,
                r#"publish = { routing_key = "q", confirm = false, confirm_timeout_ms = 500, messages = ["order-1001", "order-1002"] }
fault = { target = "network", action = "hold", window = "after-publish-before-confirm", message = "mid-1" }"#,
                None,
                "step[0].fault: `hold` of the network holds the confirm until the producer gives up on it",
            ),
            (
                r#"messages = ["order-1001", "order-1002"] }"#,
                r#"messages = ["order-1001", "order-1002"] }
fault = { target = "network", action = "hold", window = "after-publish-before-confirm", message = "mid-1" }"#,
                None,
                "t.toml:10:9: step[0].fault: `hold` of the network holds the confirm until the producer gives up on it: the publish step needs `confirm = true` and a `confirm_timeout_ms`",
            ),
            (
                r#"messages = ["order-1001", "order-1002"] }"#,
                r#"messages = ["order-1001", "order-1002"] }
fault = { target = "broker", action = "pause", window = "after-publish-before-confirm", message = "mid-1" }"#,
                None,
                "t.toml:10:9: step[0].fault: `pause` of the broker holds the confirm until the producer gives up on it: the publish step needs `confirm = true` and a `confirm_timeout_ms`",
            ),
            (
                r#"fault = { target = "consumer", action = "kill""#,
                r#"fault = { target = "broker", action = "pause""#,
                None,
                "step[1].fault.action: `pause` of the broker does not belong on this step",
            ),
            (
                "[[step]]\nconsume",
                "[[step]]\nfault = { target = \"broker\", action = \"pause\" }\n\n[[step]]\nconsume",
                None,
                "step[1].fault.target: `pause` of the broker does not belong on this step",
            ),
            (
                r#"fault = { target = "consumer", action = "kill", window = "after-commit-before-ack""#,
                r#"fault = { target = "network", action = "cut", window = "after-receive""#,
                None,
                "step[1].fault.window: `cut` of the network never passes window `after-receive` (it passes: after-commit-before-ack)",
            ),
            (
                "settle = 2 }\nfault = { target = \"consumer\", action = \"kill\", window = \"after-commit-before-ack\", message = \"mid-1\", then = \"restart\"",
                "settle = \"drain\", instances = 2 }\nfault = { target = \"consumer\", action = \"stall\", window = \"after-commit-before-ack\", message = \"mid-1\"",
                None,
                "step[1].fault.window: a stall holds its instance before the message's commit and ack",
            ),
            (
                "settle = 2 }\nfault = { target = \"consumer\", action = \"kill\", window = \"after-commit-before-ack\", message = \"mid-1\", then = \"restart\"",
                "settle = 2, instances = 2 }\nfault = { target = \"consumer\", action = \"stall\", window = \"after-receive\", message = \"mid-1\"",
                None,
                "step[1].fault: a stall holds the instance that takes the message while one other settles the rest of the queue",
            ),
            (
                r#"then = "restart""#,
                r#"then = "reconnect""#,
                None,
                "step[1].fault.then: `reconnect` does not follow `kill` of the consumer: `restart` does",
            ),
            (
                r#"window = "after-commit-before-ack", message = "mid-1", "#,
                "",
                None,
                "step[1].fault: the consumer acts at a window, for one message: set `window` and `message`",
            ),
            (
                "[[step]]\nconsume",
                "[[step]]\nfault = { target = \"broker\", action = \"restart\", window = \"after-ack\" }\n\n[[step]]\nconsume",
                None,
                "step[1].fault.window: a broker restart happens between steps: it has no window and no message",
            ),
            (
                "[[step]]\nconsume",
                "[[step]]\nfault = { target = \"node\", node = 2, action = \"kill\" }\n\n[[step]]\nconsume",
                None,
                "step[1].fault.target: a `node` fault needs a cluster: set `nodes = 3`",
            ),
            (
                r#"then = "restart", "#,
                r#"then = "restart", node = 2, "#,
                None,
                "step[1].fault.node: `node` belongs to a fault on target `node`, not `consumer`",
            ),
            (
                r#"settle = 2 }"#,
                r#"settle = 2, node = 3 }"#,
                None,
                "step[1].consume.node: node 3 does not exist: the lab has 1",
            ),
            (
                "[[step]]\nconsume",
                "[[step]]\nfault = { target = \"consumer\", action = \"kill\" }\n\n[[step]]\nconsume",
                None,
                "step[1].fault.target: the consumer is faulted inside a publish or consume step, not in a step of its own",
            ),
            (
                r#"messages = ["order-1001", "order-1002"] }"#,
                r#"messages = ["order-1001", "order-1002"] }
fault = { target = "producer", action = "kill", window = "after-confirm", message = "mid-3" }"#,
                None,
                "step[0].fault.message: `mid-3` is not one of this step's messages (mid-1, mid-2)",
            ),
            (
                r#"messages = ["order-1001", "order-1002"] }"#,
                r#"messages = ["order-1001", "order-1002"] }
fault = { target = "producer", action = "kill", window = "before-commit", message = "mid-1" }"#,
                None,
                "step[0].fault.window: `kill` of the producer never passes window `before-commit` (it passes: after-publish-before-confirm, after-confirm)",
            ),
            (
                r#"publish = { routing_key = "q","#,
                r#"publish = { routing_key = "q", park = "q", confirm = false,"#,
                None,
                "step[0].publish.park: a publish without confirms never sees a return or a nack: nothing would be parked",
            ),
            (
                r#"publish = { routing_key = "q","#,
                r#"publish = { routing_key = "q", park = "q","#,
                None,
                "step[0].publish.park: only a `mandatory` publish is returned, and only a queue with `x-overflow = reject-publish` nacks one: nothing would be parked",
            ),
            (
                r#"settle = 2 }"#,
                r#"settle = "all" }"#,
                None,
                "step[1].consume.settle: `all`: settle is a positive number of messages, or \"drain\"",
            ),
            (
                r#"consume = { queue = "q","#,
                r#"consume = { queue = "q", downstream = { timeout_ms = 500 },"#,
                None,
                "step[1].consume.downstream: pattern `inbox` never calls a downstream service: drop `downstream`, or use a pattern that calls one (side-effect-key, no-idempotency-key, effect-intent, call-without-intent, intent-unkeyed, intent-mark-first)",
            ),
            (
                r#"pattern = "no-inbox""#,
                r#"pattern = "no-idempotency-key""#,
                Some("v"),
                "step[1].consume.downstream: pattern `no-idempotency-key` calls a downstream service: set `downstream` (timeout_ms, lose_response)",
            ),
            (
                r#"consume = { queue = "q","#,
                r#"consume = { queue = "q", pattern = "side-effect-key", retry = { max_attempts = 2, dlq = "q", tiers = ["q"] }, downstream = { timeout_ms = 500, lose_response = ["mid-7"] },"#,
                None,
                "step[1].consume.downstream.lose_response: `mid-7` is not published before this step",
            ),
            (
                r#"consume = { queue = "q","#,
                r#"consume = { queue = "q", command = "true", downstream = { timeout_ms = 500 },"#,
                None,
                "step[1].consume.command: a program's behaviour is its own: `pattern`, `retry`, `transient_failures`, `max_deliveries` and `downstream` are for the built-in consumer",
            ),
            (
                r#"publish = { routing_key = "q","#,
                r#"publish = { routing_key = "q", orders = "outbox", mandatory = true, park = "q","#,
                None,
                "step[0].publish.orders: an outbox relay keeps a nacked row in its outbox: `park` does not apply to a step with `orders = \"outbox\"`",
            ),
            (
                r#"publish = { routing_key = "q","#,
                r#"publish = { routing_key = "q", orders = "direct", relay = true,"#,
                None,
                "step[0].publish.relay: `relay = true` is an outbox relay's next pass: set `orders` to an outbox handoff (outbox, outbox-after-commit, outbox-mark-first), without `reconcile`",
            ),
            (
                r#"publish = { routing_key = "q","#,
                r#"publish = { routing_key = "q", orders = "outbox", relay = true,"#,
                None,
                "step[0].publish.relay: `relay = true` is a later pass of the relay of an earlier publish step's outbox: no step before it commits orders with an outbox",
            ),
            (
                r#"publish = { routing_key = "q","#,
                r#"publish = { routing_key = "q", reconcile = true,"#,
                None,
                "step[0].publish.reconcile: a reconciliation job is an order service's that publishes directly: set `orders = \"direct\"` on the step, and keep `resend`",
            ),
            (
                r#"messages = ["order-1001", "order-1002"] }"#,
                r#"messages = ["order-1001", "order-1002"], orders = "direct", confirm = false }
fault = { target = "network", action = "cut", window = "after-publish-before-broker", message = "mid-1", then = "restart" }"#,
                None,
                "step[0].fault.action: an order service without confirms marks or moves on as soon as a publish is written",
            ),
            (
                "messages = [\"order-1001\", \"order-1002\"] }\n\n[[step]]\nconsume = { queue = \"q\",",
                "messages = [\"order-1001\", \"order-1002\"], orders = \"direct\", reconcile = true }\n\n[[step]]\nconsume = { queue = \"q\", command = \"true\",",
                None,
                "step: a reconciliation job compares the orders with the built-in consumer's business rows",
            ),
            (
                r#"pattern = "no-inbox""#,
                r#"pattern = "no-inbox"
reconcile = false"#,
                Some("v"),
                "variant.v.reconcile: no publish step of this lab sets `reconcile = true`: a variant's `reconcile = false` would change nothing",
            ),
            (
                r#"pattern = "no-inbox""#,
                r#"pattern = "no-inbox"
relay = false"#,
                Some("v"),
                "variant.v.relay: no publish step of this lab sets `relay = true`: a variant's `relay = false` would change nothing",
            ),
            (
                r#"pattern = "no-inbox""#,
                r#"pattern = "no-inbox"
orders = "direct""#,
                Some("v"),
                "variant.v.orders: no publish step of this lab sets `orders`: a variant's `orders` would change nothing",
            ),
            (
                r#"window = "after-commit-before-ack""#,
                r#"window = "after-order-commit""#,
                None,
                "step[1].fault.window: ",
            ),
        ];
        let mut wrong = Vec::new();
        for (from, to, variant, want) in cases {
            let text = BASE.replacen(from, to, 1);
            assert!(
                text != BASE || variant.is_some(),
                "edit `{from}` did not apply"
            );
            let lines = match super::super::from_str(&text, "t", &fixtures(), *variant) {
                Ok(_) => vec!["(no error)".to_string()],
                Err(e) => e.lines(),
            };
            if !lines.iter().any(|l| l.contains(want)) {
                wrong.push(format!("want `{want}`, got:\n  {}", lines.join("\n  ")));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// A variant whose handoff has no outbox, on a lab with relay passes, is
    /// refused at its own key, once.
    #[test]
    fn a_direct_variant_of_a_relay_lab_names_its_key() {
        let path =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("labs/reject-publish-resend.toml");
        let text = std::fs::read_to_string(path).unwrap()
            + "\n[variant.direct]\nclaim = \"x\"\norders = \"direct\"\nviolations = { lost = 1 }\n";
        let e = super::super::from_str(&text, "reject-publish-resend", &fixtures(), Some("direct"))
            .unwrap_err()
            .lines();
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].contains(
                "variant.direct.orders: `orders = \"direct\"` leaves the lab's relay passes"
            ),
            "{e:?}"
        );
    }

    /// A variant's prefetch on a lab with a stall is refused at its key.
    #[test]
    fn a_prefetch_variant_of_a_stall_lab_names_its_key() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("labs/per-key-workers.toml");
        let text = std::fs::read_to_string(path).unwrap()
            + "\n[variant.p]\nclaim = \"x\"\nprefetch = 10\nviolations = { orderVersion = \"1\" }\n";
        let e = super::super::from_str(&text, "per-key-workers", &fixtures(), Some("p"))
            .unwrap_err()
            .lines();
        assert!(
            e.iter().any(|l| l
                .contains("variant.p.prefetch: competing consumers under a rendezvous or a stall")),
            "{e:?}"
        );
    }

    /// `depthAtKill` is read at a consumer kill: on any other fault it
    /// would never be read, and is refused.
    #[test]
    fn depth_at_kill_only_on_a_consumer_kill() {
        let at_kill = BASE
            .replacen(
                r#"assert = ["crashExitCode"]"#,
                r#"assert = ["crashExitCode", "d"]"#,
                1,
            )
            .replacen(
                "rows = \"businessRows\"",
                "rows = \"businessRows\"\nd = \"depthAtKill:q\"",
                1,
            )
            .replacen("rows = 2", "rows = 2\nd = 0", 1);
        assert!(super::super::from_str(&at_kill, "t", &fixtures(), None).is_ok());
        let cut = at_kill
            .replacen(
                r#"target = "consumer", action = "kill""#,
                r#"target = "network", action = "cut""#,
                1,
            )
            .replacen(r#"then = "restart", "#, "", 1);
        let step = at_kill.replacen(r#"assert = ["rows"]"#, r#"assert = ["rows", "d"]"#, 1);
        let e = super::super::from_str(&step, "t", &fixtures(), None).unwrap_err();
        assert!(
            e.to_string()
                .contains("step[1].assert[1]: `depthAtKill` is read at a kill"),
            "got {e}"
        );
        let e = super::super::from_str(&cut, "t", &fixtures(), None).unwrap_err();
        assert!(
            e.to_string().contains(
                "step[1].fault.assert: `depthAtKill` is read at a kill of the built-in consumer"
            ),
            "got {e}"
        );
        // The broker's unacked count is read at the same moment, from a
        // classic queue only.
        let fault_unacked = at_kill.replacen("depthAtKill:q", "unackedAtKill:q", 1);
        assert!(super::super::from_str(&fault_unacked, "t", &fixtures(), None).is_ok());
        let quorum = fault_unacked.replacen(
            "name = \"q\"\n",
            "name = \"q\"\narguments = { \"x-queue-type\" = \"quorum\" }\n",
            1,
        );
        let e = super::super::from_str(&quorum, "t", &fixtures(), None).unwrap_err();
        assert!(
            e.to_string().contains(
                "step[1].fault.assert[1]: `unackedAtKill` reads a classic queue's own process: `q` is a quorum queue"
            ),
            "got {e}"
        );
        // So is the age of its oldest message.
        let aged = quorum.replacen("unackedAtKill:q", "oldestAgeShownAtKill:q", 1);
        let e = super::super::from_str(&aged, "t", &fixtures(), None).unwrap_err();
        assert!(
            e.to_string().contains(
                "step[1].fault.assert[1]: `oldestAgeShownAtKill` reads a classic queue's own process"
            ),
            "got {e}"
        );
        let unacked = step.replacen("depthAtKill:q", "unackedAtKill:q", 1);
        let e = super::super::from_str(&unacked, "t", &fixtures(), None).unwrap_err();
        assert!(
            e.to_string()
                .contains("step[1].assert[1]: `unackedAtKill` is read at a kill"),
            "got {e}"
        );
        // The age of the oldest message: `yes` or `no`, never on a lazy queue.
        let aged = at_kill
            .replacen("depthAtKill:q", "oldestAgeShownAtKill:q", 1)
            .replacen("d = 0", "d = \"yes\"", 1);
        assert!(super::super::from_str(&aged, "t", &fixtures(), Some("v")).is_ok());
        let cases = [
            (
                aged.replacen("d = \"yes\"", "d = true", 1),
                None,
                "expect.d: `d` is `yes` or `no`",
            ),
            (
                aged.replacen("violations = { rows = 3 }", "violations = { rows = 3, d = 1 }", 1),
                Some("v"),
                "variant.v.violations.d: `d` is `yes` or `no`",
            ),
            (
                aged.replacen(
                    "name = \"q\"\n",
                    "name = \"q\"\narguments = { \"x-queue-mode\" = \"lazy\" }\n",
                    1,
                ),
                None,
                "step[1].fault.assert[1]: `oldestAgeShownAtKill` reads the oldest message a queue holds in memory: `q` sets `x-queue-mode`",
            ),
        ];
        for (text, variant, line) in cases {
            let e = super::super::from_str(&text, "t", &fixtures(), variant).unwrap_err();
            assert!(e.to_string().contains(line), "{line}: got {e}");
        }
    }

    #[test]
    fn the_base_lab_and_its_variant_load() {
        let lab = super::super::from_str(BASE, "t", &fixtures(), None).unwrap();
        assert_eq!(lab.steps.len(), 2);
        let v = super::super::from_str(BASE, "t", &fixtures(), Some("v")).unwrap();
        assert_eq!(v.run_name(), "t@v");
        assert_eq!(v.violations.get("rows"), Some(&"3".into()));
    }

    /// `{ fixture, count = N }`: N events from one fixture, each its own
    /// eventId and order, with consecutive message ids a fault can name.
    #[test]
    fn a_series_of_events_from_one_fixture() {
        let text = BASE
            .replacen(
                r#"messages = ["order-1001", "order-1002"]"#,
                r#"messages = ["order-1002", { fixture = "order-1001", count = 3 }]"#,
                1,
            )
            .replacen(r#"message = "mid-1""#, r#"message = "mid-4""#, 1);
        let lab = super::super::from_str(&text, "t", &fixtures(), None).unwrap();
        let Action::Publish(p) = &lab.steps[0].action else {
            panic!("a publish step");
        };
        let ids: Vec<&str> = p
            .messages
            .iter()
            .map(|m| m.meta.message_id.as_str())
            .collect();
        assert_eq!(ids, ["mid-1", "mid-2", "mid-3", "mid-4"]);
        let events: Vec<String> = p
            .messages
            .iter()
            .map(|m| crate::store::event_id(m.body.as_bytes(), ""))
            .collect();
        assert_eq!(events[1], "01J7X8A6YQ4Q9M6Q4QG7H2J8F1-1");
        assert_eq!(events[3], "01J7X8A6YQ4Q9M6Q4QG7H2J8F1-3");
        assert_eq!(p.messages[2].meta.aggregate_id, "order-1001-2");
        for wrong in ["count = 0", "cuont = 3"] {
            let e = super::super::from_str(
                &text.replacen("count = 3", wrong, 1),
                "t",
                &fixtures(),
                None,
            )
            .unwrap_err();
            assert!(
                e.to_string().contains("step[0].publish.messages[1]"),
                "{wrong}: {e}"
            );
        }
    }

    /// A node killed at a producer's window: only on a publish step of a
    /// cluster lab, at `after-publish-before-confirm`, naming its node.
    #[test]
    fn a_node_kill_at_a_producer_window() {
        let lab = |fault: &str, nodes: &str| {
            format!(
                "name = \"t\"\nclaim = \"c\"\n{nodes}\n[[queue]]\nname = \"q\"\n\n[[step]]\npublish = {{ routing_key = \"q\", messages = [\"order-1001\", \"order-1002\"] }}\nfault = {fault}\n"
            )
        };
        let good = r#"{ target = "node", node = 1, action = "kill", window = "after-publish-before-confirm", message = "mid-2" }"#;
        let l = super::super::from_str(&lab(good, "nodes = 3"), "t", &fixtures(), None).unwrap();
        let f = l.steps[0].fault.as_ref().unwrap();
        assert_eq!((f.node, f.then), (Some(1), Then::Reconnect));
        assert!(l.has_broker_fault());
        let cases = [
            (good.to_string(), "", "a `node` fault needs a cluster"),
            (good.replace("node = 1, ", ""), "nodes = 3", "a `node` fault names its node"),
            (
                good.replace("after-publish-before-confirm", "after-confirm"),
                "nodes = 3",
                "`kill` of the node never passes window `after-confirm` (it passes: after-publish-before-confirm)",
            ),
            (good.replace("mid-2", "mid-7"), "nodes = 3", "`mid-7` is not one of this step's messages"),
            (
                good.replace("\"kill\"", "\"partition\""),
                "nodes = 3",
                "`partition` of the node does not belong on this step",
            ),
            (
                good.replace(" }", r#", then = "restart" }"#),
                "nodes = 3",
                "`restart` does not follow `kill` of the node: `reconnect` does",
            ),
            (
                good.replace("node = 1", "node = 2"),
                "nodes = 3",
                "node 2 is killed at the producer's window, but the producer talks to node 1",
            ),
        ];
        for (fault, nodes, want) in cases {
            let e =
                super::super::from_str(&lab(&fault, nodes), "t", &fixtures(), None).unwrap_err();
            assert!(e.to_string().contains(want), "want `{want}`, got {e}");
        }
    }

    /// A fault's other errors are still reported when one of them is wrong,
    /// and all semantic errors come at once.
    #[test]
    fn all_semantic_errors_at_once() {
        let text = BASE
            .replacen(r#"message = "mid-1""#, r#"message = "mid-9""#, 1)
            .replacen(r#""order-1002"]"#, r#""order-9999"]"#, 1)
            .replacen(
                r#"consume = { queue = "q""#,
                r#"consume = { queue = "r""#,
                1,
            );
        let e = super::super::from_str(&text, "t", &fixtures(), None).unwrap_err();
        assert_eq!(e.errors.len(), 3, "{e}");
    }

    /// Every lab in the project loads, with each of its variants.
    #[test]
    fn the_projects_labs_load() {
        let project = super::super::Project {
            root: PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        };
        for name in project.lab_names().unwrap() {
            for run in project.runs_of(&name).unwrap() {
                project.load(&run).unwrap_or_else(|e| panic!("{run}: {e}"));
            }
        }
    }
}
