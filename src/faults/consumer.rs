//! The built-in consumer killed at its window (SIGKILL after a step of its
//! pattern, before the next: after the business commit, before the ack),
//! optionally once its queue holds a given depth; the runner then starts a
//! new consumer, which gets what the dead one never acked.

use anyhow::Result;

use super::ConsumeStage;
use crate::lab::Fault;

/// The consume step's consumer, stopped at `f`'s window for its message
/// (and, with `kill_at_depth`, held there until the queue holds that
/// many), then killed; the fault's assertions are read next.
pub async fn kill_on_consume(s: &mut impl ConsumeStage, f: &Fault) -> Result<()> {
    s.start_consumer_at(f)?;
    s.consumer_at_window(f).await?;
    if let Some(depth) = f.kill_at_depth {
        s.await_depth(depth).await?;
    }
    s.kill_consumer(f).await
}
