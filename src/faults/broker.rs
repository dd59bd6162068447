//! Broker restart, a step of its own: the broker is killed (SIGKILL) and
//! started again on the same data. The harness connects again and declares
//! the lab's topology, as an application does when it connects.

use anyhow::Result;

use super::Run;
use crate::transcript::Record;
use crate::vocab::{FaultAction, Role, Status, Target};

/// The broker's fault between two steps.
pub async fn between(r: &mut impl Run, action: FaultAction) -> Result<()> {
    let line = |lab: &str, status| {
        Record::new(lab)
            .with("target", Target::Broker)
            .with("action", action)
            .status(status)
    };
    r.say(Role::Fault, &line(r.lab(), Status::Injected));
    r.env()?.restart_broker().await?;
    r.reconnect_harness(true).await?;
    r.say(Role::Fault, &line(r.lab(), Status::Healed));
    Ok(())
}
