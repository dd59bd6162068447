//! A consume step with several instances of the built-in consumer, or of a
//! program seen as a black box, as the rendezvous
//! ([`crate::faults::rendezvous`]) sequences them.

use super::*;
use crate::failure::Failure;
use crate::faults::rendezvous::{Crowd, Seen as CrowdSeen};

impl Ctx<'_> {
    /// The step's instances under its rendezvous fault, then its assertions.
    #[deny(
        clippy::wildcard_enum_match_arm,
        clippy::match_wildcard_for_single_variants
    )] // a kind without its hook must not compile
    pub(super) async fn consume_crowd(
        &mut self,
        c: &Consume,
        f: &Fault,
        kind: OnConsume,
        settle: usize,
        d: Deadline<'_>,
    ) -> Result<()> {
        let db = store::connect(&self.links.endpoints.pg_url(&self.database)).await?;
        let mut crowd = Instances {
            ctx: self,
            c,
            f,
            kind,
            settle,
            d,
            procs: Vec::new(),
            db,
        };
        let result = match kind {
            OnConsume::Stall => crate::faults::stall::run(&mut crowd, f, settle).await,
            OnConsume::Rendezvous => crate::faults::rendezvous::run(&mut crowd, f, settle).await,
            OnConsume::ConsumerKill | OnConsume::Cut | OnConsume::Database(_) => {
                bail!("{kind:?} is no crowd's fault")
            }
        };
        let procs = std::mem::take(&mut crowd.procs);
        for mut p in procs {
            // On an error: a stopped instance is killed, not left behind.
            process::kill_now(&mut p.child);
        }
        result?;
        self.await_consumers_gone(&c.queue, d.phase, d.at).await?;
        self.assert(&f.asserts).await
    }
}

/// The instances of one consume step and the connection that sees which
/// sessions wait on a lock.
struct Instances<'c, 'a> {
    ctx: &'c mut Ctx<'a>,
    c: &'c Consume,
    f: &'c Fault,
    kind: OnConsume,
    settle: usize,
    d: Deadline<'c>,
    procs: Vec<RoleProc>,
    db: PgConnection,
}

impl Instances<'_, '_> {
    /// An instance's line, in the transcript and as the rendezvous reads it.
    fn line(&mut self, line: &str) -> CrowdSeen {
        self.ctx.emit(Role::Consumer, line);
        let entry = Entry::parse(&format!("[{}] {line}", Role::Consumer));
        let field = |k| entry.as_ref().and_then(|e| e.get(k));
        let status: Option<Status> = field("status").and_then(|s| s.parse().ok());
        let Some(m) = field("messageId").map(str::to_string) else {
            return CrowdSeen::Other;
        };
        match status {
            Some(Status::AtRendezvous) => CrowdSeen::AtWindow(m),
            Some(Status::Received) => CrowdSeen::Received(m),
            Some(s) if settles(s) => CrowdSeen::Settled(m),
            _ => CrowdSeen::Other,
        }
    }

    fn pid(&self, i: usize) -> Result<Pid> {
        let pid = self.procs[i]
            .child
            .id()
            .with_context(|| format!("consumer-{} is gone", i + 1))?;
        Ok(Pid::from_raw(pid as i32))
    }
}

/// A line status that ends a message's turn with the built-in consumer.
fn settles(s: Status) -> bool {
    matches!(
        s,
        Status::BusinessCommitted
            | Status::DuplicateSkipped
            | Status::BusinessRejected
            | Status::MovedToDlq
            | Status::PoisonToDlq
            | Status::Rejected
            | Status::RetryScheduled
    )
}

/// Sessions of the lab's database waiting for a lock another one holds.
async fn lock_waits(db: &mut PgConnection) -> Result<i64> {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_one(db)
    .await?;
    Ok(n)
}

impl Crowd for Instances<'_, '_> {
    fn say(&mut self, fault: &FaultEvent) {
        crate::faults::Harness::say(&mut *self.ctx, fault);
    }

    async fn start(&mut self) -> Result<()> {
        let mut cfg = self.ctx.consumer_config(self.c, self.settle, None);
        cfg.consumer = format!("consumer-{}", self.procs.len() + 1);
        cfg.until_stopped = true;
        // A stall holds its first instance only.
        let holds = match self.kind == OnConsume::Stall && !self.procs.is_empty() {
            true => &[][..],
            false => &self.f.copies[..],
        };
        cfg.faults = holds
            .iter()
            .map(|m| FaultPoint {
                window: self.f.window,
                message: m.clone(),
                hold: true,
                cut: false,
            })
            .collect();
        let proc = self.ctx.spawn_role(RoleConfig::Consumer(cfg))?;
        self.procs.push(proc);
        Ok(())
    }

    /// A line is waited for 20 ms at a time (reading a line is cancel-safe;
    /// a query is not), and between two waits the lock query runs.
    async fn watch(&mut self, i: usize, locks: Option<usize>) -> Result<CrowdSeen> {
        loop {
            let wait = Duration::from_millis(20);
            let next = self.ctx.next_line(&mut self.procs[i], self.d);
            match tokio::time::timeout(wait, next).await {
                Ok(Ok(Some(line))) => return Ok(self.line(&line)),
                Ok(Ok(None)) => {
                    let code = self.ctx.wait_exit(&mut self.procs[i], self.d).await?;
                    return Ok(CrowdSeen::Exited(code));
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => {}
            }
            if let Some(known) = locks {
                if lock_waits(&mut self.db).await? > known as i64 {
                    return Ok(CrowdSeen::LockWait);
                }
            }
        }
    }

    async fn stopped(&mut self, i: usize) -> Result<()> {
        let pid = self.pid(i)?;
        process::await_stopped(pid.as_raw() as u32, Duration::from_secs(10)).await
    }

    /// Once it is stopped, nothing more is written: what it wrote before
    /// is in the pipe, ready at once, and a read that waits 100 ms for more
    /// has read it all.
    async fn stop(&mut self, i: usize) -> Result<Vec<CrowdSeen>> {
        signal::kill(self.pid(i)?, Signal::SIGSTOP)?;
        self.stopped(i).await?;
        let mut seen = Vec::new();
        loop {
            let next = self.ctx.next_line(&mut self.procs[i], self.d);
            match tokio::time::timeout(Duration::from_millis(100), next).await {
                Ok(Ok(Some(line))) => seen.push(self.line(&line)),
                Ok(Ok(None)) | Err(_) => return Ok(seen),
                Ok(Err(e)) => return Err(e),
            }
        }
    }

    fn resume(&mut self, i: usize) -> Result<()> {
        signal::kill(self.pid(i)?, Signal::SIGCONT)?;
        Ok(())
    }

    async fn finish(&mut self) -> Result<()> {
        for i in 0..self.procs.len() {
            // The first left is instance i.
            signal::kill(self.pid(0)?, Signal::SIGTERM)?;
            let mut proc = self.procs.remove(0);
            self.ctx
                .follow(&mut proc, Role::Consumer, self.d, None)
                .await?;
            let code = self.ctx.wait_exit(&mut proc, self.d).await?;
            if code != 0 {
                tracing::warn!(
                    "consumer-{} exited with {code}: {}",
                    i + 1,
                    process::tail(&proc.log, 10)
                );
            }
            let worst = self.ctx.log.observed.consumer_exit_code.unwrap_or(0);
            self.ctx.log.observed.consumer_exit_code = Some(if code != 0 { code } else { worst });
        }
        Ok(())
    }
}

impl Ctx<'_> {
    /// The step's program instances under its rendezvous fault, each behind
    /// proxies of its own, then the fault's assertions.
    pub(super) async fn consume_programs(
        &mut self,
        c: &Consume,
        command: &str,
        f: &Fault,
        settle: usize,
        d: Deadline<'_>,
    ) -> Result<()> {
        let db = store::connect(&self.links.endpoints.pg_url(&self.database)).await?;
        let mut crowd = Programs {
            ctx: self,
            c,
            command,
            f,
            d,
            instances: Vec::new(),
            db,
        };
        let result = crate::faults::rendezvous::run(&mut crowd, f, settle).await;
        for mut p in std::mem::take(&mut crowd.instances) {
            process::kill_now(&mut p.proc.child);
        }
        result?;
        self.await_consumers_gone(&c.queue, d.phase, d.at).await?;
        self.assert(&f.asserts).await
    }
}

/// One instance of a program: its process, and the black box its own two
/// proxies report to (dropping the proxies stops them).
struct Program {
    proc: RoleProc,
    bb: Arc<Mutex<BlackBox>>,
    seen: mpsc::UnboundedReceiver<Seen>,
    _amqp: Proxy,
    _pg: PgProxy,
}

/// The program instances of one consume step.
struct Programs<'c, 'a> {
    ctx: &'c mut Ctx<'a>,
    c: &'c Consume,
    command: &'c str,
    f: &'c Fault,
    d: Deadline<'c>,
    instances: Vec<Program>,
    db: PgConnection,
}

impl Programs<'_, '_> {
    /// What instance i's proxies saw, in the transcript and as the
    /// rendezvous reads it.
    fn seen(&mut self, i: usize, seen: Seen) -> CrowdSeen {
        let name = format!("consumer-{}", i + 1);
        self.ctx.observe(&seen, &self.c.queue, Some(&name));
        match seen {
            Seen::Delivered { message, .. } => CrowdSeen::Received(message),
            Seen::Fire { message } => CrowdSeen::AtWindow(message),
            Seen::Settled { message } => CrowdSeen::Settled(message),
            _ => CrowdSeen::Other,
        }
    }
}

impl Crowd for Programs<'_, '_> {
    fn say(&mut self, fault: &FaultEvent) {
        crate::faults::Harness::say(&mut *self.ctx, fault);
    }

    async fn start(&mut self) -> Result<()> {
        let (tx, seen) = mpsc::unbounded_channel();
        let bb = Arc::new(Mutex::new(BlackBox::new(tx)));
        bb.lock()
            .expect("black box")
            .arm_rendezvous(self.f.window, &self.f.copies, self.f.commit);
        let upstream = format!(
            "{}:{}",
            self.ctx.links.endpoints.pg_host, self.ctx.links.endpoints.pg_port
        )
        .parse()
        .context("the database's address")?;
        let pg = PgProxy::start(upstream, bb.clone()).await?;
        let amqp = self.ctx.proxy().sibling().await?;
        amqp.watch(Some(bb.clone()));
        let proc = self
            .ctx
            .spawn_program(self.c, self.command, pg.port, Some(&amqp))?;
        self.instances.push(Program {
            proc,
            bb,
            seen,
            _amqp: amqp,
            _pg: pg,
        });
        Ok(())
    }

    /// What the proxies saw first; between two 20 ms waits the lock query
    /// runs (receiving is cancel-safe, a query is not).
    async fn watch(&mut self, i: usize, locks: Option<usize>) -> Result<CrowdSeen> {
        enum Next {
            Seen(Option<Seen>),
            Exit(std::io::Result<std::process::ExitStatus>),
            Tick,
            Late,
        }
        loop {
            let p = &mut self.instances[i];
            let next = tokio::select! {
                biased;
                s = p.seen.recv() => Next::Seen(s),
                status = p.proc.child.wait() => Next::Exit(status),
                _ = tokio::time::sleep_until(self.d.at.into()) => Next::Late,
                _ = tokio::time::sleep(Duration::from_millis(20)) => Next::Tick,
            };
            match next {
                Next::Seen(Some(s)) => return Ok(self.seen(i, s)),
                Next::Seen(None) => bail!("the proxies of consumer-{} stopped", i + 1),
                Next::Exit(status) => return Ok(CrowdSeen::Exited(exit_code(status?))),
                Next::Late => return Err(Failure::Deadline.error(format!(
                    "phase {} exceeded {} s: consumer-{} did not get to the rendezvous at {}; last lines of its output:\n{}",
                    self.d.phase,
                    self.d.secs,
                    i + 1,
                    self.f.message,
                    process::tail(&p.proc.log, 10)
                ))),
                Next::Tick => {}
            }
            if let Some(known) = locks {
                if lock_waits(&mut self.db).await? > known as i64 {
                    return Ok(CrowdSeen::LockWait);
                }
            }
        }
    }

    /// The black box paused the connection at the window itself.
    async fn stopped(&mut self, _i: usize) -> Result<()> {
        Ok(())
    }

    /// Its database connection paused: the answer to the statement that
    /// waits is held when it comes. What the proxies saw before is ready.
    async fn stop(&mut self, i: usize) -> Result<Vec<CrowdSeen>> {
        self.instances[i].bb.lock().expect("black box").pause();
        let mut out = Vec::new();
        while let Ok(s) = self.instances[i].seen.try_recv() {
            out.push(self.seen(i, s));
        }
        Ok(out)
    }

    fn resume(&mut self, i: usize) -> Result<()> {
        self.instances[i].bb.lock().expect("black box").resume();
        Ok(())
    }

    async fn finish(&mut self) -> Result<()> {
        for i in 0..self.instances.len() {
            let p = &mut self.instances[i];
            process::stop(&mut p.proc.child, Signal::SIGTERM, Duration::from_secs(10)).await;
            let code = match p.proc.child.try_wait()? {
                Some(status) => exit_code(status),
                None => -1,
            };
            if code != 0 {
                tracing::warn!(
                    "consumer-{} exited with {code}: {}",
                    i + 1,
                    process::tail(&p.proc.log, 10)
                );
            }
            let worst = self.ctx.log.observed.consumer_exit_code.unwrap_or(0);
            self.ctx.log.observed.consumer_exit_code = Some(if code != 0 { code } else { worst });
        }
        Ok(())
    }
}
