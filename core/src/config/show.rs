//! Rendering of the effective configuration (defaults filled in) for `config show` and
//! `GET /admin/config`, with every secret masked (CFG-12).
//!
//! Invariants:
//! - `dynamo.discovery.etcd.auth.password`, `dynamo.discovery.etcd.tls.client_key` and
//!   `dynamo.event_bus.tls.key` are always rendered as `********`;
//! - token hashes (`admin.token_hash`, `brokers[].token_hash`, `auth.keys[].key_hash`) are rendered as `sha256:********`:
//!   not secrets, but there is no reason to hand out a dictionary-attackable digest;
//! - `ca_cert`, `client_cert`, `cert` and `client_ca` paths are shown verbatim;
//! - the output is valid config: durations and sizes use the config syntax — except a set
//!   `dynamo.peers.key`, rendered `********`, which no config accepts (a 128-bit key has no masked
//!   form that is also a key); `dynamo.peers` is rendered only when configured.

use serde_json::{Map, Value, json};

use super::peers::PeersConfig;

use super::dynamo::{
    Backoff, BrokerConfig, BrokerRole, DynamoConfig, EtcdConfig, EventBusConfig, FileConfig,
    KubernetesConfig, KvConfig, LoadConfig, ShimConfig,
};
use super::values::{MASK, fmt_duration};
use super::{BackendConfig, BackendRole, Config, ShardCount, TlsRoots, TokenHash};

/// The effective config as YAML.
pub(crate) fn to_yaml(c: &Config) -> String {
    // Serializing a serde_json::Value cannot fail (string keys only); fall back to JSON text.
    let v = to_json(c);
    serde_yaml_ng::to_string(&v).unwrap_or_else(|_| v.to_string())
}

/// The effective config as JSON.
pub(crate) fn to_json(c: &Config) -> Value {
    let s = &c.server;
    json!({
        "server": {
            "bind_address": s.bind_address.to_string(),
            "shards": match s.shards {
                ShardCount::Auto => json!("auto"),
                ShardCount::Fixed(n) => json!(n.get()),
            },
            "cpu_affinity": s.cpu_affinity,
            "control_cpu": s.control_cpu,
            "limits": {
                "max_body_bytes": s.max_body_bytes,
                "max_header_bytes": s.max_header_bytes,
                "max_headers": s.max_headers,
            },
            "timeouts": {
                "header_read": fmt_duration(s.header_read_timeout),
                "keepalive": fmt_duration(s.keepalive_timeout),
                "upstream_connect": fmt_duration(s.upstream.connect),
                "upstream_first_byte": fmt_duration(s.upstream.first_byte),
                "upstream_idle": fmt_duration(s.upstream.idle),
                "request_deadline": s.upstream.deadline.map(fmt_duration),
                "drain": fmt_duration(s.drain_timeout),
            },
            "connect_retries": s.connect_retries,
            "retry_budget": {
                "ratio": s.retry_budget.ratio,
                "min_retries_per_second": s.retry_budget.min_retries_per_second,
            },
        },
        "admin": { "token_hash": c.admin.token_hash.as_ref().map(masked_hash) },
        "backends": c.backends.iter().map(backend).collect::<Vec<_>>(),
        "disaggregated_serving": {
            "enabled": c.disaggregated_serving.enabled,
            "fallback_to_unified": c.disaggregated_serving.fallback_to_unified,
        },
        "dynamo": dynamo(&c.dynamo),
        "auth": c.auth.as_ref().map(|a| json!({
            "keys": a.keys.iter().map(|k| json!({
                "name": k.name.0,
                "key_hash": masked_hash(&k.key_hash),
                "allowed_models": k.allowed_models,
                "allowed_backends": k.allowed_backends.as_ref().map(|b| b.iter().map(|n| n.0.clone()).collect::<Vec<_>>()),
                "requests_per_second": k.rate.map(|r| r.requests_per_second),
                "burst": k.rate.map(|r| r.burst),
                "max_concurrent": k.max_concurrent,
            })).collect::<Vec<_>>(),
        })),
    })
}

fn masked_hash(_: &TokenHash) -> Value {
    json!(format!("sha256:{MASK}"))
}

fn backend(b: &BackendConfig) -> Value {
    json!({
        "name": b.name.0,
        "type": "openai",
        "url": b.url.to_string(),
        "role": match b.role {
            BackendRole::Unified => "unified",
            BackendRole::Prefill => "prefill",
            BackendRole::Decode => "decode",
        },
        "models": b.models,
        "weight": b.weight,
        "enabled": b.enabled,
        "internal": b.internal,
        "responses_api": b.responses_api.as_str(),
        "timeouts": {
            "upstream_connect": fmt_duration(b.timeouts.connect),
            "upstream_first_byte": fmt_duration(b.timeouts.first_byte),
            "upstream_idle": fmt_duration(b.timeouts.idle),
            "request_deadline": b.timeouts.deadline.map(fmt_duration),
        },
        "health_check": match &b.health_check {
            None => json!({ "enabled": false }),
            Some(h) => json!({
                "path": h.path,
                "interval": fmt_duration(h.interval),
                "timeout": fmt_duration(h.timeout),
                "healthy_threshold": h.healthy_threshold,
                "unhealthy_threshold": h.unhealthy_threshold,
            }),
        },
        "outlier": match &b.outlier {
            None => json!({ "enabled": false }),
            Some(o) => json!({
                "consecutive_failures": o.consecutive_failures,
                "base_ejection": fmt_duration(o.base_ejection),
                "max_ejection": fmt_duration(o.max_ejection),
                "max_ejection_percent": o.max_ejection_percent,
            }),
        },
        "tls": b.tls.as_ref().map(|t| match &t.roots {
            TlsRoots::System => json!({ "server_name": t.server_name }),
            TlsRoots::CaFile(p) => json!({ "ca_cert": p, "server_name": t.server_name }),
        }),
    })
}

fn dynamo(d: &DynamoConfig) -> Value {
    let mut v = json!({
        "enabled": d.enabled,
        "discovery": {
            "source": d.discovery.source.as_str(),
            "etcd": etcd(&d.discovery.etcd),
            "kubernetes": kubernetes(&d.discovery.kubernetes),
            "file": file(&d.discovery.file),
        },
        "load": load(&d.load),
        "shim": shim(&d.shim),
        "kv": kv(&d.kv),
        "event_bus": event_bus(&d.event_bus),
    });
    if d.peers != PeersConfig::default()
        && let Some(m) = v.as_object_mut()
    {
        m.insert("peers".into(), peers(&d.peers));
    }
    v
}

fn peers(p: &PeersConfig) -> Value {
    json!({
        "listen": p.listen.map(|a| a.to_string()),
        "replicas": p.replicas.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "key": p.key.map(|_| MASK),
    })
}

fn backoff(b: &Backoff) -> Value {
    json!({ "initial": fmt_duration(b.initial), "max": fmt_duration(b.max) })
}

fn etcd(e: &EtcdConfig) -> Value {
    let mut m = Map::new();
    m.insert(
        "endpoints".into(),
        json!(
            e.endpoints
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        ),
    );
    m.insert("namespace".into(), json!(e.namespace));
    // `namespaces` only when it differs from `[namespace]`, so the output parses back.
    if e.namespaces.len() != 1 || e.namespaces[0] != e.namespace {
        m.insert("namespaces".into(), json!(e.namespaces));
    }
    if let Some(t) = &e.tls {
        m.insert(
            "tls".into(),
            json!({
                "ca_cert": t.ca_cert,
                "client_cert": t.client_cert,
                "client_key": t.client_key.as_ref().map(|_| MASK),
                "server_name": t.server_name,
            }),
        );
    }
    if let Some(a) = &e.auth {
        m.insert(
            "auth".into(),
            json!({ "username": a.username, "password": MASK }),
        );
    }
    m.insert(
        "watch_reconnect_backoff".into(),
        backoff(&e.watch_reconnect_backoff),
    );
    Value::Object(m)
}

fn kubernetes(k: &KubernetesConfig) -> Value {
    // Empty lists are omitted so that the output parses back as the same config.
    let mut m = Map::new();
    m.insert("namespace".into(), json!(k.namespace));
    if !k.dynamo_namespaces.is_empty() {
        m.insert("dynamo_namespaces".into(), json!(k.dynamo_namespaces));
    }
    m.insert("model".into(), json!(k.model));
    if !k.models.is_empty() {
        let models: Vec<Value> = k
            .models
            .iter()
            .map(|e| {
                json!({
                    "component": e.component,
                    "model": e.model,
                    "dynamo_namespace": e.dynamo_namespace,
                })
            })
            .collect();
        m.insert("models".into(), Value::Array(models));
    }
    m.insert(
        "watch_reconnect_backoff".into(),
        backoff(&k.watch_reconnect_backoff),
    );
    m.insert("watch_timeout".into(), json!(fmt_duration(k.watch_timeout)));
    m.insert(
        "watch_idle_timeout".into(),
        json!(fmt_duration(k.watch_idle_timeout)),
    );
    Value::Object(m)
}

fn file(f: &FileConfig) -> Value {
    json!({
        "root": f.root,
        "ttl": fmt_duration(f.ttl),
        "namespaces": f.namespaces,
    })
}

fn load(l: &LoadConfig) -> Value {
    json!({
        "max_staleness": fmt_duration(l.max_staleness),
        "direct_allow_cidrs": l.direct_allow_cidrs.as_ref().map(|v| v.iter().map(ToString::to_string).collect::<Vec<_>>()),
        "transport": l.transport.as_str(),
    })
}

fn shim(s: &ShimConfig) -> Value {
    json!({
        "backends": s.backends.iter().map(|b| b.0.clone()).collect::<Vec<_>>(),
        "pools": s.pools.iter().map(|p| json!({
            "namespace": p.namespace,
            "backends": p.backends.iter().map(|b| b.0.clone()).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "model_map": s.model_map,
        "answers": s.answers.as_str(),
    })
}

fn kv(k: &KvConfig) -> Value {
    json!({
        "enabled": k.enabled,
        "allow_http_artifacts": k.allow_http_artifacts,
        "allow_hf_artifacts": k.allow_hf_artifacts,
        "pinned_artifacts": k.pinned_artifacts.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "artifact_cache_dir": k.artifact_cache_dir,
        "overlap_score_credit": k.overlap_score_credit,
        "prefill_load_scale": k.prefill_load_scale,
        "router_temperature": k.router_temperature,
        "send_token_data": k.send_token_data,
        "conditional_disaggregation": {
            "enabled": k.conditional_disaggregation.enabled,
            "decode_busy_threshold": k.conditional_disaggregation.decode_busy_threshold,
        },
    })
}

fn event_bus(e: &EventBusConfig) -> Value {
    json!({
        "enabled": e.enabled,
        "listen": e.listen.map(|a| a.to_string()),
        "tls": e.tls.as_ref().map(|t| json!({
            "cert": t.cert,
            "key": MASK,
            "client_ca": t.client_ca,
        })),
        "brokers": e.brokers.iter().map(broker).collect::<Vec<_>>(),
        "max_sessions": e.max_sessions,
        "max_streams_per_session": e.max_streams_per_session,
        "max_session_buffer_bytes": e.max_session_buffer_bytes,
        "heartbeat_interval": fmt_duration(e.heartbeat_interval),
        "idle_timeout": fmt_duration(e.idle_timeout),
    })
}

/// One broker entry; only the allow-list of its role is written, so the output parses back.
fn broker(b: &BrokerConfig) -> Value {
    let mut m = Map::new();
    m.insert("id".into(), json!(b.id));
    m.insert("role".into(), json!(b.role.as_str()));
    m.insert(
        "token_hash".into(),
        json!(b.token_hash.as_ref().map(masked_hash)),
    );
    match b.role {
        BrokerRole::Broker => m.insert("namespaces".into(), json!(b.namespaces)),
        BrokerRole::KvListener => m.insert("backends".into(), json!(b.backends)),
    };
    Value::Object(m)
}
