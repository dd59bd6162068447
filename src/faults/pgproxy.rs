//! A PostgreSQL wire-protocol proxy for a program mqlab did not write: it
//! forwards the original bytes, message by message, and reads just enough
//! of them to see a transaction's `COMMIT` (sent as a simple query, or
//! parsed as an extended-protocol statement) and the server's answer to it
//! (`CommandComplete` with tag `COMMIT`, or `ROLLBACK` for a failed
//! transaction). Those go to the [`BlackBox`], which may hold the `COMMIT`
//! or freeze the connection (frames dropped: the kill comes), or pause it
//! (frames held both ways, passed in order when the black box resumes).

use std::time::Duration;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::blackbox::{BlackBox, Pass};

pub struct PgProxy {
    pub port: u16,
    accept: JoinHandle<()>,
}

impl Drop for PgProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl PgProxy {
    /// Listens on a free 127.0.0.1 port, forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr, bb: Arc<Mutex<BlackBox>>) -> Result<PgProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("the PostgreSQL proxy cannot listen on 127.0.0.1")?;
        let port = listener.local_addr()?.port();
        let accept = tokio::spawn(async move {
            let mut conns: Vec<JoinHandle<()>> = Vec::new();
            while let Ok((client, _)) = listener.accept().await {
                conns.retain(|c| !c.is_finished());
                conns.push(tokio::spawn(serve(upstream, client, bb.clone())));
            }
        });
        Ok(PgProxy { port, accept })
    }
}

async fn serve(upstream: SocketAddr, client: TcpStream, bb: Arc<Mutex<BlackBox>>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    // The client's requests for an SSL or GSS session are answered by the
    // server with one untyped byte: the server side must know to expect it.
    let untyped_answers = Arc::new(Mutex::new(0usize));
    let id = super::blackbox::connection_id();
    tokio::select! {
        _ = client_to_server(cr, sw, bb.clone(), untyped_answers.clone()) => {}
        _ = server_to_client(sr, cw, bb.clone(), untyped_answers, id) => {}
    }
    bb.lock().expect("black box").db_connection_closed(id);
}

const SSL_REQUEST: u32 = 80877103;
const GSSENC_REQUEST: u32 = 80877104;

/// The length of the whole message at the start of `rest`, once all of it
/// has arrived: a type byte and a length after the startup message, a
/// length alone before it (the startup message, SSL and GSS requests).
fn frame_len(rest: &[u8], started: bool) -> Option<usize> {
    let len = match started {
        true if rest.len() >= 5 => {
            1 + u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize
        }
        false if rest.len() >= 8 => {
            u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize
        }
        _ => return None,
    };
    (rest.len() >= len).then_some(len)
}

async fn client_to_server(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    bb: Arc<Mutex<BlackBox>>,
    untyped_answers: Arc<Mutex<usize>>,
) {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut changes = bb.lock().expect("black box").paused_changes();
    // Before the startup message, messages have no type byte.
    let mut started = false;
    // Frozen (the kill comes): nothing passes any more, ever.
    let mut dropping = false;
    // Paused (a rendezvous): what came since, passed on resume, in order.
    let mut held: Vec<u8> = Vec::new();
    loop {
        tokio::select! {
            n = from.read(&mut chunk) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            },
            changed = changes.changed(), if !held.is_empty() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        let mut out = Vec::new();
        let mut used = 0;
        while let Some(len) = frame_len(&buf[used..], started) {
            let msg = &buf[used..used + len];
            used += len;
            if !started {
                let code = u32::from_be_bytes([msg[4], msg[5], msg[6], msg[7]]);
                if code == SSL_REQUEST || code == GSSENC_REQUEST {
                    *untyped_answers.lock().expect("pg proxy state") += 1;
                } else {
                    started = true;
                }
                out.extend_from_slice(msg);
                continue;
            }
            if dropping {
                continue;
            }
            let mut b = bb.lock().expect("black box");
            if held.is_empty() && is_statement(msg) {
                b.on_statement();
            }
            // Behind a held frame, every later one waits too (order).
            let pass = match held.is_empty() && is_commit(msg) {
                true => b.on_commit_request(),
                false => Pass::Forward,
            };
            if b.frozen() {
                dropping = true;
            } else if pass == Pass::Hold || b.paused() || !held.is_empty() {
                held.extend_from_slice(msg);
            } else {
                out.extend_from_slice(msg);
            }
        }
        buf.drain(..used);
        if !held.is_empty() && !bb.lock().expect("black box").paused() && !dropping {
            out.append(&mut held);
        }
        if !out.is_empty() && to.write_all(&out).await.is_err() {
            return;
        }
    }
}

async fn server_to_client(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    bb: Arc<Mutex<BlackBox>>,
    untyped_answers: Arc<Mutex<usize>>,
    id: u64,
) {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut changes = bb.lock().expect("black box").paused_changes();
    // Paused (a rendezvous): the server's answers, passed on resume, each
    // seen by the black box as it passes (when the program can read it).
    let mut held: Vec<Vec<u8>> = Vec::new();
    loop {
        tokio::select! {
            n = from.read(&mut chunk) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            },
            changed = changes.changed(), if !held.is_empty() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        let mut used = 0;
        loop {
            let rest = &buf[used..];
            if rest.is_empty() {
                break;
            }
            let len = {
                let mut pending = untyped_answers.lock().expect("pg proxy state");
                if *pending > 0 {
                    *pending -= 1;
                    1
                } else if rest.len() < 5 {
                    break;
                } else {
                    1 + u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize
                }
            };
            if rest.len() < len {
                break;
            }
            held.push(rest[..len].to_vec());
            used += len;
        }
        buf.drain(..used);
        let mut out = Vec::new();
        let mut ended = false;
        let held_delivery = {
            let mut b = bb.lock().expect("black box");
            if !b.paused() || b.frozen() {
                for msg in held.drain(..) {
                    ended |= answered(&mut b, &msg, id);
                    // Frozen (the kill comes): the program hears nothing more.
                    if !b.frozen() {
                        out.extend_from_slice(&msg);
                    }
                }
            }
            b.deliveries()
        };
        // A transaction ended and freed a delivery the AMQP proxy held: the
        // program hears the end once that delivery has passed to it.
        // (Bounded: a delivery neither passed nor gone in 10 s, which no
        // run showed, costs the transcript's order, not the run.)
        if let (true, false, Some((seen, mut passed))) = (ended, out.is_empty(), held_delivery) {
            let wait = passed.wait_for(|n| *n > seen);
            let _ = tokio::time::timeout(Duration::from_secs(10), wait).await;
        }
        if !out.is_empty() && to.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// The server's answer `msg` on connection `id` as the black box sees it:
/// whether it ends a transaction. A ReadyForQuery says whether one is open.
fn answered(b: &mut BlackBox, msg: &[u8], id: u64) -> bool {
    if msg.len() == 6 && msg[0] == b'Z' {
        b.on_ready(id, msg[5] != b'I');
    }
    if msg.len() > 1 && msg[0] == b'C' {
        match command_tag(msg) {
            Some("COMMIT") => {
                b.on_commit_done(true);
                b.on_tx_end();
                return true;
            }
            // A ROLLBACK, or the answer to a COMMIT of a failed transaction.
            Some("ROLLBACK") => {
                b.on_commit_done(false);
                b.on_tx_end();
                return true;
            }
            _ => {}
        }
    }
    false
}

/// The SQL of a client message that carries one, upper-cased and trimmed:
/// a simple query, or an extended-protocol Parse (statement name \0,
/// query \0, ...).
fn sql_of(msg: &[u8]) -> Option<String> {
    let sql = match msg.first() {
        Some(b'Q') => &msg[5..],
        Some(b'P') => {
            let body = &msg[5..];
            let name_end = body.iter().position(|b| *b == 0)?;
            &body[name_end + 1..]
        }
        _ => return None,
    };
    let sql = sql.split(|b| *b == 0).next().unwrap_or_default();
    Some(String::from_utf8_lossy(sql).trim().to_ascii_uppercase())
}

/// A client message that commits: a simple query `COMMIT` / `END` (with or
/// without `TRANSACTION`/`WORK`, a `;`), or an extended-protocol Parse of one.
fn is_commit(msg: &[u8]) -> bool {
    let Some(sql) = sql_of(msg) else {
        return false;
    };
    let words: Vec<&str> = sql.trim_end_matches(';').split_whitespace().collect();
    matches!(
        words.as_slice(),
        ["COMMIT"] | ["END"] | ["COMMIT", "TRANSACTION" | "WORK"] | ["END", "TRANSACTION" | "WORK"]
    )
}

/// A client message that runs SQL (a simple query, a parse or a bind), but
/// a `ROLLBACK`, which a program may send with nothing to roll back.
fn is_statement(msg: &[u8]) -> bool {
    match msg.first() {
        Some(b'B') => true,
        _ => sql_of(msg).is_some_and(|sql| !sql.starts_with("ROLLBACK")),
    }
}

/// The tag of a CommandComplete message (`COMMIT`, `INSERT 0 1`, ...).
fn command_tag(msg: &[u8]) -> Option<&str> {
    let body = msg.get(5..)?;
    let end = body.iter().position(|b| *b == 0)?;
    std::str::from_utf8(&body[..end]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(sql: &str) -> Vec<u8> {
        let mut m = vec![b'Q'];
        m.extend_from_slice(&((4 + sql.len() + 1) as u32).to_be_bytes());
        m.extend_from_slice(sql.as_bytes());
        m.push(0);
        m
    }

    fn parse(name: &str, sql: &str) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(name.as_bytes());
        body.push(0);
        body.extend_from_slice(sql.as_bytes());
        body.push(0);
        body.extend_from_slice(&0u16.to_be_bytes());
        let mut m = vec![b'P'];
        m.extend_from_slice(&((4 + body.len()) as u32).to_be_bytes());
        m.extend_from_slice(&body);
        m
    }

    /// Messages are cut where the protocol says, whatever the reads: the
    /// startup message by its length alone, then a type byte and a length;
    /// a message split over two reads waits for its rest.
    #[test]
    fn messages_are_framed_by_their_length() {
        let mut startup = 8u32.to_be_bytes().to_vec();
        startup.extend_from_slice(&SSL_REQUEST.to_be_bytes());
        assert_eq!(frame_len(&startup, false), Some(8));
        assert_eq!(frame_len(&startup[..7], false), None);
        let q = query("COMMIT");
        assert_eq!(frame_len(&q, true), Some(q.len()));
        assert_eq!(frame_len(&q[..q.len() - 1], true), None);
        assert_eq!(frame_len(&q[..4], true), None);
        let mut two = q.clone();
        two.extend_from_slice(&query("SELECT 1"));
        assert_eq!(frame_len(&two, true), Some(q.len()));
    }

    #[test]
    fn commits_are_recognised_in_both_protocols() {
        for sql in [
            "COMMIT",
            "commit;",
            " END ",
            "COMMIT TRANSACTION",
            "end work;",
        ] {
            assert!(is_commit(&query(sql)), "{sql}");
        }
        for sql in [
            "BEGIN",
            "COMMIT PREPARED 'x'",
            "SELECT 'COMMIT'",
            "ROLLBACK",
        ] {
            assert!(!is_commit(&query(sql)), "{sql}");
        }
        assert!(is_commit(&parse("", "COMMIT")));
        assert!(is_commit(&parse("s1", "commit")));
        assert!(!is_commit(&parse("s1", "INSERT INTO t VALUES (1)")));
    }

    #[test]
    fn statements_are_what_runs_sql_but_a_rollback() {
        assert!(is_statement(&query("INSERT INTO t VALUES (1)")));
        assert!(is_statement(&parse("s", "select 1")));
        assert!(!is_statement(&query("rollback")));
        assert!(!is_statement(&parse("", "ROLLBACK")));
        assert!(!is_statement(b"S\0\0\0\x04"));
    }

    #[test]
    fn command_tags() {
        let mut m = vec![b'C'];
        m.extend_from_slice(&(4u32 + 7).to_be_bytes());
        m.extend_from_slice(b"COMMIT\0");
        assert_eq!(command_tag(&m), Some("COMMIT"));
    }
}
