//! A PostgreSQL cluster of mqlab's own: `initdb` in a directory, `postgres`
//! on a 127.0.0.1 port, run as the `postgres` user when mqlab is root. The
//! local environment runs one for every lab, fast and not durable; a lab
//! with a `database` of its own ([`Durability::Durable`], `FsyncOff`,
//! `AsyncCommit`) runs one over a directory of its own ([`own`]), on the
//! lazy file system when the lab has a database fault, which crashes it
//! or cuts its power ([`Own::crash`], [`Own::power_loss`]).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::process::{Child, Command};

use super::{nodes, process};
use crate::lazyfs::{DirModel, LazyFs, Mount};

/// How much of PostgreSQL's durability a cluster keeps: the lab file's
/// `database` ([`Durability::Fast`] the shared one's, [`Durability::Durable`]
/// a run's own).
pub use crate::vocab::Durability;

/// One cluster's place and settings; [`Cluster::init`] then
/// [`Cluster::spawn`] start it.
pub struct Cluster {
    /// The PostgreSQL binaries (`initdb`, `postgres`).
    pub bin: PathBuf,
    /// Holds `data/` and the server's socket; 0700, the owner's.
    pub base: PathBuf,
    /// initdb's and the server's output.
    pub log: PathBuf,
    pub port: u16,
    /// The user and group it runs as (when mqlab is root).
    pub owner: Option<(u32, u32)>,
    pub durability: Durability,
}

impl Cluster {
    /// The data directory.
    pub fn data(&self) -> PathBuf {
        self.base.join("data")
    }

    /// The base directory (owner's, 0700), the log, and `initdb`.
    pub async fn init(&self) -> Result<()> {
        std::fs::create_dir_all(&self.base)?;
        if let Some((uid, gid)) = self.owner {
            nix::unistd::chown(&self.base, Some(uid.into()), Some(gid.into()))?;
        }
        std::fs::set_permissions(&self.base, std::fs::Permissions::from_mode(0o700))?;
        std::fs::write(&self.log, "")?;
        if let Some((uid, gid)) = self.owner {
            nix::unistd::chown(&self.log, Some(uid.into()), Some(gid.into()))?;
        }
        let mut initdb = self.command("initdb");
        initdb.arg("-D").arg(self.data()).args([
            "-U",
            "postgres",
            "--auth=trust",
            "--no-instructions",
            "-E",
            "UTF8",
            "--locale=C",
        ]);
        if self.durability == Durability::Fast {
            initdb.arg("--no-sync");
        }
        let status = process::spawn(&mut initdb, &self.log, false)?
            .wait()
            .await?;
        if !status.success() {
            bail!(
                "initdb failed ({status}):\n{}",
                process::tail(&self.log, 10)
            );
        }
        Ok(())
    }

    /// Starts the server on the initialised directory; `keep`: it outlives
    /// mqlab (`--keep`).
    pub fn spawn(&self, keep: bool) -> Result<Child> {
        // A unix socket's path holds at most 107 bytes: a run's own cluster,
        // deep in its run's directory under a long run name (an explore
        // point's), listens on TCP only, which is all mqlab uses.
        let socket = self.base.join(format!(".s.PGSQL.{}", self.port));
        let socket_dir = match socket.as_os_str().len() <= 107 {
            true => self.base.as_os_str(),
            false => std::ffi::OsStr::new(""),
        };
        let mut pg = self.command("postgres");
        pg.arg("-D")
            .arg(self.data())
            .arg("-k")
            .arg(socket_dir)
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"]);
        for (k, v) in settings(self.durability) {
            pg.args(["-c", &format!("{k}={v}")]);
        }
        process::spawn_with(&mut pg, &self.log, false, keep)
    }

    /// The server answers at `url` by `deadline`: its version, or an error
    /// with its log's end.
    pub async fn ready(&self, url: &str, deadline: Instant) -> Result<String> {
        ready(url, &self.log, deadline).await
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.owner {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }
}

/// What a durability sets beyond PostgreSQL's defaults.
fn settings(d: Durability) -> &'static [(&'static str, &'static str)] {
    match d {
        Durability::Fast => &[("fsync", "off"), ("full_page_writes", "off")],
        Durability::Durable => &[],
        Durability::FsyncOff => &[("fsync", "off")],
        // A lab with a database fault holds the WAL writer (Own::hold_wal_writer).
        Durability::AsyncCommit => &[("synchronous_commit", "off")],
    }
}

/// A PostgreSQL of one run's own, answering on [`Own::port`] as
/// `postgres` (trust auth); stopped by [`Own::stop`], or with mqlab if it
/// dies first (the process's parent-death signal). On the lazy file
/// system when a lab's fault needs it ([`Own::power_loss`]).
pub struct Own {
    server: Child,
    pub port: u16,
    /// The server's version, as it reports it.
    pub version: String,
    cluster: Cluster,
    lazy: Option<Lazy>,
    /// The WAL writer stopped by [`Own::hold_wal_writer`], until the
    /// server dies.
    held: Option<u32>,
}

/// Stops (SIGSTOP) the WAL writer of the server whose postmaster is
/// `postmaster` (reached at `url`) while it waits for work
/// (`WalWriterMain`), never in a flush, whose lock would stop every other
/// flush with it (a commit would then wait forever): its pid.
pub async fn hold_wal_writer_of(postmaster: u32, url: &str) -> Result<u32> {
    let writers = process::children_named(postmaster, "postgres: walwriter");
    let [writer] = writers[..] else {
        anyhow::bail!(
            "the PostgreSQL server has {} WAL writers, not one",
            writers.len()
        );
    };
    let mut db = crate::store::connect(url).await?;
    let w = nix::unistd::Pid::from_raw(writer as i32);
    for _ in 0..100 {
        nix::sys::signal::kill(w, nix::sys::signal::Signal::SIGSTOP)?;
        process::await_stopped(writer, Duration::from_secs(5)).await?;
        let waits: Option<String> = sqlx::query_scalar(
            "SELECT wait_event FROM pg_stat_activity WHERE backend_type = 'walwriter'",
        )
        .fetch_one(&mut db)
        .await?;
        if waits.as_deref() == Some("WalWriterMain") {
            return Ok(writer);
        }
        // Caught in its work: let it finish, and try again.
        nix::sys::signal::kill(w, nix::sys::signal::Signal::SIGCONT)?;
        tokio::task::yield_now().await;
    }
    anyhow::bail!("the PostgreSQL server's WAL writer was never caught waiting (100 tries)")
}

/// Dropped without [`Own::stop`] (a run torn down by a signal): the held
/// WAL writer is killed first, as the server's other processes die with
/// the server (the parent-death signal); stopped, it would see nothing
/// and keep its files open on the lazy file system.
impl Drop for Own {
    fn drop(&mut self) {
        if let Some(w) = self.held.take() {
            let w = nix::unistd::Pid::from_raw(w as i32);
            let _ = nix::sys::signal::kill(w, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// The lazy file system under a cluster's data directory, and what it serves.
struct Lazy {
    mount: Mount,
    backing: PathBuf,
}

/// How long a run's own cluster may take to answer (initdb excluded).
const OWN_READY: Duration = Duration::from_secs(60);

/// Starts a cluster with `durability` in `dir` (created, traversable by the
/// user PostgreSQL runs as), from the machine's PostgreSQL binaries; with
/// `lazy`, its data directory on the lazy file system (what `initdb`
/// wrote is durable).
pub async fn own(durability: Durability, dir: &Path, lazy: bool) -> Result<Own> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    let port = super::free_ports(1)?[0];
    let cluster = Cluster {
        bin: bindir()?,
        base: dir.join("pg"),
        log: dir.join("pg.log"),
        port,
        owner: owner()?,
        durability,
    };
    cluster.init().await?;
    let lazy = match lazy {
        true => Some(Lazy::under(&cluster, dir)?),
        false => None,
    };
    let mut server = cluster.spawn(false)?;
    match cluster
        .ready(&admin_url(port), Instant::now() + OWN_READY)
        .await
    {
        Ok(version) => Ok(Own {
            server,
            port,
            version,
            cluster,
            lazy,
            held: None,
        }),
        Err(e) => {
            Own::halt(&mut server).await;
            Err(e)
        }
    }
}

impl Lazy {
    /// `cluster`'s data directory moved to `dir/backing`, served at its
    /// place (the owner's, 0700, as PostgreSQL requires).
    fn under(cluster: &Cluster, dir: &Path) -> Result<Lazy> {
        let backing = dir.join("backing");
        std::fs::rename(cluster.data(), &backing)?;
        std::fs::create_dir(cluster.data())?;
        if let Some((uid, gid)) = cluster.owner {
            nix::unistd::chown(&cluster.data(), Some(uid.into()), Some(gid.into()))?;
        }
        std::fs::set_permissions(cluster.data(), std::fs::Permissions::from_mode(0o700))?;
        let mount = Lazy::mount(&backing, cluster)?;
        Ok(Lazy { mount, backing })
    }

    fn mount(backing: &Path, cluster: &Cluster) -> Result<Mount> {
        LazyFs::mount(backing, &cluster.data(), DirModel::Strict)
            .context("mounting the lazy file system under the run's own PostgreSQL")
    }
}

/// A cluster of mqlab's own on 127.0.0.1:`port`, its `postgres` database.
fn admin_url(port: u16) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/postgres")
}

/// What a server at `url` has of its durability, as it reports it:
/// `fsync`, `full_page_writes` and `synchronous_commit` (`on` or `off`).
pub async fn durability_at(url: &str) -> Result<(String, String, String)> {
    let mut db = crate::store::connect(url).await?;
    let seen = sqlx::query_as(
        "SELECT current_setting('fsync'), current_setting('full_page_writes'), current_setting('synchronous_commit')",
    )
    .fetch_one(&mut db)
    .await?;
    Ok(seen)
}

/// What [`durability_at`] reads from a cluster with `d`.
pub fn durability_of(d: Durability) -> (&'static str, &'static str, &'static str) {
    match d {
        Durability::Fast => ("off", "off", "on"),
        Durability::Durable => ("on", "on", "on"),
        Durability::FsyncOff => ("off", "on", "on"),
        Durability::AsyncCommit => ("on", "on", "off"),
    }
}

impl Own {
    /// Its administrative database's URL, as `postgres`.
    pub fn url(&self) -> String {
        admin_url(self.port)
    }

    /// A fast shutdown, then SIGKILL after 5 s; the lazy file system
    /// unmounted after it (a failed unmount is the run's error).
    pub async fn stop(mut self) -> Result<()> {
        self.release_wal_writer();
        Own::halt(&mut self.server).await;
        if let Some(l) = self.lazy.take() {
            l.mount
                .unmount()
                .context("unmounting the run's own PostgreSQL's file system")?;
        }
        Ok(())
    }

    /// Stops (SIGSTOP) the server's WAL writer until the server dies: an
    /// asynchronous commit then stays in memory until the lab's fault, as
    /// the lazy file system holds an fsync. PostgreSQL lets it stay there
    /// up to three `wal_writer_delay`s; held, the window lasts as long as
    /// the step, so the fault lands in it on every run. Held only while it
    /// waits for work (`WalWriterMain`), never in a flush, whose lock
    /// would stop every other flush with it.
    pub async fn hold_wal_writer(&mut self) -> Result<()> {
        let pid = self
            .server
            .id()
            .context("the run's own PostgreSQL is not running")?;
        self.held = Some(hold_wal_writer_of(pid, &self.url()).await?);
        Ok(())
    }

    /// The held WAL writer let go (a shutdown waits for it).
    fn release_wal_writer(&mut self) {
        if let Some(w) = self.held.take() {
            let w = nix::unistd::Pid::from_raw(w as i32);
            let _ = nix::sys::signal::kill(w, nix::sys::signal::Signal::SIGCONT);
        }
    }

    /// Everything written so far made durable, as the kernel's writeback
    /// would in the seconds after: a lab's setup (its database, schema and
    /// first rows) is not what its power loss is about.
    pub fn writeback(&self) -> Result<()> {
        if let Some(l) = &self.lazy {
            l.mount.sync_all()?;
        }
        Ok(())
    }

    /// Every process of the server SIGKILLed (the operating system keeps
    /// what they wrote), then the server started again on its data.
    pub async fn crash(&mut self) -> Result<()> {
        process::kill_tree(&mut self.server).await?;
        self.held = None;
        self.start_again().await
    }

    /// A power loss: the file system frozen (nothing more becomes
    /// durable), every process of the server SIGKILLed, what was never
    /// made durable dropped, the file system mounted afresh, the server
    /// started again on what is left. What was dropped, path by path.
    pub async fn power_loss(&mut self) -> Result<Vec<String>> {
        self.lazy
            .as_ref()
            .context("a power loss needs the run's own PostgreSQL on the lazy file system")?
            .mount
            .freeze();
        process::kill_tree(&mut self.server).await?;
        self.held = None;
        // Taken only now: on an error before, stop() still unmounts it.
        let lazy = self.lazy.take().context("the lazy file system is gone")?;
        let lost = lazy
            .mount
            .power_loss()
            .context("the power loss of the run's own PostgreSQL")?
            .lost;
        self.lazy = Some(Lazy {
            mount: Lazy::mount(&lazy.backing, &self.cluster)?,
            backing: lazy.backing,
        });
        self.start_again().await?;
        Ok(lost.iter().map(ToString::to_string).collect())
    }

    async fn start_again(&mut self) -> Result<()> {
        self.server = self.cluster.spawn(false)?;
        self.cluster
            .ready(&self.url(), Instant::now() + OWN_READY)
            .await
            .context("the run's own PostgreSQL, started again on its data")?;
        Ok(())
    }

    /// A fast shutdown (the postmaster ends its backends); if it takes
    /// more than 5 s, every process SIGKILLed (the backends run in
    /// sessions of their own: a process group's kill misses them).
    async fn halt(server: &mut Child) {
        let Some(pid) = server.id() else { return };
        let sigint = nix::sys::signal::Signal::SIGINT;
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sigint);
        if tokio::time::timeout(Duration::from_secs(5), server.wait())
            .await
            .is_err()
        {
            let _ = process::kill_tree(server).await;
        }
    }
}

/// The server at `url` (its output in `log`) answers by `deadline`.
pub async fn ready(url: &str, log: &Path, deadline: Instant) -> Result<String> {
    match nodes::answers_postgres(url, deadline).await? {
        Some(version) => Ok(version),
        None => bail!(
            "PostgreSQL did not become ready; last lines of its log:\n{}",
            process::tail(log, 15)
        ),
    }
}

/// The PostgreSQL binaries: `MQLAB_PG_BIN`, or the newest installed major.
pub fn bindir() -> Result<PathBuf> {
    let bin = match std::env::var_os("MQLAB_PG_BIN") {
        Some(p) => PathBuf::from(p),
        None => newest_bindir().context(
            "PostgreSQL is not installed: no /usr/lib/postgresql/<major>/bin/postgres (hint: `apt-get install postgresql`, or set MQLAB_PG_BIN)",
        )?,
    };
    if !bin.join("postgres").exists() || !bin.join("initdb").exists() {
        bail!(
            "PostgreSQL binaries missing in `{}` (hint: `apt-get install postgresql`)",
            bin.display()
        );
    }
    Ok(bin)
}

fn newest_bindir() -> Option<PathBuf> {
    let mut majors: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let major = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((major, bin))
        })
        .collect();
    majors.sort();
    majors.pop().map(|(_, p)| p)
}

/// PostgreSQL refuses to run as root: as root, run it as the `postgres` user
/// (or `MQLAB_PG_USER`).
pub fn owner() -> Result<Option<(u32, u32)>> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let name = std::env::var("MQLAB_PG_USER").unwrap_or_else(|_| "postgres".into());
    let user = nix::unistd::User::from_name(&name)?.with_context(|| {
        format!("running as root, but there is no `{name}` system user to run PostgreSQL as (hint: `apt-get install postgresql` creates `postgres`; or set MQLAB_PG_USER)")
    })?;
    Ok(Some((user.uid.as_raw(), user.gid.as_raw())))
}
