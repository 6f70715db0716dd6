//! One streamed chat completion of `kv-route`, over a blocking HTTP/1.1 connection to
//! 127.0.0.1: the request, the response head, the body de-chunked ([`Dechunker`]), split into
//! SSE events ([`SseSplitter`]), and each event's JSON folded into a [`Streamed`] outcome (time
//! to the first content, usage, the answer, the response id).
//!
//! Invariants: the parsers are pure and incremental (any split of the bytes into reads gives
//! the same events); one request is bounded by the socket timeouts and an overall deadline,
//! its head by [`MAX_HEAD`] and its body by [`MAX_BODY`]; the connection is `Connection:
//! close`, so nothing outlives the request.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Largest response head read.
const MAX_HEAD: usize = 64 * 1024;
/// Largest response body read (de-chunked or not).
const MAX_BODY: usize = 16 * 1024 * 1024;

/// What one streamed request gave.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Streamed {
    /// Status code.
    pub(crate) status: u16,
    /// The value of the header asked for, if the response had it.
    pub(crate) header: Option<String>,
    /// Seconds from just before the request was written to the first SSE event with non-empty
    /// `choices[].delta.content`.
    pub(crate) ttft: Option<f64>,
    /// Seconds to the first SSE `data:` event of any kind.
    pub(crate) first_event: Option<f64>,
    /// `usage.prompt_tokens` of the usage chunk.
    pub(crate) prompt_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens` (0 when the usage chunk lacks it).
    pub(crate) cached_tokens: Option<u64>,
    /// The concatenated delta content (the assistant's answer).
    pub(crate) content: String,
    /// The chunks' `id` (`chatcmpl-<request id>`).
    pub(crate) id: Option<String>,
    /// Whether `data: [DONE]` arrived.
    pub(crate) done: bool,
}

impl Streamed {
    /// Folds one SSE event's data (`at` seconds after the request) into the outcome.
    pub(crate) fn event(&mut self, data: &str, at: f64) {
        if self.first_event.is_none() {
            self.first_event = Some(at);
        }
        if data.trim() == "[DONE]" {
            self.done = true;
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        if self.id.is_none() {
            self.id = v["id"].as_str().map(str::to_owned);
        }
        for choice in v["choices"].as_array().into_iter().flatten() {
            if let Some(c) = choice["delta"]["content"]
                .as_str()
                .filter(|c| !c.is_empty())
            {
                if self.ttft.is_none() {
                    self.ttft = Some(at);
                }
                self.content.push_str(c);
            }
        }
        if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
            self.prompt_tokens = usage["prompt_tokens"].as_u64();
            self.cached_tokens = Some(
                usage["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .unwrap_or(0),
            );
        }
    }
}

/// An incremental decoder of a `Transfer-Encoding: chunked` body.
#[derive(Debug, Clone, Default)]
pub(crate) struct Dechunker {
    state: ChunkState,
    line: Vec<u8>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum ChunkState {
    /// Reading a chunk-size line.
    #[default]
    Size,
    /// Inside a chunk, this many bytes left.
    Data(usize),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// Trailer lines after the last chunk.
    Trailer,
    /// The body is complete.
    Done,
    /// The framing was malformed.
    Broken,
}

impl Dechunker {
    /// Feeds `input`, appending the payload bytes to `out`.
    pub(crate) fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) {
        while !input.is_empty() {
            match self.state {
                ChunkState::Done | ChunkState::Broken => return,
                ChunkState::Data(n) => {
                    let take = n.min(input.len());
                    out.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    self.state = if take == n {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(n - take)
                    };
                }
                ChunkState::Size | ChunkState::DataEnd | ChunkState::Trailer => {
                    let Some(nl) = input.iter().position(|&b| b == b'\n') else {
                        self.line.extend_from_slice(input);
                        if self.line.len() > 4096 {
                            self.state = ChunkState::Broken;
                        }
                        return;
                    };
                    self.line.extend_from_slice(&input[..nl]);
                    input = &input[nl + 1..];
                    let line = std::mem::take(&mut self.line);
                    let line = String::from_utf8_lossy(&line);
                    let line = line.trim();
                    self.state = match self.state {
                        ChunkState::DataEnd if line.is_empty() => ChunkState::Size,
                        ChunkState::Trailer if line.is_empty() => ChunkState::Done,
                        ChunkState::Trailer => ChunkState::Trailer,
                        ChunkState::Size => {
                            let hex = line.split(';').next().unwrap_or("").trim();
                            match usize::from_str_radix(hex, 16) {
                                Ok(0) => ChunkState::Trailer,
                                Ok(n) => ChunkState::Data(n),
                                Err(_) => ChunkState::Broken,
                            }
                        }
                        _ => ChunkState::Broken,
                    };
                }
            }
        }
    }

    /// Whether the last chunk and the trailer were read.
    pub(crate) fn done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// Whether the framing was malformed.
    pub(crate) fn broken(&self) -> bool {
        self.state == ChunkState::Broken
    }
}

/// An incremental splitter of an SSE stream into the data of its events.
#[derive(Debug, Clone, Default)]
pub(crate) struct SseSplitter {
    buf: Vec<u8>,
}

impl SseSplitter {
    /// Feeds payload bytes; returns the data of every event completed by them (the `data:`
    /// lines of one event joined by `\n`; events without data are skipped).
    pub(crate) fn feed(&mut self, input: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(input);
        let mut events = Vec::new();
        loop {
            let lf = find(&self.buf, b"\n\n");
            let crlf = find(&self.buf, b"\r\n\r\n");
            let (end, sep) = match (lf, crlf) {
                (Some(a), Some(b)) if b < a => (b, 4),
                (Some(a), _) => (a, 2),
                (None, Some(b)) => (b, 4),
                (None, None) => break,
            };
            let event: Vec<u8> = self.buf.drain(..end + sep).take(end).collect();
            let text = String::from_utf8_lossy(&event);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if !data.is_empty() {
                events.push(data.join("\n"));
            }
        }
        events
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A request to send.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    /// Port on 127.0.0.1.
    pub(crate) port: u16,
    /// Extra headers (pins).
    pub(crate) headers: &'a [(&'a str, String)],
    /// The JSON body.
    pub(crate) body: &'a str,
    /// The response header to report in [`Streamed::header`], if any.
    pub(crate) want_header: Option<&'a str>,
    /// Per-operation socket timeout.
    pub(crate) io_timeout: Duration,
    /// Overall deadline of the request.
    pub(crate) deadline: Instant,
}

/// POSTs `req` to `/v1/chat/completions` and reads the streamed answer. A non-200 answer is
/// returned (with its status), not an error; I/O failures, timeouts and malformed framing are.
pub(crate) fn post(req: &Request<'_>) -> std::io::Result<Streamed> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, req.port));
    let mut s = TcpStream::connect_timeout(&addr, req.io_timeout)?;
    s.set_read_timeout(Some(req.io_timeout))?;
    s.set_write_timeout(Some(req.io_timeout))?;
    s.set_nodelay(true)?;
    let mut head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: \
         application/json\r\nAccept: text/event-stream\r\nContent-Length: {}\r\nConnection: \
         close\r\n",
        req.port,
        req.body.len(),
    );
    for (k, v) in req.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let start = Instant::now();
    s.write_all(head.as_bytes())?;
    s.write_all(req.body.as_bytes())?;
    let mut out = Streamed::default();
    let mut buf = vec![0u8; 64 * 1024];
    let mut raw = Vec::new();
    let split = loop {
        if let Some(p) = find(&raw, b"\r\n\r\n") {
            break p;
        }
        if raw.len() > MAX_HEAD {
            return Err(invalid("response head too large"));
        }
        let n = read_some(&mut s, &mut buf, req.deadline)?;
        if n == 0 {
            return Err(invalid("connection closed before the response head"));
        }
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    out.status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| invalid("no status code"))?;
    let header = |name: &str| {
        head.lines().skip(1).find_map(|line| {
            let (k, v) = line.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    out.header = req.want_header.and_then(header);
    let chunked = header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    let length: Option<usize> = header("content-length").and_then(|v| v.parse().ok());
    let mut dechunk = Dechunker::default();
    let mut sse = SseSplitter::default();
    let mut body_len = 0usize;
    let mut pending = raw.split_off(split + 4);
    loop {
        let mut payload = Vec::new();
        if chunked {
            dechunk.feed(&pending, &mut payload);
        } else {
            payload = std::mem::take(&mut pending);
        }
        pending.clear();
        body_len += payload.len();
        let at = start.elapsed().as_secs_f64();
        for data in sse.feed(&payload) {
            out.event(&data, at);
        }
        if dechunk.broken() {
            return Err(invalid("malformed chunked framing"));
        }
        let complete = if chunked {
            dechunk.done()
        } else {
            length.is_some_and(|l| body_len >= l)
        };
        if complete || out.done && out.status == 200 {
            return Ok(out);
        }
        if body_len > MAX_BODY {
            return Err(invalid("response body too large"));
        }
        let n = read_some(&mut s, &mut buf, req.deadline)?;
        if n == 0 {
            if chunked || length.is_some() {
                return Err(invalid("connection closed inside the body"));
            }
            return Ok(out);
        }
        pending.extend_from_slice(&buf[..n]);
    }
}

/// One read, failing once `deadline` has passed.
fn read_some(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<usize> {
    if Instant::now() >= deadline {
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "request deadline passed",
        ));
    }
    s.read(buf)
}

fn invalid(what: &'static str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    const USAGE: &str = r#"{"id":"chatcmpl-7e2c","choices":[],"usage":{"prompt_tokens":1973,"completion_tokens":4,"total_tokens":1977,"prompt_tokens_details":{"cached_tokens":1920}}}"#;

    fn chunked(parts: &[&str]) -> Vec<u8> {
        let mut b = Vec::new();
        for p in parts {
            b.extend_from_slice(format!("{:x}\r\n{p}\r\n", p.len()).as_bytes());
        }
        b.extend_from_slice(b"0\r\n\r\n");
        b
    }

    fn body() -> Vec<u8> {
        let first = r#"data: {"id":"chatcmpl-7e2c","choices":[{"index":0,"delta":{"content":"","role":"assistant"}}]}"#;
        let second =
            r#"data: {"id":"chatcmpl-7e2c","choices":[{"index":0,"delta":{"content":"deco"}}]}"#;
        let third =
            r#"data: {"id":"chatcmpl-7e2c","choices":[{"index":0,"delta":{"content":" toge"}}]}"#;
        let usage = format!("data: {USAGE}\n\n");
        // The usage event spans two chunks; the last chunk carries the end of one event and
        // the whole of the next.
        let (u1, u2) = usage.split_at(40);
        chunked(&[
            &format!("{first}\n\n"),
            &format!("{second}\n\n{third}\n\n"),
            u1,
            &format!("{u2}data: [DONE]\n\n"),
        ])
    }

    fn run(bytes: &[u8], step: usize) -> (Streamed, bool) {
        let mut d = Dechunker::default();
        let mut sse = SseSplitter::default();
        let mut out = Streamed::default();
        for (i, piece) in bytes.chunks(step).enumerate() {
            let mut payload = Vec::new();
            d.feed(piece, &mut payload);
            for data in sse.feed(&payload) {
                out.event(&data, i as f64);
            }
        }
        (out, d.done())
    }

    #[test]
    fn dechunks_and_splits_at_any_read_size() {
        let bytes = body();
        let (whole, done) = run(&bytes, bytes.len());
        assert!(done);
        assert!(whole.done);
        assert_eq!(whole.prompt_tokens, Some(1973));
        assert_eq!(whole.cached_tokens, Some(1920));
        assert_eq!(whole.content, "deco toge");
        assert_eq!(whole.id.as_deref(), Some("chatcmpl-7e2c"));
        for step in [1, 2, 3, 7, 16, 41, 100] {
            let (s, done) = run(&bytes, step);
            assert!(done, "step {step}");
            assert_eq!(
                (s.prompt_tokens, s.cached_tokens, &s.content, s.done),
                (Some(1973), Some(1920), &whole.content, true),
                "step {step}"
            );
        }
    }

    #[test]
    fn ttft_is_the_first_non_empty_content() {
        let mut s = Streamed::default();
        s.event(
            r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#,
            0.5,
        );
        s.event(r#"{"choices":[{"delta":{"content":"x"}}]}"#, 0.7);
        s.event(r#"{"choices":[{"delta":{"content":"y"}}]}"#, 0.9);
        assert_eq!((s.first_event, s.ttft), (Some(0.5), Some(0.7)));
        // A usage chunk without the details counts no cached tokens.
        s.event(r#"{"choices":[],"usage":{"prompt_tokens":10}}"#, 1.0);
        assert_eq!((s.prompt_tokens, s.cached_tokens), (Some(10), Some(0)));
        // `usage: null` on content chunks is ignored.
        s.event(r#"{"choices":[],"usage":null}"#, 1.1);
        assert_eq!(s.prompt_tokens, Some(10));
    }

    #[test]
    fn sse_accepts_crlf_and_multi_line_data_and_rejects_bad_chunks() {
        let mut sse = SseSplitter::default();
        assert_eq!(
            sse.feed(b": ping\r\n\r\ndata: a\r\ndata: b\r\n\r\ndata:c\n"),
            ["a\nb"]
        );
        assert_eq!(sse.feed(b"\n"), ["c"]);
        let mut d = Dechunker::default();
        let mut out = Vec::new();
        d.feed(b"zz\r\n", &mut out);
        assert!(d.broken());
        let mut d = Dechunker::default();
        d.feed(b"3;ext=1\r\nabc\r\n0\r\nx-trailer: 1\r\n\r\n", &mut out);
        assert!(d.done());
        assert_eq!(out, b"abc");
    }
}
