//! The README and the docs hold together: every relative link points at a
//! file that exists, and every page is in the book's table of contents.

mod common;
use common::root;

use std::path::{Path, PathBuf};

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
    for dir in ["docs", "docs/evidence", "docs/labs", "docs/topics"] {
        for e in std::fs::read_dir(root().join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "md") {
                pages.push(p);
            }
        }
    }
    pages
}

/// One page per lab under docs/labs/, written from its lab file and its
/// stored snapshots (`evidence::lab_page`): a page that differs fails, and
/// `MQLAB_UPDATE_DOCS=1` rewrites them; no page without its lab.
#[test]
fn every_lab_has_its_page_written_from_its_files() {
    let project = mqlab::lab::Project { root: root() };
    let dir = root().join("docs/labs");
    let update = std::env::var("MQLAB_UPDATE_DOCS").is_ok_and(|v| v == "1");
    let names = project.lab_names().unwrap();
    let mut stale = Vec::new();
    for name in &names {
        let page = mqlab::evidence::lab_page(&project, name).unwrap();
        let path = dir.join(format!("{name}.md"));
        if update {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &page).unwrap();
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(page.as_str()) {
            stale.push(name.clone());
        }
    }
    assert!(
        stale.is_empty(),
        "docs/labs/ differs from the lab files for {stale:?}: MQLAB_UPDATE_DOCS=1 cargo test --test docs every_lab rewrites them"
    );
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
        assert!(names.contains(&stem), "{} has no lab", p.display());
    }
}

/// One page per topic under docs/topics/, written from the lab files
/// (`evidence::topic_page`; `your-own-program` from examples/python's);
/// every lab of the project and of the examples names its topic, and the
/// book's table of contents lists each lab's page once, under its topic's.
#[test]
fn every_topic_has_its_page_and_every_lab_a_topic() {
    use mqlab::vocab::Topic;
    let project = mqlab::lab::Project { root: root() };
    let examples = mqlab::lab::Project {
        root: root().join("examples/python"),
    };
    // First: a lab without a topic would only be missing from the pages.
    for (p, only) in [(&project, None), (&examples, Some(Topic::YourOwnProgram))] {
        for name in p.lab_names().unwrap() {
            let topic = p.load(&name).unwrap().topic;
            assert!(
                topic.is_some() && (only.is_none() || topic == only),
                "{}/labs/{name}.toml names no `topic` (one of {:?}), or not the examples' ({only:?})",
                p.root.display(),
                Topic::names()
            );
        }
    }
    let dir = root().join("docs/topics");
    let update = std::env::var("MQLAB_UPDATE_DOCS").is_ok_and(|v| v == "1");
    let mut stale = Vec::new();
    for (topic, name, _) in Topic::ALL {
        let from = match topic {
            Topic::YourOwnProgram => &examples,
            _ => &project,
        };
        let page = mqlab::evidence::topic_page(from, *topic).unwrap();
        let path = dir.join(format!("{name}.md"));
        if update {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &page).unwrap();
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(page.as_str()) {
            stale.push(*name);
        }
    }
    assert!(
        stale.is_empty(),
        "docs/topics/ differs from the lab files for {stale:?}: MQLAB_UPDATE_DOCS=1 cargo test --test docs every_topic rewrites them"
    );
    // In SUMMARY.md a lab's entry is indented under its topic's entry.
    let summary = std::fs::read_to_string(root().join("docs/SUMMARY.md")).unwrap();
    let mut under: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut topic = None;
    for line in summary.lines() {
        match (links(line).first(), line.starts_with("- ")) {
            (Some(l), true) => topic = l.strip_prefix("topics/").map(str::to_string),
            (Some(l), false) => {
                if let (Some(t), Some(lab)) = (&topic, l.strip_prefix("labs/")) {
                    under.entry(lab.to_string()).or_default().push(t.clone());
                }
            }
            _ => {}
        }
    }
    for name in project.lab_names().unwrap() {
        let topic = project.load(&name).unwrap().topic.unwrap();
        assert_eq!(
            under.get(&format!("{name}.md")),
            Some(&vec![format!("{}.md", topic.name())]),
            "docs/SUMMARY.md must list labs/{name}.md once, under topics/{}.md",
            topic.name()
        );
    }
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

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let dest = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_tree(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}

/// Every `href` of the built book that points inside it names a file
/// there (a link out of the book, to the repository's files, is checked on
/// the Markdown by the test above).
fn broken_hrefs(book: &Path) -> (usize, Vec<String>) {
    let (mut seen, mut broken) = (0, Vec::new());
    let mut stack = vec![book.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "html") {
                continue;
            }
            let html = std::fs::read_to_string(&p).unwrap();
            for part in html.split("href=\"").skip(1) {
                let href = part.split('"').next().unwrap();
                let file = href.split('#').next().unwrap();
                if file.is_empty() || href.contains("://") || href.starts_with("mailto:") {
                    continue;
                }
                let target = p.parent().unwrap().join(file);
                let Ok(inside) = std::path::absolute(&target) else {
                    continue;
                };
                let normal: PathBuf = inside.components().fold(PathBuf::new(), |mut acc, c| {
                    match c {
                        std::path::Component::ParentDir => {
                            acc.pop();
                        }
                        std::path::Component::CurDir => {}
                        c => acc.push(c),
                    }
                    acc
                });
                if !normal.starts_with(book) {
                    continue;
                }
                seen += 1;
                if !normal.exists() {
                    broken.push(format!("{}: {href}", p.display()));
                }
            }
        }
    }
    (seen, broken)
}

/// Mermaid replaced every ```mermaid block of the book's chapters by a
/// diagram in `dom`, the rendered print page: the seed lab's evidence page,
/// every lab page written from its files with the safe run's and each
/// counterexample's diagram, a cluster lab's too, which no `--all` run
/// draws.
fn diagrams_render(book: &Path, dom: &str) {
    let summary = std::fs::read_to_string(root().join("docs/SUMMARY.md")).unwrap();
    let chapters = links(&summary);
    let mut owed = 0;
    for c in &chapters {
        let text = std::fs::read_to_string(root().join("docs").join(c)).unwrap();
        owed += text.matches("```mermaid").count();
    }
    let labs = chapters.iter().filter(|c| c.starts_with("labs/")).count();
    assert!(labs > 20, "too few lab pages in the book: {labs}");
    let print = std::fs::read_to_string(book.join("print.html")).unwrap();
    let blocks = print.matches("class=\"language-mermaid\"").count();
    let sequences = print
        .matches("class=\"language-mermaid\">sequenceDiagram")
        .count();
    assert_eq!(
        blocks, owed,
        "the print page's diagrams against its chapters'"
    );
    assert!(
        !dom.contains("Syntax error"),
        "Mermaid could not parse a diagram"
    );
    // (mdBook's own icons are SVGs too: the diagram's role is Mermaid's.)
    assert_eq!(
        dom.matches("aria-roledescription=\"sequence\"").count(),
        sequences,
        "Mermaid drew the wrong number of sequence diagrams"
    );
    assert_eq!(
        dom.matches("aria-roledescription=\"").count()
            - dom.matches("aria-roledescription=\"error\"").count(),
        blocks,
        "Mermaid drew the wrong number of diagrams"
    );
}

/// The book builds with mdBook, its internal links hold, and headless
/// Chromium renders every diagram (Mermaid drew an SVG for each), the
/// faults table, the tour and a topic page (screenshots copied to
/// target/). Over 80 lines: one walk through one built book, every check
/// sharing the build and the browser helper.
#[test]
#[ignore = "needs mdbook, chromium and the mermaid npm package (.ci/run installs them)"]
fn the_book_builds_and_renders() {
    let mdbook = common::require_tool("mdbook", &[]);
    let chromium = common::require_tool("chromium", &["/usr/bin/chromium"]);
    let mermaid = std::env::var("MQLAB_MERMAID_JS")
        .unwrap_or_else(|_| "/opt/mqlab-tools/node_modules/mermaid/dist/mermaid.min.js".into());
    assert!(
        Path::new(&mermaid).is_file(),
        "this test needs {mermaid} (.ci/run installs mermaid-cli)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("docs");
    copy_tree(&root().join("docs"), &src);
    std::fs::copy(&mermaid, src.join("mermaid.min.js")).unwrap();
    let book = tmp.path().join("book");
    let out = std::process::Command::new(&mdbook)
        .arg("build")
        .arg(&src)
        .arg("-d")
        .arg(&book)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mdbook: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (seen, broken) = broken_hrefs(&book);
    assert!(seen > 50, "too few links read: {seen}");
    assert!(
        broken.is_empty(),
        "broken links in the book:\n{}",
        broken.join("\n")
    );

    let chrome = |args: &[&str], page: &str| {
        let out = std::process::Command::new(&chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
            ])
            .args([
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ])
            .args(["--virtual-time-budget=10000", "--window-size=1200,1600"])
            .args(args)
            .arg(format!("file://{}", book.join(page).display()))
            .current_dir(tmp.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "chromium on {page}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The diagrams, on every page of the book at once: mdBook's print page
    // holds every chapter, so one browser start renders them all
    // (measured: 10 s, where one start per lab page took about 80 s).
    diagrams_render(&book, &chrome(&["--dump-dom"], "print.html"));
    // The faults table, from the registry.
    let dom = chrome(&["--dump-dom"], "faults.html");
    assert!(
        dom.contains("<table>") && dom.contains("after-publish-before-confirm"),
        "no faults table"
    );
    // The tour and a topic's table, linking to the lab pages.
    // (mdBook's sidebar links every page: the checks read the page's own
    // text, inside <main>.)
    let main = |dom: &str| -> String {
        dom.split("<main>")
            .nth(1)
            .and_then(|m| m.split("</main>").next())
            .unwrap_or_default()
            .to_string()
    };
    let dom = main(&chrome(&["--dump-dom"], "introduction.html"));
    assert!(
        dom.contains("A tour of mqlab") && dom.contains("href=\"topics/consuming.html\""),
        "the tour did not render"
    );
    let dom = main(&chrome(&["--dump-dom"], "topics/consuming.html"));
    assert!(
        dom.contains("<table>")
            && dom.contains("href=\"../labs/consumer-crash.html\"")
            && dom.contains("gets the message again; the inbox turns the redelivery into a no-op"),
        "the consuming topic has no table of its labs' claims"
    );
    for (page, png) in [
        ("evidence/consumer-crash.html", "lab.png"),
        ("labs/broker-pause.html", "lab-page.png"),
        ("faults.html", "faults.png"),
        ("introduction.html", "tour.png"),
        ("topics/consuming.html", "topic.png"),
    ] {
        let shot = tmp.path().join(png);
        chrome(&[&format!("--screenshot={}", shot.display())], page);
        let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
        assert!(size > 20_000, "{png}: {size} bytes, not a rendered page");
        std::fs::copy(&shot, root().join("target").join(png)).unwrap();
    }
}
