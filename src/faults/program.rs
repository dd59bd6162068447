//! A user's program (role contract v1, judged as a black box) at a window
//! of its consume step: the two proxies follow its deliveries, commits and
//! acks ([`super::blackbox`]); at the fault's window they freeze both of
//! its connections, and it is SIGKILLed there and started again, until it
//! has settled every message; then it gets SIGTERM. The kill is the
//! consumer-kill placement's ([`crate::vocab::OnConsume::ConsumerKill`]) on
//! a program; a rendezvous of programs is [`super::rendezvous`]'s.
//!
//! The runner implements [`Program`] (the processes, the proxies, the
//! broker and the transcript); [`follow`] decides, and its unit tests drive
//! it with a scripted program.

use std::collections::BTreeSet;

use anyhow::Result;

use super::blackbox::Seen;
use crate::failure::Failure;
use crate::lab::Fault;

/// What following a program asks of the consume step in progress. Every
/// wait ends at the step's deadline with the step's message.
#[allow(async_fn_in_trait)] // used generically, never as `dyn`
pub trait Program {
    /// The step's phase, for the messages.
    fn phase(&self) -> &str;
    /// Starts the program, the black box armed at the fault's window.
    fn start(&mut self) -> Result<()>;
    /// Starts it again after the kill: the black box forgets the killed
    /// process (nothing frozen, nothing armed) first.
    fn restart(&mut self) -> Result<()>;
    /// What the proxies saw it do next; an error when it exited first or
    /// the deadline passed (saying it settled `settled` of `settle`).
    async fn next(&mut self, settled: usize, settle: usize) -> Result<Seen>;
    /// A step it took, in the transcript.
    fn observe(&mut self, seen: &Seen);
    /// The armed window's name, and why it never fired (`None`: it fired,
    /// or none is armed).
    fn window(&self) -> (String, Option<String>);
    /// Whether it consumes with autoAck (the broker settled each delivery
    /// as it sent it).
    fn auto_ack(&self) -> bool;
    /// SIGKILL now, on the way out of an error.
    fn kill_now(&mut self);
    /// SIGTERM, followed to its exit: what the proxies saw it do on its
    /// way out.
    async fn terminate(&mut self) -> Result<Vec<Seen>>;
    /// Its exit code, for the checker.
    fn record_exit(&mut self) -> Result<()>;
    /// Waits until the step's queue holds `depth` ready messages.
    async fn await_depth(&mut self, depth: u32) -> Result<()>;
    /// At the window, both connections frozen: what the database holds for
    /// `message`, SIGKILL of the program's process group, its line and the
    /// fault's assertions.
    async fn kill_at_window(&mut self, message: &str) -> Result<()>;
    /// Waits until the broker no longer lists the killed program's consumer
    /// (until then its unacked deliveries are not requeued).
    async fn await_consumers_gone(&mut self) -> Result<()>;
    /// How many messages the step's queue holds now.
    async fn queue_ready(&mut self) -> Result<usize>;
}

/// Follows the program until it settled `settle` distinct messages (acked,
/// its transaction ended), killing it at `fault`'s window and starting it
/// again: one loop over what the proxies saw, an arm per turn of the
/// program's life (settled, window unreachable, the kill and the restart).
pub async fn follow(p: &mut impl Program, fault: Option<&Fault>, mut settle: usize) -> Result<()> {
    p.start()?;
    let mut acked = BTreeSet::new();
    loop {
        match p.next(acked.len(), settle).await? {
            Seen::Settled { message } => {
                acked.insert(message);
                if acked.len() < settle {
                    continue;
                }
                // Done with every message, and the window never came.
                if let ((window, Some(why)), Some(f)) = (p.window(), fault) {
                    p.kill_now();
                    return Err(unreachable(&window, &f.message, &why));
                }
                // A declared order the program broke on its way out.
                for seen in p.terminate().await? {
                    if let Seen::Contradicts { message } = seen {
                        return Err(contradicts(p.phase(), &message));
                    }
                }
                return p.record_exit();
            }
            Seen::Unreachable { message, why } => {
                p.kill_now();
                return Err(unreachable(&p.window().0, &message, &why));
            }
            Seen::Contradicts { message } => {
                p.kill_now();
                return Err(contradicts(p.phase(), &message));
            }
            Seen::Fire { message } => {
                // The window: both connections are frozen. An autoAck
                // program is killed once the broker has pushed it
                // everything (no prefetch bounds it): the loss is then what
                // it is, not how far a race got.
                if p.auto_ack() {
                    p.await_depth(0).await?;
                }
                p.kill_at_window(&message).await?;
                p.await_consumers_gone().await?;
                // autoAck: what the broker sent the killed program is gone
                // from the queue, never to come back.
                if p.auto_ack() || fault.is_some_and(|f| f.restart_drain) {
                    // What is left to settle: what the queue holds now.
                    settle = acked.len() + p.queue_ready().await?;
                    if acked.len() >= settle {
                        // Nothing is left for a new process.
                        return Ok(());
                    }
                }
                p.restart()?;
            }
            seen => p.observe(&seen),
        }
    }
}

fn unreachable(window: &str, message: &str, why: &str) -> anyhow::Error {
    Failure::unreachable(format!(
        "window `{window}` is unreachable for this program at {message}: {why}"
    ))
}

/// A program that broke the order its lab declares for it.
fn contradicts(phase: &str, message: &str) -> anyhow::Error {
    anyhow::anyhow!("phase {phase}: the lab declares that the program commits before it acks (`commits_first`), and it went on with {message} after acking it")
}

#[cfg(test)]
mod tests;
