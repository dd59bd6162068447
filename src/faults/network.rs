//! The network between the producer and the broker, as the harness's
//! proxy shapes it: a publish dropped and its connection cut, the broker's
//! confirm held back, or a consumer's ack dropped and its connection cut.

use anyhow::Result;

use super::proxy::Rule;
use super::{Run, Stage};
use crate::failure::Failure;
use crate::lab::Fault;

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

/// The proxy drops the consumer's ack of `f`'s message and cuts the
/// connection: the same process connects again (the runner starts it with
/// `reconnect`) and gets the message redelivered. The fault's assertions
/// wait for it.
pub fn cut_ack(r: &impl Run, f: &Fault) {
    r.proxy().arm(Rule::CutOnAck {
        message: f.message.clone(),
    });
}
