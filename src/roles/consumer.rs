//! The consumer role: manual ack, the inbox transaction of LABS.md, retries by
//! dead-lettering, and the DLQ move with publisher confirms; plus the broken
//! variants that show why each of those steps is needed. Fault windows are
//! named points in this code path; a window selected for a message prints a
//! marker and blocks until the harness kills the process.

use std::collections::BTreeSet;

use anyhow::{bail, Context, Result};
use sqlx::PgConnection;

use super::{emit, now_ms, PUBLISHED_AT};
use crate::broker::{self, Delivery, Inbound, Subscription};
use crate::faults::downstream::{CALLER, IDEMPOTENCY_KEY};
use crate::faults::point;
use crate::protocol::{ConsumerConfig, RetryPolicy};
use crate::store::{self, InboxRow, OrderCreated, StateWrite};
use crate::transcript::{MessageMeta, Record};
use crate::vocab::{
    Abandoned, AttemptsFrom, Backoff, DlqOrder, FailureClass, OnFailure, PatternDef, Publish,
    Status, Step, Window, GUARDED, RETRY_ATTEMPT_HEADER,
};

mod failure;
mod lateness;

enum Outcome {
    Settled,
    Pending,
    /// Rejected into a dead-letter chain that never leads back: no final
    /// outcome of the message, but the end of this queue's entry.
    Left,
    /// Rolled back, to be tried again on the same delivery (unacked).
    RetryInPlace,
}

struct Consumer {
    cfg: ConsumerConfig,
    /// Deliveries, their settlements, the copies published on (a DLQ
    /// move is acknowledged only after the broker confirms it, except in
    /// the `unconfirmed-dlq` variant), the window barrier.
    link: Box<dyn Inbound>,
    db: PgConnection,
    /// The current delivery is acked (autoAck: from its delivery on), for
    /// explore's clean run: a window passed says it (`window_passed`).
    acked: std::cell::Cell<bool>,
}

/// What a consumer process has done, across its connections.
#[derive(Default)]
struct Progress {
    settled: BTreeSet<String>,
    /// Final outcomes, one per delivery that reached one (`settle_copies`).
    copies: usize,
    received: usize,
    /// SIGTERM, when it is one of several instances (`until_stopped`): the
    /// harness counts what they settled together.
    term: Option<tokio::signal::unix::Signal>,
    stopped: bool,
}

impl Progress {
    fn more(&self, cfg: &ConsumerConfig) -> bool {
        let done = if cfg.settle_copies {
            self.copies
        } else {
            self.settled.len()
        };
        !self.stopped && done < cfg.settle && cfg.max_deliveries.is_none_or(|m| self.received < m)
    }
}

/// Reconnects a consumer tolerates before it gives up.
const MAX_RECONNECTS: usize = 5;

pub async fn run(cfg: ConsumerConfig) -> Result<i32> {
    let mut db = Some(store::connect(&cfg.database_url).await?);
    let mut progress = Progress::default();
    if cfg.until_stopped {
        progress.term = Some(tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        )?);
    }
    let mut reconnects = 0;
    // At start, and after each lost connection: a call that failed after
    // its ack is tried again here (a consumer that runs on without a
    // reconnect leaves it for its next start).
    if let Some(db) = db.as_mut() {
        recover_intents(&cfg, db).await?;
    }
    while progress.more(&cfg) {
        let link = broker::inbound(&cfg.broker_url).await?;
        let result = session(&cfg, link, &mut db, &mut progress).await;
        match result {
            Ok(()) => {}
            Err(e) if cfg.reconnect && reconnects < MAX_RECONNECTS => {
                reconnects += 1;
                tracing::warn!("connection lost: {e:#}");
                // A transaction left open by the lost delivery is abandoned:
                // rolled back, unless the pattern keeps it.
                let kept = cfg.pattern.def().abandoned == Abandoned::Kept;
                if let Some(db) = db.as_mut().filter(|_| !kept) {
                    let _ = store::rollback(db).await;
                }
                emit(
                    Record::new(cfg.broker, &cfg.lab)
                        .with("consumer", &cfg.consumer)
                        .with("queue", &cfg.queue)
                        .status(Status::ConnectionLost),
                );
                if let Some(db) = db.as_mut() {
                    recover_intents(&cfg, db).await?;
                }
            }
            Err(e) => return Err(e),
        }
    }
    emit(
        Record::new(cfg.broker, &cfg.lab)
            .with("queue", &cfg.queue)
            .with("received", progress.received)
            .status(Status::Done),
    );
    Ok(0)
}

/// One connection's worth of consuming.
async fn session(
    cfg: &ConsumerConfig,
    mut link: Box<dyn Inbound>,
    db: &mut Option<PgConnection>,
    progress: &mut Progress,
) -> Result<()> {
    link.subscribe(Subscription {
        queue: &cfg.queue,
        consumer: &cfg.consumer,
        prefetch: cfg.prefetch,
        no_ack: cfg.pattern.def().auto_ack,
    })
    .await?;
    let mut me = Consumer {
        cfg: cfg.clone(),
        link,
        db: db.take().context("the consumer's database connection")?,
        acked: std::cell::Cell::new(false),
    };
    let result = me.consume(progress).await;
    *db = Some(me.db);
    result?;
    me.link.close().await
}

impl Consumer {
    async fn consume(&mut self, progress: &mut Progress) -> Result<()> {
        while progress.more(&self.cfg) {
            // SIGTERM is taken only here, between two deliveries.
            let next = match progress.term.as_mut() {
                Some(term) => tokio::select! {
                    d = self.link.next() => d,
                    _ = term.recv() => {
                        progress.stopped = true;
                        break;
                    }
                },
                None => self.link.next().await,
            };
            let d = next?;
            progress.received += 1;
            self.acked.set(self.def().auto_ack);
            let meta = d.meta.clone();
            let attempt = self.attempt_of(&d);
            capture_headers(&*self.link, &d, &meta, attempt);
            self.received(&d, &meta, attempt);
            // A failure retried in place holds the delivery: what is behind
            // it waits (block-key).
            let mut attempt = attempt;
            let outcome = loop {
                match self.handle(&d, &meta, attempt).await? {
                    Outcome::RetryInPlace => attempt += 1,
                    o => break o,
                }
            };
            match outcome {
                Outcome::Settled => {
                    progress.settled.insert(meta.message_id);
                    progress.copies += 1;
                }
                Outcome::Left if self.cfg.settle_copies => progress.copies += 1,
                Outcome::Left | Outcome::Pending | Outcome::RetryInPlace => {}
            }
        }
        Ok(())
    }

    /// The delivery's attempt number, read where this pattern reads it.
    fn attempt_of(&self, d: &Delivery) -> u32 {
        match self.def().on_failure {
            OnFailure::Classified {
                attempts: AttemptsFrom::Header,
                ..
            }
            | OnFailure::RetryThenDlq {
                attempts: AttemptsFrom::Header,
                ..
            } => d
                .headers
                .get(RETRY_ATTEMPT_HEADER)
                .and_then(|a| a.parse().ok())
                .unwrap_or(1),
            OnFailure::RetryThenDlq {
                attempts: AttemptsFrom::XDeathFirst,
                ..
            } => self.link.attempt(d, true),
            _ => self.link.attempt(d, false),
        }
    }

    /// The `received` line of a delivery.
    fn received(&self, d: &Delivery, meta: &MessageMeta, attempt: u32) {
        let mut received = self
            .line(meta)
            .with("consumer", &self.cfg.consumer)
            .with("attempt", attempt);
        // How long a retried or delayed copy really waited (normalized
        // out; the checker compares it with a TTL or a lab's band).
        if let Some(at) = (d.headers.get(RETRY_PUBLISHED_AT))
            .or_else(|| d.headers.get(PUBLISHED_AT))
            .and_then(|a| a.parse::<u128>().ok())
        {
            received = received.with("delayMs", now_ms().saturating_sub(at));
        }
        emit(
            received
                .with("redelivered", d.redelivered)
                .status(Status::Received),
        );
    }

    fn def(&self) -> &'static PatternDef {
        self.cfg.pattern.def()
    }

    fn line(&self, meta: &MessageMeta) -> Record {
        line(&self.cfg, meta)
    }

    /// An autoAck delivery has nothing to ack: the broker forgot it when
    /// it sent it.
    async fn ack(&self, d: &Delivery) -> Result<()> {
        if !self.def().auto_ack {
            self.link.ack(d).await?;
        }
        self.acked.set(true);
        Ok(())
    }

    fn settled(&self, meta: &MessageMeta, attempt: u32, status: Status) -> Result<Outcome> {
        emit(self.line(meta).with("attempt", attempt).status(status));
        Ok(Outcome::Settled)
    }

    /// Walks the pattern's steps in order (LABS.md's transaction for the
    /// safe one; each unsafe pattern removes or reorders one step), stopping
    /// at the window after each step when the lab selected it. Long because
    /// it is that walk, an arm per step, so a pattern's order reads as the
    /// order of the transaction.
    async fn handle(&mut self, d: &Delivery, meta: &MessageMeta, attempt: u32) -> Result<Outcome> {
        let def = self.def();
        let event_id = store::event_id(&d.body, &meta.message_id);
        // BEGIN on first use; the statements run on the one connection.
        let mut open = false;
        for (i, step) in def.steps.iter().enumerate() {
            match step {
                // The caller took and logged the delivery.
                Step::Receive => {}
                Step::Write | Step::WriteOverwrite => {
                    begin(&mut open, &mut self.db).await?;
                    let how = match step {
                        Step::WriteOverwrite => StateWrite::Overwrite,
                        _ => StateWrite::Guarded,
                    };
                    let write = self.write(d, meta, attempt, how).await;
                    if let Err((class, error)) = write {
                        return self
                            .failed(d, meta, attempt, &event_id, class, &error)
                            .await;
                    }
                }
                Step::CallDownstream | Step::CallDownstreamUnkeyed => {
                    begin(&mut open, &mut self.db).await?;
                    let key = match step {
                        Step::CallDownstream => event_id.clone(),
                        // A request id, new on each attempt.
                        _ => format!("{}/{attempt}/{}", meta.message_id, now_ms()),
                    };
                    if let Err(error) = call_downstream(&self.cfg, &d.body, key).await? {
                        return self
                            .failed(d, meta, attempt, &event_id, FailureClass::Transient, &error)
                            .await;
                    }
                }
                Step::Commit => {
                    anyhow::ensure!(open, "a pattern commits before it writes");
                    store::commit(&mut self.db).await?;
                    // Printed only once the commit returned.
                    emit(
                        line(&self.cfg, meta)
                            .with("attempt", attempt)
                            .status(Status::BusinessCommitted),
                    );
                }
                Step::Ack => self.ack(d).await?,
                Step::IntentInsert => {
                    begin(&mut open, &mut self.db).await?;
                    let meta_json = serde_json::to_string(meta)?;
                    store::add_intent(
                        &mut self.db,
                        &self.cfg.service,
                        &event_id,
                        &meta_json,
                        &d.body,
                    )
                    .await?;
                }
                Step::CallAfterAck | Step::CallAfterAckUnkeyed => {
                    let key = intent_key(*step, &event_id, &meta.message_id);
                    let called = call_downstream(&self.cfg, &d.body, key).await?;
                    if let Err(error) = called {
                        // Acked: what is left of the call is its intent, if any.
                        tracing::warn!("{error}");
                        emit(self.line(meta).status(Status::CallFailed));
                        return Ok(Outcome::Settled);
                    }
                    emit(self.line(meta).status(Status::DownstreamCalled));
                }
                Step::IntentDone => {
                    store::intent_done(&mut self.db, &self.cfg.service, &event_id).await?;
                }
                dedup => {
                    let seen = self
                        .dedup(dedup, d, meta, attempt, &event_id, &mut open)
                        .await?;
                    if let Some(outcome) = seen {
                        return Ok(outcome);
                    }
                }
            }
            if let Some(w) = def.window_after(i) {
                self.window(w, meta).await?;
            }
        }
        Ok(Outcome::Settled)
    }

    /// A deduplication step (the inbox row, or a shortcut that replaces
    /// it): Some(outcome) when the message is settled here (a duplicate
    /// skipped, a conflict isolated), None when the pattern goes on.
    async fn dedup(
        &mut self,
        step: &Step,
        d: &Delivery,
        meta: &MessageMeta,
        attempt: u32,
        event_id: &str,
        open: &mut bool,
    ) -> Result<Option<Outcome>> {
        match step {
            Step::SkipRedelivered => {
                if d.redelivered {
                    self.ack(d).await?;
                    return settled(&self.cfg, meta, attempt, Status::DuplicateSkipped).map(Some);
                }
            }
            Step::InboxSelect => {
                begin(open, &mut self.db).await?;
                if store::inbox_has(&mut self.db, &self.cfg.service, event_id).await? {
                    store::rollback(&mut self.db).await?;
                    self.ack(d).await?;
                    return settled(&self.cfg, meta, attempt, Status::DuplicateSkipped).map(Some);
                }
            }
            Step::InboxInsertIgnoring => {
                begin(open, &mut self.db).await?;
                store::insert_inbox(&mut self.db, &self.cfg.service, event_id).await?;
            }
            Step::InboxOwnTx => {
                if !store::insert_inbox_autocommit(&mut self.db, &self.cfg.service, event_id)
                    .await?
                {
                    self.ack(d).await?;
                    return settled(&self.cfg, meta, attempt, Status::DuplicateSkipped).map(Some);
                }
            }
            Step::InboxOtherConnection => {
                begin(open, &mut self.db).await?;
                return self
                    .inbox_other_connection(d, meta, attempt, event_id)
                    .await;
            }
            Step::InboxInsert | Step::InboxInsertSavepoint | Step::InboxInsertCatching => {
                begin(open, &mut self.db).await?;
                return self.inbox_row(step, d, meta, attempt, event_id).await;
            }
            Step::InboxInsertBlind | Step::InboxInsertByEvent => {
                begin(open, &mut self.db).await?;
                // Keyed by the eventId alone: one row for every service.
                let key = match step {
                    Step::InboxInsertByEvent => store::ANY_SERVICE,
                    _ => self.cfg.service.as_str(),
                };
                if !store::insert_inbox(&mut self.db, key, event_id).await? {
                    store::rollback(&mut self.db).await?;
                    self.ack(d).await?;
                    return settled(&self.cfg, meta, attempt, Status::DuplicateSkipped).map(Some);
                }
            }
            Step::Receive
            | Step::Write
            | Step::WriteOverwrite
            | Step::CallDownstream
            | Step::CallDownstreamUnkeyed
            | Step::IntentInsert
            | Step::CallAfterAck
            | Step::CallAfterAckUnkeyed
            | Step::IntentDone
            | Step::Commit
            | Step::Ack => {}
        }
        Ok(None)
    }

    /// The inbox row written by a helper on a connection of its own
    /// (article 000's "another DbContext"): its insert commits there,
    /// whatever the business transaction already open does after it. None
    /// for a new event; a duplicate is rolled back, acked and skipped.
    async fn inbox_other_connection(
        &mut self,
        d: &Delivery,
        meta: &MessageMeta,
        attempt: u32,
        event_id: &str,
    ) -> Result<Option<Outcome>> {
        let mut other = store::connect(&self.cfg.database_url).await?;
        let new = store::insert_inbox(&mut other, &self.cfg.service, event_id).await?;
        store::close(other).await;
        if new {
            return Ok(None);
        }
        store::rollback(&mut self.db).await?;
        self.ack(d).await?;
        settled(&self.cfg, meta, attempt, Status::DuplicateSkipped).map(Some)
    }

    /// The inbox row with the digest of the business content, in the open
    /// transaction: None for a new event (the pattern goes on), else the
    /// outcome of a duplicate (skipped), a conflict (isolated) or a
    /// transaction PostgreSQL aborted at a caught violation (the error path).
    async fn inbox_row(
        &mut self,
        step: &Step,
        d: &Delivery,
        meta: &MessageMeta,
        attempt: u32,
        event_id: &str,
    ) -> Result<Option<Outcome>> {
        let content = store::content(&d.body);
        let (db, service) = (&mut self.db, self.cfg.service.as_str());
        let row = match step {
            Step::InboxInsert => {
                store::insert_inbox_checked(db, service, event_id, &content).await?
            }
            _ => {
                let savepoint = *step == Step::InboxInsertSavepoint;
                store::insert_inbox_catching(db, service, event_id, &content, savepoint).await?
            }
        };
        let (class, error) = match row {
            InboxRow::New => return Ok(None),
            InboxRow::Duplicate => {
                store::rollback(&mut self.db).await?;
                self.ack(d).await?;
                return settled(&self.cfg, meta, attempt, Status::DuplicateSkipped).map(Some);
            }
            InboxRow::Conflict => (
                FailureClass::Conflict,
                "another business content under an eventId already applied".to_string(),
            ),
            // The consumer's error path, as for any failed statement.
            InboxRow::Aborted(error) => (FailureClass::Transient, error),
        };
        self.failed(d, meta, attempt, event_id, class, &error)
            .await
            .map(Some)
    }

    /// The business write of the order in `d`, or why it failed: the lab's
    /// injected transient failure, a message that is not an order, a change
    /// event older than the order's state (`how`), or the database.
    async fn write(
        &mut self,
        d: &Delivery,
        meta: &MessageMeta,
        attempt: u32,
        how: StateWrite,
    ) -> std::result::Result<(), (FailureClass, String)> {
        let injected = self
            .cfg
            .transient_failures
            .get(&meta.message_id)
            .is_some_and(|n| attempt <= *n);
        let order = if injected {
            Err((
                FailureClass::Transient,
                "inventory backend unavailable (the lab fails this attempt)".to_string(),
            ))
        } else {
            OrderCreated::classify(&d.body)
        };
        let db_error = |e: anyhow::Error| (FailureClass::Transient, e.to_string());
        match order {
            Ok(order) => {
                if how == StateWrite::Guarded {
                    too_late(&order, d)?;
                }
                let (db, service) = (&mut self.db, self.cfg.service.as_str());
                if let Some(version) = order.version {
                    let stale = store::set_order_state(db, service, &order, version, how)
                        .await
                        .map_err(db_error)?;
                    if let Some(stored) = stale {
                        return Err((
                            FailureClass::BusinessRejection,
                            format!("stale: version {version} is not newer than the order's version {stored}"),
                        ));
                    }
                } else if let Some(expected) = &order.cancel_if_status {
                    let found = store::cancel_order_if(db, service, &order, expected, how)
                        .await
                        .map_err(db_error)?;
                    // Article 000: an order that must exist and does not is
                    // an invariant violation, not a business decision.
                    if found.as_deref() == Some(store::ABSENT) {
                        return Err((
                            FailureClass::InvariantViolation,
                            format!(
                                "order {} does not exist: a check for an order never placed",
                                order.order_id
                            ),
                        ));
                    }
                    if let Some(found) = found {
                        return Err((
                            FailureClass::BusinessRejection,
                            format!("the order is {found}, not {expected}: not cancelled"),
                        ));
                    }
                }
                store::reserve_inventory(&mut self.db, &self.cfg.service, &meta.message_id, &order)
                    .await
                    .map_err(|e| (FailureClass::Transient, e.to_string()))
            }
            Err(e) => Err(e),
        }
    }

    /// A window of its path: said in explore's clean run (with whether
    /// the delivery is acked there), stopped at when the lab selected it.
    async fn window(&self, w: Window, meta: &MessageMeta) -> Result<()> {
        if self.cfg.announce_windows {
            let line = marker(&self.cfg, meta)
                .with("window", w)
                .with("acked", self.acked.get());
            emit(line.status(Status::WindowPassed));
        }
        // A cut here: the delivery abandoned, whatever is open.
        let cut = point::cut(&self.cfg.faults, w, meta, self.link.barrier()).await;
        if let Err(e) = cut {
            bail!("the connection was lost at {w} ({e}): the delivery is abandoned");
        }
        let barrier = self.link.barrier();
        point::reach(&self.cfg.faults, w, meta, marker(&self.cfg, meta), barrier).await;
        Ok(())
    }
}

/// A delayed task found later than its maximum lateness: how late it is
/// is the host's clock now, less when it was scheduled (the sender's
/// `published-at`) and its delay.
fn too_late(order: &OrderCreated, d: &Delivery) -> std::result::Result<(), (FailureClass, String)> {
    let sent = d.headers.get(PUBLISHED_AT).map(String::as_str);
    lateness::judge(order.due_in_ms, order.max_lateness_ms, sent, now_ms())
}

/// The downstream call with the event as its body and `key` as its
/// Idempotency-Key: Ok(Err(why)) when the call failed (no answer, the
/// connection closed, another status than 200), which the pattern
/// takes as transient; Err when no downstream was given (a bug).
async fn call_downstream(
    cfg: &ConsumerConfig,
    body: &[u8],
    key: String,
) -> Result<Result<(), String>> {
    let service = cfg.service.clone();
    let cfg = cfg
        .downstream
        .clone()
        .context("the pattern calls a downstream service and the harness gave none")?;
    let body = body.to_vec();
    let call = tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(std::time::Duration::from_millis(cfg.timeout_ms)))
            .http_status_as_error(false)
            .build()
            .into();
        match agent
            .post(&cfg.url)
            .header(IDEMPOTENCY_KEY, &key)
            .header(CALLER, &service)
            .header("Content-Type", "application/json")
            .send(&body[..])
        {
            Ok(r) if r.status() == 200 => Ok(()),
            Ok(r) => Err(format!(
                "the downstream answered HTTP {}",
                r.status().as_u16()
            )),
            Err(ureq::Error::Timeout(_)) => Err(format!(
                "no answer from the downstream within {} ms",
                cfg.timeout_ms
            )),
            Err(e) => Err(format!("the downstream call failed: {e}")),
        }
    });
    Ok(call.await?)
}

/// The key of a call after the ack: the eventId, or a request id new on
/// each call (`call-after-ack-unkeyed`).
fn intent_key(step: Step, event_id: &str, message_id: &str) -> String {
    match step {
        Step::CallAfterAckUnkeyed => format!("{message_id}/{}", now_ms()),
        _ => event_id.to_string(),
    }
}

/// At start, before consuming, and after a lost connection: the calls of
/// the intents left pending (a crash after the ack and before the mark, a
/// call that failed), each made and marked done. A call that fails again
/// stays pending.
async fn recover_intents(cfg: &ConsumerConfig, db: &mut PgConnection) -> Result<()> {
    let def = cfg.pattern.def();
    let Some(call) = def
        .steps
        .iter()
        .find(|s| matches!(s, Step::CallAfterAck | Step::CallAfterAckUnkeyed))
    else {
        return Ok(());
    };
    if !def.steps.contains(&Step::IntentInsert) {
        return Ok(());
    }
    for (event_id, meta, body) in store::pending_intents(db, &cfg.service).await? {
        let meta: MessageMeta = serde_json::from_str(&meta)?;
        let key = intent_key(*call, &event_id, &meta.message_id);
        match call_downstream(cfg, &body, key).await? {
            Ok(()) => {
                store::intent_done(db, &cfg.service, &event_id).await?;
                emit(line(cfg, &meta).status(Status::IntentRecovered));
            }
            Err(error) => {
                tracing::warn!("{error}");
                emit(line(cfg, &meta).status(Status::CallFailed));
            }
        }
    }
    Ok(())
}

/// The headers a copy adds to the original's: the diagnostics a reader of
/// the DLQ needs (`vocab::DLQ_HEADERS`, outside the broker's `x-` space).
fn diagnostics(
    cfg: &ConsumerConfig,
    d: &Delivery,
    meta: &MessageMeta,
    attempt: u32,
    class: FailureClass,
    error: &str,
) -> Vec<(&'static str, String)> {
    let now = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    let first = d.headers.get(FIRST_FAILED_AT).cloned();
    let event_id = store::event_id(&d.body, &meta.message_id);
    vec![
        ("event-id", event_id),
        ("event-type", meta.event_type.clone()),
        ("aggregate-id", meta.aggregate_id.clone()),
        (crate::vocab::ORIGINAL_QUEUE, cfg.queue.clone()),
        ("original-routing-key", d.routing_key.clone()),
        ("failure-class", class.name().to_string()),
        ("last-error", error.to_string()),
        ("attempts", attempt.to_string()),
        (FIRST_FAILED_AT, first.unwrap_or_else(|| now.clone())),
        ("last-failed-at", now),
    ]
}

async fn begin(open: &mut bool, db: &mut PgConnection) -> Result<()> {
    if !*open {
        store::begin(db).await?;
        *open = true;
    }
    Ok(())
}

/// The header with which a republished copy says when it left (epoch ms).
const RETRY_PUBLISHED_AT: &str = "retry-published-at";
/// When a message first failed (RFC 3339), carried through its retries.
const FIRST_FAILED_AT: &str = "first-failed-at";

fn settled(
    cfg: &ConsumerConfig,
    meta: &MessageMeta,
    attempt: u32,
    status: Status,
) -> Result<Outcome> {
    emit(line(cfg, meta).with("attempt", attempt).status(status));
    Ok(Outcome::Settled)
}

/// A window's marker line: with the instance's name when it is one of
/// several (a rendezvous), so that the transcript says which one stopped.
fn marker(cfg: &ConsumerConfig, meta: &MessageMeta) -> Record {
    match cfg.until_stopped {
        true => line(cfg, meta).with("consumer", &cfg.consumer),
        false => line(cfg, meta),
    }
}

fn line(cfg: &ConsumerConfig, meta: &MessageMeta) -> Record {
    Record::new(cfg.broker, &cfg.lab)
        .meta(meta)
        .with("destination", &cfg.queue)
}

/// `MQLAB_CAPTURE_HEADERS=DIR` saves each delivery's headers as JSON, so that
/// the x-death parser is tested on what the broker really sent
/// (`tests/data/`), not on tables written by hand.
fn capture_headers(link: &dyn Inbound, d: &Delivery, meta: &MessageMeta, attempt: u32) {
    if let Some(dir) = std::env::var_os("MQLAB_CAPTURE_HEADERS") {
        let path =
            std::path::Path::new(&dir).join(format!("{}-attempt{attempt}.json", meta.message_id));
        if let Some(json) = link.headers_json(d) {
            let _ = std::fs::write(path, json);
        }
    }
}
