//! The evidence page's sequence diagram, drawn from the transcript.

use std::collections::BTreeMap;

use crate::transcript::{CrowdNote, Entry, FaultEvent, Observation, Observed};
use crate::vocab::{Broker, FaultAction, Role, Status, Target};

/// The registry's diagram note for the placement a fault names (its
/// target, action and window), with its message filled in.
fn registry_note(f: &FaultEvent, mid: &str) -> Option<String> {
    let window = f.window?;
    let p = crate::vocab::placement_at(f.target, f.action, window)?;
    let note = p.note.replace("{mid}", mid);
    Some(note.replace("{window}", window.name())).filter(|n| !n.is_empty())
}

/// A Mermaid sequence diagram of what the transcript says happened: who
/// published, which process got which delivery, what reached PostgreSQL,
/// where a process was killed. One pass over the lines; each role's lines
/// are drawn by a method of [`Diagram`] of their own.
pub fn mermaid(lines: &[String]) -> String {
    let entries: Vec<Entry> = lines.iter().filter_map(|l| Entry::parse(l)).collect();
    let mut d = Diagram::new(&entries);
    for e in &entries {
        let mid = e.get("messageId").unwrap_or("");
        let (Ok(role), Some(Ok(status))) = (
            e.role.parse::<Role>(),
            e.get("status").map(str::parse::<Status>),
        ) else {
            continue;
        };
        match role {
            Role::Producer => d.producer(e, status, mid),
            Role::Fault => {
                if let Some(f) = FaultEvent::read(e) {
                    d.fault(&f)
                }
            }
            Role::Consumer => d.consumer(e, status, mid),
            Role::Observe => {
                if let Some(o) = Observation::read(e) {
                    d.observe(&o)
                }
            }
            Role::Job => d.job(e, status),
            Role::Inspect | Role::Assert | Role::Check => {}
        }
    }
    d.render()
}

/// What the diagram has drawn so far: its statements, and the participants
/// they name (declared first when rendered).
struct Diagram<'a> {
    entries: &'a [Entry],
    /// Competing instances (a rendezvous): each message is drawn on the
    /// instance that received it, each closing line on the next instance.
    crowd: bool,
    queues: Vec<String>,
    consumers: usize,
    next_is_new_process: bool,
    instance_of: BTreeMap<String, usize>,
    done: usize,
    body: Vec<String>,
    has_db: bool,
    has_dlq: bool,
    has_downstream: bool,
    has_broker: bool,
    has_network: bool,
    /// Cluster nodes a fault named, in order of first mention.
    nodes: Vec<String>,
}

impl<'a> Diagram<'a> {
    fn new(entries: &'a [Entry]) -> Self {
        Diagram {
            entries,
            crowd: entries
                .iter()
                .any(|e| e.get("status") == Some(Status::AtRendezvous.name())),
            queues: Vec::new(),
            consumers: 1,
            next_is_new_process: false,
            instance_of: BTreeMap::new(),
            done: 0,
            body: Vec::new(),
            has_db: false,
            has_dlq: false,
            has_downstream: false,
            has_broker: false,
            has_network: false,
            nodes: Vec::new(),
        }
    }

    /// The queue's participant (`Q<n>`), declared at its first mention.
    fn queue(&mut self, name: &str) -> String {
        if !self.queues.iter().any(|q| q == name) {
            self.queues.push(name.to_string());
        }
        format!(
            "Q{}",
            self.queues.iter().position(|q| q == name).unwrap() + 1
        )
    }

    fn producer(&mut self, e: &Entry, status: Status, mid: &str) {
        match status {
            Status::Confirmed
            | Status::Nacked
            | Status::Unconfirmed
            | Status::ConfirmTimeout
            | Status::Returned
            | Status::Parked => {
                let q = self.queue(e.get("destination").unwrap_or("?"));
                self.body.push(format!(
                    "    P->>{q}: {mid} [{}] {status}",
                    e.get("routingKey").unwrap_or("")
                ));
            }
            Status::Buffered => self.body.push(format!(
                "    Note over P: {mid} buffered in the client's batch (the send call returned)"
            )),
            // An order service: its database is the order's and the outbox's.
            Status::OrderCommitted => {
                self.has_db = true;
                self.body.push(format!("    P->>DB: commit the order of {mid}"));
            }
            Status::OrderExists => {
                self.has_db = true;
                self.body.push(format!("    Note over P: the order of {mid} is committed already: taken as done"));
            }
            // `row`: the outbox row, when another message carries its event.
            Status::OutboxSent => {
                self.has_db = true;
                self.body.push(match e.get("row") {
                    Some(row) => format!("    P->>DB: mark {row}'s outbox row sent (published as {mid})"),
                    None => format!("    P->>DB: mark {mid}'s outbox row sent"),
                });
            }
            Status::OutboxKept => self.body.push(format!(
                "    Note over P: nacked: the outbox row of {mid}'s event stays unsent, the relay's pass ends"
            )),
            Status::CrashInjected if order_service(self.entries, e).is_some() => {
                let relays = self
                    .entries
                    .iter()
                    .any(|x| x.get("status") == Some(Status::OutboxSent.name()));
                self.body.push(match order_service(self.entries, e) {
                    Some(Status::OrderCommitted) => format!(
                        "    Note over P: SIGKILL after the order of {mid} committed, before any publish: a new process takes committed orders as done"
                    ),
                    _ if relays => format!(
                        "    Note over P: SIGKILL at the fault window ({mid}): a new process takes committed orders as done and relays the outbox rows not marked sent"
                    ),
                    _ => format!(
                        "    Note over P: SIGKILL at the fault window ({mid}): a new process takes committed orders as done"
                    ),
                })
            }
            Status::CrashInjected => self.body.push(format!(
                "    Note over P: SIGKILL at the fault window ({mid}), a new producer process resends what it never saw confirmed"
            )),
            Status::ConnectionLost => self.body.push(format!(
                "    Note over P: connection lost, {mid} unconfirmed: it connects again (to a live node) and sends {mid} again"
            )),
            _ => {}
        }
    }

    /// A fault the harness injected or healed, read back from its line.
    fn fault(&mut self, f: &FaultEvent) {
        use FaultAction as A;
        let consumers = self.consumers;
        let mid = f.message.as_deref().unwrap_or("");
        let action = f.action;
        match (f.target, f.status) {
            (Target::Broker, Status::Injected) => {
                self.has_broker = true;
                let what = match registry_note(f, mid) {
                    Some(note) => note,
                    None => format!("broker {action}: SIGKILL, then started on the same data"),
                };
                self.body.push(format!("    Note over B: {what}"));
            }
            (Target::Broker, _) => {
                self.has_broker = true;
                let what = match action {
                    A::Pause => "resumed: it answers again",
                    _ => "ready again",
                };
                self.body.push(format!("    Note over B: {what}"));
            }
            (Target::Node, status) => {
                let n = f.node.map_or_else(|| "?".to_string(), |n| n.to_string());
                if !self.nodes.contains(&n) {
                    self.nodes.push(n.clone());
                }
                let what = match (action, status) {
                    (A::Kill, _) if !mid.is_empty() => {
                        format!("SIGKILL, the confirm of {mid} in flight (held back). It stays down")
                    }
                    (A::Kill, _) => "SIGKILL. It stays down".to_string(),
                    (A::Restart, Status::Injected) => "started again on its data".into(),
                    (A::Restart, _) => "back, rejoined the cluster".into(),
                    (A::Partition, _) => "cut off from the other nodes".into(),
                    (A::Heal, Status::Injected) => "the partition ends".into(),
                    (A::Heal, _) => "reachable again".into(),
                    (other, _) => other.to_string(),
                };
                self.body.push(format!("    Note over N{n}: node {n}: {what}"));
            }
            (Target::Consumer, Status::Injected) if action == A::Rendezvous => {
                let on_lock = match &f.crowd {
                    CrowdNote::Arrivals { on_lock, .. } if on_lock != "none" => Some(on_lock),
                    _ => None,
                };
                let what = match on_lock {
                    Some(l) => format!(
                        "rendezvous: the copies of {mid}'s event taken at once, every transaction open. {l} waits on a row lock, held there"
                    ),
                    None => format!(
                        "rendezvous: the copies of {mid}'s event taken at once, every transaction open"
                    ),
                };
                self.body.push(format!("    Note over C1,C{consumers}: {what}"));
            }
            (Target::Consumer, Status::Injected) if action == A::Stall => self.body.push(format!(
                "    Note over C1,C{consumers}: stall: consumer-1 holds {mid} while the other instance settles the rest"
            )),
            (Target::Consumer, Status::Healed) if action == A::Stall => self.body.push(format!(
                "    Note over C1,C{consumers}: consumer-1 released: it completes {mid} last"
            )),
            (Target::Consumer, Status::Healed) if action == A::Rendezvous => self.body.push(
                format!("    Note over C1,C{consumers}: every instance released, one at a time, consumer-1 first"),
            ),
            (Target::Database, status) => self.database(f, status, mid),
            (Target::Network, Status::Injected) => {
                self.has_network = true;
                let what = match registry_note(f, mid) {
                    Some(note) => note,
                    None => format!("network {action} of {mid}"),
                };
                self.body.push(format!("    Note over N: {what}"));
            }
            _ => {}
        }
    }

    /// A database fault: its note, and the database back on its data.
    fn database(&mut self, f: &FaultEvent, status: Status, mid: &str) {
        self.has_db = true;
        let what = match status {
            Status::Injected => {
                registry_note(f, mid).unwrap_or_else(|| format!("database {}", f.action))
            }
            _ => "started again on what its disk holds".to_string(),
        };
        self.body.push(format!("    Note over DB: {what}"));
    }

    /// The consumer process (or, competing, the instance) a consumer's
    /// line is drawn on.
    fn consumer_instance(&mut self, e: &Entry, status: Status, mid: &str) -> usize {
        // A new process's first line: a delivery, a call it makes at
        // start for an intent left pending, or its closing line when
        // it had nothing to do.
        let first = matches!(
            status,
            Status::Received | Status::IntentRecovered | Status::CallFailed | Status::Done
        );
        if self.next_is_new_process && first && !self.crowd {
            self.consumers += 1;
            self.next_is_new_process = false;
        }
        match (status, e.get("consumer")) {
            _ if !self.crowd => self.consumers,
            (Status::Done, _) => {
                self.done += 1;
                self.done
            }
            (_, Some(name)) => {
                let n = name
                    .rsplit('-')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(1);
                self.instance_of.insert(mid.to_string(), n);
                self.consumers = self.consumers.max(n);
                n
            }
            _ => self.instance_of.get(mid).copied().unwrap_or(1),
        }
    }

    /// Long because it is one match with an arm per status a consumer line
    /// can have, each drawing its statements.
    fn consumer(&mut self, e: &Entry, status: Status, mid: &str) {
        let instance = self.consumer_instance(e, status, mid);
        let c = format!("C{instance}");
        let dest = e.get("destination").or(e.get("queue")).unwrap_or("?");
        let q = self.queue(dest);
        let attempt = e.get("attempt").unwrap_or("1");
        match status {
            Status::Received => {
                let re = if e.get("redelivered") == Some("true") {
                    ", redelivered"
                } else {
                    ""
                };
                self.body
                    .push(format!("    {q}->>{c}: {mid} (attempt {attempt}{re})"));
            }
            Status::BusinessCommitted => {
                self.has_db = true;
                self.body
                    .push(format!("    {c}->>DB: commit the business row for {mid}"));
            }
            Status::BusinessRejected => {
                self.has_db = true;
                self.body.push(format!(
                    "    {c}->>DB: commit {mid}'s business rejection (no business row)"
                ));
                self.body.push(format!("    {c}-->>{q}: ack {mid}"));
            }
            Status::DuplicateSkipped => {
                self.has_db = true;
                self.body.push(format!(
                    "    {c}->>DB: inbox hit for {mid}: duplicate, rolled back"
                ));
                self.body.push(format!("    {c}-->>{q}: ack {mid}"));
            }
            Status::Retry => self
                .body
                .push(format!("    {c}-->>{q}: reject {mid} (to the retry queue)")),
            Status::Requeued => self
                .body
                .push(format!("    {c}-->>{q}: nack {mid}, requeue=true")),
            Status::Rejected => self.body.push(format!("    {c}-->>{q}: reject {mid}")),
            Status::PoisonToDlq => {
                self.has_dlq = true;
                self.body
                    .push(format!("    {c}->>DLQ: publish {mid} (attempt {attempt})"));
                self.body.push(format!("    {c}-->>{q}: ack {mid}"));
            }
            Status::CrashInjected => {
                self.body.push(format!(
                    "    Note over {c}: SIGKILL at the fault window ({mid})"
                ));
                self.next_is_new_process = true;
            }
            Status::AtRendezvous => self.body.push(format!(
                "    Note over {c}: held at the window ({mid}): stopped (SIGSTOP)"
            )),
            Status::DownstreamCalled => {
                self.has_downstream = true;
                self.body
                    .push(format!("    {c}->>DS: call for {mid} (after the ack)"));
            }
            Status::CallFailed => {
                self.has_downstream = true;
                self.body
                    .push(format!("    {c}->>DS: call for {mid}, failed"));
            }
            Status::IntentRecovered => {
                (self.has_downstream, self.has_db) = (true, true);
                self.body.push(format!(
                    "    {c}->>DS: call for {mid}'s pending intent (at start)"
                ));
                self.body
                    .push(format!("    {c}->>DB: mark {mid}'s intent done"));
            }
            Status::Done => {
                self.body.push(format!(
                    "    Note over {c}: exits after {} deliveries",
                    e.get("received").unwrap_or("?")
                ));
                self.next_is_new_process = true;
            }
            Status::ConnectionLost => self.body.push(format!(
                "    Note over {c}: connection lost, the same process connects again"
            )),
            _ => {}
        }
    }

    /// A black-box program, seen through the proxies.
    fn observe(&mut self, o: &Observation) {
        let mid = o.message.as_str();
        if self.next_is_new_process && matches!(o.seen, Observed::Delivered { .. }) && !self.crowd {
            self.consumers += 1;
            self.next_is_new_process = false;
        }
        // Competing instances: each line names its own.
        let instance = match o.consumer.as_deref().filter(|_| self.crowd) {
            Some(name) => {
                let n = name
                    .rsplit('-')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(1);
                self.consumers = self.consumers.max(n);
                n
            }
            None => self.consumers,
        };
        let c = format!("C{instance}");
        let q = self.queue(&o.queue);
        match &o.seen {
            Observed::Delivered { redelivered, .. } => {
                let re = if *redelivered { ", redelivered" } else { "" };
                self.body.push(format!("    {q}->>{c}: {mid}{re}"));
            }
            Observed::Committed => {
                self.has_db = true;
                self.body.push(format!("    {c}->>DB: COMMIT ({mid})"));
            }
            Observed::RolledBack => {
                self.has_db = true;
                self.body
                    .push(format!("    {c}->>DB: COMMIT, rolled back ({mid})"));
            }
            Observed::Acked => self.body.push(format!("    {c}-->>{q}: ack {mid}")),
            Observed::Held { what, .. } => {
                self.has_network = true;
                self.body
                    .push(format!("    Note over N: {what} of {mid} held"));
            }
            Observed::Killed { .. } => {
                self.body
                    .push(format!("    Note over {c}: SIGKILL at the window ({mid})"));
                self.next_is_new_process = true;
            }
            Observed::AtRendezvous => self.body.push(format!(
                "    Note over {c}: held at its COMMIT ({mid}), its transaction open"
            )),
        }
    }

    fn job(&mut self, e: &Entry, status: Status) {
        if status == Status::Replayed {
            let from = self.queue(e.get("from").unwrap_or("?"));
            let to = self.queue(e.get("to").unwrap_or("?"));
            self.body.push(format!(
                "    {from}->>{to}: replayed, {} moved back",
                e.get("moved").unwrap_or("?")
            ));
            return;
        }
        if status == Status::QueueDeleted {
            let q = self.queue(e.get("queue").unwrap_or("?"));
            self.body.push(format!(
                "    Note over {q}: deleted by an administrator, with its {} messages",
                e.get("held").unwrap_or("?")
            ));
            return;
        }
        if status == Status::PolicySet {
            let q = self.queue(e.get("queue").unwrap_or("?"));
            self.body.push(format!(
                "    Note over {q}: policy {} set",
                e.get("policy").unwrap_or("?")
            ));
            return;
        }
        self.has_db = true;
        self.body.push(format!(
            "    Note over DB: inbox purge: rows older than {} ms deleted ({})",
            e.get("retentionMs").unwrap_or("?"),
            e.get("purged").unwrap_or("?")
        ));
    }

    fn render(self) -> String {
        let mut out = String::from("sequenceDiagram\n    participant P as producer\n");
        for (i, q) in self.queues.iter().enumerate() {
            out.push_str(&format!("    participant Q{} as {q}\n", i + 1));
        }
        for c in 1..=self.consumers {
            out.push_str(&format!("    participant C{c} as consumer process {c}\n"));
        }
        if self.has_dlq {
            out.push_str("    participant DLQ as DLQ\n");
        }
        if self.has_network {
            out.push_str("    participant N as network (the harness's proxy)\n");
        }
        // The lines' `product` names the broker (RabbitMQ for a transcript
        // without one).
        let broker = self
            .entries
            .iter()
            .find_map(|e| e.get("product")?.parse::<Broker>().ok())
            .unwrap_or_default()
            .product();
        if self.has_broker {
            out.push_str(&format!("    participant B as {broker} node\n"));
        }
        for n in &self.nodes {
            out.push_str(&format!("    participant N{n} as {broker} node {n}\n"));
        }
        if self.has_db {
            out.push_str("    participant DB as PostgreSQL\n");
        }
        if self.has_downstream {
            out.push_str("    participant DS as downstream service\n");
        }
        for l in self.body {
            out.push_str(&statement(&l));
            out.push('\n');
        }
        out
    }
}

/// For a producer that is an order service (it committed orders before
/// `e`): the status of its last line about `e`'s message before `e`.
fn order_service(entries: &[Entry], e: &Entry) -> Option<Status> {
    let before: Vec<&Entry> = entries
        .iter()
        .take_while(|x| !std::ptr::eq(*x, e))
        .filter(|x| x.role == Role::Producer.name())
        .collect();
    let serves = before
        .iter()
        .any(|x| x.get("status") == Some(Status::OrderCommitted.name()));
    if !serves {
        return None;
    }
    before
        .iter()
        .rev()
        .find(|x| x.get("messageId") == e.get("messageId"))
        .and_then(|x| x.get("status")?.parse().ok())
}

/// Mermaid ends a statement at `;`, so one inside a message or note (a
/// message id, a reason) would cut the line short and fail the diagram:
/// it is written as Mermaid's entity code instead, which renders as `;`.
fn statement(line: &str) -> std::borrow::Cow<'_, str> {
    match line.contains(';') {
        true => line.replace(';', "#59;").into(),
        false => line.into(),
    }
}
