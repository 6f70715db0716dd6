//! `GET /admin/dynamo/workers`: the operator view of the discovered fleet (ADMIN-02..10), and
//! the entry of `POST /admin/dynamo/explain` (method, admin access, then the dispatcher's dry
//! run).
//!
//! Compiled only with the `dynamo` feature (a build without it answers 404, ADMIN-08); behind
//! the same admin authentication as every admin route. With discovery disabled by config it
//! answers 200 with `"enabled": false` and empty lists (ADMIN-07).
//!
//! Invariant: nothing internal leaves here (ADMIN-06): no worker transport address, no
//! publisher `tcp://` endpoint (only counts), no raw card, no bootstrap host.

use continuum_core::config::dynamo::{DiscoverySource, LoadTransport};
use continuum_core::discovery::fleet::DisaggregatedEndpoint;
use continuum_core::discovery::{Family, Worker};
use continuum_core::snapshot::RouterSnapshot;
use serde_json::{Value, json};

use continuum_core::load::{LoadKey, LoadStore};

use continuum_core::http1::request::Method;

use crate::dispatch::{Dispatcher, ExchangeBufs};
use crate::http::respond::{ErrorShape, LocalError};
use crate::http::{Outcome, Request, ResponseSink};
use crate::metrics::ControlStats;
use crate::signals::Signals;

/// `POST /admin/dynamo/explain`: 405 for another method, then admin access exactly as every
/// admin route (audited), then what `dispatch` would decide for the body (JSON).
pub(crate) fn explain(
    snap: &RouterSnapshot,
    dispatch: &Dispatcher,
    req: &mut Request,
    sink: &mut ResponseSink,
    bufs: &mut ExchangeBufs,
) -> Outcome {
    if req.head.method != Method::Post {
        return sink.local_error(&req.head, ErrorShape::OpenAi, LocalError::MethodNotAllowed);
    }
    if let Err(e) = super::admin_allowed(snap, req) {
        return sink.local_error(&req.head, ErrorShape::OpenAi, e);
    }
    match dispatch.explain(snap, req, sink, bufs) {
        Ok(v) => super::ok(req, sink, "application/json", v.to_string().as_bytes()),
        Err(outcome) => outcome,
    }
}

/// The response body.
pub(crate) fn workers_json(snap: &RouterSnapshot, control: &ControlStats, load: &Signals) -> Value {
    let d = &snap.config.dynamo;
    let source = d.discovery.source;
    let (namespace, namespaces) = match source {
        DiscoverySource::Etcd => (
            d.discovery.etcd.namespace.clone(),
            d.discovery.etcd.namespaces.clone(),
        ),
        DiscoverySource::File => (
            d.discovery
                .file
                .namespaces
                .first()
                .cloned()
                .unwrap_or_default(),
            d.discovery.file.namespaces.clone(),
        ),
        DiscoverySource::Kubernetes | DiscoverySource::KubernetesPods => (
            d.discovery
                .kubernetes
                .dynamo_namespaces
                .first()
                .cloned()
                .unwrap_or_default(),
            d.discovery.kubernetes.dynamo_namespaces.clone(),
        ),
    };
    // The file store and the metadata source carry the records etcd does: capacity and load
    // signals included (DISC-K8S-META-08); Pods carry none.
    let signals = source != DiscoverySource::KubernetesPods;
    let enabled = d.enabled;
    let fleet = &snap.fleet;
    let now = crate::clock::now();
    let workers: Vec<Value> = if enabled {
        fleet
            .workers
            .iter()
            .map(|w| worker_json(w, load, now))
            .collect()
    } else {
        Vec::new()
    };
    let count = |f: Family| {
        if enabled {
            fleet.publishers_of(f).count()
        } else {
            0
        }
    };
    let connected = control
        .discovery_connected
        .load(std::sync::atomic::Ordering::Relaxed)
        == 1;
    let mut out = json!({
        "enabled": enabled,
        "connected": enabled && connected,
        "source": source.as_str(),
        "signals": {"load": signals, "capacity": signals},
        "namespace": namespace,
        "namespaces": namespaces,
        "generation": snap.generation,
        "workers": workers,
        "load_publishers": count(Family::KvMetrics),
        "kv_event_publishers": count(Family::KvEvents),
        "subscriptions": subscriptions(load),
    });
    if d.load.transport == LoadTransport::Broker
        && let Some(o) = out.as_object_mut()
    {
        o.insert("broker_coverage".into(), broker_coverage(snap, load));
    }
    out
}

/// ADMIN-04 rows: every running subscription, never an address.
fn subscriptions(load: &Signals) -> Vec<Value> {
    load.tables
        .iter()
        .flat_map(|t| t.rows())
        .map(|r| {
            let mut row = json!({
                "family": r.family.topic(),
                "publisher_id": r.publisher_id.get().to_string(),
                "namespace": r.namespace,
                "component": r.component,
                "state": r.state.as_str(),
                "transport": r.transport.as_str(),
                "shard": r.shard,
            });
            if let (Some(broker), Some(o)) = (r.broker, row.as_object_mut()) {
                o.insert("broker".into(), Value::String(broker));
            }
            row
        })
        .collect()
}

/// ADMIN-05: per configured namespace, whether a broker covers it, how many do, and how many
/// broker subscriptions wait pending in it.
fn broker_coverage(snap: &RouterSnapshot, load: &Signals) -> Value {
    let coverage = load.broker.coverage(&snap.config, &load.tables);
    let mut out = serde_json::Map::new();
    for c in coverage {
        out.insert(
            c.namespace,
            json!({
                "covered": c.brokers > 0,
                "brokers": c.brokers,
                "pending_subscriptions": c.pending.iter().sum::<u64>(),
            }),
        );
    }
    Value::Object(out)
}

/// The load samples of each of the worker's dp ranks: the last sample's fields (nil fields as
/// null), its age, and whether it is fresh under `load.max_staleness` (LOAD-STORE-03..05).
fn load_json(w: &Worker, store: &LoadStore, now: continuum_core::clock::Instant) -> Vec<Value> {
    let start = w.dp_start_rank.unwrap_or(0);
    let size = w.dp_size.unwrap_or(1).clamp(1, 64);
    (start..start.saturating_add(size))
        .map(|rank| {
            let key = LoadKey { worker_id: w.instance_id, dp_rank: rank };
            match store.last(key) {
                Some(s) => json!({
                    "dp_rank": rank,
                    "fresh": store.fresh_default(key, now).is_some(),
                    "age_ms": u64::try_from(now.saturating_since(s.received_at).as_millis()).unwrap_or(u64::MAX),
                    "active_decode_blocks": s.sample.active_decode_blocks,
                    "active_prefill_tokens": s.sample.active_prefill_tokens,
                    "kv_used_blocks": s.sample.kv_used_blocks,
                }),
                None => json!({"dp_rank": rank, "fresh": false}),
            }
        })
        .collect()
}

/// The worker's indexed ranks (KV-IDX): one entry per rank the KV index holds blocks or a
/// cursor for, with its block count, last `event_id` and the age of that event.
fn kv_json(w: &Worker, load: &Signals, now: continuum_core::clock::Instant) -> Vec<Value> {
    load.kv
        .ranks_of(w.instance_id)
        .into_iter()
        .map(|r| {
            json!({
                "dp_rank": r.key.dp_rank,
                "blocks": r.blocks,
                "last_event_id": r.last_event_id,
                "last_event_age_ms": u64::try_from(now.saturating_since(r.last_event_at).as_millis()).unwrap_or(u64::MAX),
            })
        })
        .collect()
}

fn worker_json(w: &Worker, load: &Signals, now: continuum_core::clock::Instant) -> Value {
    json!({
        "load": load_json(w, &load.store, now),
        "kv": kv_json(w, load, now),
        // Its kv_metrics connection dropped and it has not published since (issue 38).
        "suspect": load.suspects.contains(w.instance_id),
        "instance_id": w.instance_id.hex(),
        "worker_id": w.instance_id.get().to_string(),
        "namespace": w.namespace,
        "role": w.role.as_str(),
        "model": w.model,
        "component": w.component,
        "endpoint": w.endpoint,
        "dp_start_rank": w.dp_start_rank,
        "dp_size": w.dp_size,
        "block_size": w.block_size,
        "capacity": {
            "total_kv_blocks": w.capacity.total_kv_blocks,
            "max_num_batched_tokens": w.capacity.max_num_batched_tokens,
            "max_num_seqs": w.capacity.max_num_seqs,
            "context_length": w.capacity.context_length,
        },
        "disaggregated_endpoint": w.disaggregated_endpoint.as_ref().map(DisaggregatedEndpoint::public),
        "first_seen": w.first_seen.rfc3339(),
        "last_updated": w.last_updated.rfc3339(),
    })
}
