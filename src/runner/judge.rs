//! Probes and judging: queue state read from the broker, inspect fields from PostgreSQL, the assertions and the total-queue checks.

use super::*;
use crate::checker::{Owed, Queued};
use crate::failure::Failure;
use crate::vocab::{ORIGINAL_QUEUE, PARKED_BY};

impl Ctx<'_> {
    /// Ready messages and consumers of a queue; `None` when the broker says
    /// the queue's node is down or unreachable (a classic queue in a cluster
    /// lab), after which the harness's channel, closed by that error, is
    /// opened again.
    pub(super) async fn queue_state(&mut self, queue: &str) -> Result<Option<(u32, u32)>> {
        let nodes = (
            self.servers.nodes_down.clone(),
            self.servers.nodes_cut.clone(),
        );
        // Only while the lab holds a node down or cut off: an answer
        // given with every node up is never taken as lasting.
        let faulted = !nodes.0.is_empty() || !nodes.1.is_empty();
        if faulted && self.servers.home_node_down.get(queue) == Some(&nodes) {
            return Ok(None);
        }
        if faulted && self.home_down_asked(queue, &nodes).await {
            self.servers.home_node_down.insert(queue.to_string(), nodes);
            return Ok(None);
        }
        match self.conns().broker.queue_state(queue).await {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.downcast_ref::<crate::broker::HomeNodeDown>().is_some() => {
                if faulted {
                    self.servers.home_node_down.insert(queue.to_string(), nodes);
                }
                self.conns().broker.reopen().await?;
                Ok(None)
            }
            Err(e) => Err(anyhow!("{e:#}")),
        }
    }

    /// Whether the harness's node finds a classic queue's process on a node
    /// the lab holds down or cut off and out of reach, asked once per queue
    /// while the same nodes are down and cut off: what a read would be
    /// answered, without 4.0's 60 s of retries.
    /// Not asked (another queue type, one node), or no answer: false, and
    /// the read asks the broker.
    async fn home_down_asked(&mut self, queue: &str, nodes: &NodesFaulted) -> bool {
        let classic = self
            .lab
            .topology
            .queues
            .iter()
            .any(|q| q.name == queue && !q.is_quorum());
        if !classic || self.servers.home_asked.get(queue) == Some(nodes) {
            return false;
        }
        self.servers
            .home_asked
            .insert(queue.to_string(), nodes.clone());
        let n = self.harness_node();
        let faulted: Vec<usize> = nodes.0.union(&nodes.1).copied().collect();
        let asked = self
            .env
            .read()
            .queue_home_down(n, &self.vhost, queue, &faulted)
            .await;
        match asked {
            Ok(answer) => answer == Some(true),
            Err(e) => {
                eprintln!(
                    "mqlab: {}: whether `{queue}`'s process is out of reach could not be asked ({e:#}): the broker is asked",
                    self.run
                );
                false
            }
        }
    }

    pub(super) async fn await_depth(
        &mut self,
        queue: &str,
        depth: u32,
        phase: &str,
        deadline: Instant,
    ) -> Result<()> {
        loop {
            let (ready, _) = self.conns().broker.queue_state(queue).await?;
            if ready == depth {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Failure::Deadline.error(format!(
                    "phase {phase}: `{queue}` holds {ready} ready messages, not {depth}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// What a queue holds beyond its ready messages (a quorum queue's
    /// at-least-once dead-letters waiting for their target), for the queues
    /// a `heldAfter` counter names: read from its process or leader. A read
    /// that fails leaves the counter unread (a failed assertion, not a value).
    async fn read_held(&mut self, asserts: &[Assertion]) {
        let held: BTreeSet<String> = asserts
            .iter()
            .filter(|a| a.counter.counter == Counter::HeldAfter)
            .filter_map(|a| a.counter.arg.clone())
            .collect();
        self.log.observed.held.clear();
        for q in held {
            let holds = self.env.read().queue_holds(&self.vhost, &q).await;
            match holds {
                Ok(n) => self.log.observed.held.insert(q, n),
                Err(e) => {
                    eprintln!(
                        "mqlab: {}: what `{q}` holds could not be read: {e:#}",
                        self.run
                    );
                    self.log.observed.held.remove(&q)
                }
            };
        }
    }

    /// Judges one point of the history now, prints its lines and keeps it.
    pub(super) fn judge(&mut self, point: Point, role: Role) {
        let entries = self.log.transcript.entries();
        for (outcome, line) in checker::judge(&point, &entries) {
            self.emit(role, &line);
            self.log.sink.tell(&Event::Outcome(&outcome));
            self.log.outcomes.push(outcome);
        }
        self.log.history.points.push(point);
    }

    /// The total-queue checks, from ground truth read now: `[check]` lines.
    pub(super) async fn check(&mut self) -> Result<()> {
        // At the end, not at an assertion: a fault's may come before the call.
        if let Some(d) = &self.links.downstream {
            let unlost = d.unlost();
            if !unlost.is_empty() {
                return Err(Failure::unreachable(format!(
                    "the downstream never lost a response for {}: the lab's fault did not happen (no call for that event)",
                    unlost.join(", ")
                )));
            }
        }
        self.await_tiers_empty().await?;
        let ground = self.ground().await?;
        let mut queued = BTreeSet::new();
        let mut queued_in = Queued::default();
        let owed = owed(self.lab, &self.log.observed.events);
        // A producer's parking queue is its outbox: a copy the producer
        // parked there (marked) is held for the queue its event is owed to,
        // when there is exactly one (with more, which one refused it is not
        // known: held for none).
        let parks: BTreeSet<&str> = self
            .lab
            .steps
            .iter()
            .filter_map(|s| match &s.action {
                Action::Publish(p) => p.park.as_deref(),
                _ => None,
            })
            .collect();
        let queues: Vec<String> = self.lab.queue_names().map(str::to_string).collect();
        for q in &queues {
            for p in self.conns().broker.peek(q).await? {
                let event = store::event_id(&p.body, &p.message_id);
                // Held for this queue, and, when it was moved here from
                // another queue, for that one too: the queue a consumer
                // moved it from and the queue the broker first
                // dead-lettered it from (a chain: both).
                let origins = [ORIGINAL_QUEUE, "x-first-death-queue"]
                    .into_iter()
                    .filter_map(|h| p.headers.get(h));
                let owed_queues = owed
                    .0
                    .get(&event)
                    .filter(|routes| {
                        routes.len() == 1
                            && parks.contains(q.as_str())
                            && p.headers.contains_key(PARKED_BY)
                    })
                    .into_iter()
                    .flat_map(|routes| routes.keys());
                for held_for in std::iter::once(q).chain(origins).chain(owed_queues) {
                    queued_in
                        .0
                        .entry(held_for.clone())
                        .or_default()
                        .insert(event.clone());
                }
                queued.insert(event);
            }
        }
        let point = Point::Checks {
            after_line: self.log.transcript.lines().len(),
            ground,
            queued,
            events: self.log.observed.events.clone(),
            owed,
            queued_in,
        };
        self.judge(point, Role::Check);
        Ok(())
    }

    pub(super) async fn inspect(&mut self, fields: &[crate::vocab::InspectField]) -> Result<()> {
        let ground = self.ground().await?;
        let mut r = Record::new(self.lab.broker, &self.lab.name);
        for f in fields {
            r = r.with(f.name(), ground.field(*f));
        }
        self.emit(Role::Inspect, &r.status(Status::Snapshot));
        Ok(())
    }

    /// The service's inbox purge, run by the harness as the service's
    /// scheduled job would run it.
    pub(super) async fn purge_inbox(&mut self, service: &str, retention_ms: u64) -> Result<()> {
        let purged = store::purge_inbox(&mut self.conns().db, service, retention_ms).await?;
        let line = Record::new(self.lab.broker, &self.lab.name)
            .with("consumer", service)
            .with("retentionMs", retention_ms)
            .with("purged", purged)
            .status(Status::InboxPurged);
        self.emit(Role::Job, &line);
        Ok(())
    }

    /// An operator's DLQ replay: what `from` holds moved into `to`.
    pub(super) async fn replay(&mut self, from: &str, to: &str) -> Result<()> {
        let moved = self.conns().broker.replay(from, to).await?;
        let line = Record::new(self.lab.broker, &self.lab.name)
            .with("from", from)
            .with("to", to)
            .with("moved", moved)
            .status(Status::Replayed);
        self.emit(Role::Job, &line);
        Ok(())
    }

    /// An administrator's deletion of queues, each with what it held.
    pub(super) async fn admin_delete(&mut self, names: &[String]) -> Result<()> {
        for queue in names {
            let held = self.conns().broker.delete_queue(queue).await?;
            let line = Record::new(self.lab.broker, &self.lab.name)
                .with("queue", queue)
                .with("held", held)
                .status(Status::QueueDeleted);
            self.emit(Role::Job, &line);
        }
        Ok(())
    }

    /// A policy for one queue, set on the running broker as an operator
    /// would set it, in force on the queue before the next step.
    pub(super) async fn set_policy(
        &mut self,
        name: &str,
        queue: &str,
        definition: &str,
    ) -> Result<()> {
        let vhost = self.vhost.clone();
        let request = crate::env::PolicyRequest {
            vhost: &vhost,
            name,
            queue,
            definition,
        };
        self.env
            .owned()
            .context("a policy step needs the environment to itself (it sets the policy with rabbitmqctl eval): this run shares it")?
            .set_policy(&request)
            .await?;
        let line = Record::new(self.lab.broker, &self.lab.name)
            .with("policy", name)
            .with("queue", queue)
            .status(Status::PolicySet);
        self.emit(Role::Job, &line);
        Ok(())
    }

    /// Re-reads the broker and PostgreSQL, then evaluates: every value comes
    /// from an observation taken now.
    pub(super) async fn assert(&mut self, asserts: &[Assertion]) -> Result<()> {
        if asserts.is_empty() {
            return Ok(());
        }
        self.await_tiers_empty().await?;
        self.log.observed.ground = self.ground().await?;
        self.log.observed.downstream = self.links.downstream.as_ref().map(|d| d.calls());
        self.log.observed.downstream_callers = self.lab.downstream_callers();
        // A queue marked `later` is read once a declare step made it.
        let queues: Vec<String> = (self.lab.topology.queues.iter())
            .filter(|q| !q.later || self.servers.declared_later.contains(&q.name))
            .map(|q| q.name.clone())
            .collect();
        for q in queues {
            // A queue on a node that is down is not read: a counter that
            // needs its depth says so.
            // An earlier reading is not this one: it goes.
            match self.queue_state(&q).await? {
                Some((ready, _)) => self.log.observed.depths.insert(q, ready),
                None => self.log.observed.depths.remove(&q),
            };
        }
        self.read_held(asserts).await;
        // Only the queues a `dlqHeader` counter reads are peeked: a peek
        // requeues, which marks the messages redelivered.
        let read: BTreeSet<String> = asserts
            .iter()
            .filter(|a| {
                matches!(
                    a.counter.counter,
                    Counter::DlqHeader | Counter::DlqFailedFor
                )
            })
            .filter_map(|a| {
                a.counter
                    .arg
                    .as_deref()?
                    .split_once('/')
                    .map(|(q, _)| q.to_string())
            })
            .collect();
        for q in read {
            let peeked = self.conns().broker.peek(&q).await?;
            self.log
                .observed
                .dlq
                .insert(q, peeked.into_iter().map(|p| p.headers).collect());
        }
        let point = Point::Assert {
            after_line: self.log.transcript.lines().len(),
            observed: self.log.observed.clone(),
            assertions: asserts
                .iter()
                .map(|a| Asserted {
                    name: a.name.clone(),
                    counter: a.counter.clone(),
                    expected: a.expected.clone(),
                })
                .collect(),
        };
        self.judge(point, Role::Assert);
        Ok(())
    }
}

/// Which services owe each event the lab publishes: the queues its publish
/// is routed to (among those declared by then), each with the services of
/// the lab's consume steps on it.
fn owed(lab: &Lab, events: &Events) -> Owed {
    let mut consumers: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for s in &lab.steps {
        if let Action::Consume(c) = &s.action {
            consumers
                .entry(c.queue.as_str())
                .or_default()
                .insert(c.service.clone());
        }
    }
    let mut declared: BTreeSet<&str> = lab
        .topology
        .queues
        .iter()
        .filter(|q| !q.later)
        .map(|q| q.name.as_str())
        .collect();
    let mut owed = Owed::default();
    for s in &lab.steps {
        match &s.action {
            Action::Declare(names) => declared.extend(names.iter().map(String::as_str)),
            Action::Delete(names) => {
                for n in names {
                    declared.remove(n.as_str());
                }
            }
            Action::Publish(p) => {
                for m in &p.messages {
                    let Some(queues) = lab.topology.route(&p.exchange, &m.routing_key, &declared)
                    else {
                        continue;
                    };
                    let routes = owed
                        .0
                        .entry(events.of(&m.meta.message_id).to_string())
                        .or_default();
                    for q in queues {
                        let services = consumers.get(q).cloned().unwrap_or_default();
                        routes.entry(q.to_string()).or_default().extend(services);
                    }
                }
            }
            _ => {}
        }
    }
    owed
}
