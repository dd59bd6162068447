//! `mqlab report merge`: the evidence of runs split over CI jobs
//! (`--partition`), brought together: one directory, one index, one JUnit
//! report, derived from each run's JSON as `--evidence` wrote it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::evidence::{self, Record};

/// What a merge wrote.
pub struct Merged {
    pub runs: usize,
    pub failed: Vec<String>,
    pub junit: PathBuf,
}

/// Copies each run's files (`<run>.json`, `.md`, `.png`) from `inputs` into
/// `out`, then writes `out/README.md` and the JUnit report. A run found in
/// two inputs is an error: the shares of a partition are disjoint, so it
/// means two reports of different suites.
pub fn merge(inputs: &[PathBuf], out: &Path, junit: Option<&Path>) -> Result<Merged> {
    let records = read_records(inputs)?;
    // One share may hold no run (more shares than runs); all of them, none.
    if records.is_empty() {
        bail!("no run evidence in these directories (written by `mqlab lab --evidence DIR`)");
    }
    evidence::prepare_dir(out)?;
    let versions: std::collections::BTreeSet<&str> =
        records.keys().map(|(_, v)| v.as_str()).collect();
    // Two generations or more: one directory each, and a matrix on top.
    let matrix = versions.len() > 1;
    let dir_of = |version: &str| match matrix {
        true => out.join(slug(version)),
        false => out.to_path_buf(),
    };
    copy_runs(&records, &dir_of)?;
    match matrix {
        false => evidence::write_index(out)?,
        true => {
            for v in &versions {
                evidence::write_index(&dir_of(v))?;
            }
            write_matrix(out, &records, &versions)?;
        }
    }
    let junit = junit
        .map(Path::to_path_buf)
        .unwrap_or_else(|| out.join("junit.xml"));
    let list: Vec<Record> = records
        .values()
        .map(|(r, _)| {
            let mut r = r.clone();
            if matrix {
                // One suite per run and generation.
                r.run = format!("{} [{}]", r.run, r.broker.version);
            }
            r
        })
        .collect();
    std::fs::write(&junit, evidence::junit(&list)?)
        .with_context(|| format!("cannot write `{}`", junit.display()))?;
    Ok(Merged {
        runs: list.len(),
        failed: list
            .iter()
            .filter(|r| r.exit_code != 0)
            .map(|r| r.run.clone())
            .collect(),
        junit,
    })
}

/// Each run's record, keyed by (run, broker version): the same run from
/// two generations is a matrix; from one generation twice, two reports of
/// different suites (an error).
type Records = BTreeMap<(String, String), (Record, PathBuf)>;

/// The run records (`<run>.json` with a `schemaVersion`) in `inputs`.
fn read_records(inputs: &[PathBuf]) -> Result<Records> {
    let mut records = Records::new();
    for dir in inputs {
        let entries = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read evidence directory `{}`", dir.display()))?;
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let Some(record) = read_record(&path)? else {
                continue; // schema.json and other files
            };
            let key = (record.run.clone(), record.broker.version.clone());
            if let Some((_, first)) = records.get(&key) {
                bail!(
                    "run `{}` on {} is in both `{}` and `{}`: not shares of one partitioned suite",
                    record.run,
                    record.broker.version,
                    first.display(),
                    dir.display()
                );
            }
            records.insert(key, (record, dir.clone()));
        }
    }
    Ok(records)
}

/// One JSON file as a run record; None for JSON that is not one.
fn read_record(path: &Path) -> Result<Option<Record>> {
    let text = std::fs::read_to_string(path)?;
    let value: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(_) => return Ok(None),
    };
    if value.get("schemaVersion").is_none() {
        return Ok(None);
    }
    let record: Record = serde_path_to_error::deserialize(value)
        .with_context(|| format!("`{}` is not an mqlab run record", path.display()))?;
    if record.schema_version != evidence::SCHEMA_VERSION {
        bail!(
            "`{}` has schema version {} (this mqlab reads {})",
            path.display(),
            record.schema_version,
            evidence::SCHEMA_VERSION
        );
    }
    Ok(Some(record))
}

/// Each run's files (`.json`, `.md`, `.png`) into its generation's directory.
fn copy_runs(records: &Records, dir_of: &dyn Fn(&str) -> PathBuf) -> Result<()> {
    for ((run, version), (_, dir)) in records {
        let to_dir = dir_of(version);
        std::fs::create_dir_all(&to_dir)?;
        for ext in ["json", "md", "png"] {
            let from = dir.join(format!("{run}.{ext}"));
            let to = to_dir.join(format!("{run}.{ext}"));
            let same = match (from.canonicalize(), to.canonicalize()) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            };
            if from.exists() && !same {
                std::fs::copy(&from, &to)
                    .with_context(|| format!("cannot copy `{}`", from.display()))?;
            }
        }
    }
    Ok(())
}

/// A directory name for a broker version: `RabbitMQ 4.0.5` → `rabbitmq-4.0.5`.
fn slug(version: &str) -> String {
    version
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// `out/README.md` for runs of several generations: a row per run, a
/// column per broker version, each cell its verdict linking to its page.
fn write_matrix(
    out: &Path,
    records: &Records,
    versions: &std::collections::BTreeSet<&str>,
) -> Result<()> {
    let mut md = String::from(
        "# mqlab evidence, by broker generation\n\nWritten by `mqlab report merge` from runs on several brokers: \
         each generation's pages in a directory of its own (its own index); a run missing on one is `–`; \
         a verdict reached with the lab file's declared difference for that generation (its own violations \
         and snapshot, its cause on the run's page) says so.\n\n| run |",
    );
    for v in versions {
        md.push_str(&format!(" [{v}]({}/README.md) |", slug(v)));
    }
    md.push_str("\n|---|");
    md.push_str(&"---|".repeat(versions.len()));
    md.push('\n');
    let runs: std::collections::BTreeSet<&str> = records.keys().map(|(r, _)| r.as_str()).collect();
    for run in runs {
        md.push_str(&format!("| {run} |"));
        for v in versions {
            match records.get(&(run.to_string(), v.to_string())) {
                Some((r, _)) => {
                    let declared = match &r.declared_difference {
                        Some(d) => format!(" (as declared for {})", d.generation),
                        None => String::new(),
                    };
                    md.push_str(&format!(
                        " [{}]({}/{run}.md){declared} |",
                        r.verdict,
                        slug(v)
                    ))
                }
                None => md.push_str(" – |"),
            }
        }
        md.push('\n');
    }
    std::fs::write(out.join("README.md"), md)
        .with_context(|| format!("cannot write the evidence index in `{}`", out.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The matrix marks a verdict reached with a declared difference: a
    /// reader of the index sees which cells are the generation's own
    /// expectation, not the 3.10 one.
    #[test]
    fn the_matrix_marks_a_declared_difference() {
        let base: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/evidence/consumer-crash.json"),
            )
            .unwrap(),
        )
        .unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let (a, b, out) = (
            tmp.path().join("a"),
            tmp.path().join("b"),
            tmp.path().join("out"),
        );
        for (dir, version, declared) in
            [(&a, "RabbitMQ 3.10.8", false), (&b, "RabbitMQ 4.0.5", true)]
        {
            std::fs::create_dir_all(dir).unwrap();
            let mut r = base.clone();
            r["broker"]["version"] = version.into();
            if declared {
                r["declaredDifference"] = serde_json::json!({
                    "generation": "4.0",
                    "cause": "a cause",
                    "source": "cause not identified",
                });
            }
            std::fs::write(dir.join("consumer-crash.json"), r.to_string()).unwrap();
        }
        merge(&[a, b], &out, None).unwrap();
        let index = std::fs::read_to_string(out.join("README.md")).unwrap();
        let row = index
            .lines()
            .find(|l| l.starts_with("| consumer-crash |"))
            .unwrap();
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert!(!cells[2].contains("declared"), "{row}");
        assert!(cells[3].ends_with("(as declared for 4.0)"), "{row}");
    }
}
