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

impl Broker {
    /// The product's name as a reader knows it: a diagram's participant,
    /// a heading of the evidence.
    pub fn product(self) -> &'static str {
        match self {
            Broker::RabbitMq => "RabbitMQ",
        }
    }

    /// The flag that asks for one of its generations (`--rabbitmq 4.0`).
    pub fn generation_flag(self) -> &'static str {
        match self {
            Broker::RabbitMq => "--rabbitmq",
        }
    }
}

impl Default for Broker {
    /// A lab file without `broker` runs on RabbitMQ, as every lab did before the key.
    fn default() -> Self {
        Broker::RabbitMq
    }
}

names! {
    /// How durable a lab's PostgreSQL is (`database` in a lab file).
    #[derive(Default)]
    pub enum Durability ("database durability") {
        #[default]
        Fast = "fast": "the environment's shared PostgreSQL (the local environment's: `initdb --no-sync`, `fsync=off`, `full_page_writes=off`, which no SIGKILL lab tells from a durable one: the operating system keeps what was written; a container's: its image's settings; --env external's: the user's)",
        Durable = "durable": "a PostgreSQL of the run's own with PostgreSQL's durability (`initdb` synced, `fsync` and full page writes on), started for the run and stopped after it: what a power loss, which drops unsynced writes, tests",
        FsyncOff = "fsync-off": "a PostgreSQL of the run's own as `durable`, but with `fsync = off`: a commit returns once the operating system has it, never on disk (docs/power-loss.md)",
        AsyncCommit = "async-commit": "a PostgreSQL of the run's own as `durable`, but with `synchronous_commit = off`: a commit returns before its WAL is written (in a lab with a database fault the WAL writer is held until the fault, so the commit is still in memory then; docs/power-loss.md)",
    }
}

names! {
    /// The articles' topics, which group the labs in the book
    /// (`topic` in a lab file; `docs/topics/<topic>.md` lists its labs).
    /// `your-own-program` is the examples' labs' (examples/python).
    pub enum Topic ("topic") {
        Consuming = "consuming": "a consumer killed, cut off or racing another instance, and what its inbox makes of a redelivery, a replay or a conflicting copy; its calls to a downstream service; what a queue's depth hides",
        Publishing = "publishing": "a publish lost, unconfirmed, refused, unroutable or routed by a topic exchange, a producer killed around its confirm, and the outbox that keeps an order and its event together",
        FailureHandling = "failure-handling": "retries, their attempts and back-off, failure classes, poison messages and the dead-letter queue",
        OrderingAndTime = "ordering-and-time": "the order a key's events complete in, and delays and TTLs, which are expiries, not timers",
        BrokersAndClusters = "brokers-and-clusters": "a broker crashed, restarted or stalled, and a quorum queue's node lost or cut off",
        YourOwnProgram = "your-own-program": "a program of yours as the consumer, in any language, judged as a black box: the examples' labs (examples/python, examples/node), safe and broken",
    }
}

impl Topic {
    /// The heading of the topic's page in the book.
    pub fn title(self) -> &'static str {
        match self {
            Topic::Consuming => "Consuming",
            Topic::Publishing => "Publishing",
            Topic::FailureHandling => "Failure handling and the DLQ",
            Topic::OrderingAndTime => "Ordering and time",
            Topic::BrokersAndClusters => "Brokers and clusters",
            Topic::YourOwnProgram => "Your own program",
        }
    }
}

names! {
    /// What a lab may need beyond publishing and consuming, each offered or
    /// not by a broker ([`crate::broker::offers`]) and by an environment
    /// (`--env external` offers none: the servers are not mqlab's). Checked
    /// when the plan is made, before anything starts.
    pub enum Capability ("capability") {
        BrokerFault = "broker-fault": "a broker fault",
        Policy = "policy": "a policy step (set with rabbitmqctl eval)",
        QueueFigures = "queue-figures": "a queue's own figures (read with rabbitmqctl eval)",
        Setting = "setting": "a broker setting its bounds rely on, read from the broker",
        OwnDatabase = "own-database": "a PostgreSQL of the run's own (a lab's `database`: `durable`, `fsync-off`, `async-commit`), which mqlab starts",
    }
}

impl Capability {
    /// Whether the broker must offer it too (else the environment alone).
    pub fn of_broker(self) -> bool {
        !matches!(self, Capability::OwnDatabase)
    }
}

names! {
    /// A broker setting a lab's bounds rely on (`settings` in a lab file).
    /// mqlab's own brokers set it (`env::rabbitmq::ADVANCED_CONFIG`); before such a
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
    /// The broker it is a generation of.
    pub fn broker(self) -> Broker {
        Broker::RabbitMq
    }

    /// The name of a run's snapshot on this generation:
    /// `<run>.rabbitmq-4.0`.
    pub fn snapshot(self, run: &str) -> String {
        format!("{run}.{}-{}", self.broker(), self)
    }

    /// The generation whose transcripts the common snapshots are: a run on
    /// another one rewrites only a snapshot its lab file declares for it.
    pub fn is_base(self) -> bool {
        matches!(self, Generation::V3_10)
    }

    /// The base generation of `broker` ([`Self::is_base`]).
    pub fn base_of(broker: Broker) -> Generation {
        Self::ALL
            .iter()
            .map(|(g, _, _)| *g)
            .find(|g| g.broker() == broker && g.is_base())
            .expect("every broker has a base generation")
    }

    /// The generation of a broker that reports `version` (`RabbitMQ 4.0.5`,
    /// or a cluster's `RabbitMQ 4.0.5 (3 nodes)`); `None` for any other.
    pub fn of_version(version: &str) -> Option<Generation> {
        Self::ALL
            .iter()
            .find(|(g, n, _)| {
                version
                    .strip_prefix(g.broker().product())
                    .and_then(|v| v.strip_prefix(' '))
                    .and_then(|v| v.strip_prefix(n))
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
        WindowPassed = "window_passed": "consumer: it passed a fault window (`window`), in explore's clean run only: the points explore then tries are these",
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
        Replayed = "replayed": "job: an operator's replay moved what a DLQ held (`from`) back into the work queue (`to`), each copy confirmed before its original was removed, with how many",
        QueueDeleted = "queue_deleted": "job: an administrator deleted a queue, with how many ready messages it held",
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
        AfterRetryPublishBeforeAck = "after-retry-publish-before-ack": "consumer: the copy for the retry tier is published (and confirmed, if the consumer waits for its confirm), the original is not acked",
        AfterAckBeforeRetryPublish = "after-ack-before-retry-publish": "consumer: the original is acked, the copy for the retry tier is not published",
        AfterDlqConfirmBeforeAck = "after-dlq-confirm-before-ack": "consumer: the DLQ copy is confirmed, the original is not acked",
        AfterAckBeforeDlqPublish = "after-ack-before-dlq-publish": "consumer: the original is acked, the DLQ copy is not published",
        AfterDownstreamCall = "after-downstream-call": "consumer: the downstream call made after the ack has returned; its intent row, if any, is not marked done",
        AfterIntentDone = "after-intent-done": "consumer: the intent row is marked done: a consumer that starts will not call it (its call made before, or, marked first, still to come)",
    }
}

impl Window {
    /// What the window's name says about the delivery's ack, where it says
    /// anything: explore's clean run checks it against what the consumer
    /// did (a window passed on the wrong side of its ack is code reordered
    /// under an unchanged name).
    pub fn says_acked(self) -> Option<bool> {
        use Window::*;
        match self {
            BeforeCommit
            | AfterCommitBeforeAck
            | AfterRetryPublishBeforeAck
            | AfterDlqConfirmBeforeAck => Some(false),
            AfterAckBeforeCommit
            | AfterAck
            | AfterAckBeforeRetryPublish
            | AfterAckBeforeDlqPublish
            | AfterDownstreamCall
            | AfterIntentDone => Some(true),
            AfterReceive
            | OnDeliver
            | AfterInboxCommit
            | AfterOrderCommit
            | AfterPublishBeforeBroker
            | AfterPublishBeforeConfirm
            | AfterConfirm => None,
        }
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
        InboxOtherConnection = "inbox-other-connection": "BEGIN; the inbox row INSERTed ON CONFLICT DO NOTHING by a helper on a database connection of its own, where it commits at once: the code reads as one transaction, the row does not roll back with it",
        SkipRedelivered = "skip-redelivered": "a delivery flagged redelivered is acked as a duplicate, unprocessed",
        InboxSelect = "inbox-select": "BEGIN; SELECT the inbox row (found: a duplicate, rolled back and acked)",
        InboxInsertIgnoring = "inbox-insert-ignoring": "INSERT the inbox row ON CONFLICT DO NOTHING without looking at the result",
        Write = "write": "write the business row (BEGIN first if no transaction is open); first, a change event (one with a version) sets its order's state only if its version is newer than the stored one, a delayed check cancels the order only if its status is still the one the check names, and a delayed task found later than its maximum lateness is not run: otherwise a business rejection",
        WriteOverwrite = "write-overwrite": "as write, without the guards: a change event sets its order's state whatever version the state holds, a delayed check cancels whatever the status, a delayed task runs however late; an older event arriving late overwrites the newer state, a late check cancels a paid order",
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
        DedupOtherConnection = "dedup-other-connection": "the inbox row written by a helper on a second database connection while the business transaction is open on the first (article 000: \"another DbContext\"): the row commits on its own",
        RequeueForever = "requeue-forever": "a failed message is nacked with requeue=true: it loops at the head of the queue",
        DlqNoConfirm = "dlq-no-confirm": "retry-dlq's DLQ move without a confirm (so no return is ever seen), then ack: an unroutable DLQ loses the message",
        DedupByRedelivered = "dedup-by-redelivered": "takes redelivered=true as its duplicate test: a resent copy (redelivered=false) applies twice",
        Classified = "classified": "inbox path; failures by class (article 000/002): transient → retry tiers, business rejection → recorded, poison and invariant violations → DLQ at once",
        ClassifiedXDeath = "classified-xdeath": "classified, but counts attempts from x-death while it republishes: the count never grows",
        AckThenPublish = "ack-then-publish": "classified, but acks the original before it publishes the DLQ copy",
        RetryCountOnly = "retry-count-only": "classified, but stops retrying at the attempt count alone: a time budget (`max_duration_ms`) set beside it is never looked at",
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
        Overwrite = "overwrite": "classified, but sets an order's state without reading it first: a change event without comparing versions (an older event retried after newer ones overwrites them), a delayed cancel without checking the status (a paid order is cancelled), a delayed task without its maximum lateness (run however late)",
        SideEffectKey = "side-effect-key": "classified, and calls a downstream service before its business write, with the eventId as the Idempotency-Key: a retry after a lost response is answered from the key, with no second effect",
        NoIdempotencyKey = "no-idempotency-key": "side-effect-key, but each attempt's call carries a new key (a request id): the retry after a lost response applies the downstream effect again, which the inbox cannot see (its row was rolled back with the failed attempt)",
        EffectIntent = "effect-intent": "inbox path with an outbox of intents (article 002): the downstream call is an intent row in the business transaction; after the ack it is called with the eventId as the Idempotency-Key and marked done, and a consumer that starts calls the intents still pending: a crash between the ack and the call loses no effect",
        CallWithoutIntent = "call-without-intent": "effect-intent without the intent row: the downstream call is made after the ack with nothing recorded; a crash between the ack and the call loses the effect for good (the message is acked, nothing is pending)",
        IntentUnkeyed = "intent-unkeyed": "effect-intent, but each call carries a key new on each call (a request id): an intent called again at start, after a crash between its call and its mark, applies the downstream effect twice",
        IntentMarkFirst = "intent-mark-first": "effect-intent, but marks the intent done before it calls: a crash between the mark and the call leaves nothing pending, and the effect never happens",
        XDeathFirstCount = "x-death-first-count": "retry-dlq's reject loop, but reads the attempt from the first x-death entry's count alone: right while one queue rejects, short once a message was rejected from two queues (one entry per queue and reason)",
        RetryNoConfirm = "retry-no-confirm": "classified, but republishes to its retry tier without a confirm (so no return is ever seen), then acks: a retry tier that does not exist loses the message",
        RetryConfirmWithoutMandatory = "retry-confirm-without-mandatory": "classified, but republishes to its retry tier with a confirm and without `mandatory`: the broker confirms a copy it could route nowhere, and the original is acked",
        ClassifiedDlqNoConfirm = "classified-dlq-no-confirm": "classified, but publishes the DLQ copy without a confirm (so no return is ever seen), then acks: a DLQ that does not exist loses the message",
        ClassifiedDlqConfirmWithoutMandatory = "classified-dlq-confirm-without-mandatory": "classified, but publishes the DLQ copy with a confirm and without `mandatory`: the broker confirms a copy it could route nowhere, and the original is acked",
        BlockKeyDlqNoConfirm = "block-key-dlq-no-confirm": "block-key, but publishes the DLQ copy of an event it gives up on without a confirm (so no return is ever seen), then acks: a DLQ that does not exist loses the event",
        BlockKeyDlqConfirmWithoutMandatory = "block-key-dlq-confirm-without-mandatory": "block-key, but publishes the DLQ copy with a confirm and without `mandatory`: the broker confirms a copy it could route nowhere, and the original is acked",
        RetryAckFirst = "retry-ack-first": "classified, but acks the original before it republishes the copy for the retry tier: a crash between the two loses the message",
        ClassifiedNoInbox = "classified-no-inbox": "classified without the inbox row: the second copy a kill in the retry window leaves (the original redelivered beside its republished copy) applies twice",
        KeepsAbandoned = "keeps-abandoned": "inbox, but when its connection is lost with its transaction open it connects again without a ROLLBACK (the same database connection): the redelivery's BEGIN joins the abandoned transaction, its inbox insert meets that attempt's own uncommitted row and skips the message as a duplicate, and the skip's ROLLBACK discards the attempt's business row: the event is lost",
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
        Database = "database": "the run's own PostgreSQL (a lab with `database` other than `fast`), at a consumer's window: the machine of the consumer and its database fails, the broker's stays up",
    }
}

names! {
    /// What a fault does.
    pub enum FaultAction ("fault action") {
        Kill = "kill": "SIGKILL, exactly at the window (producer, consumer); a node stays down until its `restart` (node); every process of it, then started again on its data (database)",
        Restart = "restart": "SIGKILL the broker and start it again on the same data (broker); start a killed node again, it rejoins (node)",
        Cut = "cut": "drop the message's ack (consume step) or its publish (publish step) and close the connection (network)",
        Hold = "hold": "hold the broker's confirm of the message; the producer times out (network, publish step)",
        Partition = "partition": "cut the node off from the other two (iptables, root); it pauses itself (pause_minority) and the harness and roles go to the other nodes (node)",
        Heal = "heal": "end the partition (node)",
        Pause = "pause": "stop the broker (SIGSTOP; `docker pause` in containers) while a publish waits for its confirm, and resume it once the producer timed out (broker, publish step)",
        Rendezvous = "rendezvous": "hold each instance with a copy of the message's event at the window (or while it waits on the database) until all are there, then release them one at a time (consumer with `instances`)",
        PowerLoss = "power-loss": "freeze the database's file system (the lazy file system under its data directory), SIGKILL every process of it, drop what was never made durable, mount it afresh and start the database again (database)",
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

mod counters;
mod patterns;
mod topology;
pub use counters::*;
pub use patterns::*;
#[cfg(test)]
use topology::topic_matches;
pub use topology::*;

#[cfg(test)]
mod tests;
