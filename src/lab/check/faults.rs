//! The fault sections: a fault on a publish or consume step (which
//! targets and actions fit which step, which windows, which message), a
//! rendezvous, and the node and broker steps of their own.

use super::*;
use crate::vocab::Placement;

impl Checker<'_> {
    /// A fault on a publish or consume step: which targets and actions fit
    /// which step, which windows each passes, which message it names. One
    /// section of the file checked key by key, in the file's order, so that
    /// errors come out in that order: each part a method of its own.
    pub(super) fn fault(
        &mut self,
        key: &str,
        s: &RawStep,
        action: &Action,
        published: &[String],
        raw: &RawLab,
    ) -> Option<Fault> {
        let spanned = s.fault.as_ref()?;
        let fkey = format!("{key}.fault");
        let f = spanned.get_ref();
        let (target, act) = (*f.target.get_ref(), *f.action.get_ref());
        let placement = self.placed(&fkey, f, action)?;
        let (window, message) =
            self.window_and_message(&fkey, spanned, action, placement, published)?;
        let then = self.then_of(&fkey, f, placement);
        self.family_keys(&fkey, spanned, action, placement);
        let node = self.fault_node(&fkey, spanned, action, placement);
        let program = matches!(action, Action::Consume(c) if c.command.is_some());
        let commit = match &f.commit {
            None => 1,
            Some(k) if *k.get_ref() >= 1 && program && window == Window::BeforeCommit => {
                *k.get_ref()
            }
            Some(k) => {
                self.err(format!("{fkey}.commit"), span(k), ErrorKind::CommitOrdinal);
                1
            }
        };
        let copies = self.copies(&fkey, spanned, action, window, message);
        let asserts = self.fault_asserts(&fkey, spanned, action, raw);
        Some(Fault {
            node,
            target,
            action: act,
            window,
            commit,
            message: message.get_ref().clone(),
            then,
            kill_at_depth: f.kill_at_depth,
            restart_settle: f.restart_settle,
            restart_drain: f.restart_drain == Some(true),
            copies,
            asserts,
        })
    }

    /// The placement a step's fault takes: the registry's for its target,
    /// action and step, and one the step's consumer admits.
    fn placed(&mut self, fkey: &str, f: &RawFault, action: &Action) -> Option<&'static Placement> {
        let (target, act) = (*f.target.get_ref(), *f.action.get_ref());
        // The step a target's action belongs on, and the windows it can use
        // there: the placement registry's, nowhere else.
        let site = match action {
            Action::Publish(_) => Some(Site::Publish),
            Action::Consume(_) => Some(Site::Consume),
            _ => None,
        };
        let placement = site.and_then(|site| placement_of(target, act, site));
        if let (Some(p), Action::Consume(c)) = (placement, action) {
            if !c.admits(p) {
                self.err(
                    format!("{fkey}.action"),
                    span(&f.action),
                    ErrorKind::BuiltInConsumerOnly {
                        target,
                        action: act,
                    },
                );
                return None;
            }
        }
        let Some(placement) = placement else {
            self.err(
                format!("{fkey}.action"),
                span(&f.action),
                ErrorKind::FaultPlacement {
                    target,
                    action: act,
                },
            );
            return None;
        };
        Some(placement)
    }

    /// The window (one the step passes) and the message (one of the step's
    /// own, or published before it); None when either is missing.
    fn window_and_message<'f>(
        &mut self,
        fkey: &str,
        spanned: &'f Spanned<RawFault>,
        action: &Action,
        placement: &Placement,
        published: &[String],
    ) -> Option<(Window, &'f Spanned<String>)> {
        let f = spanned.get_ref();
        let (target, act) = (*f.target.get_ref(), *f.action.get_ref());
        let windows: Vec<Window> = match action {
            Action::Consume(c) => c.windows_of(placement),
            Action::Publish(p) => p.windows_of(placement),
            // A publish-step placement always lists its windows.
            _ => Vec::new(),
        };
        let (Some(window), Some(message)) = (&f.window, &f.message) else {
            self.err(
                fkey.to_string(),
                span(spanned),
                ErrorKind::FaultNeedsWindowAndMessage(target),
            );
            return None;
        };
        let window_value = *window.get_ref();
        if let (Action::Publish(p), Target::Network, FaultAction::Cut) = (action, target, act) {
            if p.orders.is_some() && !p.confirm {
                self.err(
                    format!("{fkey}.action"),
                    span(&f.action),
                    ErrorKind::CutWithoutConfirm,
                );
                return None;
            }
        }
        if !windows.contains(&window_value) {
            let passes = windows
                .iter()
                .map(|w| w.name())
                .collect::<Vec<_>>()
                .join(", ");
            let kind = match action {
                Action::Consume(c) if target == Target::Consumer && c.command.is_none() => {
                    ErrorKind::WindowNotReached {
                        pattern: c.pattern,
                        window: window_value,
                        passes,
                    }
                }
                _ => ErrorKind::WindowNotPassed {
                    target,
                    action: act,
                    window: window_value,
                    passes,
                },
            };
            self.err(format!("{fkey}.window"), span(window), kind);
        }
        self.message_known(fkey, action, message, published);
        Some((window_value, message))
    }

    /// A publish step's fault names one of its own messages; a consume
    /// step's, one published before it.
    fn message_known(
        &mut self,
        fkey: &str,
        action: &Action,
        message: &Spanned<String>,
        published: &[String],
    ) {
        let candidates: Vec<String> = match action {
            Action::Publish(p) => p
                .messages
                .iter()
                .map(|m| m.meta.message_id.clone())
                .collect(),
            _ => published.to_vec(),
        };
        if !candidates.contains(message.get_ref()) {
            let kind = match action {
                Action::Publish(_) => ErrorKind::MessageNotInStep {
                    message: message.get_ref().clone(),
                    published: candidates.join(", "),
                },
                _ => ErrorKind::UnpublishedMessage {
                    message: message.get_ref().clone(),
                    published: candidates.join(", "),
                },
            };
            self.err(format!("{fkey}.message"), span(message), kind);
        }
    }

    /// The `then` a placement follows with; another is an error.
    fn then_of(&mut self, fkey: &str, f: &RawFault, placement: &Placement) -> Then {
        let (target, act) = (*f.target.get_ref(), *f.action.get_ref());
        let follows = placement.then;
        match &f.then {
            Some(t) if *t.get_ref() != follows => {
                self.err(
                    format!("{fkey}.then"),
                    span(t),
                    ErrorKind::WrongThen {
                        target,
                        action: act,
                        then: *t.get_ref(),
                        follows,
                    },
                );
                follows
            }
            _ => follows,
        }
    }

    /// The keys one family reads and no other: a held confirm's timeout,
    /// a consumer kill's depth and restart.
    fn family_keys(
        &mut self,
        fkey: &str,
        spanned: &Spanned<RawFault>,
        action: &Action,
        placement: &Placement,
    ) {
        let f = spanned.get_ref();
        let (target, act) = (*f.target.get_ref(), *f.action.get_ref());
        // A held confirm needs a producer that gives up on it (the node
        // kill's own confirm rule is checked with its node, below).
        match action {
            Action::Publish(p) if placement.needs_confirm_timeout && !p.confirm_fits(placement) => {
                self.err(
                    fkey.to_string(),
                    span(spanned),
                    ErrorKind::HoldNeedsConfirmTimeout {
                        target,
                        action: act,
                    },
                );
            }
            _ => {}
        }
        if f.kill_at_depth.is_some() && target != Target::Consumer {
            self.err(
                format!("{fkey}.kill_at_depth"),
                span(spanned),
                ErrorKind::ConsumerOnly("kill_at_depth"),
            );
        }
        // A database fault kills the consumer too; a fresh one takes over.
        let restarts = matches!(target, Target::Consumer | Target::Database);
        if f.restart_settle.is_some() && !restarts {
            self.err(
                format!("{fkey}.restart_settle"),
                span(spanned),
                ErrorKind::ConsumerOnly("restart_settle"),
            );
        }
        if f.restart_drain.is_some() && !restarts {
            self.err(
                format!("{fkey}.restart_drain"),
                span(spanned),
                ErrorKind::ConsumerOnly("restart_drain"),
            );
        }
        if f.restart_drain == Some(true) && f.restart_settle.is_some() {
            self.err(
                format!("{fkey}.restart_drain"),
                span(spanned),
                ErrorKind::SettleOrDrain,
            );
        }
    }

    /// A node fault's node: named, in a cluster, the producer's own for a
    /// publish step's kill; no other target names one.
    fn fault_node(
        &mut self,
        fkey: &str,
        spanned: &Spanned<RawFault>,
        action: &Action,
        placement: &Placement,
    ) -> Option<usize> {
        let f = spanned.get_ref();
        let target = *f.target.get_ref();
        match (&f.node, target) {
            (None, Target::Node) => {
                self.err(fkey.to_string(), span(spanned), ErrorKind::NodeMissing);
                None
            }
            (Some(n), Target::Node) => {
                if self.nodes < 3 {
                    self.err(
                        format!("{fkey}.target"),
                        span(&f.target),
                        ErrorKind::NodeFaultOneNode,
                    );
                }
                let node = self.node(format!("{fkey}.node"), &f.node);
                // The kill must break the producer's own connection, and the
                // confirm the harness holds must exist and not time out.
                if let Action::Publish(p) = action {
                    if p.node != node {
                        self.err(
                            format!("{fkey}.node"),
                            span(n),
                            ErrorKind::NodeKillNotProducers {
                                node,
                                producer: p.node,
                            },
                        );
                    }
                    if !p.confirm_fits(placement) {
                        self.err(
                            fkey.to_string(),
                            span(spanned),
                            ErrorKind::NodeKillNeedsConfirm,
                        );
                    }
                }
                Some(node)
            }
            (Some(n), _) => {
                self.err(
                    format!("{fkey}.node"),
                    span(n),
                    ErrorKind::NodeNotForTarget(target),
                );
                None
            }
            (None, _) => None,
        }
    }

    /// The copies of the event a rendezvous or a stall holds.
    fn copies(
        &mut self,
        fkey: &str,
        spanned: &Spanned<RawFault>,
        action: &Action,
        window: Window,
        message: &Spanned<String>,
    ) -> Vec<String> {
        let act = *spanned.get_ref().action.get_ref();
        match action {
            Action::Consume(c) if act == FaultAction::Rendezvous => {
                self.rendezvous(fkey, spanned, c, message)
            }
            Action::Consume(c) if act == FaultAction::Stall => {
                if (c.instances, c.prefetch, c.settle) != (2, 1, Settle::Drain) {
                    self.err(fkey.to_string(), span(spanned), ErrorKind::StallInstances);
                }
                if !matches!(window, Window::AfterReceive | Window::BeforeCommit) {
                    self.err(
                        format!("{fkey}.window"),
                        span(spanned),
                        ErrorKind::StallWindow,
                    );
                }
                vec![message.get_ref().clone()]
            }
            _ => Vec::new(),
        }
    }

    /// The fault's own assertions; a counter read at the kill only on the
    /// built-in consumer's kill.
    fn fault_asserts(
        &mut self,
        fkey: &str,
        spanned: &Spanned<RawFault>,
        action: &Action,
        raw: &RawLab,
    ) -> Vec<Assertion> {
        let f = spanned.get_ref();
        let (target, act) = (*f.target.get_ref(), *f.action.get_ref());
        let asserts = self.asserts(&format!("{fkey}.assert"), &f.assert, raw);
        let at_kill = asserts
            .iter()
            .map(|a| a.counter.counter)
            .find(|c| c.at_kill());
        let built_in = matches!(action, Action::Consume(c) if c.command.is_none());
        // A database fault kills the consumer at its window too.
        let kills_consumer = matches!(
            (target, act),
            (Target::Consumer, FaultAction::Kill) | (Target::Database, _)
        );
        if let Some(c) = at_kill.filter(|_| !kills_consumer || !built_in) {
            self.err(
                format!("{fkey}.assert"),
                span(spanned),
                ErrorKind::AtKillPlace(c),
            );
        }
        if target == Target::Database && raw.database == crate::vocab::Durability::Fast {
            self.err(
                format!("{fkey}.target"),
                span(&f.target),
                ErrorKind::DatabaseFaultOnShared,
            );
        }
        asserts
    }

    /// A rendezvous's own rules: instances to hold, one message at a time
    /// each, and a copy of the event for every instance. The copies, in
    /// publish order from the named message on.
    fn rendezvous(
        &mut self,
        fkey: &str,
        spanned: &Spanned<RawFault>,
        c: &Consume,
        message: &Spanned<String>,
    ) -> Vec<String> {
        if c.instances < 2 {
            self.err(
                fkey.to_string(),
                span(spanned),
                ErrorKind::RendezvousNeedsInstances,
            );
            return Vec::new();
        }
        if c.prefetch != 1 {
            self.err(
                fkey.to_string(),
                span(spanned),
                ErrorKind::RendezvousPrefetch,
            );
        }
        let Some(event) = self
            .events
            .iter()
            .find(|(m, _)| m == message.get_ref())
            .map(|(_, e)| e.clone())
        else {
            // Not published: said once, by the message check.
            return Vec::new();
        };
        let copies: Vec<String> = self
            .events
            .iter()
            .skip_while(|(m, _)| m != message.get_ref())
            .filter(|(_, e)| *e == event)
            .map(|(m, _)| m.clone())
            .collect();
        if copies.len() < c.instances {
            self.err(
                format!("{fkey}.message"),
                span(message),
                ErrorKind::RendezvousCopies {
                    message: message.get_ref().clone(),
                    instances: c.instances,
                    copies: copies.len(),
                    found: copies.join(", "),
                },
            );
        }
        copies.into_iter().take(c.instances).collect()
    }

    /// A fault step of its own: a cluster node's, between two steps.
    fn node_step(&mut self, key: &str, spanned: &Spanned<RawFault>) -> Option<Action> {
        let f = spanned.get_ref();
        let fkey = format!("{key}.fault");
        let act = *f.action.get_ref();
        if placement_of(Target::Node, act, Site::Between).is_none() {
            let known = placements_of(Target::Node)
                .filter(|p| p.site == Site::Between)
                .map(|p| p.action.name())
                .collect::<Vec<_>>()
                .join(", ");
            self.err(
                format!("{fkey}.action"),
                span(&f.action),
                ErrorKind::NodeAction { action: act, known },
            );
        }
        if self.nodes < 3 {
            self.err(
                format!("{fkey}.target"),
                span(&f.target),
                ErrorKind::NodeFaultOneNode,
            );
        }
        let whole = span(spanned);
        let extra = [
            f.window.as_ref().map(|w| ("window", span(w))),
            f.commit.as_ref().map(|k| ("commit", span(k))),
            f.message.as_ref().map(|m| ("message", span(m))),
            f.then.as_ref().map(|t| ("then", span(t))),
            f.kill_at_depth.map(|_| ("kill_at_depth", whole.clone())),
            f.restart_settle.map(|_| ("restart_settle", whole.clone())),
            f.restart_drain.map(|_| ("restart_drain", whole.clone())),
            f.assert.first().map(|a| ("assert", span(a))),
        ];
        for (k, sp) in extra.into_iter().flatten() {
            self.err(format!("{fkey}.{k}"), sp, ErrorKind::NodeHasNoWindow);
        }
        let node = match &f.node {
            None => {
                self.err(fkey, span(spanned), ErrorKind::NodeMissing);
                return None;
            }
            Some(_) => self.node(format!("{fkey}.node"), &f.node),
        };
        Some(Action::Node { node, action: act })
    }

    /// A fault step of its own: only the broker (or a cluster node) acts
    /// between steps.
    pub(super) fn broker_step(&mut self, key: &str, spanned: &Spanned<RawFault>) -> Option<Action> {
        let f = spanned.get_ref();
        let fkey = format!("{key}.fault");
        let (target, act) = (*f.target.get_ref(), *f.action.get_ref());
        if target == Target::Node {
            return self.node_step(key, spanned);
        }
        if let Some(n) = &f.node {
            self.err(
                format!("{fkey}.node"),
                span(n),
                ErrorKind::NodeNotForTarget(target),
            );
        }
        let Some(placement) = placement_of(target, act, Site::Between) else {
            let kind = if placements_of(target).any(|p| p.site == Site::Between) {
                ErrorKind::FaultPlacement {
                    target,
                    action: act,
                }
            } else {
                ErrorKind::NotBetweenSteps(target)
            };
            self.err(format!("{fkey}.target"), span(&f.target), kind);
            return None;
        };
        if let Some(w) = &f.window {
            self.err(
                format!("{fkey}.window"),
                span(w),
                ErrorKind::BrokerHasNoWindow,
            );
        }
        if let Some(m) = &f.message {
            self.err(
                format!("{fkey}.message"),
                span(m),
                ErrorKind::BrokerHasNoWindow,
            );
        }
        if let Some(t) = &f.then {
            if *t.get_ref() != placement.then {
                self.err(
                    format!("{fkey}.then"),
                    span(t),
                    ErrorKind::WrongThen {
                        target,
                        action: act,
                        then: *t.get_ref(),
                        follows: placement.then,
                    },
                );
            }
        }
        Some(Action::Broker(act))
    }
}
