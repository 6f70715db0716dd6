//! HTTP/1.1 termination: the client connection, its reader task, local responses and route
//! classification.
//!
//! Role: [`conn::serve`] reads request heads and bodies off one client connection, classifies the
//! route (`continuum_core::route::Route`), hands each complete [`Request`] and the connection's
//! [`ResponseSink`] to a [`Handler`], then writes what the handler left in the sink and keeps the
//! connection alive when both sides allow. This module knows no proxy, shim or picker type: what
//! a request does is the handler's business.
//!
//! Invariants:
//! - requests on a connection are handled strictly in order; bytes after the current request
//!   stay buffered and start the next one;
//! - a proxied route's handler future is dropped as soon as the client closes its side, which
//!   drops any upstream connection the handler holds (the backend sees the cancellation);
//! - buffers belong to the connection and are reused by its requests.

pub(crate) mod conn;
pub(crate) mod inbox;
pub(crate) mod respond;

use std::net::SocketAddr;
use std::ops::Range;
use std::rc::Rc;
use std::time::Instant;

use crate::deadline::ConnTimer;

use continuum_core::http1::request::RequestHead;
use continuum_core::route::Route;
use monoio::io::{AsyncWriteRent, AsyncWriteRentExt, OwnedWriteHalf};
use monoio::net::TcpStream;

use crate::metrics::ShardMetrics;
use respond::{ErrorShape, LocalError, Persistence};

/// How a request ended, for metrics and keep-alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) status: u16,
    pub(crate) keep_alive: bool,
}

impl Outcome {
    /// The connection must close without (more of) a response.
    pub(crate) fn aborted() -> Self {
        Outcome {
            status: 499,
            keep_alive: false,
        }
    }
}

/// Where the current request's body is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BodyRef {
    /// No body.
    None,
    /// A Content-Length body, in place in the read buffer.
    InPlace(Range<usize>),
    /// A chunked body, decoded into the request's own buffer.
    Decoded,
}

/// One parsed request: its head (spans into the read buffer), its body and its route. Owned by
/// the connection and reused by its requests; handlers read it and may count stripped pins.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) head: RequestHead,
    pub(crate) route: Route,
    pub(crate) peer: SocketAddr,
    pub(crate) body: BodyRef,
    /// Client pin headers or fields the handler removed (`continuum_client_pin_headers_stripped_total`).
    pub(crate) pins_stripped: u64,
    /// When the connection began serving this request (its head parsed): the one clock reading
    /// the request's start-of-dispatch bookkeeping shares (retry budget, health, pool age, the
    /// deadline's origin).
    pub(crate) started: Instant,
    /// The connection's one timer, bounding each of its waits ([`ConnTimer`]); shared with the
    /// dispatch of its requests.
    pub(crate) timer: Rc<ConnTimer>,
    rbuf: Vec<u8>,
    decoded: Vec<u8>,
}

impl Request {
    fn new(peer: SocketAddr, capacity: usize, timer_floor: std::time::Duration) -> Self {
        Self {
            head: RequestHead::default(),
            route: Route::Other,
            peer,
            body: BodyRef::None,
            pins_stripped: 0,
            started: crate::clock::instant(),
            timer: Rc::new(ConnTimer::new(timer_floor)),
            rbuf: Vec::with_capacity(capacity),
            decoded: Vec::new(),
        }
    }

    /// A parsed request as the connection would hand it over: `raw` is a complete head and
    /// Content-Length body (unit tests of the dispatch logic).
    #[cfg(test)]
    pub(crate) fn parsed(raw: &[u8]) -> Self {
        use continuum_core::http1::request::{BodyFraming, HeadLimits};
        let floor = std::time::Duration::from_secs(1);
        let mut req = Self::new(SocketAddr::from(([127, 0, 0, 1], 40000)), raw.len(), floor);
        req.rbuf.extend_from_slice(raw);
        let limits = HeadLimits {
            max_header_bytes: 64 * 1024,
            max_headers: 64,
        };
        let complete = continuum_core::http1::request::parse(&req.rbuf, limits, &mut req.head);
        assert_eq!(complete, Ok(true), "a complete request head");
        req.route = Route::classify(req.path());
        let start = req.head.head_len;
        req.body = match req.head.framing {
            BodyFraming::Length(n) => BodyRef::InPlace(start..start + n as usize),
            _ => BodyRef::None,
        };
        req
    }

    /// The bytes of a span of the head (`head.path`, a header's name or value).
    pub(crate) fn span(&self, r: &Range<usize>) -> &[u8] {
        self.rbuf.get(r.clone()).unwrap_or(&[])
    }

    /// The request target (path and query).
    pub(crate) fn path(&self) -> &[u8] {
        self.span(&self.head.path)
    }

    /// The body bytes.
    pub(crate) fn body(&self) -> &[u8] {
        match &self.body {
            BodyRef::None => &[],
            BodyRef::InPlace(r) => self.span(r),
            BodyRef::Decoded => &self.decoded,
        }
    }

    /// The persistence the client asked for.
    pub(crate) fn persistence(&self) -> Persistence {
        Persistence::of(self.head.keep_alive, self.head.http10)
    }

    /// Write the body to `up` from where it lies, without copying it.
    pub(crate) async fn write_body_to<W: AsyncWriteRent>(
        &mut self,
        up: &mut W,
    ) -> std::io::Result<()> {
        match &self.body {
            BodyRef::None => Ok(()),
            BodyRef::InPlace(r) => write_lent(up, &mut self.rbuf, r.clone()).await,
            BodyRef::Decoded => {
                let all = 0..self.decoded.len();
                write_lent(up, &mut self.decoded, all).await
            }
        }
    }
}

/// Append `n` in decimal (the request path formats status codes and lengths without
/// `core::fmt`, which cost ~7% of a plain hop's user-space instructions).
pub(crate) fn push_decimal(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Write `buf[range]` to `w` without copying: the buffer is lent to the (owned-buffer) write
/// and put back, whatever the outcome. A range outside the buffer is an error, not a panic.
pub(crate) async fn write_lent<W: AsyncWriteRent>(
    w: &mut W,
    buf: &mut Vec<u8>,
    range: Range<usize>,
) -> std::io::Result<()> {
    if range.start > range.end || range.end > buf.len() {
        return Err(std::io::ErrorKind::InvalidInput.into());
    }
    let owned = std::mem::take(buf);
    let (res, slice) = w.write_all(monoio::buf::IoBuf::slice(owned, range)).await;
    *buf = slice.into_inner();
    res.map(|_| ())
}

/// The client side of the response: the connection's write half and its write buffer. What a
/// handler leaves in [`Self::buf`] is written when it returns; a relay writes as it goes.
#[derive(Debug)]
pub(crate) struct ResponseSink {
    /// `None` only for a detached sink (unit tests of the dispatch logic): flushing then fails.
    wr: Option<OwnedWriteHalf<TcpStream>>,
    /// Bytes queued for the client (cleared after every write).
    pub(crate) buf: Vec<u8>,
}

impl ResponseSink {
    fn new(wr: OwnedWriteHalf<TcpStream>) -> Self {
        Self {
            wr: Some(wr),
            buf: Vec::with_capacity(4096),
        }
    }

    /// A sink writing to `wr` (tests that relay to a real client socket).
    #[cfg(test)]
    pub(crate) fn connected(wr: OwnedWriteHalf<TcpStream>) -> Self {
        Self::new(wr)
    }

    /// A sink with no client behind it: what a handler leaves in [`Self::buf`] can be read back,
    /// and every flush fails as if the client had gone.
    #[cfg(test)]
    pub(crate) fn detached() -> Self {
        Self {
            wr: None,
            buf: Vec::new(),
        }
    }

    /// Write and clear the buffer.
    pub(crate) async fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let Some(wr) = self.wr.as_mut() else {
            return Err(std::io::ErrorKind::NotConnected.into());
        };
        let all = 0..self.buf.len();
        let res = write_lent(wr, &mut self.buf, all).await;
        self.buf.clear();
        res
    }

    /// Replace the buffer with a local error response in `shape`; the connection stays open
    /// only when the request was read whole and the client allows it.
    pub(crate) fn local_error(
        &mut self,
        head: &RequestHead,
        shape: ErrorShape,
        e: LocalError,
    ) -> Outcome {
        self.buf.clear();
        respond::write_error_shaped(
            &mut self.buf,
            e,
            shape,
            Persistence::of(head.keep_alive, head.http10),
        );
        Outcome {
            status: e.status(),
            keep_alive: head.keep_alive,
        }
    }
}

/// Limits for reading one request, from the snapshot in force when its head starts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadLimits {
    pub(crate) max_header_bytes: usize,
    pub(crate) max_headers: usize,
    pub(crate) max_body_bytes: usize,
    pub(crate) header_read_timeout: std::time::Duration,
    pub(crate) keepalive_timeout: std::time::Duration,
    /// No longer than any limit a connection's waits use under this config: how far ahead its
    /// timer may be armed ([`ConnTimer::new`]).
    pub(crate) timer_floor: std::time::Duration,
}

/// What serves the requests of a connection.
pub(crate) trait Handler {
    /// State the handler keeps per connection across its requests (reused buffers).
    type ConnState: Default;

    /// The limits for reading the next request.
    fn limits(&self) -> ReadLimits;

    /// Whether the shard is draining (a finished request then closes its connection).
    fn draining(&self) -> bool;

    /// The shard's counters.
    fn metrics(&self) -> &ShardMetrics;

    /// Serve `req`. The response is left in `sink.buf` or already written through `sink`.
    async fn serve(
        &self,
        state: &mut Self::ConnState,
        req: &mut Request,
        sink: &mut ResponseSink,
    ) -> Outcome;
}
