//! Files' data through the mount: reads and writes go to the backing
//! files; every write, truncation and extension first records what it
//! overwrote, and a sync drops the records.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::sync::Arc;

use fuser::{Errno, FileAttr, TimeOrNow};
use nix::fcntl::AT_FDCWD;
use nix::libc;
use nix::sys::stat::{futimens, utimensat, UtimensatFlags};
use nix::sys::time::TimeSpec;

use super::apply;
use super::model::{Id, Kind, Undo};
use super::shared::{OpenFile, Shared, State};

/// What `setattr` asks to change; absent fields stay.
pub(super) struct Change {
    pub(super) mode: Option<u32>,
    pub(super) uid: Option<u32>,
    pub(super) gid: Option<u32>,
    pub(super) size: Option<u64>,
    pub(super) atime: Option<TimeOrNow>,
    pub(super) mtime: Option<TimeOrNow>,
}

/// The backing file for an open through the mount: always readable (undo
/// records need the old bytes), writable if asked, and none of the flags
/// that the file system does itself: `O_APPEND` (the kernel gives each
/// write its offset, and `pwrite` on an `O_APPEND` file ignores it),
/// `O_TRUNC` (recorded; it makes even an `O_RDONLY` open writable, as
/// Linux truncates then too), `O_SYNC`/`O_DSYNC` (not passed down: the
/// backing disk's own durability is not the point), `O_DIRECT`.
///
/// A write through an `O_SYNC`/`O_DSYNC` handle (or with `RWF_DSYNC`) is
/// made durable by the `FUSE_FSYNC` the kernel sends once the write's data
/// is through (`generic_write_sync` in `fuse_cache_write_iter`), before
/// the `write` returns; the write itself syncs nothing, so that a hold
/// catches that fsync like any other (`tests/lazyfs.rs` has the rows).
fn open_backing(path: &std::path::Path, flags: i32, create: Option<u32>) -> std::io::Result<File> {
    let mut opts = OpenOptions::new();
    let trunc = flags & libc::O_TRUNC != 0;
    opts.read(true)
        .write(create.is_some() || trunc || flags & libc::O_ACCMODE != libc::O_RDONLY);
    if let Some(mode) = create {
        opts.create_new(true).mode(mode & 0o7777);
    }
    opts.open(path)
}

impl Shared {
    pub(super) fn open(&self, id: Id, flags: i32) -> Result<u64, Errno> {
        let mut st = self.lock()?;
        let file = open_backing(&self.full(&st.path(id)?), flags, None)?;
        // Reached only if the kernel was given FUSE_ATOMIC_O_TRUNC (fuser
        // does not ask for it): else it truncates first, by a `setattr`.
        if flags & libc::O_TRUNC != 0 {
            cut(&mut st, id, &file, 0)?;
        }
        let file = Arc::new(file);
        Ok(st.add_file(OpenFile { file, id }))
    }

    pub(super) fn create(
        &self,
        who: (u32, u32),
        parent: Id,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> Result<(FileAttr, u64), Errno> {
        let mut st = self.lock()?;
        let path = st.new_child(parent, name)?;
        let full = self.full(&path);
        let file = open_backing(&full, flags, Some(mode))?;
        if let Err(e) = self.settle(&full, who, mode, Kind::File) {
            let _ = fs::remove_file(&full);
            return Err(e);
        }
        let id = st.model.create(parent, name, Kind::File);
        let attr = self.attr(&st, id, &file.metadata()?);
        let file = Arc::new(file);
        Ok((attr, st.add_file(OpenFile { file, id })))
    }

    /// Reads outside the lock: a read changes nothing.
    pub(super) fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let file = self.lock()?.file(fh)?.file.clone();
        let mut buf = vec![0; size as usize];
        let mut got = 0;
        while got < buf.len() {
            match file.read_at(&mut buf[got..], offset + got as u64)? {
                0 => break,
                n => got += n,
            }
        }
        buf.truncate(got);
        Ok(buf)
    }

    /// Recorded, never synced here: see [`open_backing`] for `O_DSYNC`.
    pub(super) fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let mut st = self.lock()?;
        let open = st.file(fh)?;
        let (file, id) = (open.file.clone(), open.id);
        overwrite(&mut st, id, &file, offset, data)?;
        Ok(data.len() as u32)
    }

    pub(super) fn release(&self, fh: u64) {
        self.lock_anyway().close(fh);
    }

    /// `posix_fallocate` (mode 0, which may extend the file: recorded) and
    /// `FALLOC_FL_KEEP_SIZE`; punching holes and the rest are refused.
    pub(super) fn fallocate(&self, fh: u64, offset: u64, len: u64, mode: i32) -> Result<(), Errno> {
        use nix::fcntl::{fallocate, FallocateFlags};
        let keep = FallocateFlags::FALLOC_FL_KEEP_SIZE;
        let flags = FallocateFlags::from_bits(mode).filter(|f| f.is_empty() || *f == keep);
        let flags = flags.ok_or(Errno::EOPNOTSUPP)?;
        let mut st = self.lock()?;
        let open = st.file(fh)?;
        let (file, id) = (open.file.clone(), open.id);
        let old_len = file.metadata()?.len();
        let end = offset.saturating_add(len);
        if flags.is_empty() && end > old_len {
            let undo = Undo {
                offset: old_len,
                old: Vec::new(),
                old_len,
            };
            st.model.resized(id, undo, end - old_len, end);
        }
        let off = |v: u64| i64::try_from(v).map_err(|_| Errno::EFBIG);
        fallocate(&*file, flags, off(offset)?, off(len)?).map_err(|e| Errno::from_i32(e as i32))?;
        Ok(())
    }

    pub(super) fn getattr(&self, id: Id, fh: Option<u64>) -> Result<FileAttr, Errno> {
        let st = self.lock()?;
        match fh.and_then(|fh| st.file(fh).ok()) {
            Some(open) => Ok(self.attr(&st, id, &open.file.metadata()?)),
            None => self.stat(&st, id),
        }
    }

    /// chmod, chown, truncate, utimens: through the open file if the
    /// kernel names one (a file unlinked while open has no name left, or
    /// only its place in the stash), else through the path.
    pub(super) fn setattr(
        &self,
        id: Id,
        fh: Option<u64>,
        change: Change,
    ) -> Result<FileAttr, Errno> {
        let mut st = self.lock()?;
        let open = match fh {
            Some(fh) => st.file(fh).ok(),
            // fchmod, fchown, futimens name no handle: one open on a file
            // with no name left serves.
            None if st.model.path(id).is_none() => st.open_of(id),
            None => None,
        };
        if let Some(file) = open.map(|o| o.file.clone()) {
            set_file(&mut st, id, &file, &change)?;
            st.model.touched(id);
            return Ok(self.attr(&st, id, &file.metadata()?));
        }
        let path = self.full(&st.path(id)?);
        if change.uid.is_some() || change.gid.is_some() {
            std::os::unix::fs::lchown(&path, change.uid, change.gid)?;
        }
        if let Some(mode) = change
            .mode
            .filter(|_| st.model.kind(id) != Some(Kind::Symlink))
        {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o7777))?;
        }
        if let Some(size) = change.size {
            let file = OpenOptions::new().read(true).write(true).open(&path)?;
            cut(&mut st, id, &file, size)?;
        }
        if change.atime.is_some() || change.mtime.is_some() {
            let (a, m) = (timespec(change.atime), timespec(change.mtime));
            utimensat(AT_FDCWD, &path, &a, &m, UtimensatFlags::NoFollowSymlink)
                .map_err(|e| Errno::from_i32(e as i32))?;
        }
        st.model.touched(id);
        self.stat(&st, id)
    }

    /// `fsync`/`fdatasync` of a file: held first if a hold matches it
    /// (outside the lock: everything else goes on meanwhile), then its
    /// undo records are dropped.
    pub(super) fn fsync(&self, id: Id, datasync: bool, dir: bool) -> Result<(), Errno> {
        // A file with no name left (unlinked, still open) syncs too; only
        // a named one can match a hold.
        let path = self.lock()?.model.path(id);
        if path.is_some_and(|p| !self.holds.pass(&p)) {
            return Err(Errno::EIO);
        }
        let mut st = self.lock()?;
        let purge = match dir {
            true => st.model.fsyncdir(id, datasync),
            false => st.model.fsync(id, datasync),
        };
        apply::purge(&self.backing, &purge)?;
        Ok(())
    }

    pub(super) fn statfs(&self) -> Result<nix::sys::statvfs::Statvfs, Errno> {
        nix::sys::statvfs::statvfs(&self.backing).map_err(|e| Errno::from_i32(e as i32))
    }
}

fn timespec(t: Option<TimeOrNow>) -> TimeSpec {
    match t {
        None => TimeSpec::UTIME_OMIT,
        Some(TimeOrNow::Now) => TimeSpec::UTIME_NOW,
        Some(TimeOrNow::SpecificTime(t)) => {
            let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            TimeSpec::from_duration(d)
        }
    }
}

/// [`Shared::setattr`] through an open file.
fn set_file(st: &mut State, id: Id, file: &File, change: &Change) -> Result<(), Errno> {
    if change.uid.is_some() || change.gid.is_some() {
        std::os::unix::fs::fchown(file, change.uid, change.gid)?;
    }
    if let Some(mode) = change.mode {
        file.set_permissions(fs::Permissions::from_mode(mode & 0o7777))?;
    }
    if let Some(size) = change.size {
        cut(st, id, file, size)?;
    }
    if change.atime.is_some() || change.mtime.is_some() {
        let (a, m) = (timespec(change.atime), timespec(change.mtime));
        futimens(file, &a, &m).map_err(|e| Errno::from_i32(e as i32))?;
    }
    Ok(())
}

/// A write, recorded first (the record of a write that then fails undoes
/// nothing that was not there).
fn overwrite(st: &mut State, id: Id, file: &File, offset: u64, data: &[u8]) -> std::io::Result<()> {
    let old_len = file.metadata()?.len();
    let end = offset.saturating_add(data.len() as u64);
    let mut old = vec![0; end.min(old_len).saturating_sub(offset) as usize];
    file.read_exact_at(&mut old, offset)?;
    let undo = Undo {
        offset,
        old,
        old_len,
    };
    st.model
        .changed(id, undo, data.len() as u64, old_len.max(end));
    file.write_all_at(data, offset)
}

/// A truncation to `len`, recorded first: the cut tail is kept.
fn cut(st: &mut State, id: Id, file: &File, len: u64) -> std::io::Result<()> {
    let old_len = file.metadata()?.len();
    let mut old = vec![0; old_len.saturating_sub(len) as usize];
    file.read_exact_at(&mut old, len)?;
    let undo = Undo {
        offset: len.min(old_len),
        old,
        old_len,
    };
    st.model.resized(id, undo, len.abs_diff(old_len), len);
    file.set_len(len)
}
