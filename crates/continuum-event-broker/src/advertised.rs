//! What the broker may relay (BROKER-14): the publishers its discovery advertises, by namespace,
//! host, port and topic. A `subscribe` for anything else is answered `stream_closed
//! target_not_advertised` and never dialled, so a router (or whoever holds its credentials)
//! cannot use the broker to reach arbitrary in-cluster addresses.
//!
//! Invariants: built whole from one fleet view and swapped whole (a reader never sees half of an
//! update); lookups allocate nothing.

use std::collections::HashSet;

use continuum_core::discovery::{Family, FleetView};
use continuum_event_bus::message::Topic;

/// The advertised publishers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Advertised {
    set: HashSet<(String, String, u16, Topic)>,
}

fn topic(family: Family) -> Topic {
    match family {
        Family::KvMetrics => Topic::KvMetrics,
        Family::KvEvents => Topic::KvEvents,
    }
}

impl Advertised {
    /// Every publisher of `fleet` in one of `namespaces`.
    pub fn from_fleet(fleet: &FleetView, namespaces: &[String]) -> Self {
        let set = fleet
            .publishers
            .iter()
            .filter(|p| namespaces.contains(&p.namespace))
            .map(|p| {
                (
                    p.namespace.clone(),
                    p.tcp.host.clone(),
                    p.tcp.port,
                    topic(p.family),
                )
            })
            .collect();
        Self { set }
    }

    /// A set from explicit entries (namespace, host, port, topic).
    pub fn from_entries(entries: impl IntoIterator<Item = (String, String, u16, Topic)>) -> Self {
        Self {
            set: entries.into_iter().collect(),
        }
    }

    /// Whether `host:port` publishes `topic` in `namespace`.
    pub fn allows(&self, namespace: &str, host: &str, port: u16, topic: Topic) -> bool {
        // HashSet<(String, ..)> cannot be probed with borrowed parts; the set is small per
        // namespace and a subscribe is rare (once per publisher per stream), so scan.
        self.set
            .iter()
            .any(|(n, h, p, t)| n == namespace && h == host && *p == port && *t == topic)
    }

    /// How many publishers are advertised.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Whether nothing is advertised.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use continuum_core::discovery::ids::PublisherId;
    use continuum_core::discovery::{Publisher, TcpTarget};

    use super::*;

    fn publisher(ns: &str, host: &str, port: u16, family: Family) -> Publisher {
        Publisher {
            family,
            publisher_id: PublisherId::new(u64::from(port)),
            namespace: ns.into(),
            component: None,
            endpoint: None,
            tcp: TcpTarget {
                host: host.into(),
                port,
            },
            source: None,
        }
    }

    #[test]
    fn only_publishers_of_the_declared_namespaces_with_their_own_topic() {
        let fleet = FleetView {
            workers: vec![],
            publishers: vec![
                publisher("dynamo", "10.0.0.7", 5557, Family::KvMetrics),
                publisher("dynamo", "10.0.0.7", 5558, Family::KvEvents),
                publisher("other", "10.0.0.9", 5557, Family::KvMetrics),
            ],
        };
        let a = Advertised::from_fleet(&fleet, &["dynamo".to_owned()]);
        assert_eq!(a.len(), 2);
        assert!(a.allows("dynamo", "10.0.0.7", 5557, Topic::KvMetrics));
        assert!(a.allows("dynamo", "10.0.0.7", 5558, Topic::KvEvents));
        // The other topic on an advertised port, another port, another namespace: refused.
        assert!(!a.allows("dynamo", "10.0.0.7", 5557, Topic::KvEvents));
        assert!(!a.allows("dynamo", "10.0.0.7", 5559, Topic::KvMetrics));
        assert!(!a.allows("other", "10.0.0.9", 5557, Topic::KvMetrics));
        assert!(!a.allows("dynamo", "10.0.0.9", 5557, Topic::KvMetrics));
    }
}
