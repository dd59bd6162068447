//! The counters a lab asserts: their arguments, what each prints, and a
//! counter with its argument as a lab writes it.

use super::*;

/// What a counter's `:argument` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    None,
    /// `name` or `name:queue`: restricted to one queue's deliveries.
    OptionalQueue,
    Queue,
    MessageId,
    /// `name` or `name:<failure class>`.
    OptionalClass,
    /// `name:<queue>/<header>`.
    QueueHeader,
    /// `name:<orderId>`: a business key, not a message.
    Order,
    /// `name:<message id>/<ms>`: a message and a time band's bound.
    MessageMs,
    /// `name:<queue>/<ms>`: a queue and a time band's bound.
    QueueMs,
}

names! {
    /// Why a message could not be processed (article 000, article 002).
    pub enum FailureClass ("failure class") {
        Transient = "transient": "may succeed later (a lock, a timeout, a dependency down): retried with backoff",
        BusinessRejection = "business-rejection": "valid, but the business says no: recorded and acked, never retried",
        Poison = "poison": "malformed, cannot be processed as it is: isolated in the DLQ at once",
        InvariantViolation = "invariant-violation": "well-formed but impossible (a negative amount): isolated in the DLQ at once",
        Conflict = "conflict": "a copy under a known eventId whose business content differs from what was applied: isolated in the DLQ at once, never skipped as a duplicate",
    }
}

names! {
    /// Engine counters a lab can assert (under its own alias, see `[counters]`).
    /// Their evaluation is `checker::evaluate`, an exhaustive match.
    pub enum Counter ("counter") {
        Confirmed = "confirmed": "messages the broker confirmed to the producer",
        Received = "received": "deliveries consumers logged as received",
        Unique = "unique": "distinct message ids among those deliveries",
        UniqueEvents = "uniqueEvents": "distinct eventIds among those deliveries",
        Redelivered = "redelivered": "deliveries flagged redelivered by the broker",
        DuplicatesObserved = "duplicatesObserved": "deliveries the inbox recognised and skipped",
        DuplicatesApplied = "duplicatesApplied": "business effects beyond the first per (service, eventId), read from PostgreSQL",
        BusinessRows = "businessRows": "business rows in PostgreSQL",
        ProcessedRows = "processedRows": "inbox rows in PostgreSQL",
        DepthAfter = "depthAfter": "ready messages in the queue, read from the broker",
        HeldAfter = "heldAfter": "messages a queue still holds in any state: ready, delivered and not acked, and (a quorum queue with at-least-once dead-lettering) waiting for their dead-letter target to take them; read from a classic queue's process or a quorum queue's leader with rabbitmqctl eval (mqlab's brokers only), never from a statistic",
        DepthAtKill = "depthAtKill": "ready messages in the queue just before a consumer kill, read while the consumer held its window with its prefetched deliveries: what a queue-depth monitor saw (on a consumer kill's `assert`)",
        UnackedAtKill = "unackedAtKill": "messages of a classic queue delivered and not acked, as its process counts them, read at the same moment as depthAtKill (with rabbitmqctl eval: mqlab's brokers only, and the run has the broker to itself)",
        OldestAgeShownAtKill = "oldestAgeShownAtKill": "`yes` if a classic queue reports a time for its oldest message at the same moment as depthAtKill, `no` if it reports none: its head_message_timestamp (what list_queues, the management API and Prometheus show), read from the messages' `timestamp` property and counting the unacked messages it holds in memory (read like unackedAtKill; a time outside the run is an error; 4.0's own received-at time is not read)",
        Attempts = "attempts": "the attempt numbers with which a message was received, in order",
        Deliveries = "deliveries": "how many times a message was delivered",
        CommitOrder = "commitOrder": "the message ids whose business transaction committed, in the order they committed (a program's COMMITs as the harness saw them)",
        DeliveriesBefore = "deliveriesBefore": "deliveries of other messages before this one's first (`never` if it never came)",
        DlqMoves = "dlqMoves": "messages a consumer moved to its DLQ after the confirm",
        Isolated = "isolated": "messages a consumer isolated in the DLQ (`isolated:<failure class>` for one class)",
        Retries = "retries": "transient failures republished to a retry tier",
        RetriesInPlace = "retriesInPlace": "transient failures tried again on the same delivery, held unacked (block-key)",
        Rejections = "rejections": "business rejections the consumer recorded and acked",
        RejectionRows = "rejectionRows": "business rejection rows in PostgreSQL",
        RetryDelaysHonoured = "retryDelaysHonoured": "redeliveries of a message that waited at least the TTL its attempt owes (the lab's tier k for attempt k, the last after that) and less than the next tier's or twice its own, whichever is longer: measured, not printed",
        DlqHeader = "dlqHeader": "`dlqHeader:<queue>/<header>`: that diagnostic header of each message in the queue, read without consuming",
        DlqFailedFor = "dlqFailedFor": "`dlqFailedFor:<queue>/<ms>`: for each message in the queue, `yes` if its `last-failed-at` is at least that long after its `first-failed-at` (its own diagnostics, read without consuming), `no` if sooner: a band, never a printed time",
        Returned = "returned": "publishes the broker returned as unroutable (mandatory)",
        Nacked = "nacked": "publishes the broker refused (basic.nack: a full queue with reject-publish)",
        Published = "published": "publishes the producer made, first sends and resends",
        OrderVersion = "orderVersion": "`orderVersion:<orderId>`: the version of that order's state in PostgreSQL, per service that holds one (`none`: no change event set it)",
        WaitedAtLeast = "waitedAtLeast": "`waitedAtLeast:<message>/<ms>`: `yes` if the message's first delivery came at least that long after the producer sent it (measured for a message with a per-message TTL, not printed), `no` if sooner: a band, never a measured time",
        OrderStatus = "orderStatus": "`orderStatus:<orderId>`: the status of that order's state in PostgreSQL, per service that holds one (`none`: no change event set it)",
        OrdersCommitted = "ordersCommitted": "orders the harness's order service (a publish step's `orders`) committed in its database",
        OrdersWithoutEvent = "ordersWithoutEvent": "orders the harness's order service committed whose event no service applied or rejected (an event still in a queue counts: drain first)",
        DownstreamCalls = "downstreamCalls": "calls the harness's downstream service received",
        DownstreamEffects = "downstreamEffects": "effects the downstream service applied (a call whose Idempotency-Key it had seen applies none)",
        DuplicateSideEffects = "duplicateSideEffects": "downstream effects beyond the first per eventId: what a local inbox cannot see",
        IntentsRecovered = "intentsRecovered": "intents a consumer found pending when it started or connected again, and called (its `intent_recovered` lines)",
        MissingSideEffects = "missingSideEffects": "(service, eventId) pairs a service that calls the downstream applied (a business row) with no effect of its own call: a call that was never made",
        CrashExitCode = "crashExitCode": "exit status of the killed role (128 + signal)",
        CrashAfterBusinessCommit = "crashAfterBusinessCommit": "business rows of the faulted message visible in PostgreSQL just before the kill",
        ConsumerExitCode = "consumerExitCode": "exit status of the last consumer process",
    }
}

/// What a counter prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// A number: expected as an integer or a bound (`{ min = 1 }`), or as
    /// one of the words it prints instead (`deliveriesBefore`: `never`).
    Count(&'static [&'static str]),
    /// `yes` or `no`.
    YesNo,
    /// A text (a list, a name, a status): expected as written.
    Text,
}

/// What any counter prints when the harness could not read it (a queue
/// whose node was down): a word a variant's violation may declare.
pub const NOT_READ: &str = "unknown";

impl Counter {
    /// Read at a consumer kill, while the consumer holds its window: only
    /// in that fault's `assert`.
    pub fn at_kill(self) -> bool {
        matches!(
            self,
            Counter::DepthAtKill | Counter::UnackedAtKill | Counter::OldestAgeShownAtKill
        )
    }

    /// Its value is `yes` or `no`: an expected value of another shape
    /// could never match.
    pub fn yes_no(self) -> bool {
        self.shape() == Shape::YesNo
    }

    /// What its value is, and so what an expectation of it may be (every
    /// counter named: a new one chooses).
    pub fn shape(self) -> Shape {
        use Counter::*;
        match self {
            WaitedAtLeast | OldestAgeShownAtKill => Shape::YesNo,
            Attempts | CommitOrder | DlqHeader | DlqFailedFor | OrderVersion | OrderStatus => {
                Shape::Text
            }
            DeliveriesBefore => Shape::Count(&["never"]),
            Confirmed
            | Received
            | Unique
            | UniqueEvents
            | Redelivered
            | DuplicatesObserved
            | DuplicatesApplied
            | BusinessRows
            | ProcessedRows
            | DepthAfter
            | HeldAfter
            | DepthAtKill
            | UnackedAtKill
            | Deliveries
            | DlqMoves
            | Isolated
            | Retries
            | RetriesInPlace
            | Rejections
            | RejectionRows
            | RetryDelaysHonoured
            | Returned
            | Nacked
            | Published
            | OrdersCommitted
            | OrdersWithoutEvent
            | DownstreamCalls
            | DownstreamEffects
            | DuplicateSideEffects
            | IntentsRecovered
            | MissingSideEffects
            | CrashExitCode
            | CrashAfterBusinessCommit
            | ConsumerExitCode => Shape::Count(&[]),
        }
    }

    /// Read from a classic queue's own process with `rabbitmqctl eval`: on
    /// mqlab's brokers only, and by a run that has the broker to itself.
    pub fn reads_queue_process(self) -> bool {
        matches!(self, Counter::UnackedAtKill | Counter::OldestAgeShownAtKill)
    }

    pub fn arg(self) -> Arg {
        use Counter::*;
        match self {
            Received | Unique | UniqueEvents | Redelivered | DuplicatesObserved | CommitOrder => {
                Arg::OptionalQueue
            }
            Isolated => Arg::OptionalClass,
            DlqHeader => Arg::QueueHeader,
            RetryDelaysHonoured => Arg::MessageId,
            DepthAfter | HeldAfter | DepthAtKill | UnackedAtKill | OldestAgeShownAtKill => {
                Arg::Queue
            }
            Attempts | Deliveries | DeliveriesBefore => Arg::MessageId,
            OrderVersion | OrderStatus => Arg::Order,
            WaitedAtLeast => Arg::MessageMs,
            DlqFailedFor => Arg::QueueMs,
            Confirmed
            | DuplicatesApplied
            | BusinessRows
            | ProcessedRows
            | DlqMoves
            | Returned
            | Nacked
            | Published
            | Retries
            | RetriesInPlace
            | Rejections
            | RejectionRows
            | OrdersCommitted
            | OrdersWithoutEvent
            | DownstreamCalls
            | DownstreamEffects
            | DuplicateSideEffects
            | MissingSideEffects
            | IntentsRecovered
            | CrashExitCode
            | CrashAfterBusinessCommit
            | ConsumerExitCode => Arg::None,
        }
    }

    /// `name`, `name[:queue]` or `name:<what>` as `mqlab list` shows it.
    pub fn usage(self) -> String {
        match self.arg() {
            Arg::None => self.name().to_string(),
            Arg::OptionalQueue => format!("{}[:queue]", self.name()),
            Arg::Queue => format!("{}:queue", self.name()),
            Arg::MessageId => format!("{}:message", self.name()),
            Arg::OptionalClass => format!("{}[:class]", self.name()),
            Arg::QueueHeader => format!("{}:queue/header", self.name()),
            Arg::Order => format!("{}:order", self.name()),
            Arg::MessageMs => format!("{}:message/ms", self.name()),
            Arg::QueueMs => format!("{}:queue/ms", self.name()),
        }
    }
}

/// A counter with its argument, as a lab writes it: `depthAfter:orders.dlq`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CounterRef {
    pub counter: Counter,
    pub arg: Option<String>,
}

impl FromStr for CounterRef {
    type Err = String;
    fn from_str(expr: &str) -> Result<CounterRef, String> {
        let (name, arg) = match expr.split_once(':') {
            Some((n, a)) => (n, Some(a.to_string())),
            None => (expr, None),
        };
        let counter: Counter = name
            .parse()
            .map_err(|e: String| format!("{e}; or alias it in [counters]"))?;
        match (counter.arg(), &arg) {
            (Arg::None, Some(_)) => Err(format!("counter `{name}` takes no `:argument`")),
            (Arg::Queue, None) => Err(format!(
                "counter `{name}` needs an argument: `{name}:<queue>`"
            )),
            (Arg::MessageId, None) => Err(format!(
                "counter `{name}` needs an argument: `{name}:<message id>`"
            )),
            (Arg::MessageMs, a)
                if a.as_deref()
                    .and_then(|a| a.split_once('/'))
                    .is_none_or(|(m, ms)| m.is_empty() || !ms.parse::<u64>().is_ok_and(|n| n > 0)) =>
            {
                Err(format!(
                    "counter `{name}` takes `<message id>/<ms>`, ms a bound above 0 (`{name}:mid-2/500`)"
                ))
            }
            (Arg::QueueMs, a)
                if a.as_deref()
                    .and_then(|a| a.split_once('/'))
                    .is_none_or(|(q, ms)| q.is_empty() || !ms.parse::<u64>().is_ok_and(|n| n > 0)) =>
            {
                Err(format!(
                    "counter `{name}` takes `<queue>/<ms>`, ms a bound above 0 (`{name}:orders.dlq/1400`)"
                ))
            }
            (Arg::Order, None) => Err(format!(
                "counter `{name}` needs an argument: `{name}:<orderId>`"
            )),
            (Arg::QueueHeader, None) => Err(format!(
                "counter `{name}` needs an argument: `{name}:<queue>/<header>`"
            )),
            (Arg::QueueHeader, Some(a)) if !a.contains('/') => Err(format!(
                "counter `{name}` takes `<queue>/<header>`, not `{a}`"
            )),
            (Arg::OptionalClass, Some(a)) if a.parse::<FailureClass>().is_err() => {
                Err(a.parse::<FailureClass>().unwrap_err())
            }
            _ => Ok(CounterRef { counter, arg }),
        }
    }
}

impl TryFrom<String> for CounterRef {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<CounterRef> for String {
    fn from(c: CounterRef) -> String {
        c.to_string()
    }
}

impl fmt::Display for CounterRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.arg {
            Some(a) => write!(f, "{}:{a}", self.counter),
            None => write!(f, "{}", self.counter),
        }
    }
}
