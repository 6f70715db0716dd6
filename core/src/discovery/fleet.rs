//! The immutable fleet view the discovery reducer publishes.
//!
//! Role: everything the registry, pickers, load supervisors and the admin view read about the
//! Dynamo fleet: workers (one per `(namespace, instance_id)`, DISC-MULTI-03) and the `kv_metrics` /
//! `kv-events` publishers to subscribe to.
//!
//! Invariants:
//! - a [`FleetView`] is never mutated after construction and is shared by `Arc`;
//! - `workers` is sorted by `(namespace, instance_id)` and holds no two workers with the same
//!   instance id (duplicates are rejected, DISC-DUP-04, Q-45); `publishers` is sorted by
//!   `(namespace, family, publisher_id)` and holds no two equal publisher ids (LOAD-CHAN-09);
//! - a publisher's `source` is `Some` only for a `kv-events` publisher whose channel key has a
//!   valid `v1/event_sources/` record with the very same key suffix; never for `kv_metrics`;
//! - the opaque card is the very `Arc` created at parse time (DISC-REC-19);
//! - a worker's request transport stays private to this crate's callers that ask for it by name
//!   ([`Worker::request_transport`]); it is never part of any display form (ADMIN-06).

use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use super::ids::{InstanceId, PublisherId, UnixMillis};

/// A worker's role in routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Disaggregated prefill worker.
    Prefill,
    /// Disaggregated decode worker.
    Decode,
    /// Prefill and decode in one worker.
    Aggregated,
    /// No role could be determined: shown to operators, never routed (DISC-REC-15, ADMIN-10).
    Unknown,
}

impl Role {
    /// The admin label (`prefill` | `decode` | `aggregated` | `unknown`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Aggregated => "aggregated",
            Role::Unknown => "unknown",
        }
    }

    /// Whether a picker may ever consider this worker.
    pub const fn is_routable(self) -> bool {
        !matches!(self, Role::Unknown)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Capacity figures from the card's `runtime_config` (ADMIN-03 `capacity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capacity {
    /// `runtime_config.total_kv_blocks`.
    pub total_kv_blocks: Option<u64>,
    /// `runtime_config.max_num_batched_tokens`.
    pub max_num_batched_tokens: Option<u64>,
    /// `runtime_config.max_num_seqs`.
    pub max_num_seqs: Option<u64>,
    /// `runtime_config.context_length`, else the card's top-level `context_length`.
    pub context_length: Option<u64>,
}

/// `runtime_config.disaggregated_endpoint`: a path string in the design document's example, an
/// object `{bootstrap_host, bootstrap_port}` in upstream Dynamo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DisaggregatedEndpoint {
    /// A string such as `dynamo/decode/generate`.
    Path(String),
    /// Upstream's bootstrap object.
    Bootstrap {
        /// `bootstrap_host`.
        host: Option<String>,
        /// `bootstrap_port`.
        port: Option<u16>,
    },
}

/// A worker's model card as the fleet wrote it: opaque JSON text, shared by `Arc` and never
/// deep-copied (DISC-REC-17/19). Keeping the text rather than a parsed tree is what keeps a
/// 16,384-worker registry small; readers parse it when they need a field the typed view lacks.
#[derive(Clone)]
pub struct CardJson(Arc<serde_json::value::RawValue>);

impl CardJson {
    /// Wrap validated JSON text.
    pub fn new(raw: Box<serde_json::value::RawValue>) -> Self {
        CardJson(Arc::from(raw))
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// The card parsed into a tree (allocates; for tools and tests, not hot paths).
    pub fn to_value(&self) -> Option<Value> {
        serde_json::from_str(self.0.get()).ok()
    }

    /// Whether both share one allocation.
    pub fn ptr_eq(a: &CardJson, b: &CardJson) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }
}

impl PartialEq for CardJson {
    fn eq(&self, other: &Self) -> bool {
        CardJson::ptr_eq(self, other) || self.0.get() == other.0.get()
    }
}

impl fmt::Debug for CardJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CardJson({} bytes)", self.0.get().len())
    }
}

impl DisaggregatedEndpoint {
    /// What the operator view may show: the endpoint path, or just `bootstrap` for a bootstrap
    /// address (an internal host never leaves the router, ADMIN-06).
    pub fn public(&self) -> String {
        match self {
            DisaggregatedEndpoint::Path(p) => p.clone(),
            DisaggregatedEndpoint::Bootstrap { .. } => "bootstrap".to_owned(),
        }
    }
}

/// The request-plane transport of a worker's `generate` endpoint. Internal: never displayed.
#[derive(Clone, PartialEq, Eq)]
pub enum RequestTransport {
    /// `{"tcp": "<host:port>/<path>"}`.
    Tcp(String),
    /// Another transport kind (e.g. `nats_tcp`, `http`), kept by name with its raw value.
    Other {
        /// The JSON key naming the transport.
        kind: String,
        /// The value as compact JSON.
        value: String,
    },
}

impl fmt::Debug for RequestTransport {
    /// Redacted: addresses never reach logs through `Debug` (ADMIN-06).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestTransport::Tcp(_) => f.write_str("Tcp(<redacted>)"),
            RequestTransport::Other { kind, .. } => write!(f, "Other({kind}, <redacted>)"),
        }
    }
}

/// One materialised worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Worker {
    /// Namespace from the etcd key (DISC-MULTI-04).
    pub namespace: String,
    /// Lease id; with `namespace` the worker's identity (DISC-MULTI-03).
    pub instance_id: InstanceId,
    /// Component from the Endpoint record.
    pub component: String,
    /// Always `generate` (DISC-REC-08).
    pub endpoint: String,
    /// Routing role (DISC-REC-09/10/15, Q-12).
    pub role: Role,
    /// The card's `display_name`.
    pub model: Option<String>,
    /// The card's `kv_cache_block_size`.
    pub block_size: Option<u32>,
    /// Capacity from `runtime_config`.
    pub capacity: Capacity,
    /// `runtime_config.data_parallel_start_rank`.
    pub dp_start_rank: Option<u32>,
    /// `runtime_config.data_parallel_size`.
    pub dp_size: Option<u32>,
    /// `runtime_config.disaggregated_endpoint`.
    pub disaggregated_endpoint: Option<DisaggregatedEndpoint>,
    /// The whole base card as opaque JSON, `None` without a card, with a rejected card or above
    /// `MAX_RETAINED_CARD_BYTES` (DISC-REC-17, DISC-MEM-03).
    pub card: Option<CardJson>,
    /// When this worker was first seen by this reducer; survives resyncs (DISC-ETCD-07).
    pub first_seen: UnixMillis,
    /// When its Endpoint or card record last changed.
    pub last_updated: UnixMillis,
    pub(crate) transport: Option<RequestTransport>,
}

impl Worker {
    /// The request-plane address of the `generate` endpoint. Never render it (ADMIN-06).
    pub fn request_transport(&self) -> Option<&RequestTransport> {
        self.transport.as_ref()
    }
}

/// A subscribed publisher family, by topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// Topic `kv_metrics` (ActiveLoad samples).
    KvMetrics,
    /// Topic `kv-events` (KV cache events).
    KvEvents,
}

impl Family {
    /// The topic string on the wire.
    pub const fn topic(self) -> &'static str {
        match self {
            Family::KvMetrics => "kv_metrics",
            Family::KvEvents => "kv-events",
        }
    }

    /// The family for a topic, `None` for topics the router does not subscribe to.
    pub fn from_topic(topic: &str) -> Option<Self> {
        match topic {
            "kv_metrics" => Some(Family::KvMetrics),
            "kv-events" => Some(Family::KvEvents),
            _ => None,
        }
    }
}

/// A `tcp://host:port` ZMQ endpoint, parsed. Internal: never displayed by the admin view.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TcpTarget {
    /// Host name or IP literal, without IPv6 brackets.
    pub host: String,
    /// Non-zero port.
    pub port: u16,
}

impl fmt::Display for TcpTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "tcp://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "tcp://{}:{}", self.host, self.port)
        }
    }
}

/// The worker rank a `kv-events` publisher declared it reports for, from its
/// `v1/event_sources/` record (Dynamo 1.6.1+). The ingest refuses events of that publisher for
/// any other `(worker, rank)` (KV-IDX-09).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventSource {
    /// `metadata.worker.worker_id`: the worker's instance id.
    pub worker_id: InstanceId,
    /// `metadata.worker.dp_rank`: the data-parallel rank.
    pub dp_rank: u32,
}

/// One subscribable publisher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publisher {
    /// Which topic it publishes.
    pub family: Family,
    /// Publisher incarnation id (LOAD-CHAN-05).
    pub publisher_id: PublisherId,
    /// Namespace from the key.
    pub namespace: String,
    /// Component of the scope, if any.
    pub component: Option<String>,
    /// Endpoint of the scope, if any.
    pub endpoint: Option<String>,
    /// Where to connect.
    pub tcp: TcpTarget,
    /// The registered `(worker, dp_rank)` of a `kv-events` publisher; `None` without a valid
    /// event-source record (Dynamo before 1.6.1) and always for `kv_metrics`.
    pub source: Option<EventSource>,
}

/// The published fleet view.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FleetView {
    /// Workers sorted by `(namespace, instance_id)`.
    pub workers: Vec<Worker>,
    /// Publishers sorted by `(namespace, family, publisher_id)`.
    pub publishers: Vec<Publisher>,
}

impl FleetView {
    /// The worker `(namespace, instance_id)`, by binary search.
    pub fn worker(&self, namespace: &str, instance_id: InstanceId) -> Option<&Worker> {
        self.workers
            .binary_search_by(|w| {
                (w.namespace.as_str(), w.instance_id).cmp(&(namespace, instance_id))
            })
            .ok()
            .and_then(|i| self.workers.get(i))
    }

    /// The worker with this instance id in any namespace (ids are unique in a view, Q-45).
    pub fn worker_by_id(&self, instance_id: InstanceId) -> Option<&Worker> {
        self.workers.iter().find(|w| w.instance_id == instance_id)
    }

    /// Workers of `namespace` serving `model`, in instance-id order.
    pub fn workers_for_model<'a>(
        &'a self,
        namespace: &'a str,
        model: &'a str,
    ) -> impl Iterator<Item = &'a Worker> + 'a {
        self.workers
            .iter()
            .filter(move |w| w.namespace == namespace && w.model.as_deref() == Some(model))
    }

    /// The view without the workers in `avoid`, for a pick that must not choose them (a re-pick
    /// after a dead pinned worker, or workers whose `kv_metrics` connection dropped; issue 38).
    /// `None` when no worker of the view is in `avoid` (nothing to leave out). The result keeps
    /// the workers' order and no publishers: it is only ever picked from. Cost: one pass and a
    /// clone of the kept workers; callers build it on those rare events, not per request.
    pub fn without(&self, avoid: &[InstanceId]) -> Option<FleetView> {
        let avoided = |w: &&Worker| avoid.contains(&w.instance_id);
        if !self.workers.iter().any(|w| avoided(&w)) {
            return None;
        }
        Some(FleetView {
            workers: self
                .workers
                .iter()
                .filter(|w| !avoided(w))
                .cloned()
                .collect(),
            publishers: Vec::new(),
        })
    }

    /// Publishers of one family.
    pub fn publishers_of(&self, family: Family) -> impl Iterator<Item = &Publisher> {
        self.publishers.iter().filter(move |p| p.family == family)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_target_display_brackets_ipv6() {
        let v4 = TcpTarget {
            host: "10.0.0.7".into(),
            port: 41000,
        };
        assert_eq!(v4.to_string(), "tcp://10.0.0.7:41000");
        let v6 = TcpTarget {
            host: "::1".into(),
            port: 5,
        };
        assert_eq!(v6.to_string(), "tcp://[::1]:5");
    }

    #[test]
    fn transport_debug_is_redacted() {
        let t = RequestTransport::Tcp("10.0.0.4:31000/1a7f2b/dynamo/prefill/generate".into());
        assert!(!format!("{t:?}").contains("10.0.0.4"));
    }

    #[test]
    fn families_map_topics() {
        assert_eq!(Family::from_topic("kv_metrics"), Some(Family::KvMetrics));
        assert_eq!(Family::from_topic("kv-events"), Some(Family::KvEvents));
        assert_eq!(Family::from_topic("forward-pass-metrics"), None);
        assert_eq!(Family::KvEvents.topic(), "kv-events");
    }
}
