//! The command line: a thin front end. Parses, validates everything that can
//! be checked without servers (labs, fixtures, snapshots), then hands over to
//! the environment and the runner.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};

use crate::checker::LabVerdict;
use crate::env::containers::{check_pinned, ContainersEnv, Pins};
use crate::env::guard::RunDir;
use crate::env::local::LocalEnv;
use crate::env::EnvOptions;
use crate::env::Environment;
use crate::evidence;
use crate::exit;
use crate::lab::{Lab, Project};
use crate::runner::{self, LabRun, Sink};
use crate::snapshot;

/// Prints to stdout, ignoring a closed pipe (`mqlab lab ... | head`): the run
/// goes on and tears down as usual.
macro_rules! out {
    () => {{
        use std::io::Write;
        let _ = writeln!(std::io::stdout());
    }};
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
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
    /// List the labs with their claims, and the engine's vocabulary
    List,
    /// Manage an environment left running by `mqlab lab --keep`
    #[command(subcommand)]
    Env(EnvCmd),
    /// Internal: cleans up after a run when the harness goes away
    #[command(hide = true)]
    Guard {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Internal: a producer or consumer process started by the runner
    #[command(hide = true)]
    Role {
        #[arg(value_enum)]
        role: RoleKind,
        #[arg(long)]
        config: String,
    },
}

#[derive(Subcommand)]
enum EnvCmd {
    /// Stop a kept environment and remove its directory
    Down {
        /// The run directory `mqlab lab --keep` printed
        dir: PathBuf,
    },
}

#[derive(clap::Args)]
struct LabArgs {
    /// Labs to run (see `mqlab list`); `LAB@VARIANT` runs a counterexample
    #[arg(value_name = "LAB", required_unless_present = "all")]
    names: Vec<String>,
    /// Run every lab under labs/, each followed by its counterexample variants
    #[arg(long, conflicts_with = "names")]
    all: bool,
    /// Run this counterexample variant of the named labs instead of the safe lab
    #[arg(long, value_name = "NAME", conflicts_with = "all")]
    variant: Option<String>,
    /// Where the broker and database come from
    #[arg(long, value_enum, default_value_t = EnvKind::Auto, env = "MQLAB_ENV")]
    env: EnvKind,
    /// Rewrite the stored snapshots with this run's transcripts
    #[arg(long)]
    update: bool,
    /// Seconds to wait for the broker and the database to become ready
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    ready_timeout: u64,
    /// Also write each normalized transcript to DIR/<lab>.log
    #[arg(long, value_name = "DIR")]
    transcript_dir: Option<PathBuf>,
    /// Run the lab broker's AMQP listener on this 127.0.0.1 port [default: a free one]
    #[arg(long, value_name = "PORT")]
    amqp_port: Option<u16>,
    /// Run the lab PostgreSQL on this 127.0.0.1 port [default: a free one]
    #[arg(long, value_name = "PORT")]
    pg_port: Option<u16>,
    /// Write DIR/<lab>.md (claim, versions, assertions, sequence diagram, log) and DIR/<lab>.json per run
    #[arg(long, value_name = "DIR")]
    evidence: Option<PathBuf>,
    /// Write a JUnit XML report: one testsuite per lab run, one testcase per assertion
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// RabbitMQ image for --env containers [default: labs/environment.toml]
    #[arg(long, env = "MQLAB_RABBITMQ_IMAGE", value_name = "REF")]
    rabbitmq_image: Option<String>,
    /// PostgreSQL image for --env containers [default: labs/environment.toml]
    #[arg(long, env = "MQLAB_POSTGRES_IMAGE", value_name = "REF")]
    postgres_image: Option<String>,
    /// Accept image references that are not pinned by digest
    #[arg(long)]
    allow_floating_images: bool,
    /// Leave RabbitMQ and PostgreSQL running afterwards (with the labs' vhosts and
    /// databases), print how to reach them and the command that stops them
    #[arg(long)]
    keep: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum EnvKind {
    /// Containers when a Docker-compatible engine answers and the pinned images are present, else local
    Auto,
    /// RabbitMQ and PostgreSQL as child processes of mqlab, from the installed packages
    Local,
    /// RabbitMQ and PostgreSQL from the images pinned in labs/environment.toml, through testcontainers
    Containers,
}

#[derive(Clone, Copy, ValueEnum)]
enum RoleKind {
    Producer,
    Consumer,
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
        Cmd::List => cmd_list(&project),
        Cmd::Env(EnvCmd::Down { dir }) => cmd_env_down(&dir),
        Cmd::Role { role, config } => return run_role(role, &config),
        Cmd::Guard { dir } => return crate::env::guard::guard_main(&dir),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            exit::SETUP
        }
    }
}

fn default_root() -> PathBuf {
    let cwd = std::env::current_dir().unwrap_or_default();
    if cwd.join("labs").is_dir() {
        cwd
    } else {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    // One thread: children are spawned from it, and PR_SET_PDEATHSIG follows
    // the spawning thread.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn run_role(role: RoleKind, config: &str) -> i32 {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let result = runtime().and_then(|rt| {
        rt.block_on(async {
            match role {
                RoleKind::Producer => {
                    crate::roles::producer::run(serde_json::from_str(config)?).await
                }
                RoleKind::Consumer => {
                    crate::roles::consumer::run(serde_json::from_str(config)?).await
                }
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
                out!("  {:<16} {}", lab.name, lab.claim);
                for (v, claim) in project.variants(&name)? {
                    out!("    --variant {v:<18} counterexample: {claim}");
                }
            }
            Err(e) => out!("  {name:<16} INVALID: {e:#}"),
        }
    }
    out!("\nconsumer patterns:");
    for p in crate::roles::consumer::PATTERNS {
        let safety = if p.safe { "safe" } else { "unsafe" };
        out!("  {:<26} {safety:<7} {}", p.name, p.doc);
    }
    out!("\nfault windows (consumer):");
    for (_, name, doc) in crate::roles::consumer::WINDOWS {
        out!("  {name:<26} {doc}");
    }
    out!("\ncounters:");
    for c in crate::checker::COUNTERS {
        let arg = match c.arg {
            crate::checker::Arg::None => "",
            crate::checker::Arg::OptionalQueue => "[:queue]",
            crate::checker::Arg::Queue => ":queue",
            crate::checker::Arg::MessageId => ":message",
        };
        out!("  {:<26} {}", format!("{}{arg}", c.name), c.doc);
    }
    Ok(exit::OK)
}

/// Terminal output: transcript lines on stdout as they happen; phases on
/// stderr, only when a person is watching.
struct Terminal {
    progress: bool,
}

impl Sink for Terminal {
    fn phase(&mut self, lab: &str, phase: &str) {
        if self.progress {
            eprintln!("mqlab: {lab}: {phase}");
        }
    }
    fn line(&mut self, line: &str) {
        out!("{line}");
    }
}

fn cmd_lab(project: &Project, args: LabArgs) -> Result<i32> {
    let names = if args.all {
        let mut runs = Vec::new();
        for lab in project.lab_names()? {
            runs.extend(project.runs_of(&lab)?);
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
    // Everything that can be wrong without a server fails here, before any boot.
    let labs: Vec<Lab> = names
        .iter()
        .map(|n| project.load(n))
        .collect::<Result<_>>()?;
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
    let images = images(project, &args)?;
    if args.keep && matches!(args.env, EnvKind::Containers) {
        bail!("--keep works with the local environment only");
    }
    let exe = std::env::current_exe().context("cannot find the mqlab executable")?;
    let run_dir = RunDir::create(&exe)?;
    eprintln!("mqlab: run directory {}", run_dir.path().display());
    let opts = EnvOptions {
        dir: run_dir.path().to_path_buf(),
        ready_timeout: Duration::from_secs(args.ready_timeout),
        keep: args.keep,
        amqp_port: args.amqp_port,
        pg_port: args.pg_port,
        vhosts: labs
            .iter()
            .map(|l| runner::vhost_for(&l.run_name()))
            .collect(),
    };
    let mut sink = Terminal {
        progress: std::io::stderr().is_terminal(),
    };
    let started = Instant::now();
    let rt = runtime()?;
    let outcome = rt.block_on(async {
        let containers = choose(args.env, args.keep, &images).await?;
        let start = async {
            Ok::<_, anyhow::Error>(match containers {
                true => Environment::Containers(Box::new(ContainersEnv::start(&opts, &images.0, &images.1).await?)),
                false => Environment::Local(Box::new(LocalEnv::start(&opts).await?)),
            })
        };
        let env = tokio::select! {
            env = start => env?,
            sig = interrupted() => return Ok((Err(sig), false)),
        };
        eprintln!(
            "mqlab: environment ready in {:.1} s: {}, {}",
            env.info().ready.as_secs_f64(),
            env.info().broker_version,
            env.info().db_version
        );
        let outcome = tokio::select! {
            runs = run_all(&labs, &env, &exe, run_dir.path(), &mut sink) => runs.map(|r| Ok((r, env.info().clone()))),
            sig = interrupted() => Ok(Err(sig)),
        };
        let kept = args.keep && matches!(outcome, Ok(Ok(_)));
        if kept {
            keep_running(env, run_dir.path(), &labs)?;
        } else {
            env.stop().await;
        }
        outcome.map(|o| (o, kept))
    });
    drop(rt);
    let outcome = match outcome {
        Ok((o, true)) => {
            run_dir.keep();
            Ok(o)
        }
        Ok((o, false)) => {
            run_dir.close();
            Ok(o)
        }
        Err(e) => {
            run_dir.close();
            Err(e)
        }
    };
    match outcome? {
        Ok((runs, info)) => report(project, &labs, &runs, &info, &args, started),
        Err(sig) => {
            eprintln!("mqlab: {sig}; environment stopped");
            Ok(exit::INTERRUPTED)
        }
    }
}

/// Where a kept environment is described; `env down` refuses directories without it.
const KEPT_FILE: &str = "kept.json";

/// The image references: flag or variable, else the committed pins; each
/// must be pinned by digest unless floating ones are allowed.
fn images(project: &Project, args: &LabArgs) -> Result<(String, String)> {
    if matches!(args.env, EnvKind::Local) {
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

/// Which environment runs, said in one line with the reason.
async fn choose(kind: EnvKind, keep: bool, images: &(String, String)) -> Result<bool> {
    let host = std::env::var("DOCKER_HOST").unwrap_or_else(|_| "the default socket".into());
    let containers = match kind {
        EnvKind::Local => false,
        EnvKind::Containers => {
            crate::env::containers::engine().await?;
            true
        }
        EnvKind::Auto if keep => {
            eprintln!("mqlab: environment: local (--keep keeps local servers only)");
            return Ok(false);
        }
        EnvKind::Auto => {
            match crate::env::containers::engine().await {
                Err(e) => {
                    eprintln!("mqlab: environment: local ({e:#})");
                    return Ok(false);
                }
                Ok(docker) => {
                    for reference in [&images.0, &images.1] {
                        if let Err(e) = crate::env::containers::image_id(&docker, reference).await {
                            eprintln!("mqlab: environment: local (an engine answers at {host}, but {e:#})");
                            return Ok(false);
                        }
                    }
                    eprintln!("mqlab: environment: containers (an engine answers at {host} and both pinned images are present)");
                    return Ok(true);
                }
            }
        }
    };
    eprintln!(
        "mqlab: environment: {}",
        if containers {
            "containers (--env containers)"
        } else {
            "local (--env local)"
        }
    );
    Ok(containers)
}

fn keep_running(env: Environment, dir: &std::path::Path, labs: &[Lab]) -> Result<()> {
    let Environment::Local(env) = env else {
        bail!("--keep works with the local environment only");
    };
    let e = &env.endpoints;
    let runs: Vec<_> = labs
        .iter()
        .map(|l| {
            serde_json::json!({
                "lab": l.run_name(),
                "amqp": e.amqp_url(&runner::vhost_for(&l.run_name())),
                "postgres": e.pg_url(&runner::database_for(&l.run_name())),
            })
        })
        .collect();
    let info = serde_json::json!({
        "dir": dir,
        "broker": env.info.broker_version,
        "database": env.info.db_version,
        "runs": runs,
    });
    std::fs::write(dir.join(KEPT_FILE), serde_json::to_string_pretty(&info)?)?;
    eprintln!(
        "mqlab: environment kept running ({}, {})",
        env.info.broker_version, env.info.db_version
    );
    for r in &runs {
        eprintln!(
            "  {:<36} {}",
            r["lab"].as_str().unwrap_or(""),
            r["amqp"].as_str().unwrap_or("")
        );
        eprintln!("  {:<36} {}", "", r["postgres"].as_str().unwrap_or(""));
    }
    eprintln!("  stop it with: mqlab env down {}", dir.display());
    env.detach();
    Ok(())
}

fn cmd_env_down(dir: &std::path::Path) -> Result<i32> {
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

async fn run_all(
    labs: &[Lab],
    env: &Environment,
    exe: &std::path::Path,
    run_dir: &std::path::Path,
    sink: &mut dyn Sink,
) -> Result<Vec<LabRun>> {
    let mut runs = Vec::new();
    for lab in labs {
        runs.push(runner::run_lab(lab, env.endpoints(), exe, run_dir, sink).await?);
    }
    Ok(runs)
}

async fn interrupted() -> String {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => "terminated (SIGTERM)".into(),
        _ = int.recv() => "interrupted (SIGINT)".into(),
    }
}

fn report(
    project: &Project,
    labs: &[Lab],
    runs: &[LabRun],
    info: &crate::env::EnvInfo,
    args: &LabArgs,
    started: Instant,
) -> Result<i32> {
    let mut failed = 0;
    let mut rows = Vec::new();
    let mut records = Vec::new();
    for (lab, run) in labs.iter().zip(runs) {
        let name = lab.run_name();
        let normalized = run.transcript.normalized();
        if let Some(dir) = &args.transcript_dir {
            std::fs::write(dir.join(format!("{name}.log")), &normalized)?;
        }
        let lab_file = format!("labs/{}.toml", lab.name);
        let path = snapshot::path_for(&project.snapshots_dir(), &name);
        let mut verdict = match &run.verdict {
            LabVerdict::Holds => "safe pattern holds".to_string(),
            LabVerdict::CounterexampleConfirmed => "counterexample confirmed".to_string(),
            LabVerdict::Failed(why) => {
                eprintln!("mqlab: {name}: {why}");
                "FAIL".to_string()
            }
        };
        // A failed run is still compared: its diff shows where it went wrong.
        let compared =
            snapshot::compare(&path, &lab_file, &normalized, args.update && run.passed())?;
        let snap = match &compared {
            snapshot::Outcome::Matched => evidence::SnapshotResult::Matched,
            snapshot::Outcome::Updated => evidence::SnapshotResult::Updated,
            snapshot::Outcome::Mismatch(diff) => evidence::SnapshotResult::Mismatch(diff),
        };
        let passed = run.passed() && !matches!(compared, snapshot::Outcome::Mismatch(_));
        records.push(evidence::record(lab, run, info, snap, passed));
        match compared {
            snapshot::Outcome::Matched => {}
            snapshot::Outcome::Updated => {
                eprintln!("mqlab: {name}: snapshot updated: {}", path.display())
            }
            snapshot::Outcome::Mismatch(diff) => {
                verdict = "FAIL (snapshot)".to_string();
                out!("{diff}");
                eprintln!(
                    "mqlab: {name}: transcript differs from {} (actual run written to {}.new; accept with --update or `cargo insta review`)",
                    path.display(),
                    path.display()
                );
            }
        }
        if verdict.starts_with("FAIL") {
            failed += 1;
        }
        rows.push((name, lab.variant.is_some(), verdict, run.duration));
    }
    if let Some(dir) = &args.evidence {
        for r in &records {
            evidence::write(dir, r)?;
        }
        evidence::write_index(dir)?;
        eprintln!("mqlab: evidence written to {}", dir.display());
    }
    if let Some(file) = &args.junit {
        std::fs::write(file, evidence::junit(&records))
            .with_context(|| format!("cannot write `{}`", file.display()))?;
        eprintln!("mqlab: JUnit report written to {}", file.display());
    }
    out!();
    out!("{:<36} {:<26} {:>8}", "lab", "verdict", "seconds");
    // Safe labs first, then counterexamples: two different kinds of evidence.
    for variants in [false, true] {
        for (name, _, verdict, d) in rows.iter().filter(|r| r.1 == variants) {
            out!("{name:<36} {verdict:<26} {:>8.2}", d.as_secs_f64());
        }
    }
    let holds = rows.iter().filter(|r| r.2 == "safe pattern holds").count();
    let confirmed = rows
        .iter()
        .filter(|r| r.2 == "counterexample confirmed")
        .count();
    out!(
        "{} passed, {failed} failed ({holds} safe pattern holds, {confirmed} counterexample confirmed; {:.1} s wall)",
        rows.len() - failed,
        started.elapsed().as_secs_f64()
    );
    Ok(if failed == 0 {
        exit::OK
    } else {
        exit::LAB_FAILED
    })
}
