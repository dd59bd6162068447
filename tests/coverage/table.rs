//! The coverage test's table, in a file of its own (tests/coverage.rs
//! stays under the project's ~800 lines): each safe step and the
//! counterexample that edits it, the steps that are the work itself, the
//! counterexample patterns waiting for a lab.

use mqlab::vocab::{Pattern, Step};

/// How a counterexample differs from the safe pattern, in one step.
#[derive(Debug)]
pub enum Edit {
    /// The step is gone (and, for the ack, the broker acks on delivery).
    Removed(Step),
    /// The step is done another way.
    Replaced(Step, &'static [Step]),
    /// Two steps in the other order.
    Swapped(Step, Step),
    /// The step is gone, and the path is this one instead (a guard done
    /// another way, at other places).
    Rewritten(Step, &'static [Step]),
    /// One setting of the failure path changed, named.
    Failure(&'static str),
    /// The transaction a lost connection abandoned is kept, not rolled
    /// back, when the consumer connects again (its steps unchanged).
    KeepsAbandoned,
}

/// The safe patterns' steps and, for each, the counterexample that edits it.
pub const COVERAGE: &[(Pattern, Edit, Pattern)] = &[
    (
        Pattern::Inbox,
        Edit::Removed(Step::InboxInsert),
        Pattern::NoInbox,
    ),
    (
        Pattern::Inbox,
        Edit::Replaced(Step::InboxInsert, &[Step::InboxOwnTx]),
        Pattern::DedupOutsideTx,
    ),
    // The reconnect's ROLLBACK of what the lost connection left open
    // (abandoned-transaction@keeps-abandoned).
    (
        Pattern::Inbox,
        Edit::KeepsAbandoned,
        Pattern::KeepsAbandoned,
    ),
    // The row on a helper's own connection (article 000: another DbContext).
    (
        Pattern::Inbox,
        Edit::Replaced(Step::InboxInsert, &[Step::InboxOtherConnection]),
        Pattern::DedupOtherConnection,
    ),
    (
        Pattern::Inbox,
        Edit::Replaced(Step::InboxInsert, &[Step::InboxInsertBlind]),
        Pattern::NoDigest,
    ),
    (
        Pattern::Inbox,
        Edit::Replaced(Step::InboxInsert, &[Step::InboxInsertByEvent]),
        Pattern::InboxByEvent,
    ),
    (
        Pattern::Inbox,
        Edit::Replaced(Step::InboxInsert, &[Step::SkipRedelivered]),
        Pattern::DedupByRedelivered,
    ),
    (
        Pattern::Inbox,
        Edit::Swapped(Step::Commit, Step::Ack),
        Pattern::AckBeforeCommit,
    ),
    (Pattern::Inbox, Edit::Removed(Step::Ack), Pattern::AutoAck),
    // The unique insert's guard as a SELECT first, the insert after the
    // write ignoring a conflict: two copies at once both pass.
    (
        Pattern::Inbox,
        Edit::Rewritten(
            Step::InboxInsert,
            &[
                Step::Receive,
                Step::InboxSelect,
                Step::Write,
                Step::InboxInsertIgnoring,
                Step::Commit,
                Step::Ack,
            ],
        ),
        Pattern::CheckThenInsert,
    ),
    (
        Pattern::Inbox,
        Edit::Failure("retry"),
        Pattern::RequeueForever,
    ),
    // Without the confirm there is nothing to wait for a return on: the
    // counterexample drops `mandatory` with it.
    (
        Pattern::Inbox,
        Edit::Failure("dlq confirm"),
        Pattern::DlqNoConfirm,
    ),
    (
        Pattern::Inbox,
        Edit::Failure("dlq mandatory"),
        Pattern::DlqConfirmWithoutMandatory,
    ),
    (
        Pattern::Inbox,
        Edit::Failure("dlq order"),
        Pattern::DlqAckFirst,
    ),
    (
        Pattern::Inbox,
        Edit::Failure("attempts"),
        Pattern::AttemptsFromHeader,
    ),
    // x-death read another way: one entry's count, not the sum of the
    // rejections over every (queue, reason) entry.
    (
        Pattern::Inbox,
        Edit::Failure("attempts"),
        Pattern::XDeathFirstCount,
    ),
    // The article's other way to a duplicate: the INSERT without ON
    // CONFLICT under a savepoint, the unique violation caught.
    (
        Pattern::InboxSavepoint,
        Edit::Replaced(Step::InboxInsertSavepoint, &[Step::InboxInsertCatching]),
        Pattern::CatchUniqueViolation,
    ),
    (
        Pattern::Classified,
        Edit::Failure("attempts"),
        Pattern::ClassifiedXDeath,
    ),
    (
        Pattern::Classified,
        Edit::Failure("dlq order"),
        Pattern::AckThenPublish,
    ),
    // Article 000: wait for the new message's confirm, then ack the
    // original (the order: retry-window@retry-ack-first); and `mandatory`,
    // or the broker confirms a copy it routed nowhere. For the retry tier's
    // copy (retry-tiers@retry-no-confirm, @retry-confirm-without-mandatory)
    // and the DLQ's (failure-classes@dlq-no-confirm,
    // @dlq-confirm-without-mandatory).
    (
        Pattern::Classified,
        Edit::Failure("retry order"),
        Pattern::RetryAckFirst,
    ),
    (
        Pattern::Classified,
        Edit::Failure("retry confirm"),
        Pattern::RetryNoConfirm,
    ),
    (
        Pattern::Classified,
        Edit::Failure("retry mandatory"),
        Pattern::RetryConfirmWithoutMandatory,
    ),
    (
        Pattern::Classified,
        Edit::Failure("dlq confirm"),
        Pattern::ClassifiedDlqNoConfirm,
    ),
    (
        Pattern::Classified,
        Edit::Failure("dlq mandatory"),
        Pattern::ClassifiedDlqConfirmWithoutMandatory,
    ),
    // The inbox on the classified path: a kill in the retry window leaves
    // two copies (retry-window@no-inbox).
    (
        Pattern::Classified,
        Edit::Removed(Step::InboxInsert),
        Pattern::ClassifiedNoInbox,
    ),
    (
        Pattern::Classified,
        Edit::Failure("by class"),
        Pattern::RetryEverything,
    ),
    (
        Pattern::Classified,
        Edit::Failure("backoff"),
        Pattern::NoBackoff,
    ),
    (
        Pattern::Classified,
        Edit::Failure("backoff"),
        Pattern::LongestDelay,
    ),
    // Article 002: without the time budget, the attempts stop at the count.
    (
        Pattern::Classified,
        Edit::Failure("budget"),
        Pattern::RetryCountOnly,
    ),
    // The write's guards, both read from the order's state before it is
    // set: the version comparison (a change event only when newer:
    // per-key-order@overwrite) and the status check (a delayed cancel only
    // while unpaid: delayed-cancel@overwrite).
    (
        Pattern::Classified,
        Edit::Replaced(Step::Write, &[Step::WriteOverwrite]),
        Pattern::Overwrite,
    ),
    // The other safe design for a key in retry: block it. Its one safety
    // step is its failure path (retry in place, the delivery held); sent
    // to a retry queue instead, the unguarded write is set back
    // (per-key-block@retry-queue).
    (
        Pattern::BlockKey,
        Edit::Failure("retry"),
        Pattern::Overwrite,
    ),
    // Its DLQ move, for an event it gives up on (per-key-block@dlq-no-confirm,
    // @dlq-confirm-without-mandatory).
    (
        Pattern::BlockKey,
        Edit::Failure("dlq confirm"),
        Pattern::BlockKeyDlqNoConfirm,
    ),
    (
        Pattern::BlockKey,
        Edit::Failure("dlq mandatory"),
        Pattern::BlockKeyDlqConfirmWithoutMandatory,
    ),
    // The downstream call's stable key: the eventId, not a request id new
    // on each attempt (side-effects@no-idempotency-key).
    (
        Pattern::SideEffectKey,
        Edit::Replaced(Step::CallDownstream, &[Step::CallDownstreamUnkeyed]),
        Pattern::NoIdempotencyKey,
    ),
    // The outbox of intents: without the intent row (and so without its
    // mark), the call after the ack is owed by nothing
    // (effect-intents@call-without-intent); the call's key, the eventId,
    // makes a second call of a pending intent a replay
    // (effect-intents@intent-unkeyed).
    (
        Pattern::EffectIntent,
        Edit::Rewritten(
            Step::IntentInsert,
            &[
                Step::Receive,
                Step::InboxInsert,
                Step::Write,
                Step::Commit,
                Step::Ack,
                Step::CallAfterAck,
            ],
        ),
        Pattern::CallWithoutIntent,
    ),
    (
        Pattern::EffectIntent,
        Edit::Replaced(Step::CallAfterAck, &[Step::CallAfterAckUnkeyed]),
        Pattern::IntentUnkeyed,
    ),
    // The mark after the call: marked first, a crash between the two
    // leaves nothing pending (effect-intents@intent-mark-first).
    (
        Pattern::EffectIntent,
        Edit::Swapped(Step::CallAfterAck, Step::IntentDone),
        Pattern::IntentMarkFirst,
    ),
];

/// Steps that are the work itself, not a safety step: removing them
/// removes the consumer. Each with why.
pub const NOT_SAFETY_STEPS: &[(Step, &str)] = &[
    (Step::Receive, "the delivery itself"),
    (
        Step::Commit,
        "without it nothing is written; its place before the ack is the safety step (Swapped)",
    ),
    (
        Step::WriteOverwrite,
        "the write without its guards: a safe pattern that uses it (block-key) owes its safety to another step, which has its counterexample",
    ),
];

/// Counterexample patterns that no lab variant runs yet, each with why.
pub const AWAITING_A_LAB: &[(Pattern, &str)] = &[];
