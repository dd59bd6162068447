//! The I/O around the model: the backing directory read into it at mount,
//! the stash kept while mounted, and a power loss's steps carried out.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::model::{stash_path, Id, Kind, Model, Undo, ROOT, STASH};
use super::plan::Step;

/// Reads the backing directory into a fresh model: everything on it is
/// durable. A stash left by an earlier mount (mqlab killed while mounted)
/// held only removals that were never undone: it goes.
pub(super) fn scan(backing: &Path, model: &mut Model) -> io::Result<()> {
    remove_any(&backing.join(STASH))?;
    let mut seen: HashMap<(u64, u64), Id> = HashMap::new();
    let mut todo = vec![(ROOT, backing.to_path_buf())];
    while let Some((dir, path)) = todo.pop() {
        let mut names: Vec<_> = fs::read_dir(&path)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<_>>()?;
        names.sort();
        for name in names {
            let full = path.join(&name);
            let meta = fs::symlink_metadata(&full)?;
            let kind = kind_of(&meta.file_type());
            let key = (meta.dev(), meta.ino());
            match seen.get(&key) {
                Some(id) if kind != Kind::Dir => model.found_link(dir, &name, *id),
                _ => {
                    let id = model.found(dir, &name, kind, meta.len());
                    seen.insert(key, id);
                    if kind == Kind::Dir {
                        todo.push((id, full));
                    }
                }
            }
        }
    }
    Ok(())
}

pub(super) fn kind_of(t: &fs::FileType) -> Kind {
    if t.is_dir() {
        Kind::Dir
    } else if t.is_file() {
        Kind::File
    } else if t.is_symlink() {
        Kind::Symlink
    } else {
        Kind::Other
    }
}

/// Moves a name into the stash (a removal a power loss may undo).
pub(super) fn stash(backing: &Path, path: &Path, id: Id) -> io::Result<()> {
    make_stash(backing)?;
    fs::rename(backing.join(path), backing.join(stash_path(id)))
}

/// Keeps a second name of a file in the stash (before a rename replaces
/// the first).
pub(super) fn stash_link(backing: &Path, path: &Path, id: Id) -> io::Result<()> {
    make_stash(backing)?;
    fs::hard_link(backing.join(path), backing.join(stash_path(id)))
}

/// Takes a stashed id back to a name (a rename that failed after its
/// victim was stashed).
pub(super) fn unstash(backing: &Path, id: Id, path: &Path) -> io::Result<()> {
    fs::rename(backing.join(stash_path(id)), backing.join(path))
}

/// Deletes what no power loss can bring back any more.
pub(super) fn purge(backing: &Path, ids: &[Id]) -> io::Result<()> {
    ids.iter()
        .try_for_each(|id| remove_any(&backing.join(stash_path(*id))))
}

/// The stash when nothing is left to undo (an unmount, the end of a power
/// loss).
pub(super) fn drop_stash(backing: &Path) -> io::Result<()> {
    remove_any(&backing.join(STASH))
}

fn make_stash(backing: &Path) -> io::Result<()> {
    match fs::DirBuilder::new()
        .mode(0o700)
        .create(backing.join(STASH))
    {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// Carries out a power loss's steps in order, then drops the stash. The
/// first failure stops it, with the path it was at.
pub(super) fn apply(backing: &Path, steps: &[Step]) -> Result<(), (PathBuf, io::Error)> {
    let at = |p: &Path| backing.join(p);
    for step in steps {
        let (path, done) = match step {
            Step::Restore { path, undo, sizes } => (path.clone(), restore(&at(path), undo, sizes)),
            Step::Stash { path, id } => (path.clone(), stash(backing, path, *id)),
            Step::Remove { path } => (path.clone(), remove_any(&at(path))),
            Step::Place { id, path } => (path.clone(), unstash(backing, *id, path)),
            Step::Link { from, to } => (to.clone(), fs::hard_link(at(from), at(to))),
            Step::Purge { id } => (stash_path(*id), purge(backing, &[*id])),
        };
        done.map_err(|e| (path, e))?;
    }
    drop_stash(backing).map_err(|e| (PathBuf::from(STASH), e))
}

/// Writes the old bytes back, newest record first, each followed by its
/// old length: the earliest record, applied last, leaves the file as its
/// last sync did; then the lengths journal commits made durable since.
fn restore(path: &Path, undo: &[Undo], sizes: &[u64]) -> io::Result<()> {
    let file = fs::OpenOptions::new().read(true).write(true).open(path)?;
    for u in undo {
        file.write_all_at(&u.old, u.offset)?;
        file.set_len(u.old_len)?;
    }
    sizes.iter().try_for_each(|len| file.set_len(*len))
}

/// Deletes a file, a symlink or a directory with what is in it; already
/// gone is fine.
fn remove_any(path: &Path) -> io::Result<()> {
    let res = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    match res {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}
