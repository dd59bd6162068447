//! `mqlab soak`: a stream of messages through competing consumers while the
//! harness kills them at random windows (and, if asked, restarts the
//! broker), reproducible from a seed; a share of the events is sent twice,
//! back to back, so that two consumers can process copies of one event at
//! the same moment (article 002's check-then-insert race, which only a
//! unique constraint in the same transaction survives). It ends with the
//! total-queue check and throughput figures, side by side with a plain
//! auto-ack consumer without faults on the same broker.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

use crate::checker::{total_queue, Events, Owed, Queued};
use crate::env::{process, Environment};
use crate::lab::{Consume, Message, Publish, Settle as LabSettle};
use crate::protocol::{ConsumerConfig, FaultPoint, OutMessage, RoleConfig};
use crate::runner::RoleSite;
use crate::store;
use crate::transcript::{Entry, MessageMeta};
use crate::vocab::{Check, FaultAction, Pattern, QueueDecl, Role, Status, Topology, Window};

/// What a soak is asked to do.
#[derive(Clone, Debug)]
pub struct Plan {
    pub messages: usize,
    pub consumers: usize,
    /// About how many consumer kills over the run.
    pub kills: usize,
    /// The share of events sent twice, back to back.
    pub resend_share: f64,
    pub broker_restarts: usize,
    pub seed: u64,
    pub pattern: Pattern,
    /// Measure a plain auto-ack consumer without faults too.
    pub baseline: bool,
}

/// What a soak found.
#[derive(Clone, Debug)]
pub struct Report {
    pub published: usize,
    pub kills: usize,
    pub broker_restarts: usize,
    pub checks: Vec<(Check, usize)>,
    pub consume_secs: f64,
    pub baseline_secs: Option<f64>,
}

impl Report {
    pub fn holds(&self) -> bool {
        self.checks.iter().all(|(_, n)| *n == 0)
    }

    /// What `mqlab soak` prints: the run, its checks, the throughput beside
    /// the auto-ack baseline's.
    pub fn lines(&self, plan: &Plan) -> Vec<String> {
        let mut out = vec![format!(
            "soak: {} messages ({} events, {} sent twice), {} consumers, pattern {}, {} kills, {} broker restarts, seed {}",
            self.published,
            plan.messages,
            self.published - plan.messages,
            plan.consumers,
            plan.pattern,
            self.kills,
            self.broker_restarts,
            plan.seed
        )];
        for (check, n) in &self.checks {
            out.push(format!(
                "[check] {check}={n} {}",
                if *n == 0 { "PASS" } else { "FAIL" }
            ));
        }
        out.push(format!(
            "{} consumers ({}, with the kills): {:.0} messages/s ({:.2} ms per message, {:.1} s)",
            plan.pattern,
            plan.consumers,
            self.rate(),
            1000.0 / self.rate(),
            self.consume_secs
        ));
        if let (Some(rate), Some(secs)) = (self.baseline_rate(), self.baseline_secs) {
            out.push(format!(
                "auto-ack consumers ({}, no faults): {rate:.0} messages/s ({:.2} ms per message, {secs:.1} s); ratio {:.2}",
                plan.consumers,
                1000.0 / rate,
                self.rate() / rate
            ));
        }
        out
    }

    pub fn rate(&self) -> f64 {
        self.published as f64 / self.consume_secs
    }

    pub fn baseline_rate(&self) -> Option<f64> {
        self.baseline_secs.map(|s| self.published as f64 / s)
    }
}

/// A reproducible stream of numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// True with probability `p`.
    fn chance(&mut self, p: f64) -> bool {
        (self.next() % 1_000_000) as f64 / 1_000_000.0 < p
    }
}

/// The messages: `messages` events, a share of them followed at once by a
/// copy (the same eventId, a message id of its own).
pub fn stream(plan: &Plan) -> Vec<OutMessage> {
    let mut rng = Rng(plan.seed | 1);
    let mut out = Vec::new();
    let mut n = 0;
    for i in 0..plan.messages {
        let copies = if rng.chance(plan.resend_share) { 2 } else { 1 };
        for _ in 0..copies {
            n += 1;
            let body = serde_json::json!({
                "eventId": format!("soak-{i:07}"),
                "eventType": "order.created",
                "schemaVersion": 1,
                "orderId": format!("order-{i}"),
                "customerId": "C1",
                "amount": 10.0,
                "currency": "CNY",
            });
            out.push(OutMessage {
                meta: MessageMeta {
                    message_id: format!("mid-{n}"),
                    event_type: "order.created".into(),
                    schema_version: "1".into(),
                    aggregate_id: format!("order-{i}"),
                    trace_id: format!("trace-{n}"),
                    correlation_id: format!("order-{i}"),
                },
                routing_key: String::new(),
                body: body.to_string(),
                expiration_ms: None,
            });
        }
    }
    out
}

/// The soak's two queues, durable, on the default exchange.
fn topology() -> Topology {
    Topology {
        exchanges: Vec::new(),
        queues: [QUEUE, BASELINE_QUEUE]
            .iter()
            .map(|q| QueueDecl {
                name: q.to_string(),
                durable: true,
                arguments: Default::default(),
                bindings: Vec::new(),
                later: false,
            })
            .collect(),
    }
}

/// The soak restarts the broker through the broker family's sequence, as a
/// lab's `broker = "restart"` step does; its `[fault]` lines go to the
/// terminal's progress line.
impl crate::faults::Harness for Soak<'_> {
    /// The soak runs on the environment's broker.
    fn say(&mut self, fault: &crate::transcript::FaultEvent) {
        (self.progress)(&fault.line(self.env.endpoints().broker.broker, "soak"));
    }

    fn env(&mut self) -> Result<&mut (dyn Environment + 'static)> {
        Ok(&mut *self.env)
    }

    /// The soak holds no connection between its checks: after a restart it
    /// declares its queues again, as the runner does.
    async fn reconnect_harness(&mut self, _restarted: bool) -> Result<()> {
        let broker = crate::broker::admin(&self.env.endpoints().broker_url(&self.vhost)).await?;
        broker.declare(&topology()).await?;
        broker.close("done").await;
        Ok(())
    }
}

/// A role process and its lines.
struct Proc {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

pub struct Soak<'a> {
    pub env: &'a mut (dyn Environment + 'static),
    pub exe: PathBuf,
    pub logs: PathBuf,
    pub vhost: String,
    pub database: String,
    pub progress: &'a dyn Fn(&str),
}

const QUEUE: &str = "orders.soak";
const BASELINE_QUEUE: &str = "orders.soak.baseline";
const SERVICE: &str = "inventory-service";

impl Soak<'_> {
    fn spawn(&self, n: usize, config: RoleConfig) -> Result<Proc> {
        let (child, stdout, _) = crate::protocol::spawn_role(&self.exe, &self.logs, n, config)?;
        Ok(Proc {
            child,
            lines: BufReader::new(stdout).lines(),
        })
    }

    /// Where the soak's roles run: the lab `soak` on the environment's broker.
    fn site(&self) -> RoleSite<'static> {
        let e = self.env.endpoints();
        RoleSite {
            lab: "soak",
            broker: e.broker.broker,
            broker_url: e.broker_url(&self.vhost),
            database_url: e.pg_url(&self.database),
        }
    }

    /// The built-in consumer on `queue`, through the runner's role code: a
    /// consume step that settles until stopped.
    fn consumer_config(
        &self,
        queue: &str,
        pattern: Pattern,
        faults: Vec<FaultPoint>,
    ) -> ConsumerConfig {
        let step = Consume {
            queue: queue.into(),
            service: SERVICE.into(),
            pattern,
            command: None,
            commits_first: false,
            prefetch: 1,
            settle: LabSettle::Drain,
            max_deliveries: None,
            retry: None,
            deadline_secs: 0,
            transient_failures: Default::default(),
            node: 1,
            instances: 1,
            downstream: None,
        };
        crate::runner::consumer_config(&self.site(), &step, usize::MAX, faults)
    }

    /// Publishes every message to `queue` with confirms (a backlog).
    async fn publish(
        &self,
        n: usize,
        messages: &[OutMessage],
        queue: &str,
        lines: &mut Vec<Entry>,
    ) -> Result<()> {
        // A publish step through the runner's role code: every message to
        // `queue` on the default exchange, persistent, confirmed, resent
        // until confirmed.
        let step = Publish {
            exchange: String::new(),
            messages: messages
                .iter()
                .map(|m| Message {
                    meta: m.meta.clone(),
                    routing_key: queue.into(),
                    fixture: String::new(),
                    body: m.body.clone(),
                    expiration_ms: m.expiration_ms,
                })
                .collect(),
            deadline_secs: 0,
            confirm: true,
            mandatory: false,
            persistent: true,
            timestamp: true,
            park: None,
            confirm_timeout_ms: None,
            resend: true,
            batch: None,
            flush: true,
            node: 1,
            orders: None,
            reconcile: false,
            relay: false,
        };
        let journal = self.logs.join(format!("{queue}.journal"));
        let cfg = crate::runner::producer_config(&self.site(), &step, journal, Vec::new());
        let mut p = self.spawn(n, RoleConfig::Producer(cfg))?;
        while let Some(line) = p.lines.next_line().await? {
            if let Some(e) = Entry::parse(&format!("[producer] {line}")) {
                lines.push(e);
            }
        }
        let status = p.child.wait().await?;
        if !status.success() {
            bail!("the producer failed ({status})");
        }
        Ok(())
    }

    /// Runs the soak: a backlog, then competing consumers killed at random
    /// windows until every message is settled, then the checks.
    pub async fn run(&mut self, plan: &Plan) -> Result<Report> {
        let mut db = self.prepare(plan.broker_restarts > 0).await?;
        let messages = stream(plan);
        let events = Events(
            messages
                .iter()
                .map(|m| {
                    (
                        m.meta.message_id.clone(),
                        store::event_id(m.body.as_bytes(), &m.meta.message_id),
                    )
                })
                .collect(),
        );
        let mut lines: Vec<Entry> = Vec::new();
        (self.progress)(&format!("publishing {} messages", messages.len()));
        self.publish(0, &messages, QUEUE, &mut lines).await?;

        let mut stops = Stops {
            rng: Rng(plan.seed.wrapping_mul(31) | 1),
            // The soak's consumer has no DLQ (no `retry`).
            windows: plan.pattern.def().windows_for(false),
            spacing: (messages.len() / plan.kills.max(1)).max(1) as f64,
            ids: messages.iter().map(|m| m.meta.message_id.clone()).collect(),
            kills: plan.kills > 0,
        };
        let started = Instant::now();
        let (mut seq, kills, restarts) = self.consume(plan, &mut stops).await?;
        let consume_secs = started.elapsed().as_secs_f64();

        // The checks: what the producer sent, what PostgreSQL holds, what
        // is still queued.
        let broker = crate::broker::admin(&self.env.endpoints().broker_url(&self.vhost)).await?;
        let ground = store::read_ground(&mut db, None).await?;
        let queued: BTreeSet<String> = broker
            .peek(QUEUE)
            .await?
            .iter()
            .map(|p| store::event_id(&p.body, &p.message_id))
            .collect();
        broker.close("done").await;
        // One service: an event is owed to "some service", as in a lab.
        let checks = total_queue(
            &lines,
            &ground,
            &queued,
            &events,
            &Owed::default(),
            &Queued::default(),
        );

        let baseline_secs = if plan.baseline {
            seq += 1;
            Some(self.baseline(plan, seq, &messages).await?)
        } else {
            None
        };
        Ok(Report {
            published: messages.len(),
            kills,
            broker_restarts: restarts,
            checks,
            consume_secs,
            baseline_secs,
        })
    }

    /// The soak's own database (migrated) and its two queues, empty; with
    /// broker restarts to come, the queues' declaration on disk before any
    /// (as the runner does for a lab with a broker fault: a restart that
    /// came before the broker logged it could lose the queue).
    async fn prepare(&self, restarts: bool) -> Result<sqlx::PgConnection> {
        let mut db =
            store::connect(&self.env.endpoints().pg_url(&self.env.endpoints().pg_admin)).await?;
        store::create_database(&mut db, &self.database).await?;
        drop(db);
        let mut db = store::connect(&self.env.endpoints().pg_url(&self.database)).await?;
        store::migrate(&mut db).await?;
        let broker = crate::broker::admin(&self.env.endpoints().broker_url(&self.vhost)).await?;
        broker.delete_queues(&topology()).await?;
        broker.declare(&topology()).await?;
        broker.close("done").await;
        if restarts {
            crate::faults::broker::declared(&*self.env, 1).await?;
        }
        std::fs::create_dir_all(&self.logs)?;
        Ok(db)
    }

    /// A consumer process numbered `seq`, with the stops drawn for it.
    fn consumer(&self, seq: usize, plan: &Plan, faults: Vec<FaultPoint>) -> Result<Proc> {
        self.spawn(
            seq,
            RoleConfig::Consumer(self.consumer_config(QUEUE, plan.pattern, faults)),
        )
    }

    /// Competing consumers until every message is settled: one that reaches
    /// its stop is killed and replaced, one that ends (its broker went away)
    /// is replaced; the broker is restarted at even shares of the messages.
    /// Returns the last process number, the kills and the restarts.
    async fn consume(&mut self, plan: &Plan, stops: &mut Stops) -> Result<(usize, usize, usize)> {
        let total = stops.ids.len();
        let mut settled: BTreeSet<String> = BTreeSet::new();
        let mut seq = 1;
        let mut procs: Vec<Proc> = Vec::new();
        for _ in 0..plan.consumers {
            seq += 1;
            procs.push(self.consumer(seq, plan, stops.next(&settled))?);
        }
        let restart_every = total / (plan.broker_restarts + 1);
        let mut next_restart = if plan.broker_restarts > 0 {
            restart_every
        } else {
            usize::MAX
        };
        let (mut kills, mut restarts) = (0, 0);
        let deadline = Instant::now() + Duration::from_secs(60 + total as u64 / 20);
        while settled.len() < total {
            if Instant::now() > deadline {
                bail!(
                    "the soak did not settle every message in time ({} of {total})",
                    settled.len()
                );
            }
            let (i, line) = next_line(&mut procs).await;
            let Ok(Some(line)) = line else {
                // A consumer that ended (its broker went away): start another.
                let _ = procs[i].child.wait().await;
                seq += 1;
                procs[i] = self.consumer(seq, plan, stops.next(&settled))?;
                continue;
            };
            let Some(e) = Entry::parse(&format!("[consumer] {line}")) else {
                continue;
            };
            match e.get("status").and_then(|s| s.parse::<Status>().ok()) {
                Some(Status::BusinessCommitted | Status::DuplicateSkipped) => {
                    if let Some(m) = e.get("messageId") {
                        settled.insert(m.to_string());
                    }
                    if settled.len().is_multiple_of(500) {
                        (self.progress)(&format!(
                            "{} of {total} settled, {kills} kills",
                            settled.len()
                        ));
                    }
                }
                Some(Status::CrashInjected) => {
                    kills += 1;
                    let pid = procs[i].child.id().context("consumer already reaped")?;
                    signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL)?;
                    let _ = procs[i].child.wait().await;
                    seq += 1;
                    procs[i] = self.consumer(seq, plan, stops.next(&settled))?;
                }
                _ => {}
            }
            if settled.len() >= next_restart && restarts < plan.broker_restarts {
                restarts += 1;
                next_restart += restart_every;
                crate::faults::broker::between(self, FaultAction::Restart).await?;
            }
        }
        for p in &mut procs {
            process::stop(&mut p.child, Signal::SIGKILL, Duration::from_secs(5)).await;
        }
        Ok((seq, kills, restarts))
    }

    /// The same messages through plain auto-ack consumers without faults,
    /// numbered from `seq`: the seconds until each was received.
    async fn baseline(&self, plan: &Plan, seq: usize, messages: &[OutMessage]) -> Result<f64> {
        (self.progress)("baseline: the same messages, an auto-ack consumer, no faults");
        let mut ignored = Vec::new();
        self.publish(seq, messages, BASELINE_QUEUE, &mut ignored)
            .await?;
        let t = Instant::now();
        let mut procs = Vec::new();
        for k in 0..plan.consumers {
            let mut cfg = self.consumer_config(BASELINE_QUEUE, Pattern::AutoAck, Vec::new());
            cfg.service = format!("baseline-{k}");
            procs.push(self.spawn(seq + 1 + k, RoleConfig::Consumer(cfg))?);
        }
        let mut seen = 0;
        while seen < messages.len() {
            match next_line(&mut procs).await.1? {
                Some(l)
                    if Entry::parse(&format!("[consumer] {l}"))
                        .is_some_and(|e| e.is(Role::Consumer, Status::Received)) =>
                {
                    seen += 1
                }
                Some(_) => {}
                None => bail!("a baseline consumer ended early"),
            }
        }
        let secs = t.elapsed().as_secs_f64();
        for p in &mut procs {
            process::stop(&mut p.child, Signal::SIGKILL, Duration::from_secs(5)).await;
        }
        Ok(secs)
    }
}

/// The next line of any of the processes, and whose it is.
async fn next_line(procs: &mut [Proc]) -> (usize, std::io::Result<Option<String>>) {
    let futs = procs
        .iter_mut()
        .enumerate()
        .map(|(i, p)| Box::pin(async move { (i, p.lines.next_line().await) }));
    futures_util::future::select_all(futs).await.0
}

/// Where the next consumer process stops: at some of the messages not yet
/// settled, each at a window of its own, about one stop per `spacing`
/// messages, drawn from the plan's seed.
struct Stops {
    rng: Rng,
    windows: Vec<Window>,
    spacing: f64,
    ids: Vec<String>,
    /// Whether the plan kills at all.
    kills: bool,
}

impl Stops {
    fn next(&mut self, settled: &BTreeSet<String>) -> Vec<FaultPoint> {
        let mut points = Vec::new();
        if !self.kills {
            return points;
        }
        for m in self.ids.iter().filter(|m| !settled.contains(*m)) {
            if self.rng.chance(1.0 / self.spacing) {
                let window = self.windows[(self.rng.next() % self.windows.len() as u64) as usize];
                points.push(FaultPoint {
                    window,
                    message: m.clone(),
                    hold: false,
                    cut: false,
                });
            }
        }
        points
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_resends_a_share_back_to_back() {
        let plan = Plan {
            messages: 1000,
            consumers: 2,
            kills: 10,
            resend_share: 0.1,
            broker_restarts: 0,
            seed: 4,
            pattern: Pattern::Inbox,
            baseline: false,
        };
        let s = stream(&plan);
        let copies = s.len() - 1000;
        assert!((60..=140).contains(&copies), "{copies}");
        let events: Vec<String> = s
            .iter()
            .map(|m| store::event_id(m.body.as_bytes(), ""))
            .collect();
        let adjacent = events.windows(2).filter(|w| w[0] == w[1]).count();
        assert_eq!(adjacent, copies);
        assert_eq!(stream(&plan).len(), s.len(), "reproducible");
    }
}
