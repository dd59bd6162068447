//! A PostgreSQL cluster of mqlab's own: `initdb` in a directory, `postgres`
//! on a 127.0.0.1 port, run as the `postgres` user when mqlab is root. The
//! local environment runs one for every lab, fast and not durable; a lab
//! that needs PostgreSQL's own durability (a power loss) runs one with
//! [`Durability::Durable`] over a directory of its own.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::process::{Child, Command};

use super::{nodes, process};

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
        let mut pg = self.command("postgres");
        pg.arg("-D")
            .arg(self.data())
            .arg("-k")
            .arg(&self.base)
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"]);
        if self.durability == Durability::Fast {
            pg.args(["-c", "fsync=off", "-c", "full_page_writes=off"]);
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

/// A PostgreSQL of one run's own, answering on [`Own::port`] as
/// `postgres` (trust auth); stopped by [`Own::stop`], or with mqlab if it
/// dies first (the process's parent-death signal).
pub struct Own {
    server: Child,
    pub port: u16,
    /// The server's version, as it reports it.
    pub version: String,
}

/// How long a run's own cluster may take to answer (initdb excluded).
const OWN_READY: Duration = Duration::from_secs(60);

/// Starts a cluster with `durability` in `dir` (created, traversable by the
/// user PostgreSQL runs as), from the machine's PostgreSQL binaries.
pub async fn own(durability: Durability, dir: &Path) -> Result<Own> {
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
    let mut server = cluster.spawn(false)?;
    match cluster
        .ready(&admin_url(port), Instant::now() + OWN_READY)
        .await
    {
        Ok(version) => Ok(Own {
            server,
            port,
            version,
        }),
        Err(e) => {
            Own::halt(&mut server).await;
            Err(e)
        }
    }
}

/// A cluster of mqlab's own on 127.0.0.1:`port`, its `postgres` database.
fn admin_url(port: u16) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/postgres")
}

/// What a server at `url` has of its durability, as it reports it:
/// `fsync` and `full_page_writes` (`on` or `off`).
pub async fn durability_at(url: &str) -> Result<(String, String)> {
    let mut db = crate::store::connect(url).await?;
    let seen =
        sqlx::query_as("SELECT current_setting('fsync'), current_setting('full_page_writes')")
            .fetch_one(&mut db)
            .await?;
    Ok(seen)
}

impl Own {
    /// Its administrative database's URL, as `postgres`.
    pub fn url(&self) -> String {
        admin_url(self.port)
    }

    /// A fast shutdown, then SIGKILL after 5 s.
    pub async fn stop(mut self) {
        Own::halt(&mut self.server).await;
    }

    async fn halt(server: &mut Child) {
        let sigint = nix::sys::signal::Signal::SIGINT;
        process::stop(server, sigint, Duration::from_secs(5)).await;
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
