//! One session of the harness, for `lab`, `explore`, `soak` and `env up`:
//! the runtime (SIGTERM and SIGINT caught from its start), the run
//! directory, the environment chosen and started once, and its teardown
//! however the work ended. The CLI parses arguments into a [`Setup`]; a
//! session runs the work on it (nextest's shape: clap → plan → session →
//! exit code).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::env::cluster::ClusterEnv;
use crate::env::containers::ContainersEnv;
use crate::env::guard::RunDir;
use crate::env::local::{Kept, LocalEnv, KEPT_FILE};
use crate::env::{EnvOptions, Environment, Progress};
use crate::error::{Error, UsageContext};
use crate::events::{Event, Sink};
use crate::lab::Lab;
use crate::naming;

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum EnvKind {
    /// Containers when a Docker-compatible engine answers and the pinned images are present, else local
    Auto,
    /// RabbitMQ and PostgreSQL as child processes of mqlab, from the installed packages
    Local,
    /// RabbitMQ and PostgreSQL from the images pinned in labs/environment.toml, through testcontainers
    Containers,
    /// Your own RabbitMQ and PostgreSQL (--amqp-url, --management-url,
    /// --database-url): each run makes and removes its own vhost and database
    External,
}

/// What a session starts, decided before anything starts.
pub struct Setup {
    pub kind: EnvKind,
    /// Leave a local environment running afterwards (`--keep`, `env up`).
    pub keep: bool,
    /// A kept environment to run on (`--env-dir`).
    pub attach: Option<Kept>,
    /// The RabbitMQ and PostgreSQL images (containers).
    pub images: (String, String),
    /// The user's servers (`--env external`).
    pub external: Option<crate::env::external::ExternalConfig>,
    pub ready_timeout: Duration,
    /// The ports asked for (`--amqp-port`, `--pg-port`).
    pub broker_port: Option<u16>,
    pub pg_port: Option<u16>,
    /// The vhosts (and databases) the runs get.
    pub vhosts: Vec<String>,
    pub management: bool,
    /// A three-node cluster.
    pub cluster: bool,
    /// The broker generation asked for (`--rabbitmq`): a local node's,
    /// and what the server must report (None: the broker's base generation
    /// locally, a container's image's).
    pub generation: Option<crate::env::Generation>,
}

/// A session's resources. Fields drop in order: the runtime (and with it
/// every task) before the run directory.
pub struct Session {
    rt: tokio::runtime::Runtime,
    run_dir: RunDir,
    exe: PathBuf,
    opts: EnvOptions,
    kind: EnvKind,
    keep: bool,
    attach: Option<Kept>,
    images: (String, String),
    external: Option<crate::env::external::ExternalConfig>,
}

/// How the work ended: its value, unless a signal came first.
pub struct Ended<T> {
    pub value: Option<T>,
    pub interrupted: Option<String>,
    /// The environment was left running (`--keep`).
    pub kept: bool,
}

impl<T> Ended<T> {
    /// The value, or `Error::Interrupted` (after the teardown).
    pub fn into_result(self) -> Result<T, Error> {
        match (self.value, self.interrupted) {
            (Some(v), None) => Ok(v),
            (_, sig) => Err(Error::Interrupted(sig.unwrap_or_default())),
        }
    }
}

impl Session {
    /// The executable (roles are its subcommands), the runtime, the
    /// external servers' preflight (bad credentials are exit 2 before
    /// anything is created), the run directory and its guard.
    pub fn open(setup: Setup, progress: Progress) -> Result<Session, Error> {
        let exe = std::env::current_exe()
            .context("cannot find the mqlab executable")
            .usage()?;
        let rt = harness_runtime().map_err(Error::Environment)?;
        if let Some(config) = &setup.external {
            rt.block_on(crate::env::external::ExternalEnv::preflight(config))
                .usage()?;
        }
        let run_dir = RunDir::create(&exe).map_err(Error::Environment)?;
        let opts = EnvOptions {
            dir: run_dir.path().to_path_buf(),
            broker: Default::default(),
            generation: setup.generation,
            ready_timeout: setup.ready_timeout,
            keep: setup.keep,
            broker_port: setup.broker_port,
            pg_port: setup.pg_port,
            vhosts: setup.vhosts,
            progress,
            management: setup.management,
            cluster: setup
                .cluster
                .then(|| crate::env::cluster::ClusterNet::new(3)),
        };
        Ok(Session {
            rt,
            run_dir,
            exe,
            opts,
            kind: setup.kind,
            keep: setup.keep,
            attach: setup.attach,
            images: setup.images,
            external: setup.external,
        })
    }

    pub fn exe(&self) -> &Path {
        &self.exe
    }

    pub fn run_dir(&self) -> &Path {
        self.run_dir.path()
    }

    /// Starts the environment of `runs`' broker (one broker: see
    /// [`by_broker`]; none: the default one), runs `work` on it until it
    /// ends or a signal comes, then stops the environment, or with `keep`
    /// (and no signal) leaves it running with `runs`' URLs in its kept file.
    pub fn run<T>(
        &mut self,
        sink: &mut dyn Sink,
        runs: &[Lab],
        work: impl AsyncFnOnce(&mut (dyn Environment + 'static), &mut dyn Sink) -> T,
    ) -> Result<Ended<T>, Error> {
        let broker = runs.first().map_or_else(Default::default, |l| l.broker);
        if let Some(other) = runs.iter().find(|l| l.broker != broker) {
            return Err(Error::Environment(anyhow::anyhow!(
                "one environment hosts one broker: {} runs on {}, {} on {broker} (a bug: by_broker groups them)",
                runs[0].run_name(),
                broker,
                other.run_name(),
            )));
        }
        let (attach, external) = (self.attach.take(), self.external.take());
        let opts = &EnvOptions {
            broker,
            // A second broker's environment keeps its files apart.
            dir: match broker == Default::default() {
                true => self.opts.dir.clone(),
                false => self.opts.dir.join(broker.name()),
            },
            // A cluster when one of these runs needs it (`nodes = 3`).
            cluster: (self.opts.cluster.clone())
                .filter(|_| runs.is_empty() || runs.iter().any(Lab::is_cluster)),
            ..self.opts.clone()
        };
        let (kind, keep, images) = (self.kind, self.keep, &self.images);
        let dir = self.run_dir.path();
        self.rt.block_on(async {
            let mut env = match external {
                Some(config) => start_external(config, &opts.vhosts, sink).await?,
                None => start_environment(kind, keep, attach, images, opts, sink).await?,
            };
            // Work that is done wins over a signal that came with it (`env
            // up`'s empty work: the environment is kept, as it always was).
            let (value, interrupted) = tokio::select! {
                biased;
                v = work(&mut *env, sink) => (Some(v), None),
                sig = interrupted() => (None, Some(sig)),
            };
            let kept = keep && interrupted.is_none();
            if kept {
                keep_running(env, dir, runs).map_err(Error::Environment)?;
            } else {
                env.stop().await;
            }
            Ok(Ended {
                value,
                interrupted,
                kept,
            })
        })
    }

    /// Ends the session: the runtime first, then the run directory, kept
    /// (an environment left running lives in it) or removed.
    pub fn close(self, keep_dir: bool) -> PathBuf {
        let Session { rt, run_dir, .. } = self;
        drop(rt);
        let path = run_dir.path().to_path_buf();
        if keep_dir {
            run_dir.keep();
        } else {
            run_dir.close();
        }
        path
    }
}

/// The runs by the broker each runs on, in the order of their first run:
/// one environment each, started only when a selected run needs it, one
/// after the other.
pub fn by_broker(runs: Vec<Lab>) -> Vec<Vec<Lab>> {
    let mut groups: Vec<Vec<Lab>> = Vec::new();
    for lab in runs {
        match groups.iter_mut().find(|g| g[0].broker == lab.broker) {
            Some(g) => g.push(lab),
            None => groups.push(vec![lab]),
        }
    }
    groups
}

/// Chooses, starts and announces the environment; Ctrl-C while it boots
/// is an interruption, a failure to start is an environment error.
async fn start_environment(
    kind: EnvKind,
    keep: bool,
    attach: Option<crate::env::local::Kept>,
    images: &(String, String),
    opts: &EnvOptions,
    sink: &mut dyn Sink,
) -> Result<Box<dyn Environment>, Error> {
    if let Some(kept) = attach {
        let why = format!("--env-dir {}", kept.dir.display());
        sink.tell(&Event::EnvChosen {
            kind: "local",
            why: &why,
        });
        let env = LocalEnv::attach(kept, opts.ready_timeout)
            .await
            .map_err(|e| Error::Environment(e.context("the kept environment does not answer")))?;
        let env: Box<dyn Environment> = Box::new(env);
        sink.tell(&Event::EnvReady(env.info()));
        return Ok(env);
    }
    // A cluster runs on local nodes unless containers are asked for.
    if opts.cluster.is_some() && !matches!(kind, EnvKind::Containers) {
        sink.tell(&Event::EnvChosen {
            kind: "local",
            why: "a three-node cluster (`nodes = 3`), local nodes",
        });
        let start = ClusterEnv::start(opts);
        let env = tokio::select! {
            env = start => Box::new(env.map_err(Error::Environment)?) as Box<dyn Environment>,
            sig = interrupted() => return Err(Error::Interrupted(sig)),
        };
        generation_matches(opts, env.as_ref())?;
        sink.tell(&Event::EnvReady(env.info()));
        return Ok(env);
    }
    let (containers, why) = choose(kind, keep, images)
        .await
        .map_err(Error::Environment)?;
    let name = if containers { "containers" } else { "local" };
    sink.tell(&Event::EnvChosen {
        kind: name,
        why: &why,
    });
    let start = async {
        Ok::<Box<dyn Environment>, anyhow::Error>(match containers {
            true => Box::new(ContainersEnv::start(opts, &images.0, &images.1).await?),
            false => crate::env::local::start(opts).await?,
        })
    };
    let env = tokio::select! {
        env = start => env.map_err(Error::Environment)?,
        sig = interrupted() => return Err(Error::Interrupted(sig)),
    };
    generation_matches(opts, env.as_ref())?;
    sink.tell(&Event::EnvReady(env.info()));
    Ok(env)
}

/// The generation asked for (`--rabbitmq 4.0`) is the one the server reports:
/// a container's image could be another, and a run must not be filed under
/// the wrong generation.
fn generation_matches(opts: &EnvOptions, env: &dyn Environment) -> Result<(), Error> {
    let Some(g) = opts.generation else {
        return Ok(());
    };
    let version = &env.info().broker_version;
    match crate::vocab::Generation::of_version(version) == Some(g) {
        true => Ok(()),
        false => Err(Error::Environment(anyhow::anyhow!(
            "{} {}, but the broker reports {version} (a container's image decides its generation)",
            g.broker().generation_flag(),
            g.name()
        ))),
    }
}

/// The user's servers: vhosts created, versions read. A failure or Ctrl-C
/// half way removes what was created.
async fn start_external(
    config: crate::env::external::ExternalConfig,
    vhosts: &[String],
    sink: &mut dyn Sink,
) -> Result<Box<dyn Environment>, Error> {
    sink.tell(&Event::EnvChosen {
        kind: "external",
        why: "--env external",
    });
    let mut env = crate::env::external::ExternalEnv::new(config);
    let outcome = tokio::select! {
        r = env.create(vhosts) => r.map_err(Error::Environment),
        sig = interrupted() => Err(Error::Interrupted(sig)),
    };
    if let Err(e) = outcome {
        env.stop().await;
        return Err(e);
    }
    let env: Box<dyn Environment> = Box::new(env);
    sink.tell(&Event::EnvReady(env.info()));
    Ok(env)
}

/// Which environment runs, and why, in a few words.
async fn choose(kind: EnvKind, keep: bool, images: &(String, String)) -> Result<(bool, String)> {
    let host =
        std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".into());
    Ok(match kind {
        EnvKind::Local | EnvKind::External => (false, "--env local".into()),
        EnvKind::Containers => {
            crate::env::containers::engine().await?;
            (true, "--env containers".into())
        }
        EnvKind::Auto if keep => (false, "--keep keeps local servers only".into()),
        EnvKind::Auto => match crate::env::containers::engine().await {
            Err(_) => (false, format!("no container engine answers at {host}")),
            Ok(docker) => {
                for reference in [&images.0, &images.1] {
                    if crate::env::containers::image_id(&docker, reference)
                        .await
                        .is_err()
                    {
                        return Ok((false, format!("image `{reference}` is not present")));
                    }
                }
                (
                    true,
                    format!("an engine answers at {host} and both pinned images are present"),
                )
            }
        },
    })
}

fn keep_running(env: Box<dyn Environment>, dir: &Path, labs: &[Lab]) -> Result<()> {
    let Some(env) = env.into_local() else {
        bail!("--keep works with the local environment only");
    };
    let mut kept = env.kept()?;
    let e = &env.endpoints;
    kept.runs = labs
        .iter()
        .map(|l| {
            serde_json::json!({
                "lab": l.run_name(),
                "broker": e.broker_url(&naming::vhost_for(&l.run_name())),
                "postgres": match l.database {
                    crate::vocab::Durability::Fast => e.pg_url(&naming::database_for(&l.run_name())),
                    durability => format!("the run's own `{durability}` cluster, stopped when the run ended"),
                },
            })
        })
        .collect();
    kept.write()?;
    eprintln!(
        "mqlab: environment kept running ({}, {})",
        env.info.broker_version, env.info.db_version
    );
    for r in kept.runs.iter().take(if labs.len() > 8 { 0 } else { 8 }) {
        eprintln!(
            "  {:<36} {}",
            r["lab"].as_str().unwrap_or(""),
            r["broker"].as_str().unwrap_or("")
        );
        eprintln!("  {:<36} {}", "", r["postgres"].as_str().unwrap_or(""));
    }
    if labs.len() > 8 {
        eprintln!(
            "  {} vhosts and databases: URLs in {}",
            labs.len(),
            dir.join(KEPT_FILE).display()
        );
    }
    eprintln!(
        "  run labs on it with: mqlab lab ... --env-dir {}",
        dir.display()
    );
    if let Some(port) = env.management_port {
        eprintln!(
            "  or as if it were yours: mqlab lab ... --env external --amqp-url {} --management-url http://{}:{}@127.0.0.1:{port} --database-url {}",
            e.broker_url("").trim_end_matches('/'),
            e.broker.user,
            e.broker.password,
            e.pg_url(&e.pg_admin)
        );
    }
    eprintln!("  stop it with: mqlab env down {}", dir.display());
    env.detach();
    Ok(())
}

/// Set by the harness's runtime: which signal arrived, once one has.
static INTERRUPT: std::sync::Mutex<Option<tokio::sync::watch::Receiver<Option<&'static str>>>> =
    std::sync::Mutex::new(None);

/// The runtime of a command that starts servers. SIGTERM and SIGINT are caught
/// from here on, before the run directory exists: a signal that lands while a
/// server boots, before any `select!` waits on [`interrupted`], is still seen
/// (it used to kill mqlab by the default action, exit -1 instead of 130).
pub fn harness_runtime() -> Result<tokio::runtime::Runtime> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = runtime()?;
    let rx = rt
        .block_on(async {
            let mut term = signal(SignalKind::terminate())?;
            let mut int = signal(SignalKind::interrupt())?;
            let (tx, rx) = tokio::sync::watch::channel(None);
            tokio::spawn(async move {
                let sig = tokio::select! {
                    _ = term.recv() => "terminated (SIGTERM)",
                    _ = int.recv() => "interrupted (SIGINT)",
                };
                tx.send_replace(Some(sig));
            });
            Ok::<_, std::io::Error>(rx)
        })
        .context("cannot catch SIGTERM and SIGINT")?;
    *INTERRUPT.lock().unwrap_or_else(|e| e.into_inner()) = Some(rx);
    Ok(rt)
}

pub fn runtime() -> Result<tokio::runtime::Runtime> {
    // One thread: children are spawned from it, and PR_SET_PDEATHSIG follows
    // the spawning thread.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// The first SIGTERM or SIGINT since [`harness_runtime`] started; pending
/// forever on a runtime that does not catch them.
pub async fn interrupted() -> String {
    let rx = INTERRUPT.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(mut rx) = rx {
        if let Ok(sig) = rx.wait_for(Option::is_some).await {
            return sig.unwrap_or_default().to_string();
        }
    }
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    fn lab(name: &str) -> crate::lab::Lab {
        let text = format!(
            "name = \"{name}\"\nclaim = \"c\"\n[[queue]]\nname = \"q\"\n[[step]]\npublish = {{ routing_key = \"q\", messages = [\"order-1001\"] }}\n"
        );
        let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures");
        crate::lab::from_str(&text, name, &fixtures, None).unwrap()
    }

    /// Runs keep their order within their broker's group, and a group
    /// comes where its first run came (one broker today: one group).
    #[test]
    fn runs_are_grouped_by_broker_in_order() {
        let groups = super::by_broker(vec![lab("b"), lab("a"), lab("c")]);
        let names: Vec<Vec<String>> = groups
            .iter()
            .map(|g| g.iter().map(|l| l.name.clone()).collect())
            .collect();
        assert_eq!(names, [["b", "a", "c"]]);
        assert!(super::by_broker(Vec::new()).is_empty());
    }
}
