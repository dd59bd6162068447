//! The README and the docs hold together: every relative link points at a
//! file that exists, and every page is in the book's table of contents.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The targets of the Markdown links `[text](target)` in `text`.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].to_string());
        }
    }
    out
}

fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    for dir in ["docs", "docs/evidence"] {
        for e in std::fs::read_dir(root().join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "md") {
                pages.push(p);
            }
        }
    }
    pages
}

#[test]
fn every_relative_link_points_at_a_file() {
    let mut broken = Vec::new();
    let mut seen = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for link in links(&text) {
            if link.contains("://") || link.starts_with('#') || link.starts_with("mailto:") {
                continue;
            }
            seen += 1;
            let file = link.split('#').next().unwrap();
            let target = page.parent().unwrap().join(file);
            if !Path::new(&target).exists() {
                broken.push(format!("{}: {link}", page.display()));
            }
        }
    }
    assert!(seen > 20, "too few links read: {seen}");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_page_is_in_the_book() {
    let summary = std::fs::read_to_string(root().join("docs/SUMMARY.md")).unwrap();
    let listed = links(&summary);
    for page in pages() {
        let rel = page
            .strip_prefix(root().join("docs"))
            .map(|p| p.to_string_lossy().into_owned());
        let Ok(rel) = rel else {
            continue; // the README is the project's, not a chapter
        };
        if rel == "SUMMARY.md" {
            continue;
        }
        assert!(
            listed.contains(&rel),
            "docs/{rel} is not in docs/SUMMARY.md"
        );
    }
}

/// The link reader on literal text.
#[test]
fn links_are_read_as_written() {
    assert_eq!(
        links("see [a](a.md) and [b](../b.md#x), not (c)"),
        ["a.md", "../b.md#x"]
    );
}
