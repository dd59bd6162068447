//! The engine's vocabulary, named once: transcript roles, statuses, consumer
//! patterns (as ordered steps) and the fault windows derived from them,
//! counters, inspect fields, exchange kinds, queue arguments. No I/O here.
//!
//! Every name lives in one table per kind (like ripgrep's flag items): the
//! lab parser, `mqlab list`, the roles, the checker and the evidence all read
//! the same table, so a rename cannot leave a caller counting a name that no
//! longer exists. What a counter computes is an exhaustive `match` on
//! [`Counter`] in the checker: a counter without an evaluator does not compile.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

mod placements;
pub use placements::*;

/// Declares a closed set of names: the enum, its table (`ALL`, with a doc per
/// name), `name()`, `doc()`, `FromStr` with a "known: ..." error, and serde
/// through the name.
macro_rules! names {
    (
        $(#[$meta:meta])*
        $vis:vis enum $ty:ident ($what:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $name:literal : $doc:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        $vis enum $ty { $( $(#[$vmeta])* $variant, )+ }

        impl $ty {
            /// Every name of this kind, in table order, with its doc.
            pub const ALL: &'static [($ty, &'static str, &'static str)] =
                &[ $( ($ty::$variant, $name, $doc), )+ ];
            /// What this kind is called in error messages.
            pub const WHAT: &'static str = $what;

            pub fn name(self) -> &'static str {
                match self { $( $ty::$variant => $name, )+ }
            }

            pub fn doc(self) -> &'static str {
                match self { $( $ty::$variant => $doc, )+ }
            }

            pub fn names() -> Vec<&'static str> {
                Self::ALL.iter().map(|(_, n, _)| *n).collect()
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                Self::ALL
                    .iter()
                    .find(|(_, n, _)| *n == s)
                    .map(|(v, _, _)| *v)
                    .ok_or_else(|| format!("unknown {} `{s}` (known: {})", $what, Self::names().join(", ")))
            }
        }

        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

names! {
    /// The broker a lab runs against (`broker` in a lab file; a module of
    /// `crate::broker` each). One today: the next is Redis Streams.
    pub enum Broker ("broker") {
        RabbitMq = "rabbitmq": "RabbitMQ: 3.10.8, or 4.0.5 with `--rabbitmq 4.0`; AMQP 0-9-1",
    }
}

impl Default for Broker {
    /// A lab file without `broker` runs on RabbitMQ, as every lab did before the key.
    fn default() -> Self {
        Broker::RabbitMq
    }
}

names! {
    /// A broker setting a lab's bounds rely on (`settings` in a lab file).
    /// mqlab's own brokers set it (`env::ADVANCED_CONFIG`); before such a
    /// lab runs, the setting is read from the broker, and a run on a broker
    /// where it differs, or where mqlab cannot read it, is refused.
    pub enum BrokerSetting ("broker setting") {
        DeadLetterConfirmTimeout = "dead_letter_worker_publisher_confirm_timeout": "milliseconds a quorum queue's at-least-once dead-letter worker waits for its target's confirm before it sends again: mqlab's brokers set 1000; RabbitMQ's default, 180000 (3 min), is longer than any lab's bound, so a delay would read as a loss",
    }
}

impl BrokerSetting {
    /// The value the lab's bounds rely on, as the broker prints it.
    pub fn required(self) -> &'static str {
        match self {
            BrokerSetting::DeadLetterConfirmTimeout => "1000",
        }
    }

    /// The Erlang expression that reads it on a node (`rabbitmqctl eval`).
    pub fn expression(self) -> String {
        format!("application:get_env(rabbit, {}).", self.name())
    }

    /// The value in `rabbitmqctl eval`'s answer to [`Self::expression`]:
    /// `{ok,1000}` is `1000`; `undefined` is RabbitMQ's default.
    pub fn value_of(self, answer: &str) -> String {
        match answer
            .trim()
            .strip_prefix("{ok,")
            .and_then(|v| v.strip_suffix('}'))
        {
            Some(v) => v.to_string(),
            None => format!("{} (RabbitMQ's default)", answer.trim()),
        }
    }
}

names! {
    /// A RabbitMQ generation mqlab runs (`--rabbitmq`), and for which a lab
    /// file may declare what differs (`[variant.v.rabbitmq."4.0"]`).
    #[derive(Default)]
    pub enum Generation ("RabbitMQ generation") {
        #[default]
        V3_10 = "3.10": "RabbitMQ 3.10.8 (Debian bookworm's package): the stored snapshots are its transcripts",
        V4_0 = "4.0": "RabbitMQ 4.0.5 (Debian trixie's package, on Erlang/OTP 27)",
    }
}

impl Generation {
    /// The generation of a broker that reports `version` (`RabbitMQ 4.0.5`,
    /// or a cluster's `RabbitMQ 4.0.5 (3 nodes)`); `None` for any other.
    pub fn of_version(version: &str) -> Option<Generation> {
        let number = version.strip_prefix("RabbitMQ ")?;
        Self::ALL
            .iter()
            .find(|(_, n, _)| {
                number
                    .strip_prefix(n)
                    .is_some_and(|rest| rest.starts_with('.'))
            })
            .map(|(g, _, _)| *g)
    }
}

names! {
    /// Who wrote a transcript line: the `[role]` prefix.
    pub enum Role ("role") {
        Producer = "producer": "the publishing role process",
        Consumer = "consumer": "a consuming role process",
        Inspect = "inspect": "the harness reading broker and database state",
        Assert = "assert": "an assertion of the lab, evaluated by the harness",
        Check = "check": "a total-queue check every lab ends with",
        Fault = "fault": "a fault the harness injected (broker, network) and its end",
        Observe = "observe": "what the harness saw a black-box program do (through its proxies)",
        Job = "job": "an operator's or a service's job the harness runs between steps (an inbox purge, a policy set)",
    }
}

names! {
    /// The last field of every role line: what happened.
    pub enum Status ("status") {
        Confirmed = "confirmed": "producer: the broker confirmed the publish",
        Nacked = "nacked": "producer: the broker refused the publish (basic.nack); it is parked if the lab names a parking queue, kept unsent in its outbox by an outbox relay that marks after the confirm, else sent again (taken as done by a producer that does not resend)",
        ConfirmTimeout = "confirm_timeout": "producer: no confirm within the timeout; it is sent again",
        Unconfirmed = "unconfirmed": "producer: published without a confirm",
        Buffered = "buffered": "producer: the message handed to its client-side batch: the send call returned, nothing went to the broker yet (a publish step's `batch`)",
        Returned = "returned": "producer: the broker returned a mandatory publish no queue took",
        Parked = "parked": "producer: a returned or nacked message, published (confirmed) to the parking queue",
        OrderCommitted = "order_committed": "producer (an order service): the order committed, with its outbox row if it has an outbox",
        OrderExists = "order_exists": "producer (a restarted order service): the order is already committed; the service takes it as done and writes nothing",
        Reconcile = "reconcile": "producer (an order service's reconciliation job): the order is committed and no service applied or rejected its event; the event is published again",
        OutboxSent = "outbox_sent": "producer (an outbox relay): the row marked sent (after the broker confirmed its publish, after the publish without a confirm, or after a refusal a relay with resend = false takes as done; outbox-mark-first: before it); `row` names the row when another message carried its event",
        OutboxKept = "outbox_kept": "producer (an outbox relay): the broker refused the row's publish; the row stays unsent for the relay's next pass, and this pass ends",
        Received = "received": "consumer: a delivery arrived",
        BusinessCommitted = "business_committed": "consumer: the business transaction committed",
        DuplicateSkipped = "duplicate_skipped": "consumer: the inbox already had the event; rolled back and acked",
        CrashInjected = "crash_injected": "a role reached the selected fault window and blocks there",
        AtRendezvous = "at_rendezvous": "consumer: an instance reached the window of a rendezvous (with a copy of the event) or of a stall and is held there until the harness releases it (the built-in consumer stops itself, SIGSTOP; a program's COMMIT is held by its PostgreSQL proxy)",
        Retry = "retry": "consumer: rejected into the retry queue",
        Requeued = "requeued": "consumer: nacked with requeue=true",
        Rejected = "rejected": "consumer: rejected without a retry policy",
        PoisonToDlq = "poison_to_dlq": "consumer: moved to the DLQ (after the confirm), then acked",
        RetryScheduled = "retry_scheduled": "consumer: a transient failure, republished to a retry tier (confirmed), then acked",
        RetryInPlace = "retry_in_place": "consumer: a transient failure, rolled back and tried again on the same delivery, unacked: what is behind it in the queue waits",
        BusinessRejected = "business_rejected": "consumer: the business said no; recorded with the inbox row, acked, no retry, no DLQ",
        MovedToDlq = "moved_to_dlq": "consumer: isolated in the DLQ with its diagnostics (its failureClass says why)",
        ConnectionLost = "connection_lost": "consumer, producer: its connection broke; it connects again (a producer sends the message again)",
        Injected = "injected": "fault: the harness injected it",
        Delivered = "delivered": "observe: the broker delivered the message to the program",
        Committed = "committed": "observe: the program's COMMIT for the message passed and the database answered",
        RolledBack = "rolled_back": "observe: the program's COMMIT ended in a rollback",
        Acked = "acked": "observe: the program acked the message",
        Held = "held": "observe: a frame of the program's (its commit or ack) held at the window",
        Killed = "killed": "observe: the program, killed at the window, with the business rows visible then",
        Healed = "healed": "fault: what the fault broke is back (the broker is ready, the network passes again)",
        Done = "done": "a role's closing line, with its totals",
        Snapshot = "snapshot": "inspect: the fields read from PostgreSQL",
        InboxPurged = "inbox_purged": "job: the inbox rows older than the retention deleted, with how many",
        PolicySet = "policy_set": "job: a policy set on the running broker, in force on its queue",
        DownstreamCalled = "downstream_called": "consumer: the downstream call after the ack returned an answer (an intent, if any, is marked done next)",
        CallFailed = "call_failed": "consumer: the downstream call after the ack failed; an intent stays pending for the consumer's next start, without one the call is never made again",
        IntentRecovered = "intent_recovered": "consumer (at start, or after a lost connection): an intent still pending, called (with its key) and marked done",
    }
}

names! {
    /// A named point in a role's code path where a fault can be injected.
    /// Windows are not listed per pattern by hand: [`PatternDef::windows`]
    /// derives them from the pattern's steps.
    pub enum Window ("fault window") {
        AfterReceive = "after-receive": "the delivery is logged, nothing is written yet",
        OnDeliver = "on-deliver": "a program's delivery reached it; it has not acted (black-box consumers)",
        AfterInboxCommit = "after-inbox-commit": "the inbox row is committed on its own, the business row is not written",
        BeforeCommit = "before-commit": "the business row is written, the transaction is still open, nothing is acked",
        AfterAckBeforeCommit = "after-ack-before-commit": "the message is acked, the transaction is still open",
        AfterCommitBeforeAck = "after-commit-before-ack": "the transaction has committed, the ack is not sent",
        AfterAck = "after-ack": "the transaction has committed and the message is acked",
        AfterOrderCommit = "after-order-commit": "producer (an order service): the order is committed, with its outbox row if it has an outbox; nothing is published",
        AfterPublishBeforeBroker = "after-publish-before-broker": "producer: the publish left the producer and never reached the broker",
        AfterPublishBeforeConfirm = "after-publish-before-confirm": "producer: the broker has the message, its confirm is not yet seen",
        AfterConfirm = "after-confirm": "producer: the confirm is seen and recorded",
        AfterRetryPublishBeforeAck = "after-retry-publish-before-ack": "consumer: the copy in the retry tier is confirmed, the original is not acked",
        AfterDlqConfirmBeforeAck = "after-dlq-confirm-before-ack": "consumer: the DLQ copy is confirmed, the original is not acked",
        AfterAckBeforeDlqPublish = "after-ack-before-dlq-publish": "consumer: the original is acked, the DLQ copy is not published",
        AfterDownstreamCall = "after-downstream-call": "consumer: the downstream call made after the ack has returned; its intent row, if any, is not marked done",
        AfterIntentDone = "after-intent-done": "consumer: the intent row is marked done: a consumer that starts will not call it (its call made before, or, marked first, still to come)",
    }
}

/// The windows the producer's path passes, for every message.
pub const PRODUCER_WINDOWS: &[Window] = &[Window::AfterPublishBeforeConfirm, Window::AfterConfirm];

/// An order service's path: the order's commit comes first.
pub const ORDER_SERVICE_WINDOWS: &[Window] = &[
    Window::AfterOrderCommit,
    Window::AfterPublishBeforeConfirm,
    Window::AfterConfirm,
];

names! {
    /// How an order service (a publish step's `orders`) hands each order's
    /// event to the broker: article 002's first failure row, "after the
    /// order commit, before the publish".
    pub enum Handoff ("order handoff") {
        Direct = "direct": "commits the order, then publishes its event (with the step's confirm): killed between the two, the order stays without its event, and the restarted service finds the order done",
        Outbox = "outbox": "commits the order and its event (an outbox row) in one transaction; a relay publishes each unsent row (with the step's confirm and mandatory) and then marks it sent: killed before the mark, the row is published again (a duplicate for the inbox)",
        OutboxMarkFirst = "outbox-mark-first": "as outbox, but the relay marks a row sent before it publishes it: a publish lost on the way leaves the row marked, and the event is never sent again",
        OutboxAfterCommit = "outbox-after-commit": "as outbox, but writes the outbox row in a transaction of its own after the order's commit: killed between the two, the order has no row for the relay to publish",
    }
}

impl Handoff {
    /// A relay publishes the event from an outbox row (every handoff but
    /// `direct`).
    pub fn is_outbox(self) -> bool {
        self != Handoff::Direct
    }
}

/// The windows a black-box consumer (a program of the user's) can be
/// faulted at: the boundaries the AMQP and PostgreSQL proxies see.
pub const PROGRAM_WINDOWS: &[Window] = &[
    Window::OnDeliver,
    Window::BeforeCommit,
    Window::AfterCommitBeforeAck,
    Window::AfterAckBeforeCommit,
    Window::AfterAck,
];

names! {
    /// One step of a consumer's success path.
    pub enum Step ("consumer step") {
        Receive = "receive": "take the delivery (with autoAck the broker forgets it now)",
        InboxInsert = "inbox-insert": "BEGIN; INSERT the inbox row with the digest of the business content ON CONFLICT DO NOTHING (no row: a duplicate if the stored digest is the same, else a conflict)",
        InboxInsertBlind = "inbox-insert-blind": "as inbox-insert, without the digest of the business content: a changed payload under a known eventId is skipped as a duplicate",
        InboxInsertByEvent = "inbox-insert-by-event": "as inbox-insert, the row keyed by the eventId alone (not by service): another service's row reads as a duplicate",
        InboxInsertSavepoint = "inbox-insert-savepoint": "BEGIN; SAVEPOINT; INSERT the inbox row with the digest, no ON CONFLICT; a unique violation is caught, rolled back to the savepoint, and the stored digest read (a duplicate or a conflict)",
        InboxInsertCatching = "inbox-insert-catching": "as inbox-insert-savepoint without the savepoint: after the caught unique violation PostgreSQL has aborted the transaction, and the digest SELECT fails (25P02)",
        InboxOwnTx = "inbox-own-tx": "INSERT the inbox row and COMMIT it in a transaction of its own",
        SkipRedelivered = "skip-redelivered": "a delivery flagged redelivered is acked as a duplicate, unprocessed",
        InboxSelect = "inbox-select": "BEGIN; SELECT the inbox row (found: a duplicate, rolled back and acked)",
        InboxInsertIgnoring = "inbox-insert-ignoring": "INSERT the inbox row ON CONFLICT DO NOTHING without looking at the result",
        Write = "write": "write the business row (BEGIN first if no transaction is open); first, a change event (one with a version) sets its order's state only if its version is newer than the stored one, and a delayed check cancels the order only if its status is still the one the check names: otherwise a business rejection",
        WriteOverwrite = "write-overwrite": "as write, without the guards: a change event sets its order's state whatever version the state holds, a delayed check cancels whatever the status; an older event arriving late overwrites the newer state, a late check cancels a paid order",
        CallDownstream = "call-downstream": "call the downstream service (BEGIN first if no transaction is open) with the eventId as the request's Idempotency-Key; no answer within the consume step's timeout is a transient failure",
        CallDownstreamUnkeyed = "call-downstream-unkeyed": "as call-downstream, with a key new on each attempt (a request id): a retry after a lost response applies the downstream effect again",
        IntentInsert = "intent-insert": "INSERT an intent row (the downstream call the event owes) in the business transaction: it commits with the business row or not at all",
        CallAfterAck = "call-after-ack": "after the ack, outside any transaction, call the downstream service with the eventId as the Idempotency-Key; a failed call is left to the intent, if any (the next start calls it)",
        CallAfterAckUnkeyed = "call-after-ack-unkeyed": "as call-after-ack, with a key new on each call (a request id): an intent called again applies its effect again",
        IntentDone = "intent-done": "mark the intent row done (a statement of its own): a consumer that starts calls only the intents not done",
        Commit = "commit": "COMMIT the business transaction",
        Ack = "ack": "basic.ack the delivery",
    }
}

names! {
    /// Consumer behaviours a lab or a variant can select. Each is a
    /// [`PatternDef`]: data the consumer role interprets.
    pub enum Pattern ("consumer pattern") {
        Inbox = "inbox": "inbox row + business row in one transaction, ack only after commit",
        NoInbox = "no-inbox": "business write without the inbox row: a redelivery applies twice",
        AckBeforeCommit = "ack-before-commit": "acks, then commits: a crash between them loses the message",
        AutoAck = "auto-ack": "autoAck consumer: the broker forgets a message once sent",
        DedupOutsideTx = "dedup-outside-tx": "inbox row committed in its own transaction before the business write",
        RequeueForever = "requeue-forever": "a failed message is nacked with requeue=true: it loops at the head of the queue",
        DlqNoConfirm = "dlq-no-confirm": "retry-dlq's DLQ move without a confirm (so no return is ever seen), then ack: an unroutable DLQ loses the message",
        DedupByRedelivered = "dedup-by-redelivered": "takes redelivered=true as its duplicate test: a resent copy (redelivered=false) applies twice",
        Classified = "classified": "inbox path; failures by class (article 000/002): transient → retry tiers, business rejection → recorded, poison and invariant violations → DLQ at once",
        ClassifiedXDeath = "classified-xdeath": "classified, but counts attempts from x-death while it republishes: the count never grows",
        AckThenPublish = "ack-then-publish": "classified, but acks the original before it publishes the DLQ copy",
        RetryEverything = "retry-everything": "classified, but takes every failure as transient: poison and rejections are retried, then dead-lettered",
        CheckThenInsert = "check-then-insert": "checks the inbox with a SELECT, writes, then inserts the inbox row ignoring a conflict: two copies processed at once both pass the check",
        DlqConfirmWithoutMandatory = "dlq-confirm-without-mandatory": "retry-dlq's DLQ move with a confirm and without `mandatory`: the broker confirms a message it could not route",
        NoDigest = "no-digest": "inbox without the digest of the business content: an upstream copy with a changed amount under a known eventId is skipped as a duplicate, silently",
        AttemptsFromHeader = "attempts-from-header": "retry-dlq's reject loop, but counts attempts from a retry-attempt header only a republish sets: the broker's dead-lettering never sets it, so the count stays 1 and the poison message never reaches the DLQ",
        DlqAckFirst = "dlq-ack-first": "retry-dlq's DLQ move in the wrong order: acks the original, then publishes the copy; a crash between the two loses the message",
        InboxByEvent = "inbox-by-event": "inbox, but the inbox is keyed by eventId alone, not (service, eventId): a second subscribing service skips what the first applied",
        NoBackoff = "no-backoff": "classified, but republishes every retry to the first tier: each waits the shortest delay, with no back-off",
        LongestDelay = "longest-delay": "classified, but republishes every retry to the last tier: each waits the longest delay, the first retries far later than their tier",
        InboxSavepoint = "inbox-savepoint": "inbox, but the row is inserted without ON CONFLICT under a savepoint: a caught unique violation rolls back to it, and the transaction goes on",
        CatchUniqueViolation = "catch-unique-violation": "inbox-savepoint without the savepoint: it catches the unique violation and goes on in the aborted transaction, so a duplicate fails (25P02) into the retry loop and the DLQ",
        BlockKey = "block-key": "retries a transient failure in place, on the same delivery held unacked (one consumer: everything behind it in the queue waits, its key's later events with the rest), and writes without the guards: the key's events commit in publish order; out of attempts the event goes to the DLQ and the key's later events go on",
        Overwrite = "overwrite": "classified, but sets an order's state without reading it first: a change event without comparing versions (an older event retried after newer ones overwrites them), a delayed cancel without checking the status (a paid order is cancelled)",
        SideEffectKey = "side-effect-key": "classified, and calls a downstream service before its business write, with the eventId as the Idempotency-Key: a retry after a lost response is answered from the key, with no second effect",
        NoIdempotencyKey = "no-idempotency-key": "side-effect-key, but each attempt's call carries a new key (a request id): the retry after a lost response applies the downstream effect again, which the inbox cannot see (its row was rolled back with the failed attempt)",
        EffectIntent = "effect-intent": "inbox path with an outbox of intents (article 002): the downstream call is an intent row in the business transaction; after the ack it is called with the eventId as the Idempotency-Key and marked done, and a consumer that starts calls the intents still pending: a crash between the ack and the call loses no effect",
        CallWithoutIntent = "call-without-intent": "effect-intent without the intent row: the downstream call is made after the ack with nothing recorded; a crash between the ack and the call loses the effect for good (the message is acked, nothing is pending)",
        IntentUnkeyed = "intent-unkeyed": "effect-intent, but each call carries a key new on each call (a request id): an intent called again at start, after a crash between its call and its mark, applies the downstream effect twice",
        IntentMarkFirst = "intent-mark-first": "effect-intent, but marks the intent done before it calls: a crash between the mark and the call leaves nothing pending, and the effect never happens",
        XDeathFirstCount = "x-death-first-count": "retry-dlq's reject loop, but reads the attempt from the first x-death entry's count alone: right while one queue rejects, short once a message was rejected from two queues (one entry per queue and reason)",
    }
}

/// What a consumer does with a message whose business write fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnFailure {
    /// The retry-dlq page's way: every failure is rejected into the retry
    /// loop (attempts from x-death); at the last attempt the message is
    /// published to the DLQ, then acked (`dlq`: in that order or, for a
    /// counterexample, acked first). `confirm`: wait for the publisher
    /// confirm; `mandatory`: have the broker return what it cannot route.
    RetryThenDlq {
        confirm: bool,
        mandatory: bool,
        dlq: DlqOrder,
        /// Where the attempt number is read (the page: x-death).
        attempts: AttemptsFrom,
    },
    /// nack with requeue=true: the message goes back to the head of the queue.
    RequeueForever,
    /// Article 002's other way for a key in retry: block it. A transient
    /// failure is rolled back and tried again on the same delivery, held
    /// unacked (with one consumer and prefetch 1 nothing behind it runs);
    /// out of attempts, and for the other classes, as `Classified`.
    RetryInPlace,
    /// Article 000's classes: transient failures republished to retry tiers
    /// (with a `retry-attempt` header and a confirm, then acked), a business
    /// rejection recorded and acked, poison and invariant violations moved
    /// to the DLQ at once.
    Classified {
        attempts: AttemptsFrom,
        dlq: DlqOrder,
        /// `false`: every failure is taken as transient (retried, then dead-lettered).
        by_class: bool,
        /// Which tier attempt k is republished to.
        backoff: Backoff,
    },
}

/// The retry tier a classified consumer republishes attempt k to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backoff {
    /// Tier k (the last tier after that): the waits grow.
    ByAttempt,
    /// Always the first: the shortest wait each time.
    FirstTier,
    /// Always the last: the longest wait each time.
    LastTier,
}

/// Where a consumer reads a message's attempt number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptsFrom {
    /// The `retry-attempt` header it sets when it republishes.
    Header,
    /// x-death: only counts broker dead-lettering (reject, expiry).
    XDeath,
    /// x-death's first entry (the latest queue and reason) alone: its count
    /// is the count of that one (queue, reason), not of the whole chain.
    XDeathFirst,
}

/// The order of the DLQ move's two effects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DlqOrder {
    /// Publish, wait for the confirm, then ack the original: a crash between
    /// them leaves a duplicate in the DLQ, never a loss.
    ConfirmThenAck,
    /// Ack first, publish after: a crash between them loses the message.
    AckThenPublish,
}

/// A consumer pattern as data: its success path in order, whether the broker
/// acks on delivery, and its failure handling.
#[derive(Debug)]
pub struct PatternDef {
    pub pattern: Pattern,
    pub safe: bool,
    pub steps: &'static [Step],
    /// autoAck: the broker considers a message acked once it sent it.
    pub auto_ack: bool,
    pub on_failure: OnFailure,
}

use Step::*;

const SAFE_PATH: &[Step] = &[Receive, InboxInsert, Write, Commit, Ack];

/// Article 000's failure classes: retry tiers by a header, the DLQ confirmed.
const CLASSIFIED_FAILURE: OnFailure = OnFailure::Classified {
    attempts: AttemptsFrom::Header,
    dlq: DlqOrder::ConfirmThenAck,
    by_class: true,
    backoff: Backoff::ByAttempt,
};

/// The retry-dlq page's failure handling (the seed labs' consumer).
const SEED_FAILURE: OnFailure = OnFailure::RetryThenDlq {
    confirm: true,
    mandatory: true,
    dlq: DlqOrder::ConfirmThenAck,
    attempts: AttemptsFrom::XDeath,
};

pub const PATTERNS: &[PatternDef] = &[
    PatternDef {
        pattern: Pattern::Inbox,
        safe: true,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::NoInbox,
        safe: false,
        steps: &[Receive, Write, Commit, Ack],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::AckBeforeCommit,
        safe: false,
        steps: &[Receive, InboxInsert, Write, Ack, Commit],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::AutoAck,
        safe: false,
        steps: &[Receive, InboxInsert, Write, Commit],
        auto_ack: true,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::DedupOutsideTx,
        safe: false,
        steps: &[Receive, InboxOwnTx, Write, Commit, Ack],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::RequeueForever,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: OnFailure::RequeueForever,
    },
    PatternDef {
        pattern: Pattern::DlqNoConfirm,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: OnFailure::RetryThenDlq {
            confirm: false,
            mandatory: false,
            dlq: DlqOrder::ConfirmThenAck,
            attempts: AttemptsFrom::XDeath,
        },
    },
    PatternDef {
        pattern: Pattern::DlqConfirmWithoutMandatory,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: OnFailure::RetryThenDlq {
            confirm: true,
            mandatory: false,
            dlq: DlqOrder::ConfirmThenAck,
            attempts: AttemptsFrom::XDeath,
        },
    },
    PatternDef {
        pattern: Pattern::Classified,
        safe: true,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: CLASSIFIED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::SideEffectKey,
        safe: true,
        steps: &[Receive, InboxInsert, CallDownstream, Write, Commit, Ack],
        auto_ack: false,
        on_failure: CLASSIFIED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::NoIdempotencyKey,
        safe: false,
        steps: &[
            Receive,
            InboxInsert,
            CallDownstreamUnkeyed,
            Write,
            Commit,
            Ack,
        ],
        auto_ack: false,
        on_failure: CLASSIFIED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::EffectIntent,
        safe: true,
        steps: &[
            Receive,
            InboxInsert,
            IntentInsert,
            Write,
            Commit,
            Ack,
            CallAfterAck,
            IntentDone,
        ],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::CallWithoutIntent,
        safe: false,
        steps: &[Receive, InboxInsert, Write, Commit, Ack, CallAfterAck],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::IntentUnkeyed,
        safe: false,
        steps: &[
            Receive,
            InboxInsert,
            IntentInsert,
            Write,
            Commit,
            Ack,
            CallAfterAckUnkeyed,
            IntentDone,
        ],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::IntentMarkFirst,
        safe: false,
        steps: &[
            Receive,
            InboxInsert,
            IntentInsert,
            Write,
            Commit,
            Ack,
            IntentDone,
            CallAfterAck,
        ],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::ClassifiedXDeath,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: OnFailure::Classified {
            attempts: AttemptsFrom::XDeath,
            dlq: DlqOrder::ConfirmThenAck,
            by_class: true,
            backoff: Backoff::ByAttempt,
        },
    },
    PatternDef {
        pattern: Pattern::AckThenPublish,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: OnFailure::Classified {
            attempts: AttemptsFrom::Header,
            dlq: DlqOrder::AckThenPublish,
            by_class: true,
            backoff: Backoff::ByAttempt,
        },
    },
    PatternDef {
        pattern: Pattern::CheckThenInsert,
        safe: false,
        steps: &[
            Receive,
            InboxSelect,
            Write,
            InboxInsertIgnoring,
            Commit,
            Ack,
        ],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::RetryEverything,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: OnFailure::Classified {
            attempts: AttemptsFrom::Header,
            dlq: DlqOrder::ConfirmThenAck,
            by_class: false,
            backoff: Backoff::ByAttempt,
        },
    },
    PatternDef {
        pattern: Pattern::NoBackoff,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: OnFailure::Classified {
            attempts: AttemptsFrom::Header,
            dlq: DlqOrder::ConfirmThenAck,
            by_class: true,
            backoff: Backoff::FirstTier,
        },
    },
    PatternDef {
        pattern: Pattern::LongestDelay,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: OnFailure::Classified {
            attempts: AttemptsFrom::Header,
            dlq: DlqOrder::ConfirmThenAck,
            by_class: true,
            backoff: Backoff::LastTier,
        },
    },
    PatternDef {
        pattern: Pattern::AttemptsFromHeader,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: OnFailure::RetryThenDlq {
            confirm: true,
            mandatory: true,
            dlq: DlqOrder::ConfirmThenAck,
            attempts: AttemptsFrom::Header,
        },
    },
    PatternDef {
        pattern: Pattern::DlqAckFirst,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: OnFailure::RetryThenDlq {
            confirm: true,
            mandatory: true,
            dlq: DlqOrder::AckThenPublish,
            attempts: AttemptsFrom::XDeath,
        },
    },
    PatternDef {
        pattern: Pattern::NoDigest,
        safe: false,
        steps: &[Receive, InboxInsertBlind, Write, Commit, Ack],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::InboxByEvent,
        safe: false,
        steps: &[Receive, InboxInsertByEvent, Write, Commit, Ack],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::InboxSavepoint,
        safe: true,
        steps: &[Receive, InboxInsertSavepoint, Write, Commit, Ack],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::CatchUniqueViolation,
        safe: false,
        steps: &[Receive, InboxInsertCatching, Write, Commit, Ack],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::BlockKey,
        safe: true,
        steps: &[Receive, InboxInsert, WriteOverwrite, Commit, Ack],
        auto_ack: false,
        on_failure: OnFailure::RetryInPlace,
    },
    PatternDef {
        pattern: Pattern::Overwrite,
        safe: false,
        steps: &[Receive, InboxInsert, WriteOverwrite, Commit, Ack],
        auto_ack: false,
        on_failure: CLASSIFIED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::XDeathFirstCount,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: OnFailure::RetryThenDlq {
            confirm: true,
            mandatory: true,
            dlq: DlqOrder::ConfirmThenAck,
            attempts: AttemptsFrom::XDeathFirst,
        },
    },
    PatternDef {
        pattern: Pattern::DedupByRedelivered,
        safe: false,
        steps: &[Receive, SkipRedelivered, Write, Commit, Ack],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
];

impl Pattern {
    /// The patterns that call a downstream service, for an error message.
    pub fn calling_downstream() -> String {
        PATTERNS
            .iter()
            .filter(|d| d.calls_downstream())
            .map(|d| d.pattern.name())
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn def(self) -> &'static PatternDef {
        PATTERNS
            .iter()
            .find(|d| d.pattern == self)
            .expect("every pattern has a definition (tested)")
    }
}

impl PatternDef {
    /// The window reached right after `steps[i]`, from what is visible by
    /// then: whether the message is acked (autoAck counts from the
    /// delivery) and whether the business transaction committed.
    pub fn window_after(&self, i: usize) -> Option<Window> {
        let done = &self.steps[..=i];
        let acked = self.auto_ack || done.contains(&Ack);
        let committed = done.contains(&Commit);
        match self.steps[i] {
            Receive => Some(Window::AfterReceive),
            InboxOwnTx => Some(Window::AfterInboxCommit),
            InboxInsert | InboxInsertBlind | InboxInsertByEvent | InboxInsertSavepoint
            | InboxInsertCatching | SkipRedelivered | InboxSelect | InboxInsertIgnoring => None,
            // The window after the write that follows covers it.
            CallDownstream | CallDownstreamUnkeyed | IntentInsert => None,
            CallAfterAck | CallAfterAckUnkeyed => Some(Window::AfterDownstreamCall),
            IntentDone => Some(Window::AfterIntentDone),
            Write | WriteOverwrite | Commit | Ack => Some(match (committed, acked) {
                (false, false) => Window::BeforeCommit,
                (false, true) => Window::AfterAckBeforeCommit,
                (true, false) => Window::AfterCommitBeforeAck,
                (true, true) => Window::AfterAck,
            }),
        }
    }

    /// Every window this pattern's path passes, in order (its success path,
    /// then its failure path): a lab naming any other is rejected, so no
    /// fault point is silently ignored.
    pub fn windows(&self) -> Vec<Window> {
        self.windows_for(true)
    }

    /// The windows a consume step with this pattern passes: the seed
    /// failure path's DLQ move only when the step has a DLQ (`retry`), and
    /// never for an autoAck consumer (the broker forgot the message when it
    /// sent it: there is no ack to come) or an inbox committed on its own
    /// (its row survives the rollback, so a message never gets past its
    /// first attempt).
    pub fn windows_for(&self, dlq: bool) -> Vec<Window> {
        let seed_dlq = dlq && !self.auto_ack && !self.steps.contains(&InboxOwnTx);
        let failure: &[Window] = match self.on_failure {
            OnFailure::Classified {
                dlq: DlqOrder::ConfirmThenAck,
                ..
            } => &[
                Window::AfterRetryPublishBeforeAck,
                Window::AfterDlqConfirmBeforeAck,
            ],
            OnFailure::Classified {
                dlq: DlqOrder::AckThenPublish,
                ..
            } => &[
                Window::AfterRetryPublishBeforeAck,
                Window::AfterAckBeforeDlqPublish,
            ],
            // The seed's DLQ move: confirmed, then acked (without a
            // confirm there is no point "after the confirm").
            OnFailure::RetryThenDlq {
                confirm: true,
                dlq: DlqOrder::ConfirmThenAck,
                ..
            } if seed_dlq => &[Window::AfterDlqConfirmBeforeAck],
            OnFailure::RetryThenDlq {
                dlq: DlqOrder::AckThenPublish,
                ..
            } if seed_dlq => &[Window::AfterAckBeforeDlqPublish],
            OnFailure::RetryInPlace => &[Window::AfterDlqConfirmBeforeAck],
            OnFailure::RetryThenDlq { .. } | OnFailure::RequeueForever => &[],
        };
        (0..self.steps.len())
            .filter_map(|i| self.window_after(i))
            .chain(failure.iter().copied())
            .collect()
    }

    /// Whether its path calls the harness's downstream service.
    pub fn calls_downstream(&self) -> bool {
        self.steps.iter().any(|s| {
            matches!(
                s,
                CallDownstream | CallDownstreamUnkeyed | CallAfterAck | CallAfterAckUnkeyed
            )
        })
    }

    /// `receive → inbox-insert → ...`, for `mqlab list`.
    pub fn path(&self) -> String {
        self.steps
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(" → ")
    }
}

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
            Attempts | CommitOrder | DlqHeader | OrderVersion | OrderStatus => Shape::Text,
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
            DepthAfter | DepthAtKill | UnackedAtKill | OldestAgeShownAtKill => Arg::Queue,
            Attempts | Deliveries | DeliveriesBefore => Arg::MessageId,
            OrderVersion | OrderStatus => Arg::Order,
            WaitedAtLeast => Arg::MessageMs,
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

names! {
    /// The total-queue checks every lab ends with, each expected to be 0.
    pub enum Check ("check") {
        Lost = "lost": "events the producer sent (whatever the broker answered), counted per service the lab routed each to, that the service neither applied nor rejected and no queue holds",
        DuplicatesApplied = "duplicatesApplied": "business effects beyond the first per (service, eventId)",
        Unexpected = "unexpected": "events applied that the producer never sent",
    }
}

names! {
    /// Fields an `inspect` step prints, read from PostgreSQL.
    pub enum InspectField ("inspect field") {
        BusinessRows = "business_rows": "business rows (inventory reservations)",
        ProcessedRows = "processed_rows": "inbox rows",
        RejectionRows = "rejection_rows": "business rejections recorded",
    }
}

/// The diagnostic headers of a DLQ copy. Outside the `x-` space: RabbitMQ
/// 4.x treats `x-` headers as its own (message annotations), so they may
/// not come back as application headers.
pub const DLQ_HEADERS: &[(&str, &str)] = &[
    ("event-id", "the business eventId"),
    ("event-type", "the event's type"),
    ("aggregate-id", "the aggregate (order) id"),
    ("original-queue", "the queue it was consumed from"),
    ("original-routing-key", "its routing key there"),
    (
        "failure-class",
        "transient, business-rejection, poison, invariant-violation",
    ),
    ("last-error", "the last error"),
    ("attempts", "how many times it was tried"),
    ("first-failed-at", "when it first failed (RFC 3339)"),
    ("last-failed-at", "when it last failed (RFC 3339)"),
];

/// The header a consumer sets when it republishes a message to a retry tier.
pub const RETRY_ATTEMPT_HEADER: &str = "retry-attempt";

names! {
    /// AMQP exchange types.
    pub enum ExchangeKind ("exchange kind") {
        Direct = "direct": "routes on the exact routing key",
        Topic = "topic": "routes on routing-key patterns (`*`, `#`)",
        Fanout = "fanout": "routes to every bound queue",
        Headers = "headers": "routes on header values",
    }
}

impl Status {
    /// A producer line saying it handed the message to the broker (whatever
    /// the broker answered), or parked it, or (an order service) committed
    /// the order that owes it: what the total-queue check expects to find
    /// applied or queued.
    pub fn is_a_send(self) -> bool {
        matches!(
            self,
            Status::OrderCommitted
                | Status::Confirmed
                | Status::Unconfirmed
                | Status::Buffered
                | Status::Nacked
                | Status::ConfirmTimeout
                | Status::Returned
                | Status::Parked
                | Status::CrashInjected
        )
    }
}

names! {
    /// Who a fault acts on.
    pub enum Target ("fault target") {
        Producer = "producer": "the producer role process (at a window of its path)",
        Consumer = "consumer": "the consumer role process (at a window of its pattern's path)",
        Broker = "broker": "the RabbitMQ node, between two steps (restart) or at a producer's window (pause)",
        Network = "network": "a role's connection, through the harness's AMQP proxy",
        Node = "node": "one node of a three-node cluster (`nodes = 3`), between two steps or, killed, at a producer's window",
    }
}

names! {
    /// What a fault does.
    pub enum FaultAction ("fault action") {
        Kill = "kill": "SIGKILL, exactly at the window (producer, consumer); a node stays down until its `restart` (node)",
        Restart = "restart": "SIGKILL the broker and start it again on the same data (broker); start a killed node again, it rejoins (node)",
        Cut = "cut": "drop the message's ack (consume step) or its publish (publish step) and close the connection (network)",
        Hold = "hold": "hold the broker's confirm of the message; the producer times out (network, publish step)",
        Partition = "partition": "cut the node off from the other two (iptables, root); it pauses itself (pause_minority) and the harness and roles go to the other nodes (node)",
        Heal = "heal": "end the partition (node)",
        Pause = "pause": "stop the broker (SIGSTOP; `docker pause` in containers) while a publish waits for its confirm, and resume it once the producer timed out (broker, publish step)",
        Rendezvous = "rendezvous": "hold each instance with a copy of the message's event at the window (or while it waits on the database) until all are there, then release them one at a time (consumer with `instances`)",
        Stall = "stall": "hold the instance that takes the message at the window while the other instance settles every other message, then release it (consumer with `instances = 2`): a slow worker, finishing last what it took first",
    }
}

impl Target {
    /// Its faults act on the environment (the broker, a node): a lab with
    /// one has the environment to itself, and `--env external` skips it.
    pub fn acts_on_environment(self) -> bool {
        matches!(self, Target::Broker | Target::Node)
    }
}

names! {
    /// What follows a fault.
    pub enum Then ("follow-up") {
        Restart = "restart": "a fresh process of the same role takes over",
        Reconnect = "reconnect": "the same process connects again (the proxy lets it once the broker dropped the old connection)",
        None = "none": "nothing: the fault itself ends (a broker restart, a held confirm the producer gives up on)",
    }
}

/// A queue argument's value type, for checking lab files before any server starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgType {
    Int,
    Str,
    Bool,
    OneOf(&'static [&'static str]),
}

/// The queue arguments RabbitMQ 3.10+ understands; any other name is a typo
/// the broker would silently ignore, so a lab naming one is rejected.
pub const QUEUE_ARGUMENTS: &[(&str, ArgType, &str)] = &[
    (
        "x-message-ttl",
        ArgType::Int,
        "ms a message may wait before it expires",
    ),
    (
        "x-expires",
        ArgType::Int,
        "ms of disuse after which the queue is deleted",
    ),
    (
        "x-max-length",
        ArgType::Int,
        "ready messages before overflow applies",
    ),
    (
        "x-max-length-bytes",
        ArgType::Int,
        "bytes of ready messages before overflow applies",
    ),
    (
        "x-overflow",
        ArgType::OneOf(&["drop-head", "reject-publish", "reject-publish-dlx"]),
        "what happens at the length limit",
    ),
    (
        "x-dead-letter-exchange",
        ArgType::Str,
        "where rejected, expired or dropped messages go",
    ),
    (
        "x-dead-letter-routing-key",
        ArgType::Str,
        "routing key for dead-lettered messages",
    ),
    (
        "x-dead-letter-strategy",
        ArgType::OneOf(&["at-most-once", "at-least-once"]),
        "quorum queues: whether dead-lettering is confirmed",
    ),
    (
        "x-queue-type",
        ArgType::OneOf(&["classic", "quorum", "stream"]),
        "the queue's implementation",
    ),
    (
        "x-delivery-limit",
        ArgType::Int,
        "quorum queues: deliveries before dead-lettering",
    ),
    (
        "x-max-priority",
        ArgType::Int,
        "classic queues: priority levels (1-255)",
    ),
    (
        "x-single-active-consumer",
        ArgType::Bool,
        "one consumer at a time",
    ),
    (
        "x-queue-mode",
        ArgType::OneOf(&["default", "lazy"]),
        "classic queues: keep messages on disk",
    ),
    (
        "x-queue-version",
        ArgType::Int,
        "classic queues: storage version (1 or 2)",
    ),
    (
        "x-quorum-initial-group-size",
        ArgType::Int,
        "quorum queues: initial replica count",
    ),
];

/// A queue argument's value as a lab writes it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum ArgValue {
    Bool(bool),
    Int(i64),
    Str(String),
}

impl fmt::Display for ArgValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgValue::Bool(b) => write!(f, "{b}"),
            ArgValue::Int(i) => write!(f, "{i}"),
            ArgValue::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// Checks one queue argument against [`QUEUE_ARGUMENTS`].
pub fn check_queue_argument(name: &str, value: &ArgValue) -> Result<(), String> {
    let Some((_, ty, _)) = QUEUE_ARGUMENTS.iter().find(|(n, _, _)| *n == name) else {
        let known: Vec<_> = QUEUE_ARGUMENTS.iter().map(|(n, _, _)| *n).collect();
        return Err(format!(
            "unknown queue argument `{name}` (known: {})",
            known.join(", ")
        ));
    };
    let ok = match (ty, value) {
        (ArgType::Int, ArgValue::Int(i)) => *i >= 0,
        (ArgType::Str, ArgValue::Str(_)) => true,
        (ArgType::Bool, ArgValue::Bool(_)) => true,
        (ArgType::OneOf(allowed), ArgValue::Str(s)) => allowed.contains(&s.as_str()),
        _ => false,
    };
    if ok {
        return Ok(());
    }
    Err(match ty {
        ArgType::Int => format!("`{name}` takes a non-negative integer, not {value}"),
        ArgType::Str => format!("`{name}` takes a string, not {value}"),
        ArgType::Bool => format!("`{name}` takes true or false, not {value}"),
        ArgType::OneOf(allowed) => {
            format!("`{name}` is one of {}, not {value}", allowed.join(", "))
        }
    })
}

/// The exchange, queues, bindings a lab declares: the data [`crate::broker::Admin`]
/// declares on the broker.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Topology {
    pub exchanges: Vec<ExchangeDecl>,
    pub queues: Vec<QueueDecl>,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExchangeDecl {
    pub name: String,
    pub kind: ExchangeKind,
    pub durable: bool,
    /// Declared by a lab step, not at the start.
    #[serde(default)]
    pub later: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueDecl {
    pub name: String,
    pub durable: bool,
    pub arguments: std::collections::BTreeMap<String, ArgValue>,
    pub bindings: Vec<(String, String)>,
    /// Declared by a lab step, not at the start.
    #[serde(default)]
    pub later: bool,
}

/// The header a consumer's DLQ or retry copy names the queue it came from
/// in: the checker holds the copy for that queue's service.
pub const ORIGINAL_QUEUE: &str = "original-queue";

/// The header a producer sets on a copy it parks (its outbox): only such a
/// copy stands for the queue that refused or returned it.
pub const PARKED_BY: &str = "parked-by";

impl Topology {
    /// Whether a message `queue` dead-letters can come back to it, its
    /// dead-letter chain through the default exchange followed queue by
    /// queue (any hop, rejection or expiry: an over-estimate of a return).
    /// `None` when the file cannot tell (another exchange, a queue it does
    /// not declare). A policy's dead-letter settings are not read.
    pub fn dead_letters_return(&self, queue: &str) -> Option<bool> {
        self.dead_letters_reach(queue, queue)
    }

    /// Whether what `from` dead-letters reaches `to`, its dead-letter
    /// chain through the default exchange followed queue by queue; `None`
    /// when the file cannot tell.
    pub fn dead_letters_reach(&self, from: &str, to: &str) -> Option<bool> {
        let mut seen = BTreeSet::new();
        let mut at = from.to_string();
        loop {
            let q = self.queues.iter().find(|q| q.name == at)?;
            let dlx = q.arguments.get("x-dead-letter-exchange");
            let key = q.arguments.get("x-dead-letter-routing-key");
            let next = match (dlx, key) {
                // No dead-letter exchange: the chain ends here.
                (None, _) => return Some(false),
                (Some(ArgValue::Str(x)), Some(ArgValue::Str(k))) if x.is_empty() => k.clone(),
                _ => return None,
            };
            if next == to {
                return Some(true);
            }
            if !seen.insert(next.clone()) {
                return Some(false);
            }
            at = next;
        }
    }

    /// The queues among `declared` a publish to `exchange` with `key` is
    /// routed to, as the broker routes it (the default exchange: the queue
    /// named `key`); `None` when that cannot be told from the declarations
    /// (a headers exchange, an exchange the lab does not declare).
    pub fn route<'a>(
        &'a self,
        exchange: &str,
        key: &str,
        declared: &BTreeSet<&str>,
    ) -> Option<BTreeSet<&'a str>> {
        let live = |q: &&QueueDecl| declared.contains(q.name.as_str());
        if exchange.is_empty() {
            return Some(
                self.queues
                    .iter()
                    .filter(live)
                    .filter(|q| q.name == key)
                    .map(|q| q.name.as_str())
                    .collect(),
            );
        }
        let kind = self.exchanges.iter().find(|x| x.name == exchange)?.kind;
        let matches = |pattern: &str| match kind {
            ExchangeKind::Direct => Some(pattern == key),
            ExchangeKind::Fanout => Some(true),
            ExchangeKind::Topic => Some(topic_matches(pattern, key)),
            ExchangeKind::Headers => None,
        };
        let mut out = BTreeSet::new();
        for q in self.queues.iter().filter(live) {
            for (x, pattern) in &q.bindings {
                if x == exchange && matches(pattern)? {
                    out.insert(q.name.as_str());
                }
            }
        }
        Some(out)
    }
}

/// A topic binding's pattern against a routing key: words split on `.`,
/// `*` one word, `#` zero or more.
fn topic_matches(pattern: &str, key: &str) -> bool {
    fn walk(p: &[&str], k: &[&str]) -> bool {
        match (p.first(), k.first()) {
            (None, None) => true,
            (Some(&"#"), _) => walk(&p[1..], k) || (!k.is_empty() && walk(p, &k[1..])),
            (Some(&w), Some(&kw)) if w == "*" || w == kw => walk(&p[1..], &k[1..]),
            _ => false,
        }
    }
    let p: Vec<&str> = pattern.split('.').collect();
    let k: Vec<&str> = if key.is_empty() {
        Vec::new()
    } else {
        key.split('.').collect()
    };
    walk(&p, &k)
}

impl QueueDecl {
    /// A quorum queue: reading its messages counts as a delivery.
    pub fn is_quorum(&self) -> bool {
        self.arguments.get("x-queue-type") == Some(&ArgValue::Str("quorum".into()))
    }
}

#[cfg(test)]
mod tests;
