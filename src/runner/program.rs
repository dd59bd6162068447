//! A program mqlab did not write as the consumer (the role contract), as
//! [`crate::faults::program`] follows it: its processes, the two proxies
//! that see it, the broker's queue and the transcript.

use super::*;
use crate::faults::program::{self, Program};

impl Ctx<'_> {
    /// A consume step run by the user's program: its delivery, commit and
    /// ack for each message are seen through the two proxies and written as
    /// `[observe]` lines; at the fault's window the black box freezes both
    /// connections and the program is killed, then started again. It is
    /// done once it acked `settle` distinct messages: then it gets SIGTERM.
    pub(super) async fn consume_program(
        &mut self,
        c: &Consume,
        command: &str,
        settle: usize,
        fault: Option<&Fault>,
        d: Deadline<'_>,
    ) -> Result<()> {
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
                k @ (OnConsume::Cut | OnConsume::Stall | OnConsume::Database(_)) => {
                    bail!(
                        "phase {}: {k:?} ({} of the {}) has no hook on a program's consume step",
                        d.phase,
                        f.action,
                        f.target
                    )
                }
            },
        };
        let (tx, seen) = mpsc::unbounded_channel();
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
        let mut step = ProgramStep {
            ctx: self,
            c,
            command,
            fault,
            d,
            bb,
            seen,
            pg_port: pg.port,
            proc: None,
        };
        let result = program::follow(&mut step, fault, settle).await;
        drop(step); // the last process, before the proxy stops watching
        self.proxy().watch(None);
        result?;
        self.await_consumers_gone(&c.queue, d.phase, d.at).await
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
        self.say_observed(&Observation {
            message: message.to_string(),
            queue: queue.to_string(),
            consumer: None,
            seen: transcript::Observed::Killed {
                exit_code: code,
                business_rows: rows,
            },
        });
        if let Some(f) = fault {
            self.assert(&f.asserts).await?;
        }
        Ok(())
    }
}

/// One consume step of a program, as [`program::follow`] sees it.
struct ProgramStep<'c, 'a> {
    ctx: &'c mut Ctx<'a>,
    c: &'c Consume,
    command: &'c str,
    fault: Option<&'c Fault>,
    d: Deadline<'c>,
    bb: Arc<Mutex<BlackBox>>,
    seen: mpsc::UnboundedReceiver<Seen>,
    /// The PostgreSQL proxy's port: the program's database.
    pg_port: u16,
    proc: Option<RoleProc>,
}

/// A program still running when the step ends (an error on the way: a
/// wait's deadline, a failed database read at the window) loses its whole
/// process group, as at the window, not only its first process (which its
/// handle's kill-on-drop would take).
impl Drop for ProgramStep<'_, '_> {
    fn drop(&mut self) {
        if let Some(pid) = self.proc.as_ref().and_then(|p| p.child.id()) {
            let _ = signal::killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

impl ProgramStep<'_, '_> {
    fn proc(&mut self) -> Result<&mut RoleProc> {
        self.proc.as_mut().context("no program running")
    }
}

impl Program for ProgramStep<'_, '_> {
    fn phase(&self) -> &str {
        self.d.phase
    }

    fn start(&mut self) -> Result<()> {
        let proc = self
            .ctx
            .spawn_program(self.c, self.command, self.pg_port, None)?;
        self.proc = Some(proc);
        Ok(())
    }

    fn restart(&mut self) -> Result<()> {
        self.bb.lock().expect("black box").reset();
        self.start()
    }

    async fn next(&mut self, settled: usize, settle: usize) -> Result<Seen> {
        let (d, phase) = (self.d, self.d.phase);
        let proc = self.proc.as_mut().context("no program running")?;
        tokio::select! {
            e = self.seen.recv() => e.context("the proxies stopped"),
            status = proc.child.wait() => {
                let code = exit_code(status?);
                let b = self.bb.lock().expect("black box");
                if let Some((why, true)) = b.refused() {
                    return Err(Failure::RoleExited.error(refused(phase, why, code)));
                }
                let also = refusal(b.refused());
                Err(Failure::RoleExited.error(format!(
                    "phase {phase}: the program exited with {code} after it settled {settled} of {settle} messages (acked, transaction ended){also}; last lines of its output:\n{}",
                    process::tail(&proc.log, 10)
                )))
            }
            _ = tokio::time::sleep_until(d.at.into()) => {
                process::kill_now(&mut proc.child);
                let b = self.bb.lock().expect("black box");
                if let Some((why, true)) = b.refused() {
                    return Err(Failure::Deadline.error(refused(phase, why, -1)));
                }
                let also = refusal(b.refused());
                let why = b.stuck().map(|w| format!(" {w};")).unwrap_or_default();
                Err(Failure::Deadline.error(format!(
                    "phase {phase} exceeded {} s: the program settled {settled} of {settle} messages (acked, transaction ended){also};{why} last lines of its output:\n{}",
                    d.secs,
                    process::tail(&proc.log, 10)
                )))
            }
        }
    }

    fn observe(&mut self, seen: &Seen) {
        self.ctx.observe(seen, &self.c.queue, None);
    }

    fn window(&self) -> (String, Option<String>) {
        let b = self.bb.lock().expect("black box");
        (b.window_name(), b.never_fired())
    }

    fn auto_ack(&self) -> bool {
        self.bb.lock().expect("black box").auto_ack()
    }

    fn kill_now(&mut self) {
        if let Some(proc) = self.proc.as_mut() {
            process::kill_now(&mut proc.child);
        }
    }

    async fn terminate(&mut self) -> Result<Vec<Seen>> {
        let proc = self.proc()?;
        process::stop(&mut proc.child, Signal::SIGTERM, Duration::from_secs(10)).await;
        let mut last = Vec::new();
        while let Ok(s) = self.seen.try_recv() {
            last.push(s);
        }
        Ok(last)
    }

    fn record_exit(&mut self) -> Result<()> {
        let code = match self.proc()?.child.try_wait()? {
            Some(status) => exit_code(status),
            None => -1,
        };
        self.ctx.log.observed.consumer_exit_code = Some(code);
        Ok(())
    }

    async fn await_depth(&mut self, depth: u32) -> Result<()> {
        let d = self.d;
        self.ctx
            .await_depth(&self.c.queue, depth, d.phase, d.at)
            .await
    }

    async fn kill_at_window(&mut self, message: &str) -> Result<()> {
        let mut proc = self.proc.take().context("no program to kill")?;
        let r = self
            .ctx
            .kill_program_at_window(&mut proc, message, &self.c.queue, self.fault)
            .await;
        self.proc = Some(proc);
        r
    }

    async fn await_consumers_gone(&mut self) -> Result<()> {
        let d = self.d;
        self.ctx
            .await_consumers_gone(&self.c.queue, d.phase, d.at)
            .await
    }

    async fn queue_ready(&mut self) -> Result<usize> {
        let (left, _) = self.ctx.conns().broker.queue_state(&self.c.queue).await?;
        Ok(left as usize)
    }
}

/// A refusal of something else (an ack of an unknown delivery tag, ...),
/// said beside the program's output.
fn refusal(refused: Option<(&str, bool)>) -> String {
    refused
        .map(|(why, _)| format!(", after the broker refused it ({why})"))
        .unwrap_or_default()
}

/// One line for a program that failed after the broker refused its
/// topology (its own declaration contradicting the lab's queue, a queue
/// the lab does not declare): the broker's words, and what to change.
/// `code`: its exit status, or -1 when it hung and was killed at the
/// deadline.
fn refused(phase: &str, why: &str, code: i32) -> String {
    let ended = match code {
        -1 => "hung until the deadline".to_string(),
        c => format!("exited with {c}"),
    };
    format!(
        "phase {phase}: the broker refused the program ({why}) and the program {ended}: the lab declares the topology the program meets, so declare it in the lab file as the program does (or let the program find it as declared)"
    )
}
