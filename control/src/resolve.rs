//! Resolving backend and publisher host names to socket addresses, off the data plane.
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

/// How long resolving one publisher host may take (LOAD-ZMTP-18: `CONNECT_TIMEOUT`).
pub(crate) const PUBLISHER_RESOLVE_TIMEOUT: std::time::Duration =
    std::time::Duration::from_secs(10);

/// Resolve the admitted publishers of every family once and check each against the connect
/// policy (CFG-20). Results for publishers already in `previous` (same id, so same incarnation
/// and endpoint) are reused; publishers that left are dropped. IP literals need no lookup; host
/// names are looked up on the blocking pool, each bounded by [`PUBLISHER_RESOLVE_TIMEOUT`].
pub(crate) async fn resolve_publishers(
    fleet: &continuum_core::discovery::FleetView,
    policy: &continuum_core::subscriptions::ConnectPolicy,
    previous: &continuum_core::snapshot::PublisherAddrs,
) -> continuum_core::snapshot::PublisherAddrs {
    use continuum_core::discovery::Family;
    use continuum_core::subscriptions::admitted;
    let mut out = continuum_core::snapshot::PublisherAddrs::new();
    for family in [Family::KvMetrics, Family::KvEvents] {
        for p in admitted(fleet, family) {
            if let Some(known) = previous.get(&p.publisher_id) {
                out.insert(p.publisher_id, known.clone());
                continue;
            }
            let resolved: Vec<SocketAddr> = match p.tcp.host.parse::<IpAddr>() {
                Ok(ip) => vec![SocketAddr::new(ip, p.tcp.port)],
                Err(_) => {
                    let target = (p.tcp.host.clone(), p.tcp.port);
                    let lookup = tokio::task::spawn_blocking(move || {
                        target.to_socket_addrs().map(Iterator::collect::<Vec<_>>)
                    });
                    match tokio::time::timeout(PUBLISHER_RESOLVE_TIMEOUT, lookup).await {
                        Ok(Ok(Ok(addrs))) => addrs,
                        _ => Vec::new(),
                    }
                }
            };
            let decision = policy.choose(&resolved);
            if let Err(why) = &decision {
                tracing::warn!(publisher = %p.publisher_id, namespace = %p.namespace, reason = %why, "publisher not subscribed");
            }
            out.insert(p.publisher_id, decision);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use continuum_core::discovery::{Family, FleetView, Publisher, PublisherId, TcpTarget};
    use continuum_core::subscriptions::{ConnectPolicy, Refusal};

    use super::*;

    fn publisher(id: u64, host: &str) -> Publisher {
        Publisher {
            family: Family::KvMetrics,
            publisher_id: PublisherId::new(id),
            namespace: "ns".into(),
            component: None,
            endpoint: None,
            tcp: TcpTarget {
                host: host.into(),
                port: 5557,
            },
            source: None,
        }
    }

    #[test]
    fn publishers_are_resolved_once_and_checked_against_the_policy() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let fleet = FleetView {
            workers: Vec::new(),
            publishers: vec![
                publisher(1, "10.1.2.3"),
                publisher(2, "203.0.113.9"),
                publisher(3, "localhost"),
                publisher(4, "no-such-host.invalid"),
            ],
        };
        let policy = ConnectPolicy::new(Some(vec![
            "10.0.0.0/8".parse().unwrap(),
            "127.0.0.0/8".parse().unwrap(),
        ]));
        let got = rt.block_on(resolve_publishers(&fleet, &policy, &Default::default()));
        assert_eq!(
            got[&PublisherId::new(1)],
            Ok("10.1.2.3:5557".parse().unwrap())
        );
        assert_eq!(got[&PublisherId::new(2)], Err(Refusal::NotAllowed));
        assert!(
            got[&PublisherId::new(3)]
                .as_ref()
                .is_ok_and(|a| a.ip().is_loopback())
        );
        assert_eq!(got[&PublisherId::new(4)], Err(Refusal::Unresolved));
        // A known publisher keeps its earlier decision (resolved once); a departed one is dropped.
        let mut previous = got.clone();
        previous.insert(PublisherId::new(1), Err(Refusal::NotAllowed));
        previous.insert(PublisherId::new(99), Ok("10.0.0.1:1".parse().unwrap()));
        let again = rt.block_on(resolve_publishers(&fleet, &policy, &previous));
        assert_eq!(again[&PublisherId::new(1)], Err(Refusal::NotAllowed));
        assert!(!again.contains_key(&PublisherId::new(99)));
    }
}
