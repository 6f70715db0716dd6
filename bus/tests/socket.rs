//! Streams handed over as Unix sockets (`OpenStream::into_socket`, `BusStream::into_socket`): how
//! a shard reads a relayed publisher. The test plays the broker with a hyper client over real TLS
//! and HTTP/2, and the holder with a plain socket.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use continuum_bus::{BusStream, BusStreamError, open_status};
use continuum_event_bus::message::{CloseReason, Topic};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UnixStream;

fn holder(sock: std::os::unix::net::UnixStream) -> UnixStream {
    sock.set_nonblocking(true).unwrap();
    UnixStream::from_std(sock).unwrap()
}

/// The router commands a stream to `host` and takes it as a socket: the holder's end and the id
/// the broker was told.
async fn commanded(
    api: &continuum_bus::EventBus,
    lines: &mut Lines,
    host: &str,
    topic: Topic,
) -> (UnixStream, String) {
    let (open, id) = command(api, lines, host, topic).await;
    let sock = holder(open.into_socket().unwrap());
    (sock, id)
}

async fn status(sock: &mut UnixStream) -> Result<(), BusStreamError> {
    let mut byte = [0u8; 1];
    tokio::time::timeout(Duration::from_secs(5), sock.read_exact(&mut byte))
        .await
        .expect("a status byte within 5 s")
        .unwrap();
    open_status(byte[0])
}

#[tokio::test]
async fn a_socket_relays_both_ways_and_ends_when_either_side_does() {
    let bus = start(bus());
    let (mut lines, _session_tx, mut send) = broker_session(&bus).await;
    let api = bus.listener.bus();
    let (mut sock, id) = commanded(&api, &mut lines, "10.0.0.7", Topic::KvMetrics).await;
    let (resp, data_tx) = open_data(&mut send, &id, TOKEN_A, "1").await;
    assert_eq!(resp.status(), 200);
    let mut from_router = resp.into_body();
    assert_eq!(status(&mut sock).await, Ok(()));

    // In: 20 KB, more than the stream's chunk (4 KiB with the defaults), in uneven pieces.
    let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    let expect = data.clone();
    let writer = tokio::spawn(async move {
        for piece in data.chunks(3_000) {
            data_tx.send(Bytes::copy_from_slice(piece)).await.unwrap();
        }
        data_tx
    });
    let mut got = vec![0u8; expect.len()];
    sock.read_exact(&mut got).await.unwrap();
    assert_eq!(got, expect, "every byte, in order");

    // Out: what the holder writes reaches the broker.
    sock.write_all(b"to the publisher").await.unwrap();
    let mut out = Vec::new();
    while out.len() < 16 {
        out.extend_from_slice(&next_data(&mut from_router).await.unwrap());
    }
    assert_eq!(out, b"to the publisher");

    // The broker ends its request: the holder reads end of file.
    drop(writer.await.unwrap());
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), sock.read_to_end(&mut rest))
        .await
        .expect("end of file within 5 s")
        .unwrap();
    assert!(rest.is_empty());
    // The holder closes its end: the stream ends and the broker is told.
    drop(sock);
    assert_eq!(
        lines.next().await.unwrap(),
        serde_json::json!({"type": "unsubscribe", "stream_id": id})
    );
}

#[tokio::test]
async fn a_refused_stream_says_why_and_a_holder_that_leaves_first_unsubscribes() {
    let bus = start(bus());
    let (mut lines, tx, _send) = broker_session(&bus).await;
    let api = bus.listener.bus();
    let (mut refused, id) = commanded(&api, &mut lines, "10.0.0.7", Topic::KvEvents).await;
    let closed = serde_json::json!({"type": "stream_closed", "stream_id": id, "reason": "target_not_advertised"});
    tx.send(Bytes::from(format!("{closed}\n"))).await.unwrap();
    assert_eq!(
        status(&mut refused).await,
        Err(BusStreamError::Refused(CloseReason::TargetNotAdvertised))
    );
    let mut rest = Vec::new();
    refused.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "nothing after a refusal");

    // Dropped before the broker opened it: cancelled at once, not after the open timeout.
    let (gone, id) = commanded(&api, &mut lines, "10.0.0.8", Topic::KvEvents).await;
    drop(gone);
    assert_eq!(
        lines.next().await.unwrap(),
        serde_json::json!({"type": "unsubscribe", "stream_id": id})
    );
}

/// The status byte round-trips every way a commanded stream can fail after placement.
#[test]
fn status_bytes_name_every_outcome() {
    for reason in CloseReason::ALL {
        assert!(
            (0..=u8::MAX).any(|b| open_status(b) == Err(BusStreamError::Refused(reason))),
            "{reason:?}"
        );
    }
    assert_eq!(open_status(0), Ok(()));
    assert!((0..=u8::MAX).any(|b| open_status(b) == Err(BusStreamError::OpenTimeout)));
    assert!((0..=u8::MAX).any(|b| open_status(b) == Err(BusStreamError::SessionClosed)));
}

/// A session carries its whole stream limit at once (the HTTP/2 concurrent-stream setting is
/// the limit plus the control stream, not hyper's default of 200).
#[tokio::test]
async fn a_session_carries_more_than_two_hundred_streams() {
    let bus = start(bus());
    let (mut lines, _tx, mut send) = broker_session(&bus).await;
    let api = bus.listener.bus();
    let mut held = Vec::new();
    for i in 0..250u32 {
        let open = api
            .open_stream(
                &target(&format!("10.0.{}.{}", i / 200, i % 200)),
                Topic::KvEvents,
            )
            .unwrap();
        let line = loop {
            let line = lines
                .next()
                .await
                .unwrap_or_else(|| panic!("the session ended before stream {i}"));
            if line["type"] != "heartbeat" {
                break line;
            }
        };
        let id = line["stream_id"]
            .as_str()
            .unwrap_or_else(|| panic!("stream {i}: {line}"))
            .to_owned();
        let (resp, body_tx) = tokio::time::timeout(
            Duration::from_secs(5),
            open_data(&mut send, &id, TOKEN_A, "1"),
        )
        .await
        .unwrap_or_else(|_| panic!("stream {i} was not answered"));
        assert_eq!(resp.status(), 200, "stream {i}");
        held.push((open.wait().await.unwrap(), resp, body_tx));
    }
    assert_eq!(held.len(), 250);
}

/// An in-memory stream (a broker double) pumps on the caller's runtime.
#[tokio::test]
async fn an_in_memory_stream_becomes_a_socket_on_the_current_runtime() {
    let (stream, mut peer) = BusStream::in_memory(1024);
    let mut sock = holder(stream.into_socket().unwrap());
    peer.to_holder
        .send(Bytes::from_static(b"zmtp bytes"))
        .await
        .unwrap();
    let mut got = [0u8; 10];
    sock.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"zmtp bytes");
    sock.write_all(&[7u8; 3000]).await.unwrap();
    let mut out = Vec::new();
    while out.len() < 3000 {
        let piece = peer.from_holder.recv().await.unwrap();
        assert!(piece.len() <= 1024, "pieces are at most the chunk");
        out.extend_from_slice(&piece);
    }
    assert_eq!(out, vec![7u8; 3000]);
    drop(peer);
    let mut rest = Vec::new();
    sock.read_to_end(&mut rest).await.unwrap();
    assert!(
        rest.is_empty(),
        "the peer's end is the holder's end of file"
    );
}
