//! The role side of a fault: named windows on a role's path. Every role calls
//! [`reach`] at each window it passes; only the window the lab selected for
//! that message stops (for good, to be killed; or, at a rendezvous, until
//! the harness continues it).

use std::future::Future;

use crate::protocol::FaultPoint;
use crate::transcript::{emit, MessageMeta, Record};
use crate::vocab::{Status, Window};

/// At the selected window: first a synchronous round trip on the role's
/// channel (`barrier`; the broker handles a channel's frames in order, so
/// whatever the role sent before, an ack or a publish, has been processed
/// when the marker appears, and a kill cannot race a frame still in a socket
/// buffer), then the marker line, then block until the harness kills the
/// process, exactly as a crashed one would die.
pub async fn reach<B, E>(
    faults: &[FaultPoint],
    window: Window,
    meta: &MessageMeta,
    line: Record,
    barrier: B,
) where
    B: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let Some(point) = faults
        .iter()
        .find(|f| f.window == window && f.message == meta.message_id)
    else {
        return;
    };
    if let Err(e) = barrier.await {
        tracing::warn!("window barrier failed: {e}");
    }
    if point.hold {
        // A rendezvous: stopped here, with the transaction as it is, until
        // the harness continues the process (SIGCONT); then on as if
        // nothing happened.
        emit(line.status(Status::AtRendezvous));
        if let Err(e) = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP) {
            tracing::warn!("cannot stop at the rendezvous: {e}");
        }
        return;
    }
    emit(line.status(Status::CrashInjected));
    std::future::pending::<()>().await;
}
