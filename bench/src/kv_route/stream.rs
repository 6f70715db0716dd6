//! One streamed chat completion of `kv-route`, over a blocking HTTP/1.1 connection to
//! 127.0.0.1: the request, the response head, the body de-chunked and split into SSE events by
//! the router's own decoders (`continuum_core::http1::chunked`, `continuum_core::ingress::sse`),
//! and each event's JSON folded into a [`Streamed`] outcome (time to the first content, usage,
//! the answer, the response id).
//!
//! Invariants: any split of the bytes into reads gives the same events; one request is bounded by the socket timeouts and an overall deadline,
//! its head by [`MAX_HEAD`] and its body by [`MAX_BODY`]; the connection is `Connection:
//! close`, so nothing outlives the request.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use continuum_core::http1::chunked::ChunkedDecoder;
use continuum_core::ingress::sse::{DEFAULT_LINE_CAP, SseEvent, SseFramer};
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
    /// The data of the first error event (`event: error`, or JSON with an `error` key).
    pub(crate) error_event: Option<String>,
    /// The first [`BODY_HEAD`] bytes of a non-200 answer's body.
    pub(crate) body_head: String,
}

/// How much of a non-200 body [`Streamed::body_head`] keeps.
const BODY_HEAD: usize = 512;

impl Streamed {
    /// Folds one SSE event's data (`at` seconds after the request) into the outcome.
    pub(crate) fn event(&mut self, data: &str, at: f64) {
        if data.trim() == "[DONE]" {
            self.done = true;
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        if self.error_event.is_none() && v.get("error").is_some_and(|e| !e.is_null()) {
            self.error_event = Some(data.to_owned());
        }
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

/// One response body, de-chunked (when chunked) and framed into SSE events by the router's own
/// decoders ([`ChunkedDecoder`], [`SseFramer`]), each event folded into a [`Streamed`].
#[derive(Debug)]
struct BodyReader {
    chunked: Option<ChunkedDecoder>,
    sse: SseFramer,
    payload: Vec<u8>,
    events: Vec<SseEvent>,
}

impl BodyReader {
    fn new(chunked: bool) -> Self {
        Self {
            chunked: chunked.then(ChunkedDecoder::new),
            sse: SseFramer::new(DEFAULT_LINE_CAP),
            payload: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Feeds body bytes read `at` seconds after the request; returns the payload bytes they
    /// carried.
    fn feed(&mut self, bytes: &[u8], at: f64, out: &mut Streamed) -> std::io::Result<usize> {
        self.payload.clear();
        match &mut self.chunked {
            Some(d) => {
                let payload = &mut self.payload;
                d.feed(bytes, |data| payload.extend_from_slice(data))
                    .map_err(|_| invalid("malformed chunked framing"))?;
            }
            None => self.payload.extend_from_slice(bytes),
        }
        self.sse
            .push(&self.payload, &mut self.events)
            .map_err(|_| invalid("SSE line too long"))?;
        for e in self.events.drain(..) {
            if out.error_event.is_none() && e.event.as_deref() == Some("error") {
                out.error_event = Some(e.data.clone());
            }
            out.event(&e.data, at);
        }
        if out.status != 200 && out.body_head.len() < BODY_HEAD {
            let room = BODY_HEAD - out.body_head.len();
            let take = &self.payload[..self.payload.len().min(room)];
            out.body_head.push_str(&String::from_utf8_lossy(take));
        }
        Ok(self.payload.len())
    }

    /// Whether a chunked body's last chunk and trailer were read.
    fn chunked_done(&self) -> bool {
        self.chunked.as_ref().is_some_and(ChunkedDecoder::is_done)
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
    let mut out = Streamed::default();
    post_into(req, &mut out)?;
    Ok(out)
}

/// [`post`], folding what arrives into `out` as it arrives, so a failed request still shows
/// what came before the failure (the status, an error event, partial content).
pub(crate) fn post_into(req: &Request<'_>, out: &mut Streamed) -> std::io::Result<()> {
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
    let mut body = BodyReader::new(chunked);
    let mut body_len = 0usize;
    let mut pending = raw.split_off(split + 4);
    loop {
        let at = start.elapsed().as_secs_f64();
        body_len += body.feed(&pending, at, out)?;
        pending.clear();
        let complete = if chunked {
            body.chunked_done()
        } else {
            length.is_some_and(|l| body_len >= l)
        };
        if complete || out.done && out.status == 200 {
            return Ok(());
        }
        if body_len > MAX_BODY {
            return Err(invalid("response body too large"));
        }
        let n = read_some(&mut s, &mut buf, req.deadline)?;
        if n == 0 {
            if chunked || length.is_some() {
                return Err(invalid("connection closed inside the body"));
            }
            return Ok(());
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
        let mut body = BodyReader::new(true);
        let mut out = Streamed::default();
        for (i, piece) in bytes.chunks(step).enumerate() {
            body.feed(piece, i as f64, &mut out).expect("well-formed");
        }
        (out, body.chunked_done())
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
        assert_eq!(s.ttft, Some(0.7));
        // A usage chunk without the details counts no cached tokens.
        s.event(r#"{"choices":[],"usage":{"prompt_tokens":10}}"#, 1.0);
        assert_eq!((s.prompt_tokens, s.cached_tokens), (Some(10), Some(0)));
        // `usage: null` on content chunks is ignored.
        s.event(r#"{"choices":[],"usage":null}"#, 1.1);
        assert_eq!(s.prompt_tokens, Some(10));
    }

    #[test]
    fn error_events_and_non_200_bodies_are_kept() {
        let mut body = BodyReader::new(false);
        let mut out = Streamed {
            status: 200,
            ..Streamed::default()
        };
        let bytes = b"event: error\ndata: {\"message\":\"worker gone\"}\n\n";
        body.feed(bytes, 0.1, &mut out).expect("well-formed");
        assert_eq!(
            out.error_event.as_deref(),
            Some(r#"{"message":"worker gone"}"#)
        );
        assert!(out.body_head.is_empty());
        let mut s = Streamed::default();
        s.event(r#"{"error":{"message":"boom","code":502}}"#, 0.2);
        assert!(s.error_event.is_some_and(|e| e.contains("boom")));
        s = Streamed::default();
        s.event(r#"{"choices":[],"error":null}"#, 0.2);
        assert!(s.error_event.is_none());
        let mut body = BodyReader::new(false);
        let mut out = Streamed {
            status: 503,
            ..Streamed::default()
        };
        body.feed(&[b'x'; 600], 0.0, &mut out).expect("plain body");
        body.feed(b"more", 0.0, &mut out).expect("plain body");
        assert_eq!(out.body_head.len(), BODY_HEAD);
    }

    #[test]
    fn malformed_chunking_is_an_error() {
        let mut body = BodyReader::new(true);
        let mut out = Streamed::default();
        assert!(body.feed(b"zz\r\n", 0.0, &mut out).is_err());
    }
}
