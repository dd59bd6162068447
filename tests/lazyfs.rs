//! The lazy file system on a real FUSE mount: literal sequences done
//! through the mount, a power loss, a fresh mount, and what is there.
//! Needs root and `/dev/fuse`: without them these tests fail with a
//! sentence, they do not skip.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::JoinHandle;

use mqlab::lazyfs::{DirModel, Hold, LazyFs, Mount};

fn require_fuse() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "tests/lazyfs.rs needs root: the lazy file system mounts with mount(2) and `allow_other` (run the tests as root, as CI does)"
    );
    assert!(
        Path::new("/dev/fuse").exists(),
        "tests/lazyfs.rs needs /dev/fuse (hint: `modprobe fuse`; a container needs `--device /dev/fuse`)"
    );
}

/// A scratch directory with `backing/` and `mnt/`. Made 0755 whatever the
/// umask: a test acts as `nobody` under it.
fn scratch() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let (backing, mnt) = (dir.path().join("backing"), dir.path().join("mnt"));
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&mnt).unwrap();
    (dir, backing, mnt)
}

fn mounted_at(mnt: &Path) -> bool {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    let mnt = mnt.canonicalize().unwrap_or_else(|_| mnt.to_path_buf());
    !mqlab::lazyfs::fuse_mounts_under(&mounts, &mnt).is_empty()
}

/// One thing done through the mount.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// `pwrite` at an offset (the file is created if missing, 0644).
    Write(&'static str, u64, &'static str),
    /// A write through an `O_APPEND` handle.
    Append(&'static str, &'static str),
    /// A write at 0 through an `O_DSYNC` handle.
    SyncWrite(&'static str, &'static str),
    Truncate(&'static str, u64),
    /// An open with `O_TRUNC`, then a write.
    Rewrite(&'static str, &'static str),
    /// An open with `O_RDONLY | O_TRUNC` (Linux truncates: the kernel
    /// sends a `setattr` first).
    ReadTrunc(&'static str),
    /// `posix_fallocate` from 0 to a length.
    Fallocate(&'static str, i64),
    Link(&'static str, &'static str),
    /// A symlink at the second path to the first.
    Symlink(&'static str, &'static str),
    /// Opens a file, unlinks it, writes through the open file and syncs it.
    UnlinkedSync(&'static str, &'static str),
    Fsync(&'static str),
    Fdatasync(&'static str),
    FsyncDir(&'static str),
    Rename(&'static str, &'static str),
    Unlink(&'static str),
    Mkdir(&'static str),
    /// Arms a hold on the path's next fsync, starts a thread that fsyncs
    /// it, and waits until the file system holds it.
    Hold(&'static str),
    /// The same, the thread writing at 0 through an `O_DSYNC` handle: the
    /// hold catches the `FUSE_FSYNC` the kernel sends for the write.
    HoldSyncWrite(&'static str, &'static str),
    /// Releases the held fsync and waits for it to succeed.
    Release,
}
use Op::*;

type Held = (Hold, JoinHandle<std::io::Result<()>>);

fn open(path: &Path, custom: i32) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o644)
        .custom_flags(custom)
        .open(path)
}

fn run(op: Op, mount: &Mount, mnt: &Path, held: &mut Option<Held>) -> std::io::Result<()> {
    let at = |p: &str| mnt.join(p);
    match op {
        Write(p, offset, text) => open(&at(p), 0)?.write_all_at(text.as_bytes(), offset),
        Append(p, text) => open(&at(p), nix::libc::O_APPEND)?.write_all(text.as_bytes()),
        SyncWrite(p, text) => open(&at(p), nix::libc::O_DSYNC)?.write_all_at(text.as_bytes(), 0),
        Truncate(p, len) => open(&at(p), 0)?.set_len(len),
        Rewrite(p, text) => open(&at(p), nix::libc::O_TRUNC)?.write_all(text.as_bytes()),
        ReadTrunc(p) => OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_TRUNC)
            .open(at(p))
            .map(drop),
        Fallocate(p, len) => {
            nix::fcntl::posix_fallocate(open(&at(p), 0)?, 0, len).map_err(std::io::Error::from)
        }
        Link(a, b) => fs::hard_link(at(a), at(b)),
        Symlink(target, p) => std::os::unix::fs::symlink(target, at(p)),
        UnlinkedSync(p, text) => {
            let mut file = open(&at(p), 0)?;
            fs::remove_file(at(p))?;
            file.write_all(text.as_bytes())?;
            file.sync_all()
        }
        Fsync(p) => File::open(at(p))?.sync_all(),
        Fdatasync(p) => File::open(at(p))?.sync_data(),
        FsyncDir(p) => File::open(at(p))?.sync_all(),
        Rename(a, b) => fs::rename(at(a), at(b)),
        Unlink(p) => fs::remove_file(at(p)),
        Mkdir(p) => fs::create_dir(at(p)),
        Hold(p) | HoldSyncWrite(p, _) => {
            let hold = mount.hold_next_fsync(p);
            let path = at(p);
            let sync = std::thread::spawn(move || match op {
                HoldSyncWrite(_, text) => {
                    open(&path, nix::libc::O_DSYNC)?.write_all_at(text.as_bytes(), 0)
                }
                _ => File::open(path)?.sync_all(),
            });
            let (hold, synced) = held_within(hold, HELD_WITHIN);
            assert_eq!(synced.map_err(std::io::Error::other)?, Path::new(p));
            *held = Some((hold, sync));
            Ok(())
        }
        Release => {
            let (hold, sync) = held.take().expect("a held fsync");
            hold.release();
            sync.join().unwrap()
        }
    }
}

/// How long a test waits for a hold to fire before it fails.
const HELD_WITHIN: std::time::Duration = std::time::Duration::from_secs(20);

/// Waits for a hold to fire, failing the test (never hanging) if nothing
/// syncs its path within `within`.
fn held_within(mut hold: Hold, within: std::time::Duration) -> (Hold, Result<PathBuf, String>) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let synced = hold.wait_held().map_err(|e| e.to_string());
        let _ = tx.send((hold, synced));
    });
    rx.recv_timeout(within)
        .unwrap_or_else(|_| panic!("no fsync was held within {within:?}"))
}

/// Every name under `dir`, sorted: `d/` for a directory, `f=contents`.
fn tree(dir: &Path, prefix: &str, out: &mut Vec<String>) {
    let mut names: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    for name in names {
        let path = dir.join(&name);
        if path.is_dir() {
            out.push(format!("{prefix}{name}/"));
            tree(&path, &format!("{prefix}{name}/"), out);
        } else {
            out.push(format!(
                "{prefix}{name}={}",
                fs::read_to_string(&path).unwrap()
            ));
        }
    }
}

struct Row {
    name: &'static str,
    dirs: DirModel,
    /// On the backing directory before the mount: `d/` a directory, else
    /// `name=contents`.
    before: &'static [&'static str],
    ops: &'static [Op],
    /// What the power loss reports.
    lost: &'static [&'static str],
    /// The tree through a fresh mount after the power loss.
    after: &'static [&'static str],
}

const S: DirModel = DirModel::Strict;
const E: DirModel = DirModel::Ext4Like;

#[rustfmt::skip]
const ROWS: &[Row] = &[
    Row { name: "write and lose it", dirs: S, before: &["a=old"],
        ops: &[Write("a", 0, "NEW")],
        lost: &["a: 3 unsynced bytes undone (size 3 -> 3)"], after: &["a=old"] },
    Row { name: "write, fsync and keep it", dirs: S, before: &["a=old"],
        ops: &[Write("a", 0, "NEW"), Fsync("a")],
        lost: &[], after: &["a=NEW"] },
    Row { name: "write, fdatasync and keep it", dirs: E, before: &["a=old"],
        ops: &[Write("a", 0, "NEW"), Fdatasync("a")],
        lost: &[], after: &["a=NEW"] },
    Row { name: "a write through O_DSYNC is kept", dirs: S, before: &["a=old"],
        ops: &[SyncWrite("a", "NEW")],
        lost: &[], after: &["a=NEW"] },
    Row { name: "rename without a directory fsync (strict)", dirs: S, before: &["a=x"],
        ops: &[Rename("a", "b"), Fsync("b")],
        lost: &["b: name removed (never made durable)", "a: name back (its removal never made durable)"],
        after: &["a=x"] },
    Row { name: "rename without a directory fsync (ext4: the file's fsync commits it)", dirs: E, before: &["a=x"],
        ops: &[Rename("a", "b"), Fsync("b")],
        lost: &[], after: &["b=x"] },
    Row { name: "rename with no sync at all (ext4)", dirs: E, before: &["a=x"],
        ops: &[Rename("a", "b")],
        lost: &["b: name removed (never made durable)", "a: name back (its removal never made durable)"],
        after: &["a=x"] },
    Row { name: "rename, then the directory's fsync", dirs: S, before: &["a=x"],
        ops: &[Rename("a", "b"), FsyncDir("")],
        lost: &[], after: &["b=x"] },
    Row { name: "rename over a durable file, lost", dirs: S, before: &["a=new", "b=old"],
        ops: &[Rename("a", "b")],
        lost: &["b: name removed (never made durable)", "a: name back (its removal never made durable)",
                "b: name back (its removal never made durable)"],
        after: &["a=new", "b=old"] },
    Row { name: "truncate and lose it", dirs: S, before: &["a=hello world"],
        ops: &[Truncate("a", 5)],
        lost: &["a: 6 unsynced bytes undone (size 5 -> 11)"], after: &["a=hello world"] },
    Row { name: "truncate, fsync and keep it", dirs: S, before: &["a=hello world"],
        ops: &[Truncate("a", 5), Fsync("a")],
        lost: &[], after: &["a=hello"] },
    Row { name: "an open with O_TRUNC, lost", dirs: S, before: &["a=old text"],
        ops: &[Rewrite("a", "new")],
        lost: &["a: 11 unsynced bytes undone (size 3 -> 8)"], after: &["a=old text"] },
    Row { name: "an open with O_RDONLY|O_TRUNC, lost", dirs: S, before: &["a=old"],
        ops: &[ReadTrunc("a")],
        lost: &["a: 3 unsynced bytes undone (size 0 -> 3)"], after: &["a=old"] },
    Row { name: "an open with O_RDONLY|O_TRUNC, fsync: kept", dirs: S, before: &["a=old"],
        ops: &[ReadTrunc("a"), Fsync("a")],
        lost: &[], after: &["a="] },
    Row { name: "posix_fallocate past the end, lost", dirs: S, before: &["a=ab"],
        ops: &[Fallocate("a", 4096)],
        lost: &["a: 4094 unsynced bytes undone (size 4096 -> 2)"], after: &["a=ab"] },
    Row { name: "a hard link and a symlink, the directory synced", dirs: S, before: &["a=x"],
        ops: &[Link("a", "b"), Symlink("a", "s"), FsyncDir("")],
        lost: &[], after: &["a=x", "b=x", "s=x"] },
    Row { name: "a hard link and a symlink, never synced", dirs: S, before: &["a=x"],
        ops: &[Link("a", "b"), Symlink("a", "s")],
        lost: &["b: name removed (never made durable)", "s: name removed (never made durable)"],
        after: &["a=x"] },
    Row { name: "append after an fsync", dirs: S, before: &["a=one"],
        ops: &[Append("a", "two"), Fsync("a"), Append("a", "three")],
        lost: &["a: 5 unsynced bytes undone (size 11 -> 6)"], after: &["a=onetwo"] },
    Row { name: "a held fsync, power lost while held: the write is lost", dirs: S, before: &["a=old"],
        ops: &[Write("a", 0, "NEW"), Hold("a")],
        lost: &["a: 3 unsynced bytes undone (size 3 -> 3)"], after: &["a=old"] },
    Row { name: "a held fsync, released: the write is kept", dirs: S, before: &["a=old"],
        ops: &[Write("a", 0, "NEW"), Hold("a"), Release],
        lost: &[], after: &["a=NEW"] },
    Row { name: "an O_DSYNC write, its fsync held, power lost while held: lost", dirs: S, before: &["a=old"],
        ops: &[HoldSyncWrite("a", "NEW")],
        lost: &["a: 3 unsynced bytes undone (size 3 -> 3)"], after: &["a=old"] },
    Row { name: "an O_DSYNC write, its fsync held, released: kept", dirs: S, before: &["a=old"],
        ops: &[HoldSyncWrite("a", "NEW"), Release],
        lost: &[], after: &["a=NEW"] },
    Row { name: "a write past the end leaves a hole, lost", dirs: S, before: &["a=ab"],
        ops: &[Write("a", 4, "cd")],
        lost: &["a: 2 unsynced bytes undone (size 6 -> 2)"], after: &["a=ab"] },
    Row { name: "a write past the end leaves a hole, fsync: kept", dirs: S, before: &["a=ab"],
        ops: &[Write("a", 4, "cd"), Fsync("a")],
        lost: &[], after: &["a=ab\0\0cd"] },
    Row { name: "truncate, then extend: both undone", dirs: S, before: &["a=hello world"],
        ops: &[Truncate("a", 5), Truncate("a", 8)],
        lost: &["a: 9 unsynced bytes undone (size 8 -> 11)"], after: &["a=hello world"] },
    Row { name: "truncate, then extend, fsync: zeros kept", dirs: S, before: &["a=hello world"],
        ops: &[Truncate("a", 5), Truncate("a", 8), Fsync("a")],
        lost: &[], after: &["a=hello\0\0\0"] },
    Row { name: "write, fdatasync (strict): kept", dirs: S, before: &["a=old"],
        ops: &[Write("a", 0, "NEW"), Fdatasync("a")],
        lost: &[], after: &["a=NEW"] },
    Row { name: "rename over a durable file, the file's fsync commits it (ext4)", dirs: E,
        before: &["a=new", "b=old"], ops: &[Rename("a", "b"), Fsync("b")],
        lost: &[], after: &["b=new"] },
    Row { name: "rename over a durable file, no sync (ext4): lost", dirs: E, before: &["a=new", "b=old"],
        ops: &[Rename("a", "b")],
        lost: &["b: name removed (never made durable)", "a: name back (its removal never made durable)",
                "b: name back (its removal never made durable)"],
        after: &["a=new", "b=old"] },
    Row { name: "a truncation, then another file's fsync: the commit keeps it (ext4)",
        dirs: E, before: &["a=hello world", "b=x"],
        ops: &[Truncate("a", 5), Write("b", 0, "y"), Fsync("b")],
        lost: &[], after: &["a=hello", "b=y"] },
    Row { name: "a write, truncations, a commit: the write undone, the sizes kept (ext4)",
        dirs: E, before: &["a=hello world", "b=x"],
        ops: &[Write("a", 0, "HE"), Truncate("a", 5), Truncate("a", 8), Write("b", 0, "y"), Fsync("b"),
               Append("a", "zz")],
        lost: &["a: 13 unsynced bytes undone (size 10 -> 8)"], after: &["a=hello\0\0\0", "b=y"] },
    Row { name: "posix_fallocate past the end, then another file's fsync: kept (ext4)",
        dirs: E, before: &["a=ab", "b=x"],
        ops: &[Fallocate("a", 8), Write("b", 0, "y"), Fsync("b")],
        lost: &[], after: &["a=ab\0\0\0\0\0\0", "b=y"] },
    Row { name: "create, fsync the file but not the directory (strict)", dirs: S, before: &[],
        ops: &[Write("c", 0, "data"), Fsync("c")],
        lost: &["c: name removed (never made durable)"], after: &[] },
    Row { name: "create, fsync the file but not the directory (ext4)", dirs: E, before: &[],
        ops: &[Write("c", 0, "data"), Fsync("c")],
        lost: &[], after: &["c=data"] },
    Row { name: "create, fsync the directory but not the file", dirs: S, before: &[],
        ops: &[Write("c", 0, "data"), FsyncDir("")],
        lost: &["c: 4 unsynced bytes undone (size 4 -> 0)"], after: &["c="] },
    Row { name: "unlink without a directory fsync", dirs: S, before: &["a=x"],
        ops: &[Unlink("a")],
        lost: &["a: name back (its removal never made durable)"], after: &["a=x"] },
    Row { name: "a durable file unlinked while open, written and synced: its removal lost", dirs: S,
        before: &["a=x"], ops: &[UnlinkedSync("a", "y")],
        lost: &["a: name back (its removal never made durable)"], after: &["a=y"] },
    Row { name: "a new file unlinked while open, written and synced", dirs: S, before: &[],
        ops: &[Write("c", 0, "x"), UnlinkedSync("c", "y")],
        lost: &[], after: &[] },
    Row { name: "a new directory never synced in its parent", dirs: S, before: &[],
        ops: &[Mkdir("d"), Write("d/f", 0, "x"), Fsync("d/f"), FsyncDir("d")],
        lost: &["d: name removed (never made durable)"], after: &[] },
    Row { name: "a durable directory renamed, its file written", dirs: S, before: &["d/", "d/f=x"],
        ops: &[Rename("d", "e"), Write("e/f", 1, "y")],
        lost: &["d/f: 1 unsynced bytes undone (size 2 -> 1)", "e: name removed (never made durable)",
                "d: name back (its removal never made durable)"],
        after: &["d/", "d/f=x"] },
];

fn check(row: &Row) -> Result<(), String> {
    let (_dir, backing, mnt) = scratch();
    for line in row.before {
        match line.split_once('=') {
            Some((name, text)) => fs::write(backing.join(name), text).unwrap(),
            None => fs::create_dir(backing.join(line)).unwrap(),
        }
    }
    let mount = LazyFs::mount(&backing, &mnt, row.dirs).map_err(|e| e.to_string())?;
    let mut held = None;
    for op in row.ops {
        run(*op, &mount, &mnt, &mut held).map_err(|e| format!("{op:?}: {e}"))?;
    }
    let loss = mount.power_loss().map_err(|e| e.to_string())?;
    if let Some((_hold, sync)) = held {
        let synced = sync.join().unwrap();
        if synced.is_ok() {
            return Err("the held fsync succeeded through a power loss".into());
        }
    }
    if mounted_at(&mnt) {
        return Err("still mounted after the power loss".into());
    }
    let lost: Vec<String> = loss.lost.iter().map(ToString::to_string).collect();
    let mount = LazyFs::mount(&backing, &mnt, row.dirs).map_err(|e| e.to_string())?;
    let mut after = Vec::new();
    tree(&mnt, "", &mut after);
    mount.unmount().map_err(|e| e.to_string())?;
    let stash = backing.join(mqlab::lazyfs::model::STASH).exists();
    match (
        lost == row.lost,
        after == row.after,
        stash,
        mounted_at(&mnt),
    ) {
        (true, true, false, false) => Ok(()),
        _ => Err(format!(
            "lost {lost:?}, after {after:?}, stash left {stash}"
        )),
    }
}

#[test]
fn a_power_loss_drops_exactly_what_was_never_made_durable() {
    require_fuse();
    let failures: Vec<String> = ROWS
        .iter()
        .filter_map(|row| check(row).err().map(|e| format!("{}: {e}", row.name)))
        .collect();
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `allow_other` with `default_permissions`: owners and modes pass through
/// and the kernel enforces them, as a server running as its own user
/// expects (PostgreSQL: its data directory 0700 and its own). `nobody`
/// stands for the server's user.
#[test]
fn owners_and_modes_pass_through_and_are_enforced() {
    require_fuse();
    let (_dir, backing, mnt) = scratch();
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let (uid, gid) = (nobody.uid.as_raw(), nobody.gid.as_raw());
    std::os::unix::fs::chown(&backing, Some(uid), Some(gid)).unwrap();
    fs::set_permissions(&backing, fs::Permissions::from_mode(0o700)).unwrap();
    let _mount = LazyFs::mount(&backing, &mnt, DirModel::Strict).unwrap();
    let top = fs::metadata(&mnt).unwrap();
    assert_eq!((top.uid(), top.mode() & 0o7777), (uid, 0o700));
    let as_user = |uid: u32, gid: u32, script: &str| {
        Command::new("sh")
            .args(["-c", script])
            .current_dir("/")
            .stderr(std::process::Stdio::null())
            .uid(uid)
            .gid(gid)
            .status()
            .unwrap()
            .success()
    };
    use std::os::unix::process::CommandExt;
    let script = format!(
        "umask 077 && mkdir {0}/d && echo x > {0}/d/f",
        mnt.display()
    );
    assert!(
        as_user(uid, gid, &script),
        "nobody could not write in its own directory"
    );
    let made = fs::metadata(backing.join("d/f")).unwrap();
    assert_eq!(
        (made.uid(), made.gid(), made.mode() & 0o777),
        (uid, gid, 0o600)
    );
    let other = format!("echo y > {}/g", mnt.display());
    assert!(
        !as_user(1, 1, &other),
        "another user wrote in a 0700 directory"
    );
}

/// A mount left by a killed harness (a child process that mounted, then
/// SIGKILLed: its mount stays, dead) is detached by the run directory's
/// cleanup, which then removes the directory.
#[test]
fn the_cleanup_guard_detaches_a_mount_left_by_a_killed_harness() {
    require_fuse();
    let run = tempfile::tempdir().unwrap().keep();
    fs::create_dir(run.join("backing")).unwrap();
    fs::create_dir(run.join("mnt")).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["mount_and_wait_to_be_killed", "--exact", "--ignored"])
        .args(["--nocapture", "--test-threads=1"])
        .env(KILLED_RUN, &run)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mounted = said_within(
        child.stdout.take().unwrap(),
        std::time::Duration::from_secs(30),
    );
    if !mounted {
        let _ = child.kill();
        let _ = child.wait();
        mqlab::env::guard::reap(&run, std::time::Duration::from_secs(5));
        panic!("the child did not say `mounted` within 30 s");
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let mnt = run.join("mnt");
    assert!(
        mounted_at(&mnt),
        "the killed child's mount is not left behind"
    );
    let dead = fs::metadata(&mnt).unwrap_err().raw_os_error();
    assert_eq!(dead, Some(nix::libc::ENOTCONN), "not a dead mount");
    mqlab::env::guard::reap(&run, std::time::Duration::from_secs(5));
    assert!(!mounted_at(&mnt), "the mount outlived the cleanup");
    assert!(!run.exists(), "the run directory outlived the cleanup");
}

const KILLED_RUN: &str = "LAZYFS_TEST_KILLED_RUN";

/// Whether the child's output has a line ending with `mounted` within
/// `within` (libtest may print its own text on the same line first).
fn said_within(out: std::process::ChildStdout, within: std::time::Duration) -> bool {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let lines = std::io::BufReader::new(out).lines().map_while(Result::ok);
        for line in lines {
            if line.trim_end().ends_with("mounted") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(within).is_ok()
}

/// The child of the test above: mounts the run directory's `backing/` at
/// `mnt/`, says so, and waits to be killed. Run on its own (`cargo test
/// -- --ignored`), with no run directory given, it plays the whole test
/// above instead, so that it never passes without doing anything.
#[test]
#[ignore = "the child of the_cleanup_guard_detaches_a_mount_left_by_a_killed_harness; run by it"]
fn mount_and_wait_to_be_killed() {
    let Some(run) = std::env::var_os(KILLED_RUN).map(PathBuf::from) else {
        return the_cleanup_guard_detaches_a_mount_left_by_a_killed_harness();
    };
    let _mount = LazyFs::mount(&run.join("backing"), &run.join("mnt"), DirModel::Strict).unwrap();
    println!("mounted");
    let _ = std::io::stdin().read_line(&mut String::new());
}

/// A process SIGKILLed in a held fsync stays in the kernel, its file open,
/// until the fsync is answered: the unmount's freeze answers it first, so
/// the unmount is prompt rather than `Busy` after its patience (10 s).
#[test]
fn an_unmount_is_not_kept_waiting_by_a_killed_process_in_a_held_fsync() {
    require_fuse();
    let (_dir, backing, mnt) = scratch();
    fs::write(backing.join("a"), "x").unwrap();
    let mount = LazyFs::mount(&backing, &mnt, DirModel::Strict).unwrap();
    let hold = mount.hold_next_fsync("a");
    // coreutils' `sync FILE` fsyncs the file.
    let mut child = Command::new("sync").arg(mnt.join("a")).spawn().unwrap();
    let (hold, synced) = held_within(hold, HELD_WITHIN);
    assert_eq!(synced.unwrap(), Path::new("a"));
    child.kill().unwrap();
    let start = std::time::Instant::now();
    let unmounted = mount.unmount();
    let took = start.elapsed();
    let status = child.wait().unwrap();
    drop(hold);
    assert!(unmounted.is_ok(), "{unmounted:?}");
    assert!(took < std::time::Duration::from_secs(5), "took {took:?}");
    assert!(!status.success(), "the killed sync succeeded");
    assert!(!mounted_at(&mnt), "still mounted");
}

/// `/proc/mounts` as the guard reads it: FUSE mounts under the directory,
/// escaped paths decoded, deepest first; others left alone.
#[test]
fn fuse_mounts_are_read_from_proc_mounts() {
    let mounts = "\
/dev/vda / ext4 rw,relatime 0 0
lazyfs /tmp/mqlab-x/pg/mnt fuse rw,nosuid,nodev,relatime,user_id=0,group_id=0,default_permissions,allow_other 0 0
lazyfs /tmp/mqlab-x/a\\040b fuse rw 0 0
bindfs /tmp/mqlab-x/pg/mnt/inner fuse.bindfs rw 0 0
lazyfs /tmp/mqlab-xy/mnt fuse rw 0 0
tmpfs /tmp/mqlab-x/t tmpfs rw 0 0
";
    let found = mqlab::lazyfs::fuse_mounts_under(mounts, Path::new("/tmp/mqlab-x"));
    let want = [
        "/tmp/mqlab-x/pg/mnt/inner",
        "/tmp/mqlab-x/pg/mnt",
        "/tmp/mqlab-x/a b",
    ];
    assert_eq!(found, want.map(PathBuf::from));
}

/// chmod, chown, utimens, readlink and statfs reach the backing files.
#[test]
fn attributes_pass_through() {
    require_fuse();
    let (_dir, backing, mnt) = scratch();
    fs::write(backing.join("a"), "x").unwrap();
    let _mount = LazyFs::mount(&backing, &mnt, DirModel::Strict).unwrap();
    fs::set_permissions(mnt.join("a"), fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::chown(mnt.join("a"), Some(1), Some(2)).unwrap();
    let mtime = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    File::options()
        .write(true)
        .open(mnt.join("a"))
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let meta = fs::metadata(backing.join("a")).unwrap();
    let got = (meta.mode() & 0o7777, meta.uid(), meta.gid(), meta.mtime());
    assert_eq!(got, (0o640, 1, 2, 1_000_000_000));
    std::os::unix::fs::symlink("a", mnt.join("s")).unwrap();
    assert_eq!(fs::read_link(mnt.join("s")).unwrap(), Path::new("a"));
    let stats = nix::sys::statvfs::statvfs(&mnt).unwrap();
    assert!(stats.blocks() > 0, "statfs: {stats:?}");
}

/// A power loss whose unmount fails still reports what it undid (the data
/// is dropped all the same). The failure here: the mount was detached by
/// someone else first, so the unmount finds no mount.
#[test]
fn a_power_loss_reports_what_it_undid_when_its_unmount_fails() {
    use mqlab::lazyfs::Error;
    require_fuse();
    let (_dir, backing, mnt) = scratch();
    fs::write(backing.join("a"), "old").unwrap();
    let mount = LazyFs::mount(&backing, &mnt, DirModel::Strict).unwrap();
    open(&mnt.join("a"), 0)
        .unwrap()
        .write_all_at(b"NEW", 0)
        .unwrap();
    nix::mount::umount2(&mnt, nix::mount::MntFlags::MNT_DETACH).unwrap();
    let (lost, unmount) = match mount.power_loss() {
        Err(Error::Unmounted { lost, unmount }) => (lost, unmount),
        other => panic!("not Error::Unmounted: {other:?}"),
    };
    let lost: Vec<String> = lost.iter().map(ToString::to_string).collect();
    assert_eq!(lost, ["a: 3 unsynced bytes undone (size 3 -> 3)"]);
    assert!(matches!(*unmount, Error::Unmount { .. }), "{unmount}");
    assert_eq!(fs::read_to_string(backing.join("a")).unwrap(), "old");
}

/// A file unlinked while open (a new one: no name left anywhere) still
/// takes fchmod, ftruncate and futimens through its handle.
#[test]
fn an_unlinked_open_file_takes_attribute_changes() {
    require_fuse();
    let (_dir, backing, mnt) = scratch();
    let _mount = LazyFs::mount(&backing, &mnt, DirModel::Strict).unwrap();
    let file = open(&mnt.join("c"), 0).unwrap();
    file.write_all_at(b"hello", 0).unwrap();
    fs::remove_file(mnt.join("c")).unwrap();
    file.set_permissions(fs::Permissions::from_mode(0o600))
        .unwrap();
    file.set_len(2).unwrap();
    let mtime = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    file.set_modified(mtime).unwrap();
    let meta = file.metadata().unwrap();
    let got = (meta.mode() & 0o7777, meta.len(), meta.mtime());
    assert_eq!(got, (0o600, 2, 1_000_000_000));
}

/// A mount point inside the backing directory (or the other way round)
/// would reach the backing files through the mount itself: refused.
#[test]
fn nested_directories_are_refused() {
    require_fuse();
    let (_dir, backing, _mnt) = scratch();
    fs::create_dir(backing.join("mnt")).unwrap();
    let err = LazyFs::mount(&backing, &backing.join("mnt"), DirModel::Strict).err();
    let err = err.expect("a nested mount was accepted").to_string();
    assert!(err.contains("are nested"), "{err}");
}
