//! Dispatching a chat request to a backend replica and relaying its response.
//!
//! Per request: find the `model` in the body (a bounded scan, no JSON tree), pick the next
//! replica of that model's weighted rotation with the shard's cursor, take a pooled keep-alive
//! connection (or connect), write the request head and body, then relay the response
//! ([`relay`]). A connect failure, before any byte was sent, moves to the next replica up to
//! `connect_retries` times; a pooled connection the backend had closed is replaced by a fresh one
//! once. Nothing else is retried: once a request may have reached a backend it is not sent again.

mod pool;
mod relay;

use std::io::Write as _;
use std::time::Instant;

use continuum_core::headers::{self, RequestHeaderFate};
use continuum_core::json_scan;
use continuum_core::snapshot::{BackendIdx, RouterSnapshot};
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

/// Proxy `POST /v1/chat/completions`.
pub(crate) async fn chat(
    shard: &Shard,
    snap: &RouterSnapshot,
    c: &mut ClientConn,
    body: BodyRef,
) -> Outcome {
    // Borrow the model name straight from the body: no allocation on the request path.
    let found = {
        let bytes = c.body_bytes(&body);
        match json_scan::top_level_string(bytes, b"model") {
            Ok(Some(r)) => match json_scan::unescape_simple(&bytes[r]) {
                Some(model) => snap.route(&model).ok_or(LocalError::ModelNotFound),
                None => Err(LocalError::ModelNotFound),
            },
            Ok(None) => Err(LocalError::BadRequest("request body has no `model`")),
            Err(json_scan::ScanError::DuplicateKey) => Err(LocalError::BadRequest(
                "request body has `model` more than once",
            )),
            Err(_) => Err(LocalError::BadRequest(
                "request body is not a JSON object with a string `model`",
            )),
        }
    };
    let route = match found {
        Ok(route) => route,
        Err(e) => return c.local_error(e),
    };
    let attempts = 1 + snap.config.server.connect_retries as usize;
    let start = shard.next_cursor(route.slot);
    let mut last = LocalError::UpstreamUnavailable;
    for attempt in 0..attempts {
        let Some(idx) = route.replica_at(start + attempt) else {
            break;
        };
        if attempt > 0 {
            shard.metrics.upstream_retry();
        }
        match send_to(shard, snap, c, &body, idx).await {
            Ok(outcome) => return outcome,
            Err(Failure::Connect) => {
                shard.metrics.upstream_error(UpstreamErrorClass::Connect);
                last = LocalError::UpstreamUnavailable;
            }
            Err(Failure::Respond(e)) => return c.local_error(e),
            Err(Failure::Abort) => return Outcome::aborted(),
        }
    }
    c.local_error(last)
}

enum Failure {
    /// Could not connect: try the next replica.
    Connect,
    /// Answer the client with this error.
    Respond(LocalError),
    /// Close the client connection without a response.
    Abort,
}

async fn send_to(
    shard: &Shard,
    snap: &RouterSnapshot,
    c: &mut ClientConn,
    body: &BodyRef,
    idx: BackendIdx,
) -> Result<Outcome, Failure> {
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
                _ => return Err(Failure::Connect),
            },
        };
        build_upstream_head(c, &backend.url, body);
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
            return Err(Failure::Respond(LocalError::UpstreamUnavailable));
        }
        match relay::relay(shard, snap, c, &mut up, backend).await {
            Ok((outcome, reusable)) => {
                if reusable {
                    shard.pool.borrow_mut().checkin(addr, up, Instant::now());
                }
                return Ok(outcome);
            }
            Err(AttemptError::StaleConnection) if reused => continue,
            Err(AttemptError::StaleConnection) => {
                shard.metrics.upstream_error(UpstreamErrorClass::Reset);
                return Err(Failure::Respond(LocalError::UpstreamUnavailable));
            }
            Err(AttemptError::Upstream(class)) => {
                shard.metrics.upstream_error(class);
                return Err(Failure::Respond(match class {
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
    Err(Failure::Connect)
}

/// Write the upstream request head (and a small body) into `c.wbuf`.
fn build_upstream_head(
    c: &mut ClientConn,
    url: &continuum_core::config::BackendUrl,
    body: &BodyRef,
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
