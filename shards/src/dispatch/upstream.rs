//! The upstream side of a relay: reading and parsing the response head, tracking where the
//! body ends ([`BodyState`]), holding a whole answer back ([`hold`]), ending client-facing
//! heads with the router's headers ([`end_head`]), and the bounded reads and client writes both
//! the plain relay and the converted relays are built from.
//!
//! Invariants: a response head is parsed once, without allocating (header spans go into the
//! exchange's reused buffer); the head is bounded by [`MAX_RESPONSE_HEAD`] bytes and
//! [`MAX_RESPONSE_HEADERS`] headers; a held body by the caller's cap; every read by the
//! timeouts of its [`Timing`]. Errors are classified in [`Phase::Head`]; a caller past the first client
//! write marks them [`Phase::Body`].

use std::io::Write as _;
use std::time::{Duration, Instant};

use super::conn::UpConn;
use continuum_core::config::{BackendConfig, UpstreamTimeouts};
use continuum_core::headers;
use continuum_core::http1::chunked::ChunkedDecoder;
use continuum_core::http1::request::HeaderSpan;
use continuum_core::upstream::{DispatchError, ErrorKind, Phase};
use monoio::buf::IoBufMut;
use monoio::io::AsyncReadRent;

use super::exchange::{Attempt, Exchange};
use crate::clock;
use crate::http::respond::Persistence;

/// Largest upstream response head accepted.
pub(super) const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// Most upstream response headers accepted.
pub(super) const MAX_RESPONSE_HEADERS: usize = 128;
/// Upstream read buffer size.
pub(super) const UPSTREAM_BUF: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    Empty,
    Length(u64),
    Chunked,
    UntilClose,
}

/// The time limits of one attempt's reads: the response head must be complete within the
/// first-byte timeout of the request being written, each body read within the idle timeout,
/// and every read before the request's overall deadline, when one is set.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    sent: Instant,
    head_by: Instant,
    idle: Duration,
    deadline: Option<Instant>,
}

impl Timing {
    /// The limits of an attempt on a backend with `t`, for a request that arrived at `started`,
    /// whose request was written at `sent`.
    pub(super) fn new(t: &UpstreamTimeouts, started: Instant, sent: Instant) -> Self {
        let deadline = t.deadline.map(|d| started + d);
        let head_by = sent + t.first_byte;
        Self {
            sent,
            head_by: deadline.map_or(head_by, |d| d.min(head_by)),
            idle: t.idle,
            deadline,
        }
    }

    /// When the response head must be complete (no clock reading: the allowance starts as the
    /// request is written).
    pub(super) fn head_by(&self) -> Instant {
        self.head_by
    }

    /// When the next body read must complete: the idle timeout from now, within the deadline.
    pub(super) fn body_by(&self) -> Instant {
        let idle = clock::instant() + self.idle;
        self.deadline.map_or(idle, |d| d.min(idle))
    }

    /// When the request was written (the attempt's one clock reading after its start).
    pub(super) fn sent(&self) -> Instant {
        self.sent
    }
}

/// A parsed upstream response head; ranges index the upstream buffer, header spans are in
/// `ExchangeBufs::resp_spans` (reused, so a response head is parsed once and without allocating).
pub(super) struct ParsedHead {
    pub(super) status: u16,
    pub(super) head_len: usize,
    pub(super) framing: Framing,
    pub(super) upstream_keep_alive: bool,
    pub(super) reason: std::ops::Range<usize>,
    pub(super) connection: Option<std::ops::Range<usize>>,
}

/// Read the whole (de-chunked) body of an answer into `ex.bufs.held`, bounded by `cap`. Returns
/// whether `up` can be pooled.
pub(super) async fn hold(
    ex: &mut Exchange<'_>,
    up: &mut UpConn,
    parsed: &ParsedHead,
    timing: &Timing,
    cap: usize,
) -> Result<bool, DispatchError> {
    let protocol = DispatchError::new(ErrorKind::Protocol, Phase::Head);
    ex.bufs.held_type.clear();
    if let Some(h) = ex
        .bufs
        .resp_spans
        .iter()
        .find(|h| ex.bufs.ubuf[h.name.clone()].eq_ignore_ascii_case(b"content-type"))
    {
        ex.bufs
            .held_type
            .extend_from_slice(&ex.bufs.ubuf[h.value.clone()]);
    }
    let mut held = std::mem::take(&mut ex.bufs.held);
    held.clear();
    let mut body = BodyState::new(parsed, true);
    let first = parsed.head_len..ex.bufs.ubuf.len();
    let mut reusable = parsed.upstream_keep_alive && parsed.framing != Framing::UntilClose;
    let result = async {
        if body.forward(&ex.bufs.ubuf[first.clone()], &mut held)? < first.len() {
            reusable = false;
        }
        while !body.done {
            if held.len() > cap {
                return Err(protocol);
            }
            ex.bufs.ubuf.clear();
            match read_continued(ex, up, timing.body_by()).await? {
                Ok(n) if n > 0 => {}
                Ok(_) if parsed.framing == Framing::UntilClose => break,
                _ => return Err(DispatchError::new(ErrorKind::Reset, Phase::Head)),
            }
            if body.forward(&ex.bufs.ubuf, &mut held)? < ex.bufs.ubuf.len() {
                reusable = false;
            }
        }
        if held.len() > cap {
            return Err(protocol);
        }
        Ok(())
    }
    .await;
    ex.bufs.held = held;
    result.map(|()| reusable)
}

/// End a client-facing response head in `ex.sink.buf`: the router's headers, the persistence
/// header, the blank line.
pub(super) fn end_head(
    ex: &mut Exchange<'_>,
    backend: &BackendConfig,
    attempt: &Attempt<'_>,
    keep_alive: bool,
) {
    write_router_headers(ex, backend, attempt);
    let persistence = Persistence::of(keep_alive, ex.req.head.http10);
    ex.sink
        .buf
        .extend_from_slice(persistence.header().as_bytes());
    ex.sink.buf.extend_from_slice(b"\r\n");
}

/// `x-backend` (only when the client asked, SHIM-15) and the routing headers of `attempt`.
fn write_router_headers(ex: &mut Exchange<'_>, backend: &BackendConfig, attempt: &Attempt<'_>) {
    let disclosure = if ex.req.head.wants_backend {
        let _ = write!(
            ex.sink.buf,
            "{}: {}\r\n",
            headers::X_BACKEND_RESPONSE,
            backend.name
        );
        headers::Disclosure::Identifiers
    } else {
        headers::Disclosure::PathOnly
    };
    if let Some(r) = &attempt.routing {
        r.write_to(&mut ex.sink.buf, disclosure);
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
    ) -> Result<usize, DispatchError> {
        let protocol = DispatchError::new(ErrorKind::Protocol, Phase::Head);
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

/// The first read of a response appended to `ex.bufs.ubuf`, bounded by the deadline `by`. (The client
/// is watched for disconnects by the connection's reader task, not here.)
///
/// It asks for no immediate ACK: what the backend sends first cannot be held back by our
/// delayed ACK (our request acknowledged everything it had sent before), and a response that
/// arrives whole in this read is then acknowledged by the next request on the connection instead
/// of by a packet of its own. Reads that continue a response go through [`read_continued`].
pub(super) async fn read_upstream(
    ex: &mut Exchange<'_>,
    up: &mut UpConn,
    by: Instant,
) -> Result<std::io::Result<usize>, DispatchError> {
    let buf = std::mem::take(&mut ex.bufs.ubuf);
    let (len, cap) = (buf.len(), buf.capacity());
    match ex
        .req
        .timer
        .until(by, up.read(buf.slice_mut(len..cap)))
        .await
    {
        Err(_) => Err(DispatchError::new(ErrorKind::Timeout, Phase::Head)),
        Ok((res, slice)) => {
            ex.bufs.ubuf = slice.into_inner();
            Ok(res)
        }
    }
}

/// A read that continues a response part of which has arrived: the same as [`read_upstream`],
/// after asking the kernel to acknowledge at once ([`UpConn::quick_ack`]), which also sends
/// the ACK of what arrived so far now. Why: a backend with Nagle on (Dynamo's frontend) holds
/// its next small write (the first SSE event after the head, each event after the one before)
/// until its last one is acknowledged, and Linux delays that ACK by up to 40 ms on a kept-alive
/// connection.
pub(super) async fn read_continued(
    ex: &mut Exchange<'_>,
    up: &mut UpConn,
    by: Instant,
) -> Result<std::io::Result<usize>, DispatchError> {
    up.quick_ack();
    read_upstream(ex, up, by).await
}

pub(super) async fn write_client(ex: &mut Exchange<'_>) -> Result<(), DispatchError> {
    ex.sink
        .flush()
        .await
        .map_err(|_| DispatchError::CLIENT_GONE)
}

pub(super) fn parse_head(
    buf: &[u8],
    head_request: bool,
    spans: &mut Vec<HeaderSpan>,
) -> Result<Option<ParsedHead>, DispatchError> {
    // Uninitialised: httparse writes the headers it finds and reads only those.
    let mut hdrs = [const { std::mem::MaybeUninit::uninit() }; MAX_RESPONSE_HEADERS];
    let mut resp = httparse::Response::new(&mut []);
    let protocol = DispatchError::new(ErrorKind::Protocol, Phase::Head);
    let parsed = httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut resp, buf, &mut hdrs);
    let head_len = match parsed.map_err(|_| protocol)? {
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
            let v = continuum_core::http1::request::parse_content_length(h.value);
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
