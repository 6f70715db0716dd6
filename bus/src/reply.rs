//! What the listener answers with: the response body type (a whole refusal, or a session's
//! line stream), counted refusals with their code's status and JSON body, and the credentials a
//! request presents. A leaf: the routes and the session both use it.

use std::convert::Infallible;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use continuum_core::bus::credentials::{Presented, VerifiedCert};
use continuum_event_bus::code::{Code, error_body};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Frame;
use tokio::sync::mpsc;

use crate::state::State;

/// What the requests of one connection share.
#[derive(Debug)]
pub(crate) struct ConnInfo {
    /// An authenticated request was answered 2xx (BUS-24).
    pub(crate) authed: AtomicBool,
    /// The verified client certificate's DNS SANs and the CA generation that verified it.
    pub(crate) cert: Option<(Vec<String>, u64)>,
    /// Requests whose answer has not ended (a session's or a stream's lasts as long as it).
    pub(crate) active: AtomicUsize,
    /// When the last request's answer ended (accept time before any).
    pub(crate) last_end: Mutex<tokio::time::Instant>,
}

impl ConnInfo {
    pub(crate) fn new(cert: Option<(Vec<String>, u64)>) -> Self {
        Self {
            authed: AtomicBool::new(false),
            cert,
            active: AtomicUsize::new(0),
            last_end: Mutex::new(tokio::time::Instant::now()),
        }
    }

    /// When the connection went idle, if no request is active.
    pub(crate) fn idle_since(&self) -> Option<tokio::time::Instant> {
        (self.active.load(Ordering::Acquire) == 0).then(|| *self.last_end())
    }

    fn last_end(&self) -> std::sync::MutexGuard<'_, tokio::time::Instant> {
        self.last_end
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One request of a connection, from its arrival until its answer's body is dropped (sent or
/// reset): the connection is not idle meanwhile (BUS-25).
#[derive(Debug)]
pub(crate) struct Active(Arc<ConnInfo>);

impl Active {
    pub(crate) fn new(conn: Arc<ConnInfo>) -> Self {
        conn.active.fetch_add(1, Ordering::AcqRel);
        Self(conn)
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        *self.0.last_end() = tokio::time::Instant::now();
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request [`Active`] until it is dropped.
pub(crate) struct Tracked {
    pub(crate) body: Body,
    pub(crate) _active: Active,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }
}

/// A response body: a whole refusal, or a session's lines or a data stream's bytes.
pub(crate) enum Body {
    Whole(Full<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
    /// A data stream's bytes to the broker, counted as they leave; it ends when the stream's
    /// inbound pump ends (the stream was closed, the broker's request ended, or the holder is
    /// gone: the third part resolves), so a stream the router closes ends both ways.
    Relay(
        mpsc::Receiver<Bytes>,
        std::sync::Arc<continuum_core::bus::metrics::BusMetrics>,
        tokio::sync::oneshot::Receiver<()>,
    ),
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Whole(b) => Pin::new(b).poll_frame(cx),
            Body::Stream(rx) => rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
            Body::Relay(rx, metrics, ended) => {
                if Pin::new(ended).poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                rx.poll_recv(cx).map(|o| {
                    o.map(|b| {
                        metrics.relayed_out(b.len());
                        Ok(Frame::data(b))
                    })
                })
            }
        }
    }
}

/// The credentials a request presents: its bearer token and its connection's verified client
/// certificate.
pub(crate) fn presented<'a>(headers: &'a HeaderMap, conn: &'a ConnInfo) -> Presented<'a> {
    let bearer = headers
        .get(http::header::AUTHORIZATION)
        .map(|v| v.as_bytes())
        .and_then(|v| {
            let (scheme, token) = v.split_at(v.len().min(7));
            scheme
                .eq_ignore_ascii_case(b"bearer ")
                .then_some(token.trim_ascii())
        });
    let cert = conn.cert.as_ref().map(|(sans, generation)| VerifiedCert {
        dns_sans: sans,
        ca_generation: *generation,
    });
    Presented { bearer, cert }
}

/// Count and answer a refusal.
pub(crate) fn refuse(state: &State, code: Code, message: &str) -> Response<Body> {
    state.metrics.refused(code);
    let status = code
        .http_status()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::BAD_REQUEST);
    let mut resp = Response::new(Body::Whole(Full::new(Bytes::from(error_body(
        code, message,
    )))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

/// Most bytes a refused request's body is read for, and for how long, before it is dropped.
const DRAIN_BYTES: usize = 64 * 1024;
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(10);

/// [`refuse`], reading the rest of the request body in the background (up to [`DRAIN_BYTES`] and
/// [`DRAIN_TIME`]): a client still sending (curl sends its whole body) then sees the answer and a
/// clean end of stream, not a reset under it.
pub(crate) fn drain_refuse(
    body: hyper::body::Incoming,
    state: &State,
    code: Code,
    message: &str,
) -> Response<Body> {
    tokio::spawn(async move {
        use http_body_util::BodyExt as _;
        let mut body = body;
        let mut read = 0usize;
        let _ = tokio::time::timeout(DRAIN_TIME, async {
            while read < DRAIN_BYTES {
                match body.frame().await {
                    Some(Ok(f)) => read += f.data_ref().map_or(0, Bytes::len),
                    _ => break,
                }
            }
        })
        .await;
    });
    refuse(state, code, message)
}
