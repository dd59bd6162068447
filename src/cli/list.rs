//! `mqlab list`: the labs and their variants, then the vocabulary and the
//! placement registry, printed from the tables the engine reads.

use anyhow::Result;

use crate::exit;
use crate::lab::Project;
use crate::sinks::out;

pub(super) fn cmd_list(project: &Project) -> Result<i32> {
    labs(project)?;
    vocabulary();
    Ok(exit::OK)
}

/// Each lab with its claim, its counterexamples and what falsifies what.
fn labs(project: &Project) -> Result<()> {
    out!("labs ({}):", project.labs_dir().display());
    for name in project.lab_names()? {
        match project.load(&name) {
            Ok(lab) => {
                out!("  {:<20} {}", lab.name, lab.claim);
                let mut falsified: Vec<(String, String)> = Vec::new();
                for (v, claim) in project.variants(&name)? {
                    out!("    --variant {v:<18} counterexample: {claim}");
                    if let Ok(var) = project.load(&format!("{name}@{v}")) {
                        // Falsified on one generation only: named with it.
                        for (g, diff) in &var.generations {
                            falsified.extend(
                                diff.violations
                                    .keys()
                                    .filter(|a| !var.violations.contains_key(*a))
                                    .map(|a| {
                                        (a.clone(), format!("{v} on {} {g}", g.broker().product()))
                                    }),
                            );
                        }
                        falsified.extend(var.violations.into_keys().map(|a| (a, v.clone())));
                    }
                }
                out!("    {}", evidence_line(&lab, &falsified));
            }
            Err(e) => out!("  {name:<20} INVALID: {e:#}"),
        }
    }
    Ok(())
}

/// The tables the engine reads: patterns, placements with their windows,
/// counters, inspect fields, broker settings.
fn vocabulary() {
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
                // The order service's windows include the plain producer's.
                crate::vocab::Windows::ProducerPath => {
                    for w in crate::vocab::ORDER_SERVICE_WINDOWS {
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
                    let program: Vec<&str> = p.program_windows.iter().map(|w| w.name()).collect();
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
    out!("\nbroker settings (a lab's `settings`, read from the broker before it runs):");
    for (s, name, doc) in crate::vocab::BrokerSetting::ALL {
        out!("  {name} = {}: {doc}", s.required());
    }
}

/// Which variant falsifies each of a lab's assertions, its harness facts
/// (fixed by how it runs) and its broker facts (given by the broker in
/// every run): what each assertion is evidence of.
fn evidence_line(lab: &crate::lab::Lab, falsified: &[(String, String)]) -> String {
    let mut names: Vec<&str> = Vec::new();
    for s in &lab.steps {
        for a in s.fault.iter().flat_map(|f| &f.asserts).chain(&s.asserts) {
            let fact = lab.facts.contains(&a.name) || lab.broker_facts.contains(&a.name);
            if !names.contains(&a.name.as_str()) && !fact {
                names.push(&a.name);
            }
        }
    }
    let shown: Vec<String> = names
        .iter()
        .map(|n| {
            let by: Vec<String> = falsified
                .iter()
                .filter(|(a, _)| a == n)
                .map(|(_, v)| format!("@{v}"))
                .collect();
            match by.is_empty() {
                true => format!("{n} (no variant)"),
                false => format!("{n} ({})", by.join(" ")),
            }
        })
        .collect();
    let mut line = format!("falsified by: {}", shown.join(", "));
    if !lab.facts.is_empty() {
        line.push_str(&format!("; harness facts: {}", lab.facts.join(", ")));
    }
    if !lab.broker_facts.is_empty() {
        line.push_str(&format!("; broker facts: {}", lab.broker_facts.join(", ")));
    }
    line
}
