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
}

impl Attempt<'_> {
    /// A plain, unorchestrated attempt.
    pub(crate) const PLAIN: Attempt<'static> = Attempt {
        pins: None,
        routing: None,
        on_failure: FailureHandling::Relay,
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

/// Proxy `POST /v1/chat/completions`: the shim path when the orchestrator runs and a worker
/// serves the model ([`shim`]), plain model routing otherwise.
pub(crate) async fn chat(
    shard: &Shard,
    snap: &RouterSnapshot,
    c: &mut ClientConn,
    body: BodyRef,
) -> Outcome {
    // Borrow the model name straight from the body: no allocation on the request path.
    let found = {
        let bytes = c.body_bytes(&body);
        match json_scan::request_fields(bytes) {
            Ok(json_scan::RequestFields {
                model: Some(r),
                stream,
            }) => match json_scan::unescape_simple(&bytes[r]) {
                Some(model) => {
                    let route = snap.route(&model);
                    let planned = shim::plan(shard, snap, &model, bytes);
                    if route.is_none() && planned.is_none() {
                        Err(LocalError::ModelNotFound)
                    } else {
                        Ok((route, planned, mode_of(stream)))
                    }
                }
                None => Err(LocalError::ModelNotFound),
            },
            Ok(_) => Err(LocalError::BadRequest("request body has no `model`")),
            Err(json_scan::ScanError::DuplicateKey) => Err(LocalError::BadRequest(
                "request body has `model` or `stream` more than once",
            )),
            Err(json_scan::ScanError::NotABool) => Err(LocalError::BadRequest(
                "request body has a non-boolean `stream`",
            )),
            Err(_) => Err(LocalError::BadRequest(
                "request body is not a JSON object with a string `model`",
            )),
        }
    };
    let (route, planned, mode) = match found {
        Ok(f) => f,
        Err(e) => return c.local_error(e),
    };
    match planned {
        shim::Plan::Pinned(p) => shim::dispatch(shard, snap, c, &body, p, route, mode).await,
        shim::Plan::NoWorker => {
            // SHIM-08: no worker serves the model; plain routing, unpinned.
            shard.metrics.dynamo.request(RoutingPath::NoWorker);
            let attempt = Attempt {
                routing: Some(RoutingHeaders {
                    path: RoutingPath::NoWorker.label(),
                    pins: None,
                    namespace: None,
                }),
                ..Attempt::PLAIN
            };
            plain(shard, snap, c, &body, route, &attempt).await
        }
        shim::Plan::Off => plain(shard, snap, c, &body, route, &Attempt::PLAIN).await,
    }
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
        build_upstream_head(c, &backend.url, body, attempt.pins.as_ref());
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
    pins: Option<&PinHeaders>,
) {
    let body_len = c.body_len(body);
    let mut stripped = 0u64;
    let ClientConn {
        wbuf, rbuf, head, ..
    } = c;
    wbuf.clear();
    let path = &rbuf[head.path.clone()];
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
    if let Some(pins) = pins {
        pins.write_to(wbuf);
    }
    wbuf.extend_from_slice(b"\r\n");
    if body_len <= COALESCE_BODY {
        let bytes = match body {
            BodyRef::None => &[][..],
            BodyRef::Rbuf(r) => &rbuf[r.clone()],
            BodyRef::Decoded => &c.body[..],
        };
        c.wbuf.extend_from_slice(bytes);
    }
    if stripped > 0 {
        c.pins_stripped = stripped;
    }
}
