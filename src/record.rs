//! What one lab run leaves once it is over: the record every sink, the
//! evidence, explore and the report read. A leaf: it names the checker's and
//! the transcript's types and nothing that runs.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::checker::{History, LabVerdict, Outcome};
use crate::expect::Expect;
use crate::transcript::Transcript;

/// The snapshot comparison of one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotResult {
    Matched,
    Updated,
    /// The unified diff, stored then actual; the actual is left as `.snap.new`.
    Mismatch(String),
    /// The snapshot could not be read or written.
    Error(String),
    /// Not compared (`mqlab explore` judges the checks only).
    Skipped,
}

/// Everything known about one lab run once it is over: what the sinks get.
#[derive(Clone, Debug)]
pub struct RunRecord {
    pub run: String,
    pub lab: String,
    /// The broker the lab ran on (the evidence's `product`).
    pub broker: crate::vocab::Broker,
    pub variant: Option<String>,
    pub claim: String,
    /// For a variant: the declared violations (name → value).
    pub violations: BTreeMap<String, Expect>,
    pub transcript: Transcript,
    /// Every assertion and check evaluated, in order.
    pub outcomes: Vec<Outcome>,
    pub history: History,
    /// A harness-level failure (deadline, role crash, setup) that ended the lab early.
    pub error: Option<String>,
    pub verdict: LabVerdict,
    pub snapshot: SnapshotResult,
    pub duration: Duration,
    /// The kind of the harness failure in `error` (a window never reached,
    /// a deadline, a role that exited...).
    pub failure: Option<crate::failure::Failure>,
    /// The lab's harness facts: assertions fixed by how it runs, shown
    /// apart from the claim's evidence.
    pub facts: Vec<String>,
    /// The lab's broker facts: assertions the broker fixes in every run,
    /// shown apart from the claim's evidence and from the harness facts.
    pub broker_facts: Vec<String>,
    /// The broker settings the run relied on, as read from the broker.
    pub settings: Vec<(String, String)>,
    /// The lab file's declared difference for the generation the run was
    /// on: `violations` and the snapshot are that generation's.
    pub declared: Option<DeclaredDifference>,
    /// The run's own PostgreSQL (a lab's `database = "durable"`): its
    /// version and what it is, its durability read from the server; None
    /// on the environment's shared one.
    pub own_database: Option<(String, String)>,
    /// What a power loss dropped from the run's own PostgreSQL, file by
    /// file (`lazyfs`'s report; empty: nothing); None without one.
    pub power_lost: Option<Vec<String>>,
}

/// What a lab file says differs on one RabbitMQ generation, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeclaredDifference {
    /// `4.0`.
    pub generation: crate::vocab::Generation,
    pub cause: String,
    /// A URL, or "cause not identified".
    pub source: String,
}

impl RunRecord {
    /// The verdict holds (safe pattern, or counterexample confirmed) and the
    /// transcript matched.
    pub fn passed(&self) -> bool {
        matches!(
            self.verdict,
            LabVerdict::Holds | LabVerdict::CounterexampleConfirmed
        ) && matches!(
            self.snapshot,
            SnapshotResult::Matched | SnapshotResult::Updated | SnapshotResult::Skipped
        )
    }

    /// The one-word verdict the summary and the evidence print. A failed
    /// verdict comes first: a safe run that lost events is a `FAIL`, even
    /// when its transcript differs too; `FAIL (snapshot)` is a run whose
    /// checks all held and whose transcript changed.
    pub fn verdict_text(&self) -> &'static str {
        match (&self.verdict, &self.snapshot) {
            (LabVerdict::Failed(_), _) => "FAIL",
            (_, SnapshotResult::Mismatch(_)) if self.error.is_none() => "FAIL (snapshot)",
            _ if !self.passed() => "FAIL",
            (LabVerdict::Holds, _) => "safe pattern holds",
            _ => "counterexample confirmed",
        }
    }

    /// The summary's verdict: [`Self::verdict_text`], with the kind of a
    /// harness failure (`FAIL (deadline)`), so that a run that broke is not
    /// read as a claim refuted.
    pub fn summary_text(&self) -> String {
        match (
            self.verdict_text(),
            self.failure.as_ref().map(|f| f.label()),
        ) {
            ("FAIL", Some(kind)) => format!("FAIL ({kind})"),
            (text, _) => text.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(verdict: LabVerdict, snapshot: SnapshotResult) -> RunRecord {
        RunRecord {
            run: "r".into(),
            lab: "r".into(),
            broker: Default::default(),
            variant: None,
            claim: String::new(),
            violations: BTreeMap::new(),
            transcript: Transcript::default(),
            outcomes: Vec::new(),
            history: History::default(),
            error: None,
            verdict,
            snapshot,
            duration: Duration::ZERO,
            failure: None,
            facts: Vec::new(),
            broker_facts: Vec::new(),
            settings: Vec::new(),
            declared: None,
            own_database: None,
            power_lost: None,
        }
    }

    /// A safe run that lost events and whose transcript differs is a
    /// failed verdict, not a snapshot matter.
    #[test]
    fn the_verdict_comes_before_the_snapshot() {
        let diff = || SnapshotResult::Mismatch("-a\n+b".into());
        let failed = || LabVerdict::Failed("failed: lost=3".into());
        assert_eq!(record(failed(), diff()).verdict_text(), "FAIL");
        assert_eq!(
            record(LabVerdict::Holds, diff()).verdict_text(),
            "FAIL (snapshot)"
        );
        assert_eq!(
            record(failed(), SnapshotResult::Matched).verdict_text(),
            "FAIL"
        );
        assert_eq!(
            record(LabVerdict::Holds, SnapshotResult::Matched).verdict_text(),
            "safe pattern holds"
        );
        assert_eq!(
            record(LabVerdict::CounterexampleConfirmed, SnapshotResult::Matched).verdict_text(),
            "counterexample confirmed"
        );
    }

    /// The summary names a harness failure's kind; a verdict the checks
    /// gave keeps its word.
    #[test]
    fn the_summary_names_a_failure_kind() {
        use crate::failure::Failure;
        let broke = |f: Failure| RunRecord {
            error: Some("phase p exceeded 1 s".into()),
            failure: Some(f),
            ..record(
                LabVerdict::Failed("phase p exceeded 1 s".into()),
                SnapshotResult::Matched,
            )
        };
        assert_eq!(broke(Failure::Deadline).summary_text(), "FAIL (deadline)");
        assert_eq!(
            broke(Failure::Unreachable("w".into())).summary_text(),
            "FAIL (unreachable)"
        );
        assert_eq!(broke(Failure::Other).summary_text(), "FAIL (error)");
        let refuted = record(
            LabVerdict::Failed("failed: lost=3".into()),
            SnapshotResult::Matched,
        );
        assert_eq!(refuted.summary_text(), "FAIL");
        let holds = record(LabVerdict::Holds, SnapshotResult::Matched);
        assert_eq!(holds.summary_text(), "safe pattern holds");
    }
}
