//! Faults as families (Jepsen's nemesis). The role side ([`point`]): a role
//! that reaches the window the lab selected for a message prints a marker and
//! blocks, so the harness's SIGKILL lands exactly there. The network side
//! ([`proxy`]): the harness's AMQP proxy between each role and the broker
//! acts on one message's frames (drops an ack and cuts the connection, holds
//! a confirm). A family that sequences its own fault does it through a
//! [`Run`] (between steps: [`broker`], [`node`]) or a [`Stage`] (on a
//! publish step: [`pause`], [`node`]; on a consume step with several
//! instances, a [`rendezvous::Crowd`]), which the runner implements:
//! where a family goes is a [`crate::vocab::PLACEMENTS`] entry, what it does
//! is its module.
//!
//! Each placement has its own [`Kind`](crate::vocab::Kind), and the runner
//! dispatches each step's fault with an exhaustive `match` on its site's
//! bare kind, no wildcard (clippy's `wildcard_enum_match_arm` and
//! `match_wildcard_for_single_variants` denied there, so CI refuses a `_`
//! arm that would hide a new kind): a placement added to the registry
//! without its hook does not compile. The runner's publish-step dispatch,
//! reduced to its arms:
//!
//! ```
//! use mqlab::vocab::OnPublish;
//! fn hook(kind: OnPublish) -> &'static str {
//!     match kind {
//!         OnPublish::ProducerKill => "faults::point: SIGKILL at the marker",
//!         OnPublish::CutPublish => "faults::proxy: Rule::CutOnPublish",
//!         OnPublish::HoldConfirm => "faults::proxy: Rule::HoldConfirm",
//!         OnPublish::BrokerPause => "faults::pause::on_publish",
//!         OnPublish::NodeKill => "faults::node::kill_on_publish",
//!     }
//! }
//! # assert_eq!(hook(OnPublish::NodeKill), "faults::node::kill_on_publish");
//! ```
//!
//! and the same with one hook missing, as a new placement's would be
//! (E0004, non-exhaustive patterns):
//!
//! ```compile_fail,E0004
//! use mqlab::vocab::OnPublish;
//! fn hook(kind: OnPublish) -> &'static str {
//!     match kind {
//!         OnPublish::ProducerKill => "faults::point: SIGKILL at the marker",
//!         OnPublish::CutPublish => "faults::proxy: Rule::CutOnPublish",
//!         OnPublish::HoldConfirm => "faults::proxy: Rule::HoldConfirm",
//!         OnPublish::BrokerPause => "faults::pause::on_publish",
//!     }
//! }
//! ```

pub mod blackbox;
pub mod broker;
pub mod consumer;
pub mod database;
pub mod downstream;
pub mod network;
pub mod node;
pub mod pause;
pub mod pgproxy;
pub mod point;
pub mod producer;
pub mod program;
pub mod proxy;
pub mod rendezvous;
#[cfg(test)]
mod script;
pub mod stall;

use anyhow::Result;

use crate::env::Environment;
use crate::transcript::FaultEvent;
use crate::vocab::Status;
use proxy::{Proxy, ProxyEvent};

/// What the broker family's restart asks of whoever runs it: the runner
/// between two steps, and `soak` mid-stream. One sequence for both, so a
/// soak restarts the broker as a lab does.
#[allow(async_fn_in_trait)] // used generically, never as `dyn`
pub trait Harness {
    /// A fault injected or healed: the runner writes its `[fault]` line
    /// to the transcript (and the terminal), for the lab and its broker.
    fn say(&mut self, fault: &FaultEvent);
    /// The environment; an error when the run shares it (it has no broker
    /// fault, by [`crate::lab::Lab::has_broker_fault`], so this is a bug).
    fn env(&mut self) -> Result<&mut (dyn Environment + 'static)>;
    /// The harness's own connection moves to a node that is up, closing the
    /// old one; after a broker restart (`restarted`) the old one is dead
    /// and the lab's topology is declared again, as an application does.
    async fn reconnect_harness(&mut self, restarted: bool) -> Result<()>;
}

/// What any fault family's hooks may ask of the run in progress, between
/// steps or on one: the runner implements it, so a family sequences its
/// fault without knowing the runner.
pub trait Run: Harness {
    /// The harness's AMQP proxy between the roles and the broker.
    fn proxy(&self) -> &Proxy;
    /// The run's vhost.
    fn vhost(&self) -> &str;
    /// The names of the lab's quorum queues declared so far (one marked
    /// `later`: once a declare step made it).
    fn quorum_queues(&self) -> Vec<String>;
    /// Node n is down (`true`: restarted after the lab, however it ends,
    /// and not the harness's to talk to) or up again.
    fn node_down(&mut self, n: usize, down: bool);
    /// Node n is cut off (healed after the lab), or (`None`) every cut healed.
    fn node_cut(&mut self, n: Option<usize>);
    /// The broker is paused (`true`) or resumed: one left paused is resumed
    /// after the lab, however it ends.
    fn broker_paused(&mut self, paused: bool);
}

/// What a fault family's hooks may ask of the consume step in progress:
/// its built-in consumer and its deadline, on top of the run's. Every wait
/// ends at the step's deadline with the step's message.
#[allow(async_fn_in_trait)] // used generically, never as `dyn`
pub trait ConsumeStage: Run {
    /// Starts the step's consumer to stop at `f`'s window for its message.
    fn start_consumer_at(&mut self, f: &crate::lab::Fault) -> Result<()>;
    /// Follows the consumer to its stop at `f`'s window; one that exits
    /// first never reached it.
    async fn consumer_at_window(&mut self, f: &crate::lab::Fault) -> Result<()>;
    /// Waits until the step's queue holds `depth` ready messages.
    async fn await_depth(&mut self, depth: u32) -> Result<()>;
    /// SIGKILLs the consumer stopped at `f`'s window.
    async fn kill_consumer(&mut self, f: &crate::lab::Fault) -> Result<()>;
    /// The run's own database killed (`fault`), then started again on its
    /// data; the harness's connection to it renewed.
    async fn database_fault(&mut self, fault: crate::vocab::DatabaseFault) -> Result<()>;
}

/// What a fault family's hooks may ask of the publish step in progress:
/// its producer and its deadline, on top of the run's. Every wait ends at
/// the step's deadline with the step's message.
#[allow(async_fn_in_trait)] // used generically, never as `dyn`
pub trait Stage: Run {
    /// The proxy's next event, by the step's deadline.
    async fn proxy_event(&mut self) -> Result<ProxyEvent>;
    /// The step's deadline, for a wait of the family's own.
    fn deadline(&self) -> std::time::Instant;
    /// Starts the step's producer (with the step's settings; `reconnect`:
    /// it connects again when its connection breaks, instead of failing).
    fn start_producer(&mut self, reconnect: bool) -> Result<()>;
    /// Follows the producer's lines up to and including `status` for `message`.
    async fn producer_until(&mut self, message: &str, status: Status) -> Result<()>;
    /// Follows the producer to its exit, which must be 0.
    async fn finish_producer(&mut self) -> Result<()>;
    /// Starts the step's producer to stop at `f`'s window for its message.
    fn start_producer_at(&mut self, f: &crate::lab::Fault) -> Result<()>;
    /// Follows the producer to its stop at `f`'s window and SIGKILLs it
    /// there; one that exits first never reached the window.
    async fn kill_producer_at_window(&mut self, f: &crate::lab::Fault) -> Result<()>;
    /// Follows the producer to its exit: its code, whatever it is.
    async fn producer_exit(&mut self) -> Result<i32>;
    /// The proxy acted on a frame: its `[fault]` line, from its event.
    async fn proxy_effect(&mut self) -> Result<()>;
}
