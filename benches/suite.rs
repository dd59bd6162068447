//! `cargo bench --bench suite` (or `just bench`): figures, printed, never
//! asserted (a slow machine is not a bug). Over MQLAB_BENCH_RUNS runs
//! (default 3):
//!
//! - environment ready: RabbitMQ + PostgreSQL booted (in parallel; the
//!   broker is the longer), in process: the "bare boot";
//! - soak on that environment: the inbox consumers (2, with kills) and as
//!   many auto-ack consumers (no faults) draining 1k and 10k messages (100k
//!   with MQLAB_BENCH_SOAK_100K=1): messages/s, ms per message, the ratio;
//! - cold `mqlab lab --all --env local` (boot + every run, default --jobs),
//!   and its ratio to the bare boot measured in the same run;
//! - `mqlab env up`, then warm `mqlab lab --all --env-dir` and
//!   `mqlab explore consumer-crash --env-dir`, then `mqlab env down`.
//!
//! The commands are the release binary, run as a user runs them.

use std::path::Path;
use std::time::{Duration, Instant};

use mqlab::env::guard::RunDir;
use mqlab::env::local::LocalEnv;
use mqlab::env::{EnvOptions, Environment};
use mqlab::lab::Project;
use mqlab::soak::{Plan, Soak};
use mqlab::vocab::Pattern;

fn stats(mut v: Vec<f64>) -> String {
    v.sort_by(|a, b| a.total_cmp(b));
    format!(
        "{:>8.2} {:>8.2} {:>8.2}",
        v[0],
        v[v.len() / 2],
        v[v.len() - 1]
    )
}

fn main() {
    let runs: usize = std::env::var("MQLAB_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let sizes: Vec<usize> = if std::env::var_os("MQLAB_BENCH_SOAK_100K").is_some() {
        vec![1_000, 10_000, 100_000]
    } else {
        vec![1_000, 10_000]
    };
    let project = Project {
        root: env!("CARGO_MANIFEST_DIR").into(),
    };
    let mut labs = Vec::new();
    // `--all`: the one-node labs (the cluster labs are `--group cluster`).
    for name in project.lab_names().unwrap() {
        if project.is_cluster(&name).unwrap() {
            continue;
        }
        for run in project.runs_of(&name).unwrap() {
            labs.push(project.load(&run).unwrap());
        }
    }
    let exe = Path::new(env!("CARGO_BIN_EXE_mqlab"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut rows: Vec<(String, Vec<f64>)> = Vec::new();
    let mut push = |name: &str, v: f64| match rows.iter_mut().find(|(n, _)| n == name) {
        Some((_, vs)) => vs.push(v),
        None => rows.push((name.to_string(), vec![v])),
    };
    let mqlab = |args: &[&str]| -> (f64, String) {
        let t = Instant::now();
        let out = std::process::Command::new(exe)
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("mqlab runs");
        let secs = t.elapsed().as_secs_f64();
        assert!(
            out.status.success(),
            "mqlab {args:?} failed: {:?}",
            out.status
        );
        (secs, String::from_utf8_lossy(&out.stdout).into_owned())
    };
    for i in 0..runs {
        let run_dir = RunDir::create(exe).expect("run directory");
        let boot = rt.block_on(async {
            let opts = EnvOptions {
                broker: Default::default(),
                generation: Default::default(),
                dir: run_dir.path().to_path_buf(),
                keep: false,
                broker_port: None,
                pg_port: None,
                ready_timeout: Duration::from_secs(60),
                vhosts: vec!["soak".into()],
                progress: Default::default(),
                management: false,
                cluster: None,
            };
            let mut env: Box<dyn Environment> =
                Box::new(LocalEnv::start(&opts).await.expect("environment"));
            let boot = env.info().ready.as_secs_f64();
            push("environment ready (s)", boot);
            for n in &sizes {
                let plan = Plan {
                    messages: *n,
                    consumers: 2,
                    kills: 50.min(n / 20),
                    resend_share: 0.05,
                    broker_restarts: 0,
                    seed: i as u64 + 1,
                    pattern: Pattern::Inbox,
                    baseline: true,
                };
                let quiet = |_: &str| {};
                let mut soak = Soak {
                    env: &mut *env,
                    exe: exe.to_path_buf(),
                    logs: run_dir.path().join(format!("soak-{n}")),
                    vhost: "soak".into(),
                    database: format!("soak_{n}"),
                    progress: &quiet,
                };
                let r = soak.run(&plan).await.expect("soak");
                assert!(r.holds(), "the soak lost or duplicated: {:?}", r.checks);
                let base = r.baseline_rate().unwrap();
                push(&format!("soak {n}: kills"), r.kills as f64);
                push(&format!("soak {n}: inbox msg/s"), r.rate());
                push(&format!("soak {n}: inbox ms/msg"), 1000.0 / r.rate());
                push(&format!("soak {n}: auto-ack msg/s"), base);
                push(&format!("soak {n}: inbox / auto-ack"), r.rate() / base);
            }
            env.stop().await;
            boot
        });
        run_dir.close();

        let (cold, _) = mqlab(&["lab", "--all", "--env", "local"]);
        push(&format!("cold lab --all, {} runs (s)", labs.len()), cold);
        push("cold lab --all / environment ready", cold / boot);

        let (up, dir) = mqlab(&["env", "up"]);
        push("env up (s)", up);
        let dir = dir.trim().to_string();
        let (warm, _) = mqlab(&["lab", "--all", "--env-dir", &dir]);
        push(&format!("warm lab --all, {} runs (s)", labs.len()), warm);
        let points = mqlab::explore::points(&project.load("consumer-crash").unwrap()).len();
        let (explore, _) = mqlab(&["explore", "consumer-crash", "--env-dir", &dir]);
        push(
            &format!("warm explore consumer-crash, {points} points (s)"),
            explore,
        );
        mqlab(&["env", "down", &dir]);
        eprintln!("run {}/{runs} done", i + 1);
    }
    println!("mqlab benchmark: {runs} runs (min median max), 2-core figures in the README");
    for (name, v) in rows {
        println!("{name:<44} {}", stats(v));
    }
}
