//! A cluster node killed at the producer's window (`node = N` on a publish
//! step): the proxy holds the message's confirm (the broker has it,
//! replicated), and once the producer's lines for the messages before it
//! are in, the node dies. New connections wait at the proxy's gate until
//! every quorum queue has a leader elsewhere; the producer, its connection
//! broken, connects again (to a live node) and sends the message again,
//! then the rest. The node stays down (restored after the lab). The node
//! faults between steps (kill, restart, partition, heal) are the runner's
//! broker steps.

use anyhow::{bail, Context, Result};

use super::proxy::{ProxyEvent, Rule};
use super::Stage;
use crate::lab::{Fault, Publish};
use crate::transcript::Record;
use crate::vocab::{Role, Status, Target};

/// A publish step's node kill at `after-publish-before-confirm`.
pub async fn kill_on_publish(s: &mut impl Stage, p: &Publish, f: &Fault) -> Result<()> {
    let node = f.node.context("a node fault names its node")?;
    s.env()?;
    s.proxy().arm(Rule::HoldConfirm {
        message: f.message.clone(),
    });
    s.start_producer(true)?;
    // The producer sends one message at a time: when the confirm before
    // the held one is logged, everything it logs until the kill is in.
    if let Some(before) = p.message_before(&f.message) {
        s.producer_until(&before, Status::Confirmed).await?;
    }
    match s.proxy_event().await {
        Ok(ProxyEvent::Held { message }) if message == f.message => {}
        other => bail!(
            "the proxy never held the confirm of {} ({other:?})",
            f.message
        ),
    }
    let line = Record::new(s.lab())
        .with("target", Target::Node)
        .with("node", node)
        .with("action", f.action)
        .with("window", f.window)
        .with("messageId", &f.message)
        .status(Status::Injected);
    s.say(Role::Fault, &line);
    s.proxy().hold_new();
    // Marked before the environment acts: a kill that fails half way
    // still leaves the node to be restored after the lab.
    s.node_down(node);
    s.env()?.kill_node(node).await?;
    // Its connection broke: the producer says so about the held message.
    s.producer_until(&f.message, Status::ConnectionLost).await?;
    let deadline = s.deadline();
    let vhost = s.vhost().to_string();
    for q in s.quorum_queues() {
        s.env()?.await_leader(node, &vhost, &q, deadline).await?;
    }
    s.reconnect_harness().await?;
    s.proxy().release();
    s.finish_producer().await
}
