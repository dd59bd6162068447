//! The step in progress as a fault family's hooks see it: the run's
//! [`crate::faults::Run`] for any step; `publish` and `consume` add their
//! role's hooks.

use super::*;

/// A step as a fault family's hooks see it: the step (`S`), its role
/// process, its deadline, and the run's transcript, proxy and environment.
pub(super) struct StepStage<'c, 'a, S> {
    pub(super) ctx: &'c mut Ctx<'a>,
    pub(super) step: &'c S,
    pub(super) d: Deadline<'c>,
    pub(super) proc: Option<RoleProc>,
}

impl<'c, 'a, S> StepStage<'c, 'a, S> {
    pub(super) fn new(ctx: &'c mut Ctx<'a>, step: &'c S, d: Deadline<'c>) -> Self {
        StepStage {
            ctx,
            step,
            d,
            proc: None,
        }
    }
}

impl<S> crate::faults::Harness for StepStage<'_, '_, S> {
    fn say(&mut self, fault: &FaultEvent) {
        crate::faults::Harness::say(&mut *self.ctx, fault);
    }

    fn env(&mut self) -> Result<&mut (dyn Environment + 'static)> {
        crate::faults::Harness::env(&mut *self.ctx)
    }

    async fn reconnect_harness(&mut self, restarted: bool) -> Result<()> {
        crate::faults::Harness::reconnect_harness(&mut *self.ctx, restarted).await
    }
}

impl<S> crate::faults::Run for StepStage<'_, '_, S> {
    fn proxy(&self) -> &Proxy {
        self.ctx.proxy()
    }

    fn vhost(&self) -> &str {
        &self.ctx.vhost
    }

    fn quorum_queues(&self) -> Vec<String> {
        crate::faults::Run::quorum_queues(&*self.ctx)
    }

    fn node_down(&mut self, n: usize, down: bool) {
        crate::faults::Run::node_down(&mut *self.ctx, n, down)
    }

    fn node_cut(&mut self, n: Option<usize>) {
        crate::faults::Run::node_cut(&mut *self.ctx, n)
    }

    fn broker_paused(&mut self, paused: bool) {
        self.ctx.servers.broker_paused = paused;
    }
}
