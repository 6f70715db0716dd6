//! End-to-end request limits and protocol errors: 413 for oversized bodies (declared and
//! chunked), 431 for oversized or too many headers, 408 for a head not completed in time, 400 for
//! malformed requests; each with the JSON error body, none reaching a backend.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Conn, MockBackend, RouterConfig, RouterProcess, STEP, chat_bytes, request_bytes};

const MAX_BODY: usize = 1024;

/// A router with small limits (body 1024 B, head 4096 B, 20 headers, header_read 1s).
fn start() -> (MockBackend, RouterProcess) {
    let b = MockBackend::start("b1");
    let mut cfg = RouterConfig::default().backend("b1", &b.url(), &["m1"]);
    cfg.max_body_bytes = MAX_BODY as u64;
    cfg.max_header_bytes = 4096;
    cfg.max_headers = 20;
    cfg.header_read = "1s".into();
    let r = RouterProcess::start(&cfg);
    (b, r)
}

/// A chat body of exactly `len` bytes.
fn body_of_len(len: usize) -> Vec<u8> {
    let shell = "{\"model\":\"m1\",\"messages\":[],\"pad\":\"\"}";
    let body = format!(
        "{{\"model\":\"m1\",\"messages\":[],\"pad\":\"{}\"}}",
        "p".repeat(len - shell.len())
    );
    assert_eq!(body.len(), len);
    body.into_bytes()
}

#[test]
fn body_at_the_limit_is_accepted() {
    let (b, r) = start();
    let mut conn = Conn::open(r.addr());
    conn.send_all(&chat_bytes(&body_of_len(MAX_BODY), &[]));
    let resp = conn.response();
    assert_eq!(resp.status, 200, "body {:?}", resp.text());
    assert_eq!(b.wait_requests(1, STEP)[0].body.len(), MAX_BODY);
}

#[test]
fn declared_content_length_over_limit_is_413() {
    let (b, r) = start();
    let mut conn = Conn::open(r.addr());
    // Only the head: the declared length alone must be rejected.
    conn.send_all(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY * 2
        )
        .as_bytes(),
    );
    conn.response().assert_json_error(413);
    assert_eq!(b.request_count(), 0, "oversized body reached the backend");
}

#[test]
fn chunked_body_over_limit_is_413() {
    let (b, r) = start();
    let mut conn = Conn::open(r.addr());
    let mut raw = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\
        Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        .to_vec();
    // 3 x 512 bytes > 1024, and no last chunk: the router must stop on the size alone.
    for _ in 0..3 {
        raw.extend_from_slice(b"200\r\n");
        raw.extend_from_slice(&[b'x'; 512]);
        raw.extend_from_slice(b"\r\n");
    }
    conn.send_all(&raw);
    conn.response().assert_json_error(413);
    assert_eq!(
        b.request_count(),
        0,
        "oversized chunked body reached the backend"
    );
}

#[test]
fn oversized_header_is_431() {
    let (b, r) = start();
    let big = "v".repeat(6000);
    let mut conn = Conn::open(r.addr());
    conn.send_all(&chat_bytes(
        b"{\"model\":\"m1\",\"messages\":[]}",
        &[("X-Big", &big)],
    ));
    conn.response().assert_json_error(431);
    assert_eq!(b.request_count(), 0);
}

#[test]
fn too_many_headers_is_431() {
    let (b, r) = start();
    let names: Vec<String> = (0..40).map(|i| format!("X-H-{i}")).collect();
    let headers: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
    let mut conn = Conn::open(r.addr());
    conn.send_all(&chat_bytes(b"{\"model\":\"m1\",\"messages\":[]}", &headers));
    conn.response().assert_json_error(431);
    assert_eq!(b.request_count(), 0);
}

#[test]
fn slow_request_head_is_408_and_connection_closed() {
    let (b, r) = start();
    let mut conn = Conn::open(r.addr());
    // A started but never completed head (header_read is 1s).
    conn.send_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    let resp = conn
        .read_response(Duration::from_secs(1) + STEP)
        .unwrap_or_else(|e| {
            panic!(
                "no 408 for an incomplete head: {e}; stderr:\n{}",
                r.stderr()
            )
        });
    resp.assert_json_error(408);
    assert!(conn.wait_closed(STEP), "connection left open after 408");
    assert_eq!(b.request_count(), 0);
}

#[test]
fn idle_connection_without_bytes_is_not_sent_408() {
    let (_b, r) = start();
    let mut conn = Conn::open(r.addr());
    // Longer than header_read (1s) but far below keepalive (60s): the header timer starts at
    // the first byte, so this connection must still be usable.
    std::thread::sleep(Duration::from_millis(1500));
    conn.send_all(&request_bytes("GET", "/health", &[], None));
    let resp = conn.response();
    assert_eq!(resp.status, 200, "body {:?}", resp.text());
}

#[test]
fn garbage_request_line_is_400() {
    let (b, r) = start();
    let mut conn = Conn::open(r.addr());
    conn.send_all(b"THIS IS NOT HTTP AT ALL\r\n\r\n");
    conn.response().assert_json_error(400);
    assert_eq!(b.request_count(), 0);
}

#[test]
fn malformed_header_line_is_400() {
    let (b, r) = start();
    let mut conn = Conn::open(r.addr());
    conn.send_all(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nNo colon in this line\r\n\r\n");
    conn.response().assert_json_error(400);
    assert_eq!(b.request_count(), 0);
}
