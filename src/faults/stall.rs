//! The stall (article 002: the order messages are taken in is not the
//! order concurrent workers complete them in): two competing instances of
//! one service, prefetch 1. The one that takes the lab's message is held at
//! the window (a slow worker: a call that hangs, a long GC) while the other
//! settles every other message of the step; then it is released and
//! completes last what was delivered first.
//!
//! Held at a window before the first database statement, the slow instance
//! holds no lock; held later, it may hold a row the other one needs: that
//! is reported as soon as the other waits on it, never waited out.
//!
//! It runs on the rendezvous's [`Crowd`] (the runner's instances).

use std::collections::BTreeSet;

use anyhow::{bail, Result};

use super::rendezvous::{Crowd, Seen};
use crate::lab::Fault;
use crate::transcript::{CrowdNote, FaultEvent};
use crate::vocab::{FaultAction, Target};

/// Runs the consume step: `settle` distinct messages settled in all.
/// Long because it is the stall's three phases in order (consumer-1 held
/// with the message, the other instance settles the rest, the release),
/// kept together so the order shows.
pub async fn run<C: Crowd>(c: &mut C, f: &Fault, settle: usize) -> Result<()> {
    let mut settled: BTreeSet<String> = BTreeSet::new();
    c.start().await?;
    // consumer-1 takes the lab's message (what is before it, it settles).
    loop {
        match c.watch(0, None).await? {
            Seen::AtWindow(m) if m == f.message => {
                c.stopped(0).await?;
                break;
            }
            Seen::Settled(m) => {
                settled.insert(m);
                if settled.contains(&f.message) {
                    return Err(crate::failure::Failure::unreachable(format!(
                        "window `{}` is unreachable at {}: consumer-1 settled it without passing the window",
                        f.window, f.message
                    )));
                }
                // Every message settled and the lab's never seen: not an
                // unreached window but a message gone, which is no verdict.
                if settled.len() >= settle {
                    bail!(
                        "consumer-1 settled {} messages without receiving {}: the stall never began",
                        settled.len(),
                        f.message
                    );
                }
            }
            Seen::Exited(code) => {
                return Err(crate::failure::Failure::RoleExited.error(format!(
                    "consumer-1 exited ({code}) before it reached the stall at {}",
                    f.message
                )))
            }
            Seen::AtWindow(_) | Seen::Received(_) | Seen::Other | Seen::LockWait => {}
        }
    }
    let fault = FaultEvent::injected(Target::Consumer, FaultAction::Stall)
        .at(f.window, &f.message)
        .with_crowd(CrowdNote::Held("consumer-1".into()));
    c.say(&fault);
    // consumer-2 settles everything else; a lock wait means consumer-1
    // holds a row it needs: an error now, not a deadline later.
    c.start().await?;
    let mut overtaken = 0;
    while settled.len() + 1 < settle {
        match c.watch(1, Some(0)).await? {
            Seen::Received(m) | Seen::AtWindow(m) | Seen::Settled(m) if m == f.message => bail!(
                "consumer-2 took {} while consumer-1 held it: the stall proves nothing",
                f.message
            ),
            Seen::Settled(m) => {
                settled.insert(m);
                overtaken += 1;
            }
            Seen::LockWait => bail!(
                "consumer-2 waits on a lock consumer-1 holds at `{}` of {}: hold it at a window before its first statement",
                f.window,
                f.message
            ),
            Seen::Exited(code) => return Err(crate::failure::Failure::RoleExited.error(format!(
                "consumer-2 exited ({code}) during the stall at {}, with {} of {settle} messages settled",
                f.message,
                settled.len()
            ))),
            Seen::AtWindow(_) | Seen::Received(_) | Seen::Other => {}
        }
    }
    if overtaken == 0 {
        bail!(
            "consumer-2 had nothing to settle while consumer-1 held {}: nothing completed before it, so the stall proves nothing",
            f.message
        );
    }
    c.say(&fault.healed());
    c.resume(0)?;
    while !settled.contains(&f.message) {
        match c.watch(0, None).await? {
            Seen::Settled(m) => {
                settled.insert(m);
            }
            Seen::Exited(code) => return Err(crate::failure::Failure::RoleExited.error(format!(
                "consumer-1 exited ({code}) after the stall at {} before it settled it",
                f.message
            ))),
            Seen::AtWindow(m) => bail!(
                "consumer-1 came to the window with {m} again after the stall: it was delivered again"
            ),
            Seen::Received(_) | Seen::Other | Seen::LockWait => {}
        }
    }
    c.finish().await
}

#[cfg(test)]
mod tests {
    use super::super::rendezvous::script::{block_on, Script};
    use super::*;

    fn m(s: &str) -> String {
        s.to_string()
    }

    fn run_script(steps: Vec<Vec<Seen>>) -> (Result<()>, Script) {
        let f = Fault {
            target: Target::Consumer,
            node: None,
            action: FaultAction::Stall,
            window: crate::vocab::Window::AfterReceive,
            commit: 1,
            message: "mid-1".into(),
            then: crate::vocab::Then::None,
            kill_at_depth: None,
            restart_settle: None,
            restart_drain: false,
            copies: vec!["mid-1".into()],
            asserts: Vec::new(),
        };
        let mut c = Script::new(steps);
        let r = block_on(run(&mut c, &f, 3));
        (r, c)
    }

    /// consumer-1 held with mid-1 while consumer-2 settles mid-2 and
    /// mid-3; then released, it settles mid-1.
    #[test]
    fn the_held_instance_completes_last() {
        let (r, c) = run_script(vec![
            vec![
                Seen::Received(m("mid-1")),
                Seen::AtWindow(m("mid-1")),
                Seen::Settled(m("mid-1")),
            ],
            vec![
                Seen::Received(m("mid-2")),
                Seen::Settled(m("mid-2")),
                Seen::Received(m("mid-3")),
                Seen::Settled(m("mid-3")),
            ],
        ]);
        r.unwrap();
        assert_eq!((c.started, c.resumed.as_slice()), (2, [0].as_slice()));
        assert!(
            c.said[0].contains("held=consumer-1 status=injected"),
            "{:?}",
            c.said
        );
        assert!(c.said[1].ends_with("status=healed"), "{:?}", c.said);
    }

    /// consumer-2 waits on a row consumer-1 holds: an error at once.
    #[test]
    fn a_lock_the_held_instance_holds_is_an_error() {
        let (r, _) = run_script(vec![
            vec![Seen::AtWindow(m("mid-1"))],
            vec![Seen::Received(m("mid-2")), Seen::LockWait],
        ]);
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains("consumer-2 waits on a lock consumer-1 holds"),
            "{e}"
        );
    }

    /// consumer-2 settles nothing while consumer-1 is held (the held
    /// message was the last): no overtaking, an error.
    #[test]
    fn nothing_overtaken_is_no_stall() {
        let steps = vec![
            vec![
                Seen::Settled(m("mid-2")),
                Seen::Settled(m("mid-3")),
                Seen::AtWindow(m("mid-1")),
            ],
            vec![],
        ];
        let (r, _) = run_script(steps);
        let e = r.unwrap_err().to_string();
        assert!(e.contains("consumer-2 had nothing to settle"), "{e}");
    }

    /// consumer-2 gets the held message (it was delivered again): an error.
    #[test]
    fn the_held_message_at_the_other_instance_is_an_error() {
        let (r, _) = run_script(vec![
            vec![Seen::AtWindow(m("mid-1"))],
            vec![Seen::Received(m("mid-1"))],
        ]);
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains("consumer-2 took mid-1 while consumer-1 held it"),
            "{e}"
        );
    }

    /// consumer-1 settles the message without passing the window.
    #[test]
    fn the_window_must_be_reached() {
        let (r, c) = run_script(vec![vec![
            Seen::Received(m("mid-1")),
            Seen::Settled(m("mid-1")),
        ]]);
        crate::faults::script::assert_unreachable(&r.unwrap_err(), "mid-1");
        assert!(c.said.is_empty());
    }
}
