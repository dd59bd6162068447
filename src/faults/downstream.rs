//! The downstream service a consumer calls inside its handling (a payment,
//! an e-mail), run by the harness on a free 127.0.0.1 port: articles 000
//! and 002's "the downstream succeeded but its response was lost". Each
//! `POST` carries the event (its body) and, maybe, an `Idempotency-Key`
//! header. A key seen before is answered `replayed`, with no new effect;
//! any other call applies one effect. The lab may lose the response to the
//! first call for some events: the effect is applied and the connection
//! closed with no response, so the caller cannot tell what happened and
//! retries. Closing, not holding: the caller learns at once, and no timer
//! decides the run. What was called and applied is recorded for the
//! checker ([`Call`]).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use crate::checker::DownstreamCall as Call;

/// The header a caller names its request's idempotency key in.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// The header the harness's consumer names its service in: each
/// (service, eventId) is owed an effect of its own (`missingSideEffects`).
pub const CALLER: &str = "X-Caller";

#[derive(Default)]
struct State {
    calls: Vec<Call>,
    /// The idempotency keys whose call applied an effect.
    keys: BTreeSet<String>,
    /// Events whose first call's response is still to be lost.
    lose: BTreeSet<String>,
}

pub struct Downstream {
    pub port: u16,
    state: Arc<Mutex<State>>,
    accept: JoinHandle<()>,
}

impl Drop for Downstream {
    fn drop(&mut self) {
        // Its connections (a held response among them) go with it.
        self.accept.abort();
    }
}

impl Downstream {
    /// Listens on a free 127.0.0.1 port; the first call for each event in
    /// `lose` applies its effect and never answers.
    pub async fn start(lose: BTreeSet<String>) -> Result<Downstream> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("the downstream service cannot listen on 127.0.0.1")?;
        let port = listener.local_addr()?.port();
        let state = Arc::new(Mutex::new(State {
            lose,
            ..State::default()
        }));
        let shared = state.clone();
        let accept = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                // Connections that ended are reaped as new ones come.
                while conns.try_join_next().is_some() {}
                let state = shared.clone();
                conns.spawn(async move {
                    let service = hyper::service::service_fn(move |req| call(state.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Downstream {
            port,
            state,
            accept,
        })
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/effects", self.port)
    }

    /// The events whose response was to be lost and never was: the lab's
    /// fault did not happen (their event was never called).
    pub fn unlost(&self) -> Vec<String> {
        let s = self.state.lock().expect("downstream state");
        s.lose.iter().cloned().collect()
    }

    /// The calls so far, in the order received.
    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().expect("downstream state").calls.clone()
    }
}

/// One call: its answer, or (the response lost) an error, on which hyper
/// closes the connection without a response.
async fn call(
    state: Arc<Mutex<State>>,
    req: Request<Incoming>,
) -> std::result::Result<Response<Full<Bytes>>, std::io::Error> {
    let key = req
        .headers()
        .get(IDEMPOTENCY_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let service = req
        .headers()
        .get(CALLER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Ok(answer(StatusCode::BAD_REQUEST, "unreadable body")),
    };
    let event_id = crate::store::event_id(&body, "?");
    {
        let mut s = state.lock().expect("downstream state");
        let effect = match &key {
            Some(k) => s.keys.insert(k.clone()),
            None => true,
        };
        let lost = effect && s.lose.remove(&event_id);
        s.calls.push(Call {
            service,
            event_id,
            effect,
            response_lost: lost,
        });
        if !lost {
            let what = if effect { "applied" } else { "replayed" };
            return Ok(answer(StatusCode::OK, what));
        }
    }
    Err(std::io::Error::other("the response is lost"))
}

fn answer(status: StatusCode, effect: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(format!(
        "{{\"effect\":\"{effect}\"}}"
    ))));
    *r.status_mut() = status;
    r
}
