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
use serde::{Deserialize, Serialize};
use sqlx::{Connection, PgConnection};

use super::{emit, meta_of};
use crate::amqp;
use crate::lab::Retry;
use crate::store::{self, OrderCreated};
use crate::transcript::{MessageMeta, Record};

/// Consumer behaviours a lab or a variant can select.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    Inbox,
    NoInbox,
    AckBeforeCommit,
    AutoAck,
    DedupOutsideTx,
    RequeueForever,
    UnconfirmedDlq,
}

/// Named points in the consumer's code path where a fault can be injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Window {
    AfterReceive,
    AfterInboxCommit,
    BeforeCommit,
    AfterAckBeforeCommit,
    AfterCommitBeforeAck,
    AfterAck,
}

pub struct PatternDef {
    pub pattern: Pattern,
    pub name: &'static str,
    pub safe: bool,
    pub doc: &'static str,
    /// The windows this pattern's code path passes through: a lab naming any
    /// other is rejected, so no fault point is silently ignored.
    pub windows: &'static [Window],
}

use Window::*;

/// One registry drives validation, `mqlab list` and the docs.
pub const PATTERNS: &[PatternDef] = &[
    PatternDef {
        pattern: Pattern::Inbox,
        name: "inbox",
        safe: true,
        doc: "inbox row + business row in one transaction, ack only after commit",
        windows: &[AfterReceive, BeforeCommit, AfterCommitBeforeAck, AfterAck],
    },
    PatternDef {
        pattern: Pattern::NoInbox,
        name: "no-inbox",
        safe: false,
        doc: "business write without the inbox row: a redelivery applies twice",
        windows: &[AfterReceive, BeforeCommit, AfterCommitBeforeAck, AfterAck],
    },
    PatternDef {
        pattern: Pattern::AckBeforeCommit,
        name: "ack-before-commit",
        safe: false,
        doc: "acks, then commits: a crash between them loses the message",
        windows: &[AfterReceive, AfterAckBeforeCommit, AfterAck],
    },
    PatternDef {
        pattern: Pattern::AutoAck,
        name: "auto-ack",
        safe: false,
        doc: "autoAck consumer: the broker forgets a message once sent",
        windows: &[AfterReceive, BeforeCommit],
    },
    PatternDef {
        pattern: Pattern::DedupOutsideTx,
        name: "dedup-outside-tx",
        safe: false,
        doc: "inbox row committed in its own transaction before the business write",
        windows: &[
            AfterReceive,
            AfterInboxCommit,
            BeforeCommit,
            AfterCommitBeforeAck,
            AfterAck,
        ],
    },
    PatternDef {
        pattern: Pattern::RequeueForever,
        name: "requeue-forever",
        safe: false,
        doc: "a failed message is nacked with requeue=true: it loops at the head of the queue",
        windows: &[AfterReceive, BeforeCommit, AfterCommitBeforeAck, AfterAck],
    },
    PatternDef {
        pattern: Pattern::UnconfirmedDlq,
        name: "unconfirmed-dlq",
        safe: false,
        doc: "DLQ publish without confirms, then ack: an unroutable DLQ loses the message",
        windows: &[AfterReceive, BeforeCommit, AfterCommitBeforeAck, AfterAck],
    },
];

pub const WINDOWS: &[(Window, &str, &str)] = &[
    (
        AfterReceive,
        "after-receive",
        "the delivery is logged, nothing is written yet",
    ),
    (
        AfterInboxCommit,
        "after-inbox-commit",
        "the inbox row is committed on its own, the business row is not written",
    ),
    (
        BeforeCommit,
        "before-commit",
        "the business row is written, the transaction is still open",
    ),
    (
        AfterAckBeforeCommit,
        "after-ack-before-commit",
        "the ack is sent, the transaction is still open",
    ),
    (
        AfterCommitBeforeAck,
        "after-commit-before-ack",
        "the transaction has committed, the ack is not sent",
    ),
    (AfterAck, "after-ack", "the ack has been sent"),
];

impl Pattern {
    pub fn parse(s: &str) -> Result<Pattern, String> {
        PATTERNS
            .iter()
            .find(|d| d.name == s)
            .map(|d| d.pattern)
            .ok_or_else(|| {
                let known: Vec<_> = PATTERNS.iter().map(|d| d.name).collect();
                format!(
                    "unknown consumer pattern `{s}` (known: {})",
                    known.join(", ")
                )
            })
    }

    pub fn def(self) -> &'static PatternDef {
        PATTERNS
            .iter()
            .find(|d| d.pattern == self)
            .expect("every pattern is registered")
    }
}

impl Window {
    pub fn parse(s: &str) -> Result<Window, String> {
        WINDOWS
            .iter()
            .find(|(_, n, _)| *n == s)
            .map(|(w, _, _)| *w)
            .ok_or_else(|| {
                let known: Vec<_> = WINDOWS.iter().map(|(_, n, _)| *n).collect();
                format!("unknown fault window `{s}` (known: {})", known.join(", "))
            })
    }

    pub fn name(self) -> &'static str {
        WINDOWS
            .iter()
            .find(|(w, _, _)| *w == self)
            .map(|(_, n, _)| *n)
            .unwrap_or("?")
    }
}

/// The status a role prints when it reaches a selected window.
pub const CRASH_MARKER: &str = "crash_injected";

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FaultPoint {
    pub window: Window,
    pub message: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConsumerConfig {
    pub lab: String,
    pub amqp_url: String,
    pub database_url: String,
    pub queue: String,
    /// The name in the log lines.
    pub consumer: String,
    /// The inbox key's consumer part: stable across restarts, distinct per queue.
    pub inbox_name: String,
    pub pattern: Pattern,
    pub prefetch: u16,
    /// Exit after this many distinct messages reached a final outcome.
    pub settle: usize,
    /// Exit after this many deliveries whatever their outcome (a budget for loops).
    pub max_deliveries: Option<usize>,
    pub retry: Option<Retry>,
    pub fault: Option<FaultPoint>,
}

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

pub async fn run(cfg: ConsumerConfig) -> Result<i32> {
    let conn = amqp::connect(&cfg.amqp_url).await?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(cfg.prefetch, BasicQosOptions::default())
        .await?;
    let confirmed = conn.create_channel().await?;
    confirmed
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let unconfirmed = conn.create_channel().await?;
    let db = store::connect(&cfg.database_url).await?;
    let mut me = Consumer {
        cfg,
        ch: ch.clone(),
        db,
        confirmed,
        unconfirmed,
    };
    let mut settled = BTreeSet::new();
    let mut received = 0;
    let budget_left =
        |received: usize, me: &Consumer| me.cfg.max_deliveries.is_none_or(|m| received < m);
    if me.cfg.settle > 0 && budget_left(received, &me) {
        let mut deliveries = ch
            .basic_consume(
                me.cfg.queue.as_str().into(),
                me.cfg.consumer.as_str().into(),
                BasicConsumeOptions {
                    no_ack: me.cfg.pattern == Pattern::AutoAck,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .with_context(|| format!("consuming from `{}`", me.cfg.queue))?;
        while settled.len() < me.cfg.settle && budget_left(received, &me) {
            let d = deliveries
                .next()
                .await
                .context("the broker closed the consumer")??;
            received += 1;
            let meta = meta_of(&d);
            let attempt = amqp::attempt_from_x_death(d.properties.headers().as_ref());
            capture_headers(&d, &meta, attempt);
            emit(
                me.line(&meta)
                    .with("consumer", &me.cfg.consumer)
                    .with("attempt", attempt)
                    .with("redelivered", d.redelivered)
                    .status("received"),
            );
            me.window(AfterReceive, &meta).await;
            if let Outcome::Settled = me.handle(&d, &meta, attempt).await? {
                settled.insert(meta.message_id);
            }
        }
    }
    emit(
        Record::new(&me.cfg.lab)
            .with("queue", &me.cfg.queue)
            .with("received", received)
            .status("done"),
    );
    conn.close(200, "done".into()).await.ok();
    Ok(0)
}

impl Consumer {
    fn line(&self, meta: &MessageMeta) -> Record {
        line(&self.cfg, meta)
    }

    async fn window(&self, w: Window, meta: &MessageMeta) {
        window(&self.cfg, &self.ch, w, meta).await
    }

    async fn ack(&self, d: &Delivery) -> Result<()> {
        ack(self.cfg.pattern, d).await
    }

    fn settled(&self, meta: &MessageMeta, attempt: u32, status: &str) -> Result<Outcome> {
        emit(self.line(meta).with("attempt", attempt).status(status));
        Ok(Outcome::Settled)
    }

    /// LABS.md's transaction: begin; inbox insert ON CONFLICT DO NOTHING;
    /// duplicate → rollback + ack; else business write, commit, then ack.
    /// Each unsafe pattern removes or reorders exactly one of those steps.
    async fn handle(&mut self, d: &Delivery, meta: &MessageMeta, attempt: u32) -> Result<Outcome> {
        let pattern = self.cfg.pattern;
        let event_id = store::event_id(&d.data, &meta.message_id);
        if pattern == Pattern::DedupOutsideTx {
            if !store::insert_inbox_autocommit(&mut self.db, &self.cfg.inbox_name, &event_id)
                .await?
            {
                self.ack(d).await?;
                return self.settled(meta, attempt, "duplicate_skipped");
            }
            self.window(AfterInboxCommit, meta).await;
        }
        let mut tx = self.db.begin().await?;
        let uses_tx_inbox = !matches!(pattern, Pattern::NoInbox | Pattern::DedupOutsideTx);
        if uses_tx_inbox && !store::insert_inbox(&mut tx, &self.cfg.inbox_name, &event_id).await? {
            tx.rollback().await?;
            self.ack(d).await?;
            return self.settled(meta, attempt, "duplicate_skipped");
        }
        let write = match OrderCreated::parse(&d.data) {
            Ok(order) => {
                store::reserve_inventory(&mut tx, &self.cfg.inbox_name, &meta.message_id, &order)
                    .await
                    .map_err(|e| e.to_string())
            }
            Err(e) => Err(e),
        };
        if let Err(error) = write {
            tx.rollback().await?;
            return self.failed(d, meta, attempt, &error).await;
        }
        if pattern == Pattern::AckBeforeCommit {
            ack(pattern, d).await?;
            window(&self.cfg, &self.ch, AfterAckBeforeCommit, meta).await;
            commit(&self.cfg, tx, meta, attempt).await?;
            self.window(AfterAck, meta).await;
            return Ok(Outcome::Settled);
        }
        window(&self.cfg, &self.ch, BeforeCommit, meta).await;
        commit(&self.cfg, tx, meta, attempt).await?;
        self.window(AfterCommitBeforeAck, meta).await;
        self.ack(d).await?;
        self.window(AfterAck, meta).await;
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
        if self.cfg.pattern == Pattern::RequeueForever {
            d.acker.nack(reject(true)).await?;
            emit(self.line(meta).with("attempt", attempt).status("requeued"));
            return Ok(Outcome::Pending);
        }
        let Some(retry) = self.cfg.retry.clone() else {
            d.acker.nack(reject(false)).await?;
            return self.settled(meta, attempt, "rejected");
        };
        if attempt < retry.max_attempts {
            d.acker.nack(reject(false)).await?;
            emit(self.line(meta).with("attempt", attempt).status("retry"));
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
        if self.cfg.pattern == Pattern::UnconfirmedDlq {
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
        self.settled(meta, attempt, "poison_to_dlq")
    }
}

/// Commits and says so: the line is printed only once the commit returned.
async fn commit(
    cfg: &ConsumerConfig,
    tx: sqlx::Transaction<'_, sqlx::Postgres>,
    meta: &MessageMeta,
    attempt: u32,
) -> Result<()> {
    tx.commit().await?;
    emit(
        line(cfg, meta)
            .with("attempt", attempt)
            .status("business_committed"),
    );
    Ok(())
}

/// An autoAck delivery has nothing to ack: the broker forgot it when it sent it.
async fn ack(pattern: Pattern, d: &Delivery) -> Result<()> {
    if pattern != Pattern::AutoAck {
        d.acker.ack(BasicAckOptions::default()).await?;
    }
    Ok(())
}

fn line(cfg: &ConsumerConfig, meta: &MessageMeta) -> Record {
    Record::new(&cfg.lab)
        .meta(meta)
        .with("destination", &cfg.queue)
}

/// Blocks forever at the selected window; the harness does the killing, so
/// the process dies exactly as a crashed one would. A synchronous round trip
/// on the channel first: the broker handles a channel's frames in order, so
/// an ack sent before the window has been processed when the marker appears
/// (a kill cannot race an ack still in a socket buffer).
async fn window(cfg: &ConsumerConfig, ch: &Channel, w: Window, meta: &MessageMeta) {
    if let Some(f) = &cfg.fault {
        if f.window == w && f.message == meta.message_id {
            if let Err(e) = ch.basic_qos(cfg.prefetch, BasicQosOptions::default()).await {
                tracing::warn!("window barrier failed: {e}");
            }
            emit(line(cfg, meta).status(CRASH_MARKER));
            std::future::pending::<()>().await;
        }
    }
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
