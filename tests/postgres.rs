//! The PostgreSQL cluster a lab runs on: fast by default (the local
//! environment's, `fsync` and full page writes off), and with PostgreSQL's
//! own durability when a lab asks for it (a power loss tests what is synced).

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use mqlab::env::postgres::{bindir, owner, Cluster, Durability};

#[tokio::test]
async fn a_cluster_runs_with_the_durability_asked_for() {
    for (durability, want) in [
        (Durability::Fast, ("off", "off")),
        (Durability::Durable, ("on", "on")),
    ] {
        let dir = tempfile::tempdir().unwrap();
        // Traversable by the user PostgreSQL runs as.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let port = mqlab::env::free_ports(1).unwrap()[0];
        let cluster = Cluster {
            bin: bindir().unwrap(),
            base: dir.path().join("pg"),
            log: dir.path().join("pg.log"),
            port,
            owner: owner().unwrap(),
            durability,
        };
        cluster.init().await.unwrap();
        let mut server = cluster.spawn(false).unwrap();
        let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
        let deadline = Instant::now() + Duration::from_secs(60);
        cluster.ready(&url, deadline).await.unwrap();
        let mut db = mqlab::store::connect(&url).await.unwrap();
        let seen: (String, String) =
            sqlx::query_as("SELECT current_setting('fsync'), current_setting('full_page_writes')")
                .fetch_one(&mut db)
                .await
                .unwrap();
        drop(db);
        mqlab::env::process::stop(
            &mut server,
            nix::sys::signal::Signal::SIGINT,
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(
            (seen.0.as_str(), seen.1.as_str()),
            want,
            "fsync, full_page_writes under {durability:?}"
        );
    }
}
