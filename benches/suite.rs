//! `cargo bench --bench suite` (or `just bench`): environment ready time, each
//! lab's time beyond the environment, and the whole-suite wall time, over a
//! few runs. Figures are printed, never asserted: a slow machine is not a bug.

use std::path::Path;
use std::time::{Duration, Instant};

use mqlab::env::guard::RunDir;
use mqlab::env::local::LocalEnv;
use mqlab::env::{EnvOptions, Environment};
use mqlab::events::Quiet;
use mqlab::lab::Project;
use mqlab::runner::{self, Suite};

fn stats(mut v: Vec<Duration>) -> String {
    v.sort();
    let s = |d: Duration| format!("{:.2}", d.as_secs_f64());
    format!(
        "{:>6} {:>6} {:>6}",
        s(v[0]),
        s(v[v.len() / 2]),
        s(v[v.len() - 1])
    )
}

fn main() {
    let runs: usize = std::env::var("MQLAB_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let project = Project {
        root: env!("CARGO_MANIFEST_DIR").into(),
    };
    let labs: Vec<_> = project
        .lab_names()
        .unwrap()
        .iter()
        .map(|n| project.load(n).unwrap())
        .collect();
    let exe = Path::new(env!("CARGO_BIN_EXE_mqlab"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (mut ready, mut wall, mut teardown) = (Vec::new(), Vec::new(), Vec::new());
    let mut per_lab: Vec<Vec<Duration>> = vec![Vec::new(); labs.len()];
    for i in 0..runs {
        let run_dir = RunDir::create(exe).expect("run directory");
        rt.block_on(async {
            let started = Instant::now();
            let opts = EnvOptions {
                dir: run_dir.path().to_path_buf(),
                keep: false,
                amqp_port: None,
                pg_port: None,
                ready_timeout: Duration::from_secs(60),
                vhosts: labs
                    .iter()
                    .map(|l| runner::vhost_for(&l.run_name()))
                    .collect(),
                progress: Default::default(),
            };
            let mut env =
                Environment::Local(Box::new(LocalEnv::start(&opts).await.expect("environment")));
            ready.push(env.info().ready);
            let mut suite = Suite {
                project: &project,
                env: &mut env,
                exe,
                run_dir: run_dir.path(),
                update: false,
                vhost: None,
                checks_only: false,
            };
            let mut records = Vec::new();
            suite.run(&labs, &mut records, &mut Quiet).await;
            for (j, r) in records.iter().enumerate() {
                assert!(r.passed(), "{} failed in run {i}", r.run);
                per_lab[j].push(r.duration);
            }
            let t = Instant::now();
            env.stop().await;
            teardown.push(t.elapsed());
            wall.push(started.elapsed());
        });
        run_dir.close();
        eprintln!("run {}/{runs} done", i + 1);
    }
    println!("mqlab suite benchmark: {runs} runs, seconds (min median max)");
    println!("{:<28} {}", "environment ready", stats(ready));
    for (lab, d) in labs.iter().zip(per_lab) {
        println!("{:<28} {}", format!("lab {}", lab.name), stats(d));
    }
    println!("{:<28} {}", "teardown", stats(teardown));
    println!("{:<28} {}", "--all wall", stats(wall));
}
