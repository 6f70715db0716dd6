//! One client connection: read a request head, read its body, route it, write the response,
//! repeat while keep-alive holds.
//!
//! Requests on a connection are handled strictly in order, so pipelined requests are answered in
//! order; bytes after the current request stay in the read buffer (or in `pending`, when they
//! arrived while a response was in progress) and start the next one. Buffers are owned by the
//! connection and reused across its requests.
//!
//! Timeouts: an idle keep-alive connection closes after `keepalive`; once the first byte of a
//! head arrived, the whole head must arrive within `header_read` (else 408 and close).

use std::net::SocketAddr;
use std::ops::Range;
use std::rc::Rc;
use std::time::Instant;

use continuum_core::http1::chunked::ChunkedDecoder;
use continuum_core::snapshot::RouterSnapshot;
use monoio::io::{AsyncWriteRentExt, Canceller, OwnedWriteHalf, Splitable};
use monoio::net::TcpStream;

use crate::inbox::{self, Inbox};
use crate::metrics::Route;
use crate::respond::{self, ErrorShape, LocalError, Persistence};
use crate::routes;
use crate::shard::{LocalSnapshot, Shard};
use continuum_core::http1::request::{
    self as reqhead, BodyFraming, HeadError, HeadLimits, HeaderSpan, RequestHead,
};

/// Initial read buffer size.
const READ_BUF: usize = 8 * 1024;

/// Where the current request's body is.
#[derive(Debug, Clone)]
pub(crate) enum BodyRef {
    /// No body.
    None,
    /// A Content-Length body, in place in the read buffer.
    Rbuf(Range<usize>),
    /// A chunked body, decoded into `ClientConn::body`.
    Decoded,
    /// The converted body of this attempt, in `ClientConn::alt_body`.
    Alt,
}

/// How a request ended, for metrics and keep-alive.
#[derive(Debug, Clone, Copy)]
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

/// A client connection and its reusable buffers.
#[derive(Debug)]
pub(crate) struct ClientConn {
    pub(crate) wr: OwnedWriteHalf<TcpStream>,
    pub(crate) inbox: Rc<Inbox>,
    pub(crate) peer: SocketAddr,
    pub(crate) rbuf: Vec<u8>,
    pub(crate) wbuf: Vec<u8>,
    pub(crate) ubuf: Vec<u8>,
    pub(crate) body: Vec<u8>,
    pub(crate) head: RequestHead,
    /// Header spans of the current upstream response head (reused).
    pub(crate) resp_spans: Vec<HeaderSpan>,
    pub(crate) pins_stripped: u64,
    /// A non-2xx shim answer held back for the shim decision (de-chunked body).
    pub(crate) held: Vec<u8>,
    /// Its `content-type` value.
    pub(crate) held_type: Vec<u8>,
    /// The shape of errors for the current request's ingress.
    pub(crate) error_shape: ErrorShape,
    /// How the current attempt's answer is converted for the client (converted ingresses).
    pub(crate) convert: Option<crate::proxy::Conversion>,
    /// The chat body a Responses request becomes for a `responses_api: chat` backend, built on
    /// first use and kept for the request's other attempts.
    pub(crate) alt_body: Vec<u8>,
    /// The context converting that body's answer back (set with `alt_body`).
    pub(crate) responses_ctx: Option<continuum_core::ingress::responses::ResponsesContext>,
}

impl ClientConn {
    /// The body bytes of the current request.
    pub(crate) fn body_bytes(&self, body: &BodyRef) -> &[u8] {
        match body {
            BodyRef::None => &[],
            BodyRef::Rbuf(r) => &self.rbuf[r.clone()],
            BodyRef::Decoded => &self.body,
            BodyRef::Alt => &self.alt_body,
        }
    }

    /// The body length of the current request.
    pub(crate) fn body_len(&self, body: &BodyRef) -> usize {
        self.body_bytes(body).len()
    }

    /// Queue a local error response; keeps the connection only when the request was read whole.
    pub(crate) fn local_error(&mut self, e: LocalError) -> Outcome {
        self.wbuf.clear();
        let keep_alive = self.head.keep_alive;
        respond::write_error_shaped(
            &mut self.wbuf,
            e,
            self.error_shape,
            Persistence::of(keep_alive, self.head.http10),
        );
        Outcome {
            status: e.status(),
            keep_alive,
        }
    }

    /// Write the body (already known to be large) to `up`.
    pub(crate) async fn write_body_to(
        &mut self,
        up: &mut TcpStream,
        body: &BodyRef,
    ) -> std::io::Result<()> {
        match body {
            BodyRef::None => Ok(()),
            BodyRef::Rbuf(r) => {
                let rbuf = std::mem::take(&mut self.rbuf);
                let (res, slice) = up
                    .write_all(monoio::buf::IoBuf::slice(rbuf, r.clone()))
                    .await;
                self.rbuf = slice.into_inner();
                res.map(|_| ())
            }
            BodyRef::Decoded => {
                let body = std::mem::take(&mut self.body);
                let (res, body) = up.write_all(body).await;
                self.body = body;
                res.map(|_| ())
            }
            BodyRef::Alt => {
                let body = std::mem::take(&mut self.alt_body);
                let (res, body) = up.write_all(body).await;
                self.alt_body = body;
                res.map(|_| ())
            }
        }
    }

    /// Wait for client bytes and move them to the end of `rbuf`. `0`: the client closed.
    async fn fill(&mut self) -> usize {
        if !self.inbox.readable().await {
            return 0;
        }
        self.inbox.take_into(&mut self.rbuf)
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        if self.wbuf.is_empty() {
            return Ok(());
        }
        let wbuf = std::mem::take(&mut self.wbuf);
        let (res, mut wbuf) = self.wr.write_all(wbuf).await;
        wbuf.clear();
        self.wbuf = wbuf;
        res.map(|_| ())
    }
}

/// Serve one accepted connection until it closes.
pub(crate) async fn serve(shard: Rc<Shard>, stream: TcpStream, peer: SocketAddr) {
    shard.metrics.connection_opened();
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    let inbox = Inbox::with_capacity(READ_BUF);
    let reader_stop = Canceller::new();
    monoio::spawn(inbox::run_reader(rd, inbox.clone(), reader_stop.handle()));
    let mut c = ClientConn {
        wr,
        inbox,
        peer,
        rbuf: Vec::with_capacity(READ_BUF),
        wbuf: Vec::with_capacity(4096),
        ubuf: Vec::new(),
        body: Vec::new(),
        head: RequestHead::default(),
        resp_spans: Vec::new(),
        held: Vec::new(),
        held_type: Vec::new(),
        error_shape: ErrorShape::OpenAi,
        convert: None,
        alt_body: Vec::new(),
        responses_ctx: None,
        pins_stripped: 0,
    };
    loop {
        let snap = shard.snapshot();
        let keep = match read_head(&mut c, &snap).await {
            HeadRead::Ready => serve_one(&shard, &snap, &mut c).await,
            HeadRead::Closed => false,
            HeadRead::Reject(e) => {
                let started = Instant::now();
                c.head.keep_alive = false;
                c.local_error(e);
                let _ = c.flush().await;
                shard
                    .metrics
                    .request_done(Route::Other, e.status(), started.elapsed());
                false
            }
        };
        if !keep || shard.draining() {
            break;
        }
    }
    // Stop the reader; the socket closes once both halves are gone.
    let _ = reader_stop.cancel();
    shard.metrics.connection_closed();
}

/// Serve the request whose head is parsed; returns whether the connection stays open.
async fn serve_one(shard: &Shard, snap: &Rc<LocalSnapshot>, c: &mut ClientConn) -> bool {
    let started = Instant::now();
    shard.metrics.inflight_inc();
    c.pins_stripped = 0;
    let route = routes::classify(c);
    c.error_shape = ErrorShape::of(route);
    let (outcome, consumed) = match read_body(c, snap).await {
        Ok((body, consumed)) if route.is_proxied() => {
            // A client that leaves aborts the exchange: dropping the dispatch future drops the
            // upstream connection, which cancels the request at the backend.
            let inbox = c.inbox.clone();
            let outcome = monoio::select! {
                o = routes::dispatch(shard, snap, c, route, body) => o,
                _ = inbox.closed() => Outcome::aborted(),
            };
            (outcome, consumed)
        }
        Ok((body, consumed)) => (
            routes::dispatch(shard, snap, c, route, body).await,
            consumed,
        ),
        Err(e) => {
            c.head.keep_alive = false;
            (c.local_error(e), 0)
        }
    };
    let flushed = c.flush().await.is_ok();
    shard.metrics.inflight_dec();
    shard.metrics.pins_stripped(c.pins_stripped);
    shard
        .metrics
        .request_done(route, outcome.status, started.elapsed());
    if !(flushed && outcome.keep_alive) {
        return false;
    }
    // Drop the finished request; keep any pipelined bytes for the next one.
    if consumed >= c.rbuf.len() {
        c.rbuf.clear();
    } else {
        c.rbuf.drain(..consumed);
    }
    if c.rbuf.capacity() > 4 * READ_BUF && c.rbuf.len() < READ_BUF {
        c.rbuf.shrink_to(READ_BUF);
    }
    true
}

enum HeadRead {
    Ready,
    Closed,
    Reject(LocalError),
}

async fn read_head(c: &mut ClientConn, snap: &RouterSnapshot) -> HeadRead {
    let cfg = &snap.config.server;
    let limits = HeadLimits {
        max_header_bytes: cfg.max_header_bytes,
        max_headers: cfg.max_headers,
    };
    let mut deadline: Option<Instant> = None;
    loop {
        if !c.rbuf.is_empty() {
            match reqhead::parse(&c.rbuf, limits, &mut c.head) {
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
            deadline.get_or_insert_with(|| Instant::now() + cfg.header_read_timeout);
        }
        let wait = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()),
            None => cfg.keepalive_timeout,
        };
        match monoio::time::timeout(wait, c.fill()).await {
            Ok(n) if n > 0 => {}
            Ok(_) => return HeadRead::Closed,
            Err(_) if deadline.is_some() => return HeadRead::Reject(LocalError::Timeout),
            Err(_) => return HeadRead::Closed,
        }
    }
}

/// Read the body; returns where it is and how many buffer bytes the request used.
async fn read_body(
    c: &mut ClientConn,
    snap: &RouterSnapshot,
) -> Result<(BodyRef, usize), LocalError> {
    let cfg = &snap.config.server;
    let head_len = c.head.head_len;
    match c.head.framing {
        BodyFraming::None => Ok((BodyRef::None, head_len)),
        BodyFraming::Length(n) => {
            let n = usize::try_from(n).map_err(|_| LocalError::BodyTooLarge)?;
            if n > cfg.max_body_bytes {
                return Err(LocalError::BodyTooLarge);
            }
            let total = head_len + n;
            continue_if_expected(c, total).await?;
            while c.rbuf.len() < total {
                c.rbuf.reserve(total - c.rbuf.len());
                match monoio::time::timeout(cfg.keepalive_timeout, c.fill()).await {
                    Ok(k) if k > 0 => {}
                    _ => return Err(LocalError::BadRequest("request body ended early")),
                }
            }
            Ok((BodyRef::Rbuf(head_len..total), total))
        }
        BodyFraming::Chunked => {
            continue_if_expected(c, head_len + 1).await?;
            c.body.clear();
            let mut decoder = ChunkedDecoder::new();
            let mut pos = head_len;
            loop {
                let mut over = false;
                let max = cfg.max_body_bytes;
                let body = &mut c.body;
                let consumed = decoder
                    .feed(&c.rbuf[pos..], |d| {
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
                c.rbuf.truncate(head_len);
                pos = head_len;
                match monoio::time::timeout(cfg.keepalive_timeout, c.fill()).await {
                    Ok(k) if k > 0 => {}
                    _ => return Err(LocalError::BadRequest("request body ended early")),
                }
            }
        }
    }
}

/// Send `100 Continue` when the client expects it and the body is not already buffered.
async fn continue_if_expected(c: &mut ClientConn, needed: usize) -> Result<(), LocalError> {
    if c.head.expect_continue && c.rbuf.len() < needed {
        c.wbuf.clear();
        c.wbuf.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
        c.flush()
            .await
            .map_err(|_| LocalError::BadRequest("client closed"))?;
    }
    Ok(())
}
