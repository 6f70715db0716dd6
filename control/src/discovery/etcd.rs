//! The etcd watch source (feature `dynamo`): read-only by construction.
//!
//! The only RPCs issued are `Authenticate` (inside `Client::connect` when `auth` is set), `Range`
//! and `Watch` (DISC-RO-01..04, DISC-RO-07: this file contains no write, delete or lease call,
//! and CI greps for them). Seeding pins every range-get to the revision the first one returned,
//! so the three prefixes of every namespace form one consistent snapshot, and each watch
//! starts at that revision + 1, so nothing is lost or applied twice between the two
//! (DISC-ETCD-02). All watches share one gRPC watch stream.

use std::time::Duration;

use continuum_core::config::dynamo::{EtcdConfig, EtcdScheme};
use etcd_client::{
    Certificate, Client, ConnectOptions, EventType, GetOptions, Identity, TlsOptions, WatchOptions,
    WatchStream,
};

use super::session::{Change, SessionEnd, WatchSource};

/// Keys per range page: small enough that a page of records at etcd's default 1.5 MiB request
/// limit stays far below the decoding limit.
const PAGE: i64 = 64;
/// Largest gRPC message accepted from etcd (a page of [`PAGE`] maximal records, plus headroom).
const MAX_MESSAGE: usize = 128 * 1024 * 1024;

/// The four prefixes of one Dynamo namespace (DISC-REC-01, plus 1.6.1's `v1/event_sources/`,
/// which maps a kv-events publisher to its `(worker, dp_rank)`). Event-channel and event-source
/// key segments are `%XX`-encoded (LOAD-CHAN-03); namespaces need no encoding elsewhere.
pub fn prefixes(namespace: &str) -> [String; 4] {
    continuum_core::discovery::keys::namespace_prefixes(namespace)
}

/// The exclusive end of the key range holding every key that starts with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A read-only etcd session.
pub struct EtcdSource {
    cfg: EtcdConfig,
    client: Option<Client>,
    revision: i64,
    stream: Option<WatchStream>,
}

impl std::fmt::Debug for EtcdSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdSource")
            .field("revision", &self.revision)
            .finish_non_exhaustive()
    }
}

impl EtcdSource {
    /// A source for the given connection settings and namespaces (not connected yet).
    pub fn new(cfg: EtcdConfig) -> Self {
        Self {
            cfg,
            client: None,
            revision: 0,
            stream: None,
        }
    }

    async fn connect(&self) -> Result<Client, SessionEnd> {
        let endpoints: Vec<String> = self.cfg.endpoints.iter().map(ToString::to_string).collect();
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(10))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(10));
        if let Some(auth) = &self.cfg.auth {
            opts = opts.with_user(auth.username.clone(), auth.password.expose().to_owned());
        }
        let https = self
            .cfg
            .endpoints
            .first()
            .is_some_and(|e| e.scheme == EtcdScheme::Https);
        if https || self.cfg.tls.is_some() {
            let mut tls = TlsOptions::new();
            if let Some(t) = &self.cfg.tls {
                if let Some(ca) = &t.ca_cert {
                    let pem = read_pem(ca).await?;
                    tls = tls.ca_certificate(Certificate::from_pem(pem));
                }
                if let (Some(cert), Some(key)) = (&t.client_cert, &t.client_key) {
                    let cert = read_pem(cert).await?;
                    let key = read_pem(key.expose()).await?;
                    tls = tls.identity(Identity::from_pem(cert, key));
                }
                if let Some(name) = &t.server_name {
                    tls = tls.domain_name(name.clone());
                }
            }
            opts = opts.with_tls(tls);
        }
        Client::connect(endpoints, Some(opts))
            .await
            .map_err(|e| SessionEnd::SeedFailed(format!("connect: {e}")))
    }
}

async fn read_pem(path: &str) -> Result<Vec<u8>, SessionEnd> {
    tokio::fs::read(path)
        .await
        .map_err(|e| SessionEnd::SeedFailed(format!("cannot read {path}: {e}")))
}

impl WatchSource for EtcdSource {
    async fn seed(&mut self) -> Result<Vec<Change>, SessionEnd> {
        let client = self.connect().await?;
        let mut kv = client.kv_client().max_decoding_message_size(MAX_MESSAGE);
        let mut out = Vec::new();
        let mut revision = 0i64;
        for ns in &self.cfg.namespaces {
            for prefix in prefixes(ns) {
                let end = prefix_end(prefix.as_bytes());
                let mut from = prefix.clone().into_bytes();
                loop {
                    let mut opts = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
                    if revision > 0 {
                        opts = opts.with_revision(revision);
                    }
                    let resp = kv
                        .get(from.clone(), Some(opts))
                        .await
                        .map_err(|e| SessionEnd::SeedFailed(format!("range {prefix}: {e}")))?;
                    if revision == 0 {
                        revision = resp.header().map_or(0, |h| h.revision());
                    }
                    let kvs = resp.kvs();
                    for kv in kvs {
                        out.push(Change::Put(kv.key().to_vec(), kv.value().to_vec()));
                    }
                    match kvs.last() {
                        Some(last) if resp.more() => {
                            from = last.key().to_vec();
                            from.push(0);
                        }
                        _ => break,
                    }
                }
            }
        }
        self.revision = revision;
        self.client = Some(client);
        Ok(out)
    }

    async fn open_watches(&mut self) -> Result<(), SessionEnd> {
        let Some(client) = &self.client else {
            return Err(SessionEnd::SeedFailed("not connected".into()));
        };
        let mut watch = client.watch_client().max_decoding_message_size(MAX_MESSAGE);
        let opts = || {
            WatchOptions::new()
                .with_prefix()
                .with_start_revision(self.revision + 1)
        };
        let all: Vec<String> = self
            .cfg
            .namespaces
            .iter()
            .flat_map(|ns| prefixes(ns))
            .collect();
        let mut stream: Option<WatchStream> = None;
        for prefix in &all {
            match stream.as_mut() {
                None => {
                    let s = watch
                        .watch(prefix.clone(), Some(opts()))
                        .await
                        .map_err(|e| SessionEnd::SeedFailed(format!("watch {prefix}: {e}")))?;
                    stream = Some(s);
                }
                Some(s) => s
                    .watch(prefix.clone(), Some(opts()))
                    .await
                    .map_err(|e| SessionEnd::SeedFailed(format!("watch {prefix}: {e}")))?,
            }
        }
        let Some(mut s) = stream else {
            return Err(SessionEnd::SeedFailed("no namespace to watch".into()));
        };
        // Wait until the server confirmed every watch (the backoff reset is measured from here).
        let mut created = 0usize;
        while created < all.len() {
            match s.message().await {
                Ok(Some(resp)) if resp.canceled() => return Err(cancel_reason(&resp)),
                Ok(Some(resp)) if resp.created() => created += 1,
                Ok(Some(_)) => {}
                Ok(None) => return Err(SessionEnd::Disconnected("watch stream closed".into())),
                Err(e) => return Err(SessionEnd::Disconnected(e.to_string())),
            }
        }
        self.stream = Some(s);
        Ok(())
    }

    async fn next(&mut self) -> Result<Vec<Change>, SessionEnd> {
        let Some(s) = self.stream.as_mut() else {
            return Err(SessionEnd::Disconnected("no watch stream".into()));
        };
        loop {
            let resp = match s.message().await {
                Ok(Some(resp)) => resp,
                Ok(None) => return Err(SessionEnd::Disconnected("watch stream closed".into())),
                Err(e) => return Err(SessionEnd::Disconnected(e.to_string())),
            };
            if resp.canceled() {
                return Err(cancel_reason(&resp));
            }
            let batch: Vec<Change> = resp
                .events()
                .iter()
                .filter_map(|ev| {
                    let kv = ev.kv()?;
                    Some(match ev.event_type() {
                        EventType::Put => Change::Put(kv.key().to_vec(), kv.value().to_vec()),
                        EventType::Delete => Change::Delete(kv.key().to_vec()),
                    })
                })
                .collect();
            if !batch.is_empty() {
                return Ok(batch);
            }
        }
    }
}

fn cancel_reason(resp: &etcd_client::WatchResponse) -> SessionEnd {
    if resp.compact_revision() > 0 {
        SessionEnd::Compacted
    } else {
        SessionEnd::Cancelled(resp.cancel_reason().to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end(b"v1/mdc/ns/"), b"v1/mdc/ns0".to_vec());
        assert_eq!(prefix_end(&[b'a', 0xff]), b"b".to_vec());
        assert_eq!(prefix_end(&[0xff]), vec![0]);
    }

    #[test]
    fn four_prefixes_per_namespace() {
        assert_eq!(
            prefixes("dynamo"),
            [
                "v1/instances/dynamo/",
                "v1/mdc/dynamo/",
                "v1/event_channels/namespace/dynamo/",
                "v1/event_sources/namespace/dynamo/"
            ]
        );
        assert_eq!(
            prefixes("a.b")[3],
            "v1/event_sources/namespace/a%2Eb/",
            "the namespace segment is encoded as in the channel keys"
        );
    }
}
