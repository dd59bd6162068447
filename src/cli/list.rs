//! `mqlab list`: the labs and their variants, then the vocabulary and the
//! placement registry, printed from the tables the engine reads.

use anyhow::Result;

use crate::exit;
use crate::lab::Project;
use crate::sinks::out;

pub(super) fn cmd_list(project: &Project) -> Result<i32> {
    out!("labs ({}):", project.labs_dir().display());
    for name in project.lab_names()? {
        match project.load(&name) {
            Ok(lab) => {
                out!("  {:<20} {}", lab.name, lab.claim);
                for (v, claim) in project.variants(&name)? {
                    out!("    --variant {v:<18} counterexample: {claim}");
                }
            }
            Err(e) => out!("  {name:<20} INVALID: {e:#}"),
        }
    }
    use crate::vocab::{Counter, InspectField, Target, PATTERNS};
    out!("\nconsumer patterns (their steps; the fault windows follow from them):");
    for p in PATTERNS {
        let safety = if p.safe { "safe" } else { "unsafe" };
        out!("  {:<26} {safety:<7} {}", p.pattern.name(), p.pattern.doc());
        out!("  {:<26} {:<7} {}", "", "", p.path());
    }
    out!("\nfault targets and placements (where each action goes, and its windows):");
    for (t, name, doc) in Target::ALL {
        out!("  {name:<26} {doc}");
        for p in crate::vocab::placements_of(*t) {
            let mut only = String::new();
            if p.built_in_only {
                only.push_str(" (built-in consumer)");
            }
            out!(
                "    {} {}{only}, then {}: {}",
                p.action,
                p.site.describe(),
                p.then,
                p.doc
            );
            match p.windows {
                crate::vocab::Windows::None => {}
                crate::vocab::Windows::These(ws) => {
                    for w in ws {
                        out!("      {:<30} {}", w.name(), w.doc());
                    }
                }
                crate::vocab::Windows::ConsumerPath => {
                    for (w, wname, wdoc) in crate::vocab::Window::ALL {
                        let used: Vec<&str> = PATTERNS
                            .iter()
                            .filter(|p| p.windows().contains(w))
                            .map(|p| p.pattern.name())
                            .collect();
                        if !used.is_empty() {
                            out!("      {wname:<30} {wdoc} [{}]", used.join(", "));
                        }
                    }
                    let program: Vec<&str> = crate::vocab::PROGRAM_WINDOWS
                        .iter()
                        .map(|w| w.name())
                        .collect();
                    out!("      a program (black box): {}", program.join(", "));
                }
            }
        }
    }
    out!("\ncounters:");
    for (c, _, doc) in Counter::ALL {
        out!("  {:<26} {doc}", c.usage());
    }
    out!("\ninspect fields:");
    for (_, name, doc) in InspectField::ALL {
        out!("  {name:<26} {doc}");
    }
    Ok(exit::OK)
}
