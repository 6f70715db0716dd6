//! Blocking HTTP/1.1 probes on 127.0.0.1 used to decide when a server is
//! ready, plus free-port discovery.
//!
//! Invariant: every probe is bounded (connect, read and write timeouts, and
//! an overall deadline in [`wait_ready`]); probes use `Connection: close`
//! so they never hold a keep-alive slot during measurement.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::child::Supervised;
use crate::error::BenchError;

/// Per-operation socket timeout of a probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The chat request every probe and wrk send.
pub(crate) const CHAT_BODY: &str = concat!(
    r#"{"model":"bench-model","messages":[{"role":"system","content":"You are terse."},"#,
    r#"{"role":"user","content":"Say hello."}],"max_tokens":16}"#
);

/// The client API key the router under test requires (`auth`), sent by every probe and by wrk
/// (nginx and the backends ignore it).
pub(crate) const BENCH_KEY: &str = "continuum-bench-key";
/// `sha256:` + SHA-256 of [`BENCH_KEY`] (checked by a unit test of `servers`).
pub(crate) const BENCH_KEY_HASH: &str =
    "sha256:112a2eac56df5b4faf1c5aa319115537e690254e1b6f01c12efd48c5a9d6978e";

/// A request a probe sends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Probe {
    /// `GET` or `POST`.
    pub(crate) method: &'static str,
    /// Request path.
    pub(crate) path: &'static str,
    /// Body (sent as JSON when non-empty).
    pub(crate) body: &'static str,
}

/// `POST /v1/chat/completions` with [`CHAT_BODY`].
pub(crate) const CHAT: Probe = Probe {
    method: "POST",
    path: "/v1/chat/completions",
    body: CHAT_BODY,
};

/// `GET /health`.
pub(crate) const HEALTH: Probe = Probe {
    method: "GET",
    path: "/health",
    body: "",
};

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub(crate) fn free_port() -> Result<u16, BenchError> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(BenchError::io("binding a probe socket"))?;
    Ok(l.local_addr()
        .map_err(BenchError::io("reading a probe socket address"))?
        .port())
}

/// Sends `probe` to `127.0.0.1:port`, returns the response status code.
pub(crate) fn status(port: u16, probe: Probe) -> std::io::Result<u16> {
    let auth = format!("Bearer {BENCH_KEY}");
    request(
        port,
        probe.method,
        probe.path,
        &[("authorization", &auth)],
        probe.body,
    )
    .map(|r| r.status)
}

/// A response read by [`request`].
#[derive(Debug, Clone)]
pub(crate) struct Response {
    /// Status code.
    pub(crate) status: u16,
    /// Status line and headers, as sent.
    pub(crate) head: String,
    /// Body bytes (at most the read cap of the message), not de-chunked.
    pub(crate) body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (case-insensitive), trimmed.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (k, v) = line.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    /// The body as text (lossy), for messages.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request to `127.0.0.1:port` with `Connection: close` and reads
/// the whole response (bounded by [`PROBE_TIMEOUT`] per operation and 1 MiB).
pub(crate) fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<Response> {
    request_capped(port, method, path, headers, body, 1024 * 1024)
}

/// [`request`], reading at most `max_bytes` of the response.
pub(crate) fn request_capped(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
    max_bytes: u64,
) -> std::io::Result<Response> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut s = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)?;
    s.set_read_timeout(Some(PROBE_TIMEOUT))?;
    s.set_write_timeout(Some(PROBE_TIMEOUT))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len(),
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes())?;
    let mut resp = Vec::new();
    s.take(max_bytes).read_to_end(&mut resp)?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP response");
    let split = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(bad)?;
    let head = String::from_utf8_lossy(&resp[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(bad)?;
    Ok(Response {
        status,
        head,
        body: resp[split + 4..].to_vec(),
    })
}

/// Probes until the server answers 200, the child exits, or `timeout`.
pub(crate) fn wait_ready(
    child: &mut Supervised,
    port: u16,
    probe: Probe,
    timeout: Duration,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + timeout;
    loop {
        if crate::signals::interrupted() {
            return Err(BenchError::Interrupted);
        }
        child.ensure_running()?;
        let detail = match status(port, probe) {
            Ok(200) => return Ok(()),
            Ok(code) => format!("{} {} answered {code}", probe.method, probe.path),
            Err(e) => format!("{} {}: {e}", probe.method, probe.path),
        };
        if Instant::now() >= deadline {
            return Err(BenchError::NotReady {
                what: child.what(),
                secs: timeout.as_secs(),
                detail,
                log: child.log_tail(),
            });
        }
        sleep(Duration::from_millis(50));
    }
}
