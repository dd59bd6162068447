//! The producer role: publishes a lab's messages one at a time, each
//! waiting for its publisher confirm (unless the lab turns confirms off).
//! Its journal (an outbox of its own, a file that survives a SIGKILL) says
//! what it sent and what was confirmed: a restarted producer resends, with
//! the same eventId and a new message id (`mid-2.2`), what it sent and never
//! saw confirmed, and skips what was. A nack or a confirm timeout is logged
//! and the message sent again; a mandatory publish the broker returns, and a
//! nack when the lab names a parking queue, is logged and published there
//! (confirmed). An order service's outbox relay keeps a nacked row unsent
//! for a later pass instead.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::{emit, now_ms, PUBLISHED_AT};
use crate::broker::{self, Answer, Outgoing, Publisher};
use crate::faults::point;
use crate::protocol::{OrderService, OutMessage, ProducerConfig};
use crate::store;
use crate::transcript::{MessageMeta, Record};
use crate::vocab::{Handoff, Status, Window, PARKED_BY};

/// Sends of one message before the producer gives up on it.
const MAX_SENDS: u32 = 5;

/// What the producer wrote down before it was (maybe) killed.
#[derive(Default)]
struct Journal {
    sent: BTreeMap<String, u32>,
    done: BTreeSet<String>,
}

impl Journal {
    fn load(path: &Path) -> Result<Journal> {
        let mut j = Journal::default();
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(j),
            Err(e) => return Err(e).context("reading the producer's journal"),
        };
        for line in text.lines() {
            match line.split_once(' ') {
                Some(("sent", m)) => *j.sent.entry(m.to_string()).or_default() += 1,
                Some(("done", m)) => {
                    j.done.insert(m.to_string());
                }
                _ => {}
            }
        }
        Ok(j)
    }

    /// One line per event; a write reaches the kernel at once, so a SIGKILL
    /// of the producer cannot lose it.
    fn append(path: &Path, what: &str, message: &str) -> Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .context("opening the producer's journal")?;
        writeln!(f, "{what} {message}").context("writing the producer's journal")
    }
}

/// A link to the broker, in confirm mode if the lab asks.
async fn open(cfg: &ProducerConfig) -> Result<Link> {
    broker::publisher(&cfg.broker_url, cfg.confirm).await
}

type Link = Box<dyn Publisher>;

pub async fn run(cfg: ProducerConfig) -> Result<i32> {
    if let Some(svc) = cfg.orders.clone() {
        return order_service(&cfg, &svc).await;
    }
    if let Some(size) = cfg.batch {
        return batching(&cfg, size).await;
    }
    let journal = Journal::load(&cfg.journal)?;
    let mut link = open(&cfg).await?;
    let mut confirmed = 0;
    for m in &cfg.messages {
        let base = &m.meta.message_id;
        if journal.done.contains(base) {
            continue;
        }
        if !cfg.resend && journal.sent.contains_key(base) {
            // Sent before the restart, never confirmed: this producer takes
            // it as delivered, as if it had sent it without a confirm.
            emit(
                line(&cfg, &m.meta)
                    .with("routingKey", &m.routing_key)
                    .status(Status::Unconfirmed),
            );
            continue;
        }
        let sends = journal.sent.get(base).copied().unwrap_or(0);
        if send(&cfg, &mut link, m, sends).await? == Status::Confirmed {
            confirmed += 1;
        }
    }
    finish(&cfg, link, confirmed).await
}

/// Article 002's order service: each message is an order, committed in the
/// service's database before anything is published. `direct`: then its
/// event is published. `outbox`: the event is an outbox row of the same
/// transaction (`outbox-after-commit`: of a transaction of its own, after),
/// and once the orders are in, a relay publishes each unsent row and marks
/// it sent after the broker's confirm. A restarted service
/// takes an order it finds committed as done (the request that made it is
/// over); its relay publishes again a row never marked sent.
async fn order_service(cfg: &ProducerConfig, svc: &OrderService) -> Result<i32> {
    let journal = Journal::load(&cfg.journal)?;
    let mut db = store::connect(&svc.database_url).await?;
    let mut link = open(cfg).await?;
    let mut confirmed = 0;
    if svc.reconcile {
        // Article 002's last resort: compare the orders with what was
        // applied, and publish again what is missing.
        for m in &cfg.messages {
            let event_id = store::event_id(m.body.as_bytes(), &m.meta.message_id);
            if !store::order_without_event(&mut db, &event_id).await? {
                continue;
            }
            emit(line(cfg, &m.meta).status(Status::Reconcile));
            let sends = journal.sent.get(&m.meta.message_id).copied().unwrap_or(0);
            if send(cfg, &mut link, m, sends).await? == Status::Confirmed {
                confirmed += 1;
            }
        }
        return finish(cfg, link, confirmed).await;
    }
    if svc.relay {
        // The relay's next pass alone: the orders are in.
        return relay(cfg, svc, &mut db, link, &journal, confirmed).await;
    }
    for m in &cfg.messages {
        let (event_id, mid) = (
            store::event_id(m.body.as_bytes(), &m.meta.message_id),
            m.meta.message_id.as_str(),
        );
        let same_tx = svc.handoff.is_outbox() && svc.handoff != Handoff::OutboxAfterCommit;
        let row = same_tx.then_some(mid);
        if !store::commit_order(&mut db, &event_id, &m.meta.aggregate_id, row).await? {
            emit(line(cfg, &m.meta).status(Status::OrderExists));
            continue;
        }
        emit(line(cfg, &m.meta).status(Status::OrderCommitted));
        let barrier = link.barrier();
        point::reach(
            &cfg.faults,
            Window::AfterOrderCommit,
            &m.meta,
            line(cfg, &m.meta),
            barrier,
        )
        .await;
        match svc.handoff {
            Handoff::Direct => {
                if send(cfg, &mut link, m, 0).await? == Status::Confirmed {
                    confirmed += 1;
                }
            }
            Handoff::OutboxAfterCommit => store::add_to_outbox(&mut db, &event_id, mid).await?,
            Handoff::Outbox | Handoff::OutboxMarkFirst => {}
        }
    }
    relay(cfg, svc, &mut db, link, &journal, confirmed).await
}

/// The relay: what the outbox holds unsent, in commit order, each row
/// published and marked sent after the broker's confirm. The service's own
/// pass relays the rows of its messages; a pass of its own (`relay`)
/// relays any unsent row, under this step's message of its event (a new
/// message id, the same eventId; a row whose event the step does not list
/// is an error). A nack (a full queue under `reject-publish`) leaves the
/// row unsent for a later pass and ends this one (the rows behind it keep
/// their order); a return is an error, as is a nack of a relay that marks
/// first (it resends, as a plain producer does). A relay that does not
/// resend (`resend = false`) takes a refusal as done and marks the row.
async fn relay(
    cfg: &ProducerConfig,
    svc: &OrderService,
    db: &mut sqlx::PgConnection,
    mut link: Link,
    journal: &Journal,
    mut confirmed: usize,
) -> Result<i32> {
    let mark_first = svc.handoff == Handoff::OutboxMarkFirst;
    for (row, event_id) in store::unsent(db).await? {
        let m = cfg.messages.iter().find(|m| {
            m.meta.message_id == row
                || svc.relay && store::event_id(m.body.as_bytes(), &m.meta.message_id) == event_id
        });
        let Some(m) = m else {
            if svc.relay {
                bail!("the relay's pass lists no message of event {event_id}, whose outbox row ({row}) is unsent: list its fixture in the step");
            }
            continue;
        };
        // The line names the row when another message carries its event.
        let says = |status| {
            let l = line(cfg, &m.meta);
            match row == m.meta.message_id {
                true => l.status(status),
                false => l.with("row", &row).status(status),
            }
        };
        if mark_first {
            store::mark_sent(db, &row).await?;
            emit(says(Status::OutboxSent));
        }
        let sends = journal.sent.get(&m.meta.message_id).copied().unwrap_or(0);
        match send(cfg, &mut link, m, sends).await? {
            Status::Confirmed => confirmed += 1,
            Status::Nacked if cfg.resend => {
                emit(says(Status::OutboxKept));
                break;
            }
            Status::Nacked | Status::Returned if cfg.resend => {
                bail!("the relay's publish of {row} was not confirmed; its outbox row stays unsent")
            }
            // Published without a confirm, or a refusal taken as done.
            _ => {}
        }
        if !mark_first {
            store::mark_sent(db, &row).await?;
            emit(says(Status::OutboxSent));
        }
    }
    finish(cfg, link, confirmed).await
}

/// Article 002: "a send call that returns may only mean the message
/// entered the client's buffer; exiting without waiting for the in-flight
/// sends may lose the memory buffer". A client-side batch: each message is
/// buffered (`buffered`: the send call returned), the batch sent when it
/// holds `size` and, with `flush`, when the producer closes; without the
/// flush it exits holding what is buffered, which never reaches the broker.
async fn batching(cfg: &ProducerConfig, size: usize) -> Result<i32> {
    let mut link = open(cfg).await?;
    let mut confirmed = 0;
    let mut buffer: Vec<&OutMessage> = Vec::new();
    for m in &cfg.messages {
        emit(
            line(cfg, &m.meta)
                .with("routingKey", &m.routing_key)
                .status(Status::Buffered),
        );
        buffer.push(m);
        if buffer.len() == size {
            confirmed += flush(cfg, &mut link, &mut buffer).await?;
        }
    }
    if cfg.flush {
        confirmed += flush(cfg, &mut link, &mut buffer).await?;
    }
    finish(cfg, link, confirmed).await
}

/// Sends what the batch holds, each until the broker answered; how many
/// were confirmed.
async fn flush(
    cfg: &ProducerConfig,
    link: &mut Link,
    buffer: &mut Vec<&OutMessage>,
) -> Result<usize> {
    let mut confirmed = 0;
    for m in buffer.drain(..) {
        if send(cfg, link, m, 0).await? == Status::Confirmed {
            confirmed += 1;
        }
    }
    Ok(confirmed)
}

/// The producer's closing line, with how many publishes were confirmed.
async fn finish(cfg: &ProducerConfig, link: Link, confirmed: usize) -> Result<i32> {
    emit(
        Record::new(cfg.broker, &cfg.lab)
            .with("destination", &cfg.destination)
            .with("confirmed", confirmed)
            .status(Status::Done),
    );
    link.close().await;
    Ok(0)
}

/// Sends `m` until the broker has answered for it (a confirm, a return, a
/// nack it parks, takes as done or, as an outbox relay, keeps; or nothing
/// asked), under a message id of its own on each resend after the `sends`
/// before; the answer it ended with.
async fn send(
    cfg: &ProducerConfig,
    link: &mut Link,
    m: &OutMessage,
    mut sends: u32,
) -> Result<Status> {
    let base = &m.meta.message_id;
    loop {
        sends += 1;
        if sends > MAX_SENDS {
            bail!("{base}: no confirm after {MAX_SENDS} sends");
        }
        let mut meta = m.meta.clone();
        if sends > 1 {
            meta.message_id = format!("{base}.{sends}");
        }
        Journal::append(&cfg.journal, "sent", base)?;
        let status = match publish(cfg, &**link, m, &meta).await {
            Ok(status) => status,
            // Its node is gone: whether the broker kept the message is
            // unknown, so it is sent again on a new connection (the
            // harness's proxy leads it to a live node).
            Err(e) if cfg.reconnect && !link.connected() => {
                tracing::warn!("connection lost: {e:#}");
                emit(
                    line(cfg, &meta)
                        .with("routingKey", &m.routing_key)
                        .status(Status::ConnectionLost),
                );
                *link = open(cfg).await?;
                continue;
            }
            Err(e) => return Err(e),
        };
        match status {
            Status::Confirmed | Status::Unconfirmed => {
                Journal::append(&cfg.journal, "done", base)?;
                if status == Status::Confirmed {
                    point::reach(
                        &cfg.faults,
                        Window::AfterConfirm,
                        &meta,
                        line(cfg, &meta),
                        link.barrier(),
                    )
                    .await;
                }
                return Ok(status);
            }
            // A producer that does not resend takes a confirm that did not
            // come in time as delivered: it cannot tell a lost publish from
            // a lost confirm, and does not try.
            Status::ConfirmTimeout if !cfg.resend => {
                Journal::append(&cfg.journal, "done", base)?;
                return Ok(status);
            }
            // A nack (a full queue with `reject-publish`) is handed to the
            // parking queue, the producer's outbox, when the lab names one;
            // a producer that neither parks nor resends takes it as done;
            // an outbox relay keeps its row unsent for a later pass.
            Status::Nacked if cfg.park.is_some() || !cfg.resend || keeps_nacked_rows(cfg) => {
                if let Some(park) = &cfg.park {
                    park_it(cfg, &**link, m, &meta, park).await?;
                }
                Journal::append(&cfg.journal, "done", base)?;
                return Ok(status);
            }
            Status::Returned => {
                if let Some(park) = &cfg.park {
                    park_it(cfg, &**link, m, &meta, park).await?;
                }
                Journal::append(&cfg.journal, "done", base)?;
                return Ok(status);
            }
            // Sent again, as the same event.
            _ => continue,
        }
    }
}

/// The producer is an outbox relay that marks a row after its confirm: a
/// row the broker nacks stays in its outbox (one that marks first has
/// marked it already, and resends as a plain producer does).
fn keeps_nacked_rows(cfg: &ProducerConfig) -> bool {
    cfg.orders
        .as_ref()
        .is_some_and(|o| o.handoff.is_outbox() && o.handoff != Handoff::OutboxMarkFirst)
}

fn line(cfg: &ProducerConfig, meta: &MessageMeta) -> Record {
    Record::new(cfg.broker, &cfg.lab)
        .meta(meta)
        .with("destination", &cfg.destination)
}

/// With `timestamp`, when it left in seconds: what a queue reports the
/// age of its oldest message from.
fn stamped(cfg: &ProducerConfig) -> Option<u64> {
    cfg.timestamp.then(|| (now_ms() / 1000) as u64)
}

/// One send and its outcome, logged.
async fn publish(
    cfg: &ProducerConfig,
    link: &dyn Publisher,
    m: &OutMessage,
    meta: &MessageMeta,
) -> Result<Status> {
    let started = Instant::now();
    // A per-message TTL, and when it left, for the consumer to measure how
    // long the message really waited.
    let headers = match m.expiration_ms {
        Some(_) => vec![(PUBLISHED_AT, now_ms().to_string())],
        None => vec![],
    };
    let pending = link
        .publish(Outgoing {
            destination: &cfg.exchange,
            routing_key: &m.routing_key,
            body: m.body.as_bytes(),
            meta,
            persistent: cfg.persistent,
            mandatory: cfg.mandatory,
            timestamp_s: stamped(cfg),
            expiration_ms: m.expiration_ms,
            headers,
        })
        .await
        .with_context(|| format!("publishing {}", meta.message_id))?;
    point::reach(
        &cfg.faults,
        Window::AfterPublishBeforeConfirm,
        meta,
        line(cfg, meta),
        link.barrier(),
    )
    .await;
    let outcome = match cfg.confirm_timeout_ms {
        Some(ms) => tokio::time::timeout(Duration::from_millis(ms), pending)
            .await
            .ok(),
        None => Some(pending.await),
    };
    let status = match outcome {
        None => Status::ConfirmTimeout,
        Some(Ok(Answer::Confirmed)) => Status::Confirmed,
        Some(Ok(Answer::Returned)) => Status::Returned,
        Some(Ok(Answer::Nacked)) => Status::Nacked,
        Some(Ok(Answer::Unconfirmed)) => Status::Unconfirmed,
        Some(Err(e)) => {
            return Err(e)
                .with_context(|| format!("waiting for the confirm of {}", meta.message_id))
        }
    };
    emit(
        line(cfg, meta)
            .with("routingKey", &m.routing_key)
            .with("durationMs", started.elapsed().as_millis())
            .status(status),
    );
    Ok(status)
}

/// A returned message goes to the parking queue, confirmed, where someone
/// can look at it: reported, not dropped.
async fn park_it(
    cfg: &ProducerConfig,
    link: &dyn Publisher,
    m: &OutMessage,
    meta: &MessageMeta,
    park: &str,
) -> Result<()> {
    let confirm = link
        .publish(Outgoing {
            destination: "",
            routing_key: park,
            body: m.body.as_bytes(),
            meta,
            persistent: true,
            mandatory: true,
            timestamp_s: stamped(cfg),
            expiration_ms: None,
            headers: vec![(PARKED_BY, "producer".to_string())],
        })
        .await?
        .await?;
    if confirm != Answer::Confirmed {
        bail!(
            "parking {} in `{park}` was not confirmed: {confirm:?}",
            meta.message_id
        );
    }
    emit(
        Record::new(cfg.broker, &cfg.lab)
            .meta(meta)
            .with("destination", park)
            .with("routingKey", park)
            .status(Status::Parked),
    );
    Ok(())
}
