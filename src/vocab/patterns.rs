//! Consumer patterns as data: each pattern's success path as ordered steps,
//! its failure handling, and the windows derived from them. A table
//! (`PATTERNS`) with the code that reads it; long because the table is.

use super::*;

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
    /// out of attempts, and for the other classes, as `Classified`, its DLQ
    /// copy published as `dlq_publish` says.
    RetryInPlace { dlq_publish: Publish },
    /// Article 000's classes: transient failures republished to retry tiers
    /// (with a `retry-attempt` header and a confirm, then acked), a business
    /// rejection recorded and acked, poison and invariant violations moved
    /// to the DLQ at once.
    Classified {
        attempts: AttemptsFrom,
        dlq: DlqOrder,
        /// The order of the retry copy's publish and the original's ack.
        retry_order: DlqOrder,
        /// How the copy for a retry tier is published.
        retry_publish: Publish,
        /// How the DLQ copy is published.
        dlq_publish: Publish,
        /// `false`: every failure is taken as transient (retried, then dead-lettered).
        by_class: bool,
        /// Which tier attempt k is republished to.
        backoff: Backoff,
        /// Whether it stops retrying once the retry policy's time budget
        /// (`max_duration_ms`, from the first failure) is spent, whichever
        /// of the count and the duration comes first; `false`: the count alone.
        budget: bool,
    },
}

/// How a failure path publishes its copy (to a retry tier, to the DLQ)
/// before it acks the original. Article 000: wait for the new message's
/// confirm, then ack the original; `mandatory` makes the broker return a
/// copy it cannot route instead of confirming it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Publish {
    /// Wait for the publisher confirm (and so see a return) before the ack.
    pub confirm: bool,
    /// The broker returns a copy no queue takes.
    pub mandatory: bool,
}

/// A copy confirmed, and returned when no queue takes it: the safe way.
pub const GUARDED: Publish = Publish {
    confirm: true,
    mandatory: true,
};

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

/// The order of a failure path's two effects: its copy published (to the
/// DLQ, or to a retry tier: `retry_order`) and the original acked.
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
    /// What it does, before it connects again, with the transaction a lost
    /// connection left open.
    pub abandoned: Abandoned,
}

/// The transaction a consumer's lost connection abandoned (the delivery it
/// belonged to comes again, redelivered).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Abandoned {
    /// ROLLBACK: the redelivery starts from nothing.
    RolledBack,
    /// Left open on the same database connection: the redelivery's BEGIN
    /// joins it, and its statements meet the abandoned attempt's rows.
    Kept,
}

use Step::*;

const SAFE_PATH: &[Step] = &[Receive, InboxInsert, Write, Commit, Ack];

/// Article 000's failure classes: retry tiers by a header, the DLQ confirmed.
const CLASSIFIED_FAILURE: OnFailure = OnFailure::Classified {
    attempts: AttemptsFrom::Header,
    dlq: DlqOrder::ConfirmThenAck,
    retry_order: DlqOrder::ConfirmThenAck,
    retry_publish: GUARDED,
    dlq_publish: GUARDED,
    by_class: true,
    backoff: Backoff::ByAttempt,
    budget: true,
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
        abandoned: Abandoned::RolledBack,
        safe: true,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::NoInbox,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: &[Receive, Write, Commit, Ack],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::AckBeforeCommit,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: &[Receive, InboxInsert, Write, Ack, Commit],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::AutoAck,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: &[Receive, InboxInsert, Write, Commit],
        auto_ack: true,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::DedupOutsideTx,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: &[Receive, InboxOwnTx, Write, Commit, Ack],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::DedupOtherConnection,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: &[Receive, InboxOtherConnection, Write, Commit, Ack],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::RequeueForever,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: OnFailure::RequeueForever,
    },
    PatternDef {
        pattern: Pattern::DlqNoConfirm,
        abandoned: Abandoned::RolledBack,
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
        abandoned: Abandoned::RolledBack,
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
        abandoned: Abandoned::RolledBack,
        safe: true,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: CLASSIFIED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::SideEffectKey,
        abandoned: Abandoned::RolledBack,
        safe: true,
        steps: &[Receive, InboxInsert, CallDownstream, Write, Commit, Ack],
        auto_ack: false,
        on_failure: CLASSIFIED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::NoIdempotencyKey,
        abandoned: Abandoned::RolledBack,
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
        abandoned: Abandoned::RolledBack,
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
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: &[Receive, InboxInsert, Write, Commit, Ack, CallAfterAck],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::IntentUnkeyed,
        abandoned: Abandoned::RolledBack,
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
        abandoned: Abandoned::RolledBack,
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
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: OnFailure::Classified {
            attempts: AttemptsFrom::XDeath,
            dlq: DlqOrder::ConfirmThenAck,
            retry_order: DlqOrder::ConfirmThenAck,
            retry_publish: GUARDED,
            dlq_publish: GUARDED,
            by_class: true,
            backoff: Backoff::ByAttempt,
            budget: true,
        },
    },
    PatternDef {
        pattern: Pattern::AckThenPublish,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: OnFailure::Classified {
            attempts: AttemptsFrom::Header,
            dlq: DlqOrder::AckThenPublish,
            retry_order: DlqOrder::ConfirmThenAck,
            retry_publish: GUARDED,
            dlq_publish: GUARDED,
            by_class: true,
            backoff: Backoff::ByAttempt,
            budget: true,
        },
    },
    PatternDef {
        pattern: Pattern::CheckThenInsert,
        abandoned: Abandoned::RolledBack,
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
        pattern: Pattern::RetryCountOnly,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: OnFailure::Classified {
            attempts: AttemptsFrom::Header,
            dlq: DlqOrder::ConfirmThenAck,
            retry_order: DlqOrder::ConfirmThenAck,
            retry_publish: GUARDED,
            dlq_publish: GUARDED,
            by_class: true,
            backoff: Backoff::ByAttempt,
            budget: false,
        },
    },
    PatternDef {
        pattern: Pattern::RetryEverything,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: OnFailure::Classified {
            attempts: AttemptsFrom::Header,
            dlq: DlqOrder::ConfirmThenAck,
            retry_order: DlqOrder::ConfirmThenAck,
            retry_publish: GUARDED,
            dlq_publish: GUARDED,
            by_class: false,
            backoff: Backoff::ByAttempt,
            budget: true,
        },
    },
    PatternDef {
        pattern: Pattern::NoBackoff,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: OnFailure::Classified {
            attempts: AttemptsFrom::Header,
            dlq: DlqOrder::ConfirmThenAck,
            retry_order: DlqOrder::ConfirmThenAck,
            retry_publish: GUARDED,
            dlq_publish: GUARDED,
            by_class: true,
            backoff: Backoff::FirstTier,
            budget: true,
        },
    },
    PatternDef {
        pattern: Pattern::LongestDelay,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: OnFailure::Classified {
            attempts: AttemptsFrom::Header,
            dlq: DlqOrder::ConfirmThenAck,
            retry_order: DlqOrder::ConfirmThenAck,
            retry_publish: GUARDED,
            dlq_publish: GUARDED,
            by_class: true,
            backoff: Backoff::LastTier,
            budget: true,
        },
    },
    PatternDef {
        pattern: Pattern::AttemptsFromHeader,
        abandoned: Abandoned::RolledBack,
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
        abandoned: Abandoned::RolledBack,
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
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: &[Receive, InboxInsertBlind, Write, Commit, Ack],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::InboxByEvent,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: &[Receive, InboxInsertByEvent, Write, Commit, Ack],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::InboxSavepoint,
        abandoned: Abandoned::RolledBack,
        safe: true,
        steps: &[Receive, InboxInsertSavepoint, Write, Commit, Ack],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::CatchUniqueViolation,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: &[Receive, InboxInsertCatching, Write, Commit, Ack],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::BlockKey,
        abandoned: Abandoned::RolledBack,
        safe: true,
        steps: &[Receive, InboxInsert, WriteOverwrite, Commit, Ack],
        auto_ack: false,
        on_failure: OnFailure::RetryInPlace {
            dlq_publish: GUARDED,
        },
    },
    PatternDef {
        pattern: Pattern::Overwrite,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: &[Receive, InboxInsert, WriteOverwrite, Commit, Ack],
        auto_ack: false,
        on_failure: CLASSIFIED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::XDeathFirstCount,
        abandoned: Abandoned::RolledBack,
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
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: &[Receive, SkipRedelivered, Write, Commit, Ack],
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::RetryNoConfirm,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: classified_copies(DlqOrder::ConfirmThenAck, UNGUARDED, GUARDED),
    },
    PatternDef {
        pattern: Pattern::RetryConfirmWithoutMandatory,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: classified_copies(DlqOrder::ConfirmThenAck, CONFIRMED_ONLY, GUARDED),
    },
    PatternDef {
        pattern: Pattern::ClassifiedDlqNoConfirm,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: classified_copies(DlqOrder::ConfirmThenAck, GUARDED, UNGUARDED),
    },
    PatternDef {
        pattern: Pattern::ClassifiedDlqConfirmWithoutMandatory,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: classified_copies(DlqOrder::ConfirmThenAck, GUARDED, CONFIRMED_ONLY),
    },
    PatternDef {
        pattern: Pattern::BlockKeyDlqNoConfirm,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: &[Receive, InboxInsert, WriteOverwrite, Commit, Ack],
        auto_ack: false,
        on_failure: OnFailure::RetryInPlace {
            dlq_publish: UNGUARDED,
        },
    },
    PatternDef {
        pattern: Pattern::BlockKeyDlqConfirmWithoutMandatory,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: &[Receive, InboxInsert, WriteOverwrite, Commit, Ack],
        auto_ack: false,
        on_failure: OnFailure::RetryInPlace {
            dlq_publish: CONFIRMED_ONLY,
        },
    },
    PatternDef {
        pattern: Pattern::RetryAckFirst,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: classified_copies(DlqOrder::AckThenPublish, GUARDED, GUARDED),
    },
    PatternDef {
        pattern: Pattern::ClassifiedNoInbox,
        abandoned: Abandoned::RolledBack,
        safe: false,
        steps: &[Receive, Write, Commit, Ack],
        auto_ack: false,
        on_failure: CLASSIFIED_FAILURE,
    },
    PatternDef {
        pattern: Pattern::KeepsAbandoned,
        abandoned: Abandoned::Kept,
        safe: false,
        steps: SAFE_PATH,
        auto_ack: false,
        on_failure: SEED_FAILURE,
    },
];

/// A copy published and acked at once: no confirm, so no return is seen
/// either (`mandatory` would have nothing to wait on).
const UNGUARDED: Publish = Publish {
    confirm: false,
    mandatory: false,
};

/// A copy confirmed, but not `mandatory`: the broker confirms a copy it
/// could route nowhere.
const CONFIRMED_ONLY: Publish = Publish {
    confirm: true,
    mandatory: false,
};

/// Article 000's classes with the retry copy's order and the retry tier's
/// and the DLQ's publishes as given (the counterexamples of one copy's
/// guard or order).
const fn classified_copies(
    retry_order: DlqOrder,
    retry_publish: Publish,
    dlq_publish: Publish,
) -> OnFailure {
    OnFailure::Classified {
        attempts: AttemptsFrom::Header,
        dlq: DlqOrder::ConfirmThenAck,
        retry_order,
        retry_publish,
        dlq_publish,
        by_class: true,
        backoff: Backoff::ByAttempt,
        budget: true,
    }
}

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
            InboxOwnTx | InboxOtherConnection => Some(Window::AfterInboxCommit),
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
    /// (`inbox_commits_alone`: its row survives the rollback, so a message
    /// never gets past its first attempt).
    pub fn windows_for(&self, dlq: bool) -> Vec<Window> {
        let seed_dlq = dlq && !self.auto_ack && !self.inbox_commits_alone();
        let failure: Vec<Window> = match self.on_failure {
            OnFailure::Classified {
                dlq,
                retry_order,
                dlq_publish,
                ..
            } => {
                let retry = match retry_order {
                    DlqOrder::ConfirmThenAck => Window::AfterRetryPublishBeforeAck,
                    DlqOrder::AckThenPublish => Window::AfterAckBeforeRetryPublish,
                };
                // Without the DLQ copy's confirm there is no point "after
                // the confirm" (as for the seed's move below).
                let dlq = match (dlq, dlq_publish.confirm) {
                    (DlqOrder::ConfirmThenAck, true) => Some(Window::AfterDlqConfirmBeforeAck),
                    (DlqOrder::ConfirmThenAck, false) => None,
                    (DlqOrder::AckThenPublish, _) => Some(Window::AfterAckBeforeDlqPublish),
                };
                std::iter::once(retry).chain(dlq).collect()
            }
            // The seed's DLQ move: confirmed, then acked (without a
            // confirm there is no point "after the confirm").
            OnFailure::RetryThenDlq {
                confirm: true,
                dlq: DlqOrder::ConfirmThenAck,
                ..
            } if seed_dlq => vec![Window::AfterDlqConfirmBeforeAck],
            OnFailure::RetryThenDlq {
                dlq: DlqOrder::AckThenPublish,
                ..
            } if seed_dlq => vec![Window::AfterAckBeforeDlqPublish],
            OnFailure::RetryInPlace {
                dlq_publish: Publish { confirm: true, .. },
            } => vec![Window::AfterDlqConfirmBeforeAck],
            OnFailure::RetryInPlace { .. }
            | OnFailure::RetryThenDlq { .. }
            | OnFailure::RequeueForever => vec![],
        };
        (0..self.steps.len())
            .filter_map(|i| self.window_after(i))
            .chain(failure)
            .collect()
    }

    /// Whether its inbox row commits apart from the business row (its own
    /// transaction, or a connection of its own): the row survives the
    /// business transaction's rollback.
    pub fn inbox_commits_alone(&self) -> bool {
        self.steps
            .iter()
            .any(|s| matches!(s, InboxOwnTx | InboxOtherConnection))
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
