//! One control session with the router's listener (BUS-03..05, BUS-44): dial over TLS 1.3 with
//! ALPN `h2`, `POST /bus/v1/session` with the credential and `hello`, then serve the router's
//! commands until the session ends: `subscribe` opens a relay to an advertised publisher (or is
//! answered `stream_closed`), `unsubscribe` ends one, heartbeats go both ways, and a drain
//! request sends `draining` and ends the session once the router has moved every stream.
//!
//! Invariants:
//! - nothing is dialled that the advertised set does not hold (BROKER-14), nothing at all once
//!   draining, and never more relays at once than the welcome's `max_streams_per_session`;
//! - a session the router stopped answering ends after the welcome's `idle_timeout_ms` without a
//!   line from it (heartbeats keep a healthy one busy);
//! - every relay ends with its session (the tasks are aborted), so a reconnect starts clean.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use continuum_event_bus::code::{Code, parse_error_body};
use continuum_event_bus::codec::{LineReader, MAX_LINE_BYTES, decode_router, encode};
use continuum_event_bus::ids::StreamId;
use continuum_event_bus::message::{
    ClientMessage, CloseReason, Hello, Role, RouterMessage, Target, Welcome,
};
use continuum_event_bus::version;
use http::HeaderValue;
use http_body_util::BodyExt as _;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::advertised::Advertised;
use crate::body::ChanBody;
use crate::relay::relay;
use crate::stats::BrokerStats;

/// How long the TCP connect and the TLS handshake to the router may take, each.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a draining session waits for the router to move its streams.
pub const DRAIN_GRACE: Duration = Duration::from_secs(10);
/// The receive window of each stream and of the connection (router to broker: the router's
/// writes towards publishers, which are small).
const WINDOW: u32 = 64 << 10;

/// Who the broker is and where it dials.
#[derive(Clone)]
pub struct Dial {
    /// The router's listener.
    pub addr: SocketAddr,
    /// The name its certificate must carry.
    pub server_name: ServerName<'static>,
    /// TLS 1.3, ALPN `h2`, the router's CA; with the client certificate when that is the
    /// credential.
    pub tls: Arc<rustls::ClientConfig>,
    /// The bearer token (`None`: the client certificate is the credential).
    pub token: Option<String>,
    /// The broker's id (its `brokers[]` entry at the router).
    pub client_id: String,
    /// The Dynamo namespaces it declares.
    pub namespaces: Vec<String>,
}

impl std::fmt::Debug for Dial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret: never printed.
        f.debug_struct("Dial")
            .field("addr", &self.addr)
            .field("client_id", &self.client_id)
            .field("namespaces", &self.namespaces)
            .finish_non_exhaustive()
    }
}

/// Why a session ended without being drained.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The router could not be reached (connect, TLS, HTTP/2).
    #[error("dial: {0}")]
    Dial(String),
    /// The router refused the session.
    #[error("refused: {0:?}")]
    Refused(Option<Code>),
    /// The router broke the contract (a line that is not a message, no welcome first).
    #[error("protocol: {0}")]
    Protocol(String),
    /// The router ended the session, or its connection failed.
    #[error("the router ended the session")]
    Ended,
    /// Nothing heard from the router within its idle timeout.
    #[error("the router went silent")]
    Silent,
}

impl SessionError {
    /// Whether the router was reached and accepted the hello before the session ended.
    pub fn after_welcome(&self) -> bool {
        matches!(self, SessionError::Ended | SessionError::Silent)
    }
}

fn line(m: &ClientMessage) -> Bytes {
    let mut out = Vec::new();
    encode(m, &mut out);
    Bytes::from(out)
}

async fn connect(dial: &Dial) -> Result<SendRequest<ChanBody>, SessionError> {
    let err = |what: &str, e: &dyn std::fmt::Display| SessionError::Dial(format!("{what}: {e}"));
    let tcp = tokio::time::timeout(DIAL_TIMEOUT, tokio::net::TcpStream::connect(dial.addr))
        .await
        .map_err(|e| err("connect", &e))?
        .map_err(|e| err("connect", &e))?;
    let _ = tcp.set_nodelay(true);
    let tls = tokio::time::timeout(
        DIAL_TIMEOUT,
        tokio_rustls::TlsConnector::from(dial.tls.clone()).connect(dial.server_name.clone(), tcp),
    )
    .await
    .map_err(|e| err("TLS", &e))?
    .map_err(|e| err("TLS", &e))?;
    let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(WINDOW)
        .initial_connection_window_size(WINDOW.saturating_mul(16))
        .handshake(TokioIo::new(tls))
        .await
        .map_err(|e| err("HTTP/2", &e))?;
    tokio::spawn(conn);
    Ok(send)
}

/// Runs one session until it is drained (`Ok`) or ends (`Err`). `advertised` is read at every
/// `subscribe`; `drain` turning true starts draining.
pub async fn run(
    dial: &Dial,
    advertised: &watch::Receiver<Arc<Advertised>>,
    drain: &mut watch::Receiver<bool>,
    stats: &BrokerStats,
) -> Result<(), SessionError> {
    let mut send = connect(dial).await?;
    let auth = dial
        .token
        .as_deref()
        .map(|t| HeaderValue::try_from(format!("Bearer {t}")))
        .transpose()
        .map_err(|_| SessionError::Dial("the token is not a valid header value".into()))?;
    let (lines_tx, lines_rx) = mpsc::channel::<Bytes>(64);
    let hello = ClientMessage::Hello(Hello {
        role: Role::Broker,
        client_id: dial.client_id.clone(),
        versions: vec![version::CURRENT],
        dynamo_namespaces: dial.namespaces.clone(),
        sources: vec![],
    });
    let _ = lines_tx.send(line(&hello)).await;
    let mut req = http::Request::post("https://router/bus/v1/session")
        .header(version::HEADER, version::CURRENT.to_string());
    if let Some(auth) = &auth {
        req = req.header(http::header::AUTHORIZATION, auth.clone());
    }
    let req = req
        .body(ChanBody(lines_rx))
        .map_err(|e| SessionError::Dial(e.to_string()))?;
    let resp = send
        .send_request(req)
        .await
        .map_err(|e| SessionError::Dial(format!("session request: {e}")))?;
    if resp.status() != http::StatusCode::OK {
        let body = resp.into_body().collect().await.map(|b| b.to_bytes());
        let code = body.ok().and_then(|b| parse_error_body(&b)).map(|(c, _)| c);
        return Err(SessionError::Refused(code));
    }
    let mut body = resp.into_body();
    let mut reader = LineReader::new(MAX_LINE_BYTES);
    let mut pending: Vec<Result<RouterMessage, String>> = Vec::new();
    // The welcome first.
    let welcome = loop {
        if !pending.is_empty() {
            match pending.remove(0) {
                Ok(RouterMessage::Welcome(w)) => break w,
                _ => return Err(SessionError::Protocol("no welcome first".into())),
            }
        }
        let frame = tokio::time::timeout(DIAL_TIMEOUT, body.frame())
            .await
            .map_err(|_| SessionError::Silent)?;
        feed(&mut reader, frame, &mut pending)?;
    };
    stats.session_up();
    let (ended_tx, ended_rx) = mpsc::channel(64);
    let mut serving = Serving {
        send,
        auth,
        lines: lines_tx,
        relays: HashMap::new(),
        ended_tx,
        ended_rx,
        draining: false,
        max_streams: usize::try_from(welcome.limits.max_streams_per_session).unwrap_or(usize::MAX),
    };
    let out = serving
        .serve(
            &welcome,
            &mut body,
            &mut reader,
            pending,
            advertised,
            drain,
            stats,
        )
        .await;
    stats.session_down();
    for (_, task) in serving.relays.drain() {
        task.abort();
        stats.stream_down();
    }
    out
}

/// Feeds one body frame to the line reader, queueing the messages it completes.
fn feed(
    reader: &mut LineReader,
    frame: Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>,
    out: &mut Vec<Result<RouterMessage, String>>,
) -> Result<(), SessionError> {
    let Some(frame) = frame else {
        return Err(SessionError::Ended);
    };
    let frame = frame.map_err(|_| SessionError::Ended)?;
    let Ok(data) = frame.into_data() else {
        return Ok(());
    };
    reader
        .feed(&data, |l| {
            out.push(decode_router(l).map_err(|e| e.to_string()));
        })
        .map_err(|e| SessionError::Protocol(e.to_string()))
}

/// A relay's end: its stream, and why if it ended on its own.
type Ended = (StreamId, Option<CloseReason>);

/// A welcomed session's state.
struct Serving {
    send: SendRequest<ChanBody>,
    auth: Option<HeaderValue>,
    lines: mpsc::Sender<Bytes>,
    relays: HashMap<StreamId, JoinHandle<()>>,
    /// Relays report their end here: the stream, and why if it ended on its own.
    ended_tx: mpsc::Sender<Ended>,
    ended_rx: mpsc::Receiver<Ended>,
    draining: bool,
    /// The welcome's `max_streams_per_session`: a router that commands more (it never should)
    /// is refused past it, so the broker's sockets and tasks stay bounded whatever it sends.
    max_streams: usize,
}

impl Serving {
    #[allow(clippy::too_many_arguments)]
    async fn serve(
        &mut self,
        welcome: &Welcome,
        body: &mut hyper::body::Incoming,
        reader: &mut LineReader,
        mut pending: Vec<Result<RouterMessage, String>>,
        advertised: &watch::Receiver<Arc<Advertised>>,
        drain: &mut watch::Receiver<bool>,
        stats: &BrokerStats,
    ) -> Result<(), SessionError> {
        let beat_every = Duration::from_millis(welcome.limits.heartbeat_interval_ms.max(100));
        let silent_after = Duration::from_millis(welcome.limits.idle_timeout_ms.max(1_000));
        let mut beat =
            tokio::time::interval_at(tokio::time::Instant::now() + beat_every, beat_every);
        let mut heard = tokio::time::Instant::now();
        let mut seq = 0u64;
        let mut drain_deadline = None;
        if crate::draining(drain) {
            self.start_draining(&mut drain_deadline).await;
        }
        loop {
            for msg in pending.drain(..) {
                let msg = msg.map_err(SessionError::Protocol)?;
                self.command(msg, advertised, stats).await;
            }
            if self.draining && self.relays.is_empty() {
                return Ok(());
            }
            tokio::select! {
                frame = body.frame() => {
                    feed(reader, frame, &mut pending)?;
                    heard = tokio::time::Instant::now();
                }
                Some((id, why)) = self.ended_rx.recv() => {
                    if self.relays.remove(&id).is_some() {
                        stats.stream_down();
                        if let Some(reason) = why {
                            let _ = self.lines.send(line(&ClientMessage::StreamClosed {
                                stream_id: id,
                                reason,
                            })).await;
                        }
                    }
                }
                _ = beat.tick() => {
                    if heard.elapsed() > silent_after {
                        return Err(SessionError::Silent);
                    }
                    seq += 1;
                    let _ = self.lines.send(line(&ClientMessage::Heartbeat { seq })).await;
                }
                changed = drain.changed(), if !self.draining => {
                    if changed.is_err() || *drain.borrow() {
                        self.start_draining(&mut drain_deadline).await;
                    }
                }
                () = sleep_until(drain_deadline) => return Ok(()),
            }
        }
    }

    async fn start_draining(&mut self, deadline: &mut Option<tokio::time::Instant>) {
        self.draining = true;
        *deadline = Some(tokio::time::Instant::now() + DRAIN_GRACE);
        let _ = self.lines.send(line(&ClientMessage::Draining)).await;
    }

    async fn command(
        &mut self,
        msg: RouterMessage,
        advertised: &watch::Receiver<Arc<Advertised>>,
        stats: &BrokerStats,
    ) {
        match msg {
            RouterMessage::Heartbeat { seq } => {
                let _ = self
                    .lines
                    .send(line(&ClientMessage::HeartbeatAck { seq }))
                    .await;
            }
            RouterMessage::Subscribe { stream_id, target } => {
                let refusal = match &target {
                    _ if self.draining => Some(CloseReason::Draining),
                    _ if self.relays.len() >= self.max_streams
                        && !self.relays.contains_key(&stream_id) =>
                    {
                        Some(CloseReason::Refused)
                    }
                    Target::Zmq {
                        namespace,
                        host,
                        port,
                        topic,
                    } if target.is_valid()
                        && advertised.borrow().allows(namespace, host, *port, *topic) =>
                    {
                        let ended = self.ended_tx.clone();
                        let run = relay(
                            self.send.clone(),
                            self.auth.clone(),
                            stream_id,
                            host.clone(),
                            *port,
                        );
                        let task = tokio::spawn(async move {
                            let why = run.await;
                            let _ = ended.send((stream_id, why)).await;
                        });
                        if let Some(old) = self.relays.insert(stream_id, task) {
                            old.abort();
                        } else {
                            stats.stream_up();
                        }
                        None
                    }
                    Target::Zmq { .. } => Some(CloseReason::TargetNotAdvertised),
                    // A broker relays ZMQ publishers only.
                    Target::Announced { .. } => Some(CloseReason::Refused),
                };
                if let Some(reason) = refusal {
                    stats.refused(reason);
                    let _ = self
                        .lines
                        .send(line(&ClientMessage::StreamClosed { stream_id, reason }))
                        .await;
                }
            }
            RouterMessage::Unsubscribe { stream_id } => {
                if let Some(task) = self.relays.remove(&stream_id) {
                    task.abort();
                    stats.stream_down();
                }
            }
            RouterMessage::HeartbeatAck { .. } | RouterMessage::Welcome(_) => {}
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
