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
use super::nodes::{self, Nodes, Server};
use super::rabbitmq::definitions_json;
use super::{free_ports, Endpoints, EnvInfo, EnvOptions};

mod cluster;

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
    /// Node 1.
    rabbit: Option<ContainerAsync<GenericImage>>,
    postgres: Option<ContainerAsync<GenericImage>>,
    pub endpoints: Endpoints,
    pub info: EnvInfo,
    ready: (String, Duration),
    /// A three-node cluster's (`nodes = 3`): nodes 2 and 3 and their network.
    cluster: Option<Cluster>,
}

/// Nodes 2 and 3 on a private network of the run's (labelled, so the guard
/// removes it after a SIGKILL), each found by its container name.
struct Cluster {
    docker: Docker,
    network: String,
    /// Container name = hostname, node n at n - 1.
    names: Vec<String>,
    /// AMQP on 127.0.0.1, node n at n - 1.
    ports: Vec<u16>,
    peers: Vec<ContainerAsync<GenericImage>>,
    /// The nodes cut off now, each with the addresses its rules drop.
    cut: Vec<(usize, Vec<String>)>,
}

/// A cluster's Erlang cookie: the nodes of one run share it.
const CLUSTER_COOKIE: &str = "mqlab-cluster-cookie";

/// A RabbitMQ container: node 1 of one node, or node n of a cluster.
fn rabbit_request(
    rabbitmq: &str,
    opts: &EnvOptions,
    run: &str,
    port: u16,
    node: Option<(&Cluster, usize)>,
) -> testcontainers::ContainerRequest<GenericImage> {
    let mut conf =
        "load_definitions = /etc/rabbitmq/mqlab-definitions.json\nloopback_users = none\n"
            .to_string();
    if let Some((c, _)) = node {
        conf.push_str(&format!(
            "cluster_formation.peer_discovery_backend = classic_config\n\
             cluster_formation.classic_config.nodes.1 = rabbit@{}\n\
             cluster_partition_handling = pause_minority\n",
            c.names[0]
        ));
    }
    // The node's name (and so its data directory, mnesia/<name>) must
    // not follow the container's hostname: a restart must find the
    // same data, or it boots a fresh node (see docs/environments.md, broker faults).
    let name = match node {
        Some((c, n)) => format!("rabbit@{}", c.names[n - 1]),
        None => "rabbit@localhost".into(),
    };
    let req = generic_image(rabbitmq)
        .with_label(RUN_LABEL, run)
        .with_env_var("RABBITMQ_NODENAME", name)
        .with_copy_to(
            CopyTargetOptions::new("/etc/rabbitmq/conf.d/90-mqlab.conf"),
            conf.into_bytes(),
        )
        .with_copy_to(
            CopyTargetOptions::new("/etc/rabbitmq/advanced.config"),
            super::rabbitmq::ADVANCED_CONFIG.as_bytes().to_vec(),
        )
        .with_copy_to(
            CopyTargetOptions::new("/etc/rabbitmq/mqlab-definitions.json"),
            definitions_json(&opts.vhosts).to_string().into_bytes(),
        )
        .with_host_config_modifier(bind_loopback("5672/tcp", port))
        .with_startup_timeout(opts.ready_timeout);
    match node {
        None => req,
        // A short net tick, so a partition is noticed within seconds.
        Some((c, n)) => req
            .with_network(c.network.clone())
            .with_container_name(c.names[n - 1].clone())
            .with_hostname(c.names[n - 1].clone())
            // Read by the node (as root) and by rabbitmqctl (Debian's wrapper
            // runs it as rabbitmq): a cookie file would have to suit both.
            .with_env_var("RABBITMQ_ERLANG_COOKIE", CLUSTER_COOKIE)
            .with_env_var(
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                "-kernel net_ticktime 10",
            ),
    }
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
        let run = std::env::var(RUN_VAR).unwrap_or_default();
        let mut env = Self::launch(&docker, opts, [rabbitmq, postgres], &ids, &run).await?;
        if let Err(e) = env
            .await_ready(&docker, opts, [rabbitmq, postgres], &mut ids, &run)
            .await
        {
            env.stop().await;
            return Err(e);
        }
        env.info.ready = started.elapsed();
        Ok(env)
    }

    /// An environment that owns no container yet, on these ports.
    fn owning(
        opts: &EnvOptions,
        amqp_port: u16,
        pg_port: u16,
        cluster: Option<Cluster>,
    ) -> ContainersEnv {
        ContainersEnv {
            rabbit: None,
            postgres: None,
            endpoints: Endpoints::loopback(super::rabbitmq::loopback(amqp_port), pg_port),
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
            cluster,
        }
    }

    /// Starts the broker's and the database's containers (and a cluster's
    /// network) and owns whatever started; on an error, removes it.
    async fn launch(
        docker: &Docker,
        opts: &EnvOptions,
        [rabbitmq, postgres]: [&str; 2],
        ids: &[String],
        run: &str,
    ) -> Result<ContainersEnv> {
        let ports = free_ports(2)?;
        let (amqp_port, pg_port) = (
            opts.broker_port.unwrap_or(ports[0]),
            opts.pg_port.unwrap_or(ports[1]),
        );
        let cluster = match &opts.cluster {
            Some(net) => Some(Cluster::create(docker, &opts.dir, net.ips.len(), amqp_port).await?),
            None => None,
        };
        let rabbit_req = rabbit_request(
            rabbitmq,
            opts,
            run,
            amqp_port,
            cluster.as_ref().map(|c| (c, 1)),
        );
        let pg_req = generic_image(postgres)
            .with_label(RUN_LABEL, run)
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
        let mut env = ContainersEnv::owning(opts, amqp_port, pg_port, cluster);
        // Whatever started is owned now, so that an error below still removes it.
        let rabbit = r.map_err(|e| failed(rabbitmq, !ids[0].is_empty(), e));
        let pg = p.map_err(|e| failed(postgres, !ids[1].is_empty(), e));
        match (rabbit, pg) {
            (Ok(rc), Ok(pc)) => {
                env.rabbit = Some(rc);
                env.postgres = Some(pc);
                Ok(env)
            }
            // Whatever started (and a cluster's network) goes.
            (Ok(rc), Err(e)) => {
                env.rabbit = Some(rc);
                env.stop().await;
                Err(e)
            }
            (Err(e), Ok(pc)) => {
                env.postgres = Some(pc);
                env.stop().await;
                Err(e)
            }
            (Err(e), Err(_)) => {
                env.stop().await;
                Err(e)
            }
        }
    }

    /// Waits for the broker and the database (and joins a cluster's other
    /// nodes), then says what runs in `info`.
    async fn await_ready(
        &mut self,
        docker: &Docker,
        opts: &EnvOptions,
        [rabbitmq, postgres]: [&str; 2],
        ids: &mut [String],
        run: &str,
    ) -> Result<()> {
        let deadline = Instant::now() + opts.ready_timeout;
        let (b, d) = tokio::join!(self.broker_ready(deadline), self.db_ready(deadline));
        let (b, d) = (b?, d?);
        for (i, reference) in [rabbitmq, postgres].iter().enumerate() {
            if ids[i].is_empty() {
                ids[i] = image_id(docker, reference).await.unwrap_or_default();
            }
        }
        if self.cluster.is_some() {
            opts.progress.say("RabbitMQ nodes 2 and 3 joining node 1");
            // Their own ready timeout, as on local nodes.
            let deadline = Instant::now() + opts.ready_timeout;
            self.start_peers(opts, rabbitmq, run, deadline).await?;
        }
        self.info.broker_version = match &self.cluster {
            Some(c) => format!("{b} ({} nodes)", c.names.len()),
            None => b,
        };
        self.info.db_version = d;
        self.info.broker_source = format!("{rabbitmq} (image id {})", ids[0]);
        self.info.db_source = format!("{postgres} (image id {})", ids[1]);
        Ok(())
    }

    async fn broker_ready(&self, deadline: Instant) -> Result<String> {
        let url = self.endpoints.broker_url(&self.ready.0);
        if nodes::answers_amqp(&url, deadline).await {
            return Server::version(self, 1).await;
        }
        let logs = match &self.rabbit {
            Some(c) => tail_logs(c).await,
            None => String::new(),
        };
        bail!(
            "RabbitMQ did not become ready within {} s; last lines of its log:\n{logs}",
            self.ready.1.as_secs()
        )
    }

    async fn db_ready(&self, deadline: Instant) -> Result<String> {
        let url = self.endpoints.pg_url(&self.endpoints.pg_admin);
        if let Some(version) = nodes::answers_postgres(&url, deadline).await? {
            return Ok(version);
        }
        let logs = match &self.postgres {
            Some(c) => tail_logs(c).await,
            None => String::new(),
        };
        bail!("PostgreSQL did not become ready; last lines of its log:\n{logs}")
    }

    pub async fn stop(&mut self) {
        let peers = self.cluster.as_mut().map(|c| std::mem::take(&mut c.peers));
        for c in [self.rabbit.take(), self.postgres.take()]
            .into_iter()
            .flatten()
            .chain(peers.into_iter().flatten())
        {
            let _ = c.rm().await;
        }
        if let Some(c) = self.cluster.take() {
            let _ = c.docker.remove_network(&c.network).await;
        }
    }

    fn broker(&self) -> Result<&ContainerAsync<GenericImage>> {
        self.rabbit.as_ref().context("the broker container is gone")
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
    // A cluster's network, once its containers are gone.
    let opts = testcontainers::bollard::query_parameters::ListNetworksOptionsBuilder::default()
        .filters(&filters)
        .build();
    if let Ok(Ok(nets)) =
        tokio::time::timeout(Duration::from_secs(5), docker.list_networks(Some(opts))).await
    {
        for n in nets.into_iter().filter_map(|n| n.name) {
            let _ = docker.remove_network(&n).await;
        }
    }
}

/// One node or a cluster of containers; the waits are [`nodes`]'s.
impl super::Environment for ContainersEnv {
    fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    fn info(&self) -> &EnvInfo {
        &self.info
    }

    fn broker_ports(&self) -> Vec<u16> {
        ContainersEnv::broker_ports(self)
    }

    fn stop(mut self: Box<Self>) -> futures_util::future::LocalBoxFuture<'static, ()> {
        Box::pin(async move { ContainersEnv::stop(&mut self).await })
    }

    fn kill_broker(&mut self) -> super::EnvFuture<'_, ()> {
        Box::pin(Server::kill(self, 1))
    }

    fn restart_broker(&mut self) -> super::EnvFuture<'_, ()> {
        Box::pin(nodes::restart(self, 1))
    }

    fn pause_broker(&self) -> super::EnvFuture<'_, ()> {
        Box::pin(Server::pause(self, 1))
    }

    fn resume_broker(&self) -> super::EnvFuture<'_, ()> {
        Box::pin(Server::resume(self, 1))
    }

    fn broker_setting(&self, s: crate::vocab::BrokerSetting) -> super::EnvFuture<'_, String> {
        Box::pin(async move {
            let answer = super::nodes::Nodes::eval(self, 1, &s.expression()).await?;
            Ok(s.value_of(&answer))
        })
    }

    fn sync_metadata(&self, n: usize) -> super::EnvFuture<'_, ()> {
        Box::pin(nodes::sync_metadata(self, n))
    }

    fn set_policy<'a>(&'a self, p: &'a super::PolicyRequest<'a>) -> super::EnvFuture<'a, ()> {
        Box::pin(nodes::set_policy(self, p))
    }

    fn queue_held<'a>(
        &'a self,
        vhost: &'a str,
        queue: &'a str,
    ) -> super::EnvFuture<'a, super::nodes::Held> {
        Box::pin(nodes::held(self, vhost, queue))
    }

    fn queue_holds<'a>(&'a self, vhost: &'a str, queue: &'a str) -> super::EnvFuture<'a, u64> {
        Box::pin(nodes::holds(self, vhost, queue))
    }

    fn queue_home_down<'a>(
        &'a self,
        n: usize,
        vhost: &'a str,
        queue: &'a str,
        faulted: &'a [usize],
    ) -> super::EnvFuture<'a, Option<bool>> {
        Box::pin(async move {
            nodes::home_down(self, n, vhost, queue, faulted)
                .await
                .map(Some)
        })
    }

    fn await_leader<'a>(
        &'a self,
        gone: usize,
        vhost: &'a str,
        queue: &'a str,
        deadline: Instant,
    ) -> super::EnvFuture<'a, ()> {
        Box::pin(nodes::await_leader(self, gone, vhost, queue, deadline))
    }

    fn kill_node(&mut self, n: usize) -> super::EnvFuture<'_, ()> {
        Box::pin(Server::kill(self, n))
    }

    fn restart_node(&mut self, n: usize) -> super::EnvFuture<'_, ()> {
        Box::pin(nodes::restart(self, n))
    }

    fn partition(&mut self, n: usize) -> super::EnvFuture<'_, ()> {
        Box::pin(nodes::partition(self, n))
    }

    fn heal(&mut self) -> super::EnvFuture<'_, ()> {
        Box::pin(nodes::heal(self))
    }
}

#[cfg(test)]
mod tests;
