//! Faults between steps: the broker restarted, a cluster node killed, restarted, cut off or healed.

use super::*;

impl Ctx<'_> {
    /// A broker fault between steps: killed and started again on the same
    /// data. The harness reconnects and declares the topology again, as an
    /// application does when it connects.
    pub(super) async fn broker(&mut self, action: FaultAction) -> Result<()> {
        let line = |lab: &str, status| {
            Record::new(lab)
                .with("target", Target::Broker)
                .with("action", action)
                .status(status)
        };
        self.emit(Role::Fault, &line(&self.lab.name, Status::Injected));
        self.env
            .as_mut()
            .context("a broker fault needs the environment to itself: this run shares it")?
            .restart_broker()
            .await?;
        let (amqp, channel) = self.connect_broker().await?;
        crate::amqp::declare(&channel, &self.lab.topology).await?;
        let c = self.conns();
        c.amqp = amqp;
        c.channel = channel;
        self.emit(Role::Fault, &line(&self.lab.name, Status::Healed));
        Ok(())
    }

    /// A cluster node's fault between steps. The harness moves its own
    /// connection to a node that is up and in the majority; the queues are
    /// not declared again (a classic queue whose node is down cannot be).
    pub(super) async fn node(&mut self, node: usize, action: FaultAction) -> Result<()> {
        let line = |lab: &str, status| {
            Record::new(lab)
                .with("target", Target::Node)
                .with("node", node)
                .with("action", action)
                .status(status)
        };
        if self.env.is_none() {
            bail!("a node fault needs the environment to itself: this run shares it");
        }
        self.emit(Role::Fault, &line(&self.lab.name, Status::Injected));
        let env = self.env.as_mut().context("checked above")?;
        // Marked before the environment acts: a step that fails half way
        // still leaves the node to be restored after the lab.
        match action {
            FaultAction::Kill => {
                self.nodes_down.insert(node);
                env.kill_node(node).await?;
            }
            FaultAction::Restart => {
                env.restart_node(node).await?;
                self.nodes_down.remove(&node);
            }
            FaultAction::Partition => {
                self.nodes_cut.insert(node);
                env.partition(node).await?;
            }
            FaultAction::Heal => {
                // Every cut ends, whichever node the step names.
                env.heal().await?;
                self.nodes_cut.clear();
            }
            other => bail!("a node fault cannot `{other}`"),
        }
        self.move_harness().await?;
        if matches!(action, FaultAction::Restart | FaultAction::Heal) {
            self.emit(Role::Fault, &line(&self.lab.name, Status::Healed));
        }
        Ok(())
    }

    /// The harness's own connection moves to the first node that is up and
    /// in the majority; the old one is closed (its node may be gone).
    pub(super) async fn move_harness(&mut self) -> Result<()> {
        let (amqp, channel) = self.connect_broker().await?;
        let c = self.conns();
        let _ = c.amqp.close(200, "moving to a live node".into()).await;
        c.amqp = amqp;
        c.channel = channel;
        Ok(())
    }
}
