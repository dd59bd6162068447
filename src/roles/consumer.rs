//! The consumer role: manual ack, the inbox transaction of LABS.md, retries by
//! dead-lettering, and the DLQ move with publisher confirms; plus the broken
//! variants that show why each of those steps is needed. Fault windows are
//! named points in this code path; a window selected for a message prints a
//! marker and blocks until the harness kills the process.

use std::collections::BTreeSet;

use anyhow::{Context, Result};
use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Confirmation};
use sqlx::PgConnection;

use super::{emit, meta_of};
use crate::amqp;
use crate::faults::point;
use crate::protocol::ConsumerConfig;
use crate::store::{self, OrderCreated};
use crate::transcript::{MessageMeta, Record};
use crate::vocab::{OnFailure, PatternDef, Status, Step};

enum Outcome {
    Settled,
    Pending,
}

struct Consumer {
    cfg: ConsumerConfig,
    /// The consuming channel: acks go here, and the window barrier too.
    ch: Channel,
    db: PgConnection,
    /// In confirm mode: a DLQ move is acknowledged only after the broker confirms it.
    confirmed: Channel,
    /// Not in confirm mode: what the `unconfirmed-dlq` variant publishes on.
    unconfirmed: Channel,
}

/// What a consumer process has done, across its connections.
#[derive(Default)]
struct Progress {
    settled: BTreeSet<String>,
    received: usize,
}

impl Progress {
    fn more(&self, cfg: &ConsumerConfig) -> bool {
        self.settled.len() < cfg.settle && cfg.max_deliveries.is_none_or(|m| self.received < m)
    }
}

/// Reconnects a consumer tolerates before it gives up.
const MAX_RECONNECTS: usize = 5;

pub async fn run(cfg: ConsumerConfig) -> Result<i32> {
    let mut db = Some(store::connect(&cfg.database_url).await?);
    let mut progress = Progress::default();
    let mut reconnects = 0;
    while progress.more(&cfg) {
        let conn = amqp::connect(&cfg.amqp_url).await?;
        let result = session(&cfg, &conn, &mut db, &mut progress).await;
        match result {
            Ok(()) => {
                conn.close(200, "done".into()).await.ok();
            }
            Err(e) if cfg.reconnect && reconnects < MAX_RECONNECTS => {
                reconnects += 1;
                tracing::warn!("connection lost: {e:#}");
                // A transaction left open by the lost delivery is abandoned.
                if let Some(db) = db.as_mut() {
                    let _ = store::rollback(db).await;
                }
                emit(
                    Record::new(&cfg.lab)
                        .with("consumer", &cfg.consumer)
                        .with("queue", &cfg.queue)
                        .status(Status::ConnectionLost),
                );
            }
            Err(e) => return Err(e),
        }
    }
    emit(
        Record::new(&cfg.lab)
            .with("queue", &cfg.queue)
            .with("received", progress.received)
            .status(Status::Done),
    );
    Ok(0)
}

/// One connection's worth of consuming.
async fn session(
    cfg: &ConsumerConfig,
    conn: &lapin::Connection,
    db: &mut Option<PgConnection>,
    progress: &mut Progress,
) -> Result<()> {
    let ch = conn.create_channel().await?;
    ch.basic_qos(cfg.prefetch, BasicQosOptions::default())
        .await?;
    let confirmed = conn.create_channel().await?;
    confirmed
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let unconfirmed = conn.create_channel().await?;
    let mut me = Consumer {
        cfg: cfg.clone(),
        ch: ch.clone(),
        db: db.take().context("the consumer's database connection")?,
        confirmed,
        unconfirmed,
    };
    let result = me.consume(progress).await;
    *db = Some(me.db);
    result
}

impl Consumer {
    async fn consume(&mut self, progress: &mut Progress) -> Result<()> {
        let mut deliveries = self
            .ch
            .basic_consume(
                self.cfg.queue.as_str().into(),
                self.cfg.consumer.as_str().into(),
                BasicConsumeOptions {
                    no_ack: self.def().auto_ack,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .with_context(|| format!("consuming from `{}`", self.cfg.queue))?;
        while progress.more(&self.cfg) {
            let d = deliveries
                .next()
                .await
                .context("the broker closed the consumer")??;
            progress.received += 1;
            let meta = meta_of(&d);
            let attempt = amqp::attempt_from_x_death(d.properties.headers().as_ref());
            capture_headers(&d, &meta, attempt);
            emit(
                self.line(&meta)
                    .with("consumer", &self.cfg.consumer)
                    .with("attempt", attempt)
                    .with("redelivered", d.redelivered)
                    .status(Status::Received),
            );
            if let Outcome::Settled = self.handle(&d, &meta, attempt).await? {
                progress.settled.insert(meta.message_id);
            }
        }
        Ok(())
    }

    fn def(&self) -> &'static PatternDef {
        self.cfg.pattern.def()
    }

    fn line(&self, meta: &MessageMeta) -> Record {
        line(&self.cfg, meta)
    }

    async fn ack(&self, d: &Delivery) -> Result<()> {
        ack(self.def(), d).await
    }

    fn settled(&self, meta: &MessageMeta, attempt: u32, status: Status) -> Result<Outcome> {
        emit(self.line(meta).with("attempt", attempt).status(status));
        Ok(Outcome::Settled)
    }

    /// Walks the pattern's steps in order (LABS.md's transaction for the
    /// safe one; each unsafe pattern removes or reorders one step), stopping
    /// at the window after each step when the lab selected it.
    async fn handle(&mut self, d: &Delivery, meta: &MessageMeta, attempt: u32) -> Result<Outcome> {
        let def = self.def();
        let event_id = store::event_id(&d.data, &meta.message_id);
        // BEGIN on first use; the statements run on the one connection.
        let mut open = false;
        for (i, step) in def.steps.iter().enumerate() {
            match step {
                // The caller took and logged the delivery.
                Step::Receive => {}
                Step::SkipRedelivered => {
                    if d.redelivered {
                        ack(def, d).await?;
                        return settled(&self.cfg, meta, attempt, Status::DuplicateSkipped);
                    }
                }
                Step::InboxOwnTx => {
                    if !store::insert_inbox_autocommit(&mut self.db, &self.cfg.service, &event_id)
                        .await?
                    {
                        ack(def, d).await?;
                        return settled(&self.cfg, meta, attempt, Status::DuplicateSkipped);
                    }
                }
                Step::InboxInsert => {
                    begin(&mut open, &mut self.db).await?;
                    if !store::insert_inbox(&mut self.db, &self.cfg.service, &event_id).await? {
                        store::rollback(&mut self.db).await?;
                        ack(def, d).await?;
                        return settled(&self.cfg, meta, attempt, Status::DuplicateSkipped);
                    }
                }
                Step::Write => {
                    begin(&mut open, &mut self.db).await?;
                    let write = match OrderCreated::parse(&d.data) {
                        Ok(order) => store::reserve_inventory(
                            &mut self.db,
                            &self.cfg.service,
                            &meta.message_id,
                            &order,
                        )
                        .await
                        .map_err(|e| e.to_string()),
                        Err(e) => Err(e),
                    };
                    if let Err(error) = write {
                        store::rollback(&mut self.db).await?;
                        return self.failed(d, meta, attempt, &error).await;
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
                Step::Ack => ack(def, d).await?,
            }
            if let Some(w) = def.window_after(i) {
                let barrier = self
                    .ch
                    .basic_qos(self.cfg.prefetch, BasicQosOptions::default());
                point::reach(
                    self.cfg.fault.as_ref(),
                    w,
                    meta,
                    line(&self.cfg, meta),
                    barrier,
                )
                .await;
            }
        }
        Ok(Outcome::Settled)
    }

    /// A failed business write: reject into the retry loop, or at the last
    /// attempt move to the DLQ (confirmed) and only then ack the original.
    async fn failed(
        &mut self,
        d: &Delivery,
        meta: &MessageMeta,
        attempt: u32,
        error: &str,
    ) -> Result<Outcome> {
        tracing::warn!(message = %meta.message_id, attempt, error, "business write failed");
        let reject = |requeue| BasicNackOptions {
            requeue,
            multiple: false,
        };
        let confirmed = match self.def().on_failure {
            OnFailure::RequeueForever => {
                d.acker.nack(reject(true)).await?;
                emit(
                    self.line(meta)
                        .with("attempt", attempt)
                        .status(Status::Requeued),
                );
                return Ok(Outcome::Pending);
            }
            OnFailure::RetryThenDlq { confirmed } => confirmed,
        };
        let Some(retry) = self.cfg.retry.clone() else {
            d.acker.nack(reject(false)).await?;
            return self.settled(meta, attempt, Status::Rejected);
        };
        if attempt < retry.max_attempts {
            d.acker.nack(reject(false)).await?;
            emit(
                self.line(meta)
                    .with("attempt", attempt)
                    .status(Status::Retry),
            );
            return Ok(Outcome::Pending);
        }
        let mut headers = d.properties.headers().clone().unwrap_or_default();
        for (k, v) in [
            ("x-failure-class", "poison"),
            ("x-last-error", error),
            ("x-attempts", &attempt.to_string()),
            ("x-original-queue", &self.cfg.queue),
            ("x-original-routing-key", d.routing_key.as_str()),
        ] {
            headers.insert(k.into(), lapin::types::AMQPValue::LongString(v.into()));
        }
        let properties = d.properties.clone().with_headers(headers);
        if !confirmed {
            // Fire and forget: no confirm, no mandatory flag; an unroutable DLQ drops it.
            self.unconfirmed
                .basic_publish(
                    "".into(),
                    retry.dlq.as_str().into(),
                    BasicPublishOptions::default(),
                    &d.data,
                    properties,
                )
                .await?;
        } else {
            let confirm = self
                .confirmed
                .basic_publish(
                    "".into(),
                    retry.dlq.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        immediate: false,
                    },
                    &d.data,
                    properties,
                )
                .await?
                .await?;
            match confirm {
                Confirmation::Ack(None) => {}
                other => anyhow::bail!(
                    "the DLQ publish of {} was not confirmed: {other:?}",
                    meta.message_id
                ),
            }
        }
        self.ack(d).await?;
        self.settled(meta, attempt, Status::PoisonToDlq)
    }
}

async fn begin(open: &mut bool, db: &mut PgConnection) -> Result<()> {
    if !*open {
        store::begin(db).await?;
        *open = true;
    }
    Ok(())
}

fn settled(
    cfg: &ConsumerConfig,
    meta: &MessageMeta,
    attempt: u32,
    status: Status,
) -> Result<Outcome> {
    emit(line(cfg, meta).with("attempt", attempt).status(status));
    Ok(Outcome::Settled)
}

/// An autoAck delivery has nothing to ack: the broker forgot it when it sent it.
async fn ack(def: &PatternDef, d: &Delivery) -> Result<()> {
    if !def.auto_ack {
        d.acker.ack(BasicAckOptions::default()).await?;
    }
    Ok(())
}

fn line(cfg: &ConsumerConfig, meta: &MessageMeta) -> Record {
    Record::new(&cfg.lab)
        .meta(meta)
        .with("destination", &cfg.queue)
}

/// `MQLAB_CAPTURE_HEADERS=DIR` saves each delivery's headers as JSON, so that
/// the x-death parser is tested on what the broker really sent
/// (`tests/data/`), not on tables written by hand.
fn capture_headers(d: &Delivery, meta: &MessageMeta, attempt: u32) {
    if let Some(dir) = std::env::var_os("MQLAB_CAPTURE_HEADERS") {
        let path =
            std::path::Path::new(&dir).join(format!("{}-attempt{attempt}.json", meta.message_id));
        if let Ok(json) = serde_json::to_string(d.properties.headers()) {
            let _ = std::fs::write(path, json);
        }
    }
}
