//! Evidence a reader can audit: one Markdown page and one JSON document per
//! lab run, and a JUnit file for CI viewers. Everything here is derived from
//! the run's outcome; nothing is re-measured.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::checker::History;
use crate::env::EnvInfo;
use crate::expect::Expect;
use crate::record::{RunRecord, SnapshotResult};

mod mermaid;

pub use mermaid::mermaid;

/// Bumped when a field changes meaning or disappears (`docs/evidence/schema.json`).
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub schema_version: u32,
    pub product: String,
    pub lab: String,
    pub variant: Option<String>,
    pub run: String,
    pub claim: String,
    pub verdict: String,
    pub exit_code: i32,
    pub broker: Server,
    pub database: Server,
    pub client: Client,
    pub environment: String,
    pub captured_at: String,
    pub duration_ms: u64,
    pub assertions: Vec<Assertion>,
    pub error: Option<String>,
    pub transcript: Vec<String>,
    /// For a counterexample: the violations its lab file declares.
    #[serde(default)]
    pub declared_violations: BTreeMap<String, Expect>,
    /// The broker settings the run relied on, as read from the broker.
    #[serde(default)]
    pub broker_settings: BTreeMap<String, String>,
    /// The lab file's declared difference for the broker's generation:
    /// `declaredViolations` and the transcript are that generation's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared_difference: Option<DeclaredDifference>,
    /// What the runner judged, on which observations: `mqlab check` re-judges it.
    #[serde(default)]
    pub history: History,
    /// What a power loss dropped from the run's own PostgreSQL, file by
    /// file (paths in its data directory; empty: nothing); absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_loss_dropped: Option<Vec<String>>,
    /// A rendered `<run>.png` sits next to the page (not part of the JSON).
    #[serde(skip)]
    pub diagram_image: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeclaredDifference {
    pub generation: String,
    pub cause: String,
    pub source: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Server {
    pub version: String,
    pub source: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Client {
    pub library: String,
    pub version: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Assertion {
    /// `assert`, `check`, `snapshot` or `harness`.
    pub kind: String,
    pub name: String,
    pub expected: String,
    pub actual: String,
    /// As printed in the transcript.
    pub result: String,
    /// For a counterexample: this FAIL was declared, so it confirms the claim.
    pub expected_violation: bool,
    /// Whether this line supports the run's verdict (what JUnit reports).
    pub ok: bool,
    /// The unified diff, for a snapshot mismatch.
    pub detail: Option<String>,
}

/// The run's lines of evidence: each check and assertion (a declared
/// violation counts as its support), the snapshot comparison and, for a run
/// that stopped, the harness's own line.
fn assertions(r: &RunRecord) -> Vec<Assertion> {
    let pass_fail = |p: bool| if p { "PASS" } else { "FAIL" }.to_string();
    let mut assertions: Vec<Assertion> = r
        .outcomes
        .iter()
        .map(|o| {
            // A counterexample's declared violation is the line that proves it.
            let declared = r.variant.as_ref().and(r.violations.get(&o.name));
            let ok = match declared {
                Some(v) => !o.pass && v.holds(&o.actual),
                None => o.pass,
            };
            // A harness fact (fixed by how the lab runs) or a broker fact
            // (given by the broker in every run): shown apart.
            let assert = o.kind.name() == "assert";
            let kind = match () {
                _ if assert && r.facts.contains(&o.name) => "fact",
                _ if assert && r.broker_facts.contains(&o.name) => "broker-fact",
                _ => o.kind.name(),
            };
            Assertion {
                kind: kind.to_string(),
                name: o.name.clone(),
                expected: o.expected.clone(),
                actual: o.actual.clone(),
                result: pass_fail(o.pass),
                expected_violation: ok && declared.is_some(),
                ok,
                detail: declared.map(|v| format!("declared violation: {}={v}", o.name)),
            }
        })
        .collect();
    let snap_file = match &r.declared {
        Some(d) => format!("snapshots/{}.snap", d.generation.snapshot(&r.run)),
        None => format!("snapshots/{}.snap", r.run),
    };
    let (actual, pass, detail) = match &r.snapshot {
        SnapshotResult::Matched => ("matched", true, None),
        SnapshotResult::Updated => ("updated", true, None),
        SnapshotResult::Mismatch(diff) => ("differs", false, Some(diff.clone())),
        SnapshotResult::Error(e) => ("unreadable", false, Some(e.clone())),
        SnapshotResult::Skipped => ("not compared", true, None),
    };
    assertions.push(Assertion {
        kind: "snapshot".into(),
        name: format!("transcript matches {snap_file}"),
        expected: "matched".into(),
        actual: actual.into(),
        result: pass_fail(pass),
        expected_violation: false,
        ok: pass,
        detail,
    });
    if let Some(e) = &r.error {
        assertions.push(Assertion {
            kind: "harness".into(),
            name: "the lab ran to its end".into(),
            expected: "completed".into(),
            actual: "stopped".into(),
            result: "FAIL".into(),
            expected_violation: false,
            ok: false,
            detail: Some(e.clone()),
        });
    }
    assertions
}

pub fn record(r: &RunRecord, info: &EnvInfo) -> Record {
    let assertions = assertions(r);
    let passed = r.passed();
    Record {
        schema_version: SCHEMA_VERSION,
        product: r.broker.to_string(),
        lab: r.lab.clone(),
        variant: r.variant.clone(),
        run: r.run.clone(),
        claim: r.claim.clone(),
        verdict: if passed { r.verdict_text() } else { "FAIL" }.into(),
        exit_code: if passed { 0 } else { 1 },
        broker: Server {
            version: info.broker_version.clone(),
            source: info.broker_source.clone(),
        },
        database: match &r.own_database {
            Some((version, source)) => Server {
                version: version.clone(),
                source: source.clone(),
            },
            None => Server {
                version: info.db_version.clone(),
                source: info.db_source.clone(),
            },
        },
        client: {
            let (library, version) = crate::broker::client_library(r.broker);
            Client {
                library: library.into(),
                version: version.into(),
            }
        },
        environment: info.kind.into(),
        captured_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        duration_ms: r.duration.as_millis() as u64,
        assertions,
        error: r.error.clone(),
        transcript: r
            .transcript
            .normalized()
            .lines()
            .map(str::to_string)
            .collect(),
        declared_violations: if r.variant.is_some() {
            r.violations.clone()
        } else {
            BTreeMap::new()
        },
        history: r.history.clone(),
        broker_settings: r.settings.iter().cloned().collect(),
        declared_difference: r.declared.as_ref().map(|d| DeclaredDifference {
            generation: d.generation.to_string(),
            cause: d.cause.clone(),
            source: d.source.clone(),
        }),
        power_loss_dropped: r.power_lost.clone(),
        diagram_image: false,
    }
}

/// Checks up front that evidence can be written, so a bad `--evidence` is a
/// setup error before any server starts.
pub fn prepare_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create evidence directory `{}`", dir.display()))?;
    let probe = dir.join(".mqlab-write-test");
    std::fs::write(&probe, b"")
        .with_context(|| format!("cannot write to evidence directory `{}`", dir.display()))?;
    let _ = std::fs::remove_file(probe);
    Ok(())
}

pub fn write(dir: &Path, r: &Record) -> Result<()> {
    let mut r = r.clone();
    r.diagram_image = dir.join(format!("{}.png", r.run)).exists();
    let r = &r;
    let json = serde_json::to_string_pretty(r)? + "\n";
    std::fs::write(dir.join(format!("{}.json", r.run)), json)
        .with_context(|| format!("cannot write evidence to `{}`", dir.display()))?;
    std::fs::write(dir.join(format!("{}.md", r.run)), markdown(r))
        .with_context(|| format!("cannot write evidence to `{}`", dir.display()))?;
    Ok(())
}

/// `DIR/README.md`: every run whose JSON is in DIR, with its verdict and claim.
pub fn write_index(dir: &Path) -> Result<()> {
    let mut rows = Vec::new();
    for e in std::fs::read_dir(dir)?.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(&path)?)
        else {
            continue;
        };
        if v.get("schemaVersion").is_none() {
            continue; // schema.json and other files
        }
        let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
        rows.push((s("run"), s("verdict"), s("claim"), s("capturedAt")));
    }
    rows.sort();
    let mut md = String::from(
        "# mqlab evidence\n\nWritten by `mqlab lab ... --evidence DIR`. Each page shows the claim, the broker and \
         database versions read from the running servers, the client library, the assertions, a sequence \
         diagram of the run and its normalized log; `<run>.json` holds the same facts \
         ([schema](schema.json) where present).\n\n| run | verdict | claim |\n|---|---|---|\n",
    );
    for (run, verdict, claim, _) in &rows {
        md.push_str(&format!(
            "| [{run}]({run}.md) | {verdict} | {} |\n",
            cell(claim)
        ));
    }
    std::fs::write(dir.join("README.md"), md)
        .with_context(|| format!("cannot write the evidence index in `{}`", dir.display()))
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// The evidence page of one run: its facts, assertions, diagram and log.
pub fn markdown(r: &Record) -> String {
    let mut md = header(r);
    md.push_str(&assertions_section(r));
    if let Some(e) = &r.error {
        md.push_str(&format!("\n**The lab stopped early:** {}\n", cell(e)));
    }
    if let Some(dropped) = &r.power_loss_dropped {
        md.push_str("\n## What the power loss dropped\n\nFrom the run's own PostgreSQL's data directory, what was written and never made durable, undone by the lazy file system:\n\n");
        if dropped.is_empty() {
            md.push_str("- nothing: everything written had been made durable\n");
        }
        for l in dropped {
            md.push_str(&format!("- `{}`\n", l.replace('`', "'")));
        }
    }
    md.push_str("\n## Sequence\n\n");
    if r.diagram_image {
        md.push_str(&format!(
            "![sequence diagram of {}]({}.png)\n\n",
            r.run, r.run
        ));
    }
    md.push_str("```mermaid\n");
    md.push_str(&mermaid(&r.transcript));
    md.push_str("```\n\n## Normalized log\n\n```\n");
    for l in &r.transcript {
        md.push_str(l);
        md.push('\n');
    }
    md.push_str("```\n");
    md
}

/// The page's title, claim and the table of what ran.
fn header(r: &Record) -> String {
    let mut md = String::new();
    md.push_str(&format!("# {}\n\n> {}\n\n", r.run, r.claim));
    md.push_str("| | |\n|---|---|\n");
    let rows = [
        ("product", r.product.to_string()),
        ("lab", r.lab.clone()),
        (
            "variant",
            r.variant
                .clone()
                .unwrap_or_else(|| "— (the safe pattern)".into()),
        ),
        ("verdict", format!("**{}**", r.verdict)),
        (
            "broker",
            format!("{} (`{}`)", r.broker.version, r.broker.source),
        ),
        (
            "database",
            format!("{} (`{}`)", r.database.version, r.database.source),
        ),
        (
            "client library",
            format!("{} {}", r.client.library, r.client.version),
        ),
        ("environment", r.environment.to_string()),
        ("captured at", r.captured_at.clone()),
        (
            "duration",
            format!("{:.2} s", r.duration_ms as f64 / 1000.0),
        ),
        ("exit code", r.exit_code.to_string()),
    ];
    for (k, v) in rows {
        md.push_str(&format!("| {k} | {} |\n", cell(&v)));
    }
    for (name, value) in &r.broker_settings {
        md.push_str(&format!(
            "| broker setting | `{}` = {} (read from the broker: the lab's bounds rely on it) |\n",
            cell(name),
            cell(value)
        ));
    }
    if let Some(d) = &r.declared_difference {
        // The product, as the broker's version names it (`RabbitMQ 4.0.5`).
        let product = r.broker.version.split(' ').next().unwrap_or_default();
        md.push_str(&format!(
            "| declared for {product} {} | {} ({}) |\n",
            cell(&d.generation),
            cell(&d.cause),
            cell(&d.source)
        ));
    }
    md
}

/// The claim's assertions, then the harness facts and the broker facts
/// apart.
fn assertions_section(r: &Record) -> String {
    let mut md = String::new();
    md.push_str(
        "\n## Assertions\n\n| kind | name | expected | actual | result |\n|---|---|---|---|---|\n",
    );
    let evidence = r
        .assertions
        .iter()
        .filter(|a| !matches!(a.kind.as_str(), "fact" | "broker-fact"));
    for a in evidence {
        let result = if a.expected_violation {
            format!("{} (expected violation)", a.result)
        } else {
            a.result.to_string()
        };
        md.push_str(&format!(
            "| {} | `{}` | {} | {} | {} |\n",
            a.kind,
            cell(&a.name),
            cell(&a.expected),
            cell(&a.actual),
            result
        ));
    }
    md.push_str(&facts_table(
        r,
        "fact",
        "Harness facts",
        "Fixed by how the lab runs (no variant of the lab changes them): \
         they show the run went as designed, not that the claim holds.",
    ));
    md.push_str(&facts_table(
        r,
        "broker-fact",
        "Broker facts",
        "What the broker gives in every run (no variant of the lab changes \
         them; another broker or generation could): the behaviour the run \
         relies on, not evidence of the claim.",
    ));
    md
}

/// One table of a run's facts of `kind`, if it has any.
fn facts_table(r: &Record, kind: &str, title: &str, why: &str) -> String {
    let facts: Vec<&Assertion> = r.assertions.iter().filter(|a| a.kind == kind).collect();
    if facts.is_empty() {
        return String::new();
    }
    let mut md = format!(
        "\n## {title}\n\n{why}\n\n| name | expected | actual | result |\n|---|---|---|---|\n"
    );
    for a in facts {
        md.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            cell(&a.name),
            cell(&a.expected),
            cell(&a.actual),
            a.result
        ));
    }
    md
}

/// JUnit XML (quick-junit): one testsuite per lab run, one testcase per
/// assertion. A counterexample's declared violation is a passing testcase.
pub fn junit(records: &[Record]) -> Result<String> {
    use quick_junit::{NonSuccessKind, Property, Report, TestCase, TestCaseStatus, TestSuite};
    let mut report = Report::new("mqlab");
    let total_ms: u64 = records.iter().map(|r| r.duration_ms).sum();
    report.set_time(std::time::Duration::from_millis(total_ms));
    for r in records {
        let mut suite = TestSuite::new(r.run.as_str());
        suite.set_time(std::time::Duration::from_millis(r.duration_ms));
        if let Ok(t) = humantime::parse_rfc3339(&r.captured_at) {
            let t: chrono::DateTime<chrono::Utc> = t.into();
            suite.set_timestamp(t);
        }
        for (k, v) in [
            ("claim", r.claim.clone()),
            ("verdict", r.verdict.clone()),
            ("broker", r.broker.version.clone()),
            ("database", r.database.version.clone()),
            (
                "client",
                format!("{} {}", r.client.library, r.client.version),
            ),
        ] {
            suite.add_property(Property::new(k, v));
        }
        for a in &r.assertions {
            let status = if a.ok {
                TestCaseStatus::success()
            } else {
                let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                let message = format!("{}={} (expected {})", a.name, a.actual, a.expected);
                s.set_type(a.kind.as_str());
                s.set_description(a.detail.clone().unwrap_or_else(|| message.clone()));
                s.set_message(message);
                s
            };
            let mut case = TestCase::new(format!("{} {}", a.kind, a.name), status);
            case.set_classname(format!("mqlab.{}", r.run));
            case.set_time(std::time::Duration::ZERO);
            if let (true, Some(d)) = (a.expected_violation, &a.detail) {
                case.set_system_out(format!("{d}: observed, as the counterexample claims"));
            }
            suite.add_test_case(case);
        }
        report.add_test_suite(suite);
    }
    Ok(report.to_string()?)
}

/// A lab's steps as the page lists them: each step's kind and target, the
/// consumer it runs (a pattern or a program), its cluster node, its fault.
fn steps(lab: &crate::lab::Lab) -> String {
    use crate::lab::Action;
    let mut out = String::new();
    for (i, step) in lab.steps.iter().enumerate() {
        let mut line = match &step.action {
            Action::Broker(a) => format!("fault: `broker` `{a}`, between steps"),
            Action::Node { node, action } => {
                format!("fault: `node` `{action}` (node {node}), between steps")
            }
            other => format!("`{}`", other.phase()),
        };
        match &step.action {
            Action::Consume(c) => {
                match &c.command {
                    Some(cmd) => line.push_str(&format!(", program `{cmd}`")),
                    None => line.push_str(&format!(", pattern `{}`", c.pattern)),
                }
                if lab.is_cluster() {
                    line.push_str(&format!(", on node {}", c.node));
                }
            }
            Action::Publish(p) if lab.is_cluster() => {
                line.push_str(&format!(", on node {}", p.node));
            }
            Action::PurgeInbox {
                service,
                retention_ms,
            } => line.push_str(&format!(
                ", `{service}`'s rows older than {retention_ms} ms"
            )),
            Action::Policy {
                queue, definition, ..
            } => line.push_str(&format!(" on `{queue}`: `{definition}`")),
            Action::Replay { from, to } => line.push_str(&format!(": `{from}` into `{to}`")),
            Action::Delete(_) => line.push_str(": by an administrator, with what it holds"),
            _ => {}
        }
        if let Some(f) = &step.fault {
            let node = f.node.map(|n| format!(" (node {n})")).unwrap_or_default();
            line.push_str(&format!(
                ", fault: `{}` `{}`{node} at `{}` of `{}`, then `{}`",
                f.target, f.action, f.window, f.message, f.then
            ));
        }
        out.push_str(&format!("{}. {line}\n", i + 1));
    }
    out
}

/// One lab's page of the book (`docs/labs/<lab>.md`), written from its lab
/// file and its stored snapshots only: the claim, the steps with their
/// faults, what the safe run shows (its diagram and its assertions), and
/// each counterexample with its declared violations and its diagram. A
/// test fails when a page differs from what this writes
/// (`MQLAB_UPDATE_DOCS=1` rewrites them). Long: the page's sections in the
/// order a reader reads them.
pub fn lab_page(project: &crate::lab::Project, name: &str) -> Result<String> {
    let lab = project.load(name)?;
    let mut out = format!("# `{name}`\n\n> {}\n\n", lab.claim);
    let mut how = format!("Run it: `cargo run -- lab {name}`");
    if lab.is_cluster() {
        how.push_str(" (a cluster lab, on three nodes; not in one command with one-node labs)");
    }
    if lab.has_partition() {
        how.push_str("; it cuts a node off, which needs iptables and root (and nsenter with `--env containers`)");
    }
    out.push_str(&format!(
        "{how}. Its file: `labs/{name}.toml`; this page is written from it and from its snapshots.\n\n## Steps\n\n{}",
        steps(&lab)
    ));
    let snapshot = |run: &str| -> Result<Vec<String>> {
        let path = crate::snapshot::path_for(&project.snapshots_dir(), run);
        let body = crate::snapshot::read(&path)?
            .with_context(|| format!("`{run}` has no snapshot ({})", path.display()))?;
        Ok(body.lines().map(str::to_string).collect())
    };
    let judged = |lines: &[String]| -> String {
        lines
            .iter()
            .filter(|l| l.starts_with("[assert]") || l.starts_with("[check]"))
            .map(|l| format!("- `{l}`\n"))
            .collect()
    };
    let lines = snapshot(name)?;
    out.push_str("\n## What the safe run shows\n\n```mermaid\n");
    out.push_str(&mermaid(&lines));
    out.push_str("```\n\nIts assertions and checks, from `snapshots/");
    out.push_str(&format!("{name}.snap`:\n\n{}", judged(&lines)));
    let variants = project.variants(name)?;
    if !variants.is_empty() {
        out.push_str("\n## Counterexamples\n");
    }
    for (v, claim) in variants {
        let run = format!("{name}@{v}");
        let variant = project.load(&run)?;
        let declared: Vec<String> = variant
            .violations
            .iter()
            .map(|(k, val)| format!("`{k}={val}`"))
            .collect();
        let lines = snapshot(&run)?;
        // What the variant changes shows in its steps (a pattern, a
        // window), its database, or else in its topology (a queue's type,
        // durability).
        let changed = match (steps(&variant) == steps(&lab), variant.database) {
            (true, d) if d != lab.database => format!(
                "its steps are the lab's; its database is `{d}` (the lab's: `{}`)",
                lab.database
            ),
            (true, _) => "its steps are the lab's; it changes the topology or the producer (see the lab file)".to_string(),
            (false, _) => format!("its steps:\n\n{}", steps(&variant)),
        };
        out.push_str(&format!(
            "\n### `{run}`\n\n> {claim}\n\nRun it: `cargo run -- lab {run}`; {changed}\n\nDeclared violations (the run must fail with exactly these): {}.\n\n```mermaid\n{}```\n",
            declared.join(", "),
            mermaid(&lines)
        ));
        for (g, diff) in &variant.generations {
            let declared: Vec<String> = diff
                .violations
                .iter()
                .map(|(k, val)| format!("`{k}={val}`"))
                .collect();
            let claim = diff.claim.as_deref().unwrap_or(&claim);
            let snap = g.snapshot(&run);
            out.push_str(&format!(
                "\n#### On {} {g}\n\n> {claim}\n\nRun it: `cargo run -- lab {run} {} {g}`. Why it differs there: {} (source: {}).\n\nDeclared violations on {g} (its transcript: `snapshots/{snap}.snap`): {}.\n",
                g.broker().product(),
                g.broker().generation_flag(),
                diff.cause,
                diff.source,
                declared.join(", "),
            ));
        }
    }
    Ok(out)
}

/// One topic's page of the book (`docs/topics/<topic>.md`), written from
/// the lab files of `project` only: what the topic covers, then a row per
/// lab of that topic with its claim and its counterexamples, each linking
/// to the lab's page (the examples' labs, `your-own-program`, to the byo
/// page). A test fails when a page differs (`MQLAB_UPDATE_DOCS=1` rewrites
/// them), and when one of the project's labs names no topic.
pub fn topic_page(project: &crate::lab::Project, topic: crate::vocab::Topic) -> Result<String> {
    use crate::vocab::Topic;
    let mut doc = topic.doc().to_string();
    doc[..1].make_ascii_uppercase();
    let how = match topic {
        Topic::YourOwnProgram => "Each lab runs an example program as the consumer (`examples/python`; `examples/node` has the same labs but `byo-cached-inbox`); [Bring your own consumer](../byo.md) says how to run them and how to bring yours. Each counterexample runs a broken mode of the program and must fail as declared.",
        _ => "Each lab is a claim mqlab runs against a real broker and a real PostgreSQL; each counterexample changes one thing the safe run relies on (a step removed or reordered, a setting, a queue's type) and must fail as declared. A lab's page has its steps, its sequence diagrams and its assertions; `cargo run -- lab <lab>` runs it, `cargo run -- lab <lab>@<counterexample>` runs a counterexample.",
    };
    let mut out = format!(
        "# {}\n\n{doc}. {how}\n\n| lab | claim | counterexamples |\n|---|---|---|\n",
        topic.title()
    );
    for name in project.lab_names()? {
        let lab = project.load(&name)?;
        if lab.topic != Some(topic) {
            continue;
        }
        let link = match topic {
            Topic::YourOwnProgram => "../byo.md".to_string(),
            _ => format!("../labs/{name}.md"),
        };
        let nodes = match lab.is_cluster() {
            true => " (three nodes)",
            false => "",
        };
        let variants: Vec<String> = project
            .variants(&name)?
            .into_iter()
            .map(|(v, _)| format!("`@{v}`"))
            .collect();
        out.push_str(&format!(
            "| [`{name}`]({link}){nodes} | {} | {} |\n",
            cell(&lab.claim),
            variants.join(", ")
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
