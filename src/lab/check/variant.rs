//! A variant applied to the raw lab: what it changes in the consume and
//! publish steps and the queues, before the lab is checked again.

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
