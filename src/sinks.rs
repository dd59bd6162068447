//! The sinks of a run's event stream: the terminal, the summary table,
//! `--transcript-dir`, `--evidence` and `--junit`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::checker::LabVerdict;
use crate::env::EnvInfo;
use crate::events::{Event, Sink};
use crate::evidence;
use crate::record::{RunRecord, SnapshotResult};
use crate::snapshot;

/// Prints to stdout, ignoring a closed pipe (`mqlab lab ... | head`): the run
/// goes on and tears down as usual.
pub fn out(line: &str) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{line}");
}

/// Transcript lines on stdout as they happen; one line on stderr for each
/// environment choice and failure; on a terminal, a live progress line
/// (indicatif) with the boot's elapsed time, then each lab and its phase.
pub struct Terminal {
    bar: ProgressBar,
    snapshots: PathBuf,
    /// `mqlab explore`: progress only, no transcript lines or lab failures.
    quiet: bool,
}

impl Terminal {
    pub fn new(snapshots: PathBuf) -> Terminal {
        let target = if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(None, target);
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed:>3}] {msg}")
                .expect("a valid template"),
        );
        bar.enable_steady_tick(Duration::from_millis(120));
        Terminal {
            bar,
            snapshots,
            quiet: false,
        }
    }

    /// The same terminal, showing progress only.
    pub fn quiet(mut t: Terminal) -> Terminal {
        t.quiet = true;
        t
    }

    /// A handle the environment reports its boot steps through.
    pub fn progress(&self) -> ProgressBar {
        self.bar.clone()
    }

    fn say(&self, line: &str) {
        self.bar.suspend(|| eprintln!("mqlab: {line}"));
    }
}

impl Sink for Terminal {
    fn on(&mut self, event: &Event) -> Result<()> {
        if self.quiet
            && matches!(
                event,
                Event::Line(_) | Event::SnapshotCompared { .. } | Event::LabFinished(_)
            )
        {
            return Ok(());
        }
        match event {
            Event::EnvChosen { kind, why } => self.say(&format!("environment: {kind} ({why})")),
            Event::EnvProgress(what) => self.bar.set_message(format!("environment: {what}")),
            Event::EnvReady(info) => self.say(&format!(
                "environment ready in {:.1} s: {}, {}",
                info.ready.as_secs_f64(),
                info.broker_version,
                info.db_version
            )),
            Event::LabStarted { run, index, total } => {
                self.bar.reset_elapsed();
                self.bar.set_style(
                    ProgressStyle::with_template("{spinner} [{pos}/{len}] {msg} ({elapsed})")
                        .expect("a valid template"),
                );
                self.bar.set_length(*total as u64);
                self.bar.set_position(*index as u64 + 1);
                self.bar.set_message(run.to_string());
            }
            Event::Phase { run, phase } => self.bar.set_message(format!("{run}: {phase}")),
            Event::Line(line) => self.bar.suspend(|| out(line)),
            Event::Outcome(_) => {}
            Event::SnapshotCompared {
                run,
                result,
                update_refused,
            } => {
                let path = snapshot::path_for(&self.snapshots, run);
                match result {
                    SnapshotResult::Matched | SnapshotResult::Skipped => {}
                    SnapshotResult::Updated => {
                        self.say(&format!("{run}: snapshot updated: {}", path.display()))
                    }
                    SnapshotResult::Mismatch(diff) => {
                        self.bar.suspend(|| out(diff));
                        let accept = update_refused
                            .unwrap_or("accept with --update or `cargo insta review`");
                        self.say(&format!(
                            "{run}: transcript differs from {} (actual run written to {}.new; {accept})",
                            path.display(),
                            path.display()
                        ));
                    }
                    SnapshotResult::Error(e) => self.say(&format!("{run}: {e}")),
                }
            }
            Event::LabFinished(r) => {
                if let LabVerdict::Failed(why) = &r.verdict {
                    self.say(&format!("{}: {why}", r.run));
                }
            }
            Event::SuiteFinished { .. } => self.bar.finish_and_clear(),
        }
        Ok(())
    }
}

/// The table at the end: safe labs first, then counterexamples.
pub struct Summary;

impl Sink for Summary {
    fn on(&mut self, event: &Event) -> Result<()> {
        let Event::SuiteFinished { records, wall } = event else {
            return Ok(());
        };
        out("");
        out(&format!("{:<36} {:<26} {:>8}", "lab", "verdict", "seconds"));
        for variants in [false, true] {
            for r in records.iter().filter(|r| r.variant.is_some() == variants) {
                out(&format!(
                    "{:<36} {:<26} {:>8.2}",
                    r.run,
                    r.summary_text(),
                    r.duration.as_secs_f64()
                ));
            }
        }
        let failed = records.iter().filter(|r| !r.passed()).count();
        let holds = records
            .iter()
            .filter(|r| r.passed() && r.verdict == LabVerdict::Holds)
            .count();
        let confirmed = records.len() - failed - holds;
        out(&format!(
            "{} passed, {failed} failed ({holds} safe pattern holds, {confirmed} counterexample confirmed; {:.1} s wall)",
            records.len() - failed,
            wall.as_secs_f64()
        ));
        Ok(())
    }
}

/// `--transcript-dir DIR`: `DIR/<run>.log`, the normalized transcript.
pub struct TranscriptDir(pub PathBuf);

impl Sink for TranscriptDir {
    fn on(&mut self, event: &Event) -> Result<()> {
        if let Event::LabFinished(r) = event {
            let path = self.0.join(format!("{}.log", r.run));
            std::fs::write(&path, r.transcript.normalized())
                .with_context(|| format!("cannot write `{}`", path.display()))?;
        }
        Ok(())
    }
}

fn env_info(info: &Option<EnvInfo>) -> Result<&EnvInfo> {
    info.as_ref()
        .context("a lab finished before the environment was ready")
}

/// `--evidence DIR`: a page and a JSON document per run as it finishes, the
/// index at the end.
pub struct Evidence {
    pub dir: PathBuf,
    pub info: Option<EnvInfo>,
}

impl Sink for Evidence {
    fn on(&mut self, event: &Event) -> Result<()> {
        match event {
            Event::EnvReady(info) => self.info = Some((*info).clone()),
            Event::LabFinished(r) => {
                evidence::write(&self.dir, &evidence::record(r, env_info(&self.info)?))?
            }
            Event::SuiteFinished { .. } => {
                evidence::write_index(&self.dir)?;
                eprintln!("mqlab: evidence written to {}", self.dir.display());
            }
            _ => {}
        }
        Ok(())
    }
}

/// `--junit FILE`: written at the end, whatever happened to the labs.
pub struct Junit {
    pub file: PathBuf,
    pub info: Option<EnvInfo>,
    pub records: Vec<evidence::Record>,
}

impl Junit {
    pub fn new(file: &Path) -> Junit {
        Junit {
            file: file.to_path_buf(),
            info: None,
            records: Vec::new(),
        }
    }
}

impl Sink for Junit {
    fn on(&mut self, event: &Event) -> Result<()> {
        match event {
            Event::EnvReady(info) => self.info = Some((*info).clone()),
            Event::LabFinished(r) => self
                .records
                .push(evidence::record(r, env_info(&self.info)?)),
            Event::SuiteFinished { records, .. } => {
                // The suites in the labs' order, not the order runs ended in
                // (concurrent runs end in any order).
                let order = |run: &str| {
                    records
                        .iter()
                        .position(|r| r.run == run)
                        .unwrap_or(usize::MAX)
                };
                self.records.sort_by_cached_key(|e| order(&e.run));
                std::fs::write(&self.file, evidence::junit(&self.records)?)
                    .with_context(|| format!("cannot write `{}`", self.file.display()))?;
                eprintln!("mqlab: JUnit report written to {}", self.file.display());
            }
            _ => {}
        }
        Ok(())
    }
}

/// The records, judged for the exit code: 0 when every run passed.
pub fn all_passed(records: &[RunRecord]) -> bool {
    records.iter().all(RunRecord::passed)
}
