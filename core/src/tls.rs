//! Upstream TLS contexts: what a shard needs to open an `https://` backend connection.
//!
//! The control thread reads each `https://` backend's trust anchors (its `tls.ca_cert` file or
//! the system roots) when it loads a config, builds one rustls client config per distinct
//! (anchors, server name) and publishes them in the router snapshot next to the backend
//! addresses (its `backend_tls` table, which names this module's types; this module names no
//! other). Nothing here reads files or sockets.
//!
//! Invariants:
//! - a context exists for a backend exactly when its URL is `https://` and its anchors loaded;
//!   an `https://` backend without one is never routed (like a backend that did not resolve);
//! - [`TlsId`] names the trust a connection was verified under: equal ids mean the same anchor
//!   certificates and server name, so a pooled connection is only reused under the trust it
//!   was opened with (a rotated CA file opens fresh connections).

use std::sync::Arc;

use rustls::pki_types::ServerName;

/// Identity of an upstream TLS context: a digest of its anchors and server name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TlsId(pub u64);

/// One backend's TLS client context.
#[derive(Debug, Clone)]
pub struct UpstreamTls {
    /// The rustls client config (ring provider, ALPN `http/1.1`, the backend's anchors).
    pub config: Arc<rustls::ClientConfig>,
    /// The name the certificate must be valid for, also sent as SNI (for a DNS name).
    pub server_name: ServerName<'static>,
    /// What connections opened under this context are pooled by.
    pub id: TlsId,
}

/// Every backend's TLS context, indexed like `config.backends` (`None` for `http://`).
pub type BackendTlsTable = Arc<[Option<UpstreamTls>]>;
