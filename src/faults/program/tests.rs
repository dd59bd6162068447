//! [`follow`] against a scripted program: each call it makes is a line of
//! the script's log, in order; what the proxies "see" is the script's.

use std::collections::VecDeque;

use super::*;
use crate::faults::script::block_on;
use crate::vocab::{FaultAction, Target, Then, Window};

/// A program that does what its script says: the proxies' sightings in
/// order, then (when they run out) the deadline.
#[derive(Default)]
struct Scripted {
    seen: VecDeque<Seen>,
    /// What it does on its way out, after SIGTERM.
    last: Vec<Seen>,
    log: Vec<String>,
    auto_ack: bool,
    /// Why the armed window never fired.
    missed: Option<String>,
    /// What the queue holds after the kill.
    ready: usize,
}

impl Program for Scripted {
    fn phase(&self) -> &str {
        "consume"
    }
    fn start(&mut self) -> Result<()> {
        self.log.push("start".into());
        Ok(())
    }
    fn restart(&mut self) -> Result<()> {
        self.log.push("restart".into());
        Ok(())
    }
    async fn next(&mut self, settled: usize, settle: usize) -> Result<Seen> {
        self.seen.pop_front().ok_or_else(|| {
            Failure::Deadline.error(format!("deadline: settled {settled} of {settle}"))
        })
    }
    fn observe(&mut self, seen: &Seen) {
        self.log.push(format!("observe {seen:?}"));
    }
    fn window(&self) -> (String, Option<String>) {
        ("after-commit-before-ack".into(), self.missed.clone())
    }
    fn auto_ack(&self) -> bool {
        self.auto_ack
    }
    fn kill_now(&mut self) {
        self.log.push("SIGKILL now".into());
    }
    async fn terminate(&mut self) -> Result<Vec<Seen>> {
        self.log.push("SIGTERM".into());
        Ok(std::mem::take(&mut self.last))
    }
    fn record_exit(&mut self) -> Result<()> {
        self.log.push("exit code".into());
        Ok(())
    }
    async fn await_depth(&mut self, depth: u32) -> Result<()> {
        self.log.push(format!("queue at {depth}"));
        Ok(())
    }
    async fn kill_at_window(&mut self, message: &str) -> Result<()> {
        self.log
            .push(format!("SIGKILL at the window with {message}"));
        Ok(())
    }
    async fn await_consumers_gone(&mut self) -> Result<()> {
        self.log.push("consumers gone".into());
        Ok(())
    }
    async fn queue_ready(&mut self) -> Result<usize> {
        self.log.push("queue read".into());
        Ok(self.ready)
    }
}

fn kill(message: &str, restart_drain: bool) -> Fault {
    Fault {
        target: Target::Consumer,
        node: None,
        action: FaultAction::Kill,
        window: Window::AfterCommitBeforeAck,
        commit: 1,
        message: message.into(),
        then: Then::Restart,
        kill_at_depth: None,
        restart_settle: None,
        restart_drain,
        copies: Vec::new(),
        asserts: Vec::new(),
    }
}

fn settled(m: &str) -> Seen {
    Seen::Settled { message: m.into() }
}
fn acked(m: &str) -> Seen {
    Seen::Acked { message: m.into() }
}
fn fire(m: &str) -> Seen {
    Seen::Fire { message: m.into() }
}

/// `follow` on the script; a run that ends with sightings left over
/// stopped early (a message counted twice, say), which the log alone would
/// not show.
fn follow_script(p: &mut Scripted, fault: Option<&Fault>, settle: usize) -> Result<()> {
    let r = block_on(follow(p, fault, settle));
    assert!(p.seen.is_empty(), "left unread: {:?}", p.seen);
    r
}

/// No fault: every step observed, done at the last distinct message, then
/// SIGTERM and its exit code. A message settled twice counts once.
#[test]
fn a_program_without_a_fault_is_followed_to_its_last_message() {
    let mut p = Scripted {
        seen: [
            acked("mid-1"),
            settled("mid-1"),
            settled("mid-1"),
            settled("mid-2"),
        ]
        .into(),
        ..Default::default()
    };
    follow_script(&mut p, None, 2).unwrap();
    assert_eq!(
        p.log,
        [
            "start",
            "observe Acked { message: \"mid-1\" }",
            "SIGTERM",
            "exit code"
        ]
    );
}

/// At the window: killed there, its consumer gone, started again; the new
/// process settles what is left.
#[test]
fn the_window_kills_and_restarts_it() {
    let f = kill("mid-1", false);
    let mut p = Scripted {
        seen: [fire("mid-1"), settled("mid-1"), settled("mid-2")].into(),
        ..Default::default()
    };
    follow_script(&mut p, Some(&f), 2).unwrap();
    assert_eq!(
        p.log,
        [
            "start",
            "SIGKILL at the window with mid-1",
            "consumers gone",
            "restart",
            "SIGTERM",
            "exit code"
        ]
    );
}

/// An autoAck program is killed only once the queue is empty (the broker
/// pushed it everything); what the broker sent it is gone, so what is left
/// is what the queue holds: nothing, and no new process.
#[test]
fn an_auto_ack_program_is_killed_once_the_queue_is_empty() {
    let f = kill("mid-1", false);
    let mut p = Scripted {
        seen: [settled("mid-0"), fire("mid-1")].into(),
        auto_ack: true,
        ready: 0,
        ..Default::default()
    };
    follow_script(&mut p, Some(&f), 3).unwrap();
    assert_eq!(
        p.log,
        [
            "start",
            "queue at 0",
            "SIGKILL at the window with mid-1",
            "consumers gone",
            "queue read"
        ]
    );
}

/// `restart_drain`: the new process settles what the queue holds after the
/// kill (here one message), not the step's count.
#[test]
fn restart_drain_settles_what_the_queue_holds() {
    let f = kill("mid-1", true);
    let mut p = Scripted {
        seen: [fire("mid-1"), settled("mid-2")].into(),
        ready: 1,
        ..Default::default()
    };
    follow_script(&mut p, Some(&f), 3).unwrap();
    assert_eq!(
        p.log,
        [
            "start",
            "SIGKILL at the window with mid-1",
            "consumers gone",
            "queue read",
            "restart",
            "SIGTERM",
            "exit code"
        ]
    );
}

/// Every message settled and the armed window never fired: unreachable,
/// typed, the program killed; never a pass.
#[test]
fn a_window_that_never_fires_is_unreachable() {
    let f = kill("mid-2", false);
    let mut p = Scripted {
        seen: [settled("mid-1")].into(),
        missed: Some("it acks before it commits".into()),
        ..Default::default()
    };
    let e = follow_script(&mut p, Some(&f), 1).unwrap_err();
    assert!(matches!(Failure::of(&e), Failure::Unreachable(_)), "{e}");
    assert_eq!(
        e.to_string(),
        "window `after-commit-before-ack` is unreachable for this program at mid-2: it acks before it commits"
    );
    assert_eq!(p.log, ["start", "SIGKILL now"]);
}

/// The black box says the window cannot come (its order rules it out).
#[test]
fn the_black_box_rules_the_window_out() {
    let f = kill("mid-1", false);
    let mut p = Scripted {
        seen: [Seen::Unreachable {
            message: "mid-3".into(),
            why: "no COMMIT before its ack".into(),
        }]
        .into(),
        ..Default::default()
    };
    let e = follow_script(&mut p, Some(&f), 1).unwrap_err();
    assert!(matches!(Failure::of(&e), Failure::Unreachable(_)), "{e}");
    assert_eq!(
        e.to_string(),
        "window `after-commit-before-ack` is unreachable for this program at mid-3: no COMMIT before its ack"
    );
    assert_eq!(p.log, ["start", "SIGKILL now"]);
}

/// A declared order broken, mid-run or on the way out after SIGTERM: an
/// error naming the message, never a pass, and no exit code recorded.
#[test]
fn a_broken_declared_order_fails() {
    let contra = || Seen::Contradicts {
        message: "mid-2".into(),
    };
    let mut p = Scripted {
        seen: [contra()].into(),
        ..Default::default()
    };
    let e = follow_script(&mut p, None, 1).unwrap_err();
    assert!(
        e.to_string().contains("went on with mid-2 after acking it"),
        "{e}"
    );
    assert_eq!(p.log, ["start", "SIGKILL now"]);

    let mut p = Scripted {
        seen: [settled("mid-1")].into(),
        last: vec![acked("mid-1"), contra()],
        ..Default::default()
    };
    let e = follow_script(&mut p, None, 1).unwrap_err();
    assert!(
        e.to_string().contains("went on with mid-2 after acking it"),
        "{e}"
    );
    assert_eq!(p.log, ["start", "SIGTERM"]);
}

/// The program stops short (the script runs out: the deadline): the
/// step's error, as the stage said it.
#[test]
fn a_deadline_is_the_stages_error() {
    let mut p = Scripted {
        seen: [settled("mid-1")].into(),
        ..Default::default()
    };
    let e = follow_script(&mut p, None, 2).unwrap_err();
    assert!(matches!(Failure::of(&e), Failure::Deadline), "{e}");
    assert_eq!(e.to_string(), "deadline: settled 1 of 2");
}
