//! What the harness itself says in a transcript, as typed events: a fault
//! it injected or healed, and what the proxies saw a user's program do.
//! Each event has two renderings: its transcript line ([`FaultEvent::line`],
//! [`Observation::line`]) and the evidence diagram's note, which the
//! evidence draws from the event read back from the line ([`FaultEvent::read`],
//! [`Observation::read`]), so that a stored snapshot draws as a live run.
//! The round trip is tested below, for every shape a family writes.

use super::{Entry, Record};
use crate::vocab::{Broker, FaultAction, Role, Status, Target, Window};

/// A `[fault]` line: the fault a family injected (`status=injected`) or
/// healed (`status=healed`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultEvent {
    pub target: Target,
    /// The cluster node a node fault acts on.
    pub node: Option<usize>,
    pub action: FaultAction,
    /// The window a fault on a step is placed at (none: between steps).
    pub window: Option<Window>,
    /// The message at that window.
    pub message: Option<String>,
    pub crowd: CrowdNote,
    /// [`Status::Injected`] or [`Status::Healed`].
    pub status: Status,
}

/// What a fault on competing instances adds to its injected line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CrowdNote {
    #[default]
    None,
    /// A rendezvous: the instances held at the window, and those waiting
    /// on a row lock (`consumer-1,consumer-2`, or `none`).
    Arrivals { at_window: String, on_lock: String },
    /// A stall: the instance held.
    Held(String),
}

impl FaultEvent {
    /// `action` on `target`, injected, between steps.
    pub fn injected(target: Target, action: FaultAction) -> FaultEvent {
        FaultEvent {
            target,
            node: None,
            action,
            window: None,
            message: None,
            crowd: CrowdNote::None,
            status: Status::Injected,
        }
    }

    pub fn on_node(self, node: usize) -> FaultEvent {
        FaultEvent {
            node: Some(node),
            ..self
        }
    }

    /// Placed at `window`, on `message`.
    pub fn at(self, window: Window, message: &str) -> FaultEvent {
        FaultEvent {
            window: Some(window),
            message: Some(message.to_string()),
            ..self
        }
    }

    pub fn with_crowd(self, crowd: CrowdNote) -> FaultEvent {
        FaultEvent { crowd, ..self }
    }

    /// The same fault, healed (its crowd detail is the injected line's only).
    pub fn healed(&self) -> FaultEvent {
        FaultEvent {
            crowd: CrowdNote::None,
            status: Status::Healed,
            ..self.clone()
        }
    }

    /// Its transcript line's body (the runner adds the `[fault]` role).
    pub fn line(&self, broker: Broker, lab: &str) -> String {
        let mut r = Record::new(broker, lab).with("target", self.target);
        if let Some(n) = self.node {
            r = r.with("node", n);
        }
        r = r.with("action", self.action);
        if let Some(w) = self.window {
            r = r.with("window", w);
        }
        if let Some(m) = &self.message {
            r = r.with("messageId", m);
        }
        r = match &self.crowd {
            CrowdNote::None => r,
            CrowdNote::Arrivals { at_window, on_lock } => {
                r.with("atWindow", at_window).with("onLock", on_lock)
            }
            CrowdNote::Held(who) => r.with("held", who),
        };
        r.status(self.status)
    }

    /// The event a `[fault]` line says; None for another role's line or a
    /// line this version would not write.
    pub fn read(e: &Entry) -> Option<FaultEvent> {
        if e.role != Role::Fault.name() {
            return None;
        }
        let status = e.get("status")?.parse().ok()?;
        if !matches!(status, Status::Injected | Status::Healed) {
            return None;
        }
        let crowd = match (e.get("atWindow"), e.get("onLock"), e.get("held")) {
            (Some(a), Some(l), None) => CrowdNote::Arrivals {
                at_window: a.to_string(),
                on_lock: l.to_string(),
            },
            (None, None, Some(h)) => CrowdNote::Held(h.to_string()),
            (None, None, None) => CrowdNote::None,
            _ => return None,
        };
        Some(FaultEvent {
            target: e.get("target")?.parse().ok()?,
            node: match e.get("node") {
                Some(n) => Some(n.parse().ok()?),
                None => None,
            },
            action: e.get("action")?.parse().ok()?,
            window: match e.get("window") {
                Some(w) => Some(w.parse().ok()?),
                None => None,
            },
            message: e.get("messageId").map(str::to_string),
            crowd,
            status,
        })
    }
}

/// An `[observe]` line: what the proxies saw a user's program (the black
/// box) do with one message, on one queue; which instance, when a step
/// runs several.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    pub message: String,
    pub queue: String,
    pub consumer: Option<String>,
    pub seen: Observed,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    /// `auto_ack`: the program consumes without acks (said only then).
    Delivered {
        redelivered: bool,
        auto_ack: bool,
    },
    Committed,
    RolledBack,
    /// A frame held at the program's window (`what`), and the commit it
    /// belongs to, when the window is one.
    Held {
        what: String,
        commit: Option<usize>,
    },
    Acked,
    /// A competing instance held at its window (a rendezvous).
    AtRendezvous,
    /// The program killed at its window: its exit code, and the business
    /// rows the database held for the message at that moment.
    Killed {
        exit_code: i32,
        business_rows: i64,
    },
}

impl Observation {
    /// Its transcript line's body (the runner adds the `[observe]` role).
    pub fn line(&self, broker: Broker, lab: &str) -> String {
        let mut r = Record::new(broker, lab)
            .with("messageId", &self.message)
            .with("destination", &self.queue);
        if let Some(c) = &self.consumer {
            r = r.with("consumer", c);
        }
        let status = match &self.seen {
            Observed::Delivered {
                redelivered,
                auto_ack,
            } => {
                r = r.with("redelivered", redelivered);
                if *auto_ack {
                    r = r.with("autoAck", true);
                }
                Status::Delivered
            }
            Observed::Committed => Status::Committed,
            Observed::RolledBack => Status::RolledBack,
            Observed::Held { what, commit } => {
                r = r.with("what", what);
                if let Some(k) = commit {
                    r = r.with("commit", k);
                }
                Status::Held
            }
            Observed::Acked => Status::Acked,
            Observed::AtRendezvous => Status::AtRendezvous,
            Observed::Killed {
                exit_code,
                business_rows,
            } => {
                r = r
                    .with("exitCode", exit_code)
                    .with("businessRows", business_rows);
                Status::Killed
            }
        };
        r.status(status)
    }

    /// The observation an `[observe]` line says; None for another role's
    /// line or a line this version would not write.
    pub fn read(e: &Entry) -> Option<Observation> {
        if e.role != Role::Observe.name() {
            return None;
        }
        let seen = match e.get("status")?.parse().ok()? {
            Status::Delivered => Observed::Delivered {
                redelivered: e.get("redelivered")?.parse().ok()?,
                auto_ack: e.get("autoAck") == Some("true"),
            },
            Status::Committed => Observed::Committed,
            Status::RolledBack => Observed::RolledBack,
            Status::Held => Observed::Held {
                what: e.get("what")?.to_string(),
                commit: match e.get("commit") {
                    Some(k) => Some(k.parse().ok()?),
                    None => None,
                },
            },
            Status::Acked => Observed::Acked,
            Status::AtRendezvous => Observed::AtRendezvous,
            Status::Killed => Observed::Killed {
                exit_code: e.get("exitCode")?.parse().ok()?,
                business_rows: e.get("businessRows")?.parse().ok()?,
            },
            _ => return None,
        };
        Some(Observation {
            message: e.get("messageId")?.to_string(),
            queue: e.get("destination")?.to_string(),
            consumer: e.get("consumer").map(str::to_string),
            seen,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_back<T>(role: Role, body: &str, read: impl Fn(&Entry) -> Option<T>) -> Option<T> {
        read(&Entry::parse(&format!("[{}] {body}", role.name())).unwrap())
    }

    /// Every shape a family writes, rendered and read back, is itself.
    #[test]
    fn fault_events_round_trip_through_their_lines() {
        use FaultAction as A;
        let crowd = CrowdNote::Arrivals {
            at_window: "consumer-1,consumer-2".into(),
            on_lock: "none".into(),
        };
        let events = [
            FaultEvent::injected(Target::Broker, A::Restart),
            FaultEvent::injected(Target::Broker, A::Restart).healed(),
            FaultEvent::injected(Target::Broker, A::Pause)
                .at(Window::AfterPublishBeforeConfirm, "mid-2"),
            FaultEvent::injected(Target::Node, A::Kill).on_node(1),
            FaultEvent::injected(Target::Node, A::Restart)
                .on_node(2)
                .healed(),
            FaultEvent::injected(Target::Node, A::Kill)
                .on_node(1)
                .at(Window::AfterPublishBeforeConfirm, "mid-3"),
            FaultEvent::injected(Target::Network, A::Cut).at(Window::AfterCommitBeforeAck, "mid-1"),
            FaultEvent::injected(Target::Consumer, A::Rendezvous)
                .at(Window::AfterCommitBeforeAck, "mid-1")
                .with_crowd(crowd),
            FaultEvent::injected(Target::Consumer, A::Stall)
                .at(Window::AfterCommitBeforeAck, "mid-1")
                .with_crowd(CrowdNote::Held("consumer-1".into())),
        ];
        for ev in events {
            let line = ev.line(Broker::RabbitMq, "lab");
            assert_eq!(
                read_back(Role::Fault, &line, FaultEvent::read).as_ref(),
                Some(&ev),
                "{line}"
            );
            assert_eq!(read_back(Role::Observe, &line, FaultEvent::read), None);
        }
    }

    /// The fields in the order the transcripts have always had them.
    #[test]
    fn a_fault_line_keeps_its_field_order() {
        let line = FaultEvent::injected(Target::Node, FaultAction::Kill)
            .on_node(1)
            .at(Window::AfterPublishBeforeConfirm, "mid-3")
            .line(Broker::RabbitMq, "lab");
        let body = line.split_once(" lab=lab ").unwrap().1;
        assert_eq!(
            body,
            "target=node node=1 action=kill window=after-publish-before-confirm messageId=mid-3 status=injected"
        );
    }

    #[test]
    fn observations_round_trip_through_their_lines() {
        let seen = [
            Observed::Delivered {
                redelivered: true,
                auto_ack: false,
            },
            Observed::Delivered {
                redelivered: false,
                auto_ack: true,
            },
            Observed::Committed,
            Observed::RolledBack,
            Observed::Held {
                what: "the ack".into(),
                commit: Some(2),
            },
            Observed::Held {
                what: "the COMMIT".into(),
                commit: None,
            },
            Observed::Acked,
            Observed::AtRendezvous,
            Observed::Killed {
                exit_code: 137,
                business_rows: 1,
            },
        ];
        for (i, seen) in seen.into_iter().enumerate() {
            let o = Observation {
                message: "mid-1".into(),
                queue: "orders".into(),
                consumer: (i % 2 == 0).then(|| "consumer-2".to_string()),
                seen,
            };
            let line = o.line(Broker::RabbitMq, "lab");
            assert_eq!(
                read_back(Role::Observe, &line, Observation::read).as_ref(),
                Some(&o),
                "{line}"
            );
        }
    }

    /// Every `[fault]` and `[observe]` line of every stored snapshot (the
    /// project's and the examples') reads back as its event: the diagrams
    /// drawn from them draw each one.
    #[test]
    fn every_stored_line_reads_back() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let dirs = [
            "snapshots",
            "examples/python/snapshots",
            "examples/node/snapshots",
        ];
        let (mut faults, mut observed, mut unread) = (0, 0, Vec::new());
        for dir in dirs {
            for file in std::fs::read_dir(root.join(dir)).unwrap().flatten() {
                let text = std::fs::read_to_string(file.path()).unwrap();
                for line in text.lines() {
                    let Some(e) = Entry::parse(line) else {
                        continue;
                    };
                    let read = match e.role.as_str() {
                        "fault" => FaultEvent::read(&e).map(|_| faults += 1),
                        "observe" => Observation::read(&e).map(|_| observed += 1),
                        _ => Some(()),
                    };
                    if read.is_none() {
                        unread.push(format!("{}: {line}", file.path().display()));
                    }
                }
            }
        }
        assert!(unread.is_empty(), "{}", unread.join("\n"));
        assert!(
            faults > 30 && observed > 50,
            "{faults} fault lines, {observed} observations"
        );
    }

    /// A line this version would not write is no event (the diagram then
    /// draws nothing for it, as for an unknown status).
    #[test]
    fn a_fault_line_with_mixed_crowd_fields_is_no_event() {
        let line = "[fault] lab=x target=consumer action=stall held=consumer-1 onLock=none status=injected";
        assert_eq!(FaultEvent::read(&Entry::parse(line).unwrap()), None);
    }
}
