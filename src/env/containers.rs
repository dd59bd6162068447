//! The `containers` environment: RabbitMQ and PostgreSQL from images pinned by
//! digest, started through testcontainers on a Docker-compatible engine
//! (Docker, or podman's API socket). Ports are published on 127.0.0.1 only,
//! explicitly (podman 4.3 reports no HostIp for publish-all ports).

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use testcontainers::bollard::models::{HostConfig, PortBinding};
use testcontainers::bollard::Docker;
use testcontainers::runners::AsyncRunner;
use testcontainers::CopyTargetOptions;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use super::guard::RUN_VAR;
use super::{definitions_json, free_ports, Endpoints, EnvInfo, EnvOptions};
use crate::{amqp, store};

/// The label every container of a run carries: the guard removes by it.
pub const RUN_LABEL: &str = "mqlab.run";

/// `labs/environment.toml`: the images users pin.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pins {
    pub rabbitmq: String,
    pub postgres: String,
}

impl Pins {
    pub fn load(path: &Path) -> Result<Pins> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the image pins `{}`", path.display()))?;
        #[derive(Deserialize)]
        struct File {
            images: Pins,
        }
        let f: File = toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.message()))?;
        Ok(f.images)
    }
}

/// A reference must name a digest unless the user accepts a floating one:
/// the evidence must say exactly what ran.
pub fn check_pinned(reference: &str, allow_floating: bool) -> Result<()> {
    let pinned = reference
        .split_once("@sha256:")
        .is_some_and(|(_, hex)| hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit()));
    if !pinned && !allow_floating {
        bail!(
            "image `{reference}` is not pinned by digest (hint: use NAME@sha256:<64 hex>, or pass --allow-floating-images)"
        );
    }
    Ok(())
}

/// testcontainers builds `name:tag`; a digest reference is split so that the
/// result is the reference itself.
fn generic_image(reference: &str) -> GenericImage {
    if let Some((name, hex)) = reference.split_once("@sha256:") {
        return GenericImage::new(format!("{name}@sha256"), hex.to_string());
    }
    // the last colon after the last slash separates the tag
    let slash = reference.rfind('/').map(|i| i + 1).unwrap_or(0);
    match reference[slash..].rfind(':') {
        Some(i) => GenericImage::new(
            reference[..slash + i].to_string(),
            reference[slash + i + 1..].to_string(),
        ),
        None => GenericImage::new(reference.to_string(), "latest".to_string()),
    }
}

/// The engine, or a one-line reason it cannot be used.
pub async fn engine() -> Result<Docker> {
    let host =
        std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".into());
    let hint = "(hint: start Docker or `podman system service --time=0 unix:///run/podman/podman.sock`, and point DOCKER_HOST at its socket)";
    let docker = Docker::connect_with_defaults()
        .with_context(|| format!("no Docker-compatible engine at `{host}` {hint}"))?;
    match tokio::time::timeout(Duration::from_secs(3), docker.ping()).await {
        Ok(Ok(_)) => Ok(docker),
        Ok(Err(e)) => bail!("no Docker-compatible engine answers at `{host}`: {e} {hint}"),
        Err(_) => bail!("the engine at `{host}` did not answer within 3 s {hint}"),
    }
}

/// The image's id as the engine reports it (the digest to cite), or why not.
pub async fn image_id(docker: &Docker, reference: &str) -> Result<String> {
    let img = docker
        .inspect_image(reference)
        .await
        .with_context(|| format!("image `{reference}` is not present"))?;
    Ok(img.id.unwrap_or_default())
}

pub struct ContainersEnv {
    rabbit: Option<ContainerAsync<GenericImage>>,
    postgres: Option<ContainerAsync<GenericImage>>,
    pub endpoints: Endpoints,
    pub info: EnvInfo,
    ready: (String, Duration),
}

fn bind_loopback(
    container_port: &'static str,
    host_port: u16,
) -> impl Fn(&mut HostConfig) + Send + Sync + 'static {
    move |hc: &mut HostConfig| {
        hc.publish_all_ports = Some(false);
        hc.port_bindings = Some(HashMap::from([(
            container_port.to_string(),
            Some(vec![PortBinding {
                host_ip: Some("127.0.0.1".into()),
                host_port: Some(host_port.to_string()),
            }]),
        )]));
    }
}

impl ContainersEnv {
    pub async fn start(opts: &EnvOptions, rabbitmq: &str, postgres: &str) -> Result<ContainersEnv> {
        let started = Instant::now();
        let docker = engine().await?;
        // Empty when absent: testcontainers then tries to pull.
        let mut ids = Vec::new();
        for reference in [rabbitmq, postgres] {
            ids.push(image_id(&docker, reference).await.unwrap_or_default());
        }
        let ports = free_ports(2)?;
        let (amqp_port, pg_port) = (
            opts.amqp_port.unwrap_or(ports[0]),
            opts.pg_port.unwrap_or(ports[1]),
        );
        let run = std::env::var(RUN_VAR).unwrap_or_default();
        let conf =
            "load_definitions = /etc/rabbitmq/mqlab-definitions.json\nloopback_users = none\n";
        let rabbit_req = generic_image(rabbitmq)
            .with_label(RUN_LABEL, &run)
            // The node's name (and so its data directory, mnesia/<name>) must
            // not follow the container's hostname: a restart must find the
            // same data, or it boots a fresh node (see README, broker faults).
            .with_env_var("RABBITMQ_NODENAME", "rabbit@localhost")
            .with_copy_to(
                CopyTargetOptions::new("/etc/rabbitmq/conf.d/90-mqlab.conf"),
                conf.as_bytes().to_vec(),
            )
            .with_copy_to(
                CopyTargetOptions::new("/etc/rabbitmq/advanced.config"),
                super::ADVANCED_CONFIG.as_bytes().to_vec(),
            )
            .with_copy_to(
                CopyTargetOptions::new("/etc/rabbitmq/mqlab-definitions.json"),
                definitions_json(&opts.vhosts).to_string().into_bytes(),
            )
            .with_host_config_modifier(bind_loopback("5672/tcp", amqp_port))
            .with_startup_timeout(opts.ready_timeout);
        let pg_req = generic_image(postgres)
            .with_label(RUN_LABEL, &run)
            .with_env_var("POSTGRES_HOST_AUTH_METHOD", "trust")
            .with_host_config_modifier(bind_loopback("5432/tcp", pg_port))
            .with_startup_timeout(opts.ready_timeout);
        let failed = |reference: &str, present: bool, e: testcontainers::TestcontainersError| {
            match present {
                true => anyhow::anyhow!("cannot start a container of image `{reference}`: {e}"),
                false => {
                    anyhow::anyhow!("image `{reference}` is not present and cannot be pulled ({e})")
                }
            }
        };
        opts.progress
            .say("starting the RabbitMQ and PostgreSQL containers");
        let (r, p) = tokio::join!(rabbit_req.start(), pg_req.start());
        opts.progress.say("waiting for RabbitMQ and PostgreSQL");
        let mut env = ContainersEnv {
            rabbit: None,
            postgres: None,
            endpoints: Endpoints::loopback(amqp_port, pg_port),
            info: EnvInfo {
                kind: "containers",
                broker_version: String::new(),
                broker_source: String::new(),
                db_version: String::new(),
                db_source: String::new(),
                ready: Duration::ZERO,
            },
            ready: (
                opts.vhosts.first().cloned().unwrap_or_else(|| "/".into()),
                opts.ready_timeout,
            ),
        };
        // Whatever started is owned now, so that an error below still removes it.
        let rabbit = r.map_err(|e| failed(rabbitmq, !ids[0].is_empty(), e));
        let pg = p.map_err(|e| failed(postgres, !ids[1].is_empty(), e));
        match (rabbit, pg) {
            (Ok(rc), Ok(pc)) => {
                env.rabbit = Some(rc);
                env.postgres = Some(pc);
            }
            (Ok(rc), Err(e)) => {
                let _ = rc.rm().await;
                return Err(e);
            }
            (Err(e), Ok(pc)) => {
                let _ = pc.rm().await;
                return Err(e);
            }
            (Err(e), Err(_)) => return Err(e),
        }
        let deadline = Instant::now() + opts.ready_timeout;
        let (b, d) = tokio::join!(env.broker_ready(deadline), env.db_ready(deadline));
        let (b, d) = match (b, d) {
            (Ok(b), Ok(d)) => (b, d),
            (Err(e), _) | (_, Err(e)) => {
                env.stop().await;
                return Err(e);
            }
        };
        for (i, reference) in [rabbitmq, postgres].iter().enumerate() {
            if ids[i].is_empty() {
                ids[i] = image_id(&docker, reference).await.unwrap_or_default();
            }
        }
        env.info.broker_version = b;
        env.info.db_version = d;
        env.info.broker_source = format!("{rabbitmq} (image id {})", ids[0]);
        env.info.db_source = format!("{postgres} (image id {})", ids[1]);
        env.info.ready = started.elapsed();
        Ok(env)
    }

    async fn broker_ready(&self, deadline: Instant) -> Result<String> {
        let url = self.endpoints.amqp_url(&self.ready.0);
        loop {
            if let Ok(conn) = amqp::connect(&url).await {
                let _ = conn.close(200, "ready".into()).await;
                return amqp::broker_version(&self.endpoints.amqp_host, self.endpoints.amqp_port)
                    .await;
            }
            if Instant::now() > deadline {
                let logs = match &self.rabbit {
                    Some(c) => tail_logs(c).await,
                    None => String::new(),
                };
                bail!(
                    "RabbitMQ did not become ready within {} s; last lines of its log:\n{logs}",
                    self.ready.1.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn db_ready(&self, deadline: Instant) -> Result<String> {
        let url = self.endpoints.pg_url(&self.endpoints.pg_admin);
        loop {
            if let Ok(mut c) = store::connect(&url).await {
                return store::server_version(&mut c).await;
            }
            if Instant::now() > deadline {
                let logs = match &self.postgres {
                    Some(c) => tail_logs(c).await,
                    None => String::new(),
                };
                bail!("PostgreSQL did not become ready; last lines of its log:\n{logs}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn stop(&mut self) {
        for c in [self.rabbit.take(), self.postgres.take()]
            .into_iter()
            .flatten()
        {
            let _ = c.rm().await;
        }
    }

    fn broker(&self) -> Result<&ContainerAsync<GenericImage>> {
        self.rabbit.as_ref().context("the broker container is gone")
    }

    /// A kill (exit 137), as `docker kill` does it.
    pub async fn kill_broker(&mut self) -> Result<()> {
        self.broker()?.stop_with_timeout(Some(0)).await?;
        Ok(())
    }

    /// SIGKILL (if it runs) and start again: same container, same data,
    /// same host port.
    pub async fn restart_broker(&mut self) -> Result<()> {
        let running = self
            .broker()?
            .is_running()
            .await
            .context("asking the engine about the broker container")?;
        if running {
            self.kill_broker().await?;
        }
        self.broker()?.start().await?;
        self.broker_ready(Instant::now() + self.ready.1).await?;
        Ok(())
    }

    /// See `LocalEnv::sync_metadata`: the node writes its metadata log now.
    pub async fn sync_metadata(&self) -> Result<()> {
        let mut r = self
            .broker()?
            .exec(testcontainers::core::ExecCommand::new([
                "rabbitmqctl",
                "eval",
                "mnesia:sync_log().",
            ]))
            .await
            .context("rabbitmqctl eval in the broker container")?;
        let out = r.stdout_to_vec().await?;
        let code = r.exit_code().await?;
        if code != Some(0) || String::from_utf8_lossy(&out).trim() != "ok" {
            bail!(
                "`rabbitmqctl eval mnesia:sync_log()` in the broker container failed ({code:?}): {}",
                String::from_utf8_lossy(&out).trim()
            );
        }
        Ok(())
    }

    pub async fn pause_broker(&self) -> Result<()> {
        self.broker()?.pause().await?;
        Ok(())
    }

    pub async fn resume_broker(&self) -> Result<()> {
        self.broker()?.unpause().await?;
        Ok(())
    }
}

async fn tail_logs(c: &ContainerAsync<GenericImage>) -> String {
    let mut out = c.stdout_to_vec().await.unwrap_or_default();
    out.extend(c.stderr_to_vec().await.unwrap_or_default());
    let text = String::from_utf8_lossy(&out);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Removes every container labelled with this run (the guard's path after a
/// SIGKILL of mqlab). Quiet when no engine answers: then there is nothing to remove.
pub async fn remove_labelled(run: &str) {
    let Ok(docker) = Docker::connect_with_defaults() else {
        return;
    };
    let filters = HashMap::from([("label".to_string(), vec![format!("{RUN_LABEL}={run}")])]);
    let opts = testcontainers::bollard::query_parameters::ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let Ok(Ok(list)) =
        tokio::time::timeout(Duration::from_secs(5), docker.list_containers(Some(opts))).await
    else {
        return;
    };
    for c in list {
        if let Some(id) = c.id {
            let rm =
                testcontainers::bollard::query_parameters::RemoveContainerOptionsBuilder::default()
                    .force(true)
                    .v(true)
                    .build();
            let _ = docker.remove_container(&id, Some(rm)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floating_references_are_refused_unless_allowed() {
        let hex = "294b01e1796a8acede4619f32a1c394fae1f8021e57986ea01aad38dc2a4f502";
        assert!(check_pinned(&format!("rabbitmq:4.1.4-management@sha256:{hex}"), false).is_ok());
        assert!(check_pinned("rabbitmq:latest", false)
            .unwrap_err()
            .to_string()
            .contains("not pinned by digest"));
        assert!(check_pinned("rabbitmq@sha256:abc", false).is_err());
        assert!(check_pinned("rabbitmq:latest", true).is_ok());
    }

    #[test]
    fn references_round_trip_through_generic_image() {
        use testcontainers::Image;
        let hex = "67f41722b7a8cbdb868a44a4995c846eddfdc2973bccb291ce937dce88ad5675";
        for r in [
            format!("postgres:17@sha256:{hex}"),
            format!("localhost/mqlab-postgres@sha256:{hex}"),
            "localhost:5000/x/rabbitmq:3.10".to_string(),
        ] {
            let g = generic_image(&r);
            assert_eq!(format!("{}:{}", g.name(), g.tag()), r);
        }
    }
}
