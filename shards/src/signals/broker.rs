//! The event bus as the shards see it (`transport: broker`): the running listener's command API,
//! which the control thread swaps in and out as the listener starts, restarts and stops, and the
//! broker gauges and coverage derived from it and from the subscription tables (BROKER-11,
//! OBS-07, OBS-08, ADMIN-05).
//!
//! Invariants:
//! - only the control thread stores the bus here; shards load it when a subscription connects,
//!   never per message or per request;
//! - gauge labels are closed sets: `broker` only takes configured `dynamo.event_bus.brokers[].id`
//!   values, `namespace` only the configured Dynamo namespaces;
//! - a build without `dynamo-event-bus` has no bus: every namespace is uncovered and broker
//!   subscriptions stay pending (BROKER-12).

use std::fmt::Write as _;
use std::sync::Arc;

use continuum_core::config::Config;
use continuum_core::config::dynamo::{BrokerRole, LoadTransport};
use continuum_core::discovery::Family;

use super::subs::{SubRow, SubState, SubTable, Transport};

/// The bus slot.
#[derive(Debug, Default)]
pub struct BrokerSignals {
    #[cfg(feature = "dynamo-event-bus")]
    bus: arc_swap::ArcSwapOption<continuum_bus::EventBus>,
}

impl BrokerSignals {
    /// The running listener's command API (`None`: no listener).
    #[cfg(feature = "dynamo-event-bus")]
    pub fn set(&self, bus: Option<continuum_bus::EventBus>) {
        self.bus.store(bus.map(Arc::new));
    }

    /// The running listener's command API, if one runs.
    #[cfg(feature = "dynamo-event-bus")]
    pub fn bus(&self) -> Option<Arc<continuum_bus::EventBus>> {
        self.bus.load_full()
    }

    /// How many active, non-draining broker sessions declared `namespace`.
    pub fn brokers_for(&self, namespace: &str) -> usize {
        #[cfg(feature = "dynamo-event-bus")]
        if let Some(bus) = self.bus.load().as_ref() {
            return bus.brokers_for(namespace);
        }
        let _ = namespace;
        0
    }

    /// Per configured namespace: how many broker sessions cover it, and how many broker
    /// subscriptions in it wait pending (ADMIN-05).
    pub fn coverage(&self, config: &Config, tables: &[Arc<SubTable>]) -> Vec<Coverage> {
        let rows: Vec<SubRow> = tables.iter().flat_map(|t| t.rows()).collect();
        self.coverage_of(config, &rows)
    }

    /// [`BrokerSignals::coverage`] over rows already read.
    fn coverage_of(&self, config: &Config, rows: &[SubRow]) -> Vec<Coverage> {
        config
            .dynamo
            .namespaces()
            .iter()
            .map(|ns| Coverage {
                namespace: ns.clone(),
                brokers: self.brokers_for(ns),
                pending: [Family::KvMetrics, Family::KvEvents].map(|f| {
                    rows.iter()
                        .filter(|r| {
                            r.family == f
                                && &r.namespace == ns
                                && r.transport == Transport::Broker
                                && r.state == SubState::Pending
                        })
                        .count() as u64
                }),
            })
            .collect()
    }

    /// Append `continuum_dynamo_broker_subscriptions{family,broker}` (OBS-07) and, with
    /// `transport: broker`, `continuum_dynamo_broker_namespace_sessions{namespace}` and
    /// `continuum_dynamo_broker_pending_subscriptions{family,namespace}` (OBS-08).
    pub fn render_metrics(&self, out: &mut String, config: &Config, tables: &[Arc<SubTable>]) {
        let rows: Vec<SubRow> = tables.iter().flat_map(|t| t.rows()).collect();
        let _ = writeln!(
            out,
            "# HELP continuum_dynamo_broker_subscriptions Subscriptions a broker relays now, by family and configured broker id.\n\
             # TYPE continuum_dynamo_broker_subscriptions gauge"
        );
        let brokers = config
            .dynamo
            .event_bus
            .brokers
            .iter()
            .filter(|b| b.role == BrokerRole::Broker);
        for b in brokers {
            for family in [Family::KvMetrics, Family::KvEvents] {
                let n = rows
                    .iter()
                    .filter(|r| r.family == family && r.broker.as_deref() == Some(b.id.as_str()))
                    .count();
                let _ = writeln!(
                    out,
                    "continuum_dynamo_broker_subscriptions{{family=\"{}\",broker=\"{}\"}} {n}",
                    family.topic(),
                    b.id
                );
            }
        }
        if config.dynamo.load.transport != LoadTransport::Broker {
            return;
        }
        let coverage = self.coverage_of(config, &rows);
        let _ = writeln!(
            out,
            "# HELP continuum_dynamo_broker_namespace_sessions Broker sessions covering each configured Dynamo namespace.\n\
             # TYPE continuum_dynamo_broker_namespace_sessions gauge"
        );
        for c in &coverage {
            let _ = writeln!(
                out,
                "continuum_dynamo_broker_namespace_sessions{{namespace=\"{}\"}} {}",
                c.namespace, c.brokers
            );
        }
        let _ = writeln!(
            out,
            "# HELP continuum_dynamo_broker_pending_subscriptions Broker subscriptions waiting for a covering broker, by family and namespace.\n\
             # TYPE continuum_dynamo_broker_pending_subscriptions gauge"
        );
        for c in &coverage {
            for (family, n) in [Family::KvMetrics, Family::KvEvents].iter().zip(c.pending) {
                let _ = writeln!(
                    out,
                    "continuum_dynamo_broker_pending_subscriptions{{family=\"{}\",namespace=\"{}\"}} {n}",
                    family.topic(),
                    c.namespace
                );
            }
        }
    }
}

/// One configured namespace's broker coverage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coverage {
    /// The Dynamo namespace.
    pub namespace: String,
    /// Active, non-draining broker sessions that declared it.
    pub brokers: usize,
    /// Pending broker subscriptions in it: `kv_metrics`, then `kv-events`.
    pub pending: [u64; 2],
}

#[cfg(test)]
mod tests {
    use continuum_core::discovery::PublisherId;

    use super::*;

    fn config(transport: &str) -> Config {
        let z = "0".repeat(64);
        let yaml = format!(
            "dynamo:\n  enabled: true\n  load:\n    transport: {transport}\n  discovery:\n    source: etcd\n    \
             etcd:\n      endpoints: [\"http://127.0.0.1:2379\"]\n      namespaces: [dyn-a]\n  event_bus:\n    \
             brokers:\n      - {{ id: b-one, token_hash: \"sha256:{z}\", namespaces: [dyn-a] }}\n      \
             - {{ id: l-one, role: kv_listener, token_hash: \"sha256:{z}\", backends: [b] }}\n"
        );
        let (config, _) =
            Config::from_yaml(&yaml, &continuum_core::config::NoEnv).expect("valid config");
        config
    }

    fn row(family: Family, id: u64, ns: &str, state: SubState, broker: Option<&str>) -> SubRow {
        SubRow {
            family,
            publisher_id: PublisherId::new(id),
            namespace: ns.into(),
            component: None,
            state,
            shard: 0,
            transport: Transport::Broker,
            broker: broker.map(str::to_owned),
        }
    }

    #[test]
    fn gauges_count_by_configured_broker_and_namespace_only() {
        let table = Arc::new(SubTable::default());
        table.upsert(row(
            Family::KvMetrics,
            1,
            "dyn-a",
            SubState::Connected,
            Some("b-one"),
        ));
        table.upsert(row(
            Family::KvEvents,
            2,
            "dyn-a",
            SubState::Connected,
            Some("b-one"),
        ));
        table.upsert(row(Family::KvMetrics, 3, "dyn-a", SubState::Pending, None));
        table.upsert(row(Family::KvEvents, 4, "dyn-a", SubState::Pending, None));
        table.upsert(row(Family::KvEvents, 5, "dyn-a", SubState::Pending, None));
        // A namespace nobody configured never becomes a label.
        table.upsert(row(
            Family::KvMetrics,
            6,
            "elsewhere",
            SubState::Pending,
            None,
        ));
        let tables = [table];
        let signals = BrokerSignals::default();
        let mut out = String::new();
        signals.render_metrics(&mut out, &config("broker"), &tables);
        for line in [
            "continuum_dynamo_broker_subscriptions{family=\"kv_metrics\",broker=\"b-one\"} 1\n",
            "continuum_dynamo_broker_subscriptions{family=\"kv-events\",broker=\"b-one\"} 1\n",
            "continuum_dynamo_broker_namespace_sessions{namespace=\"dyn-a\"} 0\n",
            "continuum_dynamo_broker_pending_subscriptions{family=\"kv_metrics\",namespace=\"dyn-a\"} 1\n",
            "continuum_dynamo_broker_pending_subscriptions{family=\"kv-events\",namespace=\"dyn-a\"} 2\n",
        ] {
            assert!(out.contains(line), "missing {line:?} in\n{out}");
        }
        assert!(
            !out.contains("l-one"),
            "a kv_listener relays no subscription"
        );
        assert!(!out.contains("elsewhere"));
        // Direct transport: only the per-broker family.
        let mut direct = String::new();
        signals.render_metrics(&mut direct, &config("direct"), &tables);
        assert!(direct.contains("continuum_dynamo_broker_subscriptions{"));
        assert!(!direct.contains("namespace_sessions{"));
    }
}
