//! One client connection: read a request head, read its body, hand it to the [`Handler`], write
//! the response, repeat while keep-alive holds.
//!
//! Pipelined requests are answered in order; bytes after the current request stay in the read
//! buffer and start the next one. Timeouts: an idle keep-alive connection closes after
//! `keepalive`; once the first byte of a head arrived, the whole head must arrive within
//! `header_read` (else 408 and close). Body limits: `max_body_bytes` (413), a body that ends
//! early or bad chunked framing (400).

use std::net::SocketAddr;
use std::time::Instant;

use continuum_core::http1::chunked::ChunkedDecoder;
use continuum_core::http1::request::{self as reqhead, BodyFraming, HeadError, HeadLimits};
use continuum_core::route::Route;
use monoio::io::Splitable;
use monoio::net::TcpStream;

use super::inbox::{self, Inbox};
use super::respond::{ErrorShape, LocalError};
use super::{BodyRef, Handler, Outcome, ReadLimits, Request, ResponseSink};
use crate::clock;
use crate::deadline::Elapsed;

/// Initial read buffer size.
const READ_BUF: usize = 8 * 1024;

/// A client connection: its inbox (fed by the reader task), the request being read and the
/// response sink.
struct Conn {
    inbox: std::rc::Rc<Inbox>,
    req: Request,
    sink: ResponseSink,
}

impl Conn {
    /// Wait, at most `limit`, for client bytes and move them to the end of the read buffer.
    /// `Ok(0)`: the client closed.
    async fn fill(&mut self, limit: std::time::Duration) -> Result<usize, Elapsed> {
        let timer = self.req.timer.clone();
        timer.within(limit, self.take()).await
    }

    /// [`Conn::fill`] until the deadline `by`.
    async fn fill_by(&mut self, by: Instant) -> Result<usize, Elapsed> {
        let timer = self.req.timer.clone();
        timer.until(by, self.take()).await
    }

    /// Wait for client bytes and move them to the end of the read buffer; 0: the client closed.
    async fn take(&mut self) -> usize {
        if !self.inbox.readable().await {
            return 0;
        }
        self.inbox.take_into(&mut self.req.rbuf)
    }
}

/// Serve one accepted connection until it closes.
pub(crate) async fn serve<H: Handler>(handler: &H, stream: TcpStream, peer: SocketAddr) {
    handler.metrics().connection_opened();
    let _ = stream.set_nodelay(true);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    let (rd, wr) = stream.into_split();
    let inbox = Inbox::with_capacity(READ_BUF);
    monoio::spawn(inbox::run_reader(rd, inbox.clone()));
    let floor = handler.limits().timer_floor;
    let mut c = Conn {
        inbox,
        req: Request::new(peer, READ_BUF, floor),
        sink: ResponseSink::new(wr),
    };
    let mut state = H::ConnState::default();
    // When the connection last went idle: the keep-alive wait counts from here (the end of the
    // previous request, whose clock reading this reuses).
    let mut idle_since = clock::instant();
    loop {
        let limits = handler.limits();
        let keep = match read_head(&mut c, &limits, idle_since).await {
            HeadRead::Ready => match serve_one(handler, &mut state, &mut c, &limits).await {
                Some(ended) => {
                    idle_since = ended;
                    true
                }
                None => false,
            },
            HeadRead::Closed => false,
            HeadRead::Reject(e) => {
                let started = clock::instant();
                c.req.head.keep_alive = false;
                c.sink.local_error(&c.req.head, ErrorShape::OpenAi, e);
                let _ = c.sink.flush().await;
                handler
                    .metrics()
                    .request_done(Route::Other, e.status(), started.elapsed());
                false
            }
        };
        if !keep || handler.draining() {
            break;
        }
    }
    // Stop the reader; the socket closes once both halves are gone.
    c.inbox.stop(fd);
    handler.metrics().connection_closed();
}

/// The route of the parsed head; the Dynamo admin routes exist only in builds with discovery.
fn route_of(req: &Request) -> Route {
    match Route::classify(req.path()) {
        Route::AdminDynamoWorkers | Route::AdminDynamoExplain if !cfg!(feature = "dynamo") => {
            Route::Other
        }
        r => r,
    }
}

/// Serve the request whose head is parsed; returns when it ended if the connection stays open.
async fn serve_one<H: Handler>(
    handler: &H,
    state: &mut H::ConnState,
    c: &mut Conn,
    limits: &ReadLimits,
) -> Option<Instant> {
    let started = clock::instant();
    let metrics = handler.metrics();
    metrics.inflight_inc();
    c.req.pins_stripped = 0;
    c.req.started = started;
    let route = route_of(&c.req);
    c.req.route = route;
    let (outcome, consumed) = match read_body(c, limits).await {
        Ok((body, consumed)) => {
            c.req.body = body;
            let outcome = if route.is_proxied() {
                // A client that leaves aborts the exchange: dropping the handler's future drops
                // the upstream connection, which cancels the request at the backend.
                let inbox = c.inbox.clone();
                monoio::select! {
                    o = handler.serve(state, &mut c.req, &mut c.sink) => o,
                    _ = inbox.closed() => Outcome::aborted(),
                }
            } else {
                handler.serve(state, &mut c.req, &mut c.sink).await
            };
            (outcome, consumed)
        }
        Err(e) => {
            c.req.head.keep_alive = false;
            (c.sink.local_error(&c.req.head, ErrorShape::of(route), e), 0)
        }
    };
    // Counted before the buffered answer's last bytes leave, so a client that scrapes
    // `/metrics` right after it sees its own stripped pins. A streamed answer has sent its last
    // chunk inside `serve`: a scrape on another shard right after it can miss this count
    // until this line runs.
    metrics.pins_stripped(c.req.pins_stripped);
    let flushed = c.sink.flush().await.is_ok();
    metrics.inflight_dec();
    let ended = clock::instant();
    metrics.request_done(
        route,
        outcome.status,
        ended.saturating_duration_since(started),
    );
    c.req.body = BodyRef::None;
    if !(flushed && outcome.keep_alive) {
        return None;
    }
    // Drop the finished request; keep any pipelined bytes for the next one.
    let rbuf = &mut c.req.rbuf;
    if consumed >= rbuf.len() {
        rbuf.clear();
    } else {
        rbuf.drain(..consumed);
    }
    if rbuf.capacity() > 4 * READ_BUF && rbuf.len() < READ_BUF {
        rbuf.shrink_to(READ_BUF);
    }
    Some(ended)
}

enum HeadRead {
    Ready,
    Closed,
    Reject(LocalError),
}

/// Read the next request head; the connection is idle since `idle_since` until its first byte
/// (the keep-alive limit), then the whole head is due within the header-read limit.
async fn read_head(c: &mut Conn, limits: &ReadLimits, idle_since: Instant) -> HeadRead {
    let head_limits = HeadLimits {
        max_header_bytes: limits.max_header_bytes,
        max_headers: limits.max_headers,
    };
    let mut deadline: Option<Instant> = None;
    loop {
        if !c.req.rbuf.is_empty() {
            match reqhead::parse(&c.req.rbuf, head_limits, &mut c.req.head) {
                Ok(true) => return HeadRead::Ready,
                Ok(false) => {}
                Err(HeadError::TooLarge | HeadError::TooManyHeaders) => {
                    return HeadRead::Reject(LocalError::HeadersTooLarge);
                }
                Err(HeadError::Malformed) => {
                    return HeadRead::Reject(LocalError::BadRequest("malformed HTTP request"));
                }
                Err(HeadError::BadFraming) => {
                    return HeadRead::Reject(LocalError::BadRequest(
                        "invalid request body framing",
                    ));
                }
            }
            deadline.get_or_insert_with(|| clock::instant() + limits.header_read_timeout);
        }
        let by = match deadline {
            Some(d) => Some(d),
            None => idle_since.checked_add(limits.keepalive_timeout),
        };
        let filled = match by {
            Some(by) => c.fill_by(by).await,
            None => Ok(c.take().await),
        };
        match filled {
            Ok(n) if n > 0 => {}
            Ok(_) => return HeadRead::Closed,
            Err(_) if deadline.is_some() => return HeadRead::Reject(LocalError::Timeout),
            Err(_) => return HeadRead::Closed,
        }
    }
}

/// Read the body; returns where it is and how many buffer bytes the request used.
async fn read_body(c: &mut Conn, limits: &ReadLimits) -> Result<(BodyRef, usize), LocalError> {
    let head_len = c.req.head.head_len;
    match c.req.head.framing {
        BodyFraming::None => Ok((BodyRef::None, head_len)),
        BodyFraming::Length(n) => {
            let n = usize::try_from(n).map_err(|_| LocalError::BodyTooLarge)?;
            if n > limits.max_body_bytes {
                return Err(LocalError::BodyTooLarge);
            }
            let total = head_len + n;
            continue_if_expected(c, total).await?;
            while c.req.rbuf.len() < total {
                let missing = total - c.req.rbuf.len();
                c.req.rbuf.reserve(missing);
                match c.fill(limits.keepalive_timeout).await {
                    Ok(k) if k > 0 => {}
                    _ => return Err(LocalError::BadRequest("request body ended early")),
                }
            }
            Ok((BodyRef::InPlace(head_len..total), total))
        }
        BodyFraming::Chunked => {
            continue_if_expected(c, head_len + 1).await?;
            c.req.decoded.clear();
            let mut decoder = ChunkedDecoder::new();
            let mut pos = head_len;
            loop {
                let mut over = false;
                let max = limits.max_body_bytes;
                let body = &mut c.req.decoded;
                let consumed = decoder
                    .feed(&c.req.rbuf[pos..], |d| {
                        if body.len() + d.len() > max {
                            over = true;
                        } else {
                            body.extend_from_slice(d);
                        }
                    })
                    .map_err(|_| LocalError::BadRequest("invalid chunked request body"))?;
                if over {
                    return Err(LocalError::BodyTooLarge);
                }
                pos += consumed;
                if decoder.is_done() {
                    return Ok((BodyRef::Decoded, pos));
                }
                // Everything buffered is consumed: drop the raw chunks behind the head so the
                // read buffer does not grow with the body (the decoded copy is what we keep).
                c.req.rbuf.truncate(head_len);
                pos = head_len;
                match c.fill(limits.keepalive_timeout).await {
                    Ok(k) if k > 0 => {}
                    _ => return Err(LocalError::BadRequest("request body ended early")),
                }
            }
        }
    }
}

/// Send `100 Continue` when the client expects it and the body is not already buffered.
async fn continue_if_expected(c: &mut Conn, needed: usize) -> Result<(), LocalError> {
    if c.req.head.expect_continue && c.req.rbuf.len() < needed {
        c.sink.buf.clear();
        c.sink
            .buf
            .extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
        c.sink
            .flush()
            .await
            .map_err(|_| LocalError::BadRequest("client closed"))?;
    }
    Ok(())
}
