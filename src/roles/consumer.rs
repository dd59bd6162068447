//! The consumer role: manual ack, the inbox transaction of LABS.md, retries by
//! dead-lettering, and the DLQ move with publisher confirms. Its fault windows
//! are named points in this code path; a window selected for a message prints
//! a marker and blocks until the harness kills the process.

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

/// Consumer behaviours a lab can select. One registry drives validation,
/// `mqlab list` and the docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    Inbox,
}

pub const PATTERNS: &[(Pattern, &str, &str)] = &[(
    Pattern::Inbox,
    "inbox",
    "inbox row + business row in one transaction, ack only after commit",
)];

impl Pattern {
    pub fn parse(s: &str) -> Result<Pattern, String> {
        PATTERNS
            .iter()
            .find(|(_, n, _)| *n == s)
            .map(|(p, _, _)| *p)
            .ok_or_else(|| {
                let known: Vec<_> = PATTERNS.iter().map(|(_, n, _)| *n).collect();
                format!(
                    "unknown consumer pattern `{s}` (known: {})",
                    known.join(", ")
                )
            })
    }
}

/// Named points in the consumer's code path where a fault can be injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Window {
    AfterReceive,
    BeforeCommit,
    AfterCommitBeforeAck,
    AfterAck,
}

pub const WINDOWS: &[(Window, &str, &str)] = &[
    (
        Window::AfterReceive,
        "after-receive",
        "the delivery is logged, nothing is written yet",
    ),
    (
        Window::BeforeCommit,
        "before-commit",
        "the business row is written, the transaction is still open",
    ),
    (
        Window::AfterCommitBeforeAck,
        "after-commit-before-ack",
        "the transaction has committed, the ack is not sent",
    ),
    (Window::AfterAck, "after-ack", "the ack has been sent"),
];

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
    pub retry: Option<Retry>,
    pub fault: Option<FaultPoint>,
}

enum Outcome {
    Settled,
    Retrying,
}

struct Consumer {
    cfg: ConsumerConfig,
    db: PgConnection,
    /// In confirm mode: a DLQ move is acknowledged only after the broker confirms it.
    publisher: Channel,
}

pub async fn run(cfg: ConsumerConfig) -> Result<i32> {
    let conn = amqp::connect(&cfg.amqp_url).await?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(cfg.prefetch, BasicQosOptions::default())
        .await?;
    let publisher = conn.create_channel().await?;
    publisher
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let db = store::connect(&cfg.database_url).await?;
    let mut deliveries = ch
        .basic_consume(
            cfg.queue.as_str().into(),
            cfg.consumer.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("consuming from `{}`", cfg.queue))?;
    let mut me = Consumer { cfg, db, publisher };
    let mut settled = BTreeSet::new();
    let mut received = 0;
    while settled.len() < me.cfg.settle {
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
        me.window(Window::AfterReceive, &meta).await;
        if let Outcome::Settled = me.handle(&d, &meta, attempt).await? {
            settled.insert(meta.message_id);
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
        window(&self.cfg, w, meta).await
    }

    async fn handle(&mut self, d: &Delivery, meta: &MessageMeta, attempt: u32) -> Result<Outcome> {
        match self.cfg.pattern {
            Pattern::Inbox => self.inbox(d, meta, attempt).await,
        }
    }

    /// LABS.md's transaction: begin; inbox insert ON CONFLICT DO NOTHING;
    /// duplicate → rollback + ack; else business write, commit, then ack.
    async fn inbox(&mut self, d: &Delivery, meta: &MessageMeta, attempt: u32) -> Result<Outcome> {
        let event_id = store::event_id(&d.data, &meta.message_id);
        let mut tx = self.db.begin().await?;
        if !store::insert_inbox(&mut tx, &self.cfg.inbox_name, &event_id).await? {
            tx.rollback().await?;
            d.acker.ack(BasicAckOptions::default()).await?;
            emit(
                self.line(meta)
                    .with("attempt", attempt)
                    .status("duplicate_skipped"),
            );
            return Ok(Outcome::Settled);
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
        window(&self.cfg, Window::BeforeCommit, meta).await;
        tx.commit().await?;
        emit(
            self.line(meta)
                .with("attempt", attempt)
                .status("business_committed"),
        );
        self.window(Window::AfterCommitBeforeAck, meta).await;
        d.acker.ack(BasicAckOptions::default()).await?;
        self.window(Window::AfterAck, meta).await;
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
        let Some(retry) = self.cfg.retry.clone() else {
            d.acker
                .nack(BasicNackOptions {
                    requeue: false,
                    multiple: false,
                })
                .await?;
            emit(self.line(meta).with("attempt", attempt).status("rejected"));
            return Ok(Outcome::Settled);
        };
        if attempt < retry.max_attempts {
            d.acker
                .nack(BasicNackOptions {
                    requeue: false,
                    multiple: false,
                })
                .await?;
            emit(self.line(meta).with("attempt", attempt).status("retry"));
            return Ok(Outcome::Retrying);
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
        let confirm = self
            .publisher
            .basic_publish(
                "".into(),
                retry.dlq.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                &d.data,
                d.properties.clone().with_headers(headers),
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
        d.acker.ack(BasicAckOptions::default()).await?;
        emit(
            self.line(meta)
                .with("attempt", attempt)
                .status("poison_to_dlq"),
        );
        Ok(Outcome::Settled)
    }
}

fn line(cfg: &ConsumerConfig, meta: &MessageMeta) -> Record {
    Record::new(&cfg.lab)
        .meta(meta)
        .with("destination", &cfg.queue)
}

/// Blocks forever at the selected window; the harness does the killing, so
/// the process dies exactly as a crashed one would.
async fn window(cfg: &ConsumerConfig, w: Window, meta: &MessageMeta) {
    if let Some(f) = &cfg.fault {
        if f.window == w && f.message == meta.message_id {
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
