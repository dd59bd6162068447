//! The run as fault families see it ([`crate::faults::Run`]): its
//! transcript, proxy, environment and the harness's own connection; the
//! families' between-step faults (`faults::broker`, `faults::node`) act
//! through it.

use super::*;

impl crate::faults::Harness for Ctx<'_> {
    fn say(&mut self, fault: &FaultEvent) {
        let line = fault.line(self.lab.broker, &self.lab.name);
        self.emit(Role::Fault, &line);
    }

    fn env(&mut self) -> Result<&mut (dyn Environment + 'static)> {
        self.env
            .own()
            .context("a broker or node fault needs the environment to itself: this run shares it")
    }

    async fn reconnect_harness(&mut self, restarted: bool) -> Result<()> {
        if !restarted {
            return self.move_harness().await;
        }
        let broker = self.connect_broker().await?;
        broker.declare(&self.lab.topology).await?;
        self.conns().broker = broker;
        // A quorum queue is read once its member is elected again (its
        // depth reads 0 before): no node is gone, any leader will do.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        for q in crate::faults::Run::quorum_queues(self) {
            let leader = self.env.read().await_leader(0, &self.vhost, &q, deadline);
            leader.await?;
        }
        Ok(())
    }
}

impl crate::faults::Run for Ctx<'_> {
    fn proxy(&self) -> &Proxy {
        Ctx::proxy(self)
    }

    fn vhost(&self) -> &str {
        &self.vhost
    }

    fn quorum_queues(&self) -> Vec<String> {
        self.lab
            .topology
            .queues
            .iter()
            // A queue marked `later` only once a declare step made it.
            .filter(|q| q.is_quorum())
            .filter(|q| !q.later || self.servers.declared_later.contains(&q.name))
            .map(|q| q.name.clone())
            .collect()
    }

    fn node_down(&mut self, n: usize, down: bool) {
        match down {
            true => self.servers.nodes_down.insert(n),
            false => self.servers.nodes_down.remove(&n),
        };
    }

    fn node_cut(&mut self, n: Option<usize>) {
        match n {
            Some(n) => {
                self.servers.nodes_cut.insert(n);
            }
            None => self.servers.nodes_cut.clear(),
        }
    }

    fn broker_paused(&mut self, paused: bool) {
        self.servers.broker_paused = paused;
    }
}

impl Ctx<'_> {
    /// The harness's own connection moves to the first node that is up and
    /// in the majority; the old one is closed (its node may be gone).
    pub(super) async fn move_harness(&mut self) -> Result<()> {
        let broker = self.connect_broker().await?;
        let old = std::mem::replace(&mut self.conns().broker, broker);
        old.close("moving to a live node").await;
        Ok(())
    }
}
