//! One event stream out of a run. The runner says what happens; the
//! terminal, the summary table, the evidence pages, JUnit and
//! `--transcript-dir` are sinks of it (nextest's reporter shape): a new
//! output is one more sink, never a change to the runner.

use std::time::Duration;

use crate::checker::Outcome;
use crate::env::EnvInfo;
use crate::record::{RunRecord, SnapshotResult};

pub enum Event<'a> {
    /// The environment was chosen (`local`, `containers`) and why.
    EnvChosen {
        kind: &'a str,
        why: &'a str,
    },
    /// A boot step of the environment (`RabbitMQ booting`, `PostgreSQL ready`).
    EnvProgress(&'a str),
    EnvReady(&'a EnvInfo),
    LabStarted {
        run: &'a str,
        index: usize,
        total: usize,
    },
    /// A phase of the running lab (`publish(orders.crash)`, `consume(...)`).
    Phase {
        run: &'a str,
        phase: &'a str,
    },
    /// One transcript line, as the harness received it.
    Line(&'a str),
    Outcome(&'a Outcome),
    SnapshotCompared {
        run: &'a str,
        result: &'a SnapshotResult,
        /// Why `--update` would not rewrite this snapshot (a failed run;
        /// 3.10's snapshot on another generation), when it would not.
        update_refused: Option<&'a str>,
    },
    LabFinished(&'a RunRecord),
    SuiteFinished {
        records: &'a [RunRecord],
        wall: Duration,
    },
}

pub trait Sink {
    /// A sink that cannot do its job (an unwritable file) says so; the run
    /// goes on and the error is reported at the end.
    fn on(&mut self, event: &Event) -> anyhow::Result<()>;

    /// What the runner and the session call: a failure is said on stderr
    /// at once and the run goes on (a [`Fanout`] also keeps its sinks'
    /// errors for the end of the command, which then exits 2).
    fn tell(&mut self, event: &Event) {
        if let Err(e) = self.on(event) {
            eprintln!("mqlab: an output failed: {e:#}");
        }
    }
}

/// Several sinks as one; the first error of each is kept.
#[derive(Default)]
pub struct Fanout {
    sinks: Vec<Box<dyn Sink>>,
    pub errors: Vec<anyhow::Error>,
}

impl Fanout {
    pub fn push(&mut self, sink: impl Sink + 'static) {
        self.sinks.push(Box::new(sink));
    }
}

impl Sink for Fanout {
    fn on(&mut self, event: &Event) -> anyhow::Result<()> {
        for s in &mut self.sinks {
            if let Err(e) = s.on(event) {
                self.errors.push(e);
            }
        }
        Ok(())
    }
}

/// A sink that ignores everything (benchmarks, tests).
pub struct Quiet;

impl Sink for Quiet {
    fn on(&mut self, _: &Event) -> anyhow::Result<()> {
        Ok(())
    }
}
