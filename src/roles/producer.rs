//! Publishes a lab's messages as persistent messages with publisher confirms,
//! one `status=confirmed` line per broker ack.

use std::time::Instant;

use anyhow::{Context, Result};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::Confirmation;
use serde::{Deserialize, Serialize};

use super::{emit, properties_of};
use crate::amqp;
use crate::lab::Message;
use crate::transcript::Record;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProducerConfig {
    pub lab: String,
    pub amqp_url: String,
    pub exchange: String,
    /// What the lines call `destination` (the exchange, or the queue behind the default exchange).
    pub destination: String,
    pub messages: Vec<Message>,
}

pub async fn run(cfg: ProducerConfig) -> Result<i32> {
    let conn = amqp::connect(&cfg.amqp_url).await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut confirmed = 0;
    for m in &cfg.messages {
        let started = Instant::now();
        let confirm = ch
            .basic_publish(
                cfg.exchange.as_str().into(),
                m.routing_key.as_str().into(),
                BasicPublishOptions::default(),
                m.body.as_bytes(),
                properties_of(&m.meta),
            )
            .await
            .with_context(|| format!("publishing {}", m.meta.message_id))?
            .await
            .with_context(|| format!("waiting for the confirm of {}", m.meta.message_id))?;
        let status = match confirm {
            Confirmation::Ack(_) => {
                confirmed += 1;
                "confirmed"
            }
            Confirmation::Nack(_) => "nacked",
            Confirmation::NotRequested => "unconfirmed",
        };
        emit(
            Record::new(&cfg.lab)
                .meta(&m.meta)
                .with("destination", &cfg.destination)
                .with("routingKey", &m.routing_key)
                .with("durationMs", started.elapsed().as_millis())
                .status(status),
        );
    }
    emit(
        Record::new(&cfg.lab)
            .with("destination", &cfg.destination)
            .with("confirmed", confirmed)
            .status("done"),
    );
    conn.close(200, "done".into()).await.ok();
    Ok(if confirmed == cfg.messages.len() {
        0
    } else {
        1
    })
}
