//! Evidence a reader can audit: one Markdown page and one JSON document per
//! lab run, and a JUnit file for CI viewers. Everything here is derived from
//! the run's outcome; nothing is re-measured.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::checker::LabVerdict;
use crate::env::EnvInfo;
use crate::lab::Lab;
use crate::runner::LabRun;
use crate::transcript::{Entry, PRODUCT};

/// Bumped when a field changes meaning or disappears (`docs/evidence/schema.json`).
pub const SCHEMA_VERSION: u32 = 1;
pub const CLIENT_LIBRARY: &str = "lapin";
pub const CLIENT_VERSION: &str = env!("MQLAB_LAPIN_VERSION");

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub schema_version: u32,
    pub product: &'static str,
    pub lab: String,
    pub variant: Option<String>,
    pub run: String,
    pub claim: String,
    pub verdict: String,
    pub exit_code: i32,
    pub broker: Server,
    pub database: Server,
    pub client: Client,
    pub environment: &'static str,
    pub captured_at: String,
    pub duration_ms: u64,
    pub assertions: Vec<Assertion>,
    pub error: Option<String>,
    pub transcript: Vec<String>,
    /// A rendered `<run>.png` sits next to the page (not part of the JSON).
    #[serde(skip)]
    pub diagram_image: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Server {
    pub version: String,
    pub source: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Client {
    pub library: &'static str,
    pub version: &'static str,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Assertion {
    /// `assert`, `check`, `snapshot` or `harness`.
    pub kind: &'static str,
    pub name: String,
    pub expected: String,
    pub actual: String,
    /// As printed in the transcript.
    pub result: &'static str,
    /// For a counterexample: this FAIL was declared, so it confirms the claim.
    pub expected_violation: bool,
    /// Whether this line supports the run's verdict (what JUnit reports).
    pub ok: bool,
    /// The unified diff, for a snapshot mismatch.
    pub detail: Option<String>,
}

/// The snapshot comparison as the runner's caller saw it.
pub enum SnapshotResult<'a> {
    Matched,
    Updated,
    Mismatch(&'a str),
}

pub fn record(
    lab: &Lab,
    run: &LabRun,
    info: &EnvInfo,
    snapshot: SnapshotResult,
    passed: bool,
) -> Record {
    let mut assertions: Vec<Assertion> = run
        .outcomes
        .iter()
        .map(|o| {
            // A counterexample's declared violation is the line that proves it.
            let declared = lab.variant.as_ref().and(lab.violations.get(&o.name));
            let ok = match declared {
                Some(v) => !o.pass && o.actual == *v,
                None => o.pass,
            };
            Assertion {
                kind: o.kind,
                name: o.name.clone(),
                expected: o.expected.clone(),
                actual: o.actual.clone(),
                result: if o.pass { "PASS" } else { "FAIL" },
                expected_violation: ok && declared.is_some(),
                ok,
                detail: declared.map(|v| format!("declared violation: {}={v}", o.name)),
            }
        })
        .collect();
    let snap_file = format!("snapshots/{}.snap", lab.run_name());
    let (actual, pass, detail) = match snapshot {
        SnapshotResult::Matched => ("matched", true, None),
        SnapshotResult::Updated => ("updated", true, None),
        SnapshotResult::Mismatch(diff) => ("differs", false, Some(diff.to_string())),
    };
    assertions.push(Assertion {
        kind: "snapshot",
        name: format!("transcript matches {snap_file}"),
        expected: "matched".into(),
        actual: actual.into(),
        result: if pass { "PASS" } else { "FAIL" },
        expected_violation: false,
        ok: pass,
        detail,
    });
    if let Some(e) = &run.error {
        assertions.push(Assertion {
            kind: "harness",
            name: "the lab ran to its end".into(),
            expected: "completed".into(),
            actual: "stopped".into(),
            result: "FAIL",
            expected_violation: false,
            ok: false,
            detail: Some(e.clone()),
        });
    }
    Record {
        schema_version: SCHEMA_VERSION,
        product: PRODUCT,
        lab: lab.name.clone(),
        variant: lab.variant.clone(),
        run: lab.run_name(),
        claim: lab.claim.clone(),
        verdict: match (&run.verdict, passed) {
            (LabVerdict::Holds, true) => "safe pattern holds".into(),
            (LabVerdict::CounterexampleConfirmed, true) => "counterexample confirmed".into(),
            _ => "FAIL".into(),
        },
        exit_code: if passed { 0 } else { 1 },
        broker: Server {
            version: info.broker_version.clone(),
            source: info.broker_source.clone(),
        },
        database: Server {
            version: info.db_version.clone(),
            source: info.db_source.clone(),
        },
        client: Client {
            library: CLIENT_LIBRARY,
            version: CLIENT_VERSION,
        },
        environment: info.kind,
        captured_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        duration_ms: run.duration.as_millis() as u64,
        assertions,
        error: run.error.clone(),
        transcript: run
            .transcript
            .normalized()
            .lines()
            .map(str::to_string)
            .collect(),
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

pub fn markdown(r: &Record) -> String {
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
    md.push_str(
        "\n## Assertions\n\n| kind | name | expected | actual | result |\n|---|---|---|---|---|\n",
    );
    for a in &r.assertions {
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
    if let Some(e) = &r.error {
        md.push_str(&format!("\n**The lab stopped early:** {}\n", cell(e)));
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

/// A Mermaid sequence diagram of what the transcript says happened: who
/// published, which process got which delivery, what reached PostgreSQL,
/// where a process was killed.
pub fn mermaid(lines: &[String]) -> String {
    let entries: Vec<Entry> = lines.iter().filter_map(|l| Entry::parse(l)).collect();
    let mut queues: Vec<String> = Vec::new();
    let mut consumers = 1;
    let mut next_is_new_process = false;
    let mut body = Vec::new();
    let mut has_db = false;
    let mut has_dlq = false;
    let queue = |name: &str, queues: &mut Vec<String>| -> String {
        if !queues.iter().any(|q| q == name) {
            queues.push(name.to_string());
        }
        format!("Q{}", queues.iter().position(|q| q == name).unwrap() + 1)
    };
    for e in &entries {
        let mid = e.get("messageId").unwrap_or("");
        let status = e.get("status").unwrap_or("");
        match e.role.as_str() {
            "producer"
                if status == "confirmed" || status == "nacked" || status == "unconfirmed" =>
            {
                let q = queue(e.get("destination").unwrap_or("?"), &mut queues);
                body.push(format!(
                    "    P->>{q}: {mid} [{}] {status}",
                    e.get("routingKey").unwrap_or("")
                ));
            }
            "consumer" => {
                if next_is_new_process && status == "received" {
                    consumers += 1;
                    next_is_new_process = false;
                }
                let c = format!("C{consumers}");
                let dest = e.get("destination").or(e.get("queue")).unwrap_or("?");
                let q = queue(dest, &mut queues);
                let attempt = e.get("attempt").unwrap_or("1");
                match status {
                    "received" => {
                        let re = if e.get("redelivered") == Some("true") {
                            ", redelivered"
                        } else {
                            ""
                        };
                        body.push(format!("    {q}->>{c}: {mid} (attempt {attempt}{re})"));
                    }
                    "business_committed" => {
                        has_db = true;
                        body.push(format!("    {c}->>DB: commit the business row for {mid}"));
                    }
                    "duplicate_skipped" => {
                        has_db = true;
                        body.push(format!(
                            "    {c}->>DB: inbox hit for {mid}: duplicate, rolled back"
                        ));
                        body.push(format!("    {c}-->>{q}: ack {mid}"));
                    }
                    "retry" => {
                        body.push(format!("    {c}-->>{q}: reject {mid} (to the retry queue)"))
                    }
                    "requeued" => body.push(format!("    {c}-->>{q}: nack {mid}, requeue=true")),
                    "rejected" => body.push(format!("    {c}-->>{q}: reject {mid}")),
                    "poison_to_dlq" => {
                        has_dlq = true;
                        body.push(format!("    {c}->>DLQ: publish {mid} (attempt {attempt})"));
                        body.push(format!("    {c}-->>{q}: ack {mid}"));
                    }
                    "crash_injected" => {
                        body.push(format!(
                            "    Note over {c}: SIGKILL at the fault window ({mid})"
                        ));
                        next_is_new_process = true;
                    }
                    "done" => {
                        body.push(format!(
                            "    Note over {c}: exits after {} deliveries",
                            e.get("received").unwrap_or("?")
                        ));
                        next_is_new_process = true;
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    let mut out = String::from("sequenceDiagram\n    participant P as producer\n");
    for (i, q) in queues.iter().enumerate() {
        out.push_str(&format!("    participant Q{} as {q}\n", i + 1));
    }
    for c in 1..=consumers {
        out.push_str(&format!("    participant C{c} as consumer process {c}\n"));
    }
    if has_dlq {
        out.push_str("    participant DLQ as DLQ\n");
    }
    if has_db {
        out.push_str("    participant DB as PostgreSQL\n");
    }
    for l in body {
        out.push_str(&l);
        out.push('\n');
    }
    out
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// JUnit XML: one testsuite per lab run, one testcase per assertion.
pub fn junit(records: &[Record]) -> String {
    let total: usize = records.iter().map(|r| r.assertions.len()).sum();
    let failures: usize = records
        .iter()
        .flat_map(|r| &r.assertions)
        .filter(|a| !a.ok)
        .count();
    let time: f64 = records.iter().map(|r| r.duration_ms as f64 / 1000.0).sum();
    let mut x = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"mqlab\" tests=\"{total}\" failures=\"{failures}\" errors=\"0\" time=\"{time:.3}\">\n"
    );
    for r in records {
        let fails = r.assertions.iter().filter(|a| !a.ok).count();
        x.push_str(&format!(
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{fails}\" errors=\"0\" skipped=\"0\" time=\"{:.3}\" timestamp=\"{}\">\n",
            xml(&r.run),
            r.assertions.len(),
            r.duration_ms as f64 / 1000.0,
            xml(r.captured_at.trim_end_matches('Z')),
        ));
        x.push_str("    <properties>\n");
        for (k, v) in [
            ("claim", r.claim.as_str()),
            ("verdict", r.verdict.as_str()),
            ("broker", r.broker.version.as_str()),
            ("database", r.database.version.as_str()),
            (
                "client",
                &format!("{} {}", r.client.library, r.client.version),
            ),
        ] {
            x.push_str(&format!(
                "      <property name=\"{k}\" value=\"{}\"/>\n",
                xml(v)
            ));
        }
        x.push_str("    </properties>\n");
        for a in &r.assertions {
            let name = format!("{} {}", a.kind, a.name);
            x.push_str(&format!(
                "    <testcase classname=\"mqlab.{}\" name=\"{}\" time=\"0\"",
                xml(&r.run),
                xml(&name)
            ));
            if a.ok {
                match (&a.detail, a.expected_violation) {
                    (Some(d), true) => x.push_str(&format!(
                        ">\n      <system-out>{}: observed, as the counterexample claims</system-out>\n    </testcase>\n",
                        xml(d)
                    )),
                    _ => x.push_str("/>\n"),
                }
            } else {
                let message = format!("{}={} (expected {})", a.name, a.actual, a.expected);
                x.push_str(&format!(
                    ">\n      <failure message=\"{}\" type=\"{}\">{}</failure>\n    </testcase>\n",
                    xml(&message),
                    a.kind,
                    xml(a.detail.as_deref().unwrap_or(&message))
                ));
            }
        }
        x.push_str("  </testsuite>\n");
    }
    x.push_str("</testsuites>\n");
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mermaid_marks_the_kill_and_the_second_process() {
        let lines: Vec<String> = [
            "[producer] messageId=mid-1 destination=orders.crash routingKey=orders.crash status=confirmed",
            "[consumer] messageId=mid-1 destination=orders.crash attempt=1 redelivered=false status=received",
            "[consumer] messageId=mid-1 destination=orders.crash attempt=1 status=business_committed",
            "[consumer] messageId=mid-1 destination=orders.crash status=crash_injected",
            "[assert] crashExitCode=137 PASS",
            "[consumer] messageId=mid-1 destination=orders.crash attempt=1 redelivered=true status=received",
            "[consumer] messageId=mid-1 destination=orders.crash attempt=1 status=duplicate_skipped",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let m = mermaid(&lines);
        assert!(m.starts_with("sequenceDiagram\n"));
        assert!(m.contains("participant Q1 as orders.crash"));
        assert!(m.contains("participant C2 as consumer process 2"));
        assert!(m.contains("Note over C1: SIGKILL at the fault window (mid-1)"));
        assert!(m.contains("Q1->>C2: mid-1 (attempt 1, redelivered)"));
        assert!(m.contains("C2->>DB: inbox hit for mid-1"));
    }

    #[test]
    fn xml_escapes() {
        assert_eq!(xml("a<b & \"c\">"), "a&lt;b &amp; &quot;c&quot;&gt;");
    }
}
