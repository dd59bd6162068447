//! The roles that run as their own OS processes (hidden `mqlab role ...`
//! subcommands). They read one JSON config ([`crate::protocol`]), print
//! logfmt lines on stdout and know nothing of snapshots, assertions or
//! faults other than their windows ([`crate::faults::point`]).

pub mod consumer;
pub mod producer;

pub use crate::transcript::emit;

/// The header with which a delayed message (one with a per-message TTL)
/// says when the producer sent it (epoch ms): the consumer measures its wait.
pub const PUBLISHED_AT: &str = "published-at";

/// Wall-clock epoch milliseconds: producer and consumer run on one host.
pub fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default()
}
