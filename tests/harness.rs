//! Self-tests of the shared harness (no router involved): the raw client against
//! [`common::MockBackend`] directly, and the Prometheus text helper. They keep the harness honest
//! so a failing acceptance test points at the router, not at the test code.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;

use common::{
    Conn, MockBackend, RouterConfig, STEP, chat_body, chat_bytes, metric_value, refusing_url,
};

fn addr_of(b: &MockBackend) -> SocketAddr {
    b.url().trim_start_matches("http://").parse().unwrap()
}

#[test]
fn mock_backend_records_and_answers_keep_alive() {
    let b = MockBackend::start("mock");
    let mut conn = Conn::open(addr_of(&b));
    for i in 0..3 {
        let body = chat_body("m1", &format!("n{i}"), false);
        conn.send_all(&chat_bytes(&body, &[("X-Dynamo-Test", "1")]));
        let resp = conn.response();
        assert_eq!(resp.status, 200);
        assert_eq!(resp.json()["backend"], "mock");
        let req = &b.wait_requests(i + 1, STEP)[i];
        assert_eq!(
            (req.method.as_str(), req.path.as_str()),
            ("POST", "/v1/chat/completions")
        );
        assert_eq!(req.body, body);
        assert_eq!(req.header("x-dynamo-test"), Some("1"));
    }
    assert_eq!(b.connections(), 1, "keep-alive connection not reused");
}

#[test]
fn mock_backend_streams_events_as_released() {
    let b = MockBackend::start("mock");
    let sse = b.push_sse();
    let mut conn = Conn::open(addr_of(&b));
    conn.send_all(&chat_bytes(&chat_body("m1", "s", true), &[]));
    b.wait_requests(1, STEP);
    sse.send(b"data: 1\n\n");
    let mut body = conn.stream_response(STEP).unwrap();
    assert_eq!(body.head.header("content-type"), Some("text/event-stream"));
    body.expect_next(b"data: 1\n\n", STEP).unwrap();
    // Nothing more arrives until released.
    assert!(
        body.expect_next(b"x", std::time::Duration::from_millis(200))
            .is_err()
    );
    sse.send(b"data: 2\n\n");
    body.expect_next(b"data: 2\n\n", STEP).unwrap();
    sse.finish();
    assert_eq!(body.finish(STEP).unwrap(), b"data: 1\n\ndata: 2\n\n");
}

#[test]
fn mock_backend_decodes_chunked_requests() {
    let b = MockBackend::start("mock");
    let mut conn = Conn::open(addr_of(&b));
    conn.send_all(
        b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n\
          3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\n\r\n",
    );
    assert_eq!(conn.response().status, 200);
    let req = &b.wait_requests(1, STEP)[0];
    assert!(req.chunked);
    assert_eq!(req.body, b"abcde");
}

#[test]
fn refusing_url_refuses() {
    let url = refusing_url();
    let addr: SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    assert!(std::net::TcpStream::connect(addr).is_err());
}

#[test]
fn metric_value_matches_labels_in_any_order() {
    let text = "# HELP x y\n# TYPE continuum_http_requests_total counter\n\
        continuum_http_requests_total{status=\"200\",route=\"chat_completions\"} 6\n\
        continuum_http_requests_total{route=\"chat_completions\",status=\"404\"} 1\n\
        continuum_http_requests_total_other 9\n\
        continuum_config_generation 2\n";
    let ok = [("route", "chat_completions"), ("status", "200")];
    assert_eq!(
        metric_value(text, "continuum_http_requests_total", &ok),
        Some(6.0)
    );
    assert_eq!(
        metric_value(text, "continuum_http_requests_total", &[]),
        Some(7.0)
    );
    assert_eq!(
        metric_value(text, "continuum_config_generation", &[]),
        Some(2.0)
    );
    assert_eq!(metric_value(text, "continuum_missing", &[]), None);
}

#[test]
fn router_config_renders_the_contract_shape() {
    let y = RouterConfig::default()
        .backend("b1", "http://127.0.0.1:1", &["m1", "m2"])
        .to_yaml(([127, 0, 0, 1], 8080).into());
    for needle in [
        "bind_address: \"127.0.0.1:8080\"",
        "shards: 2",
        "max_body_bytes: 1048576",
        "header_read: \"2s\"",
        "connect_retries: 2",
        "- name: \"b1\"",
        "models: [\"m1\", \"m2\"]",
        "disaggregated_serving:",
    ] {
        assert!(y.contains(needle), "`{needle}` missing from:\n{y}");
    }
}

#[test]
fn zmq_publisher_speaks_zmtp_and_reports_no_subscriber() {
    use std::io::Read;
    let mut p = common::zmq::ZmqPublisher::start();
    assert!(p.endpoint().starts_with("tcp://127.0.0.1:"));
    // A raw TCP peer receives the ZMTP 3 greeting's signature first.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", p.port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut sig = [0u8; 10];
    s.read_exact(&mut sig).unwrap();
    assert_eq!(sig[0], 0xff);
    assert_eq!(sig[9], 0x7f);
    // Nobody completed a subscription.
    assert_eq!(
        p.wait_subscribed(std::time::Duration::from_millis(200)),
        None
    );
}
