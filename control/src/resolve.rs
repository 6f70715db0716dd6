//! Resolving backend host names to socket addresses, off the data plane.
//!
//! Shards never resolve: a host name is looked up here, once per publication, and the first
//! address is placed in the snapshot. A backend that does not resolve is logged and left out of
//! routing until a later reload resolves it.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use continuum_core::config::Config;

/// Resolve every backend of `config` (blocking; call from the control thread's blocking pool or
/// at startup).
pub fn resolve_blocking(config: &Config) -> Vec<Option<SocketAddr>> {
    config
        .backends
        .iter()
        .map(|b| {
            if let Ok(ip) = b.url.host.parse::<IpAddr>() {
                return Some(SocketAddr::new(ip, b.url.port));
            }
            match (b.url.host.as_str(), b.url.port).to_socket_addrs() {
                Ok(mut addrs) => {
                    let first = addrs.next();
                    if first.is_none() {
                        tracing::warn!(backend = %b.name, host = %b.url.host, "backend host resolved to no address");
                    }
                    first
                }
                Err(e) => {
                    tracing::warn!(backend = %b.name, host = %b.url.host, error = %e, "backend host does not resolve");
                    None
                }
            }
        })
        .collect()
}
