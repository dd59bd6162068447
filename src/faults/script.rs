//! A scripted run for the unit tests of the families that act through
//! [`Run`] and [`Stage`] ([`super::broker`], [`super::node`],
//! [`super::pause`]), as [`super::rendezvous::script`] is for the crowd
//! families: each call a family makes is one line of [`Script::log`], in
//! order; the environment is a double whose operations succeed unless the
//! script names one to fail; the proxy's events are the script's. The
//! proxy itself is real (it listens, nothing connects): its armed rule is
//! read back.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

#[cfg(test)]
use super::proxy::Rule;
use super::proxy::{Proxy, ProxyEvent};
use super::{ConsumeStage, Harness, Run, Stage};
use crate::env::{Endpoints, EnvFuture, EnvInfo, Environment};
use crate::transcript::FaultEvent;
use crate::vocab::Status;

type Log = Rc<RefCell<Vec<String>>>;

/// The run a family sees, and what it did to it.
pub struct Script {
    pub log: Log,
    pub proxy: Proxy,
    events: VecDeque<ProxyEvent>,
    env: Double,
    queues: Vec<String>,
    /// What the scripted producer exits with (1: it failed, its connection cut).
    pub exit: i32,
}

impl Script {
    /// A run whose proxy will report `events`, in order, and whose
    /// environment fails the operation named `fail` (`"pause_broker"`...).
    pub async fn new(events: Vec<ProxyEvent>, fail: Option<&'static str>) -> Script {
        let upstream = "127.0.0.1:9".parse().expect("an address");
        let (proxy, _) = Proxy::start(vec![upstream], crate::broker::codec(Default::default()))
            .await
            .expect("the proxy listens");
        let log = Log::default();
        Script {
            log: log.clone(),
            proxy,
            events: events.into(),
            env: Double::new(log, fail),
            queues: vec!["q1".into(), "q2".into()],
            exit: 1,
        }
    }

    fn note(&self, line: String) {
        self.log.borrow_mut().push(line);
    }

    /// The log so far, for an assertion.
    pub fn lines(&self) -> Vec<String> {
        self.log.borrow().clone()
    }
}

/// What a `[fault]` line says, as the script's log has it.
fn said(fault: &FaultEvent) -> String {
    format!("say {} {}", fault.action, fault.status.name())
}

impl Harness for Script {
    fn say(&mut self, fault: &FaultEvent) {
        self.note(said(fault));
    }
    fn env(&mut self) -> Result<&mut (dyn Environment + 'static)> {
        Ok(&mut self.env)
    }
    async fn reconnect_harness(&mut self, restarted: bool) -> Result<()> {
        self.note(format!("reconnect restarted={restarted}"));
        Ok(())
    }
}

impl Run for Script {
    fn proxy(&self) -> &Proxy {
        &self.proxy
    }
    fn vhost(&self) -> &str {
        "v"
    }
    fn quorum_queues(&self) -> Vec<String> {
        self.queues.clone()
    }
    fn node_down(&mut self, n: usize, down: bool) {
        self.note(format!("node_down {n} {down}"));
    }
    fn node_cut(&mut self, n: Option<usize>) {
        self.note(format!("node_cut {n:?}"));
    }
    fn broker_paused(&mut self, paused: bool) {
        self.note(format!("broker_paused {paused}"));
    }
}

impl Stage for Script {
    async fn proxy_event(&mut self) -> Result<ProxyEvent> {
        match self.events.pop_front() {
            Some(e) => Ok(e),
            None => bail!("the deadline passed with no proxy event"),
        }
    }
    fn deadline(&self) -> Instant {
        Instant::now() + Duration::from_secs(10)
    }
    fn start_producer(&mut self, reconnect: bool) -> Result<()> {
        self.note(format!("start_producer reconnect={reconnect}"));
        Ok(())
    }
    async fn producer_until(&mut self, message: &str, status: Status) -> Result<()> {
        self.note(format!("producer_until {message} {status}"));
        Ok(())
    }
    async fn finish_producer(&mut self) -> Result<()> {
        self.note("finish_producer".into());
        Ok(())
    }
    fn start_producer_at(&mut self, f: &crate::lab::Fault) -> Result<()> {
        self.note(format!("start_producer_at {} {}", f.window, f.message));
        Ok(())
    }
    async fn kill_producer_at_window(&mut self, f: &crate::lab::Fault) -> Result<()> {
        self.note(format!(
            "kill_producer_at_window {} {}",
            f.window, f.message
        ));
        Ok(())
    }
    async fn producer_exit(&mut self) -> Result<i32> {
        self.note(format!("producer_exit {}", self.exit));
        Ok(self.exit)
    }
    async fn proxy_effect(&mut self) -> Result<()> {
        let event = self.proxy_event().await?;
        self.note(format!("proxy_effect {event:?}"));
        Ok(())
    }
}

impl ConsumeStage for Script {
    fn start_consumer_at(&mut self, f: &crate::lab::Fault) -> Result<()> {
        self.note(format!("start_consumer_at {} {}", f.window, f.message));
        Ok(())
    }
    async fn consumer_at_window(&mut self, f: &crate::lab::Fault) -> Result<()> {
        self.note(format!("consumer_at_window {} {}", f.window, f.message));
        Ok(())
    }
    async fn await_depth(&mut self, depth: u32) -> Result<()> {
        self.note(format!("await_depth {depth}"));
        Ok(())
    }
    async fn kill_consumer(&mut self, f: &crate::lab::Fault) -> Result<()> {
        self.note(format!("kill_consumer {} {}", f.window, f.message));
        Ok(())
    }
    async fn database_fault(&mut self, fault: crate::vocab::DatabaseFault) -> Result<()> {
        self.note(format!("database_fault {fault:?}"));
        Ok(())
    }
}

/// An environment that says what was asked of it, and fails one operation
/// if told to.
struct Double {
    log: Log,
    fail: Option<&'static str>,
    endpoints: Endpoints,
    info: EnvInfo,
}

impl Double {
    fn new(log: Log, fail: Option<&'static str>) -> Double {
        Double {
            log,
            fail,
            endpoints: Endpoints {
                broker: crate::broker::Addr {
                    broker: crate::vocab::Broker::RabbitMq,
                    host: "127.0.0.1".into(),
                    port: 9,
                    user: "u".into(),
                    password: "p".into(),
                },
                pg_host: "127.0.0.1".into(),
                pg_port: 9,
                pg_user: "u".into(),
                pg_password: None,
                pg_admin: "postgres".into(),
            },
            info: EnvInfo {
                kind: "script",
                broker_version: String::new(),
                broker_source: String::new(),
                db_version: String::new(),
                db_source: String::new(),
                ready: Duration::ZERO,
            },
        }
    }

    /// `op` logged, then its scripted answer.
    fn act<'a>(&self, op: &'static str, arg: String) -> EnvFuture<'a, ()> {
        self.log.borrow_mut().push(format!("env {op}{arg}"));
        let fails = self.fail == Some(op);
        Box::pin(async move {
            if fails {
                bail!("{op} failed (scripted)");
            }
            Ok(())
        })
    }
}

impl Environment for Double {
    fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }
    fn info(&self) -> &EnvInfo {
        &self.info
    }
    fn stop(self: Box<Self>) -> futures_util::future::LocalBoxFuture<'static, ()> {
        Box::pin(async {})
    }
    fn kill_broker(&mut self) -> EnvFuture<'_, ()> {
        self.act("kill_broker", String::new())
    }
    fn restart_broker(&mut self) -> EnvFuture<'_, ()> {
        self.act("restart_broker", String::new())
    }
    fn pause_broker(&self) -> EnvFuture<'_, ()> {
        self.act("pause_broker", String::new())
    }
    fn resume_broker(&self) -> EnvFuture<'_, ()> {
        self.act("resume_broker", String::new())
    }
    fn sync_metadata(&self, n: usize) -> EnvFuture<'_, ()> {
        self.act("sync_metadata", format!(" {n}"))
    }
    fn await_leader<'a>(
        &'a self,
        gone: usize,
        _vhost: &'a str,
        queue: &'a str,
        _deadline: Instant,
    ) -> EnvFuture<'a, ()> {
        self.act("await_leader", format!(" {gone} {queue}"))
    }
    fn kill_node(&mut self, n: usize) -> EnvFuture<'_, ()> {
        self.act("kill_node", format!(" {n}"))
    }
    fn restart_node(&mut self, n: usize) -> EnvFuture<'_, ()> {
        self.act("restart_node", format!(" {n}"))
    }
    fn partition(&mut self, n: usize) -> EnvFuture<'_, ()> {
        self.act("partition", format!(" {n}"))
    }
    fn heal(&mut self) -> EnvFuture<'_, ()> {
        self.act("heal", String::new())
    }
}

/// A family's run on a runtime of its own (the proxy's tasks with it).
pub fn block_on<T>(run: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(run)
}

/// A family's error for a window it never reached: typed
/// [`crate::failure::Failure::Unreachable`] (explore counts the point as
/// never reaching its window), naming the message.
pub fn assert_unreachable(e: &anyhow::Error, message: &str) {
    assert!(
        matches!(
            crate::failure::Failure::of(e),
            crate::failure::Failure::Unreachable(_)
        ),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains(&format!("is unreachable at {message}")),
        "{e}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::{Action, Fault, Lab, Project, Publish};
    use crate::vocab::{FaultAction, NodeFault, Window};

    fn lab(name: &str) -> Lab {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        Project { root }
            .load(name)
            .expect("the project's lab loads")
    }

    /// The first publish step of `name` with a fault, and the fault.
    fn faulted_publish(name: &str) -> (Publish, Fault) {
        lab(name)
            .steps
            .into_iter()
            .find_map(|s| match (s.action, s.fault) {
                (Action::Publish(p), Some(f)) => Some((p, f)),
                _ => None,
            })
            .expect("a faulted publish step")
    }

    fn held(message: &str) -> ProxyEvent {
        ProxyEvent::Held {
            message: message.into(),
        }
    }

    /// A broker restart: said, restarted, the harness connected again
    /// (its topology declared again: `restarted`), then said healed.
    #[test]
    fn broker_restart_in_order() {
        let lines = block_on(async {
            let mut s = Script::new(vec![], None).await;
            super::super::broker::between(&mut s, FaultAction::Restart)
                .await
                .unwrap();
            s.lines()
        });
        assert_eq!(
            lines,
            [
                "say restart injected",
                "env restart_broker",
                "reconnect restarted=true",
                "say restart healed",
            ]
        );
    }

    /// A restart that fails ends the step: no healed line, no reconnect.
    #[test]
    fn a_failed_broker_restart_says_no_healed() {
        let (r, lines) = block_on(async {
            let mut s = Script::new(vec![], Some("restart_broker")).await;
            let r = super::super::broker::between(&mut s, FaultAction::Restart).await;
            (r, s.lines())
        });
        assert!(r.is_err());
        assert_eq!(lines, ["say restart injected", "env restart_broker"]);
    }

    /// Each node fault between steps: what is marked for the restore
    /// after the lab is marked before the environment acts (a kill or a
    /// cut that fails half way is still restored), and unmarked only
    /// after a restart or a heal succeeded. After a kill, each quorum
    /// queue has a leader on another node before the next step.
    #[test]
    fn node_faults_between_steps_mark_before_they_act() {
        let run = |action, fault, fail| {
            block_on(async move {
                let mut s = Script::new(vec![], fail).await;
                let r = super::super::node::between(&mut s, 2, action, fault).await;
                (r.is_ok(), s.lines())
            })
        };
        let (ok, lines) = run(FaultAction::Kill, NodeFault::Kill, None);
        assert!(ok);
        assert_eq!(
            lines,
            [
                "say kill injected",
                "node_down 2 true",
                "env kill_node 2",
                "env await_leader 2 q1",
                "env await_leader 2 q2",
                "reconnect restarted=false"
            ]
        );
        let (ok, lines) = run(FaultAction::Kill, NodeFault::Kill, Some("kill_node"));
        assert!(!ok);
        assert_eq!(
            lines,
            ["say kill injected", "node_down 2 true", "env kill_node 2"]
        );
        let (ok, lines) = run(FaultAction::Restart, NodeFault::Restart, None);
        assert!(ok);
        assert_eq!(
            lines,
            [
                "say restart injected",
                "env restart_node 2",
                "node_down 2 false",
                "reconnect restarted=false",
                "say restart healed"
            ]
        );
        let (ok, lines) = run(
            FaultAction::Restart,
            NodeFault::Restart,
            Some("restart_node"),
        );
        assert!(!ok);
        assert_eq!(lines, ["say restart injected", "env restart_node 2"]);
        let (ok, lines) = run(
            FaultAction::Partition,
            NodeFault::Partition,
            Some("partition"),
        );
        assert!(!ok);
        assert_eq!(
            lines,
            [
                "say partition injected",
                "node_cut Some(2)",
                "env partition 2"
            ]
        );
        let (ok, lines) = run(FaultAction::Heal, NodeFault::Heal, None);
        assert!(ok);
        assert_eq!(
            lines,
            [
                "say heal injected",
                "env heal",
                "node_cut None",
                "reconnect restarted=false",
                "say heal healed"
            ]
        );
    }

    /// broker-pause: the confirm held, then the pause, the producer's
    /// timeout, the resume; the paused mark set before the signal and
    /// cleared after the resume.
    #[test]
    fn broker_pause_on_a_publish_step() {
        let (p, f) = faulted_publish("broker-pause");
        let before = p.message_before(&f.message).expect("a message before");
        let (lines, armed) = block_on(async {
            let mut s = Script::new(vec![held(&f.message)], None).await;
            super::super::pause::on_publish(&mut s, &p, &f)
                .await
                .unwrap();
            (s.lines(), s.proxy.armed())
        });
        assert_eq!(
            lines,
            [
                "start_producer reconnect=false".to_string(),
                format!("producer_until {before} confirmed"),
                "say pause injected".into(),
                "broker_paused true".into(),
                "env pause_broker".into(),
                format!("producer_until {} confirm_timeout", f.message),
                "env resume_broker".into(),
                "broker_paused false".into(),
                "say pause healed".into(),
                "finish_producer".into(),
            ]
        );
        // The hold was armed for the message (and the script's proxy,
        // with nothing connected, never used it).
        assert_eq!(
            armed,
            Some(Rule::HoldConfirm {
                message: f.message.clone()
            })
        );
    }

    /// A pause that fails is resumed all the same, and the step fails.
    #[test]
    fn a_failed_pause_is_resumed() {
        let (p, f) = faulted_publish("broker-pause");
        let (r, lines) = block_on(async {
            let mut s = Script::new(vec![held(&f.message)], Some("pause_broker")).await;
            let r = super::super::pause::on_publish(&mut s, &p, &f).await;
            (r, s.lines())
        });
        assert!(r.is_err());
        let tail: Vec<_> = lines.iter().rev().take(3).rev().cloned().collect();
        assert_eq!(
            tail,
            [
                "env pause_broker",
                "env resume_broker",
                "broker_paused false"
            ]
        );
    }

    /// No held confirm (the proxy saw another message's): no pause at all.
    #[test]
    fn no_pause_without_the_held_confirm() {
        let (p, f) = faulted_publish("broker-pause");
        let (r, lines) = block_on(async {
            let mut s = Script::new(vec![held("mid-999")], None).await;
            let r = super::super::pause::on_publish(&mut s, &p, &f).await;
            (r, s.lines())
        });
        assert!(r.is_err());
        assert!(!lines.iter().any(|l| l.starts_with("env ")), "{lines:?}");
    }

    /// publisher-confirm-failover: the confirm held, the node marked down
    /// before it is killed, the producer's lost connection, a leader
    /// elsewhere for each quorum queue, then the harness moves and the
    /// producer goes on.
    #[test]
    fn node_kill_on_a_publish_step() {
        let (p, f) = faulted_publish("publisher-confirm-failover");
        let node = f.node.expect("a node");
        let before = p.message_before(&f.message).expect("a message before");
        let (lines, armed) = block_on(async {
            let mut s = Script::new(vec![held(&f.message)], None).await;
            super::super::node::kill_on_publish(&mut s, &p, &f)
                .await
                .unwrap();
            (s.lines(), s.proxy.armed())
        });
        assert_eq!(
            armed,
            Some(Rule::HoldConfirm {
                message: f.message.clone()
            })
        );
        assert_eq!(
            lines,
            [
                "start_producer reconnect=true".to_string(),
                format!("producer_until {before} confirmed"),
                "say kill injected".into(),
                format!("node_down {node} true"),
                format!("env kill_node {node}"),
                format!("producer_until {} connection_lost", f.message),
                format!("env await_leader {node} q1"),
                format!("env await_leader {node} q2"),
                "reconnect restarted=false".into(),
                "finish_producer".into(),
            ]
        );
    }

    /// A producer kill on a publish step: the producer started to stop at
    /// the window, then killed there (the runner starts the next one).
    #[test]
    fn producer_kill_on_a_publish_step() {
        let (_, f) = faulted_publish("producer-resend");
        let lines = block_on(async {
            let mut s = Script::new(vec![], None).await;
            super::super::producer::kill_on_publish(&mut s, &f)
                .await
                .unwrap();
            s.lines()
        });
        assert_eq!(
            lines,
            [
                format!("start_producer_at {} {}", f.window, f.message),
                format!("kill_producer_at_window {} {}", f.window, f.message),
            ]
        );
    }

    /// A cut publish: the rule armed, the producer fails, the proxy's
    /// effect said, the gate released; a producer that exits 0 never had
    /// its publish cut: the window was not reached.
    #[test]
    fn cut_publish_on_a_publish_step() {
        let (_, f) = faulted_publish("publish-lost");
        let cut = ProxyEvent::CutPublish {
            message: f.message.clone(),
        };
        let (r, lines, armed) = block_on(async {
            let mut s = Script::new(vec![cut.clone()], None).await;
            let r = super::super::network::cut_publish(&mut s, &f, "p").await;
            (r, s.lines(), s.proxy.armed())
        });
        r.unwrap();
        assert_eq!(
            lines,
            [
                "start_producer reconnect=false".to_string(),
                "producer_exit 1".into(),
                format!("proxy_effect {cut:?}"),
            ]
        );
        // Armed for the producer (a real proxy disarms it as it acts).
        assert_eq!(
            armed,
            Some(Rule::CutOnPublish {
                message: f.message.clone()
            })
        );
        let (r, lines) = block_on(async {
            let mut s = Script::new(vec![], None).await;
            s.exit = 0;
            let r = super::super::network::cut_publish(&mut s, &f, "p").await;
            (r, s.lines())
        });
        let e = r.expect_err("a publish never cut has no verdict");
        assert!(
            matches!(
                crate::failure::Failure::of(&e),
                crate::failure::Failure::Unreachable(_)
            ),
            "{e:#}"
        );
        assert_eq!(lines, ["start_producer reconnect=false", "producer_exit 0"]);
    }

    /// A held confirm: the rule armed for the runner's producer.
    #[test]
    fn hold_confirm_on_a_publish_step() {
        let (_, f) = faulted_publish("confirm-timeout");
        let armed = block_on(async {
            let s = Script::new(vec![], None).await;
            super::super::network::hold_confirm(&s, &f);
            s.proxy.armed()
        });
        assert_eq!(
            armed,
            Some(Rule::HoldConfirm {
                message: f.message.clone()
            })
        );
    }

    /// The first consume step of `run` with a fault, and the fault.
    fn faulted_consume(run: &str) -> Fault {
        lab(run)
            .steps
            .into_iter()
            .find_map(|s| match (s.action, s.fault) {
                (Action::Consume(_), Some(f)) => Some(f),
                _ => None,
            })
            .expect("a faulted consume step")
    }

    /// A consumer kill: started to stop at the window, followed there,
    /// killed; with `kill_at_depth`, killed only once the queue holds it.
    #[test]
    fn consumer_kill_on_a_consume_step() {
        let plain = faulted_consume("consumer-crash");
        let deep = lab("republish-window@ack-then-publish")
            .steps
            .into_iter()
            .filter_map(|s| s.fault)
            .find(|f| f.kill_at_depth.is_some())
            .expect("a kill at a depth");
        for f in [plain, deep] {
            let lines = block_on(async {
                let mut s = Script::new(vec![], None).await;
                super::super::consumer::kill_on_consume(&mut s, &f)
                    .await
                    .unwrap();
                s.lines()
            });
            let at = format!("{} {}", f.window, f.message);
            let mut want = vec![
                format!("start_consumer_at {at}"),
                format!("consumer_at_window {at}"),
            ];
            want.extend(f.kill_at_depth.map(|d| format!("await_depth {d}")));
            want.push(format!("kill_consumer {at}"));
            assert_eq!(lines, want);
        }
    }

    /// A database fault: the consumer started to stop at the window,
    /// followed there, the fault said, the consumer killed, the database
    /// faulted and back, the fault said healed; in that order.
    #[test]
    fn database_fault_on_a_consume_step() {
        use crate::vocab::DatabaseFault;
        for (name, fault, action) in [
            ("commit-durability", DatabaseFault::PowerLoss, "power-loss"),
            ("database-crash", DatabaseFault::Kill, "kill"),
        ] {
            let f = faulted_consume(name);
            let lines = block_on(async {
                let mut s = Script::new(vec![], None).await;
                super::super::database::on_consume(&mut s, &f, fault)
                    .await
                    .unwrap();
                s.lines()
            });
            let at = format!("{} {}", f.window, f.message);
            assert_eq!(
                lines,
                vec![
                    format!("start_consumer_at {at}"),
                    format!("consumer_at_window {at}"),
                    format!("say {action} injected"),
                    format!("kill_consumer {at}"),
                    format!("database_fault {fault:?}"),
                    format!("say {action} healed"),
                ]
            );
        }
    }

    /// A consumer's cut: the rule armed for the consumer the runner starts,
    /// with the ack (connection-drop), or before the COMMIT at the
    /// consumer's round trip there (abandoned-transaction).
    #[test]
    fn a_consumer_cut_on_a_consume_step() {
        let cut = |name| {
            let f = lab(name)
                .steps
                .into_iter()
                .filter_map(|s| s.fault)
                .find(|f| f.action == FaultAction::Cut)
                .expect("a cut");
            (super::super::network::consumer_cut(&f).unwrap(), f)
        };
        let ((rule, point), f) = cut("connection-drop");
        assert_eq!(rule, Rule::CutOnAck { message: f.message });
        assert!(point.is_none());
        let ((rule, point), f) = cut("abandoned-transaction");
        assert_eq!(
            rule,
            Rule::CutOnBarrier {
                message: f.message.clone(),
            }
        );
        let point = point.expect("the consumer's round trip");
        assert!(point.cut && !point.hold);
        assert_eq!(
            (point.window, point.message),
            (Window::BeforeCommit, f.message.clone())
        );
        // Any other window is an error, not the ack's cut.
        let elsewhere = Fault {
            window: Window::AfterAck,
            ..f
        };
        let refused = super::super::network::consumer_cut(&elsewhere).unwrap_err();
        assert!(refused.to_string().contains("after-ack"), "{refused}");
    }
}
