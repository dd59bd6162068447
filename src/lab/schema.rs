//! The lab file as serde reads it: strict (`deny_unknown_fields`), typed
//! (the vocabulary's enums, non-zero numbers where zero means nothing), with
//! spans kept on the values a semantic error may point at. Private to `lab`:
//! the validated model is what the rest of the engine sees.

use std::collections::BTreeMap;
use std::fmt;
use std::num::{NonZeroU16, NonZeroU32, NonZeroU64, NonZeroUsize};

use serde::Deserialize;
use toml::Spanned;

use crate::expect::Expect;
use crate::vocab::{
    ArgValue, CounterRef, ExchangeKind, FaultAction, Handoff, InspectField, Pattern, Target, Then,
    Window,
};

#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawLab {
    pub name: Spanned<String>,
    pub claim: String,
    /// The broker it runs against; RabbitMQ when the file does not say.
    #[serde(default)]
    pub broker: crate::vocab::Broker,
    /// The PostgreSQL it runs on: the environment's shared one (`fast`),
    /// or one of the run's own (`durable`).
    #[serde(default)]
    pub database: crate::vocab::Durability,
    /// The articles' topic the book lists it under (a user's lab may
    /// have none).
    pub topic: Option<crate::vocab::Topic>,
    #[serde(default, rename = "exchange")]
    pub exchanges: Vec<RawExchange>,
    #[serde(default, rename = "queue")]
    pub queues: Vec<RawQueue>,
    #[serde(default, rename = "step")]
    pub steps: Vec<RawStep>,
    /// Lab-specific names for engine counters, e.g. `receivedTotal = "received"`.
    #[serde(default)]
    pub counters: BTreeMap<String, Spanned<CounterRef>>,
    #[serde(default)]
    pub expect: BTreeMap<String, Spanned<Expected>>,
    /// Counterexamples: the same lab with one safety step removed.
    #[serde(default)]
    pub variant: BTreeMap<String, RawVariant>,
    /// For a lab whose consumer is a program: the SQL that reads its
    /// business effects from its database, one `(service, eventId)` row each.
    pub effects: Option<String>,
    /// 3: the lab runs on a three-node cluster (the `cluster` group).
    pub nodes: Option<Spanned<usize>>,
    /// Assertions whose value is fixed by how the lab runs (the harness's
    /// own SIGKILL status, a queue a drain empties): shown apart from the
    /// claim's evidence, and falsified by no variant.
    #[serde(default)]
    pub facts: Vec<Spanned<String>>,
    /// Assertions whose value the broker gives in every run, whatever the
    /// variant (a drained queue reads 0, a copy published again is never
    /// flagged redelivered): not evidence of the claim, and not fixed by
    /// the harness either (another broker or generation could change it).
    #[serde(default)]
    pub broker_facts: Vec<Spanned<String>>,
    /// Broker settings the lab's bounds rely on (checked on the broker
    /// before the lab runs).
    #[serde(default)]
    pub settings: Vec<crate::vocab::BrokerSetting>,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawExchange {
    pub name: String,
    pub kind: ExchangeKind,
    #[serde(default = "yes")]
    pub durable: bool,
    /// Declared by a `declare` step, not before the first step.
    #[serde(default)]
    pub later: bool,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawQueue {
    pub name: Spanned<String>,
    #[serde(default = "yes")]
    pub durable: bool,
    /// Queue arguments (`x-message-ttl`, `x-dead-letter-exchange`, ...).
    #[serde(default)]
    pub arguments: BTreeMap<String, Spanned<ArgValue>>,
    #[serde(default)]
    pub bind: Vec<RawBinding>,
    /// Declared by a `declare` step, not before the first step.
    #[serde(default)]
    pub later: bool,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawBinding {
    pub exchange: Spanned<String>,
    pub key: String,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawStep {
    pub publish: Option<RawPublish>,
    pub consume: Option<RawConsume>,
    pub inspect: Option<Vec<InspectField>>,
    /// Declares exchanges and queues the lab marks `later`, or queues a
    /// `delete` step deleted.
    pub declare: Option<Vec<Spanned<String>>>,
    /// An administrator deletes these queues, with what they hold.
    pub delete: Option<Vec<Spanned<String>>>,
    /// Waits until a queue holds `depth` ready messages, or `within_secs` passed.
    #[serde(rename = "await")]
    pub await_depth: Option<RawAwait>,
    /// The service's inbox purge: deletes the rows older than a retention.
    pub purge_inbox: Option<RawPurgeInbox>,
    /// A policy set (or changed) on the running broker for one queue.
    pub policy: Option<RawPolicy>,
    /// An operator's DLQ replay: what `from` holds moved into `to`.
    pub replay: Option<RawReplay>,
    pub fault: Option<Spanned<RawFault>>,
    #[serde(default)]
    pub assert: Vec<Spanned<String>>,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    pub name: String,
    /// The one queue it applies to (the pattern is its name, anchored).
    pub queue: Spanned<String>,
    /// Policy keys and values, as `rabbitmqctl set_policy` takes them.
    pub definition: BTreeMap<String, ArgValue>,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawReplay {
    /// The queue replayed (a DLQ).
    pub from: Spanned<String>,
    /// Where its messages go (the work queue).
    pub to: Spanned<String>,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawPurgeInbox {
    /// Inbox rows processed longer ago than this are deleted.
    pub retention_ms: u64,
    /// Whose rows: the service the purge belongs to.
    #[serde(default = "default_service")]
    pub service: String,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawAwait {
    pub queue: Spanned<String>,
    pub depth: u32,
    pub within_secs: NonZeroU64,
    /// The queue the awaited messages are dead-lettered from: once it
    /// holds none (ready, unacked or waiting for the dead-letter target),
    /// nothing more can come, and the wait ends before its bound.
    pub from: Option<Spanned<String>>,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawPublish {
    pub exchange: Option<Spanned<String>>,
    pub routing_key: Option<String>,
    pub messages: Vec<Spanned<RawMessage>>,
    #[serde(default = "default_deadline")]
    pub deadline_secs: NonZeroU64,
    /// Publisher confirms (the producer waits for each).
    #[serde(default = "yes")]
    pub confirm: bool,
    /// The broker returns what no queue takes.
    #[serde(default)]
    pub mandatory: bool,
    /// delivery_mode 2: the broker writes the message to disk.
    #[serde(default = "yes")]
    pub persistent: bool,
    /// The `timestamp` property (when it was sent, in seconds): what the
    /// broker's age of a queue's oldest message is read from.
    #[serde(default = "yes")]
    pub timestamp: bool,
    /// Where the producer publishes a returned or nacked message (confirmed):
    /// its outbox.
    pub park: Option<Spanned<String>>,
    /// A publish whose confirm does not come within this is sent again.
    pub confirm_timeout_ms: Option<NonZeroU64>,
    /// A restarted producer sends again what it sent and never saw confirmed
    /// (false: an outbox relay takes a refusal as done and marks the row).
    #[serde(default = "yes")]
    pub resend: bool,
    /// A client-side batch of this many messages (article 002: a send call
    /// that returns may only mean the message entered the client's
    /// buffer): each message is buffered, and the batch is sent when full
    /// and, with `flush`, when the producer closes.
    pub batch: Option<Spanned<usize>>,
    /// With `batch`: send what the batch holds before exiting (false: exit
    /// at once, what it holds is never sent).
    #[serde(default = "yes")]
    pub flush: bool,
    /// The cluster node the producer connects to (default 1).
    pub node: Option<Spanned<usize>>,
    /// The producer is an order service: each order committed in its
    /// database first, its event handed over `direct` or by an `outbox`.
    pub orders: Option<Spanned<Handoff>>,
    /// With `orders`: the service's reconciliation job (article 002: a gap
    /// is closed by compensation and reconciliation), not its requests.
    #[serde(default)]
    pub reconcile: bool,
    /// With an outbox `orders`: the relay's next pass alone, which
    /// publishes the rows an earlier pass left unsent (a refused publish).
    #[serde(default)]
    pub relay: bool,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(untagged)]
pub enum RawMessage {
    Fixture(String),
    Full(RawFullMessage),
}

/// `{ fixture, routing_key }`, or `{ fixture, count = N }`: N events made
/// from one fixture, each its own eventId and order (`<eventId>-k`,
/// `<orderId>-k`), for a lab that needs a stream; `expiration_ms` gives
/// each a per-message TTL. A misspelt key is an
/// error, not a silent default.
#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawFullMessage {
    pub fixture: String,
    pub routing_key: Option<String>,
    pub count: Option<std::num::NonZeroU16>,
    /// A per-message TTL in ms: the `expiration` property.
    pub expiration_ms: Option<NonZeroU64>,
}

impl RawMessage {
    /// How many messages this entry publishes.
    pub fn count(&self) -> usize {
        match self {
            RawMessage::Full(RawFullMessage { count: Some(n), .. }) => n.get().into(),
            _ => 1,
        }
    }
}

#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawConsume {
    pub queue: Spanned<String>,
    /// The consuming service: the inbox key's consumer part and the business
    /// rows' owner. Two services on one message each apply it once.
    #[serde(default = "default_service")]
    pub service: String,
    /// A built-in consumer's behaviour (default `inbox`).
    pub pattern: Option<Spanned<Pattern>>,
    /// A program mqlab did not write, run with `sh -c` (the role contract:
    /// docs/byo.md); its windows are placed from outside, through the proxies.
    pub command: Option<Spanned<String>>,
    /// With `command`: the program commits before it acks, so a message it
    /// acks with no statement is a skip, from its first message on (mqlab
    /// otherwise learns the order at the first COMMIT); checked at each
    /// COMMIT.
    pub commits_first: Option<Spanned<bool>>,
    #[serde(default = "default_prefetch")]
    pub prefetch: NonZeroU16,
    pub settle: Settle,
    pub max_deliveries: Option<NonZeroUsize>,
    pub retry: Option<RawRetry>,
    #[serde(default = "default_deadline")]
    pub deadline_secs: NonZeroU64,
    /// Message id → how many of its first attempts fail transiently.
    #[serde(default)]
    pub transient_failures: BTreeMap<String, NonZeroU32>,
    /// The cluster node the consumer connects to (default 1).
    pub node: Option<Spanned<usize>>,
    /// Competing consumers of the one service (default 1); more than one
    /// needs a `rendezvous` fault, which sequences them.
    pub instances: Option<Spanned<NonZeroUsize>>,
    /// The downstream service the harness runs for a pattern that calls one.
    pub downstream: Option<Spanned<RawDownstream>>,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawDownstream {
    /// How long the consumer waits for the downstream's answer.
    pub timeout_ms: NonZeroU64,
    /// Messages whose event's first call applies its effect and is never
    /// answered (the response lost).
    #[serde(default)]
    pub lose_response: Vec<String>,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawRetry {
    pub max_attempts: NonZeroU32,
    /// The time budget from a message's first failure, in ms (article 002:
    /// attempts stop at whichever of the count and the duration comes first).
    pub max_duration_ms: Option<Spanned<NonZeroU64>>,
    pub dlq: Spanned<String>,
    /// Retry queues of increasing TTL (the classified pattern republishes to them).
    #[serde(default)]
    pub tiers: Vec<Spanned<String>>,
}

/// When a consumer stops: after this many distinct messages reached a final
/// outcome, or (`"drain"`) after as many as the queue holds when the step starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    Count(NonZeroUsize),
    Drain,
}

impl<'de> Deserialize<'de> for Settle {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Settle;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a positive number of messages, or \"drain\"")
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Settle, E> {
                usize::try_from(n)
                    .ok()
                    .and_then(NonZeroUsize::new)
                    .map(Settle::Count)
                    .ok_or_else(|| {
                        E::custom(format!(
                            "`{n}`: settle is a positive number of messages, or \"drain\""
                        ))
                    })
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Settle, E> {
                self.visit_i64(i64::try_from(n).unwrap_or(-1))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Settle, E> {
                match s {
                    "drain" => Ok(Settle::Drain),
                    _ => Err(E::custom(format!(
                        "`{s}`: settle is a positive number of messages, or \"drain\""
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

fn default_service() -> String {
    "inventory-service".into()
}

fn default_prefetch() -> NonZeroU16 {
    NonZeroU16::MIN
}
fn default_deadline() -> NonZeroU64 {
    NonZeroU64::new(30).expect("30 is not zero")
}

#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawFault {
    pub target: Spanned<Target>,
    pub action: Spanned<FaultAction>,
    pub window: Option<Spanned<Window>>,
    /// `before-commit` of a program that commits more than once per
    /// message: the k-th `COMMIT` is held (default 1).
    pub commit: Option<Spanned<usize>>,
    pub message: Option<Spanned<String>>,
    /// Default: what follows the action (`kill` → restart, `cut` →
    /// reconnect, `hold` and a broker `restart` → none).
    pub then: Option<Spanned<Then>>,
    /// Kill only once the queue shows this many ready messages: what the
    /// broker has already pushed to the doomed consumer is then fixed, not a race.
    pub kill_at_depth: Option<u32>,
    /// `settle` of the consumer started after the kill (default: the step's);
    /// 0 starts one that finds nothing left to do.
    pub restart_settle: Option<usize>,
    /// `true`: the consumer started after the kill settles what the queue
    /// holds then and what waits to expire into it, each copy once (two
    /// copies of one event are two).
    pub restart_drain: Option<bool>,
    /// The node a `node` fault acts on.
    pub node: Option<Spanned<usize>>,
    #[serde(default)]
    pub assert: Vec<Spanned<String>>,
}

/// A variant overrides the consume steps and faults, and declares which
/// assertions and checks must fail, with which values.
#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawVariant {
    pub claim: String,
    pub pattern: Option<Spanned<Pattern>>,
    pub window: Option<Spanned<Window>>,
    /// The fault's `commit` (a program's k-th `COMMIT` at `before-commit`).
    pub commit: Option<Spanned<usize>>,
    pub settle: Option<NonZeroUsize>,
    /// Every consume step's prefetch (what the broker pushes to a consumer
    /// before its first ack).
    pub prefetch: Option<NonZeroU16>,
    pub max_deliveries: Option<NonZeroUsize>,
    /// A DLQ the consumer publishes to; may name a queue that does not exist.
    pub dlq: Option<Spanned<String>>,
    /// Retry tiers the consumer republishes to; may name queues that do
    /// not exist (a tier that exists must dead-letter back, as in the lab).
    pub tiers: Option<Vec<Spanned<String>>>,
    pub kill_at_depth: Option<u32>,
    pub restart_settle: Option<usize>,
    /// Overrides every publish step's flags.
    pub persistent: Option<bool>,
    pub confirm: Option<bool>,
    pub mandatory: Option<bool>,
    pub resend: Option<bool>,
    /// `false`: messages sent without the `timestamp` property.
    pub timestamp: Option<bool>,
    /// `false`: a batching producer exits without sending its batch.
    pub flush: Option<bool>,
    /// An order service's handoff (`direct` against `outbox`).
    pub orders: Option<Spanned<Handoff>>,
    /// `false`: the reconciliation steps (`reconcile = true`) left out.
    pub reconcile: Option<bool>,
    /// `false`: the outbox relay's later passes (`relay = true`) left out.
    pub relay: Option<bool>,
    /// `false`: returned and nacked messages are not parked (a return is
    /// dropped; a nack is sent again, or taken as done without `resend`).
    pub park: Option<bool>,
    /// Overrides every queue's durability.
    pub durable: Option<bool>,
    /// Overrides the lab's `database` (another of the run's own: `fsync-off`).
    pub database: Option<crate::vocab::Durability>,
    /// `true`: every quorum queue becomes a classic queue (its quorum-only
    /// arguments dropped).
    pub classic: Option<bool>,
    /// Sets queue arguments, queue by queue (`{ "q" = { "x-overflow" =
    /// "drop-head" } }`): one setting changed, to show it necessary.
    #[serde(default)]
    pub arguments: BTreeMap<String, BTreeMap<String, Spanned<ArgValue>>>,
    /// Replaces a queue's bindings, queue by queue (`{ "q" = [{ exchange =
    /// "x", key = "order.*" }] }`): routing shown to follow the binding.
    #[serde(default)]
    pub bind: BTreeMap<String, Vec<RawBinding>>,
    /// Removes queue arguments, queue by queue (`{ "q" = ["x-dead-letter-exchange"] }`):
    /// a setting shown necessary by its absence.
    #[serde(default)]
    pub unset: BTreeMap<String, Vec<String>>,
    /// Replaces the program of every consume step that runs one; the
    /// lab's `commits_first` is the old program's, so it is dropped unless
    /// the variant declares it again.
    pub command: Option<Spanned<String>>,
    /// With `command`: the new program commits before it acks.
    pub commits_first: Option<Spanned<bool>>,
    /// Overrides every inbox purge's retention.
    pub retention_ms: Option<u64>,
    /// `false`: the lab's policy steps are left out.
    pub policy: Option<bool>,
    #[serde(default)]
    pub violations: BTreeMap<String, Spanned<Expected>>,
    /// What this counterexample shows instead on one RabbitMQ generation
    /// (`[variant.v.rabbitmq."4.0"]`), and why: a difference nobody
    /// declared fails the run, as any other mismatch does.
    #[serde(default)]
    pub rabbitmq: BTreeMap<String, RawGenerationDiff>,
}

impl RawVariant {
    /// The variant's declared differences, one table per broker
    /// (`[variant.v.rabbitmq."4.0"]`): a second broker's table is a field
    /// above and a row here.
    pub fn generation_tables(
        &self,
    ) -> [(crate::vocab::Broker, &BTreeMap<String, RawGenerationDiff>); 1] {
        [(crate::vocab::Broker::RabbitMq, &self.rabbitmq)]
    }
}

/// A counterexample's run on one generation: its own violations and its
/// own snapshot (`snapshots/<run>.rabbitmq-<generation>.snap`), with the
/// broker change that causes the difference.
#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawGenerationDiff {
    /// The variant's claim on this generation, where it reads otherwise.
    pub claim: Option<String>,
    /// What changed in the broker, in a sentence.
    pub cause: String,
    /// The release note or doc page that names the change (a URL), or
    /// "cause not identified".
    pub source: Spanned<String>,
    /// Replace the variant's violations on this generation.
    pub violations: BTreeMap<String, Spanned<Expected>>,
}

/// An expected value: what the `[assert]` line must print, or (a bound)
/// the integers it may print.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expected {
    Int(i64),
    Bool(bool),
    Str(String),
    /// `{ min = 1 }`, `{ max = 3 }` or both: an integer within them.
    Bound {
        min: Option<i64>,
        max: Option<i64>,
    },
}

impl Expected {
    /// What the checker compares a printed value with.
    pub fn expect(&self) -> Expect {
        match self {
            Expected::Bound { min, max } => Expect::Within {
                min: *min,
                max: *max,
            },
            other => Expect::Is(other.to_string()),
        }
    }
}

/// By hand rather than `untagged`: a value of another shape (an array, a
/// float) says what an expected value is, not "did not match any variant",
/// and a table is read as a bound, its keys and ends checked here.
impl<'de> Deserialize<'de> for Expected {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Expected;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer, `true`/`false`, a string (what the assertion prints) or a bound (`{ min = 1 }`, `{ max = 3 }`)")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Expected, A::Error> {
                use serde::de::Error;
                let (mut min, mut max) = (None, None);
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "min" => min = Some(map.next_value::<i64>()?),
                        "max" => max = Some(map.next_value::<i64>()?),
                        other => {
                            return Err(A::Error::custom(format!(
                                "unknown key `{other}` in a bound: `min`, `max`"
                            )))
                        }
                    }
                }
                match (min, max) {
                    (None, None) => Err(A::Error::custom("a bound names `min`, `max` or both")),
                    (Some(a), Some(b)) if a > b => Err(A::Error::custom(format!(
                        "a bound whose `min` ({a}) is above its `max` ({b})"
                    ))),
                    _ => Ok(Expected::Bound { min, max }),
                }
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Expected, E> {
                Ok(Expected::Int(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Expected, E> {
                i64::try_from(v)
                    .map(Expected::Int)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(v), &self))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Expected, E> {
                Ok(Expected::Bool(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Expected, E> {
                Ok(Expected::Str(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

impl fmt::Display for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expected::Int(i) => write!(f, "{i}"),
            Expected::Bool(b) => write!(f, "{b}"),
            Expected::Str(s) => f.write_str(s),
            Expected::Bound { min, max } => Expect::Within {
                min: *min,
                max: *max,
            }
            .fmt(f),
        }
    }
}
