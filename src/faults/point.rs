//! The role side of a fault: named windows on a role's path. Every role calls
//! [`reach`] at each window it passes; only the window the lab selected for
//! that message stops.

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
    if !faults
        .iter()
        .any(|f| f.window == window && f.message == meta.message_id)
    {
        return;
    }
    if let Err(e) = barrier.await {
        tracing::warn!("window barrier failed: {e}");
    }
    emit(line.status(Status::CrashInjected));
    std::future::pending::<()>().await;
}
