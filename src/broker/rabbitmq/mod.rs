//! RabbitMQ (AMQP 0-9-1) through lapin and amq-protocol: the only module
//! that imports them.

pub mod client;
pub mod codec;

/// A codec for one proxied connection.
pub fn codec() -> Box<dyn crate::broker::Codec> {
    Box::<codec::AmqpCodec>::default()
}
