//! The consumer's machine fails at its window: the consumer, stopped
//! there, is SIGKILLed, then its PostgreSQL (the run's own) by a SIGKILL
//! of every process of it, or by a power loss (its file system, the lazy
//! one, frozen first, what was never made durable dropped). The broker,
//! on another machine, stays up: what the consumer acked stays acked.
//! The database starts again on its data; the runner then starts a fresh
//! consumer, which gets what the dead one never acked.

use anyhow::Result;

use super::ConsumeStage;
use crate::lab::Fault;
use crate::transcript::FaultEvent;
use crate::vocab::{DatabaseFault, Target};

/// The consume step's consumer stopped at `f`'s window and killed, then
/// its database by `fault`, then started again.
pub async fn on_consume(s: &mut impl ConsumeStage, f: &Fault, fault: DatabaseFault) -> Result<()> {
    s.start_consumer_at(f)?;
    s.consumer_at_window(f).await?;
    let said = FaultEvent::injected(Target::Database, f.action).at(f.window, &f.message);
    s.say(&said);
    // Killed first, as the consumer kill does (reading what the database
    // holds for the message at that moment); stopped at its window, it
    // writes nothing until the database goes.
    s.kill_consumer(f).await?;
    s.database_fault(fault).await?;
    s.say(&said.healed());
    Ok(())
}
