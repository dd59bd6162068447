//! `cargo bench --bench suite` (or `just bench`): figures, printed, never
//! asserted (a slow machine is not a bug). Over MQLAB_BENCH_RUNS runs
//! (default 3), each on a freshly started local environment:
//!
//! - environment ready (RabbitMQ + PostgreSQL booted: the "bare boot");
//! - cold `lab --all`: boot + every run of every lab, serially;
//! - warm `lab --all`: the same runs on the running environment;
//! - `explore consumer-crash` on the running environment (points, seconds);
//! - soak: the inbox consumers (2, with kills) and as many auto-ack
//!   consumers (no faults) draining 1k and 10k messages (100k with
//!   MQLAB_BENCH_SOAK_100K=1): messages/s, ms per message, the ratio.

use std::path::Path;
use std::time::{Duration, Instant};

use mqlab::env::guard::RunDir;
use mqlab::env::local::LocalEnv;
use mqlab::env::{EnvOptions, Environment};
use mqlab::events::Quiet;
use mqlab::lab::Project;
use mqlab::runner::{self, Suite};
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
    for name in project.lab_names().unwrap() {
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
    for i in 0..runs {
        let run_dir = RunDir::create(exe).expect("run directory");
        rt.block_on(async {
            let started = Instant::now();
            let mut vhosts: Vec<String> = labs
                .iter()
                .map(|l| runner::vhost_for(&l.run_name()))
                .collect();
            vhosts.extend(["explore".to_string(), "soak".to_string()]);
            let opts = EnvOptions {
                dir: run_dir.path().to_path_buf(),
                keep: false,
                amqp_port: None,
                pg_port: None,
                ready_timeout: Duration::from_secs(60),
                vhosts,
                progress: Default::default(),
            };
            let mut env =
                Environment::Local(Box::new(LocalEnv::start(&opts).await.expect("environment")));
            let boot = env.info().ready.as_secs_f64();
            push("environment ready (s)", boot);
            let mut suite = Suite {
                project: &project,
                env: &mut env,
                exe,
                run_dir: run_dir.path(),
                update: false,
                vhost: None,
                checks_only: false,
                jobs: 1,
            };
            let mut records = Vec::new();
            let t = Instant::now();
            suite.run(&labs, &mut records, &mut Quiet).await;
            let warm = t.elapsed().as_secs_f64();
            for r in &records {
                assert!(r.passed(), "{} failed in run {i}", r.run);
            }
            push("cold lab --all (s)", started.elapsed().as_secs_f64());
            push("warm lab --all (s)", warm);
            push("cold --all / boot", started.elapsed().as_secs_f64() / boot);

            let lab = project.load("consumer-crash").unwrap();
            let points = mqlab::explore::points(&lab);
            let mut suite = Suite {
                project: &project,
                env: &mut env,
                exe,
                run_dir: run_dir.path(),
                update: false,
                vhost: Some("explore".into()),
                checks_only: true,
                jobs: 1,
            };
            let t = Instant::now();
            for p in &points {
                let r = suite.run_one(&p.lab, &mut Quiet).await;
                assert_eq!(mqlab::explore::Verdict::of(&r), mqlab::explore::Verdict::Ok);
            }
            push(
                &format!("explore consumer-crash, {} points (s)", points.len()),
                t.elapsed().as_secs_f64(),
            );

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
                    env: &mut env,
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
        });
        run_dir.close();
        eprintln!("run {}/{runs} done", i + 1);
    }
    println!("mqlab benchmark: {runs} runs (min median max), 2-core figures in the README");
    for (name, v) in rows {
        println!("{name:<44} {}", stats(v));
    }
}
