//! A lazy file system: a FUSE pass-through over a backing directory that
//! remembers what was written and never made durable, so that a simulated
//! power loss drops exactly that. A SIGKILL loses nothing the kernel
//! already holds; a power loss shows what an unsynced write costs.
//!
//! - [`model`]: the names as they are and as they were last made durable,
//!   and each file's undo records; which sync makes a name durable is a
//!   [`DirModel`]. Pure.
//! - [`plan`]: a power loss computed from the model (steps and a report).
//! - the adapter (`fs`, `shared`, `data`, `names`, `hold`, over fuser)
//!   feeds the model; [`LazyFs::mount`] returns the [`Mount`] a harness
//!   drives: [`Mount::hold_next_fsync`], [`Mount::freeze`],
//!   [`Mount::power_loss`].
//!
//! A leaf: it imports nothing else from the crate.

mod apply;
mod cleanup;
mod data;
mod fs;
mod hold;
pub mod model;
mod mount;
mod names;
pub mod plan;
mod shared;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

pub use cleanup::{detach_fuse_mounts_under, fuse_mounts_under};
pub use hold::Hold;
pub use model::DirModel;
pub use mount::{LazyFs, Mount, PowerLoss};
pub use plan::{Lost, Undone};

/// Why the lazy file system could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no FUSE device: `/dev/fuse` is missing (hint: `modprobe fuse`; a container needs `--device /dev/fuse`)")]
    NoFuse,
    #[error("reading the backing directory `{}`: {source}", path.display())]
    Backing {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("mounting the lazy file system on `{}`: {source}", mountpoint.display())]
    Mount {
        mountpoint: PathBuf,
        source: std::io::Error,
    },
    #[error("power loss: undoing `{}` in `{}`: {source}", path.display(), backing.display())]
    Undo {
        backing: PathBuf,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("unmounting `{}`: {source}", mountpoint.display())]
    Unmount {
        mountpoint: PathBuf,
        source: std::io::Error,
    },
    #[error("`{}` is detached, but a file opened on it is still open (hint: kill the servers using it first)", mountpoint.display())]
    Busy { mountpoint: PathBuf },
    /// A power loss was done (`lost`, as [`PowerLoss`] reports it), but
    /// the unmount after it failed.
    #[error("power loss done ({} paths undone), then {unmount}", lost.len())]
    Unmounted {
        lost: Vec<Lost>,
        unmount: Box<Error>,
    },
    #[error("the fsync of `{}` was never held: the file system was frozen or unmounted first", suffix.display())]
    NotHeld { suffix: PathBuf },
}
