//! End-to-end failure paths: a client that goes away cancels the upstream request, a silent
//! backend times out with 504, startup failures (port taken, CPU missing) exit with a clear error
//! instead of a panic, and the epoll fallback driver relays like io_uring does.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{
    Conn, MockBackend, RouterConfig, RouterProcess, STEP, chat, chat_body, chat_bytes, run_cli,
};

/// What a raw backend does after reading one request head.
#[derive(Clone, Copy)]
enum Script {
    /// Send an SSE response head and one event, then wait.
    OneEvent,
    /// Never answer.
    Silent,
    /// Read the request head, then stop reading for `STUCK_FOR` (a backend that does not take
    /// the request body).
    Stuck,
}

/// How long a [`Script::Stuck`] backend stops reading.
const STUCK_FOR: Duration = Duration::from_secs(3);

/// A one-connection raw backend that reports (on the returned channel) how long after its
/// scripted action the router closed the upstream connection, or `None` if it never did within
/// `STEP`.
fn raw_backend(script: Script) -> (SocketAddr, mpsc::Receiver<Option<Duration>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0u8; 65536];
        let mut got = Vec::new();
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                let _ = tx.send(Some(Duration::ZERO));
                return;
            }
            got.extend_from_slice(&buf[..n]);
        }
        if let Script::Stuck = script {
            std::thread::sleep(STUCK_FOR);
        }
        if let Script::OneEvent = script {
            let ev = b"data: {\"n\":1}\n\n";
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
            s.write_all(head.as_bytes()).unwrap();
            s.write_all(format!("{:x}\r\n", ev.len()).as_bytes())
                .unwrap();
            s.write_all(ev).unwrap();
            s.write_all(b"\r\n").unwrap();
        }
        let t0 = Instant::now();
        s.set_read_timeout(Some(STEP)).unwrap();
        let closed = loop {
            match s.read(&mut buf) {
                Ok(0) => break Some(t0.elapsed()),
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    break Some(t0.elapsed());
                }
                Err(_) => break None,
            }
        };
        let _ = tx.send(closed);
    });
    (addr, rx)
}

#[test]
fn client_leaving_a_stream_closes_the_upstream_connection() {
    let (backend, closed) = raw_backend(Script::OneEvent);
    let r = RouterProcess::start(&RouterConfig::default().backend(
        "raw",
        &format!("http://{backend}"),
        &["m1"],
    ));
    let mut conn = Conn::open(r.addr());
    conn.send_all(&chat_bytes(&chat_body("m1", "leave", true), &[]));
    let mut body = conn
        .stream_response(STEP)
        .unwrap_or_else(|e| panic!("no stream head: {e}"));
    body.expect_next(b"data: {\"n\":1}\n\n", STEP)
        .unwrap_or_else(|e| panic!("first event: {e}"));
    drop(body);
    drop(conn);
    let after = closed.recv_timeout(STEP + Duration::from_secs(1)).unwrap();
    assert!(
        after.is_some(),
        "router kept the upstream stream open after its client left"
    );
}

#[test]
fn client_leaving_before_the_response_closes_the_upstream_connection() {
    let (backend, closed) = raw_backend(Script::Silent);
    let r = RouterProcess::start(&RouterConfig::default().backend(
        "raw",
        &format!("http://{backend}"),
        &["m1"],
    ));
    let mut s = TcpStream::connect(r.addr()).unwrap();
    s.write_all(&chat_bytes(&chat_body("m1", "leave early", false), &[]))
        .unwrap();
    // Give the request time to reach the backend, then go away.
    std::thread::sleep(Duration::from_millis(300));
    drop(s);
    let after = closed.recv_timeout(STEP + Duration::from_secs(1)).unwrap();
    assert!(
        after.is_some(),
        "router kept waiting upstream after its client left"
    );
}

#[test]
fn silent_backend_times_out_with_504() {
    let (backend, closed) = raw_backend(Script::Silent);
    let mut cfg = RouterConfig::default().backend("raw", &format!("http://{backend}"), &["m1"]);
    cfg.upstream_first_byte = "300ms".into();
    let r = RouterProcess::start(&cfg);
    let started = Instant::now();
    let resp = chat(r.addr(), &chat_body("m1", "slow", false), &[]);
    let v = resp.assert_json_error(504);
    assert_eq!(v["code"], "upstream_timeout", "{v}");
    assert!(started.elapsed() < STEP, "timeout not applied");
    assert!(
        closed.recv_timeout(STEP).unwrap().is_some(),
        "timed-out upstream left open"
    );
}

/// A backend that reads the request head and then nothing: the router's write of a body far
/// larger than loopback socket buffers hold blocks, and must be bounded by the first-byte
/// timeout too; on either I/O driver.
fn stuck_backend_times_out_with_504(driver: Option<&str>) {
    let (backend, closed) = raw_backend(Script::Stuck);
    let mut cfg = RouterConfig::default().backend("raw", &format!("http://{backend}"), &["m1"]);
    cfg.upstream_first_byte = "300ms".into();
    cfg.max_body_bytes = 64 << 20;
    if let Some(d) = driver {
        cfg.env.push(("CONTINUUM_DRIVER".into(), d.into()));
    }
    let r = RouterProcess::start(&cfg);
    let big = "x".repeat(48 << 20);
    let mut conn = Conn::open(r.addr());
    let started = Instant::now();
    conn.send_all(&chat_bytes(&chat_body("m1", &big, false), &[]));
    let resp = conn.response();
    let took = started.elapsed();
    let v = resp.assert_json_error(504);
    assert_eq!(v["code"], "upstream_timeout", "{v}");
    assert!(
        took < STUCK_FOR,
        "the write was not bounded: answered after {took:?}"
    );
    assert!(
        closed.recv_timeout(STUCK_FOR + STEP).unwrap().is_some(),
        "the stuck upstream was left open"
    );
    // The client's connection is still good for the next request (its buffers came back).
    conn.send_all(&chat_bytes(&chat_body("m1", "next", false), &[]));
    let next = conn.response();
    assert!(next.status == 502 || next.status == 504, "{}", next.text());
}

#[test]
fn a_backend_that_does_not_take_the_request_times_out_with_504() {
    stuck_backend_times_out_with_504(None);
}

#[test]
fn a_backend_that_does_not_take_the_request_times_out_with_504_on_epoll() {
    stuck_backend_times_out_with_504(Some("epoll"));
}

fn raw_config(extra_server: &str, bind: SocketAddr) -> String {
    format!(
        "server:\n  bind_address: \"{bind}\"\n  shards: 1\n{extra_server}backends:\n  - name: b\n    type: openai\n    url: \"http://127.0.0.1:9\"\n    models: [\"m\"]\n"
    )
}

#[test]
fn taken_port_exits_1_with_a_bind_error_not_a_panic() {
    let holder = TcpListener::bind("127.0.0.1:0").unwrap();
    let bind = holder.local_addr().unwrap();
    let dir = common::TempDir::new("bind");
    let path = dir.write("r.yaml", &raw_config("", bind));
    let out = run_cli(&["--config", path.to_str().unwrap()]);
    assert_eq!(out.code, Some(1), "stderr:\n{}", out.stderr);
    assert!(
        out.stderr.contains("cannot bind"),
        "stderr:\n{}",
        out.stderr
    );
    assert!(!out.stderr.contains("panicked"), "stderr:\n{}", out.stderr);
}

#[test]
fn missing_cpu_exits_1_with_a_pin_error_not_a_panic() {
    let dir = common::TempDir::new("pin");
    let bind: SocketAddr = ([127, 0, 0, 1], common::free_port()).into();
    let path = dir.write("r.yaml", &raw_config("  cpu_affinity: [1000]\n", bind));
    let out = run_cli(&["--config", path.to_str().unwrap()]);
    assert_eq!(out.code, Some(1), "stderr:\n{}", out.stderr);
    assert!(
        out.stderr.contains("cannot pin shard-0 to CPU 1000"),
        "stderr:\n{}",
        out.stderr
    );
    assert!(!out.stderr.contains("panicked"), "stderr:\n{}", out.stderr);
}

#[test]
fn epoll_fallback_relays_buffered_and_streamed_chat() {
    let b = MockBackend::start("b1");
    let mut cfg = RouterConfig::default().backend("b1", &b.url(), &["m1"]);
    cfg.env.push(("CONTINUUM_DRIVER".into(), "epoll".into()));
    let r = RouterProcess::start(&cfg);
    let resp = chat(r.addr(), &chat_body("m1", "epoll", false), &[]);
    assert_eq!(resp.status, 200, "{}", resp.text());
    let sent = b.wait_requests(1, STEP);
    assert_eq!(sent[0].body, chat_body("m1", "epoll", false));
    let sse = b.push_sse();
    let mut conn = Conn::open(r.addr());
    conn.send_all(&chat_bytes(&chat_body("m1", "epoll stream", true), &[]));
    b.wait_requests(2, STEP);
    sse.send(b"data: a\n\n");
    let mut body = conn.stream_response(STEP).unwrap_or_else(|e| panic!("{e}"));
    body.expect_next(b"data: a\n\n", STEP)
        .unwrap_or_else(|e| panic!("{e}"));
    sse.send(b"data: [DONE]\n\n");
    body.expect_next(b"data: [DONE]\n\n", STEP)
        .unwrap_or_else(|e| panic!("{e}"));
    sse.finish();
    assert_eq!(body.finish(STEP).unwrap(), b"data: a\n\ndata: [DONE]\n\n");
    assert!(
        r.stderr().contains("driver=epoll"),
        "stderr:\n{}",
        r.stderr()
    );
}

/// A low soft open-files limit (a common 1,024, or less) is raised to the hard limit at startup:
/// with 1,000 workers the subscriptions alone need more than 1,024 descriptors.
#[test]
fn the_soft_open_files_limit_is_raised_to_the_hard_limit() {
    let b = common::MockBackend::start("b");
    let mut cfg = common::RouterConfig::default().backend("b", &b.url(), &["m"]);
    cfg.nofile = Some((256, 4096));
    let r = common::RouterProcess::start(&cfg);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", r.pid())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let nums: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(nums, ["4096", "4096"], "{line}");
    let resp = common::chat(r.addr(), &common::chat_body("m", "x", false), &[]);
    assert_eq!(resp.status, 200);
}
