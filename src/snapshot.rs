//! Stored transcripts, in insta's file format (`---` header `---` body) so
//! that `cargo insta review` works on the same files the CLI compares.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

pub fn path_for(dir: &Path, lab: &str) -> PathBuf {
    dir.join(format!("{lab}.snap"))
}

/// The stored body, `None` when there is no snapshot yet. A file that exists
/// but is not a snapshot is an error naming the file.
pub fn read(path: &Path) -> Result<Option<String>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read snapshot `{}`", path.display()))
        }
    };
    parse(&text)
        .map(|b| Some(b.to_string()))
        .with_context(|| format!("corrupt snapshot `{}`", path.display()))
}

fn parse(text: &str) -> Result<&str> {
    let Some(rest) = text.strip_prefix("---\n") else {
        bail!("it does not start with a `---` header");
    };
    let Some(end) = rest.find("\n---\n") else {
        bail!("its header is not closed by `---`");
    };
    let header = &rest[..end];
    if !header.lines().all(|l| l.is_empty() || l.contains(':')) {
        bail!("its header is not `key: value` lines");
    }
    let body = &rest[end + 5..];
    if body.lines().any(|l| !l.starts_with('[')) {
        bail!("its body has a line that is not a transcript line");
    }
    Ok(body)
}

/// Writes in insta's layout; the header holds nothing run-dependent, so two
/// equal runs write byte-identical files.
pub fn write(path: &Path, lab_file: &str, body: &str) -> Result<()> {
    let text = format!(
        "---\nsource: {lab_file}\nexpression: transcript\n---\n{}",
        body
    );
    // A project's first snapshot: its snapshots/ may not exist yet.
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create `{}`", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("cannot write `{}`", path.display()))
}

pub enum Outcome {
    Matched,
    Updated,
    /// The unified diff, stored then actual; the actual is left as `.snap.new`.
    Mismatch(String),
}

pub fn compare(path: &Path, lab_file: &str, actual: &str, update: bool) -> Result<Outcome> {
    let stored = read(path)?;
    if stored.as_deref().map(str::trim_end) == Some(actual.trim_end()) {
        let _ = std::fs::remove_file(path.with_extension("snap.new"));
        return Ok(Outcome::Matched);
    }
    if update {
        write(path, lab_file, actual)?;
        let _ = std::fs::remove_file(path.with_extension("snap.new"));
        return Ok(Outcome::Updated);
    }
    write(&path.with_extension("snap.new"), lab_file, actual)?;
    let old = stored.unwrap_or_default();
    Ok(Outcome::Mismatch(diff(
        &old,
        actual,
        &path.display().to_string(),
    )))
}

pub fn diff(old: &str, new: &str, name: &str) -> String {
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(2)
        .header(&format!("{name} (stored)"), "actual run")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_insta_layout() {
        let t = "---\nsource: x\nexpression: transcript\n---\n[assert] a=1 PASS\n";
        assert_eq!(parse(t).unwrap(), "[assert] a=1 PASS\n");
    }

    #[test]
    fn rejects_corrupt_files() {
        assert!(parse("[assert] a=1 PASS\n").is_err());
        assert!(parse("---\nsource: x\n[assert] a=1 PASS\n").is_err());
        assert!(parse("---\nsource: x\n---\ngarbage\n").is_err());
    }

    #[test]
    fn diff_shows_both_sides() {
        let d = diff("[a] x=1\n[a] y=2\n", "[a] x=1\n[a] y=3\n", "s");
        assert!(d.contains("-[a] y=2"));
        assert!(d.contains("+[a] y=3"));
        assert!(d.contains("s (stored)"));
    }
}
