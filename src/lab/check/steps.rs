//! The step sections: publish and consume, and the order of all steps
//! (the steps of their own kind are [`super::standalone`]'s).

use super::*;

impl Checker<'_> {
    /// Long because it checks one section of the file key by key, in the
    /// file's order, so that errors come out in that order.
    pub(super) fn steps(
        &mut self,
        raw: &RawLab,
        topology: &Topology,
        missing_ok: &[String],
    ) -> Vec<Step> {
        let mut published: Vec<String> = Vec::new();
        let mut next_id = 1;
        let mut steps = Vec::new();
        for (i, s) in raw.steps.iter().enumerate() {
            let key = format!("step[{i}]");
            self.while_deleted(&key, s);
            if let Some(step) = self.standalone(&key, s, raw, topology) {
                steps.extend(step);
                continue;
            }
            let action = match (&s.publish, &s.consume, &s.inspect) {
                (Some(p), None, None) => {
                    // Ids are positional: a message whose fixture is broken
                    // still has one, so a fault naming it is not a second error.
                    let n: usize = p.messages.iter().map(|m| m.get_ref().count()).sum();
                    published.extend((0..n).map(|j| format!("mid-{}", next_id + j)));
                    let p = self.publish(&key, p, raw, &mut next_id);
                    if let (Some(_), Some(f)) = (p.batch, &s.fault) {
                        self.err(format!("{key}.fault"), span(f), ErrorKind::BatchWithFault);
                    }
                    for m in &p.messages {
                        // As the consumer reads it (the message id if there is none).
                        let event = serde_json::from_str::<serde_json::Value>(&m.body)
                            .ok()
                            .and_then(|v| v.get("eventId")?.as_str().map(str::to_string))
                            .unwrap_or_else(|| m.meta.message_id.clone());
                        self.events.push((m.meta.message_id.clone(), event));
                    }
                    Action::Publish(p)
                }
                (None, Some(c), None) => {
                    Action::Consume(self.consume(&key, c, topology, missing_ok, &published))
                }
                (None, None, Some(fields)) => Action::Inspect(fields.clone()),
                (None, None, None) if s.fault.is_some() => {
                    let f = s.fault.as_ref().expect("checked");
                    if let Some(a) = self.broker_step(&key, f) {
                        let asserts = self.asserts(&format!("{key}.assert"), &s.assert, raw);
                        steps.push(Step {
                            action: a,
                            fault: None,
                            asserts,
                        });
                    }
                    continue;
                }
                _ => {
                    self.err(key, None, ErrorKind::StepActions);
                    continue;
                }
            };
            let fault = if matches!(action, Action::Inspect(_)) && s.fault.is_some() {
                self.err(
                    format!("{key}.fault"),
                    s.fault.as_ref().map(span).unwrap_or_default(),
                    ErrorKind::NoFaultOnInspect,
                );
                None
            } else {
                self.fault(&key, s, &action, &published, raw)
            };
            if let Action::Consume(c) = &action {
                let rendezvous = fault.as_ref().is_some_and(|f| {
                    matches!(f.action, FaultAction::Rendezvous | FaultAction::Stall)
                });
                if c.instances > 1 && !rendezvous {
                    self.err(
                        format!("{key}.consume.instances"),
                        s.consume
                            .as_ref()
                            .and_then(|c| c.instances.as_ref())
                            .and_then(span),
                        ErrorKind::InstancesNeedRendezvous(c.instances),
                    );
                }
            }
            let asserts = self.asserts(&format!("{key}.assert"), &s.assert, raw);
            steps.push(Step {
                action,
                fault,
                asserts,
            });
        }
        // A heal ends a partition of the same node made before it.
        let mut cut = BTreeSet::new();
        for (i, s) in raw.steps.iter().enumerate() {
            let Some(f) = s.fault.as_ref().map(|f| f.get_ref()) else {
                continue;
            };
            if *f.target.get_ref() != Target::Node {
                continue;
            }
            let Some(n) = f.node.as_ref().map(|n| *n.get_ref()) else {
                continue;
            };
            match f.action.get_ref() {
                FaultAction::Partition => {
                    cut.insert(n);
                }
                FaultAction::Heal if !cut.remove(&n) => self.err(
                    format!("step[{i}].fault.node"),
                    f.node.as_ref().and_then(span),
                    ErrorKind::HealWithoutCut(n),
                ),
                _ => {}
            }
        }
        for (queue, by) in std::mem::take(&mut self.deleted) {
            self.err(by, None, ErrorKind::DeletedForGood(queue));
        }
        steps
    }

    /// A publish step, checked key by key in the file's order (its
    /// messages, exchange, park and order keys), so that errors come out in
    /// that order.
    fn publish(&mut self, key: &str, p: &RawPublish, raw: &RawLab, next_id: &mut usize) -> Publish {
        let messages = self.messages(key, p, next_id);
        let exchange = p
            .exchange
            .as_ref()
            .map(|x| x.get_ref().clone())
            .unwrap_or_default();
        if let Some(x) = &p.exchange {
            if !x.get_ref().is_empty() && !raw.exchanges.iter().any(|d| &d.name == x.get_ref()) {
                self.err(
                    format!("{key}.publish.exchange"),
                    span(x),
                    ErrorKind::UnknownExchange(x.get_ref().clone()),
                );
            }
        }
        let park = p.park.as_ref().map(|q| q.get_ref().clone());
        self.park(key, p, raw);
        self.handoff_keys(key, p);
        Publish {
            exchange,
            messages,
            deadline_secs: p.deadline_secs.get(),
            confirm: p.confirm,
            mandatory: p.mandatory,
            persistent: p.persistent,
            timestamp: p.timestamp,
            park,
            confirm_timeout_ms: p.confirm_timeout_ms.map(|n| n.get()),
            resend: p.resend,
            batch: self.batch(key, p),
            flush: p.flush,
            node: self.node(format!("{key}.publish.node"), &p.node),
            orders: p.orders.as_ref().map(|o| *o.get_ref()),
            reconcile: p.reconcile,
            relay: p.relay,
        }
    }

    /// The step's messages from their fixtures, numbered from `next_id`.
    fn messages(&mut self, key: &str, p: &RawPublish, next_id: &mut usize) -> Vec<Message> {
        let mut messages = Vec::new();
        for (j, m) in p.messages.iter().enumerate() {
            let mkey = format!("{key}.publish.messages[{j}]");
            let (fixture, rk, count, expiration_ms) = match m.get_ref() {
                RawMessage::Fixture(f) => (f.clone(), p.routing_key.clone(), None, None),
                RawMessage::Full(RawFullMessage {
                    fixture,
                    routing_key,
                    count,
                    expiration_ms,
                }) => (
                    fixture.clone(),
                    routing_key.clone().or_else(|| p.routing_key.clone()),
                    *count,
                    expiration_ms.map(|n| n.get()),
                ),
            };
            let first = *next_id;
            *next_id += m.get_ref().count();
            let Some(routing_key) = rk else {
                self.err(mkey, span(m), ErrorKind::NoRoutingKey);
                continue;
            };
            for n in first..*next_id {
                let copy = count.map(|_| n - first + 1);
                let loaded = load_fixture(self.fixtures, &fixture, n, copy).and_then(|(m, b)| {
                    delayed_task_scheduled(&fixture, &b, expiration_ms).map(|()| (m, b))
                });
                match loaded {
                    Ok((meta, body)) => messages.push(Message {
                        meta,
                        routing_key: routing_key.clone(),
                        fixture: fixture.clone(),
                        body,
                        expiration_ms,
                    }),
                    Err(kind) => {
                        self.err(mkey, span(m), kind);
                        break;
                    }
                }
            }
        }
        messages
    }

    /// The queue a returned or refused publish is parked in: declared, and
    /// reached only with a confirm (and `mandatory`, or a queue that refuses).
    fn park(&mut self, key: &str, p: &RawPublish, raw: &RawLab) {
        if let Some(q) = &p.park {
            if !raw.queues.iter().any(|d| d.name.get_ref() == q.get_ref()) {
                self.err(
                    format!("{key}.publish.park"),
                    span(q),
                    ErrorKind::UnknownQueue(q.get_ref().clone()),
                );
            }
            // A return (`mandatory`) or a nack (a full queue that rejects
            // publishes) is parked; the producer sees either in the confirm.
            if !p.confirm {
                self.err(
                    format!("{key}.publish.park"),
                    span(q),
                    ErrorKind::ParkWithoutConfirm,
                );
            } else if !parks_anything(p, &raw.queues) {
                self.err(
                    format!("{key}.publish.park"),
                    span(q),
                    ErrorKind::ParkWithoutMandatory,
                );
            }
        }
    }

    /// The order-and-event keys (`orders`, `reconcile`, `relay`) that only
    /// go together.
    fn handoff_keys(&mut self, key: &str, p: &RawPublish) {
        if p.reconcile
            && (p.orders.as_ref().map(|o| *o.get_ref()) != Some(Handoff::Direct) || !p.resend)
        {
            self.err(
                format!("{key}.publish.reconcile"),
                None,
                ErrorKind::ReconcileWithoutOrders,
            );
        }
        if let Some(o) = p.orders.as_ref().filter(|o| o.get_ref().is_outbox()) {
            if p.park.is_some() {
                self.err(
                    format!("{key}.publish.orders"),
                    span(o),
                    ErrorKind::OutboxPark(*o.get_ref()),
                );
            }
        }
        if p.relay && (p.reconcile || !p.orders.as_ref().is_some_and(|o| o.get_ref().is_outbox())) {
            self.err(
                format!("{key}.publish.relay"),
                None,
                ErrorKind::RelayWithoutOutbox,
            );
        }
    }

    /// A consume step, checked key by key in the file's order (its queue,
    /// retry, program and pattern keys, the messages it names), so that
    /// errors come out in that order.
    fn consume(
        &mut self,
        key: &str,
        c: &RawConsume,
        topology: &Topology,
        missing_ok: &[String],
        published: &[String],
    ) -> Consume {
        let tiers = self.consume_queues(key, c, topology, missing_ok);
        let pattern = c.pattern.as_ref().map_or(Pattern::Inbox, |p| *p.get_ref());
        self.program_keys(key, c);
        self.pattern_needs(key, c, pattern);
        self.consume_messages(key, c, published);
        Consume {
            queue: c.queue.get_ref().clone(),
            service: c.service.clone(),
            pattern,
            command: c.command.as_ref().map(|s| s.get_ref().clone()),
            commits_first: c.commits_first.as_ref().is_some_and(|b| *b.get_ref()),
            prefetch: c.prefetch.get(),
            settle: match c.settle {
                RawSettle::Count(n) => Settle::Count(n.get()),
                RawSettle::Drain => Settle::Drain,
            },
            max_deliveries: c.max_deliveries.map(|n| n.get()),
            retry: c.retry.as_ref().map(|r| Retry {
                max_attempts: r.max_attempts.get(),
                max_duration_ms: r.max_duration_ms.as_ref().map(|m| m.get_ref().get()),
                dlq: r.dlq.get_ref().clone(),
                tiers,
            }),
            deadline_secs: c.deadline_secs.get(),
            transient_failures: c
                .transient_failures
                .iter()
                .map(|(m, n)| (m.clone(), n.get()))
                .collect(),
            node: self.node(format!("{key}.consume.node"), &c.node),
            instances: c.instances.as_ref().map_or(1, |n| n.get_ref().get()),
            downstream: c.downstream.as_ref().map(|d| Downstream {
                timeout_ms: d.get_ref().timeout_ms.get(),
                lose_response: d.get_ref().lose_response.clone(),
            }),
        }
    }

    /// The step's queue and its retry's DLQ and tiers, declared (a tier: a
    /// queue whose TTL dead-letters back to the work queue); the tiers.
    fn consume_queues(
        &mut self,
        key: &str,
        c: &RawConsume,
        topology: &Topology,
        missing_ok: &[String],
    ) -> Vec<(String, u64)> {
        let declared = |q: &str| topology.queues.iter().any(|d| d.name == q);
        if !declared(c.queue.get_ref()) {
            self.err(
                format!("{key}.consume.queue"),
                span(&c.queue),
                ErrorKind::UnknownQueue(c.queue.get_ref().clone()),
            );
        }
        let mut tiers = Vec::new();
        if let Some(r) = &c.retry {
            let dlq = r.dlq.get_ref();
            if !declared(dlq) && !missing_ok.contains(dlq) {
                self.err(
                    format!("{key}.consume.retry.dlq"),
                    span(&r.dlq),
                    ErrorKind::UnknownQueue(dlq.clone()),
                );
            }
            for (j, t) in r.tiers.iter().enumerate() {
                let tkey = format!("{key}.consume.retry.tiers[{j}]");
                let Some(q) = topology.queues.iter().find(|q| &q.name == t.get_ref()) else {
                    match missing_ok.contains(t.get_ref()) {
                        // A variant's missing tier: it holds nothing, for no time.
                        true => tiers.push((t.get_ref().clone(), 0)),
                        false => {
                            self.err(tkey, span(t), ErrorKind::UnknownQueue(t.get_ref().clone()))
                        }
                    }
                    continue;
                };
                let back = q.arguments.get("x-dead-letter-routing-key")
                    == Some(&ArgValue::Str(c.queue.get_ref().clone()));
                match q.arguments.get("x-message-ttl") {
                    Some(ArgValue::Int(ttl)) if back => tiers.push((q.name.clone(), *ttl as u64)),
                    _ => self.err(
                        tkey,
                        span(t),
                        ErrorKind::NotATier {
                            queue: q.name.clone(),
                            work: c.queue.get_ref().clone(),
                        },
                    ),
                }
            }
        }
        tiers
    }

    /// A program (`command`) takes no built-in consumer's keys and needs
    /// the effects query; `commits_first` is a single program's.
    fn program_keys(&mut self, key: &str, c: &RawConsume) {
        if let Some(d) = &c.commits_first {
            let instances = c.instances.as_ref().map_or(1, |n| n.get_ref().get());
            if c.command.is_none() || instances > 1 {
                self.err(
                    format!("{key}.consume.commits_first"),
                    span(d),
                    ErrorKind::CommitsFirstOfOne,
                );
            }
        }
        if let Some(cmd) = &c.command {
            let builtin_only = c.pattern.is_some()
                || c.retry.is_some()
                || !c.transient_failures.is_empty()
                || c.max_deliveries.is_some()
                || c.downstream.is_some();
            if builtin_only {
                self.err(
                    format!("{key}.consume.command"),
                    span(cmd),
                    ErrorKind::ProgramHasNoPattern,
                );
            }
            if !self.has_effects {
                self.err(
                    format!("{key}.consume.command"),
                    span(cmd),
                    ErrorKind::NoEffectsQuery,
                );
            }
        }
    }

    /// What the built-in consumer's pattern needs: retry tiers, a retry,
    /// one instance, a downstream (and none where it calls none).
    fn pattern_needs(&mut self, key: &str, c: &RawConsume, pattern: Pattern) {
        let classified =
            c.command.is_none() && matches!(pattern.def().on_failure, OnFailure::Classified { .. });
        if classified && c.retry.as_ref().is_none_or(|r| r.tiers.is_empty()) {
            self.err(
                format!("{key}.consume.retry"),
                span(&c.queue),
                ErrorKind::NoTiers(pattern),
            );
        }
        if let Some(m) = (c.retry.as_ref())
            .and_then(|r| r.max_duration_ms.as_ref())
            .filter(|_| !classified)
        {
            self.err(
                format!("{key}.consume.retry.max_duration_ms"),
                span(m),
                ErrorKind::BudgetNeedsClassified(pattern),
            );
        }
        let in_place = c.command.is_none()
            && matches!(pattern.def().on_failure, OnFailure::RetryInPlace { .. });
        if in_place && c.retry.is_none() {
            self.err(
                format!("{key}.consume.retry"),
                span(&c.queue),
                ErrorKind::NoRetry(pattern),
            );
        }
        if let Some(n) = c
            .instances
            .as_ref()
            .filter(|n| in_place && n.get_ref().get() > 1)
        {
            self.err(
                format!("{key}.consume.instances"),
                span(n),
                ErrorKind::BlockNeedsOneConsumer(pattern),
            );
        }
        let calls = pattern.def().calls_downstream();
        match &c.downstream {
            None if calls && c.command.is_none() => self.err(
                format!("{key}.consume.downstream"),
                span(&c.queue),
                ErrorKind::NoDownstream(pattern),
            ),
            Some(d) if !calls && c.command.is_none() => self.err(
                format!("{key}.consume.downstream"),
                span(d),
                ErrorKind::DownstreamNeverCalled(pattern, Pattern::calling_downstream()),
            ),
            _ => {}
        }
    }

    /// The messages the step names (a lost response, a transient failure):
    /// published before it.
    fn consume_messages(&mut self, key: &str, c: &RawConsume, published: &[String]) {
        let lose = c.downstream.iter().flat_map(|d| &d.get_ref().lose_response);
        for m in lose {
            if !published.contains(m) {
                self.err(
                    format!("{key}.consume.downstream.lose_response"),
                    span(c.downstream.as_ref().expect("iterated")),
                    ErrorKind::UnpublishedMessage {
                        message: m.clone(),
                        published: published.join(", "),
                    },
                );
            }
        }
        for m in c.transient_failures.keys() {
            if !published.contains(m) {
                self.err(
                    format!("{key}.consume.transient_failures.{m}"),
                    span(&c.queue),
                    ErrorKind::UnpublishedMessage {
                        message: m.clone(),
                        published: published.join(", "),
                    },
                );
            }
        }
    }
}

/// A fixture that is a delayed task (`dueInMs`, `maxLatenessMs`) is
/// published with its delay as its TTL: the consumer measures how late it
/// is from the time stamped on it, which only a message with
/// `expiration_ms` carries; without both fields it would have no rule.
fn delayed_task_scheduled(
    fixture: &str,
    body: &str,
    expiration_ms: Option<u64>,
) -> Result<(), ErrorKind> {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let field = |k: &str| v.get(k).map(|x| (x.as_u64(), x.to_string()));
    let (due, max) = (field("dueInMs"), field("maxLatenessMs"));
    let why = match (&due, &max, expiration_ms) {
        (None, None, _) => return Ok(()),
        (Some((Some(d), _)), Some((Some(_), _)), Some(e)) if *d == e => return Ok(()),
        (Some((Some(d), _)), Some((Some(_), _)), e) => format!(
            "`dueInMs` {d}, published with {}",
            e.map_or("no `expiration_ms`".to_string(), |e| format!(
                "`expiration_ms = {e}`"
            ))
        ),
        (Some((None, raw)), _, _) => format!("`dueInMs` is {raw}, not a count of ms"),
        (_, Some((None, raw)), _) => format!("`maxLatenessMs` is {raw}, not a count of ms"),
        (None, _, _) => "`maxLatenessMs` without `dueInMs`".to_string(),
        (_, None, _) => "`dueInMs` without `maxLatenessMs`".to_string(),
    };
    Err(ErrorKind::DelayedTaskUnscheduled {
        fixture: fixture.to_string(),
        why,
    })
}

#[cfg(test)]
mod delayed_task_tests {
    use super::delayed_task_scheduled as check;

    #[test]
    fn a_delayed_task_needs_both_fields_and_its_ttl() {
        let why = |body: &str, ttl: Option<u64>| match check("f", body, ttl) {
            Ok(()) => "ok".to_string(),
            Err(super::ErrorKind::DelayedTaskUnscheduled { why, .. }) => why,
            Err(other) => format!("{other}"),
        };
        let both = r#"{"dueInMs": 200, "maxLatenessMs": 500}"#;
        assert_eq!(why(both, Some(200)), "ok");
        assert_eq!(why(r#"{"eventId": "e"}"#, None), "ok");
        assert_eq!(
            why(both, Some(300)),
            "`dueInMs` 200, published with `expiration_ms = 300`"
        );
        assert_eq!(
            why(both, None),
            "`dueInMs` 200, published with no `expiration_ms`"
        );
        assert_eq!(
            why(r#"{"dueInMs": 200}"#, Some(200)),
            "`dueInMs` without `maxLatenessMs`"
        );
        assert_eq!(
            why(r#"{"maxLatenessMs": 5}"#, Some(200)),
            "`maxLatenessMs` without `dueInMs`"
        );
        assert_eq!(
            why(r#"{"dueInMs": 200.5, "maxLatenessMs": 5}"#, Some(200)),
            "`dueInMs` is 200.5, not a count of ms"
        );
        assert_eq!(
            why(r#"{"dueInMs": 200, "maxLatenessMs": -5}"#, Some(200)),
            "`maxLatenessMs` is -5, not a count of ms"
        );
    }
}
