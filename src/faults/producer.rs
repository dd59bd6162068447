//! The producer killed at its window (SIGKILL after the publish, before or
//! after the confirm): the runner then starts a new producer on the same
//! journal, which sends again what it never saw confirmed.

use anyhow::Result;

use super::Stage;
use crate::lab::Fault;

/// The publish step's producer, stopped at `f`'s window for its message and
/// killed there; the fault's assertions are read next, before the new
/// producer runs.
pub async fn kill_on_publish(s: &mut impl Stage, f: &Fault) -> Result<()> {
    s.start_producer_at(f)?;
    s.kill_producer_at_window(f).await
}
