//! The network between the producer and the broker, as the harness's
//! proxy shapes it: a publish dropped and its connection cut, the broker's
//! confirm held back, or a consumer's connection cut (with its ack, or
//! while its transaction is open).

use anyhow::Result;

use super::proxy::Rule;
use super::{Run, Stage};
use crate::failure::Failure;
use crate::lab::Fault;
use crate::protocol::{ConsumerConfig, FaultPoint};
use crate::vocab::Window;

/// The proxy drops `f`'s publish and cuts the connection: the producer
/// fails waiting for its confirm (a new one, started by the runner,
/// resumes from the journal). The fault's assertions wait for that one.
pub async fn cut_publish(s: &mut impl Stage, f: &Fault, phase: &str) -> Result<()> {
    s.proxy().arm(Rule::CutOnPublish {
        message: f.message.clone(),
    });
    s.start_producer(false)?;
    if s.producer_exit().await? == 0 {
        // The publish never left (a reconciliation with nothing to send):
        // the window was not reached, no verdict.
        return Err(Failure::unreachable(format!(
            "phase {phase}: the producer finished; its publish of {} was never cut",
            f.message
        )));
    }
    s.proxy_effect().await?;
    s.proxy().release();
    Ok(())
}

/// The proxy holds the broker's confirm of `f`'s message: the producer the
/// runner starts times out and sends again. The fault's assertions wait
/// for it.
pub fn hold_confirm(r: &impl Run, f: &Fault) {
    r.proxy().arm(Rule::HoldConfirm {
        message: f.message.clone(),
    });
}

/// The proxy cuts the consumer's connection at `f`'s window: at
/// `after-commit-before-ack` it drops the ack of `f`'s message with it; at
/// `before-commit` the consumer's round trip on its channel there (the
/// consumer is told to make one, [`FaultPoint::cut`]), so that it learns
/// of the loss with its transaction open and abandons the delivery. Either
/// way the same process connects again (`reconnect`) and gets the message
/// redelivered. The fault's assertions wait for it.
pub fn cut_consumer(r: &impl Run, f: &Fault, cfg: &mut ConsumerConfig) -> Result<()> {
    let (rule, point) = consumer_cut(f)?;
    cfg.faults.extend(point);
    r.proxy().arm(rule);
    cfg.reconnect = true;
    Ok(())
}

/// The proxy's rule for a consumer cut at `f`'s window, and the point where
/// the consumer makes the round trip the proxy drops (before its COMMIT).
pub fn consumer_cut(f: &Fault) -> Result<(Rule, Option<FaultPoint>)> {
    let message = f.message.clone();
    match f.window {
        Window::BeforeCommit => Ok((
            Rule::CutOnBarrier {
                message: message.clone(),
            },
            Some(FaultPoint {
                window: f.window,
                message,
                hold: false,
                cut: true,
            }),
        )),
        Window::AfterCommitBeforeAck => Ok((Rule::CutOnAck { message }, None)),
        // The placement's two windows are all the lab checker admits.
        w => anyhow::bail!("a consumer's connection cut at {w}: no placement has that window"),
    }
}
