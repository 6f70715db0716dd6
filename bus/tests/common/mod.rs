//! The bus tests' harness: a generated CA and server certificate, a listener on loopback, and a
//! real HTTP/2 client (hyper over rustls) that can keep a request body open.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use continuum_bus::{BusMetrics, Listener, Settings, ZmqTarget};
use continuum_core::config::TokenHash;
use continuum_core::config::dynamo::{BrokerConfig, BrokerRole, EventBusConfig};
use http_body_util::BodyExt as _;
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName};
use sha2::Digest as _;
use tokio::sync::mpsc;

pub const TOKEN_A: &str = "token-of-broker-a";

/// A CA and a server certificate for `localhost` and 127.0.0.1, and a client CA that signs
/// brokers' certificates.
pub struct Pki {
    pub ca_der: CertificateDer<'static>,
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub client_ca: Ca,
}

/// A CA that can sign certificates.
pub struct Ca {
    pub cert: rcgen::Certificate,
    pub key: rcgen::KeyPair,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Self { cert, key }
    }

    /// A client certificate with DNS SAN `san`: its chain and key.
    pub fn client(&self, san: &str) -> ClientCert {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![san.to_owned()]).unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let key_der = rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der());
        (vec![cert.der().clone()], key_der.into())
    }
}

/// A client certificate chain and its key.
pub type ClientCert = (
    Vec<CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
);

pub fn pki() -> Pki {
    use rcgen::{CertificateParams, KeyPair, SanType};
    let Ca {
        cert: ca,
        key: ca_key,
    } = Ca::new("continuum bus test CA");
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .subject_alt_names
        .push(SanType::IpAddress(std::net::IpAddr::from([127, 0, 0, 1])));
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    Pki {
        ca_der: ca.der().clone(),
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        client_ca: Ca::new("continuum bus test client CA"),
    }
}

pub fn broker(id: &str, token: &str, namespaces: &[&str]) -> BrokerConfig {
    BrokerConfig {
        id: id.into(),
        role: BrokerRole::Broker,
        token_hash: Some(TokenHash(sha2::Sha256::digest(token.as_bytes()).into())),
        namespaces: namespaces.iter().map(|n| (*n).to_owned()).collect(),
        backends: vec![],
    }
}

/// The default test bus: broker `broker-a.dynamo` (namespace `dynamo`), `TOKEN_A`.
pub fn bus() -> EventBusConfig {
    EventBusConfig {
        enabled: true,
        brokers: vec![broker("broker-a.dynamo", TOKEN_A, &["dynamo"])],
        ..EventBusConfig::default()
    }
}

pub struct Bus {
    pub pki: Pki,
    pub listener: Listener,
    pub metrics: Arc<BusMetrics>,
}

impl Bus {
    pub fn addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }
}

pub fn start(bus: EventBusConfig) -> Bus {
    start_with(bus, false)
}

/// A listener; with `client_ca`, it verifies client certificates against the test client CA.
pub fn start_with(bus: EventBusConfig, client_ca: bool) -> Bus {
    start_opts(bus, client_ca, None)
}

/// A listener with every option.
pub fn start_opts(bus: EventBusConfig, client_ca: bool, open_timeout: Option<Duration>) -> Bus {
    let pki = pki();
    let ca_pem = client_ca.then(|| pki.client_ca.cert.pem());
    let tls = continuum_bus::tls::server_config(
        pki.cert_pem.as_bytes(),
        pki.key_pem.as_bytes(),
        ca_pem.as_deref().map(str::as_bytes),
    )
    .unwrap();
    let metrics = Arc::new(BusMetrics::default());
    let mut n = 0u128;
    let listener = continuum_bus::spawn(
        Settings {
            listen: "127.0.0.1:0".parse().unwrap(),
            tls,
            bus,
            ids: Some(Box::new(move || {
                n += 1;
                n
            })),
            open_timeout,
        },
        metrics.clone(),
    )
    .unwrap();
    Bus {
        pki,
        listener,
        metrics,
    }
}

/// A client TLS config trusting the test CA, ALPN `h2`, presenting `cert`.
pub fn client_tls_cert(pki: &Pki, cert: ClientCert) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca_der.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut c = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(cert.0, cert.1)
        .unwrap();
    c.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(c)
}

/// A client TLS config trusting the test CA, TLS 1.3, with `alpn`.
pub fn client_tls(pki: &Pki, alpn: &[&[u8]], tls12_only: bool) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca_der.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = if tls12_only {
        &[&rustls::version::TLS12]
    } else {
        &[&rustls::version::TLS13]
    };
    let mut c = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    c.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    Arc::new(c)
}

pub async fn tls_connect(
    bus: &Bus,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(bus.addr()).await?;
    // As a broker would: small control lines must not wait for delayed ACKs.
    tcp.set_nodelay(true)?;
    tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// A request body the test keeps open and writes lines into.
pub struct ChanBody(pub mpsc::Receiver<Bytes>);

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

/// An HTTP/2 connection to the listener.
pub async fn h2(bus: &Bus) -> hyper::client::conn::http2::SendRequest<ChanBody> {
    h2_with(bus, client_tls(&bus.pki, &[b"h2"], false)).await
}

/// An HTTP/2 connection to the listener with the client TLS config `tls`.
pub async fn h2_with(
    bus: &Bus,
    tls: Arc<rustls::ClientConfig>,
) -> hyper::client::conn::http2::SendRequest<ChanBody> {
    let tls = tls_connect(bus, tls).await.unwrap();
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    send
}

/// A session request: its response and the sender of further body lines.
pub async fn session(
    send: &mut hyper::client::conn::http2::SendRequest<ChanBody>,
    token: Option<&str>,
    version: Option<&str>,
    first_line: &str,
) -> (http::Response<Incoming>, mpsc::Sender<Bytes>) {
    let (tx, rx) = mpsc::channel(16);
    let mut req = http::Request::post("https://localhost/bus/v1/session");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    if let Some(v) = version {
        req = req.header("continuum-bus-version", v);
    }
    if !first_line.is_empty() {
        tx.send(Bytes::from(format!("{first_line}\n")))
            .await
            .unwrap();
    }
    let resp = send
        .send_request(req.body(ChanBody(rx)).unwrap())
        .await
        .unwrap();
    (resp, tx)
}

pub fn hello(id: &str, namespaces: &[&str]) -> String {
    serde_json::json!({
        "type": "hello", "role": "broker", "client_id": id, "versions": [1],
        "dynamo_namespaces": namespaces,
    })
    .to_string()
}

/// Reads a response body line by line.
pub struct Lines {
    body: Incoming,
    buf: Vec<u8>,
}

impl Lines {
    pub fn new(body: Incoming) -> Self {
        Self {
            body,
            buf: Vec::new(),
        }
    }

    /// The next line as JSON, within 5 s; `None` when the body ended.
    pub async fn next(&mut self) -> Option<serde_json::Value> {
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = self.buf.drain(..=i).collect();
                    return Some(serde_json::from_slice(&line[..i]).unwrap());
                }
                match self.body.frame().await {
                    Some(Ok(f)) => {
                        if let Ok(d) = f.into_data() {
                            self.buf.extend_from_slice(&d);
                        }
                    }
                    _ => return None,
                }
            }
        })
        .await
        .expect("a line within 5 s")
    }
}

/// A whole (refusal) body as JSON.
pub async fn json(resp: http::Response<Incoming>) -> serde_json::Value {
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

/// Wait until `f` holds (bounded; the listener counts on its own thread).
pub async fn eventually(mut f: impl FnMut() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition never held");
}

/// A broker session: its lines, its sender of lines, and its HTTP/2 connection.
pub async fn broker_session(
    bus: &Bus,
) -> (
    Lines,
    mpsc::Sender<Bytes>,
    hyper::client::conn::http2::SendRequest<ChanBody>,
) {
    let mut send = h2(bus).await;
    let (resp, tx) = session(
        &mut send,
        Some(TOKEN_A),
        Some("1"),
        &hello("broker-a.dynamo", &["dynamo"]),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut lines = Lines::new(resp.into_body());
    assert_eq!(lines.next().await.unwrap()["type"], "welcome");
    (lines, tx, send)
}

/// The router commands a stream to `host`: the pending stream and the id its `subscribe` names.
pub async fn command(
    api: &continuum_bus::EventBus,
    lines: &mut Lines,
    host: &str,
    topic: continuum_event_bus::message::Topic,
) -> (continuum_bus::OpenStream, String) {
    let open = api.open_stream(&target(host), topic).unwrap();
    let id = lines.next().await.unwrap()["stream_id"]
        .as_str()
        .unwrap()
        .to_owned();
    (open, id)
}

/// A publisher target in namespace `dynamo`.
pub fn target(host: &str) -> ZmqTarget {
    ZmqTarget {
        namespace: "dynamo".into(),
        host: host.into(),
        port: 5557,
    }
}

/// The broker opens stream `id`: the response, and the sender of its body.
pub async fn open_data(
    send: &mut hyper::client::conn::http2::SendRequest<ChanBody>,
    id: &str,
    token: &str,
    version: &str,
) -> (http::Response<hyper::body::Incoming>, mpsc::Sender<Bytes>) {
    let (tx, rx) = mpsc::channel(4);
    let req = http::Request::post(format!("https://localhost/bus/v1/streams/{id}"))
        .header("authorization", format!("Bearer {token}"))
        .header("continuum-bus-version", version)
        .body(ChanBody(rx))
        .unwrap();
    (send.send_request(req).await.unwrap(), tx)
}

pub async fn next_data(body: &mut hyper::body::Incoming) -> Option<Bytes> {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match body.frame().await {
                Some(Ok(f)) => {
                    // An empty DATA frame may carry the end of the stream.
                    if let Ok(d) = f.into_data()
                        && !d.is_empty()
                    {
                        return Some(d);
                    }
                }
                _ => return None,
            }
        }
    })
    .await
    .expect("data or the end within 5 s")
}
