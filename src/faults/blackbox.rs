//! Fault windows for a program mqlab did not write (a user's consumer in any
//! language), placed from outside. The AMQP proxy and the PostgreSQL proxy
//! report each of the program's externally visible effects for a message
//! (its delivery, its `COMMIT`, its ack) to one [`BlackBox`], which decides
//! frame by frame what passes. At the selected window it *freezes* both
//! connections (nothing more passes either way) and tells the runner to
//! kill: the kill lands with the window exact, and no race between the kill
//! and the program's next step can change what the broker and the database
//! saw. With prefetch 1, every `COMMIT` between the delivery of message M
//! and the next delivery belongs to M.

use std::collections::BTreeSet;

use std::sync::Arc;

use tokio::sync::{mpsc, Notify};

use crate::vocab::Window;

/// What the proxies saw the program do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    Delivered {
        message: String,
        redelivered: bool,
    },
    /// Its `COMMIT` passed to the database and the database answered.
    Committed {
        message: String,
    },
    /// Its `COMMIT` ended in a rollback (the transaction had failed).
    RolledBack {
        message: String,
    },
    Acked {
        message: String,
    },
    /// Both acked and its transaction ended: the program is done with it.
    Settled {
        message: String,
    },
    /// A frame of the program's held at the window (`commit` or `ack`).
    Held {
        message: String,
        what: &'static str,
    },
    /// The window was reached: both connections are frozen; kill now.
    Fire {
        message: String,
    },
    /// The program's order never reaches the window (e.g. it acks before it
    /// commits, so there is no `after-commit-before-ack`).
    Unreachable {
        message: String,
        why: String,
    },
}

/// Whether a frame passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    Forward,
    Hold,
}

pub struct BlackBox {
    target: Option<(Window, String)>,
    /// The message whose effects come now (the last delivered).
    current: Option<String>,
    committed: BTreeSet<String>,
    acked: BTreeSet<String>,
    /// Messages whose transaction ended (COMMIT or ROLLBACK answered).
    ended: BTreeSet<String>,
    frozen: bool,
    fired: bool,
    /// A `COMMIT` passed and is not answered yet.
    commit_pending: bool,
    /// The current message's transaction has not ended yet (no COMMIT or
    /// ROLLBACK answered since its delivery): the next delivery waits, so
    /// that every COMMIT between two deliveries belongs to the first, even
    /// for a program that acks before it commits (its ack frees the
    /// prefetch slot before its COMMIT).
    awaiting_tx_end: bool,
    /// Wakes the AMQP proxy to pass a delivery it held.
    pub release: Arc<Notify>,
    seen: mpsc::UnboundedSender<Seen>,
}

impl BlackBox {
    pub fn new(seen: mpsc::UnboundedSender<Seen>) -> BlackBox {
        BlackBox {
            target: None,
            current: None,
            committed: BTreeSet::new(),
            acked: BTreeSet::new(),
            ended: BTreeSet::new(),
            frozen: false,
            fired: false,
            commit_pending: false,
            awaiting_tx_end: false,
            release: Arc::new(Notify::new()),
            seen,
        }
    }

    /// Selects the window for one message (None: only observe).
    pub fn arm(&mut self, window: Window, message: &str) {
        self.target = Some((window, message.to_string()));
        self.fired = false;
    }

    /// After the kill: nothing is frozen, nothing armed; a new process
    /// starts from a clean slate.
    pub fn reset(&mut self) {
        self.target = None;
        self.current = None;
        self.frozen = false;
        self.commit_pending = false;
        self.awaiting_tx_end = false;
    }

    pub fn frozen(&self) -> bool {
        self.frozen
    }

    /// The next delivery must wait for the current message's transaction to end.
    pub fn holds_next_delivery(&self) -> bool {
        self.awaiting_tx_end && !self.frozen
    }

    /// The program's transaction ended (COMMIT or ROLLBACK answered).
    pub fn on_tx_end(&mut self) {
        if std::mem::take(&mut self.awaiting_tx_end) {
            self.release.notify_one();
            if let Some(m) = self.current.clone() {
                self.ended.insert(m.clone());
                self.settle(&m);
            }
        }
    }

    fn settle(&self, m: &str) {
        if self.acked.contains(m) && self.ended.contains(m) {
            self.say(Seen::Settled {
                message: m.to_string(),
            });
        }
    }

    fn say(&self, s: Seen) {
        let _ = self.seen.send(s);
    }

    fn targets(&self, w: Window) -> Option<String> {
        match &self.target {
            Some((tw, m)) if *tw == w && !self.fired && self.current.as_deref() == Some(m) => {
                Some(m.clone())
            }
            _ => None,
        }
    }

    fn fire(&mut self, message: String) {
        self.frozen = true;
        self.fired = true;
        self.say(Seen::Fire { message });
    }

    /// The broker delivers a message to the program (the frame passes; at
    /// `on-deliver` everything after it is held).
    pub fn on_deliver(&mut self, message: &str, redelivered: bool) -> Pass {
        if self.frozen {
            return Pass::Hold;
        }
        self.current = Some(message.to_string());
        self.awaiting_tx_end = true;
        self.say(Seen::Delivered {
            message: message.to_string(),
            redelivered,
        });
        if let Some(m) = self.targets(Window::OnDeliver) {
            self.fire(m);
        }
        Pass::Forward
    }

    /// The program sends `COMMIT`.
    pub fn on_commit_request(&mut self) -> Pass {
        if self.frozen {
            return Pass::Hold;
        }
        let Some(m) = self.current.clone() else {
            return Pass::Forward;
        };
        if self.targets(Window::BeforeCommit).is_some() {
            self.say(Seen::Held {
                message: m.clone(),
                what: "commit",
            });
            self.fire(m);
            return Pass::Hold;
        }
        if self.targets(Window::AfterAckBeforeCommit).is_some() {
            if self.acked.contains(&m) {
                self.say(Seen::Held {
                    message: m.clone(),
                    what: "commit",
                });
                self.fire(m);
                return Pass::Hold;
            }
            self.say(Seen::Unreachable {
                message: m,
                why: "it commits before it acks".into(),
            });
            self.fired = true;
        }
        self.commit_pending = true;
        Pass::Forward
    }

    /// The database answered the program's `COMMIT` (`committed`: it was a
    /// commit, not the rollback of a failed transaction).
    pub fn on_commit_done(&mut self, committed: bool) {
        // A ROLLBACK the program asked for itself is not the answer to a COMMIT.
        if !std::mem::take(&mut self.commit_pending) {
            return;
        }
        let Some(m) = self.current.clone() else {
            return;
        };
        if !committed {
            self.say(Seen::RolledBack { message: m });
            return;
        }
        self.committed.insert(m.clone());
        self.say(Seen::Committed { message: m.clone() });
        if self.targets(Window::AfterAck).is_some() && self.acked.contains(&m) {
            self.fire(m);
        }
    }

    /// The program acks a message.
    pub fn on_ack(&mut self, message: &str) -> Pass {
        if self.frozen {
            return Pass::Hold;
        }
        let m = message.to_string();
        let is_target = |w: Window, me: &Self| matches!(&me.target, Some((tw, tm)) if *tw == w && *tm == m && !me.fired);
        if is_target(Window::AfterCommitBeforeAck, self) {
            if self.committed.contains(&m) {
                self.say(Seen::Held {
                    message: m.clone(),
                    what: "ack",
                });
                self.fire(m);
                return Pass::Hold;
            }
            self.say(Seen::Unreachable {
                message: m.clone(),
                why: "it acks before it commits".into(),
            });
            self.fired = true;
        }
        self.acked.insert(m.clone());
        self.say(Seen::Acked { message: m.clone() });
        if self.current.as_deref() == Some(m.as_str()) {
            self.settle(&m);
        }
        if is_target(Window::AfterAck, self) && self.committed.contains(&m) {
            self.fire(m);
        }
        Pass::Forward
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bb() -> (BlackBox, mpsc::UnboundedReceiver<Seen>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (BlackBox::new(tx), rx)
    }

    fn drain(rx: &mut mpsc::UnboundedReceiver<Seen>) -> Vec<Seen> {
        let mut v = Vec::new();
        while let Ok(s) = rx.try_recv() {
            v.push(s);
        }
        v
    }

    /// A program that commits, then acks: each window lands where it says.
    #[test]
    fn commit_then_ack() {
        let (mut b, mut rx) = bb();
        b.arm(Window::AfterCommitBeforeAck, "mid-1");
        assert_eq!(b.on_deliver("mid-1", false), Pass::Forward);
        assert_eq!(b.on_commit_request(), Pass::Forward);
        b.on_commit_done(true);
        assert_eq!(b.on_ack("mid-1"), Pass::Hold);
        assert!(b.frozen());
        assert_eq!(b.on_deliver("mid-2", false), Pass::Hold);
        let seen = drain(&mut rx);
        assert!(matches!(seen.last(), Some(Seen::Fire { message }) if message == "mid-1"));

        let (mut b, mut rx) = bb();
        b.arm(Window::BeforeCommit, "mid-1");
        b.on_deliver("mid-1", false);
        assert_eq!(b.on_commit_request(), Pass::Hold);
        assert!(b.frozen());
        drain(&mut rx);

        // This program never acks before it commits.
        let (mut b, mut rx) = bb();
        b.arm(Window::AfterAckBeforeCommit, "mid-1");
        b.on_deliver("mid-1", false);
        assert_eq!(b.on_commit_request(), Pass::Forward);
        assert!(drain(&mut rx)
            .iter()
            .any(|s| matches!(s, Seen::Unreachable { .. })));
        assert!(!b.frozen());
    }

    /// A program that acks first: `after-ack-before-commit` holds its
    /// commit; `after-commit-before-ack` is unreachable.
    #[test]
    fn ack_then_commit() {
        let (mut b, mut rx) = bb();
        b.arm(Window::AfterAckBeforeCommit, "mid-1");
        b.on_deliver("mid-1", false);
        assert_eq!(b.on_ack("mid-1"), Pass::Forward);
        assert_eq!(b.on_commit_request(), Pass::Hold);
        assert!(b.frozen());
        drain(&mut rx);

        let (mut b, mut rx) = bb();
        b.arm(Window::AfterCommitBeforeAck, "mid-1");
        b.on_deliver("mid-1", false);
        assert_eq!(b.on_ack("mid-1"), Pass::Forward);
        assert!(drain(&mut rx)
            .iter()
            .any(|s| matches!(s, Seen::Unreachable { .. })));
    }

    #[test]
    fn on_deliver_and_after_ack() {
        let (mut b, _rx) = bb();
        b.arm(Window::OnDeliver, "mid-2");
        b.on_deliver("mid-1", false);
        assert!(!b.frozen());
        b.on_deliver("mid-2", false);
        assert!(b.frozen());
        assert_eq!(b.on_commit_request(), Pass::Hold);

        let (mut b, _rx) = bb();
        b.arm(Window::AfterAck, "mid-1");
        b.on_deliver("mid-1", false);
        b.on_commit_request();
        b.on_commit_done(true);
        assert!(!b.frozen());
        assert_eq!(b.on_ack("mid-1"), Pass::Forward);
        assert!(b.frozen());
    }
}
