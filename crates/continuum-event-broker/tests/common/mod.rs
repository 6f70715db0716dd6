//! The broker tests' harness: the router's own event bus listener on loopback with a generated
//! CA, and the broker's dial details for it.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use continuum_bus::{BusMetrics, Listener, Settings};
use continuum_core::config::TokenHash;
use continuum_core::config::dynamo::{BrokerConfig, BrokerRole, EventBusConfig};
use continuum_event_broker::Dial;
use rustls::pki_types::ServerName;
use sha2::Digest as _;

pub const TOKEN: &str = "broker-token-a";
pub const ID: &str = "broker-a.dynamo";

pub struct Router {
    pub listener: Listener,
    pub ca: rustls::pki_types::CertificateDer<'static>,
    pub ca_pem: String,
    pub tls: Arc<rustls::ServerConfig>,
}

pub fn bus_config() -> EventBusConfig {
    EventBusConfig {
        enabled: true,
        brokers: vec![BrokerConfig {
            id: ID.into(),
            role: BrokerRole::Broker,
            token_hash: Some(TokenHash(sha2::Sha256::digest(TOKEN.as_bytes()).into())),
            namespaces: vec!["dynamo".into()],
            backends: vec![],
        }],
        heartbeat_interval: Duration::from_millis(200),
        ..EventBusConfig::default()
    }
}

/// A CA and a server certificate for `router.test` signed by it.
pub struct Pki {
    pub ca: rustls::pki_types::CertificateDer<'static>,
    pub ca_pem: String,
    pub tls: Arc<rustls::ServerConfig>,
}

pub fn pki() -> Pki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["router.test".to_owned()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let tls = continuum_bus::tls::server_config(
        cert.pem().as_bytes(),
        key.serialize_pem().as_bytes(),
        None,
    )
    .unwrap();
    Pki {
        ca: ca.der().clone(),
        ca_pem: ca.pem(),
        tls,
    }
}

pub fn router() -> Router {
    let Pki { ca, ca_pem, tls } = pki();
    let listener = listen(tls.clone(), "127.0.0.1:0".parse().unwrap());
    Router {
        listener,
        ca,
        ca_pem,
        tls,
    }
}

/// The broker's dial details for a router at `addr` whose certificate `ca` signed.
pub fn dial(
    addr: std::net::SocketAddr,
    ca: &rustls::pki_types::CertificateDer<'static>,
    token: &str,
) -> Dial {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    Dial {
        addr,
        server_name: ServerName::try_from("router.test").unwrap(),
        tls: Arc::new(tls),
        token: Some(token.to_owned()),
        client_id: ID.into(),
        namespaces: vec!["dynamo".into()],
    }
}

pub fn listen(tls: Arc<rustls::ServerConfig>, at: std::net::SocketAddr) -> Listener {
    continuum_bus::spawn(
        Settings {
            listen: at,
            tls,
            bus: bus_config(),
            ids: None,
            open_timeout: Some(Duration::from_secs(5)),
        },
        Arc::new(BusMetrics::default()),
    )
    .unwrap()
}

impl Router {
    pub fn dial(&self, token: &str) -> Dial {
        dial(self.listener.local_addr(), &self.ca, token)
    }
}

/// Waits until `f` holds (bounded).
pub async fn eventually(mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition never held");
}
