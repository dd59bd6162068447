//! Consume steps: the built-in consumer under its placements, and a program of the user's seen as a black box through the proxies.

use super::*;

impl Ctx<'_> {
    /// The entries a drain of `queue` owes: what it holds, and what its
    /// feeders (delay queues, retry tiers) hold, which expires into it
    /// while the drain runs. Without them a drain that starts while a
    /// delayed message waits ends before it comes, and its fault points
    /// read "never reached".
    async fn drain_count(&mut self, queue: &str) -> Result<usize> {
        let lab = self.lab;
        let feeders = lab.feeders_of(queue);
        let broker = &self.conns().broker;
        // A message moving from a feeder into the queue between two reads
        // is counted in neither (or both): read until two counts agree.
        let mut last = None;
        for _ in 0..10 {
            let mut n = broker.queue_state(queue).await?.0 as usize;
            for q in &feeders {
                n += broker.queue_state(q).await?.0 as usize;
            }
            if last == Some(n) {
                return Ok(n);
            }
            last = Some(n);
        }
        bail!("the depths of `{queue}` and the queues that feed it never held still over 10 reads")
    }

    #[deny(
        clippy::wildcard_enum_match_arm,
        clippy::match_wildcard_for_single_variants
    )] // a kind without its hook must not compile
    pub(super) async fn consume(&mut self, c: &Consume, fault: Option<&Fault>) -> Result<()> {
        let phase = format!("consume({})", c.queue);
        let d = Deadline::new(&phase, c.deadline_secs);
        let deadline = d.at;
        let settle = match c.settle {
            Settle::Count(n) => n,
            // What the queue holds now, each entry once (`settle_copies`),
            // and what waits to expire into it.
            Settle::Drain => self.drain_count(&c.queue).await?,
        };
        if let Some(command) = &c.command {
            return self.consume_program(c, command, settle, fault, d).await;
        }
        let mut cfg = self.consumer_config(c, settle, None);
        // Every consume-step placement of the registry, by its kind, with
        // no wildcard: a placement without its hook here does not compile.
        // Each arm says whose assertions wait for the consumer's end.
        let after = match on_consume(fault)? {
            None => None,
            Some((f, kind)) => match kind {
                k @ (OnConsume::Rendezvous | OnConsume::Stall) => {
                    return self.consume_crowd(c, f, k, settle, d).await;
                }
                OnConsume::ConsumerKill => {
                    let step = ConsumeStep { c, settle };
                    let mut stage = StepStage::new(self, &step, d);
                    crate::faults::consumer::kill_on_consume(&mut stage, f).await?;
                    self.after_kill(c, f, &mut cfg, d).await?;
                    None
                }
                OnConsume::Database(what) => {
                    let step = ConsumeStep { c, settle };
                    let mut stage = StepStage::new(self, &step, d);
                    crate::faults::database::on_consume(&mut stage, f, what).await?;
                    self.after_kill(c, f, &mut cfg, d).await?;
                    None
                }
                OnConsume::Cut => {
                    crate::faults::network::cut_consumer(self, f, &mut cfg)?;
                    Some(f)
                }
            },
        };
        // Not across a cut: the process that reconnects gets a redelivery of
        // what it settled (its ack lost), which is no entry of the queue.
        cfg.settle_copies = (c.settle == Settle::Drain || cfg.settle_copies) && !cfg.reconnect;
        let mut proc = self.spawn_role(RoleConfig::Consumer(cfg))?;
        self.follow(&mut proc, Role::Consumer, d, None).await?;
        let code = self.wait_exit(&mut proc, d).await?;
        // A delivery in flight when the consumer closed goes back to the
        // queue when the broker removes the consumer, a moment after the
        // process is gone: the queue's state is read after that.
        self.await_consumers_gone(&c.queue, &phase, deadline)
            .await?;
        self.log.observed.consumer_exit_code = Some(code);
        if code != 0 {
            tracing::warn!(
                "consumer exited with {code}: {}",
                process::tail(&proc.log, 10)
            );
        }
        if let Some(f) = after {
            self.assert(&f.asserts).await?;
        }
        Ok(())
    }

    /// After a fault killed the step's consumer: the fault's assertions,
    /// the broker rid of the dead consumer, and what the fresh one settles.
    async fn after_kill(
        &mut self,
        c: &Consume,
        f: &Fault,
        cfg: &mut ConsumerConfig,
        d: Deadline<'_>,
    ) -> Result<()> {
        self.assert(&f.asserts).await?;
        self.await_consumers_gone(&c.queue, d.phase, d.at).await?;
        if let Some(n) = f.restart_settle {
            cfg.settle = n;
        }
        if f.restart_drain {
            cfg.settle = self.drain_count(&c.queue).await?;
            cfg.settle_copies = true;
        }
        Ok(())
    }

    /// Waits until `queue` holds at least `depth` ready messages, or the time
    /// is up: then the step ends without an error, and the assertions after
    /// it say what the queue holds (what did not arrive within the bound).
    /// With `from`, the queue its messages are dead-lettered from: once it
    /// holds no message (ready, unacked, or waiting for an at-least-once
    /// dead-letter target), the wait ends. What the assertions read
    /// afterwards is then final for at-least-once: the broker leaves such
    /// a message in `from` until the awaited queue confirmed it. An
    /// at-most-once dead-letter leaves `from` before it is forwarded, which
    /// on one node reaches the awaited queue before the harness's next read.
    pub(super) async fn await_at_least(
        &mut self,
        queue: &str,
        depth: u32,
        within_secs: u64,
        from: Option<&str>,
    ) -> Result<()> {
        let until = Instant::now() + Duration::from_secs(within_secs);
        // Each read of `from` starts a rabbitmqctl VM: the next one 250 ms
        // after it answered. A read that fails or outlasts the bound ends
        // the reading, not the run: the wait is then the bound, as without
        // `from`.
        let mut reading = from;
        let mut next_read = Instant::now();
        loop {
            let (ready, _) = self.conns().broker.queue_state(queue).await?;
            if ready >= depth || Instant::now() >= until {
                return Ok(());
            }
            if let Some(src) = reading.filter(|_| Instant::now() >= next_read) {
                let left = until.saturating_duration_since(Instant::now());
                let read = self.env.read().queue_holds(&self.vhost, src);
                match tokio::time::timeout(left, read).await {
                    Ok(Ok(0)) => return Ok(()),
                    Ok(Ok(_)) => next_read = Instant::now() + Duration::from_millis(250),
                    Ok(Err(e)) => {
                        eprintln!(
                            "mqlab: {}: what `{src}` holds could not be read ({e:#}): waiting out the {within_secs} s bound",
                            self.run
                        );
                        reading = None;
                    }
                    Err(_) => reading = None,
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A message waiting in a retry tier, or in any queue whose TTL
    /// dead-letters it on (the seed's reject-TTL-back loop), is in transit
    /// by design: it moves on when its TTL ends. Queue state is read once no
    /// such queue holds one (each waits at most its TTL), so that no read can
    /// catch a message between two queues.
    pub(super) async fn await_tiers_empty(&mut self) -> Result<()> {
        let mut tiers: Vec<(String, u64)> = self
            .lab
            .steps
            .iter()
            .filter_map(|s| match &s.action {
                Action::Consume(c) => c.retry.as_ref(),
                _ => None,
            })
            .flat_map(|r| r.tiers.iter().cloned())
            // A variant's tier that does not exist holds nothing.
            .filter(|(t, _)| self.lab.topology.queues.iter().any(|q| q.name == *t))
            .collect();
        for q in &self.lab.topology.queues {
            let ttl = match q.arguments.get("x-message-ttl") {
                Some(crate::vocab::ArgValue::Int(ms)) => *ms as u64,
                _ => continue,
            };
            if q.arguments.contains_key("x-dead-letter-exchange")
                && !tiers.iter().any(|(t, _)| *t == q.name)
            {
                tiers.push((q.name.clone(), ttl));
            }
        }
        for (q, ttl) in tiers {
            let deadline = Instant::now() + Duration::from_millis(ttl) + Duration::from_secs(10);
            self.await_depth(&q, 0, "reading the retry tiers", deadline)
                .await?;
        }
        Ok(())
    }

    /// What the proxies saw a program do, as an `[observe]` line; which
    /// instance, when the step runs several.
    pub(super) fn observe(&mut self, seen: &Seen, queue: &str, consumer: Option<&str>) {
        use transcript::Observed as O;
        let (message, seen) = match seen {
            Seen::Delivered {
                message,
                redelivered,
                auto_ack,
            } => (
                message,
                O::Delivered {
                    redelivered: *redelivered,
                    auto_ack: *auto_ack,
                },
            ),
            Seen::Committed { message } => (message, O::Committed),
            Seen::RolledBack { message } => (message, O::RolledBack),
            Seen::Held {
                message,
                what,
                commit,
            } => (
                message,
                O::Held {
                    what: what.to_string(),
                    commit: *commit,
                },
            ),
            Seen::Acked { message } => (message, O::Acked),
            // A rendezvous's instance at its window: held there, not killed.
            Seen::Fire { message } if consumer.is_some() => (message, O::AtRendezvous),
            Seen::Settled { .. }
            | Seen::Unreachable { .. }
            | Seen::Contradicts { .. }
            | Seen::Fire { .. } => return,
        };
        self.say_observed(&Observation {
            message: message.clone(),
            queue: queue.to_string(),
            consumer: consumer.map(str::to_string),
            seen,
        });
    }

    /// An observation's `[observe]` line in the transcript.
    pub(super) fn say_observed(&mut self, o: &Observation) {
        let line = o.line(self.lab.broker, &self.lab.name);
        self.emit(Role::Observe, &line);
    }

    /// After a kill the broker requeues the dead channel's unacked messages
    /// when it removes its consumer; a new consumer started before that would
    /// see them out of order.
    pub(super) async fn await_consumers_gone(
        &mut self,
        queue: &str,
        phase: &str,
        deadline: Instant,
    ) -> Result<()> {
        loop {
            let Some((_, consumers)) = self.queue_state(queue).await? else {
                return Ok(()); // its node is down: no consumer on it either
            };
            if consumers == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Failure::Deadline.error(format!(
                    "phase {phase}: the broker still lists a consumer on `{queue}` after the kill"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A consume step of the built-in consumer, as its fault family's hooks
/// see it: the step, and how many messages the consumer settles.
pub(super) struct ConsumeStep<'c> {
    c: &'c Consume,
    settle: usize,
}

impl crate::faults::ConsumeStage for StepStage<'_, '_, ConsumeStep<'_>> {
    fn start_consumer_at(&mut self, f: &Fault) -> Result<()> {
        let step = self.step;
        let cfg = self
            .ctx
            .consumer_config(step.c, step.settle, Some(point_of(f)));
        self.proc = Some(self.ctx.spawn_role(RoleConfig::Consumer(cfg))?);
        Ok(())
    }

    async fn consumer_at_window(&mut self, f: &Fault) -> Result<()> {
        let d = self.d;
        let mut proc = self.proc.take().context("no consumer to follow")?;
        let r = self.ctx.reach_marker(&mut proc, Role::Consumer, f, d).await;
        self.proc = Some(proc);
        r
    }

    async fn await_depth(&mut self, depth: u32) -> Result<()> {
        let (queue, d) = (&self.step.c.queue, self.d);
        self.ctx.await_depth(queue, depth, d.phase, d.at).await
    }

    async fn kill_consumer(&mut self, f: &Fault) -> Result<()> {
        let d = self.d;
        let mut proc = self.proc.take().context("no consumer to kill")?;
        self.ctx.kill_marked(&mut proc, Role::Consumer, f, d).await
    }

    async fn database_fault(&mut self, fault: crate::vocab::DatabaseFault) -> Result<()> {
        self.ctx.database_fault(fault).await
    }
}

impl Ctx<'_> {
    /// The run's own database killed by `fault` and started again on its
    /// data; the harness's connection to the run's database renewed.
    async fn database_fault(&mut self, fault: crate::vocab::DatabaseFault) -> Result<()> {
        let (own, _) = self
            .links
            .own_database
            .as_mut()
            .context("a database fault needs the run's own PostgreSQL (a lab's `database`)")?;
        match fault {
            crate::vocab::DatabaseFault::Kill => own.crash().await?,
            crate::vocab::DatabaseFault::PowerLoss => {
                let lost = own.power_loss().await?;
                self.log
                    .power_lost
                    .get_or_insert_with(Vec::new)
                    .extend(lost);
            }
        }
        let url = self.links.endpoints.pg_url(&self.database);
        self.conns().db = store::connect(&url).await?;
        Ok(())
    }
}
