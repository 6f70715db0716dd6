//! The local broker-tunnel setup (`tests/broker_tunnel.rs`, `tests/broker_live_check.rs`): a
//! real etcd seeded with the captured agg worker and its `kv_metrics` / `kv-events` channels
//! pointing at pyzmq publishers, the fake Kubernetes API server advertising them as the worker's
//! `DynamoWorkerMetadata`, a router with the event bus listener over TLS and real
//! `continuum-event-broker` processes dialling it with bearer tokens.
//!
//! Every wait here is bounded by [`WAIT`]. The admin view is always read with the bearer
//! [`ADMIN_TOKEN`] ([`admin_workers`]): a router without `admin.token_hash` ignores it (loopback
//! is enough), one with it requires it, so the same helpers serve both.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use continuum_core::discovery::InstanceId;
use continuum_core::kv::encode::{KvDataRef, KvEventRef};
use continuum_core::kv::event::Tier;
use continuum_core::kv::{EngineHash, StoredBlock, TokensHash};
use serde_json::{Value, json};

use super::broker::{BrokerProcess, BrokerSpec, token_hash};
use super::etcd::{EtcdServer, read_dump};
use super::kube::{FakeApiServer, endpoint_slice, pod_id, worker_metadata};
use super::pki::TestCa;
use super::{ADMIN_TOKEN, RouterConfig, RouterProcess, free_port, get_with};

/// The captured Dynamo 1.6.1 fleet's records and frames.
pub const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/fixtures/dynamo-1.6.1"
);
/// The captured agg worker and its `kv_metrics` publisher.
pub const WORKER_HEX: &str = "6a6ca22d4998ac0b";
/// The captured `kv_metrics` publisher of the agg worker.
pub const METRICS_HEX: &str = "a3d9516d245b1";
/// The worker's `kv-events` publisher (an id of these tests').
pub const EVENTS_ID: u64 = 0x5eed_0001;
/// A `kv_metrics` publisher the brokers do not advertise.
pub const HIDDEN_ID: u64 = 0x5eed_0002;
/// The etcd prefix of the worker's event channels.
pub const CHANNELS: &str =
    "v1/event_channels/namespace/agg/component/backend/endpoint/generate/topic";
/// The bearer token of broker `b-one`.
pub const TOKEN_ONE: &str = "broker-one-token";
/// The bearer token of broker `b-two`.
pub const TOKEN_TWO: &str = "broker-two-token";
/// The bound on every wait of these tests.
pub const WAIT: Duration = Duration::from_secs(20);

/// The agg worker's instance id.
pub fn worker() -> u64 {
    u64::from_str_radix(WORKER_HEX, 16).unwrap()
}

/// Its `kv_metrics` publisher id.
pub fn metrics_id() -> u64 {
    u64::from_str_radix(METRICS_HEX, 16).unwrap()
}

/// The agg worker's registrations, its `kv_metrics` channel at `metrics`, a `kv-events` channel
/// at `events` and, when given, a second `kv_metrics` channel ([`HIDDEN_ID`]) at `hidden`.
pub fn seed(etcd: &EtcdServer, metrics: &str, events: &str, hidden: Option<&str>) {
    let dump = read_dump(Path::new(&format!("{FIXTURES}/etcd-dump.txt")));
    let channel_key = format!("{CHANNELS}/kv_metrics/{METRICS_HEX}");
    let mut channel: Option<Value> = None;
    for (k, v) in dump {
        if k == format!("v1/instances/agg/backend/generate/{WORKER_HEX}")
            || k == format!("v1/mdc/agg/backend/generate/{WORKER_HEX}")
        {
            etcd.put(&k, &v);
        } else if k == channel_key {
            channel = Some(serde_json::from_str(&v).unwrap());
        }
    }
    let channel = channel.expect("the captured kv_metrics channel");
    let put = |topic: &str, id: u64, endpoint: &str| {
        let mut rec = channel.clone();
        rec["topic"] = topic.into();
        rec["instance_id"] = id.into();
        rec["transport"]["config"]["endpoint"] = endpoint.into();
        etcd.put(&format!("{CHANNELS}/{topic}/{id:x}"), &rec.to_string());
    };
    put("kv_metrics", metrics_id(), metrics);
    put("kv-events", EVENTS_ID, events);
    if let Some(hidden) = hidden {
        put("kv_metrics", HIDDEN_ID, hidden);
    }
}

/// What the brokers' discovery advertises: one worker Pod whose `DynamoWorkerMetadata` carries
/// the `kv_metrics` and `kv-events` channels (never the hidden one), its slice ready.
pub fn advertise(api: &FakeApiServer, metrics: &str, events: &str) {
    let pod = "agg-worker-0";
    let id = pod_id(pod);
    let hex = format!("{id:x}");
    let ep = format!("agg/backend/generate/{hex}");
    let channel = |topic: &str, publisher: u64, endpoint: &str| {
        json!({
            "type": "EventChannel",
            "scope": {"kind": "endpoint", "endpoint": {"namespace": "agg", "component": "backend", "name": "generate"}},
            "topic": topic, "instance_id": publisher,
            "transport": {"kind": "Zmq", "config": {"endpoint": endpoint}},
        })
    };
    let data = json!({
        "endpoints": {
            ep.clone(): {
                "type": "Endpoint", "component": "backend", "endpoint": "generate",
                "namespace": "agg", "instance_id": id,
                "transport": {"tcp": format!("10.244.1.7:35917/{hex}/agg/backend/generate")},
                "device_type": "cuda", "request_plane_codec": "msgpack",
            }
        },
        "model_cards": {
            ep: {
                "type": "Model", "namespace": "agg", "component": "backend",
                "endpoint": "generate", "instance_id": id,
                "card_json": {
                    "display_name": "tiny-agg", "slug": "tiny-agg", "kv_cache_block_size": 64,
                    "context_length": 4096,
                    "runtime_config": {"total_kv_blocks": 1024, "max_num_seqs": 64,
                        "max_num_batched_tokens": 8192, "data_parallel_size": 1},
                },
            }
        },
        "event_channels": {
            format!("namespace/agg/component/backend/endpoint/generate/topic/kv_metrics/{:x}", metrics_id()):
                channel("kv_metrics", metrics_id(), metrics),
            format!("namespace/agg/component/backend/endpoint/generate/topic/kv-events/{EVENTS_ID:x}"):
                channel("kv-events", EVENTS_ID, events),
        },
        "event_sources": null,
    });
    api.put(
        "dynamoworkermetadatas",
        "dynamo",
        &worker_metadata(pod, &data),
    );
    api.put(
        "endpointslices",
        "dynamo",
        &endpoint_slice("agg-backend-s", "agg-backend", &[(pod, true)]),
    );
}

/// The router's event bus listener: its port and TLS files (CA, certificate, key).
#[derive(Debug)]
pub struct Bus {
    /// The listener's loopback port.
    pub port: u16,
    /// The CA (PEM) the brokers trust.
    pub ca: PathBuf,
    /// The listener's certificate (for `localhost` and `127.0.0.1`).
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

impl Bus {
    /// A CA and a listener certificate written into `dir`, on a free port.
    pub fn new(dir: &Path) -> Bus {
        let ca = TestCa::new(dir, "ca", "bus test CA");
        let server = ca.server(dir, "listener", &["localhost", "127.0.0.1"]);
        Bus {
            port: free_port(),
            ca: ca.pem.clone(),
            cert: server.cert,
            key: server.key,
        }
    }
}

/// A router discovering the agg fleet in `etcd`, its subscriptions over `transport`, KV on, and
/// with `bus` the event bus listener accepting brokers `b-one` ([`TOKEN_ONE`]) and `b-two`
/// ([`TOKEN_TWO`]) for namespace `agg`.
pub fn router_config(etcd: &EtcdServer, transport: &str, bus: Option<&Bus>) -> RouterConfig {
    let mut cfg = RouterConfig {
        shards: "2".into(),
        ..RouterConfig::default()
    }
    .backend("fe-agg", "http://127.0.0.1:9", &["tiny-agg"]);
    let mut yaml = format!(
        "dynamo:\n  enabled: true\n  discovery:\n    source: etcd\n    etcd:\n      endpoints: [\"{}\"]\n      \
         namespaces: [agg]\n  load:\n    transport: {transport}\n    direct_allow_cidrs: [\"127.0.0.0/8\"]\n  \
         kv:\n    enabled: true\n  shim:\n    backends: [fe-agg]\n",
        etcd.endpoint()
    );
    if let Some(b) = bus {
        yaml.push_str(&format!(
            "  event_bus:\n    enabled: true\n    listen: \"127.0.0.1:{}\"\n    tls: {{ cert: \"{}\", key: \"{}\" }}\n    \
             brokers:\n      - {{ id: b-one, token_hash: \"{}\", namespaces: [agg] }}\n      \
             - {{ id: b-two, token_hash: \"{}\", namespaces: [agg] }}\n",
            b.port,
            b.cert.display(),
            b.key.display(),
            token_hash(TOKEN_ONE),
            token_hash(TOKEN_TWO),
        ));
    }
    cfg.extra_yaml = yaml;
    cfg
}

/// [`router_config`], started.
pub fn router(etcd: &EtcdServer, transport: &str, bus: Option<&Bus>) -> RouterProcess {
    RouterProcess::start(&router_config(etcd, transport, bus))
}

/// A broker `id` with `token` dialling `bus`, discovering through `api` (namespace `dynamo`,
/// Dynamo namespace `agg`).
pub fn broker(id: &str, token: &str, bus: &Bus, api: &FakeApiServer) -> BrokerProcess {
    BrokerProcess::start(&BrokerSpec {
        id: id.into(),
        router: format!("127.0.0.1:{}", bus.port),
        server_name: "localhost".into(),
        ca_file: bus.ca.clone(),
        token: token.into(),
        discovery: "  source: kubernetes\n  kubernetes:\n    namespace: dynamo\n    dynamo_namespace: agg\n"
            .into(),
        env: vec![(
            "KUBECONFIG".into(),
            api.kubeconfig().to_string_lossy().into_owned(),
        )],
    })
}

/// Polls `probe` until it returns a value; panics with the router's stderr after [`WAIT`].
pub fn wait_until<T>(what: &str, r: &RouterProcess, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what} not reached within {WAIT:?}; router stderr:\n{}",
            r.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A decimal-string id of the admin view.
pub fn decimal(v: &Value) -> Option<u64> {
    v.as_str()?.parse().ok()
}

/// `GET /admin/dynamo/workers` with the bearer [`ADMIN_TOKEN`].
pub fn admin_workers(r: &RouterProcess) -> Value {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let resp = get_with(
        r.addr(),
        "/admin/dynamo/workers",
        &[("Authorization", &bearer)],
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    resp.json()
}

/// The agg worker's first KV row: (blocks, last event id).
pub fn kv_row(r: &RouterProcess) -> Option<(u64, u64)> {
    let admin = admin_workers(r);
    let w = admin["workers"]
        .as_array()?
        .iter()
        .find(|w| decimal(&w["worker_id"]) == Some(worker()))?
        .clone();
    let k = w["kv"].as_array()?.first()?.clone();
    Some((k["blocks"].as_u64()?, k["last_event_id"].as_u64()?))
}

/// The admin `subscriptions[]` row of `(family, publisher)`.
pub fn sub_row(r: &RouterProcess, family: &str, publisher: u64) -> Option<Value> {
    let v = admin_workers(r);
    v["subscriptions"]
        .as_array()?
        .iter()
        .find(|s| s["family"] == family && decimal(&s["publisher_id"]) == Some(publisher))
        .cloned()
}

/// Whether the row is connected through a broker; its broker id then.
pub fn relayed_by(r: &RouterProcess, family: &str, publisher: u64) -> Option<String> {
    let row = sub_row(r, family, publisher)?;
    (row["state"] == "connected" && row["transport"] == "broker")
        .then(|| row["broker"].as_str().map(str::to_owned))
        .flatten()
}

/// The 4 frames of the captured agg `kv_metrics` message `n`.
pub fn metrics_frames(n: u32) -> Vec<Vec<u8>> {
    (0..4)
        .map(|k| {
            let p = format!("{FIXTURES}/frames/agg.backend.kv_metrics-{n:03}.f{k}.bin");
            std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
        })
        .collect()
}

/// A generated `kv_metrics` message of the agg worker's publisher with `sequence` (each new
/// sequence is applied): `kv_used_blocks` only, as Dynamo's vLLM workers send.
pub fn load_message(sequence: u64, kv_used_blocks: u64) -> [Vec<u8>; 4] {
    use continuum_core::discovery::{PublisherId, UnixMillis};
    use continuum_core::dynamo_event::{
        ActiveLoad, Encoding, EventEnvelope, Sequence, encode_active_load, encode_message,
    };
    let load = ActiveLoad {
        worker_id: InstanceId::new(worker()),
        dp_rank: 0,
        active_decode_blocks: None,
        active_prefill_tokens: None,
        kv_used_blocks: Some(kv_used_blocks),
    };
    let mut payload = Vec::new();
    encode_active_load(&load, Encoding::Array, &mut payload);
    let env = EventEnvelope {
        publisher_id: PublisherId::new(metrics_id()),
        sequence: Sequence(sequence),
        published_at: UnixMillis(1_796_056_139_389),
        topic: b"kv_metrics",
        payload: &payload,
    };
    encode_message(&env, Encoding::Array).unwrap()
}

/// A stored block whose engine hash is `h`.
pub fn block(h: u64) -> StoredBlock {
    StoredBlock {
        block_hash: EngineHash(h),
        tokens_hash: TokensHash(h.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
    }
}

/// A `Stored` event of the agg worker (rank 0, device tier).
pub fn stored(event_id: u64, parent: Option<u64>, blocks: &[StoredBlock]) -> KvEventRef<'_> {
    KvEventRef {
        worker: InstanceId::new(worker()),
        dp_rank: 0,
        event_id,
        tier: Tier::Device,
        data: KvDataRef::Stored {
            parent: parent.map(EngineHash),
            blocks,
        },
    }
}
