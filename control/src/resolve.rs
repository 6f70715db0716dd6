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

/// The publishers' resolved addresses, with the endpoint each was resolved from.
#[derive(Debug, Clone, Default)]
pub(crate) struct PublisherCache {
    /// The decisions the snapshot carries.
    pub(crate) addrs: continuum_core::snapshot::PublisherAddrs,
    /// The `(host, port)` each decision was made for.
    endpoints: std::collections::HashMap<continuum_core::discovery::PublisherId, (String, u16)>,
}

impl PublisherCache {
    /// How many publishers did not resolve (to be retried).
    pub(crate) fn unresolved(&self) -> usize {
        self.addrs
            .values()
            .filter(|d| matches!(d, Err(continuum_core::subscriptions::Refusal::Unresolved)))
            .count()
    }
}

/// Resolve the admitted publishers of every family and check each against the connect policy
/// (CFG-20). A decision in `previous` is reused only for the same publisher at the same
/// endpoint and only if its lookup succeeded: a publisher whose record changed its endpoint is
/// resolved again, and a failed lookup is retried by the next call (LOAD-STORE-16). Publishers
/// that left are dropped. IP literals need no lookup; host names are looked up on the blocking
/// pool all at once, so the whole call waits at most [`PUBLISHER_RESOLVE_TIMEOUT`], however
/// many there are.
pub(crate) async fn resolve_publishers(
    fleet: &continuum_core::discovery::FleetView,
    policy: &continuum_core::subscriptions::ConnectPolicy,
    previous: &PublisherCache,
) -> PublisherCache {
    use continuum_core::discovery::Family;
    use continuum_core::subscriptions::{Refusal, admitted};
    let mut out = PublisherCache::default();
    let mut lookups = Vec::new();
    for family in [Family::KvMetrics, Family::KvEvents] {
        for p in admitted(fleet, family) {
            let endpoint = (p.tcp.host.clone(), p.tcp.port);
            let known = previous
                .addrs
                .get(&p.publisher_id)
                .filter(|d| !matches!(d, Err(Refusal::Unresolved)))
                .filter(|_| previous.endpoints.get(&p.publisher_id) == Some(&endpoint));
            if let Some(known) = known {
                out.addrs.insert(p.publisher_id, known.clone());
                out.endpoints.insert(p.publisher_id, endpoint);
                continue;
            }
            match p.tcp.host.parse::<IpAddr>() {
                Ok(ip) => {
                    let decision = policy.choose(&[SocketAddr::new(ip, p.tcp.port)]);
                    note_refusal(p, &decision);
                    out.addrs.insert(p.publisher_id, decision);
                    out.endpoints.insert(p.publisher_id, endpoint);
                }
                Err(_) => {
                    let target = endpoint.clone();
                    let lookup = tokio::task::spawn_blocking(move || {
                        target.to_socket_addrs().map(Iterator::collect::<Vec<_>>)
                    });
                    lookups.push((p, endpoint, lookup));
                }
            }
        }
    }
    let deadline = tokio::time::Instant::now() + PUBLISHER_RESOLVE_TIMEOUT;
    for (p, endpoint, lookup) in lookups {
        let resolved = match tokio::time::timeout_at(deadline, lookup).await {
            Ok(Ok(Ok(addrs))) => addrs,
            _ => Vec::new(),
        };
        let decision = policy.choose(&resolved);
        note_refusal(p, &decision);
        out.addrs.insert(p.publisher_id, decision);
        out.endpoints.insert(p.publisher_id, endpoint);
    }
    out
}

fn note_refusal(
    p: &continuum_core::discovery::Publisher,
    decision: &Result<SocketAddr, continuum_core::subscriptions::Refusal>,
) {
    if let Err(why) = decision {
        tracing::warn!(publisher = %p.publisher_id, namespace = %p.namespace, reason = %why, "publisher not subscribed");
    }
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
        let cache = rt.block_on(resolve_publishers(
            &fleet,
            &policy,
            &PublisherCache::default(),
        ));
        let got = &cache.addrs;
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
        assert_eq!(cache.unresolved(), 1);
        // A known publisher at the same endpoint keeps its earlier decision (resolved once); a
        // departed one is dropped.
        let mut previous = cache.clone();
        previous
            .addrs
            .insert(PublisherId::new(1), Err(Refusal::NotAllowed));
        previous
            .addrs
            .insert(PublisherId::new(99), Ok("10.0.0.1:1".parse().unwrap()));
        let again = rt.block_on(resolve_publishers(&fleet, &policy, &previous));
        assert_eq!(again.addrs[&PublisherId::new(1)], Err(Refusal::NotAllowed));
        assert!(!again.addrs.contains_key(&PublisherId::new(99)));
        // A failed lookup is not remembered: the next call looks the host up again (here it
        // fails again, and stays counted for the retry).
        assert_eq!(again.unresolved(), 1);
        // A record that changed its endpoint (same publisher id) is resolved again.
        let moved = FleetView {
            workers: Vec::new(),
            publishers: vec![publisher(1, "127.0.0.1")],
        };
        let after = rt.block_on(resolve_publishers(&moved, &policy, &previous));
        assert_eq!(
            after.addrs[&PublisherId::new(1)],
            Ok("127.0.0.1:5557".parse().unwrap())
        );
    }
}
