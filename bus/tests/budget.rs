//! BUS-27..29 over real TLS and HTTP/2: a broker that pushes ten times a stream's budget while the
//! router reads nothing is held back by flow control, the listener holds no more than the budget's
//! pipe and frame beyond the HTTP/2 window, and once the router reads, every byte arrives, in order.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use continuum_bus::ZmqTarget;
use continuum_event_bus::message::Topic;
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};

/// The default per-stream, per-direction budget (`max_session_buffer_bytes` 64 MiB over
/// 4 × 1024 streams, clamped to 16 KiB).
const BUDGET: usize = 16 << 10;
const CHUNK: usize = 1024;
const TOTAL: usize = 10 * BUDGET;

fn byte_at(i: usize) -> u8 {
    (i % 251) as u8
}

/// A request body of `TOTAL` bytes in `CHUNK`s, counting what hyper took from it.
struct Counting {
    sent: usize,
    taken: Arc<AtomicUsize>,
}

impl hyper::body::Body for Counting {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.sent >= TOTAL {
            return Poll::Ready(None);
        }
        let start = self.sent;
        let chunk: Vec<u8> = (start..start + CHUNK).map(byte_at).collect();
        self.sent += CHUNK;
        self.taken.fetch_add(CHUNK, Ordering::SeqCst);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(chunk)))))
    }
}

#[tokio::test]
async fn a_broker_pushing_ten_times_the_budget_is_held_to_it() {
    let bus = start(bus());
    let (mut lines, _tx, _send) = broker_session(&bus).await;
    let open = bus
        .listener
        .bus()
        .open_stream(
            &ZmqTarget {
                namespace: "dynamo".into(),
                host: "10.0.0.7".into(),
                port: 5557,
            },
            Topic::KvEvents,
        )
        .unwrap();
    let id = lines.next().await.unwrap()["stream_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The broker's data connection: a client that buffers at most one chunk of its own.
    let tls = tls_connect(&bus, client_tls(&bus.pki, &[b"h2"], false))
        .await
        .unwrap();
    let (mut data, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .max_send_buf_size(CHUNK)
        .handshake::<_, Counting>(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let taken = Arc::new(AtomicUsize::new(0));
    let req = http::Request::post(format!("https://localhost/bus/v1/streams/{id}"))
        .header("authorization", format!("Bearer {TOKEN_A}"))
        .header("continuum-bus-version", "1")
        .body(Counting {
            sent: 0,
            taken: taken.clone(),
        })
        .unwrap();
    let resp = data.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = open.wait().await.unwrap();
    // The router reads nothing for a while. The broker is held back by flow control (what it
    // hands its connection stops growing), and what the listener took off the connection is at
    // most the stream's pipe and the frame in hand; HTTP/2 holds the rest of the budget, the
    // receive window, which the broker cannot overrun (a flow-control error otherwise).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (before, taken_in) = (taken.load(Ordering::SeqCst), bus.metrics.stream_bytes_in());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = taken.load(Ordering::SeqCst);
    assert_eq!(
        before, held,
        "the broker kept sending while nothing was read"
    );
    assert_eq!(
        bus.metrics.stream_bytes_in(),
        taken_in,
        "the listener kept taking"
    );
    assert!(
        held < TOTAL / 2,
        "flow control did not hold the broker: {held} of {TOTAL}"
    );
    let window = BUDGET / 4;
    assert!(
        taken_in as usize <= 3 * window,
        "the listener holds {taken_in} bytes outside the window; the budget allows {}",
        3 * window
    );
    assert!(taken_in > 0);
    // Now the router reads: every byte arrives, in order.
    let mut got = 0usize;
    while got < TOTAL {
        let chunk = tokio::time::timeout(Duration::from_secs(10), stream.recv())
            .await
            .expect("bytes keep coming")
            .expect("the stream ended early");
        for (k, b) in chunk.iter().enumerate() {
            assert_eq!(*b, byte_at(got + k), "byte {}", got + k);
        }
        got += chunk.len();
    }
    assert_eq!(got, TOTAL);
    assert_eq!(taken.load(Ordering::SeqCst), TOTAL);
    assert_eq!(bus.metrics.stream_bytes_in(), TOTAL as u64);
}
