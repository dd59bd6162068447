//! `mqlab explore`: every fault point a lab's roles pass, each run on its
//! own and judged by the total-queue checks (and, where a lab has them, the
//! counters they cannot see: [`judged_apart`]). A scripted lab proves one
//! window; the bugs that reach production sit in the ones nobody scripted.
//!
//! The points of a lab come from the placement registry
//! ([`crate::vocab::PLACEMENTS`]): for each consume step, each window its
//! consumer passes (a built-in pattern's, or the black-box windows of a
//! program) times each message published before it, and the network cut of
//! each message's ack; for each publish step, each producer window, the
//! network cut of each publish and (with a confirm timeout) the held
//! confirm, times its messages; and a broker restart between any two steps.
//! The lab's own fault and assertions are dropped. A clean run comes first
//! ([`baseline`]): the built-in consumer's windows are then the ones it
//! passed there ([`Passed`]), not the ones its pattern declares, and where
//! the two differ explore fails ([`mismatches`]).

use std::collections::BTreeMap;

mod followed;
pub use followed::{mismatches, Passed};

use crate::exit;
use crate::failure::Failure;
use crate::lab::{Action, Assertion, Consume, Fault, Lab, Settle, Step};
use crate::record::RunRecord;
use crate::vocab::{Check, Counter, Explore, FaultAction, Placement, Site, Window, PLACEMENTS};

/// One fault point: where, and the lab that injects exactly it.
#[derive(Clone, Debug)]
pub struct Point {
    /// `consumer/after-ack`, `producer/after-confirm`, `network/before-commit`,
    /// `broker/restart` ...: the matrix row.
    pub row: String,
    /// The message (`mid-2`), or the step after which the broker restarts.
    pub column: String,
    pub lab: Lab,
}

/// What a point showed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every check passed.
    Ok,
    /// The checks that failed, as `lost=1`.
    Violation(String),
    /// The window is never reached at this message (why).
    Unreachable(String),
    /// The run stopped for another reason.
    Error(String),
}

impl Verdict {
    pub fn of(r: &RunRecord) -> Verdict {
        if let Some(Failure::Unreachable(why)) = &r.failure {
            return Verdict::Unreachable(why.clone());
        }
        if let Some(e) = &r.error {
            return Verdict::Error(e.lines().next().unwrap_or_default().to_string());
        }
        let failed: Vec<String> = r
            .outcomes
            .iter()
            .filter(|o| !o.pass)
            .map(|o| format!("{}={}", o.name, o.actual))
            .collect();
        if failed.is_empty() {
            Verdict::Ok
        } else {
            Verdict::Violation(failed.join(" "))
        }
    }

    /// Which of two verdicts in one matrix cell the cell shows: a lab with
    /// two consume steps has two points per (window, message), one of them
    /// never reached (the message is consumed in the other step).
    fn weight(&self) -> u8 {
        match self {
            Verdict::Violation(_) => 3,
            Verdict::Error(_) => 2,
            Verdict::Ok => 1,
            Verdict::Unreachable(_) => 0,
        }
    }

    /// The matrix cell.
    pub fn cell(&self) -> String {
        match self {
            Verdict::Ok => "ok".into(),
            Verdict::Violation(v) => v.clone(),
            Verdict::Unreachable(_) => "–".into(),
            Verdict::Error(_) => "error".into(),
        }
    }
}

/// The lab as every point runs it: no fault, no assertions; each consume
/// step drains what its queue holds; and at the end, one more consumer per
/// queue drains what a fault left there (a redelivery, a resent copy), so
/// that what the fault causes *after* the lab's own steps is judged too.
fn base_of(lab: &Lab) -> Lab {
    let mut base = lab.clone();
    let mut drains: Vec<Step> = Vec::new();
    for s in &mut base.steps {
        s.fault = None;
        s.asserts.clear();
        if let Action::Consume(c) = &mut s.action {
            c.settle = Settle::Drain;
            // Several instances run only under the lab's own rendezvous,
            // which a point replaces: each point runs one.
            c.instances = 1;
            if !drains
                .iter()
                .any(|d| matches!(&d.action, Action::Consume(x) if x.queue == c.queue))
            {
                drains.push(Step {
                    action: Action::Consume(c.clone()),
                    fault: None,
                    asserts: Vec::new(),
                });
            }
        }
    }
    base.steps.extend(drains);
    for s in &mut base.steps {
        if let Action::Consume(Consume {
            downstream: Some(d),
            ..
        }) = &mut s.action
        {
            // The lab's own lost response is a fault too: dropped, as its
            // kill is, so that a point shows what its own fault does.
            d.lose_response.clear();
        }
    }
    if let Some(last) = base.steps.last_mut() {
        for c in judged_apart(lab) {
            last.asserts.push(Assertion {
                name: c.name().to_string(),
                counter: c.name().parse().expect("a counter without argument"),
                expected: "0".into(),
            });
        }
    }
    base
}

fn with_label(mut lab: Lab, label: &str) -> Lab {
    let run = match &lab.variant {
        Some(v) => format!("{v}~{label}"),
        None => format!("~{label}"),
    };
    lab.variant = Some(run);
    lab.violations = BTreeMap::new();
    lab.generations = BTreeMap::new();
    lab
}

/// Every fault point of `lab`, in a fixed order, the built-in consumer's
/// windows as its pattern declares them.
pub fn points(lab: &Lab) -> Vec<Point> {
    points_with(lab, None)
}

/// Every fault point of `lab`, the built-in consumer's windows those the
/// clean run `passed` (and a window it passed that its pattern does not
/// declare too). Long because it is one pass over the steps, an arm per
/// kind of step and the placements it admits, so the order of the points
/// is the order of the lab.
pub fn points_with(lab: &Lab, passed: Option<&Passed>) -> Vec<Point> {
    let base = base_of(lab);
    // The drain steps at the end are not places for a fault.
    let own = lab.steps.len();
    let mut out = Vec::new();
    let mut published: Vec<String> = Vec::new();
    // Two consume steps give two points per (window, message): one cell,
    // two runs, each with a name (logs, record) of its own.
    let mut labels: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    for (i, step) in base.steps.iter().enumerate().take(own) {
        let mut at = |row: String, column: String, f: Fault| {
            let mut l = base.clone();
            if matches!(f.action, FaultAction::Rendezvous | FaultAction::Stall) {
                // The lab's own instances, as its rendezvous or stall needs them.
                l.steps[i].action = lab.steps[i].action.clone();
            }
            l.steps[i].fault = Some(f);
            let mut label = format!("{}:{column}", row.replace('/', "-"));
            if !labels.insert(label.clone()) {
                label = format!("{label}:step{i}");
                labels.insert(label.clone());
            }
            out.push(Point {
                row,
                column,
                lab: with_label(l, &label),
            });
        };
        // The placements of the registry, in its order: a publish step's
        // message by message, a consume step's window by window.
        match &step.action {
            Action::Publish(pb) => {
                // A batching producer keeps no journal across a restart: the
                // lab file refuses a fault on its step, and so does explore.
                let faultable = pb.batch.is_none();
                for m in &pb.messages {
                    let mid = &m.meta.message_id;
                    for p in PLACEMENTS
                        .iter()
                        .filter(|p| faultable && p.site == Site::Publish && pb.confirm_fits(p))
                    {
                        for w in pb.windows_of(p) {
                            if let Some(r) = row_of(p, w) {
                                at(r, mid.clone(), fault_at(p, w, mid));
                            }
                        }
                    }
                }
                published.extend(pb.messages.iter().map(|m| m.meta.message_id.clone()));
            }
            Action::Consume(c) => {
                // The lab's rendezvous, as it is: the one point where its
                // instances hold copies at once (a crash point runs one).
                if let Some(f) = rendezvous_of(lab, i) {
                    at(
                        format!("consumer/{}-{}", f.action, f.window),
                        f.message.clone(),
                        f,
                    );
                }
                // A database fault needs a database of the run's own.
                let own_database = lab.database != crate::vocab::Durability::Fast;
                for p in PLACEMENTS.iter().filter(|p| {
                    p.site == Site::Consume
                        && c.admits(p)
                        && (p.target != crate::vocab::Target::Database || own_database)
                }) {
                    // The built-in consumer's own path, as the clean run
                    // went: where it passed, and where it went undeclared.
                    let followed = passed.filter(|_| {
                        c.command.is_none()
                            && matches!(p.windows, crate::vocab::Windows::ConsumerPath)
                    });
                    let undeclared = followed.map(|f| f.undeclared(c)).unwrap_or_default();
                    let pairs = c
                        .windows_of(p)
                        .into_iter()
                        .flat_map(|w| published.iter().map(move |mid| (w, mid.clone())));
                    for (w, mid) in pairs
                        .filter(|(w, mid)| followed.is_none_or(|f| f.passed(&c.queue, *w, mid)))
                        .chain(
                            undeclared
                                .into_iter()
                                .filter(|(_, m)| published.contains(m)),
                        )
                    {
                        if let Some(r) = row_of(p, w) {
                            at(r, mid.clone(), fault_at(p, w, &mid));
                        }
                    }
                }
            }
            Action::Inspect(_)
            | Action::Broker(_)
            | Action::Node { .. }
            | Action::Declare(_)
            | Action::Delete(_)
            | Action::Await { .. }
            | Action::PurgeInbox { .. }
            | Action::Replay { .. }
            | Action::Policy { .. } => {}
        }
    }
    out.extend(between_points(&base, own));
    out
}

/// Step `i`'s rendezvous (or stall), as the lab declares it, without its
/// assertions (a point is judged by the checker alone).
fn rendezvous_of(lab: &Lab, i: usize) -> Option<Fault> {
    let mut f = lab.steps[i]
        .fault
        .clone()
        .filter(|f| matches!(f.action, FaultAction::Rendezvous | FaultAction::Stall))?;
    f.asserts.clear();
    Some(f)
}

/// The lab with no fault, run before the points: the built-in consumer
/// says each window it passes ([`Passed`]), and a program that fails it
/// fails every point the same way.
pub fn baseline(lab: &Lab) -> Lab {
    let mut clean = with_label(base_of(lab), "baseline");
    clean.announce_windows = true;
    clean
}

/// How many `COMMIT`s per message explore tries at most (a program that
/// commits more often has its later ones untried; docs/byo.md says so).
pub const MAX_COMMITS: usize = 16;

/// After a point at a program's k-th `COMMIT` of a message that reached
/// its window (it held, or a check failed), the point at its (k+1)-th: a
/// program may commit several times per message, and explore tries every
/// `COMMIT` until one never comes (that point is "never reached").
pub fn next_commit(p: &Point, verdict: &Verdict) -> Option<Point> {
    if !matches!(verdict, Verdict::Ok | Verdict::Violation(_)) {
        return None;
    }
    let i = p.lab.steps.iter().position(|s| {
        matches!(&s.action, Action::Consume(c) if c.command.is_some())
            && s.fault.as_ref().is_some_and(|f| {
                f.window == Window::BeforeCommit && f.action == crate::vocab::FaultAction::Kill
            })
    })?;
    let mut l = p.lab.clone();
    let f = l.steps[i].fault.as_mut()?;
    if f.commit >= MAX_COMMITS {
        return None;
    }
    f.commit += 1;
    let window = crate::faults::blackbox::commit_window_name(f.commit);
    let row = format!("{}/{window}", f.target);
    let label = format!("{}:{}", row.replace('/', "-"), p.column);
    l.variant = l.variant.map(|v| match v.split_once('~') {
        Some((own, _)) => format!("{own}~{label}"),
        None => v,
    });
    Some(Point {
        row,
        column: p.column.clone(),
        lab: l,
    })
}

/// The row a placement's point at window `w` is counted under, if explored.
fn row_of(p: &Placement, w: Window) -> Option<String> {
    match p.explore {
        Explore::PerWindow => Some(format!("{}/{w}", p.target)),
        Explore::PerWindowAs(name) => Some(format!("{name}/{w}")),
        Explore::Row(r) => Some(r.to_string()),
        Explore::No => None,
    }
}

/// The placement's fault at window `w` of message `mid`, as explore puts it:
/// a restarted consumer drains what is left.
fn fault_at(p: &Placement, w: Window, mid: &str) -> Fault {
    Fault {
        node: None,
        target: p.target,
        action: p.action,
        window: w,
        commit: 1,
        message: mid.to_string(),
        then: p.then,
        kill_at_depth: None,
        restart_settle: None,
        restart_drain: true,
        copies: Vec::new(),
        asserts: Vec::new(),
    }
}

/// A fault between any two of the lab's `own` steps (the broker restart; a
/// cluster's node faults are not explored).
fn between_points(base: &Lab, own: usize) -> Vec<Point> {
    let mut out = Vec::new();
    for p in PLACEMENTS.iter().filter(|p| p.site == Site::Between) {
        let (Explore::Row(row), crate::vocab::Target::Broker) = (p.explore, p.target) else {
            continue;
        };
        for i in 0..own.saturating_sub(1) {
            let mut l = base.clone();
            l.steps.insert(
                i + 1,
                Step {
                    action: Action::Broker(p.action),
                    fault: None,
                    asserts: Vec::new(),
                },
            );
            out.push(Point {
                row: row.to_string(),
                lab: with_label(l, &format!("{}:after-step-{i}", row.replace('/', "-"))),
                column: format!("after step {i}"),
            });
        }
    }
    out
}

/// What a set of points showed, counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tally {
    pub ok: usize,
    pub violated: usize,
    pub unreachable: usize,
    pub errors: usize,
}

impl Tally {
    pub fn of(results: &[(Point, Verdict)]) -> Tally {
        let count = |f: fn(&Verdict) -> bool| results.iter().filter(|(_, v)| f(v)).count();
        Tally {
            ok: count(|v| matches!(v, Verdict::Ok)),
            violated: count(|v| matches!(v, Verdict::Violation(_))),
            unreachable: count(|v| matches!(v, Verdict::Unreachable(_))),
            errors: count(|v| matches!(v, Verdict::Error(_))),
        }
    }

    pub fn summary(&self, secs: f64) -> String {
        let Tally {
            ok,
            violated,
            unreachable,
            errors,
        } = self;
        format!(
            "{} points in {secs:.1} s: {ok} hold, {violated} violate a check, {unreachable} never reach their window, {errors} errors",
            ok + violated + unreachable + errors
        )
    }

    /// The verdict policy, with a line to print where it needs one. A safe
    /// lab must hold at every point (an error is a doubt, and a doubt
    /// fails); a counterexample must fail somewhere, by a check, not
    /// merely an error; one share of its points (`--partition`) need not.
    pub fn exit_code(&self, counterexample: bool, one_share: bool) -> (i32, Option<&'static str>) {
        let holds = self.violated == 0 && self.errors == 0;
        match (counterexample, holds) {
            (false, true) => (exit::OK, None),
            (false, false) => (exit::LAB_FAILED, None),
            (true, _) if self.violated > 0 => (exit::OK, None),
            (true, _) if one_share && self.errors == 0 => (
                exit::OK,
                Some("no violation in this share; the counterexample is confirmed if another share reports one"),
            ),
            (true, _) => (exit::LAB_FAILED, None),
        }
    }
}

/// A line for each point that violated a check or stopped with an error.
pub fn findings(results: &[(Point, Verdict)]) -> Vec<String> {
    results
        .iter()
        .filter_map(|(p, v)| match v {
            Verdict::Violation(what) => {
                Some(format!("violation: {} at {}: {what}", p.row, p.column))
            }
            Verdict::Error(e) => Some(format!("error: {} at {}: {e}", p.row, p.column)),
            _ => None,
        })
        .collect()
}

/// `n` points of `all`, chosen by `seed` (reproducible), in their order.
pub fn sample(all: Vec<Point>, n: usize, seed: u64) -> Vec<Point> {
    if n >= all.len() {
        return all;
    }
    // xorshift; a partial Fisher-Yates over the indices.
    let mut x = seed | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut idx: Vec<usize> = (0..all.len()).collect();
    for i in 0..n {
        let j = i + (next() as usize) % (idx.len() - i);
        idx.swap(i, j);
    }
    let mut keep: Vec<usize> = idx[..n].to_vec();
    keep.sort();
    let mut all: Vec<Option<Point>> = all.into_iter().map(Some).collect();
    keep.into_iter()
        .map(|i| all[i].take().expect("each index once"))
        .collect()
}

/// Rows, columns and the cell at each (row, column).
pub struct Matrix {
    pub rows: Vec<String>,
    pub columns: Vec<String>,
    pub cells: BTreeMap<(String, String), String>,
}

/// The matrix: one row per fault, one column per message (or step). A
/// cell several points share shows the most telling of their verdicts (a
/// violation, an error, a hold, then never reached).
pub fn matrix(results: &[(Point, Verdict)]) -> Matrix {
    let mut rows: Vec<String> = Vec::new();
    let mut columns: Vec<String> = Vec::new();
    let mut shown: BTreeMap<(String, String), Verdict> = BTreeMap::new();
    for (p, v) in results {
        if !rows.contains(&p.row) {
            rows.push(p.row.clone());
        }
        if !columns.contains(&p.column) {
            columns.push(p.column.clone());
        }
        let cell = shown
            .entry((p.row.clone(), p.column.clone()))
            .or_insert_with(|| v.clone());
        if v.weight() > cell.weight() {
            *cell = v.clone();
        } else if let (Verdict::Violation(a), Verdict::Violation(b)) = (&mut *cell, v) {
            // Two different violations in one cell: both.
            if !a.split(" / ").any(|x| x == b) {
                *a = format!("{a} / {b}");
            }
        }
    }
    Matrix {
        rows,
        columns,
        cells: shown.into_iter().map(|(k, v)| (k, v.cell())).collect(),
    }
}

/// The matrix as text for a terminal.
pub fn render_text(results: &[(Point, Verdict)]) -> String {
    let Matrix {
        rows,
        columns,
        cells,
    } = matrix(results);
    let width = |c: &String| {
        rows.iter()
            .filter_map(|r| cells.get(&(r.clone(), c.clone())))
            .map(|s| s.chars().count())
            .chain(std::iter::once(c.chars().count()))
            .max()
            .unwrap_or(2)
    };
    let first = rows.iter().map(|r| r.len()).max().unwrap_or(10).max(10);
    let mut out = format!("{:<first$}", "");
    for c in &columns {
        out.push_str(&format!("  {:<w$}", c, w = width(c)));
    }
    out.push('\n');
    for r in &rows {
        out.push_str(&format!("{r:<first$}"));
        for c in &columns {
            let cell = cells
                .get(&(r.clone(), c.clone()))
                .map(String::as_str)
                .unwrap_or("");
            out.push_str(&format!("  {:<w$}", cell, w = width(c)));
        }
        out.push('\n');
    }
    out
}

/// The matrix as a Markdown page (`--evidence`).
pub fn render_markdown(
    run: &str,
    claim: &str,
    results: &[(Point, Verdict)],
    summary: &str,
) -> String {
    let Matrix {
        rows,
        columns,
        cells,
    } = matrix(results);
    let mut md = format!("# explore {run}\n\n> {claim}\n\n{summary}\n\n| fault |");
    for c in &columns {
        md.push_str(&format!(" {c} |"));
    }
    md.push_str("\n|---|");
    md.push_str(&"---|".repeat(columns.len()));
    md.push('\n');
    for r in &rows {
        md.push_str(&format!("| `{r}` |"));
        for c in &columns {
            let cell = cells
                .get(&(r.clone(), c.clone()))
                .map(String::as_str)
                .unwrap_or("");
            md.push_str(&format!(" {cell} |"));
        }
        md.push('\n');
    }
    md.push_str(
        "\n`ok`: every total-queue check passed (nothing lost, nothing applied twice, nothing unexpected). \
         `–`: the window is never reached at this message. Otherwise the checks that failed.\n",
    );
    let errors: Vec<String> = results
        .iter()
        .filter_map(|(p, v)| match v {
            Verdict::Error(e) => Some(format!("- `{}` at {}: {e}", p.row, p.column)),
            _ => None,
        })
        .collect();
    if !errors.is_empty() {
        md.push_str("\n## Errors\n\n");
        md.push_str(&errors.join("\n"));
        md.push('\n');
    }
    md
}

/// What the total-queue checks cannot see in `lab`, judged at every point
/// as a counter that must be 0: a downstream's second or missing effect
/// (the checks read the business rows), an order an order service committed whose
/// event never came (counted by `lost` too, and named).
fn judged_apart(lab: &Lab) -> Vec<Counter> {
    let mut out = Vec::new();
    for s in &lab.steps {
        match &s.action {
            Action::Consume(c) if c.downstream.is_some() => {
                out.extend([Counter::DuplicateSideEffects, Counter::MissingSideEffects])
            }
            Action::Publish(p) if p.orders.is_some() => out.push(Counter::OrdersWithoutEvent),
            _ => {}
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The checks (and counters) every point of `lab` is judged by.
pub fn judged_by(lab: &Lab) -> String {
    let mut names = Check::names();
    names.extend(judged_apart(lab).iter().map(|c| c.name()));
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lab() -> Lab {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        crate::lab::Project { root }.load("consumer-crash").unwrap()
    }

    /// consumer-crash: 4 consumer windows × 3 messages, 3 connections to
    /// cut before the COMMIT and 3 with the ack, 2 producer windows and a
    /// publish to cut × 3 messages, 2 restarts.
    #[test]
    fn the_points_of_consumer_crash() {
        let p = points(&lab());
        assert_eq!(
            p.len(),
            12 + 6 + 9 + 2,
            "{:?}",
            p.iter().map(|p| &p.row).collect::<Vec<_>>()
        );
        let names: std::collections::BTreeSet<String> =
            p.iter().map(|p| p.lab.run_name()).collect();
        assert_eq!(
            names.len(),
            p.len(),
            "each point runs under a name of its own"
        );
        for point in &p {
            let faults = point.lab.steps.iter().filter(|s| s.fault.is_some()).count();
            let restarts = point
                .lab
                .steps
                .iter()
                .filter(|s| matches!(s.action, Action::Broker(_)))
                .count();
            assert_eq!(faults + restarts, 1, "{}", point.lab.run_name());
            assert!(point.lab.steps.iter().all(|s| s.asserts.is_empty()));
        }
    }

    /// A lab with two consume steps has two points per (window, message),
    /// one cell: each still runs under a name of its own.
    #[test]
    fn points_that_share_a_cell_have_names_of_their_own() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let lab = crate::lab::Project { root }
            .load("reject-publish-resend")
            .unwrap();
        let p = points(&lab);
        let cells: std::collections::BTreeSet<(&str, &str)> = p
            .iter()
            .map(|p| (p.row.as_str(), p.column.as_str()))
            .collect();
        assert!(cells.len() < p.len(), "no cell is shared");
        let names: std::collections::BTreeSet<String> =
            p.iter().map(|p| p.lab.run_name()).collect();
        assert_eq!(names.len(), p.len());
    }

    /// The verdict policy: a doubt (an error) never passes a safe lab, and
    /// a counterexample is confirmed by a violation, not by an error.
    #[test]
    fn the_verdict_policy() {
        let t = |ok, violated, unreachable, errors| Tally {
            ok,
            violated,
            unreachable,
            errors,
        };
        assert_eq!(t(5, 0, 2, 0).exit_code(false, false).0, exit::OK);
        assert_eq!(t(5, 0, 0, 1).exit_code(false, false).0, exit::LAB_FAILED);
        assert_eq!(t(5, 1, 0, 0).exit_code(false, false).0, exit::LAB_FAILED);
        assert_eq!(t(5, 1, 0, 3).exit_code(true, false).0, exit::OK);
        assert_eq!(t(5, 0, 0, 1).exit_code(true, false).0, exit::LAB_FAILED);
        assert_eq!(t(5, 0, 0, 0).exit_code(true, false).0, exit::LAB_FAILED);
        assert_eq!(t(5, 0, 0, 0).exit_code(true, true).0, exit::OK);
        assert_eq!(t(5, 0, 0, 1).exit_code(true, true).0, exit::LAB_FAILED);
        assert_eq!(
            t(1, 2, 3, 4).summary(1.3),
            "10 points in 1.3 s: 1 hold, 2 violate a check, 3 never reach their window, 4 errors"
        );
    }

    /// Two points in one cell (a message consumed in one of two consume
    /// steps): the cell shows the one that ran, and a violation above all.
    #[test]
    fn a_shared_cell_shows_the_most_telling_verdict() {
        let p = points(&lab()).remove(0);
        let never = Verdict::Unreachable("not consumed in this step".into());
        let cell = |vs: &[Verdict]| {
            let results: Vec<_> = vs.iter().map(|v| (p.clone(), v.clone())).collect();
            matrix(&results).cells[&(p.row.clone(), p.column.clone())].clone()
        };
        assert_eq!(cell(&[Verdict::Ok, never.clone()]), "ok");
        assert_eq!(cell(&[never.clone(), Verdict::Ok]), "ok");
        assert_eq!(cell(&[never.clone(), never.clone()]), "–");
        let lost = Verdict::Violation("lost=1".into());
        assert_eq!(cell(&[Verdict::Ok, lost.clone(), never]), "lost=1");
        assert_eq!(cell(&[Verdict::Error("x".into()), Verdict::Ok]), "error");
        let doubled = Verdict::Violation("duplicatesApplied=1".into());
        assert_eq!(
            cell(&[lost.clone(), doubled, lost]),
            "lost=1 / duplicatesApplied=1"
        );
    }

    #[test]
    fn sampling_is_reproducible_and_keeps_order() {
        let all = points(&lab());
        let a: Vec<String> = sample(all.clone(), 5, 7)
            .iter()
            .map(|p| p.lab.run_name())
            .collect();
        let b: Vec<String> = sample(all.clone(), 5, 7)
            .iter()
            .map(|p| p.lab.run_name())
            .collect();
        assert_eq!(a, b);
        assert_eq!(a.len(), 5);
        let order: Vec<String> = all.iter().map(|p| p.lab.run_name()).collect();
        let positions: Vec<usize> = a
            .iter()
            .map(|n| order.iter().position(|o| o == n).unwrap())
            .collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]));
    }
}
