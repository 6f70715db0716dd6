//! A control session (`POST /bus/v1/session`, BUS-03, BUS-04, BUS-18..23): the version header,
//! the credentials, a handshake slot, the `hello` within 10 s (its line read from the request body
//! before any response is sent, so every refusal is an HTTP status), then `welcome` and the
//! session's life: heartbeats both ways, the idle limit, and its end when the client closes, goes
//! idle, or a newer session of its entry supersedes it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use continuum_core::config::dynamo::BrokerConfig;
use continuum_event_bus::code::Code;
use continuum_event_bus::codec::{LineReader, MAX_LINE_BYTES, decode_client, encode};
use continuum_event_bus::ids::SessionId;
use continuum_event_bus::message::{ClientMessage, Limits, RouterMessage, Welcome};
use continuum_event_bus::version;
use http::{Request, Response};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use tokio::sync::{mpsc, oneshot};

use crate::reply::{Body, ConnInfo, drain_refuse, presented};
use crate::state::State;

/// The allowance for the `hello` line (BUS-18).
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Lines queued towards the client before the session stops reading its messages.
const OUTBOX: usize = 64;

/// The client's lines: the body, the reader and the lines it completed but nobody took yet.
struct Inbound {
    body: Incoming,
    reader: LineReader,
    ready: std::collections::VecDeque<Vec<u8>>,
}

impl Inbound {
    /// The next complete line; `Ok(None)` when the body ended, `Err` on an over-long line or a
    /// broken stream.
    async fn next_line(&mut self) -> Result<Option<Vec<u8>>, Code> {
        loop {
            if let Some(l) = self.ready.pop_front() {
                return Ok(Some(l));
            }
            let Some(frame) = self.body.frame().await else {
                return Ok(None);
            };
            let Ok(frame) = frame else {
                return Ok(None);
            };
            if let Ok(data) = frame.into_data() {
                let ready = &mut self.ready;
                self.reader
                    .feed(&data, |l| ready.push_back(l.to_vec()))
                    .map_err(|_| Code::BadRequest)?;
            }
        }
    }
}

/// Frees the entry's handshake slot unless the session was established.
struct Handshake<'s> {
    state: &'s State,
    id: String,
    done: bool,
}

impl Drop for Handshake<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.state.lock().sessions.abandon(&self.id);
        }
    }
}

pub(crate) async fn open(
    req: Request<Incoming>,
    state: &Arc<State>,
    conn: &ConnInfo,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    // Every refusal keeps reading what the client still sends (bounded), so the stream ends
    // cleanly instead of being reset under the answer (`reply::drain`).
    let header = parts.headers.get(version::HEADER).map(|v| v.as_bytes());
    if version::parse_header(header).is_err() {
        return drain_refuse(
            body,
            state,
            Code::UnsupportedProtocolVersion,
            "continuum-bus-version must name a version this router speaks",
        );
    }
    let entry: BrokerConfig = {
        let d = state.lock();
        match d.credentials.authenticate(presented(&parts.headers, conn)) {
            Ok(a) => d.bus.brokers[a.index].clone(),
            Err(code) => return drain_refuse(body, state, code, "no valid credential"),
        }
    };
    if let Err(code) = state.lock().sessions.begin(&entry.id) {
        return drain_refuse(
            body,
            state,
            code,
            "no session slot is free for this credential",
        );
    }
    let mut handshake = Handshake {
        state,
        id: entry.id.clone(),
        done: false,
    };
    let mut inbound = Inbound {
        body,
        reader: LineReader::new(MAX_LINE_BYTES),
        ready: Default::default(),
    };
    let line = match tokio::time::timeout(HELLO_TIMEOUT, inbound.next_line()).await {
        Err(_) => {
            return drain_refuse(
                inbound.body,
                state,
                Code::HelloTimeout,
                "no hello within 10 s",
            );
        }
        Ok(Err(code)) => {
            return drain_refuse(inbound.body, state, code, "the hello line is too long");
        }
        Ok(Ok(None)) => {
            return drain_refuse(
                inbound.body,
                state,
                Code::BadRequest,
                "the session ended before its hello",
            );
        }
        Ok(Ok(Some(line))) => line,
    };
    let Ok(ClientMessage::Hello(hello)) = decode_client(&line) else {
        return drain_refuse(
            inbound.body,
            state,
            Code::BadRequest,
            "the first message must be a hello",
        );
    };
    let (end_tx, end_rx) = oneshot::channel();
    let (tx, rx) = mpsc::channel(OUTBOX);
    let (sid, heartbeat, idle) = {
        let mut d = state.lock();
        let sid = SessionId::from_random((d.ids)());
        let version = match d.sessions.establish(&entry, &hello, sid) {
            Ok(superseded) => {
                if let Some(old) = superseded.and_then(|old| d.enders.remove(&old)) {
                    let _ = old.send(Code::SessionSuperseded);
                }
                d.sessions.session(&entry.id).map_or(1, |s| s.version)
            }
            Err(code) => {
                handshake.done = true; // `establish` ended the handshake itself
                drop(d);
                return drain_refuse(
                    inbound.body,
                    state,
                    code,
                    "the hello does not match this credential's entry",
                );
            }
        };
        d.enders.insert(sid, end_tx);
        let bus = &d.bus;
        let limits = Limits {
            max_streams_per_session: bus.max_streams_per_session,
            max_session_buffer_bytes: bus.max_session_buffer_bytes,
            stream_buffer_bytes: u32::try_from(bus.per_stream_buffer_bytes()).unwrap_or(u32::MAX),
            heartbeat_interval_ms: millis(bus.heartbeat_interval),
            idle_timeout_ms: millis(bus.idle_timeout),
        };
        let welcome = RouterMessage::Welcome(Welcome {
            session_id: sid,
            version,
            limits,
        });
        let timing = (bus.heartbeat_interval, bus.idle_timeout);
        // The welcome goes first in the outbox: queued before the link that lets the command
        // API queue a subscribe behind it is published, both under the lock.
        let _ = tx.try_send(line_of(&welcome));
        d.links.insert(
            sid,
            crate::link::Link::new(
                entry.id.clone(),
                hello.client_id.clone(),
                (
                    hello.dynamo_namespaces.clone(),
                    hello.sources.iter().map(|s| s.backend.clone()).collect(),
                ),
                version,
                tx.clone(),
            ),
        );
        (sid, timing.0, timing.1)
    };
    handshake.done = true;
    state.metrics.session_opened();
    state.sessions_changed();
    tokio::spawn(run(
        state.clone(),
        entry.id,
        sid,
        inbound,
        tx,
        end_rx,
        heartbeat,
        idle,
    ));
    let mut resp = Response::new(Body::Stream(rx));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-ndjson"),
    );
    resp
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn line_of(m: &RouterMessage) -> Bytes {
    let mut out = Vec::new();
    encode(m, &mut out);
    Bytes::from(out)
}

/// An established session until it ends.
#[allow(clippy::too_many_arguments)]
async fn run(
    state: Arc<State>,
    entry: String,
    sid: SessionId,
    mut inbound: Inbound,
    tx: mpsc::Sender<Bytes>,
    mut end: oneshot::Receiver<Code>,
    heartbeat: Duration,
    idle: Duration,
) {
    let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
    let mut seq = 0u64;
    // Idle counts from the client's last line, not from anything the router sent.
    let mut heard = tokio::time::Instant::now();
    let ended: Option<Code> = loop {
        tokio::select! {
            line = inbound.next_line() => match line {
                Ok(Some(line)) => match decode_client(&line) {
                    Ok(ClientMessage::Heartbeat { seq }) => {
                        heard = tokio::time::Instant::now();
                        if tx.send(line_of(&RouterMessage::HeartbeatAck { seq })).await.is_err() {
                            break None;
                        }
                    }
                    Ok(ClientMessage::HeartbeatAck { .. }) => heard = tokio::time::Instant::now(),
                    Ok(ClientMessage::StreamClosed { stream_id, reason }) => {
                        heard = tokio::time::Instant::now();
                        if let Some(link) = state.lock().links.get_mut(&sid) {
                            link.closed_by_client(stream_id, reason);
                        }
                    }
                    // BUS-44: a draining client takes no new stream, and its open ones close at
                    // once so that they move to another session.
                    Ok(ClientMessage::Draining) => {
                        heard = tokio::time::Instant::now();
                        if let Some(link) = state.lock().links.get_mut(&sid) {
                            link.draining = true;
                            link.close_all(crate::link::BusStreamError::SessionClosed);
                        }
                        state.sessions_changed();
                    }
                    Ok(ClientMessage::Hello(_)) | Err(_) => break Some(Code::BadRequest),
                },
                Ok(None) => break None,
                Err(code) => break Some(code),
            },
            _ = beat.tick() => {
                seq += 1;
                if tx.send(line_of(&RouterMessage::Heartbeat { seq })).await.is_err() {
                    break None;
                }
            }
            () = tokio::time::sleep_until(heard + idle) => break Some(Code::IdleTimeout),
            code = &mut end => break code.ok(),
        }
    };
    if let Some(code) = ended {
        state.metrics.refused(code);
    }
    let mut d = state.lock();
    d.sessions.end(&entry, sid);
    d.enders.remove(&sid);
    if let Some(mut link) = d.links.remove(&sid) {
        link.close_all(crate::link::BusStreamError::SessionClosed);
    }
    drop(d);
    state.metrics.session_closed();
    state.sessions_changed();
}
