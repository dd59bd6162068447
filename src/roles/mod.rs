//! The roles that run as their own OS processes (hidden `mqlab role ...`
//! subcommands). They read one JSON config ([`crate::protocol`]), print
//! logfmt lines on stdout and know nothing of snapshots, assertions or
//! faults other than their windows ([`crate::faults::point`]).

pub mod consumer;
pub mod producer;

use lapin::message::Delivery;

use crate::broker::rabbitmq::client as amqp;
use crate::transcript::MessageMeta;

pub use crate::transcript::emit;

pub fn meta_of(d: &Delivery) -> MessageMeta {
    let p = &d.properties;
    let headers = p.headers().as_ref();
    let h = |k: &str| amqp::header_str(headers, k).unwrap_or_default();
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

/// The header with which a delayed message (one with a per-message TTL)
/// says when the producer sent it (epoch ms): the consumer measures its wait.
pub const PUBLISHED_AT: &str = "published-at";

/// Wall-clock epoch milliseconds: producer and consumer run on one host.
pub fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default()
}

/// The AMQP properties of a lab message; `persistent` is delivery_mode 2
/// (written to disk by the broker), else 1 (transient).
pub fn properties_of(m: &MessageMeta, persistent: bool) -> lapin::BasicProperties {
    lapin::BasicProperties::default()
        .with_message_id(m.message_id.as_str().into())
        .with_correlation_id(m.correlation_id.as_str().into())
        .with_content_type("application/json".into())
        .with_delivery_mode(if persistent { 2 } else { 1 })
        .with_headers(amqp::string_table(&[
            ("traceId", &m.trace_id),
            ("eventType", &m.event_type),
            ("schemaVersion", &m.schema_version),
            ("aggregateId", &m.aggregate_id),
        ]))
}
