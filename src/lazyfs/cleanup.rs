//! Mounts left behind: a harness killed while a lazy file system was
//! mounted leaves a dead mount (its serving threads died with it) that
//! makes every removal under it fail. The cleanup guard detaches them
//! before it removes a run directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::mount::{umount2, MntFlags};

/// The FUSE mounts (`fuse`, `fuse.*`, `fuseblk`) at or under `dir`, from the
/// text of `/proc/mounts`, deepest first (a mount inside another goes
/// first).
pub fn fuse_mounts_under(mounts: &str, dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let (_source, at, kind) = (fields.next()?, fields.next()?, fields.next()?);
            let fuse = kind == "fuse" || kind == "fuseblk" || kind.starts_with("fuse.");
            let at = unescape(at);
            (fuse && at.starts_with(dir)).then_some(at)
        })
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

/// `/proc/mounts` writes a space, a tab, a newline and a backslash in a
/// path as an octal escape (`\040`).
fn unescape(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            let d = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(d, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Lazily unmounts every FUSE mount at or under `dir` (as root by
/// `umount2(MNT_DETACH)`, else by `fusermount3 -u -z`); returns the mount
/// points it found.
pub fn detach_fuse_mounts_under(dir: &Path) -> Vec<PathBuf> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let found = fuse_mounts_under(&mounts, &dir);
    for at in &found {
        if umount2(at, MntFlags::MNT_DETACH).is_err() {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z", "--"])
                .arg(at)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
    found
}
