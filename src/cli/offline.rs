//! The commands that start no server: `mqlab check` (a stored history
//! judged again) and `mqlab report merge` (CI shares into one report).

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::out;
use crate::error::{Error, UsageContext};
use crate::evidence;
use crate::exit;

/// `mqlab check RUN.json...`: the stored history judged again, offline.
pub(super) fn cmd_check(files: &[PathBuf]) -> Result<i32, Error> {
    let mut failed = 0;
    for file in files {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read `{}`", file.display()))
            .usage()?;
        let r: evidence::Record = serde_json::from_str(&text)
            .with_context(|| format!("`{}` is not a run's evidence JSON", file.display()))
            .usage()?;
        if r.history.points.is_empty() {
            return Err(Error::Usage(anyhow::anyhow!(
                "`{}` holds no history to re-judge (written by an mqlab older than `mqlab check`?)",
                file.display()
            )));
        }
        let declared = r.variant.as_ref().map(|_| &r.declared_violations);
        // The raw lines when the record has them (a measured value is
        // normalized out of the transcript).
        let lines = if r.history.lines.is_empty() {
            &r.transcript
        } else {
            &r.history.lines
        };
        let (outcomes, verdict) = crate::checker::rejudge(&r.history, lines, declared);
        for o in &outcomes {
            out(&format!(
                "[{}] {}={} {}",
                o.kind.name(),
                o.name,
                o.actual,
                if o.pass { "PASS" } else { "FAIL" }
            ));
        }
        let stored: Vec<(&str, &str, &str)> = r
            .assertions
            .iter()
            // A harness or broker fact is an assertion shown apart.
            .filter(|a| matches!(a.kind.as_str(), "assert" | "check" | "fact" | "broker-fact"))
            .map(|a| (a.name.as_str(), a.actual.as_str(), a.result.as_str()))
            .collect();
        let again: Vec<(&str, &str, &str)> = outcomes
            .iter()
            .map(|o| {
                (
                    o.name.as_str(),
                    o.actual.as_str(),
                    if o.pass { "PASS" } else { "FAIL" },
                )
            })
            .collect();
        let text = match &verdict {
            crate::checker::LabVerdict::Holds => "safe pattern holds".to_string(),
            crate::checker::LabVerdict::CounterexampleConfirmed => {
                "counterexample confirmed".to_string()
            }
            crate::checker::LabVerdict::Failed(why) => format!("FAIL: {why}"),
        };
        let same = if stored == again {
            "as recorded"
        } else {
            "DIFFERS from the recorded outcomes"
        };
        out(&format!(
            "{}: {text} ({} outcomes re-judged, {same})",
            r.run,
            outcomes.len()
        ));
        if matches!(verdict, crate::checker::LabVerdict::Failed(_)) || stored != again {
            failed += 1;
        }
    }
    Ok(if failed == 0 {
        exit::OK
    } else {
        exit::LAB_FAILED
    })
}

pub(super) fn cmd_report_merge(
    dirs: &[PathBuf],
    out: &Path,
    junit: Option<&Path>,
) -> Result<i32, Error> {
    let m = crate::report::merge(dirs, out, junit).usage()?;
    eprintln!(
        "mqlab: merged {} runs from {} directories into {} (index README.md), JUnit {}",
        m.runs,
        dirs.len(),
        out.display(),
        m.junit.display()
    );
    if m.failed.is_empty() {
        return Ok(exit::OK);
    }
    eprintln!("mqlab: {} failed: {}", m.failed.len(), m.failed.join(", "));
    Ok(exit::LAB_FAILED)
}
