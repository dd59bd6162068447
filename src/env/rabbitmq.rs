//! RabbitMQ's server as mqlab's own environments start it (a local node or
//! a container): its lab user, the files it boots with, where its 4.0
//! packages are.

use crate::vocab::{Broker, Generation};

/// The lab broker's only user. A fixed password is fine for a throwaway node
/// bound to 127.0.0.1; it never reaches a transcript.
pub const AMQP_USER: &str = "mqlab";
pub const AMQP_PASSWORD: &str = "mqlab";
/// `base64(salt ++ sha256(salt ++ "mqlab"))`, salt `mqlb`: RabbitMQ's
/// `rabbit_password_hashing_sha256` format for the definitions file.
const AMQP_PASSWORD_HASH: &str = "bXFsYqOmh5m7bntlzLoTNCAJ+VXuXuQBgrO3dSCfBLDxX2PX";

/// `advanced.config` for the lab node: a quorum queue's at-least-once
/// dead-letter worker retries a message its target did not take every
/// `dead_letter_worker_publisher_confirm_timeout` ms (3 min by default, not
/// settable in rabbitmq.conf in 3.10): 1 s lets a lab show the message
/// arriving once the target exists.
pub const ADVANCED_CONFIG: &str =
    "[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, 1000}]}].\n";

/// Vhosts, the lab user and its permissions, imported at boot: no CLI round
/// trips (each `rabbitmqctl` call costs ~0.7 s).
pub fn definitions_json(vhosts: &[String]) -> serde_json::Value {
    serde_json::json!({
        "users": [{
            "name": AMQP_USER,
            "password_hash": AMQP_PASSWORD_HASH,
            "hashing_algorithm": "rabbit_password_hashing_sha256",
            "tags": ["administrator"]
        }],
        "vhosts": vhosts.iter().map(|v| serde_json::json!({"name": v})).collect::<Vec<_>>(),
        "permissions": vhosts.iter().map(|v| serde_json::json!({
            "user": AMQP_USER, "vhost": v, "configure": ".*", "write": ".*", "read": ".*"
        })).collect::<Vec<_>>(),
    })
}

/// Where the 4.0 root is: `MQLAB_RABBITMQ_4_ROOT`, or where
/// `scripts/rabbitmq-4-root.sh` builds it.
pub fn rabbitmq_4_root() -> std::path::PathBuf {
    std::env::var_os("MQLAB_RABBITMQ_4_ROOT")
        .map(Into::into)
        .unwrap_or_else(|| "/var/tmp/mqlab-images/rabbitmq-4.0".into())
}

/// The generation a local node or a container runs: 3.10 from the
/// machine's own Debian packages, 4.0 from a Debian trixie root
/// (`scripts/rabbitmq-4-root.sh`; its binaries need trixie's libraries) or
/// its image. The broker's exact version is read from the server, as always.
/// `--rabbitmq 3.10 | 4.0`, from the vocabulary's table.
impl clap::ValueEnum for Generation {
    fn value_variants<'a>() -> &'a [Self] {
        static OF_RABBITMQ: std::sync::OnceLock<Vec<Generation>> = std::sync::OnceLock::new();
        OF_RABBITMQ.get_or_init(|| {
            Generation::ALL
                .iter()
                .map(|(g, _, _)| *g)
                .filter(|g| g.broker() == Broker::RabbitMq)
                .collect()
        })
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()).help(self.doc()))
    }
}

/// The lab user's address of a node on 127.0.0.1 at `port`.
pub fn loopback(port: u16) -> crate::broker::Addr {
    crate::broker::Addr {
        broker: Broker::RabbitMq,
        host: "127.0.0.1".into(),
        port,
        user: AMQP_USER.into(),
        password: AMQP_PASSWORD.into(),
    }
}
