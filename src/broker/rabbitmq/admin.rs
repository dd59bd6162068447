//! The harness's link to a RabbitMQ vhost: one connection, one channel
//! (a passive declare that fails closes it: [`Admin::reopen`]).

use anyhow::Result;
use futures_util::future::BoxFuture;
use lapin::{Channel, Connection};

use super::client;
use crate::broker::admin::{Admin, Peeked};
use crate::vocab::Topology;

pub struct AmqpAdmin {
    conn: Connection,
    channel: Channel,
}

pub async fn admin(url: &str) -> Result<AmqpAdmin> {
    let conn = client::connect(url).await?;
    let channel = conn.create_channel().await?;
    Ok(AmqpAdmin { conn, channel })
}

impl Admin for AmqpAdmin {
    fn declare<'a>(&'a self, topology: &'a Topology) -> BoxFuture<'a, Result<()>> {
        Box::pin(client::declare(&self.channel, topology))
    }

    fn declare_later<'a>(
        &'a self,
        topology: &'a Topology,
        names: &'a [String],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(client::declare_later(&self.channel, topology, names))
    }

    fn delete_queues<'a>(&'a self, topology: &'a Topology) -> BoxFuture<'a, Result<()>> {
        Box::pin(client::delete_queues(&self.channel, topology))
    }

    fn delete_queue<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u32>> {
        Box::pin(client::delete_queue(&self.channel, queue))
    }

    fn queue_state<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<(u32, u32)>> {
        Box::pin(client::queue_state(&self.channel, queue))
    }

    fn reopen(&mut self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            self.channel = self.conn.create_channel().await?;
            Ok(())
        })
    }

    fn peek<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<Vec<Peeked>>> {
        Box::pin(client::peek(&self.conn, queue))
    }

    fn replay<'a>(&'a self, from: &'a str, to: &'a str) -> BoxFuture<'a, Result<usize>> {
        Box::pin(client::replay(&self.conn, from, to))
    }

    fn close(self: Box<Self>, why: &'static str) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let _ = self.conn.close(200, why.into()).await;
        })
    }
}
