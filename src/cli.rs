//! The command line: a thin front end. Parses, validates everything that can
//! be checked without servers (labs, fixtures, snapshots, output paths),
//! then hands over to the environment and the runner, whose events the
//! sinks turn into output.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};

use crate::env::containers::{check_pinned, Pins};
use crate::env::Progress;
use crate::error::{Error, UsageContext};
use crate::events::{Event, Fanout, Sink};
use crate::evidence;
use crate::exit;
use crate::lab::{Lab, Project};
use crate::naming;
use crate::record::RunRecord;
use crate::runner::Suite;
use crate::session::{EnvKind, Session, Setup};
use crate::sinks::{self, out};
use crate::snapshot;

/// Prints a line to stdout, ignoring a closed pipe.
macro_rules! out {
    () => {
        out("")
    };
    ($($arg:tt)*) => {
        out(&format!($($arg)*))
    };
}

#[derive(Parser)]
#[command(
    name = "mqlab",
    version,
    about = "Fault-injection labs that prove or refute message-queue reliability claims against a real RabbitMQ and PostgreSQL",
    after_help = "Exit codes: 0 every lab passed and matched its snapshot; 1 a lab failed (assertion FAIL, snapshot mismatch, phase deadline); 2 usage or environment error; 130 interrupted."
)]
struct Cli {
    /// Project directory holding labs/, fixtures/ and snapshots/ [default: the current
    /// directory if it has labs/, else the source checkout mqlab was built from]
    #[arg(long, global = true, env = "MQLAB_ROOT", value_name = "DIR")]
    root: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run labs on one freshly started broker and database, then compare each
    /// normalized transcript with its stored snapshot
    Lab(LabArgs),
    /// Run a lab once per fault point its roles pass (every window × every
    /// message × every target, and a broker restart between any two steps),
    /// on one environment, each judged by the total-queue checks alone; print
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
enum EnvCmd {
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
    },
    /// Stop a kept environment and remove its directory
    Down {
        /// The directory `mqlab env up` or `mqlab lab --keep` printed
        dir: PathBuf,
    },
}

#[derive(Subcommand)]
enum ReportCmd {
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
struct ExploreArgs {
    /// The lab to explore; `LAB@VARIANT` explores a counterexample
    #[arg(value_name = "LAB")]
    lab: String,
    /// Explore this counterexample variant of the lab
    #[arg(long, value_name = "NAME")]
    variant: Option<String>,
    /// Run only this many points, chosen by --seed
    #[arg(long, value_name = "N")]
    points: Option<usize>,
    /// The seed that chooses the points for --points
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write DIR/explore-<run>.md: the matrix
    #[arg(long, value_name = "DIR")]
    evidence: Option<PathBuf>,
    /// Run this command as the consumer of a lab that runs a program
    #[arg(long, value_name = "COMMAND")]
    consumer_cmd: Option<String>,
    /// Run share K of N of the points (after --points): `K/N`, `count:K/N`
    /// or `hash:K/N`, as for `mqlab lab`
    #[arg(long, value_name = "K/N")]
    partition: Option<crate::partition::Partition>,
    #[command(flatten)]
    env: EnvArgs,
}

#[derive(clap::Args)]
struct SoakArgs {
    /// Events to publish (a share of them twice, see --resend-share)
    #[arg(long, default_value_t = 10_000)]
    messages: usize,
    /// Competing consumer processes
    #[arg(long, default_value_t = 2)]
    consumers: usize,
    /// About how many consumer kills, at random windows
    #[arg(long, default_value_t = 50)]
    kills: usize,
    /// The share of events the producer sends twice, back to back
    #[arg(long, default_value_t = 0.05)]
    resend_share: f64,
    /// Broker restarts spread over the run
    #[arg(long, default_value_t = 0)]
    broker_restarts: usize,
    /// The seed of the kills, their windows and the resent events
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The consumers' pattern (see `mqlab list`)
    #[arg(long, default_value = "inbox")]
    pattern: String,
    /// Skip the auto-ack consumer measured beside it
    #[arg(long)]
    no_baseline: bool,
    #[command(flatten)]
    env: EnvArgs,
}

/// Where the servers come from: shared by `lab` and `explore`.
#[derive(clap::Args)]
struct EnvArgs {
    /// Where the broker and database come from
    #[arg(long, value_enum, default_value_t = EnvKind::Auto, env = "MQLAB_ENV")]
    env: EnvKind,
    /// Seconds to wait for the broker and the database to become ready
    #[arg(long, default_value_t = 60, value_name = "SECS",
          value_parser = clap::value_parser!(u64).range(1..))]
    ready_timeout: u64,
    /// Run the lab broker's AMQP listener on this 127.0.0.1 port [default: a free one]
    #[arg(long, value_name = "PORT")]
    amqp_port: Option<u16>,
    /// Run the lab PostgreSQL on this 127.0.0.1 port [default: a free one]
    #[arg(long, value_name = "PORT")]
    pg_port: Option<u16>,
    /// RabbitMQ image for --env containers [default: labs/environment.toml]
    #[arg(long, env = "MQLAB_RABBITMQ_IMAGE", value_name = "REF")]
    rabbitmq_image: Option<String>,
    /// PostgreSQL image for --env containers [default: labs/environment.toml]
    #[arg(long, env = "MQLAB_POSTGRES_IMAGE", value_name = "REF")]
    postgres_image: Option<String>,
    /// Accept image references that are not pinned by digest
    #[arg(long)]
    allow_floating_images: bool,
    /// Run against the environment `mqlab env up` started in DIR (warm: no
    /// boot); its broker is killed and restarted by the labs that say so.
    /// One mqlab at a time per environment
    #[arg(long, value_name = "DIR", env = "MQLAB_ENV_DIR",
          conflicts_with_all = ["amqp_port", "pg_port"])]
    env_dir: Option<PathBuf>,
    /// --env external: the broker, amqp://USER:PASSWORD@HOST:PORT (the user
    /// needs every right on the vhosts mqlab creates)
    #[arg(
        long,
        value_name = "URL",
        env = "MQLAB_EXTERNAL_AMQP_URL",
        hide_env_values = true
    )]
    amqp_url: Option<String>,
    /// --env external: the broker's management API, http://USER:PASSWORD@HOST:15672
    /// (an `administrator`; without USER, the AMQP user) to create and delete vhosts
    #[arg(
        long,
        value_name = "URL",
        env = "MQLAB_EXTERNAL_MANAGEMENT_URL",
        hide_env_values = true
    )]
    management_url: Option<String>,
    /// --env external: PostgreSQL, postgres://USER:PASSWORD@HOST:PORT/DB (a role
    /// with CREATEDB; DB is where it connects to create the runs' databases)
    #[arg(
        long,
        value_name = "URL",
        env = "MQLAB_EXTERNAL_DATABASE_URL",
        hide_env_values = true
    )]
    database_url: Option<String>,
}

impl EnvArgs {
    /// `--env external`'s servers, parsed before anything connects; the URL
    /// flags without `--env external` are a mistake worth one line.
    fn external(&self) -> Result<Option<crate::env::external::ExternalConfig>> {
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
    fn attach(&self, vhosts: &[String]) -> Result<Option<crate::env::local::Kept>> {
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
struct LabArgs {
    #[command(flatten)]
    env: EnvArgs,
    /// Labs to run (see `mqlab list`); `LAB@VARIANT` runs a counterexample
    #[arg(value_name = "LAB", required_unless_present_any = ["all", "group"])]
    names: Vec<String>,
    /// Run every one-node lab under labs/, each followed by its
    /// counterexample variants (the cluster labs: --group cluster)
    #[arg(long, conflicts_with_all = ["names", "group"])]
    all: bool,
    /// Run every lab of a group, each followed by its variants: `cluster`,
    /// the labs on three RabbitMQ nodes (`nodes = 3`; --env local, root for
    /// a partition)
    #[arg(long, value_name = "GROUP", conflicts_with = "names")]
    group: Option<Group>,
    /// Run this counterexample variant of the named labs instead of the safe lab
    #[arg(long, value_name = "NAME", conflicts_with_all = ["all", "group"])]
    variant: Option<String>,
    /// Rewrite the stored snapshots with this run's transcripts
    #[arg(long)]
    update: bool,
    /// Also write each normalized transcript to DIR/<lab>.log
    #[arg(long, value_name = "DIR")]
    transcript_dir: Option<PathBuf>,
    /// Write DIR/<lab>.md (claim, versions, assertions, sequence diagram, log) and DIR/<lab>.json per run
    #[arg(long, value_name = "DIR")]
    evidence: Option<PathBuf>,
    /// Write a JUnit XML report: one testsuite per lab run, one testcase per assertion
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Runs at once: labs without a broker fault run concurrently, each in
    /// its own vhost and database (their lines printed when each ends); a lab
    /// with one runs alone, after them [default: the number of cores]
    #[arg(long, value_name = "N", default_value_t = cores(),
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    jobs: usize,
    /// Run this command as the consumer of every step that runs a program
    /// (a lab with a `command`), instead of the lab file's: a one-off run
    /// against your own consumer (role contract: docs/byo.md)
    #[arg(long, value_name = "COMMAND")]
    consumer_cmd: Option<String>,
    /// Run share K of N of the runs (CI matrix jobs): `K/N` or `count:K/N`
    /// deals them in turn, `hash:K/N` by a hash of each run's name; the N
    /// shares run every run exactly once (`mqlab report merge` joins them)
    #[arg(long, value_name = "K/N")]
    partition: Option<crate::partition::Partition>,
    /// Skip the labs this environment cannot run (a broker fault on
    /// --env external) instead of refusing to start; they are listed
    #[arg(long)]
    skip_unsupported: bool,
    /// Leave RabbitMQ and PostgreSQL running afterwards (with the labs' vhosts and
    /// databases), print how to reach them and the command that stops them
    #[arg(long)]
    keep: bool,
}

/// A named set of labs (`--group`).
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Group {
    /// The labs on a three-node cluster (`nodes = 3`)
    Cluster,
}

pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                exit::SETUP
            } else {
                exit::OK
            };
        }
    };
    let project = Project {
        root: cli.root.clone().unwrap_or_else(default_root),
    };
    // A bug in the harness is one line and a clean teardown (the unwinding
    // drops the environment), not a trace.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("mqlab: internal error: {msg}{at} (a bug in mqlab; everything it started is being stopped)");
    }));
    let result = match cli.cmd {
        Cmd::Lab(args) => {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cmd_lab(&project, args)))
            {
                Ok(r) => r,
                Err(_) => return exit::INTERNAL,
            }
        }
        Cmd::Explore(args) => {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                cmd_explore(&project, args)
            })) {
                Ok(r) => r,
                Err(_) => return exit::INTERNAL,
            }
        }
        Cmd::Soak(args) => {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                cmd_soak(&project, args)
            })) {
                Ok(r) => r,
                Err(_) => return exit::INTERNAL,
            }
        }
        Cmd::List => cmd_list(&project).usage(),
        Cmd::Check { files } => cmd_check(&files),
        Cmd::Env(EnvCmd::Down { dir }) => cmd_env_down(&dir).usage(),
        Cmd::Report(ReportCmd::Merge { dirs, out, junit }) => {
            cmd_report_merge(&dirs, &out, junit.as_deref())
        }
        Cmd::Env(EnvCmd::Up {
            ready_timeout,
            amqp_port,
            pg_port,
            management,
        }) => cmd_env_up(&project, ready_timeout, amqp_port, pg_port, management),
        Cmd::Role {
            config,
            config_file,
        } => {
            let config = match (config, config_file) {
                (Some(c), _) => c,
                (None, Some(f)) => match std::fs::read_to_string(&f) {
                    Ok(c) => c,
                    Err(e) => {
                        eprintln!("error: cannot read `{}`: {e}", f.display());
                        return exit::LAB_FAILED;
                    }
                },
                (None, None) => return exit::SETUP,
            };
            return run_role(&config);
        }
        Cmd::Guard { dir } => return crate::env::guard::guard_main(&dir),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            match &e {
                Error::Interrupted(why) => eprintln!("mqlab: {why}; environment stopped"),
                _ => {
                    for line in e.lines() {
                        eprintln!("error: {line}");
                    }
                }
            }
            e.exit_code()
        }
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn default_root() -> PathBuf {
    let cwd = std::env::current_dir().unwrap_or_default();
    if cwd.join("labs").is_dir() {
        cwd
    } else {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }
}

fn run_role(config: &str) -> i32 {
    // The role's log is a file: no colour codes in it (they reach JUnit).
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let result = crate::session::runtime().and_then(|rt| {
        rt.block_on(async {
            match crate::protocol::Envelope::from_json(config)?.config {
                crate::protocol::RoleConfig::Producer(c) => crate::roles::producer::run(c).await,
                crate::protocol::RoleConfig::Consumer(c) => crate::roles::consumer::run(c).await,
            }
        })
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            exit::LAB_FAILED
        }
    }
}

fn cmd_list(project: &Project) -> Result<i32> {
    out!("labs ({}):", project.labs_dir().display());
    for name in project.lab_names()? {
        match project.load(&name) {
            Ok(lab) => {
                out!("  {:<20} {}", lab.name, lab.claim);
                for (v, claim) in project.variants(&name)? {
                    out!("    --variant {v:<18} counterexample: {claim}");
                }
            }
            Err(e) => out!("  {name:<20} INVALID: {e:#}"),
        }
    }
    use crate::vocab::{Counter, InspectField, Target, PATTERNS};
    out!("\nconsumer patterns (their steps; the fault windows follow from them):");
    for p in PATTERNS {
        let safety = if p.safe { "safe" } else { "unsafe" };
        out!("  {:<26} {safety:<7} {}", p.pattern.name(), p.pattern.doc());
        out!("  {:<26} {:<7} {}", "", "", p.path());
    }
    out!("\nfault targets and placements (where each action goes, and its windows):");
    for (t, name, doc) in Target::ALL {
        out!("  {name:<26} {doc}");
        for p in crate::vocab::placements_of(*t) {
            let mut only = String::new();
            if p.built_in_only {
                only.push_str(" (built-in consumer)");
            }
            out!(
                "    {} {}{only}, then {}: {}",
                p.action,
                p.site.describe(),
                p.then,
                p.doc
            );
            match p.windows {
                crate::vocab::Windows::None => {}
                crate::vocab::Windows::These(ws) => {
                    for w in ws {
                        out!("      {:<30} {}", w.name(), w.doc());
                    }
                }
                crate::vocab::Windows::ConsumerPath => {
                    for (w, wname, wdoc) in crate::vocab::Window::ALL {
                        let used: Vec<&str> = PATTERNS
                            .iter()
                            .filter(|p| p.windows().contains(w))
                            .map(|p| p.pattern.name())
                            .collect();
                        if !used.is_empty() {
                            out!("      {wname:<30} {wdoc} [{}]", used.join(", "));
                        }
                    }
                    let program: Vec<&str> = crate::vocab::PROGRAM_WINDOWS
                        .iter()
                        .map(|w| w.name())
                        .collect();
                    out!("      a program (black box): {}", program.join(", "));
                }
            }
        }
    }
    out!("\ncounters:");
    for (c, _, doc) in Counter::ALL {
        out!("  {:<26} {doc}", c.usage());
    }
    out!("\ninspect fields:");
    for (_, name, doc) in InspectField::ALL {
        out!("  {name:<26} {doc}");
    }
    Ok(exit::OK)
}

/// Everything that can be wrong without a server, checked before any boot.
fn plan(project: &Project, args: &LabArgs) -> Result<Vec<Lab>> {
    let names = if args.all || args.group.is_some() {
        let cluster = args.group == Some(Group::Cluster);
        let mut runs = Vec::new();
        for lab in project.lab_names()? {
            if project.is_cluster(&lab)? == cluster {
                runs.extend(project.runs_of(&lab)?);
            }
        }
        runs
    } else {
        match &args.variant {
            Some(v) => args.names.iter().map(|n| format!("{n}@{v}")).collect(),
            None => args.names.clone(),
        }
    };
    if names.is_empty() {
        bail!("no labs found in `{}`", project.labs_dir().display());
    }
    let names = match &args.partition {
        Some(p) => p.share(names, |n| n.clone()),
        None => names,
    };
    let mut labs: Vec<Lab> = names
        .iter()
        .map(|n| project.load(n))
        .collect::<Result<_>>()?;
    cluster_plan(&labs, args)?;
    if let Some(cmd) = &args.consumer_cmd {
        for lab in &mut labs {
            if !lab.set_command(cmd) {
                bail!(
                    "lab `{}` runs no program: --consumer-cmd replaces the `command` of a consume step (see examples/python)",
                    lab.run_name()
                );
            }
        }
    }
    for lab in &labs {
        snapshot::read(&snapshot::path_for(
            &project.snapshots_dir(),
            &lab.run_name(),
        ))?;
    }
    if let Some(dir) = &args.transcript_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create `{}`", dir.display()))?;
    }
    if let Some(dir) = &args.evidence {
        evidence::prepare_dir(dir)?;
    }
    if let Some(file) = &args.junit {
        std::fs::write(file, "")
            .with_context(|| format!("cannot write the JUnit report `{}`", file.display()))?;
    }
    if args.keep && matches!(args.env.env, EnvKind::Containers) {
        bail!("--keep works with the local environment only");
    }
    if args.keep && matches!(args.env.env, EnvKind::External) {
        bail!("--keep and --env external: mqlab does not own those servers, and removes what it created");
    }
    if args.keep && args.env.env_dir.is_some() {
        bail!("--keep and --env-dir: the environment in --env-dir stays running anyway");
    }
    Ok(labs)
}

/// Cluster labs run together on three local nodes, apart from the others;
/// a partition needs iptables and root, said before anything starts.
fn cluster_plan(labs: &[Lab], args: &LabArgs) -> Result<()> {
    let (cluster, single): (Vec<&Lab>, Vec<&Lab>) = labs.iter().partition(|l| l.is_cluster());
    if cluster.is_empty() {
        return Ok(());
    }
    if !single.is_empty() {
        bail!(
            "{} runs on a three-node cluster and {} on one node: run them apart (`mqlab lab --group cluster`)",
            cluster[0].run_name(),
            single[0].run_name()
        );
    }
    match args.env.env {
        EnvKind::External => bail!(
            "the cluster labs kill and cut off nodes: not on --env external (the broker is not mqlab's)"
        ),
        EnvKind::Auto | EnvKind::Local | EnvKind::Containers => {}
    }
    if args.keep || args.env.env_dir.is_some() {
        bail!("--keep and --env-dir: not for the cluster labs (each run starts its own cluster)");
    }
    if let Some(lab) = cluster.iter().find(|l| l.has_partition()) {
        let containers = matches!(args.env.env, EnvKind::Containers);
        crate::env::cluster::can_partition(containers).with_context(|| {
            format!(
                "{} cuts a node off (a partition), which cannot be done here",
                lab.run_name()
            )
        })?;
    }
    Ok(())
}

fn cmd_lab(project: &Project, args: LabArgs) -> Result<i32, Error> {
    let mut labs = plan(project, &args).usage()?;
    let external = args.env.external().usage()?;
    let mut skipped = Vec::new();
    if external.is_some() {
        let (cannot, can): (Vec<Lab>, Vec<Lab>) = labs.into_iter().partition(Lab::has_broker_fault);
        skipped = cannot.iter().map(Lab::run_name).collect::<Vec<_>>();
        if !skipped.is_empty() && !args.skip_unsupported {
            return Err(Error::Usage(anyhow::anyhow!(
                "not runnable on --env external (a broker fault; the broker is not mqlab's): {} (--skip-unsupported runs the others)",
                skipped.join(", ")
            )));
        }
        labs = can;
        if !skipped.is_empty() {
            eprintln!(
                "mqlab: skipped, not runnable on --env external (a broker fault): {}",
                skipped.join(", ")
            );
        }
    }
    if let (Some(p), true) = (&args.partition, labs.is_empty()) {
        eprintln!("mqlab: partition {p} holds none of these runs; nothing to run");
        return Ok(exit::OK);
    }
    let vhosts: Vec<String> = labs
        .iter()
        .map(|l| naming::vhost_for(&l.run_name()))
        .collect();
    let setup = Setup {
        kind: args.env.env,
        keep: args.keep,
        attach: args.env.attach(&vhosts).usage()?,
        images: images(project, &args.env).usage()?,
        external,
        ready_timeout: Duration::from_secs(args.env.ready_timeout),
        amqp_port: args.env.amqp_port,
        pg_port: args.env.pg_port,
        vhosts,
        management: false,
        cluster: labs.iter().any(Lab::is_cluster),
    };
    let terminal = sinks::Terminal::new(project.snapshots_dir());
    let mut session = Session::open(setup, progress(&terminal))?;
    let mut sink = Fanout::default();
    sink.push(terminal);
    sink.push(sinks::Summary);
    if let Some(dir) = &args.transcript_dir {
        sink.push(sinks::TranscriptDir(dir.clone()));
    }
    if let Some(dir) = &args.evidence {
        sink.push(sinks::Evidence {
            dir: dir.clone(),
            info: None,
        });
    }
    if let Some(file) = &args.junit {
        sink.push(sinks::Junit::new(file));
    }
    eprintln!("mqlab: run directory {}", session.run_dir().display());
    let started = Instant::now();
    let mut records: Vec<RunRecord> = Vec::new();
    let (exe, run_dir) = (session.exe().to_path_buf(), session.run_dir().to_path_buf());
    let ended = session.run(&mut sink, &labs, async |env, sink| {
        let mut suite = Suite {
            project,
            env,
            exe: &exe,
            run_dir: &run_dir,
            update: args.update,
            vhost: None,
            checks_only: false,
            jobs: args.jobs,
        };
        suite.run(&labs, &mut records, sink).await
    });
    let ended = match ended {
        Ok(e) => e,
        Err(e) => {
            session.close(false);
            return Err(e);
        }
    };
    // What ended is reported, even when the suite was interrupted.
    sink.tell(&Event::SuiteFinished {
        records: &records,
        wall: started.elapsed(),
    });
    if !skipped.is_empty() {
        eprintln!(
            "mqlab: {} skipped (not runnable on --env external): {}",
            skipped.len(),
            skipped.join(", ")
        );
    }
    session.close(ended.kept);
    ended.into_result()?;
    if !sink.errors.is_empty() {
        for e in &sink.errors {
            eprintln!("error: {e:#}");
        }
        return Ok(exit::SETUP);
    }
    Ok(if sinks::all_passed(&records) {
        exit::OK
    } else {
        exit::LAB_FAILED
    })
}

fn cmd_soak(project: &Project, args: SoakArgs) -> Result<i32, Error> {
    let pattern: crate::vocab::Pattern = args
        .pattern
        .parse()
        .map_err(|e: String| Error::Usage(anyhow::anyhow!("--pattern: {e}")))?;
    if args.messages == 0 || args.consumers == 0 {
        return Err(Error::Usage(anyhow::anyhow!(
            "--messages and --consumers must be at least 1"
        )));
    }
    if !(0.0..=1.0).contains(&args.resend_share) {
        return Err(Error::Usage(anyhow::anyhow!(
            "--resend-share is a share between 0 and 1, not {}",
            args.resend_share
        )));
    }
    let plan = crate::soak::Plan {
        messages: args.messages,
        consumers: args.consumers,
        kills: args.kills,
        resend_share: args.resend_share,
        broker_restarts: args.broker_restarts,
        seed: args.seed,
        pattern,
        baseline: !args.no_baseline,
    };
    if matches!(args.env.env, EnvKind::External) {
        return Err(Error::Usage(anyhow::anyhow!(
            "soak runs on --env local or containers"
        )));
    }
    let setup = Setup {
        kind: args.env.env,
        keep: false,
        attach: args.env.attach(&[SOAK_VHOST.into()]).usage()?,
        images: images(project, &args.env).usage()?,
        external: None,
        ready_timeout: Duration::from_secs(args.env.ready_timeout),
        amqp_port: args.env.amqp_port,
        pg_port: args.env.pg_port,
        vhosts: vec![SOAK_VHOST.into()],
        management: false,
        cluster: false,
    };
    let terminal = sinks::Terminal::new(project.snapshots_dir());
    let say = terminal.progress();
    let mut session = Session::open(setup, progress(&terminal))?;
    let mut sink = sinks::Terminal::quiet(terminal);
    let (exe, logs) = (
        session.exe().to_path_buf(),
        session.run_dir().join("roles/soak"),
    );
    let ended = session.run(&mut sink, &[], async |env, _| {
        let progress = move |what: &str| say.set_message(format!("soak: {what}"));
        let mut soak = crate::soak::Soak {
            env,
            exe,
            logs,
            vhost: SOAK_VHOST.into(),
            database: "soak".into(),
            progress: &progress,
        };
        soak.run(&plan).await
    });
    if ended.is_ok() {
        sink.tell(&Event::SuiteFinished {
            records: &[],
            wall: Duration::ZERO,
        });
    }
    session.close(false);
    let report = ended?
        .into_result()?
        .map_err(|e| Error::Environment(e.context("the soak stopped")));
    let r = report?;
    for line in r.lines(&plan) {
        out(&line);
    }
    Ok(if r.holds() {
        exit::OK
    } else {
        exit::LAB_FAILED
    })
}

/// The vhost every explore point runs in, one after the other.
const EXPLORE_VHOST: &str = "explore";
/// The vhost and database of `mqlab soak`.
const SOAK_VHOST: &str = "soak";

fn cmd_explore(project: &Project, args: ExploreArgs) -> Result<i32, Error> {
    if matches!(args.env.env, EnvKind::External) {
        return Err(Error::Usage(anyhow::anyhow!(
            "explore runs on --env local or containers: its points restart the broker"
        )));
    }
    let run = match &args.variant {
        Some(v) => format!("{}@{v}", args.lab),
        None => args.lab.clone(),
    };
    let mut lab = project.load(&run).usage()?;
    if lab.is_cluster() {
        return Err(Error::Usage(anyhow::anyhow!(
            "`{run}` runs on a three-node cluster: explore runs one-node labs (`mqlab lab --group cluster` runs the cluster labs)"
        )));
    }
    if let Some(cmd) = &args.consumer_cmd {
        if !lab.set_command(cmd) {
            return Err(Error::Usage(anyhow::anyhow!(
                "lab `{run}` runs no program: --consumer-cmd replaces the `command` of a consume step"
            )));
        }
    }
    let all = crate::explore::points(&lab);
    let total = all.len();
    let mut points = match args.points {
        Some(n) => crate::explore::sample(all, n, args.seed),
        None => all,
    };
    if let Some(p) = &args.partition {
        points = p.share(points, |p| format!("{} {}", p.row, p.column));
        if points.is_empty() {
            eprintln!("mqlab: partition {p} of {run}'s points holds none; nothing to run");
            return Ok(exit::OK);
        }
    }
    if let Some(dir) = &args.evidence {
        evidence::prepare_dir(dir).usage()?;
    }
    let setup = Setup {
        kind: args.env.env,
        keep: false,
        attach: args.env.attach(&[EXPLORE_VHOST.into()]).usage()?,
        images: images(project, &args.env).usage()?,
        external: None,
        ready_timeout: Duration::from_secs(args.env.ready_timeout),
        amqp_port: args.env.amqp_port,
        pg_port: args.env.pg_port,
        vhosts: vec![EXPLORE_VHOST.into()],
        management: false,
        cluster: false,
    };
    let terminal = sinks::Terminal::new(project.snapshots_dir());
    let mut session = Session::open(setup, progress(&terminal))?;
    // The points' transcripts are not printed: the matrix is the output.
    let mut sink = sinks::Terminal::quiet(terminal);
    eprintln!(
        "mqlab: exploring {run}: {} of {total} fault points (judged by {})",
        points.len(),
        crate::explore::judged_by()
    );
    let started = Instant::now();
    let mut results = Vec::new();
    let (exe, run_dir) = (session.exe().to_path_buf(), session.run_dir().to_path_buf());
    let ended = session.run(&mut sink, &[], async |env, sink| {
        let mut suite = Suite {
            project,
            env,
            exe: &exe,
            run_dir: &run_dir,
            update: false,
            vhost: Some(EXPLORE_VHOST.into()),
            checks_only: true,
            jobs: 1,
        };
        let total = points.len();
        for (i, p) in points.into_iter().enumerate() {
            let name = format!("{} {}", p.row, p.column);
            sink.tell(&Event::LabStarted {
                run: &name,
                index: i,
                total,
            });
            let record = suite.run_one(&p.lab, sink).await;
            results.push((p, crate::explore::Verdict::of(&record)));
        }
    });
    if ended.is_ok() {
        sink.tell(&Event::SuiteFinished {
            records: &[],
            wall: started.elapsed(),
        });
    }
    session.close(false);
    ended?.into_result()?;
    let tally = crate::explore::Tally::of(&results);
    let summary = tally.summary(started.elapsed().as_secs_f64());
    out(&crate::explore::render_text(&results));
    for line in crate::explore::findings(&results) {
        out(&line);
    }
    out(&summary);
    if let Some(dir) = &args.evidence {
        // Each share its own page: shares upload side by side.
        let file = match &args.partition {
            Some(p) => dir.join(format!("explore-{run}-{}of{}.md", p.k, p.n)),
            None => dir.join(format!("explore-{run}.md")),
        };
        std::fs::write(
            &file,
            crate::explore::render_markdown(&run, &lab.claim, &results, &summary),
        )
        .with_context(|| format!("cannot write `{}`", file.display()))
        .usage()?;
        eprintln!("mqlab: matrix written to {}", file.display());
    }
    lab.violations.clear();
    let counterexample = args.variant.is_some() || run.contains('@');
    let (code, note) = tally.exit_code(counterexample, args.partition.is_some());
    if let Some(note) = note {
        eprintln!("mqlab: {note}");
    }
    Ok(code)
}

/// `mqlab check RUN.json...`: the stored history judged again, offline.
fn cmd_check(files: &[PathBuf]) -> Result<i32, Error> {
    let mut failed = 0;
    for file in files {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read `{}`", file.display()))
            .usage()?;
        let r: evidence::Record = serde_json::from_str(&text)
            .with_context(|| format!("`{}` is not a run's evidence JSON", file.display()))
            .usage()?;
        if r.history.points.is_empty() {
            return Err(Error::Usage(anyhow::anyhow!(
                "`{}` holds no history to re-judge (written by an mqlab older than `mqlab check`?)",
                file.display()
            )));
        }
        let declared = r.variant.as_ref().map(|_| &r.declared_violations);
        // The raw lines when the record has them (a measured value is
        // normalized out of the transcript).
        let lines = if r.history.lines.is_empty() {
            &r.transcript
        } else {
            &r.history.lines
        };
        let (outcomes, verdict) = crate::checker::rejudge(&r.history, lines, declared);
        for o in &outcomes {
            out(&format!(
                "[{}] {}={} {}",
                o.kind.name(),
                o.name,
                o.actual,
                if o.pass { "PASS" } else { "FAIL" }
            ));
        }
        let stored: Vec<(&str, &str, &str)> = r
            .assertions
            .iter()
            .filter(|a| a.kind == "assert" || a.kind == "check")
            .map(|a| (a.name.as_str(), a.actual.as_str(), a.result.as_str()))
            .collect();
        let again: Vec<(&str, &str, &str)> = outcomes
            .iter()
            .map(|o| {
                (
                    o.name.as_str(),
                    o.actual.as_str(),
                    if o.pass { "PASS" } else { "FAIL" },
                )
            })
            .collect();
        let text = match &verdict {
            crate::checker::LabVerdict::Holds => "safe pattern holds".to_string(),
            crate::checker::LabVerdict::CounterexampleConfirmed => {
                "counterexample confirmed".to_string()
            }
            crate::checker::LabVerdict::Failed(why) => format!("FAIL: {why}"),
        };
        let same = if stored == again {
            "as recorded"
        } else {
            "DIFFERS from the recorded outcomes"
        };
        out(&format!(
            "{}: {text} ({} outcomes re-judged, {same})",
            r.run,
            outcomes.len()
        ));
        if matches!(verdict, crate::checker::LabVerdict::Failed(_)) || stored != again {
            failed += 1;
        }
    }
    Ok(if failed == 0 {
        exit::OK
    } else {
        exit::LAB_FAILED
    })
}

use crate::env::local::KEPT_FILE;

/// The image references: flag or variable, else the committed pins; each
/// must be pinned by digest unless floating ones are allowed.
fn images(project: &Project, args: &EnvArgs) -> Result<(String, String)> {
    if matches!(args.env, EnvKind::Local | EnvKind::External) || args.env_dir.is_some() {
        return Ok(Default::default());
    }
    let pins_file = project.labs_dir().join("environment.toml");
    let pins = if args.rabbitmq_image.is_some() && args.postgres_image.is_some() {
        None
    } else {
        Some(Pins::load(&pins_file)?)
    };
    let pick = |flag: &Option<String>, pinned: fn(&Pins) -> &String| {
        flag.clone()
            .unwrap_or_else(|| pins.as_ref().map(pinned).cloned().unwrap_or_default())
    };
    let r = pick(&args.rabbitmq_image, |p| &p.rabbitmq);
    let p = pick(&args.postgres_image, |p| &p.postgres);
    for reference in [&r, &p] {
        check_pinned(reference, args.allow_floating_images)?;
    }
    Ok((r, p))
}

/// `mqlab env up`: a local environment for every lab run (and `explore`,
/// `soak`), kept running; its directory on stdout.
fn cmd_env_up(
    project: &Project,
    ready_timeout: u64,
    amqp_port: Option<u16>,
    pg_port: Option<u16>,
    management: bool,
) -> Result<i32, Error> {
    let mut labs = Vec::new();
    for lab in project.lab_names().usage()? {
        for run in project.runs_of(&lab).usage()? {
            labs.push(project.load(&run).usage()?);
        }
    }
    let mut vhosts: Vec<String> = labs
        .iter()
        .map(|l| naming::vhost_for(&l.run_name()))
        .collect();
    vhosts.extend([EXPLORE_VHOST.to_string(), SOAK_VHOST.to_string()]);
    let setup = Setup {
        kind: EnvKind::Local,
        keep: true,
        attach: None,
        images: Default::default(),
        external: None,
        ready_timeout: Duration::from_secs(ready_timeout),
        amqp_port,
        pg_port,
        vhosts,
        management,
        cluster: false,
    };
    let terminal = sinks::Terminal::new(project.snapshots_dir());
    let mut session = Session::open(setup, progress(&terminal))?;
    let mut sink = sinks::Terminal::quiet(terminal);
    match session.run(&mut sink, &labs, async |_, _| ()) {
        Ok(ended) if ended.kept => {
            // Printed while the run directory still goes with this process:
            // a failed print (stdout closed) still tears everything down.
            println!("{}", session.run_dir().display());
            session.close(true);
            Ok(exit::OK)
        }
        Ok(ended) => {
            session.close(false);
            ended.into_result().map(|()| exit::OK)
        }
        Err(e) => {
            session.close(false);
            Err(e)
        }
    }
}

/// Where the environment's boot steps go: the terminal's progress line.
fn progress(terminal: &sinks::Terminal) -> Progress {
    let bar = terminal.progress();
    Progress::new(move |what| bar.set_message(format!("environment: {what}")))
}

fn cmd_report_merge(dirs: &[PathBuf], out: &Path, junit: Option<&Path>) -> Result<i32, Error> {
    let m = crate::report::merge(dirs, out, junit).usage()?;
    eprintln!(
        "mqlab: merged {} runs from {} directories into {} (index README.md), JUnit {}",
        m.runs,
        dirs.len(),
        out.display(),
        m.junit.display()
    );
    if m.failed.is_empty() {
        return Ok(exit::OK);
    }
    eprintln!("mqlab: {} failed: {}", m.failed.len(), m.failed.join(", "));
    Ok(exit::LAB_FAILED)
}

fn cmd_env_down(dir: &Path) -> Result<i32> {
    if !dir.join(KEPT_FILE).is_file() {
        bail!(
            "`{}` is not an environment kept by `mqlab lab --keep` (no {KEPT_FILE} in it)",
            dir.display()
        );
    }
    crate::env::guard::reap(dir, Duration::from_secs(10));
    let left = crate::env::guard::marked_processes(&dir.to_string_lossy());
    if !left.is_empty() || dir.exists() {
        bail!(
            "could not stop everything in `{}` (processes {left:?})",
            dir.display()
        );
    }
    eprintln!("mqlab: stopped and removed {}", dir.display());
    Ok(exit::OK)
}
