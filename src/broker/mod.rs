//! The brokers mqlab runs its labs on, each a module behind what the
//! engine asks of a broker. Nothing outside a broker's module imports its
//! client crate (`tests/modules.rs` enforces it for RabbitMQ's client
//! crates).
//!
//! What a broker gives the engine, here as types of its own:
//! - a wire [`Codec`]: the proxy between the roles and the broker reads
//!   each frame's meaning through it, and its rules (cut an ack, cut a
//!   publish, hold a confirm) and the black box's hooks are written once
//!   over [`Frame`];
//! - an [`Admin`]: the harness declares a lab's topology, reads a
//!   queue's state and peeks at what it holds;
//! - role transports ([`transport`]): a [`Publisher`] and an [`Inbound`],
//!   over which the producer and consumer roles walk their patterns.

pub mod admin;
pub mod rabbitmq;
pub mod transport;

use anyhow::{bail, Result};

use crate::vocab::{Broker, Capability};

pub use admin::{Admin, HomeNodeDown, Peeked};
pub use transport::{Answer, Delivery, Inbound, Outgoing, Pending, Publisher, Subscription};

/// Where a broker listens and the lab user it admits: the environment
/// knows it, the runner and `soak` turn it into a URL for one namespace (a
/// vhost on RabbitMQ) without knowing the broker's scheme. Credentials live
/// here and in URLs only, never in a transcript (nor in `{:?}`).
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub struct Addr {
    #[serde(default)]
    pub broker: Broker,
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
}

impl Addr {
    /// The same broker, reached on `port` (another node, or a proxy).
    pub fn at(&self, port: u16) -> Addr {
        Addr {
            port,
            ..self.clone()
        }
    }

    /// A client's URL for `namespace` on this broker.
    pub fn url(&self, namespace: &str) -> String {
        match self.broker {
            Broker::RabbitMq => rabbitmq::url(self, namespace),
        }
    }

    /// `host:port` resolved (a name too: the user's broker may have one),
    /// for a proxy's upstream.
    pub async fn socket(&self) -> Result<std::net::SocketAddr> {
        use anyhow::Context;
        let what = || format!("the broker's address {}:{}", self.host, self.port);
        let all: Vec<_> = tokio::net::lookup_host((self.host.as_str(), self.port))
            .await
            .with_context(what)?
            .collect();
        // IPv4 first: mqlab's own brokers listen on 127.0.0.1 only, and
        // `localhost` may resolve to ::1 first.
        all.iter()
            .find(|a| a.is_ipv4())
            .or(all.first())
            .copied()
            .with_context(what)
    }
}

impl std::fmt::Debug for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}:{}", self.broker, self.host, self.port)
    }
}

/// The broker a role's URL names.
fn speaks_amqp(url: &str) -> Result<()> {
    match url.starts_with("amqp://") || url.starts_with("amqps://") {
        true => Ok(()),
        false => bail!("no broker of mqlab's is reached by `{url}`"),
    }
}

/// A producer's link to the broker at `url`; `confirm`: the broker answers
/// each publish.
pub async fn publisher(url: &str, confirm: bool) -> Result<Box<dyn Publisher>> {
    speaks_amqp(url)?;
    rabbitmq::publisher(url, confirm).await
}

/// A consumer's link to the broker at `url`, not yet subscribed.
pub async fn inbound(url: &str) -> Result<Box<dyn Inbound>> {
    speaks_amqp(url)?;
    rabbitmq::inbound(url).await
}

/// Which way a frame goes through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    ToBroker,
    ToClient,
}

/// How a client settles a delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    Ack,
    /// A negative acknowledgement; `requeue`: back to the queue, else
    /// dropped or dead-lettered.
    Nack {
        requeue: bool,
    },
    Reject {
        requeue: bool,
    },
}

/// What one frame means to the proxy, as a broker's codec reads it. A
/// frame the proxy has no use for is [`Frame::Other`] and passes as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    Other,
    /// A client begins a publish on `channel` whose message is known only
    /// at a later frame of the channel ([`Frame::Published`]).
    PublishBegins {
        channel: u16,
    },
    /// A client's publish of `message` on `channel`.
    Published {
        channel: u16,
        message: String,
    },
    /// A client starts consuming; `no_ack`: the broker settles each
    /// delivery as it sends it (autoAck).
    Consume {
        no_ack: bool,
    },
    /// A client limits its unacknowledged deliveries (0: no limit).
    Qos {
        prefetch: u16,
    },
    /// The broker delivers `message` to a client (whose consumer may be
    /// autoAck: nothing to settle then).
    Delivered {
        message: String,
        redelivered: bool,
        auto_ack: bool,
    },
    /// A client settles deliveries: the one its tag names or, with
    /// `multiple`, every one not settled yet up to it (a batch), `covers`
    /// in the order they were delivered (the deliveries the codec saw).
    Settled {
        covers: Vec<String>,
        multiple: bool,
        how: Settle,
    },
    /// The broker answers for publishes: the messages its answer covers
    /// (several under `multiple`); `ack`: confirmed, else refused.
    Confirmed {
        covers: Vec<String>,
        ack: bool,
    },
    /// The broker refuses what a client asked on one of its channels, in
    /// its own words, and closes the channel; `topology`: the request was
    /// a declaration (an exchange's, a queue's: one that contradicts it as
    /// it exists) or a consume from a queue that does not exist.
    Refused {
        text: String,
        topology: bool,
    },
}

/// A broker's wire protocol as the proxy reads it, one connection's state
/// each (a delivery's tag and a publish's number name a message only
/// within their connection).
pub trait Codec: Send {
    /// The length of the first complete frame in `buf`, or None when more
    /// bytes are needed.
    fn frame_len(&self, buf: &[u8]) -> Option<usize>;
    /// The frame begins a delivery to the client (read without changing
    /// the connection's state: the proxy may hold it back first).
    fn begins_delivery(&self, frame: &[u8]) -> bool;
    /// For a frame of content (a message body): whether it finishes a
    /// content the proxy let through; None for any other frame. Read even
    /// on a frozen connection, which passes a content in progress to its
    /// end and nothing else.
    fn content(&mut self, frame: &[u8]) -> Option<bool>;
    /// What the frame means, its connection's state updated.
    fn read(&mut self, dir: Direction, frame: &[u8]) -> Frame;
}

/// The client library mqlab's roles and harness use on `broker`: its name
/// and version, for the evidence.
pub fn client_library(broker: Broker) -> (&'static str, &'static str) {
    match broker {
        Broker::RabbitMq => rabbitmq::client_library(),
    }
}

/// The variable a user's program (role contract v1) reads its URL of
/// `broker` from.
pub fn program_url_var(broker: Broker) -> &'static str {
    match broker {
        Broker::RabbitMq => "MQLAB_AMQP_URL",
    }
}

/// What mqlab can do to and read from `broker` beyond its labs' publishing
/// and consuming (on an environment that offers it too).
pub fn offers(broker: Broker) -> &'static [Capability] {
    match broker {
        Broker::RabbitMq => rabbitmq::offers(),
    }
}

/// A fresh codec for one proxied connection to `broker`.
pub fn codec(broker: Broker) -> fn() -> Box<dyn Codec> {
    match broker {
        Broker::RabbitMq => rabbitmq::codec,
    }
}

/// The version of the server that answers at `a` (`RabbitMQ 3.10.8`), read
/// from the server itself, not from a package.
pub async fn version(a: &Addr) -> Result<String> {
    match a.broker {
        Broker::RabbitMq => rabbitmq::version(a).await,
    }
}

/// The harness's link to the broker namespace at `url`.
pub async fn admin(url: &str) -> Result<Box<dyn Admin>> {
    speaks_amqp(url)?;
    rabbitmq::admin(url).await
}
