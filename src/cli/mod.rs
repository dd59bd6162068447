//! The command line: a thin front end. Parses, validates everything that can
//! be checked without servers (labs, fixtures, snapshots, output paths),
//! then hands over to the environment and the runner, whose events the
//! sinks turn into output.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;

use crate::env::Progress;
use crate::error::{Error, UsageContext};
use crate::events::{Event, Fanout, Sink};
use crate::exit;
use crate::lab::{Lab, Project};
use crate::naming;
use crate::record::RunRecord;
use crate::runner::Suite;
use crate::session::{EnvKind, Session, Setup};
use crate::sinks::{self, out};
use crate::vocab::Capability;

/// Prints a line to stdout, ignoring a closed pipe.
macro_rules! out {
    () => {
        out("")
    };
    ($($arg:tt)*) => {
        out(&format!($($arg)*))
    };
}

mod args;
mod env;
mod explore;
mod list;
mod offline;
mod plan;

use args::{Cli, Cmd, EnvCmd, LabArgs, ReportCmd, SoakArgs};
use env::{cmd_env_down, cmd_env_up};
use explore::cmd_explore;
use list::cmd_list;
use offline::{cmd_check, cmd_report_merge};
use plan::{images, plan};

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
    panic_hook();
    let result = match cli.cmd {
        // The commands that start servers: a panic unwinds through the
        // session (which stops them) and ends here: one line, exit 101.
        Cmd::Lab(args) => match guarded(|| cmd_lab(&project, args)) {
            Some(r) => r,
            None => return exit::INTERNAL,
        },
        Cmd::Explore(args) => match guarded(|| cmd_explore(&project, args)) {
            Some(r) => r,
            None => return exit::INTERNAL,
        },
        Cmd::Soak(args) => match guarded(|| cmd_soak(&project, args)) {
            Some(r) => r,
            None => return exit::INTERNAL,
        },
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
            rabbitmq,
        }) => cmd_env_up(
            &project,
            ready_timeout,
            amqp_port,
            pg_port,
            management,
            rabbitmq,
        ),
        Cmd::Role {
            config,
            config_file,
        } => return role_main(config, config_file),
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

/// A bug in the harness is one line and a clean teardown (the unwinding
/// drops the environment), not a trace.
fn panic_hook() {
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
}

/// Runs a command; None if it panicked (the hook has said so).
fn guarded(f: impl FnOnce() -> Result<i32, Error>) -> Option<Result<i32, Error>> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok()
}

fn default_root() -> PathBuf {
    let cwd = std::env::current_dir().unwrap_or_default();
    if cwd.join("labs").is_dir() {
        cwd
    } else {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }
}

/// `mqlab role`: the config inline or in a file (the runner writes a
/// private file beside the role's log).
fn role_main(config: Option<String>, file: Option<PathBuf>) -> i32 {
    let config = match (config, file) {
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
    run_role(&config)
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

/// What an environment offers a lab beyond publishing and consuming:
/// everything on servers mqlab started, nothing on `--env external`.
fn offered(external: bool) -> Vec<Capability> {
    match external {
        true => Vec::new(),
        false => Capability::ALL.iter().map(|(c, _, _)| *c).collect(),
    }
}

/// Why `l` cannot run where `offered` is what the environment offers: the
/// first of its needs that the environment or its broker lacks, in words.
fn unmet(l: &Lab, offered: &[Capability]) -> Option<String> {
    let lacks = |c: &Capability| {
        !offered.contains(c) || (c.of_broker() && !crate::broker::offers(l.broker).contains(c))
    };
    let need = l.needs().into_iter().find(lacks)?;
    Some(match (need, l.settings.first()) {
        (Capability::Setting, Some(s)) => format!(
            "it relies on the broker setting `{s}` = {}, which mqlab cannot read from a broker it did not start: {}",
            s.required(),
            s.doc()
        ),
        (need, _) => need.doc().to_string(),
    })
}

/// A lab with a database of its own starts it from the machine's
/// PostgreSQL binaries, whichever environment hosts the rest, and a lab
/// with a database fault runs it on the lazy file system (root and
/// `/dev/fuse`): checked before anything starts.
fn own_databases_possible(labs: &[Lab]) -> Result<(), Error> {
    if labs
        .iter()
        .any(|l| l.needs().contains(&Capability::OwnDatabase))
    {
        crate::env::postgres::bindir()
            .and_then(|_| crate::env::postgres::owner())
            .context("a lab with a `database` of its own (`durable`, `fsync-off`, `async-commit`) runs a PostgreSQL of its own")
            .usage()?;
    }
    if let Some(l) = labs.iter().find(|l| l.has_database_fault()) {
        let why = if !nix::unistd::geteuid().is_root() {
            Some("mqlab is not root")
        } else if !std::path::Path::new("/dev/fuse").exists() {
            Some("there is no /dev/fuse (hint: `modprobe fuse`; a container needs `--device /dev/fuse`)")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(anyhow::anyhow!(
                "{}: a database fault runs the lab's PostgreSQL on the lazy file system (FUSE, mounted as root), and {why}",
                l.run_name()
            ))
            .usage();
        }
    }
    Ok(())
}

/// The runs whose needs the environment (`external`: `--env external`) and
/// their broker offer, checked before anything starts: the others refused,
/// or with `--skip-unsupported` left out and named.
fn runnable(labs: Vec<Lab>, external: bool, skip: bool) -> Result<(Vec<Lab>, Vec<String>), Error> {
    let offered = offered(external);
    let (cannot, can): (Vec<Lab>, Vec<Lab>) =
        labs.into_iter().partition(|l| unmet(l, &offered).is_some());
    if cannot.is_empty() {
        return Ok((can, Vec::new()));
    }
    let (on, because) = match external {
        true => ("--env external", " (the servers are not mqlab's)"),
        false => ("this environment", ""),
    };
    let skipped = cannot
        .iter()
        .map(|l| {
            format!(
                "{} ({})",
                l.run_name(),
                unmet(l, &offered).unwrap_or_default()
            )
        })
        .collect::<Vec<_>>();
    if !skip {
        return Err(Error::Usage(anyhow::anyhow!(
            "not runnable on {on}{because}: {} (--skip-unsupported runs the others)",
            skipped.join(", ")
        )));
    }
    if can.is_empty() {
        // Nothing left would prove anything: not a pass.
        return Err(Error::Usage(anyhow::anyhow!(
            "none of these runs is runnable on {on}: {}",
            skipped.join(", ")
        )));
    }
    eprintln!(
        "mqlab: skipped, not runnable on {on}: {}",
        skipped.join(", ")
    );
    Ok((can, cannot.iter().map(Lab::run_name).collect()))
}

/// Runs on several brokers need an environment each, which mqlab starts:
/// not a kept one (`--env-dir`), not the user's (`--env external`), and
/// none left running (`--keep`).
fn one_environment_possible(groups: &[Vec<Lab>], setup: &Setup) -> Result<(), Error> {
    // A kept environment is the default broker's (`env up`, `--keep`).
    let kept = setup.keep || setup.attach.is_some();
    if let Some(g) = groups
        .iter()
        .find(|g| kept && g[0].broker != Default::default())
    {
        return Err(Error::Usage(anyhow::anyhow!(
            "--keep and --env-dir keep a {} environment: {} runs on {}",
            crate::vocab::Broker::default().product(),
            g[0].run_name(),
            g[0].broker.product()
        )));
    }
    let [first, second, ..] = groups else {
        return Ok(());
    };
    let given = [
        (setup.keep, "--keep"),
        (setup.attach.is_some(), "--env-dir"),
        (setup.external.is_some(), "--env external"),
    ];
    match given.iter().find(|(on, _)| *on) {
        Some((_, flag)) => Err(Error::Usage(anyhow::anyhow!(
            "{flag} is one environment, of one broker: these runs are on {} ({}) and {} ({}); run each broker's apart",
            first[0].broker,
            first[0].run_name(),
            second[0].broker,
            second[0].run_name()
        ))),
        None => Ok(()),
    }
}

/// Where `mqlab lab`'s events go: the terminal and the summary table, and
/// the outputs its flags ask for.
fn lab_sinks(terminal: sinks::Terminal, args: &LabArgs) -> Fanout {
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
    sink
}

/// Long because it is the command's one sequence: plan, refusals, the
/// session, a run per broker, the report; each part a few lines.
fn cmd_lab(project: &Project, args: LabArgs) -> Result<i32, Error> {
    let labs = plan(project, &args).usage()?;
    let external = args.env.external().usage()?;
    let (labs, skipped) = runnable(labs, external.is_some(), args.skip_unsupported)?;
    own_databases_possible(&labs)?;
    if let (Some(p), true) = (&args.partition, labs.is_empty()) {
        eprintln!("mqlab: partition {p} holds none of these runs; nothing to run");
        return Ok(exit::OK);
    }
    let vhosts: Vec<String> = labs
        .iter()
        .map(|l| naming::vhost_for(&l.run_name()))
        .collect();
    let setup = Setup {
        keep: args.keep,
        external,
        cluster: labs.iter().any(Lab::is_cluster),
        ..setup(project, &args.env, vhosts)?
    };
    let groups = crate::session::by_broker(labs);
    one_environment_possible(&groups, &setup)?;
    let terminal = sinks::Terminal::new(project.snapshots_dir());
    let mut session = Session::open(setup, progress(&terminal))?;
    let mut sink = lab_sinks(terminal, &args);
    eprintln!("mqlab: run directory {}", session.run_dir().display());
    let started = Instant::now();
    let mut records: Vec<RunRecord> = Vec::new();
    let (exe, run_dir) = (session.exe().to_path_buf(), session.run_dir().to_path_buf());
    let mut ended = crate::session::Ended {
        value: Some(()),
        interrupted: None,
        kept: false,
    };
    // One environment per broker, one after the other.
    for group in &groups {
        let run = session.run(&mut sink, group, async |env, sink| {
            let mut suite = Suite {
                project,
                env,
                exe: &exe,
                run_dir: &run_dir,
                update: args.update,
                vhost: None,
                checks_only: false,
                jobs: args.jobs,
                settings: Default::default(),
            };
            suite.run(group, &mut records, sink).await
        });
        ended = match run {
            Ok(e) => e,
            Err(e) => {
                session.close(false);
                return Err(e);
            }
        };
        if ended.interrupted.is_some() {
            break;
        }
    }
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
    if pattern.def().calls_downstream() {
        return Err(Error::Usage(anyhow::anyhow!(
            "--pattern: `{pattern}` calls a downstream service, which only a lab runs (`downstream` on its consume step)"
        )));
    }
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
    let setup = setup(project, &args.env, vec![SOAK_VHOST.into()])?;
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

/// The session's setup from the environment flags, for runs in `vhosts`:
/// not kept, no external servers, one node (the callers say otherwise).
fn setup(project: &Project, env: &args::EnvArgs, vhosts: Vec<String>) -> Result<Setup, Error> {
    let attach = env.attach(&vhosts).usage()?;
    // A kept environment's generation is its own: asking for 4.0 on a 3.10
    // one would build the wrong matrix.
    if let Some((g, k)) = env
        .rabbitmq
        .zip(attach.as_ref())
        .filter(|(g, k)| crate::vocab::Generation::of_version(&k.broker) != Some(*g))
    {
        return Err(Error::Usage(anyhow::anyhow!(
            "--rabbitmq {g}, but the environment in --env-dir runs {}",
            k.broker
        )));
    }
    Ok(Setup {
        kind: env.kind().usage()?,
        keep: false,
        attach,
        images: images(project, env).usage()?,
        external: None,
        ready_timeout: Duration::from_secs(env.ready_timeout),
        broker_port: env.amqp_port,
        pg_port: env.pg_port,
        vhosts,
        management: false,
        cluster: false,
        generation: env.rabbitmq,
    })
}

/// Where the environment's boot steps go: the terminal's progress line.
fn progress(terminal: &sinks::Terminal) -> Progress {
    let bar = terminal.progress();
    Progress::new(move |what| bar.set_message(format!("environment: {what}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lab(run: &str) -> Lab {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        Project { root }.load(run).unwrap()
    }

    /// A lab's needs, checked against what the environment offers: on
    /// servers mqlab started every need is met; on `--env external` the
    /// first unmet one is named.
    #[test]
    fn a_lab_runs_where_its_needs_are_offered() {
        let rows: &[(&str, &[Capability], Option<&str>)] = &[
            ("consumer-crash", &[], None),
            (
                "broker-restart",
                &[Capability::BrokerFault],
                Some("a broker fault"),
            ),
        ];
        for (run, needs, external) in rows {
            let l = lab(run);
            assert_eq!(l.needs(), *needs, "{run}");
            assert_eq!(unmet(&l, &offered(false)), None, "{run} on local");
            assert_eq!(unmet(&l, &offered(true)).as_deref(), *external, "{run}");
        }
        // A database of the run's own: the environment's to give, whatever
        // the broker offers.
        let mut l = lab("consumer-crash");
        l.database = crate::vocab::Durability::Durable;
        assert_eq!(l.needs(), [Capability::OwnDatabase]);
        assert_eq!(unmet(&l, &offered(false)), None);
        assert_eq!(
            unmet(&l, &offered(true)).as_deref(),
            Some(Capability::OwnDatabase.doc())
        );
    }
}
