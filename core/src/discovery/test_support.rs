//! Test helpers: record builders in the shapes real Dynamo writes, and a small driver.

use serde_json::{Value, json};

use super::diag::Diagnostic;
use super::fleet::FleetView;
use super::ids::{PublisherId, UnixMillis};
use super::keys::{CHANNELS_PREFIX, SOURCES_PREFIX, channel_key};
use super::reducer::{KvEvent, Reducer};

pub(crate) const T0: UnixMillis = UnixMillis(1_790_136_662_000);

/// A small deterministic generator (xorshift64) for property and differential tests: every
/// case is reproducible from its seed, and the crate needs no extra dependency.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub(crate) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }

    pub(crate) fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

/// A key/value pair.
pub(crate) type Kv = (String, String);

pub(crate) fn endpoint(ns: &str, component: &str, ep: &str, id: u64) -> Kv {
    (
        format!("v1/instances/{ns}/{component}/{ep}/{id:x}"),
        json!({
            "type": "Endpoint", "namespace": ns, "component": component, "endpoint": ep,
            "instance_id": id,
            "transport": {"tcp": format!("10.0.0.4:31000/{id:x}/{ns}/{component}/{ep}")},
            "device_type": "cuda", "request_plane_codec": "msgpack"
        })
        .to_string(),
    )
}

pub(crate) fn card_json(model: &str, worker_type: Option<&str>) -> Value {
    let mut c = json!({
        "display_name": model,
        "kv_cache_block_size": 64,
        "runtime_config": {
            "total_kv_blocks": 12000, "max_num_batched_tokens": 8192, "max_num_seqs": 256,
            "context_length": 32768, "data_parallel_start_rank": 0, "data_parallel_size": 1,
            "disaggregated_endpoint": "dynamo/decode/generate"
        }
    });
    if let (Some(wt), Some(obj)) = (worker_type, c.as_object_mut()) {
        obj.insert("worker_type".into(), json!(wt));
    }
    c
}

pub(crate) fn card(ns: &str, component: &str, id: u64, card: Value) -> Kv {
    (
        format!("v1/mdc/{ns}/{component}/generate/{id:x}"),
        json!({
            "type": "Model", "namespace": ns, "component": component, "endpoint": "generate",
            "instance_id": id, "card_json": card
        })
        .to_string(),
    )
}

pub(crate) fn channel(ns: &str, component: &str, topic: &str, pid: u64, ep: &str) -> Kv {
    (
        channel_key(ns, component, "generate", topic, PublisherId::new(pid)),
        json!({
            "type": "EventChannel",
            "scope": {"kind": "endpoint",
                      "endpoint": {"namespace": ns, "component": component, "name": "generate"}},
            "topic": topic, "instance_id": pid,
            "transport": {"kind": "Zmq", "config": {"endpoint": ep}}
        })
        .to_string(),
    )
}

/// The `v1/event_sources/` record Dynamo 1.6.1 writes next to the kv-events channel
/// `channel(ns, component, "kv-events", pid, _)`.
pub(crate) fn source(ns: &str, component: &str, pid: u64, worker_id: u64, dp_rank: u32) -> Kv {
    let channel = channel_key(
        ns,
        component,
        "generate",
        "kv-events",
        PublisherId::new(pid),
    );
    let scope = json!({"namespace": ns, "component": component, "name": "generate"});
    (
        channel.replacen(CHANNELS_PREFIX, SOURCES_PREFIX, 1),
        json!({
            "type": "EventSource",
            "scope": {"kind": "endpoint", "endpoint": scope},
            "topic": "kv-events", "publisher_id": pid,
            "metadata": {
                "kv_state_endpoint": scope,
                "worker": {"worker_id": worker_id, "dp_rank": dp_rank},
                "publisher_id": pid,
                "recovery_target": {
                    "component": component, "namespace": ns, "instance_id": worker_id,
                    "endpoint": format!("worker_kv_query_source_{pid:x}"),
                    "transport": {"tcp": format!("10.0.0.4:37455/{worker_id:x}/{ns}/{component}")}
                }
            }
        })
        .to_string(),
    )
}

pub(crate) fn put(r: &mut Reducer, kv: &Kv) {
    put_at(r, kv, T0);
}

pub(crate) fn put_at(r: &mut Reducer, kv: &Kv, now: UnixMillis) {
    r.apply(
        KvEvent::Put {
            key: kv.0.as_bytes(),
            value: kv.1.as_bytes(),
        },
        now,
    );
}

pub(crate) fn del(r: &mut Reducer, key: &str) {
    r.apply(
        KvEvent::Delete {
            key: key.as_bytes(),
        },
        T0,
    );
}

/// A reducer fed with `kvs`, materialised.
pub(crate) fn view_of(kvs: &[Kv]) -> (Reducer, std::sync::Arc<FleetView>) {
    let mut r = Reducer::new();
    for kv in kvs {
        put(&mut r, kv);
    }
    let v = r.materialize();
    (r, v)
}

pub(crate) fn dups(d: &[Diagnostic]) -> usize {
    d.iter()
        .filter(|d| matches!(d, Diagnostic::Duplicate { .. }))
        .count()
}
