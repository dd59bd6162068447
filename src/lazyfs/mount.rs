//! The control API the harness uses in-process: mount, hold an fsync,
//! freeze, lose power, unmount.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use fuser::{BackgroundSession, Config, MountOption, Session, SessionACL};
use nix::mount::{umount2, MntFlags};

use super::apply;
use super::fs::Fs;
use super::hold::Hold;
use super::model::{DirModel, Model};
use super::plan::Lost;
use super::shared::Shared;
use super::Error;

/// How long an unmount waits for the file system's threads once the mount
/// is detached. They end at once unless a file on the mount is still open
/// (the kernel keeps the file system until the last one closes): the
/// servers are meant to be dead by then.
const PATIENCE: Duration = Duration::from_secs(10);

/// Worker threads: a held fsync blocks one, and the servers go on with
/// the others.
const THREADS: usize = 4;

/// The lazy file system.
pub struct LazyFs;

impl LazyFs {
    /// Serves `backing` at `mountpoint`. Everything on `backing` now is
    /// durable. Mounted with `allow_other` (a server runs as its own user)
    /// and `default_permissions` (the kernel checks modes and owners, which
    /// pass through: PostgreSQL finds its data directory 0700 and its own).
    pub fn mount(backing: &Path, mountpoint: &Path, dirs: DirModel) -> Result<Mount, Error> {
        if !Path::new("/dev/fuse").exists() {
            return Err(Error::NoFuse);
        }
        let at_backing = |source| Error::Backing {
            path: backing.to_path_buf(),
            source,
        };
        let backing = backing.canonicalize().map_err(at_backing)?;
        let mut model = Model::new(dirs);
        apply::scan(&backing, &mut model).map_err(at_backing)?;
        let shared = Arc::new(Shared::new(backing, model));
        let (ended_tx, ended) = mpsc::channel();
        let fs = Fs {
            shared: shared.clone(),
            _ended: ended_tx,
        };
        let at_mount = |source| Error::Mount {
            mountpoint: mountpoint.to_path_buf(),
            source,
        };
        let mountpoint = mountpoint.canonicalize().map_err(at_mount)?;
        // Either inside the other, and the backing files would be reached
        // through the mount itself.
        if mountpoint.starts_with(&shared.backing) || shared.backing.starts_with(&mountpoint) {
            let nested = "the mount point and the backing directory are nested";
            return Err(at_mount(io::Error::new(
                io::ErrorKind::InvalidInput,
                nested,
            )));
        }
        let session = Session::new(fs, &mountpoint, &config())
            .and_then(Session::spawn)
            .map_err(at_mount)?;
        Ok(Mount {
            shared,
            session: Some(session),
            ended,
            mountpoint,
        })
    }
}

fn config() -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("lazyfs".into()),
        MountOption::DefaultPermissions,
    ];
    config.acl = SessionACL::All;
    config.n_threads = Some(THREADS);
    config.clone_fd = true;
    config
}

/// A mounted lazy file system. Dropping it unmounts (never leave a mount).
pub struct Mount {
    shared: Arc<Shared>,
    session: Option<BackgroundSession>,
    ended: Receiver<()>,
    mountpoint: PathBuf,
}

/// What a power loss undid, path by path (for the evidence).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PowerLoss {
    pub lost: Vec<Lost>,
}

impl Mount {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    pub fn backing(&self) -> &Path {
        &self.shared.backing
    }

    /// Makes the next `fsync`/`fdatasync`/`fsyncdir` of a path ending with
    /// `path_suffix` (relative to the backing directory, whole components:
    /// `pg_wal/000000010000000000000001`, `a.txt`) block inside the file
    /// system until the returned hold is released or dropped. A power loss
    /// meanwhile fails it: the write it would have synced is lost.
    ///
    /// Only a release (or dropping the hold) or a freeze frees the process
    /// that is syncing: a SIGKILL does not, because the kernel waits
    /// uninterruptibly for a FUSE request the file system has already
    /// read, so the process stays (with its files open) until then.
    /// [`Mount::unmount`], [`Mount::power_loss`] and dropping the mount
    /// freeze first, so a held fsync never keeps them waiting.
    pub fn hold_next_fsync(&self, path_suffix: impl AsRef<Path>) -> Hold {
        self.shared.holds.arm(path_suffix.as_ref())
    }

    /// Everything written so far made durable, as `sync(2)` (or the
    /// kernel's writeback, given time) would: a power loss from now on
    /// undoes only what comes after.
    pub fn sync_all(&self) -> Result<(), Error> {
        let mut st = self.shared.lock_anyway();
        let purge = st.model.sync_all();
        apply::purge(&self.shared.backing, &purge).map_err(|source| Error::Undo {
            backing: self.shared.backing.clone(),
            path: PathBuf::from(super::model::STASH),
            source,
        })
    }

    /// The files with unsynced data, and how many bytes (what a power loss
    /// now would undo).
    pub fn unsynced(&self) -> Vec<(PathBuf, u64)> {
        self.shared.lock_anyway().model.unsynced()
    }

    /// Every request from now on fails with EIO, and every held fsync:
    /// nothing more becomes durable. The first part of a power loss, for a
    /// harness that must kill several servers before dropping their data.
    pub fn freeze(&self) {
        self.shared.freeze();
    }

    /// Drops everything never made durable (file contents, sizes, names)
    /// from the backing directory, then unmounts. Mount afresh to go on:
    /// the kernel's page cache above this mount may still hold what was
    /// dropped. Kill the servers using it first: a file still open on it
    /// keeps its threads, and after [`PATIENCE`] the unmount fails with
    /// [`Error::Busy`]. The data is dropped all the same, so that failure
    /// comes as [`Error::Unmounted`], which carries the report; an
    /// [`Error::Undo`] (the backing directory is then not what was
    /// durable) comes first, whatever the unmount did.
    pub fn power_loss(mut self) -> Result<PowerLoss, Error> {
        self.shared.freeze();
        let done = {
            let st = self.shared.lock_anyway();
            let plan = st.model.power_loss();
            match apply::apply(&self.shared.backing, &plan.steps) {
                Ok(()) => Ok(PowerLoss { lost: plan.lost }),
                Err((path, source)) => Err(Error::Undo {
                    backing: self.shared.backing.clone(),
                    path,
                    source,
                }),
            }
        };
        let unmount = self.detach();
        match (done, unmount) {
            (Ok(loss), Err(unmount)) => Err(Error::Unmounted {
                lost: loss.lost,
                unmount: Box::new(unmount),
            }),
            (done, _) => done,
        }
    }

    /// Unmounts, keeping everything as the processes using it saw it. It
    /// freezes first: a request still to come fails, and a held fsync
    /// with it (its process, killed or not, would otherwise keep a file
    /// open and the unmount [`Error::Busy`]).
    pub fn unmount(mut self) -> Result<(), Error> {
        self.detach()
    }

    /// Freezes, detaches the mount (lazily: a file still open on it keeps
    /// its file system, not the mount point), waits for the threads to
    /// end, then drops the stash: what it kept was removed for good. The
    /// freeze comes first because it cancels the held fsyncs: a process
    /// blocked in one keeps its file open, and the threads would outlive
    /// [`PATIENCE`] (a power loss has taken its plan before this).
    fn detach(&mut self) -> Result<(), Error> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        self.shared.freeze();
        let mountpoint = self.mountpoint.clone();
        if let Err(errno) = umount2(&mountpoint, MntFlags::MNT_DETACH) {
            drop(session); // fuser's own unmount: `fusermount3 -u -z` for a user
            let source = io::Error::from_raw_os_error(errno as i32);
            return Err(Error::Unmount { mountpoint, source });
        }
        let ended = match self.ended.recv_timeout(PATIENCE) {
            Err(RecvTimeoutError::Timeout) => false,
            Ok(()) | Err(RecvTimeoutError::Disconnected) => true,
        };
        if !ended {
            drop(session); // its threads end when the last file closes
            return Err(Error::Busy { mountpoint });
        }
        let _ = session.join();
        apply::drop_stash(&self.shared.backing).map_err(|source| Error::Backing {
            path: self.shared.backing.clone(),
            source,
        })
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = self.detach();
    }
}
