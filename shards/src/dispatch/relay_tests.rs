//! The relay on real sockets: when it asks the kernel for an immediate ACK, and the heads the
//! attempt and the relay format by hand. A response that
//! arrives whole in its first read must not cost a `setsockopt` and an ACK packet of its own
//! (the next request acknowledges it); every read that continues a response must ask first, or
//! a backend with Nagle on holds its next write until our delayed ACK (docs/decisions.md).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use continuum_core::config::ResponsesApi;

use super::conn::{QUICK_ACKS, UpConn};
use super::exchange::{Answer, Attempt};
use super::tests::{Parts, backend};
use super::upstream::Timing;
use super::{Ingress, relay};
use crate::http::ResponseSink;

/// Relay the response a backend sends as `segments` (each written alone, a pause between them)
/// to a real client socket; returns the answer, what the client received and how many quick
/// ACKs the relay asked for.
fn relay_segments(segments: &'static [&'static [u8]]) -> (Answer, Vec<u8>, usize) {
    let backend_l = TcpListener::bind("127.0.0.1:0").unwrap();
    let client_l = TcpListener::bind("127.0.0.1:0").unwrap();
    let (backend_addr, client_addr) = (
        backend_l.local_addr().unwrap(),
        client_l.local_addr().unwrap(),
    );
    let backend_side = std::thread::spawn(move || {
        let (mut s, _) = backend_l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        for (i, seg) in segments.iter().enumerate() {
            if i > 0 {
                // Long enough that the relay has read the segment before alone.
                std::thread::sleep(Duration::from_millis(30));
            }
            s.write_all(seg).unwrap();
        }
        // Held open until the relay is done: the relay must find the end from the framing.
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    });
    let client_side = std::thread::spawn(move || {
        let (mut s, _) = client_l.accept().unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        got
    });
    let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .unwrap();
    let (answer, acks) = rt.block_on(async move {
        let up = monoio::net::TcpStream::connect_addr(backend_addr)
            .await
            .unwrap();
        let client = monoio::net::TcpStream::connect_addr(client_addr)
            .await
            .unwrap();
        let (_rd, wr) = monoio::io::Splitable::into_split(client);
        let mut parts = Parts::new("/v1/chat/completions", r#"{"model":"m","messages":[]}"#);
        parts.sink = ResponseSink::connected(wr);
        let b = backend(ResponsesApi::Native);
        let now = crate::clock::instant();
        let timing = Timing::new(&b.timeouts, now, now);
        let mut up = UpConn::Plain(up);
        let before = QUICK_ACKS.with(std::cell::Cell::get);
        let mut ex = parts.exchange(Ingress::Chat);
        let (answer, _reusable) =
            match relay::relay(&timing, &mut ex, &mut up, &b, &Attempt::PLAIN, false).await {
                Ok(a) => a,
                Err(e) => panic!("relay failed: {e:?}"),
            };
        let acks = QUICK_ACKS.with(std::cell::Cell::get) - before;
        drop(up);
        (answer, acks)
        // `parts` (the client's write half) drops here: the client sees its end.
    });
    backend_side.join().unwrap();
    (answer, client_side.join().unwrap(), acks)
}

fn status(answer: Answer) -> u16 {
    match answer {
        Answer::Done(o) => o.status,
        Answer::Held(s) => s,
    }
}

#[test]
fn a_response_that_arrives_whole_asks_for_no_immediate_ack() {
    const WHOLE: &[&[u8]] =
        &[b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}"];
    let (answer, got, acks) = relay_segments(WHOLE);
    assert_eq!(status(answer), 200);
    assert!(
        got.ends_with(b"{\"ok\":true}"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert_eq!(acks, 0, "one read, nothing to acknowledge early");
}

#[test]
fn every_read_that_continues_a_response_asks_for_an_immediate_ack() {
    // A streamed answer as Dynamo's frontend writes it: the head, then each event on its own.
    const STREAM: &[&[u8]] = &[
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
        b"f\r\ndata: {\"a\":1}\n\n\r\n",
        b"f\r\ndata: {\"a\":2}\n\n\r\n0\r\n\r\n",
    ];
    let (answer, got, acks) = relay_segments(STREAM);
    assert_eq!(status(answer), 200);
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.contains("data: {\"a\":1}") && text.contains("data: {\"a\":2}"),
        "{text}"
    );
    // The head came alone: each of the two reads after it asked first.
    assert_eq!(acks, 2, "one immediate ACK before each continuing read");
}

#[test]
fn a_head_split_across_reads_asks_before_the_second_read() {
    const SPLIT_HEAD: &[&[u8]] = &[
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n",
        b"content-length: 2\r\n\r\n{}",
    ];
    let (answer, got, acks) = relay_segments(SPLIT_HEAD);
    assert_eq!(status(answer), 200);
    assert!(got.ends_with(b"{}"));
    assert_eq!(acks, 1);
}

/// The upstream request head, formatted without `core::fmt`: the request line with the base
/// path, `host` (an IPv6 literal in brackets) with the port, and the body's exact length.
#[test]
fn the_upstream_head_names_the_host_port_and_length() {
    use continuum_core::config::{BackendUrl, UrlScheme};

    use super::attempt::build_upstream_head;
    use super::exchange::Body;

    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    for (host, port, want) in [
        ("127.0.0.1", 8000, "host: 127.0.0.1:8000"),
        ("::1", 65535, "host: [::1]:65535"),
        ("frontend.prod.svc", 80, "host: frontend.prod.svc:80"),
    ] {
        let mut p = Parts::new("/v1/chat/completions", body);
        let mut ex = p.exchange(Ingress::Chat);
        let url = BackendUrl {
            scheme: UrlScheme::Http,
            host: host.to_owned(),
            port,
            base_path: "/proxy".to_owned(),
        };
        build_upstream_head(&mut ex, &url, Body::Client, &Attempt::PLAIN);
        let raw = String::from_utf8(ex.bufs.out.clone()).unwrap();
        let (head, sent) = raw.split_once("\r\n\r\n").unwrap();
        let mut lines = head.lines();
        assert_eq!(
            lines.next(),
            Some("POST /proxy/v1/chat/completions HTTP/1.1")
        );
        assert_eq!(lines.next(), Some(want));
        assert_eq!(
            lines.next(),
            Some(format!("content-length: {}", body.len()).as_str())
        );
        assert_eq!(sent, body);
    }
}
