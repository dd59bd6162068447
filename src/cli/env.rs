//! `mqlab env up` and `mqlab env down`: an environment kept running for
//! many runs, and its removal.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Result};

use super::{progress, EXPLORE_VHOST, SOAK_VHOST};
use crate::env::local::KEPT_FILE;
use crate::error::{Error, UsageContext};
use crate::exit;
use crate::lab::Project;
use crate::naming;
use crate::session::{EnvKind, Session, Setup};
use crate::sinks;

/// `mqlab env up`: a local environment for every lab run (and `explore`,
/// `soak`), kept running; its directory on stdout.
pub(super) fn cmd_env_up(
    project: &Project,
    ready_timeout: u64,
    amqp_port: Option<u16>,
    pg_port: Option<u16>,
    management: bool,
    rabbitmq: Option<crate::env::Generation>,
) -> Result<i32, Error> {
    let mut labs = Vec::new();
    for lab in project.lab_names().usage()? {
        for run in project.runs_of(&lab).usage()? {
            labs.push(project.load(&run).usage()?);
        }
    }
    // One environment, of one broker: the default one's, for its labs.
    labs.retain(|l| l.broker == crate::vocab::Broker::default());
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
        broker_port: amqp_port,
        pg_port,
        vhosts,
        management,
        cluster: false,
        generation: rabbitmq,
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

pub(super) fn cmd_env_down(dir: &Path) -> Result<i32> {
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
