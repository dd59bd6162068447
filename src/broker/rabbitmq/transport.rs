//! The role transports over lapin: a publisher on one channel (in confirm
//! mode when asked), and an inbound that consumes on one channel and
//! publishes its copies on two more (confirmed and not).

use anyhow::{Context, Result};
use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation, Connection};

use super::client;
use crate::broker::transport::{
    Answer, Delivery, Inbound, Outgoing, Pending, Publisher, Subscription,
};
use crate::transcript::MessageMeta;

/// How long a `basic.consume` may go unanswered before the consumer gives
/// up. A healthy broker answers in milliseconds; a classic queue whose home
/// node is down is answered NOT_FOUND at once by 3.10 and only after about
/// 60 s of lookups by 4.0 (`rabbit_amqqueue:with/4`, docs/environments.md):
/// the consumer fails either way, here without waiting those 60 s.
const CONSUME_ANSWER: std::time::Duration = std::time::Duration::from_secs(10);

/// The AMQP properties of a lab message; `persistent` is delivery_mode 2
/// (written to disk by the broker), else 1 (transient).
fn properties_of(m: &MessageMeta, persistent: bool) -> BasicProperties {
    BasicProperties::default()
        .with_message_id(m.message_id.as_str().into())
        .with_correlation_id(m.correlation_id.as_str().into())
        .with_content_type("application/json".into())
        .with_delivery_mode(if persistent { 2 } else { 1 })
        .with_headers(client::string_table(&[
            ("traceId", &m.trace_id),
            ("eventType", &m.event_type),
            ("schemaVersion", &m.schema_version),
            ("aggregateId", &m.aggregate_id),
        ]))
}

fn meta_of(p: &BasicProperties) -> MessageMeta {
    let headers = p.headers().as_ref();
    let h = |k: &str| client::header_str(headers, k).unwrap_or_default();
    MessageMeta {
        message_id: p
            .message_id()
            .as_ref()
            .map(|s| s.to_string())
            .unwrap_or_default(),
        event_type: h("eventType"),
        schema_version: h("schemaVersion"),
        aggregate_id: h("aggregateId"),
        trace_id: h("traceId"),
        correlation_id: p
            .correlation_id()
            .as_ref()
            .map(|s| s.to_string())
            .unwrap_or_default(),
    }
}

/// `properties` with `headers` set over its own.
fn with_headers(properties: BasicProperties, headers: &[(&str, String)]) -> BasicProperties {
    if headers.is_empty() {
        return properties;
    }
    let mut table = properties.headers().clone().unwrap_or_default();
    for (k, v) in headers {
        client::set_header(&mut table, k, v);
    }
    properties.with_headers(table)
}

pub struct AmqpPublisher {
    conn: Connection,
    ch: Channel,
}

/// A connection and its channel, in confirm mode if asked.
pub async fn publisher(url: &str, confirm: bool) -> Result<AmqpPublisher> {
    let conn = client::connect(url).await?;
    let ch = conn.create_channel().await?;
    if confirm {
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
    }
    Ok(AmqpPublisher { conn, ch })
}

impl Publisher for AmqpPublisher {
    fn publish<'a>(&'a self, m: Outgoing<'a>) -> BoxFuture<'a, Result<Pending>> {
        Box::pin(async move {
            let mut properties = properties_of(m.meta, m.persistent);
            if let Some(s) = m.timestamp_s {
                properties = properties.with_timestamp(s);
            }
            if let Some(ms) = m.expiration_ms {
                properties = properties.with_expiration(ms.to_string().into());
            }
            let properties = with_headers(properties, &m.headers);
            let confirm = self
                .ch
                .basic_publish(
                    m.destination.into(),
                    m.routing_key.into(),
                    BasicPublishOptions {
                        mandatory: m.mandatory,
                        immediate: false,
                    },
                    m.body,
                    properties,
                )
                .await?;
            let pending: Pending = Box::pin(async move {
                Ok(match confirm.await? {
                    Confirmation::Ack(None) => Answer::Confirmed,
                    Confirmation::Ack(Some(_)) => Answer::Returned,
                    Confirmation::Nack(_) => Answer::Nacked,
                    Confirmation::NotRequested => Answer::Unconfirmed,
                })
            });
            Ok(pending)
        })
    }

    fn barrier(&self) -> BoxFuture<'static, Result<()>> {
        let ch = self.ch.clone();
        Box::pin(async move { Ok(ch.basic_qos(0, BasicQosOptions::default()).await?) })
    }

    fn connected(&self) -> bool {
        self.conn.status().connected()
    }

    fn close(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            self.conn.close(200, "done".into()).await.ok();
        })
    }
}

/// The channels of one subscription.
struct Link {
    /// The consuming channel: acks go here, and the window barrier too.
    ch: Channel,
    /// In confirm mode: a copy is acknowledged only after the broker confirms it.
    confirmed: Channel,
    /// Not in confirm mode: what an unconfirmed copy is published on.
    unconfirmed: Channel,
    deliveries: lapin::Consumer,
    prefetch: u16,
}

pub struct AmqpInbound {
    conn: Connection,
    link: Option<Link>,
}

pub async fn inbound(url: &str) -> Result<AmqpInbound> {
    let conn = client::connect(url).await?;
    Ok(AmqpInbound { conn, link: None })
}

impl AmqpInbound {
    fn link(&self) -> Result<&Link> {
        self.link.as_ref().context("consuming before subscribing")
    }
}

/// The lapin delivery behind a neutral one.
fn raw(d: &Delivery) -> Result<&lapin::message::Delivery> {
    d.handle
        .downcast_ref()
        .context("a delivery that did not come from RabbitMQ")
}

fn headers_of(d: &Delivery) -> Option<&FieldTable> {
    raw(d).ok()?.properties.headers().as_ref()
}

impl Inbound for AmqpInbound {
    fn subscribe<'a>(&'a mut self, sub: Subscription<'a>) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let ch = self.conn.create_channel().await?;
            ch.basic_qos(sub.prefetch, BasicQosOptions::default())
                .await?;
            let confirmed = self.conn.create_channel().await?;
            confirmed
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            let unconfirmed = self.conn.create_channel().await?;
            let consume = ch.basic_consume(
                sub.queue.into(),
                sub.consumer.into(),
                BasicConsumeOptions {
                    no_ack: sub.no_ack,
                    ..Default::default()
                },
                FieldTable::default(),
            );
            let deliveries = tokio::time::timeout(CONSUME_ANSWER, consume)
                .await
                .map_err(|_| {
                    anyhow::anyhow!(
                        "no answer to basic.consume within {} s (is its queue's node down?)",
                        CONSUME_ANSWER.as_secs()
                    )
                })
                .and_then(|r| r.map_err(anyhow::Error::from))
                .with_context(|| format!("consuming from `{}`", sub.queue))?;
            self.link = Some(Link {
                ch,
                confirmed,
                unconfirmed,
                deliveries,
                prefetch: sub.prefetch,
            });
            Ok(())
        })
    }

    fn next(&mut self) -> BoxFuture<'_, Result<Delivery>> {
        Box::pin(async move {
            let link = self.link.as_mut().context("consuming before subscribing")?;
            let mut d = link
                .deliveries
                .next()
                .await
                .context("the broker closed the consumer")??;
            let headers = d.properties.headers().as_ref();
            let strings = headers.map(client::string_headers).unwrap_or_default();
            Ok(Delivery {
                meta: meta_of(&d.properties),
                body: std::mem::take(&mut d.data),
                redelivered: d.redelivered,
                routing_key: d.routing_key.to_string(),
                headers: strings,
                handle: Box::new(d),
            })
        })
    }

    fn ack<'a>(&'a self, d: &'a Delivery) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            raw(d)?.acker.ack(BasicAckOptions::default()).await?;
            Ok(())
        })
    }

    fn reject<'a>(&'a self, d: &'a Delivery, requeue: bool) -> BoxFuture<'a, Result<()>> {
        let options = BasicNackOptions {
            requeue,
            multiple: false,
        };
        Box::pin(async move {
            raw(d)?.acker.nack(options).await?;
            Ok(())
        })
    }

    fn republish<'a>(
        &'a self,
        d: &'a Delivery,
        queue: &'a str,
        headers: Vec<(&'a str, String)>,
        (confirm, mandatory): (bool, bool),
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let link = self.link()?;
            let original = raw(d)?;
            let channel = if confirm {
                &link.confirmed
            } else {
                &link.unconfirmed
            };
            let pending = channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions {
                        mandatory,
                        immediate: false,
                    },
                    &d.body,
                    with_headers(original.properties.clone(), &headers),
                )
                .await?;
            if confirm {
                match pending.await? {
                    Confirmation::Ack(None) => {}
                    other => anyhow::bail!(
                        "the publish of {} to `{queue}` was not confirmed: {other:?}",
                        d.meta.message_id
                    ),
                }
            }
            Ok(())
        })
    }

    fn attempt(&self, d: &Delivery, first_only: bool) -> u32 {
        match first_only {
            true => client::attempt_from_first_x_death(headers_of(d)),
            false => client::attempt_from_x_death(headers_of(d)),
        }
    }

    fn barrier(&self) -> BoxFuture<'static, Result<()>> {
        let link = self.link.as_ref().map(|l| (l.ch.clone(), l.prefetch));
        Box::pin(async move {
            let (ch, prefetch) = link.context("a barrier before subscribing")?;
            Ok(ch.basic_qos(prefetch, BasicQosOptions::default()).await?)
        })
    }

    fn headers_json(&self, d: &Delivery) -> Option<String> {
        serde_json::to_string(raw(d).ok()?.properties.headers()).ok()
    }

    fn close(self: Box<Self>) -> BoxFuture<'static, Result<()>> {
        Box::pin(async move {
            if let Some(link) = &self.link {
                // channel.close is processed after the acks before it on the
                // same channel; a bare connection.close is not: measured, the
                // broker then sometimes requeues the last acked message
                // (depth 1 after a drained queue, 2 in ~40 suites under load).
                link.ch.close(200, "done".into()).await?;
            }
            self.conn.close(200, "done".into()).await.ok();
            Ok(())
        })
    }
}
