//! The PostgreSQL cluster a lab runs on: fast by default (the local
//! environment's, `fsync` and full page writes off), and with PostgreSQL's
//! own durability when a lab asks for it (a power loss tests what is synced).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use mqlab::env::postgres::{bindir, durability_at, own, Durability};

mod common;

#[tokio::test]
async fn a_cluster_runs_with_the_durability_asked_for() {
    for (durability, want) in [
        (Durability::Fast, ("off", "off", "on")),
        (Durability::Durable, ("on", "on", "on")),
        (Durability::FsyncOff, ("off", "on", "on")),
        (Durability::AsyncCommit, ("on", "on", "off")),
    ] {
        let dir = tempfile::tempdir().unwrap();
        // Traversable by the user PostgreSQL runs as.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let server = own(durability, &dir.path().join("pg"), false)
            .await
            .unwrap();
        let seen = durability_at(&server.url()).await.unwrap();
        server.stop().await.unwrap();
        assert_eq!(
            (seen.0.as_str(), seen.1.as_str(), seen.2.as_str()),
            want,
            "fsync, full_page_writes, synchronous_commit under {durability:?}"
        );
    }
}

/// A scratch project whose `consumer-crash` declares `database = "durable"`.
fn durable_project() -> tempfile::TempDir {
    let project = common::scratch_project();
    let lab = project.path().join("labs/consumer-crash.toml");
    let text = std::fs::read_to_string(&lab).unwrap();
    let durable = text.replacen("\nfacts = ", "\ndatabase = \"durable\"\nfacts = ", 1);
    assert_ne!(durable, text);
    std::fs::write(&lab, durable).unwrap();
    project
}

/// Runs `consumer-crash` of `project` (with `env` set), evidence to
/// `evidence`: the exit code and stderr.
fn run_durable(project: &Path, evidence: &Path, env: &[(&str, &Path)]) -> (i32, String) {
    let mut cmd = common::mqlab(&[
        "lab",
        "consumer-crash",
        "--root",
        project.to_str().unwrap(),
        "--evidence",
        evidence.to_str().unwrap(),
    ]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let (code, _, stderr) = common::run(&mut cmd);
    (code, stderr)
}

/// Without PostgreSQL's binaries a durable lab is refused before anything
/// starts: one line, exit 2, no run directory.
#[test]
fn a_durable_lab_without_postgresql_binaries_is_refused_first() {
    let project = durable_project();
    let evidence = tempfile::tempdir().unwrap();
    let (code, stderr) = run_durable(
        project.path(),
        evidence.path(),
        &[("MQLAB_PG_BIN", Path::new("/nonexistent"))],
    );
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: a lab with a `database` of its own (`durable`, `fsync-off`, `async-commit`) runs a PostgreSQL of its own: PostgreSQL binaries missing in `/nonexistent`"),
        "{stderr}"
    );
}

/// A lab file's `database = "durable"`: the run gets a PostgreSQL of its
/// own, whose durability the evidence shows as read from the server, and
/// the same transcript as on the shared one (its snapshot matches).
#[test]
fn a_durable_lab_runs_on_a_database_of_its_own() {
    let project = durable_project();
    let evidence = tempfile::tempdir().unwrap();
    let (code, stderr) = run_durable(project.path(), evidence.path(), &[]);
    assert_eq!(code, 0, "{stderr}");
    let json = std::fs::read_to_string(evidence.path().join("consumer-crash.json")).unwrap();
    let record: serde_json::Value = serde_json::from_str(&json).unwrap();
    let source = record["database"]["source"].as_str().unwrap();
    assert!(
        source.contains("the run's own cluster")
            && source.contains("`durable`: fsync=on, full_page_writes=on, synchronous_commit=on (read from the server)"),
        "{source}"
    );
    assert!(
        record["database"]["version"]
            .as_str()
            .unwrap()
            .starts_with("PostgreSQL "),
        "{json}"
    );
}

/// A run's own cluster without the durability asked for fails the run,
/// saying what it read from the server: here PostgreSQL's binaries with a
/// `postgres` that turns `fsync` off (`MQLAB_PG_BIN`).
#[test]
fn a_durable_lab_on_a_server_without_fsync_fails() {
    let project = durable_project();
    let bin = tempfile::tempdir().unwrap();
    std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let real = bindir().unwrap();
    for e in std::fs::read_dir(&real).unwrap() {
        let e = e.unwrap();
        if e.file_name() != "postgres" {
            std::os::unix::fs::symlink(e.path(), bin.path().join(e.file_name())).unwrap();
        }
    }
    let postgres = bin.path().join("postgres");
    std::fs::write(
        &postgres,
        format!(
            "#!/bin/sh\nexec '{}' \"$@\" -c fsync=off\n",
            real.join("postgres").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&postgres, std::fs::Permissions::from_mode(0o755)).unwrap();
    let evidence = tempfile::tempdir().unwrap();
    let (code, stderr) = run_durable(
        project.path(),
        evidence.path(),
        &[("MQLAB_PG_BIN", bin.path())],
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr
            .contains("the run's own PostgreSQL has fsync=off, full_page_writes=on, synchronous_commit=on: not `durable`"),
        "{stderr}"
    );
    let json = std::fs::read_to_string(evidence.path().join("consumer-crash.json")).unwrap();
    let record: serde_json::Value = serde_json::from_str(&json).unwrap();
    let source = record["database"]["source"].as_str().unwrap();
    assert!(
        source.starts_with("the run's own cluster on 127.0.0.1:"),
        "{source}"
    );
}

/// A power loss's report reaches the evidence, never the transcript: the
/// page's section and the JSON's `powerLossDropped`, which names the WAL
/// segment the lost commit was written to.
#[test]
fn a_power_loss_is_in_the_evidence() {
    let evidence = tempfile::tempdir().unwrap();
    let mut cmd = common::mqlab(&[
        "lab",
        "commit-durability@fsync-off",
        "--evidence",
        evidence.path().to_str().unwrap(),
    ]);
    let (code, _, stderr) = common::run(&mut cmd);
    assert_eq!(code, 0, "{stderr}");
    let run = evidence.path().join("commit-durability@fsync-off");
    let json = std::fs::read_to_string(run.with_extension("json")).unwrap();
    let record: serde_json::Value = serde_json::from_str(&json).unwrap();
    let dropped = record["powerLossDropped"].as_array().expect(&json);
    assert!(
        dropped
            .iter()
            .any(|d| d.as_str().unwrap().starts_with("pg_wal/")),
        "{dropped:?}"
    );
    let page = std::fs::read_to_string(run.with_extension("md")).unwrap();
    assert!(page.contains("## What the power loss dropped"), "{page}");
}
