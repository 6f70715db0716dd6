//! End-to-end proxying: byte-exact relay of buffered and streamed chat completions, header
//! hygiene in both directions, backend disclosure, model routing, round robin, connect-failure
//! retry, pipelining, chunked request bodies and request counters.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;

use common::{
    Conn, MockBackend, PIN_HEADERS, Reply, RouterConfig, RouterProcess, STEP, chat, chat_body,
    chat_bytes, get, is_pin_header, metric_value, refusing_url, request_bytes,
};

const SSE_EVENTS: [&[u8]; 3] = [
    b"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n",
    b"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo \xc3\xa9\"}}]}\n\n",
    b"data: [DONE]\n\n",
];

fn one_backend(b: &MockBackend, models: &[&str]) -> RouterProcess {
    RouterProcess::start(&RouterConfig::default().backend(b.name(), &b.url(), models))
}

#[test]
fn buffered_chat_is_relayed_byte_exact() {
    let b = MockBackend::start("b1");
    let r = one_backend(&b, &["m1"]);
    // Odd spacing, escapes, non-ASCII and a float a re-serializer would rewrite.
    let body = "{ \"model\" : \"m1\",\n  \"messages\": [ {\"role\":\"user\",\"content\":\"h\u{e9}llo \\\"q\\\" \\u00e9\"} ],\n  \"temperature\": 0.50 }";
    let reply = b"{\"id\":\"x\",  \"choices\":[],\n\"usage\":{\"total_tokens\":1.0}}\n";
    b.push_reply(Reply::json(reply));
    let resp = chat(r.addr(), body.as_bytes(), &[]);
    assert_eq!(resp.status, 200, "body {:?}", resp.text());
    assert_eq!(
        resp.body, reply,
        "client must get the backend's body byte-exact"
    );
    let reqs = b.wait_requests(1, STEP);
    assert_eq!(reqs[0].method, "POST");
    assert_eq!(reqs[0].path, "/v1/chat/completions");
    assert_eq!(
        reqs[0].text(),
        body,
        "backend must get the client's body byte-exact"
    );

    // A large body and a large reply, on a keep-alive connection.
    let pad = "a".repeat(300_000);
    let big = format!("{{\"model\":\"m1\",\"messages\":[],\"pad\":\"{pad}\"}}");
    let big_reply = format!(
        "{{\"object\":\"chat.completion\",\"pad\":\"{}\"}}",
        "z".repeat(500_000)
    );
    b.push_reply(Reply::json(big_reply.as_bytes()));
    let mut conn = Conn::open(r.addr());
    conn.send_all(&chat_bytes(big.as_bytes(), &[]));
    let resp = conn.response();
    assert_eq!(resp.status, 200);
    assert!(
        resp.body == big_reply.as_bytes(),
        "large reply not relayed byte-exact"
    );
    let reqs = b.wait_requests(2, STEP);
    assert!(
        reqs[1].body == big.as_bytes(),
        "large request body not forwarded byte-exact"
    );
}

#[test]
fn upstream_path_includes_backend_base_path() {
    let b = MockBackend::start("b1");
    let cfg = RouterConfig::default().backend("b1", &format!("{}/proxy/base", b.url()), &["m1"]);
    let r = RouterProcess::start(&cfg);
    let resp = chat(r.addr(), &chat_body("m1", "x", false), &[]);
    assert_eq!(resp.status, 200, "body {:?}", resp.text());
    assert_eq!(
        b.wait_requests(1, STEP)[0].path,
        "/proxy/base/v1/chat/completions"
    );
}

#[test]
fn streamed_chat_is_relayed_event_by_event() {
    let b = MockBackend::start("b1");
    let r = one_backend(&b, &["m1"]);
    let sse = b.push_sse();
    let mut conn = Conn::open(r.addr());
    conn.send_all(&chat_bytes(&chat_body("m1", "stream me", true), &[]));
    b.wait_requests(1, STEP);
    sse.send(SSE_EVENTS[0]);
    let mut body = conn
        .stream_response(STEP)
        .unwrap_or_else(|e| panic!("no streamed response head: {e}"));
    assert_eq!(body.head.status, 200);
    let ct = body.head.header("content-type").unwrap_or("");
    assert!(ct.starts_with("text/event-stream"), "content-type {ct:?}");
    let pins: Vec<_> = body
        .head
        .headers
        .iter()
        .filter(|(n, _)| is_pin_header(n))
        .collect();
    assert!(
        pins.is_empty(),
        "x-dynamo-* response headers leaked: {pins:?}"
    );
    // Each event must reach the client before the backend is allowed to send the next.
    for ev in SSE_EVENTS {
        if ev != SSE_EVENTS[0] {
            sse.send(ev);
        }
        body.expect_next(ev, STEP)
            .unwrap_or_else(|e| panic!("event not relayed before the next was released: {e}"));
    }
    sse.finish();
    let all = body
        .finish(STEP)
        .unwrap_or_else(|e| panic!("stream did not end: {e}"));
    assert_eq!(all, SSE_EVENTS.concat(), "streamed body not byte-exact");
}

#[test]
fn pin_and_hop_by_hop_headers_are_not_forwarded() {
    let b = MockBackend::start("b1");
    let r = one_backend(&b, &["m1"]);
    let mut headers: Vec<(&str, &str)> = vec![
        ("Authorization", "Bearer sk-client-key"),
        ("X-Request-Id", "req-123"),
        ("X-Custom-Header", "custom value"),
        ("Connection", "keep-alive"),
        ("Keep-Alive", "timeout=5"),
        ("TE", "trailers"),
        ("Trailer", "X-Foo"),
        ("Proxy-Authorization", "Basic Zm9vOmJhcg=="),
        ("Proxy-Connection", "keep-alive"),
    ];
    headers.extend_from_slice(&PIN_HEADERS);
    let resp = chat(r.addr(), &chat_body("m1", "hdrs", false), &headers);
    assert_eq!(resp.status, 200, "body {:?}", resp.text());
    let req = &b.wait_requests(1, STEP)[0];
    let leaked: Vec<_> = req
        .headers
        .iter()
        .filter(|(n, _)| is_pin_header(n))
        .collect();
    assert!(
        leaked.is_empty(),
        "pin headers reached the backend: {leaked:?}"
    );
    for hop in [
        "keep-alive",
        "te",
        "trailer",
        "proxy-authorization",
        "proxy-connection",
    ] {
        assert!(
            req.header(hop).is_none(),
            "hop-by-hop {hop} forwarded: {:?}",
            req.headers
        );
    }
    assert_eq!(req.header("authorization"), Some("Bearer sk-client-key"));
    assert_eq!(req.header("x-request-id"), Some("req-123"));
    assert_eq!(req.header("x-custom-header"), Some("custom value"));
    assert_eq!(req.header("content-type"), Some("application/json"));
}

#[test]
fn pin_response_headers_are_stripped() {
    let b = MockBackend::start("b1");
    let r = one_backend(&b, &["m1"]);
    b.push_reply(Reply::Full {
        status: 200,
        headers: vec![
            ("Content-Type".into(), "application/json".into()),
            ("X-Dynamo-Worker-Instance-Id".into(), "7".into()),
            ("x-dynamo-prefill-worker".into(), "8".into()),
            ("X-Other".into(), "kept".into()),
        ],
        body: b"{}".to_vec(),
    });
    let resp = chat(r.addr(), &chat_body("m1", "x", false), &[]);
    assert_eq!(resp.status, 200);
    let leaked: Vec<_> = resp
        .headers
        .iter()
        .filter(|(n, _)| n.to_ascii_lowercase().starts_with("x-dynamo-"))
        .collect();
    assert!(
        leaked.is_empty(),
        "x-dynamo-* response headers returned: {leaked:?}"
    );
    assert_eq!(
        resp.header("x-other"),
        Some("kept"),
        "ordinary response header lost"
    );
}

#[test]
fn x_backend_is_disclosed_only_when_requested() {
    let b = MockBackend::start("b1");
    let r = one_backend(&b, &["m1"]);
    let plain = chat(r.addr(), &chat_body("m1", "x", false), &[]);
    assert_eq!(plain.status, 200);
    assert!(
        plain.header("x-backend").is_none(),
        "x-backend disclosed unasked: {:?}",
        plain.headers
    );
    let empty = chat(r.addr(), &chat_body("m1", "x", false), &[("x-backend", "")]);
    assert_eq!(empty.status, 200);
    assert_eq!(
        empty.header("x-backend"),
        Some("b1"),
        "headers {:?}",
        empty.headers
    );
    let any = chat(
        r.addr(),
        &chat_body("m1", "x", false),
        &[("X-Backend", "please")],
    );
    assert_eq!(
        any.header("x-backend"),
        Some("b1"),
        "headers {:?}",
        any.headers
    );
}

#[test]
fn unknown_model_is_404_model_not_found() {
    let b = MockBackend::start("b1");
    let r = one_backend(&b, &["m1"]);
    let resp = chat(r.addr(), &chat_body("no-such-model", "x", false), &[]);
    let err = resp.assert_json_error(404);
    assert_eq!(err["type"], "invalid_request_error");
    assert_eq!(err["code"], "model_not_found");
    assert_eq!(
        b.request_count(),
        0,
        "unknown model must not reach a backend"
    );
}

#[test]
fn models_endpoint_lists_configured_models() {
    let b1 = MockBackend::start("b1");
    let b2 = MockBackend::start("b2");
    let cfg = RouterConfig::default()
        .backend("b1", &b1.url(), &["m1", "m2"])
        .backend("b2", &b2.url(), &["m2", "m3"]);
    let r = RouterProcess::start(&cfg);
    let resp = get(r.addr(), "/v1/models");
    assert_eq!(resp.status, 200, "body {:?}", resp.text());
    let v = resp.json();
    assert_eq!(v["object"], "list", "{v}");
    let data = v["data"]
        .as_array()
        .unwrap_or_else(|| panic!("no data array: {v}"));
    let ids: Vec<&str> = data
        .iter()
        .map(|m| m["id"].as_str().unwrap_or(""))
        .collect();
    let unique: BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(unique, BTreeSet::from(["m1", "m2", "m3"]), "{v}");
    assert_eq!(ids.len(), unique.len(), "a model is listed twice: {v}");
    assert!(data.iter().all(|m| m["object"] == "model"), "{v}");
}

#[test]
fn round_robin_alternates_between_two_backends() {
    let b1 = MockBackend::start("b1");
    let b2 = MockBackend::start("b2");
    let mut cfg = RouterConfig::default()
        .backend("b1", &b1.url(), &["m1"])
        .backend("b2", &b2.url(), &["m1"]);
    cfg.shards = "1".into();
    let r = RouterProcess::start(&cfg);
    let mut conn = Conn::open(r.addr());
    let mut served = Vec::new();
    for i in 0..6 {
        conn.send_all(&chat_bytes(&chat_body("m1", &format!("rr{i}"), false), &[]));
        let resp = conn.response();
        assert_eq!(resp.status, 200, "body {:?}", resp.text());
        served.push(resp.json()["backend"].as_str().unwrap_or("?").to_string());
    }
    assert_eq!(
        served.iter().filter(|s| *s == "b1").count(),
        3,
        "served by {served:?}"
    );
    assert_eq!(
        served.iter().filter(|s| *s == "b2").count(),
        3,
        "served by {served:?}"
    );
    assert!(
        served.windows(2).all(|w| w[0] != w[1]),
        "not alternating: {served:?}"
    );
}

#[test]
fn connect_failure_retries_another_replica() {
    let live = MockBackend::start("live");
    let mut cfg = RouterConfig::default()
        .backend("dead", &refusing_url(), &["m1"])
        .backend("live", &live.url(), &["m1"]);
    cfg.shards = "1".into();
    let r = RouterProcess::start(&cfg);
    for i in 0..4 {
        let resp = chat(
            r.addr(),
            &chat_body("m1", &format!("retry{i}"), false),
            &[("x-backend", "")],
        );
        assert_eq!(resp.status, 200, "request {i}: body {:?}", resp.text());
        assert_eq!(resp.header("x-backend"), Some("live"), "request {i}");
    }
    assert_eq!(live.wait_requests(4, STEP).len(), 4);
}

#[test]
fn all_replicas_refusing_is_502_upstream_unavailable() {
    let cfg = RouterConfig::default()
        .backend("dead1", &refusing_url(), &["m1"])
        .backend("dead2", &refusing_url(), &["m1"]);
    let r = RouterProcess::start(&cfg);
    let resp = chat(r.addr(), &chat_body("m1", "x", false), &[]);
    let err = resp.assert_json_error(502);
    assert_eq!(err["code"], "upstream_unavailable");
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let b = MockBackend::start("b1");
    b.set_handler(|req| Reply::json(&req.body));
    let r = one_backend(&b, &["m1"]);
    let first = chat_body("m1", "first", false);
    let last = chat_body("m1", "fourth", false);
    let mut batch = chat_bytes(&first, &[]);
    batch.extend(request_bytes("GET", "/v1/models", &[], None));
    batch.extend(chat_bytes(&chat_body("nope", "third", false), &[]));
    batch.extend(chat_bytes(&last, &[]));
    let mut conn = Conn::open(r.addr());
    conn.send_all(&batch);
    let a = conn.response();
    assert_eq!(
        (a.status, a.body.as_slice()),
        (200, first.as_slice()),
        "1st: {:?}",
        a.text()
    );
    let m = conn.response();
    assert_eq!(m.status, 200, "2nd: {:?}", m.text());
    assert_eq!(m.json()["object"], "list", "2nd should be the model list");
    conn.response().assert_json_error(404);
    let d = conn.response();
    assert_eq!(
        (d.status, d.body.as_slice()),
        (200, last.as_slice()),
        "4th: {:?}",
        d.text()
    );
}

#[test]
fn chunked_request_body_is_forwarded() {
    let b = MockBackend::start("b1");
    let r = one_backend(&b, &["m1"]);
    let body = chat_body("m1", "sent in chunks", false);
    let (p1, rest) = body.split_at(10);
    let (p2, p3) = rest.split_at(20);
    let mut raw = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\
        Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        .to_vec();
    for part in [p1, p2, p3] {
        raw.extend(format!("{:x}\r\n", part.len()).bytes());
        raw.extend_from_slice(part);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    let mut conn = Conn::open(r.addr());
    conn.send_all(&raw);
    let resp = conn.response();
    assert_eq!(resp.status, 200, "body {:?}", resp.text());
    assert_eq!(
        b.wait_requests(1, STEP)[0].body,
        body,
        "chunked body not forwarded intact"
    );
}

#[test]
fn chat_requests_are_counted_across_shards() {
    let b = MockBackend::start("b1");
    let r = one_backend(&b, &["m1"]);
    for i in 0..6 {
        let resp = chat(r.addr(), &chat_body("m1", &format!("count{i}"), false), &[]);
        assert_eq!(resp.status, 200);
    }
    chat(r.addr(), &chat_body("nope", "x", false), &[]).assert_json_error(404);
    let ok = [("route", "chat_completions"), ("status", "200")];
    let nf = [("route", "chat_completions"), ("status", "404")];
    // Shards may publish their counters periodically: wait for both to be merged in.
    r.wait_metric("continuum_http_requests_total", &ok, 6.0, STEP);
    r.wait_metric("continuum_http_requests_total", &nf, 1.0, STEP);
    let text = r.metrics();
    assert_eq!(
        metric_value(&text, "continuum_http_requests_total", &ok),
        Some(6.0),
        "{text}"
    );
    let nf = [("route", "chat_completions"), ("status", "404")];
    assert_eq!(
        metric_value(&text, "continuum_http_requests_total", &nf),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric_value(&text, "continuum_config_generation", &[]),
        Some(1.0),
        "{text}"
    );
}

#[test]
fn http10_client_gets_a_streamed_reply_dechunked_and_closed() {
    let b = MockBackend::start("b1");
    let r = RouterProcess::start(&RouterConfig::default().backend("b1", &b.url(), &["m1"]));
    let sse = b.push_sse();
    let body = chat_body("m1", "old client", true);
    let mut raw = format!(
        "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(&body);
    let mut s = std::net::TcpStream::connect(r.addr()).unwrap();
    std::io::Write::write_all(&mut s, &raw).unwrap();
    b.wait_requests(1, STEP);
    sse.send(b"data: one\n\n");
    sse.send(b"data: [DONE]\n\n");
    sse.finish();
    s.set_read_timeout(Some(STEP)).unwrap();
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut s, &mut got).unwrap();
    let text = String::from_utf8_lossy(&got);
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        !head.to_ascii_lowercase().contains("transfer-encoding"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    assert_eq!(
        rest, "data: one\n\ndata: [DONE]\n\n",
        "body must arrive de-chunked"
    );
}
