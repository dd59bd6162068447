//! What the runner hands a role process (`mqlab role <ROLE> --config JSON`):
//! an explicit wire type of its own, so that renaming a lab-file key cannot
//! silently change what a role reads, and a role never sees the lab model.

use serde::{Deserialize, Serialize};

use crate::transcript::MessageMeta;
use crate::vocab::{Handoff, Pattern, Window};

/// Bumped when a field changes meaning; a role refuses a config of another version.
pub const VERSION: u32 = 1;

/// The version of the contract a user's program is started with
/// (`MQLAB_CONTRACT`; docs/byo.md).
pub const PROGRAM_CONTRACT: u32 = 1;

/// The config of one role process.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "kebab-case", deny_unknown_fields)]
pub enum RoleConfig {
    Producer(ProducerConfig),
    Consumer(ConsumerConfig),
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    pub version: u32,
    pub config: RoleConfig,
}

/// A role process of `exe` (`mqlab role --config-file F`), its config in
/// a private file beside its log (`logs/<n>-<role>.json`: thousands of
/// messages do not fit in one argument, and the URLs hold credentials);
/// its stdout piped for the harness to read.
pub fn spawn_role(
    exe: &std::path::Path,
    logs: &std::path::Path,
    n: usize,
    config: RoleConfig,
) -> anyhow::Result<(
    tokio::process::Child,
    tokio::process::ChildStdout,
    std::path::PathBuf,
)> {
    use anyhow::Context;
    let role = match &config {
        RoleConfig::Producer(_) => "producer",
        RoleConfig::Consumer(_) => "consumer",
    };
    let log = logs.join(format!("{n}-{role}.log"));
    let file = logs.join(format!("{n}-{role}.json"));
    crate::env::process::write_private(&file, &Envelope::new(config).to_json())?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("role")
        .arg("--config-file")
        .arg(&file)
        .env("RUST_LOG", "warn");
    let mut child = crate::env::process::spawn(&mut cmd, &log, true)?;
    let stdout = child.stdout.take().context("role stdout")?;
    Ok((child, stdout, log))
}

impl Envelope {
    pub fn new(config: RoleConfig) -> Envelope {
        Envelope {
            version: VERSION,
            config,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a role config serializes")
    }

    pub fn from_json(s: &str) -> anyhow::Result<Envelope> {
        let e: Envelope = serde_json::from_str(s)?;
        anyhow::ensure!(
            e.version == VERSION,
            "role config version {} is not this binary's {VERSION}",
            e.version
        );
        Ok(e)
    }
}

/// One message to publish, complete: the role reads no fixture files.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutMessage {
    pub meta: MessageMeta,
    pub routing_key: String,
    pub body: String,
    /// A per-message TTL (the `expiration` property), in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_ms: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProducerConfig {
    pub lab: String,
    /// The lab's broker: its lines' `product`.
    #[serde(default)]
    pub broker: crate::vocab::Broker,
    pub broker_url: String,
    pub exchange: String,
    /// What the lines call `destination` (the exchange, or the queue behind the default exchange).
    pub destination: String,
    pub messages: Vec<OutMessage>,
    pub confirm: bool,
    pub mandatory: bool,
    pub persistent: bool,
    /// Each message carries the `timestamp` property (seconds).
    pub timestamp: bool,
    /// Where a returned message is published (confirmed).
    pub park: Option<String>,
    /// No confirm within this: log `confirm_timeout` and send again.
    pub confirm_timeout_ms: Option<u64>,
    /// On start, send again what the journal says was sent and never
    /// confirmed, and after a confirm timeout send again (else: count it as
    /// done, as a fire-and-forget producer does).
    pub resend: bool,
    /// A client-side batch of this many messages: each message is buffered
    /// (`buffered`), the batch sent when full and, with `flush`, at close.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<usize>,
    pub flush: bool,
    /// The producer's own record of what it sent and what was confirmed
    /// (its outbox): a restarted producer resends what it sent and never
    /// saw confirmed, and skips what was.
    pub journal: std::path::PathBuf,
    /// Where to stop for the harness's kill: the first of these reached.
    pub faults: Vec<FaultPoint>,
    /// A broken connection (its node killed) is not the end: log
    /// `connection_lost`, connect again and send the message again.
    #[serde(default)]
    pub reconnect: bool,
    /// The producer is an order service: each message's order is committed
    /// in its database first (and published directly, or through an outbox).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orders: Option<OrderService>,
}

/// An order service's database and how it hands its events to the broker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderService {
    pub database_url: String,
    pub handoff: Handoff,
    /// The reconciliation job instead: it creates no order, and publishes
    /// again the event of each committed order no service applied.
    #[serde(default)]
    pub reconcile: bool,
    /// The outbox relay's next pass alone: it creates no order, and
    /// publishes the rows an earlier pass left unsent.
    #[serde(default)]
    pub relay: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    /// The time budget from a message's first failure, in ms: no retry
    /// once it is spent (the classified pattern; None: the count alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration_ms: Option<u64>,
    pub dlq: String,
    /// Retry queues of increasing TTL, for the classified pattern: attempt n
    /// waits in tier min(n, len) - 1.
    pub tiers: Vec<Tier>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tier {
    pub queue: String,
    pub ttl_ms: u64,
}

/// Where the role blocks so the harness can act on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultPoint {
    pub window: Window,
    pub message: String,
    /// A rendezvous point: the role prints its marker and stops itself
    /// (SIGSTOP), and goes on when the harness continues it.
    #[serde(default)]
    pub hold: bool,
    /// The harness's proxy cuts the role's connection at this point: the
    /// role's round trip there fails, and it abandons what it was doing
    /// ([`crate::faults::point::cut`]).
    #[serde(default)]
    pub cut: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerConfig {
    pub lab: String,
    /// The lab's broker: its lines' `product`.
    #[serde(default)]
    pub broker: crate::vocab::Broker,
    pub broker_url: String,
    pub database_url: String,
    pub queue: String,
    /// The name in the log lines.
    pub consumer: String,
    /// The consuming service: the inbox key's consumer part and the owner of
    /// the business rows; stable across restarts.
    pub service: String,
    pub pattern: Pattern,
    pub prefetch: u16,
    /// Exit after this many distinct messages reached a final outcome.
    pub settle: usize,
    /// Exit after this many deliveries whatever their outcome (a budget for loops).
    pub max_deliveries: Option<usize>,
    pub retry: Option<RetryPolicy>,
    /// Where to stop for the harness's kill: the first of these reached.
    pub faults: Vec<FaultPoint>,
    /// On a lost connection, connect again and go on (else: exit with an error).
    pub reconnect: bool,
    /// Message id → how many of its first attempts fail transiently (a
    /// dependency the lab makes unavailable).
    pub transient_failures: std::collections::BTreeMap<String, u32>,
    /// One of several instances: the harness counts what they settled
    /// together and ends each with SIGTERM, which it takes between two
    /// deliveries (its own `settle` is the step's, never reached alone).
    #[serde(default)]
    pub until_stopped: bool,
    /// A drain: `settle` counts the queue's entries, each ending once, not
    /// message ids: the queue may hold two copies of one message (a retried
    /// copy beside the original an unclean broker restart brought back).
    #[serde(default)]
    pub settle_copies: bool,
    /// A message rejected into the retry loop leaves this queue for good
    /// (its dead-letter chain never leads back): in a drain, an entry that
    /// ended here.
    #[serde(default)]
    pub rejected_leave: bool,
    /// Say each fault window passed (`window_passed`): explore's clean run
    /// records where the code really goes, not where its pattern says.
    #[serde(default)]
    pub announce_windows: bool,
    /// The downstream service its pattern calls (`call-downstream`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downstream: Option<DownstreamConfig>,
}

/// Where the consumer calls the downstream service, and how long it waits
/// for the answer before it takes the call as failed (transient).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownstreamConfig {
    pub url: String,
    pub timeout_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_round_trips_and_other_versions_are_refused() {
        let e = Envelope::new(RoleConfig::Producer(ProducerConfig {
            lab: "l".into(),
            broker: Default::default(),
            broker_url: "amqp://x".into(),
            exchange: String::new(),
            destination: "q".into(),
            messages: vec![],
            confirm: true,
            mandatory: false,
            persistent: true,
            timestamp: true,
            park: None,
            confirm_timeout_ms: None,
            resend: true,
            batch: None,
            flush: true,
            journal: "/tmp/j".into(),
            faults: Vec::new(),
            reconnect: false,
            orders: None,
        }));
        let json = e.to_json();
        assert!(json.contains("\"role\":\"producer\""), "{json}");
        assert!(Envelope::from_json(&json).is_ok());
        let other = json.replace("\"version\":1", "\"version\":99");
        assert!(Envelope::from_json(&other)
            .unwrap_err()
            .to_string()
            .contains("version 99"));
    }
}
