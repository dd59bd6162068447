//! What a command will run, decided and checked before any server starts:
//! the labs (names, groups, variants, a CI share), their snapshots and
//! output paths, the cluster rules, the container images.

use anyhow::{bail, Context, Result};

use super::args::{EnvArgs, Group, LabArgs};
use crate::env::containers::{check_pinned, Pins};
use crate::evidence;
use crate::lab::{Lab, Project};
use crate::session::EnvKind;
use crate::snapshot;

/// Everything that can be wrong without a server, checked before any boot.
pub(super) fn plan(project: &Project, args: &LabArgs) -> Result<Vec<Lab>> {
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

/// The image references: flag or variable, else the committed pins; each
/// must be pinned by digest unless floating ones are allowed.
pub(super) fn images(project: &Project, args: &EnvArgs) -> Result<(String, String)> {
    if matches!(args.kind()?, EnvKind::Local | EnvKind::External) || args.env_dir.is_some() {
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
    // RabbitMQ 4.0 in a container: its image (scripts/build-images.sh builds
    // one from the 4.0 root); the server's version is checked once it runs.
    let four = std::env::var("MQLAB_RABBITMQ_4_IMAGE")
        .ok()
        .filter(|s| !s.is_empty());
    let r = match (args.rabbitmq, four) {
        (Some(crate::env::Generation::V4_0), Some(image)) => image,
        (Some(crate::env::Generation::V4_0), None) if args.rabbitmq_image.is_none() => {
            anyhow::bail!("--rabbitmq 4.0 with --env containers needs a RabbitMQ 4.0 image: --rabbitmq-image REF or MQLAB_RABBITMQ_4_IMAGE (scripts/build-images.sh builds localhost/mqlab-rabbitmq:4.0.5 and prints its digest)")
        }
        _ => pick(&args.rabbitmq_image, |p| &p.rabbitmq),
    };
    let p = pick(&args.postgres_image, |p| &p.postgres);
    for reference in [&r, &p] {
        check_pinned(reference, args.allow_floating_images)?;
    }
    Ok((r, p))
}
