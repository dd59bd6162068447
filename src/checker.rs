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
        "duplicatesApplied" => {
            let mut per: BTreeMap<&(String, String), usize> = BTreeMap::new();
            for row in &obs.ground.business {
                *per.entry(row).or_default() += 1;
            }
            per.values().map(|n| n - 1).sum::<usize>().to_string()
        }
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
        "dlqMoves" => count_status("poison_to_dlq").to_string(),
        "crashExitCode" => return known(obs.crash_exit_code.map(i64::from), "crash"),
        "crashAfterBusinessCommit" => return known(obs.crash_business_rows, "crash"),
        "consumerExitCode" => return known(obs.consumer_exit_code.map(i64::from), "consumer exit"),
        other => return Err(format!("counter `{other}` has no evaluator")),
    })
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
