//! One data stream (BUS-05): a TCP connection to an advertised publisher, relayed byte for byte
//! on `POST /bus/v1/streams/{id}` (the publisher's bytes in the request body, the router's in the
//! response body) until either end closes.
//!
//! Invariants: bounded: one read of at most [`READ_BYTES`] is in flight from the publisher (sized
//! to the traffic from 4 KiB, allocated only when the socket is readable, so an idle relay holds
//! no buffer) and the request body's channel holds one chunk, so a router that reads slowly holds the publisher
//! back through TCP; the connect is bounded by [`CONNECT_TIMEOUT`]; a relay that ends on its own
//! says why (`stream_closed`), one the router ended says nothing; a publisher's end reaches the
//! router in band (the request's end, after its last byte) before `stream_closed eof` is sent, so
//! no byte is cut off.

use std::time::Duration;

use bytes::BytesMut;
use continuum_event_bus::ids::StreamId;
use continuum_event_bus::message::CloseReason;
use continuum_event_bus::version;
use http::HeaderValue;
use http_body_util::BodyExt as _;
use hyper::client::conn::http2::SendRequest;
use tokio::io::AsyncWriteExt as _;
use tokio::sync::mpsc;

use crate::body::ChanBody;

/// The most one read from the publisher takes.
pub(crate) const READ_BYTES: usize = 64 << 10;
/// The smallest read from the publisher (a quiet stream's).
const MIN_READ_BYTES: usize = 4 << 10;

/// The next read's size after one of `got` bytes into `want`: doubled when the read filled it,
/// halved when it used less than a quarter, within [`MIN_READ_BYTES`]..=[`READ_BYTES`].
fn next_read_size(want: usize, got: usize) -> usize {
    if got >= want {
        (want * 2).min(READ_BYTES)
    } else if got < want / 4 {
        (want / 2).max(MIN_READ_BYTES)
    } else {
        want
    }
}

/// How long a relay whose publisher ended waits for the router to take the last bytes.
pub(crate) const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// How long connecting to a publisher may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Relays `host:port` on stream `id`. `Some(reason)` when the relay ended on its own (the
/// broker reports it), `None` when the router ended the stream.
pub(crate) async fn relay(
    mut send: SendRequest<ChanBody>,
    auth: Option<HeaderValue>,
    id: StreamId,
    host: String,
    port: u16,
) -> Option<CloseReason> {
    let tcp = match tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect((host.as_str(), port)),
    )
    .await
    {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(_)) | Err(_) => return Some(CloseReason::ConnectFailed),
    };
    let _ = tcp.set_nodelay(true);
    let (rd, mut wr) = tcp.into_split();
    let (body_tx, body_rx) = mpsc::channel(1);
    let mut req = http::Request::post(format!("https://router/bus/v1/streams/{id}"))
        .header(version::HEADER, version::CURRENT.to_string());
    if let Some(auth) = auth {
        req = req.header(http::header::AUTHORIZATION, auth);
    }
    let Ok(req) = req.body(ChanBody(body_rx)) else {
        return Some(CloseReason::Error);
    };
    let resp = match send.send_request(req).await {
        Ok(r) if r.status() == http::StatusCode::OK => r,
        // The router refused the stream (unknown or duplicate, BUS-26): it knows why.
        Ok(_) => return None,
        Err(_) => return Some(CloseReason::Error),
    };
    let mut from_router = resp.into_body();
    let upstream = async move {
        // Sized to the traffic, allocated only once there is something to read: an idle relay
        // holds no buffer, a quiet one 4 KiB reads, a busy one up to READ_BYTES.
        let mut want = MIN_READ_BYTES;
        loop {
            if rd.readable().await.is_err() {
                return Some(CloseReason::Error);
            }
            let mut buf = BytesMut::with_capacity(want);
            match rd.try_read_buf(&mut buf) {
                Ok(0) => return Some(CloseReason::Eof),
                Ok(n) => {
                    want = next_read_size(want, n);
                    if body_tx.send(buf.freeze()).await.is_err() {
                        return None;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return Some(CloseReason::Error),
            }
        }
    };
    let downstream = async move {
        while let Some(frame) = from_router.frame().await {
            let Ok(frame) = frame else {
                return None;
            };
            if let Ok(data) = frame.into_data()
                && wr.write_all(&data).await.is_err()
            {
                return Some(CloseReason::Error);
            }
        }
        // The router ended its answer: the stream is over on its side.
        None
    };
    let mut downstream = std::pin::pin!(downstream);
    tokio::select! {
        r = upstream => {
            if r == Some(CloseReason::Eof) {
                // The request's end (in band, after the last byte) tells the router; its answer
                // ends once it has taken every byte. Reporting `stream_closed` before that could
                // overtake the data on the control stream and cut it off.
                let _ = tokio::time::timeout(CLOSE_GRACE, &mut downstream).await;
            }
            r
        }
        r = &mut downstream => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_grow_under_traffic_and_shrink_when_quiet() {
        let mut want = MIN_READ_BYTES;
        for _ in 0..10 {
            want = next_read_size(want, want);
        }
        assert_eq!(want, READ_BYTES, "a full read doubles, up to the cap");
        want = next_read_size(want, READ_BYTES / 2);
        assert_eq!(want, READ_BYTES, "half full keeps the size");
        for _ in 0..10 {
            want = next_read_size(want, 100);
        }
        assert_eq!(
            want, MIN_READ_BYTES,
            "quiet reads shrink it, down to the floor"
        );
    }
}
