//! Counters: pure functions from what was observed (the transcript, the kill's
//! wait status, PostgreSQL and broker state) to a value. Nothing here talks to
//! a server, so every counter is unit-tested on literal transcripts.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::expect::Expect;
use crate::store::Ground;
use crate::transcript::Entry;
use crate::vocab::{Check, Counter, CounterRef, Role, Status, NOT_READ};

/// Facts the runner gathered by watching processes and asking the servers;
/// stored with the run, so that `mqlab check` can re-judge it offline.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Observed {
    pub crash_exit_code: Option<i32>,
    pub crash_business_rows: Option<i64>,
    pub consumer_exit_code: Option<i32>,
    pub depths: BTreeMap<String, u32>,
    pub ground: Ground,
    /// The lab's messages: message id → eventId (the identity).
    #[serde(default)]
    pub events: Events,
    /// Queues read without consuming (for `dlqHeader`): each message's headers.
    #[serde(default)]
    pub dlq: BTreeMap<String, Vec<BTreeMap<String, String>>>,
    /// What each queue a `heldAfter` counter names still holds in any state
    /// (ready, unacked, waiting for its dead-letter target), read from the
    /// queue's process or leader at the assertion.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub held: BTreeMap<String, u64>,
    /// Ready messages of each queue a consumer kill's `depthAtKill` names,
    /// read while the consumer was held at its window, before the kill.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub depths_at_kill: BTreeMap<String, u32>,
    /// Unacked messages of each queue a consumer kill's `unackedAtKill`
    /// names, as the broker counted them at the same moment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unacked_at_kill: BTreeMap<String, u32>,
    /// Whether each queue a consumer kill's `oldestAgeShownAtKill` names
    /// told the age of its oldest message at the same moment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ages_shown_at_kill: BTreeMap<String, bool>,
    /// The TTL of each retry tier of the lab, in order: the wait attempt k
    /// owes (tier k, the last one after that), read from the lab, not from
    /// the tier the consumer chose.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retry_tiers: Vec<u64>,
    /// What the harness's downstream service received, when a step ran one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downstream: Option<Vec<DownstreamCall>>,
    /// The services whose consume steps call the downstream service: each
    /// of their applied events is owed an effect.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub downstream_callers: BTreeSet<String>,
}

/// One call the harness's downstream service received, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DownstreamCall {
    /// The calling service (empty: a caller that did not say).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service: String,
    /// The eventId of the body (`?` when the body names none).
    pub event_id: String,
    /// Whether this call applied an effect (false: a key seen before).
    pub effect: bool,
    /// Whether its response was lost (the connection closed unanswered).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub response_lost: bool,
}

/// Downstream effects applied beyond the first per event.
fn duplicate_side_effects(calls: &[DownstreamCall]) -> usize {
    let mut per: BTreeMap<&str, usize> = BTreeMap::new();
    for c in calls.iter().filter(|c| c.effect) {
        *per.entry(&c.event_id).or_default() += 1;
    }
    per.values().map(|n| n - 1).sum()
}

/// (service, eventId) pairs a calling service applied (a business row)
/// with no downstream effect of its own call. Services that call no
/// downstream owe none.
fn missing_side_effects(obs: &Observed, calls: &[DownstreamCall]) -> usize {
    let effects: BTreeSet<(&str, &str)> = calls
        .iter()
        .filter(|c| c.effect)
        .map(|c| (c.service.as_str(), c.event_id.as_str()))
        .collect();
    obs.ground
        .business
        .iter()
        .filter(|(s, _)| obs.downstream_callers.contains(s))
        .map(|(s, e)| (s.as_str(), e.as_str()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|p| !effects.contains(p))
        .count()
}

/// Message id → eventId for the messages a lab publishes. A resend carries
/// the first send's id with a suffix (`mid-2.2`): the same event.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Events(pub BTreeMap<String, String>);

impl Events {
    pub fn of<'a>(&'a self, message_id: &'a str) -> &'a str {
        let base = message_id.split_once('.').map_or(message_id, |(b, _)| b);
        self.0
            .get(message_id)
            .or_else(|| self.0.get(base))
            .map(String::as_str)
            .unwrap_or(message_id)
    }
}

/// Which services had to apply each event: eventId → each queue its publish
/// was routed to → the services that consume that queue (none for a queue
/// no step consumes). Worked out from the lab's topology and steps, so a
/// service that never saw an event still owes it. An event with no entry
/// (a route that cannot be told, a run stored before this was recorded)
/// is owed by "some service", as before.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Owed(pub BTreeMap<String, BTreeMap<String, BTreeSet<String>>>);

/// The copies the lab's queues still hold, by the queue each is held for:
/// the queue it sits in and, for a copy moved from another queue, that one
/// too (a consumer's DLQ or retry copy names it in `original-queue`, a copy
/// the broker dead-lettered in `x-first-death-queue`; a copy a consumer
/// moved after the broker dead-lettered it, both; a copy the producer
/// parked, the one queue its event was owed to). A copy in a parking
/// queue or a DLQ that names no origin is held for no service's queue.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Queued(pub BTreeMap<String, BTreeSet<String>>);

impl Queued {
    fn holds(&self, queue: &str, event: &str) -> bool {
        self.0.get(queue).is_some_and(|es| es.contains(event))
    }
}

/// Per business event (eventId), from what the producer sent (whatever the
/// broker answered: a returned message is lost too unless someone parked
/// it), the business rows in PostgreSQL and what still sits in the lab's
/// queues (a DLQ, a parking queue, a queue it loops in):
/// - `lost`: per (service, eventId) the event was owed to ([`Owed`]): not
///   applied nor rejected (recorded) by that service, and no copy held
///   for one of its queues ([`Queued`]: a copy in a DLQ or a retry tier
///   is held for the queue it came from). An event owed to no known
///   service: applied or rejected by none, in no queue;
/// - `duplicatesApplied`: business effects beyond the first per (service, eventId);
/// - `unexpected`: applied, never sent.
pub fn total_queue(
    entries: &[Entry],
    ground: &Ground,
    queued: &BTreeSet<String>,
    events: &Events,
    owed: &Owed,
    queued_in: &Queued,
) -> Vec<(Check, usize)> {
    let sent: BTreeSet<&str> = entries
        .iter()
        .filter(|e| e.role == Role::Producer.name())
        .filter(|e| {
            e.get("status")
                .and_then(|s| s.parse::<Status>().ok())
                .is_some_and(|s| s.is_a_send())
        })
        .filter_map(|e| e.get("messageId"))
        .map(|m| events.of(m))
        .collect();
    let applied: BTreeSet<&str> = ground.business.iter().map(|(_, e)| e.as_str()).collect();
    let rejected: BTreeSet<&str> = ground.rejected.iter().map(|(_, e)| e.as_str()).collect();
    let done: BTreeSet<(&str, &str)> = ground
        .business
        .iter()
        .chain(&ground.rejected)
        .map(|(s, e)| (s.as_str(), e.as_str()))
        .collect();
    let mut lost = 0;
    for e in &sent {
        // Each service the event was owed to, with the queues it consumes it from.
        let mut owing: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (q, services) in owed.0.get(*e).into_iter().flatten() {
            for s in services {
                owing.entry(s.as_str()).or_default().push(q.as_str());
            }
        }
        if owing.is_empty() {
            if !applied.contains(e) && !rejected.contains(e) && !queued.contains(*e) {
                lost += 1;
            }
            continue;
        }
        lost += owing
            .iter()
            .filter(|(s, queues)| {
                !done.contains(&(**s, *e)) && !queues.iter().any(|q| queued_in.holds(q, e))
            })
            .count();
    }
    let unexpected = applied.iter().filter(|e| !sent.contains(*e)).count();
    Check::ALL
        .iter()
        .map(|(c, _, _)| {
            (
                *c,
                match c {
                    Check::Lost => lost,
                    Check::DuplicatesApplied => duplicates_applied(ground),
                    Check::Unexpected => unexpected,
                },
            )
        })
        .collect()
}

fn duplicates_applied(ground: &Ground) -> usize {
    let mut per: BTreeMap<&(String, String), usize> = BTreeMap::new();
    for row in &ground.business {
        *per.entry(row).or_default() += 1;
    }
    per.values().map(|n| n - 1).sum()
}

/// The order states read from PostgreSQL, or why there are none to read.
fn order_states(obs: &Observed) -> Result<&[(String, String, i64, String)], String> {
    obs.ground
        .states
        .as_deref()
        .ok_or_else(|| "order states were not read (a program keeps its own tables)".to_string())
}

/// A value, or why it cannot be known (which fails the assertion). An
/// exhaustive match: a counter without an evaluator does not compile.
/// Long because it is that one match, an arm per counter, kept whole so
/// the compiler checks every counter has one.
pub fn evaluate(c: &CounterRef, entries: &[Entry], obs: &Observed) -> Result<String, String> {
    let q = c.arg.as_deref();
    let consumer = |status: Status| {
        entries.iter().filter(move |e| {
            e.is(Role::Consumer, status)
                // A black-box program's deliveries, as the harness saw them.
                || (status == Status::Received && e.is(Role::Observe, Status::Delivered))
        })
    };
    let on_queue = move |e: &&Entry| q.is_none() || e.get("destination") == q;
    let of_message = move |e: &&Entry| e.get("messageId") == q;
    let known = |v: Option<i64>, what: &str| {
        v.map(|n| n.to_string())
            .ok_or_else(|| format!("no {what} was observed"))
    };
    Ok(match c.counter {
        Counter::Confirmed => entries
            .iter()
            .filter(|e| e.is(Role::Producer, Status::Confirmed))
            .count()
            .to_string(),
        Counter::Received => consumer(Status::Received)
            .filter(on_queue)
            .count()
            .to_string(),
        Counter::Unique => consumer(Status::Received)
            .filter(on_queue)
            .filter_map(|e| e.get("messageId"))
            .collect::<BTreeSet<_>>()
            .len()
            .to_string(),
        Counter::UniqueEvents => consumer(Status::Received)
            .filter(on_queue)
            .filter_map(|e| e.get("messageId"))
            .map(|m| obs.events.of(m))
            .collect::<BTreeSet<_>>()
            .len()
            .to_string(),
        Counter::Redelivered => consumer(Status::Received)
            .filter(on_queue)
            .filter(|e| e.get("redelivered") == Some("true"))
            .count()
            .to_string(),
        Counter::DuplicatesObserved => consumer(Status::DuplicateSkipped)
            .filter(on_queue)
            .count()
            .to_string(),
        Counter::DuplicatesApplied => duplicates_applied(&obs.ground).to_string(),
        Counter::BusinessRows => obs.ground.business.len().to_string(),
        Counter::ProcessedRows => obs.ground.processed_rows.to_string(),
        Counter::DepthAfter => {
            let queue = q.unwrap_or_default();
            return obs.depths.get(queue).map(|d| d.to_string()).ok_or_else(|| {
                format!("queue `{queue}` could not be read (unavailable: its node down or cut off)")
            });
        }
        Counter::HeldAfter => {
            let queue = q.unwrap_or_default();
            return obs.held.get(queue).map(|d| d.to_string()).ok_or_else(|| {
                format!("what queue `{queue}` holds could not be read (its node down or cut off)")
            });
        }
        Counter::DepthAtKill | Counter::UnackedAtKill => {
            let queue = q.unwrap_or_default();
            let read = match c.counter {
                Counter::DepthAtKill => &obs.depths_at_kill,
                _ => &obs.unacked_at_kill,
            };
            return read
                .get(queue)
                .map(|d| d.to_string())
                .ok_or_else(|| format!("queue `{queue}` was not read at a consumer kill"));
        }
        Counter::OldestAgeShownAtKill => {
            let queue = q.unwrap_or_default();
            return match obs.ages_shown_at_kill.get(queue) {
                Some(true) => Ok("yes".into()),
                Some(false) => Ok("no".into()),
                None => Err(format!("queue `{queue}` was not read at a consumer kill")),
            };
        }
        Counter::Attempts => consumer(Status::Received)
            .filter(of_message)
            .filter_map(|e| e.get("attempt"))
            .collect::<Vec<_>>()
            .join(","),
        Counter::Deliveries => consumer(Status::Received)
            .filter(of_message)
            .count()
            .to_string(),
        Counter::DeliveriesBefore => {
            match consumer(Status::Received).position(|e| e.get("messageId") == q) {
                Some(i) => i.to_string(),
                None => "never".into(),
            }
        }
        // The order the harness read the lines in: with one consumer, the
        // commit order; a rejection recorded is no business commit.
        Counter::CommitOrder => entries
            .iter()
            .filter(|e| {
                e.is(Role::Consumer, Status::BusinessCommitted)
                    || e.is(Role::Observe, Status::Committed)
            })
            .filter(on_queue)
            .filter_map(|e| e.get("messageId"))
            .collect::<Vec<_>>()
            .join(","),
        Counter::DlqMoves => consumer(Status::PoisonToDlq).count().to_string(),
        Counter::Isolated => consumer(Status::MovedToDlq)
            .filter(|e| q.is_none() || e.get("failureClass") == q)
            .count()
            .to_string(),
        Counter::Retries => consumer(Status::RetryScheduled).count().to_string(),
        Counter::RetriesInPlace => consumer(Status::RetryInPlace).count().to_string(),
        Counter::Rejections => consumer(Status::BusinessRejected).count().to_string(),
        Counter::IntentsRecovered => consumer(Status::IntentRecovered).count().to_string(),
        Counter::RejectionRows => obs.ground.rejected.len().to_string(),
        Counter::RetryDelaysHonoured => {
            // Each redelivery of the message that waited at least the TTL
            // its previous attempt owed (the lab's tier for that attempt; a
            // run stored without the tiers: the tier the line names) and
            // less than the next tier's, or twice its own when that is
            // longer (and for the last tier): a TTL is no
            // precise timer, but a wait as long as a later tier's is a
            // retry sent to the wrong tier.
            let owed = |e: &Entry| -> Option<(u128, u128)> {
                let k: usize = e.get("attempt")?.parse().ok()?;
                let last = obs.retry_tiers.len().checked_sub(1)?;
                let i = k.saturating_sub(1).min(last);
                let t = u128::from(*obs.retry_tiers.get(i)?);
                let next = obs.retry_tiers.get(i + 1).map(|n| u128::from(*n));
                Some((t, next.map_or(2 * t, |n| n.max(2 * t))))
            };
            let mut ttl: Option<(u128, u128)> = None;
            let mut honoured = 0;
            for e in entries
                .iter()
                .filter(|e| e.role == Role::Consumer.name() && e.get("messageId") == q)
            {
                if e.is(Role::Consumer, Status::RetryScheduled) {
                    ttl = owed(e).or_else(|| {
                        let t: u128 = e.get("ttlMs")?.parse().ok()?;
                        Some((t, 2 * t))
                    });
                } else if e.is(Role::Consumer, Status::Received) {
                    let delay = e.get("delayMs").and_then(|d| d.parse::<u128>().ok());
                    if let (Some((t, within)), Some(d)) = (ttl.take(), delay) {
                        if d >= t && d < within {
                            honoured += 1;
                        }
                    }
                }
            }
            honoured.to_string()
        }
        Counter::DlqHeader => {
            let (queue, header) = q.unwrap_or_default().split_once('/').unwrap_or_default();
            let Some(messages) = obs.dlq.get(queue) else {
                return Err(format!("queue `{queue}` was not read"));
            };
            messages
                .iter()
                .map(|h| h.get(header).map(String::as_str).unwrap_or("-"))
                .collect::<Vec<_>>()
                .join(",")
        }
        Counter::DlqFailedFor => {
            let (queue, bound) = q.unwrap_or_default().split_once('/').unwrap_or_default();
            let bound: u128 = bound.parse().unwrap_or(u128::MAX);
            let Some(messages) = obs.dlq.get(queue) else {
                return Err(format!("queue `{queue}` was not read"));
            };
            let at =
                |h: &BTreeMap<String, String>, k: &str| humantime::parse_rfc3339(h.get(k)?).ok();
            let mut out = Vec::new();
            for h in messages {
                let (Some(first), Some(last)) = (at(h, "first-failed-at"), at(h, "last-failed-at"))
                else {
                    return Err(format!(
                        "a message in `{queue}` has no first-failed-at and last-failed-at"
                    ));
                };
                let span = last.duration_since(first).map_or(0, |d| d.as_millis());
                out.push(if span >= bound { "yes" } else { "no" });
            }
            out.join(",")
        }
        Counter::Returned => entries
            .iter()
            .filter(|e| e.is(Role::Producer, Status::Returned))
            .count()
            .to_string(),
        Counter::Nacked => entries
            .iter()
            .filter(|e| e.is(Role::Producer, Status::Nacked))
            .count()
            .to_string(),
        Counter::Published => entries
            .iter()
            .filter(|e| e.role == Role::Producer.name())
            .filter(|e| {
                e.get("status")
                    .and_then(|s| s.parse::<Status>().ok())
                    .is_some_and(|s| {
                        // A buffered message is published when its batch
                        // is sent (its `confirmed` line), if ever.
                        s.is_a_send()
                            && !matches!(
                                s,
                                Status::Parked | Status::OrderCommitted | Status::Buffered
                            )
                    })
            })
            .count()
            .to_string(),
        Counter::OrderVersion => {
            let versions: Vec<String> = order_states(obs)?
                .iter()
                .filter(|(_, order, ..)| Some(order.as_str()) == q)
                .map(|(_, _, v, _)| v.to_string())
                .collect();
            match versions.is_empty() {
                true => "none".into(),
                false => versions.join(","),
            }
        }
        Counter::WaitedAtLeast => {
            let (message, bound) = q.unwrap_or_default().split_once('/').unwrap_or_default();
            let bound: u128 = bound.parse().unwrap_or(u128::MAX);
            let waited = consumer(Status::Received)
                .find(|e| e.get("messageId") == Some(message))
                .and_then(|e| e.get("delayMs"))
                .and_then(|d| d.parse::<u128>().ok());
            match waited {
                Some(d) if d >= bound => "yes".into(),
                Some(_) => "no".into(),
                None => return Err(format!("no wait of {message} was measured")),
            }
        }
        Counter::OrderStatus => {
            let statuses: Vec<&str> = order_states(obs)?
                .iter()
                .filter(|(_, order, ..)| Some(order.as_str()) == q)
                .map(|(.., s)| s.as_str())
                .collect();
            match statuses.is_empty() {
                true => "none".into(),
                false => statuses.join(","),
            }
        }
        Counter::OrdersCommitted | Counter::OrdersWithoutEvent => {
            if obs.ground.orders.is_empty() {
                return Err(
                    "no order service committed an order (no publish step sets `orders`)".into(),
                );
            }
            if c.counter == Counter::OrdersCommitted {
                return Ok(obs.ground.orders.len().to_string());
            }
            let done: BTreeSet<&str> = obs
                .ground
                .business
                .iter()
                .chain(&obs.ground.rejected)
                .map(|(_, e)| e.as_str())
                .collect();
            obs.ground
                .orders
                .iter()
                .filter(|e| !done.contains(e.as_str()))
                .count()
                .to_string()
        }
        Counter::DownstreamCalls
        | Counter::DownstreamEffects
        | Counter::DuplicateSideEffects
        | Counter::MissingSideEffects => {
            let calls = obs.downstream.as_deref().ok_or_else(|| {
                "no downstream service ran (no consume step declares one)".to_string()
            })?;
            match c.counter {
                Counter::DownstreamCalls => calls.len(),
                Counter::DownstreamEffects => calls.iter().filter(|c| c.effect).count(),
                Counter::MissingSideEffects => missing_side_effects(obs, calls),
                _ => duplicate_side_effects(calls),
            }
            .to_string()
        }
        Counter::CrashExitCode => return known(obs.crash_exit_code.map(i64::from), "crash"),
        Counter::CrashAfterBusinessCommit => return known(obs.crash_business_rows, "crash"),
        Counter::ConsumerExitCode => {
            return known(obs.consumer_exit_code.map(i64::from), "consumer exit")
        }
    })
}

/// Which section of the transcript an outcome printed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutcomeKind {
    Assert,
    Check,
}

impl OutcomeKind {
    pub fn name(self) -> &'static str {
        match self {
            OutcomeKind::Assert => "assert",
            OutcomeKind::Check => "check",
        }
    }
}

/// One evaluated assertion or check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    pub kind: OutcomeKind,
    pub name: String,
    pub expected: String,
    pub actual: String,
    pub pass: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LabVerdict {
    /// The safe lab: every assertion and check passed.
    Holds,
    /// A variant: exactly the declared violations occurred, with their values.
    CounterexampleConfirmed,
    Failed(String),
}

/// A counterexample is confirmed when the same names failed as it
/// declares, each with values its declaration meets (one value, or any
/// within a bound). `failed`: each failing name, with every value it showed.
/// The lab verdict and the generation-snapshot coverage test both judge so.
pub fn violations_met(
    failed: &BTreeMap<&str, BTreeSet<&str>>,
    declared: &BTreeMap<String, Expect>,
) -> bool {
    declared.len() == failed.len()
        && declared.iter().all(|(k, e)| {
            failed
                .get(k.as_str())
                .is_some_and(|seen| seen.iter().all(|a| e.holds(a)))
        })
}

/// The lab's verdict from its outcomes. For a variant, the set of failures
/// must equal the declared violations exactly: an unsafe variant that passes,
/// or fails differently, refutes the lab's explanation.
pub fn lab_verdict(
    outcomes: &[Outcome],
    violations: Option<&BTreeMap<String, Expect>>,
) -> LabVerdict {
    let mut failed: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for o in outcomes.iter().filter(|o| !o.pass) {
        failed.entry(&o.name).or_default().insert(&o.actual);
    }
    let show = |m: &BTreeMap<&str, BTreeSet<&str>>| {
        m.iter()
            .map(|(k, v)| format!("{k}={}", v.iter().copied().collect::<Vec<_>>().join("|")))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match violations {
        None if failed.is_empty() => LabVerdict::Holds,
        None => LabVerdict::Failed(format!("failed: {}", show(&failed))),
        Some(_) if failed.is_empty() => LabVerdict::Failed(
            "counterexample NOT confirmed: the unsafe variant passed every assertion".into(),
        ),
        Some(v) => {
            if violations_met(&failed, v) {
                LabVerdict::CounterexampleConfirmed
            } else {
                let declared: Vec<String> = v.iter().map(|(k, e)| format!("{k}={e}")).collect();
                LabVerdict::Failed(format!(
                    "counterexample differs: declared {}, observed {}",
                    declared.join(", "),
                    show(&failed)
                ))
            }
        }
    }
}

/// What the runner judged at one moment of a run, with the observations it
/// judged on: Jepsen's history. Stored with the run's JSON, so that
/// [`rejudge`] (`mqlab check`) re-evaluates a run offline.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    pub points: Vec<Point>,
    /// The transcript as it was written, not normalized: what a counter
    /// reads (a measured `delayMs`) must still be there to re-judge.
    #[serde(default)]
    pub lines: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Point {
    /// A step's assertions, on the first `after_line` transcript lines.
    #[serde(rename_all = "camelCase")]
    Assert {
        after_line: usize,
        observed: Observed,
        assertions: Vec<Asserted>,
    },
    /// The total-queue checks at the end, on PostgreSQL and the queues.
    #[serde(rename_all = "camelCase")]
    Checks {
        after_line: usize,
        ground: Ground,
        /// The eventIds of the messages still sitting in the lab's queues.
        queued: BTreeSet<String>,
        events: Events,
        /// Empty in runs stored before it was recorded.
        #[serde(default)]
        owed: Owed,
        #[serde(default)]
        queued_in: Queued,
    },
}

/// One assertion as the lab file defines it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Asserted {
    pub name: String,
    pub counter: CounterRef,
    pub expected: Expect,
}

impl Point {
    pub fn after_line(&self) -> usize {
        match self {
            Point::Assert { after_line, .. } | Point::Checks { after_line, .. } => *after_line,
        }
    }
}

/// The outcomes of one point, with the line each prints, from the transcript
/// entries that existed when it was taken.
pub fn judge(point: &Point, entries: &[Entry]) -> Vec<(Outcome, String)> {
    match point {
        Point::Assert {
            observed,
            assertions,
            ..
        } => assertions
            .iter()
            .map(|a| {
                let value = evaluate(&a.counter, entries, observed);
                let (line, pass) = assert_line(&a.name, &a.expected, &value);
                let outcome = Outcome {
                    kind: OutcomeKind::Assert,
                    name: a.name.clone(),
                    expected: a.expected.to_string(),
                    actual: value.unwrap_or_else(|_| NOT_READ.into()),
                    pass,
                };
                (outcome, line)
            })
            .collect(),
        Point::Checks {
            ground,
            queued,
            events,
            owed,
            queued_in,
            ..
        } => total_queue(entries, ground, queued, events, owed, queued_in)
            .into_iter()
            .map(|(check, value)| {
                let (line, pass) = assert_line(check.name(), &"0".into(), &Ok(value.to_string()));
                let outcome = Outcome {
                    kind: OutcomeKind::Check,
                    name: check.name().to_string(),
                    expected: "0".into(),
                    actual: value.to_string(),
                    pass,
                };
                (outcome, line)
            })
            .collect(),
    }
}

/// Re-judges a stored run: every point on the transcript prefix it saw.
pub fn rejudge(
    history: &History,
    transcript: &[String],
    violations: Option<&BTreeMap<String, Expect>>,
) -> (Vec<Outcome>, LabVerdict) {
    let entries: Vec<(usize, Entry)> = transcript
        .iter()
        .enumerate()
        .filter_map(|(i, l)| Some((i, Entry::parse(l)?)))
        .collect();
    let mut outcomes = Vec::new();
    for p in &history.points {
        let seen: Vec<Entry> = entries
            .iter()
            .filter(|(i, _)| *i < p.after_line())
            .map(|(_, e)| e.clone())
            .collect();
        outcomes.extend(judge(p, &seen).into_iter().map(|(o, _)| o));
    }
    let verdict = lab_verdict(&outcomes, violations);
    (outcomes, verdict)
}

/// One `[assert]` line body: `name=value PASS`, or `FAIL expected=...`.
pub fn assert_line(
    name: &str,
    expected: &Expect,
    actual: &Result<String, String>,
) -> (String, bool) {
    match actual {
        Ok(v) if expected.holds(v) => (format!("{name}={v} PASS"), true),
        Ok(v) => (format!("{name}={v} FAIL expected={expected}"), false),
        Err(why) => (
            format!("{name}={NOT_READ} FAIL expected={expected} reason={why:?}"),
            false,
        ),
    }
}

#[cfg(test)]
mod tests;
