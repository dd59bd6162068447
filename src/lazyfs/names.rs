//! Names through the mount: each change is made on the backing directory
//! and told to the model, under the lock. A name whose removal a power
//! loss could undo keeps its file or directory in the stash instead of
//! deleting it.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::path::Path;

use fuser::{Errno, FileAttr};
use nix::sys::stat::{mknod, Mode, SFlag};

use super::apply;
use super::model::{Id, Kind, ROOT};
use super::shared::{hidden, Shared};

impl Shared {
    pub(super) fn lookup(&self, parent: Id, name: &OsStr) -> Result<FileAttr, Errno> {
        let st = self.lock()?;
        let id = st.lookup(parent, name)?;
        self.stat(&st, id)
    }

    pub(super) fn mkdir(
        &self,
        who: (u32, u32),
        parent: Id,
        name: &OsStr,
        mode: u32,
    ) -> Result<FileAttr, Errno> {
        let mut st = self.lock()?;
        let full = self.full(&st.new_child(parent, name)?);
        fs::create_dir(&full)?;
        if let Err(e) = self.settle(&full, who, mode, Kind::Dir) {
            let _ = fs::remove_dir(&full);
            return Err(e);
        }
        let id = st.model.create(parent, name, Kind::Dir);
        self.stat(&st, id)
    }

    /// A fifo, socket, device node or (without `create`) a regular file.
    pub(super) fn mknod(
        &self,
        who: (u32, u32),
        parent: Id,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> Result<FileAttr, Errno> {
        let mut st = self.lock()?;
        let full = self.full(&st.new_child(parent, name)?);
        let kind = SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits());
        let perm = Mode::from_bits_truncate(mode & 0o7777);
        mknod(&full, kind, perm, rdev.into()).map_err(|e| Errno::from_i32(e as i32))?;
        let kind = match kind == SFlag::S_IFREG {
            true => Kind::File,
            false => Kind::Other,
        };
        if let Err(e) = self.settle(&full, who, mode, kind) {
            let _ = fs::remove_file(&full);
            return Err(e);
        }
        let id = st.model.create(parent, name, kind);
        self.stat(&st, id)
    }

    pub(super) fn symlink(
        &self,
        who: (u32, u32),
        parent: Id,
        name: &OsStr,
        target: &Path,
    ) -> Result<FileAttr, Errno> {
        let mut st = self.lock()?;
        let full = self.full(&st.new_child(parent, name)?);
        std::os::unix::fs::symlink(target, &full)?;
        if let Err(e) = self.settle(&full, who, 0o777, Kind::Symlink) {
            let _ = fs::remove_file(&full);
            return Err(e);
        }
        let id = st.model.create(parent, name, Kind::Symlink);
        self.stat(&st, id)
    }

    pub(super) fn readlink(&self, id: Id) -> Result<Vec<u8>, Errno> {
        use std::os::unix::ffi::OsStrExt;
        let st = self.lock()?;
        let target = fs::read_link(self.full(&st.path(id)?))?;
        Ok(target.as_os_str().as_bytes().to_vec())
    }

    pub(super) fn link(&self, id: Id, parent: Id, name: &OsStr) -> Result<FileAttr, Errno> {
        let mut st = self.lock()?;
        if st.model.kind(id) == Some(Kind::Dir) {
            return Err(Errno::EPERM);
        }
        let to = self.full(&st.new_child(parent, name)?);
        fs::hard_link(self.full(&st.path(id)?), to)?;
        st.model.link(id, parent, name);
        self.stat(&st, id)
    }

    /// `unlink` (`dir` false) or `rmdir`.
    pub(super) fn unlink(&self, parent: Id, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let mut st = self.lock()?;
        let id = st.lookup(parent, name)?;
        let is_dir = st.model.kind(id) == Some(Kind::Dir);
        match (dir, is_dir) {
            (true, false) => return Err(Errno::ENOTDIR),
            (false, true) => return Err(Errno::EISDIR),
            (true, true) if !empty(&st.model, id) => return Err(Errno::ENOTEMPTY),
            _ => {}
        }
        let path = st.path(parent)?.join(name);
        if st.model.must_keep(parent, name) {
            apply::stash(&self.backing, &path, id)?;
        } else if dir {
            fs::remove_dir(self.full(&path))?;
        } else {
            fs::remove_file(self.full(&path))?;
        }
        let removed = st.model.unlink(parent, name).ok_or(Errno::ENOENT)?;
        apply::purge(&self.backing, &removed.purge)?;
        Ok(())
    }

    /// `rename` with flags 0 (`RENAME_NOREPLACE` and `RENAME_EXCHANGE` are
    /// refused by the caller with EINVAL). A replaced name's file or
    /// directory is stashed first if a power loss could bring it back:
    /// a file by a second hard link (its name stays until the rename), a
    /// directory (empty) by moving it, unseen since the lock is held.
    pub(super) fn rename(&self, from: (Id, &OsStr), to: (Id, &OsStr)) -> Result<(), Errno> {
        let mut st = self.lock()?;
        let id = st.lookup(from.0, from.1)?;
        if hidden(to.0, to.1) {
            return Err(Errno::EPERM);
        }
        if st.model.kind(to.0) != Some(Kind::Dir) {
            return Err(Errno::ENOTDIR);
        }
        let is_dir = st.model.kind(id) == Some(Kind::Dir);
        if is_dir && st.model.is_within(to.0, id) {
            return Err(Errno::EINVAL);
        }
        let victim = st.model.lookup(to.0, to.1);
        if victim == Some(id) {
            return Ok(());
        }
        if let Some(v) = victim {
            let v_dir = st.model.kind(v) == Some(Kind::Dir);
            match (is_dir, v_dir) {
                (true, false) => return Err(Errno::ENOTDIR),
                (false, true) => return Err(Errno::EISDIR),
                (true, true) if !empty(&st.model, v) => return Err(Errno::ENOTEMPTY),
                _ => {}
            }
        }
        let src = st.path(from.0)?.join(from.1);
        let dst = st.path(to.0)?.join(to.1);
        let kept = victim.filter(|_| st.model.must_keep(to.0, to.1));
        let victim_dir = victim.is_some_and(|v| st.model.kind(v) == Some(Kind::Dir));
        if let Some(v) = kept {
            match victim_dir {
                true => apply::stash(&self.backing, &dst, v)?,
                false => apply::stash_link(&self.backing, &dst, v)?,
            }
        }
        if let Err(e) = fs::rename(self.full(&src), self.full(&dst)) {
            if let Some(v) = kept {
                let _ = match victim_dir {
                    true => apply::unstash(&self.backing, v, &dst),
                    false => apply::purge(&self.backing, &[v]),
                };
            }
            return Err(e.into());
        }
        let removed = st.model.rename(from, to);
        apply::purge(&self.backing, &removed.map(|r| r.purge).unwrap_or_default())?;
        Ok(())
    }

    /// A directory's listing as it is at `opendir`, with `.` and `..`.
    pub(super) fn opendir(&self, id: Id) -> Result<u64, Errno> {
        let mut st = self.lock()?;
        let mut entries = st.model.entries(id).ok_or(Errno::ENOENT)?;
        if st.model.kind(id) != Some(Kind::Dir) {
            return Err(Errno::ENOTDIR);
        }
        let up = st.model.parent(id).unwrap_or(ROOT);
        let dots = [(".", id), ("..", up)].map(|(n, i)| (OsString::from(n), i, Kind::Dir));
        entries.splice(0..0, dots);
        Ok(st.add_dir(entries))
    }

    pub(super) fn releasedir(&self, fh: u64) {
        self.lock_anyway().dirs.remove(&fh);
    }
}

fn empty(model: &super::model::Model, dir: Id) -> bool {
    model.entries(dir).is_some_and(|e| e.is_empty())
}
