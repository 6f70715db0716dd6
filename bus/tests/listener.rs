//! The event bus listener end to end on loopback TLS (BUS-08..24): a generated CA, a real HTTP/2
//! client over rustls, and `openssl s_client` / `curl --http2` as clients nobody here wrote. Each
//! refusal asserts its status, its code and its counter.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read as _, Write as _};
use std::time::Duration;

use common::*;
use continuum_event_bus::code::Code;

#[tokio::test]
async fn a_broker_session_gets_its_welcome_and_heartbeat_answers() {
    let bus = start(bus());
    let mut send = h2(&bus).await;
    let (resp, tx) = session(
        &mut send,
        Some(TOKEN_A),
        Some("1"),
        &hello("broker-a.dynamo", &["dynamo"]),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut lines = Lines::new(resp.into_body());
    let welcome = lines.next().await.unwrap();
    assert_eq!(welcome["type"], "welcome");
    let sid = welcome["session_id"].as_str().unwrap();
    assert!(sid.starts_with("sess-") && sid.len() == 37, "{sid}");
    assert_eq!(welcome["version"], 1);
    assert_eq!(welcome["limits"]["max_streams_per_session"], 1024);
    assert_eq!(welcome["limits"]["stream_buffer_bytes"], 16384);
    assert_eq!(bus.metrics.sessions(), 1);
    tx.send(bytes::Bytes::from_static(
        b"{\"type\":\"heartbeat\",\"seq\":41}\n",
    ))
    .await
    .unwrap();
    let ack = lines.next().await.unwrap();
    assert_eq!(ack, serde_json::json!({"type": "heartbeat_ack", "seq": 41}));
    // The client closes its side: the session ends and frees its slot.
    drop(tx);
    assert_eq!(lines.next().await, None);
    eventually(|| bus.metrics.sessions() == 0).await;
}

#[tokio::test]
async fn session_refusals_carry_their_code_status_and_count() {
    let bus = start(bus());
    let mut send = h2(&bus).await;
    let good = hello("broker-a.dynamo", &["dynamo"]);
    // (token, version header, first line, status, code)
    type Case<'a> = (Option<&'a str>, Option<&'a str>, String, u16, Code);
    let cases: [Case<'_>; 6] = [
        (
            Some(TOKEN_A),
            None,
            good.clone(),
            400,
            Code::UnsupportedProtocolVersion,
        ),
        (
            Some(TOKEN_A),
            Some("7"),
            good.clone(),
            400,
            Code::UnsupportedProtocolVersion,
        ),
        (None, Some("1"), good.clone(), 401, Code::Unauthenticated),
        (
            Some("wrong"),
            Some("1"),
            good.clone(),
            401,
            Code::Unauthenticated,
        ),
        // BUS-20, BUS-21: another client id, a namespace outside the allow list.
        (
            Some(TOKEN_A),
            Some("1"),
            hello("broker-b.dynamo", &["dynamo"]),
            403,
            Code::Forbidden,
        ),
        (
            Some(TOKEN_A),
            Some("1"),
            hello("broker-a.dynamo", &["elsewhere"]),
            403,
            Code::Forbidden,
        ),
    ];
    for (token, version, line, status, code) in cases {
        let before = bus.metrics.refused_total(code);
        let (resp, _tx) = session(&mut send, token, version, &line).await;
        assert_eq!(resp.status(), status, "{code}");
        assert_eq!(json(resp).await["error"]["code"], code.as_str());
        assert_eq!(bus.metrics.refused_total(code), before + 1);
    }
    // A first message that is not a hello.
    let (resp, _tx) = session(
        &mut send,
        Some(TOKEN_A),
        Some("1"),
        "{\"type\":\"draining\"}",
    )
    .await;
    assert_eq!(resp.status(), 400);
    assert_eq!(json(resp).await["error"]["code"], "bad_request");
    // Every refused handshake freed its slot: a good session still opens.
    let (resp, _tx) = session(&mut send, Some(TOKEN_A), Some("1"), &good).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(bus.metrics.sessions(), 1);
}

/// BUS-19 and BUS-23: a second pre-hello handshake of one credential is refused; a new session
/// of an entry supersedes its old one.
#[tokio::test]
async fn one_handshake_per_credential_and_supersession() {
    let bus = start(bus());
    let mut send = h2(&bus).await;
    let (pending, tx_pending) = {
        let mut s2 = send.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let req = http::Request::post("https://localhost/bus/v1/session")
            .header("authorization", format!("Bearer {TOKEN_A}"))
            .header("continuum-bus-version", "1")
            .body(ChanBody(rx))
            .unwrap();
        (
            tokio::spawn(async move { s2.send_request(req).await.unwrap() }),
            tx,
        )
    };
    // Let the pending request reach the listener (its handshake slot is what is tested).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (resp, _tx) = session(
        &mut send,
        Some(TOKEN_A),
        Some("1"),
        &hello("broker-a.dynamo", &["dynamo"]),
    )
    .await;
    assert_eq!(resp.status(), 429);
    assert_eq!(json(resp).await["error"]["code"], "too_many_sessions");
    // The pending one says hello and gets its session; a second session supersedes it.
    tx_pending
        .send(bytes::Bytes::from(format!(
            "{}\n",
            hello("broker-a.dynamo", &["dynamo"])
        )))
        .await
        .unwrap();
    let first = pending.await.unwrap();
    assert_eq!(first.status(), 200);
    let mut first_lines = Lines::new(first.into_body());
    assert_eq!(first_lines.next().await.unwrap()["type"], "welcome");
    let (second, _tx2) = session(
        &mut send,
        Some(TOKEN_A),
        Some("1"),
        &hello("broker-a.dynamo", &["dynamo"]),
    )
    .await;
    assert_eq!(second.status(), 200);
    assert_eq!(
        first_lines.next().await,
        None,
        "the superseded session's stream ends"
    );
    eventually(|| bus.metrics.refused_total(Code::SessionSuperseded) == 1).await;
    eventually(|| bus.metrics.sessions() == 1).await;
    drop(tx_pending);
}

#[tokio::test]
async fn data_streams_need_credentials_and_a_command() {
    let bus = start(bus());
    let mut send = h2(&bus).await;
    let stream = |token: Option<&str>| {
        let (_tx, rx) = tokio::sync::mpsc::channel(1);
        let mut r = http::Request::post(
            "https://localhost/bus/v1/streams/strm-0000000000000000000000000000002a",
        )
        .header("continuum-bus-version", "1");
        if let Some(t) = token {
            r = r.header("authorization", format!("Bearer {t}"));
        }
        r.body(ChanBody(rx)).unwrap()
    };
    let resp = send.send_request(stream(None)).await.unwrap();
    assert_eq!(resp.status(), 401);
    let resp = send.send_request(stream(Some(TOKEN_A))).await.unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(json(resp).await["error"]["code"], "unknown_stream");
    let (_tx, rx) = tokio::sync::mpsc::channel(1);
    let other = http::Request::get("https://localhost/")
        .body(ChanBody(rx))
        .unwrap();
    let resp = send.send_request(other).await.unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(json(resp).await["error"]["code"], "not_found");
}

/// BUS-09: plaintext is answered with a plaintext 403 and closed; a non-ASCII, non-TLS first byte
/// is closed.
#[tokio::test]
async fn plaintext_gets_a_403_tls_required() {
    let bus = start(bus());
    let addr = bus.addr();
    let text = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap();
    assert!(text.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{text}");
    assert!(text.contains("\"tls_required\""));
    let closed = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(&[0x00, 0x01]).unwrap();
        let mut out = Vec::new();
        // Closed with our bytes unread: an end of stream or a reset, never an answer.
        match s.read_to_end(&mut out) {
            Ok(_) => out,
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset);
                Vec::new()
            }
        }
    })
    .await
    .unwrap();
    assert!(closed.is_empty());
    eventually(|| bus.metrics.refused_total(Code::TlsRequired) == 2).await;
}

/// BUS-08: TLS 1.2 and a handshake without ALPN `h2` fail.
#[tokio::test]
async fn tls12_and_missing_h2_fail_the_handshake() {
    let bus = start(bus());
    assert!(
        tls_connect(&bus, client_tls(&bus.pki, &[b"h2"], true))
            .await
            .is_err()
    );
    assert!(
        tls_connect(&bus, client_tls(&bus.pki, &[b"http/1.1"], false))
            .await
            .is_err()
    );
    // No ALPN offered: rustls completes the handshake, the listener closes at once.
    let mut tls = tls_connect(&bus, client_tls(&bus.pki, &[], false))
        .await
        .unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::io::AsyncReadExt::read(&mut tls, &mut buf)
        .await
        .unwrap_or(0);
    assert_eq!(n, 0);
    eventually(|| bus.metrics.refused_total(Code::HandshakeFailed) == 3).await;
}

/// Clients nobody here wrote: `openssl s_client -tls1_2` fails, `curl --http2` gets its welcome.
#[tokio::test]
async fn openssl_and_curl() {
    let bus = start(bus());
    let dir = std::env::temp_dir().join(format!("bus-curl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, &bus.pki.ca_pem).unwrap();
    let addr = bus.addr();
    let port = addr.port();
    let ca2 = ca.clone();
    let openssl = tokio::task::spawn_blocking(move || {
        std::process::Command::new("openssl")
            .args([
                "s_client",
                "-tls1_2",
                "-connect",
                &addr.to_string(),
                "-CAfile",
            ])
            .arg(&ca2)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let out = String::from_utf8_lossy(&openssl.stdout).to_string()
        + &String::from_utf8_lossy(&openssl.stderr);
    assert!(!openssl.status.success(), "openssl: {out}");
    assert!(out.contains("alert protocol version"), "openssl: {out}");
    let hello_file = dir.join("hello.ndjson");
    std::fs::write(
        &hello_file,
        format!("{}\n", hello("broker-a.dynamo", &["dynamo"])),
    )
    .unwrap();
    let curl = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["-sS", "--http2", "--max-time", "3", "--cacert"])
            .arg(&ca)
            .args(["-H", &format!("authorization: Bearer {TOKEN_A}")])
            .args(["-H", "continuum-bus-version: 1", "--data-binary"])
            .arg(format!("@{}", hello_file.display()))
            .arg(format!("https://localhost:{port}/bus/v1/session"))
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let body = String::from_utf8_lossy(&curl.stdout);
    let first = body.lines().next().unwrap_or_default();
    let welcome: serde_json::Value = serde_json::from_str(first)
        .unwrap_or_else(|_| panic!("curl: {body} {}", String::from_utf8_lossy(&curl.stderr)));
    assert_eq!(welcome["type"], "welcome");
    let _ = std::fs::remove_dir_all(&dir);
}

/// BUS-25 / BUS-04: the router heartbeats a session, and ends one whose client stays silent past
/// `idle_timeout` (its own heartbeats do not count as the client's).
#[tokio::test]
async fn a_silent_session_is_heartbeaten_then_ended_idle() {
    let mut cfg = bus();
    cfg.heartbeat_interval = Duration::from_millis(100);
    cfg.idle_timeout = Duration::from_millis(450);
    let bus = start(cfg);
    let (mut lines, _tx, _send) = broker_session(&bus).await;
    let mut beats = 0;
    while let Some(m) = lines.next().await {
        assert_eq!(m["type"], "heartbeat");
        beats += 1;
    }
    assert!(beats >= 2, "{beats} heartbeats before the idle end");
    // The session's idle end (the connection's own idle close may follow, under the same code).
    eventually(|| bus.metrics.refused_total(Code::IdleTimeout) >= 1).await;
    eventually(|| bus.metrics.sessions() == 0).await;
}

/// BUS-18 and BUS-24 (each 10 s by the spec, run together): a session whose hello never comes is
/// 408 `hello_timeout`; a TLS connection that never makes an authenticated request is closed
/// `auth_timeout`, although it answers the listener's PINGs.
#[tokio::test]
async fn hello_and_auth_deadlines() {
    let bus = start(bus());
    let silent = async {
        let mut send = h2(&bus).await;
        let (resp, _tx) = session(&mut send, Some(TOKEN_A), Some("1"), "").await;
        assert_eq!(resp.status(), 408);
        assert_eq!(json(resp).await["error"]["code"], "hello_timeout");
    };
    let idle_conn = async {
        let tls = tls_connect(&bus, client_tls(&bus.pki, &[b"h2"], false))
            .await
            .unwrap();
        let (_send, conn) = hyper::client::conn::http2::handshake::<_, _, ChanBody>(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tls),
        )
        .await
        .unwrap();
        let started = tokio::time::Instant::now();
        // The client's connection task ends when the listener closes the connection.
        let _ = tokio::time::timeout(Duration::from_secs(15), conn).await;
        assert!(started.elapsed() < Duration::from_secs(15), "never closed");
    };
    // BUS-10: a client that connects and never completes its TLS handshake is closed at 10 s.
    let slow_handshake = async {
        let mut tcp = tokio::net::TcpStream::connect(bus.addr()).await.unwrap();
        // A TLS record header, then nothing.
        tokio::io::AsyncWriteExt::write_all(&mut tcp, &[0x16, 0x03, 0x01])
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(
            Duration::from_secs(15),
            tokio::io::AsyncReadExt::read(&mut tcp, &mut buf),
        )
        .await
        .expect("closed within 15 s")
        .unwrap_or(0);
        assert_eq!(n, 0);
        assert!(started.elapsed() >= Duration::from_secs(9), "closed early");
    };
    tokio::join!(silent, idle_conn, slow_handshake);
    // Both connections passed their auth deadline without a 2xx: the silent session's one is
    // shut down too, after its 408.
    eventually(|| bus.metrics.refused_total(Code::AuthTimeout) == 2).await;
    assert_eq!(bus.metrics.refused_total(Code::HelloTimeout), 1);
    assert_eq!(bus.metrics.refused_total(Code::HandshakeTimeout), 1);
}

/// BUS-23: `max_sessions` router-wide (429), and the connection limit (`4 × max_sessions`, at
/// least 16) closing the connection beyond it.
#[tokio::test]
async fn session_and_connection_limits() {
    let mut cfg = bus();
    cfg.max_sessions = 1;
    cfg.brokers
        .push(broker("broker-b.dynamo", "token-b", &["dynamo"]));
    let bus = start(cfg);
    let (_lines, _tx, mut send) = broker_session(&bus).await;
    let (resp, _tx2) = session(
        &mut send,
        Some("token-b"),
        Some("1"),
        &hello("broker-b.dynamo", &["dynamo"]),
    )
    .await;
    assert_eq!(resp.status(), 429);
    assert_eq!(json(resp).await["error"]["code"], "too_many_sessions");
    // 1 connection is held by the session; 15 more fill the limit of 16 (each completes its
    // handshake, so the listener has accepted it before the next).
    let mut held = Vec::new();
    for _ in 0..15 {
        held.push(
            tls_connect(&bus, client_tls(&bus.pki, &[b"h2"], false))
                .await
                .unwrap(),
        );
    }
    let mut over = tokio::net::TcpStream::connect(bus.addr()).await.unwrap();
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read(&mut over, &mut buf),
    )
    .await
    .expect("the connection over the limit is closed")
    .unwrap_or(0);
    assert_eq!(n, 0);
    eventually(|| bus.metrics.refused_total(Code::ConnectionLimit) == 1).await;
    drop(held);
}

/// BUS-22: a kv_listener hello must announce a source.
#[tokio::test]
async fn a_kv_listener_hello_without_sources_is_refused() {
    use continuum_core::config::dynamo::BrokerRole;
    let mut cfg = bus();
    let mut kvl = broker("kvl-1", "token-kvl", &[]);
    kvl.role = BrokerRole::KvListener;
    kvl.backends = vec!["vllm-a".into()];
    cfg.brokers.push(kvl);
    let bus = start(cfg);
    let mut send = h2(&bus).await;
    let empty = serde_json::json!({
        "type": "hello", "role": "kv_listener", "client_id": "kvl-1", "versions": [1], "sources": [],
    });
    let (resp, _tx) = session(&mut send, Some("token-kvl"), Some("1"), &empty.to_string()).await;
    assert_eq!(resp.status(), 400);
    assert_eq!(json(resp).await["error"]["code"], "bad_request");
    let outside = serde_json::json!({
        "type": "hello", "role": "kv_listener", "client_id": "kvl-1", "versions": [1],
        "sources": [{"backend": "vllm-z"}],
    });
    let (resp, _tx) = session(
        &mut send,
        Some("token-kvl"),
        Some("1"),
        &outside.to_string(),
    )
    .await;
    assert_eq!(resp.status(), 403);
}

/// BUS-16, BUS-31, BUS-42: a live reload ends the sessions it no longer allows (`forbidden`),
/// and a token it removed is `credential_revoked` from then on.
#[tokio::test]
async fn a_reload_revokes_and_ends_what_it_no_longer_allows() {
    let bus = start(bus());
    let (mut lines, _tx, mut send) = broker_session(&bus).await;
    assert!(bus.listener.covers("dynamo"));
    // The namespace leaves broker-a's allow list and its token changes.
    let mut next = common::bus();
    next.brokers = vec![broker("broker-a.dynamo", "a-new-token", &["other"])];
    bus.listener.reconfigure(next);
    assert_eq!(lines.next().await, None, "the session ends");
    eventually(|| bus.metrics.refused_total(Code::Forbidden) == 1).await;
    eventually(|| bus.listener.session_count() == 0).await;
    assert!(!bus.listener.covers("dynamo"));
    let (resp, _tx) = session(
        &mut send,
        Some(TOKEN_A),
        Some("1"),
        &hello("broker-a.dynamo", &["other"]),
    )
    .await;
    assert_eq!(resp.status(), 401);
    assert_eq!(json(resp).await["error"]["code"], "credential_revoked");
    let (resp, _tx) = session(
        &mut send,
        Some("a-new-token"),
        Some("1"),
        &hello("broker-a.dynamo", &["other"]),
    )
    .await;
    assert_eq!(resp.status(), 200);
}

/// BUS-25: a connection whose last answer ended closes after `idle_timeout` (shorter than 30 s
/// here), not while a session runs on it.
#[tokio::test]
async fn an_idle_connection_is_closed_after_its_last_answer() {
    let mut cfg = bus();
    cfg.heartbeat_interval = Duration::from_millis(100);
    cfg.idle_timeout = Duration::from_millis(600);
    let bus = start(cfg);
    let tls = tls_connect(&bus, client_tls(&bus.pki, &[b"h2"], false))
        .await
        .unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .unwrap();
    let mut conn = tokio::spawn(conn);
    let (resp, tx) = session(
        &mut send,
        Some(TOKEN_A),
        Some("1"),
        &hello("broker-a.dynamo", &["dynamo"]),
    )
    .await;
    let mut lines = Lines::new(resp.into_body());
    assert_eq!(lines.next().await.unwrap()["type"], "welcome");
    // The session answers heartbeats for longer than the idle limit: the connection stays.
    for seq in 0..8 {
        tx.send(bytes::Bytes::from(format!(
            "{{\"type\":\"heartbeat\",\"seq\":{seq}}}\n"
        )))
        .await
        .unwrap();
        loop {
            let m = lines.next().await.unwrap();
            if m["type"] == "heartbeat_ack" {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!conn.is_finished(), "closed while a session ran on it");
    assert_eq!(bus.metrics.refused_total(Code::IdleTimeout), 0);
    // The session ends; the idle connection closes after the limit.
    drop(tx);
    while lines.next().await.is_some() {}
    tokio::time::timeout(Duration::from_secs(5), &mut conn)
        .await
        .expect("the idle connection is closed")
        .unwrap()
        .ok();
    eventually(|| bus.metrics.refused_total(Code::IdleTimeout) == 1).await;
}
