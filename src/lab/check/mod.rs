//! From the raw file to the validated [`Lab`]: one method per section, each
//! collecting typed errors, so one edit-run cycle shows every problem.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::Path;

use toml::Spanned;

use super::schema::{
    Expected, RawConsume, RawFault, RawFullMessage, RawLab, RawMessage, RawPublish, RawQueue,
    RawStep, RawVariant, Settle as RawSettle,
};
use super::{
    Action, Assertion, Consume, Downstream, Fault, GenerationDiff, Lab, LabError, LabErrors,
    Message, Publish, Retry, Settle, Step,
};
use crate::expect::Expect;
use crate::transcript::MessageMeta;
use crate::vocab::{
    check_queue_argument, ArgValue, Check, Counter, CounterRef, ExchangeDecl, FaultAction,
    Generation, Handoff, OnFailure, Pattern, QueueDecl, Shape, Site, Target, Then, Topology,
    Window, NOT_READ,
};
use crate::vocab::{placement_of, placements_of};

mod errors;
mod faults;
mod standalone;
mod steps;
#[cfg(test)]
mod tests;
mod variant;

pub use errors::ErrorKind;
use variant::{apply_variant, parks_anything};

/// Whether `from` dead-letters straight into `queue` alone, as the file tells:
/// an await's `from` that does not (another queue's source, a chain through
/// a second queue, what the file cannot tell) would end the wait while a
/// message may still come, and a run that expects none would pass.
fn dead_letters_into(topology: &Topology, from: &str, queue: &str) -> bool {
    use crate::vocab::ArgValue;
    let Some(q) = topology.queues.iter().find(|q| q.name == from) else {
        return false;
    };
    let all: BTreeSet<&str> = topology.queues.iter().map(|q| q.name.as_str()).collect();
    match (
        q.arguments.get("x-dead-letter-exchange"),
        q.arguments.get("x-dead-letter-routing-key"),
    ) {
        // The dead-letter exchange routes its key to `queue` alone: a
        // second queue routed too could pass a copy on later.
        (Some(ArgValue::Str(x)), Some(ArgValue::Str(k))) => {
            from != queue
                && topology
                    .route(x, k, &all)
                    .is_some_and(|routed| routed.len() == 1 && routed.contains(queue))
        }
        _ => false,
    }
}

pub fn parse(path: &Path) -> Result<(RawLab, String), LabErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| LabErrors {
        file: path.to_path_buf(),
        text: String::new(),
        errors: vec![LabError {
            path: String::new(),
            span: None,
            kind: ErrorKind::Read(e.to_string()),
        }],
    })?;
    let raw = parse_text(path, &text)?;
    Ok((raw, text))
}

/// serde stops at the first error; its key path comes from
/// `serde_path_to_error`, its position from the TOML parser.
pub fn parse_text(path: &Path, text: &str) -> Result<RawLab, LabErrors> {
    let de = toml::Deserializer::new(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        // Spanned values show up as a private field in the path.
        let key = e
            .path()
            .to_string()
            .replace(".$__serde_spanned_private_value", "");
        let inner = e.into_inner();
        LabErrors {
            file: path.to_path_buf(),
            text: text.to_string(),
            errors: vec![LabError {
                path: if key == "." { String::new() } else { key },
                span: inner.span(),
                kind: ErrorKind::Parse(inner.message().trim().to_string()),
            }],
        }
    })
}

pub struct Checker<'a> {
    path: &'a Path,
    fixtures: &'a Path,
    errs: Vec<LabError>,
    /// The lab names an `effects` query.
    has_effects: bool,
    /// How many broker nodes the lab runs on.
    nodes: usize,
    /// Each message published so far and its eventId: a rendezvous holds
    /// the copies of one event.
    events: Vec<(String, String)>,
    /// The queues a `delete` step deleted and no `declare` step declared
    /// again yet, with that step's key: a `declare` step may declare them.
    deleted: Vec<(String, String)>,
    /// The `later` exchanges and queues a `declare` step declared so far.
    declared: Vec<String>,
}

fn span<T>(s: &Spanned<T>) -> Option<Range<usize>> {
    Some(s.span())
}

impl<'a> Checker<'a> {
    pub fn new(path: &'a Path, _text: &'a str, fixtures: &'a Path) -> Checker<'a> {
        Checker {
            path,
            fixtures,
            errs: Vec::new(),
            has_effects: false,
            events: Vec::new(),
            deleted: Vec::new(),
            declared: Vec::new(),
            nodes: 1,
        }
    }

    fn err(&mut self, path: impl Into<String>, span: Option<Range<usize>>, kind: ErrorKind) {
        self.errs.push(LabError {
            path: path.into(),
            span,
            kind,
        });
    }

    pub fn lab(mut self, raw: RawLab, variant: Option<&str>) -> Result<Lab, Vec<LabError>> {
        // The queues as written, before a variant's overrides.
        let written = raw.queues.clone();
        // The order-service steps as written, which a variant may leave out.
        let written_publish = |f: fn(&RawPublish) -> bool| {
            raw.steps.iter().any(|s| s.publish.as_ref().is_some_and(f))
        };
        let written_jobs = (
            written_publish(|p| p.reconcile),
            written_publish(|p| p.relay),
        );
        let (raw, variant_def) = match self.with_variant(raw, variant) {
            Some(v) => v,
            None => return Err(self.errs),
        };
        self.name(&raw);
        self.has_effects = raw.effects.is_some();
        if let Some(n) = &raw.nodes {
            match *n.get_ref() {
                1 | 3 => self.nodes = *n.get_ref(),
                other => self.err("nodes", span(n), ErrorKind::Nodes(other)),
            }
        }
        // A variant may aim its DLQ or its retry tiers at queues that do
        // not exist: that is its point.
        let missing_ok: Vec<String> = variant_def
            .as_ref()
            .map(|(_, d)| {
                let tiers = d.tiers.iter().flatten();
                d.dlq
                    .iter()
                    .chain(tiers)
                    .map(|s| s.get_ref().clone())
                    .collect()
            })
            .unwrap_or_default();
        let topology = self.topology(&raw);
        let steps = self.steps(&raw, &topology, &missing_ok);
        self.counters(&raw, &steps);
        self.across_steps(&steps);
        let violations = match &variant_def {
            Some((name, def)) => {
                self.variant_keys(name, def, &raw, &written, written_jobs);
                self.variant(name, def, &steps)
            }
            None => (BTreeMap::new(), BTreeMap::new()),
        };
        let (violations, generations) = violations;
        let (facts, broker_facts) = self.facts(&raw, &steps);
        if !self.errs.is_empty() {
            return Err(self.errs);
        }
        Ok(Lab {
            name: raw.name.into_inner(),
            variant: variant.map(str::to_string),
            claim: raw.claim,
            broker: raw.broker,
            path: self.path.to_path_buf(),
            topology,
            steps,
            violations,
            generations,
            effects: raw.effects,
            nodes: self.nodes,
            facts,
            broker_facts,
            settings: raw.settings,
            database: raw.database,
            topic: raw.topic,
            announce_windows: false,
        })
    }

    /// The lab as a variant changes it (and the variant's definition), or
    /// None when the lab has no such variant (the error is recorded).
    fn with_variant<'v>(
        &mut self,
        raw: RawLab,
        variant: Option<&'v str>,
    ) -> Option<(RawLab, Option<(&'v str, RawVariant)>)> {
        let Some(v) = variant else {
            return Some((raw, None));
        };
        if let Some(def) = raw.variant.get(v).cloned() {
            return Some((apply_variant(raw, &def), Some((v, def))));
        }
        let known: Vec<_> = raw.variant.keys().cloned().collect();
        self.err(
            "",
            None,
            ErrorKind::UnknownVariant {
                name: v.into(),
                lab: raw.name.get_ref().clone(),
                known: if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                },
            },
        );
        None
    }

    /// What no single step shows: a relay's pass needs an earlier outbox
    /// step, and a reconciliation job needs the built-in consumer.
    fn across_steps(&mut self, steps: &[Step]) {
        let reconciles = steps
            .iter()
            .any(|s| matches!(&s.action, Action::Publish(p) if p.reconcile));
        let program = steps
            .iter()
            .any(|s| matches!(&s.action, Action::Consume(c) if c.command.is_some()));
        // A relay's later pass relays what an earlier step's outbox holds.
        let outbox_step = |p: &Publish| p.orders.is_some_and(Handoff::is_outbox) && !p.relay;
        let first_outbox = steps
            .iter()
            .position(|s| matches!(&s.action, Action::Publish(p) if outbox_step(p)));
        for (i, s) in steps.iter().enumerate() {
            if matches!(&s.action, Action::Publish(p) if p.relay && p.orders.is_some_and(Handoff::is_outbox))
                && first_outbox.is_none_or(|f| f > i)
            {
                self.err(
                    format!("step[{i}].publish.relay"),
                    None,
                    ErrorKind::RelayWithoutEarlierOutbox,
                );
            }
        }
        if reconciles && program {
            self.err("step", None, ErrorKind::ReconcileWithProgram);
        }
    }

    /// `facts` and `broker_facts`: each names an assertion of the lab that
    /// no variant falsifies, in one of the two lists.
    fn facts(&mut self, raw: &RawLab, steps: &[Step]) -> (Vec<String>, Vec<String>) {
        let named: Vec<&str> = steps
            .iter()
            .flat_map(|s| {
                s.asserts
                    .iter()
                    .chain(s.fault.iter().flat_map(|f| &f.asserts))
            })
            .map(|a| a.name.as_str())
            .collect();
        let mut lists = [Vec::new(), Vec::new()];
        for (list, (key, raw_list)) in [("facts", &raw.facts), ("broker_facts", &raw.broker_facts)]
            .into_iter()
            .enumerate()
        {
            for (i, f) in raw_list.iter().enumerate() {
                let name = f.get_ref();
                let at = format!("{key}[{i}]");
                if !named.contains(&name.as_str()) {
                    let known = named.join(", ");
                    let kind = ErrorKind::UnknownFact {
                        name: name.clone(),
                        known,
                    };
                    self.err(at.clone(), span(f), kind);
                }
                if let Some((v, _)) = raw.variant.iter().find(|(_, v)| {
                    v.violations.contains_key(name)
                        || v.generation_tables()
                            .iter()
                            .any(|(_, t)| t.values().any(|d| d.violations.contains_key(name)))
                }) {
                    let kind = ErrorKind::FactFalsified {
                        name: name.clone(),
                        variant: v.clone(),
                    };
                    self.err(at.clone(), span(f), kind);
                }
                if list == 1 && lists[0].contains(name) {
                    self.err(at, span(f), ErrorKind::FactTwice(name.clone()));
                }
                lists[list].push(name.clone());
            }
        }
        let [facts, broker_facts] = lists;
        (facts, broker_facts)
    }

    /// A publish step's `batch` (and its `flush`).
    fn batch(&mut self, key: &str, p: &RawPublish) -> Option<usize> {
        let Some(b) = &p.batch else {
            if !p.flush {
                self.err(
                    format!("{key}.publish.flush"),
                    None,
                    ErrorKind::FlushWithoutBatch,
                );
            }
            return None;
        };
        if *b.get_ref() < 2 {
            self.err(
                format!("{key}.publish.batch"),
                span(b),
                ErrorKind::BatchSize,
            );
        }
        if p.orders.is_some() {
            self.err(
                format!("{key}.publish.batch"),
                span(b),
                ErrorKind::BatchWithOrders,
            );
        }
        Some(*b.get_ref())
    }

    /// A `node = N` key: 1 by default, at most the lab's `nodes`.
    fn node(&mut self, key: String, n: &Option<Spanned<usize>>) -> usize {
        match n {
            None => 1,
            Some(v) if (1..=self.nodes).contains(v.get_ref()) => *v.get_ref(),
            Some(v) => {
                self.err(
                    key,
                    span(v),
                    ErrorKind::NoSuchNode {
                        node: *v.get_ref(),
                        nodes: self.nodes,
                    },
                );
                1
            }
        }
    }

    fn name(&mut self, raw: &RawLab) {
        let stem = self
            .path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if raw.name.get_ref() != &stem {
            self.err(
                "name",
                span(&raw.name),
                ErrorKind::NameMismatch {
                    name: raw.name.get_ref().clone(),
                    stem,
                },
            );
        }
    }

    fn topology(&mut self, raw: &RawLab) -> Topology {
        let exchanges: Vec<ExchangeDecl> = raw
            .exchanges
            .iter()
            .map(|x| ExchangeDecl {
                name: x.name.clone(),
                kind: x.kind,
                durable: x.durable,
                later: x.later,
            })
            .collect();
        let mut seen = BTreeSet::new();
        let mut queues = Vec::new();
        for (i, q) in raw.queues.iter().enumerate() {
            let key = format!("queue[{i}]");
            if !seen.insert(q.name.get_ref().as_str()) {
                self.err(
                    format!("{key}.name"),
                    span(&q.name),
                    ErrorKind::DuplicateQueue(q.name.get_ref().clone()),
                );
            }
            for (j, b) in q.bind.iter().enumerate() {
                if !exchanges.iter().any(|x| &x.name == b.exchange.get_ref()) {
                    self.err(
                        format!("{key}.bind[{j}].exchange"),
                        span(&b.exchange),
                        ErrorKind::UnknownExchange(b.exchange.get_ref().clone()),
                    );
                }
            }
            for (name, value) in &q.arguments {
                if let Err(why) = check_queue_argument(name, value.get_ref()) {
                    self.err(
                        format!("{key}.arguments.{name}"),
                        span(value),
                        ErrorKind::QueueArgument(why),
                    );
                }
            }
            let quorum = is_quorum(q);
            if quorum && !q.durable {
                self.err(
                    format!("{key}.durable"),
                    span(&q.name),
                    ErrorKind::QuorumNotDurable,
                );
            }
            queues.push(QueueDecl {
                name: q.name.get_ref().clone(),
                durable: q.durable,
                arguments: q
                    .arguments
                    .iter()
                    .map(|(k, v)| (k.clone(), v.get_ref().clone()))
                    .collect(),
                bindings: q
                    .bind
                    .iter()
                    .map(|b| (b.exchange.get_ref().clone(), b.key.clone()))
                    .collect(),
                later: q.later,
            });
        }
        Topology { exchanges, queues }
    }

    fn asserts(&mut self, key: &str, names: &[Spanned<String>], raw: &RawLab) -> Vec<Assertion> {
        let mut out = Vec::new();
        for (j, n) in names.iter().enumerate() {
            let name = n.get_ref();
            let akey = format!("{key}[{j}]");
            let counter = match raw.counters.get(name) {
                Some(c) => c.get_ref().clone(),
                None => match name.parse::<CounterRef>() {
                    Ok(c) => c,
                    Err(why) => {
                        self.err(
                            akey,
                            span(n),
                            ErrorKind::Counter {
                                name: name.clone(),
                                why,
                            },
                        );
                        continue;
                    }
                },
            };
            let Some(expected) = raw.expect.get(name) else {
                self.err(akey, span(n), ErrorKind::NoExpectedValue(name.clone()));
                continue;
            };
            if let Some(kind) = misfit(name, counter.counter.shape(), expected.get_ref(), false) {
                self.err(format!("expect.{name}"), span(expected), kind);
            }
            if let Some(q) = counter
                .arg
                .as_ref()
                .filter(|_| counter.counter == Counter::OldestAgeShownAtKill)
                .filter(|q| lazy_queue(raw, q))
            {
                self.err(akey.clone(), span(n), ErrorKind::AgeOfLazyQueue(q.clone()));
            }
            // Read at the kill only: a step's assertion would find nothing.
            if counter.counter.at_kill() && !key.ends_with(".fault.assert") {
                self.err(
                    akey.clone(),
                    span(n),
                    ErrorKind::AtKillPlace(counter.counter),
                );
            }
            if let Some(q) = counter
                .arg
                .as_ref()
                .filter(|_| counter.counter.reads_queue_process())
                .filter(|q| quorum_queue(raw, q))
            {
                self.err(
                    akey.clone(),
                    span(n),
                    ErrorKind::ProcessOfQuorum(counter.counter, q.clone()),
                );
            }
            out.push(Assertion {
                name: name.clone(),
                counter,
                expected: expected.get_ref().expect(),
            });
        }
        out
    }

    /// Aliases and expected values must each be used: an unused one is a typo.
    fn counters(&mut self, raw: &RawLab, steps: &[Step]) {
        for (name, c) in &raw.counters {
            if !raw.expect.contains_key(name) {
                self.err(
                    format!("counters.{name}"),
                    span(c),
                    ErrorKind::UnusedAlias(name.clone()),
                );
            }
        }
        let asserted = asserted(steps);
        for (name, v) in &raw.expect {
            if !asserted.contains(name.as_str()) {
                self.err(
                    format!("expect.{name}"),
                    span(v),
                    ErrorKind::ExpectedNeverAsserted(name.clone()),
                );
            }
        }
    }
}

/// How many actions a step names (a fault counts: a step of its own kind
/// takes none).
fn actions(s: &RawStep) -> usize {
    [
        s.publish.is_some(),
        s.consume.is_some(),
        s.inspect.is_some(),
        s.declare.is_some(),
        s.delete.is_some(),
        s.await_depth.is_some(),
        s.purge_inbox.is_some(),
        s.policy.is_some(),
        s.replay.is_some(),
        s.fault.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count()
}

/// A queue declared with `x-queue-type = "quorum"`.
fn is_quorum(q: &RawQueue) -> bool {
    q.arguments
        .get("x-queue-type")
        .is_some_and(|v| v.get_ref() == &ArgValue::Str("quorum".into()))
}

/// Whether the lab declares `name` as a quorum queue.
fn quorum_queue(raw: &RawLab, name: &str) -> bool {
    raw.queues
        .iter()
        .any(|q| q.name.get_ref() == name && is_quorum(q))
}

/// Whether the lab's queue `name` sets `x-queue-mode` (lazy on 3.x: its
/// messages kept on disk; ignored by 4.0).
fn lazy_queue(raw: &RawLab, name: &str) -> bool {
    raw.queues
        .iter()
        .any(|q| q.name.get_ref() == name && q.arguments.contains_key("x-queue-mode"))
}

/// What each assertion's counter prints, by the assertion's name.
fn shapes(steps: &[Step]) -> BTreeMap<&str, Shape> {
    assertions(steps)
        .map(|a| (a.name.as_str(), a.counter.counter.shape()))
        .collect()
}

fn yes_or_no(e: &Expected) -> bool {
    matches!(e, Expected::Str(s) if s == "yes" || s == "no")
}

/// Why `e` is no expectation a counter of `shape` can meet (None: it is);
/// `unread`: the word of a value not read is one too (a variant's
/// violation, which declares what the run printed).
fn misfit(name: &str, shape: Shape, e: &Expected, unread: bool) -> Option<ErrorKind> {
    match shape {
        Shape::YesNo => {
            let unread_word = unread && matches!(e, Expected::Str(s) if s == NOT_READ);
            (!yes_or_no(e) && !unread_word).then(|| ErrorKind::YesOrNo(name.to_string()))
        }
        Shape::Count(_) if matches!(e, Expected::Bound { min, max: None } if min.is_none_or(|m| m <= 0)) => {
            Some(ErrorKind::BoundCannotFail(name.to_string()))
        }
        Shape::Count(words) => {
            let word = |s: &str| words.contains(&s) || unread && s == NOT_READ;
            let fits = match e {
                Expected::Int(_) | Expected::Bound { .. } => true,
                Expected::Str(s) => word(s),
                Expected::Bool(_) => false,
            };
            let mut named: Vec<String> = words.iter().map(|w| format!("`{w}`")).collect();
            if unread {
                named.push(format!("`{NOT_READ}` (not read)"));
            }
            let words = match named.is_empty() {
                true => String::new(),
                false => format!(", or {}", named.join(", ")),
            };
            (!fits).then(|| ErrorKind::NotACount {
                name: name.to_string(),
                words,
            })
        }
        Shape::Text => {
            matches!(e, Expected::Bound { .. }).then(|| ErrorKind::BoundOfText(name.to_string()))
        }
    }
}

fn asserted(steps: &[Step]) -> BTreeSet<&str> {
    assertions(steps).map(|a| a.name.as_str()).collect()
}

/// Every assertion of the steps, their faults' included.
fn assertions(steps: &[Step]) -> impl Iterator<Item = &super::Assertion> {
    steps.iter().flat_map(|s| {
        s.asserts
            .iter()
            .chain(s.fault.iter().flat_map(|f| f.asserts.iter()))
    })
}

/// Reads `fixtures/<name>.json`. The envelope fields the transcript shows must
/// be present; business fields may be missing on purpose (poison messages).
/// `copy` (k of a `count`) makes the k-th event of a series: `-k` appended
/// to its eventId and orderId.
fn load_fixture(
    dir: &Path,
    name: &str,
    n: usize,
    copy: Option<usize>,
) -> Result<(MessageMeta, String), ErrorKind> {
    let path = dir.join(format!("{name}.json"));
    let fail = |why: String| ErrorKind::Fixture {
        file: path.display().to_string(),
        why,
    };
    let body = std::fs::read_to_string(&path).map_err(|e| fail(e.to_string()))?;
    let mut v: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| fail(format!("not JSON: {e}")))?;
    let body = match copy {
        None => body,
        Some(k) => {
            for f in ["eventId", "orderId"] {
                let Some(x) = v.get_mut(f).and_then(|x| x.as_str().map(str::to_string)) else {
                    return Err(fail(format!("missing string field `{f}`")));
                };
                v[f] = serde_json::Value::String(format!("{x}-{k}"));
            }
            v.to_string()
        }
    };
    let field = |k: &str| -> Result<String, ErrorKind> {
        v.get(k)
            .and_then(|x| x.as_str())
            .map(str::to_string)
            .ok_or_else(|| fail(format!("missing string field `{k}`")))
    };
    let aggregate = field("orderId")?;
    field("eventId")?;
    Ok((
        MessageMeta {
            message_id: format!("mid-{n}"),
            event_type: field("eventType")?,
            schema_version: v
                .get("schemaVersion")
                .map(|s| s.to_string().trim_matches('"').to_string())
                .unwrap_or_else(|| "1".into()),
            trace_id: format!("trace-{n}"),
            correlation_id: aggregate.clone(),
            aggregate_id: aggregate,
        },
        body,
    ))
}
