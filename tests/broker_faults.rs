//! Broker faults exposed by the environment, on a real node: after a SIGKILL
//! and a restart on the same data directory, a durable queue still holds its
//! persistent messages and has lost its transient ones; a paused broker
//! answers nothing until it is resumed.

use std::time::Duration;

use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::BasicProperties;
use mqlab::amqp;
use mqlab::env::guard::RunDir;
use mqlab::env::local::LocalEnv;
use mqlab::env::EnvOptions;

#[test]
fn kill_restart_keeps_persistent_and_loses_transient_messages() {
    let run_dir = RunDir::create(std::path::Path::new(env!("CARGO_BIN_EXE_mqlab"))).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let opts = EnvOptions {
            dir: run_dir.path().to_path_buf(),
            ready_timeout: Duration::from_secs(90),
            keep: false,
            amqp_port: None,
            pg_port: None,
            vhosts: vec!["faults".into()],
        };
        let mut env = LocalEnv::start(&opts).await.unwrap();
        let url = env.endpoints.amqp_url("faults");
        let conn = amqp::connect(&url).await.unwrap();
        let ch = conn.create_channel().await.unwrap();
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        ch.queue_declare(
            "durable.q".into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
        for (id, mode) in [("p-1", 2), ("t-1", 1), ("p-2", 2), ("t-2", 1)] {
            ch.basic_publish(
                "".into(),
                "durable.q".into(),
                BasicPublishOptions::default(),
                id.as_bytes(),
                BasicProperties::default()
                    .with_message_id(id.into())
                    .with_delivery_mode(mode),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        }
        assert_eq!(amqp::queue_state(&ch, "durable.q").await.unwrap().0, 4);

        // Paused: the broker accepts TCP (the kernel does) but says nothing.
        env.pause_broker().unwrap();
        let silent = tokio::time::timeout(
            Duration::from_millis(500),
            amqp::broker_version("127.0.0.1", env.endpoints.amqp_port),
        )
        .await;
        assert!(silent.is_err(), "a paused broker answered");
        env.resume_broker().unwrap();
        let version = tokio::time::timeout(
            Duration::from_secs(10),
            amqp::broker_version("127.0.0.1", env.endpoints.amqp_port),
        )
        .await;
        assert!(version.unwrap().unwrap().starts_with("RabbitMQ "));

        env.kill_broker().await.unwrap();
        assert!(
            amqp::connect(&url).await.is_err(),
            "a killed broker accepted a connection"
        );
        env.restart_broker().await.unwrap();

        let conn = amqp::connect(&url).await.unwrap();
        let ch = conn.create_channel().await.unwrap();
        let mut ids = Vec::new();
        while let Some(m) = ch
            .basic_get("durable.q".into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            ids.push(
                m.delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .unwrap()
                    .to_string(),
            );
        }
        assert_eq!(
            ids,
            ["p-1", "p-2"],
            "persistent messages survive, transient ones do not"
        );
        env.stop().await;
    });
    run_dir.close();
}
