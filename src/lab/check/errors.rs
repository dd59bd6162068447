//! The lab checker's errors: one kind per problem, with its message and
//! its hint. A table (about a hundred kinds), longer than a file should
//! be for that reason.

use super::*;

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
    #[error("`max_duration_ms` is a time budget the built-in classified patterns keep; pattern `{0}` would never look at it: drop it, or choose a classified pattern")]
    BudgetNeedsClassified(Pattern),
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
        "a step has exactly one of `publish`, `consume`, `inspect`, `declare`, `delete`, `await`, `purge_inbox`, `policy`, `replay` (or only a broker `fault`)"
    )]
    StepActions,
    #[error("an inspect step reads state; a fault belongs on a publish or consume step")]
    NoFaultOnInspect,
    #[error("`{0}` is not an exchange or queue marked `later = true`, nor a queue a `delete` step deleted")]
    NotLater(String),
    #[error("`{0}` does not exist at this step (a `later` queue no `declare` step declared yet, or one deleted already): nothing to delete")]
    NothingToDelete(String),
    #[error("`{queue}` is deleted ({by}) until a `declare` step declares it again: until then a step may only publish (with no `fault`), delete or declare, and have no `assert`, since any other reads the broker's queues")]
    WhileDeleted { queue: String, by: String },
    #[error("`{0}` is deleted here and never declared again: the run's checks read every queue of the lab at its end; add a `declare` step after it")]
    DeletedForGood(String),
    #[error("no `routing_key` (set it on the message or the step)")]
    NoRoutingKey,
    #[error("fixture `{file}`: {why}")]
    Fixture { file: String, why: String },
    #[error("fixture `{fixture}` is a delayed task ({why}): give it `dueInMs` and `maxLatenessMs`, and publish it with `expiration_ms` equal to `dueInMs`, which also stamps when it was sent (the consumer measures its lateness from that)")]
    DelayedTaskUnscheduled { fixture: String, why: String },
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
    #[error("`{0}` applies to a fault that kills the consumer only (a consumer kill; `restart_settle` and `restart_drain`: a database fault too)")]
    ConsumerOnly(&'static str),
    #[error("`restart_drain` settles what the queue holds after the kill: it takes no `restart_settle` beside it")]
    SettleOrDrain,
    #[error("a replay moves a queue's messages into another queue: `from` and `to` are the same queue, which it would never empty")]
    ReplayIntoItself,
    #[error("`{name}` is no assertion of this lab (its assertions: {known})")]
    UnknownFact { name: String, known: String },
    #[error(
        "`{name}` is falsified by the variant `{variant}`: it is evidence of the claim, not a fact"
    )]
    FactFalsified { name: String, variant: String },
    #[error("`{0}` is in `facts` and in `broker_facts`: a fact is fixed by the harness or given by the broker, one of the two")]
    FactTwice(String),
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
    #[error("a database fault acts on a PostgreSQL of the run's own: set the lab's `database` (`durable`, `fsync-off` or `async-commit`; the shared one is `fast`)")]
    DatabaseFaultOnShared,
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
