//! PostgreSQL's settings under a SIGKILL of its server and under a power
//! loss, measured row by row against the findings table in
//! docs/power-loss.md: the table is what this test reads and checks, so a
//! cell that stops being true fails here. Real parts: the machine's
//! PostgreSQL, its data directory on the lazy file system (a real FUSE
//! mount, `DirModel::Strict`), one committed row, the server's processes
//! SIGKILLed. Needs root and `/dev/fuse`: without them it fails with a
//! sentence, it does not skip.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mqlab::env::postgres::{bindir, owner, Cluster, Durability};
use mqlab::lazyfs::{DirModel, LazyFs, Mount};

/// The findings of PostgreSQL's rows start after this line of the page.
const MARKER: &str = "<!-- findings: postgresql, checked by tests/power_loss.rs -->";

/// What a committed row is after the fault and a restart on the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Kept,
    Lost,
    /// The server does not start again on what was left.
    NoStart,
}

impl Outcome {
    fn parse(cell: &str) -> Option<Outcome> {
        match cell.trim() {
            "kept" => Some(Outcome::Kept),
            "lost" => Some(Outcome::Lost),
            "does not start" => Some(Outcome::NoStart),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Every process of the server SIGKILLed: the operating system keeps
    /// what was written.
    Kill,
    /// The file system frozen, every process SIGKILLed, what was never
    /// made durable dropped, mounted afresh.
    PowerLoss,
}

/// One row of the table: its settings (`key = value`, in the first cell's
/// backticks) and what each fault does to a committed row.
#[derive(Debug)]
struct Row {
    line: String,
    settings: Vec<(String, String)>,
    kill: Outcome,
    power: Outcome,
}

fn findings() -> Vec<Row> {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/power-loss.md");
    let text = std::fs::read_to_string(&page).unwrap();
    let after = text
        .split_once(MARKER)
        .unwrap_or_else(|| panic!("docs/power-loss.md has no `{MARKER}`"))
        .1;
    let mut rows = Vec::new();
    for line in after
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
    {
        let cells: Vec<&str> = line.trim_matches('|').split('|').collect();
        let settings: Vec<(String, String)> = cells[0]
            .split('`')
            .skip(1)
            .step_by(2)
            .filter_map(|s| s.split_once(" = "))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        if line.starts_with("| setting |") || line.starts_with("|---") {
            continue; // the header and its rule
        }
        assert!(
            !settings.is_empty(),
            "a row names no `key = value` setting: {line}"
        );
        let outcome = |i: usize| {
            Outcome::parse(cells[i]).unwrap_or_else(|| {
                panic!("`{}` is not kept, lost or does not start: {line}", cells[i])
            })
        };
        rows.push(Row {
            line: line.to_string(),
            settings,
            kill: outcome(1),
            power: outcome(2),
        });
    }
    rows
}

fn require_fuse() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "tests/power_loss.rs needs root: the lazy file system mounts with mount(2) and `allow_other`"
    );
    assert!(
        Path::new("/dev/fuse").exists(),
        "tests/power_loss.rs needs /dev/fuse (hint: `modprobe fuse`)"
    );
}

/// A case's cluster: `base` (its socket; `data`, the mount point), and
/// the backing directory the lazy file system serves at `base/data`.
struct Place {
    dir: tempfile::TempDir,
    cluster: Cluster,
    backing: PathBuf,
}

fn cluster_at(dir: &Path) -> Cluster {
    Cluster {
        bin: bindir().unwrap(),
        base: dir.join("pg"),
        log: dir.join("pg.log"),
        port: mqlab::env::free_ports(1).unwrap()[0],
        owner: owner().unwrap(),
        durability: Durability::Durable,
    }
}

fn traversable() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn url(c: &Cluster) -> String {
    format!("postgres://postgres@127.0.0.1:{}/postgres", c.port)
}

async fn ready(c: &Cluster) -> anyhow::Result<()> {
    c.ready(&url(c), Instant::now() + Duration::from_secs(60))
        .await
        .map(drop)
}

async fn sql(c: &Cluster, statement: &str) -> anyhow::Result<i64> {
    let mut db = mqlab::store::connect(&url(c)).await?;
    let n: Option<i64> = sqlx::query_scalar(statement)
        .fetch_optional(&mut db)
        .await?;
    Ok(n.unwrap_or(0))
}

/// A synced cluster with the table `t`, stopped cleanly (a checkpoint):
/// everything on its disk is durable. Copied for each case.
async fn template() -> (tempfile::TempDir, Cluster) {
    let dir = traversable();
    let cluster = cluster_at(dir.path());
    cluster.init().await.unwrap();
    let mut server = cluster.spawn(false).unwrap();
    ready(&cluster).await.unwrap();
    sql(&cluster, "CREATE TABLE t (id int PRIMARY KEY)")
        .await
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(server.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    assert!(server.wait().await.unwrap().success());
    (dir, cluster)
}

/// `template`'s cluster copied, its data directory moved aside as the
/// backing directory, `settings` (and the row's fixed ones) appended to
/// its `postgresql.auto.conf`.
fn case_place(template: &Cluster, settings: &[(String, String)]) -> Place {
    let dir = traversable();
    let copied = Command::new("cp")
        .arg("-a")
        .arg(&template.base)
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(copied.success());
    let cluster = cluster_at(dir.path());
    let backing = dir.path().join("backing");
    std::fs::rename(cluster.data(), &backing).unwrap();
    std::fs::create_dir(cluster.data()).unwrap();
    if let Some((uid, gid)) = cluster.owner {
        std::os::unix::fs::chown(cluster.data(), Some(uid), Some(gid)).unwrap();
    }
    std::fs::set_permissions(cluster.data(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut conf = String::new();
    for (k, v) in settings {
        conf.push_str(&format!("{k} = {v}\n"));
    }

    let auto = backing.join("postgresql.auto.conf");
    let mut text = std::fs::read_to_string(&auto).unwrap();
    text.push_str(&conf);
    std::fs::write(&auto, text).unwrap();
    Place {
        dir,
        cluster,
        backing,
    }
}

/// One committed row, `fault`, the server started again on what is left:
/// is the row there?
async fn case(template: &Cluster, settings: &[(String, String)], fault: Fault) -> Outcome {
    let place = case_place(template, settings);
    let c = &place.cluster;
    let mut mount: Mount = LazyFs::mount(&place.backing, &c.data(), DirModel::Strict).unwrap();
    let mut server = c.spawn(false).unwrap();
    ready(c).await.unwrap();
    // The WAL writer held (SIGSTOP) until the fault: an asynchronous
    // commit stays in the server's memory (PostgreSQL allows up to three
    // `wal_writer_delay`s), so the fault lands before its flush every time.
    mqlab::env::postgres::hold_wal_writer_of(server.id().unwrap(), &url(c))
        .await
        .unwrap();
    sql(c, "INSERT INTO t VALUES (1) RETURNING id::bigint")
        .await
        .unwrap();
    match fault {
        Fault::Kill => mqlab::env::process::kill_tree(&mut server).await.unwrap(),
        Fault::PowerLoss => {
            mount.freeze();
            mqlab::env::process::kill_tree(&mut server).await.unwrap();
            mount.power_loss().unwrap();
            mount = LazyFs::mount(&place.backing, &c.data(), DirModel::Strict).unwrap();
        }
    }
    let mut again = c.spawn(false).unwrap();
    let outcome = match ready(c).await {
        Err(_) => Outcome::NoStart,
        Ok(()) => match sql(c, "SELECT count(*) FROM t WHERE id = 1").await.unwrap() {
            1 => Outcome::Kept,
            _ => Outcome::Lost,
        },
    };
    mqlab::env::process::kill_tree(&mut again).await.unwrap();
    mount.unmount().unwrap();
    drop(place.dir);
    outcome
}

#[tokio::test]
async fn postgres_settings_under_a_sigkill_and_a_power_loss_are_the_findings_table() {
    require_fuse();
    let rows = findings();
    assert!(
        rows.len() >= 3,
        "docs/power-loss.md's PostgreSQL table has {} rows",
        rows.len()
    );
    let (_dir, template) = template().await;
    let mut wrong = Vec::new();
    for row in &rows {
        for (fault, want) in [(Fault::Kill, row.kill), (Fault::PowerLoss, row.power)] {
            let got = case(&template, &row.settings, fault).await;
            println!("{:?} under {fault:?}: {got:?}", row.settings);
            if got != want {
                wrong.push(format!(
                    "{fault:?}: {got:?}, the table says {want:?}: {}",
                    row.line
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
