//! The harness's proxy between the roles and the broker: every role
//! connects to the broker through it (127.0.0.1 only). It forwards the
//! original bytes, frame by frame, reading each frame's meaning through the
//! broker's [`Codec`] (one per connection) to follow one message: the
//! deliveries and the acks of a consumer, the publishes and the confirms of a
//! producer. An armed [`Rule`] acts once, on one message's frame or on the
//! consumer's round trip that follows its delivery:
//!
//! - [`Rule::CutOnAck`]: the consumer's ack of that message is dropped and
//!   the connection closed on both sides; the broker never hears the ack and
//!   requeues the message. New connections then wait at a gate until the
//!   harness [`Proxy::release`]s them, once the broker has dropped the old one.
//! - [`Rule::CutOnBarrier`]: the consumer's round trip (a basic.qos) on the
//!   connection that message reached, made at its window before its COMMIT,
//!   is dropped and the connection closed, the gate shut as for the ack:
//!   the consumer learns of the loss with its transaction open.
//! - [`Rule::CutOnPublish`]: the producer's publish of that message (its
//!   method and header frames) is dropped and the connection closed; the
//!   broker never gets the message.
//! - [`Rule::HoldConfirm`]: the broker's confirm of that publish is never
//!   passed on; the producer times out, or (a cluster's node killed at the
//!   producer's window) loses its connection first. [`Proxy::hold_new`]
//!   then keeps new connections at the gate until the harness releases them.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::blackbox::{BlackBox, Pass};
use crate::broker::{Codec, Direction as Dir, Frame, Settle};

/// What the proxy does to one message's frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rule {
    CutOnAck {
        message: String,
    },
    /// The consumer's first basic.qos on the connection `message` was
    /// delivered on (its round trip at its window): dropped, and that
    /// connection cut.
    CutOnBarrier {
        message: String,
    },
    CutOnPublish {
        message: String,
    },
    HoldConfirm {
        message: String,
    },
}

/// What the proxy did, for the runner's transcript.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProxyEvent {
    /// The ack of `message` was dropped and its connection closed.
    Cut { message: String },
    /// The consumer's round trip after `message` was delivered was dropped
    /// and its connection closed: its transaction was open.
    CutBarrier { message: String },
    /// The publish of `message` was dropped and its connection closed.
    CutPublish { message: String },
    /// The broker's confirm of `message` was held back.
    Held { message: String },
}

struct Shared {
    /// A codec for each new connection: the broker's wire protocol.
    codec: fn() -> Box<dyn Codec>,
    /// The broker's nodes: one listener each, trying its own node first,
    /// then the others in order (a client of a killed node reconnects to a
    /// live one, as a client with a list of hosts would).
    upstreams: Vec<SocketAddr>,
    rule: Mutex<Option<Rule>>,
    /// For a program mqlab did not write: its deliveries and acks go to the
    /// black box, which may hold an ack or freeze the connection.
    blackbox: Mutex<Option<Arc<Mutex<BlackBox>>>>,
    /// `true`: new connections go through; `false`: they wait.
    gate: watch::Sender<bool>,
    events: mpsc::UnboundedSender<ProxyEvent>,
}

/// Aborting a task drops its handles, not the tasks they name: this aborts them.
struct AbortAll(Vec<JoinHandle<()>>);

impl Drop for AbortAll {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

pub struct Proxy {
    /// Node 1's listener.
    pub port: u16,
    /// One listener per node, node 1 first.
    pub ports: Vec<u16>,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Proxy {
    /// Listens on a free 127.0.0.1 port per upstream node.
    pub async fn start(
        upstreams: Vec<SocketAddr>,
        codec: fn() -> Box<dyn Codec>,
    ) -> Result<(Proxy, mpsc::UnboundedReceiver<ProxyEvent>)> {
        let mut listeners = Vec::new();
        for _ in &upstreams {
            listeners.push(
                TcpListener::bind("127.0.0.1:0")
                    .await
                    .context("the AMQP proxy cannot listen on 127.0.0.1")?,
            );
        }
        let ports = listeners
            .iter()
            .map(|l| Ok(l.local_addr()?.port()))
            .collect::<Result<Vec<u16>>>()?;
        let (events, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            codec,
            upstreams,
            rule: Mutex::new(None),
            blackbox: Mutex::new(None),
            gate: watch::Sender::new(true),
            events,
        });
        let s = shared.clone();
        let accept = tokio::spawn(async move {
            let mut accepting = AbortAll(Vec::new());
            for (node, listener) in listeners.into_iter().enumerate() {
                let s = s.clone();
                accepting.0.push(tokio::spawn(async move {
                    // The connections go with their listener's task.
                    let mut conns = AbortAll(Vec::new());
                    while let Ok((client, _)) = listener.accept().await {
                        conns.0.retain(|c| !c.is_finished());
                        conns.0.push(tokio::spawn(serve(s.clone(), client, node)));
                    }
                }));
            }
            std::future::pending::<()>().await;
            drop(accepting);
        });
        Ok((
            Proxy {
                port: ports[0],
                ports,
                shared,
                accept,
            },
            rx,
        ))
    }

    /// Arms a rule: it acts on the first matching frame, then disarms itself.
    pub fn arm(&self, rule: Rule) {
        *self.shared.rule.lock().expect("proxy rule") = Some(rule);
    }

    /// The armed rule that has not acted (yet).
    pub fn armed(&self) -> Option<Rule> {
        self.shared.rule.lock().expect("proxy rule").clone()
    }

    pub fn disarm(&self) {
        *self.shared.rule.lock().expect("proxy rule") = None;
    }

    /// New connections wait at the gate until [`Proxy::release`].
    pub fn hold_new(&self) {
        self.shared.gate.send_replace(false);
    }

    /// Lets connections that wait at the gate through.
    pub fn release(&self) {
        self.shared.gate.send_replace(true);
    }

    /// Another proxy to the same nodes, with no rule: one instance of a
    /// program each, so that each one's frames reach its own black box.
    pub async fn sibling(&self) -> Result<Proxy> {
        Ok(
            Proxy::start(self.shared.upstreams.clone(), self.shared.codec)
                .await?
                .0,
        )
    }

    /// Reports a program's deliveries and acks to `bb` (None: stop).
    pub fn watch(&self, bb: Option<Arc<Mutex<BlackBox>>>) {
        *self.shared.blackbox.lock().expect("proxy black box") = bb;
    }
}

/// What the proxy holds of one connection besides its codec's state.
#[derive(Default)]
struct Held {
    /// A publish's first frames held back until a later one says which
    /// message it is (a publish to cut is dropped whole).
    stashed: HashMap<u16, Vec<u8>>,
    /// The message of a [`Rule::CutOnBarrier`] delivered on this
    /// connection: its next basic.qos is the one to cut while that rule is
    /// armed (named, so that a later rule's message is not taken for it).
    barrier_for: Option<String>,
}

enum Verdict {
    Forward,
    Drop,
    /// Hold the frame back until the next one on its channel decides.
    Stash(u16),
    /// Forward what was held back on this channel, then this frame.
    Release(u16),
    Cut,
}

async fn serve(shared: Arc<Shared>, client: TcpStream, node: usize) {
    let mut gate = shared.gate.subscribe();
    while !*gate.borrow_and_update() {
        if gate.changed().await.is_err() {
            return;
        }
    }
    // Its own node first, then the others.
    let order = std::iter::once(node).chain((0..shared.upstreams.len()).filter(|n| *n != node));
    let mut upstream = None;
    for n in order {
        if let Ok(s) = TcpStream::connect(shared.upstreams[n]).await {
            upstream = Some(s);
            break;
        }
    }
    let Some(upstream) = upstream else {
        return; // every node is down: the client sees its connection close
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (ur, uw) = upstream.into_split();
    let conn = Arc::new(Mutex::new(((shared.codec)(), Held::default())));
    let id = super::blackbox::connection_id();
    // Either direction ending (EOF, an error, a cut) ends the connection:
    // dropping both halves of both sockets closes them.
    tokio::select! {
        _ = pump(Dir::ToBroker, cr, uw, conn.clone(), shared.clone(), id) => {}
        _ = pump(Dir::ToClient, ur, cw, conn, shared.clone(), id) => {}
    }
    // A delivery this connection held for a transaction's end will not pass
    // now: whoever waits for it (the PostgreSQL proxy) goes on.
    if let Some(b) = shared.blackbox.lock().expect("proxy black box").clone() {
        b.lock().expect("black box").delivery_gone(id);
    }
}

/// One connection's codec and what the proxy holds of it.
type Conn = (Box<dyn Codec>, Held);

/// Copies frames from `from` to `to`, deciding for each.
async fn pump(
    dir: Dir,
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    conn: Arc<Mutex<Conn>>,
    shared: Arc<Shared>,
    id: u64,
) {
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    // Complete frames not judged yet: a black box may hold a delivery (and
    // so everything after it) until the program ended its last transaction.
    let mut pending: VecDeque<Vec<u8>> = VecDeque::new();
    loop {
        let bb = shared.blackbox.lock().expect("proxy black box").clone();
        let mut out: Vec<u8> = Vec::new();
        while let Some(frame) = pending.front() {
            let held = dir == Dir::ToClient
                && state(&conn).0.begins_delivery(frame)
                && bb
                    .as_ref()
                    .is_some_and(|b| b.lock().expect("black box").holds_next_delivery());
            if held {
                if let Some(b) = &bb {
                    b.lock().expect("black box").hold_delivery(id);
                }
                break;
            }
            let frame = pending.pop_front().expect("a pending frame");
            let verdict = judge(dir, &frame, &mut state(&conn), &shared);
            match verdict {
                Verdict::Forward => out.extend_from_slice(&frame),
                Verdict::Drop => {}
                Verdict::Stash(ch) => {
                    state(&conn).1.stashed.insert(ch, frame);
                }
                Verdict::Release(ch) => {
                    if let Some(held) = state(&conn).1.stashed.remove(&ch) {
                        out.extend_from_slice(&held);
                    }
                    out.extend_from_slice(&frame);
                }
                Verdict::Cut => {
                    let _ = to.write_all(&out).await;
                    return;
                }
            }
        }
        if !out.is_empty() && to.write_all(&out).await.is_err() {
            return;
        }
        let release = bb.map(|b| b.lock().expect("black box").release.clone());
        tokio::select! {
            n = from.read(&mut chunk) => {
                let n = match n {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                buf.extend_from_slice(&chunk[..n]);
                let mut used = 0;
                let codec = state(&conn);
                while let Some(len) = codec.0.frame_len(&buf[used..]) {
                    pending.push_back(buf[used..used + len].to_vec());
                    used += len;
                }
                drop(codec);
                buf.drain(..used);
            }
            _ = async { release.expect("checked").notified().await }, if release.is_some() && !pending.is_empty() => {}
        }
    }
}

fn state(conn: &Mutex<Conn>) -> std::sync::MutexGuard<'_, Conn> {
    conn.lock().expect("proxy connection state")
}

/// Reads one frame's meaning through the connection's codec and applies
/// the armed rule and the black box's hooks. A frozen connection passes
/// the content in progress to its end and nothing else, unread. Long
/// because it is one match, an arm per kind of frame a rule or hook acts
/// on; each arm is a few lines.
fn judge(dir: Dir, frame: &[u8], conn: &mut Conn, shared: &Shared) -> Verdict {
    let (codec, held) = conn;
    let bb = shared.blackbox.lock().expect("proxy black box").clone();
    let frozen = bb
        .as_ref()
        .is_some_and(|b| b.lock().expect("black box").frozen());
    if let Some(in_progress) = codec.content(frame) {
        return match frozen && !in_progress {
            true => Verdict::Drop,
            false => Verdict::Forward,
        };
    }
    if frozen {
        return Verdict::Drop;
    }
    let read = codec.read(dir, frame);
    let mut rule = shared.rule.lock().expect("proxy rule");
    match read {
        Frame::PublishBegins { channel } => {
            if matches!(rule.as_ref(), Some(Rule::CutOnPublish { .. })) {
                return Verdict::Stash(channel);
            }
        }
        Frame::Published { channel, message } => {
            if let Some(Rule::CutOnPublish { message: cut }) = rule.as_ref() {
                if *cut == message {
                    let _ = shared.events.send(ProxyEvent::CutPublish { message });
                    *rule = None;
                    shared.gate.send_replace(false);
                    return Verdict::Cut;
                }
            }
            if held.stashed.contains_key(&channel) {
                return Verdict::Release(channel);
            }
        }
        Frame::Consume { no_ack } => {
            if let Some(b) = &bb {
                b.lock().expect("black box").on_consume(no_ack);
            }
        }
        // An ack, of one delivery or (`multiple`) of a batch: the black box
        // follows the messages it covers (held, the broker sees none of the
        // batch); the cut, the ack that covers its message.
        Frame::Settled {
            covers,
            how: Settle::Ack,
            ..
        } => {
            if let Some(b) = &bb {
                if b.lock().expect("black box").on_acks(&covers) == Pass::Hold {
                    return Verdict::Drop;
                }
            }
            if let Some(Rule::CutOnAck { message: cut }) = rule.as_ref() {
                if covers.contains(cut) {
                    let message = cut.clone();
                    let _ = shared.events.send(ProxyEvent::Cut { message });
                    *rule = None;
                    shared.gate.send_replace(false);
                    return Verdict::Cut;
                }
            }
        }
        Frame::Delivered {
            message,
            redelivered,
            auto_ack,
        } => {
            if let Some(b) = &bb {
                b.lock()
                    .expect("black box")
                    .on_deliver(&message, redelivered, auto_ack);
            }
            if let Some(Rule::CutOnBarrier { message: cut }) = rule.as_ref() {
                if *cut == message {
                    held.barrier_for = Some(message);
                }
            }
        }
        // The consumer's round trip at its window, on the connection the
        // message reached (a reconnect's own basic.qos comes on another).
        Frame::Qos { .. } => {
            if let Some(Rule::CutOnBarrier { message }) = rule.as_ref() {
                if held.barrier_for.as_ref() != Some(message) {
                    return Verdict::Forward;
                }
                let message = message.clone();
                let _ = shared.events.send(ProxyEvent::CutBarrier { message });
                *rule = None;
                shared.gate.send_replace(false);
                return Verdict::Cut;
            }
        }
        // The confirm (or a `multiple` one covering it) of the held publish.
        Frame::Confirmed { covers, ack: true } => {
            if let Some(Rule::HoldConfirm { message }) = rule.as_ref() {
                if covers.contains(message) {
                    let _ = shared.events.send(ProxyEvent::Held {
                        message: message.clone(),
                    });
                    *rule = None;
                    return Verdict::Drop;
                }
            }
        }
        // Kept for the program's failure, which it explains.
        Frame::Refused { text, topology } => {
            if let Some(b) = &bb {
                b.lock().expect("black box").on_refused(text, topology);
            }
        }
        Frame::Settled { .. } | Frame::Confirmed { .. } | Frame::Other => {}
    }
    Verdict::Forward
}
