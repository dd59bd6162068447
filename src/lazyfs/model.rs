//! The durability model, with no FUSE and no I/O in it: the tree of names
//! as it is now and as a power loss would find it, and for each file the
//! undo records of what was written since its last sync.
//!
//! Data: a write or a truncation records what it overwrote (the old bytes
//! and the old length); an `fsync` or `fdatasync` of the file (a write
//! through an `O_SYNC`/`O_DSYNC` handle included: the kernel follows it
//! with a `FUSE_FSYNC` before the write returns) drops the file's records. Ranges
//! are not modeled: a sync makes the whole file durable, as the kernel's
//! whole-page writeback mostly does.
//!
//! Names: each directory keeps its entries as they are and as they were when
//! last made durable. Which event makes them durable is the [`DirModel`].
//! A file's attributes (mode, owner, times) are not modeled: they stay as
//! they are.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

/// A file, directory or symlink, for as long as the model needs it; never
/// reused within a mount (the FUSE inode number is the same).
pub type Id = u64;

/// The backing directory itself (FUSE's root inode number).
pub const ROOT: Id = 1;

/// The hidden directory, inside the backing directory, that keeps what was
/// removed while a power loss could still bring it back. Hidden from the
/// mount; gone after a power loss or an unmount.
pub const STASH: &str = ".lazyfs-stash";

/// Which event makes a name (a create, unlink, rename, mkdir, rmdir, link
/// or symlink) durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DirModel {
    /// Only an `fsync` of the directory makes its entries durable: what
    /// POSIX promises, and the worst case a server must survive. A file
    /// removed while a durable name still points at it is kept in the
    /// stash until that directory is synced, so a server that removes
    /// files and never syncs their directory makes the stash (on the
    /// backing disk) grow for as long as it is mounted.
    #[default]
    Strict,
    /// ext4 with its journal (`data=ordered`, the default): every name
    /// change goes into the one running jbd2 transaction, shared by all
    /// inodes, and `fsync`/`fdatasync` of any file or directory commits
    /// that transaction if the inode is in it (`ext4_sync_file` waits for
    /// `i_sync_tid`, or `i_datasync_tid` for `fdatasync`, which moves only
    /// when the size or allocation changed: `fs/ext4/fsync.c`,
    /// `fs/ext4/inode.c`). A commit makes every earlier name change
    /// durable, in every directory, but no other file's data: with delayed
    /// allocation the data of a file is written by its own sync (ext4's
    /// `auto_da_alloc` heuristics for replace-by-rename and the 5 s
    /// periodic commit are not modeled, so this loses at most what ext4
    /// could lose).
    ///
    /// A change of size by a truncation (shrinking or extending) or by
    /// `fallocate` is journaled (ext4 sets `i_disksize` in the handle),
    /// so a commit makes it durable with the names, though not the data
    /// written since the file's last sync: a power loss then undoes that
    /// data and sets the committed sizes again (a tail cut by a committed
    /// truncation stays cut).
    ///
    /// A held fsync commits when it is released: what anyone changed while
    /// it was held joins that commit, as on ext4 when a commit starts late.
    Ext4Like,
}

/// What kind of thing a name points at (only files have data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// A fifo, socket or device node: a name, no data.
    Other,
}

/// What one write or truncation overwrote: undone by writing `old` back at
/// `offset`, then setting the length back to `old_len`. An append
/// overwrote nothing (`old` is empty); a truncation keeps the cut tail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Undo {
    pub offset: u64,
    pub old: Vec<u8>,
    pub old_len: u64,
}

#[derive(Debug)]
pub(super) struct Node {
    pub(super) kind: Kind,
    /// Its current names, as (directory, name).
    pub(super) links: Vec<(Id, OsString)>,
    /// Directories: the entries now.
    pub(super) entries: BTreeMap<OsString, Id>,
    /// Directories: the entries a power loss would find.
    pub(super) durable: BTreeMap<OsString, Id>,
    /// Files: the undo records since the last sync, oldest first.
    pub(super) undo: Vec<Undo>,
    /// Files: bytes written or cut since the last sync (for the report).
    pub(super) unsynced: u64,
    /// Files: the length now.
    pub(super) len: u64,
    /// Files: written since the last sync (not only resized).
    pub(super) wrote: bool,
    /// Files, `Ext4Like`: the sizes truncations and `fallocate` set in the
    /// running transaction, (smallest, last).
    pub(super) sized: Option<(u64, u64)>,
    /// Files, `Ext4Like`: the sizes commits made durable since the last
    /// sync, (smallest, last): a power loss cuts to the smallest and sets
    /// the last once the data is undone.
    pub(super) committed: Option<(u64, u64)>,
}

impl Node {
    fn new(kind: Kind, len: u64) -> Node {
        Node {
            kind,
            links: Vec::new(),
            entries: BTreeMap::new(),
            durable: BTreeMap::new(),
            undo: Vec::new(),
            unsynced: 0,
            len,
            wrote: false,
            sized: None,
            committed: None,
        }
    }

    /// Its data is durable (a sync of the file).
    fn synced(&mut self) {
        self.undo.clear();
        self.unsynced = 0;
        self.wrote = false;
        self.sized = None;
        self.committed = None;
    }

    /// A journal commit: the sizes set in the running transaction are
    /// durable. With nothing written since the last sync, the whole file
    /// then is (its data is the synced data, resized).
    fn commit_size(&mut self) {
        let Some((min, last)) = self.sized.take() else {
            return;
        };
        match (self.wrote, self.committed) {
            (false, _) => self.synced(),
            (true, None) => self.committed = Some((min, last)),
            (true, Some((m, _))) => self.committed = Some((m.min(min), last)),
        }
    }
}

/// What removing a name did to the thing it named.
#[derive(Debug, PartialEq, Eq)]
pub struct Removed {
    pub id: Id,
    /// It lost its last name but a power loss could bring it back: the
    /// caller moves it into the stash instead of deleting it.
    pub kept: bool,
    /// Stashed ids no longer needed (a removed directory was their last
    /// durable name): the caller deletes them.
    pub purge: Vec<Id>,
}

/// The model of one mounted backing directory. Ordered maps throughout,
/// so that a power loss's plan and report come out in one order.
#[derive(Debug)]
pub struct Model {
    pub(super) dirs: DirModel,
    pub(super) nodes: BTreeMap<Id, Node>,
    next: Id,
    /// Removed from every directory, kept in [`STASH`] under its id.
    pub(super) stashed: BTreeSet<Id>,
    /// Directories whose entries changed since they were last durable.
    changed: BTreeSet<Id>,
    /// `Ext4Like`: what the running transaction holds; every change, and
    /// the changes of size (which `fdatasync` commits for).
    running: BTreeSet<Id>,
    running_size: BTreeSet<Id>,
}

impl Model {
    pub fn new(dirs: DirModel) -> Model {
        let mut nodes = BTreeMap::new();
        nodes.insert(ROOT, Node::new(Kind::Dir, 0));
        Model {
            dirs,
            nodes,
            next: ROOT + 1,
            stashed: BTreeSet::new(),
            changed: BTreeSet::new(),
            running: BTreeSet::new(),
            running_size: BTreeSet::new(),
        }
    }

    pub fn dirs(&self) -> DirModel {
        self.dirs
    }

    /// A name found on the backing directory at mount: durable already.
    pub fn found(&mut self, parent: Id, name: &OsStr, kind: Kind, len: u64) -> Id {
        let id = self.fresh(kind, len);
        self.found_link(parent, name, id);
        id
    }

    /// A second name of something already found (a hard link).
    pub fn found_link(&mut self, parent: Id, name: &OsStr, id: Id) {
        self.attach(parent, name, id);
        if let Some(dir) = self.nodes.get_mut(&parent) {
            dir.durable.insert(name.to_owned(), id);
        }
    }

    pub fn lookup(&self, parent: Id, name: &OsStr) -> Option<Id> {
        self.nodes.get(&parent)?.entries.get(name).copied()
    }

    pub fn kind(&self, id: Id) -> Option<Kind> {
        self.nodes.get(&id).map(|n| n.kind)
    }

    /// A directory's entries now, in name order.
    pub fn entries(&self, dir: Id) -> Option<Vec<(OsString, Id, Kind)>> {
        let node = self.nodes.get(&dir)?;
        let kind = |id: &Id| self.nodes.get(id).map_or(Kind::Other, |n| n.kind);
        Some(
            node.entries
                .iter()
                .map(|(name, id)| (name.clone(), *id, kind(id)))
                .collect(),
        )
    }

    /// How many names it has now.
    pub fn links(&self, id: Id) -> usize {
        self.nodes.get(&id).map_or(0, |n| n.links.len())
    }

    /// The directory of its first name (a directory has only one).
    pub fn parent(&self, id: Id) -> Option<Id> {
        self.nodes.get(&id)?.links.first().map(|(p, _)| *p)
    }

    /// Whether `id` is `dir` or lies under it (a directory cannot be moved
    /// into itself).
    pub fn is_within(&self, id: Id, dir: Id) -> bool {
        let mut at = Some(id);
        while let Some(now) = at {
            if now == dir {
                return true;
            }
            at = self.parent(now);
        }
        false
    }

    /// Where it is on the backing directory, relative to it: its first
    /// current name, or its place in the stash (a removed file still open).
    pub fn path(&self, id: Id) -> Option<PathBuf> {
        if id == ROOT {
            return Some(PathBuf::new());
        }
        let node = self.nodes.get(&id)?;
        match node.links.first() {
            Some((parent, name)) => Some(self.path(*parent)?.join(name)),
            None if self.stashed.contains(&id) => Some(stash_path(id)),
            None => None,
        }
    }

    /// A new name for a new thing (create, mkdir, symlink, mknod).
    pub fn create(&mut self, parent: Id, name: &OsStr, kind: Kind) -> Id {
        let id = self.fresh(kind, 0);
        self.attach(parent, name, id);
        self.mark(parent);
        self.note(id, true);
        id
    }

    /// A new name for something that has one (`link`).
    pub fn link(&mut self, id: Id, parent: Id, name: &OsStr) {
        self.attach(parent, name, id);
        self.mark(parent);
        self.note(id, false);
    }

    /// Whether removing `parent/name` takes the last name of something a
    /// power loss could bring back (a durable entry somewhere names it):
    /// then the caller keeps it in the stash rather than deleting it.
    pub fn must_keep(&self, parent: Id, name: &OsStr) -> bool {
        let Some(id) = self.lookup(parent, name) else {
            return false;
        };
        let last = self.nodes.get(&id).is_some_and(|n| n.links.len() == 1);
        last && self.durably_named(id)
    }

    /// `unlink` or `rmdir`. The caller asked [`Model::must_keep`] first and
    /// moved the thing into the stash if so.
    pub fn unlink(&mut self, parent: Id, name: &OsStr) -> Option<Removed> {
        let kept = self.must_keep(parent, name);
        let id = self.detach(parent, name)?;
        self.mark(parent);
        self.note(id, false);
        let mut purge = Vec::new();
        if kept {
            self.stashed.insert(id);
        } else if self.nodes.get(&id).is_some_and(|n| n.links.is_empty()) {
            let gone = self.nodes.remove(&id);
            self.forget(id);
            // Its durable entries were the last to name what it held.
            if gone.is_some_and(|n| !n.durable.is_empty()) {
                purge = self.gc();
            }
        }
        Some(Removed { id, kept, purge })
    }

    /// `rename` with flags 0: replaces what `to` named (returned, as for
    /// [`Model::unlink`]; ask [`Model::must_keep`] on `to` first).
    pub fn rename(&mut self, from: (Id, &OsStr), to: (Id, &OsStr)) -> Option<Removed> {
        let id = self.lookup(from.0, from.1)?;
        let victim = match self.lookup(to.0, to.1) {
            Some(v) if v == id => return None, // the same file: nothing happens
            Some(_) => self.unlink(to.0, to.1),
            None => None,
        };
        self.detach(from.0, from.1);
        self.attach(to.0, to.1, id);
        self.mark(from.0);
        self.mark(to.0);
        self.note(id, false);
        victim
    }

    /// A write of a file: what it overwrote, how many bytes it wrote, and
    /// the length after.
    pub fn changed(&mut self, id: Id, undo: Undo, bytes: u64, len: u64) {
        self.record(id, undo, bytes, len, true);
    }

    /// A truncation, or a change of size by `fallocate`: as a write, but
    /// under `Ext4Like` the new size is journaled (see [`DirModel`]).
    pub fn resized(&mut self, id: Id, undo: Undo, bytes: u64, len: u64) {
        self.record(id, undo, bytes, len, false);
        let ext4 = self.dirs == DirModel::Ext4Like;
        if let Some(node) = self.nodes.get_mut(&id).filter(|_| ext4) {
            node.sized = Some(node.sized.map_or((len, len), |(m, _)| (m.min(len), len)));
        }
    }

    fn record(&mut self, id: Id, undo: Undo, bytes: u64, len: u64, write: bool) {
        let Some(node) = self.nodes.get_mut(&id) else {
            return; // removed for good: nothing to undo
        };
        let resized = undo.old_len != len;
        node.undo.push(undo);
        node.unsynced += bytes;
        node.len = len;
        node.wrote |= write;
        self.note(id, resized);
    }

    /// A change of attributes (mode, owner, times): not undone, but under
    /// `Ext4Like` it puts the inode in the running transaction.
    pub fn touched(&mut self, id: Id) {
        if self.nodes.contains_key(&id) {
            self.note(id, false);
        }
    }

    /// `fsync`/`fdatasync` of a file: its data is durable. Returns the
    /// stashed ids no longer needed (the caller deletes them).
    pub fn fsync(&mut self, id: Id, datasync: bool) -> Vec<Id> {
        if let Some(node) = self.nodes.get_mut(&id) {
            node.synced();
        }
        self.commit_if_running(id, datasync)
    }

    /// `fsync` of a directory: its entries are durable (and under
    /// `Ext4Like`, with the journal's commit, everyone's).
    pub fn fsyncdir(&mut self, id: Id, datasync: bool) -> Vec<Id> {
        match self.dirs {
            DirModel::Strict => {
                self.changed.remove(&id);
                match self.make_durable(id) {
                    true => self.gc(),
                    false => Vec::new(),
                }
            }
            DirModel::Ext4Like => self.commit_if_running(id, datasync),
        }
    }

    /// `sync(2)`: every file's data and every directory's names durable,
    /// as the kernel's writeback makes them in the seconds after a write
    /// (a server that never syncs still has its old writes on disk).
    /// Returns the stashed ids no longer needed.
    pub fn sync_all(&mut self) -> Vec<Id> {
        let ids: Vec<(Id, bool)> = self
            .nodes
            .iter()
            .map(|(id, n)| (*id, n.kind == Kind::Dir))
            .collect();
        let mut purge = Vec::new();
        for (id, dir) in ids {
            if !self.nodes.contains_key(&id) {
                continue; // purged by an earlier directory's sync
            }
            purge.extend(match dir {
                true => self.fsyncdir(id, false),
                false => self.fsync(id, false),
            });
        }
        purge
    }

    /// Every file with data not yet synced, and how many bytes.
    pub fn unsynced(&self) -> Vec<(PathBuf, u64)> {
        self.nodes
            .iter()
            .filter(|(_, n)| !n.undo.is_empty())
            .filter_map(|(id, n)| Some((self.path(*id)?, n.unsynced)))
            .collect()
    }

    fn fresh(&mut self, kind: Kind, len: u64) -> Id {
        let id = self.next;
        self.next += 1;
        self.nodes.insert(id, Node::new(kind, len));
        id
    }

    fn attach(&mut self, parent: Id, name: &OsStr, id: Id) {
        if let Some(dir) = self.nodes.get_mut(&parent) {
            dir.entries.insert(name.to_owned(), id);
        }
        if let Some(node) = self.nodes.get_mut(&id) {
            node.links.push((parent, name.to_owned()));
        }
    }

    fn detach(&mut self, parent: Id, name: &OsStr) -> Option<Id> {
        let id = self.nodes.get_mut(&parent)?.entries.remove(name)?;
        if let Some(node) = self.nodes.get_mut(&id) {
            node.links.retain(|(p, n)| !(*p == parent && n == name));
        }
        Some(id)
    }

    /// A directory's entries changed.
    fn mark(&mut self, dir: Id) {
        self.changed.insert(dir);
        self.note(dir, false);
    }

    /// `Ext4Like`: the inode joins the running transaction (`Strict` has
    /// none: nothing to keep).
    fn note(&mut self, id: Id, resized: bool) {
        if self.dirs == DirModel::Strict {
            return;
        }
        self.running.insert(id);
        if resized {
            self.running_size.insert(id);
        }
    }

    fn durably_named(&self, id: Id) -> bool {
        self.nodes
            .values()
            .any(|n| n.durable.values().any(|v| *v == id))
    }

    /// The journal commits if the synced inode is in the running
    /// transaction (`Ext4Like` only: under `Strict` no file sync makes a
    /// name durable).
    fn commit_if_running(&mut self, id: Id, datasync: bool) -> Vec<Id> {
        let running = match datasync {
            true => &self.running_size,
            false => &self.running,
        };
        if self.dirs != DirModel::Ext4Like || !running.contains(&id) {
            return Vec::new();
        }
        let mut dropped = false;
        for dir in std::mem::take(&mut self.changed) {
            dropped |= self.make_durable(dir);
        }
        self.running.clear();
        self.running_size.clear();
        self.nodes.values_mut().for_each(Node::commit_size);
        match dropped {
            true => self.gc(),
            false => Vec::new(),
        }
    }

    /// A directory's entries become its durable ones. True if that dropped
    /// a durable name of something with no name left (time to collect).
    fn make_durable(&mut self, dir: Id) -> bool {
        let Some(node) = self.nodes.get_mut(&dir) else {
            return false;
        };
        let old = std::mem::replace(&mut node.durable, node.entries.clone());
        old.values()
            .any(|id| self.nodes.get(id).is_none_or(|n| n.links.is_empty()))
    }

    /// Forgets what neither the tree now nor any durable entry still
    /// reachable names; returns the stashed ones among them.
    fn gc(&mut self) -> Vec<Id> {
        let mut alive = BTreeSet::from([ROOT]);
        let mut todo = vec![ROOT];
        let linked = self.nodes.iter().filter(|(_, n)| !n.links.is_empty());
        todo.extend(linked.map(|(id, _)| *id));
        alive.extend(todo.iter().copied());
        while let Some(id) = todo.pop() {
            let Some(node) = self.nodes.get(&id) else {
                continue;
            };
            for child in node.entries.values().chain(node.durable.values()) {
                if alive.insert(*child) {
                    todo.push(*child);
                }
            }
        }
        let dead: Vec<Id> = self
            .nodes
            .keys()
            .filter(|id| !alive.contains(id))
            .copied()
            .collect();
        let mut purge = Vec::new();
        for id in dead {
            self.nodes.remove(&id);
            if self.stashed.contains(&id) {
                purge.push(id);
            }
            self.forget(id);
        }
        purge
    }

    fn forget(&mut self, id: Id) {
        self.stashed.remove(&id);
        self.changed.remove(&id);
        self.running.remove(&id);
        self.running_size.remove(&id);
    }
}

/// Where a stashed id lives, relative to the backing directory.
pub fn stash_path(id: Id) -> PathBuf {
    PathBuf::from(STASH).join(id.to_string())
}
