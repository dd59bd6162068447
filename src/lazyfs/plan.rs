//! A power loss, computed from the model alone: the steps that turn the
//! backing directory as it is into what was durable, and the report of
//! what they undo. Pure, so that it is tested on literal sequences; the
//! steps are carried out by `apply`.
//!
//! The durable tree is what the root's durable entries reach, through each
//! directory's durable entries. The steps compare it with the tree now,
//! entry by entry (directory, name, id): an entry only now is taken away
//! (deepest first, into the stash when the thing is durable elsewhere),
//! then an entry only durable is put back (parents first, from the stash
//! or as a hard link of a file still named). A directory moves with what
//! is under it, so an entry both now and durable needs no step even when
//! its directory moves.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use super::model::{stash_path, Id, Kind, Model, Undo, ROOT};

/// One change to the backing directory; paths are relative to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Undo a file's unsynced writes: the records, newest first, then the
    /// lengths to set in order (sizes a journal commit made durable).
    Restore {
        path: PathBuf,
        undo: Vec<Undo>,
        sizes: Vec<u64>,
    },
    /// Move a name's file or directory into the stash, to be placed back
    /// under its durable name.
    Stash { path: PathBuf, id: Id },
    /// Delete a name, and what is under it.
    Remove { path: PathBuf },
    /// Rename a stashed id to its durable name.
    Place { id: Id, path: PathBuf },
    /// Another durable name for a file that has one already.
    Link { from: PathBuf, to: PathBuf },
    /// Delete a stashed id that no durable name reaches.
    Purge { id: Id },
}

/// What a power loss undid at one path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Undone {
    /// Writes and truncations since the file's last sync: `bytes` written
    /// or cut, the size going from `size_before` back to `size_after`.
    Contents {
        bytes: u64,
        size_before: u64,
        size_after: u64,
    },
    /// A name never made durable (created, or renamed to), removed.
    NameRemoved,
    /// A name whose removal (unlink, or rename away) was never made
    /// durable, back.
    NameRestored,
    /// A durable name whose file the lazy file system no longer held: a
    /// bug of its own, reported rather than hidden.
    Missing,
}

/// One line of evidence: a path (relative to the backing directory) and
/// what the power loss undid there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lost {
    pub path: PathBuf,
    pub undone: Undone,
}

impl fmt::Display for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path.display();
        match &self.undone {
            Undone::Contents {
                bytes,
                size_before,
                size_after,
            } => write!(
                f,
                "{path}: {bytes} unsynced bytes undone (size {size_before} -> {size_after})"
            ),
            Undone::NameRemoved => write!(f, "{path}: name removed (never made durable)"),
            Undone::NameRestored => write!(f, "{path}: name back (its removal never made durable)"),
            Undone::Missing => write!(f, "{path}: durable, but no longer held (a lazyfs bug)"),
        }
    }
}

#[derive(Debug, Default)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub lost: Vec<Lost>,
}

type Entry = (Id, OsString, Id);

impl Model {
    /// What a power loss now would undo, and how.
    pub fn power_loss(&self) -> Plan {
        let durable = DurableTree::of(self);
        let mut work = Work::of(self);
        let mut plan = Plan::default();
        self.restore_contents(&durable, &work, &mut plan);
        self.take_away(&durable, &mut work, &mut plan);
        put_back(&durable, &mut work, &mut plan, |id| self.kind(id));
        let left: Vec<Id> = work.stashed.iter().copied().collect();
        plan.steps
            .extend(left.into_iter().map(|id| Step::Purge { id }));
        plan
    }

    /// Files that keep a durable name get their unsynced writes undone
    /// first, where they are now.
    fn restore_contents(&self, durable: &DurableTree, work: &Work, plan: &mut Plan) {
        for (id, path) in &durable.first {
            let Some(node) = self.nodes.get(id) else {
                continue;
            };
            let (Some(first), Some(now)) = (node.undo.first(), work.path(*id)) else {
                continue;
            };
            plan.lost.push(Lost {
                path: path.clone(),
                undone: Undone::Contents {
                    bytes: node.unsynced,
                    size_before: node.len,
                    size_after: node.committed.map_or(first.old_len, |(_, last)| last),
                },
            });
            let undo = node.undo.iter().rev().cloned().collect();
            let sizes = node
                .committed
                .map_or(Vec::new(), |(min, last)| vec![min, last]);
            plan.steps.push(Step::Restore {
                path: now,
                undo,
                sizes,
            });
        }
    }

    /// Entries now and not durable, deepest first: a thing durable under
    /// another name goes to the stash (unless it has a name or a stashed
    /// copy left); anything else is deleted, with what is under it (an
    /// entry inside a directory that goes is left to go with it).
    fn take_away(&self, durable: &DurableTree, work: &mut Work, plan: &mut Plan) {
        let mut gone: Vec<(usize, PathBuf, Entry)> = Vec::new();
        for (dir, node) in &self.nodes {
            let listed = *dir == ROOT || !node.links.is_empty();
            for (name, id) in node.entries.iter().filter(|_| listed) {
                let entry = (*dir, name.clone(), *id);
                if !durable.entries.contains(&entry) {
                    let path = work.path(*dir).unwrap_or_default().join(name);
                    gone.push((path.components().count(), path, entry));
                }
            }
        }
        gone.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        for (_, path, (dir, name, id)) in gone {
            let wanted = durable.first.contains_key(&id);
            if !wanted && !durable.first.contains_key(&dir) {
                continue; // goes with its directory
            }
            let elsewhere = work.links(id) > 1 || work.stashed.contains(&id);
            plan.steps.push(match wanted && !elsewhere {
                true => Step::Stash {
                    path: path.clone(),
                    id,
                },
                false => Step::Remove { path: path.clone() },
            });
            work.unlink(dir, &name, id, wanted && !elsewhere);
            plan.lost.push(Lost {
                path,
                undone: Undone::NameRemoved,
            });
        }
    }
}

/// Entries durable and not there now, parents first: from the stash, or
/// as a hard link of the file under a name it kept.
fn put_back(
    durable: &DurableTree,
    work: &mut Work,
    plan: &mut Plan,
    kind: impl Fn(Id) -> Option<Kind>,
) {
    for (dir, name, id) in &durable.order {
        if work.has_link(*dir, name, *id) {
            continue;
        }
        let path = work.path(*dir).unwrap_or_default().join(name);
        let step = if work.stashed.remove(id) {
            Step::Place {
                id: *id,
                path: path.clone(),
            }
        } else if let Some(from) = work.path(*id).filter(|_| kind(*id) != Some(Kind::Dir)) {
            Step::Link {
                from,
                to: path.clone(),
            }
        } else {
            plan.lost.push(Lost {
                path,
                undone: Undone::Missing,
            });
            continue;
        };
        plan.steps.push(step);
        work.links
            .entry(*id)
            .or_default()
            .push((*dir, name.clone()));
        plan.lost.push(Lost {
            path,
            undone: Undone::NameRestored,
        });
    }
}

/// The tree a power loss would leave: the entries reachable from the root
/// through durable entries, in breadth-first order, and the first path of
/// each thing reached. A directory reached twice (a cross-directory rename
/// of which only one side was made durable, under `Strict`) stays at its
/// first place: a directory has one name.
struct DurableTree {
    order: Vec<Entry>,
    entries: BTreeSet<Entry>,
    first: BTreeMap<Id, PathBuf>,
}

impl DurableTree {
    fn of(model: &Model) -> DurableTree {
        let mut tree = DurableTree {
            order: Vec::new(),
            entries: BTreeSet::new(),
            first: BTreeMap::from([(ROOT, PathBuf::new())]),
        };
        let mut todo = VecDeque::from([ROOT]);
        while let Some(dir) = todo.pop_front() {
            let Some(node) = model.nodes.get(&dir) else {
                continue;
            };
            for (name, id) in &node.durable {
                let Some(kind) = model.kind(*id) else {
                    continue;
                };
                let seen = tree.first.contains_key(id);
                if seen && kind == Kind::Dir {
                    continue;
                }
                if !seen {
                    tree.first.insert(*id, tree.first[&dir].join(name));
                    if kind == Kind::Dir {
                        todo.push_back(*id);
                    }
                }
                tree.order.push((dir, name.clone(), *id));
                tree.entries.insert((dir, name.clone(), *id));
            }
        }
        tree
    }
}

/// Where each thing is on the backing directory while the steps run.
struct Work {
    links: BTreeMap<Id, Vec<(Id, OsString)>>,
    stashed: BTreeSet<Id>,
}

impl Work {
    fn of(model: &Model) -> Work {
        Work {
            links: model
                .nodes
                .iter()
                .map(|(id, n)| (*id, n.links.clone()))
                .collect(),
            stashed: model.stashed.clone(),
        }
    }

    fn path(&self, id: Id) -> Option<PathBuf> {
        if id == ROOT {
            return Some(PathBuf::new());
        }
        match self.links.get(&id).and_then(|l| l.first()) {
            Some((dir, name)) => Some(self.path(*dir)?.join(name)),
            None if self.stashed.contains(&id) => Some(stash_path(id)),
            None => None,
        }
    }

    fn links(&self, id: Id) -> usize {
        self.links.get(&id).map_or(0, Vec::len)
    }

    fn has_link(&self, dir: Id, name: &OsString, id: Id) -> bool {
        let links = self.links.get(&id);
        links.is_some_and(|l| l.iter().any(|(d, n)| *d == dir && n == name))
    }

    fn unlink(&mut self, dir: Id, name: &OsString, id: Id, stashed: bool) {
        if let Some(links) = self.links.get_mut(&id) {
            links.retain(|(d, n)| !(*d == dir && n == name));
        }
        if stashed {
            self.stashed.insert(id);
        }
    }
}
