//! `bus-relay`'s broker: the part of an in-cluster broker the bench needs, speaking the wire
//! contract through `continuum-event-bus`. It dials the listener over TLS 1.3 + HTTP/2 with a
//! token, says hello for one namespace, answers heartbeats, and for every `subscribe` connects to
//! the target over TCP and relays bytes both ways on `POST /bus/v1/streams/{id}` (BUS-05) until
//! `unsubscribe` or either end closes. A stand-in until the real broker (issue 35) exists.
//!
//! Invariants: runs on the caller's tokio current-thread runtime (so every allocation of the
//! broker side is on that one thread, which the memory figures rely on); every relay holds at
//! most one read buffer of [`RELAY_READ`] bytes and a body pipe of [`PIPE`] chunks per direction;
//! a session ends when its `stop` future resolves or the listener ends it.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use continuum_event_bus::codec::{LineReader, MAX_LINE_BYTES, decode_router, encode};
use continuum_event_bus::ids::StreamId;
use continuum_event_bus::message::{ClientMessage, Hello, Role, RouterMessage, Target};
use continuum_event_bus::version;
use http_body_util::BodyExt as _;
use hyper::body::Frame;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;

/// Bytes one relay read takes from the publisher's socket.
pub(super) const RELAY_READ: usize = 64 << 10;
/// Chunks a request body pipe holds.
const PIPE: usize = 2;

/// Why the broker stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BrokerError {
    /// A socket or TLS operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// HTTP/2 failed.
    #[error("HTTP/2: {0}")]
    Http(#[from] hyper::Error),
    /// The listener refused the session, or broke the contract.
    #[error("session: {0}")]
    Session(String),
}

/// A request body fed through a bounded channel.
struct ChanBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChanBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.get_mut()
            .0
            .poll_recv(cx)
            .map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

/// Who the broker is and where it dials.
#[derive(Clone)]
pub(super) struct Dial {
    /// The listener.
    pub(super) addr: SocketAddr,
    /// TLS 1.3, ALPN `h2`, trusting the listener's CA.
    pub(super) tls: Arc<rustls::ClientConfig>,
    /// The bearer token of its `brokers[]` entry.
    pub(super) token: String,
    /// Its entry's id.
    pub(super) client_id: String,
    /// The namespace it declares.
    pub(super) namespace: String,
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> BrokerError {
    move |source| BrokerError::Io { what, source }
}

/// Runs one session until `stop` resolves (`Ok`) or the session ends (`Err`). `welcomed` is
/// called once the listener accepted the hello.
pub(super) async fn session(
    dial: Dial,
    stop: impl Future<Output = ()>,
    welcomed: impl FnOnce(),
) -> Result<(), BrokerError> {
    let tcp = tokio::net::TcpStream::connect(dial.addr)
        .await
        .map_err(io("connecting to the listener"))?;
    tcp.set_nodelay(true).map_err(io("nodelay"))?;
    let name =
        ServerName::try_from("localhost").map_err(|e| BrokerError::Session(e.to_string()))?;
    let tls = tokio_rustls::TlsConnector::from(dial.tls.clone())
        .connect(name, tcp)
        .await
        .map_err(io("TLS handshake"))?;
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await?;
    tokio::spawn(conn);

    let (lines_tx, lines_rx) = mpsc::channel(16);
    let hello = ClientMessage::Hello(Hello {
        role: Role::Broker,
        client_id: dial.client_id.clone(),
        versions: vec![version::CURRENT],
        dynamo_namespaces: vec![dial.namespace.clone()],
        sources: vec![],
    });
    let _ = lines_tx.send(line(&hello)).await;
    let req = http::Request::post("https://localhost/bus/v1/session")
        .header("authorization", format!("Bearer {}", dial.token))
        .header(version::HEADER, version::CURRENT.to_string())
        .body(ChanBody(lines_rx))
        .map_err(|e| BrokerError::Session(e.to_string()))?;
    let resp = send.send_request(req).await?;
    if resp.status() != 200 {
        return Err(BrokerError::Session(format!(
            "the listener answered {}",
            resp.status()
        )));
    }
    let mut welcomed = Some(welcomed);
    let mut relays: Vec<(StreamId, tokio::task::JoinHandle<()>)> = Vec::new();
    let mut reader = LineReader::new(MAX_LINE_BYTES);
    let mut body = resp.into_body();
    let commands = async {
        loop {
            let Some(frame) = body.frame().await else {
                return Err(BrokerError::Session(
                    "the listener ended the session".into(),
                ));
            };
            let Ok(data) = frame?.into_data() else {
                continue;
            };
            let mut msgs = Vec::new();
            reader
                .feed(&data, |l| msgs.push(decode_router(l)))
                .map_err(|e| BrokerError::Session(e.to_string()))?;
            for msg in msgs {
                match msg.map_err(|e| BrokerError::Session(e.to_string()))? {
                    RouterMessage::Welcome(_) => {
                        if let Some(f) = welcomed.take() {
                            f();
                        }
                    }
                    RouterMessage::Heartbeat { seq } => {
                        let _ = lines_tx
                            .send(line(&ClientMessage::HeartbeatAck { seq }))
                            .await;
                    }
                    RouterMessage::HeartbeatAck { .. } => {}
                    RouterMessage::Subscribe {
                        stream_id,
                        target: Target::Zmq { host, port, .. },
                    } => {
                        let relay = relay(send.clone(), dial.token.clone(), stream_id, host, port);
                        relays.push((stream_id, tokio::spawn(relay)));
                    }
                    RouterMessage::Subscribe { .. } => {
                        return Err(BrokerError::Session("an announced stream".into()));
                    }
                    RouterMessage::Unsubscribe { stream_id } => {
                        relays.retain(|(id, task)| {
                            if *id == stream_id {
                                task.abort();
                            }
                            *id != stream_id
                        });
                    }
                }
            }
        }
    };
    let end = tokio::select! {
        r = commands => r,
        () = stop => Ok(()),
    };
    for (_, task) in relays {
        task.abort();
    }
    end
}

fn line(m: &ClientMessage) -> Bytes {
    let mut out = Vec::new();
    encode(m, &mut out);
    Bytes::from(out)
}

/// Relays `host:port` on data stream `id` until either end closes.
async fn relay(
    mut send: SendRequest<ChanBody>,
    token: String,
    id: StreamId,
    host: String,
    port: u16,
) {
    let Ok(tcp) = tokio::net::TcpStream::connect((host.as_str(), port)).await else {
        return;
    };
    let _ = tcp.set_nodelay(true);
    let (mut rd, mut wr) = tcp.into_split();
    let (body_tx, body_rx) = mpsc::channel(PIPE);
    let Ok(req) = http::Request::post(format!("https://localhost/bus/v1/streams/{id}"))
        .header("authorization", format!("Bearer {token}"))
        .header(version::HEADER, version::CURRENT.to_string())
        .body(ChanBody(body_rx))
    else {
        return;
    };
    let Ok(resp) = send.send_request(req).await else {
        return;
    };
    if resp.status() != 200 {
        return;
    }
    let mut from_router = resp.into_body();
    let upstream = async move {
        let mut buf = vec![0u8; RELAY_READ];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if body_tx
                        .send(Bytes::copy_from_slice(buf.get(..n).unwrap_or(&[])))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    };
    let downstream = async move {
        while let Some(Ok(frame)) = from_router.frame().await {
            if let Ok(data) = frame.into_data()
                && wr.write_all(&data).await.is_err()
            {
                return;
            }
        }
    };
    tokio::join!(upstream, downstream);
}
