//! The broker process: a validated [`BrokerConfig`] turned into a running broker. Discovery runs
//! through the router's own read-only sources (`continuum_control::discovery::Supervisor`: etcd,
//! Dynamo's file store, or `DynamoWorkerMetadata` + EndpointSlices) and every fleet view becomes
//! the advertised set; the session runs until SIGTERM or SIGINT drains it; `/metrics` and
//! `/healthz` are served when `metrics_listen` is set.
//!
//! Invariants: the router's certificate is verified against `router.ca_file` only (no system
//! roots); discovery stays read-only (it is the router's code, checked in CI); a stale view from a
//! replaced watcher is ignored by epoch.

use std::net::SocketAddr;
use std::sync::Arc;

use continuum_control::discovery::{FleetUpdate, Supervisor, plan_for_discovery};
use continuum_shards::metrics::ControlStats;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::sync::{mpsc, watch};

use crate::config::{BrokerConfig, Credential};
use crate::{Advertised, BrokerStats, Dial};

/// Why the broker could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A file the config names could not be read or used.
    #[error("{field}: {path}: {reason}")]
    File {
        /// The config field.
        field: &'static str,
        /// The path.
        path: String,
        /// Why.
        reason: String,
    },
    /// The router's address does not resolve.
    #[error("router.address: {0}: does not resolve")]
    Address(String),
    /// The discovery section cannot run in this build.
    #[error("discovery: cannot run: {0}")]
    Discovery(String),
    /// The metrics listener could not bind.
    #[error("metrics_listen: {0}")]
    Metrics(std::io::Error),
}

fn file_err(field: &'static str, path: &std::path::Path, reason: impl ToString) -> StartError {
    StartError::File {
        field,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

fn pem_certs(
    field: &'static str,
    path: &std::path::Path,
) -> Result<Vec<CertificateDer<'static>>, StartError> {
    use rustls::pki_types::pem::PemObject as _;
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(field, path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(field, path, e))?;
    if certs.is_empty() {
        return Err(file_err(field, path, "no certificate in the file"));
    }
    Ok(certs)
}

/// The broker's TLS client config: TLS 1.3, ALPN `h2`, the router's CA, and the client
/// certificate when that is the credential.
pub fn client_tls(config: &BrokerConfig) -> Result<Arc<rustls::ClientConfig>, StartError> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in pem_certs("router.ca_file", &config.ca_file)? {
        roots
            .add(ca)
            .map_err(|e| file_err("router.ca_file", &config.ca_file, e))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .map_err(|e| file_err("router.ca_file", &config.ca_file, e))?
    .with_root_certificates(roots);
    let mut tls = match &config.credential {
        Credential::Token(_) => builder.with_no_client_auth(),
        Credential::Certificate {
            cert_file,
            key_file,
        } => {
            use rustls::pki_types::pem::PemObject as _;
            let chain = pem_certs("router.client_cert_file", cert_file)?;
            let key = PrivateKeyDer::from_pem_file(key_file)
                .map_err(|e| file_err("router.client_key_file", key_file, e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| file_err("router.client_key_file", key_file, e))?
        }
    };
    tls.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(tls))
}

/// The dial details for `config` (resolving the router's address once; a broker in a cluster
/// reaches a stable name, and a restart re-resolves).
pub fn dial(config: &BrokerConfig) -> Result<Dial, StartError> {
    use std::net::ToSocketAddrs as _;
    let addr: SocketAddr = config
        .address
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| StartError::Address(config.address.clone()))?;
    let server_name =
        ServerName::try_from(config.server_name.clone()).map_err(|e| StartError::File {
            field: "router.server_name",
            path: config.server_name.clone(),
            reason: e.to_string(),
        })?;
    Ok(Dial {
        addr,
        server_name,
        tls: client_tls(config)?,
        token: match &config.credential {
            Credential::Token(t) => Some(t.clone()),
            Credential::Certificate { .. } => None,
        },
        client_id: config.id.clone(),
        namespaces: config.namespaces.clone(),
    })
}

/// Starts discovery; every view of the current watcher replaces the advertised set.
pub fn discover(
    config: &BrokerConfig,
    stats: Arc<BrokerStats>,
) -> Result<watch::Receiver<Arc<Advertised>>, StartError> {
    let plan = plan_for_discovery(&config.discovery)
        .map_err(|e| StartError::Discovery(format!("{e:?}")))?;
    let (updates_tx, mut updates) = mpsc::unbounded_channel::<FleetUpdate>();
    let mut supervisor = Supervisor::new(updates_tx, Arc::new(ControlStats::default()));
    let _ = supervisor.reconcile(Some(plan), true);
    let (tx, rx) = watch::channel(Arc::new(Advertised::default()));
    let namespaces = config.namespaces.clone();
    tokio::spawn(async move {
        // The supervisor lives as long as this task: dropping it stops the watcher.
        let supervisor = supervisor;
        while let Some(update) = updates.recv().await {
            if Some(update.epoch) != supervisor.epoch() {
                continue;
            }
            let set = Advertised::from_fleet(&update.fleet, &namespaces);
            stats.advertised(set.len());
            tracing::debug!(publishers = set.len(), "advertised publishers");
            if tx.send(Arc::new(set)).is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

/// A drain signal that turns true on SIGTERM or SIGINT.
pub fn drain_on_signals() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers; the broker cannot drain");
            std::future::pending::<()>().await;
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("draining: the router moves this broker's streams, then it exits");
        let _ = tx.send(true);
        // Keep the sender: a dropped sender also means drain, but say it once.
        std::future::pending::<()>().await;
    });
    rx
}

/// Serves `/metrics` and `/healthz` on `addr`.
pub async fn serve_metrics(addr: SocketAddr, stats: Arc<BrokerStats>) -> Result<(), StartError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(StartError::Metrics)?;
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let stats = stats.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: http::Request<_>| {
                    let stats = stats.clone();
                    async move { Ok::<_, std::convert::Infallible>(crate::stats::answer(&req, &stats)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    Ok(())
}
