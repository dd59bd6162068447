//! The black box on literal sequences of a program's effects.

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
    assert!(b.holds_next_delivery());
    b.on_ack("mid-2");
    assert!(!b.holds_next_delivery());
    assert!(drain(&mut rx)
        .iter()
        .any(|s| matches!(s, Seen::Settled { message } if message == "mid-2")));

    let (mut b, _rx) = bb();
    b.on_deliver("mid-1", false, false);
    b.on_ack("mid-1");
    assert!(b.holds_next_delivery());
    assert!(b.stuck().is_some());

    // Declared to commit before it acks: followed from its first message.
    let (mut b, mut rx) = bb();
    b.declare_commits_first();
    b.on_deliver("mid-1", false, false);
    b.on_ack("mid-1");
    assert!(!b.holds_next_delivery());
    assert!(b.stuck().is_none());
    assert!(drain(&mut rx)
        .iter()
        .any(|s| matches!(s, Seen::Settled { message } if message == "mid-1")));
}

fn contradicted(rx: &mut mpsc::UnboundedReceiver<Seen>, m: &str) -> bool {
    drain(rx)
        .iter()
        .any(|s| matches!(s, Seen::Contradicts { message } if message == m))
}

/// A declared order the program does not keep is an error at the COMMIT
/// that shows it: never followed on a wrong premise.
#[test]
fn a_declared_order_is_checked_at_each_commit() {
    let (mut b, mut rx) = bb();
    b.declare_commits_first();
    b.on_deliver("mid-1", false, false);
    commit(&mut b);
    b.on_ack("mid-1");
    b.on_deliver("mid-2", false, false);
    b.on_ack("mid-2");
    assert_eq!(b.on_commit_request(), Pass::Hold);
    assert!(b.frozen());
    assert!(contradicted(&mut rx, "mid-2"));

    // An ack-first program's statement after its ack, before the next
    // delivery: the ack was no skip.
    let (mut b, mut rx) = bb();
    b.declare_commits_first();
    b.on_deliver("mid-1", false, false);
    b.on_ack("mid-1");
    b.on_statement();
    assert!(b.frozen());
    assert!(contradicted(&mut rx, "mid-1"));

    // An autoAck program acks every message as it is sent.
    let (mut b, mut rx) = bb();
    b.declare_commits_first();
    b.on_deliver("mid-1", false, true);
    assert_eq!(b.on_commit_request(), Pass::Hold);
    assert!(contradicted(&mut rx, "mid-1"));
}

fn settled(seen: &[Seen]) -> Vec<&str> {
    seen.iter()
        .filter_map(|s| match s {
            Seen::Settled { message } => Some(message.as_str()),
            _ => None,
        })
        .collect()
}

/// Two messages, each committed in turn, then one ack with `multiple`
/// (the proxy gives `on_acks` every message it covers, in delivery
/// order): both settle; held at either one's `after-commit-before-ack`,
/// none of the batch is acked.
#[test]
fn a_batch_acked_together() {
    let batch = |b: &mut BlackBox| {
        for m in ["mid-1", "mid-2"] {
            b.on_deliver(m, false, false);
            b.on_statement();
            b.on_ready(1, true);
            commit(b);
        }
    };
    let (mut b, mut rx) = bb();
    batch(&mut b);
    let both = ["mid-1".to_string(), "mid-2".to_string()];
    assert_eq!(b.on_acks(&both), Pass::Forward);
    assert_eq!(settled(&drain(&mut rx)), ["mid-1", "mid-2"]);

    let (mut b, mut rx) = bb();
    b.arm(Window::AfterCommitBeforeAck, "mid-1", 1);
    batch(&mut b);
    assert_eq!(b.on_ack("mid-1"), Pass::Hold);
    assert!(b.frozen());
    assert!(matches!(drain(&mut rx).last(), Some(Seen::Fire { message }) if message == "mid-1"));
}

/// A batch acked before its last COMMIT: the ack of the current message
/// comes after its statements, so it is no skip. The next delivery
/// waits for its transaction, `after-ack-before-commit` holds its
/// COMMIT, and `after-commit-before-ack` is said unreachable.
#[test]
fn a_batch_acked_before_its_last_commit() {
    let acked_early = |b: &mut BlackBox| {
        b.on_deliver("mid-1", false, false);
        b.on_statement();
        b.on_ready(1, true);
        commit(b);
        b.on_deliver("mid-2", false, false);
        b.on_statement();
        b.on_ready(1, true);
        b.on_acks(&["mid-1".to_string(), "mid-2".to_string()]);
    };
    let (mut b, mut rx) = bb();
    b.arm(Window::AfterAckBeforeCommit, "mid-2", 1);
    acked_early(&mut b);
    assert!(b.holds_next_delivery());
    assert_eq!(b.on_commit_request(), Pass::Hold);
    assert!(b.frozen());
    assert_eq!(settled(&drain(&mut rx)), ["mid-1"]);

    let (mut b, mut rx) = bb();
    b.arm(Window::AfterCommitBeforeAck, "mid-2", 1);
    acked_early(&mut b);
    assert!(drain(&mut rx).iter().any(|s| matches!(
        s,
        Seen::Unreachable { message, why } if message == "mid-2" && why == "it acks before it commits"
    )));
}

/// A read outside a transaction (autocommit: ReadyForQuery says idle)
/// leaves an ack with no COMMIT a skip: the next delivery is freed.
#[test]
fn a_read_outside_a_transaction_is_no_transaction() {
    let (mut b, mut rx) = bb();
    b.on_deliver("mid-1", false, false);
    commit(&mut b);
    b.on_ack("mid-1");
    b.on_deliver("mid-2", false, false);
    b.on_statement();
    b.on_ready(1, false);
    b.on_ack("mid-2");
    assert!(!b.holds_next_delivery());
    assert_eq!(settled(&drain(&mut rx)), ["mid-1", "mid-2"]);
}

/// Another database connection's answers (a pool's ping, a read in
/// autocommit) do not close the transaction open on the first: an ack then
/// is still an ack before its COMMIT, and the next delivery waits.
#[test]
fn a_transaction_open_on_one_of_two_connections() {
    let (mut b, _rx) = bb();
    b.on_deliver("mid-1", false, false);
    commit(&mut b);
    b.on_ack("mid-1");
    b.on_deliver("mid-2", false, false);
    b.on_statement();
    b.on_ready(1, true);
    b.on_ready(2, false);
    b.on_ack("mid-2");
    assert!(b.holds_next_delivery());
    assert!(b.stuck().is_some());
    // The first connection closes: nothing is open any more.
    b.db_connection_closed(1);
    assert!(b.stuck().is_none());
}

/// A delivery held by one AMQP connection is released to the waiting
/// PostgreSQL proxy when it passes or when that connection ends, not when
/// another connection ends.
#[test]
fn a_held_delivery_is_waited_for_per_connection() {
    let (mut b, _rx) = bb();
    b.hold_delivery(7);
    let (seen, rx) = b.deliveries().expect("held");
    b.delivery_gone(8);
    assert_eq!(*rx.borrow(), seen);
    assert!(b.deliveries().is_some());
    b.delivery_gone(7);
    assert!(*rx.borrow() > seen);
    assert!(b.deliveries().is_none());
}
