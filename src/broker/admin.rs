//! What the harness asks of the broker for a lab: its topology declared and
//! deleted, a queue's state, the messages a queue holds, read without
//! consuming them. A broker's module implements [`Admin`] over its own
//! client; the runner and `soak` hold a `Box<dyn Admin>`.

use std::collections::BTreeMap;

use anyhow::Result;
use futures_util::future::BoxFuture;

use crate::vocab::Topology;

/// A message read from a queue without consuming it.
pub struct Peeked {
    pub message_id: String,
    pub body: Vec<u8>,
    /// The headers with a string or integer value.
    pub headers: BTreeMap<String, String>,
}

/// The broker's answer when a queue's home node is down or cut off (a
/// classic queue in a cluster lab): a typed error, which a caller tells
/// from any other with `downcast_ref`.
#[derive(Debug, thiserror::Error)]
#[error("the home node of queue `{0}` is down or inaccessible")]
pub struct HomeNodeDown(pub String);

/// The harness's own link to a lab's broker namespace.
pub trait Admin: Send {
    /// Declares the topology, except what the lab declares later.
    fn declare<'a>(&'a self, topology: &'a Topology) -> BoxFuture<'a, Result<()>>;
    /// Declares `names` (queues, or the bindings to them) of the topology.
    fn declare_later<'a>(
        &'a self,
        topology: &'a Topology,
        names: &'a [String],
    ) -> BoxFuture<'a, Result<()>>;
    /// Deletes the topology's queues (a vhost another run used).
    fn delete_queues<'a>(&'a self, topology: &'a Topology) -> BoxFuture<'a, Result<()>>;
    /// Deletes one queue as an administrator would, with what it holds; how
    /// many ready messages it held.
    fn delete_queue<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u32>>;
    /// Ready messages and consumers of a queue, as the broker reports them;
    /// a [`HomeNodeDown`] error, after which [`Admin::reopen`] is called.
    fn queue_state<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<(u32, u32)>>;
    /// Opens its link again after an error that closed it.
    fn reopen(&mut self) -> BoxFuture<'_, Result<()>>;
    /// What a queue holds, read without consuming it.
    fn peek<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<Vec<Peeked>>>;
    /// Moves every message `from` holds into `to` (an operator's DLQ
    /// replay), each copy confirmed before its original is removed; how
    /// many it moved.
    fn replay<'a>(&'a self, from: &'a str, to: &'a str) -> BoxFuture<'a, Result<usize>>;
    /// Closes the link, saying why (its node may be gone: no error).
    fn close(self: Box<Self>, why: &'static str) -> BoxFuture<'static, ()>;
}
