//! AMQP plumbing shared by the harness and the roles: connections, the lab's
//! topology, queue depth, x-death, and the broker's own version.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::{Channel, Connection, ConnectionProperties};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::broker::admin::{HomeNodeDown, Peeked};
use crate::vocab::{ArgValue, ExchangeKind, Topology};

pub async fn connect(url: &str) -> Result<Connection> {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .context("cannot connect to the broker")
}

/// Declares the topology, except what the lab declares later.
pub async fn declare(channel: &Channel, topology: &Topology) -> Result<()> {
    declare_where(channel, topology, |later, _| !later, |later, _| !later).await
}

/// Declares the named `later` exchanges and queues, and the named queues a
/// `delete` step deleted (a lab's `declare` step).
pub async fn declare_later(channel: &Channel, topology: &Topology, names: &[String]) -> Result<()> {
    let named = |name: &str| names.iter().any(|n| n == name);
    declare_where(
        channel,
        topology,
        |later, name| later && named(name),
        |_, name| named(name),
    )
    .await
}

/// Deletes one queue, whatever it holds (`queue.delete` with neither
/// `if-empty` nor `if-unused`, as `rabbitmqctl delete_queue` does); the
/// message count of its `delete-ok` (the ready messages it held).
pub async fn delete_queue(channel: &Channel, queue: &str) -> Result<u32> {
    channel
        .queue_delete(queue.into(), lapin::options::QueueDeleteOptions::default())
        .await
        .with_context(|| format!("deleting queue `{queue}`"))
}

/// Deletes the topology's queues (a run reusing another's vhost).
pub async fn delete_queues(channel: &Channel, topology: &Topology) -> Result<()> {
    for q in &topology.queues {
        channel
            .queue_delete(
                q.name.as_str().into(),
                lapin::options::QueueDeleteOptions::default(),
            )
            .await
            .with_context(|| format!("deleting queue `{}`", q.name))?;
    }
    Ok(())
}

/// Declares the exchanges and the queues (with their bindings) each pick
/// takes, given whether it is marked `later` and its name.
async fn declare_where(
    channel: &Channel,
    topology: &Topology,
    pick_exchange: impl Fn(bool, &str) -> bool,
    pick_queue: impl Fn(bool, &str) -> bool,
) -> Result<()> {
    for x in topology
        .exchanges
        .iter()
        .filter(|x| pick_exchange(x.later, &x.name))
    {
        let kind = match x.kind {
            ExchangeKind::Direct => lapin::ExchangeKind::Direct,
            ExchangeKind::Topic => lapin::ExchangeKind::Topic,
            ExchangeKind::Fanout => lapin::ExchangeKind::Fanout,
            ExchangeKind::Headers => lapin::ExchangeKind::Headers,
        };
        let opts = ExchangeDeclareOptions {
            durable: x.durable,
            ..Default::default()
        };
        channel
            .exchange_declare(x.name.as_str().into(), kind, opts, FieldTable::default())
            .await
            .with_context(|| format!("declaring exchange `{}`", x.name))?;
    }
    for q in topology
        .queues
        .iter()
        .filter(|q| pick_queue(q.later, &q.name))
    {
        let opts = QueueDeclareOptions {
            durable: q.durable,
            ..Default::default()
        };
        channel
            .queue_declare(q.name.as_str().into(), opts, queue_arguments(&q.arguments))
            .await
            .with_context(|| format!("declaring queue `{}`", q.name))?;
        for (exchange, key) in &q.bindings {
            channel
                .queue_bind(
                    q.name.as_str().into(),
                    exchange.as_str().into(),
                    key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .with_context(|| format!("binding `{}` to `{exchange}`", q.name))?;
        }
    }
    Ok(())
}

fn queue_arguments(args: &BTreeMap<String, ArgValue>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in args {
        let value = match v {
            ArgValue::Str(s) => AMQPValue::LongString(s.as_str().into()),
            ArgValue::Int(i) => AMQPValue::LongLongInt(*i),
            ArgValue::Bool(b) => AMQPValue::Boolean(*b),
        };
        t.insert(ShortString::from(k.as_str()), value);
    }
    t
}

/// Ready messages and consumers of a queue, as the broker reports them.
pub async fn queue_state(channel: &Channel, queue: &str) -> Result<(u32, u32)> {
    let q = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| match home_node_down(&e) {
            true => anyhow::Error::new(HomeNodeDown(queue.to_string())),
            false => anyhow::Error::new(e),
        })
        .with_context(|| format!("reading the depth of queue `{queue}`"))?;
    Ok((q.message_count(), q.consumer_count()))
}

/// RabbitMQ says it as a 404 NOT_FOUND whose reply text decides (the code
/// alone is also "no such queue"): 3.10 answers at once, naming the home
/// node ("... is down or inaccessible"); 4.0 keeps the queue's record when
/// its node goes down and answers only after retrying the queue's process
/// for about 60 s ("failed to perform operation on queue ... due to
/// timeout", measured on 4.0.5).
fn home_node_down(e: &lapin::Error) -> bool {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    matches!(e.kind(), lapin::ErrorKind::ProtocolError(p)
        if *p.kind() == AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND)
            && (p.get_message().as_str().contains("is down or inaccessible")
                || p.get_message().as_str().contains("due to timeout")))
}

/// The messages waiting in a queue (message id, body), read without
/// consuming them: fetched unacked on a channel of their own, then requeued
/// when it closes.
pub async fn peek(conn: &lapin::Connection, queue: &str) -> Result<Vec<Peeked>> {
    let ch = conn.create_channel().await?;
    let mut ids = Vec::new();
    while let Some(m) = ch
        .basic_get(
            queue.into(),
            lapin::options::BasicGetOptions { no_ack: false },
        )
        .await
        .with_context(|| format!("reading queue `{queue}`"))?
    {
        let p = &m.delivery.properties;
        ids.push(Peeked {
            message_id: p
                .message_id()
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_default(),
            body: m.delivery.data.clone(),
            headers: p.headers().as_ref().map(string_headers).unwrap_or_default(),
        });
    }
    ch.close(200, "peeked".into()).await?;
    Ok(ids)
}

/// Moves every ready message of `from` into `to` (the default exchange,
/// routing key `to`), as an operator's DLQ replay does: each published
/// with its properties and headers (a consumer's `retry-attempt` too: a
/// replayed copy keeps its attempt count), `mandatory` and confirmed, and
/// only then acked in `from`; a copy returned or refused stops the replay
/// with the original back in `from`. How many it moved.
pub async fn replay(conn: &lapin::Connection, from: &str, to: &str) -> Result<usize> {
    use lapin::options::{
        BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
    };
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut moved = 0;
    while let Some(m) = ch
        .basic_get(from.into(), BasicGetOptions { no_ack: false })
        .await
        .with_context(|| format!("reading queue `{from}`"))?
    {
        let d = &m.delivery;
        let publish = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        let confirm = ch
            .basic_publish("".into(), to.into(), publish, &d.data, d.properties.clone())
            .await?
            .await?;
        if !matches!(confirm, lapin::Confirmation::Ack(None)) {
            // Closing the channel puts the unacked original back in `from`.
            let _ = ch.close(200, "replay stopped".into()).await;
            anyhow::bail!(
                "replaying a message of `{from}` into `{to}`: not confirmed ({confirm:?})"
            );
        }
        ch.basic_ack(d.delivery_tag, BasicAckOptions::default())
            .await?;
        moved += 1;
    }
    ch.close(200, "replayed".into()).await?;
    Ok(moved)
}

/// The headers with a string or integer value, as text.
pub fn string_headers(h: &FieldTable) -> BTreeMap<String, String> {
    h.inner()
        .keys()
        .filter_map(|k| Some((k.to_string(), header_str(Some(h), k.as_str())?)))
        .collect()
}

pub fn header_str(headers: Option<&FieldTable>, key: &str) -> Option<String> {
    match headers?.inner().get(key)? {
        AMQPValue::LongString(s) => Some(s.to_string()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        AMQPValue::LongInt(i) => Some(i.to_string()),
        AMQPValue::LongLongInt(i) => Some(i.to_string()),
        AMQPValue::ShortInt(i) => Some(i.to_string()),
        _ => None,
    }
}

pub fn set_header(headers: &mut FieldTable, key: &str, value: &str) {
    headers.insert(key.into(), AMQPValue::LongString(value.into()));
}

pub fn string_table(pairs: &[(&str, &str)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in pairs {
        t.insert((*k).into(), AMQPValue::LongString(LongString::from(*v)));
    }
    t
}

/// `1 + sum of x-death counts whose reason is rejected`. x-death keeps one
/// entry per (queue, reason), so a single entry's count is not the total.
pub fn attempt_from_x_death(headers: Option<&FieldTable>) -> u32 {
    let Some(AMQPValue::FieldArray(deaths)) = headers.and_then(|h| h.inner().get("x-death")) else {
        return 1;
    };
    1 + rejected_deaths(deaths)
}

/// A counterexample's reading: `1 + the first x-death entry's count`, of
/// whatever queue and reason. The broker puts the latest (queue, reason)
/// first, so in a loop of one rejecting queue this equals the sum; once a
/// message was rejected from two queues it is short.
pub fn attempt_from_first_x_death(headers: Option<&FieldTable>) -> u32 {
    let Some(AMQPValue::FieldArray(deaths)) = headers.and_then(|h| h.inner().get("x-death")) else {
        return 1;
    };
    1 + deaths
        .as_slice()
        .iter()
        .find_map(|d| match d {
            AMQPValue::FieldTable(t) => Some(death_count(t)),
            _ => None,
        })
        .unwrap_or(0)
}

fn rejected_deaths(deaths: &FieldArray) -> u32 {
    deaths
        .as_slice()
        .iter()
        .filter_map(|d| match d {
            AMQPValue::FieldTable(t) => Some(t),
            _ => None,
        })
        .filter(|t| {
            matches!(t.inner().get("reason"), Some(AMQPValue::LongString(r)) if r.to_string() == "rejected")
        })
        .map(death_count)
        .sum()
}

fn death_count(entry: &FieldTable) -> u32 {
    match entry.inner().get("count") {
        Some(AMQPValue::LongLongInt(n)) => *n as u32,
        Some(AMQPValue::LongInt(n)) => *n as u32,
        Some(AMQPValue::LongUInt(n)) => *n,
        Some(AMQPValue::ShortInt(n)) => *n as u32,
        _ => 0,
    }
}

/// Reads the broker's `product` and `version` from its Connection.Start
/// frame: the version of the server actually running, not of a package.
pub async fn broker_version(host: &str, port: u16) -> Result<String> {
    let mut s = tokio::net::TcpStream::connect((host, port)).await?;
    s.write_all(b"AMQP\x00\x00\x09\x01").await?;
    let mut head = [0u8; 7];
    s.read_exact(&mut head).await?;
    let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]) as usize;
    anyhow::ensure!(
        head[0] == 1 && size < 1 << 20,
        "not an AMQP 0-9-1 method frame"
    );
    let mut payload = vec![0u8; size];
    s.read_exact(&mut payload).await?;
    // class id, method id, version-major, version-minor, then the properties table
    let (_, props) = lapin::types::parsing::parse_field_table(&payload[6..])
        .map_err(|e| anyhow::anyhow!("cannot parse Connection.Start: {e:?}"))?;
    let get = |k: &str| header_str(Some(&props), k).unwrap_or_else(|| "unknown".into());
    Ok(format!("{} {}", get("product"), get("version")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn death(queue: &str, reason: &str, count: i64) -> AMQPValue {
        let mut t = FieldTable::default();
        t.insert("queue".into(), AMQPValue::LongString(queue.into()));
        t.insert("reason".into(), AMQPValue::LongString(reason.into()));
        t.insert("count".into(), AMQPValue::LongLongInt(count));
        t.insert("exchange".into(), AMQPValue::LongString("".into()));
        AMQPValue::FieldTable(t)
    }

    fn headers(deaths: Vec<AMQPValue>) -> FieldTable {
        let mut h = FieldTable::default();
        h.insert("x-death".into(), AMQPValue::FieldArray(deaths.into()));
        h
    }

    /// Headers the consumer captured from RabbitMQ 3.10.8 in the retry-dlq lab
    /// (`MQLAB_CAPTURE_HEADERS`): the poison message on its 1st, 2nd, 3rd delivery.
    #[test]
    fn attempts_from_headers_captured_from_the_broker() {
        for (n, json) in [
            (
                1,
                include_str!("../../../tests/data/x-death-rabbitmq-3.10-attempt1.json"),
            ),
            (
                2,
                include_str!("../../../tests/data/x-death-rabbitmq-3.10-attempt2.json"),
            ),
            (
                3,
                include_str!("../../../tests/data/x-death-rabbitmq-3.10-attempt3.json"),
            ),
        ] {
            let h: FieldTable = serde_json::from_str(json).unwrap();
            assert_eq!(attempt_from_x_death(Some(&h)), n, "capture {n}");
        }
    }

    #[test]
    fn no_x_death_is_first_attempt() {
        assert_eq!(attempt_from_x_death(None), 1);
        assert_eq!(attempt_from_x_death(Some(&FieldTable::default())), 1);
    }

    /// The shape RabbitMQ 3.10 sends after a reject from `orders.work` and a TTL
    /// expiry in `orders.retry`, twice: one entry per (queue, reason).
    #[test]
    fn counts_only_rejections_across_entries() {
        let h = headers(vec![
            death("orders.retry", "expired", 2),
            death("orders.work", "rejected", 2),
        ]);
        assert_eq!(attempt_from_x_death(Some(&h)), 3);
    }

    /// In the one-queue loop the first entry's count is the sum too: why
    /// the first-entry reading looks right until a second queue rejects.
    #[test]
    fn first_entry_equals_the_sum_in_a_one_queue_loop() {
        let h: FieldTable = serde_json::from_str(include_str!(
            "../../../tests/data/x-death-rabbitmq-3.10-attempt3.json"
        ))
        .unwrap();
        assert_eq!(attempt_from_first_x_death(Some(&h)), 3);
        assert_eq!(attempt_from_first_x_death(None), 1);
    }

    /// Headers captured (`MQLAB_CAPTURE_HEADERS`) in the x-death-count lab
    /// at the poison message's 3rd delivery, rejected once by the main queue
    /// and once by the slow lane: the first entry is the retry queue's
    /// expiry (count 1) on both generations; 4.0 orders the other two entries
    /// differently. The sum of the rejections says 3, the first entry 2.
    #[test]
    fn first_entry_is_short_after_two_rejecting_queues() {
        for json in [
            include_str!("../../../tests/data/x-death-rabbitmq-3.10-two-queues-attempt3.json"),
            include_str!("../../../tests/data/x-death-rabbitmq-4.0-two-queues-attempt3.json"),
        ] {
            let h: FieldTable = serde_json::from_str(json).unwrap();
            assert_eq!(attempt_from_x_death(Some(&h)), 3);
            assert_eq!(attempt_from_first_x_death(Some(&h)), 2);
        }
    }

    #[test]
    fn sums_rejections_from_several_queues() {
        let h = headers(vec![
            death("orders.work", "rejected", 1),
            death("orders.other", "rejected", 2),
            death("orders.retry", "expired", 3),
        ]);
        assert_eq!(attempt_from_x_death(Some(&h)), 4);
    }
}
