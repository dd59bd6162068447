//! Broker restart, a step of its own: the broker is killed (SIGKILL) and
//! started again on the same data. The harness connects again and declares
//! the lab's topology, as an application does when it connects.

use anyhow::Result;

use super::Harness;
use crate::env::Environment;
use crate::transcript::FaultEvent;
use crate::vocab::{FaultAction, Target};

/// Before any restart, once the topology is declared: its declaration on
/// disk (on `node`, the harness's), since a restart that came before the
/// broker logged it could lose the queues. The runner calls it after each
/// declaration of a lab with a broker fault, `soak` before its restarts.
pub async fn declared(env: &dyn Environment, node: usize) -> Result<()> {
    env.sync_metadata(node).await
}

/// The broker's fault between two steps (or, in `soak`, mid-stream): killed
/// and started on the same data, the harness connected again and the
/// topology declared again.
pub async fn between(r: &mut impl Harness, action: FaultAction) -> Result<()> {
    let fault = FaultEvent::injected(Target::Broker, action);
    r.say(&fault);
    r.env()?.restart_broker().await?;
    r.reconnect_harness(true).await?;
    r.say(&fault.healed());
    Ok(())
}
