//! Data streams and the command API over real TLS and HTTP/2 (BUS-05, BUS-26, BUS-33, BUS-35,
//! BUS-44): the test plays the broker with a hyper client; the router side is the listener's
//! `EventBus`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use continuum_bus::BusStreamError;
use continuum_event_bus::message::{CloseReason, Topic};

#[tokio::test]
async fn a_commanded_stream_relays_both_ways_and_unsubscribes_when_dropped() {
    let bus = start(bus());
    let (mut lines, _session_tx, mut send) = broker_session(&bus).await;
    let api = bus.listener.bus();
    let open = api
        .open_stream(&target("10.0.0.7"), Topic::KvEvents)
        .unwrap();
    let sub = lines.next().await.unwrap();
    assert_eq!(sub["type"], "subscribe");
    let id = sub["stream_id"].as_str().unwrap().to_owned();
    assert_eq!(id, open.id().to_string());
    assert_eq!(
        sub["target"],
        serde_json::json!({"kind": "zmq", "namespace": "dynamo", "host": "10.0.0.7", "port": 5557, "topic": "kv-events"})
    );
    let (resp, data_tx) = open_data(&mut send, &id, TOKEN_A, "1").await;
    assert_eq!(resp.status(), 200);
    let mut from_router = resp.into_body();
    let mut stream = open.wait().await.unwrap();
    data_tx
        .send(Bytes::from_static(b"\xff\x00zmtp greeting"))
        .await
        .unwrap();
    assert_eq!(
        stream.recv().await.unwrap(),
        Bytes::from_static(b"\xff\x00zmtp greeting")
    );
    stream
        .send(Bytes::from_static(b"to the publisher"))
        .await
        .unwrap();
    assert_eq!(
        next_data(&mut from_router).await.unwrap(),
        Bytes::from_static(b"to the publisher")
    );
    // A second request for the same stream is a duplicate.
    let (dup, _t) = open_data(&mut send, &id, TOKEN_A, "1").await;
    assert_eq!(dup.status(), 409);
    assert_eq!(json(dup).await["error"]["code"], "duplicate_stream");
    drop(stream);
    let unsub = lines.next().await.unwrap();
    assert_eq!(
        unsub,
        serde_json::json!({"type": "unsubscribe", "stream_id": id})
    );
    assert_eq!(
        next_data(&mut from_router).await,
        None,
        "the broker's response ends"
    );
}

/// BUS-26: only the commanding session's credentials, at its version, open a stream.
#[tokio::test]
async fn a_stream_opens_only_for_its_owner_at_its_version() {
    let mut cfg = bus();
    cfg.brokers
        .push(broker("broker-b.dynamo", "token-b", &["dynamo"]));
    let bus = start(cfg);
    let (mut lines, _tx, mut send) = broker_session(&bus).await;
    let open = bus
        .listener
        .bus()
        .open_stream(&target("10.0.0.8"), Topic::KvMetrics)
        .unwrap();
    let id = lines.next().await.unwrap()["stream_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (r, _t) = open_data(&mut send, &id, "token-b", "1").await;
    assert_eq!(r.status(), 403);
    let (r, _t) = open_data(&mut send, &id, TOKEN_A, "2").await;
    assert_eq!(r.status(), 400);
    assert_eq!(
        json(r).await["error"]["code"],
        "unsupported_protocol_version"
    );
    let (r, _t) = open_data(
        &mut send,
        "strm-00000000000000000000000000000bad",
        TOKEN_A,
        "1",
    )
    .await;
    assert_eq!(r.status(), 404);
    let (r, _t) = open_data(&mut send, &id, TOKEN_A, "1").await;
    assert_eq!(r.status(), 200);
    assert!(open.wait().await.is_ok());
}

#[tokio::test]
async fn placement_errors() {
    let mut cfg = bus();
    cfg.max_streams_per_session = 1;
    let bus = start(cfg);
    let api = bus.listener.bus();
    assert_eq!(
        api.open_stream(&target("10.0.0.7"), Topic::KvEvents)
            .unwrap_err(),
        BusStreamError::NoSession
    );
    let (_lines, _tx, _send) = broker_session(&bus).await;
    assert!(api.covers("dynamo"));
    let mut other = target("10.0.0.7");
    other.namespace = "elsewhere".into();
    assert_eq!(
        api.open_stream(&other, Topic::KvEvents).unwrap_err(),
        BusStreamError::NoSession
    );
    assert_eq!(
        api.open_stream(&target("bad host"), Topic::KvEvents)
            .unwrap_err(),
        BusStreamError::InvalidTarget
    );
    let first = api
        .open_stream(&target("10.0.0.7"), Topic::KvEvents)
        .unwrap();
    assert_eq!(
        api.open_stream(&target("10.0.0.9"), Topic::KvEvents)
            .unwrap_err(),
        BusStreamError::TooManyStreams
    );
    // Dropping the pending stream frees its slot.
    drop(first);
    assert!(
        api.open_stream(&target("10.0.0.9"), Topic::KvEvents)
            .is_ok()
    );
}

/// A broker refuses a stream, and a commanded stream it never opens times out (both send
/// nothing further but an `unsubscribe` for the timeout).
#[tokio::test]
async fn refused_and_timed_out_streams() {
    let bus = start_opts(bus(), false, Some(Duration::from_millis(300)));
    let (mut lines, tx, _send) = broker_session(&bus).await;
    let api = bus.listener.bus();
    let (refused, id) = command(&api, &mut lines, "10.0.0.7", Topic::KvEvents).await;
    let closed = serde_json::json!({"type": "stream_closed", "stream_id": id, "reason": "target_not_advertised"});
    tx.send(Bytes::from(format!("{closed}\n"))).await.unwrap();
    assert_eq!(
        refused.wait().await.unwrap_err(),
        BusStreamError::Refused(CloseReason::TargetNotAdvertised)
    );
    let (late, id) = command(&api, &mut lines, "10.0.0.8", Topic::KvEvents).await;
    assert_eq!(late.wait().await.unwrap_err(), BusStreamError::OpenTimeout);
    let unsub = lines.next().await.unwrap();
    assert_eq!(
        unsub,
        serde_json::json!({"type": "unsubscribe", "stream_id": id})
    );
}

/// BUS-44: a draining session's streams end at once and it takes no new one; a session that
/// ends fails its pending streams.
#[tokio::test]
async fn draining_and_ended_sessions_close_their_streams() {
    let bus = start(bus());
    let (mut lines, tx, mut send) = broker_session(&bus).await;
    let api = bus.listener.bus();
    let (open, id) = command(&api, &mut lines, "10.0.0.7", Topic::KvEvents).await;
    let (resp, _data_tx) = open_data(&mut send, &id, TOKEN_A, "1").await;
    let mut to_broker = resp.into_body();
    let mut stream = open.wait().await.unwrap();
    let pending = api
        .open_stream(&target("10.0.0.8"), Topic::KvEvents)
        .unwrap();
    tx.send(Bytes::from_static(b"{\"type\":\"draining\"}\n"))
        .await
        .unwrap();
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), stream.recv())
            .await
            .unwrap(),
        None
    );
    // Both ways: the broker's answer ends too, although the holder still has the stream.
    assert_eq!(next_data(&mut to_broker).await, None);
    assert_eq!(
        pending.wait().await.unwrap_err(),
        BusStreamError::SessionClosed
    );
    assert_eq!(
        api.open_stream(&target("10.0.0.9"), Topic::KvEvents)
            .unwrap_err(),
        BusStreamError::NoSession
    );
    // A new session of the broker supersedes the draining one; its end fails what it held.
    let (mut lines2, tx2, _send2) = broker_session(&bus).await;
    let held = api
        .open_stream(&target("10.0.0.9"), Topic::KvEvents)
        .unwrap();
    assert_eq!(lines2.next().await.unwrap()["type"], "subscribe");
    drop(tx2);
    assert_eq!(
        held.wait().await.unwrap_err(),
        BusStreamError::SessionClosed
    );
    drop(tx);
}

/// BUS-34, BUS-40: a kv_listener's announced source gets its streams on the session with the
/// fewest, carrying the resume position.
#[tokio::test]
async fn announced_streams_go_to_the_least_loaded_kv_listener() {
    use continuum_core::config::dynamo::BrokerRole;
    let mut cfg = bus();
    for (id, token) in [("kvl-1", "token-1"), ("kvl-2", "token-2")] {
        let mut entry = broker(id, token, &[]);
        entry.role = BrokerRole::KvListener;
        entry.backends = vec!["vllm-a".into(), "vllm-b".into()];
        cfg.brokers.push(entry);
    }
    let bus = start(cfg);
    let mut sessions = Vec::new();
    for (id, token) in [("kvl-1", "token-1"), ("kvl-2", "token-2")] {
        let mut send = h2(&bus).await;
        let hello = serde_json::json!({
            "type": "hello", "role": "kv_listener", "client_id": id, "versions": [1],
            "sources": [{"backend": "vllm-a"}],
        });
        let (resp, tx) = session(&mut send, Some(token), Some("1"), &hello.to_string()).await;
        assert_eq!(resp.status(), 200);
        let mut lines = Lines::new(resp.into_body());
        assert_eq!(lines.next().await.unwrap()["type"], "welcome");
        sessions.push((lines, tx, send));
    }
    let api = bus.listener.bus();
    let first = api.open_announced_stream("vllm-a", Some(41)).unwrap();
    let sub = sessions[0].0.next().await.unwrap();
    assert_eq!(
        sub["target"],
        serde_json::json!({"kind": "announced", "backend": "vllm-a", "last_event_id": 41})
    );
    assert_eq!(sub["stream_id"].as_str().unwrap(), first.id().to_string());
    // kvl-1 now carries one stream: the next goes to kvl-2.
    let second = api.open_announced_stream("vllm-a", None).unwrap();
    let sub = sessions[1].0.next().await.unwrap();
    assert_eq!(
        sub["target"],
        serde_json::json!({"kind": "announced", "backend": "vllm-a"})
    );
    assert_eq!(sub["stream_id"].as_str().unwrap(), second.id().to_string());
    // vllm-b is allowed for both entries but announced by neither session.
    assert_eq!(
        api.open_announced_stream("vllm-b", None).unwrap_err(),
        BusStreamError::NoSession
    );
    // Broker streams never land on a kv_listener.
    assert_eq!(
        api.open_stream(&target("10.0.0.7"), Topic::KvEvents)
            .unwrap_err(),
        BusStreamError::NoSession
    );
}

/// BUS-36: the sessions watch wakes a waiter when a session opens and when it ends (no polling),
/// and coverage follows.
#[tokio::test]
async fn the_sessions_watch_wakes_on_open_and_end() {
    let bus = start(bus());
    let api = bus.listener.bus();
    let mut watch = api.subscribe_sessions();
    watch.borrow_and_update();
    assert!(api.covered_namespaces().is_empty());
    let (lines, tx, send) = broker_session(&bus).await;
    tokio::time::timeout(Duration::from_secs(5), watch.changed())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(api.covered_namespaces(), vec!["dynamo".to_owned()]);
    assert_eq!(api.session_count(), 1);
    watch.borrow_and_update();
    drop((lines, tx, send));
    tokio::time::timeout(Duration::from_secs(5), watch.changed())
        .await
        .unwrap()
        .unwrap();
    eventually(|| api.session_count() == 0).await;
    assert!(!api.covers("dynamo"));
}

/// A `stream_closed` line that overtakes data on its own HTTP/2 stream does not cut the data
/// off: what the broker sends on the stream still arrives (within `CLOSE_GRACE`), then the end.
#[tokio::test]
async fn a_stream_closed_line_does_not_cut_off_the_data_it_overtook() {
    let bus = start(bus());
    let (mut lines, tx, mut send) = broker_session(&bus).await;
    let api = bus.listener.bus();
    let (open, id) = command(&api, &mut lines, "10.0.0.7", Topic::KvMetrics).await;
    let (resp, data_tx) = open_data(&mut send, &id, TOKEN_A, "1").await;
    assert_eq!(resp.status(), 200);
    let mut stream = open.wait().await.unwrap();
    data_tx.send(Bytes::from_static(b"first")).await.unwrap();
    assert_eq!(stream.recv().await.unwrap(), Bytes::from_static(b"first"));
    // The control line first, the rest of the data after it: the race a broker can lose. The
    // pause lets the listener act on the line before the data arrives.
    let closed = serde_json::json!({"type": "stream_closed", "stream_id": id, "reason": "eof"});
    tx.send(Bytes::from(format!("{closed}\n"))).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    data_tx.send(Bytes::from_static(b"last")).await.unwrap();
    drop(data_tx);
    let next = tokio::time::timeout(Duration::from_secs(5), stream.recv())
        .await
        .unwrap();
    assert_eq!(
        next,
        Some(Bytes::from_static(b"last")),
        "the data the line overtook"
    );
    let end = tokio::time::timeout(Duration::from_secs(5), stream.recv())
        .await
        .unwrap();
    assert_eq!(end, None);
}
