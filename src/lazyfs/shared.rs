//! What the FUSE threads and the mount's owner share: the backing
//! directory, the model behind one lock, the open files, the holds and
//! the freeze.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, Metadata};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, INodeNo};

use super::hold::Holds;
use super::model::{Id, Kind, Model, ROOT, STASH};

/// Everything a request needs, behind the one lock: names and data change
/// under it, so the undo records, the stash and the backing files agree.
pub(super) struct State {
    pub(super) model: Model,
    files: HashMap<u64, OpenFile>,
    pub(super) dirs: HashMap<u64, Vec<(OsString, Id, Kind)>>,
    next_fh: u64,
}

/// A file opened through the mount: the backing file, always readable
/// (its undo records need the old bytes).
pub(super) struct OpenFile {
    pub(super) file: Arc<File>,
    pub(super) id: Id,
}

pub(super) struct Shared {
    pub(super) backing: PathBuf,
    state: Mutex<State>,
    frozen: AtomicBool,
    pub(super) holds: Holds,
    /// Running as root: new files are given to whoever made them.
    root: bool,
}

impl Shared {
    pub(super) fn new(backing: PathBuf, model: Model) -> Shared {
        Shared {
            backing,
            state: Mutex::new(State {
                model,
                files: HashMap::new(),
                dirs: HashMap::new(),
                next_fh: 1,
            }),
            frozen: AtomicBool::new(false),
            holds: Holds::default(),
            root: nix::unistd::geteuid().is_root(),
        }
    }

    /// The state, for a request: EIO once frozen (the disk is gone). The
    /// flag is read under the lock, so nothing changes after a freeze.
    pub(super) fn lock(&self) -> Result<MutexGuard<'_, State>, Errno> {
        let state = self.lock_anyway();
        match self.frozen.load(Ordering::SeqCst) {
            true => Err(Errno::EIO),
            false => Ok(state),
        }
    }

    pub(super) fn lock_anyway(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// From now on every request fails and every held fsync with it.
    pub(super) fn freeze(&self) {
        let _state = self.lock_anyway();
        self.frozen.store(true, Ordering::SeqCst);
        self.holds.cancel_all();
    }

    pub(super) fn full(&self, rel: &Path) -> PathBuf {
        self.backing.join(rel)
    }

    /// A thing's attributes from its backing file; the inode number is the
    /// model's id, and a file's link count is its names in the model (a
    /// file removed but kept in the stash has none).
    pub(super) fn attr(&self, st: &State, id: Id, meta: &Metadata) -> FileAttr {
        let kind = file_type(&meta.file_type());
        let nlink = match kind {
            FileType::Directory => meta.nlink() as u32,
            _ => st.model.links(id) as u32,
        };
        FileAttr {
            ino: INodeNo(id),
            size: meta.len(),
            blocks: meta.blocks(),
            atime: time(meta.atime(), meta.atime_nsec()),
            mtime: time(meta.mtime(), meta.mtime_nsec()),
            ctime: time(meta.ctime(), meta.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind,
            perm: (meta.mode() & 0o7777) as u16,
            nlink,
            uid: meta.uid(),
            gid: meta.gid(),
            rdev: meta.rdev() as u32,
            blksize: meta.blksize() as u32,
            flags: 0,
        }
    }

    pub(super) fn stat(&self, st: &State, id: Id) -> Result<FileAttr, Errno> {
        let meta = fs::symlink_metadata(self.full(&st.path(id)?))?;
        Ok(self.attr(st, id, &meta))
    }

    /// A new name made as root is given to the requester, and its mode set
    /// exactly (this process's umask is not the requester's; the kernel
    /// applied theirs). In a set-group-ID directory the group is the
    /// directory's, and a new directory inherits the bit. The owner goes
    /// first: a chown clears the set-ID bits.
    pub(super) fn settle(
        &self,
        full: &Path,
        who: (u32, u32),
        mode: u32,
        kind: Kind,
    ) -> Result<(), Errno> {
        let parent = fs::metadata(full.parent().unwrap_or(&self.backing))?;
        let setgid = parent.mode() & 0o2000 != 0;
        let gid = if setgid { parent.gid() } else { who.1 };
        if self.root {
            std::os::unix::fs::lchown(full, Some(who.0), Some(gid))?;
        }
        let mode = match (kind, setgid) {
            (Kind::Dir, true) => mode | 0o2000,
            _ => mode,
        };
        if kind != Kind::Symlink {
            fs::set_permissions(full, fs::Permissions::from_mode(mode & 0o7777))?;
        }
        Ok(())
    }
}

impl State {
    /// Where a thing is on the backing directory, relative to it.
    pub(super) fn path(&self, id: Id) -> Result<PathBuf, Errno> {
        self.model.path(id).ok_or(Errno::ENOENT)
    }

    /// The name's thing: the stash is no name of the mount.
    pub(super) fn lookup(&self, parent: Id, name: &OsStr) -> Result<Id, Errno> {
        if hidden(parent, name) {
            return Err(Errno::ENOENT);
        }
        self.model.lookup(parent, name).ok_or(Errno::ENOENT)
    }

    /// The path for a new name in a directory: the directory must be one,
    /// and the name free (and not the stash's).
    pub(super) fn new_child(&self, parent: Id, name: &OsStr) -> Result<PathBuf, Errno> {
        if self.model.kind(parent) != Some(Kind::Dir) {
            return Err(Errno::ENOTDIR);
        }
        if hidden(parent, name) {
            return Err(Errno::EPERM);
        }
        if self.model.lookup(parent, name).is_some() {
            return Err(Errno::EEXIST);
        }
        Ok(self.path(parent)?.join(name))
    }

    pub(super) fn add_file(&mut self, open: OpenFile) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        self.files.insert(fh, open);
        fh
    }

    pub(super) fn file(&self, fh: u64) -> Result<&OpenFile, Errno> {
        self.files.get(&fh).ok_or(Errno::EBADF)
    }

    /// Any file open on `id` (for a file with no name left).
    pub(super) fn open_of(&self, id: Id) -> Option<&OpenFile> {
        self.files.values().find(|o| o.id == id)
    }

    pub(super) fn close(&mut self, fh: u64) {
        self.files.remove(&fh);
    }

    pub(super) fn add_dir(&mut self, entries: Vec<(OsString, Id, Kind)>) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        self.dirs.insert(fh, entries);
        fh
    }
}

/// The stash's name in the root: not part of the mount.
pub(super) fn hidden(parent: Id, name: &OsStr) -> bool {
    parent == ROOT && name == STASH
}

pub(super) fn file_type(t: &fs::FileType) -> FileType {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        FileType::Directory
    } else if t.is_symlink() {
        FileType::Symlink
    } else if t.is_fifo() {
        FileType::NamedPipe
    } else if t.is_socket() {
        FileType::Socket
    } else if t.is_char_device() {
        FileType::CharDevice
    } else if t.is_block_device() {
        FileType::BlockDevice
    } else {
        FileType::RegularFile
    }
}

pub(super) fn kind_type(kind: Kind) -> FileType {
    match kind {
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::File | Kind::Other => FileType::RegularFile,
    }
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    let nsecs = Duration::from_nanos(nsecs as u64);
    match u64::try_from(secs) {
        Ok(secs) => UNIX_EPOCH + Duration::from_secs(secs) + nsecs,
        Err(_) => UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + nsecs,
    }
}
