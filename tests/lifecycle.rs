//! End-to-end lifecycle: health and generation, hot reload (SIGHUP and file change) without
//! dropping an in-flight SSE stream, rejected reloads keeping the old config, and SIGTERM
//! draining an in-flight stream before exiting 0.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::ErrorKind;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::client::StreamingBody;
use common::{
    Conn, MockBackend, RouterConfig, RouterProcess, STEP, SseSender, chat, chat_body, chat_bytes,
    metric_value, request_bytes,
};

const EVENTS: [&[u8]; 4] = [
    b"data: {\"choices\":[{\"delta\":{\"content\":\"one\"}}]}\n\n",
    b"data: {\"choices\":[{\"delta\":{\"content\":\"two\"}}]}\n\n",
    b"data: {\"choices\":[{\"delta\":{\"content\":\"three\"}}]}\n\n",
    b"data: [DONE]\n\n",
];

const RELOADS: &str = "continuum_config_reloads_total";

/// Polls until connecting to the router is refused; panics after `timeout`.
fn wait_refused(r: &RouterProcess, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        match TcpStream::connect_timeout(&r.addr(), Duration::from_secs(1)) {
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => return,
            other => {
                assert!(
                    Instant::now() < deadline,
                    "router still accepts connections {timeout:?} after SIGTERM (last: {other:?}); \
                     stderr:\n{}",
                    r.stderr()
                );
                drop(other);
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

#[test]
fn health_and_generation_start_at_one() {
    let b = MockBackend::start("b1");
    let r = RouterProcess::start(&RouterConfig::default().backend("b1", &b.url(), &["m1"]));
    let h = r.get("/health");
    assert_eq!(h.status, 200);
    let v = h.json();
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["generation"], 1, "{v}");
    // Must hold as soon as the router reports ready, not after some warm-up.
    let text = r.metrics();
    assert_eq!(
        metric_value(&text, "continuum_config_generation", &[]),
        Some(1.0),
        "continuum_config_generation differs from /health's generation right after ready:\n{text}"
    );
}

#[test]
fn reload_adds_backend_while_sse_stream_keeps_flowing() {
    let b1 = MockBackend::start("b1");
    let b2 = MockBackend::start("b2");
    let cfg = RouterConfig::default().backend("b1", &b1.url(), &["m1"]);
    let r = RouterProcess::start(&cfg);
    assert_eq!(r.generation(), 1);
    chat(r.addr(), &chat_body("m2", "before", false), &[]).assert_json_error(404);

    // A long stream in flight through b1.
    let sse = b1.push_sse();
    let mut conn = Conn::open(r.addr());
    conn.send_all(&chat_bytes(&chat_body("m1", "long stream", true), &[]));
    b1.wait_requests(1, STEP);
    sse.send(EVENTS[0]);
    let mut body = conn
        .stream_response(STEP)
        .unwrap_or_else(|e| panic!("no stream head: {e}"));
    assert_eq!(body.head.status, 200);
    body.expect_next(EVENTS[0], STEP)
        .unwrap_or_else(|e| panic!("first event: {e}"));

    // Reload: add b2 serving a new model m2.
    r.write_config(&cfg.clone().backend("b2", &b2.url(), &["m2"]));
    r.sighup();
    let generation = r.wait_generation(2, STEP);

    // The stream started before the reload keeps flowing.
    sse.send(EVENTS[1]);
    body.expect_next(EVENTS[1], STEP)
        .unwrap_or_else(|e| panic!("event after reload: {e}"));

    // New requests see the new config.
    let resp = chat(
        r.addr(),
        &chat_body("m2", "after", false),
        &[("x-backend", "")],
    );
    assert_eq!(
        resp.status,
        200,
        "new backend not used after reload: {:?}",
        resp.text()
    );
    assert_eq!(resp.header("x-backend"), Some("b2"));
    assert_eq!(b2.wait_requests(1, STEP).len(), 1);
    let old = chat(
        r.addr(),
        &chat_body("m1", "old model", false),
        &[("x-backend", "")],
    );
    assert_eq!(
        (old.status, old.header("x-backend")),
        (200, Some("b1")),
        "{:?}",
        old.text()
    );

    finish_stream(sse, &mut body, 2, "across reload");

    let text = r.metrics();
    let applied = metric_value(&text, RELOADS, &[("result", "applied")]).unwrap_or(0.0);
    assert!(
        applied >= 1.0,
        "applied reloads {applied}; metrics:\n{text}"
    );
    // SIGHUP and the file watcher may both fire for one edit: allow a second apply.
    let gen_metric = metric_value(&text, "continuum_config_generation", &[]).unwrap_or(0.0);
    assert!(
        gen_metric >= generation as f64,
        "generation metric {gen_metric}; {text}"
    );
}

#[test]
fn config_file_change_is_applied_without_a_signal() {
    let b1 = MockBackend::start("b1");
    let b2 = MockBackend::start("b2");
    let cfg = RouterConfig::default().backend("b1", &b1.url(), &["m1"]);
    let r = RouterProcess::start(&cfg);
    // Edited right after ready: a watcher that takes its baseline (mtime, size) later than it
    // read the config misses this edit for good, which is what this test catches.
    r.write_config(&cfg.clone().backend("b2", &b2.url(), &["m2"]));
    r.wait_generation(2, STEP);
    let resp = chat(r.addr(), &chat_body("m2", "watched", false), &[]);
    assert_eq!(resp.status, 200, "body {:?}", resp.text());
}

#[test]
fn invalid_reload_is_rejected_and_old_config_keeps_serving() {
    let b1 = MockBackend::start("b1");
    let cfg = RouterConfig::default().backend("b1", &b1.url(), &["m1"]);
    let r = RouterProcess::start(&cfg);
    let before = metric_value(&r.metrics(), RELOADS, &[("result", "rejected")]).unwrap_or(0.0);

    let mut bad = cfg.clone().backend("b1", "not a url", &["m2"]); // duplicate name, bad URL
    bad.max_body_bytes = 0;
    r.write_config(&bad);
    r.sighup();
    r.wait_metric(RELOADS, &[("result", "rejected")], before + 1.0, STEP);

    assert_eq!(r.generation(), 1, "generation changed by a rejected reload");
    let resp = chat(r.addr(), &chat_body("m1", "still here", false), &[]);
    assert_eq!(
        resp.status,
        200,
        "old config no longer serving: {:?}",
        resp.text()
    );
    chat(r.addr(), &chat_body("m2", "not applied", false), &[]).assert_json_error(404);
    let text = r.metrics();
    assert_eq!(
        metric_value(&text, "continuum_config_generation", &[]),
        Some(1.0),
        "{text}"
    );
}

/// Starts a router with one backend and an SSE stream in flight whose first event the client
/// has already read.
fn router_with_stream_in_flight(b: &MockBackend) -> (RouterProcess, Conn, SseSender) {
    let r = RouterProcess::start(&RouterConfig::default().backend("b1", &b.url(), &["m1"]));
    let sse = b.push_sse();
    let mut conn = Conn::open(r.addr());
    conn.send_all(&chat_bytes(&chat_body("m1", "drain me", true), &[]));
    b.wait_requests(1, STEP);
    sse.send(EVENTS[0]);
    (r, conn, sse)
}

/// Whether a new connection is served normally: connected, and `GET /health` answered 200
/// within 1s. Refused, closed, unanswered or non-200 all count as not served.
fn new_connection_served(r: &RouterProcess) -> bool {
    let Ok(mut probe) = Conn::connect(r.addr()) else {
        return false;
    };
    if probe
        .send(&request_bytes("GET", "/health", &[], None))
        .is_err()
    {
        return false;
    }
    probe
        .read_response(Duration::from_secs(1))
        .is_ok_and(|resp| resp.status == 200)
}

/// Once SIGTERM has been handled (signals are asynchronous: poll), new connections must not be
/// served.
fn wait_new_connections_not_served(r: &RouterProcess, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while new_connection_served(r) {
        assert!(
            Instant::now() < deadline,
            "new connections still served {timeout:?} after SIGTERM; stderr:\n{}",
            r.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigterm_drains_inflight_stream_then_exits_zero() {
    let b = MockBackend::start("b1");
    let (mut r, mut conn, sse) = router_with_stream_in_flight(&b);
    let mut body = conn
        .stream_response(STEP)
        .unwrap_or_else(|e| panic!("no stream head: {e}"));
    body.expect_next(EVENTS[0], STEP)
        .unwrap_or_else(|e| panic!("first event: {e}"));

    r.sigterm();
    wait_new_connections_not_served(&r, STEP);
    assert!(
        r.wait_exit(Duration::ZERO).is_none(),
        "router exited with a stream still in flight; stderr:\n{}",
        r.stderr()
    );

    finish_stream(sse, &mut body, 1, "during drain");

    // The drain deadline is 10s; the stream ended well before it.
    let status = r
        .wait_exit(STEP)
        .unwrap_or_else(|| panic!("router still running after drain; stderr:\n{}", r.stderr()));
    assert!(
        status.success(),
        "exit status {status}; stderr:\n{}",
        r.stderr()
    );
    wait_refused(&r, STEP);
}

/// "Stop accepting new connections" means the listening sockets are closed as soon as the drain
/// starts: new connections are refused (not parked in the kernel backlog until exit) while a
/// stream is still in flight.
#[test]
fn sigterm_refuses_new_connections_while_draining() {
    let b = MockBackend::start("b1");
    let (mut r, mut conn, sse) = router_with_stream_in_flight(&b);
    let mut body = conn
        .stream_response(STEP)
        .unwrap_or_else(|e| panic!("no stream head: {e}"));
    body.expect_next(EVENTS[0], STEP)
        .unwrap_or_else(|e| panic!("first event: {e}"));
    r.sigterm();
    // Release the stream whatever happens below, so a failure does not hold the drain.
    let probe = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_refused(&r, Duration::from_secs(3));
    }));
    for ev in &EVENTS[1..] {
        sse.send(ev);
    }
    sse.finish();
    let _ = body.finish(STEP);
    let _ = r.wait_exit(STEP);
    if let Err(e) = probe {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn sigterm_when_idle_exits_zero() {
    let b = MockBackend::start("b1");
    let mut r = RouterProcess::start(&RouterConfig::default().backend("b1", &b.url(), &["m1"]));
    r.sigterm();
    let status = r.wait_exit(STEP).unwrap_or_else(|| {
        panic!(
            "idle router did not exit on SIGTERM; stderr:\n{}",
            r.stderr()
        )
    });
    assert!(
        status.success(),
        "exit status {status}; stderr:\n{}",
        r.stderr()
    );
}

/// Sends `EVENTS[from..]` through the backend, checks each arrives as sent, ends the stream and
/// checks the client received every event byte for byte.
fn finish_stream(sse: SseSender, body: &mut StreamingBody<'_>, from: usize, when: &str) {
    for ev in &EVENTS[from..] {
        sse.send(ev);
        body.expect_next(ev, STEP)
            .unwrap_or_else(|e| panic!("event {when}: {e}"));
    }
    sse.finish();
    let all = body
        .finish(STEP)
        .unwrap_or_else(|e| panic!("stream {when} did not complete: {e}"));
    assert_eq!(all, EVENTS.concat(), "stream {when} not byte-exact");
}
