//! Faults as a family (Jepsen's nemesis). The role side ([`point`]): a role
//! that reaches the window the lab selected for a message prints a marker and
//! blocks, so the harness's SIGKILL lands exactly there. The network side
//! ([`proxy`]): the harness's AMQP proxy between each role and the broker
//! acts on one message's frames (drops an ack and cuts the connection, holds
//! a confirm). The broker side is the environment's own kill/restart; the
//! runner sequences all three.

pub mod blackbox;
pub mod pgproxy;
pub mod point;
pub mod proxy;
