//! A lab as data: parsed from `labs/<name>.toml`, then validated against the
//! engine's registries (counters, consumer patterns, fault windows) so that a
//! lab naming something the engine does not know is rejected before anything
//! starts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::checker::Counter;
use crate::roles::consumer::{Pattern, Window};
use crate::transcript::MessageMeta;

// ---- the file format (private, strict) ----

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawLab {
    name: String,
    claim: String,
    #[serde(default, rename = "exchange")]
    exchanges: Vec<Exchange>,
    #[serde(default, rename = "queue")]
    queues: Vec<Queue>,
    #[serde(default, rename = "step")]
    steps: Vec<RawStep>,
    /// Lab-specific names for engine counters, e.g. `receivedTotal = "received"`.
    #[serde(default)]
    counters: BTreeMap<String, String>,
    #[serde(default)]
    expect: BTreeMap<String, toml::Value>,
    /// Counterexamples: the same lab with one safety step removed.
    #[serde(default)]
    variant: BTreeMap<String, RawVariant>,
}

/// A variant overrides the consume steps and declares which assertions and
/// checks must fail, with which values.
#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawVariant {
    claim: String,
    pattern: Option<String>,
    window: Option<String>,
    settle: Option<usize>,
    max_deliveries: Option<usize>,
    /// A DLQ the consumer publishes to; may name a queue that does not exist.
    dlq: Option<String>,
    kill_at_depth: Option<u32>,
    /// `settle` of the consumer started after the kill.
    restart_settle: Option<usize>,
    violations: BTreeMap<String, toml::Value>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawStep {
    publish: Option<RawPublish>,
    consume: Option<RawConsume>,
    inspect: Option<Vec<String>>,
    fault: Option<RawFault>,
    #[serde(default)]
    assert: Vec<String>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawPublish {
    #[serde(default)]
    exchange: String,
    routing_key: Option<String>,
    messages: Vec<RawMessage>,
    #[serde(default = "default_deadline")]
    deadline_secs: u64,
}

#[derive(Deserialize, Clone)]
#[serde(untagged)]
enum RawMessage {
    Fixture(String),
    Full {
        fixture: String,
        routing_key: String,
    },
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawConsume {
    queue: String,
    #[serde(default = "default_pattern")]
    pattern: String,
    #[serde(default = "default_prefetch")]
    prefetch: u16,
    settle: usize,
    max_deliveries: Option<usize>,
    retry: Option<Retry>,
    #[serde(default = "default_deadline")]
    deadline_secs: u64,
}

fn default_pattern() -> String {
    "inbox".into()
}
fn default_prefetch() -> u16 {
    1
}
fn default_deadline() -> u64 {
    30
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawFault {
    kill: String,
    window: String,
    message: String,
    then: String,
    /// Kill only once the queue shows this many ready messages: what the
    /// broker has already pushed to the doomed consumer is then fixed, not a race.
    kill_at_depth: Option<u32>,
    /// `settle` of the consumer started after the kill (default: the step's).
    restart_settle: Option<usize>,
    #[serde(default)]
    assert: Vec<String>,
}

// ---- the validated model (public) ----

#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Exchange {
    pub name: String,
    pub kind: String,
    #[serde(default = "yes")]
    pub durable: bool,
}

#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Queue {
    pub name: String,
    #[serde(default = "yes")]
    pub durable: bool,
    /// Queue arguments (`x-message-ttl`, `x-dead-letter-exchange`, ...), passed as declared.
    #[serde(default)]
    pub arguments: BTreeMap<String, toml::Value>,
    #[serde(default)]
    pub bind: Vec<Binding>,
}

#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    pub exchange: String,
    pub key: String,
}

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Retry {
    pub max_attempts: u32,
    pub dlq: String,
}

#[derive(Clone, Debug)]
pub struct Lab {
    pub name: String,
    /// Set for a counterexample run of the lab.
    pub variant: Option<String>,
    pub claim: String,
    pub path: PathBuf,
    pub exchanges: Vec<Exchange>,
    pub queues: Vec<Queue>,
    pub steps: Vec<Step>,
    /// For a variant: assertion or check name → the value it must FAIL with.
    pub violations: BTreeMap<String, String>,
}

impl Lab {
    /// `lab` or `lab@variant`: the snapshot, vhost and database name.
    pub fn run_name(&self) -> String {
        match &self.variant {
            Some(v) => format!("{}@{v}", self.name),
            None => self.name.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Step {
    pub action: Action,
    pub fault: Option<Fault>,
    pub asserts: Vec<Assertion>,
}

#[derive(Clone, Debug)]
pub enum Action {
    Publish(Publish),
    Consume(Consume),
    Inspect(Vec<String>),
}

impl Action {
    /// The phase name used in progress lines and deadline errors.
    pub fn phase(&self) -> String {
        match self {
            Action::Publish(p) => format!("publish({})", p.destination()),
            Action::Consume(c) => format!("consume({})", c.queue),
            Action::Inspect(_) => "inspect".into(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Publish {
    pub exchange: String,
    pub messages: Vec<Message>,
    pub deadline_secs: u64,
}

impl Publish {
    /// What the producer's lines call `destination`: the exchange, or the
    /// queue when publishing through the default exchange.
    pub fn destination(&self) -> &str {
        if self.exchange.is_empty() {
            self.messages
                .first()
                .map(|m| m.routing_key.as_str())
                .unwrap_or("")
        } else {
            &self.exchange
        }
    }
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Message {
    pub meta: MessageMeta,
    pub routing_key: String,
    pub fixture: String,
    pub body: String,
}

#[derive(Clone, Debug)]
pub struct Consume {
    pub queue: String,
    pub pattern: Pattern,
    pub prefetch: u16,
    pub settle: usize,
    pub max_deliveries: Option<usize>,
    pub retry: Option<Retry>,
    pub deadline_secs: u64,
}

#[derive(Clone, Debug)]
pub struct Fault {
    pub window: Window,
    pub message: String,
    pub kill_at_depth: Option<u32>,
    pub restart_settle: Option<usize>,
    pub asserts: Vec<Assertion>,
}

#[derive(Clone, Debug)]
pub struct Assertion {
    /// The name printed in `[assert] name=value`, as the lab spells it.
    pub name: String,
    pub counter: Counter,
    pub expected: String,
}

/// Where a project keeps its labs, fixtures and snapshots.
#[derive(Clone, Debug)]
pub struct Project {
    pub root: PathBuf,
}

impl Project {
    pub fn labs_dir(&self) -> PathBuf {
        self.root.join("labs")
    }
    pub fn fixtures_dir(&self) -> PathBuf {
        self.root.join("fixtures")
    }
    pub fn snapshots_dir(&self) -> PathBuf {
        self.root.join("snapshots")
    }

    /// Lab names, sorted, from the files present.
    pub fn lab_names(&self) -> anyhow::Result<Vec<String>> {
        let dir = self.labs_dir();
        let rd = std::fs::read_dir(&dir)
            .map_err(|e| anyhow::anyhow!("cannot read lab directory `{}`: {e}", dir.display()))?;
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            // the image pins of the containers environment, not a lab
            .filter(|p| p.file_stem().is_some_and(|s| s != "environment"))
            .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .collect();
        names.sort();
        Ok(names)
    }

    /// Loads `lab` or `lab@variant`.
    pub fn load(&self, run: &str) -> anyhow::Result<Lab> {
        let (name, variant) = match run.split_once('@') {
            Some((n, v)) => (n, Some(v)),
            None => (run, None),
        };
        let known = self.lab_names()?;
        if !known.iter().any(|k| k == name) {
            anyhow::bail!("unknown lab `{name}` (known: {})", known.join(", "));
        }
        let path = self.labs_dir().join(format!("{name}.toml"));
        load_file(&path, &self.fixtures_dir(), variant)
    }

    /// The lab followed by each of its variants, as run names.
    pub fn runs_of(&self, name: &str) -> anyhow::Result<Vec<String>> {
        let lab = self.load(name)?;
        let path = lab.path.clone();
        let raw = parse_raw(&path)?;
        Ok(std::iter::once(name.to_string())
            .chain(raw.variant.keys().map(|v| format!("{name}@{v}")))
            .collect())
    }

    /// Variant names and claims of a lab, for `mqlab list`.
    pub fn variants(&self, name: &str) -> anyhow::Result<Vec<(String, String)>> {
        let raw = parse_raw(&self.labs_dir().join(format!("{name}.toml")))?;
        Ok(raw.variant.into_iter().map(|(k, v)| (k, v.claim)).collect())
    }
}

pub fn load_file(path: &Path, fixtures: &Path, variant: Option<&str>) -> anyhow::Result<Lab> {
    let raw = parse_raw(path)?;
    let raw = match variant {
        None => raw,
        Some(v) => apply_variant(raw, v).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?,
    };
    validate(raw, path, fixtures, variant)
        .map_err(|errs| anyhow::anyhow!("{}: invalid lab: {}", path.display(), errs.join("; ")))
}

/// Applies a variant's overrides to every consume step and fault.
fn apply_variant(mut raw: RawLab, name: &str) -> Result<RawLab, String> {
    let Some(v) = raw.variant.get(name).cloned() else {
        let known: Vec<_> = raw.variant.keys().cloned().collect();
        return Err(format!(
            "unknown variant `{name}` of lab `{}` (known: {})",
            raw.name,
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ));
    };
    for step in &mut raw.steps {
        if let Some(c) = &mut step.consume {
            if let Some(p) = &v.pattern {
                c.pattern = p.clone();
            }
            if let Some(n) = v.settle {
                c.settle = n;
            }
            if v.max_deliveries.is_some() {
                c.max_deliveries = v.max_deliveries;
            }
            if let (Some(r), Some(dlq)) = (&mut c.retry, &v.dlq) {
                r.dlq = dlq.clone();
            }
        }
        if let Some(f) = &mut step.fault {
            if let Some(w) = &v.window {
                f.window = w.clone();
            }
            if v.kill_at_depth.is_some() {
                f.kill_at_depth = v.kill_at_depth;
            }
            if v.restart_settle.is_some() {
                f.restart_settle = v.restart_settle;
            }
        }
    }
    raw.claim = v.claim.clone();
    Ok(raw)
}

fn parse_raw(path: &Path) -> anyhow::Result<RawLab> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read `{}`: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| {
        let (line, col) = e.span().map(|s| line_col(&text, s.start)).unwrap_or((0, 0));
        anyhow::anyhow!("{}:{line}:{col}: {}", path.display(), e.message().trim())
    })
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    (line, col)
}

/// Collects every semantic error (with its key path) before failing, so one
/// edit-run cycle shows them all.
fn validate(
    raw: RawLab,
    path: &Path,
    fixtures: &Path,
    variant: Option<&str>,
) -> Result<Lab, Vec<String>> {
    let mut errs = Vec::new();
    let variant_dlq = variant
        .and_then(|v| raw.variant.get(v))
        .and_then(|v| v.dlq.clone());
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
    if stem.as_deref() != Some(raw.name.as_str()) {
        errs.push(format!(
            "`name` is `{}` but the file is `{}.toml`",
            raw.name,
            stem.unwrap_or_default()
        ));
    }
    let queue_names: Vec<&str> = raw.queues.iter().map(|q| q.name.as_str()).collect();
    for (i, q) in raw.queues.iter().enumerate() {
        for (j, b) in q.bind.iter().enumerate() {
            if !raw.exchanges.iter().any(|x| x.name == b.exchange) {
                errs.push(format!(
                    "queue[{i}].bind[{j}].exchange: no exchange `{}` is declared",
                    b.exchange
                ));
            }
        }
    }
    for (i, x) in raw.exchanges.iter().enumerate() {
        if !["direct", "topic", "fanout", "headers"].contains(&x.kind.as_str()) {
            errs.push(format!(
                "exchange[{i}].kind: `{}` is not one of direct, topic, fanout, headers",
                x.kind
            ));
        }
    }

    let resolve = |name: &str, key: &str, errs: &mut Vec<String>| -> Option<Assertion> {
        let expr = raw.counters.get(name).map(String::as_str).unwrap_or(name);
        let counter = match Counter::parse(expr) {
            Ok(c) => c,
            Err(e) => {
                errs.push(format!("{key}: `{name}`: {e}"));
                return None;
            }
        };
        let Some(expected) = raw.expect.get(name) else {
            errs.push(format!("{key}: `{name}` has no expected value in [expect]"));
            return None;
        };
        let expected = match expected {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => {
                errs.push(format!(
                    "expect.{name}: `{other}` is not a string, integer or boolean"
                ));
                return None;
            }
        };
        Some(Assertion {
            name: name.to_string(),
            counter,
            expected,
        })
    };

    let mut next_id = 1;
    let mut published = Vec::new();
    let mut steps = Vec::new();
    for (i, s) in raw.steps.iter().enumerate() {
        let key = format!("step[{i}]");
        let actions = [
            s.publish.is_some(),
            s.consume.is_some(),
            s.inspect.is_some(),
        ];
        if actions.iter().filter(|a| **a).count() != 1 {
            errs.push(format!(
                "{key}: a step has exactly one of `publish`, `consume`, `inspect`"
            ));
            continue;
        }
        let action = if let Some(p) = &s.publish {
            let mut messages = Vec::new();
            for (j, m) in p.messages.iter().enumerate() {
                let (fixture, rk) = match m {
                    RawMessage::Fixture(f) => (f.clone(), p.routing_key.clone()),
                    RawMessage::Full {
                        fixture,
                        routing_key,
                    } => (fixture.clone(), Some(routing_key.clone())),
                };
                let Some(rk) = rk else {
                    errs.push(format!(
                        "{key}.publish.messages[{j}]: no `routing_key` (set it on the message or the step)"
                    ));
                    continue;
                };
                match load_fixture(fixtures, &fixture, next_id) {
                    Ok((meta, body)) => {
                        messages.push(Message {
                            meta,
                            routing_key: rk,
                            fixture,
                            body,
                        });
                        next_id += 1;
                    }
                    Err(e) => errs.push(format!("{key}.publish.messages[{j}]: {e}")),
                }
            }
            if !p.exchange.is_empty() && !raw.exchanges.iter().any(|x| x.name == p.exchange) {
                errs.push(format!(
                    "{key}.publish.exchange: no exchange `{}` is declared",
                    p.exchange
                ));
            }
            published.extend(messages.iter().map(|m| m.meta.message_id.clone()));
            Action::Publish(Publish {
                exchange: p.exchange.clone(),
                messages,
                deadline_secs: p.deadline_secs,
            })
        } else if let Some(c) = &s.consume {
            if !queue_names.contains(&c.queue.as_str()) {
                errs.push(format!(
                    "{key}.consume.queue: no queue `{}` is declared",
                    c.queue
                ));
            }
            if let Some(r) = &c.retry {
                if variant_dlq.as_deref() == Some(r.dlq.as_str()) {
                    // A variant may aim at a DLQ that does not exist: that is its point.
                } else if !queue_names.contains(&r.dlq.as_str()) {
                    errs.push(format!(
                        "{key}.consume.retry.dlq: no queue `{}` is declared",
                        r.dlq
                    ));
                }
                if r.max_attempts == 0 {
                    errs.push(format!(
                        "{key}.consume.retry.max_attempts: must be at least 1"
                    ));
                }
            }
            let pattern = Pattern::parse(&c.pattern).unwrap_or_else(|e| {
                errs.push(format!("{key}.consume.pattern: {e}"));
                Pattern::Inbox
            });
            Action::Consume(Consume {
                queue: c.queue.clone(),
                pattern,
                prefetch: c.prefetch.max(1),
                settle: c.settle,
                max_deliveries: c.max_deliveries,
                retry: c.retry.clone(),
                deadline_secs: c.deadline_secs,
            })
        } else {
            let fields = s.inspect.clone().unwrap_or_default();
            for f in &fields {
                if !crate::store::INSPECT_FIELDS.contains(&f.as_str()) {
                    errs.push(format!(
                        "{key}.inspect: unknown field `{f}` (known: {})",
                        crate::store::INSPECT_FIELDS.join(", ")
                    ));
                }
            }
            Action::Inspect(fields)
        };

        let fault = s.fault.as_ref().and_then(|f| {
            let fkey = format!("{key}.fault");
            if !matches!(action, Action::Consume(_)) {
                errs.push(format!("{fkey}: a fault belongs to a `consume` step"));
                return None;
            }
            if f.kill != "consumer" {
                errs.push(format!(
                    "{fkey}.kill: `{}` is not a role that can be killed here (known: consumer)",
                    f.kill
                ));
            }
            if f.then != "restart" {
                errs.push(format!(
                    "{fkey}.then: `{}` is not known (known: restart)",
                    f.then
                ));
            }
            if !published.contains(&f.message) {
                errs.push(format!(
                    "{fkey}.message: `{}` is not published before this step (published: {})",
                    f.message,
                    published.join(", ")
                ));
            }
            let window = Window::parse(&f.window)
                .map_err(|e| errs.push(format!("{fkey}.window: {e}")))
                .ok()?;
            if let Action::Consume(c) = &action {
                let def = c.pattern.def();
                if !def.windows.contains(&window) {
                    let known: Vec<_> = def.windows.iter().map(|w| w.name()).collect();
                    errs.push(format!(
                        "{fkey}.window: pattern `{}` never reaches window `{}` (it passes: {})",
                        def.name,
                        f.window,
                        known.join(", ")
                    ));
                }
            }
            let asserts = f
                .assert
                .iter()
                .enumerate()
                .filter_map(|(j, n)| resolve(n, &format!("{fkey}.assert[{j}]"), &mut errs))
                .collect();
            Some(Fault {
                window,
                message: f.message.clone(),
                kill_at_depth: f.kill_at_depth,
                restart_settle: f.restart_settle,
                asserts,
            })
        });
        let asserts = s
            .assert
            .iter()
            .enumerate()
            .filter_map(|(j, n)| resolve(n, &format!("{key}.assert[{j}]"), &mut errs))
            .collect();
        steps.push(Step {
            action,
            fault,
            asserts,
        });
    }
    for name in raw.counters.keys() {
        if !raw.expect.contains_key(name) {
            errs.push(format!(
                "counters.{name}: alias is never asserted (no [expect] value)"
            ));
        }
    }
    let asserted: Vec<&str> = steps
        .iter()
        .flat_map(|s| {
            s.asserts
                .iter()
                .chain(s.fault.iter().flat_map(|f| f.asserts.iter()))
        })
        .map(|a| a.name.as_str())
        .collect();
    let mut violations = BTreeMap::new();
    if let Some(v) = variant.and_then(|v| raw.variant.get(v)) {
        if v.violations.is_empty() {
            errs.push(format!(
                "variant.{}.violations: a counterexample declares at least one",
                variant.unwrap_or_default()
            ));
        }
        for (k, val) in &v.violations {
            if !asserted.contains(&k.as_str()) && !crate::checker::CHECKS.contains(&k.as_str()) {
                errs.push(format!(
                    "variant.{}.violations.{k}: neither an assertion of this lab nor a check ({})",
                    variant.unwrap_or_default(),
                    crate::checker::CHECKS.join(", ")
                ));
            }
            let val = match val {
                toml::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            violations.insert(k.clone(), val);
        }
        if v.pattern
            .as_deref()
            .and_then(|p| Pattern::parse(p).ok())
            .is_some_and(|p| p.def().safe)
        {
            errs.push(format!(
                "variant.{}.pattern: a counterexample uses an unsafe pattern",
                variant.unwrap_or_default()
            ));
        }
    }
    if errs.is_empty() {
        Ok(Lab {
            name: raw.name,
            variant: variant.map(str::to_string),
            claim: raw.claim,
            path: path.to_path_buf(),
            exchanges: raw.exchanges,
            queues: raw.queues,
            steps,
            violations,
        })
    } else {
        Err(errs)
    }
}

/// Reads `fixtures/<name>.json`. The envelope fields the transcript shows must
/// be present; business fields may be missing on purpose (poison messages).
fn load_fixture(dir: &Path, name: &str, n: usize) -> Result<(MessageMeta, String), String> {
    let path = dir.join(format!("{name}.json"));
    let body =
        std::fs::read_to_string(&path).map_err(|e| format!("fixture `{}`: {e}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&body)
        .map_err(|e| format!("fixture `{}`: not JSON: {e}", path.display()))?;
    let field = |k: &str| -> Result<String, String> {
        v.get(k)
            .and_then(|x| x.as_str())
            .map(str::to_string)
            .ok_or_else(|| format!("fixture `{}`: missing string field `{k}`", path.display()))
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
