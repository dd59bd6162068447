//! Imports run one way (vocab ← lab ← faults ← runner ← session ← cli): no
//! cycle among the crate's top-level modules, and the environments know
//! nothing of the runner, the events or the labs. Read from the `crate::`
//! paths of `src/` (test modules left out), as text.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The top-level module a file belongs to (`src/env/local.rs` → `env`).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_string_lossy();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_string();
    (name != "main" && name != "lib").then_some(name)
}

/// Every `crate::x` (and `use crate::{x, y}`) outside comments and `#[cfg(test)]`.
fn targets(text: &str) -> BTreeSet<String> {
    // The test module at the end of a file (a `#[cfg(test)]` item elsewhere
    // still counts: more edges can only make this fail, never pass).
    let code = text.split("\n#[cfg(test)]\nmod tests").next().unwrap_or("");
    // A `//` comment, but not the `://` of a URL in a string.
    let comment = |l: &str| {
        l.match_indices("//")
            .find(|(i, _)| !l[..*i].ends_with(':'))
            .map_or(l.len(), |(i, _)| i)
    };
    let code: String = code
        .lines()
        .map(|l| &l[..comment(l)])
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |s: &str| -> String {
        s.trim()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let names: Vec<String> = match rest.strip_prefix('{') {
            // A group may span lines and nest: only its top-level names count.
            Some(group) => {
                let (mut depth, mut names, mut at_start) = (0, Vec::new(), true);
                for (k, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => at_start = true,
                        _ if at_start && !c.is_whitespace() => {
                            names.push(ident(&group[k..]));
                            at_start = false;
                        }
                        _ => {}
                    }
                }
                names
            }
            None => vec![ident(rest)],
        };
        out.extend(
            names
                .into_iter()
                .filter(|n| n != "self" && n.starts_with(|c: char| c.is_ascii_lowercase())),
        );
    }
    out
}

fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut g = Graph::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let Some(m) = module_of(&src, &path) else {
                    continue;
                };
                // A file of its own for a module's tests (`#[cfg(test)] mod
                // tests;`) is test code, as the block at a file's end is.
                let text = match path.file_name().is_some_and(|f| f == "tests.rs") {
                    true => String::new(),
                    false => std::fs::read_to_string(&path).unwrap(),
                };
                let edges = g.entry(m.clone()).or_default();
                edges.extend(targets(&text).into_iter().filter(|t| *t != m));
            }
        }
    }
    g
}

/// The modules `from` reaches through its imports.
fn reach(g: &Graph, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<&str> = g
        .get(from)
        .into_iter()
        .flatten()
        .map(String::as_str)
        .collect();
    while let Some(m) = todo.pop() {
        if seen.insert(m.to_string()) {
            todo.extend(g.get(m).into_iter().flatten().map(String::as_str));
        }
    }
    seen
}

#[test]
fn no_import_cycle_among_top_level_modules() {
    let g = graph();
    assert!(g.len() > 10, "too few modules read: {g:?}");
    let cycles: Vec<String> = g
        .keys()
        .filter(|m| reach(&g, m).contains(*m))
        .map(|m| {
            let back: Vec<&String> = g[m].iter().filter(|t| reach(&g, t).contains(m)).collect();
            format!("{m} -> {back:?} -> {m}")
        })
        .collect();
    assert!(cycles.is_empty(), "import cycles: {cycles:#?}");
}

#[test]
fn the_environments_know_nothing_of_runner_events_or_labs() {
    let g = graph();
    assert!(g.contains_key("env"), "no env module read: {g:?}");
    let reached = reach(&g, "env");
    // The runner, events, sinks and cli import env: reaching them would be
    // a cycle too; the labs and the checker do not, so this is their check.
    for forbidden in [
        "lab", "checker", "runner", "events", "sinks", "cli", "explore", "soak",
    ] {
        assert!(
            !reached.contains(forbidden),
            "env reaches {forbidden}: {:?}",
            g["env"]
        );
    }
}

/// The import graph as a Mermaid flowchart, with the edges another path
/// already implies left out (the transitive reduction of a graph without
/// cycles: unique), so the layers show.
fn mermaid(g: &Graph) -> String {
    let mut out = String::from("```mermaid\nflowchart BT\n");
    for (m, targets) in g {
        for t in targets {
            let implied = targets
                .iter()
                .any(|other| other != t && reach(g, other).contains(t));
            if !implied {
                out.push_str(&format!("    {m} --> {t}\n"));
            }
        }
    }
    out.push_str("```\n");
    out
}

/// docs/architecture.md shows the module graph as it is: the block between
/// its `modules` markers is [`mermaid`]'s (`MQLAB_UPDATE_DOCS=1` rewrites it).
#[test]
fn the_architecture_page_draws_the_import_graph_as_it_is() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let (start, end) = (
        "<!-- modules: from tests/modules.rs -->\n",
        "<!-- end modules -->",
    );
    let a = text.find(start).expect("the start marker") + start.len();
    let b = text.find(end).expect("the end marker");
    let want = mermaid(&graph());
    if std::env::var("MQLAB_UPDATE_DOCS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, format!("{}{want}{}", &text[..a], &text[b..])).unwrap();
        return;
    }
    assert_eq!(
        &text[a..b],
        want,
        "docs/architecture.md's module graph differs from the imports: MQLAB_UPDATE_DOCS=1 cargo test --test modules rewrites it"
    );
}

/// The reader itself, on literal text: a commented import and a test module
/// do not count, a grouped import does.
#[test]
fn imports_are_read_as_written() {
    let t = targets(
        "use crate::{vocab, lab::{Lab, Step},\n    store};\n// crate::cli\nlet u = format!(\"amqp://{}\", crate::amqp::url(x)); // crate::soak\nlet x = crate::naming::vhost_for(r);\n#[cfg(test)]\nmod tests {\n    use crate::runner;\n}",
    );
    assert_eq!(
        t,
        ["amqp", "lab", "naming", "store", "vocab"]
            .map(String::from)
            .into_iter()
            .collect()
    );
}

/// The code of a Rust source with its comments and the contents of its
/// strings and char literals blanked (newlines kept, so line numbers hold):
/// a crate's name in a doc comment or a string is no use of it. Long: one
/// pass of a small lexer, a branch per token kind, easier read whole.
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            loop {
                if i >= c.len() {
                    break;
                }
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if c[i] == 'r' && (next == Some('"') || next == Some('#')) && raw_start(&c, i) {
            // A raw string: r"...", r#"..."#, br"...".
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            out.push('"');
            i = j + 1;
            while i < c.len() {
                if c[i] == '"' && (1..=hashes).all(|k| c.get(i + k) == Some(&'#')) {
                    out.push('"');
                    i += 1 + hashes;
                    break;
                }
                out.push(blank(c[i]));
                i += 1;
            }
        } else if c[i] == '"' {
            out.push('"');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < c.len() {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
            out.push('"');
            i += 1;
        } else if c[i] == '\'' && (c.get(i + 2) == Some(&'\'') || next == Some('\\')) {
            // A char literal ('"', '\'', '\u{..}'), not a lifetime.
            let end = match next == Some('\\') {
                true => (i + 3..c.len())
                    .find(|&k| c[k] == '\'')
                    .unwrap_or(c.len() - 1),
                false => i + 2,
            };
            out.push_str(&" ".repeat(end + 1 - i));
            i = end + 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// Whether the `r` at `i` opens a raw string: `r"`, or `br"`/`cr"` (a
/// byte or C raw string), not the end of an identifier.
fn raw_start(c: &[char], i: usize) -> bool {
    let before = |k: usize| k.checked_sub(1).map(|k| c[k]);
    match before(i) {
        Some('b' | 'c') => !ident(before(i - 1)),
        other => !ident(other),
    }
}

fn ident(c: Option<char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// The client crate a line of code (from [`code_only`]) names: `lapin` or
/// `amq_protocol` as a whole identifier, however it is used (a path, an
/// import, a group `use {lapin, ..}`, `extern crate`).
fn client_crate_path(code: &str) -> Option<&'static str> {
    ["lapin", "amq_protocol"].into_iter().find(|krate| {
        code.match_indices(krate).any(|(i, _)| {
            !ident(code[..i].chars().next_back()) && !ident(code[i + krate.len()..].chars().next())
        })
    })
}

/// A line of `broker/rabbitmq/mod.rs` that could let a submodule's type
/// out: any public item but a function, or a public function whose line
/// names a submodule's path (`client::Conn`): the module's functions speak
/// the engine's types only.
fn leaks_a_submodule(line: &str) -> bool {
    let line = line.trim_start();
    if !line.starts_with("pub") {
        return false;
    }
    let function = line.starts_with("pub fn ") || line.starts_with("pub async fn ");
    let names_one = ["client", "admin", "codec", "transport"].iter().any(|m| {
        line.match_indices(&format!("{m}::")).any(|(i, _)| {
            let before = line[..i].chars().next_back();
            !ident(before) && before != Some(':')
        })
    });
    !function || names_one
}

/// The RabbitMQ module alone speaks lapin and amq-protocol: a second broker
/// then needs no file of the engine that names them. They are named only in
/// its private submodules: `broker/rabbitmq/mod.rs` names neither and
/// makes none of its submodules public or re-exports from them, so no
/// lapin type can leave the module in a signature.
#[test]
fn only_the_rabbitmq_module_imports_its_client_crates() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let home = src.join("broker").join("rabbitmq");
    let gate = home.join("mod.rs");
    let mut found = Vec::new();
    let mut read = 0;
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                && (!path.starts_with(&home) || path == gate)
            {
                read += 1;
                let code = code_only(&std::fs::read_to_string(&path).unwrap());
                for (n, line) in code.lines().enumerate() {
                    if let Some(krate) = client_crate_path(line) {
                        found.push(format!("{}:{}: {krate}", path.display(), n + 1));
                    }
                    let leaks = path == gate && leaks_a_submodule(line);
                    if leaks {
                        found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(read > 40, "too few files read: {read}");
    assert!(
        found.is_empty(),
        "outside rabbitmq's submodules: {found:#?}"
    );
}

#[test]
fn a_client_crate_path_is_read_as_written() {
    for (line, want) in [
        ("use lapin::Channel;", Some("lapin")),
        ("    ch: lapin::Channel,", Some("lapin")),
        ("use amq_protocol::frame::AMQPFrame;", Some("amq_protocol")),
        ("fn f(c: &lapin::Connection) {}", Some("lapin")),
        ("pub const CLIENT_LIBRARY: &str = \"lapin\";", None),
        ("// lapin::Channel in a comment", None),
        ("let flapin::x = 1;", None),
        ("let lapin_count = 1;", None),
        ("use {lapin, std::fmt};", Some("lapin")),
        ("pub use lapin;", Some("lapin")),
        ("let x = ::lapin::Channel::default();", Some("lapin")),
        ("extern crate amq_protocol;", Some("amq_protocol")),
        (
            "let u = \"amqp://h\"; let c: lapin::Channel;",
            Some("lapin"),
        ),
        ("let s = r#\"lapin::Channel\"#;", None),
        ("let q = '\"'; let c: lapin::Channel;", Some("lapin")),
        ("/* lapin::Channel */ let a = 1;", None),
        (
            "let b = br#\"x \" lapin::X\"#; let c: lapin::Channel;",
            Some("lapin"),
        ),
        ("let b = br#\"lapin::X\"#;", None),
    ] {
        assert_eq!(client_crate_path(&code_only(line)), want, "{line}");
    }
    for (line, leaks) in [
        ("pub fn codec() -> Box<dyn Codec> {", false),
        (
            "pub async fn admin(url: &str) -> Result<Box<dyn Admin>> {",
            false,
        ),
        (
            "pub async fn conn(url: &str) -> Result<client::Conn> {",
            true,
        ),
        ("pub use client::*;", true),
        ("pub(super) use client::Conn;", true),
        ("pub type Conn = client::Conn;", true),
        ("pub mod client;", true),
        ("mod client;", false),
        ("pub fn f() -> super::transport::Pending {", false),
    ] {
        assert_eq!(leaks_a_submodule(line), leaks, "{line}");
    }
}
