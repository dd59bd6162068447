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
    let Some(point) = selected(faults, window, meta).filter(|p| !p.cut) else {
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

/// At a window where the harness cuts the role's connection
/// ([`FaultPoint::cut`]): the same round trip as [`reach`]'s, which the
/// proxy drops as it closes the connection. The role learns of the loss
/// here, whatever it holds open (a consumer: its transaction), and gets
/// the error to abandon it with, as a handler cancelled with its
/// connection would. A round trip that succeeds was not cut: the role goes
/// on, and the run fails on the fault it never saw.
pub async fn cut<B, E>(
    faults: &[FaultPoint],
    window: Window,
    meta: &MessageMeta,
    barrier: B,
) -> Result<(), String>
where
    B: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    match selected(faults, window, meta) {
        Some(p) if p.cut => barrier.await.map_err(|e| e.to_string()),
        _ => Ok(()),
    }
}

/// The point the lab selected at this window for this message, if any.
fn selected<'f>(
    faults: &'f [FaultPoint],
    window: Window,
    meta: &MessageMeta,
) -> Option<&'f FaultPoint> {
    faults
        .iter()
        .find(|f| f.window == window && f.message == meta.message_id)
}
