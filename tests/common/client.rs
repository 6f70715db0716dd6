//! A minimal raw HTTP/1.1 client for the acceptance tests.
//!
//! Requests are written as raw bytes (so tests control framing, header case, pipelining and
//! malformed input exactly); responses are parsed with `Content-Length`, chunked or
//! read-until-close framing. Streaming bodies can be read incrementally, chunk by chunk, each
//! read bounded by a deadline. Nothing here retries: every failure is reported as a `String`
//! describing what was read so far, so test panics are self-explanatory.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Default bound for reading one whole response.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// A parsed response head.
#[derive(Debug, Clone)]
pub struct ResponseHead {
    /// Status code.
    pub status: u16,
    /// Headers in wire order, names as sent.
    pub headers: Vec<(String, String)>,
}

impl ResponseHead {
    /// The first header named `name` (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }
}

/// A complete response.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers in wire order, names as sent.
    pub headers: Vec<(String, String)>,
    /// The decoded body (chunked framing removed).
    pub body: Vec<u8>,
}

impl Response {
    /// The first header named `name` (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// The body as (lossy) UTF-8.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON; panics with the body if it is not JSON.
    pub fn json(&self) -> serde_json::Value {
        match serde_json::from_slice(&self.body) {
            Ok(v) => v,
            Err(e) => panic!(
                "response body is not JSON ({e}); status {}, body: {:?}",
                self.status,
                self.text()
            ),
        }
    }

    /// Asserts this is an error response with `status` and the JSON error shape
    /// `{"error":{"message":string,"type":string,"code":string}}`; returns the `error` object.
    pub fn assert_json_error(&self, status: u16) -> serde_json::Value {
        assert_eq!(
            self.status,
            status,
            "expected status {status}, got {}; headers {:?}; body {:?}",
            self.status,
            self.headers,
            self.text()
        );
        let v = self.json();
        let err = v
            .get("error")
            .unwrap_or_else(|| panic!("error body lacks `error` object: {v}"))
            .clone();
        for field in ["message", "type", "code"] {
            assert!(
                err.get(field).is_some_and(serde_json::Value::is_string),
                "error.{field} missing or not a string in {v}"
            );
        }
        err
    }
}

/// The first header named `name` in `headers` (ASCII case-insensitive).
pub fn find_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Builds a request with `Host`, the given headers and (when `body` is `Some`) a
/// `Content-Length`.
pub fn request_bytes(
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n").into_bytes();
    for (n, v) in headers {
        out.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
    }
    if let Some(body) = body {
        out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
        out.extend_from_slice(body);
    } else {
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// A `POST /v1/chat/completions` with a JSON body and extra headers (the bytes [`post`] sends).
pub fn chat_bytes(body: &[u8], headers: &[(&str, &str)]) -> Vec<u8> {
    let mut all = vec![("Content-Type", "application/json")];
    all.extend_from_slice(headers);
    request_bytes("POST", "/v1/chat/completions", &all, Some(body))
}

/// A minimal chat body for `model`, with a marker so requests can be told apart.
pub fn chat_body(model: &str, marker: &str, stream: bool) -> Vec<u8> {
    format!(
        "{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"{marker}\"}}],\"stream\":{stream}}}"
    )
    .into_bytes()
}

/// Body framing of the response being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
    Done,
}

/// One client connection with its read buffer.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    /// Connects to `addr` (5 s connect timeout).
    pub fn connect(addr: SocketAddr) -> std::io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: Vec::new(),
        })
    }

    /// Connects to `addr`, panicking with a clear message on failure.
    pub fn open(addr: SocketAddr) -> Conn {
        Conn::connect(addr).unwrap_or_else(|e| panic!("cannot connect to router at {addr}: {e}"))
    }

    /// Writes all of `bytes`.
    pub fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Writes all of `bytes`, panicking on failure.
    pub fn send_all(&mut self, bytes: &[u8]) {
        if let Err(e) = self.send(bytes) {
            panic!("writing {} bytes to the router failed: {e}", bytes.len());
        }
    }

    /// Half-closes the write side.
    pub fn shutdown_write(&self) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }

    /// Reads more bytes into the buffer; `Ok(0)` at EOF; an error past `deadline`.
    fn fill(&mut self, deadline: Instant) -> Result<usize, String> {
        let mut tmp = [0u8; 16 * 1024];
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(format!(
                    "timed out waiting for data; buffered so far: {:?}",
                    String::from_utf8_lossy(&self.buf)
                ));
            }
            let wait = (deadline - now).max(Duration::from_millis(1));
            self.stream
                .set_read_timeout(Some(wait))
                .map_err(|e| e.to_string())?;
            match self.stream.read(&mut tmp) {
                Ok(n) => {
                    self.buf.extend_from_slice(&tmp[..n]);
                    return Ok(n);
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(format!(
                        "read error {e}; buffered so far: {:?}",
                        String::from_utf8_lossy(&self.buf)
                    ));
                }
            }
        }
    }

    /// Reads one response head (skipping interim 1xx responses).
    pub fn read_head(&mut self, timeout: Duration) -> Result<ResponseHead, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                let head: Vec<u8> = self.buf.drain(..end + 4).collect();
                let parsed = parse_head(&head)?;
                if (100..200).contains(&parsed.status) {
                    continue;
                }
                return Ok(parsed);
            }
            if self.fill(deadline)? == 0 {
                return Err(format!(
                    "connection closed before a complete response head; got {:?}",
                    String::from_utf8_lossy(&self.buf)
                ));
            }
        }
    }

    /// Reads one complete response.
    pub fn read_response(&mut self, timeout: Duration) -> Result<Response, String> {
        let deadline = Instant::now() + timeout;
        let head = self.read_head(timeout)?;
        let mut framing = framing_of(&head);
        let mut body = Vec::new();
        while let Some(data) = self.next_data(&mut framing, deadline)? {
            body.extend_from_slice(&data);
        }
        Ok(Response {
            status: head.status,
            headers: head.headers,
            body,
        })
    }

    /// Reads one complete response, panicking with context on failure.
    pub fn response(&mut self) -> Response {
        self.read_response(RESPONSE_TIMEOUT)
            .unwrap_or_else(|e| panic!("no complete response from the router: {e}"))
    }

    /// Reads a response head and returns a reader for its body, consumed incrementally.
    pub fn stream_response(&mut self, timeout: Duration) -> Result<StreamingBody<'_>, String> {
        let head = self.read_head(timeout)?;
        let framing = framing_of(&head);
        Ok(StreamingBody {
            conn: self,
            head,
            framing,
            received: Vec::new(),
        })
    }

    /// The next piece of decoded body data; `None` once the body is complete.
    fn next_data(
        &mut self,
        framing: &mut Framing,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, String> {
        match *framing {
            Framing::Done => Ok(None),
            Framing::Length(0) => {
                *framing = Framing::Done;
                Ok(None)
            }
            Framing::Length(remaining) => {
                if self.buf.is_empty() && self.fill(deadline)? == 0 {
                    return Err(format!(
                        "connection closed with {remaining} body bytes outstanding"
                    ));
                }
                let n = remaining.min(self.buf.len());
                *framing = Framing::Length(remaining - n);
                Ok(Some(self.buf.drain(..n).collect()))
            }
            Framing::UntilClose => {
                if self.buf.is_empty() && self.fill(deadline)? == 0 {
                    *framing = Framing::Done;
                    return Ok(None);
                }
                Ok(Some(std::mem::take(&mut self.buf)))
            }
            Framing::Chunked => self.next_chunk(framing, deadline),
        }
    }

    fn next_chunk(
        &mut self,
        framing: &mut Framing,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, String> {
        let line_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n") {
                break i;
            }
            if self.fill(deadline)? == 0 {
                return Err("connection closed inside a chunk-size line".to_string());
            }
        };
        let line = String::from_utf8_lossy(&self.buf[..line_end]).into_owned();
        let size_text = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|e| format!("bad chunk-size line {line:?}: {e}"))?;
        if size == 0 {
            // Last chunk: skip optional trailers up to the empty line.
            self.buf.drain(..line_end + 2);
            loop {
                if let Some(i) = find(&self.buf, b"\r\n") {
                    self.buf.drain(..i + 2);
                    if i == 0 {
                        *framing = Framing::Done;
                        return Ok(None);
                    }
                    continue;
                }
                if self.fill(deadline)? == 0 {
                    return Err("connection closed inside chunked trailers".to_string());
                }
            }
        }
        while self.buf.len() < line_end + 2 + size + 2 {
            if self.fill(deadline)? == 0 {
                return Err(format!("connection closed inside a {size}-byte chunk"));
            }
        }
        self.buf.drain(..line_end + 2);
        let data: Vec<u8> = self.buf.drain(..size).collect();
        let crlf: Vec<u8> = self.buf.drain(..2).collect();
        if crlf != b"\r\n" {
            return Err(format!("chunk not followed by CRLF but {crlf:?}"));
        }
        Ok(Some(data))
    }

    /// Waits until the peer closes the connection (EOF or reset) and returns true, or returns
    /// false if it is still open after `timeout`. Discards any data received meanwhile.
    pub fn wait_closed(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            match self.fill(deadline) {
                Ok(0) => return true,
                Ok(_) => self.buf.clear(),
                Err(e) => return !e.starts_with("timed out"),
            }
        }
    }
}

/// An in-progress response body read incrementally.
#[derive(Debug)]
pub struct StreamingBody<'a> {
    conn: &'a mut Conn,
    /// The response head.
    pub head: ResponseHead,
    framing: Framing,
    received: Vec<u8>,
}

impl StreamingBody<'_> {
    /// Reads until exactly `expected` more bytes have arrived and checks they equal `expected`.
    /// Fails if the body ends first or the bytes differ.
    pub fn expect_next(&mut self, expected: &[u8], timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let start = self.received.len();
        while self.received.len() < start + expected.len() {
            match self.conn.next_data(&mut self.framing, deadline) {
                Ok(Some(d)) => self.received.extend_from_slice(&d),
                Ok(None) => {
                    return Err(format!(
                        "body ended before {:?}; body so far {:?}",
                        String::from_utf8_lossy(expected),
                        String::from_utf8_lossy(&self.received)
                    ));
                }
                Err(e) => {
                    return Err(format!(
                        "waiting for {:?}: {e}; body so far {:?}",
                        String::from_utf8_lossy(expected),
                        String::from_utf8_lossy(&self.received)
                    ));
                }
            }
        }
        let got = &self.received[start..];
        if got != expected {
            return Err(format!(
                "expected next body bytes {:?}, got {:?}",
                String::from_utf8_lossy(expected),
                String::from_utf8_lossy(got)
            ));
        }
        Ok(())
    }

    /// Reads the rest of the body; returns everything received from the start.
    pub fn finish(&mut self, timeout: Duration) -> Result<Vec<u8>, String> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.conn.next_data(&mut self.framing, deadline) {
                Ok(Some(d)) => self.received.extend_from_slice(&d),
                Ok(None) => return Ok(self.received.clone()),
                Err(e) => {
                    return Err(format!(
                        "{e}; body so far {:?}",
                        String::from_utf8_lossy(&self.received)
                    ));
                }
            }
        }
    }

    /// Everything received so far.
    pub fn received(&self) -> &[u8] {
        &self.received
    }
}

/// Opens a connection, sends `raw`, reads one response.
pub fn roundtrip(addr: SocketAddr, raw: &[u8]) -> Result<Response, String> {
    let mut conn = Conn::connect(addr).map_err(|e| format!("connect to {addr}: {e}"))?;
    conn.send(raw)
        .map_err(|e| format!("write to {addr}: {e}"))?;
    conn.read_response(RESPONSE_TIMEOUT)
}

/// `GET path` on a fresh connection, panicking with context on failure.
pub fn get(addr: SocketAddr, path: &str) -> Response {
    roundtrip(addr, &request_bytes("GET", path, &[], None))
        .unwrap_or_else(|e| panic!("GET {path} on {addr} failed: {e}"))
}

/// `GET path` with extra headers on a fresh connection, panicking with context on failure.
pub fn get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response {
    roundtrip(addr, &request_bytes("GET", path, headers, None))
        .unwrap_or_else(|e| panic!("GET {path} on {addr} failed: {e}"))
}

/// A chat completion on a fresh connection, panicking with context on failure.
pub fn chat(addr: SocketAddr, body: &[u8], headers: &[(&str, &str)]) -> Response {
    post(addr, "/v1/chat/completions", body, headers)
}

/// `POST path` with a JSON body and extra headers on a fresh connection, panicking with context
/// on failure.
pub fn post(addr: SocketAddr, path: &str, body: &[u8], headers: &[(&str, &str)]) -> Response {
    let mut all = vec![("Content-Type", "application/json")];
    all.extend_from_slice(headers);
    roundtrip(addr, &request_bytes("POST", path, &all, Some(body)))
        .unwrap_or_else(|e| panic!("POST {path} on {addr} failed: {e}"))
}

fn framing_of(head: &ResponseHead) -> Framing {
    if (100..200).contains(&head.status) || head.status == 204 || head.status == 304 {
        return Framing::Done;
    }
    if head
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    {
        return Framing::Chunked;
    }
    match head.header("content-length").map(|v| v.trim().parse()) {
        Some(Ok(n)) => Framing::Length(n),
        _ => Framing::UntilClose,
    }
}

fn parse_head(head: &[u8]) -> Result<ResponseHead, String> {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        return Err(format!("not an HTTP/1.x status line: {status_line:?}"));
    }
    let status = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut headers = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let (n, v) = line
            .split_once(':')
            .ok_or_else(|| format!("bad response header line {line:?}"))?;
        headers.push((n.to_string(), v.trim().to_string()));
    }
    Ok(ResponseHead { status, headers })
}

/// Index of the first occurrence of `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
