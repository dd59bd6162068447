//! Environment providers: where the broker and the database come from. The
//! runner only sees [`Endpoints`] and [`EnvInfo`], never how they were started.

pub mod guard;
pub mod local;
pub mod process;

use std::time::Duration;

/// How to reach the servers. Credentials live here and in URLs only, never in
/// a transcript.
#[derive(Clone, Debug)]
pub struct Endpoints {
    pub amqp_host: String,
    pub amqp_port: u16,
    pub amqp_user: String,
    pub amqp_password: String,
    pub pg_host: String,
    pub pg_port: u16,
    pub pg_user: String,
}

impl Endpoints {
    pub fn amqp_url(&self, vhost: &str) -> String {
        format!(
            "amqp://{}:{}@{}:{}/{}",
            self.amqp_user,
            self.amqp_password,
            self.amqp_host,
            self.amqp_port,
            percent_encode(vhost)
        )
    }

    pub fn pg_url(&self, database: &str) -> String {
        format!(
            "postgres://{}@{}:{}/{}",
            self.pg_user, self.pg_host, self.pg_port, database
        )
    }
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// What the evidence says about the servers: read from the running servers.
#[derive(Clone, Debug)]
pub struct EnvInfo {
    pub kind: &'static str,
    pub broker_version: String,
    pub broker_source: String,
    pub db_version: String,
    pub db_source: String,
    pub ready: Duration,
}

#[derive(Clone, Debug)]
pub struct EnvOptions {
    /// The run directory: the environment keeps its servers' files under `env/`.
    pub dir: std::path::PathBuf,
    pub ready_timeout: Duration,
    /// Leave the servers running after mqlab exits (`--keep`).
    pub keep: bool,
    /// Ports the user asked for; free ones are picked otherwise.
    pub amqp_port: Option<u16>,
    pub pg_port: Option<u16>,
    /// One isolated vhost per lab run, created at broker boot.
    pub vhosts: Vec<String>,
}

#[cfg(test)]
mod tests {
    #[test]
    fn vhost_names_are_escaped() {
        assert_eq!(super::percent_encode("/"), "%2F");
        assert_eq!(super::percent_encode("consumer-crash"), "consumer-crash");
    }
}
