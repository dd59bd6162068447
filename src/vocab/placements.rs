//! Where each fault family's action can go ([`PLACEMENTS`]), and the one
//! kind per placement ([`Kind`]) the runner dispatches on: an exhaustive
//! `match`, so a placement without its hook does not compile.

use super::{FaultAction, Target, Then, Window, PRODUCER_WINDOWS, PROGRAM_WINDOWS};

/// Where a fault goes in a lab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// On a publish step, at a window of one of its messages.
    Publish,
    /// On a consume step, at a window of a message published before it.
    Consume,
    /// In a step of its own, between two steps.
    Between,
}

impl Site {
    pub fn describe(self) -> &'static str {
        match self {
            Site::Publish => "on a publish step",
            Site::Consume => "on a consume step",
            Site::Between => "in a step of its own",
        }
    }
}

/// The windows a placement can use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Windows {
    /// None: the fault acts between steps.
    None,
    /// Exactly these.
    These(&'static [Window]),
    /// The ones the consumer passes: its pattern's derived windows, or a
    /// program's [`PROGRAM_WINDOWS`].
    ConsumerPath,
    /// The ones the producer passes: [`PRODUCER_WINDOWS`], or an order
    /// service's [`ORDER_SERVICE_WINDOWS`].
    ProducerPath,
}

/// Which points `mqlab explore` makes of a placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Explore {
    /// None (a cluster's faults: explore refuses a cluster lab).
    No,
    /// One row per window, `target/window`, a column per message.
    PerWindow,
    /// One row per window under this name (`power-loss/after-ack`), for a
    /// target with more than one action explored per window.
    PerWindowAs(&'static str),
    /// One row of this name, a column per message (per pair of steps for
    /// [`Site::Between`]).
    Row(&'static str),
}

/// One kind per placement: what the runner dispatches on. Each step's
/// dispatch is an exhaustive `match` on its site's kind, with no wildcard,
/// so a placement added here without its hook in the runner does not
/// compile (the `compile_fail` example in [`crate::faults`] shows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Publish(OnPublish),
    Consume(OnConsume),
    Between(BetweenSteps),
}

/// The placements on a publish step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnPublish {
    /// SIGKILL of the producer at a window of its path ([`crate::faults::point`]).
    ProducerKill,
    /// The publish dropped and the connection cut (the proxy).
    CutPublish,
    /// The confirm held back (the proxy).
    HoldConfirm,
    /// The broker stopped with a confirm held ([`crate::faults::pause`]).
    BrokerPause,
    /// The producer's node killed with its confirm held ([`crate::faults::node`]).
    NodeKill,
}

/// The placements on a consume step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnConsume {
    /// SIGKILL of the consumer (built-in or a program) at a window.
    ConsumerKill,
    /// The consumer's connection cut (the proxy): before its COMMIT, or
    /// with its ack.
    Cut,
    /// Competing instances held together ([`crate::faults::rendezvous`]).
    Rendezvous,
    /// One instance held while the other goes on ([`crate::faults::stall`]).
    Stall,
    /// The consumer killed at its window with its database, by a SIGKILL
    /// or a power loss ([`crate::faults::database`]).
    Database(DatabaseFault),
}

/// What a database fault does to the run's own PostgreSQL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatabaseFault {
    /// Every process SIGKILLed: the operating system keeps what was written.
    Kill,
    /// The file system frozen, every process SIGKILLed, what was never
    /// made durable dropped.
    PowerLoss,
}

/// The placements in a step of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BetweenSteps {
    /// SIGKILL of the broker, started again on its data ([`crate::faults::broker`]).
    BrokerRestart,
    /// A cluster node's fault ([`crate::faults::node`]).
    Node(NodeFault),
}

/// What a between-steps node fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeFault {
    Kill,
    Restart,
    Partition,
    Heal,
}

impl Kind {
    /// Where a placement of this kind goes.
    pub const fn site(self) -> Site {
        match self {
            Kind::Publish(_) => Site::Publish,
            Kind::Consume(_) => Site::Consume,
            Kind::Between(_) => Site::Between,
        }
    }
}

/// One place a fault family's action can go: the single table the lab-file
/// checks, `mqlab list`, `explore`, the docs and the evidence notes read
/// (Jepsen keeps a nemesis's schedule with its faults; ripgrep one item per
/// flag). No other code lists which action goes where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Which hook runs it.
    pub kind: Kind,
    pub target: Target,
    pub action: FaultAction,
    pub site: Site,
    pub windows: Windows,
    /// What follows it (a lab may say so, and must not say otherwise).
    pub then: Then,
    /// A consume-step placement for the built-in consumer only (the
    /// proxy's connection cut needs the harness's own role: its round
    /// trip at the window, its reconnect).
    pub built_in_only: bool,
    /// A publish-step placement that needs the step's confirm and no
    /// confirm timeout (the harness holds the confirm until it acts).
    pub needs_confirm: bool,
    /// A publish-step placement that needs a confirm timeout (the producer
    /// gives up on a held confirm).
    pub needs_confirm_timeout: bool,
    /// For [`Windows::ConsumerPath`]: the windows a program (black box)
    /// offers it, where fewer than [`PROGRAM_WINDOWS`].
    pub program_windows: &'static [Window],
    pub explore: Explore,
    /// What it does, for `mqlab list` and the docs.
    pub doc: &'static str,
    /// The evidence diagram's note when it is injected (`{mid}`: the
    /// message, `{window}`: its window); empty where the diagram says more
    /// than one thing.
    pub note: &'static str,
}

const fn placement(
    kind: Kind,
    target: Target,
    action: FaultAction,
    windows: Windows,
    then: Then,
) -> Placement {
    Placement {
        kind,
        target,
        action,
        site: kind.site(),
        windows,
        then,
        built_in_only: false,
        needs_confirm: false,
        needs_confirm_timeout: false,
        program_windows: PROGRAM_WINDOWS,
        explore: Explore::No,
        doc: "",
        note: "",
    }
}

/// Every placement, by fault family: role kill at a window, network cut and
/// hold (the harness's AMQP proxy), broker restart, cluster node faults.
pub const PLACEMENTS: &[Placement] = &[
    Placement {
        explore: Explore::PerWindow,
        doc: "SIGKILL at a window its pattern (or program) passes; a fresh consumer takes over",
        ..placement(Kind::Consume(OnConsume::ConsumerKill), Target::Consumer, FaultAction::Kill, Windows::ConsumerPath, Then::Restart)
    },
    Placement {
        explore: Explore::PerWindow,
        doc: "SIGKILL at a window of its path; a fresh producer resends what it never saw confirmed (an order service: takes the orders it finds committed as done, and relays the outbox rows not marked sent)",
        ..placement(Kind::Publish(OnPublish::ProducerKill), Target::Producer, FaultAction::Kill, Windows::ProducerPath, Then::Restart)
    },
    Placement {
        built_in_only: true,
        explore: Explore::PerWindow,
        doc: "the consumer's connection closed by the proxy: at `before-commit`, while its transaction is open (its round trip on the channel there is dropped, so it learns of the loss before its COMMIT and abandons the delivery, as a handler cancelled with its connection does); at `after-commit-before-ack`, its ack of the message dropped with it (it committed and acked; the broker never hears it). The same process connects again and gets the message redelivered",
        note: "{window} of {mid}: the consumer's connection cut",
        ..placement(Kind::Consume(OnConsume::Cut), Target::Network, FaultAction::Cut, Windows::These(&[Window::BeforeCommit, Window::AfterCommitBeforeAck]), Then::Reconnect)
    },
    Placement {
        explore: Explore::No,
        // A program is held by its PostgreSQL proxy: at its COMMIT only.
        program_windows: &[Window::BeforeCommit],
        doc: "with `instances = N` (competing consumers of one service): every copy of the message's event goes to its own instance, each is held at the window (or, blocked on a row lock, stopped), then they are released one at a time: both transactions were open at once (a program's: held at its COMMIT, `before-commit`)",
        note: "the copies of {mid}'s event held together",
        ..placement(Kind::Consume(OnConsume::Rendezvous), Target::Consumer, FaultAction::Rendezvous, Windows::ConsumerPath, Then::None)
    },
    Placement {
        built_in_only: true,
        explore: Explore::No,
        doc: "with `instances = 2` (competing consumers of one service, prefetch 1): the instance that takes the message is held at the window while the other settles every other message, then released: what it took first completes last",
        note: "{mid} held while the other instance goes on",
        ..placement(Kind::Consume(OnConsume::Stall), Target::Consumer, FaultAction::Stall, Windows::ConsumerPath, Then::None)
    },
    Placement {
        built_in_only: true,
        explore: Explore::PerWindowAs("database-kill"),
        doc: "with a `database` of the run's own (`durable`, `fsync-off`, `async-commit`): the consumer stopped at its window and SIGKILLed with every process of its PostgreSQL (the broker stays up); the database is started again on its data, then a fresh consumer",
        note: "{window} of {mid}: the consumer and every process of its database SIGKILLed",
        ..placement(Kind::Consume(OnConsume::Database(DatabaseFault::Kill)), Target::Database, FaultAction::Kill, Windows::ConsumerPath, Then::Restart)
    },
    Placement {
        built_in_only: true,
        explore: Explore::PerWindowAs("power-loss"),
        doc: "with a `database` of the run's own: the consumer stopped at its window, then the power of its machine lost: the database's file system (the lazy file system) frozen, the consumer and every process of the database SIGKILLed, what was never made durable dropped (the broker stays up); the database is started again on what was durable, then a fresh consumer",
        note: "{window} of {mid}: power lost, the consumer and its database die, what the database never made durable is gone",
        ..placement(Kind::Consume(OnConsume::Database(DatabaseFault::PowerLoss)), Target::Database, FaultAction::PowerLoss, Windows::ConsumerPath, Then::Restart)
    },
    Placement {
        explore: Explore::Row("network/cut-publish"),
        doc: "the publish itself is dropped and the connection closed (the broker never gets the message)",
        note: "the publish of {mid} dropped, the connection cut",
        ..placement(Kind::Publish(OnPublish::CutPublish), Target::Network, FaultAction::Cut, Windows::These(&[Window::AfterPublishBeforeBroker]), Then::Restart)
    },
    Placement {
        needs_confirm_timeout: true,
        explore: Explore::Row("network/hold-confirm"),
        doc: "the broker's confirm of the message is held; the producer times out",
        note: "the confirm of {mid} held back",
        ..placement(Kind::Publish(OnPublish::HoldConfirm), Target::Network, FaultAction::Hold, Windows::These(&[Window::AfterPublishBeforeConfirm]), Then::None)
    },
    Placement {
        needs_confirm_timeout: true,
        explore: Explore::Row("broker/pause"),
        doc: "the proxy holds the message's confirm (the broker has the message) and the broker is stopped (SIGSTOP); once the producer times out, the broker resumes and the producer's resend is confirmed",
        note: "the broker paused, the confirm of {mid} held back",
        ..placement(Kind::Publish(OnPublish::BrokerPause), Target::Broker, FaultAction::Pause, Windows::These(&[Window::AfterPublishBeforeConfirm]), Then::None)
    },
    Placement {
        explore: Explore::Row("broker/restart"),
        doc: "SIGKILL the broker and start it again on the same data",
        ..placement(Kind::Between(BetweenSteps::BrokerRestart), Target::Broker, FaultAction::Restart, Windows::None, Then::None)
    },
    Placement {
        needs_confirm: true,
        doc: "with `node = N`, the producer's own node: the proxy holds the message's confirm (the broker has it), then the node dies; the producer connects again to a live node and sends the message again",
        ..placement(Kind::Publish(OnPublish::NodeKill), Target::Node, FaultAction::Kill, Windows::These(&[Window::AfterPublishBeforeConfirm]), Then::Reconnect)
    },
    Placement {
        doc: "with `node = N`: SIGKILL; it stays down until its `restart`",
        ..placement(Kind::Between(BetweenSteps::Node(NodeFault::Kill)), Target::Node, FaultAction::Kill, Windows::None, Then::None)
    },
    Placement {
        doc: "with `node = N`: start a killed node again, it rejoins",
        ..placement(Kind::Between(BetweenSteps::Node(NodeFault::Restart)), Target::Node, FaultAction::Restart, Windows::None, Then::None)
    },
    Placement {
        doc: "with `node = N`: cut it off from the other two (iptables, root); it pauses itself (pause_minority)",
        ..placement(Kind::Between(BetweenSteps::Node(NodeFault::Partition)), Target::Node, FaultAction::Partition, Windows::None, Then::None)
    },
    Placement {
        doc: "with `node = N`: end its partition",
        ..placement(Kind::Between(BetweenSteps::Node(NodeFault::Heal)), Target::Node, FaultAction::Heal, Windows::None, Then::None)
    },
];

/// The placement of `action` of `target` at `site`, if the registry has one.
pub fn placement_of(target: Target, action: FaultAction, site: Site) -> Option<&'static Placement> {
    PLACEMENTS
        .iter()
        .find(|p| p.target == target && p.action == action && p.site == site)
}

/// The placements as a Markdown table: `docs/faults.md` holds it between
/// its `placements` markers, and a test fails when the two differ.
pub fn placements_markdown() -> String {
    let mut out = String::from(
        "| fault | where | windows | what it does, and what follows |\n|---|---|---|---|\n",
    );
    for p in PLACEMENTS {
        let windows = match p.windows {
            Windows::None => "between two steps".to_string(),
            Windows::These(ws) => ws
                .iter()
                .map(|w| format!("`{w}`"))
                .collect::<Vec<_>>()
                .join(", "),
            Windows::ConsumerPath if p.built_in_only => {
                "those the consumer's pattern passes".to_string()
            }
            Windows::ConsumerPath if p.program_windows.len() < PROGRAM_WINDOWS.len() => format!(
                "those the consumer's pattern passes, or a program's {}",
                p.program_windows
                    .iter()
                    .map(|w| format!("`{w}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Windows::ConsumerPath => {
                "those the consumer's pattern passes, or a program's five (`mqlab list` names them)"
                    .to_string()
            }
            Windows::ProducerPath => format!(
                "{}; an order service (`orders`) first `{}`",
                PRODUCER_WINDOWS
                    .iter()
                    .map(|w| format!("`{w}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
                Window::AfterOrderCommit
            ),
        };
        let mut site = p.site.describe().to_string();
        if p.built_in_only {
            site.push_str(" (the built-in consumer)");
        }
        if p.needs_confirm {
            site.push_str(", with `confirm = true` and no `confirm_timeout_ms`");
        }
        if p.needs_confirm_timeout {
            site.push_str(", with `confirm = true` and a `confirm_timeout_ms`");
        }
        out.push_str(&format!(
            "| `{}` `{}` | {site} | {windows} | {}; then `{}` |\n",
            p.target, p.action, p.doc, p.then
        ));
    }
    out
}

/// The placement a fault line names (`target`, `action`, `window`): a
/// window tells a publish step's placement from a consume step's; a
/// placement on a role's path is the one of its target and action.
pub fn placement_at(
    target: Target,
    action: FaultAction,
    window: Window,
) -> Option<&'static Placement> {
    PLACEMENTS.iter().find(|p| {
        p.target == target
            && p.action == action
            && match p.windows {
                Windows::These(ws) => ws.contains(&window),
                // A target whose action has one placement: that one.
                Windows::ConsumerPath | Windows::ProducerPath => {
                    placements_of(target).filter(|q| q.action == action).count() == 1
                }
                Windows::None => false,
            }
    })
}

/// The placements of one target, in table order.
pub fn placements_of(target: Target) -> impl Iterator<Item = &'static Placement> {
    PLACEMENTS.iter().filter(move |p| p.target == target)
}

/// Where each target's actions go, in one line: the lab checker's message
/// for a fault on the wrong step, derived from [`PLACEMENTS`].
pub fn placements_summary() -> String {
    Target::ALL
        .iter()
        .map(|(t, name, _)| {
            // Sites in table order, each with its actions: "cut or hold on a publish step".
            let mut sites: Vec<(Site, Vec<String>)> = Vec::new();
            for p in placements_of(*t) {
                let action = match p.built_in_only {
                    true => format!("{} (built-in consumer)", p.action),
                    false => p.action.name().to_string(),
                };
                match sites.iter_mut().find(|(s, _)| *s == p.site) {
                    Some((_, actions)) => actions.push(action),
                    None => sites.push((p.site, vec![action])),
                }
            }
            let sites: Vec<String> = sites
                .iter()
                .map(|(site, actions)| {
                    let actions = match actions.split_last() {
                        Some((last, [])) => last.to_string(),
                        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                        None => String::new(),
                    };
                    format!("{actions} {}", site.describe())
                })
                .collect();
            format!("{name}: {}", sites.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The placement registry is consistent: one entry per (target, action,
    /// site) and per kind, windows exactly where a fault acts inside a step, a
    /// follow-up only there, distinct explore rows, a note for each
    /// network placement (the evidence diagram reads it).
    #[test]
    fn placements_are_consistent() {
        let mut seen = Vec::new();
        let mut rows = Vec::new();
        let mut kinds = Vec::new();
        for p in PLACEMENTS {
            let key = (p.target, p.action, p.site);
            assert!(!seen.contains(&key), "{key:?} twice");
            seen.push(key);
            // One hook per placement: two placements of one kind would run
            // one's hook for the other.
            assert!(!kinds.contains(&p.kind), "{:?} twice", p.kind);
            assert_eq!(p.site, p.kind.site(), "{key:?}");
            kinds.push(p.kind);
            assert_eq!(
                p.site == Site::Between,
                p.windows == Windows::None,
                "{key:?}"
            );
            if p.site == Site::Between {
                assert_eq!(p.then, Then::None, "{key:?}");
            }
            assert!(!p.doc.is_empty(), "{key:?}");
            if p.target == Target::Network {
                assert!(p.note.contains("{mid}"), "{key:?}");
                let Windows::These(ws) = p.windows else {
                    panic!("{key:?}")
                };
                for w in ws {
                    assert_eq!(placement_at(p.target, p.action, *w), Some(p), "{key:?}");
                }
            }
            if let Explore::Row(r) = p.explore {
                assert!(!rows.contains(&r), "{r} twice");
                rows.push(r);
            }
        }
        for (t, _, _) in Target::ALL {
            assert!(placements_of(*t).next().is_some(), "{t} has no placement");
        }
    }

    /// `docs/faults.md` shows the registry as it is (regenerate with
    /// `MQLAB_UPDATE_DOCS=1 cargo test --lib placements_table`).
    #[test]
    fn the_placements_table_in_the_docs_is_the_registry() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/faults.md");
        let doc = std::fs::read_to_string(&path).unwrap();
        let (begin, end) = (
            "<!-- placements: from vocab::PLACEMENTS -->\n",
            "<!-- end placements -->",
        );
        let start = doc.find(begin).expect("the begin marker") + begin.len();
        let stop = doc[start..].find(end).expect("the end marker") + start;
        let table = placements_markdown();
        if std::env::var("MQLAB_UPDATE_DOCS").is_ok_and(|v| v == "1") {
            std::fs::write(&path, format!("{}{table}{}", &doc[..start], &doc[stop..])).unwrap();
        } else {
            assert_eq!(
                doc[start..stop],
                table,
                "docs/faults.md differs from the registry (MQLAB_UPDATE_DOCS=1 cargo test --lib placements_table)"
            );
        }
    }
}
