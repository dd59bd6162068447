//! RabbitMQ (AMQP 0-9-1) through lapin and amq-protocol: the only module
//! that imports them. Its submodules are private: what leaves it is
//! written in the engine's own types (a `tests/modules.rs` test also reads
//! the source for a lapin or amq-protocol path elsewhere).

mod admin;
mod client;
mod codec;
mod transport;

use anyhow::Result;

use super::{Admin, Codec, Inbound, Publisher};

/// `amqp://user:password@host:port/vhost`.
pub fn url(a: &super::Addr, vhost: &str) -> String {
    use crate::naming::url_encode;
    format!(
        "amqp://{}:{}@{}:{}/{}",
        url_encode(&a.user),
        url_encode(&a.password),
        a.host,
        a.port,
        url_encode(vhost)
    )
}

/// A codec for one proxied connection.
pub fn codec() -> Box<dyn Codec> {
    Box::<codec::AmqpCodec>::default()
}

/// The harness's link to the vhost at `url`.
pub async fn admin(url: &str) -> Result<Box<dyn Admin>> {
    Ok(Box::new(admin::admin(url).await?))
}

/// A producer's link (in confirm mode when asked).
pub async fn publisher(url: &str, confirm: bool) -> Result<Box<dyn Publisher>> {
    Ok(Box::new(transport::publisher(url, confirm).await?))
}

/// A consumer's link, not yet subscribed.
pub async fn inbound(url: &str) -> Result<Box<dyn Inbound>> {
    Ok(Box::new(transport::inbound(url).await?))
}

/// What mqlab does to a RabbitMQ it started beyond publishing and
/// consuming: every capability (faults, policies and figures through
/// `rabbitmqctl`, settings read from the node).
pub fn offers() -> &'static [crate::vocab::Capability] {
    use crate::vocab::Capability::*;
    &[BrokerFault, Policy, QueueFigures, Setting]
}

/// The client library the roles and the harness speak through, and its
/// version as built (`build.rs`): the evidence names it.
pub fn client_library() -> (&'static str, &'static str) {
    ("lapin", env!("MQLAB_LAPIN_VERSION"))
}

/// The broker's `product` and `version` from its Connection.Start frame:
/// the version of the server actually running, not of a package.
pub async fn version(a: &super::Addr) -> Result<String> {
    client::broker_version(&a.host, a.port).await
}

/// Whether `url` takes an AMQP connection now (closed at once).
pub async fn answers(url: &str) -> bool {
    match client::connect(url).await {
        Ok(conn) => {
            let _ = conn.close(200, "ready".into()).await;
            true
        }
        Err(_) => false,
    }
}
