//! `--env external`: labs against servers mqlab did not start. The "user's"
//! broker and database here are a kept local environment with the
//! management API (`mqlab env up --management`), used only through the
//! three URLs a user would give.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

/// The kept servers; `env down` even when an assertion fails.
struct Servers {
    dir: String,
    amqp: String,
    management: String,
    /// host:port, without credentials.
    management_at: String,
    database: String,
    pg_port: String,
    /// The "user's" password: searched for wherever mqlab writes.
    token: String,
    _tmp: tempfile::TempDir,
}

impl Drop for Servers {
    fn drop(&mut self) {
        let _ = mqlab(&["env", "down", &self.dir]).output();
    }
}

fn servers() -> Servers {
    let tmp = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = run(mqlab(&["env", "up", "--management"])
        .current_dir(root())
        .env("TMPDIR", tmp.path()));
    assert_eq!(code, 0, "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("--env external"))
        .expect("env up --management prints the external URLs");
    let arg = |flag: &str| -> String {
        let mut words = line.split_whitespace();
        words.find(|w| *w == flag).unwrap();
        words.next().unwrap().to_string()
    };
    let (management, database) = (arg("--management-url"), arg("--database-url"));
    let management_at = management.rsplit_once('@').unwrap().1.to_string();
    let amqp_at = arg("--amqp-url").rsplit_once('@').unwrap().1.to_string();
    let pg_port = database
        .rsplit_once(':')
        .unwrap()
        .1
        .split('/')
        .next()
        .unwrap()
        .to_string();
    // A user of the servers' own, with a password nothing else contains.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let token = format!("pw{nanos:x}");
    let mut s = Servers {
        dir: stdout.trim().to_string(),
        amqp: format!("amqp://owner:{token}@{amqp_at}"),
        management: format!("http://owner:{token}@{management_at}"),
        database: format!("postgres://owner:{token}@127.0.0.1:{pg_port}/postgres"),
        management_at,
        pg_port,
        token: token.clone(),
        _tmp: tmp,
    };
    let body = format!(r#"{{"password":"{token}","tags":"administrator"}}"#);
    let (code, _) = s.api("PUT", "/api/users/owner", Some(&body));
    assert!(code < 300, "{code}");
    s.psql(&format!(
        "CREATE ROLE owner LOGIN CREATEDB PASSWORD '{token}'"
    ));
    s.dir = s.dir.trim().to_string();
    s
}

impl Servers {
    fn args<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut a = extra.to_vec();
        a.extend([
            "--env",
            "external",
            "--amqp-url",
            &self.amqp,
            "--management-url",
            &self.management,
            "--database-url",
            &self.database,
        ]);
        a
    }

    fn api(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let url = format!("http://{}{path}", self.management_at);
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let auth = "Basic bXFsYWI6bXFsYWI="; // mqlab:mqlab, the lab broker's user
        let mut r = match method {
            "GET" => agent.get(&url).header("Authorization", auth).call(),
            "DELETE" => agent.delete(&url).header("Authorization", auth).call(),
            _ => agent
                .put(&url)
                .header("Authorization", auth)
                .header("Content-Type", "application/json")
                .send(body.unwrap_or("{}")),
        }
        .unwrap();
        (
            r.status().as_u16(),
            r.body_mut().read_to_string().unwrap_or_default(),
        )
    }

    /// What mqlab may have left: vhosts and databases with its prefix.
    fn leftovers(&self) -> (Vec<String>, Vec<String>) {
        let (_, body) = self.api("GET", "/api/vhosts", None);
        let vhosts: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
        let vhosts = vhosts
            .iter()
            .filter_map(|v| v["name"].as_str())
            .filter(|n| n.starts_with("mqlab"))
            .map(str::to_string)
            .collect();
        (
            vhosts,
            self.psql("SELECT datname FROM pg_database WHERE datname LIKE 'lab\\_mqlab%'"),
        )
    }

    fn psql(&self, sql: &str) -> Vec<String> {
        let out = std::process::Command::new("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.pg_port,
                "-U",
                "postgres",
                "-Atc",
                sql,
            ])
            .env("PGDATABASE", "postgres")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn assert_clean(&self, what: &str) {
        // Removed before mqlab exits: no waiting here.
        assert_eq!(self.leftovers(), (vec![], vec![]), "left after {what}");
    }
}

/// The seed labs pass on the "user's" servers with transcripts equal to the
/// spec's references, the evidence says where they ran, no credential is
/// written anywhere, and no vhost or database is left.
#[test]
fn seed_labs_pass_on_external_servers_and_leave_nothing() {
    let s = servers();
    let out = tempfile::tempdir().unwrap();
    let transcripts = out.path().join("t");
    let evidence = out.path().join("e");
    let (t, e) = (
        transcripts.to_str().unwrap().to_string(),
        evidence.to_str().unwrap().to_string(),
    );
    let (code, stdout, stderr) = run(mqlab(&s.args(&[
        "lab",
        "consumer-crash",
        "retry-dlq",
        "routing",
        "--transcript-dir",
        &t,
        "--evidence",
        &e,
    ]))
    .current_dir(root()));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    for lab in ["consumer-crash", "retry-dlq", "routing"] {
        let reference =
            std::fs::read_to_string(root().join(format!("tests/reference/{lab}.log"))).unwrap();
        let got = std::fs::read_to_string(transcripts.join(format!("{lab}.log"))).unwrap();
        let got: Vec<&str> = got.lines().filter(|l| !l.starts_with("[check] ")).collect();
        assert_eq!(got.join("\n"), reference.trim_end(), "{lab}");
        let record: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(evidence.join(format!("{lab}.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(record["environment"], "external", "{record}");
        assert_eq!(record["broker"]["version"], "RabbitMQ 3.10.8", "{record}");
    }
    assert_no_credentials(out.path(), &stdout, &stderr, &s.token);
    s.assert_clean("success");
}

fn assert_no_credentials(dir: &Path, stdout: &str, stderr: &str, token: &str) {
    let mut texts = vec![stdout.to_string(), stderr.to_string()];
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else if let Ok(t) = std::fs::read_to_string(e.path()) {
                texts.push(t);
            }
        }
    }
    for t in texts {
        assert!(!t.contains(token), "the password was written:\n{t}");
    }
}

/// A failing lab, then Ctrl-C in the middle of a lab: each time, the
/// vhosts and databases this run created are gone when mqlab exits.
#[test]
fn failure_and_ctrl_c_leave_nothing_behind() {
    let s = servers();
    let project = scratch_project();
    let lab = project.path().join("labs/routing.toml");
    let text = std::fs::read_to_string(&lab).unwrap();
    let wrong = text.replacen(
        "\"received:orders.routing.created\" = 2",
        "\"received:orders.routing.created\" = 7",
        1,
    );
    assert_ne!(wrong, text);
    std::fs::write(&lab, wrong).unwrap();
    let root_arg = project.path().to_str().unwrap().to_string();
    let (code, stdout, stderr) = run(&mut mqlab(
        &s.args(&["lab", "routing", "--root", &root_arg]),
    ));
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    s.assert_clean("a failed lab");

    // A consume phase that cannot finish (a second message that never
    // comes) holds the run until Ctrl-C.
    let stuck = text.replace(
        "consume = { queue = \"orders.routing.eu\", service = \"eu-tax-service\", settle = \"drain\" }",
        "consume = { queue = \"orders.routing.eu\", service = \"eu-tax-service\", settle = 2, deadline_secs = 120 }",
    );
    assert_ne!(stuck, text);
    std::fs::write(&lab, stuck).unwrap();
    let run = start(&s.args(&["lab", "routing", "--root", &root_arg]), &[]);
    let dir = run.run_dir();
    run.wait_for_line("destination=orders.routing.eu consumer=");
    // Mid-run, this run's vhost and database exist.
    let (vhosts, dbs) = s.leftovers();
    assert_eq!((vhosts.len(), dbs.len()), (1, 1), "{vhosts:?} {dbs:?}");
    run.signal(Signal::SIGINT);
    let (code, stderr) = run.finish(&dir);
    assert_eq!(code, 130, "{stderr}");
    s.assert_clean("Ctrl-C");
}

/// Missing rights are one line and exit 2 before any vhost is made: a
/// management user without `administrator`, a PostgreSQL role without
/// CREATEDB; a broker fault is refused, or skipped and listed.
#[test]
fn missing_rights_and_broker_faults_are_refused_up_front() {
    let s = servers();
    let (code, _) = s.api(
        "PUT",
        "/api/users/monitor",
        Some(r#"{"password":"pw","tags":"monitoring"}"#),
    );
    assert!(code < 300, "{code}");
    let limited = s
        .management
        .replacen(&format!("owner:{}@", s.token), "monitor:pw@", 1);
    let mut args = s.args(&["lab", "routing"]);
    let i = args.iter().position(|a| *a == "--management-url").unwrap();
    args[i + 1] = &limited;
    let started = Instant::now();
    let (code, _, stderr) = run(mqlab(&args).current_dir(root()));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("the management user `monitor` cannot create vhosts"),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    s.psql("CREATE ROLE nocreate LOGIN");
    let db = s
        .database
        .replacen(&format!("owner:{}@", s.token), "nocreate@", 1);
    let mut args = s.args(&["lab", "routing"]);
    let i = args.iter().position(|a| *a == "--database-url").unwrap();
    args[i + 1] = &db;
    let (code, _, stderr) = run(mqlab(&args).current_dir(root()));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("the PostgreSQL role `nocreate` cannot create databases"),
        "{stderr}"
    );

    let (code, _, stderr) =
        run(mqlab(&s.args(&["lab", "broker-restart", "routing"])).current_dir(root()));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("not runnable on --env external"),
        "{stderr}"
    );
    // A lab whose bound relies on a broker setting mqlab cannot read here.
    let (code, _, stderr) =
        run(mqlab(&s.args(&["lab", "dead-letter-safety", "routing"])).current_dir(root()));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("dead-letter-safety (it relies on the broker setting `dead_letter_worker_publisher_confirm_timeout` = 1000"),
        "{stderr}"
    );
    let (code, stdout, stderr) =
        run(
            mqlab(&s.args(&["lab", "broker-restart", "routing", "--skip-unsupported"]))
                .current_dir(root()),
        );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed, 0 failed"), "{stdout}");
    assert!(
        stderr.contains("1 skipped (not runnable on --env external): broker-restart"),
        "{stderr}"
    );
    assert!(!stderr.contains(&s.token), "{stderr}");
    s.assert_clean("the refusals");
}
