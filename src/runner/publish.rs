//! Publish steps: the producer under each publish-step placement (a kill at its window, a cut publish, a held confirm, a node killed with the confirm in flight), and what the proxy did.

use super::*;

impl Ctx<'_> {
    #[deny(
        clippy::wildcard_enum_match_arm,
        clippy::match_wildcard_for_single_variants
    )] // a kind without its hook must not compile
    pub(super) async fn publish(
        &mut self,
        p: &Publish,
        fault: Option<&Fault>,
        phase: &str,
    ) -> Result<()> {
        let d = Deadline::new(phase, p.deadline_secs);
        // Every publish-step placement of the registry, by its kind, with
        // no wildcard: a placement without its hook here does not compile.
        // Each arm says whose assertions wait for the producer's end.
        let after = match on_publish(fault)? {
            None => None,
            Some((f, kind)) => match kind {
                // A family that sequences its own fault: its hook, then the
                // fault's assertions.
                OnPublish::NodeKill => {
                    let mut stage = PublishStage::new(self, p, d);
                    crate::faults::node::kill_on_publish(&mut stage, p, f).await?;
                    return self.assert(&f.asserts).await;
                }
                OnPublish::BrokerPause => {
                    let mut stage = PublishStage::new(self, p, d);
                    crate::faults::pause::on_publish(&mut stage, p, f).await?;
                    return self.assert(&f.asserts).await;
                }
                // Then a new producer on the same journal.
                OnPublish::ProducerKill => {
                    let mut stage = PublishStage::new(self, p, d);
                    crate::faults::producer::kill_on_publish(&mut stage, f).await?;
                    self.assert(&f.asserts).await?;
                    None
                }
                OnPublish::CutPublish => {
                    let mut stage = PublishStage::new(self, p, d);
                    crate::faults::network::cut_publish(&mut stage, f, phase).await?;
                    Some(f)
                }
                OnPublish::HoldConfirm => {
                    crate::faults::network::hold_confirm(self, f);
                    Some(f)
                }
            },
        };
        // After a kill, the restarted producer reads the same journal.
        let cfg = self.producer_config(p, None);
        let mut proc = self.spawn_role(RoleConfig::Producer(cfg))?;
        self.follow(&mut proc, Role::Producer, d, None).await?;
        self.expect_success(&mut proc, d).await?;
        if let Some(f) = after {
            self.assert(&f.asserts).await?;
        }
        Ok(())
    }

    /// The proxy acted: its `[fault]` line, from its event.
    pub(super) async fn proxy_effect(&mut self, phase: &str, deadline: Instant) -> Result<()> {
        let rx = &mut self
            .links
            .proxy
            .as_mut()
            .expect("prepared before any step")
            .1;
        let Ok(Some(event)) = tokio::time::timeout_at(deadline.into(), rx.recv()).await else {
            bail!("phase {phase}: a role lost its connection or a confirm, and the proxy did not cause it");
        };
        let (action, window, message) = match &event {
            ProxyEvent::Cut { message } => {
                (FaultAction::Cut, Window::AfterCommitBeforeAck, message)
            }
            ProxyEvent::CutBarrier { message } => (FaultAction::Cut, Window::BeforeCommit, message),
            ProxyEvent::CutPublish { message } => {
                (FaultAction::Cut, Window::AfterPublishBeforeBroker, message)
            }
            ProxyEvent::Held { message } => (
                FaultAction::Hold,
                Window::AfterPublishBeforeConfirm,
                message,
            ),
        };
        crate::faults::Harness::say(
            self,
            &FaultEvent::injected(Target::Network, action).at(window, message),
        );
        Ok(())
    }

    /// A cut the consumer never noticed (it had settled its last message and
    /// left before reading again): its `[fault]` line after the consumer's
    /// lines, and the proxy's gate opened for whatever connects next.
    pub(super) async fn unnoticed_cut(&mut self, phase: &str) -> Result<()> {
        let pending = match self.links.proxy.as_mut() {
            Some((_, rx)) => !rx.is_empty(),
            None => false,
        };
        if pending {
            let deadline = Instant::now() + Duration::from_secs(30);
            self.proxy_effect(phase, deadline).await?;
            self.after_cut(phase, deadline).await?;
        }
        Ok(())
    }

    /// After a cut the broker must have dropped the old connection (and
    /// requeued its unacked message) before the consumer may connect again:
    /// the proxy holds new connections until then.
    pub(super) async fn after_cut(&mut self, phase: &str, deadline: Instant) -> Result<()> {
        let queues: Vec<String> = self.lab.queue_names().map(str::to_string).collect();
        for q in &queues {
            self.await_consumers_gone(q, phase, deadline).await?;
        }
        self.proxy().release();
        Ok(())
    }
}

type PublishStage<'c, 'a> = StepStage<'c, 'a, Publish>;

impl crate::faults::Stage for StepStage<'_, '_, Publish> {
    fn deadline(&self) -> Instant {
        self.d.at
    }

    async fn proxy_event(&mut self) -> Result<ProxyEvent> {
        let rx = &mut self
            .ctx
            .links
            .proxy
            .as_mut()
            .expect("prepared before any step")
            .1;
        match tokio::time::timeout_at(self.d.at.into(), rx.recv()).await {
            Ok(Some(event)) => Ok(event),
            Ok(None) => bail!("phase {}: the proxy stopped", self.d.phase),
            Err(_) => Err(Failure::Deadline.error(format!(
                "phase {} exceeded {} s waiting for the proxy",
                self.d.phase, self.d.secs
            ))),
        }
    }

    fn start_producer(&mut self, reconnect: bool) -> Result<()> {
        let mut cfg = self.ctx.producer_config(self.step, None);
        cfg.reconnect = reconnect;
        self.proc = Some(self.ctx.spawn_role(RoleConfig::Producer(cfg))?);
        Ok(())
    }

    async fn producer_until(&mut self, message: &str, status: Status) -> Result<()> {
        let d = self.d;
        let mut proc = self.proc.take().context("no producer to follow")?;
        let r = self.ctx.follow_until(&mut proc, d, message, status).await;
        self.proc = Some(proc);
        r
    }

    async fn finish_producer(&mut self) -> Result<()> {
        let d = self.d;
        let mut proc = self.proc.take().context("no producer to follow")?;
        self.ctx.follow(&mut proc, Role::Producer, d, None).await?;
        self.ctx.expect_success(&mut proc, d).await
    }

    fn start_producer_at(&mut self, f: &Fault) -> Result<()> {
        let cfg = self.ctx.producer_config(self.step, Some(point_of(f)));
        self.proc = Some(self.ctx.spawn_role(RoleConfig::Producer(cfg))?);
        Ok(())
    }

    async fn kill_producer_at_window(&mut self, f: &Fault) -> Result<()> {
        let d = self.d;
        let mut proc = self.proc.take().context("no producer to kill")?;
        self.ctx
            .kill_at_marker(&mut proc, Role::Producer, f, d)
            .await
    }

    async fn producer_exit(&mut self) -> Result<i32> {
        let d = self.d;
        let mut proc = self.proc.take().context("no producer to follow")?;
        self.ctx.follow(&mut proc, Role::Producer, d, None).await?;
        self.ctx.wait_exit(&mut proc, d).await
    }

    async fn proxy_effect(&mut self) -> Result<()> {
        self.ctx.proxy_effect(self.d.phase, self.d.at).await
    }
}
