//! mqlab: fault-injection labs that prove or refute message-queue reliability
//! claims against a real RabbitMQ and PostgreSQL.
//!
//! Data flows one way: lab definition ([`lab`]) → environment ([`env`]) →
//! roles ([`roles`], as subprocesses) → transcript ([`transcript`]) → checker
//! ([`checker`]) → snapshot ([`snapshot`]). [`runner`] sequences the phases.

pub mod broker;
pub mod checker;
pub mod cli;
pub mod env;
pub mod error;
pub mod events;
pub mod evidence;
pub mod exit;
pub mod expect;
pub mod explore;
pub mod failure;
pub mod faults;
pub mod lab;
pub mod lazyfs;
pub mod naming;
pub mod partition;
pub mod protocol;
pub mod record;
pub mod report;
pub mod roles;
pub mod runner;
pub mod session;
pub mod sinks;
pub mod snapshot;
pub mod soak;
pub mod store;
pub mod transcript;
pub mod vocab;
