//! `mqlab list` reads the registries (labs, patterns, fault placements,
//! counters): its output is locked, so that a change of a registry shows
//! here as a diff to review.

mod common;
use common::*;

#[test]
fn mqlab_list() {
    let (code, stdout, stderr) = run(mqlab(&["list"]).current_dir(root()));
    assert_eq!(code, 0, "{stderr}");
    let root = root().display().to_string();
    let stdout = stdout.replace(&root, "<root>");
    insta::assert_snapshot!(stdout);
}
