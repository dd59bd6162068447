//! Fault windows for a program mqlab did not write (a user's consumer in any
//! language), placed from outside. The AMQP proxy and the PostgreSQL proxy
//! report each of the program's externally visible effects for a message
//! (its delivery, its `COMMIT`, its ack) to one [`BlackBox`], which decides
//! frame by frame what passes. At the selected window it *freezes* both
//! connections (nothing more passes either way) and tells the runner to
//! kill: the kill lands with the window exact, and no race between the kill
//! and the program's next step can change what the broker and the database
//! saw. With prefetch 1, every `COMMIT` between the delivery of message M
//! and the next delivery belongs to M; a program may commit more than once
//! per message, and each `COMMIT` is a window of its own (`before-commit`
//! with `commit = k` holds M's k-th). A program that consumes with autoAck
//! (the no-ack bit of its `basic.consume`) has each message settled by the
//! broker when it is sent: its delivery counts as its ack.
//!
//! Armed for a rendezvous instead ([`BlackBox::arm_rendezvous`], competing
//! instances of the program), the window does not freeze: it *pauses* the
//! program's database connection (frames held, not dropped; the AMQP
//! connection left alone) until the runner resumes it, and the held
//! `COMMIT` then goes on to the database.

use std::collections::BTreeSet;

use std::sync::Arc;

use tokio::sync::{mpsc, watch, Notify};

use crate::vocab::Window;

/// What the proxies saw the program do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    Delivered {
        message: String,
        redelivered: bool,
        /// Sent to an autoAck consumer: the broker settled it as it sent it.
        auto_ack: bool,
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
    /// A frame of the program's held at the window (`commit` or `ack`);
    /// a commit's ordinal among the message's when it is not the first.
    Held {
        message: String,
        what: &'static str,
        commit: Option<usize>,
    },
    /// The window was reached: both connections are frozen; kill now.
    Fire {
        message: String,
    },
    /// A program declared to commit before it acks (`commits_first`) went
    /// on with a message it had acked: a statement after a skip, or a
    /// `COMMIT` for an acked message (any autoAck program's).
    Contradicts {
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
    /// A rendezvous: the window is reached with any of these messages (the
    /// copies of one event), and it pauses instead of freezing.
    copies: Vec<String>,
    /// `true` while the database connection is paused (a rendezvous): the
    /// PostgreSQL proxy holds frames both ways and passes them on resume.
    paused: watch::Sender<bool>,
    /// The target `COMMIT`'s ordinal among its message's (1: the first).
    commit: usize,
    /// `COMMIT`s the current message's program sent so far.
    commits: usize,
    /// The program consumes with autoAck (seen in its `basic.consume`).
    auto_ack: bool,
    /// The program's order, learned at its first `COMMIT` for a delivered
    /// message (kept across restarts: the same program): `true` when it
    /// commits before it acks. Such a program is done with a message at
    /// its ack, so one it acks with no transaction (a duplicate skipped in
    /// memory, a type it filters) is settled there; a program that acks
    /// first still has its `COMMIT` to come.
    commits_first: Option<bool>,
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
    /// `commits_first` was declared by the lab, not learned.
    declared: bool,
    /// The current message was settled as a skip (acked with no
    /// transaction): a statement before the next delivery contradicts a
    /// declared order.
    skip_settled: bool,
    /// The program's database connections with a transaction open (their
    /// last ReadyForQuery said so), by connection id: an ack of the current
    /// message while one is open is an ack before its COMMIT, not a skip (a
    /// batch acked with `multiple` before its last COMMIT). A read outside
    /// a transaction, or another connection's, leaves it out.
    open_tx: BTreeSet<u64>,
    /// Wakes the AMQP proxy to pass a delivery it held.
    pub release: Arc<Notify>,
    /// The AMQP proxy connection (by id) that holds a delivery for the end
    /// of the current transaction: the database's answer that ends it
    /// reaches the program only once that delivery has passed
    /// ([`BlackBox::deliveries`] counts up), so what the program does next
    /// (a batch's ack) comes after it.
    delivery_held: Option<u64>,
    /// Deliveries passed so far (and resets), for whoever waits for one.
    passed: watch::Sender<u64>,
    /// The broker's first refusal of something the current process asked,
    /// and whether it concerned the topology (its own declaration
    /// contradicting the lab's): what explains its failure, if it fails.
    refused: Option<(String, bool)>,
    seen: mpsc::UnboundedSender<Seen>,
}

impl BlackBox {
    pub fn new(seen: mpsc::UnboundedSender<Seen>) -> BlackBox {
        BlackBox {
            target: None,
            copies: Vec::new(),
            paused: watch::Sender::new(false),
            commit: 1,
            commits: 0,
            auto_ack: false,
            commits_first: None,
            current: None,
            committed: BTreeSet::new(),
            acked: BTreeSet::new(),
            ended: BTreeSet::new(),
            frozen: false,
            fired: false,
            commit_pending: false,
            awaiting_tx_end: false,
            declared: false,
            skip_settled: false,
            open_tx: BTreeSet::new(),
            release: Arc::new(Notify::new()),
            delivery_held: None,
            passed: watch::Sender::new(0),
            refused: None,
            seen,
        }
    }

    /// Selects the window for one message; `commit`: which of its
    /// `COMMIT`s `before-commit` holds (1: the first).
    pub fn arm(&mut self, window: Window, message: &str, commit: usize) {
        self.target = Some((window, message.to_string()));
        self.commit = commit.max(1);
        self.fired = false;
    }

    /// Selects the window for a rendezvous: reached with any of `copies`
    /// (the copies of one event), it pauses the database connection.
    pub fn arm_rendezvous(&mut self, window: Window, copies: &[String], commit: usize) {
        let first = copies.first().cloned().unwrap_or_default();
        self.arm(window, &first, commit);
        self.copies = copies.to_vec();
    }

    /// Holds the database connection's frames both ways (a rendezvous's
    /// instance waiting on another's row lock, or at its window).
    pub fn pause(&mut self) {
        self.paused.send_replace(true);
    }

    /// Passes what the database connection held, and what follows. A
    /// rendezvous holds an instance once: released, it is not held again
    /// (one parked on a lock would otherwise stop at its COMMIT after it).
    pub fn resume(&mut self) {
        self.fired = true;
        self.paused.send_replace(false);
    }

    pub fn paused(&self) -> bool {
        *self.paused.borrow()
    }

    /// Changes of [`BlackBox::paused`], for the proxy waiting to pass what it held.
    pub fn paused_changes(&self) -> watch::Receiver<bool> {
        self.paused.subscribe()
    }

    /// The lab declares that the program commits before it acks
    /// (`commits_first`): a message it acks with no statement is a skip
    /// from its first message on; statements and `COMMIT`s are checked
    /// against it ([`BlackBox::on_statement`], [`BlackBox::on_commit_request`]).
    pub fn declare_commits_first(&mut self) {
        self.commits_first = Some(true);
        self.declared = true;
    }

    /// The broker refused a request of the program's and closed its
    /// channel; the first refusal is kept.
    pub fn on_refused(&mut self, text: String, topology: bool) {
        self.refused.get_or_insert((text, topology));
    }

    /// The broker's first refusal of the current process's requests, and
    /// whether it concerned the topology.
    pub fn refused(&self) -> Option<(&str, bool)> {
        self.refused
            .as_ref()
            .map(|(t, topology)| (t.as_str(), *topology))
    }

    /// The program's `basic.consume` asked for autoAck.
    pub fn on_consume(&mut self, no_ack: bool) {
        self.auto_ack |= no_ack;
    }

    pub fn auto_ack(&self) -> bool {
        self.auto_ack
    }

    /// The window armed and never reached, once the program is done with
    /// the message: why (a `COMMIT` it never sent, a message it never got).
    pub fn never_fired(&self) -> Option<String> {
        let (w, _) = self.target.as_ref().filter(|_| !self.fired)?;
        Some(match w {
            Window::BeforeCommit if self.commit > 1 => {
                format!("it sent fewer than {} COMMITs for it", self.commit)
            }
            Window::BeforeCommit => "it sent no COMMIT for it".into(),
            _ => "the program settled every message and the window never came".into(),
        })
    }

    /// The armed window's name (`after-commit-1-before-commit-2` for a
    /// second COMMIT), for the transcript's errors.
    pub fn window_name(&self) -> String {
        match &self.target {
            Some((Window::BeforeCommit, _)) => commit_window_name(self.commit),
            Some((w, _)) => w.name().to_string(),
            None => "?".into(),
        }
    }

    /// After the kill: nothing is frozen, nothing armed; a new process
    /// starts from a clean slate.
    pub fn reset(&mut self) {
        self.refused = None;
        self.target = None;
        self.current = None;
        self.commits = 0;
        self.frozen = false;
        self.commit_pending = false;
        self.awaiting_tx_end = false;
        self.skip_settled = false;
        self.open_tx.clear();
        self.delivery_passed();
    }

    /// AMQP proxy connection `conn` holds a delivery until the
    /// transaction ends.
    pub fn hold_delivery(&mut self, conn: u64) {
        self.delivery_held = Some(conn);
    }

    /// AMQP proxy connection `conn` ended: a delivery it held will not
    /// pass (another connection's still may).
    pub fn delivery_gone(&mut self, conn: u64) {
        if self.delivery_held == Some(conn) {
            self.delivery_passed();
        }
    }

    /// The database is ready for the next query on the program's
    /// connection `conn`; `in_tx`: a transaction is open there
    /// (ReadyForQuery's status `T` or `E`).
    pub fn on_ready(&mut self, conn: u64, in_tx: bool) {
        if self.frozen {
            return;
        }
        match in_tx {
            true => self.open_tx.insert(conn),
            false => self.open_tx.remove(&conn),
        };
    }

    /// The program's database connection `conn` ended.
    pub fn db_connection_closed(&mut self, conn: u64) {
        self.open_tx.remove(&conn);
    }

    fn in_tx(&self) -> bool {
        !self.open_tx.is_empty()
    }

    fn delivery_passed(&mut self) {
        self.delivery_held = None;
        self.passed.send_modify(|n| *n += 1);
    }

    /// When a delivery is held: the deliveries passed so far, and their
    /// count's changes, for the PostgreSQL proxy to wait until the held one
    /// has passed before it answers the transaction's end to the program.
    pub fn deliveries(&self) -> Option<(u64, watch::Receiver<u64>)> {
        self.delivery_held
            .map(|_| (*self.passed.borrow(), self.passed.subscribe()))
    }

    pub fn frozen(&self) -> bool {
        self.frozen
    }

    /// Why the program's next delivery is held with no end in sight, for a
    /// deadline's error: its message was acked with no transaction before
    /// the program showed whether it commits before it acks.
    pub fn stuck(&self) -> Option<String> {
        let m = self.current.as_ref()?;
        if !(self.awaiting_tx_end && self.acked.contains(m)) {
            return None;
        }
        match self.commits_first {
            None => Some(format!(
                "mqlab holds the next delivery: {m} was acked with no transaction, before the program committed any message, so mqlab cannot tell a skip from an ack-first program whose COMMIT is still to come (a program is followed through messages it settles without a database statement once it has committed one; one that commits before it acks can say so with `commits_first = true` on its consume step; docs/byo.md)"
            )),
            Some(true) if self.in_tx() => Some(format!(
                "mqlab holds the next delivery: {m} was acked while a transaction of the program was open, and the program never ended it (a COMMIT or ROLLBACK ends a message's transaction; a driver that opens one for every read needs its read committed or rolled back, or autocommit; docs/byo.md)"
            )),
            Some(_) => None,
        }
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

    /// The armed message (or, for a rendezvous, the copy) the program is at,
    /// when `w` is the armed window and it has not been reached yet.
    fn targets(&self, w: Window) -> Option<String> {
        let current = self.current.as_ref()?;
        match &self.target {
            Some((tw, m))
                if *tw == w && !self.fired && (m == current || self.copies.contains(current)) =>
            {
                Some(current.clone())
            }
            _ => None,
        }
    }

    /// The window: frozen for the kill, or, for a rendezvous, paused.
    fn fire(&mut self, message: String) {
        match self.copies.is_empty() {
            true => self.frozen = true,
            false => self.pause(),
        }
        self.fired = true;
        self.say(Seen::Fire { message });
    }

    /// The broker delivers a message to the program (the frame passes; at
    /// `on-deliver` everything after it is held).
    pub fn on_deliver(&mut self, message: &str, redelivered: bool, auto_ack: bool) -> Pass {
        self.delivery_passed();
        if self.frozen {
            return Pass::Hold;
        }
        // The message before, acked and followed by another: its k-th
        // COMMIT never came (a redelivery of it may still commit).
        let done = self
            .current
            .as_deref()
            .is_some_and(|m| m != message && self.acked.contains(m));
        if let Some(why) = self
            .targets(Window::BeforeCommit)
            .filter(|_| done)
            .and_then(|_| self.never_fired())
        {
            let m = self.current.clone().unwrap_or_default();
            self.fired = true;
            self.say(Seen::Unreachable { message: m, why });
        }
        self.current = Some(message.to_string());
        self.skip_settled = false;
        self.commits = 0;
        self.awaiting_tx_end = true;
        self.say(Seen::Delivered {
            message: message.to_string(),
            redelivered,
            auto_ack,
        });
        if auto_ack {
            self.acked.insert(message.to_string());
            if self.targets(Window::AfterCommitBeforeAck).is_some() {
                self.fired = true;
                self.say(Seen::Unreachable {
                    message: message.to_string(),
                    why: "it consumes with autoAck: the broker settled the message when it sent it, there is no ack to hold".into(),
                });
            }
        }
        if let Some(m) = self.targets(Window::OnDeliver) {
            self.fire(m);
        }
        Pass::Forward
    }

    /// The program sends a statement (anything but `ROLLBACK`). Under a
    /// declared order, one that comes after a message was settled as a skip
    /// and before the next delivery is that message's: it acked first.
    pub fn on_statement(&mut self) {
        if self.frozen || !self.declared || !self.skip_settled {
            return;
        }
        let m = self.current.clone().unwrap_or_default();
        self.say(Seen::Contradicts { message: m });
        self.frozen = true;
    }

    /// The program sends `COMMIT`.
    pub fn on_commit_request(&mut self) -> Pass {
        if self.frozen {
            return Pass::Hold;
        }
        let Some(m) = self.current.clone() else {
            return Pass::Forward;
        };
        self.commits += 1;
        if self.declared && self.acked.contains(&m) {
            self.say(Seen::Contradicts { message: m });
            self.frozen = true;
            return Pass::Hold;
        }
        if self.commits_first.is_none() {
            self.commits_first = Some(!self.acked.contains(&m));
        }
        if self.targets(Window::BeforeCommit).is_some() && self.commits == self.commit {
            self.say(Seen::Held {
                message: m.clone(),
                what: "commit",
                commit: (self.commits > 1).then_some(self.commits),
            });
            // Paused, not frozen: the COMMIT passes at resume, and its
            // answer is the answer to this one.
            self.commit_pending = !self.copies.is_empty();
            self.fire(m);
            return Pass::Hold;
        }
        if self.targets(Window::AfterAckBeforeCommit).is_some() {
            if self.acked.contains(&m) {
                self.hold(m, "commit");
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
        self.on_acks(&[message.to_string()])
    }

    /// The program acks the messages one frame covers (one, or a batch
    /// acked with `multiple`), in delivery order. The frame passes whole or
    /// not at all: held at `after-commit-before-ack` of one of them, none
    /// of the batch is acked (the broker sees none); passed, each is acked,
    /// then `after-ack` fires.
    pub fn on_acks(&mut self, covers: &[String]) -> Pass {
        if self.frozen {
            return Pass::Hold;
        }
        if let Some(m) = self.committed_target(Window::AfterCommitBeforeAck, covers) {
            self.hold(m, "ack");
            return Pass::Hold;
        }
        for m in covers {
            self.ack_one(m);
        }
        if let Some(m) = self.committed_target(Window::AfterAck, covers) {
            self.fire(m);
        }
        Pass::Forward
    }

    /// The message among `covers` whose window `w` is armed and whose
    /// COMMIT passed.
    fn committed_target(&self, w: Window, covers: &[String]) -> Option<String> {
        covers
            .iter()
            .find(|m| self.is_target(w, m) && self.committed.contains(*m))
            .cloned()
    }

    /// The window reached with `m`'s `what` (an ack, a COMMIT) held.
    fn hold(&mut self, m: String, what: &'static str) {
        self.say(Seen::Held {
            message: m.clone(),
            what,
            commit: None,
        });
        self.fire(m);
    }

    /// `w` is armed for `m` and not reached yet.
    fn is_target(&self, w: Window, m: &str) -> bool {
        matches!(&self.target, Some((tw, tm)) if *tw == w && tm == m && !self.fired)
    }

    /// One message of an ack that passes.
    fn ack_one(&mut self, m: &str) {
        let m = m.to_string();
        if self.is_target(Window::AfterCommitBeforeAck, &m) {
            // A program that commits before it acks and acks with no
            // COMMIT and no statement skipped the message: there is no
            // commit to kill after.
            let skip = self.commits_first == Some(true)
                && !(self.in_tx() && self.current.as_deref() == Some(m.as_str()));
            let why = match skip {
                true => "it acks it with no COMMIT (a skip)",
                false => "it acks before it commits",
            };
            self.say(Seen::Unreachable {
                message: m.clone(),
                why: why.into(),
            });
            self.fired = true;
        }
        self.acked.insert(m.clone());
        self.say(Seen::Acked { message: m.clone() });
        if self.current.as_deref() == Some(m.as_str()) {
            // Acked with no transaction ended since its delivery, and no
            // statement sent, by a program that commits before it acks: it
            // skipped the message.
            if self.commits_first == Some(true)
                && !self.in_tx()
                && std::mem::take(&mut self.awaiting_tx_end)
            {
                self.ended.insert(m.clone());
                self.skip_settled = true;
                self.release.notify_one();
            }
        }
        // An earlier message too (a batch acked with `multiple`): its
        // transaction ended before the delivery after it.
        self.settle(&m);
    }
}

/// A connection's id among every proxied connection of this process (AMQP
/// and PostgreSQL): what the black box keys per-connection state by.
pub fn connection_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The window that holds a message's k-th `COMMIT`, as explore's rows and
/// the errors name it: `before-commit`, then `after-commit-1-before-commit-2`...
pub fn commit_window_name(k: usize) -> String {
    match k {
        0 | 1 => Window::BeforeCommit.name().to_string(),
        k => format!("after-commit-{}-before-commit-{k}", k - 1),
    }
}

#[cfg(test)]
mod tests;
