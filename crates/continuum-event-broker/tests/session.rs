//! The broker against the router's own event bus listener over real TLS 1.3 and HTTP/2, with
//! loopback TCP publishers: relaying (BUS-05), BROKER-14's advertised-only rule, a publisher's
//! end, draining (BUS-44), a refused credential, and reconnecting after the listener restarts.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{TOKEN, eventually, listen, router};
use continuum_bus::{BusStreamError, ZmqTarget};
use continuum_event_broker::{Advertised, BrokerStats, SessionError};
use continuum_event_bus::code::Code;
use continuum_event_bus::message::{CloseReason, Topic};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;

/// A publisher double: accepts one connection, writes `greeting`, then echoes upper-cased what it
/// reads back (so the test sees both directions), until the peer closes or `close` fires.
async fn publisher(
    greeting: impl AsRef<[u8]> + Send + 'static,
) -> (
    u16,
    tokio::task::JoinHandle<Vec<u8>>,
    tokio::sync::oneshot::Sender<()>,
) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let (close_tx, mut close_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        s.write_all(greeting.as_ref()).await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            tokio::select! {
                n = s.read(&mut buf) => match n {
                    Ok(0) | Err(_) => return got,
                    Ok(n) => {
                        got.extend_from_slice(&buf[..n]);
                        let _ = s.write_all(&buf[..n].to_ascii_uppercase()).await;
                    }
                },
                _ = &mut close_rx => return got,
            }
        }
    });
    (port, task, close_tx)
}

fn target(port: u16) -> ZmqTarget {
    ZmqTarget {
        namespace: "dynamo".into(),
        host: "127.0.0.1".into(),
        port,
    }
}

fn advertising(ports: &[(u16, Topic)]) -> watch::Receiver<Arc<Advertised>> {
    let set = Advertised::from_entries(
        ports
            .iter()
            .map(|(p, t)| ("dynamo".to_owned(), "127.0.0.1".to_owned(), *p, *t)),
    );
    watch::channel(Arc::new(set)).1
}

async fn recv_exactly(stream: &mut continuum_bus::BusStream, n: usize) -> Vec<u8> {
    let mut got = Vec::new();
    while got.len() < n {
        let chunk = tokio::time::timeout(Duration::from_secs(5), stream.recv())
            .await
            .expect("bytes within 5 s")
            .expect("the stream is open");
        got.extend_from_slice(&chunk);
    }
    got
}

/// A broker relaying `port` (topic `topic`) to a fresh router listener, welcomed.
struct Running {
    router: common::Router,
    stats: Arc<BrokerStats>,
    drain: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

async fn running(port: u16, topic: Topic) -> Running {
    let router = router();
    let (drain, drain_rx) = watch::channel(false);
    let stats = Arc::new(BrokerStats::default());
    let task = tokio::spawn(continuum_event_broker::run(
        router.dial(TOKEN),
        advertising(&[(port, topic)]),
        drain_rx,
        stats.clone(),
    ));
    let api = router.listener.bus();
    eventually(|| api.covers("dynamo") && stats.sessions() == 1).await;
    Running {
        router,
        stats,
        drain,
        task,
    }
}

impl Running {
    /// The router opens a stream to `port` and the broker relays it.
    async fn open(&self, port: u16, topic: Topic) -> continuum_bus::BusStream {
        self.router
            .listener
            .bus()
            .open_stream(&target(port), topic)
            .unwrap()
            .wait()
            .await
            .unwrap()
    }
}

#[tokio::test]
async fn relays_an_advertised_publisher_both_ways_and_refuses_the_rest() {
    let (port, published, _close) = publisher(b"\xff\x00greeting").await;
    let broker = running(port, Topic::KvEvents).await;
    let (api, stats) = (broker.router.listener.bus(), broker.stats.clone());
    let mut stream = broker.open(port, Topic::KvEvents).await;
    assert_eq!(recv_exactly(&mut stream, 10).await, b"\xff\x00greeting");
    stream.send(Bytes::from_static(b"subscribe")).await.unwrap();
    assert_eq!(recv_exactly(&mut stream, 9).await, b"SUBSCRIBE");
    assert_eq!(stats.streams(), 1);

    // The same publisher on the other topic, and a port nobody advertised: refused, not dialled.
    let (other, other_published, _c) = publisher(b"never").await;
    for (port, topic) in [(port, Topic::KvMetrics), (other, Topic::KvEvents)] {
        let refused = api.open_stream(&target(port), topic).unwrap().wait().await;
        assert_eq!(
            refused.unwrap_err(),
            BusStreamError::Refused(CloseReason::TargetNotAdvertised)
        );
    }
    assert_eq!(stats.refusals(CloseReason::TargetNotAdvertised), 2);
    assert!(!other_published.is_finished(), "nothing connected to it");

    // The router drops the stream: the broker ends the relay and the publisher sees the close.
    drop(stream);
    let got = tokio::time::timeout(Duration::from_secs(5), published)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, b"subscribe");
    eventually(|| stats.streams() == 0).await;
    broker.task.abort();
}

#[tokio::test]
async fn a_publisher_that_ends_ends_the_stream_after_its_last_byte() {
    // 1 MB written at once, then the publisher goes: every byte must still arrive (the end
    // travels in band; a `stream_closed` that overtook it would cut the tail off).
    let payload: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let (port, _published, close) = publisher(payload.clone()).await;
    let broker = running(port, Topic::KvMetrics).await;
    let mut stream = broker.open(port, Topic::KvMetrics).await;
    close.send(()).unwrap();
    let mut got = Vec::new();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(5), stream.recv())
        .await
        .expect("bytes or the end within 5 s")
    {
        got.extend_from_slice(&chunk);
    }
    assert_eq!(got.len(), payload.len(), "every byte before the end");
    assert_eq!(got, payload);
    eventually(|| broker.stats.streams() == 0).await;
    broker.task.abort();
}

#[tokio::test]
async fn draining_hands_the_streams_back_then_ends() {
    let (port, _published, _close) = publisher(b"x").await;
    let broker = running(port, Topic::KvMetrics).await;
    let (api, stats) = (broker.router.listener.bus(), broker.stats.clone());
    let mut stream = broker.open(port, Topic::KvMetrics).await;
    assert_eq!(recv_exactly(&mut stream, 1).await, b"x");
    broker.drain.send(true).unwrap();
    // The router closes a draining session's streams and places nothing new on it (BUS-44);
    // with no stream left, the broker ends the session and returns.
    let end = tokio::time::timeout(Duration::from_secs(5), stream.recv())
        .await
        .expect("the stream ends within 5 s");
    assert_eq!(end, None);
    tokio::time::timeout(Duration::from_secs(5), broker.task)
        .await
        .expect("the broker returns once drained")
        .unwrap();
    eventually(|| !api.covers("dynamo")).await;
    assert_eq!(stats.sessions(), 0);
}

#[tokio::test]
async fn a_wrong_token_is_refused_unauthenticated() {
    let router = router();
    let (_drain_tx, mut drain) = watch::channel(false);
    let err = continuum_event_broker::session::run(
        &router.dial("not-the-token"),
        &advertising(&[]),
        &mut drain,
        &BrokerStats::default(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, SessionError::Refused(Some(Code::Unauthenticated))),
        "{err:?}"
    );
    assert!(!err.after_welcome());
}

#[tokio::test]
async fn reconnects_when_the_listener_comes_back() {
    let router = router();
    let addr = router.listener.local_addr();
    let (_drain_tx, drain) = watch::channel(false);
    let stats = Arc::new(BrokerStats::default());
    let broker = tokio::spawn(continuum_event_broker::run(
        router.dial(TOKEN),
        advertising(&[]),
        drain,
        stats.clone(),
    ));
    eventually(|| stats.sessions() == 1).await;
    let common::Router { listener, tls, .. } = router;
    listener.stop();
    eventually(|| stats.sessions() == 0).await;
    let again = listen(tls, addr);
    eventually(|| stats.established() == 2).await;
    assert!(again.covers("dynamo"));
    broker.abort();
}
