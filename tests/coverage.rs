//! Every safe step is shown necessary (issue 20, item 7): for each step of
//! each safe consumer pattern, on its success path and its failure path,
//! a counterexample pattern removes, replaces or reorders exactly that step,
//! and some lab runs that counterexample as a variant with declared
//! violations (which `lab --all` confirms). A new safe step with no
//! counterexample, or a counterexample no lab runs, fails here. Pure: the
//! lab files are read, nothing is started.

use mqlab::lab::{Action, Project};
use mqlab::vocab::{Abandoned, DlqOrder, OnFailure, Pattern, PatternDef, Step, PATTERNS};

#[path = "coverage/table.rs"]
mod table;
use table::{Edit, AWAITING_A_LAB, COVERAGE, NOT_SAFETY_STEPS};

fn def(p: Pattern) -> &'static PatternDef {
    PATTERNS.iter().find(|d| d.pattern == p).unwrap()
}

/// The failure-path settings of a pattern, named, for `Edit::Failure`.
fn failure_settings(f: OnFailure) -> Vec<(&'static str, String)> {
    match f {
        OnFailure::RetryThenDlq {
            confirm,
            mandatory,
            dlq,
            attempts,
        } => vec![
            ("retry", "retry tiers".into()),
            ("attempts", format!("{attempts:?}")),
            ("dlq confirm", confirm.to_string()),
            ("dlq mandatory", mandatory.to_string()),
            (
                "dlq order",
                format!("{:?}", dlq == DlqOrder::ConfirmThenAck),
            ),
        ],
        OnFailure::RequeueForever => vec![("retry", "requeue".into())],
        OnFailure::RetryInPlace { dlq_publish } => vec![
            ("retry", "in place".into()),
            ("dlq confirm", dlq_publish.confirm.to_string()),
            ("dlq mandatory", dlq_publish.mandatory.to_string()),
        ],
        OnFailure::Classified {
            attempts,
            dlq,
            by_class,
            backoff,
            budget,
            retry_order,
            retry_publish,
            dlq_publish,
        } => vec![
            (
                "retry order",
                format!("{:?}", retry_order == DlqOrder::ConfirmThenAck),
            ),
            ("retry confirm", retry_publish.confirm.to_string()),
            ("retry mandatory", retry_publish.mandatory.to_string()),
            ("dlq confirm", dlq_publish.confirm.to_string()),
            ("dlq mandatory", dlq_publish.mandatory.to_string()),
            ("attempts", format!("{attempts:?}")),
            (
                "dlq order",
                format!("{:?}", dlq == DlqOrder::ConfirmThenAck),
            ),
            ("by class", by_class.to_string()),
            ("backoff", format!("{backoff:?}")),
            ("budget", budget.to_string()),
        ],
    }
}

/// Whether `cx` is `safe` with exactly `edit` applied.
fn applies(safe: &PatternDef, edit: &Edit, cx: &PatternDef) -> Result<(), String> {
    let same_failure = failure_settings(safe.on_failure) == failure_settings(cx.on_failure);
    let steps = |f: &dyn Fn(&[Step]) -> Vec<Step>| f(safe.steps);
    let (want, failure_ok, auto_ack) = match edit {
        Edit::Removed(s) => (
            steps(&|v| v.iter().copied().filter(|x| x != s).collect()),
            same_failure,
            *s == Step::Ack,
        ),
        Edit::Rewritten(s, path) => (path.to_vec(), same_failure && !path.contains(s), false),
        Edit::Replaced(s, by) => (
            steps(&|v| {
                v.iter()
                    .flat_map(|x| if x == s { by.to_vec() } else { vec![*x] })
                    .collect()
            }),
            same_failure,
            false,
        ),
        Edit::Swapped(a, b) => (
            steps(&|v| {
                v.iter()
                    .map(|x| match x {
                        x if x == a => *b,
                        x if x == b => *a,
                        x => *x,
                    })
                    .collect()
            }),
            same_failure,
            false,
        ),
        Edit::Failure(name) => {
            let (s, c) = (
                failure_settings(safe.on_failure),
                failure_settings(cx.on_failure),
            );
            let changed: Vec<&str> = s
                .iter()
                .filter(|(k, v)| !c.iter().any(|(ck, cv)| ck == k && cv == v))
                .map(|(k, _)| *k)
                .collect();
            // Retrying at all: a failure path of another kind.
            let other_kind =
                std::mem::discriminant(&safe.on_failure) != std::mem::discriminant(&cx.on_failure);
            // A confirm's counterexample drops its `mandatory` with it.
            let with_mandatory = name.replace("confirm", "mandatory");
            let ok = (*name == "retry" && other_kind)
                || changed.first() == Some(name)
                    && (changed.len() == 1
                        || (name.ends_with("confirm") && changed == [*name, &with_mandatory]));
            (safe.steps.to_vec(), ok, false)
        }
        Edit::KeepsAbandoned => (safe.steps.to_vec(), same_failure, false),
    };
    let kept = matches!(edit, Edit::KeepsAbandoned);
    if safe.abandoned == Abandoned::Kept {
        return Err(format!(
            "the safe {} keeps an abandoned transaction",
            safe.pattern
        ));
    }
    if (cx.abandoned == Abandoned::Kept) != kept {
        return Err(format!("abandoned transaction {:?}", cx.abandoned));
    }
    if cx.steps != want.as_slice() {
        return Err(format!("steps {:?}, not {want:?}", cx.steps));
    }
    if !failure_ok {
        return Err(format!(
            "failure path {:?} against {:?}",
            cx.on_failure, safe.on_failure
        ));
    }
    if cx.auto_ack != auto_ack {
        return Err(format!("auto_ack {}", cx.auto_ack));
    }
    Ok(())
}

/// Each counterexample pattern a lab variant with declared violations runs,
/// with the run.
fn patterns_in_labs() -> Vec<(Pattern, String)> {
    let project = Project {
        root: std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")),
    };
    let mut out = Vec::new();
    for name in project.lab_names().unwrap() {
        for run in project.runs_of(&name).unwrap().into_iter().skip(1) {
            let lab = project.load(&run).unwrap();
            assert!(!lab.violations.is_empty(), "{run} declares no violations");
            for s in &lab.steps {
                if let Action::Consume(c) = &s.action {
                    if c.command.is_none() {
                        out.push((c.pattern, run.clone()));
                    }
                }
            }
        }
    }
    out
}

#[test]
fn every_safe_step_has_a_counterexample_a_lab_runs() {
    let in_labs = patterns_in_labs();
    let mut problems = Vec::new();
    for (safe, edit, cx) in COVERAGE {
        if let Err(e) = applies(def(*safe), edit, def(*cx)) {
            problems.push(format!("{cx} is not {safe} with {edit:?}: {e}"));
        }
        if !in_labs.iter().any(|(p, _)| p == cx) {
            problems.push(format!(
                "{cx} ({safe} with {edit:?}) is run by no lab variant"
            ));
        }
    }
    for safe in PATTERNS.iter().filter(|d| d.safe) {
        for step in safe.steps {
            // A pattern with the same success path shares its step
            // counterexamples (Classified runs the Inbox path), and so does
            // one whose path differs only in steps with counterexamples of
            // their own (InboxSavepoint's insert against Inbox's).
            // A path with a downstream call added shares the counterexamples
            // of the path without it (side-effect-key is classified's path
            // with the call), except the call's own.
            // So does a path with an outbox of intents (effect-intent is
            // the inbox path with its intent row, call and mark).
            let without_call: Vec<Step> = safe
                .steps
                .iter()
                .copied()
                .filter(|s| {
                    !matches!(
                        s,
                        Step::CallDownstream
                            | Step::IntentInsert
                            | Step::CallAfterAck
                            | Step::IntentDone
                    )
                })
                .collect();
            let sibling = |other: &PatternDef| {
                other.pattern == safe.pattern
                    || other.steps.len() == without_call.len()
                        && other.steps.iter().zip(&without_call).all(|(a, b)| {
                            a == b
                            // The unguarded write where the other has the
                            // guarded one: the work itself, not a safety step.
                            || (*a == Step::Write && *b == Step::WriteOverwrite)
                            || (b != step
                                && COVERAGE.iter().any(|(p, e, _)| {
                                    *p == safe.pattern
                                        && matches!(e, Edit::Replaced(s, _) if s == b)
                                }))
                        })
            };
            let covered = COVERAGE.iter().any(|(p, e, _)| {
                sibling(def(*p))
                    && match e {
                        Edit::Removed(s) | Edit::Replaced(s, _) | Edit::Rewritten(s, _) => {
                            s == step
                        }
                        Edit::Swapped(a, b) => a == step || b == step,
                        Edit::Failure(_) | Edit::KeepsAbandoned => false,
                    }
            });
            let exempt = NOT_SAFETY_STEPS.iter().any(|(s, _)| s == step);
            if !covered && !exempt {
                problems.push(format!(
                    "{}'s step `{step}` has no counterexample that removes, replaces or reorders it",
                    safe.pattern
                ));
            }
        }
        // A failure path is shared as a whole: a pattern with the same one
        // (InboxSavepoint, Inbox's) shares its counterexamples.
        for (setting, _) in failure_settings(safe.on_failure) {
            let covered = COVERAGE.iter().any(|(p, e, _)| {
                failure_settings(def(*p).on_failure) == failure_settings(safe.on_failure)
                    && matches!(e, Edit::Failure(n) if *n == setting)
            });
            if !covered {
                problems.push(format!(
                    "{}'s failure path setting `{setting}` has no counterexample",
                    safe.pattern
                ));
            }
        }
        // The reconnect's ROLLBACK is one code path for every pattern:
        // one counterexample shows it for all.
        let rollback = COVERAGE
            .iter()
            .any(|(p, e, _)| matches!(e, Edit::KeepsAbandoned) && def(*p).safe);
        if safe.abandoned != Abandoned::RolledBack || !rollback {
            problems.push(format!(
                "{}'s ROLLBACK of an abandoned transaction has no counterexample",
                safe.pattern
            ));
        }
    }
    // Every counterexample pattern is in the table, or waits for its lab.
    for d in PATTERNS.iter().filter(|d| !d.safe) {
        let listed = COVERAGE.iter().any(|(_, _, cx)| *cx == d.pattern);
        let awaiting = AWAITING_A_LAB.iter().any(|(p, _)| *p == d.pattern);
        if !listed && !awaiting {
            problems.push(format!(
                "counterexample pattern {} edits no listed safe step",
                d.pattern
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every step of every safe pattern has a fault window (issue 20, item 7):
/// a kill right after it is a point `explore` tries, before the step that
/// shows what it did. A step inside the business transaction (the inbox
/// row, the write) shows at the `COMMIT`: a window after it and before the
/// commit. A step the broker, the database or a downstream service sees at
/// once (the delivery, the commit, a downstream call, the ack) needs one
/// after it and before the next such step. And a failure path that
/// publishes a copy, then acks the original, has a window between the two
/// for each copy it publishes (the retry republish's, the DLQ move's): that
/// part restates `PatternDef::windows_for`, so it guards that table's edits.
#[test]
fn every_safe_step_has_a_window() {
    let problems: Vec<String> = PATTERNS
        .iter()
        .filter(|d| d.safe)
        .flat_map(window_gaps)
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The check itself can fail: a step after the ack with no window of
    // its own, and a downstream call between the commit and the ack (the
    // commit's window comes before the call, the ack's after the ack).
    let after_ack = PatternDef {
        steps: &[
            Step::Receive,
            Step::Write,
            Step::Commit,
            Step::Ack,
            Step::InboxInsert,
        ],
        ..*def(Pattern::Inbox)
    };
    assert_eq!(
        window_gaps(&after_ack).len(),
        1,
        "{:?}",
        window_gaps(&after_ack)
    );
    let call_after_commit = PatternDef {
        steps: &[
            Step::Receive,
            Step::InboxInsert,
            Step::Write,
            Step::Commit,
            Step::CallDownstream,
            Step::Ack,
        ],
        ..*def(Pattern::SideEffectKey)
    };
    assert_eq!(
        window_gaps(&call_after_commit).len(),
        1,
        "{:?}",
        window_gaps(&call_after_commit)
    );
}

/// Whether the broker, the database or a downstream service sees a step
/// when it is done (else it shows with the transaction's `COMMIT`).
fn seen_at_once(s: Step) -> bool {
    matches!(
        s,
        Step::Receive
            | Step::Commit
            | Step::Ack
            | Step::InboxOwnTx
            | Step::InboxOtherConnection
            | Step::CallDownstream
            | Step::CallDownstreamUnkeyed
            | Step::CallAfterAck
            | Step::CallAfterAckUnkeyed
            | Step::IntentDone
    )
}

/// The boundaries of `d`'s path with no fault window (see
/// [`every_safe_step_has_a_window`]).
fn window_gaps(d: &PatternDef) -> Vec<String> {
    use mqlab::vocab::Window;
    let mut gaps = Vec::new();
    let steps = d.steps;
    for (i, step) in steps.iter().enumerate() {
        // The step that shows this one's effect, or the next effect after it.
        let shown_by = |s: &Step| match seen_at_once(*step) {
            true => seen_at_once(*s),
            false => *s == Step::Commit,
        };
        let until = (i + 1..steps.len())
            .find(|j| shown_by(&steps[*j]))
            .unwrap_or(steps.len());
        if (i..until).all(|j| d.window_after(j).is_none()) {
            gaps.push(format!(
                "{}'s step `{step}` has no window before the step that shows it",
                d.pattern
            ));
        }
    }
    // Each copy the failure path publishes before it acks the original.
    let dlq_moves = !d.auto_ack && !d.inbox_commits_alone();
    let owed: &[&[Window]] = match d.on_failure {
        OnFailure::Classified { .. } => &[
            &[
                Window::AfterRetryPublishBeforeAck,
                Window::AfterAckBeforeRetryPublish,
            ],
            &[
                Window::AfterDlqConfirmBeforeAck,
                Window::AfterAckBeforeDlqPublish,
            ],
        ],
        OnFailure::RetryInPlace { .. } => &[&[Window::AfterDlqConfirmBeforeAck]],
        OnFailure::RetryThenDlq { confirm: true, .. } if dlq_moves => &[&[
            Window::AfterDlqConfirmBeforeAck,
            Window::AfterAckBeforeDlqPublish,
        ]],
        OnFailure::RetryThenDlq { .. } | OnFailure::RequeueForever => &[],
    };
    let windows = d.windows_for(true);
    for one_of in owed {
        if !windows.iter().any(|w| one_of.contains(w)) {
            gaps.push(format!(
                "{}'s failure path publishes a copy and acks the original with no window between ({one_of:?})",
                d.pattern
            ));
        }
    }
    gaps
}

/// Claim-bearing assertions no variant falsifies yet: each a gap to close
/// with a variant (issue 20 item 8), listed so that no new one appears.
/// None today: the last one, quorum-partition's `confirmed` (on 3.10.8 the
/// classic queue's publish is confirmed too, and dropped), is falsified by
/// `@classic-queue` on RabbitMQ 4.0, which nacks it (declared in the lab file).
const UNFALSIFIED: &[(&str, &str)] = &[];

/// Every assertion of a lab is falsified by one of its variants (its
/// declared violations, which `lab --all` confirms), or is a harness fact
/// of the lab file (`facts`, shown apart in the evidence; the loader
/// refuses a fact some variant falsifies), or is a listed gap. Every
/// project: the labs, the Python examples and the Node.js ones.
#[test]
fn every_assertion_is_falsified_by_a_variant_or_is_a_harness_fact() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut problems = Vec::new();
    let mut gaps_seen = Vec::new();
    for dir in [
        root.clone(),
        root.join("examples/python"),
        root.join("examples/node"),
    ] {
        let project = Project { root: dir };
        for name in project.lab_names().unwrap() {
            let lab = project.load(&name).unwrap();
            let mut falsified: Vec<String> = Vec::new();
            for run in project.runs_of(&name).unwrap().into_iter().skip(1) {
                let variant = project.load(&run).unwrap();
                // A generation's declared violations count: that run is
                // confirmed on that generation (tests/generations).
                for diff in variant.generations.values() {
                    falsified.extend(diff.violations.keys().cloned());
                }
                falsified.extend(variant.violations.into_keys());
            }
            for s in &lab.steps {
                for a in s.fault.iter().flat_map(|f| &f.asserts).chain(&s.asserts) {
                    let fact = lab.facts.contains(&a.name) || lab.broker_facts.contains(&a.name);
                    let gap = UNFALSIFIED.contains(&(name.as_str(), a.name.as_str()));
                    if gap {
                        gaps_seen.push((name.clone(), a.name.clone()));
                    }
                    if !falsified.contains(&a.name) && !fact && !gap {
                        problems.push(format!(
                            "{name}: `{}` is falsified by no variant and is no harness or broker fact",
                            a.name
                        ));
                    }
                    if falsified.contains(&a.name) && gap {
                        problems.push(format!(
                            "{name}: `{}` is falsified now: take it off UNFALSIFIED",
                            a.name
                        ));
                    }
                }
            }
        }
    }
    for (lab, a) in UNFALSIFIED {
        if !gaps_seen.iter().any(|(l, n)| l == lab && n == a) {
            problems.push(format!(
                "UNFALSIFIED names {lab}'s `{a}`, which it does not assert"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A difference a lab file declares for another generation has its own
/// stored transcript, and every such transcript belongs to a declared
/// difference: none is left behind when a declaration goes.
#[test]
fn every_generation_snapshot_belongs_to_a_declared_difference() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let project = Project { root: root.clone() };
    let mut declared = Vec::new();
    for name in project.lab_names().unwrap() {
        for run in project.runs_of(&name).unwrap() {
            for g in project.load(&run).unwrap().generations.keys() {
                declared.push(format!("{run}.rabbitmq-{g}"));
            }
        }
    }
    let mut stored: Vec<String> = std::fs::read_dir(root.join("snapshots"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".snap")
                .filter(|s| s.contains(".rabbitmq-"))
                .map(str::to_string)
        })
        .collect();
    declared.sort();
    stored.sort();
    assert_eq!(
        stored, declared,
        "stored per-generation snapshots vs declared differences"
    );
    assert!(
        !declared.is_empty(),
        "the cluster labs declare their 4.0 differences"
    );
}

/// A declared generation difference is what its stored transcript shows:
/// the `FAIL` lines of `snapshots/<run>.rabbitmq-<g>.snap` are exactly the
/// declared violations, with their values (the cluster runs that show it
/// live need root and the 4.0 root: tests/generations).
#[test]
fn every_declared_generation_difference_is_its_snapshots_failures() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let project = Project { root: root.clone() };
    for name in project.lab_names().unwrap() {
        for run in project.runs_of(&name).unwrap() {
            for (g, diff) in &project.load(&run).unwrap().generations {
                let path = root.join(format!("snapshots/{run}.rabbitmq-{g}.snap"));
                let text = std::fs::read_to_string(&path).unwrap();
                let mut failed: std::collections::BTreeMap<&str, std::collections::BTreeSet<&str>> =
                    Default::default();
                for (n, v) in text
                    .lines()
                    .filter(|l| l.starts_with("[assert] ") || l.starts_with("[check] "))
                    .filter_map(|l| l.split_once(' ')?.1.split_once(" FAIL"))
                    .filter_map(|(nv, _)| nv.split_once('='))
                {
                    failed.entry(n).or_default().insert(v);
                }
                // Judged as the lab verdict judges a counterexample.
                let met = mqlab::checker::violations_met(&failed, &diff.violations);
                assert!(
                    met,
                    "{}: failed {failed:?}, declared {:?}",
                    path.display(),
                    diff.violations
                );
            }
        }
    }
}
