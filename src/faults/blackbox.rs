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
//! Until the program's first `COMMIT` shows its order, a message it acked
//! with no statement since its delivery may be a skip (a duplicate known in
//! memory, a type it filters: the program waits for the next delivery) or
//! the ack of a program that acks first (its statements are still to
//! come). Then the next delivery is passed to the program but *deferred*
//! for the black box, and the program's statements tell which it is, by
//! the eventIds they carry: the acked message's (it acks first: the
//! deferred delivery is seen when that transaction ends, as if it had been
//! held) or the deferred one's (the acked message was skipped, and settles).
//!
//! Armed for a rendezvous instead ([`BlackBox::arm_rendezvous`], competing
//! instances of the program), the window does not freeze: it *pauses* the
//! program's database connection (frames held, not dropped; the AMQP
//! connection left alone) until the runner resumes it, and the held
//! `COMMIT` then goes on to the database.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

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
    /// The program's statements could not be told apart: no statement of
    /// a transaction named the eventId of the message it acked with no
    /// statement nor of the one delivered after it.
    Unattributable {
        message: String,
        why: String,
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
    /// Wakes the AMQP proxy to pass a delivery it held.
    pub release: Arc<Notify>,
    seen: mpsc::UnboundedSender<Seen>,
    /// The lab's messages: message id → eventId, what the program's
    /// statements are matched against (empty: nothing is deferred).
    event_ids: BTreeMap<String, String>,
    /// The program's statements (simple queries, parses, binds) since the
    /// current message's delivery.
    statements: usize,
    /// Deliveries the proxy passed while the current message was acked
    /// with no statement and its order unknown, and whose header has not
    /// come yet: each is deferred when it does.
    admitted: usize,
    /// Deliveries passed to the program and not yet seen by the black box
    /// (message, redelivered, autoAck), in order.
    deferred: VecDeque<(String, bool, bool)>,
    /// A statement since the current message's delivery named its eventId:
    /// the deferred deliveries come after its transaction.
    named_current: bool,
    /// Messages settled as skips because the program went on to the next
    /// one: a statement naming one of them later is an error.
    skipped: BTreeSet<String>,
}

/// What a program's statement says, for the eventIds it names.
#[derive(Clone, Copy, Debug)]
pub enum Said<'a> {
    /// The SQL of a simple query or a parse: names an eventId as a quoted
    /// literal (`'01J7...'`).
    Sql(&'a [u8]),
    /// A bound parameter's value (text format): names an eventId when it is
    /// that eventId, or holds it as a JSON string (`"01J7..."`).
    Value(&'a [u8]),
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
            release: Arc::new(Notify::new()),
            seen,
            event_ids: BTreeMap::new(),
            statements: 0,
            admitted: 0,
            deferred: VecDeque::new(),
            named_current: false,
            skipped: BTreeSet::new(),
        }
    }

    /// The lab's messages (message id → eventId): with them, a message
    /// acked with no statement before the program's order is known no
    /// longer holds the next delivery (see the module's doc).
    pub fn know(&mut self, event_ids: BTreeMap<String, String>) {
        self.event_ids = event_ids;
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
        self.target = None;
        self.current = None;
        self.commits = 0;
        self.frozen = false;
        self.commit_pending = false;
        self.awaiting_tx_end = false;
        self.statements = 0;
        self.admitted = 0;
        self.deferred.clear();
        self.named_current = false;
        self.skipped.clear();
    }

    pub fn frozen(&self) -> bool {
        self.frozen
    }

    /// Why the program's next delivery is held with no end in sight, for a
    /// deadline's error: its message was acked with no transaction before
    /// the program showed whether it commits before it acks.
    pub fn stuck(&self) -> Option<String> {
        let m = self.current.as_ref()?;
        (self.awaiting_tx_end && self.acked.contains(m) && self.commits_first.is_none()).then(|| {
            format!(
                "{m} was acked with no statement before the program committed any message, and nothing after it told a skip from an ack-first program whose COMMIT is still to come (docs/byo.md)"
            )
        })
    }

    /// Whether the proxy passes the next delivery now: not while the
    /// current message's transaction is still to end, unless the message
    /// was acked with no statement before the program's order is known;
    /// such a delivery is passed, and deferred (see the module's doc).
    pub fn admit_delivery(&mut self) -> bool {
        if !self.awaiting_tx_end || self.frozen {
            return true;
        }
        if self.undecided() {
            self.admitted += 1;
            return true;
        }
        false
    }

    /// The current message was acked with no statement since its delivery,
    /// before the program's order is known: a skip, or an ack-first
    /// program whose statements are still to come.
    fn undecided(&self) -> bool {
        let Some(m) = self.current.as_ref() else {
            return false;
        };
        !self.event_ids.is_empty()
            && self.commits_first.is_none()
            && self.statements == 0
            && self.deferred.is_empty()
            && self.acked.contains(m)
    }

    /// The current message's turn is over: the next deferred delivery is
    /// seen now, or the proxy passes the one it held.
    fn next_delivery(&mut self) {
        // Frozen: the kill comes, and nothing more is seen.
        if self.frozen {
            return;
        }
        if self.deferred.is_empty() {
            // A delivery admitted whose header has not come yet comes
            // after this turn: it is seen as it comes.
            self.admitted = 0;
        }
        match self.deferred.pop_front() {
            Some((m, redelivered, auto_ack)) => self.deliver(&m, redelivered, auto_ack),
            None => self.release.notify_one(),
        }
    }

    /// A message's eventId; a resend (`mid-1.2`) carries its original's.
    fn event_of(&self, m: &str) -> Option<&String> {
        let base = m.split_once('.').map_or(m, |(b, _)| b);
        self.event_ids.get(m).or_else(|| self.event_ids.get(base))
    }

    /// The program sends a statement (a simple query, a parse or a bind):
    /// with deliveries deferred, the eventId it names tells whose it is.
    pub fn on_statement(&mut self, said: &[Said]) {
        if self.frozen {
            return;
        }
        self.statements += 1;
        if self.event_ids.is_empty() || self.commits_first.is_some() {
            return;
        }
        let names = |m: &str| {
            self.event_of(m)
                .is_some_and(|e| said.iter().any(|s| s.names(e.as_bytes())))
        };
        let current = self.current.clone().unwrap_or_default();
        if let Some(s) = self.skipped.iter().find(|m| names(m)).cloned() {
            return self.unattributable(&current, format!("a statement named the eventId of {s}, which the program had acked with no statement and left for a later message: it works on more than one message at a time"));
        }
        // A copy of the current message's event (a resend, mid-1.2) after it
        // is not told apart by its eventId: the statement is the current
        // one's, as the hold would have had it (the same event either way).
        let same = self.event_of(&current);
        let later = self
            .deferred
            .iter()
            .position(|(m, ..)| names(m) && self.event_of(m) != same);
        match (names(&current), later) {
            (true, Some(k)) => {
                let other = self.deferred[k].0.clone();
                self.unattributable(&current, format!("a statement named the eventId of both {current} and {other}, delivered after it"));
            }
            (true, None) => self.named_current = true,
            (false, Some(k)) if self.named_current => {
                let other = self.deferred[k].0.clone();
                self.unattributable(&current, format!("a statement of {current}'s transaction named the eventId of {other}, delivered after it"));
            }
            (false, Some(k)) => {
                self.skip_to(k);
                if !self.frozen {
                    self.statements = 1;
                    self.named_current = true;
                }
            }
            (false, None) => {}
        }
    }

    /// mqlab cannot tell which message the program's effects are: said,
    /// and frozen (the runner ends the run with the error).
    fn unattributable(&mut self, message: &str, why: String) {
        self.say(Seen::Unattributable {
            message: message.to_string(),
            why,
        });
        self.frozen = true;
    }

    /// The messages before the deferred one at `k` were settled with no
    /// statement (skips): each settles, and the next is seen, up to `k`.
    fn skip_to(&mut self, k: usize) {
        for _ in 0..=k {
            let m = self.current.clone().unwrap_or_default();
            if !self.acked.contains(&m) {
                return self.unattributable(
                    &m,
                    format!("the program went on to a later message before it acked {m}"),
                );
            }
            self.awaiting_tx_end = false;
            self.skipped.insert(m.clone());
            self.ended.insert(m.clone());
            self.settle(&m);
            self.next_delivery();
            if self.frozen {
                return;
            }
        }
    }

    /// The program's transaction ended (COMMIT or ROLLBACK answered).
    pub fn on_tx_end(&mut self) {
        if std::mem::take(&mut self.awaiting_tx_end) {
            if let Some(m) = self.current.clone() {
                self.ended.insert(m.clone());
                self.settle(&m);
            }
            self.next_delivery();
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
        if self.frozen {
            return Pass::Hold;
        }
        if self.admitted > 0 {
            self.admitted -= 1;
            self.deferred
                .push_back((message.to_string(), redelivered, auto_ack));
            return Pass::Forward;
        }
        self.deliver(message, redelivered, auto_ack);
        Pass::Forward
    }

    /// The black box sees a delivery: the program's effects from now on
    /// are this message's.
    fn deliver(&mut self, message: &str, redelivered: bool, auto_ack: bool) {
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
        self.commits = 0;
        self.statements = 0;
        self.named_current = false;
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
    }

    /// The program sends `COMMIT`.
    pub fn on_commit_request(&mut self) -> Pass {
        if self.frozen {
            return Pass::Hold;
        }
        let Some(m) = self.current.clone() else {
            return Pass::Forward;
        };
        // A message acked before the program's first COMMIT: the ack of an
        // ack-first (or autoAck) program, or a skip. Its transaction must
        // name whose it is, whether or not the next delivery came first.
        let acked_first =
            self.commits_first.is_none() && self.acked.contains(&m) && !self.event_ids.is_empty();
        if (acked_first || !self.deferred.is_empty()) && !self.named_current {
            let why = match self.deferred.front() {
                Some((next, ..)) => format!("the program acked {m} before its first COMMIT, then committed a transaction none of whose statements named the eventId of {m} or of {next}, delivered after it, as text"),
                None => format!("the program acked {m} before its first COMMIT, then committed a transaction none of whose statements named the eventId of {m} as text"),
            };
            self.unattributable(&m, why);
            return Pass::Hold;
        }
        self.commits += 1;
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
                self.say(Seen::Held {
                    message: m.clone(),
                    what: "commit",
                    commit: None,
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
        // The program acks a message the black box has not seen yet: the
        // ones before it were skipped.
        if let Some(k) = self.deferred.iter().position(|(d, ..)| *d == m) {
            self.skip_to(k);
            if self.frozen {
                return Pass::Hold;
            }
        }
        let is_target = |w: Window, me: &Self| matches!(&me.target, Some((tw, tm)) if *tw == w && *tm == m && !me.fired);
        if is_target(Window::AfterCommitBeforeAck, self) {
            if self.committed.contains(&m) {
                self.say(Seen::Held {
                    message: m.clone(),
                    what: "ack",
                    commit: None,
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
            // Acked with no transaction ended since its delivery, by a
            // program that commits before it acks: it skipped the message.
            let skipped =
                self.commits_first == Some(true) && std::mem::take(&mut self.awaiting_tx_end);
            if skipped {
                self.ended.insert(m.clone());
            }
            self.settle(&m);
            if skipped {
                self.next_delivery();
            }
        }
        if is_target(Window::AfterAck, self) && self.committed.contains(&m) {
            self.fire(m);
        }
        Pass::Forward
    }
}

impl Said<'_> {
    /// Whether it names `event`: never as part of a longer id (`evt-1`
    /// in `evt-10`) or an unquoted token (`2` in `$2`).
    fn names(&self, event: &[u8]) -> bool {
        let quoted = |text: &[u8], q: u8| {
            let mut lit = vec![q];
            lit.extend_from_slice(event);
            lit.push(q);
            text.windows(lit.len()).any(|w| w == lit)
        };
        match *self {
            _ if event.is_empty() => false,
            Said::Sql(sql) => quoted(sql, b'\''),
            Said::Value(v) => v == event || quoted(v, b'"'),
        }
    }
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
mod tests {
    use super::*;

    fn bb() -> (BlackBox, mpsc::UnboundedReceiver<Seen>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (BlackBox::new(tx), rx)
    }

    /// The program's COMMIT passes and is answered.
    fn commit(b: &mut BlackBox) {
        b.on_commit_request();
        b.on_commit_done(true);
        b.on_tx_end();
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
        b.arm(Window::AfterCommitBeforeAck, "mid-1", 1);
        assert_eq!(b.on_deliver("mid-1", false, false), Pass::Forward);
        assert_eq!(b.on_commit_request(), Pass::Forward);
        b.on_commit_done(true);
        assert_eq!(b.on_ack("mid-1"), Pass::Hold);
        assert!(b.frozen());
        assert_eq!(b.on_deliver("mid-2", false, false), Pass::Hold);
        let seen = drain(&mut rx);
        assert!(matches!(seen.last(), Some(Seen::Fire { message }) if message == "mid-1"));

        let (mut b, mut rx) = bb();
        b.arm(Window::BeforeCommit, "mid-1", 1);
        b.on_deliver("mid-1", false, false);
        assert_eq!(b.on_commit_request(), Pass::Hold);
        assert!(b.frozen());
        drain(&mut rx);

        // This program never acks before it commits.
        let (mut b, mut rx) = bb();
        b.arm(Window::AfterAckBeforeCommit, "mid-1", 1);
        b.on_deliver("mid-1", false, false);
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
        b.arm(Window::AfterAckBeforeCommit, "mid-1", 1);
        b.on_deliver("mid-1", false, false);
        assert_eq!(b.on_ack("mid-1"), Pass::Forward);
        assert_eq!(b.on_commit_request(), Pass::Hold);
        assert!(b.frozen());
        drain(&mut rx);

        let (mut b, mut rx) = bb();
        b.arm(Window::AfterCommitBeforeAck, "mid-1", 1);
        b.on_deliver("mid-1", false, false);
        assert_eq!(b.on_ack("mid-1"), Pass::Forward);
        assert!(drain(&mut rx)
            .iter()
            .any(|s| matches!(s, Seen::Unreachable { .. })));
    }

    #[test]
    fn on_deliver_and_after_ack() {
        let (mut b, _rx) = bb();
        b.arm(Window::OnDeliver, "mid-2", 1);
        b.on_deliver("mid-1", false, false);
        assert!(!b.frozen());
        b.on_deliver("mid-2", false, false);
        assert!(b.frozen());
        assert_eq!(b.on_commit_request(), Pass::Hold);

        let (mut b, _rx) = bb();
        b.arm(Window::AfterAck, "mid-1", 1);
        b.on_deliver("mid-1", false, false);
        b.on_commit_request();
        b.on_commit_done(true);
        assert!(!b.frozen());
        assert_eq!(b.on_ack("mid-1"), Pass::Forward);
        assert!(b.frozen());
    }

    /// Two transactions per message: `before-commit` with `commit = 2`
    /// holds the second, after the first passed; a program with one
    /// `COMMIT` never reaches it, said at the next delivery.
    #[test]
    fn the_kth_commit() {
        let (mut b, mut rx) = bb();
        b.arm(Window::BeforeCommit, "mid-1", 2);
        b.on_deliver("mid-1", false, false);
        assert_eq!(b.on_commit_request(), Pass::Forward);
        b.on_commit_done(true);
        b.on_tx_end();
        assert_eq!(b.on_commit_request(), Pass::Hold);
        assert!(b.frozen());
        assert!(drain(&mut rx).iter().any(|s| matches!(
            s,
            Seen::Held {
                commit: Some(2),
                ..
            }
        )));

        let (mut b, mut rx) = bb();
        b.arm(Window::BeforeCommit, "mid-1", 2);
        b.on_deliver("mid-1", false, false);
        commit(&mut b);
        b.on_ack("mid-1");
        b.on_deliver("mid-2", false, false);
        assert!(!b.frozen());
        assert!(drain(&mut rx)
            .iter()
            .any(|s| matches!(s, Seen::Unreachable { message, .. } if message == "mid-1")));
        assert_eq!(commit_window_name(2), "after-commit-1-before-commit-2");
    }

    /// autoAck: the delivery is the ack; a message settles when its
    /// transaction ends; there is no ack to hold.
    #[test]
    fn auto_ack() {
        let (mut b, mut rx) = bb();
        b.on_consume(true);
        b.on_deliver("mid-1", false, true);
        commit(&mut b);
        assert!(drain(&mut rx)
            .iter()
            .any(|s| matches!(s, Seen::Settled { message } if message == "mid-1")));

        let (mut b, mut rx) = bb();
        b.arm(Window::AfterCommitBeforeAck, "mid-1", 1);
        b.on_deliver("mid-1", false, true);
        assert!(drain(&mut rx)
            .iter()
            .any(|s| matches!(s, Seen::Unreachable { .. })));

        let (mut b, _rx) = bb();
        b.arm(Window::AfterAck, "mid-1", 1);
        b.on_deliver("mid-1", false, true);
        b.on_commit_request();
        b.on_commit_done(true);
        assert!(b.frozen());
    }

    /// A program that commits before it acks is done with a message at its
    /// ack: one acked with no transaction (skipped in memory) settles there
    /// and frees the next delivery. Before its order is known, it does not.
    #[test]
    fn a_skip_without_a_statement() {
        let (mut b, mut rx) = bb();
        b.on_deliver("mid-1", false, false);
        commit(&mut b);
        b.on_ack("mid-1");
        b.on_deliver("mid-2", false, false);
        assert!(!b.admit_delivery());
        b.on_ack("mid-2");
        assert!(b.admit_delivery());
        assert!(drain(&mut rx)
            .iter()
            .any(|s| matches!(s, Seen::Settled { message } if message == "mid-2")));

        let (mut b, _rx) = bb();
        b.on_deliver("mid-1", false, false);
        b.on_ack("mid-1");
        assert!(!b.admit_delivery());
        assert!(b.stuck().is_some());
    }

    fn knowing() -> (BlackBox, mpsc::UnboundedReceiver<Seen>) {
        let (mut b, rx) = bb();
        b.know(
            [("mid-1", "evt-1"), ("mid-2", "evt-2"), ("mid-3", "evt-3")]
                .into_iter()
                .map(|(m, e)| (m.to_string(), e.to_string()))
                .collect(),
        );
        (b, rx)
    }

    /// An eventId is named quoted in SQL, or as a parameter's whole value or
    /// a JSON string in it: never as part of another token.
    #[test]
    fn what_names_an_event() {
        assert!(Said::Sql(b"VALUES ('2', 1)").names(b"2"));
        assert!(!Said::Sql(b"VALUES ($2)").names(b"2"));
        assert!(!Said::Sql(b"VALUES ('evt-10')").names(b"evt-1"));
        assert!(Said::Value(b"evt-1").names(b"evt-1"));
        assert!(!Said::Value(b"evt-10").names(b"evt-1"));
        assert!(Said::Value(br#"{"eventId": "evt-1"}"#).names(b"evt-1"));
        assert!(!Said::Value(b"").names(b""));
    }

    /// Before the program's order is known, a message acked with no
    /// statement does not hold the next delivery: it is passed, deferred,
    /// and the next statement's eventId tells a skip (the deferred one's)...
    #[test]
    fn a_first_skip_is_told_by_the_next_statement() {
        let (mut b, mut rx) = knowing();
        b.arm(Window::OnDeliver, "mid-2", 1);
        b.on_deliver("mid-1", false, false);
        b.on_ack("mid-1");
        assert!(b.admit_delivery());
        b.on_deliver("mid-2", false, false);
        assert!(!b.frozen(), "deferred: not seen yet");
        assert!(!drain(&mut rx)
            .iter()
            .any(|s| matches!(s, Seen::Delivered { message, .. } if message == "mid-2")));
        b.on_statement(&[Said::Sql(b"BEGIN")]);
        b.on_statement(&[
            Said::Sql(b"INSERT INTO t VALUES ($1)"),
            Said::Value(b"evt-2x"),
        ]);
        assert!(!b.frozen(), "evt-2x is another id");
        b.on_statement(&[Said::Value(b"svc"), Said::Value(b"evt-2")]);
        let seen = drain(&mut rx);
        assert!(
            matches!(&seen[..], [Seen::Settled { message: a }, Seen::Delivered { message: b, .. }, Seen::Fire { .. }] if a == "mid-1" && b == "mid-2"),
            "{seen:?}"
        );
        assert!(b.frozen());
    }

    /// ...or an ack-first program (the acked one's): the deferred delivery
    /// is seen when that transaction ends, as if it had been held.
    #[test]
    fn an_ack_first_program_is_told_by_its_statement() {
        let (mut b, mut rx) = knowing();
        b.on_deliver("mid-1", false, false);
        b.on_ack("mid-1");
        assert!(b.admit_delivery());
        b.on_deliver("mid-2", false, false);
        b.on_statement(&[Said::Sql(b"INSERT INTO t VALUES ('evt-1')")]);
        assert_eq!(b.on_commit_request(), Pass::Forward);
        b.on_commit_done(true);
        assert!(!drain(&mut rx)
            .iter()
            .any(|s| matches!(s, Seen::Delivered { message, .. } if message == "mid-2")));
        b.on_tx_end();
        let seen = drain(&mut rx);
        assert!(
            matches!(&seen[..], [Seen::Settled { message: a }, Seen::Delivered { message: b, .. }] if a == "mid-1" && b == "mid-2"),
            "{seen:?}"
        );
        // Its order is known now: the next delivery waits for mid-2's end.
        b.on_ack("mid-2");
        assert!(!b.admit_delivery());

        // A skipped message acked in turn: the one before settles first.
        let (mut b, mut rx) = knowing();
        b.on_deliver("mid-1", false, false);
        b.on_ack("mid-1");
        assert!(b.admit_delivery());
        b.on_deliver("mid-2", false, false);
        b.on_ack("mid-2");
        let seen = drain(&mut rx);
        assert!(
            matches!(&seen[..], [Seen::Delivered { .. }, Seen::Acked { .. }, Seen::Settled { message: a }, Seen::Delivered { message: b, .. }, Seen::Acked { .. }] if a == "mid-1" && b == "mid-2"),
            "{seen:?}"
        );

        // A resend (`mid-1.2`) is named by its original's eventId.
        let (mut b, mut rx) = knowing();
        b.on_deliver("mid-1.2", false, false);
        b.on_ack("mid-1.2");
        assert!(b.admit_delivery());
        b.on_deliver("mid-2", false, false);
        b.on_statement(&[Said::Value(b"evt-1")]);
        b.on_commit_request();
        b.on_commit_done(true);
        b.on_tx_end();
        assert!(drain(&mut rx)
            .iter()
            .any(|s| matches!(s, Seen::Committed { message } if message == "mid-1.2")));

        // Whether or not the next delivery came first, an ack-first
        // program's first transaction must name its message: the same
        // error on both paths, never a pass on one and an error on the other.
        let (mut b, mut rx) = knowing();
        b.on_deliver("mid-1", false, false);
        b.on_ack("mid-1");
        b.on_statement(&[
            Said::Sql(b"INSERT INTO t VALUES ($1)"),
            Said::Value(&[1, 2, 3]),
        ]);
        assert!(!b.admit_delivery(), "a statement came first: held");
        assert_eq!(b.on_commit_request(), Pass::Hold);
        assert!(drain(&mut rx)
            .iter()
            .any(|s| matches!(s, Seen::Unattributable { .. })));

        // A program that acks mid-2 before a statement of mid-1 comes (it
        // works on more than one message at a time): an error, not a skip.
        let (mut b, mut rx) = knowing();
        b.on_deliver("mid-1", false, false);
        b.on_ack("mid-1");
        assert!(b.admit_delivery());
        b.on_deliver("mid-2", false, false);
        b.on_ack("mid-2");
        b.on_statement(&[Said::Value(b"evt-1")]);
        assert!(b.frozen());
        assert!(drain(&mut rx)
            .iter()
            .any(|s| matches!(s, Seen::Unattributable { message, .. } if message == "mid-2")));

        // A copy of the same event after it (a resend): the current one's.
        let (mut b, mut rx) = knowing();
        b.on_deliver("mid-1", false, true);
        assert!(b.admit_delivery());
        b.on_deliver("mid-1.2", false, true);
        b.on_statement(&[Said::Value(b"evt-1")]);
        assert_eq!(b.on_commit_request(), Pass::Forward);
        b.on_commit_done(true);
        b.on_tx_end();
        let seen = drain(&mut rx);
        assert!(
            !seen
                .iter()
                .any(|s| matches!(s, Seen::Unattributable { .. })),
            "{seen:?}"
        );
        assert!(seen
            .iter()
            .any(|s| matches!(s, Seen::Committed { message } if message == "mid-1")));

        // A statement naming two events: an error.
        let (mut b, mut rx) = knowing();
        b.on_deliver("mid-1", false, false);
        b.on_ack("mid-1");
        assert!(b.admit_delivery());
        b.on_deliver("mid-2", false, false);
        b.on_statement(&[Said::Value(b"evt-1"), Said::Value(b"evt-2")]);
        assert!(drain(&mut rx)
            .iter()
            .any(|s| matches!(s, Seen::Unattributable { .. })));

        // A COMMIT none of whose statements names either: a failure.
        let (mut b, mut rx) = knowing();
        b.on_deliver("mid-1", false, false);
        b.on_ack("mid-1");
        assert!(b.admit_delivery());
        b.on_deliver("mid-2", false, false);
        b.on_statement(&[Said::Sql(b"UPDATE counters SET n = n + 1")]);
        assert_eq!(b.on_commit_request(), Pass::Hold);
        assert!(drain(&mut rx)
            .iter()
            .any(|s| matches!(s, Seen::Unattributable { .. })));
    }
}
