//! Relaying one upstream response to the client.
//!
//! The response head is parsed once, filtered (hop-by-hop, framing and `x-dynamo-*` headers are
//! dropped; `x-backend` is added only when the client asked) and written together with the body
//! bytes that arrived with it. The body is then copied read-for-write: each upstream read is
//! written to the client before the next read, so a slow client slows the backend (backpressure)
//! and nothing is buffered beyond one read. Chunked bodies pass through with their chunk
//! boundaries intact (an SSE event leaves as soon as it arrives); a decoder only tracks where the
//! body ends.

use std::io::Write as _;

use continuum_core::config::BackendConfig;
use continuum_core::headers;
use continuum_core::http1::chunked::ChunkedDecoder;
use continuum_core::snapshot::RouterSnapshot;
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

use super::{Attempt, AttemptError, FailureHandling};
use crate::conn::{ClientConn, Outcome};
use crate::metrics::UpstreamErrorClass;
use crate::respond::{self, Persistence};
use crate::shard::Shard;
use continuum_core::http1::request::{HeaderSpan, Method};

/// Largest upstream response head accepted.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// Most upstream response headers accepted.
const MAX_RESPONSE_HEADERS: usize = 128;
/// Upstream read buffer size.
const UPSTREAM_BUF: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    Empty,
    Length(u64),
    Chunked,
    UntilClose,
}

/// A parsed upstream response head; ranges index the upstream buffer, header spans are in
/// `ClientConn::resp_spans` (reused, so a response head is parsed once and without allocating).
pub(super) struct ParsedHead {
    pub(super) status: u16,
    pub(super) head_len: usize,
    pub(super) framing: Framing,
    pub(super) upstream_keep_alive: bool,
    reason: std::ops::Range<usize>,
    connection: Option<std::ops::Range<usize>>,
}

/// Largest non-2xx body held back for the shim decision (error bodies are small; a larger one
/// is treated as an unusable answer).
const MAX_HELD_BODY: usize = 256 * 1024;

/// How a relay ended.
#[derive(Debug, Clone, Copy)]
pub(super) enum RelayEnd {
    /// The response went to the client.
    Relayed(Outcome),
    /// A non-2xx answer was held back, whole, in `ClientConn::held` (status, content type in
    /// `ClientConn::held_type`); nothing was written to the client.
    Held(u16),
}

/// Relay the response on `up`. Returns how it ended and whether `up` can be pooled.
pub(super) async fn relay(
    shard: &Shard,
    snap: &RouterSnapshot,
    c: &mut ClientConn,
    up: &mut TcpStream,
    backend: &BackendConfig,
    attempt: &Attempt<'_>,
) -> Result<(RelayEnd, bool), AttemptError> {
    let timeout = snap.config.server.upstream_response_timeout;
    c.ubuf.clear();
    if c.ubuf.capacity() < UPSTREAM_BUF {
        c.ubuf.reserve(UPSTREAM_BUF);
    }
    // Read until a complete (non-1xx) response head is buffered.
    let parsed = loop {
        if c.ubuf.len() == c.ubuf.capacity() {
            if c.ubuf.len() >= MAX_RESPONSE_HEAD {
                return Err(AttemptError::Upstream(UpstreamErrorClass::Protocol));
            }
            c.ubuf.reserve(UPSTREAM_BUF);
        }
        let nothing_yet = c.ubuf.is_empty();
        match read_upstream(c, up, timeout).await? {
            Ok(n) if n > 0 => {}
            // EOF or reset before any response byte: a pooled connection the backend closed.
            _ if nothing_yet => return Err(AttemptError::StaleConnection),
            _ => return Err(AttemptError::Upstream(UpstreamErrorClass::Reset)),
        }
        match parse_head(&c.ubuf, c.head.method == Method::Head, &mut c.resp_spans)? {
            None => continue,
            Some(p) if (100..200).contains(&p.status) => {
                c.ubuf.drain(..p.head_len);
                if let Some(p) =
                    parse_head(&c.ubuf, c.head.method == Method::Head, &mut c.resp_spans)?
                    && !(100..200).contains(&p.status)
                {
                    break p;
                }
            }
            Some(p) => break p,
        }
    };
    if attempt.on_failure == FailureHandling::Hold && !(200..300).contains(&parsed.status) {
        let reusable = hold(c, up, &parsed, timeout, MAX_HELD_BODY).await?;
        return Ok((RelayEnd::Held(parsed.status), reusable));
    }
    if let Some(ctx) = c.convert.clone() {
        return super::convert::relay_converted(c, up, &parsed, timeout, backend, attempt, ctx)
            .await;
    }
    // An HTTP/1.0 client cannot read chunked framing: decode it and delimit by close instead.
    let dechunk = c.head.http10 && parsed.framing == Framing::Chunked;
    let keep_alive = c.head.keep_alive && parsed.framing != Framing::UntilClose && !dechunk;
    write_client_head(c, &parsed, backend, keep_alive, dechunk, attempt);
    let mut reusable = parsed.upstream_keep_alive;
    // Body bytes that came with the head.
    let first = parsed.head_len..c.ubuf.len();
    let mut body = BodyState::new(&parsed, dechunk);
    let consumed = body.forward(&c.ubuf[first.clone()], &mut c.wbuf)?;
    if consumed < first.len() {
        reusable = false; // bytes beyond the response: do not trust this connection
    }
    write_client(c).await?;
    while !body.done {
        c.ubuf.clear();
        match read_upstream(c, up, timeout).await {
            Ok(Ok(n)) if n > 0 => {}
            Ok(Ok(_)) if parsed.framing == Framing::UntilClose => break,
            // The response has started: nothing can be retried or answered any more. The
            // client sees the connection close mid-body.
            Ok(_) | Err(AttemptError::Upstream(_)) => {
                shard.metrics.upstream_error(UpstreamErrorClass::Reset);
                return Err(AttemptError::ClientWrite);
            }
            Err(e) => return Err(e),
        }
        c.wbuf.clear();
        if body.forward(&c.ubuf, &mut c.wbuf)? < c.ubuf.len() {
            reusable = false;
        }
        write_client(c).await?;
    }
    let reusable = reusable && parsed.framing != Framing::UntilClose;
    Ok((
        RelayEnd::Relayed(Outcome {
            status: parsed.status,
            keep_alive,
        }),
        reusable,
    ))
}

/// Read the whole (de-chunked) body of an answer into `c.held`, bounded by `cap`. Returns
/// whether `up` can be pooled.
pub(super) async fn hold(
    c: &mut ClientConn,
    up: &mut TcpStream,
    parsed: &ParsedHead,
    timeout: std::time::Duration,
    cap: usize,
) -> Result<bool, AttemptError> {
    let protocol = AttemptError::Upstream(UpstreamErrorClass::Protocol);
    c.held_type.clear();
    if let Some(h) = c
        .resp_spans
        .iter()
        .find(|h| c.ubuf[h.name.clone()].eq_ignore_ascii_case(b"content-type"))
    {
        c.held_type.extend_from_slice(&c.ubuf[h.value.clone()]);
    }
    let mut held = std::mem::take(&mut c.held);
    held.clear();
    let mut body = BodyState::new(parsed, true);
    let first = parsed.head_len..c.ubuf.len();
    let mut reusable = parsed.upstream_keep_alive && parsed.framing != Framing::UntilClose;
    let result = async {
        if body.forward(&c.ubuf[first.clone()], &mut held)? < first.len() {
            reusable = false;
        }
        while !body.done {
            if held.len() > cap {
                return Err(protocol);
            }
            c.ubuf.clear();
            match read_upstream(c, up, timeout).await? {
                Ok(n) if n > 0 => {}
                Ok(_) if parsed.framing == Framing::UntilClose => break,
                _ => return Err(AttemptError::Upstream(UpstreamErrorClass::Reset)),
            }
            if body.forward(&c.ubuf, &mut held)? < c.ubuf.len() {
                reusable = false;
            }
        }
        if held.len() > cap {
            return Err(protocol);
        }
        Ok(())
    }
    .await;
    c.held = held;
    result.map(|()| reusable)
}

/// Write a held answer to `c.wbuf` as a complete response with the routing headers, for the
/// connection's writer to send.
pub(super) fn write_held(
    c: &mut ClientConn,
    status: u16,
    backend: &BackendConfig,
    attempt: &Attempt<'_>,
) -> Outcome {
    let keep_alive = c.head.keep_alive;
    if c.convert.is_some() {
        // The client speaks another protocol: its own error shape, the upstream message kept.
        let err = super::convert::upstream_error(status, &c.held);
        c.held = respond::classified_body(&err, c.error_shape);
        c.held_type.clear();
        c.held_type.extend_from_slice(b"application/json");
    }
    c.wbuf.clear();
    let _ = write!(
        c.wbuf,
        "HTTP/1.1 {status} {}\r\ncontent-length: {}\r\n",
        respond::reason(status),
        c.held.len()
    );
    if !c.held_type.is_empty() {
        c.wbuf.extend_from_slice(b"content-type: ");
        c.wbuf.extend_from_slice(&c.held_type);
        c.wbuf.extend_from_slice(b"\r\n");
    }
    end_head(c, backend, attempt, keep_alive);
    if c.head.method != Method::Head {
        let ClientConn { wbuf, held, .. } = c;
        wbuf.extend_from_slice(held);
    }
    Outcome { status, keep_alive }
}

/// End a client-facing response head in `c.wbuf`: the router's headers, the persistence
/// header, the blank line.
pub(super) fn end_head(
    c: &mut ClientConn,
    backend: &BackendConfig,
    attempt: &Attempt<'_>,
    keep_alive: bool,
) {
    write_router_headers(c, backend, attempt);
    let persistence = Persistence::of(keep_alive, c.head.http10);
    c.wbuf.extend_from_slice(persistence.header().as_bytes());
    c.wbuf.extend_from_slice(b"\r\n");
}

/// `x-backend` (only when the client asked, SHIM-15) and the routing headers of `attempt`.
fn write_router_headers(c: &mut ClientConn, backend: &BackendConfig, attempt: &Attempt<'_>) {
    let disclosure = if c.head.wants_backend {
        let _ = write!(
            c.wbuf,
            "{}: {}\r\n",
            headers::X_BACKEND_RESPONSE,
            backend.name
        );
        headers::Disclosure::Identifiers
    } else {
        headers::Disclosure::PathOnly
    };
    if let Some(r) = &attempt.routing {
        r.write_to(&mut c.wbuf, disclosure);
    }
}

/// Where the relay is in the response body.
pub(super) struct BodyState {
    framing: Framing,
    remaining: u64,
    decoder: ChunkedDecoder,
    dechunk: bool,
    pub(super) done: bool,
}

impl BodyState {
    /// The state at the start of `parsed`'s body, decoding chunked framing when `dechunk`.
    pub(super) fn new(parsed: &ParsedHead, dechunk: bool) -> Self {
        Self {
            framing: parsed.framing,
            remaining: match parsed.framing {
                Framing::Length(n) => n,
                _ => 0,
            },
            decoder: ChunkedDecoder::new(),
            dechunk,
            done: parsed.framing == Framing::Empty,
        }
    }

    /// Append the body part of `bytes` to `out` (decoded when de-chunking); returns how many
    /// bytes of `bytes` belong to the body.
    pub(super) fn forward(
        &mut self,
        bytes: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<usize, AttemptError> {
        let protocol = AttemptError::Upstream(UpstreamErrorClass::Protocol);
        let n = match self.framing {
            Framing::Empty => {
                self.done = true;
                return Ok(0);
            }
            Framing::Length(_) => {
                let take =
                    usize::try_from(self.remaining).map_or(bytes.len(), |r| r.min(bytes.len()));
                self.remaining -= take as u64;
                self.done = self.remaining == 0;
                take
            }
            Framing::Chunked if self.dechunk => {
                let n = self
                    .decoder
                    .feed(bytes, |d| out.extend_from_slice(d))
                    .map_err(|_| protocol)?;
                self.done = self.decoder.is_done();
                return Ok(n);
            }
            Framing::Chunked => {
                let n = self.decoder.feed(bytes, |_| {}).map_err(|_| protocol)?;
                self.done = self.decoder.is_done();
                n
            }
            Framing::UntilClose => bytes.len(),
        };
        out.extend_from_slice(&bytes[..n]);
        Ok(n)
    }
}

/// One upstream read appended to `c.ubuf`, bounded by `timeout`. (The client is watched for
/// disconnects by the connection's reader task, not here.)
pub(super) async fn read_upstream(
    c: &mut ClientConn,
    up: &mut TcpStream,
    timeout: std::time::Duration,
) -> Result<std::io::Result<usize>, AttemptError> {
    let buf = std::mem::take(&mut c.ubuf);
    let (len, cap) = (buf.len(), buf.capacity());
    match monoio::time::timeout(timeout, up.read(buf.slice_mut(len..cap))).await {
        Err(_) => Err(AttemptError::Upstream(UpstreamErrorClass::Timeout)),
        Ok((res, slice)) => {
            c.ubuf = slice.into_inner();
            Ok(res)
        }
    }
}

pub(super) async fn write_client(c: &mut ClientConn) -> Result<(), AttemptError> {
    if c.wbuf.is_empty() {
        return Ok(());
    }
    let wbuf = std::mem::take(&mut c.wbuf);
    let (res, mut wbuf) = c.wr.write_all(wbuf).await;
    wbuf.clear();
    c.wbuf = wbuf;
    res.map(|_| ()).map_err(|_| AttemptError::ClientWrite)
}

fn parse_head(
    buf: &[u8],
    head_request: bool,
    spans: &mut Vec<HeaderSpan>,
) -> Result<Option<ParsedHead>, AttemptError> {
    let mut hdrs = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
    let mut resp = httparse::Response::new(&mut hdrs);
    let protocol = AttemptError::Upstream(UpstreamErrorClass::Protocol);
    let head_len = match resp.parse(buf).map_err(|_| protocol)? {
        httparse::Status::Partial => return Ok(None),
        httparse::Status::Complete(n) => n,
    };
    let status = resp.code.ok_or(protocol)?;
    let base = buf.as_ptr() as usize;
    let span = |s: &[u8]| {
        let start = s.as_ptr() as usize - base;
        start..start + s.len()
    };
    let reason = span(resp.reason.unwrap_or("").as_bytes());
    let mut connection = None;
    let mut length = None;
    let mut chunked = false;
    let mut close = resp.version == Some(0);
    spans.clear();
    for h in resp.headers.iter() {
        let name = h.name.as_bytes();
        spans.push(HeaderSpan {
            name: span(name),
            value: span(h.value),
        });
        if name.eq_ignore_ascii_case(b"content-length") {
            let v = std::str::from_utf8(h.value)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok());
            length = Some(v.ok_or(protocol)?);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            chunked = h.value.trim_ascii().eq_ignore_ascii_case(b"chunked");
            if !chunked {
                return Err(protocol);
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            connection = Some(span(h.value));
            if headers::connection_has_close(h.value) {
                close = true;
            } else if resp.version == Some(0) && headers::connection_has_keep_alive(h.value) {
                close = false;
            }
        }
    }
    let framing = if head_request || status == 204 || status == 304 || (100..200).contains(&status)
    {
        Framing::Empty
    } else if chunked {
        Framing::Chunked
    } else if let Some(n) = length {
        if n == 0 {
            Framing::Empty
        } else {
            Framing::Length(n)
        }
    } else {
        Framing::UntilClose
    };
    Ok(Some(ParsedHead {
        status,
        head_len,
        framing,
        upstream_keep_alive: !close,
        reason,
        connection,
    }))
}

/// Write the client-facing response head into `c.wbuf` (cleared first).
fn write_client_head(
    c: &mut ClientConn,
    p: &ParsedHead,
    backend: &BackendConfig,
    keep_alive: bool,
    dechunk: bool,
    attempt: &Attempt<'_>,
) {
    c.wbuf.clear();
    let reason = &c.ubuf[p.reason.clone()];
    let _ = write!(c.wbuf, "HTTP/1.1 {} ", p.status);
    if reason.is_empty() {
        c.wbuf
            .extend_from_slice(respond::reason(p.status).as_bytes());
    } else {
        c.wbuf.extend_from_slice(reason);
    }
    c.wbuf.extend_from_slice(b"\r\n");
    let connection = p.connection.clone().map_or(&b""[..], |r| &c.ubuf[r]);
    for h in &c.resp_spans {
        let name = &c.ubuf[h.name.clone()];
        if headers::response_header_relayable(name, connection) {
            c.wbuf.extend_from_slice(name);
            c.wbuf.extend_from_slice(b": ");
            c.wbuf.extend_from_slice(&c.ubuf[h.value.clone()]);
            c.wbuf.extend_from_slice(b"\r\n");
        }
    }
    match p.framing {
        Framing::Length(n) => {
            let _ = write!(c.wbuf, "content-length: {n}\r\n");
        }
        Framing::Chunked if !dechunk => c.wbuf.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        Framing::Chunked => {}
        Framing::Empty => {
            if p.status != 204 && p.status != 304 {
                c.wbuf.extend_from_slice(b"content-length: 0\r\n");
            }
        }
        Framing::UntilClose => {}
    }
    end_head(c, backend, attempt, keep_alive);
}
