//! One connection from accept to close: the first-byte check (BUS-09), the TLS handshake within
//! 10 s with ALPN `h2` (BUS-08, BUS-10), then HTTP/2 with a PING every 20 s (BUS-11), shut down when
//! no authenticated 2xx request came within 10 s of accept, PINGs or not (BUS-24), or when it has
//! been idle (no answer in progress) for 30 s or `idle_timeout`, whichever is shorter (BUS-25,
//! a GOAWAY, after which a request still in flight gets its answer and nothing new is
//! taken.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use continuum_event_bus::code::{Code, error_body};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::reply::ConnInfo;
use crate::state::{ConnectionSlot, State};

/// The TLS handshake's allowance, first byte included (BUS-10).
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The allowance for a connection's first authenticated 2xx request (BUS-24).
pub(crate) const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection closes this long after its last answer ended (BUS-25), or after `idle_timeout`
/// when that is shorter.
pub(crate) const IDLE_CLOSE: Duration = Duration::from_secs(30);
/// The HTTP/2 keep-alive PING period (BUS-11).
pub(crate) const PING_INTERVAL: Duration = Duration::from_secs(20);

/// What the first byte of a connection says (BUS-09).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FirstByte {
    /// A TLS handshake record.
    Tls,
    /// Printable ASCII: a plaintext client, answered with a plaintext 403 before the close.
    Ascii,
    /// Anything else: closed.
    Other,
}

pub(crate) fn classify(b: u8) -> FirstByte {
    match b {
        0x16 => FirstByte::Tls,
        0x20..=0x7e => FirstByte::Ascii,
        _ => FirstByte::Other,
    }
}

/// The plaintext answer to a plaintext client.
pub(crate) fn plaintext_refusal() -> Vec<u8> {
    let body = error_body(
        Code::TlsRequired,
        "this port speaks TLS 1.3 with HTTP/2 only",
    );
    let mut out = format!(
        "HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

async fn handshake(
    mut tcp: TcpStream,
    acceptor: &tokio_rustls::TlsAcceptor,
) -> Result<tokio_rustls::server::TlsStream<TcpStream>, Option<Code>> {
    let mut first = [0u8; 1];
    if tcp.peek(&mut first).await.map_err(|_| None)? == 0 {
        return Err(None);
    }
    match classify(first[0]) {
        FirstByte::Tls => {}
        FirstByte::Ascii => {
            // Take what the client sent, answer, and let it read the answer before the close
            // (closing on unread bytes would reset the connection under its reader).
            let mut sink = [0u8; 4096];
            let _ = tcp.try_read(&mut sink);
            let _ = tcp.write_all(&plaintext_refusal()).await;
            let _ = tcp.shutdown().await;
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                while let Ok(n) = tcp.read(&mut sink).await {
                    if n == 0 {
                        break;
                    }
                }
            })
            .await;
            return Err(Some(Code::TlsRequired));
        }
        FirstByte::Other => return Err(Some(Code::TlsRequired)),
    }
    let tls = acceptor
        .accept(tcp)
        .await
        .map_err(|_| Some(Code::HandshakeFailed))?;
    // A client that offered no ALPN at all completes a rustls handshake without one.
    if tls.get_ref().1.alpn_protocol() != Some(crate::tls::ALPN_H2) {
        return Err(Some(Code::HandshakeFailed));
    }
    Ok(tls)
}

/// Serve one accepted connection until it closes.
pub(crate) async fn connection(
    tcp: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    state: Arc<State>,
    _slot: ConnectionSlot,
) {
    let accepted = tokio::time::Instant::now();
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(tcp, &acceptor)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(code)) => {
            if let Some(code) = code {
                state.metrics.refused(code);
            }
            return;
        }
        Err(_) => {
            state.metrics.refused(Code::HandshakeTimeout);
            return;
        }
    };
    // The identity a verified client certificate claims, bound to the CA generation that
    // verified it (BUS-17).
    let cert = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| {
            (
                crate::tls::dns_sans(c),
                state.lock().credentials.ca_generation(),
            )
        });
    let info = Arc::new(ConnInfo::new(cert));
    let svc = {
        let (state, info) = (state.clone(), info.clone());
        hyper::service::service_fn(move |req| {
            crate::service::handle(req, state.clone(), info.clone())
        })
    };
    let (windows, max_streams) = {
        let d = state.lock();
        (
            crate::budget::Windows::of(&d.bus),
            d.bus.max_streams_per_session,
        )
    };
    let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(PING_INTERVAL))
        .keep_alive_timeout(PING_INTERVAL)
        .adaptive_window(false)
        .initial_stream_window_size(windows.stream)
        .initial_connection_window_size(windows.connection)
        .max_send_buf_size(windows.send_buf)
        // Every stream a session may hold, and its control stream: hyper's default (200) would
        // make a broker's streams past it wait forever for a slot.
        .max_concurrent_streams(max_streams.saturating_add(1))
        .serve_connection(TokioIo::new(tls), svc);
    let mut conn = std::pin::pin!(conn);
    // BUS-24 and BUS-25: until a 2xx, the auth deadline; after it, the idle close (30 s after the
    // last answer ended, or `idle_timeout` if shorter; Q-31: whichever comes first).
    let idle_limit = state.lock().bus.idle_timeout.min(IDLE_CLOSE);
    let tick = (idle_limit / 4).max(Duration::from_millis(25));
    let closing = loop {
        let now = tokio::time::Instant::now();
        let authed = info.authed.load(Ordering::Acquire);
        let wake = if authed {
            now + tick
        } else {
            (accepted + AUTH_TIMEOUT).min(now + tick)
        };
        tokio::select! {
            _ = conn.as_mut() => return,
            () = tokio::time::sleep_until(wake) => {}
        }
        let now = tokio::time::Instant::now();
        if !info.authed.load(Ordering::Acquire) {
            if now >= accepted + AUTH_TIMEOUT {
                break Code::AuthTimeout;
            }
        } else if info.idle_since().is_some_and(|t| now >= t + idle_limit) {
            break Code::IdleTimeout;
        }
    };
    // GOAWAY: no new request; one in flight still gets its answer (a session waiting for its
    // hello gets its own 408), then the connection closes.
    state.metrics.refused(closing);
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(crate::session::HELLO_TIMEOUT, conn).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_bytes() {
        assert_eq!(classify(0x16), FirstByte::Tls);
        assert_eq!(classify(b'G'), FirstByte::Ascii);
        assert_eq!(classify(b' '), FirstByte::Ascii);
        assert_eq!(classify(0x00), FirstByte::Other);
        assert_eq!(classify(0x80), FirstByte::Other);
        let r = String::from_utf8(plaintext_refusal()).unwrap();
        assert!(r.starts_with("HTTP/1.1 403 Forbidden\r\n"));
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(body.contains("\"tls_required\""));
    }
}
