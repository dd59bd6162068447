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
    let mut records: BTreeMap<String, (Record, PathBuf)> = BTreeMap::new();
    for dir in inputs {
        let entries = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read evidence directory `{}`", dir.display()))?;
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let text = std::fs::read_to_string(&path)?;
            let value: serde_json::Value = match serde_json::from_str(&text) {
                Ok(v) => v,
                Err(_) => continue,
            };
            if value.get("schemaVersion").is_none() {
                continue; // schema.json and other files
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
            if let Some((_, first)) = records.get(&record.run) {
                bail!(
                    "run `{}` is in both `{}` and `{}`: not shares of one partitioned suite",
                    record.run,
                    first.display(),
                    dir.display()
                );
            }
            records.insert(record.run.clone(), (record, dir.clone()));
        }
    }
    // One share may hold no run (more shares than runs); all of them, none.
    if records.is_empty() {
        bail!("no run evidence in these directories (written by `mqlab lab --evidence DIR`)");
    }
    evidence::prepare_dir(out)?;
    for (run, (_, dir)) in &records {
        for ext in ["json", "md", "png"] {
            let from = dir.join(format!("{run}.{ext}"));
            let to = out.join(format!("{run}.{ext}"));
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
    evidence::write_index(out)?;
    let junit = junit
        .map(Path::to_path_buf)
        .unwrap_or_else(|| out.join("junit.xml"));
    let list: Vec<Record> = records.values().map(|(r, _)| r.clone()).collect();
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
