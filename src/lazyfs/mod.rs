//! A lazy file system: a FUSE pass-through over a backing directory that
//! remembers what was written and never made durable, so that a simulated
//! power loss can drop exactly that. A SIGKILL loses nothing the kernel
//! already holds; this shows what an unsynced write costs.
//!
//! A leaf: it imports nothing else from the crate.

pub mod model;
pub mod plan;
#[cfg(test)]
mod tests;

pub use model::DirModel;
pub use plan::{Lost, Undone};
