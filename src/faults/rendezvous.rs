//! The rendezvous (article 002's check-then-insert race, made deterministic):
//! competing instances of one service each take a copy of one event, and
//! each is held where the lab's window is (its transaction open, nothing
//! committed) or, if the database makes it wait for another instance's row
//! lock first, stopped there. Once every instance is in, they are released
//! one at a time, each running until it has nothing left to do, so that the
//! transcript has one order. Both transactions were open at once: a check
//! that reads "absent" in each lets both apply the event; a unique key makes
//! the second wait and then skip it.
//!
//! The built-in consumer's side is [`super::point::reach`] with `hold`: a
//! marker, then SIGSTOP of itself. A program's is the black box armed for
//! a rendezvous: its `COMMIT` held by the PostgreSQL proxy, the connection
//! paused ([`super::blackbox::BlackBox::arm_rendezvous`]). The runner
//! implements [`Crowd`] for each.

use std::collections::BTreeSet;

use anyhow::{bail, Result};

use crate::lab::Fault;
use crate::transcript::{CrowdNote, FaultEvent};
use crate::vocab::{FaultAction, Target};

/// What the rendezvous asks of a consume step with several instances.
#[allow(async_fn_in_trait)] // used generically, never as `dyn`
pub trait Crowd {
    /// A fault injected or healed: its `[fault]` line in the transcript.
    fn say(&mut self, fault: &FaultEvent);
    /// Starts the next instance (`consumer-<n>`), holding at the fault's
    /// window for each copy.
    async fn start(&mut self) -> Result<()>;
    /// Instance i's next step (written to the transcript first), or its
    /// exit; with `locks: Some(k)`, also that more than k sessions of the
    /// lab's database wait on a lock (k: the instances already parked on
    /// one). A released instance is watched with `None`: until the held
    /// COMMIT it waited for lands, a parked one still waits.
    async fn watch(&mut self, i: usize, locks: Option<usize>) -> Result<Seen>;
    /// Waits until instance i, which reached its window, is held there.
    async fn stopped(&mut self, i: usize) -> Result<()>;
    /// Holds instance i where it is (waiting on a lock); then what it did
    /// before it was held (each in the transcript first).
    async fn stop(&mut self, i: usize) -> Result<Vec<Seen>>;
    /// Lets instance i go on.
    fn resume(&mut self, i: usize) -> Result<()>;
    /// Ends every instance with SIGTERM, in order, each followed to its exit.
    async fn finish(&mut self) -> Result<()>;
}

/// What [`Crowd::watch`] saw.
#[derive(Debug)]
pub enum Seen {
    /// A delivery of this message.
    Received(String),
    /// At the window with this copy.
    AtWindow(String),
    /// Done with this message (committed, skipped, rejected, moved...).
    Settled(String),
    /// Any other step.
    Other,
    LockWait,
    Exited(i32),
}

/// Where an instance is when the rendezvous is complete.
#[derive(Clone, Debug, PartialEq)]
enum Arrival {
    /// At the window, with this copy (stopped itself).
    Window(String),
    /// Waiting for a held instance's row lock, with this copy (stopped).
    Lock(String),
    /// Settled its copy without waiting for anyone, and what else it could.
    Idle,
}

impl Arrival {
    fn holds(&self) -> bool {
        !matches!(self, Arrival::Idle)
    }
}

/// Runs the consume step: `settle` distinct messages settled in all.
/// Long because it is the rendezvous's three phases in order (gather,
/// release one by one, finish), kept together so the order shows.
pub async fn run<C: Crowd>(c: &mut C, f: &Fault, settle: usize) -> Result<()> {
    let mut settled: BTreeSet<String> = BTreeSet::new();
    let mut arrivals: Vec<Arrival> = Vec::new();
    for i in 0..f.copies.len() {
        c.start().await?;
        let held = arrivals.iter().filter(|a| a.holds()).count();
        let mut current = None;
        // The copy of the event this instance took: without one, the
        // instances never overlapped on the event, and nothing was tried.
        let mut took: Option<String> = None;
        let parked = arrivals
            .iter()
            .filter(|a| matches!(a, Arrival::Lock(_)))
            .count();
        let arrival = loop {
            match c.watch(i, Some(parked)).await? {
                Seen::AtWindow(m) => {
                    c.stopped(i).await?;
                    break Arrival::Window(m);
                }
                Seen::Received(m) => {
                    if took.is_none() && f.copies.contains(&m) {
                        took = Some(m.clone());
                    }
                    current = Some(m);
                }
                Seen::Settled(m) => {
                    settled.insert(m);
                    if settled.len() + held >= settle {
                        break Arrival::Idle;
                    }
                }
                Seen::Other => {}
                Seen::LockWait if i > 0 => {
                    // Its delivery may still be on its way to the transcript.
                    for seen in c.stop(i).await? {
                        if let Seen::Received(m) = seen {
                            if took.is_none() && f.copies.contains(&m) {
                                took = Some(m.clone());
                            }
                            current = Some(m);
                        }
                    }
                    let Some(copy) = current.clone() else {
                        bail!(
                            "consumer-{} waits on a lock before it received a copy of {}'s event",
                            i + 1,
                            f.message
                        );
                    };
                    break Arrival::Lock(copy);
                }
                Seen::LockWait => bail!(
                    "consumer-1 waits on a lock before the rendezvous at {}: nothing else should hold one",
                    f.message
                ),
                Seen::Exited(code) => return Err(crate::failure::Failure::RoleExited.error(format!(
                    "consumer-{} exited ({code}) before the rendezvous at {}",
                    i + 1,
                    f.message
                ))),
            }
        };
        if i == 0 && !matches!(arrival, Arrival::Window(_)) {
            return Err(crate::failure::Failure::unreachable(format!(
                "window `{}` is unreachable at {}: consumer-1 settled it without passing the window",
                f.window, f.message
            )));
        }
        // Held with a copy of the event, or done with one while the others
        // were held: anything else is no rendezvous, and says so.
        let with = match &arrival {
            Arrival::Window(m) | Arrival::Lock(m) => Some(m.clone()),
            Arrival::Idle => took.clone(),
        };
        match with {
            Some(m) if f.copies.contains(&m) => {}
            _ => bail!(
                "consumer-{} took no copy of {}'s event ({}) before the others were released: the instances never overlapped on it, so the rendezvous proves nothing",
                i + 1,
                f.message,
                f.copies.join(", ")
            ),
        }
        arrivals.push(arrival);
    }
    let names = |pick: fn(&Arrival) -> bool| {
        let v: Vec<String> = arrivals
            .iter()
            .enumerate()
            .filter(|(_, a)| pick(a))
            .map(|(i, _)| format!("consumer-{}", i + 1))
            .collect();
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(",")
        }
    };
    let fault = FaultEvent::injected(Target::Consumer, FaultAction::Rendezvous)
        .at(f.window, &f.message)
        .with_crowd(CrowdNote::Arrivals {
            at_window: names(|a| matches!(a, Arrival::Window(_))),
            on_lock: names(|a| matches!(a, Arrival::Lock(_))),
        });
    c.say(&fault);
    for i in 0..arrivals.len() {
        let copy = match &arrivals[i] {
            Arrival::Window(m) | Arrival::Lock(m) => m.clone(),
            Arrival::Idle => continue,
        };
        c.resume(i)?;
        let later = arrivals[i + 1..].iter().filter(|a| a.holds()).count();
        while !(settled.contains(&copy) && settled.len() + later >= settle) {
            match c.watch(i, None).await? {
                Seen::Settled(m) => {
                    settled.insert(m);
                }
                // Parked on a lock, then released, it may come to its
                // window after all: it goes on.
                Seen::AtWindow(_) => {
                    c.stopped(i).await?;
                    c.resume(i)?;
                }
                Seen::Received(_) | Seen::Other | Seen::LockWait => {}
                Seen::Exited(code) => return Err(crate::failure::Failure::RoleExited.error(format!(
                    "consumer-{} exited ({code}) after the rendezvous at {}, with {} of {settle} messages settled",
                    i + 1,
                    f.message,
                    settled.len()
                ))),
            }
        }
    }
    c.say(&fault.healed());
    c.finish().await
}

/// Scripted instances for the unit tests of the families that run on a
/// [`Crowd`] (this one, [`super::stall`]).
#[cfg(test)]
pub(super) mod script {
    use super::*;
    use std::collections::VecDeque;

    /// Instances that do what their script says, in order.
    pub struct Script {
        steps: Vec<VecDeque<Seen>>,
        pub started: usize,
        pub said: Vec<String>,
        pub resumed: Vec<usize>,
    }

    impl Script {
        pub fn new(steps: Vec<Vec<Seen>>) -> Script {
            Script {
                steps: steps.into_iter().map(VecDeque::from).collect(),
                started: 0,
                said: Vec::new(),
                resumed: Vec::new(),
            }
        }
    }

    /// A family's run on a runtime of its own (the doubles' one).
    pub use crate::faults::script::block_on;

    impl Crowd for Script {
        fn say(&mut self, fault: &FaultEvent) {
            self.said
                .push(fault.line(crate::vocab::Broker::default(), "t"));
        }
        async fn start(&mut self) -> Result<()> {
            self.started += 1;
            Ok(())
        }
        async fn watch(&mut self, i: usize, _locks: Option<usize>) -> Result<Seen> {
            Ok(self.steps[i].pop_front().unwrap_or(Seen::Exited(0)))
        }
        async fn stopped(&mut self, _i: usize) -> Result<()> {
            Ok(())
        }
        async fn stop(&mut self, _i: usize) -> Result<Vec<Seen>> {
            Ok(Vec::new())
        }
        fn resume(&mut self, i: usize) -> Result<()> {
            self.resumed.push(i);
            Ok(())
        }
        async fn finish(&mut self) -> Result<()> {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::script::{block_on, Script};
    use super::*;

    fn fault() -> Fault {
        Fault {
            target: Target::Consumer,
            node: None,
            action: FaultAction::Rendezvous,
            window: crate::vocab::Window::BeforeCommit,
            commit: 1,
            message: "mid-1".into(),
            then: crate::vocab::Then::None,
            kill_at_depth: None,
            restart_settle: None,
            restart_drain: false,
            copies: vec!["mid-1".into(), "mid-2".into()],
            asserts: Vec::new(),
        }
    }

    fn m(s: &str) -> String {
        s.to_string()
    }

    fn run_script(steps: Vec<Vec<Seen>>) -> (Result<()>, Script) {
        let mut c = Script::new(steps);
        let r = block_on(run(&mut c, &fault(), 3));
        (r, c)
    }

    /// consumer-1 held at its window, consumer-2 on its row lock: both are
    /// said, then released in order, consumer-1 first.
    #[test]
    fn one_at_the_window_one_on_the_lock() {
        let (r, c) = run_script(vec![
            vec![
                Seen::Received(m("mid-1")),
                Seen::AtWindow(m("mid-1")),
                Seen::Settled(m("mid-1")),
                Seen::Received(m("mid-3")),
                Seen::Settled(m("mid-3")),
            ],
            vec![
                Seen::Received(m("mid-2")),
                Seen::LockWait,
                Seen::Settled(m("mid-2")),
            ],
        ]);
        r.unwrap();
        assert_eq!(c.resumed, [0, 1]);
        assert!(
            c.said[0].contains("atWindow=consumer-1 onLock=consumer-2 status=injected"),
            "{:?}",
            c.said
        );
        assert!(c.said[1].ends_with("status=healed"), "{:?}", c.said);
    }

    /// consumer-2 never got a copy of the event (it settled another
    /// message): no overlap, an error, never a rendezvous that "held".
    #[test]
    fn an_instance_without_a_copy_is_no_rendezvous() {
        let (r, c) = run_script(vec![
            vec![Seen::Received(m("mid-1")), Seen::AtWindow(m("mid-1"))],
            vec![
                Seen::Received(m("mid-3")),
                Seen::Settled(m("mid-3")),
                Seen::Received(m("mid-4")),
                Seen::Settled(m("mid-4")),
            ],
        ]);
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains("consumer-2 took no copy of mid-1's event"),
            "{e}"
        );
        assert!(c.said.is_empty(), "{:?}", c.said);
    }

    /// consumer-1 settles its copy without reaching the window.
    #[test]
    fn the_first_instance_must_reach_the_window() {
        let (r, _) = run_script(vec![vec![
            Seen::Received(m("mid-1")),
            Seen::Settled(m("mid-1")),
            Seen::Received(m("mid-2")),
            Seen::Settled(m("mid-2")),
            Seen::Received(m("mid-3")),
            Seen::Settled(m("mid-3")),
        ]]);
        crate::faults::script::assert_unreachable(&r.unwrap_err(), "mid-1");
    }
}
