//! Role processes: spawning a role, reading its lines, waiting for its exit, killing it at its window marker.

use super::*;

impl Ctx<'_> {
    pub(super) fn spawn_role(&mut self, config: RoleConfig) -> Result<RoleProc> {
        self.role_seq += 1;
        let (child, stdout, log) =
            crate::protocol::spawn_role(self.exe, &self.logs, self.role_seq, config)?;
        Ok(RoleProc {
            child,
            lines: Some(BufReader::new(stdout).lines()),
            log,
        })
    }

    /// The next stdout line of a role, or None at its exit; a deadline overrun
    /// kills it and names the phase.
    pub(super) async fn next_line(
        &self,
        p: &mut RoleProc,
        d: Deadline<'_>,
    ) -> Result<Option<String>> {
        let Deadline {
            phase,
            at: deadline,
            secs,
        } = d;
        let Some(lines) = p.lines.as_mut() else {
            return Ok(None);
        };
        match tokio::time::timeout_at(deadline.into(), lines.next_line()).await {
            Ok(line) => Ok(line?),
            Err(_) => {
                process::kill_now(&mut p.child);
                Err(Failure::Deadline.error(format!(
                    "phase {phase} exceeded {secs} s; last lines of the role's log:\n{}",
                    process::tail(&p.log, 10)
                )))
            }
        }
    }

    pub(super) async fn wait_exit(&self, p: &mut RoleProc, d: Deadline<'_>) -> Result<i32> {
        let Deadline {
            phase,
            at: deadline,
            secs,
        } = d;
        match tokio::time::timeout_at(deadline.into(), p.child.wait()).await {
            Ok(status) => Ok(exit_code(status?)),
            Err(_) => {
                process::kill_now(&mut p.child);
                Err(Failure::Deadline.error(format!(
                    "phase {phase} exceeded {secs} s waiting for the role to exit"
                )))
            }
        }
    }

    /// The producer's exit, which must be 0.
    pub(super) async fn expect_success(
        &mut self,
        proc: &mut RoleProc,
        d: Deadline<'_>,
    ) -> Result<()> {
        let code = self.wait_exit(proc, d).await?;
        if code != 0 {
            return Err(Failure::RoleExited.error(format!(
                "the producer exited with {code}; last lines of its log:\n{}",
                process::tail(&proc.log, 10)
            )));
        }
        Ok(())
    }

    /// Emits the producer's lines up to and including `status` for `message`.
    pub(super) async fn follow_until(
        &mut self,
        proc: &mut RoleProc,
        d: Deadline<'_>,
        message: &str,
        status: Status,
    ) -> Result<()> {
        loop {
            let Some(line) = self.next_line(proc, d).await? else {
                return Err(Failure::RoleExited.error(format!(
                    "the producer exited before it logged {message} {status}; last lines of its log:\n{}",
                    process::tail(&proc.log, 10)
                )));
            };
            self.emit(Role::Producer, &line);
            let entry = Entry::parse(&format!("[{}] {line}", Role::Producer));
            let field = |k| entry.as_ref().and_then(|e| e.get(k));
            if field("messageId") == Some(message) && field("status") == Some(status.name()) {
                return Ok(());
            }
        }
    }

    /// Reads a role's lines until it exits (or, given a message, until its
    /// window marker for it; then `true`). The proxy's faults are written
    /// into the transcript just before the role's line that shows their
    /// effect, so lines come in the order of cause and effect, every run.
    pub(super) async fn follow(
        &mut self,
        proc: &mut RoleProc,
        role: Role,
        d: Deadline<'_>,
        until_marker: Option<&str>,
    ) -> Result<bool> {
        let Deadline {
            phase,
            at: deadline,
            ..
        } = d;
        while let Some(line) = self.next_line(proc, d).await? {
            let entry = Entry::parse(&format!("[{role}] {line}"));
            let status = entry
                .as_ref()
                .and_then(|e| e.get("status"))
                .and_then(|s| s.parse::<Status>().ok());
            if matches!(
                status,
                Some(Status::ConnectionLost | Status::ConfirmTimeout)
            ) {
                self.proxy_effect(phase, deadline).await?;
            }
            self.emit(role, &line);
            if status == Some(Status::ConnectionLost) {
                self.after_cut(phase, deadline).await?;
            }
            if let (Some(m), Some(Status::CrashInjected)) = (until_marker, status) {
                if entry.as_ref().and_then(|e| e.get("messageId")) == Some(m) {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// Follows a role to its window marker, then kills it there.
    pub(super) async fn kill_at_marker(
        &mut self,
        proc: &mut RoleProc,
        role: Role,
        f: &Fault,
        d: Deadline<'_>,
    ) -> Result<()> {
        self.reach_marker(proc, role, f, d).await?;
        self.kill_marked(proc, role, f, d).await
    }

    /// Follows a role to its window marker for the fault's message; a role
    /// that exits first never reaches the window (recorded as unreachable,
    /// and the lab fails).
    pub(super) async fn reach_marker(
        &mut self,
        proc: &mut RoleProc,
        role: Role,
        f: &Fault,
        d: Deadline<'_>,
    ) -> Result<()> {
        if !self.follow(proc, role, d, Some(&f.message)).await? {
            let code = self.wait_exit(proc, d).await?;
            return Err(Failure::Unreachable(format!(
                "the {role} never reached `{}` for {}",
                f.window, f.message
            ))
            .error(format!(
                    "the {role} exited with {code} before reaching window `{}` for {}; last lines of its log:\n{}",
                    f.window,
                    f.message,
                    process::tail(&proc.log, 10)
                )));
        }
        Ok(())
    }

    /// The role blocks at its marker: ground truth now, then SIGKILL, reap,
    /// and the crash recorded.
    pub(super) async fn kill_marked(
        &mut self,
        proc: &mut RoleProc,
        role: Role,
        f: &Fault,
        d: Deadline<'_>,
    ) -> Result<()> {
        // Ground truth at the moment of the kill, before anything can change it.
        self.log.observed.crash_business_rows =
            Some(store::business_rows_for(&mut self.conns().db, &f.message).await?);
        // What a queue-depth monitor sees while the consumer holds its
        // prefetched deliveries unacked: read before they go back.
        for q in queues_read_at_kill(f, Counter::DepthAtKill) {
            match self.queue_state(&q).await? {
                Some((ready, _)) => self.log.observed.depths_at_kill.insert(q, ready),
                None => self.log.observed.depths_at_kill.remove(&q),
            };
        }
        // And the queue's own process: what it delivered unacked, and
        // whether it tells the age of its oldest message.
        let aged = queues_read_at_kill(f, Counter::OldestAgeShownAtKill);
        let counted = queues_read_at_kill(f, Counter::UnackedAtKill);
        let mut read: Vec<String> = counted.iter().chain(&aged).cloned().collect();
        read.sort();
        read.dedup();
        for q in read {
            let vhost = self.vhost.clone();
            let held = self
                .env
                .owned()
                .context("a queue's own figures (unackedAtKill, oldestAgeShownAtKill) need the environment to itself (read with rabbitmqctl eval): this run shares it")?
                .queue_held(&vhost, &q)
                .await?;
            // A stamp from before the run or from the future is no message
            // of this run's: an error, never a `yes`.
            if let Some(s) = held.oldest_stamp.filter(|_| aged.contains(&q)) {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or_default();
                let began = now.saturating_sub(self.began.elapsed().as_secs() + 1);
                if !(began..=now + 1).contains(&s) {
                    bail!("`{q}` says its oldest message was stamped at {s} s, outside this run ({began}-{now} s since the epoch)");
                }
            }
            if counted.contains(&q) {
                self.log
                    .observed
                    .unacked_at_kill
                    .insert(q.clone(), held.unacked);
            }
            if aged.contains(&q) {
                self.log
                    .observed
                    .ages_shown_at_kill
                    .insert(q, held.oldest_stamp.is_some());
            }
        }
        let pid = proc.child.id().context("role already reaped")?;
        signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL)?;
        let code = self.wait_exit(proc, d).await?;
        while let Some(line) = self.next_line(proc, d).await? {
            self.emit(role, &line);
        }
        self.log.observed.crash_exit_code = Some(code);
        Ok(())
    }

    /// Where this run's roles run, for a step on `node`.
    fn site(&self, node: usize) -> RoleSite<'_> {
        RoleSite {
            lab: &self.lab.name,
            broker: self.lab.broker,
            broker_url: self.role_url(node),
            database_url: self.links.endpoints.pg_url(&self.database),
        }
    }

    pub(super) fn producer_config(&self, p: &Publish, fault: Option<FaultPoint>) -> ProducerConfig {
        let journal = self.logs.join(format!("producer-{}.journal", self.step));
        producer_config(&self.site(p.node), p, journal, fault.into_iter().collect())
    }

    pub(super) fn consumer_config(
        &self,
        c: &Consume,
        settle: usize,
        fault: Option<FaultPoint>,
    ) -> ConsumerConfig {
        let faults = fault.into_iter().collect();
        ConsumerConfig {
            // A policy may set a dead-letter chain the file does not show.
            rejected_leave: !self.lab.has_policy()
                && self.lab.topology.dead_letters_return(&c.queue) == Some(false),
            announce_windows: self.lab.announce_windows,
            downstream: c
                .downstream
                .as_ref()
                .zip(self.links.downstream.as_ref())
                .map(|(d, server)| DownstreamConfig {
                    url: server.url(),
                    timeout_ms: d.timeout_ms,
                }),
            ..consumer_config(&self.site(c.node), c, settle, faults)
        }
    }

    /// Starts the program (`sh -c`, in the project's directory) with the
    /// contract's environment: its connections go through the proxies.
    pub(super) fn spawn_program(
        &mut self,
        c: &Consume,
        command: &str,
        pg_port: u16,
        amqp: Option<&Proxy>,
    ) -> Result<RoleProc> {
        self.role_seq += 1;
        let log = self.logs.join(format!("{}-program.log", self.role_seq));
        let mut db = self.links.endpoints.clone();
        db.pg_port = pg_port;
        // `exec`: the program itself is the process mqlab signals and reaps
        // (its exit status, not a shell's), with variables expanded.
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &format!("exec {command}")])
            .current_dir(self.root)
            .env(
                "MQLAB_CONTRACT",
                crate::protocol::PROGRAM_CONTRACT.to_string(),
            )
            .env(
                crate::broker::program_url_var(self.lab.broker),
                self.role_url_via(c.node, amqp),
            )
            .env("MQLAB_DATABASE_URL", db.pg_url(&self.database))
            .env("MQLAB_QUEUE", &c.queue)
            .env("MQLAB_SERVICE", &c.service)
            .env("MQLAB_PREFETCH", "1")
            .env("MQLAB_RUN_ID", &self.run);
        let child = process::spawn(&mut cmd, &log, false)
            .with_context(|| format!("cannot start the program `{command}`"))?;
        Ok(RoleProc {
            child,
            lines: None,
            log,
        })
    }
}

/// The queues a kill's `assert` reads `counter` of, at the kill.
fn queues_read_at_kill(f: &Fault, counter: Counter) -> Vec<String> {
    f.asserts
        .iter()
        .filter(|a| a.counter.counter == counter)
        .filter_map(|a| a.counter.arg.clone())
        .collect()
}

/// What a role is told besides its step: whose lines it writes and where
/// its connections go. The runner and `soak` give their roles the same
/// configs through it.
pub struct RoleSite<'a> {
    pub lab: &'a str,
    pub broker: crate::vocab::Broker,
    pub broker_url: String,
    pub database_url: String,
}

/// The producer's config for publish step `p` (its outbox journal at
/// `journal`), stopping at the first of `faults` it reaches.
pub fn producer_config(
    site: &RoleSite<'_>,
    p: &Publish,
    journal: PathBuf,
    faults: Vec<FaultPoint>,
) -> ProducerConfig {
    ProducerConfig {
        lab: site.lab.to_string(),
        broker: site.broker,
        broker_url: site.broker_url.clone(),
        exchange: p.exchange.clone(),
        destination: p.destination().to_string(),
        messages: p
            .messages
            .iter()
            .map(|m| OutMessage {
                meta: m.meta.clone(),
                routing_key: m.routing_key.clone(),
                body: m.body.clone(),
                expiration_ms: m.expiration_ms,
            })
            .collect(),
        confirm: p.confirm,
        mandatory: p.mandatory,
        persistent: p.persistent,
        timestamp: p.timestamp,
        park: p.park.clone(),
        confirm_timeout_ms: p.confirm_timeout_ms,
        resend: p.resend,
        batch: p.batch,
        flush: p.flush,
        journal,
        faults,
        reconnect: false,
        orders: p.orders.map(|handoff| OrderService {
            database_url: site.database_url.clone(),
            handoff,
            reconcile: p.reconcile,
            relay: p.relay,
        }),
    }
}

/// The built-in consumer's config for consume step `c`: it ends once
/// `settle` distinct messages are settled, stopping at the first of
/// `faults` it reaches; no downstream service, rejections dead-lettered.
pub fn consumer_config(
    site: &RoleSite<'_>,
    c: &Consume,
    settle: usize,
    faults: Vec<FaultPoint>,
) -> ConsumerConfig {
    ConsumerConfig {
        lab: site.lab.to_string(),
        broker: site.broker,
        broker_url: site.broker_url.clone(),
        database_url: site.database_url.clone(),
        queue: c.queue.clone(),
        consumer: "consumer-1".into(),
        service: c.service.clone(),
        pattern: c.pattern,
        prefetch: c.prefetch,
        settle,
        max_deliveries: c.max_deliveries,
        retry: c.retry.as_ref().map(|r| RetryPolicy {
            max_attempts: r.max_attempts,
            max_duration_ms: r.max_duration_ms,
            dlq: r.dlq.clone(),
            tiers: r
                .tiers
                .iter()
                .map(|(queue, ttl_ms)| Tier {
                    queue: queue.clone(),
                    ttl_ms: *ttl_ms,
                })
                .collect(),
        }),
        faults,
        reconnect: false,
        transient_failures: c.transient_failures.clone(),
        until_stopped: false,
        settle_copies: false,
        rejected_leave: false,
        announce_windows: false,
        downstream: None,
    }
}

/// 128 + signal for a killed process, as a shell reports it.
pub(super) fn exit_code(status: std::process::ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}

/// Where a role blocks for a fault.
pub(super) fn point_of(f: &Fault) -> FaultPoint {
    FaultPoint {
        window: f.window,
        message: f.message.clone(),
        hold: false,
        cut: false,
    }
}
