//! The steps of their own kind, not a role's (`policy`, `purge_inbox`,
//! `declare`, `delete`, `await`, `replay`), and what a deleted queue
//! forbids until it is declared again.

use super::*;

impl Checker<'_> {
    /// A step of its own kind, not a role's (`policy`, `purge_inbox`,
    /// `declare`, `delete`, `await`, `replay`): None when `s` is none of
    /// them; Some(None) when it is one and has an error.
    pub(super) fn standalone(
        &mut self,
        key: &str,
        s: &RawStep,
        raw: &RawLab,
        topology: &Topology,
    ) -> Option<Option<Step>> {
        if s.policy.is_none()
            && s.purge_inbox.is_none()
            && s.declare.is_none()
            && s.delete.is_none()
            && s.await_depth.is_none()
            && s.replay.is_none()
        {
            return None;
        }
        if actions(s) > 1 {
            self.err(key.to_string(), None, ErrorKind::StepActions);
            return Some(None);
        }
        let action = if let Some(p) = &s.policy {
            self.policy(key, p, topology)
        } else if let Some(p) = &s.purge_inbox {
            Action::PurgeInbox {
                service: p.service.clone(),
                retention_ms: p.retention_ms,
            }
        } else if let Some(names) = &s.declare {
            self.declare(key, names, topology)
        } else if let Some(names) = &s.delete {
            self.delete(key, names, topology)
        } else if let Some(r) = &s.replay {
            self.replay(key, r, topology)
        } else {
            let a = s.await_depth.as_ref().expect("one of the six");
            self.await_step(key, a, topology)
        };
        let asserts = self.asserts(&format!("{key}.assert"), &s.assert, raw);
        Some(Some(Step {
            action,
            fault: None,
            asserts,
        }))
    }

    /// A `replay` step: two declared queues, not the same one.
    fn replay(
        &mut self,
        key: &str,
        r: &crate::lab::schema::RawReplay,
        topology: &Topology,
    ) -> Action {
        for (field, q) in [("from", &r.from), ("to", &r.to)] {
            if !topology.queues.iter().any(|t| &t.name == q.get_ref()) {
                self.err(
                    format!("{key}.replay.{field}"),
                    span(q),
                    ErrorKind::UnknownQueue(q.get_ref().clone()),
                );
            }
        }
        if r.from.get_ref() == r.to.get_ref() {
            self.err(
                format!("{key}.replay.to"),
                span(&r.to),
                ErrorKind::ReplayIntoItself,
            );
        }
        Action::Replay {
            from: r.from.get_ref().clone(),
            to: r.to.get_ref().clone(),
        }
    }

    /// An `await` step: its queue declared, and its `from` a queue that
    /// dead-letters straight into it.
    fn await_step(
        &mut self,
        key: &str,
        a: &crate::lab::schema::RawAwait,
        topology: &Topology,
    ) -> Action {
        for (field, q) in
            std::iter::once(("queue", &a.queue)).chain(a.from.iter().map(|f| ("from", f)))
        {
            if !topology.queues.iter().any(|t| &t.name == q.get_ref()) {
                self.err(
                    format!("{key}.await.{field}"),
                    span(q),
                    ErrorKind::UnknownQueue(q.get_ref().clone()),
                );
            }
        }
        if let Some(f) = &a.from {
            if topology.queues.iter().any(|t| &t.name == f.get_ref())
                && !dead_letters_into(topology, f.get_ref(), a.queue.get_ref())
            {
                self.err(
                    format!("{key}.await.from"),
                    span(f),
                    ErrorKind::AwaitFromNotDeadLettering {
                        from: f.get_ref().clone(),
                        queue: a.queue.get_ref().clone(),
                    },
                );
            }
        }
        Action::Await {
            queue: a.queue.get_ref().clone(),
            depth: a.depth,
            within_secs: a.within_secs.get(),
            from: a.from.as_ref().map(|f| f.get_ref().clone()),
        }
    }

    /// A `policy` step: its queue declared, and a classic one (a quorum or
    /// stream queue applies a policy after it reports it).
    fn policy(
        &mut self,
        key: &str,
        p: &crate::lab::schema::RawPolicy,
        topology: &Topology,
    ) -> Action {
        match topology
            .queues
            .iter()
            .find(|q| &q.name == p.queue.get_ref())
        {
            None => self.err(
                format!("{key}.policy.queue"),
                span(&p.queue),
                ErrorKind::UnknownQueue(p.queue.get_ref().clone()),
            ),
            Some(q) => {
                if let Some(ArgValue::Str(kind)) = q.arguments.get("x-queue-type") {
                    if kind != "classic" {
                        self.err(
                            format!("{key}.policy.queue"),
                            span(&p.queue),
                            ErrorKind::PolicyOnClassicOnly(q.name.clone(), kind.clone()),
                        );
                    }
                }
            }
        }
        Action::Policy {
            name: p.name.clone(),
            queue: p.queue.get_ref().clone(),
            definition: serde_json::to_string(&p.definition)
                .expect("a map of strings, numbers and booleans"),
        }
    }

    /// A `declare` step: each name a queue or exchange marked `later`, or a
    /// queue a `delete` step before it deleted.
    fn declare(&mut self, key: &str, names: &[Spanned<String>], topology: &Topology) -> Action {
        for (j, n) in names.iter().enumerate() {
            let later = topology
                .queues
                .iter()
                .any(|q| q.later && &q.name == n.get_ref())
                || topology
                    .exchanges
                    .iter()
                    .any(|x| x.later && &x.name == n.get_ref())
                || self.deleted.iter().any(|(d, _)| d == n.get_ref());
            if !later {
                self.err(
                    format!("{key}.declare[{j}]"),
                    span(n),
                    ErrorKind::NotLater(n.get_ref().clone()),
                );
            }
        }
        self.deleted
            .retain(|(d, _)| !names.iter().any(|n| n.get_ref() == d));
        self.declared
            .extend(names.iter().map(|n| n.get_ref().clone()));
        Action::Declare(names.iter().map(|n| n.get_ref().clone()).collect())
    }

    /// A `delete` step: each name a queue of the lab's topology that
    /// exists at this step (a `later` one declared, none deleted already:
    /// RabbitMQ answers the deletion of a missing queue as done).
    fn delete(&mut self, key: &str, names: &[Spanned<String>], topology: &Topology) -> Action {
        for (j, n) in names.iter().enumerate() {
            let name = n.get_ref();
            let Some(q) = topology.queues.iter().find(|q| &q.name == name) else {
                self.err(
                    format!("{key}.delete[{j}]"),
                    span(n),
                    ErrorKind::UnknownQueue(name.clone()),
                );
                continue;
            };
            if (q.later && !self.declared.contains(name))
                || self.deleted.iter().any(|(d, _)| d == name)
            {
                self.err(
                    format!("{key}.delete[{j}]"),
                    span(n),
                    ErrorKind::NothingToDelete(name.clone()),
                );
                continue;
            }
            self.deleted.push((name.clone(), key.to_string()));
        }
        Action::Delete(names.iter().map(|n| n.get_ref().clone()).collect())
    }

    /// While a queue is deleted, every read of the broker's queues (an
    /// assertion, a consume, a wait, a fault) would find it missing: a step
    /// then may only publish (unrouted to it), delete or declare, and its
    /// assertions, read after it, need every queue there again.
    pub(super) fn while_deleted(&mut self, key: &str, s: &RawStep) {
        if let Some((queue, by)) = self.deleted.first().cloned() {
            let publishes = s.publish.is_some() && s.fault.is_none();
            if !(publishes || s.delete.is_some() || s.declare.is_some()) {
                self.err(key.to_string(), None, ErrorKind::WhileDeleted { queue, by });
                return;
            }
        }
        let mut after = self.deleted.clone();
        if let Some(names) = &s.declare {
            after.retain(|(d, _)| !names.iter().any(|n| n.get_ref() == d));
        }
        for n in s.delete.iter().flatten() {
            after.push((n.get_ref().clone(), key.to_string()));
        }
        if let (Some((queue, by)), false) = (after.first().cloned(), s.assert.is_empty()) {
            self.err(
                format!("{key}.assert"),
                None,
                ErrorKind::WhileDeleted { queue, by },
            );
        }
    }
}
