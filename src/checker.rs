//! Counters: pure functions from what was observed (the transcript, the kill's
//! wait status, PostgreSQL and broker state) to a value. Nothing here talks to
//! a server, so every counter is unit-tested on literal transcripts.

use std::collections::{BTreeMap, BTreeSet};

use crate::store::Ground;
use crate::transcript::Entry;

/// Whether a counter takes a `:argument`, and what it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    None,
    OptionalQueue,
    Queue,
    MessageId,
}

pub struct CounterDef {
    pub name: &'static str,
    pub arg: Arg,
    pub doc: &'static str,
}

/// The registry: drives validation of lab files and `mqlab list --counters`.
pub const COUNTERS: &[CounterDef] = &[
    CounterDef {
        name: "confirmed",
        arg: Arg::None,
        doc: "messages the broker confirmed to the producer",
    },
    CounterDef {
        name: "received",
        arg: Arg::OptionalQueue,
        doc: "deliveries consumers logged as received",
    },
    CounterDef {
        name: "unique",
        arg: Arg::OptionalQueue,
        doc: "distinct message ids among those deliveries",
    },
    CounterDef {
        name: "redelivered",
        arg: Arg::OptionalQueue,
        doc: "deliveries flagged redelivered by the broker",
    },
    CounterDef {
        name: "duplicatesObserved",
        arg: Arg::OptionalQueue,
        doc: "deliveries the inbox recognised and skipped",
    },
    CounterDef {
        name: "duplicatesApplied",
        arg: Arg::None,
        doc: "business rows beyond the first per (consumer, message), read from PostgreSQL",
    },
    CounterDef {
        name: "businessRows",
        arg: Arg::None,
        doc: "business rows in PostgreSQL",
    },
    CounterDef {
        name: "processedRows",
        arg: Arg::None,
        doc: "inbox rows in PostgreSQL",
    },
    CounterDef {
        name: "depthAfter",
        arg: Arg::Queue,
        doc: "ready messages in the queue, read from the broker",
    },
    CounterDef {
        name: "attempts",
        arg: Arg::MessageId,
        doc: "the attempt numbers with which a message was received, in order",
    },
    CounterDef {
        name: "deliveries",
        arg: Arg::MessageId,
        doc: "how many times a message was delivered",
    },
    CounterDef {
        name: "deliveriesBefore",
        arg: Arg::MessageId,
        doc: "deliveries of other messages before this one's first (`never` if it never came)",
    },
    CounterDef {
        name: "dlqMoves",
        arg: Arg::None,
        doc: "messages a consumer moved to its DLQ after the confirm",
    },
    CounterDef {
        name: "crashExitCode",
        arg: Arg::None,
        doc: "exit status of the killed role (128 + signal)",
    },
    CounterDef {
        name: "crashAfterBusinessCommit",
        arg: Arg::None,
        doc: "business rows of the faulted message visible in PostgreSQL just before the kill",
    },
    CounterDef {
        name: "consumerExitCode",
        arg: Arg::None,
        doc: "exit status of the last consumer process",
    },
];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counter {
    pub name: &'static str,
    pub arg: Option<String>,
}

impl Counter {
    pub fn parse(expr: &str) -> Result<Counter, String> {
        let (name, arg) = match expr.split_once(':') {
            Some((n, a)) => (n, Some(a.to_string())),
            None => (expr, None),
        };
        let Some(def) = COUNTERS.iter().find(|d| d.name == name) else {
            let known: Vec<_> = COUNTERS.iter().map(|d| d.name).collect();
            return Err(format!(
                "unknown counter `{name}` (known: {}; or alias it in [counters])",
                known.join(", ")
            ));
        };
        match (def.arg, &arg) {
            (Arg::None, Some(_)) => Err(format!("counter `{name}` takes no `:argument`")),
            (Arg::Queue | Arg::MessageId, None) => Err(format!(
                "counter `{name}` needs an argument: `{name}:<{}>`",
                if def.arg == Arg::Queue {
                    "queue"
                } else {
                    "message id"
                }
            )),
            _ => Ok(Counter {
                name: def.name,
                arg,
            }),
        }
    }
}

/// Facts the runner gathered by watching processes and asking the servers.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    pub crash_exit_code: Option<i32>,
    pub crash_business_rows: Option<i64>,
    pub consumer_exit_code: Option<i32>,
    pub depths: BTreeMap<String, u32>,
    pub ground: Ground,
}

/// The total-queue checks every lab ends with, each expected to be 0.
pub const CHECKS: &[&str] = &["lost", "duplicatesApplied", "unexpected"];

/// Per message id, from the producer's confirms, the business rows in
/// PostgreSQL and what still sits in the lab's queues (a DLQ, or a queue it
/// loops in):
/// - `lost`: confirmed, never applied and in no queue;
/// - `duplicatesApplied`: business rows beyond the first per (consumer, message);
/// - `unexpected`: applied but never confirmed to the producer.
pub fn total_queue(
    entries: &[Entry],
    ground: &Ground,
    queued: &BTreeSet<String>,
) -> Vec<(&'static str, usize)> {
    let confirmed: BTreeSet<&str> = entries
        .iter()
        .filter(|e| e.is("producer", "confirmed"))
        .filter_map(|e| e.get("messageId"))
        .collect();
    let applied: BTreeSet<&str> = ground.business.iter().map(|(_, m)| m.as_str()).collect();
    let lost = confirmed
        .iter()
        .filter(|m| !applied.contains(*m) && !queued.contains(**m))
        .count();
    let unexpected = applied.iter().filter(|m| !confirmed.contains(*m)).count();
    vec![
        ("lost", lost),
        ("duplicatesApplied", duplicates_applied(ground)),
        ("unexpected", unexpected),
    ]
}

fn duplicates_applied(ground: &Ground) -> usize {
    let mut per: BTreeMap<&(String, String), usize> = BTreeMap::new();
    for row in &ground.business {
        *per.entry(row).or_default() += 1;
    }
    per.values().map(|n| n - 1).sum()
}

/// A value, or why it cannot be known (which fails the assertion).
pub fn evaluate(c: &Counter, entries: &[Entry], obs: &Observed) -> Result<String, String> {
    let q = c.arg.as_deref();
    let received = || {
        entries
            .iter()
            .filter(|e| e.is("consumer", "received"))
            .filter(move |e| q.is_none() || e.get("destination") == q)
    };
    let count_status = |status: &str| {
        entries
            .iter()
            .filter(|e| e.is("consumer", status))
            .filter(|e| q.is_none() || e.get("destination") == q)
            .count()
    };
    let known = |v: Option<i64>, what: &str| {
        v.map(|n| n.to_string())
            .ok_or_else(|| format!("no {what} was observed"))
    };
    Ok(match c.name {
        "confirmed" => entries
            .iter()
            .filter(|e| e.is("producer", "confirmed"))
            .count()
            .to_string(),
        "received" => received().count().to_string(),
        "unique" => received()
            .filter_map(|e| e.get("messageId"))
            .collect::<BTreeSet<_>>()
            .len()
            .to_string(),
        "redelivered" => received()
            .filter(|e| e.get("redelivered") == Some("true"))
            .count()
            .to_string(),
        "duplicatesObserved" => count_status("duplicate_skipped").to_string(),
        "duplicatesApplied" => duplicates_applied(&obs.ground).to_string(),
        "businessRows" => obs.ground.business.len().to_string(),
        "processedRows" => obs.ground.processed_rows.to_string(),
        "depthAfter" => {
            let queue = q.unwrap_or_default();
            return obs
                .depths
                .get(queue)
                .map(|d| d.to_string())
                .ok_or_else(|| format!("queue `{queue}` was not inspected"));
        }
        "attempts" => {
            let attempts: Vec<&str> = entries
                .iter()
                .filter(|e| e.is("consumer", "received") && e.get("messageId") == q)
                .filter_map(|e| e.get("attempt"))
                .collect();
            attempts.join(",")
        }
        "deliveries" => entries
            .iter()
            .filter(|e| e.is("consumer", "received") && e.get("messageId") == q)
            .count()
            .to_string(),
        "deliveriesBefore" => {
            let all: Vec<&Entry> = entries
                .iter()
                .filter(|e| e.is("consumer", "received"))
                .collect();
            match all.iter().position(|e| e.get("messageId") == q) {
                Some(i) => i.to_string(),
                None => "never".into(),
            }
        }
        "dlqMoves" => count_status("poison_to_dlq").to_string(),
        "crashExitCode" => return known(obs.crash_exit_code.map(i64::from), "crash"),
        "crashAfterBusinessCommit" => return known(obs.crash_business_rows, "crash"),
        "consumerExitCode" => return known(obs.consumer_exit_code.map(i64::from), "consumer exit"),
        other => return Err(format!("counter `{other}` has no evaluator")),
    })
}

/// One evaluated assertion or check.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Outcome {
    /// `assert` or `check`: which section of the transcript it printed in.
    pub kind: &'static str,
    pub name: String,
    pub expected: String,
    pub actual: String,
    pub pass: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
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
    violations: Option<&BTreeMap<String, String>>,
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
            let expected: BTreeMap<&str, BTreeSet<&str>> = v
                .iter()
                .map(|(k, val)| (k.as_str(), BTreeSet::from([val.as_str()])))
                .collect();
            if expected == failed {
                LabVerdict::CounterexampleConfirmed
            } else {
                LabVerdict::Failed(format!(
                    "counterexample differs: declared {}, observed {}",
                    show(&expected),
                    show(&failed)
                ))
            }
        }
    }
}

/// One `[assert]` line body: `name=value PASS`, or `FAIL expected=...`.
pub fn assert_line(name: &str, expected: &str, actual: &Result<String, String>) -> (String, bool) {
    match actual {
        Ok(v) if v == expected => (format!("{name}={v} PASS"), true),
        Ok(v) => (format!("{name}={v} FAIL expected={expected}"), false),
        Err(why) => (
            format!("{name}=unknown FAIL expected={expected} reason={why:?}"),
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
        evaluate(&Counter::parse(expr).unwrap(), &entries(lines), obs).unwrap()
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
    }

    #[test]
    fn duplicates_applied_counts_extra_business_rows() {
        let row = |c: &str, m: &str| (c.to_string(), m.to_string());
        let mut obs = Observed::default();
        obs.ground.business = vec![row("a", "mid-1"), row("a", "mid-2"), row("b", "mid-1")];
        assert_eq!(eval("duplicatesApplied", &[], &obs), "0");
        obs.ground.business.push(row("a", "mid-1"));
        assert_eq!(eval("duplicatesApplied", &[], &obs), "1");
        assert_eq!(eval("businessRows", &[], &obs), "4");
    }

    #[test]
    fn missing_observations_fail_instead_of_defaulting() {
        let c = Counter::parse("crashExitCode").unwrap();
        assert!(evaluate(&c, &[], &Observed::default()).is_err());
        let d = Counter::parse("depthAfter:q").unwrap();
        assert!(evaluate(&d, &[], &Observed::default()).is_err());
        let (line, pass) =
            assert_line("crashExitCode", "137", &Err("no crash was observed".into()));
        assert!(!pass);
        assert!(line.contains("FAIL"));
    }

    /// Jepsen-style: literal histories for each verdict.
    #[test]
    fn total_queue_verdicts() {
        let row = |m: &str| ("c".to_string(), m.to_string());
        let confirmed = entries(&[
            "[producer] messageId=mid-1 status=confirmed",
            "[producer] messageId=mid-2 status=confirmed",
            "[producer] messageId=mid-3 status=confirmed",
        ]);
        let get = |ground: &Ground, dlq: &[&str]| {
            let dlq = dlq.iter().map(|s| s.to_string()).collect();
            total_queue(&confirmed, ground, &dlq)
                .into_iter()
                .map(|(_, n)| n)
                .collect::<Vec<_>>()
        };
        let mut g = Ground {
            business: vec![row("mid-1"), row("mid-2"), row("mid-3")],
            processed_rows: 3,
        };
        assert_eq!(get(&g, &[]), vec![0, 0, 0]);
        g.business.push(row("mid-1"));
        assert_eq!(
            get(&g, &[]),
            vec![0, 1, 0],
            "a second effect is a duplicate"
        );
        g.business = vec![row("mid-2"), row("mid-3")];
        assert_eq!(
            get(&g, &[]),
            vec![1, 0, 0],
            "mid-1 confirmed, never applied"
        );
        assert_eq!(
            get(&g, &["mid-1"]),
            vec![0, 0, 0],
            "still queued (a DLQ) is not lost"
        );
        g.business.push(row("mid-9"));
        assert_eq!(
            get(&g, &["mid-1"]),
            vec![0, 0, 1],
            "applied, never published"
        );
    }

    #[test]
    fn verdicts() {
        let o = |n: &str, a: &str, pass| Outcome {
            kind: "assert",
            name: n.into(),
            expected: "0".into(),
            actual: a.into(),
            pass,
        };
        let v = BTreeMap::from([("duplicatesApplied".to_string(), "1".to_string())]);
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
            assert_line("x", "1", &Ok("1".into())),
            ("x=1 PASS".into(), true)
        );
        assert_eq!(
            assert_line("x", "0", &Ok("1".into())),
            ("x=1 FAIL expected=0".into(), false)
        );
    }

    #[test]
    fn counter_parse_errors() {
        assert!(Counter::parse("nope")
            .unwrap_err()
            .contains("unknown counter"));
        assert!(Counter::parse("depthAfter")
            .unwrap_err()
            .contains("needs an argument"));
        assert!(Counter::parse("confirmed:q")
            .unwrap_err()
            .contains("takes no"));
    }
}
