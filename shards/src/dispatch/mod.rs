//! Dispatching a chat request to a backend replica and relaying its response.
//!
//! Per request: find the `model` and `stream` in the body (one bounded scan, no JSON tree). When
//! the disaggregated orchestrator runs and a discovered worker serves the model, the shim path
//! ([`shim`]) picks and pins the workers. Otherwise (plain routing): pick the next
//! replica of that model's weighted rotation with the shard's cursor, take a pooled keep-alive
//! connection (or connect), write the request head and body, then relay the response
//! ([`relay`]). A connect failure, before any byte was sent, moves to the next replica up to
//! `connect_retries` times; a pooled connection the backend had closed is replaced by a fresh one
//! once. Nothing else is retried: once a request may have reached a backend it is not sent again,
//! except by the shim path's configured unified fallback (SHIM-20).

mod convert;
mod pool;
mod relay;
mod shim;

use std::io::Write as _;
use std::time::Instant;

use continuum_core::headers::{self, PinHeaders, RequestHeaderFate, RoutingHeaders};
use continuum_core::json_scan;
use continuum_core::shim::{RequestMode, RoutingPath};
use continuum_core::snapshot::{BackendIdx, ModelRoute, RouterSnapshot};
use monoio::io::AsyncWriteRentExt;
use monoio::net::TcpStream;

use crate::conn::{BodyRef, ClientConn, Outcome};
use crate::metrics::UpstreamErrorClass;
use crate::respond::LocalError;
use crate::shard::Shard;

pub(crate) use convert::Conversion;
pub(crate) use pool::Pool;

/// Bodies up to this size are copied behind the request head and sent in one write.
const COALESCE_BODY: usize = 64 * 1024;

/// How an attempt on one connection ended, when it did not produce a relayed response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptError {
    /// A pooled connection was closed by the backend before answering: retry on a fresh one.
    StaleConnection,
    /// The backend failed after the request may have reached it.
    Upstream(UpstreamErrorClass),
    /// The client could not be written to after the response started; abort.
    ClientWrite,
}

/// What one attempt carries beyond the plain proxy.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attempt<'a> {
    /// The pin headers to write on the outbound request (shim attempts only).
    pub(crate) pins: Option<PinHeaders>,
    /// The routing response headers (orchestrated requests only).
    pub(crate) routing: Option<RoutingHeaders<'a>>,
    /// What happens to a non-2xx answer.
    pub(crate) on_failure: FailureHandling,
    /// The upstream request path when it is not the client's (converted requests).
    pub(crate) upstream_path: Option<&'static [u8]>,
    /// The client protocol (a Responses request is converted per backend).
    pub(crate) ingress: Ingress,
}

impl Attempt<'_> {
    /// A plain, unorchestrated attempt.
    pub(crate) const PLAIN: Attempt<'static> = Attempt {
        pins: None,
        routing: None,
        on_failure: FailureHandling::Relay,
        upstream_path: None,
        ingress: Ingress::Chat,
    };
}

/// What happens to a non-2xx upstream answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureHandling {
    /// Relay it to the client as it comes.
    Relay,
    /// Hold it back whole for the shim decision (`core::shim::decide`).
    Hold,
}

/// Which client protocol a proxied request arrived in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ingress {
    /// `POST /v1/chat/completions`: relayed as is.
    Chat,
    /// Anthropic Messages: converted to chat, the answer converted back ([`convert`]).
    Messages,
    /// `POST /v1/responses`: native passthrough, pinned by model (INGRESS-05).
    Responses,
    /// `POST /v1/responses/compact`: passthrough, never pinned (INGRESS-08).
    ResponsesCompact,
}

/// The path converted requests are sent to.
const CHAT_PATH: &[u8] = b"/v1/chat/completions";

/// Proxy one request of `ingress`: the shim path when the orchestrator runs and a worker serves
/// the model ([`shim`]), plain model routing otherwise. Client pin fields and
/// `nvext.token_data` never reach a backend (INGRESS-04).
pub(crate) async fn forward(
    shard: &Shard,
    snap: &RouterSnapshot,
    c: &mut ClientConn,
    mut body: BodyRef,
    ingress: Ingress,
) -> Outcome {
    c.convert = None;
    c.alt_body.clear();
    c.responses_ctx = None;
    if ingress == Ingress::Messages {
        match convert::prepare_messages(c, &body) {
            Ok(b) => body = b,
            Err(out) => return out,
        }
    }
    let mut sanitized = false;
    let found = loop {
        let bytes = c.body_bytes(&body);
        let fields = match json_scan::request_fields(bytes) {
            Ok(f) => f,
            Err(e) => break Err(scan_error(e)),
        };
        if fields.needs_sanitize && !sanitized {
            match sanitize_into(c, &body) {
                Ok(b) => {
                    body = b;
                    sanitized = true;
                    continue;
                }
                Err(e) => break Err(e),
            }
        }
        let Some(r) = fields.model else {
            break Err(LocalError::BadRequest("request body has no `model`"));
        };
        let Some(model) = json_scan::unescape_simple(&bytes[r]) else {
            break Err(LocalError::ModelNotFound);
        };
        let route = snap.route(&model);
        let planned = match ingress {
            Ingress::ResponsesCompact => shim::Plan::Off,
            _ => shim::plan(shard, snap, &model, bytes),
        };
        break if route.is_none() && planned.is_none() {
            Err(LocalError::ModelNotFound)
        } else {
            Ok((route, planned, mode_of(fields.stream)))
        };
    };
    let (route, planned, mode) = match found {
        Ok(f) => f,
        Err(e) => return c.local_error(e),
    };
    let upstream_path = match ingress {
        Ingress::Messages => Some(CHAT_PATH),
        _ => None,
    };
    match planned {
        shim::Plan::Pinned(p) => {
            let req = shim::Request {
                route,
                mode,
                upstream_path,
                ingress,
            };
            shim::dispatch(shard, snap, c, &body, p, req).await
        }
        shim::Plan::NoWorker => {
            // SHIM-08: no worker serves the model; plain routing, unpinned.
            shard.metrics.dynamo.request(RoutingPath::NoWorker);
            let attempt = Attempt {
                routing: Some(RoutingHeaders {
                    path: RoutingPath::NoWorker.label(),
                    pins: None,
                    namespace: None,
                }),
                upstream_path,
                ingress,
                ..Attempt::PLAIN
            };
            plain(shard, snap, c, &body, route, &attempt).await
        }
        shim::Plan::Off => {
            let attempt = Attempt {
                upstream_path,
                ingress,
                ..Attempt::PLAIN
            };
            plain(shard, snap, c, &body, route, &attempt).await
        }
    }
}

fn scan_error(e: json_scan::ScanError) -> LocalError {
    match e {
        json_scan::ScanError::DuplicateKey => {
            LocalError::BadRequest("request body has a routing field more than once")
        }
        json_scan::ScanError::NotABool => {
            LocalError::BadRequest("request body has a non-boolean `stream`")
        }
        _ => LocalError::BadRequest("request body is not a JSON object with a string `model`"),
    }
}

/// Remove client pin fields and `nvext.token_data` (INGRESS-04, KV-PICK-11): the body is parsed,
/// stripped and re-serialised into `c.body`. Only bodies that carry such a field get here.
fn sanitize_into(c: &mut ClientConn, body: &BodyRef) -> Result<BodyRef, LocalError> {
    let mut v: serde_json::Value = serde_json::from_slice(c.body_bytes(body)).map_err(|_| {
        LocalError::BadRequest("request body is not a JSON object with a string `model`")
    })?;
    if continuum_core::ingress::sanitize::strip_client_pins_value(&mut v) {
        c.pins_stripped += 1;
    }
    c.body = serde_json::to_vec(&v).map_err(|_| LocalError::BadRequest("request body"))?;
    Ok(BodyRef::Decoded)
}

fn mode_of(stream: bool) -> RequestMode {
    if stream {
        RequestMode::Streaming
    } else {
        RequestMode::Buffered
    }
}

/// Plain model routing: the model's weighted rotation, connect failures moving to the next
/// replica up to `connect_retries` times.
pub(crate) async fn plain(
    shard: &Shard,
    snap: &RouterSnapshot,
    c: &mut ClientConn,
    body: &BodyRef,
    route: Option<&ModelRoute>,
    attempt: &Attempt<'_>,
) -> Outcome {
    let Some(route) = route else {
        return c.local_error(LocalError::ModelNotFound);
    };
    // A converted answer is rendered in the client's protocol, errors included: hold them.
    let attempt = &Attempt {
        on_failure: if c.convert.is_some() || attempt.ingress == Ingress::Responses {
            FailureHandling::Hold
        } else {
            attempt.on_failure
        },
        ..*attempt
    };
    let attempts = 1 + snap.config.server.connect_retries as usize;
    let start = shard.next_cursor(route.slot);
    let mut last = LocalError::UpstreamUnavailable;
    for n in 0..attempts {
        let Some(idx) = route.replica_at(start + n) else {
            break;
        };
        if n > 0 {
            shard.metrics.upstream_retry();
        }
        match send_to(shard, snap, c, body, idx, attempt).await {
            Ok(Sent::Relayed(outcome)) => return outcome,
            // Plain attempts relay every status, so nothing is held.
            Ok(Sent::Held(status)) => {
                let Some(backend) = snap.backend(idx) else {
                    return c.local_error(LocalError::UpstreamUnavailable);
                };
                return relay::write_held(c, status, backend, attempt);
            }
            Err(Failure::Connect) => {
                last = LocalError::UpstreamUnavailable;
            }
            Err(Failure::Transport(e)) => return c.local_error(e),
            Err(Failure::Answered(outcome)) => return outcome,
            Err(Failure::Abort) => return Outcome::aborted(),
        }
    }
    c.local_error(last)
}

/// How an attempt that produced no relayed response ended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Failure {
    /// Could not connect: nothing was sent; another replica may be tried.
    Connect,
    /// The request may have reached the backend, but no response started; the error a plain
    /// request answers with.
    Transport(LocalError),
    /// The router answered the client itself (the response is in `c.wbuf`).
    Answered(Outcome),
    /// Close the client connection without (more of) a response.
    Abort,
}

/// What an attempt produced.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Sent {
    /// The response was relayed to the client.
    Relayed(Outcome),
    /// A non-2xx answer is held in `ClientConn::held` ([`FailureHandling::Hold`]).
    Held(u16),
}

/// One attempt on backend `idx`: a pooled or new connection, the head and body, then the relay.
pub(crate) async fn send_to(
    shard: &Shard,
    snap: &RouterSnapshot,
    c: &mut ClientConn,
    body: &BodyRef,
    idx: BackendIdx,
    attempt: &Attempt<'_>,
) -> Result<Sent, Failure> {
    let (Some(backend), Some(addr)) = (snap.backend(idx), snap.backend_addr(idx)) else {
        return Err(Failure::Connect);
    };
    let (body, attempt) = match convert::for_backend(c, backend, body, attempt) {
        Ok(b) => b,
        Err(outcome) => return Err(Failure::Answered(outcome)),
    };
    let (body, attempt) = (&body, &attempt);
    let cfg = &snap.config.server;
    let pooled = shard.pool.borrow_mut().checkout(addr, Instant::now());
    for slot in [pooled, None] {
        let reused = slot.is_some();
        let mut up = match slot {
            Some(s) => s,
            None => match monoio::time::timeout(
                cfg.upstream_connect_timeout,
                TcpStream::connect_addr(addr),
            )
            .await
            {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    s
                }
                _ => {
                    shard.metrics.upstream_error(UpstreamErrorClass::Connect);
                    return Err(Failure::Connect);
                }
            },
        };
        build_upstream_head(c, &backend.url, body, attempt);
        let wbuf = std::mem::take(&mut c.wbuf);
        let (res, wbuf) = up.write_all(wbuf).await;
        c.wbuf = wbuf;
        let mut ok = res.is_ok();
        if ok && c.body_len(body) > COALESCE_BODY {
            ok = c.write_body_to(&mut up, body).await.is_ok();
        }
        if !ok {
            if reused {
                continue;
            }
            shard.metrics.upstream_error(UpstreamErrorClass::Reset);
            return Err(Failure::Transport(LocalError::UpstreamUnavailable));
        }
        match relay::relay(shard, snap, c, &mut up, backend, attempt).await {
            Ok((end, reusable)) => {
                if reusable {
                    shard.pool.borrow_mut().checkin(addr, up, Instant::now());
                }
                return Ok(match end {
                    relay::RelayEnd::Relayed(o) => Sent::Relayed(o),
                    relay::RelayEnd::Held(status) => Sent::Held(status),
                });
            }
            Err(AttemptError::StaleConnection) if reused => continue,
            Err(AttemptError::StaleConnection) => {
                shard.metrics.upstream_error(UpstreamErrorClass::Reset);
                return Err(Failure::Transport(LocalError::UpstreamUnavailable));
            }
            Err(AttemptError::Upstream(class)) => {
                shard.metrics.upstream_error(class);
                return Err(Failure::Transport(match class {
                    UpstreamErrorClass::Timeout => LocalError::UpstreamTimeout,
                    UpstreamErrorClass::Protocol => LocalError::UpstreamProtocol,
                    _ => LocalError::UpstreamUnavailable,
                }));
            }
            Err(AttemptError::ClientWrite) => {
                return Err(Failure::Abort);
            }
        }
    }
    shard.metrics.upstream_error(UpstreamErrorClass::Connect);
    Err(Failure::Connect)
}

/// Write the upstream request head (and a small body) into `c.wbuf`.
fn build_upstream_head(
    c: &mut ClientConn,
    url: &continuum_core::config::BackendUrl,
    body: &BodyRef,
    attempt: &Attempt<'_>,
) {
    let body_len = c.body_len(body);
    let mut stripped = 0u64;
    let ClientConn {
        wbuf, rbuf, head, ..
    } = c;
    wbuf.clear();
    let path = attempt
        .upstream_path
        .unwrap_or_else(|| &rbuf[head.path.clone()]);
    wbuf.extend_from_slice(b"POST ");
    wbuf.extend_from_slice(url.base_path.as_bytes());
    wbuf.extend_from_slice(path);
    wbuf.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    if url.host.contains(':') {
        let _ = write!(wbuf, "[{}]:{}", url.host, url.port);
    } else {
        let _ = write!(wbuf, "{}:{}", url.host, url.port);
    }
    let _ = write!(wbuf, "\r\ncontent-length: {body_len}\r\n");
    let connection = head.connection.clone().map(|r| &rbuf[r]).unwrap_or(b"");
    for h in &head.headers {
        let name = &rbuf[h.name.clone()];
        match headers::request_header_fate(name, connection) {
            RequestHeaderFate::Forward => {
                if name.eq_ignore_ascii_case(b"expect") {
                    continue;
                }
                wbuf.extend_from_slice(name);
                wbuf.extend_from_slice(b": ");
                wbuf.extend_from_slice(&rbuf[h.value.clone()]);
                wbuf.extend_from_slice(b"\r\n");
            }
            RequestHeaderFate::DropPin => stripped += 1,
            RequestHeaderFate::DropHop => {}
        }
    }
    // The picker's pins, after every client pin was dropped above (SHIM-09).
    if let Some(pins) = &attempt.pins {
        pins.write_to(wbuf);
    }
    wbuf.extend_from_slice(b"\r\n");
    if body_len <= COALESCE_BODY {
        let bytes = match body {
            BodyRef::None => &[][..],
            BodyRef::Rbuf(r) => &rbuf[r.clone()],
            BodyRef::Decoded => &c.body[..],
            BodyRef::Alt => &c.alt_body[..],
        };
        c.wbuf.extend_from_slice(bytes);
    }
    if stripped > 0 {
        c.pins_stripped = stripped;
    }
}
