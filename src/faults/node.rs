//! A cluster node killed at the producer's window (`node = N` on a publish
//! step): the proxy holds the message's confirm (the broker has it,
//! replicated), and once the producer's lines for the messages before it
//! are in, the node dies. New connections wait at the proxy's gate until
//! every quorum queue has a leader elsewhere; the producer, its connection
//! broken, connects again (to a live node) and sends the message again,
//! then the rest. The node stays down (restored after the lab). Between
//! steps ([`between`]): a node killed, restarted, cut off or healed.

use anyhow::{bail, Context, Result};

use super::proxy::{ProxyEvent, Rule};
use super::{Run, Stage};
use crate::lab::{Fault, Publish};
use crate::transcript::FaultEvent;
use crate::vocab::{FaultAction, NodeFault, Status, Target};

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
    s.say(
        &FaultEvent::injected(Target::Node, f.action)
            .on_node(node)
            .at(f.window, &f.message),
    );
    s.proxy().hold_new();
    // Marked before the environment acts: a kill that fails half way
    // still leaves the node to be restored after the lab.
    s.node_down(node, true);
    s.env()?.kill_node(node).await?;
    // Its connection broke: the producer says so about the held message.
    s.producer_until(&f.message, Status::ConnectionLost).await?;
    let deadline = s.deadline();
    leaders_elsewhere(s, node, deadline).await?;
    s.reconnect_harness(false).await?;
    s.proxy().release();
    s.finish_producer().await
}

/// A cluster node's fault between steps. The harness moves its own
/// connection to a node that is up and in the majority; the queues are
/// not declared again (a classic queue whose node is down cannot be).
#[deny(
    clippy::wildcard_enum_match_arm,
    clippy::match_wildcard_for_single_variants
)] // a kind without its hook must not compile
pub async fn between(
    r: &mut impl Run,
    node: usize,
    action: FaultAction,
    fault: NodeFault,
) -> Result<()> {
    let said = FaultEvent::injected(Target::Node, action).on_node(node);
    r.env()?;
    r.say(&said);
    // Marked before the environment acts: a step that fails half way
    // still leaves the node to be restored after the lab.
    match fault {
        NodeFault::Kill => {
            r.node_down(node, true);
            r.env()?.kill_node(node).await?;
        }
        NodeFault::Restart => {
            r.env()?.restart_node(node).await?;
            r.node_down(node, false);
        }
        NodeFault::Partition => {
            r.node_cut(Some(node));
            r.env()?.partition(node).await?;
        }
        NodeFault::Heal => {
            // Every cut ends, whichever node the step names.
            r.env()?.heal().await?;
            r.node_cut(None);
        }
    }
    // A node gone or cut off may have led a quorum queue: the next step's
    // consumer subscribes once another node leads it, not while the
    // others elect one (it gives up a consume unanswered for 10 s).
    if matches!(fault, NodeFault::Kill | NodeFault::Partition) {
        leaders_elsewhere(r, node, std::time::Instant::now() + LEADER_WAIT).await?;
    }
    r.reconnect_harness(false).await?;
    if matches!(fault, NodeFault::Restart | NodeFault::Heal) {
        r.say(&said.healed());
    }
    Ok(())
}

/// Each quorum queue the lab declared so far has a leader on a node other
/// than `node` (gone or cut off), by `deadline`.
async fn leaders_elsewhere(
    r: &mut impl Run,
    node: usize,
    deadline: std::time::Instant,
) -> Result<()> {
    let vhost = r.vhost().to_string();
    for q in r.quorum_queues() {
        r.env()?.await_leader(node, &vhost, &q, deadline).await?;
    }
    Ok(())
}

/// How long the quorum queues of a cluster may take to have a leader on
/// another node after a node's kill or cut between steps.
const LEADER_WAIT: std::time::Duration = std::time::Duration::from_secs(60);
