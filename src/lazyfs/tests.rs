//! The model and the power-loss plan on literal sequences: each row says
//! what was done, what the power loss reports, which steps it takes, and
//! what the files hold after them.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::model::{DirModel, Id, Kind, Model, Undo, ROOT, STASH};
use super::plan::Step;

/// One thing done through the file system, as the adapter tells the model.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// On the backing directory at mount, with its contents (None: a directory).
    Found(&'static str, Option<&'static str>),
    Create(&'static str),
    Mkdir(&'static str),
    Write(&'static str, u64, &'static str),
    Append(&'static str, &'static str),
    Truncate(&'static str, u64),
    Fsync(&'static str),
    Fdatasync(&'static str),
    FsyncDir(&'static str),
    /// `sync(2)`: everything.
    SyncAll,
    Unlink(&'static str),
    Rename(&'static str, &'static str),
    Link(&'static str, &'static str),
}
use Op::*;

/// The model and, beside it, what each file holds (the backing files'
/// bytes, as the adapter would read them for its undo records).
struct Sim {
    model: Model,
    data: BTreeMap<Id, Vec<u8>>,
    purged: Vec<Id>,
}

impl Sim {
    fn new(dirs: DirModel) -> Sim {
        Sim {
            model: Model::new(dirs),
            data: BTreeMap::new(),
            purged: Vec::new(),
        }
    }

    fn at(&self, path: &str) -> (Id, &'static OsStr) {
        let path = Path::new(path);
        let parent = path.parent().map_or(ROOT, |p| self.id(p));
        let name = path.file_name().unwrap().to_owned();
        (parent, Box::leak(name.into_boxed_os_str()))
    }

    fn id(&self, path: &Path) -> Id {
        path.iter().fold(ROOT, |dir, name| {
            self.model
                .lookup(dir, name)
                .unwrap_or_else(|| panic!("no {}", path.display()))
        })
    }

    fn write(&mut self, path: &str, offset: u64, bytes: &[u8], truncate: Option<u64>) {
        let id = self.id(Path::new(path));
        let data = self.data.entry(id).or_default();
        let old_len = data.len() as u64;
        let (start, end) = match truncate {
            Some(len) => (len.min(old_len), old_len),
            None => (
                offset.min(old_len),
                (offset + bytes.len() as u64).min(old_len),
            ),
        };
        let old = data[start as usize..end as usize].to_vec();
        match truncate {
            Some(len) => data.resize(len as usize, 0),
            None => {
                let end = offset as usize + bytes.len();
                data.resize(data.len().max(end), 0);
                data[offset as usize..end].copy_from_slice(bytes);
            }
        }
        let changed = truncate.map_or(bytes.len() as u64, |_| old_len - start);
        let undo = Undo {
            offset: start,
            old,
            old_len,
        };
        let len = data.len() as u64;
        match truncate {
            Some(_) => self.model.resized(id, undo, changed, len),
            None => self.model.changed(id, undo, changed, len),
        }
    }

    fn run(&mut self, op: Op) {
        match op {
            Found(path, contents) => {
                let (dir, name) = self.at(path);
                let kind = contents.map_or(Kind::Dir, |_| Kind::File);
                let bytes = contents.unwrap_or_default().as_bytes().to_vec();
                let id = self.model.found(dir, name, kind, bytes.len() as u64);
                self.data.insert(id, bytes);
            }
            Create(path) | Mkdir(path) => {
                let (dir, name) = self.at(path);
                let kind = match op {
                    Mkdir(_) => Kind::Dir,
                    _ => Kind::File,
                };
                let id = self.model.create(dir, name, kind);
                self.data.insert(id, Vec::new());
            }
            Write(path, offset, text) => self.write(path, offset, text.as_bytes(), None),
            Append(path, text) => {
                let len = self.data[&self.id(Path::new(path))].len() as u64;
                self.write(path, len, text.as_bytes(), None)
            }
            Truncate(path, len) => self.write(path, 0, &[], Some(len)),
            Fsync(path) | Fdatasync(path) => {
                let id = self.id(Path::new(path));
                let purged = self.model.fsync(id, matches!(op, Fdatasync(_)));
                self.purged.extend(purged);
            }
            FsyncDir(path) => {
                let id = self.id(Path::new(path));
                let purged = self.model.fsyncdir(id, false);
                self.purged.extend(purged);
            }
            SyncAll => {
                let purged = self.model.sync_all();
                self.purged.extend(purged);
            }
            Unlink(path) => {
                let (dir, name) = self.at(path);
                let removed = self.model.unlink(dir, name).expect("a name to unlink");
                self.purged.extend(removed.purge);
            }
            Rename(from, to) => {
                let (from, to) = (self.at(from), self.at(to));
                let removed = self.model.rename(from, to);
                self.purged
                    .extend(removed.into_iter().flat_map(|r| r.purge));
            }
            Link(from, to) => {
                let id = self.id(Path::new(from));
                let (dir, name) = self.at(to);
                self.model.link(id, dir, name);
            }
        }
    }

    /// The file at a path the plan names before it moves anything: a name
    /// now, or a stashed id.
    fn id_before(&self, path: &Path) -> Id {
        match path.strip_prefix(STASH) {
            Ok(id) => id.to_str().unwrap().parse().unwrap(),
            Err(_) => self.id(path),
        }
    }
}

/// A step as one short line.
fn show(step: &Step) -> String {
    match step {
        Step::Restore { path, undo, sizes } => match sizes.is_empty() {
            true => format!("restore {} ({})", path.display(), undo.len()),
            false => format!(
                "restore {} ({}), sizes {sizes:?}",
                path.display(),
                undo.len()
            ),
        },
        Step::Stash { path, id } => format!("stash {} as #{id}", path.display()),
        Step::Remove { path } => format!("remove {}", path.display()),
        Step::Place { id, path } => format!("place #{id} at {}", path.display()),
        Step::Link { from, to } => format!("link {} -> {}", from.display(), to.display()),
        Step::Purge { id } => format!("purge #{id}"),
    }
}

struct Row {
    name: &'static str,
    dirs: DirModel,
    ops: &'static [Op],
    lost: &'static [&'static str],
    steps: &'static [&'static str],
    /// What files hold after the restore steps, by their path before.
    contents: &'static [(&'static str, &'static str)],
}

const S: DirModel = DirModel::Strict;
const E: DirModel = DirModel::Ext4Like;

#[rustfmt::skip]
const ROWS: &[Row] = &[
    Row { name: "write and lose it", dirs: S,
        ops: &[Found("a", Some("old")), Write("a", 0, "NEW")],
        lost: &["a: 3 unsynced bytes undone (size 3 -> 3)"],
        steps: &["restore a (1)"], contents: &[("a", "old")] },
    Row { name: "write, fsync: kept", dirs: S,
        ops: &[Found("a", Some("old")), Write("a", 0, "NEW"), Fsync("a")],
        lost: &[], steps: &[], contents: &[("a", "NEW")] },
    Row { name: "write, fdatasync: kept", dirs: E,
        ops: &[Found("a", Some("old")), Write("a", 0, "NEW"), Fdatasync("a")],
        lost: &[], steps: &[], contents: &[("a", "NEW")] },
    Row { name: "writes over writes: the first record wins", dirs: S,
        ops: &[Found("a", Some("abcdef")), Write("a", 1, "XX"), Write("a", 0, "YYYYYYYY"), Write("a", 2, "Z")],
        lost: &["a: 11 unsynced bytes undone (size 8 -> 6)"],
        steps: &["restore a (3)"], contents: &[("a", "abcdef")] },
    Row { name: "truncate and lose it", dirs: S,
        ops: &[Found("a", Some("hello world")), Truncate("a", 5)],
        lost: &["a: 6 unsynced bytes undone (size 5 -> 11)"],
        steps: &["restore a (1)"], contents: &[("a", "hello world")] },
    Row { name: "truncate, fsync: kept", dirs: S,
        ops: &[Found("a", Some("hello world")), Truncate("a", 5), Fsync("a")],
        lost: &[], steps: &[], contents: &[("a", "hello")] },
    Row { name: "append after an fsync", dirs: S,
        ops: &[Found("a", Some("one")), Append("a", "two"), Fsync("a"), Append("a", "three")],
        lost: &["a: 5 unsynced bytes undone (size 11 -> 6)"],
        steps: &["restore a (1)"], contents: &[("a", "onetwo")] },
    Row { name: "create, write: the name goes", dirs: S,
        ops: &[Create("b"), Write("b", 0, "x")],
        lost: &["b: name removed (never made durable)"], steps: &["remove b"], contents: &[] },
    Row { name: "create, fsync the file, not the directory (strict)", dirs: S,
        ops: &[Create("b"), Write("b", 0, "x"), Fsync("b")],
        lost: &["b: name removed (never made durable)"], steps: &["remove b"], contents: &[] },
    Row { name: "create, fsync the file, not the directory (ext4)", dirs: E,
        ops: &[Create("b"), Write("b", 0, "x"), Fsync("b")],
        lost: &[], steps: &[], contents: &[("b", "x")] },
    Row { name: "create, fsync the directory, not the file", dirs: S,
        ops: &[Create("b"), Write("b", 0, "xy"), FsyncDir("")],
        lost: &["b: 2 unsynced bytes undone (size 2 -> 0)"],
        steps: &["restore b (1)"], contents: &[("b", "")] },
    Row { name: "rename without a directory fsync (strict)", dirs: S,
        ops: &[Found("a", Some("x")), Rename("a", "b"), Fsync("b")],
        lost: &["b: name removed (never made durable)", "a: name back (its removal never made durable)"],
        steps: &["stash b as #2", "place #2 at a"], contents: &[] },
    Row { name: "rename, fsync the file (ext4: the journal commits)", dirs: E,
        ops: &[Found("a", Some("x")), Rename("a", "b"), Fsync("b")],
        lost: &[], steps: &[], contents: &[] },
    Row { name: "rename with no sync at all (ext4)", dirs: E,
        ops: &[Found("a", Some("x")), Rename("a", "b")],
        lost: &["b: name removed (never made durable)", "a: name back (its removal never made durable)"],
        steps: &["stash b as #2", "place #2 at a"], contents: &[] },
    Row { name: "sync(2): everything written and named is kept (strict)", dirs: S,
        ops: &[Found("a", Some("x")), Mkdir("d"), Create("d/b"), Write("d/b", 0, "yz"), Write("a", 0, "w"), Rename("a", "c"), SyncAll],
        lost: &[], steps: &[], contents: &[("c", "w"), ("d/b", "yz")] },
    Row { name: "sync(2), then a write: only the write is undone", dirs: S,
        ops: &[Found("a", Some("x")), Write("a", 0, "y"), SyncAll, Append("a", "z")],
        lost: &["a: 1 unsynced bytes undone (size 2 -> 1)"], steps: &["restore a (1)"], contents: &[("a", "y")] },
    Row { name: "rename, fsync the directory", dirs: S,
        ops: &[Found("a", Some("x")), Rename("a", "b"), FsyncDir("")],
        lost: &[], steps: &[], contents: &[] },
    Row { name: "rename over a durable file", dirs: S,
        ops: &[Found("a", Some("new")), Found("b", Some("old")), Rename("a", "b")],
        lost: &["b: name removed (never made durable)", "a: name back (its removal never made durable)",
                "b: name back (its removal never made durable)"],
        steps: &["stash b as #2", "place #2 at a", "place #3 at b"], contents: &[] },
    Row { name: "fdatasync of an overwrite commits nothing (ext4)", dirs: E,
        ops: &[Found("a", Some("abc")), Create("b"), FsyncDir(""), Create("c"), Write("a", 0, "xyz"), Fdatasync("a")],
        lost: &["c: name removed (never made durable)"], steps: &["remove c"], contents: &[("a", "xyz")] },
    Row { name: "fsync of an overwrite commits (ext4)", dirs: E,
        ops: &[Found("a", Some("abc")), Create("c"), Write("a", 0, "xyz"), Fsync("a")],
        lost: &[], steps: &[], contents: &[("a", "xyz")] },
    Row { name: "a truncation, then another file's fsync: the commit keeps it (ext4)", dirs: E,
        ops: &[Found("a", Some("hello world")), Found("b", Some("x")), Truncate("a", 5), Write("b", 0, "y"), Fsync("b")],
        lost: &[], steps: &[], contents: &[("a", "hello"), ("b", "y")] },
    Row { name: "a truncation, no commit: undone (ext4)", dirs: E,
        ops: &[Found("a", Some("hello world")), Found("b", Some("x")), Truncate("a", 5), Write("b", 0, "y"), Fdatasync("b")],
        lost: &["a: 6 unsynced bytes undone (size 5 -> 11)"],
        steps: &["restore a (1)"], contents: &[("a", "hello world"), ("b", "y")] },
    Row { name: "a write, a truncation, a commit: the write undone, the cut kept (ext4)", dirs: E,
        ops: &[Found("a", Some("hello world")), Found("b", Some("x")), Write("a", 0, "HE"), Truncate("a", 5),
               Truncate("a", 8), Write("b", 0, "y"), Fsync("b"), Append("a", "zz")],
        lost: &["a: 10 unsynced bytes undone (size 10 -> 8)"],
        steps: &["restore a (4), sizes [5, 8]"], contents: &[("a", "hello\0\0\0")] },
    Row { name: "a truncation under strict: another file's fsync commits nothing", dirs: S,
        ops: &[Found("a", Some("hello world")), Found("b", Some("x")), Truncate("a", 5), Fsync("b")],
        lost: &["a: 6 unsynced bytes undone (size 5 -> 11)"],
        steps: &["restore a (1)"], contents: &[("a", "hello world")] },
    Row { name: "unlink without a directory fsync", dirs: S,
        ops: &[Found("a", Some("x")), Unlink("a")],
        lost: &["a: name back (its removal never made durable)"], steps: &["place #2 at a"], contents: &[] },
    Row { name: "unlink, fsync the directory: gone, stash purged", dirs: S,
        ops: &[Found("a", Some("x")), Unlink("a"), FsyncDir("")],
        lost: &[], steps: &[], contents: &[] },
    Row { name: "a new directory's file, synced, in a directory never synced", dirs: S,
        ops: &[Mkdir("d"), Create("d/f"), Write("d/f", 0, "x"), Fsync("d/f"), FsyncDir("d")],
        lost: &["d: name removed (never made durable)"], steps: &["remove d"], contents: &[] },
    Row { name: "the same under ext4: the journal holds it all", dirs: E,
        ops: &[Mkdir("d"), Create("d/f"), Write("d/f", 0, "x"), Fsync("d/f")],
        lost: &[], steps: &[], contents: &[("d/f", "x")] },
    Row { name: "a durable file moved into a new directory comes out first", dirs: S,
        ops: &[Found("a", Some("x")), Mkdir("d"), Rename("a", "d/a"), FsyncDir("d")],
        lost: &["d/a: name removed (never made durable)", "d: name removed (never made durable)",
                "a: name back (its removal never made durable)"],
        steps: &["stash d/a as #2", "remove d", "place #2 at a"], contents: &[] },
    Row { name: "a cross-directory rename synced on one side only (strict)", dirs: S,
        ops: &[Found("d", None), Found("a", Some("x")), Rename("a", "d/a"), FsyncDir("d")],
        lost: &["a: name back (its removal never made durable)"],
        steps: &["link d/a -> a"], contents: &[] },
    Row { name: "a hard link's first name removed", dirs: S,
        ops: &[Found("a", Some("x")), Link("a", "b"), Unlink("a")],
        lost: &["b: name removed (never made durable)", "a: name back (its removal never made durable)"],
        steps: &["stash b as #2", "place #2 at a"], contents: &[] },
    Row { name: "rmdir without a directory fsync", dirs: S,
        ops: &[Found("d", None), Unlink("d")],
        lost: &["d: name back (its removal never made durable)"], steps: &["place #2 at d"], contents: &[] },
    Row { name: "a durable directory renamed takes its files along", dirs: S,
        ops: &[Found("d", None), Found("d/f", Some("x")), Rename("d", "e"), Write("e/f", 1, "y")],
        lost: &["d/f: 1 unsynced bytes undone (size 2 -> 1)", "e: name removed (never made durable)",
                "d: name back (its removal never made durable)"],
        steps: &["restore e/f (1)", "stash e as #2", "place #2 at d"], contents: &[("e/f", "x")] },
];

#[test]
fn a_power_loss_undoes_exactly_what_was_never_made_durable() {
    let mut failures = Vec::new();
    for row in ROWS {
        let mut sim = Sim::new(row.dirs);
        for op in row.ops {
            sim.run(*op);
        }
        let plan = sim.model.power_loss();
        let lost: Vec<String> = plan.lost.iter().map(ToString::to_string).collect();
        let steps: Vec<String> = plan.steps.iter().map(show).collect();
        let mut data = sim.data.clone();
        for step in &plan.steps {
            if let Step::Restore { path, undo, sizes } = step {
                let bytes = data.get_mut(&sim.id_before(path)).unwrap();
                for u in undo {
                    let end = u.offset as usize + u.old.len();
                    bytes.resize(bytes.len().max(end), 0);
                    bytes[u.offset as usize..end].copy_from_slice(&u.old);
                    bytes.resize(u.old_len as usize, 0);
                }
                for len in sizes {
                    bytes.resize(*len as usize, 0);
                }
            }
        }
        let contents: Vec<(&str, String)> = row
            .contents
            .iter()
            .map(|(p, _)| {
                (
                    *p,
                    String::from_utf8_lossy(&data[&sim.id(Path::new(p))]).into(),
                )
            })
            .collect();
        let want: Vec<(&str, String)> = row
            .contents
            .iter()
            .map(|(p, c)| (*p, c.to_string()))
            .collect();
        if lost != row.lost || steps != row.steps || contents != want {
            failures.push(format!(
                "{}: lost {lost:?}, steps {steps:?}, contents {contents:?}",
                row.name
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn a_sync_that_makes_a_removal_durable_purges_the_stash() {
    let mut sim = Sim::new(DirModel::Strict);
    for op in [
        Found("a", Some("x")),
        Found("d", None),
        Unlink("a"),
        Unlink("d"),
    ] {
        sim.run(op);
    }
    assert_eq!(sim.model.path(2), Some(PathBuf::from(STASH).join("2")));
    sim.run(FsyncDir(""));
    assert_eq!(sim.purged, vec![2, 3]);
    assert_eq!(sim.model.power_loss().steps, vec![]);

    // Under ext4 the commit of any sync does it.
    let mut sim = Sim::new(DirModel::Ext4Like);
    for op in [Found("a", Some("x")), Unlink("a"), Create("c"), Fsync("c")] {
        sim.run(op);
    }
    assert_eq!(sim.purged, vec![2]);
}

#[test]
fn a_removed_directory_takes_its_durable_names_with_it() {
    // d/f unlinked (kept: d still names it durably), then d itself, then
    // the root synced: neither can come back, both are purged.
    let mut sim = Sim::new(DirModel::Strict);
    for op in [
        Found("d", None),
        Found("d/f", Some("x")),
        Unlink("d/f"),
        Unlink("d"),
    ] {
        sim.run(op);
    }
    sim.run(FsyncDir(""));
    assert_eq!(sim.purged, vec![2, 3]);
}

#[test]
fn unsynced_lists_the_files_with_data_to_lose() {
    let mut sim = Sim::new(DirModel::Strict);
    for op in [
        Found("a", Some("x")),
        Found("b", Some("y")),
        Append("a", "12"),
        Append("b", "3"),
        Fsync("b"),
    ] {
        sim.run(op);
    }
    assert_eq!(sim.model.unsynced(), vec![(PathBuf::from("a"), 2)]);
}
