//! Helpers for tests that run the real `mqlab` binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn mqlab(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mqlab"));
    c.args(args).env_remove("MQLAB_ROOT");
    c
}

pub fn run(cmd: &mut Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("mqlab runs");
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// A throwaway project root with copies of labs/, fixtures/ and snapshots/, to break on purpose.
pub fn scratch_project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for sub in ["labs", "fixtures", "snapshots"] {
        copy_dir(&root().join(sub), &dir.path().join(sub));
    }
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.path().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// The snapshot body (after insta's `---` header).
pub fn snapshot_body(lab: &str) -> String {
    let text = std::fs::read_to_string(root().join(format!("snapshots/{lab}.snap"))).unwrap();
    text.splitn(3, "---\n").nth(2).unwrap().to_string()
}
