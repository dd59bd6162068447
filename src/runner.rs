//! Executes a lab's steps in order on a running environment. The only place
//! that knows about phases and faults: it spawns the roles, reads their lines
//! into the transcript, kills at the selected window, reads broker and
//! database state, and evaluates the assertions.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use lapin::Channel;
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use sqlx::PgConnection;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use crate::checker::{self, LabVerdict, Observed, Outcome};
use crate::env::{process, Endpoints};
use crate::lab::{Action, Assertion, Consume, Lab, Publish};
use crate::roles::consumer::{ConsumerConfig, FaultPoint, CRASH_MARKER};
use crate::roles::producer::ProducerConfig;
use crate::store;
use crate::transcript::{Entry, Record, Role, Transcript};

/// Receives what happens, as it happens: the terminal is one sink; others
/// (evidence, JUnit) can be added without touching the runner.
pub trait Sink {
    fn phase(&mut self, lab: &str, phase: &str);
    fn line(&mut self, line: &str);
}

pub struct LabRun {
    pub transcript: Transcript,
    /// Every assertion and check evaluated, in order.
    pub outcomes: Vec<Outcome>,
    /// A harness-level failure (deadline, role crash) that ended the lab early.
    pub error: Option<String>,
    pub verdict: LabVerdict,
    pub duration: Duration,
}

impl LabRun {
    /// The safe pattern held, or the counterexample showed exactly its violations.
    pub fn passed(&self) -> bool {
        matches!(
            self.verdict,
            LabVerdict::Holds | LabVerdict::CounterexampleConfirmed
        )
    }
}

/// The isolated names a lab run gets on the shared servers.
pub fn vhost_for(run: &str) -> String {
    run.to_string()
}

pub fn database_for(lab: &str) -> String {
    format!("lab_{}", lab.replace(['-', '.', '@'], "_"))
}

struct Ctx<'a> {
    lab: &'a Lab,
    endpoints: &'a Endpoints,
    exe: &'a Path,
    logs: PathBuf,
    run: String,
    conn: &'a lapin::Connection,
    channel: Channel,
    db: PgConnection,
    transcript: Transcript,
    observed: Observed,
    outcomes: Vec<Outcome>,
    sink: &'a mut dyn Sink,
    role_seq: usize,
}

/// Runs one lab; role logs go under `run_dir/roles/<run>/`.
pub async fn run_lab(
    lab: &Lab,
    endpoints: &Endpoints,
    exe: &Path,
    run_dir: &Path,
    sink: &mut dyn Sink,
) -> Result<LabRun> {
    let started = Instant::now();
    sink.phase(&lab.name, "prepare");
    let run = lab.run_name();
    let db_name = database_for(&run);
    let mut admin = store::connect(&endpoints.pg_url("postgres")).await?;
    store::create_database(&mut admin, &db_name).await?;
    drop(admin);
    let mut db = store::connect(&endpoints.pg_url(&db_name)).await?;
    store::migrate(&mut db).await?;
    let conn = crate::amqp::connect(&endpoints.amqp_url(&vhost_for(&run))).await?;
    let channel = conn.create_channel().await?;
    crate::amqp::declare(&channel, &lab.exchanges, &lab.queues).await?;
    let logs = run_dir.join("roles").join(&run);
    std::fs::create_dir_all(&logs)?;

    let mut ctx = Ctx {
        lab,
        endpoints,
        exe,
        logs,
        run,
        conn: &conn,
        channel,
        db,
        transcript: Transcript::default(),
        observed: Observed::default(),
        outcomes: Vec::new(),
        sink,
        role_seq: 0,
    };
    let error = ctx.run_steps().await.err().map(|e| format!("{e:#}"));
    let verdict = match &error {
        Some(e) => LabVerdict::Failed(e.clone()),
        None => checker::lab_verdict(&ctx.outcomes, lab.variant.as_ref().map(|_| &lab.violations)),
    };
    let (transcript, outcomes) = (ctx.transcript, ctx.outcomes);
    let _ = conn.close(200, "done".into()).await;
    Ok(LabRun {
        transcript,
        outcomes,
        error,
        verdict,
        duration: started.elapsed(),
    })
}

/// A role process with its stdout lines.
struct RoleProc {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    log: PathBuf,
}

impl Ctx<'_> {
    /// The steps in order, each followed by its assertions, then the checks;
    /// the first harness error ends the lab.
    async fn run_steps(&mut self) -> Result<()> {
        let lab = self.lab;
        for step in &lab.steps {
            let phase = step.action.phase();
            self.sink.phase(&lab.name, &phase);
            failpoint(&phase);
            match &step.action {
                Action::Publish(p) => self.publish(p).await?,
                Action::Consume(c) => self.consume(c, step.fault.as_ref()).await?,
                Action::Inspect(fields) => self.inspect(fields).await?,
            }
            self.assert(&step.asserts).await?;
        }
        self.check().await
    }

    fn emit(&mut self, role: Role, body: &str) {
        let line = self.transcript.push(role, body).to_string();
        self.sink.line(&line);
    }

    fn spawn_role(&mut self, role: &str, config: String) -> Result<RoleProc> {
        self.role_seq += 1;
        let log = self.logs.join(format!("{}-{role}.log", self.role_seq));
        let mut cmd = Command::new(self.exe);
        cmd.args(["role", role, "--config", &config])
            .env("RUST_LOG", "warn");
        let mut child = process::spawn(&mut cmd, &log, true)?;
        let stdout = child.stdout.take().context("role stdout")?;
        Ok(RoleProc {
            child,
            lines: BufReader::new(stdout).lines(),
            log,
        })
    }

    /// The next stdout line of a role, or None at its exit; a deadline overrun
    /// kills it and names the phase.
    async fn next_line(
        &self,
        p: &mut RoleProc,
        phase: &str,
        deadline: Instant,
        secs: u64,
    ) -> Result<Option<String>> {
        match tokio::time::timeout_at(deadline.into(), p.lines.next_line()).await {
            Ok(line) => Ok(line?),
            Err(_) => {
                process::kill_now(&mut p.child);
                bail!(
                    "phase {phase} exceeded {secs} s; last lines of the role's log:\n{}",
                    process::tail(&p.log, 10)
                )
            }
        }
    }

    async fn wait_exit(
        &self,
        p: &mut RoleProc,
        phase: &str,
        deadline: Instant,
        secs: u64,
    ) -> Result<i32> {
        match tokio::time::timeout_at(deadline.into(), p.child.wait()).await {
            Ok(status) => Ok(exit_code(status?)),
            Err(_) => {
                process::kill_now(&mut p.child);
                bail!("phase {phase} exceeded {secs} s waiting for the role to exit")
            }
        }
    }

    async fn publish(&mut self, p: &Publish) -> Result<()> {
        let cfg = ProducerConfig {
            lab: self.lab.name.clone(),
            amqp_url: self.endpoints.amqp_url(&vhost_for(&self.run)),
            exchange: p.exchange.clone(),
            destination: p.destination().to_string(),
            messages: p.messages.clone(),
        };
        let phase = format!("publish({})", p.destination());
        let secs = p.deadline_secs;
        let deadline = Instant::now() + Duration::from_secs(secs);
        let mut proc = self.spawn_role("producer", serde_json::to_string(&cfg)?)?;
        while let Some(line) = self.next_line(&mut proc, &phase, deadline, secs).await? {
            self.emit(Role::Producer, &line);
        }
        let code = self.wait_exit(&mut proc, &phase, deadline, secs).await?;
        if code != 0 {
            bail!(
                "the producer exited with {code}; last lines of its log:\n{}",
                process::tail(&proc.log, 10)
            );
        }
        Ok(())
    }

    async fn consume(&mut self, c: &Consume, fault: Option<&crate::lab::Fault>) -> Result<()> {
        let phase = format!("consume({})", c.queue);
        let deadline = Instant::now() + Duration::from_secs(c.deadline_secs);
        let (amqp_url, database_url) = (
            self.endpoints.amqp_url(&vhost_for(&self.run)),
            self.endpoints.pg_url(&database_for(&self.run)),
        );
        let lab_name = self.lab.name.clone();
        let config = |fault: Option<FaultPoint>| ConsumerConfig {
            lab: lab_name.clone(),
            amqp_url: amqp_url.clone(),
            database_url: database_url.clone(),
            queue: c.queue.clone(),
            consumer: "consumer-1".into(),
            inbox_name: format!("{}:{}", crate::transcript::SERVICE, c.queue),
            pattern: c.pattern,
            prefetch: c.prefetch,
            settle: c.settle,
            max_deliveries: c.max_deliveries,
            retry: c.retry.clone(),
            fault,
        };
        if let Some(f) = fault {
            let cfg = config(Some(FaultPoint {
                window: f.window,
                message: f.message.clone(),
            }));
            let mut proc = self.spawn_role("consumer", serde_json::to_string(&cfg)?)?;
            let mut marked = false;
            while let Some(line) = self
                .next_line(&mut proc, &phase, deadline, c.deadline_secs)
                .await?
            {
                self.emit(Role::Consumer, &line);
                if Entry::parse(&format!("[consumer] {line}"))
                    .is_some_and(|e| e.is("consumer", CRASH_MARKER))
                {
                    marked = true;
                    break;
                }
            }
            if !marked {
                let code = self
                    .wait_exit(&mut proc, &phase, deadline, c.deadline_secs)
                    .await?;
                bail!(
                    "the consumer exited with {code} before reaching window `{:?}` for {}; last lines of its log:\n{}",
                    f.window,
                    f.message,
                    process::tail(&proc.log, 10)
                );
            }
            if let Some(depth) = f.kill_at_depth {
                self.await_depth(&c.queue, depth, &phase, deadline).await?;
            }
            // Ground truth at the moment of the kill, before anything can change it.
            self.observed.crash_business_rows =
                Some(store::business_rows_for(&mut self.db, &f.message).await?);
            let pid = proc.child.id().context("consumer already reaped")?;
            signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL)?;
            let code = self
                .wait_exit(&mut proc, &phase, deadline, c.deadline_secs)
                .await?;
            while let Some(line) = self
                .next_line(&mut proc, &phase, deadline, c.deadline_secs)
                .await?
            {
                self.emit(Role::Consumer, &line);
            }
            self.observed.crash_exit_code = Some(code);
            self.assert(&f.asserts).await?;
            self.await_consumers_gone(&c.queue, &phase, deadline)
                .await?;
        }
        let mut cfg = config(None);
        if let Some(n) = fault.and_then(|f| f.restart_settle) {
            cfg.settle = n;
        }
        let mut proc = self.spawn_role("consumer", serde_json::to_string(&cfg)?)?;
        while let Some(line) = self
            .next_line(&mut proc, &phase, deadline, c.deadline_secs)
            .await?
        {
            self.emit(Role::Consumer, &line);
        }
        let code = self
            .wait_exit(&mut proc, &phase, deadline, c.deadline_secs)
            .await?;
        self.observed.consumer_exit_code = Some(code);
        if code != 0 {
            tracing::warn!(
                "consumer exited with {code}: {}",
                process::tail(&proc.log, 10)
            );
        }
        Ok(())
    }

    /// After a kill the broker requeues the dead channel's unacked messages
    /// when it removes its consumer; a new consumer started before that would
    /// see them out of order.
    async fn await_consumers_gone(
        &self,
        queue: &str,
        phase: &str,
        deadline: Instant,
    ) -> Result<()> {
        loop {
            let (_, consumers) = crate::amqp::queue_state(&self.channel, queue).await?;
            if consumers == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "phase {phase}: the broker still lists a consumer on `{queue}` after the kill"
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn await_depth(
        &self,
        queue: &str,
        depth: u32,
        phase: &str,
        deadline: Instant,
    ) -> Result<()> {
        loop {
            let (ready, _) = crate::amqp::queue_state(&self.channel, queue).await?;
            if ready == depth {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("phase {phase}: `{queue}` holds {ready} ready messages, not {depth}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The total-queue checks, from ground truth read now: `[check]` lines.
    async fn check(&mut self) -> Result<()> {
        let ground = store::read_ground(&mut self.db).await?;
        let mut queued = std::collections::BTreeSet::new();
        for q in &self.lab.queues {
            queued.extend(crate::amqp::peek_message_ids(self.conn, &q.name).await?);
        }
        let entries = self.transcript.entries();
        for (name, value) in checker::total_queue(&entries, &ground, &queued) {
            let (body, pass) = checker::assert_line(name, "0", &Ok(value.to_string()));
            self.emit(Role::Check, &body);
            self.outcomes.push(Outcome {
                kind: "check",
                name: name.to_string(),
                expected: "0".into(),
                actual: value.to_string(),
                pass,
            });
        }
        Ok(())
    }

    async fn inspect(&mut self, fields: &[String]) -> Result<()> {
        let ground = store::read_ground(&mut self.db).await?;
        let mut r = Record::new(&self.lab.name);
        for f in fields {
            r = r.with(f, ground.field(f));
        }
        self.emit(Role::Inspect, &r.status("snapshot"));
        Ok(())
    }

    /// Re-reads the broker and PostgreSQL, then evaluates: every value comes
    /// from an observation taken now.
    async fn assert(&mut self, asserts: &[Assertion]) -> Result<()> {
        if asserts.is_empty() {
            return Ok(());
        }
        self.observed.ground = store::read_ground(&mut self.db).await?;
        for q in &self.lab.queues {
            let (ready, _) = crate::amqp::queue_state(&self.channel, &q.name)
                .await
                .map_err(|e| anyhow!("{e:#}"))?;
            self.observed.depths.insert(q.name.clone(), ready);
        }
        let entries = self.transcript.entries();
        for a in asserts {
            let value = checker::evaluate(&a.counter, &entries, &self.observed);
            let (body, pass) = checker::assert_line(&a.name, &a.expected, &value);
            self.emit(Role::Assert, &body);
            self.outcomes.push(Outcome {
                kind: "assert",
                name: a.name.clone(),
                expected: a.expected.clone(),
                actual: value.unwrap_or_else(|_| "unknown".into()),
                pass,
            });
        }
        Ok(())
    }
}

/// A named point where the harness itself can be made to panic
/// (`MQLAB_PANIC_AT=<phase>`), so that the tests can show a panicking harness
/// leaves nothing behind.
fn failpoint(phase: &str) {
    if std::env::var("MQLAB_PANIC_AT").is_ok_and(|p| p == phase) {
        panic!("failpoint MQLAB_PANIC_AT={phase}");
    }
}

/// 128 + signal for a killed process, as a shell reports it.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}
