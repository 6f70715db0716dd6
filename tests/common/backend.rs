//! `MockBackend`: a scripted loopback OpenAI-style backend (std threads, std `TcpListener`,
//! HTTP/1.1 keep-alive).
//!
//! Every request is recorded (method, path, headers as sent, decoded body) before it is
//! answered. Answers come from a FIFO of queued one-off [`Reply`]s, else from the installed
//! handler, else from [`default_reply`]. A streamed answer ([`MockBackend::push_sse`]) writes
//! one chunk per event, each released by the test through an [`SseSender`], so a test can check
//! that the router relays an event before the backend produces the next one.
//!
//! Threads are bounded: the accept loop and every connection loop poll a stop flag every
//! 100 ms and end when the backend is dropped; a streamed reply waits at most
//! [`SSE_EVENT_WAIT`] for each event before aborting the connection.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::client::{find, find_header};

/// The event [`SseSender::abort`] sends: never a real event (starts with NUL).
const ABORT_MARK: &[u8] = b"\0abort";

/// How long a streamed reply waits for the test to release its next event.
pub const SSE_EVENT_WAIT: Duration = Duration::from_secs(30);

/// One request as the backend received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// Request method.
    pub method: String,
    /// Request target as sent.
    pub path: String,
    /// Headers in wire order, names as sent.
    pub headers: Vec<(String, String)>,
    /// The decoded body (chunked framing removed).
    pub body: Vec<u8>,
    /// Whether the body came with `Transfer-Encoding: chunked`.
    pub chunked: bool,
    /// Which accepted connection (0-based) carried it.
    pub conn_id: u64,
}

impl RecordedRequest {
    /// The first header named `name` (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// The body as (lossy) UTF-8.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// How the backend answers one request.
#[derive(Debug)]
pub enum Reply {
    /// A buffered response with `Content-Length`.
    Full {
        /// Status code.
        status: u16,
        /// Extra headers (`Content-Length` is added).
        headers: Vec<(String, String)>,
        /// Body bytes, sent exactly.
        body: Vec<u8>,
    },
    /// A chunked response, one chunk per event received; ends when the sender is dropped.
    Stream {
        /// Headers (`Transfer-Encoding: chunked` is added).
        headers: Vec<(String, String)>,
        /// Events, released by the test.
        events: Receiver<Vec<u8>>,
    },
    /// Close the connection without answering.
    Close,
}

impl Reply {
    /// A 200 JSON response with `body` sent byte-exact.
    pub fn json(body: &[u8]) -> Reply {
        Reply::Full {
            status: 200,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: body.to_vec(),
        }
    }

    /// A JSON response with `status`.
    pub fn json_status(status: u16, body: &[u8]) -> Reply {
        Reply::Full {
            status,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: body.to_vec(),
        }
    }
}

/// Releases the events of one streamed reply.
#[derive(Debug)]
pub struct SseSender {
    tx: Option<Sender<Vec<u8>>>,
}

impl SseSender {
    /// Lets the backend write `event` as its next chunk.
    pub fn send(&self, event: &[u8]) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(event.to_vec());
        }
    }

    /// Ends the stream (the backend writes the last chunk).
    pub fn finish(mut self) {
        self.tx = None;
    }

    /// Breaks the stream: the backend closes the connection without the last chunk.
    pub fn abort(mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(ABORT_MARK.to_vec());
        }
    }
}

type Handler = Box<dyn Fn(&RecordedRequest) -> Reply + Send>;

struct Shared {
    name: String,
    stop: AtomicBool,
    requests: Mutex<Vec<RecordedRequest>>,
    arrived: Condvar,
    queue: Mutex<VecDeque<Reply>>,
    handler: Mutex<Option<Handler>>,
    conns: AtomicU64,
    /// The next connection id (ids stay unique whatever `conns` does).
    next_id: AtomicU64,
    /// The status the router's health probes get.
    health_status: AtomicU16,
    /// Health probes answered (not recorded as requests, their connections not counted).
    probes: AtomicU64,
}

/// A scripted loopback backend; stops when dropped.
pub struct MockBackend {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockBackend")
            .field("name", &self.shared.name)
            .field("addr", &self.addr)
            .finish()
    }
}

/// The default answer: a small chat completion naming the backend and the request number.
pub fn default_reply(name: &str, n: usize) -> Reply {
    let body = format!(
        "{{\"id\":\"chatcmpl-{name}-{n}\",\"object\":\"chat.completion\",\"backend\":\"{name}\",\
         \"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"hi\"}},\
         \"finish_reason\":\"stop\"}}]}}"
    );
    Reply::json(body.as_bytes())
}

/// A loopback URL on which nothing listens (connections are refused).
pub fn refusing_url() -> String {
    format!("http://127.0.0.1:{}", super::free_port())
}

impl MockBackend {
    /// Starts a backend named `name` on an ephemeral loopback port.
    pub fn start(name: &str) -> MockBackend {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind mock backend");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let addr = listener.local_addr().expect("mock backend addr");
        let shared = Arc::new(Shared {
            name: name.to_string(),
            stop: AtomicBool::new(false),
            requests: Mutex::new(Vec::new()),
            arrived: Condvar::new(),
            queue: Mutex::new(VecDeque::new()),
            handler: Mutex::new(None),
            conns: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
            health_status: AtomicU16::new(200),
            probes: AtomicU64::new(0),
        });
        let s = Arc::clone(&shared);
        let accept = std::thread::spawn(move || accept_loop(&listener, &s));
        MockBackend {
            addr,
            shared,
            accept: Some(accept),
        }
    }

    /// The backend's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Installs a handler used when no queued reply is pending.
    pub fn set_handler(&self, f: impl Fn(&RecordedRequest) -> Reply + Send + 'static) {
        *self.shared.handler.lock().unwrap() = Some(Box::new(f));
    }

    /// Queues a one-off reply for the next request.
    pub fn push_reply(&self, reply: Reply) {
        self.shared.queue.lock().unwrap().push_back(reply);
    }

    /// Queues an SSE reply (`text/event-stream`, plus an `X-Dynamo-Worker-Instance-Id` header
    /// the router must strip) for the next request; returns its event sender.
    pub fn push_sse(&self) -> SseSender {
        let (tx, rx) = channel();
        self.push_reply(Reply::Stream {
            headers: vec![
                ("Content-Type".into(), "text/event-stream".into()),
                ("Cache-Control".into(), "no-cache".into()),
                ("X-Dynamo-Worker-Instance-Id".into(), "42".into()),
            ],
            events: rx,
        });
        SseSender { tx: Some(tx) }
    }

    /// All requests received so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Number of requests received so far.
    pub fn request_count(&self) -> usize {
        self.shared.requests.lock().unwrap().len()
    }

    /// Answer the router's health probes with `status` from now on (200 at start).
    pub fn set_health_status(&self, status: u16) {
        self.shared.health_status.store(status, Ordering::SeqCst);
    }

    /// Number of health probes answered so far.
    pub fn health_probes(&self) -> u64 {
        self.shared.probes.load(Ordering::SeqCst)
    }

    /// Number of connections accepted so far (health probes' not counted).
    pub fn connections(&self) -> u64 {
        self.shared.conns.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` requests arrived; panics after `timeout`.
    pub fn wait_requests(&self, n: usize, timeout: Duration) -> Vec<RecordedRequest> {
        let deadline = Instant::now() + timeout;
        let mut reqs = self.shared.requests.lock().unwrap();
        while reqs.len() < n {
            let now = Instant::now();
            assert!(
                now < deadline,
                "backend {} got {} request(s), expected {n} within {timeout:?}",
                self.shared.name,
                reqs.len()
            );
            reqs = self
                .shared
                .arrived
                .wait_timeout(reqs, deadline - now)
                .unwrap()
                .0;
        }
        reqs.clone()
    }
}

impl Drop for MockBackend {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                shared.conns.fetch_add(1, Ordering::SeqCst);
                let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
                let s = Arc::clone(shared);
                std::thread::spawn(move || serve_conn(stream, &s, id));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Reads into `buf` until `pred(buf)` yields a value; `None` on EOF, error or stop.
fn read_until<T>(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    shared: &Shared,
    mut pred: impl FnMut(&[u8]) -> Option<T>,
) -> Option<T> {
    let mut tmp = [0u8; 16 * 1024];
    loop {
        if let Some(v) = pred(buf) {
            return Some(v);
        }
        if shared.stop.load(Ordering::SeqCst) || buf.len() > 64 * 1024 * 1024 {
            return None;
        }
        match stream.read(&mut tmp) {
            Ok(0) => return None,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

fn serve_conn(mut stream: TcpStream, shared: &Shared, conn_id: u64) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = Vec::new();
    loop {
        let Some(head_end) = read_until(&mut stream, &mut buf, shared, |b| find(b, b"\r\n\r\n"))
        else {
            return;
        };
        let head: Vec<u8> = buf.drain(..head_end + 4).collect();
        let Some((method, path, headers)) = parse_request_head(&head) else {
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
            return;
        };
        let chunked = find_header(&headers, "transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        let body = if chunked {
            match read_chunked(&mut stream, &mut buf, shared) {
                Some(b) => b,
                None => return,
            }
        } else {
            let len: usize = find_header(&headers, "content-length")
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if read_until(&mut stream, &mut buf, shared, |b| {
                (b.len() >= len).then_some(())
            })
            .is_none()
            {
                return;
            }
            buf.drain(..len).collect()
        };
        let close = find_header(&headers, "connection")
            .is_some_and(|v| v.to_ascii_lowercase().contains("close"));
        if method == "GET"
            && find_header(&headers, "user-agent") == Some("continuum-router-health-check")
        {
            // The router's active health check, answered like a frontend's `/health`; it is not
            // traffic, so it is neither recorded nor counted as a connection.
            // The status is taken before the probe is counted, so a test that changes it after
            // seeing the count changes the next probe's answer, never this one's.
            let status = shared.health_status.load(Ordering::SeqCst);
            shared.conns.fetch_sub(1, Ordering::SeqCst);
            shared.probes.fetch_add(1, Ordering::SeqCst);
            let _ = write_reply(
                &mut stream,
                Reply::json_status(status, br#"{"status":"healthy"}"#),
            );
            return;
        }
        let req = RecordedRequest {
            method,
            path,
            headers,
            body,
            chunked,
            conn_id,
        };
        let reply = {
            let queued = shared.queue.lock().unwrap().pop_front();
            match queued {
                Some(r) => r,
                None => {
                    let n = shared.requests.lock().unwrap().len();
                    match shared.handler.lock().unwrap().as_ref() {
                        Some(h) => h(&req),
                        None => default_reply(&shared.name, n),
                    }
                }
            }
        };
        {
            let mut reqs = shared.requests.lock().unwrap();
            reqs.push(req);
            shared.arrived.notify_all();
        }
        if !write_reply(&mut stream, reply) || close {
            return;
        }
    }
}

/// Writes `reply`; false if the connection must end.
fn write_reply(stream: &mut TcpStream, reply: Reply) -> bool {
    match reply {
        Reply::Close => false,
        Reply::Full {
            status,
            headers,
            body,
        } => {
            let mut out = format!("HTTP/1.1 {status} {}\r\n", reason(status)).into_bytes();
            for (n, v) in &headers {
                out.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
            }
            out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
            out.extend_from_slice(&body);
            stream.write_all(&out).is_ok()
        }
        Reply::Stream { headers, events } => {
            let mut out = b"HTTP/1.1 200 OK\r\n".to_vec();
            for (n, v) in &headers {
                out.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
            }
            out.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
            if stream.write_all(&out).is_err() {
                return false;
            }
            loop {
                match events.recv_timeout(SSE_EVENT_WAIT) {
                    Ok(ev) if ev.is_empty() => {}
                    Ok(ev) if ev == ABORT_MARK => return false,
                    Ok(ev) => {
                        let mut chunk = format!("{:x}\r\n", ev.len()).into_bytes();
                        chunk.extend_from_slice(&ev);
                        chunk.extend_from_slice(b"\r\n");
                        if stream.write_all(&chunk).is_err() {
                            return false;
                        }
                    }
                    Err(RecvTimeoutError::Disconnected) => {
                        return stream.write_all(b"0\r\n\r\n").is_ok();
                    }
                    Err(RecvTimeoutError::Timeout) => return false,
                }
            }
        }
    }
}

fn read_chunked(stream: &mut TcpStream, buf: &mut Vec<u8>, shared: &Shared) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = read_until(stream, buf, shared, |b| find(b, b"\r\n"))?;
        let line = String::from_utf8_lossy(&buf[..line_end]).into_owned();
        let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        buf.drain(..line_end + 2);
        if size == 0 {
            // Trailers up to the empty line.
            loop {
                let end = read_until(stream, buf, shared, |b| find(b, b"\r\n"))?;
                buf.drain(..end + 2);
                if end == 0 {
                    return Some(body);
                }
            }
        }
        read_until(stream, buf, shared, |b| (b.len() >= size + 2).then_some(()))?;
        body.extend(buf.drain(..size));
        buf.drain(..2);
    }
}

/// Method, target and headers of a request head.
type Head = (String, String, Vec<(String, String)>);

fn parse_request_head(head: &[u8]) -> Option<Head> {
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.split("\r\n");
    let mut parts = lines.next()?.split(' ');
    let method = parts.next()?.to_string();
    let path = parts.next()?.to_string();
    let mut headers = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let (n, v) = line.split_once(':')?;
        headers.push((n.to_string(), v.trim().to_string()));
    }
    Some((method, path, headers))
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}
