//! Publishes a lab's messages as persistent messages with publisher confirms,
//! one `status=confirmed` line per broker ack.

use std::time::Instant;

use anyhow::{Context, Result};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::Confirmation;

use super::{emit, properties_of};
use crate::amqp;
use crate::protocol::ProducerConfig;
use crate::transcript::Record;
use crate::vocab::Status;

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
                Status::Confirmed
            }
            Confirmation::Nack(_) => Status::Nacked,
            Confirmation::NotRequested => Status::Unconfirmed,
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
            .status(Status::Done),
    );
    conn.close(200, "done".into()).await.ok();
    Ok(if confirmed == cfg.messages.len() {
        0
    } else {
        1
    })
}
