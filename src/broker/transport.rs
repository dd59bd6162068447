//! What a role process asks of its broker: a [`Publisher`] (publish, the
//! broker's answer, a barrier) and an [`Inbound`] (the next delivery, its
//! settlement, a copy published on). The roles walk their patterns over
//! these alone; a broker's module implements them with its own client.

use std::any::Any;
use std::collections::BTreeMap;

use anyhow::Result;
use futures_util::future::BoxFuture;

use crate::transcript::MessageMeta;

/// A lab message on its way to the broker.
pub struct Outgoing<'a> {
    /// Where it is published (for RabbitMQ an exchange, "" the default one).
    pub destination: &'a str,
    pub routing_key: &'a str,
    pub body: &'a [u8],
    pub meta: &'a MessageMeta,
    /// Kept by the broker on disk (delivery mode 2 in AMQP), else transient.
    pub persistent: bool,
    /// Returned by the broker when it routes it nowhere.
    pub mandatory: bool,
    /// When it left, in seconds: what a queue reports the age of its oldest
    /// message from.
    pub timestamp_s: Option<u64>,
    /// A per-message time to live.
    pub expiration_ms: Option<u64>,
    /// Headers of the lab's own beside the message's metadata.
    pub headers: Vec<(&'a str, String)>,
}

/// The broker's answer for one publish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Confirmed,
    /// Routed nowhere and given back (a mandatory publish).
    Returned,
    /// Refused (a full queue under `reject-publish`).
    Nacked,
    /// Published on a link without confirms: no answer asked.
    Unconfirmed,
}

/// The answer of a publish still to come: awaited after the window that
/// sits between a publish and its answer.
pub type Pending = BoxFuture<'static, Result<Answer>>;

/// A producer's link to the broker.
pub trait Publisher: Send + Sync {
    /// Sends `m`; the broker's answer is awaited apart.
    fn publish<'a>(&'a self, m: Outgoing<'a>) -> BoxFuture<'a, Result<Pending>>;
    /// A round trip: what was published before it has been routed when it
    /// returns (a window's barrier).
    fn barrier(&self) -> BoxFuture<'static, Result<()>>;
    /// Whether the link is still up (after a failed publish: its node gone).
    fn connected(&self) -> bool;
    fn close(self: Box<Self>) -> BoxFuture<'static, ()>;
}

/// Which queue a consumer reads and how.
pub struct Subscription<'a> {
    pub queue: &'a str,
    pub consumer: &'a str,
    /// Unsettled deliveries the broker lets it hold.
    pub prefetch: u16,
    /// The broker settles each delivery as it sends it (autoAck).
    pub no_ack: bool,
}

/// A delivery as a consumer sees it.
pub struct Delivery {
    pub meta: MessageMeta,
    pub body: Vec<u8>,
    pub redelivered: bool,
    /// The key it was published with.
    pub routing_key: String,
    /// Its headers with a string or integer value.
    pub headers: BTreeMap<String, String>,
    /// The broker's own handle on it, read back by the [`Inbound`] that
    /// delivered it (its tag, its properties as sent).
    pub handle: Box<dyn Any + Send + Sync>,
}

/// A consumer's link to the broker.
pub trait Inbound: Send {
    /// Starts consuming (with a link to publish copies on, confirmed and
    /// not).
    fn subscribe<'a>(&'a mut self, sub: Subscription<'a>) -> BoxFuture<'a, Result<()>>;
    /// The next delivery; an error when the broker closed the consumer or
    /// the link was lost. Cancel-safe: a SIGTERM races it.
    fn next(&mut self) -> BoxFuture<'_, Result<Delivery>>;
    fn ack<'a>(&'a self, d: &'a Delivery) -> BoxFuture<'a, Result<()>>;
    /// A negative settlement of one delivery; `requeue`: back to its queue,
    /// else dropped or dead-lettered.
    fn reject<'a>(&'a self, d: &'a Delivery, requeue: bool) -> BoxFuture<'a, Result<()>>;
    /// Publishes a copy of `d` to `queue` with `headers` added to its own;
    /// `confirm`: once the broker confirmed it; `mandatory`: a copy routed
    /// nowhere fails.
    fn republish<'a>(
        &'a self,
        d: &'a Delivery,
        queue: &'a str,
        headers: Vec<(&'a str, String)>,
        confirm_mandatory: (bool, bool),
    ) -> BoxFuture<'a, Result<()>>;
    /// Its attempt number as the broker's own records count it: 1 + the
    /// times the broker dead-lettered it after a reject (`first_only`: the
    /// latest record's count alone, a counterexample's reading, short once
    /// it was rejected from two queues).
    fn attempt(&self, d: &Delivery, first_only: bool) -> u32;
    /// A round trip on the consuming link (a window's barrier).
    fn barrier(&self) -> BoxFuture<'static, Result<()>>;
    /// Its headers as the broker sent them, as JSON (`MQLAB_CAPTURE_HEADERS`).
    fn headers_json(&self, d: &Delivery) -> Option<String>;
    /// Closes after what was settled has reached the broker.
    fn close(self: Box<Self>) -> BoxFuture<'static, Result<()>>;
}
