//! The topology a lab declares (RabbitMQ's model: exchanges, queues,
//! bindings, x-arguments), the queue arguments RabbitMQ understands, and the
//! routing the checker needs to know where a message went.

use super::*;

/// A queue argument's value type, for checking lab files before any server starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgType {
    Int,
    Str,
    Bool,
    OneOf(&'static [&'static str]),
}

/// The queue arguments RabbitMQ 3.10+ understands; any other name is a typo
/// the broker would silently ignore, so a lab naming one is rejected.
pub const QUEUE_ARGUMENTS: &[(&str, ArgType, &str)] = &[
    (
        "x-message-ttl",
        ArgType::Int,
        "ms a message may wait before it expires",
    ),
    (
        "x-expires",
        ArgType::Int,
        "ms of disuse after which the queue is deleted",
    ),
    (
        "x-max-length",
        ArgType::Int,
        "ready messages before overflow applies",
    ),
    (
        "x-max-length-bytes",
        ArgType::Int,
        "bytes of ready messages before overflow applies",
    ),
    (
        "x-overflow",
        ArgType::OneOf(&["drop-head", "reject-publish", "reject-publish-dlx"]),
        "what happens at the length limit",
    ),
    (
        "x-dead-letter-exchange",
        ArgType::Str,
        "where rejected, expired or dropped messages go",
    ),
    (
        "x-dead-letter-routing-key",
        ArgType::Str,
        "routing key for dead-lettered messages",
    ),
    (
        "x-dead-letter-strategy",
        ArgType::OneOf(&["at-most-once", "at-least-once"]),
        "quorum queues: whether dead-lettering is confirmed",
    ),
    (
        "x-queue-type",
        ArgType::OneOf(&["classic", "quorum", "stream"]),
        "the queue's implementation",
    ),
    (
        "x-delivery-limit",
        ArgType::Int,
        "quorum queues: deliveries before dead-lettering",
    ),
    (
        "x-max-priority",
        ArgType::Int,
        "classic queues: priority levels (1-255)",
    ),
    (
        "x-single-active-consumer",
        ArgType::Bool,
        "one consumer at a time",
    ),
    (
        "x-queue-mode",
        ArgType::OneOf(&["default", "lazy"]),
        "classic queues: keep messages on disk",
    ),
    (
        "x-queue-version",
        ArgType::Int,
        "classic queues: storage version (1 or 2)",
    ),
    (
        "x-quorum-initial-group-size",
        ArgType::Int,
        "quorum queues: initial replica count",
    ),
];

/// A queue argument's value as a lab writes it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum ArgValue {
    Bool(bool),
    Int(i64),
    Str(String),
}

impl fmt::Display for ArgValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgValue::Bool(b) => write!(f, "{b}"),
            ArgValue::Int(i) => write!(f, "{i}"),
            ArgValue::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// Checks one queue argument against [`QUEUE_ARGUMENTS`].
pub fn check_queue_argument(name: &str, value: &ArgValue) -> Result<(), String> {
    let Some((_, ty, _)) = QUEUE_ARGUMENTS.iter().find(|(n, _, _)| *n == name) else {
        let known: Vec<_> = QUEUE_ARGUMENTS.iter().map(|(n, _, _)| *n).collect();
        return Err(format!(
            "unknown queue argument `{name}` (known: {})",
            known.join(", ")
        ));
    };
    let ok = match (ty, value) {
        (ArgType::Int, ArgValue::Int(i)) => *i >= 0,
        (ArgType::Str, ArgValue::Str(_)) => true,
        (ArgType::Bool, ArgValue::Bool(_)) => true,
        (ArgType::OneOf(allowed), ArgValue::Str(s)) => allowed.contains(&s.as_str()),
        _ => false,
    };
    if ok {
        return Ok(());
    }
    Err(match ty {
        ArgType::Int => format!("`{name}` takes a non-negative integer, not {value}"),
        ArgType::Str => format!("`{name}` takes a string, not {value}"),
        ArgType::Bool => format!("`{name}` takes true or false, not {value}"),
        ArgType::OneOf(allowed) => {
            format!("`{name}` is one of {}, not {value}", allowed.join(", "))
        }
    })
}

/// The exchange, queues, bindings a lab declares: the data [`crate::broker::Admin`]
/// declares on the broker.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Topology {
    pub exchanges: Vec<ExchangeDecl>,
    pub queues: Vec<QueueDecl>,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExchangeDecl {
    pub name: String,
    pub kind: ExchangeKind,
    pub durable: bool,
    /// Declared by a lab step, not at the start.
    #[serde(default)]
    pub later: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueDecl {
    pub name: String,
    pub durable: bool,
    pub arguments: std::collections::BTreeMap<String, ArgValue>,
    pub bindings: Vec<(String, String)>,
    /// Declared by a lab step, not at the start.
    #[serde(default)]
    pub later: bool,
}

/// The header a consumer's DLQ or retry copy names the queue it came from
/// in: the checker holds the copy for that queue's service.
pub const ORIGINAL_QUEUE: &str = "original-queue";

/// The header a producer sets on a copy it parks (its outbox): only such a
/// copy stands for the queue that refused or returned it.
pub const PARKED_BY: &str = "parked-by";

impl Topology {
    /// Whether a message `queue` dead-letters can come back to it, its
    /// dead-letter chain through the default exchange followed queue by
    /// queue (any hop, rejection or expiry: an over-estimate of a return).
    /// `None` when the file cannot tell (another exchange, a queue it does
    /// not declare). A policy's dead-letter settings are not read.
    pub fn dead_letters_return(&self, queue: &str) -> Option<bool> {
        self.dead_letters_reach(queue, queue)
    }

    /// Whether what `from` dead-letters reaches `to`, its dead-letter
    /// chain through the default exchange followed queue by queue; `None`
    /// when the file cannot tell.
    pub fn dead_letters_reach(&self, from: &str, to: &str) -> Option<bool> {
        let mut seen = BTreeSet::new();
        let mut at = from.to_string();
        loop {
            let q = self.queues.iter().find(|q| q.name == at)?;
            let dlx = q.arguments.get("x-dead-letter-exchange");
            let key = q.arguments.get("x-dead-letter-routing-key");
            let next = match (dlx, key) {
                // No dead-letter exchange: the chain ends here.
                (None, _) => return Some(false),
                (Some(ArgValue::Str(x)), Some(ArgValue::Str(k))) if x.is_empty() => k.clone(),
                _ => return None,
            };
            if next == to {
                return Some(true);
            }
            if !seen.insert(next.clone()) {
                return Some(false);
            }
            at = next;
        }
    }

    /// The queues among `declared` a publish to `exchange` with `key` is
    /// routed to, as the broker routes it (the default exchange: the queue
    /// named `key`); `None` when that cannot be told from the declarations
    /// (a headers exchange, an exchange the lab does not declare).
    pub fn route<'a>(
        &'a self,
        exchange: &str,
        key: &str,
        declared: &BTreeSet<&str>,
    ) -> Option<BTreeSet<&'a str>> {
        let live = |q: &&QueueDecl| declared.contains(q.name.as_str());
        if exchange.is_empty() {
            return Some(
                self.queues
                    .iter()
                    .filter(live)
                    .filter(|q| q.name == key)
                    .map(|q| q.name.as_str())
                    .collect(),
            );
        }
        let kind = self.exchanges.iter().find(|x| x.name == exchange)?.kind;
        let matches = |pattern: &str| match kind {
            ExchangeKind::Direct => Some(pattern == key),
            ExchangeKind::Fanout => Some(true),
            ExchangeKind::Topic => Some(topic_matches(pattern, key)),
            ExchangeKind::Headers => None,
        };
        let mut out = BTreeSet::new();
        for q in self.queues.iter().filter(live) {
            for (x, pattern) in &q.bindings {
                if x == exchange && matches(pattern)? {
                    out.insert(q.name.as_str());
                }
            }
        }
        Some(out)
    }
}

/// A topic binding's pattern against a routing key: words split on `.`,
/// `*` one word, `#` zero or more.
pub(super) fn topic_matches(pattern: &str, key: &str) -> bool {
    fn walk(p: &[&str], k: &[&str]) -> bool {
        match (p.first(), k.first()) {
            (None, None) => true,
            (Some(&"#"), _) => walk(&p[1..], k) || (!k.is_empty() && walk(p, &k[1..])),
            (Some(&w), Some(&kw)) if w == "*" || w == kw => walk(&p[1..], &k[1..]),
            _ => false,
        }
    }
    let p: Vec<&str> = pattern.split('.').collect();
    let k: Vec<&str> = if key.is_empty() {
        Vec::new()
    } else {
        key.split('.').collect()
    };
    walk(&p, &k)
}

impl QueueDecl {
    /// A quorum queue: reading its messages counts as a delivery.
    pub fn is_quorum(&self) -> bool {
        self.arguments.get("x-queue-type") == Some(&ArgValue::Str("quorum".into()))
    }
}
