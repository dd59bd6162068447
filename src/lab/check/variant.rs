//! A variant applied to the raw lab: what it changes in the consume and
//! publish steps and the queues, before the lab is checked again; and the
//! checks of a variant's own keys and declared violations.

use super::*;

/// Applies a variant's overrides to every step and queue.
pub(super) fn apply_variant(mut raw: RawLab, v: &RawVariant) -> RawLab {
    for step in &mut raw.steps {
        if let Some(c) = &mut step.consume {
            vary_consume(c, v);
        }
        if let Some(p) = &mut step.publish {
            vary_publish(p, v);
        }
        if let (Some(p), Some(r)) = (&mut step.purge_inbox, v.retention_ms) {
            p.retention_ms = r;
        }
        if let Some(f) = &mut step.fault {
            let (span, mut inner) = (f.span(), f.get_ref().clone());
            if let Some(w) = &v.window {
                inner.window = Some(w.clone());
            }
            if let Some(k) = &v.commit {
                inner.commit = Some(k.clone());
            }
            if v.kill_at_depth.is_some() {
                inner.kill_at_depth = v.kill_at_depth;
            }
            if v.restart_settle.is_some() {
                inner.restart_settle = v.restart_settle;
            }
            *f = Spanned::new(span, inner);
        }
    }
    if let Some(d) = v.database {
        raw.database = d;
    }
    if v.policy == Some(false) {
        raw.steps.retain(|s| s.policy.is_none());
    }
    if v.reconcile == Some(false) {
        raw.steps
            .retain(|s| !s.publish.as_ref().is_some_and(|p| p.reconcile));
    }
    if v.relay == Some(false) {
        raw.steps
            .retain(|s| !s.publish.as_ref().is_some_and(|p| p.relay));
    }
    vary_queues(&mut raw.queues, v);
    // A variant that takes away what a parking queue is for (confirms,
    // `mandatory`, the queue's reject-publish) takes the parking with it.
    let queues = raw.queues.clone();
    for p in raw.steps.iter_mut().filter_map(|s| s.publish.as_mut()) {
        if !p.confirm || !parks_anything(p, &queues) {
            p.park = None;
        }
    }
    raw.claim = v.claim.clone();
    raw
}

/// Whether a publish can be returned (`mandatory`) or nacked (a queue of
/// the lab rejects publishes when full): what a parking queue takes.
pub(super) fn parks_anything(p: &RawPublish, queues: &[RawQueue]) -> bool {
    p.mandatory
        || queues.iter().any(|q| {
            q.arguments.get("x-overflow").is_some_and(
                |v| matches!(v.get_ref(), ArgValue::Str(s) if s.starts_with("reject-publish")),
            )
        })
}

fn vary_consume(c: &mut RawConsume, v: &RawVariant) {
    if let Some(p) = &v.pattern {
        c.pattern = Some(p.clone());
    }
    if let (Some(cmd), true) = (&v.command, c.command.is_some()) {
        c.command = Some(cmd.clone());
        // A declaration is of the program it was written for.
        c.commits_first = v.commits_first.clone();
    }
    if let Some(n) = v.settle {
        c.settle = RawSettle::Count(n);
    }
    if let Some(n) = v.prefetch {
        c.prefetch = n;
    }
    if v.max_deliveries.is_some() {
        c.max_deliveries = v.max_deliveries;
    }
    if let (Some(r), Some(dlq)) = (&mut c.retry, &v.dlq) {
        r.dlq = dlq.clone();
    }
    if let (Some(r), Some(tiers)) = (&mut c.retry, &v.tiers) {
        r.tiers = tiers.clone();
    }
}

fn vary_publish(p: &mut RawPublish, v: &RawVariant) {
    if let Some(x) = v.persistent {
        p.persistent = x;
    }
    if let Some(x) = v.confirm {
        p.confirm = x;
    }
    if let Some(x) = v.mandatory {
        p.mandatory = x;
    }
    if let Some(x) = v.resend {
        p.resend = x;
    }
    if let Some(x) = v.timestamp {
        p.timestamp = x;
    }
    // Only a batching step has a batch to send at close.
    if let (Some(x), true) = (v.flush, p.batch.is_some()) {
        p.flush = x;
    }
    if let (Some(x), true) = (&v.orders, p.orders.is_some() && !p.reconcile) {
        p.orders = Some(x.clone());
    }
    if v.park == Some(false) {
        p.park = None;
    }
}

/// Durability, arguments, bindings, and the classic variant of a quorum queue.
fn vary_queues(queues: &mut [RawQueue], v: &RawVariant) {
    if let Some(d) = v.durable {
        for q in queues.iter_mut() {
            q.durable = d;
        }
    }
    for q in queues.iter_mut() {
        if let Some(args) = v.arguments.get(q.name.get_ref()) {
            q.arguments.extend(args.clone());
        }
        if let Some(bind) = v.bind.get(q.name.get_ref()) {
            q.bind = bind.clone();
        }
        for a in v.unset.get(q.name.get_ref()).into_iter().flatten() {
            q.arguments.remove(a);
        }
    }
    if v.classic == Some(true) {
        for q in queues.iter_mut() {
            let quorum = q
                .arguments
                .get("x-queue-type")
                .is_some_and(|t| t.get_ref() == &ArgValue::Str("quorum".into()));
            if quorum {
                for k in [
                    "x-queue-type",
                    "x-dead-letter-strategy",
                    "x-delivery-limit",
                    "x-quorum-initial-group-size",
                ] {
                    q.arguments.remove(k);
                }
            }
        }
    }
}

impl Checker<'_> {
    /// A variant's keys that name the lab as written: its queues, the
    /// arguments it unsets, the reconciliation it drops.
    pub(super) fn variant_keys(
        &mut self,
        name: &str,
        def: &RawVariant,
        raw: &RawLab,
        written: &[RawQueue],
        (written_reconciles, written_relays): (bool, bool),
    ) {
        let batches = raw
            .steps
            .iter()
            .any(|s| s.publish.as_ref().is_some_and(|p| p.batch.is_some()));
        if def.flush.is_some() && !batches {
            self.err(
                format!("variant.{name}.flush"),
                None,
                ErrorKind::NoBatchToFlush,
            );
        }
        if def.reconcile == Some(false) && !written_reconciles {
            self.err(
                format!("variant.{name}.reconcile"),
                None,
                ErrorKind::NoReconcileToDrop,
            );
        }
        // The variant's handoff, not the relay steps it reaches, is what to
        // change: said once, at the variant's key.
        if let Some(o) = def.orders.as_ref().filter(|o| !o.get_ref().is_outbox()) {
            if written_relays && def.relay != Some(false) {
                self.errs
                    .retain(|e| e.kind != ErrorKind::RelayWithoutOutbox);
                self.err(
                    format!("variant.{name}.orders"),
                    span(o),
                    ErrorKind::VariantOrdersWithRelay(*o.get_ref()),
                );
            }
        }
        let program = raw
            .steps
            .iter()
            .any(|s| s.consume.as_ref().is_some_and(|c| c.command.is_some()));
        let held = raw.steps.iter().any(|s| {
            s.fault.as_ref().is_some_and(|f| {
                matches!(
                    f.get_ref().action.get_ref(),
                    FaultAction::Rendezvous | FaultAction::Stall
                )
            })
        });
        if held && def.prefetch.is_some_and(|p| p.get() != 1) {
            // Said at the variant's key, not at the step it reaches.
            self.errs
                .retain(|e| e.kind != ErrorKind::RendezvousPrefetch);
            self.err(
                format!("variant.{name}.prefetch"),
                None,
                ErrorKind::HeldPrefetch,
            );
        }
        if program && def.prefetch.is_some_and(|p| p.get() != 1) {
            self.err(
                format!("variant.{name}.prefetch"),
                None,
                ErrorKind::ProgramPrefetch,
            );
        }
        if def.relay == Some(false) && !written_relays {
            self.err(
                format!("variant.{name}.relay"),
                None,
                ErrorKind::NoRelayToDrop,
            );
        }
        self.variant_queues(name, def, raw, written);
    }

    /// The queues a variant's `arguments`, `bind` and `unset` name: each
    /// a queue of the lab, and each unset argument one the queue sets.
    fn variant_queues(&mut self, name: &str, def: &RawVariant, raw: &RawLab, written: &[RawQueue]) {
        let named = def
            .arguments
            .keys()
            .map(|q| ("arguments", q))
            .chain(def.bind.keys().map(|q| ("bind", q)))
            .chain(def.unset.keys().map(|q| ("unset", q)));
        for (key, q) in named {
            if !raw.queues.iter().any(|r| r.name.get_ref() == q) {
                self.err(
                    format!("variant.{name}.{key}.{q}"),
                    None,
                    ErrorKind::UnknownQueue(q.clone()),
                );
            }
        }
        // In the lab as written: an argument it does not set cannot
        // be shown necessary by removing it.
        for (q, args) in &def.unset {
            let Some(declared) = written.iter().find(|r| r.name.get_ref() == q) else {
                continue;
            };
            for a in args.iter().filter(|a| !declared.arguments.contains_key(*a)) {
                self.err(
                    format!("variant.{name}.unset.{q}"),
                    None,
                    ErrorKind::NotAnArgument {
                        queue: q.clone(),
                        argument: a.clone(),
                    },
                );
            }
        }
    }

    /// A variant's violations, and what it shows instead on another
    /// generation.
    pub(super) fn variant(
        &mut self,
        name: &str,
        v: &RawVariant,
        steps: &[Step],
    ) -> (
        BTreeMap<String, Expect>,
        BTreeMap<Generation, GenerationDiff>,
    ) {
        let key = format!("variant.{name}");
        let violations = self.violations(&key, &v.violations, steps);
        let generations = self.generation_diffs(&key, v, steps);
        if let Some(o) = &v.orders {
            let serves = steps
                .iter()
                .any(|s| matches!(&s.action, Action::Publish(p) if p.orders.is_some()));
            if !serves {
                self.err(
                    format!("{key}.orders"),
                    span(o),
                    ErrorKind::OrdersWithoutOrderService,
                );
            } else if *o.get_ref() == Handoff::Outbox {
                self.err(
                    format!("{key}.orders"),
                    span(o),
                    ErrorKind::SafeHandoffInVariant,
                );
            }
        }
        if let Some(p) = &v.pattern {
            if p.get_ref().def().safe {
                self.err(
                    format!("{key}.pattern"),
                    span(p),
                    ErrorKind::SafePatternInVariant(*p.get_ref()),
                );
            }
        }
        (violations, generations)
    }

    /// A variant's `[variant.<name>.<broker>.<generation>]` tables: what
    /// it shows instead on another generation, each with its cause and source.
    fn generation_diffs(
        &mut self,
        key: &str,
        v: &RawVariant,
        steps: &[Step],
    ) -> BTreeMap<Generation, GenerationDiff> {
        let mut generations = BTreeMap::new();
        for (g, diff, broker) in v
            .generation_tables()
            .into_iter()
            .flat_map(|(b, t)| t.iter().map(move |(g, d)| (g, d, b)))
        {
            let at = format!("{key}.{broker}.{g}");
            let generation = match g.parse::<Generation>() {
                Ok(other) if other.broker() != broker => {
                    self.err(at.clone(), None, ErrorKind::UnknownGeneration(g.clone()));
                    continue;
                }
                Ok(base) if base.is_base() => {
                    self.err(at.clone(), None, ErrorKind::BaseGeneration(base));
                    continue;
                }
                Ok(generation) => generation,
                Err(_) => {
                    self.err(at.clone(), None, ErrorKind::UnknownGeneration(g.clone()));
                    continue;
                }
            };
            if diff.cause.trim().is_empty() {
                self.err(format!("{at}.cause"), None, ErrorKind::NoCause);
            }
            let source = diff.source.get_ref().trim();
            if !(source.starts_with("https://") || source == "cause not identified") {
                self.err(
                    format!("{at}.source"),
                    span(&diff.source),
                    ErrorKind::NoSource,
                );
            }
            let violations = self.violations(&at, &diff.violations, steps);
            generations.insert(
                generation,
                GenerationDiff {
                    claim: diff.claim.clone(),
                    cause: diff.cause.clone(),
                    source: source.to_string(),
                    violations,
                },
            );
        }
        generations
    }

    /// `violations` under `key`: at least one, each an assertion or a check.
    pub(super) fn violations(
        &mut self,
        key: &str,
        declared: &BTreeMap<String, Spanned<Expected>>,
        steps: &[Step],
    ) -> BTreeMap<String, Expect> {
        if declared.is_empty() {
            self.err(format!("{key}.violations"), None, ErrorKind::NoViolations);
        }
        let asserted = asserted(steps);
        let shapes = shapes(steps);
        let mut violations = BTreeMap::new();
        for (k, val) in declared {
            let is_check = k.parse::<Check>().is_ok();
            // A check is a count, always read; an assertion may print the
            // word of a value not read.
            let shape = match is_check {
                true => Some((Shape::Count(&[]), false)),
                false => shapes.get(k.as_str()).map(|s| (*s, true)),
            };
            if let Some(kind) = shape.and_then(|(s, unread)| misfit(k, s, val.get_ref(), unread)) {
                self.err(format!("{key}.violations.{k}"), span(val), kind);
            }
            if !asserted.contains(k.as_str()) && !is_check {
                self.err(
                    format!("{key}.violations.{k}"),
                    span(val),
                    ErrorKind::NotAnAssertion(k.clone()),
                );
            }
            violations.insert(k.clone(), val.get_ref().expect());
        }
        violations
    }
}
