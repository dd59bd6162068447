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
                    self.assert(&f.asserts).await?;
                    self.await_consumers_gone(&c.queue, &phase, deadline)
                        .await?;
                    if let Some(n) = f.restart_settle {
                        cfg.settle = n;
                    }
                    if f.restart_drain {
                        cfg.settle = self.drain_count(&c.queue).await?;
                        cfg.settle_copies = true;
                    }
                    None
                }
                OnConsume::CutAck => {
                    crate::faults::network::cut_ack(self, f);
                    cfg.reconnect = true;
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

    /// A program mqlab did not write as the consumer (the role contract):
    /// its delivery, commit and ack for each message are seen through the
    /// two proxies and written as `[observe]` lines; at the fault's window
    /// the black box freezes both connections and the program is killed,
    /// then started again. It is done once it acked `settle` distinct
    /// messages: then it gets SIGTERM.
    /// Long because it is one loop over what the proxies saw, an arm per
    /// turn of the program's life (settled, window unreachable, the kill
    /// and the restart), kept together so the order of the turns shows.
    pub(super) async fn consume_program(
        &mut self,
        c: &Consume,
        command: &str,
        mut settle: usize,
        fault: Option<&Fault>,
        d: Deadline<'_>,
    ) -> Result<()> {
        let (phase, deadline) = (d.phase, d.at);
        if settle == 0 {
            return Ok(());
        }
        // Every consume-step placement on a program, by its kind, before
        // anything starts.
        #[deny(
            clippy::wildcard_enum_match_arm,
            clippy::match_wildcard_for_single_variants
        )] // a kind without its hook must not compile
        let kill = match on_consume(fault)? {
            None => None,
            Some((f, kind)) => match kind {
                OnConsume::Rendezvous => {
                    return self.consume_programs(c, command, f, settle, d).await;
                }
                OnConsume::ConsumerKill => Some(f),
                // The built-in consumer's only (`built_in_only`): the lab
                // checker refuses them on a program.
                k @ (OnConsume::CutAck | OnConsume::Stall) => {
                    bail!(
                    "phase {phase}: {k:?} ({} of the {}) has no hook on a program's consume step",
                    f.action,
                    f.target
                )
                }
            },
        };
        let (tx, mut seen) = mpsc::unbounded_channel();
        let bb = Arc::new(Mutex::new(BlackBox::new(tx)));
        if c.commits_first {
            bb.lock().expect("black box").declare_commits_first();
        }
        let upstream = format!(
            "{}:{}",
            self.links.endpoints.pg_host, self.links.endpoints.pg_port
        )
        .parse()
        .context("the database's address")?;
        let pg = PgProxy::start(upstream, bb.clone()).await?;
        self.proxy().watch(Some(bb.clone()));
        if let Some(f) = kill {
            bb.lock()
                .expect("black box")
                .arm(f.window, &f.message, f.commit);
        }
        let result = async {
            let mut proc = self.spawn_program(c, command, pg.port, None)?;
            let mut acked = BTreeSet::new();
            loop {
                match next_seen(&mut seen, &mut proc, (acked.len(), settle), d, &bb).await? {
                    Seen::Settled { message } => {
                        acked.insert(message);
                        if acked.len() >= settle {
                            // Done with every message, and the window never came.
                            let (missed, window) = {
                                let b = bb.lock().expect("black box");
                                (b.never_fired(), b.window_name())
                            };
                            if let (Some(why), Some(f)) = (missed, fault) {
                                process::kill_now(&mut proc.child);
                                return Err(Failure::unreachable(format!(
                                    "window `{window}` is unreachable for this program at {}: {why}",
                                    f.message
                                )));
                            }
                            process::stop(
                                &mut proc.child,
                                Signal::SIGTERM,
                                Duration::from_secs(10),
                            )
                            .await;
                            // A declared order the program broke on its way out.
                            while let Ok(s) = seen.try_recv() {
                                if let Seen::Contradicts { message } = s {
                                    return Err(contradicts(phase, &message));
                                }
                            }
                            let code = match proc.child.try_wait()? {
                                Some(status) => exit_code(status),
                                None => -1,
                            };
                            self.log.observed.consumer_exit_code = Some(code);
                            return Ok(());
                        }
                    }
                    Seen::Unreachable { message, why } => {
                        process::kill_now(&mut proc.child);
                        let window = bb.lock().expect("black box").window_name();
                        return Err(Failure::unreachable(format!(
                            "window `{window}` is unreachable for this program at {message}: {why}"
                        )));
                    }
                    Seen::Contradicts { message } => {
                        process::kill_now(&mut proc.child);
                        return Err(contradicts(phase, &message));
                    }
                    Seen::Fire { message } => {
                        // The window: both connections are frozen. An
                        // autoAck program is killed once the broker has
                        // pushed it everything (no prefetch bounds it): the
                        // loss is then what it is, not how far a race got.
                        if bb.lock().expect("black box").auto_ack() {
                            self.await_depth(&c.queue, 0, phase, deadline).await?;
                        }
                        self.kill_program_at_window(&mut proc, &message, &c.queue, fault)
                            .await?;
                        self.await_consumers_gone(&c.queue, phase, deadline).await?;
                        // autoAck: what the broker sent the killed program is
                        // gone from the queue, never to come back.
                        let auto_ack = bb.lock().expect("black box").auto_ack();
                        if auto_ack || fault.is_some_and(|f| f.restart_drain) {
                            // What is left to settle: what the queue holds now.
                            let (left, _) =
                                self.conns().broker.queue_state(&c.queue).await?;
                            settle = acked.len() + left as usize;
                            if acked.len() >= settle {
                                // Nothing is left for a new process.
                                return Ok(());
                            }
                        }
                        bb.lock().expect("black box").reset();
                        proc = self.spawn_program(c, command, pg.port, None)?;
                    }
                    seen => self.observe(&seen, &c.queue, None),
                }
            }
        }
        .await;
        self.proxy().watch(None);
        result?;
        self.await_consumers_gone(&c.queue, phase, deadline).await
    }

    /// What the proxies saw a program do, as an `[observe]` line; which
    /// instance, when the step runs several.
    pub(super) fn observe(&mut self, seen: &Seen, queue: &str, consumer: Option<&str>) {
        let at = |me: &Self, message: &str| {
            let line = me.observe_line(message, queue);
            match consumer {
                Some(name) => line.with("consumer", name),
                None => line,
            }
        };
        let line = match seen {
            Seen::Delivered {
                message,
                redelivered,
                auto_ack,
            } => {
                let line = at(self, message).with("redelivered", redelivered);
                // Said only of an autoAck program: the broker settled it here.
                let line = match auto_ack {
                    true => line.with("autoAck", true),
                    false => line,
                };
                line.status(Status::Delivered)
            }
            Seen::Committed { message } => at(self, message).status(Status::Committed),
            Seen::RolledBack { message } => at(self, message).status(Status::RolledBack),
            Seen::Held {
                message,
                what,
                commit,
            } => {
                let line = at(self, message).with("what", what);
                let line = match commit {
                    Some(k) => line.with("commit", k),
                    None => line,
                };
                line.status(Status::Held)
            }
            Seen::Acked { message } => at(self, message).status(Status::Acked),
            // A rendezvous's instance at its window: held there, not killed.
            Seen::Fire { message } if consumer.is_some() => {
                at(self, message).status(Status::AtRendezvous)
            }
            Seen::Settled { .. }
            | Seen::Unreachable { .. }
            | Seen::Contradicts { .. }
            | Seen::Fire { .. } => return,
        };
        self.emit(Role::Observe, &line);
    }

    /// The program at its window (both connections frozen): what the
    /// database holds for the message now, then SIGKILL of its process
    /// group, its `[observe] ... status=killed` line and the fault's
    /// assertions.
    async fn kill_program_at_window(
        &mut self,
        proc: &mut RoleProc,
        message: &str,
        queue: &str,
        fault: Option<&Fault>,
    ) -> Result<()> {
        let lab = self.lab;
        let event = self.log.observed.events.of(message).to_string();
        let rows = store::program_rows_for(
            &mut self.conns().db,
            lab.effects.as_deref().unwrap_or_default(),
            &event,
        )
        .await?;
        self.log.observed.crash_business_rows = Some(rows);
        let pid = proc.child.id().context("program already reaped")?;
        signal::killpg(Pid::from_raw(pid as i32), Signal::SIGKILL).ok();
        let code = exit_code(proc.child.wait().await?);
        self.log.observed.crash_exit_code = Some(code);
        let line = self
            .observe_line(message, queue)
            .with("exitCode", code)
            .with("businessRows", rows)
            .status(Status::Killed);
        self.emit(Role::Observe, &line);
        if let Some(f) = fault {
            self.assert(&f.asserts).await?;
        }
        Ok(())
    }

    pub(super) fn observe_line(&self, message: &str, queue: &str) -> Record {
        Record::new(self.lab.broker, &self.lab.name)
            .with("messageId", message)
            .with("destination", queue)
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

/// A program that broke the order its lab declares for it.
fn contradicts(phase: &str, message: &str) -> anyhow::Error {
    anyhow::anyhow!("phase {phase}: the lab declares that the program commits before it acks (`commits_first`), and it went on with {message} after acking it")
}

/// What the proxies saw the program do next; an error when the program
/// exited first or the phase ran out, with how far it got (`settled` of
/// `settle`) and its last lines.
async fn next_seen(
    seen: &mut mpsc::UnboundedReceiver<Seen>,
    proc: &mut RoleProc,
    (settled, settle): (usize, usize),
    d: Deadline<'_>,
    bb: &Mutex<BlackBox>,
) -> Result<Seen> {
    let phase = d.phase;
    tokio::select! {
        e = seen.recv() => e.context("the proxies stopped"),
        status = proc.child.wait() => {
            let code = exit_code(status?);
            Err(Failure::RoleExited.error(format!(
                "phase {phase}: the program exited with {code} after it settled {settled} of {settle} messages (acked, transaction ended); last lines of its output:\n{}",
                process::tail(&proc.log, 10)
            )))
        }
        _ = tokio::time::sleep_until(d.at.into()) => {
            process::kill_now(&mut proc.child);
            let why = bb.lock().expect("black box").stuck().map(|w| format!(" {w};")).unwrap_or_default();
            Err(Failure::Deadline.error(format!(
                "phase {phase} exceeded {} s: the program settled {settled} of {settle} messages (acked, transaction ended);{why} last lines of its output:\n{}",
                d.secs,
                process::tail(&proc.log, 10)
            )))
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
}
