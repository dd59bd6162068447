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
            // The same names failed, each with values its declaration
            // meets (one value, or any within a bound).
            let met = v.len() == failed.len()
                && v.iter().all(|(k, e)| {
                    failed
                        .get(k.as_str())
                        .is_some_and(|seen| seen.iter().all(|a| e.holds(a)))
                });
            if met {
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
mod tests {
    use super::*;

    fn entries(lines: &[&str]) -> Vec<Entry> {
        lines.iter().map(|l| Entry::parse(l).unwrap()).collect()
    }

    const CRASH: &[&str] = &[
        "[producer] messageId=mid-1 status=confirmed",
        "[consumer] messageId=mid-1 destination=q attempt=1 redelivered=false status=received",
        "[consumer] messageId=mid-1 destination=q attempt=1 status=business_committed",
        "[consumer] messageId=mid-1 destination=q attempt=1 redelivered=true status=received",
        "[consumer] messageId=mid-1 destination=q attempt=1 status=duplicate_skipped",
        "[consumer] messageId=mid-2 destination=q attempt=1 redelivered=false status=received",
    ];

    fn eval(expr: &str, lines: &[&str], obs: &Observed) -> String {
        evaluate(&expr.parse().unwrap(), &entries(lines), obs).unwrap()
    }

    #[test]
    fn transcript_counters() {
        let obs = Observed::default();
        assert_eq!(eval("confirmed", CRASH, &obs), "1");
        assert_eq!(eval("received", CRASH, &obs), "3");
        assert_eq!(eval("received:q", CRASH, &obs), "3");
        assert_eq!(eval("received:other", CRASH, &obs), "0");
        assert_eq!(eval("unique", CRASH, &obs), "2");
        assert_eq!(eval("redelivered", CRASH, &obs), "1");
        assert_eq!(eval("duplicatesObserved", CRASH, &obs), "1");
        assert_eq!(eval("attempts:mid-1", CRASH, &obs), "1,1");
        assert_eq!(eval("deliveries:mid-1", CRASH, &obs), "2");
        assert_eq!(eval("deliveriesBefore:mid-2", CRASH, &obs), "2");
        assert_eq!(eval("deliveriesBefore:mid-9", CRASH, &obs), "never");
        let commits = &[
            "[consumer] messageId=mid-2 destination=q status=business_committed",
            "[consumer] messageId=mid-1 destination=q status=retry_in_place",
            "[consumer] messageId=mid-1 destination=q status=business_committed",
            "[observe] messageId=mid-3 destination=p status=committed",
        ];
        assert_eq!(eval("commitOrder", commits, &obs), "mid-2,mid-1,mid-3");
        assert_eq!(eval("commitOrder:q", commits, &obs), "mid-2,mid-1");
        assert_eq!(eval("retriesInPlace", commits, &obs), "1");
    }

    #[test]
    fn duplicates_applied_counts_extra_business_rows() {
        let row = |c: &str, e: &str| (c.to_string(), e.to_string());
        let mut obs = Observed::default();
        obs.ground.business = vec![row("a", "E1"), row("a", "E2"), row("b", "E1")];
        assert_eq!(eval("duplicatesApplied", &[], &obs), "0");
        obs.ground.business.push(row("a", "E1"));
        assert_eq!(eval("duplicatesApplied", &[], &obs), "1");
        assert_eq!(eval("businessRows", &[], &obs), "4");
    }

    #[test]
    fn order_version_reads_each_services_state_of_that_order() {
        let state = |c: &str, o: &str, v: i64| (c.to_string(), o.to_string(), v, "paid".into());
        let mut obs = Observed::default();
        let c: CounterRef = "orderVersion:order-1".parse().unwrap();
        assert!(evaluate(&c, &[], &obs).is_err(), "not read is not `none`");
        obs.ground.states = Some(Vec::new());
        assert_eq!(eval("orderVersion:order-1", &[], &obs), "none");
        obs.ground.states = Some(vec![state("a", "order-1", 3), state("a", "order-2", 1)]);
        assert_eq!(eval("orderVersion:order-1", &[], &obs), "3");
        obs.ground
            .states
            .as_mut()
            .unwrap()
            .push(state("b", "order-1", 1));
        assert_eq!(eval("orderVersion:order-1", &[], &obs), "3,1");
        assert!(
            "orderVersion".parse::<CounterRef>().is_err(),
            "needs an order"
        );
        assert_eq!(eval("orderStatus:order-1", &[], &obs), "paid,paid");
        assert_eq!(eval("orderStatus:order-9", &[], &obs), "none");
    }

    #[test]
    fn waited_at_least_is_a_band_of_the_first_measured_delivery() {
        let lines = &[
            "[consumer] messageId=mid-1 attempt=1 delayMs=1004 status=received",
            "[consumer] messageId=mid-2 attempt=1 delayMs=1007 status=received",
            "[consumer] messageId=mid-3 attempt=1 status=received",
        ];
        let obs = Observed::default();
        assert_eq!(eval("waitedAtLeast:mid-2/500", lines, &obs), "yes");
        assert_eq!(eval("waitedAtLeast:mid-2/1008", lines, &obs), "no");
        let c: CounterRef = "waitedAtLeast:mid-3/500".parse().unwrap();
        assert!(
            evaluate(&c, &entries(lines), &obs).is_err(),
            "no measured wait"
        );
        assert!("waitedAtLeast:mid-2".parse::<CounterRef>().is_err());
        assert!("waitedAtLeast:mid-2/soon".parse::<CounterRef>().is_err());
        assert!(
            "waitedAtLeast:mid-2/0".parse::<CounterRef>().is_err(),
            "a bound of 0 cannot fail"
        );
    }

    #[test]
    fn downstream_effects_count_per_event_and_fail_without_a_downstream() {
        let call = |e: &str, effect: bool| DownstreamCall {
            service: "a".into(),
            event_id: e.into(),
            effect,
            response_lost: false,
        };
        let mut obs = Observed::default();
        let c: CounterRef = "duplicateSideEffects".parse().unwrap();
        assert!(evaluate(&c, &[], &obs).is_err(), "no downstream ran");
        obs.downstream = Some(vec![call("e1", true), call("e1", false), call("e2", true)]);
        assert_eq!(eval("downstreamCalls", &[], &obs), "3");
        assert_eq!(eval("downstreamEffects", &[], &obs), "2");
        assert_eq!(eval("duplicateSideEffects", &[], &obs), "0");
        obs.downstream.as_mut().unwrap().push(call("e1", true));
        assert_eq!(eval("downstreamEffects", &[], &obs), "3");
        assert_eq!(eval("duplicateSideEffects", &[], &obs), "1");
        // An event a calling service applied with no effect of its own
        // call is missing; a service that calls no downstream owes none.
        obs.ground.business = vec![
            ("a".into(), "e1".into()),
            ("a".into(), "e3".into()),
            ("b".into(), "e3".into()),
            ("c".into(), "e3".into()),
        ];
        obs.downstream_callers = ["a".to_string(), "b".to_string()].into();
        assert_eq!(eval("missingSideEffects", &[], &obs), "2");
        obs.downstream.as_mut().unwrap().push(call("e3", false));
        assert_eq!(
            eval("missingSideEffects", &[], &obs),
            "2",
            "a replay is no effect"
        );
        obs.downstream.as_mut().unwrap().push(call("e3", true));
        assert_eq!(
            eval("missingSideEffects", &[], &obs),
            "1",
            "a's effect is not b's"
        );
    }

    #[test]
    fn orders_without_event_are_the_committed_orders_no_service_handled() {
        let mut obs = Observed::default();
        let c: CounterRef = "ordersWithoutEvent".parse().unwrap();
        assert!(evaluate(&c, &[], &obs).is_err(), "no order service ran");
        obs.ground.orders = vec!["e1".into(), "e2".into(), "e3".into()];
        obs.ground.business = vec![("a".into(), "e1".into())];
        obs.ground.rejected = vec![("b".into(), "e2".into())];
        assert_eq!(eval("ordersCommitted", &[], &obs), "3");
        assert_eq!(eval("ordersWithoutEvent", &[], &obs), "1");
        // A committed order owes its event to the total-queue checks.
        let lines = entries(&["[producer] messageId=mid-3 status=order_committed"]);
        let events = Events([("mid-3".to_string(), "e3".to_string())].into());
        let lost = total_queue(
            &lines,
            &obs.ground,
            &BTreeSet::new(),
            &events,
            &Owed::default(),
            &Queued::default(),
        );
        assert!(lost.contains(&(Check::Lost, 1)), "{lost:?}");
    }

    #[test]
    fn missing_observations_fail_instead_of_defaulting() {
        let c: CounterRef = "crashExitCode".parse().unwrap();
        assert!(evaluate(&c, &[], &Observed::default()).is_err());
        let d: CounterRef = "depthAfter:q".parse().unwrap();
        assert!(evaluate(&d, &[], &Observed::default()).is_err());
        let (line, pass) = assert_line(
            "crashExitCode",
            &"137".into(),
            &Err("no crash was observed".into()),
        );
        assert!(!pass);
        assert!(line.contains("FAIL"));
    }

    /// A wait is owed by the lab's tier for its attempt, not by the tier
    /// the consumer chose: a consumer that always uses the first tier
    /// honours the first wait only.
    #[test]
    fn retry_delays_are_owed_by_the_labs_tier_for_the_attempt() {
        let lines = entries(&[
            "[consumer] messageId=mid-2 attempt=1 tier=t1 ttlMs=200 status=retry_scheduled",
            "[consumer] messageId=mid-2 attempt=2 delayMs=210 status=received",
            "[consumer] messageId=mid-2 attempt=2 tier=t1 ttlMs=200 status=retry_scheduled",
            "[consumer] messageId=mid-2 attempt=3 delayMs=205 status=received",
            "[consumer] messageId=mid-2 attempt=3 tier=t1 ttlMs=200 status=retry_scheduled",
            "[consumer] messageId=mid-2 attempt=4 delayMs=820 status=received",
        ]);
        let c: CounterRef = "retryDelaysHonoured:mid-2".parse().unwrap();
        let mut obs = Observed::default();
        assert_eq!(
            evaluate(&c, &lines, &obs).unwrap(),
            "2",
            "no tiers stored: the line's TTL, and under twice it (820 is not)"
        );
        obs.retry_tiers = vec![200, 400, 800];
        assert_eq!(evaluate(&c, &lines, &obs).unwrap(), "2");
        obs.retry_tiers = vec![200, 400, 900];
        assert_eq!(evaluate(&c, &lines, &obs).unwrap(), "1");
        // Every retry in the last tier: long enough, and too long for the
        // first two attempts (as long as the next tier's TTL, or longer).
        let last = entries(&[
            "[consumer] messageId=mid-2 attempt=1 tier=t3 ttlMs=800 status=retry_scheduled",
            "[consumer] messageId=mid-2 attempt=2 delayMs=805 status=received",
            "[consumer] messageId=mid-2 attempt=2 tier=t3 ttlMs=800 status=retry_scheduled",
            "[consumer] messageId=mid-2 attempt=3 delayMs=800 status=received",
            "[consumer] messageId=mid-2 attempt=3 tier=t3 ttlMs=800 status=retry_scheduled",
            "[consumer] messageId=mid-2 attempt=4 delayMs=810 status=received",
        ]);
        obs.retry_tiers = vec![200, 400, 800];
        assert_eq!(evaluate(&c, &last, &obs).unwrap(), "1");
    }

    /// Jepsen-style: literal histories for each verdict. Long because it
    /// is a table: each history beside the verdict it must get.
    #[test]
    fn total_queue_verdicts() {
        let row = |e: &str| ("svc".to_string(), e.to_string());
        let events = Events(
            [
                ("mid-1", "E1"),
                ("mid-2", "E2"),
                ("mid-3", "E3"),
                ("mid-4", "E1"),
            ]
            .iter()
            .map(|(m, e)| (m.to_string(), e.to_string()))
            .collect(),
        );
        let confirmed = entries(&[
            "[producer] messageId=mid-1 status=confirmed",
            "[producer] messageId=mid-2 status=confirmed",
            "[producer] messageId=mid-3 status=confirmed",
        ]);
        let get = |lines: &[Entry], ground: &Ground, queued: &[&str]| {
            let queued = queued.iter().map(|s| s.to_string()).collect();
            total_queue(
                lines,
                ground,
                &queued,
                &events,
                &Owed::default(),
                &Queued::default(),
            )
            .into_iter()
            .map(|(_, n)| n)
            .collect::<Vec<_>>()
        };
        let mut g = Ground {
            business: vec![row("E1"), row("E2"), row("E3")],
            processed_rows: 3,
            rejected: Vec::new(),
            states: None,
            orders: Vec::new(),
        };
        assert_eq!(get(&confirmed, &g, &[]), vec![0, 0, 0]);
        g.business.push(row("E1"));
        assert_eq!(
            get(&confirmed, &g, &[]),
            vec![0, 1, 0],
            "a second effect is a duplicate"
        );
        g.business = vec![row("E2"), row("E3")];
        assert_eq!(
            get(&confirmed, &g, &[]),
            vec![1, 0, 0],
            "E1 confirmed, never applied"
        );
        assert_eq!(
            get(&confirmed, &g, &["E1"]),
            vec![0, 0, 0],
            "still queued (a DLQ) is not lost"
        );
        g.business.push(row("E9"));
        assert_eq!(
            get(&confirmed, &g, &["E1"]),
            vec![0, 0, 1],
            "applied, never published"
        );

        // An upstream resend: mid-4 carries E1 again. The inbox applied E1
        // once: nothing lost (the message id is transport detail).
        let resent = entries(&[
            "[producer] messageId=mid-1 status=confirmed",
            "[producer] messageId=mid-2 status=confirmed",
            "[producer] messageId=mid-3 status=confirmed",
            "[producer] messageId=mid-4 status=confirmed",
        ]);
        let once = Ground {
            business: vec![row("E1"), row("E2"), row("E3")],
            processed_rows: 3,
            rejected: Vec::new(),
            states: None,
            orders: Vec::new(),
        };
        assert_eq!(get(&resent, &once, &[]), vec![0, 0, 0]);
        // A consumer that applied both copies: one duplicate of E1.
        let twice = Ground {
            business: vec![row("E1"), row("E2"), row("E3"), row("E1")],
            processed_rows: 0,
            rejected: Vec::new(),
            states: None,
            orders: Vec::new(),
        };
        assert_eq!(get(&resent, &twice, &[]), vec![0, 1, 0]);
        // Two services each applying E1 once are not duplicates.
        let two = Ground {
            business: vec![
                row("E1"),
                ("other".into(), "E1".into()),
                row("E2"),
                row("E3"),
            ],
            processed_rows: 0,
            rejected: Vec::new(),
            states: None,
            orders: Vec::new(),
        };
        assert_eq!(get(&resent, &two, &[]), vec![0, 0, 0]);
        // A producer resend after a lost confirm: `mid-2.2` is E2.
        let producer_resend = entries(&[
            "[producer] messageId=mid-1 status=confirmed",
            "[producer] messageId=mid-2.2 status=confirmed",
            "[producer] messageId=mid-3 status=confirmed",
        ]);
        assert_eq!(get(&producer_resend, &once, &[]), vec![0, 0, 0]);
        // Sent without confirms, never applied: lost all the same.
        let unconfirmed = entries(&["[producer] messageId=mid-1 status=unconfirmed"]);
        let none = Ground::default();
        assert_eq!(get(&unconfirmed, &none, &[]), vec![1, 0, 0]);
        // Returned and parked: in a queue, not lost; returned and dropped: lost.
        let returned = entries(&["[producer] messageId=mid-1 status=returned"]);
        assert_eq!(get(&returned, &none, &["E1"]), vec![0, 0, 0]);
        assert_eq!(get(&returned, &none, &[]), vec![1, 0, 0]);
    }

    /// A service that consumes an event from two queues owes it once, and
    /// a copy held for either of them keeps it.
    #[test]
    fn a_service_on_two_routed_queues_owes_the_event_once() {
        let events = Events(BTreeMap::from([("mid-1".to_string(), "E1".to_string())]));
        let sent = entries(&["[producer] messageId=mid-1 status=confirmed"]);
        let a = || BTreeSet::from(["A".to_string()]);
        let owed = Owed(BTreeMap::from([(
            "E1".to_string(),
            BTreeMap::from([("q1".to_string(), a()), ("q2".to_string(), a())]),
        )]));
        let none = Ground::default();
        let check = |queued_in: Queued| {
            let queued = queued_in.0.values().flatten().cloned().collect();
            total_queue(&sent, &none, &queued, &events, &owed, &queued_in)[0].1
        };
        assert_eq!(check(Queued::default()), 1);
        let in_q2 = Queued(BTreeMap::from([(
            "q2".to_string(),
            BTreeSet::from(["E1".to_string()]),
        )]));
        assert_eq!(check(in_q2), 0);
    }

    /// An event routed to two services is owed by each: one that never
    /// applied it loses it, whatever the other did.
    #[test]
    fn lost_counts_each_service_an_event_was_owed_to() {
        let events = Events(BTreeMap::from([
            ("mid-1".to_string(), "E1".to_string()),
            ("mid-2".to_string(), "E2".to_string()),
        ]));
        let sent = entries(&[
            "[producer] messageId=mid-1 status=confirmed",
            "[producer] messageId=mid-2 status=confirmed",
        ]);
        let svc = |q: &str, s: &[&str]| (q.to_string(), s.iter().map(|s| s.to_string()).collect());
        // E1 to queues a (service A) and b (service B); E2 to a only, and to
        // a queue c nobody consumes.
        let owed = Owed(BTreeMap::from([
            (
                "E1".to_string(),
                BTreeMap::from([svc("a", &["A"]), svc("b", &["B"])]),
            ),
            (
                "E2".to_string(),
                BTreeMap::from([svc("a", &["A"]), svc("c", &[])]),
            ),
        ]));
        let row = |s: &str, e: &str| (s.to_string(), e.to_string());
        let lost = |business: Vec<(String, String)>, queued_in: &[(&str, &str)]| {
            let queued_in = Queued(queued_in.iter().fold(BTreeMap::new(), |mut m, (q, e)| {
                m.entry(q.to_string())
                    .or_insert_with(BTreeSet::new)
                    .insert(e.to_string());
                m
            }));
            let queued = queued_in.0.values().flatten().cloned().collect();
            let ground = Ground {
                business,
                processed_rows: 0,
                rejected: Vec::new(),
                states: None,
                orders: Vec::new(),
            };
            total_queue(&sent, &ground, &queued, &events, &owed, &queued_in)[0].1
        };
        let all = vec![row("A", "E1"), row("B", "E1"), row("A", "E2")];
        assert_eq!(lost(all.clone(), &[("c", "E2")]), 0);
        assert_eq!(
            lost(vec![row("A", "E1"), row("A", "E2")], &[]),
            1,
            "B never applied E1, though A did"
        );
        assert_eq!(
            lost(vec![row("A", "E1"), row("A", "E2")], &[("b", "E1")]),
            0,
            "still held for B's queue (in it, or a DLQ copy from it)"
        );
        assert_eq!(
            lost(vec![row("A", "E1"), row("B", "E1")], &[("c", "E2")]),
            1,
            "a copy in another routed queue does not stand for A's"
        );
        assert_eq!(
            lost(vec![row("A", "E1"), row("A", "E2")], &[("parked", "E1")]),
            1,
            "a copy held for no queue of B's does not stand for B's"
        );
        assert_eq!(
            lost(vec![row("B", "E1")], &[]),
            2,
            "one per service: A owes E1 and E2"
        );
    }

    #[test]
    fn verdicts() {
        let o = |n: &str, a: &str, pass| Outcome {
            kind: OutcomeKind::Assert,
            name: n.into(),
            expected: "0".into(),
            actual: a.into(),
            pass,
        };
        let v = BTreeMap::from([("duplicatesApplied".to_string(), Expect::from("1"))]);
        let pass = [o("duplicatesApplied", "0", true)];
        let dup = [
            o("duplicatesApplied", "1", false),
            o("duplicatesApplied", "1", false),
        ];
        assert_eq!(lab_verdict(&pass, None), LabVerdict::Holds);
        assert!(matches!(lab_verdict(&dup, None), LabVerdict::Failed(_)));
        assert_eq!(
            lab_verdict(&dup, Some(&v)),
            LabVerdict::CounterexampleConfirmed
        );
        assert!(
            matches!(lab_verdict(&pass, Some(&v)), LabVerdict::Failed(m) if m.contains("NOT confirmed"))
        );
        let other = [o("duplicatesApplied", "2", false)];
        assert!(
            matches!(lab_verdict(&other, Some(&v)), LabVerdict::Failed(m) if m.contains("differs"))
        );
        // A bound: every failing value within it.
        let some = BTreeMap::from([(
            "duplicatesApplied".to_string(),
            Expect::Within {
                min: Some(1),
                max: None,
            },
        )]);
        assert_eq!(
            lab_verdict(&other, Some(&some)),
            LabVerdict::CounterexampleConfirmed
        );
        let unread = [o("duplicatesApplied", "unknown", false)];
        assert!(
            matches!(lab_verdict(&unread, Some(&some)), LabVerdict::Failed(m) if m.contains("declared duplicatesApplied=1-or-more"))
        );
        let disagree = [
            o("duplicatesApplied", "1", false),
            o("duplicatesApplied", "2", false),
        ];
        assert!(matches!(
            lab_verdict(&disagree, Some(&v)),
            LabVerdict::Failed(_)
        ));
    }

    #[test]
    fn assert_lines() {
        assert_eq!(
            assert_line("x", &"1".into(), &Ok("1".into())),
            ("x=1 PASS".into(), true)
        );
        assert_eq!(
            assert_line("x", &"0".into(), &Ok("1".into())),
            ("x=1 FAIL expected=0".into(), false)
        );
    }
}
