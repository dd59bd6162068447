//! What the built-in consumer really does, as explore's clean run shows
//! it: every window it passed, message by message (its `window_passed`
//! lines). explore tries those windows, not the ones the pattern table
//! says, and a difference between the two is a failure: a window the code
//! passes that its pattern does not declare (the code reordered, the table
//! not), a window passed on the other side of the delivery's ack than its
//! name says (the code reordered under an unchanged name: each line says
//! whether the delivery was acked), a consumer that received messages and
//! passed no window at all, a window of the pattern's success path no
//! message passed while
//! one message at least was applied (committed), or a
//! message the consumer says it copied to a retry tier or the DLQ that
//! passed none of the windows its pattern declares for that copy (a window
//! call gone from the code). A failure path's window no message passed is
//! no failure by itself: whether a message fails is the lab's data.

use std::collections::BTreeMap;

use crate::lab::{Action, Consume, Lab};
use crate::transcript::Transcript;
use crate::vocab::{Role, Status, Window};

/// The windows passed in the clean run, per queue: (window, message), in
/// the order passed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Passed {
    by_queue: BTreeMap<String, Vec<(Window, String)>>,
    /// What the consumer said of each message: the copies it made
    /// (`retry_scheduled`, `moved_to_dlq`, `poison_to_dlq`), that it applied
    /// it (`business_committed`), that it received it; per queue:
    /// (message, status).
    said: BTreeMap<String, Vec<(String, Status)>>,
    /// Windows passed on the other side of the delivery's ack than their
    /// name says, per queue: (window, message, acked).
    wrong_side: BTreeMap<String, Vec<(Window, String, bool)>>,
}

impl Passed {
    /// Read from the clean run's transcript.
    pub fn of(t: &Transcript) -> Passed {
        let mut by_queue: BTreeMap<String, Vec<(Window, String)>> = BTreeMap::new();
        let mut said: BTreeMap<String, Vec<(String, Status)>> = BTreeMap::new();
        let mut wrong_side: BTreeMap<String, Vec<(Window, String, bool)>> = BTreeMap::new();
        for e in t.entries() {
            let told = [
                Status::RetryScheduled,
                Status::MovedToDlq,
                Status::PoisonToDlq,
                Status::BusinessCommitted,
                Status::Received,
            ]
            .into_iter()
            .find(|s| e.is(Role::Consumer, *s));
            if let (Some(s), Some(queue), Some(mid)) =
                (told, e.get("destination"), e.get("messageId"))
            {
                said.entry(queue.to_string())
                    .or_default()
                    .push((mid.to_string(), s));
            }
            if !e.is(Role::Consumer, Status::WindowPassed) {
                continue;
            }
            let (Some(queue), Some(mid), Some(w)) = (
                e.get("destination"),
                e.get("messageId"),
                e.get("window").and_then(|w| w.parse::<Window>().ok()),
            ) else {
                continue;
            };
            let acked = e.get("acked").map(|a| a == "true");
            if let Some(acked) = acked.filter(|a| w.says_acked().is_some_and(|s| s != *a)) {
                let at = (w, mid.to_string(), acked);
                wrong_side.entry(queue.to_string()).or_default().push(at);
            }
            let seen = by_queue.entry(queue.to_string()).or_default();
            if !seen.iter().any(|(sw, sm)| *sw == w && sm == mid) {
                seen.push((w, mid.to_string()));
            }
        }
        Passed {
            by_queue,
            said,
            wrong_side,
        }
    }

    /// Whether the consumer of `queue` passed `w` with message `mid`.
    pub fn passed(&self, queue: &str, w: Window, mid: &str) -> bool {
        self.on(queue).iter().any(|(pw, pm)| *pw == w && pm == mid)
    }

    fn on(&self, queue: &str) -> &[(Window, String)] {
        self.by_queue.get(queue).map_or(&[], Vec::as_slice)
    }

    /// What the consumer of `c`'s queue passed that its pattern does not
    /// declare: (window, message), in the order passed.
    pub fn undeclared(&self, c: &Consume) -> Vec<(Window, String)> {
        let declared = c.pattern.def().windows_for(c.retry.is_some());
        self.on(&c.queue)
            .iter()
            .filter(|(w, _)| !declared.contains(w))
            .cloned()
            .collect()
    }
}

/// Where the built-in consumers' code and their patterns part, one line
/// each as (window, message or `-`, why): a window passed and not
/// declared; a success-path window declared and passed by no message of a
/// queue whose consumer applied one at least (a lab whose messages all
/// fail applies none); a copy with no window around it.
pub fn mismatches(lab: &Lab, passed: &Passed) -> Vec<(Window, String, String)> {
    let mut out = Vec::new();
    let mut queues: Vec<&str> = Vec::new();
    for s in &lab.steps {
        let Action::Consume(c) = &s.action else {
            continue;
        };
        if c.command.is_some() || queues.contains(&c.queue.as_str()) {
            continue;
        }
        queues.push(&c.queue);
        let pattern = c.pattern;
        for (w, mid, acked) in passed.wrong_side.get(&c.queue).into_iter().flatten() {
            let state = if *acked { "acked" } else { "not acked" };
            let why = format!("the consumer passed `{w}` with {mid} {state}, which the window's name contradicts: the code's order and the pattern's differ");
            out.push((*w, mid.clone(), why));
        }
        for (w, mid) in passed.undeclared(c) {
            let why = format!("the consumer passed `{w}`, which its pattern `{pattern}` does not declare: the code and the pattern table differ");
            out.push((w, mid, why));
        }
        let said = passed.said.get(&c.queue).map_or(&[][..], Vec::as_slice);
        let applied = said.iter().any(|(_, s)| *s == Status::BusinessCommitted);
        let received = said.iter().any(|(_, s)| *s == Status::Received);
        if received && passed.on(&c.queue).is_empty() {
            let why = "the consumer received messages and passed no window at all in the clean run: explore has nothing of its own path to try".to_string();
            out.push((Window::AfterReceive, "-".into(), why));
        }
        let def = pattern.def();
        for w in (0..def.steps.len()).filter_map(|i| def.window_after(i)) {
            if applied && !passed.on(&c.queue).iter().any(|(pw, _)| *pw == w) {
                let why = format!("pattern `{pattern}` declares `{w}` on its success path, and no message passed it in the clean run: the code never reaches it");
                out.push((w, "-".into(), why));
            }
        }
        out.extend(copies_unwindowed(c, passed));
    }
    out
}

/// Each copy the consumer of `c` said it made whose message passed none
/// of the windows its pattern declares around that copy.
fn copies_unwindowed(c: &Consume, passed: &Passed) -> Vec<(Window, String, String)> {
    let declared = c.pattern.def().windows_for(c.retry.is_some());
    let around = |s: Status| -> Vec<Window> {
        let of_copy: &[Window] = match s {
            Status::RetryScheduled => &[
                Window::AfterRetryPublishBeforeAck,
                Window::AfterAckBeforeRetryPublish,
            ],
            _ => &[
                Window::AfterDlqConfirmBeforeAck,
                Window::AfterAckBeforeDlqPublish,
            ],
        };
        of_copy
            .iter()
            .copied()
            .filter(|w| declared.contains(w))
            .collect()
    };
    let mut out = Vec::new();
    let said = passed.said.get(&c.queue).into_iter().flatten();
    let made = |s: &Status| !matches!(s, Status::BusinessCommitted | Status::Received);
    for (mid, s) in said.filter(|(_, s)| made(s)) {
        let owed = around(*s);
        let Some(w) = owed.first() else {
            continue;
        };
        if !owed.iter().any(|w| passed.passed(&c.queue, *w, mid)) {
            let why = format!("the consumer says {mid} is {s}, and it passed no window its pattern `{}` declares around that copy (`{w}`): the code never reaches it", c.pattern);
            out.push((*w, mid.clone(), why));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript(lines: &[&str]) -> Transcript {
        let mut t = Transcript::default();
        for l in lines {
            t.push(Role::Consumer, l);
        }
        t
    }

    fn line(mid: &str, w: &str) -> String {
        format!("timestamp=t level=INFO service=s product=rabbitmq lab=l messageId={mid} destination=q window={w} status=window_passed")
    }

    /// Each (window, message) once, in the order passed; other lines and
    /// other statuses are not windows.
    #[test]
    fn windows_are_read_from_the_clean_run() {
        let lines = [
            line("mid-1", "after-receive"),
            line("mid-1", "after-receive"),
            "timestamp=t level=INFO messageId=mid-1 destination=q status=received".to_string(),
            line("mid-1", "before-commit"),
            line("mid-2", "no-such-window"),
        ];
        let t = transcript(&lines.iter().map(String::as_str).collect::<Vec<_>>());
        let p = Passed::of(&t);
        assert_eq!(
            p.on("q"),
            &[
                (Window::AfterReceive, "mid-1".to_string()),
                (Window::BeforeCommit, "mid-1".to_string())
            ]
        );
        assert!(p.passed("q", Window::BeforeCommit, "mid-1"));
        assert!(!p.passed("q", Window::BeforeCommit, "mid-2"));
        assert!(!p.passed("other", Window::AfterReceive, "mid-1"));
    }

    fn lab(name: &str) -> Lab {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        crate::lab::Project { root }.load(name).unwrap()
    }

    /// A clean run of dlq-move-window's consumer (pattern `inbox`, a DLQ):
    /// its (message, window) lines, and its (message, status) lines.
    fn clean(windows: &[(&str, &str)], statuses: &[(&str, &str)]) -> Passed {
        let mut t = Transcript::default();
        for (mid, w) in windows {
            t.push(Role::Consumer, &format!("lab=l messageId={mid} destination=orders.dm.work window={w} status=window_passed"));
        }
        for (mid, s) in statuses {
            t.push(
                Role::Consumer,
                &format!("lab=l messageId={mid} destination=orders.dm.work status={s}"),
            );
        }
        Passed::of(&t)
    }

    const SUCCESS: [&str; 4] = [
        "after-receive",
        "before-commit",
        "after-commit-before-ack",
        "after-ack",
    ];

    /// The code as its pattern declares it: no mismatch. Each way the code
    /// can part from it is one: a window not declared, a success-path
    /// window no message passed, a copy with no window around it.
    #[test]
    fn the_code_and_its_pattern_part_in_three_ways() {
        let l = lab("dlq-move-window");
        let queue = match &l.steps[1].action {
            Action::Consume(c) => c.queue.clone(),
            _ => panic!("step 1 consumes"),
        };
        assert_eq!(queue, "orders.dm.work");
        let mut good: Vec<(&str, &str)> = SUCCESS.iter().map(|w| ("mid-2", *w)).collect();
        good.push(("mid-1", "after-receive"));
        good.push(("mid-1", "after-dlq-confirm-before-ack"));
        let moved = [("mid-1", "poison_to_dlq"), ("mid-2", "business_committed")];
        assert_eq!(mismatches(&l, &clean(&good, &moved)), vec![]);

        let mut reordered = good.clone();
        reordered.retain(|(_, w)| *w != "after-dlq-confirm-before-ack");
        reordered.push(("mid-1", "after-ack-before-dlq-publish"));
        let m = mismatches(&l, &clean(&reordered, &moved));
        let windows: Vec<Window> = m.iter().map(|(w, _, _)| *w).collect();
        // The ack moved before the copy, the window's name kept: the line
        // says the delivery was acked where the name says it is not.
        let mut t = Transcript::default();
        for (mid, w) in &good {
            let acked = *w == "after-ack";
            t.push(Role::Consumer, &format!("lab=l messageId={mid} destination=orders.dm.work window={w} acked={acked} status=window_passed"));
        }
        let mut same_name = Passed::of(&t);
        assert_eq!(
            mismatches(&l, &same_name),
            vec![],
            "the right side of the ack"
        );
        t.push(Role::Consumer, "lab=l messageId=mid-1 destination=orders.dm.work window=after-dlq-confirm-before-ack acked=true status=window_passed");
        same_name = Passed::of(&t);
        let m2 = mismatches(&l, &same_name);
        assert_eq!(m2.len(), 1, "{m2:?}");
        assert_eq!(
            (m2[0].0, m2[0].1.as_str()),
            (Window::AfterDlqConfirmBeforeAck, "mid-1")
        );
        assert_eq!(
            windows,
            [
                Window::AfterAckBeforeDlqPublish,
                Window::AfterDlqConfirmBeforeAck
            ],
            "{m:?}"
        );

        let mut no_ack_window = good.clone();
        no_ack_window.retain(|(_, w)| *w != "after-ack");
        let m = mismatches(&l, &clean(&no_ack_window, &moved));
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!((m[0].0, m[0].1.as_str()), (Window::AfterAck, "-"));
        // No message applied (every one failed): the success path is not owed.
        let poison_only = [
            ("mid-1", "after-receive"),
            ("mid-1", "after-dlq-confirm-before-ack"),
        ];
        assert_eq!(mismatches(&l, &clean(&poison_only, &moved[..1])), vec![]);
    }
}
