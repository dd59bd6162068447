//! The `external` environment: the user's own RabbitMQ and PostgreSQL. mqlab
//! starts nothing there; each invocation creates its own vhosts (through the
//! management HTTP API) and databases, all named with a prefix unique to the
//! invocation, and removes them when it stops (success, failure, Ctrl-C).
//! It never touches anything else. Only faults of what the harness runs
//! (role processes, its proxy) are possible: the broker is not ours.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use url::Url;

use super::{Endpoints, EnvInfo};
use crate::store;

/// Where the user's servers are, from `--amqp-url`, `--management-url` and
/// `--database-url`. Credentials stay in here and in URLs handed to
/// clients; nothing prints them.
#[derive(Clone)]
pub struct ExternalConfig {
    pub endpoints: Endpoints,
    management: Management,
}

#[derive(Clone)]
struct Management {
    /// Without credentials: safe to name in an error.
    base: String,
    user: String,
    password: String,
}

impl ExternalConfig {
    /// Parses the three URLs: a usage error names the flag, never the
    /// credentials.
    pub fn parse(amqp: &str, management: &str, database: &str) -> Result<ExternalConfig> {
        let parse = |flag: &str, s: &str, schemes: &[&str]| -> Result<Url> {
            let u = Url::parse(s).map_err(|e| anyhow::anyhow!("{flag}: not a URL ({e})"))?;
            if !schemes.contains(&u.scheme()) {
                bail!(
                    "{flag}: the scheme is `{}`, expected {}",
                    u.scheme(),
                    schemes.join(" or ")
                );
            }
            if u.host_str().is_none_or(str::is_empty) {
                bail!("{flag}: no host");
            }
            Ok(u)
        };
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        let a = parse("--amqp-url", amqp, &["amqp"])?;
        let m = parse("--management-url", management, &["http", "https"])?;
        let d = parse("--database-url", database, &["postgres", "postgresql"])?;
        if a.username().is_empty() {
            bail!("--amqp-url: no user (amqp://USER:PASSWORD@HOST:PORT)");
        }
        let admin_db = d.path().trim_start_matches('/');
        let mut base = m.clone();
        let _ = base.set_username("");
        let _ = base.set_password(None);
        let (m_user, m_password) = match m.username() {
            "" => (decode(a.username()), decode(a.password().unwrap_or(""))),
            u => (decode(u), decode(m.password().unwrap_or(""))),
        };
        Ok(ExternalConfig {
            endpoints: Endpoints {
                broker: crate::broker::Addr {
                    broker: crate::vocab::Broker::RabbitMq,
                    host: a.host_str().unwrap_or_default().to_string(),
                    port: a.port().unwrap_or(5672),
                    user: decode(a.username()),
                    password: decode(a.password().unwrap_or("")),
                },
                pg_host: d.host_str().unwrap_or_default().to_string(),
                pg_port: d.port().unwrap_or(5432),
                pg_user: match d.username() {
                    "" => "postgres".into(),
                    u => decode(u),
                },
                pg_password: d.password().map(decode),
                pg_admin: if admin_db.is_empty() {
                    "postgres".into()
                } else {
                    decode(admin_db)
                },
            },
            management: Management {
                base: base.as_str().trim_end_matches('/').to_string(),
                user: m_user,
                password: m_password,
            },
        })
    }
}

pub struct ExternalEnv {
    pub endpoints: Endpoints,
    pub info: EnvInfo,
    management: Management,
    /// Every vhost and database of this invocation starts with it.
    prefix: String,
    vhosts: Vec<String>,
}

impl ExternalEnv {
    /// Checks that both servers answer, and the rights (exit 2 when not:
    /// `Err` from here is a usage error), before anything is created.
    pub async fn preflight(config: &ExternalConfig) -> Result<()> {
        let who: serde_json::Value = config.management.get("/api/whoami").await?;
        let tags = match &who["tags"] {
            serde_json::Value::Array(a) => a
                .iter()
                .filter_map(|t| t.as_str().map(str::to_string))
                .collect::<Vec<_>>(),
            serde_json::Value::String(s) => s.split(',').map(|t| t.trim().to_string()).collect(),
            _ => Vec::new(),
        };
        if !tags.iter().any(|t| t == "administrator") {
            bail!(
                "the management user `{}` cannot create vhosts (it needs the `administrator` tag; it has: {})",
                config.management.user,
                if tags.is_empty() { "none".into() } else { tags.join(", ") }
            );
        }
        let e = &config.endpoints;
        within("the broker (--amqp-url)", crate::broker::version(&e.broker)).await?;
        let mut db = within(
            "PostgreSQL (--database-url)",
            store::connect(&e.pg_url(&e.pg_admin)),
        )
        .await?;
        let can: (bool,) = sqlx::query_as(
            "SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user",
        )
        .fetch_one(&mut db)
        .await?;
        if !can.0 {
            bail!(
                "the PostgreSQL role `{}` cannot create databases (it needs CREATEDB)",
                e.pg_user
            );
        }
        Ok(())
    }

    /// Nothing created yet; `create` makes the vhosts, `stop` removes what
    /// was made, even when `create` failed or was interrupted half way.
    pub fn new(config: ExternalConfig) -> ExternalEnv {
        // Unique per invocation: pids repeat across CI containers sharing
        // one broker, and another run's objects must never be adopted.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let tag = crate::partition::fnv1a(&format!("{}-{nanos}", std::process::id()));
        let prefix = format!("mqlab{:06x}-", tag & 0xff_ffff);
        ExternalEnv {
            endpoints: config.endpoints.clone(),
            info: EnvInfo {
                kind: "external",
                broker_version: String::new(),
                broker_source: format!(
                    "external {}:{}",
                    config.endpoints.broker.host, config.endpoints.broker.port
                ),
                db_version: String::new(),
                db_source: format!(
                    "external {}:{}",
                    config.endpoints.pg_host, config.endpoints.pg_port
                ),
                ready: Duration::ZERO,
            },
            management: config.management,
            prefix,
            vhosts: Vec::new(),
        }
    }

    pub async fn create(&mut self, vhosts: &[String]) -> Result<()> {
        let started = Instant::now();
        for v in vhosts {
            let name = self.vhost(v);
            let status = self
                .management
                .put(
                    &format!("/api/vhosts/{}", enc(&name)),
                    serde_json::json!({}),
                )
                .await?;
            if status != 201 {
                // 204: it existed. Not ours: never used, never removed.
                bail!("vhost `{name}` already exists on the external broker: not mqlab's to use");
            }
            // Recorded before the permissions: a failure from here on still
            // removes the vhost.
            self.vhosts.push(name.clone());
            self.management
                .put(
                    &format!(
                        "/api/permissions/{}/{}",
                        enc(&name),
                        enc(&self.endpoints.broker.user)
                    ),
                    serde_json::json!({"configure": ".*", "write": ".*", "read": ".*"}),
                )
                .await?;
        }
        let e = &self.endpoints;
        self.info.broker_version = within("the broker", crate::broker::version(&e.broker)).await?;
        let mut db = within("PostgreSQL", store::connect(&e.pg_url(&e.pg_admin))).await?;
        self.info.db_version = store::server_version(&mut db).await?;
        self.info.ready = started.elapsed();
        Ok(())
    }

    /// This invocation's name for a lab run's vhost (and, through
    /// `database_for`, its database).
    pub fn vhost(&self, run_vhost: &str) -> String {
        format!("{}{run_vhost}", self.prefix)
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Removes every vhost and database this invocation created; what it
    /// cannot remove is named.
    pub async fn stop(self) {
        for v in &self.vhosts {
            if let Err(e) = self
                .management
                .delete(&format!("/api/vhosts/{}", enc(v)))
                .await
            {
                eprintln!("mqlab: could not remove vhost `{v}` from the external broker: {e:#}");
            }
        }
        let e = &self.endpoints;
        let pattern = format!(
            "{}%",
            crate::naming::database_for(&self.prefix).replace('_', "\\_")
        );
        let dropped = async {
            let mut db = store::connect(&e.pg_url(&e.pg_admin)).await?;
            let names: Vec<(String,)> =
                sqlx::query_as("SELECT datname FROM pg_database WHERE datname LIKE $1")
                    .bind(&pattern)
                    .fetch_all(&mut db)
                    .await?;
            let mut failed = Vec::new();
            for (name,) in names {
                // WITH (FORCE), PostgreSQL 13 or later: a role process still
                // connected would otherwise keep its database.
                let drop = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
                if sqlx::query(&drop).execute(&mut db).await.is_err() {
                    failed.push(name);
                }
            }
            if !failed.is_empty() {
                bail!("could not drop {}", failed.join(", "));
            }
            anyhow::Ok(())
        };
        if let Err(err) = dropped.await {
            eprintln!(
                "mqlab: could not remove this run's databases ({pattern}) from the external PostgreSQL: {err:#}"
            );
        }
    }
}

/// The user's servers may not answer at all: say so within seconds.
async fn within<T>(what: &str, f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    match tokio::time::timeout(Duration::from_secs(10), f).await {
        Ok(r) => r.with_context(|| format!("{what} does not answer as expected")),
        Err(_) => bail!("{what} did not answer within 10 s"),
    }
}

fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

impl Management {
    async fn call(
        &self,
        method: &'static str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(u16, String)> {
        let url = format!("{}{path}", self.base);
        let auth = format!(
            "Basic {}",
            base64_encode(format!("{}:{}", self.user, self.password).as_bytes())
        );
        let shown = url.clone();
        tokio::task::spawn_blocking(move || -> Result<(u16, String)> {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .timeout_global(Some(Duration::from_secs(10)))
                .http_status_as_error(false)
                .build()
                .into();
            let mut response = match (method, body) {
                ("GET", _) => agent.get(&url).header("Authorization", &auth).call(),
                ("DELETE", _) => agent.delete(&url).header("Authorization", &auth).call(),
                (_, body) => agent
                    .put(&url)
                    .header("Authorization", &auth)
                    .header("Content-Type", "application/json")
                    .send(body.unwrap_or_default().to_string()),
            }
            .map_err(|e| anyhow::anyhow!("the management API at {shown} does not answer: {e}"))?;
            let status = response.status().as_u16();
            let text = response.body_mut().read_to_string().unwrap_or_default();
            match status {
                200..=299 => Ok((status, text)),
                401 => bail!("the management API at {shown} refused the credentials (401)"),
                403 => bail!("the management user lacks the rights for {method} {shown} (403)"),
                s => bail!("{method} {shown}: HTTP {s}: {}", text.trim()),
            }
        })
        .await?
    }

    async fn get(&self, path: &str) -> Result<serde_json::Value> {
        let (_, text) = self.call("GET", path, None).await?;
        serde_json::from_str(&text).context("the management API answered something else than JSON")
    }

    /// The status: 201 created, 204 it was there already.
    async fn put(&self, path: &str, body: serde_json::Value) -> Result<u16> {
        Ok(self.call("PUT", path, Some(body)).await?.0)
    }

    async fn delete(&self, path: &str) -> Result<()> {
        self.call("DELETE", path, None).await.map(drop)
    }
}

/// Standard base64 for one Basic-auth header.
fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The user's servers: no broker fault, nothing to sync or wait for.
impl super::Environment for ExternalEnv {
    fn endpoints(&self) -> &super::Endpoints {
        &self.endpoints
    }

    fn info(&self) -> &super::EnvInfo {
        &self.info
    }

    fn prefix(&self) -> String {
        ExternalEnv::prefix(self).to_string()
    }

    fn stop(self: Box<Self>) -> futures_util::future::LocalBoxFuture<'static, ()> {
        Box::pin(ExternalEnv::stop(*self))
    }

    fn kill_broker(&mut self) -> super::EnvFuture<'_, ()> {
        Box::pin(std::future::ready(super::not_ours()))
    }

    fn restart_broker(&mut self) -> super::EnvFuture<'_, ()> {
        Box::pin(std::future::ready(super::not_ours()))
    }

    fn pause_broker(&self) -> super::EnvFuture<'_, ()> {
        Box::pin(std::future::ready(super::not_ours()))
    }

    fn resume_broker(&self) -> super::EnvFuture<'_, ()> {
        Box::pin(std::future::ready(super::not_ours()))
    }

    fn sync_metadata(&self, _n: usize) -> super::EnvFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }

    /// The database is the user's: a run gets a database in it, never a
    /// server of its own (the plan refuses such a lab first).
    fn own_database<'a>(
        &'a self,
        _durability: crate::vocab::Durability,
        _dir: &'a std::path::Path,
        _lazy: bool,
    ) -> super::EnvFuture<'a, super::postgres::Own> {
        Box::pin(async {
            anyhow::bail!(
                "the database is the user's (--env external): mqlab cannot start a PostgreSQL of the run's own"
            )
        })
    }
}
