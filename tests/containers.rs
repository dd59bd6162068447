//! The containers environment, through a real Docker-compatible engine
//! (podman's API socket here) and locally built images pinned by digest.
//! `.ci/run` prepares both and exports MQLAB_RABBITMQ_IMAGE and
//! MQLAB_POSTGRES_IMAGE, then runs the `#[ignore]`d tests; the ones that need
//! no engine always run. The cluster group in containers runs in
//! tests/cluster.rs, at once with the local one.

mod common;
use common::*;

use std::time::{Duration, Instant};

/// `mqlab lab ARGS...` in the containers environment with these images.
fn in_containers(args: &[&str], rabbitmq: &str, postgres: &str) -> Vec<String> {
    let mut v = vec!["lab".to_string()];
    v.extend(args.iter().map(|s| s.to_string()));
    for (flag, value) in [
        ("--env", "containers"),
        ("--rabbitmq-image", rabbitmq),
        ("--postgres-image", postgres),
    ] {
        v.push(flag.into());
        v.push(value.into());
    }
    v
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The heavy runs one at a time: a cluster beside a whole suite on two
/// cores would time them, not test them.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The one-node runs whose labs need something of the environment (a
/// broker fault, a policy, a setting, a queue's figures, a database of
/// their own), in containers: the same transcripts as on local nodes. The
/// other runs reach the broker and the database through the proxy only,
/// as on any environment, and run on local 3.10 and 4.0 nodes in the other
/// suites; each run here starts the containers and connects through them,
/// as theirs would. (All of them, 129 runs, took 301 s of CI's time on
/// 2026-12-07's fourth machine, about 200 s more than these.)
#[test]
#[ignore = "needs a container engine and locally built images (.ci/run prepares them)"]
fn every_lab_that_needs_the_environment_passes_in_containers_with_the_local_transcripts() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (r, p) = require_images();
    let out = tempfile::tempdir().unwrap();
    let runs = one_node_runs(|lab| !lab.needs().is_empty());
    // 15 on 2026-12-07: a narrower `needs` would shrink this suite unseen.
    assert!(
        runs.len() >= 15,
        "only {} runs need the environment",
        runs.len()
    );
    let mut which: Vec<&str> = runs.iter().map(String::as_str).collect();
    which.extend(["--transcript-dir", out.path().to_str().unwrap()]);
    let args = in_containers(&which, &r, &p);
    let (code, stdout, stderr) = run(mqlab(&as_strs(&args)).current_dir(root()));
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stderr.contains("mqlab: environment: containers"),
        "{stderr}"
    );
    // The binary compared each transcript with the same snapshots the local
    // runs are compared with; check that it saw them all.
    assert!(stdout.contains(" 0 failed ("), "{stdout}");
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), runs.len());
}

#[test]
fn no_engine_is_one_line_and_exit_2() {
    let started = Instant::now();
    let (code, _, stderr) = run(mqlab(&[
        "lab",
        "routing",
        "--env",
        "containers",
        "--allow-floating-images",
    ])
    .current_dir(root())
    .env("DOCKER_HOST", "unix:///nonexistent/docker.sock"));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("no Docker-compatible engine")
            && stderr.contains("unix:///nonexistent/docker.sock"),
        "{stderr}"
    );
    assert!(stderr.contains("DOCKER_HOST"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_floating_image_is_refused() {
    let (code, _, stderr) = run(mqlab(&[
        "lab",
        "routing",
        "--env",
        "containers",
        "--rabbitmq-image",
        "rabbitmq:latest",
    ])
    .current_dir(root()));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("image `rabbitmq:latest` is not pinned by digest"),
        "{stderr}"
    );
}

#[test]
#[ignore = "needs a container engine and locally built images (.ci/run prepares them)"]
fn an_image_that_cannot_be_pulled() {
    let (_, p) = require_images();
    let missing = format!("localhost/mqlab-absent@sha256:{}", "0".repeat(64));
    let started = Instant::now();
    let args = in_containers(&["routing"], &missing, &p);
    let (code, _, stderr) = run(mqlab(&as_strs(&args)).current_dir(root()));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "image `{missing}` is not present and cannot be pulled"
        )),
        "{stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
}

/// After a SIGKILL of mqlab, the guard removes the run's containers through the engine.
#[test]
#[ignore = "needs a container engine and locally built images (.ci/run prepares them)"]
fn sigkill_of_mqlab_leaves_no_container() {
    let (r, p) = require_images();
    let run = start(&as_strs(&in_containers(&["consumer-crash"], &r, &p)), &[]);
    let dir = run.run_dir();
    run.wait_for_line("[consumer]");
    run.signal(nix::sys::signal::Signal::SIGKILL);
    let (code, stderr) = run.finish(&dir);
    assert_eq!(code, -1);
    assert_eq!(labelled_left(&dir), (0, 0), "{stderr}");
}

/// The same for a cluster: its three nodes and its network.
#[test]
#[ignore = "needs a container engine and locally built images (.ci/run prepares them)"]
fn sigkill_of_mqlab_leaves_no_cluster_container_or_network() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (r, p) = require_images();
    let args = in_containers(&["quorum-leader-kill"], &r, &p);
    let run = start(&as_strs(&args), &[]);
    let dir = run.run_dir();
    run.wait_for_line("[producer]");
    run.signal(nix::sys::signal::Signal::SIGKILL);
    let (code, stderr) = run.finish(&dir);
    assert_eq!(code, -1);
    assert_eq!(labelled_left(&dir), (0, 0), "{stderr}");
}
