//! The command line's arguments (clap): every flag with its help text.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand, ValueEnum};

use crate::env::local::KEPT_FILE;
use crate::session::EnvKind;

#[derive(Parser)]
#[command(
    name = "mqlab",
    version,
    about = "Fault-injection labs that prove or refute message-queue reliability claims against a real RabbitMQ and PostgreSQL",
    after_help = "Exit codes: 0 every lab passed and matched its snapshot; 1 a lab failed (assertion FAIL, snapshot mismatch, phase deadline); 2 usage or environment error; 130 interrupted."
)]
pub(super) struct Cli {
    /// Project directory holding labs/, fixtures/ and snapshots/ [default: the current
    /// directory if it has labs/, else the source checkout mqlab was built from]
    #[arg(long, global = true, env = "MQLAB_ROOT", value_name = "DIR")]
    pub(super) root: Option<PathBuf>,
    #[command(subcommand)]
    pub(super) cmd: Cmd,
}

#[derive(Subcommand)]
pub(super) enum Cmd {
    /// Run labs on one freshly started broker and database, then compare each
    /// normalized transcript with its stored snapshot
    Lab(LabArgs),
    /// Run a lab once per fault point its roles pass (every window × every
    /// message × every target, and a broker restart between any two steps),
    /// on one environment, each judged by the total-queue checks (and the
    /// downstream's and order service's counters they cannot see); print
    /// the matrix. Exit 0 when a safe lab holds at every point (or a variant
    /// fails at one at least), 1 otherwise
    Explore(ExploreArgs),
    /// Stream messages through competing consumers killed at random windows
    /// (and optionally broker restarts), reproducible from --seed; end with
    /// the total-queue check and throughput beside a plain auto-ack consumer.
    /// Exit 0 when nothing is lost or applied twice, 1 otherwise
    Soak(SoakArgs),
    /// List the labs with their claims, and the engine's vocabulary
    List,
    /// Re-judge a stored run offline from its evidence JSON (`--evidence DIR`
    /// writes DIR/<run>.json): the assertions and checks are evaluated again
    /// on the recorded transcript and observations
    Check {
        /// `<run>.json` files written by `mqlab lab --evidence`
        #[arg(required = true, value_name = "RUN_JSON")]
        files: Vec<PathBuf>,
    },
    /// Start an environment that outlives mqlab (a warm suite: `--env-dir`),
    /// or stop one
    #[command(subcommand)]
    Env(EnvCmd),
    /// Join reports of runs split over CI jobs (`--partition`)
    #[command(subcommand)]
    Report(ReportCmd),
    /// Internal: cleans up after a run when the harness goes away
    #[command(hide = true)]
    Guard {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Internal: a producer or consumer process started by the runner
    #[command(hide = true)]
    Role {
        /// The config as JSON
        #[arg(long, required_unless_present = "config_file")]
        config: Option<String>,
        /// The config in a file (a long message list does not fit in an argument)
        #[arg(long)]
        config_file: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
pub(super) enum EnvCmd {
    /// Start RabbitMQ and PostgreSQL, with a vhost for every lab run, `explore`
    /// and `soak`; print the directory to pass as `--env-dir` (stdout) and
    /// how to reach and stop it (stderr)
    Up {
        /// Seconds to wait for the broker and the database to become ready
        #[arg(long, default_value_t = 60, value_name = "SECS",
              value_parser = clap::value_parser!(u64).range(1..))]
        ready_timeout: u64,
        /// The broker's AMQP listener on this 127.0.0.1 port [default: a free one]
        #[arg(long, value_name = "PORT")]
        amqp_port: Option<u16>,
        /// PostgreSQL on this 127.0.0.1 port [default: a free one]
        #[arg(long, value_name = "PORT")]
        pg_port: Option<u16>,
        /// Also enable RabbitMQ's management API, and print the three URLs
        /// that `--env external` takes (to try it on these servers)
        #[arg(long)]
        management: bool,
        /// The RabbitMQ generation of the node [default: 3.10]
        #[arg(long, value_enum, env = "MQLAB_RABBITMQ", value_name = "GENERATION")]
        rabbitmq: Option<crate::env::Generation>,
    },
    /// Stop a kept environment and remove its directory
    Down {
        /// The directory `mqlab env up` or `mqlab lab --keep` printed
        dir: PathBuf,
    },
}

#[derive(Subcommand)]
pub(super) enum ReportCmd {
    /// Merge `--evidence` directories into one: every run's page and JSON,
    /// one index (OUT/README.md) and one JUnit report from the runs' JSON.
    /// Exit 0 when every merged run passed, 1 otherwise
    Merge {
        /// Evidence directories written by `mqlab lab --evidence DIR`
        #[arg(required = true, value_name = "DIR")]
        dirs: Vec<PathBuf>,
        /// Where the merged evidence goes
        #[arg(long, value_name = "OUT")]
        out: PathBuf,
        /// The merged JUnit report [default: OUT/junit.xml]
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
pub(super) struct ExploreArgs {
    /// The lab to explore; `LAB@VARIANT` explores a counterexample
    #[arg(value_name = "LAB")]
    pub(super) lab: String,
    /// Explore this counterexample variant of the lab
    #[arg(long, value_name = "NAME")]
    pub(super) variant: Option<String>,
    /// Run only this many points, chosen by --seed
    #[arg(long, value_name = "N")]
    pub(super) points: Option<usize>,
    /// The seed that chooses the points for --points
    #[arg(long, default_value_t = 1)]
    pub(super) seed: u64,
    /// Write DIR/explore-<run>.md: the matrix
    #[arg(long, value_name = "DIR")]
    pub(super) evidence: Option<PathBuf>,
    /// Run this command as the consumer of a lab that runs a program
    #[arg(long, value_name = "COMMAND")]
    pub(super) consumer_cmd: Option<String>,
    /// Run share K of N of the points (after --points): `K/N`, `count:K/N`
    /// or `hash:K/N`, as for `mqlab lab`
    #[arg(long, value_name = "K/N")]
    pub(super) partition: Option<crate::partition::Partition>,
    #[command(flatten)]
    pub(super) env: EnvArgs,
}

#[derive(clap::Args)]
pub(super) struct SoakArgs {
    /// Events to publish (a share of them twice, see --resend-share)
    #[arg(long, default_value_t = 10_000)]
    pub(super) messages: usize,
    /// Competing consumer processes
    #[arg(long, default_value_t = 2)]
    pub(super) consumers: usize,
    /// About how many consumer kills, at random windows
    #[arg(long, default_value_t = 50)]
    pub(super) kills: usize,
    /// The share of events the producer sends twice, back to back
    #[arg(long, default_value_t = 0.05)]
    pub(super) resend_share: f64,
    /// Broker restarts spread over the run
    #[arg(long, default_value_t = 0)]
    pub(super) broker_restarts: usize,
    /// The seed of the kills, their windows and the resent events
    #[arg(long, default_value_t = 1)]
    pub(super) seed: u64,
    /// The consumers' pattern (see `mqlab list`)
    #[arg(long, default_value = "inbox")]
    pub(super) pattern: String,
    /// Skip the auto-ack consumer measured beside it
    #[arg(long)]
    pub(super) no_baseline: bool,
    #[command(flatten)]
    pub(super) env: EnvArgs,
}

/// Where the servers come from: shared by `lab` and `explore`.
#[derive(clap::Args)]
pub(super) struct EnvArgs {
    /// Where the broker and database come from
    #[arg(long, value_enum, default_value_t = EnvKind::Auto, env = "MQLAB_ENV")]
    pub(super) env: EnvKind,
    /// Seconds to wait for the broker and the database to become ready
    #[arg(long, default_value_t = 60, value_name = "SECS",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) ready_timeout: u64,
    /// The RabbitMQ generation: a local node's (4.0 runs from a Debian
    /// trixie root: scripts/rabbitmq-4-root.sh builds it), or the one a
    /// container must run (its image: --rabbitmq-image, or
    /// MQLAB_RABBITMQ_4_IMAGE for 4.0) [default: 3.10 locally; a
    /// container's is its image's]
    #[arg(long, value_enum, env = "MQLAB_RABBITMQ", value_name = "GENERATION")]
    pub(super) rabbitmq: Option<crate::env::Generation>,
    /// Run the lab broker's AMQP listener on this 127.0.0.1 port [default: a free one]
    #[arg(long, value_name = "PORT")]
    pub(super) amqp_port: Option<u16>,
    /// Run the lab PostgreSQL on this 127.0.0.1 port [default: a free one]
    #[arg(long, value_name = "PORT")]
    pub(super) pg_port: Option<u16>,
    /// RabbitMQ image for --env containers [default: labs/environment.toml]
    #[arg(long, env = "MQLAB_RABBITMQ_IMAGE", value_name = "REF")]
    pub(super) rabbitmq_image: Option<String>,
    /// PostgreSQL image for --env containers [default: labs/environment.toml]
    #[arg(long, env = "MQLAB_POSTGRES_IMAGE", value_name = "REF")]
    pub(super) postgres_image: Option<String>,
    /// Accept image references that are not pinned by digest
    #[arg(long)]
    pub(super) allow_floating_images: bool,
    /// Run against the environment `mqlab env up` started in DIR (warm: no
    /// boot); its broker is killed and restarted by the labs that say so.
    /// One mqlab at a time per environment
    #[arg(long, value_name = "DIR", env = "MQLAB_ENV_DIR",
          conflicts_with_all = ["amqp_port", "pg_port"])]
    pub(super) env_dir: Option<PathBuf>,
    /// --env external: the broker, amqp://USER:PASSWORD@HOST:PORT (the user
    /// needs every right on the vhosts mqlab creates)
    #[arg(
        long,
        value_name = "URL",
        env = "MQLAB_EXTERNAL_AMQP_URL",
        hide_env_values = true
    )]
    pub(super) amqp_url: Option<String>,
    /// --env external: the broker's management API, http://USER:PASSWORD@HOST:15672
    /// (an `administrator`; without USER, the AMQP user) to create and delete vhosts
    #[arg(
        long,
        value_name = "URL",
        env = "MQLAB_EXTERNAL_MANAGEMENT_URL",
        hide_env_values = true
    )]
    pub(super) management_url: Option<String>,
    /// --env external: PostgreSQL, postgres://USER:PASSWORD@HOST:PORT/DB (a role
    /// with CREATEDB; DB is where it connects to create the runs' databases)
    #[arg(
        long,
        value_name = "URL",
        env = "MQLAB_EXTERNAL_DATABASE_URL",
        hide_env_values = true
    )]
    pub(super) database_url: Option<String>,
}

impl EnvArgs {
    /// The environment kind, with `--rabbitmq`: a generation is a local
    /// node's or a container's (checked against the server once it runs);
    /// an external broker's is its own. `auto` goes local with 4.0.
    pub(super) fn kind(&self) -> Result<EnvKind> {
        use crate::env::Generation;
        match (self.env, self.rabbitmq) {
            (EnvKind::External, Some(g)) => bail!(
                "--rabbitmq {} chooses the generation mqlab starts: an external broker's is its own (read from it)",
                g.name()
            ),
            (EnvKind::Auto, Some(Generation::V4_0)) => Ok(EnvKind::Local),
            (kind, _) => Ok(kind),
        }
    }

    pub(super) fn external(&self) -> Result<Option<crate::env::external::ExternalConfig>> {
        let given = [&self.amqp_url, &self.management_url, &self.database_url];
        if !matches!(self.env, EnvKind::External) {
            if given.iter().any(|u| u.is_some()) {
                bail!("--amqp-url, --management-url and --database-url go with --env external");
            }
            return Ok(None);
        }
        if self.env_dir.is_some() {
            bail!("--env external and --env-dir: choose one");
        }
        match (&self.amqp_url, &self.management_url, &self.database_url) {
            (Some(a), Some(m), Some(d)) => Ok(Some(crate::env::external::ExternalConfig::parse(a, m, d)?)),
            _ => bail!(
                "--env external needs --amqp-url, --management-url and --database-url (or MQLAB_EXTERNAL_AMQP_URL, MQLAB_EXTERNAL_MANAGEMENT_URL, MQLAB_EXTERNAL_DATABASE_URL)"
            ),
        }
    }

    /// The kept environment `--env-dir` names, read before anything starts;
    /// every vhost the runs need must be there.
    pub(super) fn attach(&self, vhosts: &[String]) -> Result<Option<crate::env::local::Kept>> {
        let Some(dir) = &self.env_dir else {
            return Ok(None);
        };
        if matches!(self.env, EnvKind::Containers) {
            bail!("--env-dir attaches to a local environment: drop --env containers");
        }
        let file = dir.join(KEPT_FILE);
        let text = std::fs::read_to_string(&file).map_err(|e| {
            anyhow::anyhow!(
                "`{}` is not an environment started by `mqlab env up` ({KEPT_FILE}: {e})",
                dir.display()
            )
        })?;
        let mut kept: crate::env::local::Kept = serde_json::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "`{}` is unreadable ({e}): start a new environment with `mqlab env up`",
                file.display()
            )
        })?;
        if let Some(v) = vhosts.iter().find(|v| !kept.vhosts.contains(v)) {
            bail!(
                "the environment in `{}` has no vhost `{v}` (it was started for other labs): start one for these labs with `mqlab env up`",
                dir.display()
            );
        }
        // One mqlab at a time: two would delete each other's queues and
        // restart the broker under each other.
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("kept.lock"))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => bail!(
                "another mqlab is running on the environment in `{}`; wait for it or start another with `mqlab env up`",
                dir.display()
            ),
            Err(std::fs::TryLockError::Error(e)) => return Err(e.into()),
        }
        kept.lock = Some(lock);
        Ok(Some(kept))
    }
}

#[derive(clap::Args)]
pub(super) struct LabArgs {
    #[command(flatten)]
    pub(super) env: EnvArgs,
    /// Labs to run (see `mqlab list`); `LAB@VARIANT` runs a counterexample
    #[arg(value_name = "LAB", required_unless_present_any = ["all", "group"])]
    pub(super) names: Vec<String>,
    /// Run every one-node lab under labs/, each followed by its
    /// counterexample variants (the cluster labs: --group cluster)
    #[arg(long, conflicts_with_all = ["names", "group"])]
    pub(super) all: bool,
    /// Run every lab of a group, each followed by its variants: `cluster`,
    /// the labs on three RabbitMQ nodes (`nodes = 3`; --env local, root for
    /// a partition)
    #[arg(long, value_name = "GROUP", conflicts_with = "names")]
    pub(super) group: Option<Group>,
    /// Run this counterexample variant of the named labs instead of the safe lab
    #[arg(long, value_name = "NAME", conflicts_with_all = ["all", "group"])]
    pub(super) variant: Option<String>,
    /// Rewrite the stored snapshots with this run's transcripts
    #[arg(long)]
    pub(super) update: bool,
    /// Also write each normalized transcript to DIR/<lab>.log
    #[arg(long, value_name = "DIR")]
    pub(super) transcript_dir: Option<PathBuf>,
    /// Write DIR/<lab>.md (claim, versions, assertions, sequence diagram, log) and DIR/<lab>.json per run
    #[arg(long, value_name = "DIR")]
    pub(super) evidence: Option<PathBuf>,
    /// Write a JUnit XML report: one testsuite per lab run, one testcase per assertion
    #[arg(long, value_name = "FILE")]
    pub(super) junit: Option<PathBuf>,
    /// Runs at once: labs without a broker fault run concurrently, each in
    /// its own vhost and database (their lines printed when each ends); a lab
    /// with one runs alone, after them [default: twice the number of cores, at most 8]
    #[arg(long, value_name = "N", default_value_t = twice_the_cores(),
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub(super) jobs: usize,
    /// Run this command as the consumer of every step that runs a program
    /// (a lab with a `command`), instead of the lab file's: a one-off run
    /// against your own consumer (role contract: docs/byo.md)
    #[arg(long, value_name = "COMMAND")]
    pub(super) consumer_cmd: Option<String>,
    /// Run share K of N of the runs (CI matrix jobs): `K/N` or `count:K/N`
    /// deals them in turn, `hash:K/N` by a hash of each run's name; the N
    /// shares run every run exactly once (`mqlab report merge` joins them)
    #[arg(long, value_name = "K/N")]
    pub(super) partition: Option<crate::partition::Partition>,
    /// Skip the labs this environment cannot run (a broker fault on
    /// --env external) instead of refusing to start; they are listed
    #[arg(long)]
    pub(super) skip_unsupported: bool,
    /// Leave RabbitMQ and PostgreSQL running afterwards (with the labs' vhosts and
    /// databases), print how to reach them and the command that stops them
    #[arg(long)]
    pub(super) keep: bool,
}

/// A named set of labs (`--group`).
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum Group {
    /// The labs on a three-node cluster (`nodes = 3`)
    Cluster,
}

/// The default for `--jobs`: a run mostly waits (on a TTL, a timeout, a
/// process or the broker), so twice the cores keep them busy. Measured on
/// 2 cores, 88 runs of `lab --all`: 54.2 s (mean of 3) at 2 at once, 43.8
/// and 47.7 s at 4. At most 8: each run holds 3-5 PostgreSQL connections
/// of the server's 100.
fn twice_the_cores() -> usize {
    (2 * std::thread::available_parallelism().map_or(1, |n| n.get())).min(8)
}
