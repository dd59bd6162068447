//! The harness's AMQP 0-9-1 proxy: every role connects to the broker through
//! it (127.0.0.1 only). It forwards the original bytes, frame by frame,
//! reading each frame with `amq-protocol` to follow one message: the
//! deliveries and the acks of a consumer, the publishes and the confirms of a
//! producer. An armed [`Rule`] acts on one message's frame, once:
//!
//! - [`Rule::CutOnAck`]: the consumer's ack of that message is dropped and
//!   the connection closed on both sides; the broker never hears the ack and
//!   requeues the message. New connections then wait at a gate until the
//!   harness [`Proxy::release`]s them, once the broker has dropped the old one.
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

use amq_protocol::frame::{parse_frame, AMQPFrame};
use amq_protocol::protocol::{basic, channel, confirm, AMQPClass};
use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::blackbox::{BlackBox, Pass};

/// What the proxy does to one message's frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rule {
    CutOnAck { message: String },
    CutOnPublish { message: String },
    HoldConfirm { message: String },
}

/// What the proxy did, for the runner's transcript.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProxyEvent {
    /// The ack of `message` was dropped and its connection closed.
    Cut { message: String },
    /// The publish of `message` was dropped and its connection closed.
    CutPublish { message: String },
    /// The broker's confirm of `message` was held back.
    Held { message: String },
}

struct Shared {
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
        Ok(Proxy::start(self.shared.upstreams.clone()).await?.0)
    }

    /// Reports a program's deliveries and acks to `bb` (None: stop).
    pub fn watch(&self, bb: Option<Arc<Mutex<BlackBox>>>) {
        *self.shared.blackbox.lock().expect("proxy black box") = bb;
    }
}

/// What one connection's frames have said so far.
#[derive(Default)]
struct Conn {
    /// A Deliver waits for its content header: channel → (delivery tag, redelivered).
    deliver_pending: HashMap<u16, (u64, bool)>,
    /// Body bytes still to come for the content in progress, per channel
    /// (a frozen connection still finishes a delivery it let through).
    body_left: HashMap<u16, u64>,
    /// (channel, delivery tag) → message id.
    deliveries: HashMap<(u16, u64), String>,
    /// Channels in confirm mode → publishes so far (the confirm's delivery tag).
    confirm_seq: HashMap<u16, u64>,
    /// A publish waits for its content header: channel → sequence number.
    publish_pending: HashMap<u16, u64>,
    /// (channel, publish sequence number) → message id.
    published: HashMap<(u16, u64), String>,
    /// A Basic.Publish held back until its header says which message it is.
    stashed: HashMap<u16, Vec<u8>>,
    /// Channels whose consumer asked for autoAck (Basic.Consume no-ack).
    no_ack: std::collections::HashSet<u16>,
}

impl Conn {
    fn channel_opened(&mut self, ch: u16) {
        self.deliver_pending.remove(&ch);
        self.publish_pending.remove(&ch);
        self.confirm_seq.remove(&ch);
        self.deliveries.retain(|(c, _), _| *c != ch);
        self.published.retain(|(c, _), _| *c != ch);
        self.stashed.remove(&ch);
        self.no_ack.remove(&ch);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    ToBroker,
    ToClient,
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
    let conn = Arc::new(Mutex::new(Conn::default()));
    // Either direction ending (EOF, an error, a cut) ends the connection:
    // dropping both halves of both sockets closes them.
    tokio::select! {
        _ = pump(Dir::ToBroker, cr, uw, conn.clone(), shared.clone()) => {}
        _ = pump(Dir::ToClient, ur, cw, conn, shared.clone()) => {}
    }
}

/// Copies frames from `from` to `to`, deciding for each.
async fn pump(
    dir: Dir,
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    conn: Arc<Mutex<Conn>>,
    shared: Arc<Shared>,
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
                && is_deliver(frame)
                && bb
                    .as_ref()
                    .is_some_and(|b| b.lock().expect("black box").holds_next_delivery());
            if held {
                break;
            }
            let frame = pending.pop_front().expect("a pending frame");
            match judge(dir, &frame, &conn, &shared) {
                Verdict::Forward => out.extend_from_slice(&frame),
                Verdict::Drop => {}
                Verdict::Stash(ch) => {
                    conn.lock()
                        .expect("proxy connection state")
                        .stashed
                        .insert(ch, frame);
                }
                Verdict::Release(ch) => {
                    if let Some(held) = conn
                        .lock()
                        .expect("proxy connection state")
                        .stashed
                        .remove(&ch)
                    {
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
                while let Some(len) = frame_len(&buf[used..]) {
                    pending.push_back(buf[used..used + len].to_vec());
                    used += len;
                }
                buf.drain(..used);
            }
            _ = async { release.expect("checked").notified().await }, if release.is_some() && !pending.is_empty() => {}
        }
    }
}

/// A Basic.Deliver method frame (class 60, method 60).
fn is_deliver(frame: &[u8]) -> bool {
    frame.len() > 11 && frame[0] == 1 && frame[7..11] == [0, 60, 0, 60]
}

/// The length of the first complete frame in `buf` (the 8-byte protocol
/// header counts as one), or None when more bytes are needed.
fn frame_len(buf: &[u8]) -> Option<usize> {
    match buf.first()? {
        b'A' => (buf.len() >= 8).then_some(8),
        _ if buf.len() < 7 => None,
        _ => {
            let size = u32::from_be_bytes([buf[3], buf[4], buf[5], buf[6]]) as usize;
            let len = 7 + size + 1;
            (buf.len() >= len).then_some(len)
        }
    }
}

/// Reads one frame's meaning (bodies are never parsed) and applies the rule.
/// Long because it is one match, an arm per (direction, frame kind) the
/// proxy follows; each arm is a few lines.
fn judge(dir: Dir, frame: &[u8], conn: &Mutex<Conn>, shared: &Shared) -> Verdict {
    let bb = shared.blackbox.lock().expect("proxy black box").clone();
    let frozen = bb
        .as_ref()
        .is_some_and(|b| b.lock().expect("black box").frozen());
    if frame.first() == Some(&3) {
        // A body frame: it finishes the content in progress on its channel.
        let ch = u16::from_be_bytes([frame[1], frame[2]]);
        let mut c = conn.lock().expect("proxy connection state");
        let left = c.body_left.get(&ch).copied().unwrap_or(0);
        let size = (frame.len() - 8) as u64;
        c.body_left.insert(ch, left.saturating_sub(size));
        return if frozen && left == 0 {
            Verdict::Drop
        } else {
            Verdict::Forward
        };
    }
    if frozen {
        return Verdict::Drop;
    }
    let Ok((_, parsed)) = parse_frame(frame) else {
        return Verdict::Forward;
    };
    let mut c = conn.lock().expect("proxy connection state");
    let mut rule = shared.rule.lock().expect("proxy rule");
    if let AMQPFrame::Header(ch, h) = &parsed {
        c.body_left.insert(*ch, h.body_size);
    }
    match (dir, parsed) {
        (
            Dir::ToBroker,
            AMQPFrame::Method(ch, AMQPClass::Channel(channel::AMQPMethod::Open(_))),
        ) => c.channel_opened(ch),
        (
            Dir::ToBroker,
            AMQPFrame::Method(ch, AMQPClass::Confirm(confirm::AMQPMethod::Select(_))),
        ) => {
            c.confirm_seq.insert(ch, 0);
        }
        (Dir::ToBroker, AMQPFrame::Method(ch, AMQPClass::Basic(basic::AMQPMethod::Publish(_)))) => {
            let seq = c.confirm_seq.get(&ch).map_or(0, |s| s + 1);
            if let Some(s) = c.confirm_seq.get_mut(&ch) {
                *s = seq;
            }
            c.publish_pending.insert(ch, seq);
            if matches!(rule.as_ref(), Some(Rule::CutOnPublish { .. })) {
                return Verdict::Stash(ch);
            }
        }
        (Dir::ToBroker, AMQPFrame::Header(ch, h)) => {
            if let Some(seq) = c.publish_pending.remove(&ch) {
                let mid = h
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                if let Some(Rule::CutOnPublish { message }) = rule.as_ref() {
                    if *message == mid {
                        let _ = shared.events.send(ProxyEvent::CutPublish {
                            message: message.clone(),
                        });
                        *rule = None;
                        shared.gate.send_replace(false);
                        return Verdict::Cut;
                    }
                }
                c.published.insert((ch, seq), mid);
                if c.stashed.contains_key(&ch) {
                    return Verdict::Release(ch);
                }
            }
        }
        (
            Dir::ToBroker,
            AMQPFrame::Method(ch, AMQPClass::Basic(basic::AMQPMethod::Consume(consume))),
        ) => {
            if consume.no_ack {
                c.no_ack.insert(ch);
            }
            if let Some(b) = &bb {
                b.lock().expect("black box").on_consume(consume.no_ack);
            }
        }
        (Dir::ToBroker, AMQPFrame::Method(ch, AMQPClass::Basic(basic::AMQPMethod::Ack(a)))) => {
            let acked = c.deliveries.get(&(ch, a.delivery_tag));
            if let (Some(b), Some(mid)) = (&bb, acked) {
                if b.lock().expect("black box").on_ack(mid) == Pass::Hold {
                    return Verdict::Drop;
                }
            }
            if let (Some(Rule::CutOnAck { message }), Some(mid)) = (rule.as_ref(), acked) {
                if message == mid {
                    let _ = shared.events.send(ProxyEvent::Cut {
                        message: message.clone(),
                    });
                    *rule = None;
                    shared.gate.send_replace(false);
                    return Verdict::Cut;
                }
            }
        }
        (Dir::ToClient, AMQPFrame::Method(ch, AMQPClass::Basic(basic::AMQPMethod::Deliver(d)))) => {
            c.deliver_pending
                .insert(ch, (d.delivery_tag, d.redelivered));
        }
        (Dir::ToClient, AMQPFrame::Header(ch, h)) => {
            if let Some((tag, redelivered)) = c.deliver_pending.remove(&ch) {
                let mid = h
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                if let Some(b) = &bb {
                    let auto_ack = c.no_ack.contains(&ch);
                    b.lock()
                        .expect("black box")
                        .on_deliver(&mid, redelivered, auto_ack);
                }
                c.deliveries.insert((ch, tag), mid);
            }
        }
        (Dir::ToClient, AMQPFrame::Method(ch, AMQPClass::Basic(basic::AMQPMethod::Ack(a)))) => {
            if let Some(Rule::HoldConfirm { message }) = rule.as_ref() {
                // The confirm (or a `multiple` one covering it) of the held publish.
                let covers = c.published.iter().any(|((pc, seq), mid)| {
                    *pc == ch
                        && mid == message
                        && (*seq == a.delivery_tag || (a.multiple && *seq <= a.delivery_tag))
                });
                if covers {
                    let _ = shared.events.send(ProxyEvent::Held {
                        message: message.clone(),
                    });
                    *rule = None;
                    return Verdict::Drop;
                }
            }
        }
        _ => {}
    }
    Verdict::Forward
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_cut_at_their_length() {
        assert_eq!(frame_len(b"AMQP\x00\x00\x09\x01rest"), Some(8));
        assert_eq!(frame_len(b"AMQP\x00"), None);
        // a heartbeat: type 8, channel 0, size 0, frame end
        assert_eq!(frame_len(&[8, 0, 0, 0, 0, 0, 0, 0xCE, 1]), Some(8));
        assert_eq!(frame_len(&[1, 0, 1, 0, 0, 0, 4, 0, 0]), None);
    }
}
