//! The load of `soak`: `connections` client threads in this process, each with its own
//! keep-alive HTTP/1.1 connection to the router on 127.0.0.1, sending the same chat completion.
//!
//! Two paces: [`Pace::Closed`] (each thread sends its next request as soon as the last answer is
//! in: the calibration of the router's maximum rate) and [`Pace::Open`] (request `i` is due at
//! `start + i / rate` whatever the answers do, the tickets shared by all threads; a request that
//! finds every thread busy starts late and its latency counts from when it was due, as wrk2
//! counts it). Every answer is classified ([`Tally`]): 200, the router's
//! `disaggregated_decode_failed` 502 (what a pin to a worker that has just left turns into), any
//! other status, or a transport failure.
//!
//! Invariants: every socket operation is bounded by the I/O timeout and no request starts after
//! the load's end or an interrupt, so the load ends by `end + io timeout`; a connection is
//! dropped (and opened again for the next request) after any failure or `Connection: close`;
//! bodies are read up to [`MAX_BODY`]; only the first [`KEPT_ERRORS`] error texts are kept.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Largest response body read.
const MAX_BODY: usize = 1 << 20;
/// Error texts kept per load.
const KEPT_ERRORS: usize = 5;
/// A request that starts this much after it was due counts as late.
const LATE: Duration = Duration::from_millis(1);
/// The class of the router's answer when a pinned request failed in the frontend and unified
/// fallback is off (SHIM-20): what a pin to a worker that left just after the pick becomes.
pub(crate) const DECODE_FAILED: &str = "disaggregated_decode_failed";

/// How requests are paced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Pace {
    /// Back to back on every connection.
    Closed,
    /// Request `i` due at `start + i / rate` (requests per second).
    Open {
        /// Requests per second.
        rate: f64,
    },
}

/// One load.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LoadSpec<'a> {
    /// The router's port on 127.0.0.1.
    pub(crate) port: u16,
    /// The whole request (head and body), sent as is.
    pub(crate) request: &'a [u8],
    /// Client threads, one connection each.
    pub(crate) connections: usize,
    /// Pace.
    pub(crate) pace: Pace,
    /// When request 0 is due (open pace) and the load starts.
    pub(crate) start: Instant,
    /// No request starts at or after this.
    pub(crate) end: Instant,
    /// Bound of every socket operation.
    pub(crate) io_timeout: Duration,
    /// Set: no further request starts (the driver saw the router exit or an interrupt).
    pub(crate) stop: Option<&'a AtomicBool>,
}

/// What a load (or one of its threads) got.
#[derive(Debug, Clone)]
pub(crate) struct Tally {
    /// Requests sent (answered or not).
    pub(crate) sent: u64,
    /// Answered 200.
    pub(crate) ok: u64,
    /// Answered 502 `disaggregated_decode_failed`.
    pub(crate) decode_failed: u64,
    /// Other answers by `status class` (`503 no_worker`, `500`, ...).
    pub(crate) other: BTreeMap<String, u64>,
    /// Connect, write or read failures (no complete answer).
    pub(crate) transport: u64,
    /// Open pace: requests started more than [`LATE`] after they were due.
    pub(crate) late: u64,
    /// Microseconds from due (open pace) or sent (closed pace) to the whole answer, all answers.
    pub(crate) latency: Histogram<u64>,
    /// The first error texts.
    pub(crate) errors: Vec<String>,
}

impl Default for Tally {
    fn default() -> Self {
        Self {
            sent: 0,
            ok: 0,
            decode_failed: 0,
            other: BTreeMap::new(),
            transport: 0,
            late: 0,
            // 1 us to 10 min at 3 significant digits cannot fail.
            latency: Histogram::new_with_bounds(1, 600_000_000, 3)
                .unwrap_or_else(|_| Histogram::new(3).unwrap_or_else(|_| unreachable!())),
            errors: Vec::new(),
        }
    }
}

impl Tally {
    /// Every failed request.
    pub(crate) fn failed(&self) -> u64 {
        self.decode_failed + self.other.values().sum::<u64>() + self.transport
    }

    /// Adds `o` into `self`.
    pub(crate) fn merge(&mut self, o: &Tally) {
        self.sent += o.sent;
        self.ok += o.ok;
        self.decode_failed += o.decode_failed;
        for (k, n) in &o.other {
            *self.other.entry(k.clone()).or_default() += n;
        }
        self.transport += o.transport;
        self.late += o.late;
        let _ = self.latency.add(&o.latency);
        for e in &o.errors {
            if self.errors.len() < KEPT_ERRORS {
                self.errors.push(e.clone());
            }
        }
    }

    fn error(&mut self, text: String) {
        if self.errors.len() < KEPT_ERRORS {
            self.errors.push(text);
        }
    }

    /// Counts one answer.
    fn answer(&mut self, status: u16, body: &[u8]) {
        if status == 200 {
            self.ok += 1;
            return;
        }
        let class = error_class(body);
        if status == 502 && class.as_deref() == Some(DECODE_FAILED) {
            self.decode_failed += 1;
            return;
        }
        let key = match class {
            Some(c) => format!("{status} {c}"),
            None => status.to_string(),
        };
        *self.other.entry(key).or_default() += 1;
        let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
        self.error(format!("answered {status}: {text}"));
    }
}

/// The `error.code` (or `error.type`) string of an OpenAI-shaped error body.
pub(crate) fn error_class(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let e = v.get("error")?;
    e.get("code")
        .and_then(|c| c.as_str())
        .or_else(|| e.get("type").and_then(|t| t.as_str()))
        .map(str::to_owned)
}

/// `POST /v1/chat/completions` with `body`, keep-alive, to `127.0.0.1:port`.
pub(crate) fn chat_request(port: u16, body: &str) -> Vec<u8> {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Runs the load; returns the merged tally and its wall seconds.
pub(crate) fn run(spec: &LoadSpec<'_>) -> (Tally, f64) {
    let total = Mutex::new(Tally::default());
    let ticket = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..spec.connections.max(1) {
            let (total, ticket) = (&total, &ticket);
            scope.spawn(move || {
                let t = client(spec, ticket);
                if let Ok(mut all) = total.lock() {
                    all.merge(&t);
                }
            });
        }
    });
    let secs = spec.start.elapsed().as_secs_f64();
    (total.into_inner().unwrap_or_default(), secs)
}

/// One client thread.
fn client(spec: &LoadSpec<'_>, ticket: &AtomicU64) -> Tally {
    let mut t = Tally::default();
    let mut conn: Option<Conn> = None;
    loop {
        if crate::signals::interrupted() || spec.stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            break;
        }
        let due = match spec.pace {
            Pace::Closed => Instant::now(),
            Pace::Open { rate } => {
                let i = ticket.fetch_add(1, Ordering::Relaxed);
                spec.start + Duration::from_secs_f64(i as f64 / rate.max(f64::MIN_POSITIVE))
            }
        };
        if due >= spec.end {
            break;
        }
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        } else if now - due > LATE {
            t.late += 1;
        }
        t.sent += 1;
        match exchange(&mut conn, spec) {
            Ok((status, body)) => t.answer(status, &body),
            Err(e) => {
                conn = None;
                t.transport += 1;
                t.error(format!("transport: {e}"));
            }
        }
        let us = due.elapsed().as_micros().max(1);
        let _ = t.latency.record(u64::try_from(us).unwrap_or(u64::MAX));
    }
    t
}

/// A keep-alive connection and the bytes read past the last answer.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

/// Sends the request on `conn` (connecting first if there is none) and reads the answer:
/// status and body. Drops the connection when the answer says `Connection: close`.
fn exchange(conn: &mut Option<Conn>, spec: &LoadSpec<'_>) -> std::io::Result<(u16, Vec<u8>)> {
    if conn.is_none() {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, spec.port));
        let stream = TcpStream::connect_timeout(&addr, spec.io_timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(spec.io_timeout))?;
        stream.set_write_timeout(Some(spec.io_timeout))?;
        *conn = Some(Conn {
            stream,
            buf: Vec::with_capacity(8192),
        });
    }
    let Some(c) = conn.as_mut() else {
        return Err(std::io::Error::other("no connection"));
    };
    c.stream.write_all(spec.request)?;
    let (status, body, close) = read_answer(c)?;
    if close {
        *conn = None;
    }
    Ok((status, body))
}

/// Reads one answer from `c`: status, body (de-chunked), whether the server closes.
fn read_answer(c: &mut Conn) -> std::io::Result<(u16, Vec<u8>, bool)> {
    let mut chunk = [0u8; 16 * 1024];
    let (status, framing, close, head_len) = loop {
        if let Some(h) = parse_head(&c.buf)? {
            break h;
        }
        fill(c, &mut chunk)?;
    };
    c.buf.drain(..head_len);
    let body = match framing {
        Framing::Length(n) => {
            if n > MAX_BODY {
                return Err(invalid("body too large"));
            }
            while c.buf.len() < n {
                fill(c, &mut chunk)?;
            }
            c.buf.drain(..n).collect()
        }
        Framing::Chunked => loop {
            if let Some((used, body)) = dechunk(&c.buf)? {
                c.buf.drain(..used);
                break body;
            }
            if c.buf.len() > MAX_BODY {
                return Err(invalid("body too large"));
            }
            fill(c, &mut chunk)?;
        },
        Framing::UntilClose => {
            while let Ok(n) = c.stream.read(&mut chunk) {
                if n == 0 || c.buf.len() > MAX_BODY {
                    break;
                }
                c.buf.extend_from_slice(&chunk[..n]);
            }
            return Ok((status, std::mem::take(&mut c.buf), true));
        }
    };
    Ok((status, body, close))
}

/// Reads more bytes into `c.buf`; EOF is an error (the answer is incomplete).
fn fill(c: &mut Conn, chunk: &mut [u8]) -> std::io::Result<()> {
    let n = c.stream.read(chunk)?;
    if n == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "closed before the whole answer",
        ));
    }
    c.buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

/// How an answer's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

/// A complete response head at the start of `buf`: status, framing, whether the server closes,
/// head length; `None` while incomplete.
fn parse_head(buf: &[u8]) -> std::io::Result<Option<(u16, Framing, bool, usize)>> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut r = httparse::Response::new(&mut headers);
    let n = match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(invalid("not an HTTP response")),
    };
    let status = r.code.ok_or_else(|| invalid("no status"))?;
    let mut framing = Framing::UntilClose;
    let mut close = r.version == Some(0);
    for h in r.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let len = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| invalid("bad content-length"))?;
            if framing != Framing::Chunked {
                framing = Framing::Length(len);
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding")
            && h.value.eq_ignore_ascii_case(b"chunked")
        {
            framing = Framing::Chunked;
        } else if h.name.eq_ignore_ascii_case("connection") {
            close = h.value.eq_ignore_ascii_case(b"close");
        }
    }
    Ok(Some((status, framing, close, n)))
}

/// A complete chunked body at the start of `buf` (no trailers): bytes used and the body; `None`
/// while incomplete.
fn dechunk(buf: &[u8]) -> std::io::Result<Option<(usize, Vec<u8>)>> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let Some(eol) = buf[at..].windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let line = std::str::from_utf8(&buf[at..at + eol]).map_err(|_| invalid("chunk size"))?;
        let hex = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(hex, 16).map_err(|_| invalid("chunk size"))?;
        let data = at + eol + 2;
        if buf.len() < data + size + 2 {
            return Ok(None);
        }
        if &buf[data + size..data + size + 2] != b"\r\n" {
            return Err(invalid("chunk end"));
        }
        if size == 0 {
            return Ok(Some((data + 2, body)));
        }
        body.extend_from_slice(&buf[data..data + size]);
        at = data + size + 2;
    }
}

fn invalid(what: &'static str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_and_chunks() {
        let h = parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello")
            .unwrap()
            .unwrap();
        assert_eq!((h.0, h.1, h.2), (200, Framing::Length(5), false));
        assert_eq!(h.3, 38);
        assert!(
            parse_head(b"HTTP/1.1 200 OK\r\ncontent-len")
                .unwrap()
                .is_none()
        );
        let h = parse_head(
            b"HTTP/1.1 502 Bad Gateway\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!((h.0, h.1, h.2), (502, Framing::Chunked, true));
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\nX").unwrap(),
            Some((20, b"abcde".to_vec()))
        );
        assert_eq!(dechunk(b"3\r\nabc\r\n2\r\nd").unwrap(), None);
        assert!(dechunk(b"zz\r\n").is_err());
    }

    #[test]
    fn answers_are_classified() {
        let mut t = Tally::default();
        t.answer(200, b"{}");
        t.answer(
            502,
            br#"{"error":{"message":"m","type":"server_error","code":"disaggregated_decode_failed"}}"#,
        );
        t.answer(503, br#"{"error":{"message":"m","type":"no_worker"}}"#);
        t.answer(500, b"boom");
        assert_eq!((t.ok, t.decode_failed, t.failed()), (1, 1, 3));
        assert_eq!(t.other.get("503 no_worker"), Some(&1));
        assert_eq!(t.other.get("500"), Some(&1));
        assert_eq!(t.errors.len(), 2);
        let mut all = Tally::default();
        all.merge(&t);
        all.merge(&t);
        assert_eq!((all.ok, all.decode_failed, all.failed()), (2, 2, 6));
        assert_eq!(
            error_class(br#"{"error":{"type":"x"}}"#).as_deref(),
            Some("x")
        );
        assert_eq!(error_class(b"nope"), None);
        let r = String::from_utf8(chat_request(9, "{}")).unwrap();
        assert!(r.ends_with("Content-Length: 2\r\n\r\n{}"), "{r}");
    }

    #[test]
    fn a_closed_load_against_nothing_fails_fast_and_ends() {
        // A port nobody listens on: every request is a transport failure; the load still ends.
        let port = crate::probe::free_port().unwrap();
        let req = chat_request(port, "{}");
        let start = Instant::now();
        let (t, secs) = run(&LoadSpec {
            port,
            request: &req,
            connections: 2,
            pace: Pace::Open { rate: 200.0 },
            start,
            end: start + Duration::from_millis(200),
            io_timeout: Duration::from_secs(1),
            stop: None,
        });
        assert!(secs < 5.0, "{secs}");
        assert!(t.sent > 0 && t.sent <= 41, "{}", t.sent);
        assert_eq!(t.transport, t.sent);
        assert_eq!(t.ok, 0);
    }
}
