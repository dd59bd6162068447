//! A broker's servers as an environment started them (one, or a
//! cluster's nodes; node 1 first), as the broker faults and the waits see
//! them, for any broker: started, killed, paused and resumed, waited for,
//! asked their version. What a server is (a child process, a chroot's, a
//! container) is each environment's own; what a restart does in order is
//! written here once ([`restart`]). A RabbitMQ node adds what only its
//! cluster has ([`super::nodes::Nodes`]: Erlang names, `eval`, partitions).

use std::time::{Duration, Instant};

use anyhow::{bail, Result};

#[allow(async_fn_in_trait)] // used generically, never as `dyn`
pub trait Server {
    /// How many: 1, or a cluster's.
    fn count(&self) -> usize;
    /// Whether server n runs (not killed by the lab).
    async fn running(&self, n: usize) -> bool;
    /// Waits until server n answers its clients, by `deadline`.
    async fn ready(&self, n: usize, deadline: Instant) -> Result<()>;
    /// How long a server may take to answer after it starts (`--ready-timeout`).
    fn ready_timeout(&self) -> Duration;
    /// SIGKILLs server n, as `docker kill` does; reaped before it returns
    /// (a dying server may still accept for a moment).
    async fn kill(&mut self, n: usize) -> Result<()>;
    /// Starts server n again with its data and port; does not wait.
    async fn start(&mut self, n: usize) -> Result<()>;
    /// Freezes server n (SIGSTOP; `docker pause`), seen frozen: it answers
    /// nothing until resumed.
    async fn pause(&self, n: usize) -> Result<()>;
    async fn resume(&self, n: usize) -> Result<()>;
    /// The version server n reports to a client.
    async fn version(&self, n: usize) -> Result<String>;
}

pub(super) fn in_range(server: &impl Server, n: usize) -> Result<()> {
    if n < 1 || n > server.count() {
        bail!("no node {n} in a {}-node cluster", server.count());
    }
    Ok(())
}

/// Kills server n if it runs, starts it again, and waits until it answers.
pub async fn restart(server: &mut impl Server, n: usize) -> Result<()> {
    in_range(server, n)?;
    if server.running(n).await {
        server.kill(n).await?;
    }
    server.start(n).await?;
    let deadline = Instant::now() + server.ready_timeout();
    server.ready(n, deadline).await
}
