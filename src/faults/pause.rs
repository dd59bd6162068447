//! Broker pause: the broker stops answering while a publish waits for its
//! confirm (a stall: a garbage collection, a disk that does not return;
//! here SIGSTOP, `docker pause` in containers), and answers again later.
//! It shows article 002's "超时 … 不能推出服务端没做": the producer's
//! confirm timeout says "unknown", not "failed". The broker had the
//! message; the producer sends it again, and once the broker resumes it
//! holds both copies, so the consumer must skip one.
//!
//! The sequence, each step awaited (no sleep): the proxy holds the
//! message's confirm (the broker has the message: it confirmed it), the
//! broker is paused, the producer logs `confirm_timeout` and sends the
//! message again into the paused broker, the broker resumes and confirms
//! the copy. The held confirm is never passed on: a stalled broker's
//! confirm that comes after the producer gave up changes nothing it does.
//! The broker is resumed however the wait ended.

use anyhow::{bail, Result};

use super::proxy::{ProxyEvent, Rule};
use super::Stage;
use crate::lab::{Fault, Publish};
use crate::transcript::FaultEvent;
use crate::vocab::{FaultAction, Status, Target};

/// A publish step's broker pause at `after-publish-before-confirm`.
pub async fn on_publish(s: &mut impl Stage, p: &Publish, f: &Fault) -> Result<()> {
    s.proxy().arm(Rule::HoldConfirm {
        message: f.message.clone(),
    });
    s.start_producer(false)?;
    // The producer sends one message at a time: once the confirm before
    // the held one is logged, everything it logs before the pause is in.
    if let Some(before) = p.message_before(&f.message) {
        s.producer_until(&before, Status::Confirmed).await?;
    }
    match s.proxy_event().await? {
        ProxyEvent::Held { message } if message == f.message => {}
        other => bail!(
            "the proxy held no confirm of {} before the pause ({other:?})",
            f.message
        ),
    }
    let fault = FaultEvent::injected(Target::Broker, FaultAction::Pause).at(f.window, &f.message);
    s.say(&fault);
    // Marked before the signal: the runner resumes a broker left paused
    // after the lab, however it ended (an error, a dropped run).
    s.broker_paused(true);
    let paused = s.env()?.pause_broker().await;
    let timed_out = match paused {
        Ok(()) => s.producer_until(&f.message, Status::ConfirmTimeout).await,
        Err(e) => Err(e),
    };
    // Resumed whatever happened: the next step (and the next lab) needs it.
    let resumed = s.env()?.resume_broker().await;
    if resumed.is_ok() {
        s.broker_paused(false);
    }
    timed_out?;
    resumed?;
    s.say(&fault.healed());
    s.finish_producer().await
}
