//! The broker against a router that breaks its own limits: a fake listener (hyper's HTTP/2
//! server over rustls, speaking the wire contract through `continuum-event-bus`) welcomes the
//! broker with `max_streams_per_session: 2` and then commands three streams to an advertised
//! publisher. The broker opens two and refuses the third (`stream_closed refused`), so what it
//! holds stays bounded whatever a router sends.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use common::{TOKEN, eventually};
use continuum_event_broker::{Advertised, BrokerStats};
use continuum_event_bus::codec::{LineReader, MAX_LINE_BYTES, decode_client, encode};
use continuum_event_bus::ids::{SessionId, StreamId};
use continuum_event_bus::message::{
    ClientMessage, CloseReason, Limits, RouterMessage, Target, Topic, Welcome,
};
use http_body_util::BodyExt as _;
use hyper::body::{Frame, Incoming};
use tokio::sync::{mpsc, watch};

/// A response body fed through a channel (kept open while the sender lives).
struct Lines(mpsc::Receiver<Bytes>);

impl hyper::body::Body for Lines {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.get_mut()
            .0
            .poll_recv(cx)
            .map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

fn line(m: &RouterMessage) -> Bytes {
    let mut out = Vec::new();
    encode(m, &mut out);
    Bytes::from(out)
}

/// What the fake router saw: the broker's control messages, and the data streams it opened.
#[derive(Default)]
struct Seen {
    from_broker: Vec<ClientMessage>,
    opened: Vec<String>,
}

async fn serve(
    req: http::Request<Incoming>,
    port: u16,
    seen: Arc<std::sync::Mutex<Seen>>,
    keep: Arc<std::sync::Mutex<Vec<mpsc::Sender<Bytes>>>>,
) -> Result<http::Response<Lines>, Infallible> {
    let (tx, rx) = mpsc::channel(16);
    if req.uri().path() == "/bus/v1/session" {
        let welcome = RouterMessage::Welcome(Welcome {
            session_id: SessionId::from_random(7),
            version: 1,
            limits: Limits {
                max_streams_per_session: 2,
                max_session_buffer_bytes: 64 << 20,
                stream_buffer_bytes: 16 << 10,
                heartbeat_interval_ms: 10_000,
                idle_timeout_ms: 30_000,
            },
        });
        tx.send(line(&welcome)).await.unwrap();
        for i in 1..=3u128 {
            let subscribe = RouterMessage::Subscribe {
                stream_id: StreamId::from_random(i),
                target: Target::Zmq {
                    namespace: "dynamo".into(),
                    host: "127.0.0.1".into(),
                    port,
                    topic: Topic::KvMetrics,
                },
            };
            tx.send(line(&subscribe)).await.unwrap();
        }
        // Read the broker's lines as they come.
        let mut body = req.into_body();
        tokio::spawn(async move {
            let mut reader = LineReader::new(MAX_LINE_BYTES);
            while let Some(Ok(frame)) = body.frame().await {
                if let Ok(data) = frame.into_data() {
                    let mut got = Vec::new();
                    reader
                        .feed(&data, |l| got.push(decode_client(l).unwrap()))
                        .unwrap();
                    seen.lock().unwrap().from_broker.extend(got);
                }
            }
        });
    } else {
        seen.lock()
            .unwrap()
            .opened
            .push(req.uri().path().to_owned());
    }
    // Every answer stays open for the test's life.
    keep.lock().unwrap().push(tx);
    Ok(http::Response::new(Lines(rx)))
}

#[tokio::test]
async fn commands_past_the_welcomed_stream_limit_are_refused() {
    // An advertised publisher that accepts and holds connections.
    let publisher = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = publisher.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = publisher.accept().await {
            held.push(s);
        }
    });

    // The fake router: TLS 1.3 with ALPN h2, a certificate for router.test.
    let pki = common::pki();
    let server_tls = pki.tls.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
    let keep = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (s2, k2) = (seen.clone(), keep.clone());
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let tls = tokio_rustls::TlsAcceptor::from(server_tls)
            .accept(tcp)
            .await
            .unwrap();
        let svc = hyper::service::service_fn(move |req| serve(req, port, s2.clone(), k2.clone()));
        let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
            .await;
    });

    let dial = common::dial(addr, &pki.ca, TOKEN);
    let advertised = Advertised::from_entries([(
        "dynamo".to_owned(),
        "127.0.0.1".to_owned(),
        port,
        Topic::KvMetrics,
    )]);
    let (_drain_tx, drain) = watch::channel(false);
    let stats = Arc::new(BrokerStats::default());
    let broker = tokio::spawn(continuum_event_broker::run(
        dial,
        watch::channel(Arc::new(advertised)).1,
        drain,
        stats.clone(),
    ));

    let third = StreamId::from_random(3);
    eventually(|| {
        seen.lock().unwrap().from_broker.iter().any(|m| {
            matches!(m, ClientMessage::StreamClosed { stream_id, reason: CloseReason::Refused }
                if *stream_id == third)
        })
    })
    .await;
    // Give a wrongly opened third stream the time to show up, then count.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let opened = seen.lock().unwrap().opened.clone();
    assert_eq!(
        opened,
        vec![
            format!("/bus/v1/streams/{}", StreamId::from_random(1)),
            format!("/bus/v1/streams/{}", StreamId::from_random(2)),
        ],
        "two streams, the limit"
    );
    assert_eq!(stats.streams(), 2);
    assert_eq!(stats.refusals(CloseReason::Refused), 1);
    broker.abort();
}
