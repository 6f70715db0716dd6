//! Conversion of `dynamo.load`, `dynamo.shim`, `dynamo.kv` and `dynamo.event_bus`, with the
//! rules local to each: CFG-15, CFG-17, CFG-19, CFG-29, the shape half of CFG-16/CFG-23,
//! KV-PICK-16, KV-TOK-07, BUS-21, BUS-28, BUS-38, BUS-39.
//!
//! Invariants: findings go to the [`Ctx`] with their dotted paths; rules that need other
//! sections (backend references, port overlap, namespace coverage) live in
//! [`super::validate`].

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;

use super::BackendName;
use super::addr::parse_socket_addr;
use super::convert_namespace::check_namespace;
use super::dynamo::{
    Blake3Digest, BrokerConfig, BrokerRole, ConditionalDisaggregation, EventBusConfig, EventBusTls,
    KvConfig, LoadConfig, LoadTransport, MAX_DYNAMO_NAMESPACES, Secret, ShimAnswers, ShimConfig,
    ShimPool,
};
use super::peers::{MAX_PEERS, PeersConfig, parse_key};
use super::scalar::Scalar;
use super::user_dynamo::{UserBroker, UserEventBus, UserKv, UserLoad, UserPeers, UserShim};
use super::values::{Ctx, MISSING, index, interpolate, join, parse_hex_digest};

/// Most `direct_allow_cidrs` entries (CFG-19).
const MAX_CIDRS: usize = 64;
/// Most `shim.backends` entries and backends per pool (CFG-16).
const MAX_SHIM_BACKENDS: usize = 64;
/// Most `model_map` pairs (CFG-17).
const MAX_MODEL_MAP: usize = 1024;
/// Upper bound of the KV cost weights and the temperature.
const MAX_KV_WEIGHT: f64 = 100.0;

/// `dynamo.load`.
pub(crate) fn load(ctx: &mut Ctx<'_>, u: Option<&UserLoad>) -> LoadConfig {
    let d = LoadConfig::default();
    let Some(u) = u else { return d };
    // CFG-15.
    let max_staleness = ctx.duration(
        "dynamo.load.max_staleness",
        u.max_staleness.as_ref(),
        d.max_staleness,
        Duration::from_millis(100),
        Duration::from_secs(300),
    );
    // CFG-19.
    let direct_allow_cidrs = u.direct_allow_cidrs.as_ref().map(|list| {
        const F: &str = "dynamo.load.direct_allow_cidrs";
        if list.len() > MAX_CIDRS {
            ctx.error(
                F,
                format!("{} entries", list.len()),
                format!("at most {MAX_CIDRS} CIDRs"),
            );
        }
        if list.is_empty() {
            ctx.warn(F, "an empty list denies every direct publisher connection");
        }
        let mut out = Vec::new();
        for (i, s) in list.iter().enumerate() {
            let f = index(F, i);
            let Some(text) = ctx.string(&f, Some(s)) else {
                continue;
            };
            match text.parse::<IpNet>() {
                Ok(net) => out.push(net),
                Err(_) => ctx.error(
                    &f,
                    &text,
                    "must be an IPv4 or IPv6 CIDR (e.g. 10.0.0.0/8, fd00::/8)",
                ),
            }
        }
        out
    });
    let transport = match &u.transport {
        None => d.transport,
        Some(Scalar::Str(s)) if s == "direct" => LoadTransport::Direct,
        Some(Scalar::Str(s)) if s == "broker" => LoadTransport::Broker,
        Some(s) => {
            ctx.error("dynamo.load.transport", s, "must be direct or broker");
            d.transport
        }
    };
    LoadConfig {
        max_staleness,
        direct_allow_cidrs,
        transport,
    }
}

/// A list of backend names (non-empty strings, unique within the list, at most 64).
fn backend_names(ctx: &mut Ctx<'_>, field: &str, list: &[Scalar]) -> Vec<BackendName> {
    if list.len() > MAX_SHIM_BACKENDS {
        ctx.error(
            field,
            format!("{} entries", list.len()),
            format!("at most {MAX_SHIM_BACKENDS} backends"),
        );
    }
    let mut out: Vec<BackendName> = Vec::new();
    for (i, s) in list.iter().enumerate() {
        let f = index(field, i);
        let Some(name) = ctx.string(&f, Some(s)) else {
            continue;
        };
        if out.iter().any(|b| b.0 == name) {
            ctx.error(&f, &name, "duplicate backend");
        } else {
            out.push(BackendName(name));
        }
    }
    out
}

/// `dynamo.shim` (shape only; references are checked in `validate`).
pub(crate) fn shim(ctx: &mut Ctx<'_>, u: Option<&UserShim>) -> ShimConfig {
    let Some(u) = u else {
        return ShimConfig::default();
    };
    let backends = backend_names(
        ctx,
        "dynamo.shim.backends",
        u.backends.as_deref().unwrap_or(&[]),
    );
    let mut pools = Vec::new();
    if let Some(list) = &u.pools {
        if list.len() > MAX_DYNAMO_NAMESPACES {
            ctx.error(
                "dynamo.shim.pools",
                format!("{} entries", list.len()),
                format!("at most {MAX_DYNAMO_NAMESPACES} pools (one per namespace)"),
            );
        }
        for (i, p) in list.iter().enumerate() {
            let base = index("dynamo.shim.pools", i);
            let nf = join(&base, "namespace");
            let namespace = match &p.namespace {
                None => {
                    ctx.error(&nf, MISSING, "is required");
                    None
                }
                Some(s) => check_namespace(ctx, &nf, s),
            };
            let bf = join(&base, "backends");
            let backends = match &p.backends {
                None => {
                    ctx.error(&bf, MISSING, "is required");
                    Vec::new()
                }
                Some(l) if l.is_empty() => {
                    ctx.error(&bf, "[]", "a pool needs at least 1 backend");
                    Vec::new()
                }
                Some(l) => backend_names(ctx, &bf, l),
            };
            if let Some(namespace) = namespace {
                pools.push(ShimPool {
                    namespace,
                    backends,
                });
            }
        }
    }
    // CFG-17.
    let mut model_map = BTreeMap::new();
    if let Some(map) = &u.model_map {
        if map.len() > MAX_MODEL_MAP {
            ctx.error(
                "dynamo.shim.model_map",
                format!("{} pairs", map.len()),
                format!("at most {MAX_MODEL_MAP} pairs"),
            );
        }
        for (k, v) in map {
            let f = if k.is_empty() {
                "dynamo.shim.model_map.\"\"".to_owned()
            } else {
                join("dynamo.shim.model_map", k)
            };
            if k.trim().is_empty() {
                ctx.error(&f, k, "client model id (key) must not be empty");
                continue;
            }
            match ctx.string(&f, Some(v)) {
                Some(val) if val.trim().is_empty() => {
                    ctx.error(&f, "\"\"", "Dynamo display_name (value) must not be empty")
                }
                Some(val) => {
                    model_map.insert(k.clone(), val);
                }
                None => {}
            }
        }
    }
    let answers = match &u.answers {
        None => ShimAnswers::default(),
        Some(Scalar::Str(s)) if s == "dynamo_1_6" => ShimAnswers::Dynamo16,
        Some(Scalar::Str(s)) if s == "strict" => ShimAnswers::Strict,
        Some(s) => {
            ctx.error(
                "dynamo.shim.answers",
                s,
                "must be dynamo_1_6 (the 1.6 frontend's documented client errors are relayed) \
                 or strict (every non-2xx answer is a shim failure)",
            );
            ShimAnswers::default()
        }
    };
    ShimConfig {
        backends,
        pools,
        model_map,
        answers,
    }
}

/// `dynamo.kv` (KV-PICK-16, KV-TOK-07, CFG-29, Q-42 ranges).
pub(crate) fn kv(ctx: &mut Ctx<'_>, u: Option<&UserKv>) -> KvConfig {
    let d = KvConfig::default();
    let Some(u) = u else { return d };
    let f = |k: &str| join("dynamo.kv", k);
    let mut pinned_artifacts: Vec<Blake3Digest> = Vec::new();
    for (i, s) in u.pinned_artifacts.iter().flatten().enumerate() {
        let fi = index(&f("pinned_artifacts"), i);
        match s.as_str().and_then(|t| parse_hex_digest(t, "blake3:")) {
            Some(bytes) => {
                let dg = Blake3Digest(bytes);
                if pinned_artifacts.contains(&dg) {
                    ctx.warn(&fi, "duplicate pinned artifact");
                } else {
                    pinned_artifacts.push(dg);
                }
            }
            None => ctx.error(
                &fi,
                s,
                "must be \"blake3:\" followed by 64 lowercase hex digits",
            ),
        }
    }
    let c = u.conditional_disaggregation.as_ref();
    let cf = |k: &str| join("dynamo.kv.conditional_disaggregation", k);
    let conditional_disaggregation = ConditionalDisaggregation {
        enabled: ctx.bool(&cf("enabled"), c.and_then(|c| c.enabled.as_ref()), false),
        decode_busy_threshold: ctx.opt_float(
            &cf("decode_busy_threshold"),
            c.and_then(|c| c.decode_busy_threshold.as_ref()),
            0.0,
            1.0,
        ),
    };
    if conditional_disaggregation.enabled {
        // CFG-29 / KV-PICK-15.
        ctx.warn(
            &cf("enabled"),
            "Dynamo 1.5.x frontends in --router-mode direct reject requests without a prefill id \
             while prefill workers are registered (503 disaggregated_prefill_decode_unavailable); \
             enable only against frontends that accept decode-only pins",
        );
    }
    KvConfig {
        enabled: ctx.bool(&f("enabled"), u.enabled.as_ref(), d.enabled),
        allow_http_artifacts: ctx.bool(
            &f("allow_http_artifacts"),
            u.allow_http_artifacts.as_ref(),
            d.allow_http_artifacts,
        ),
        allow_hf_artifacts: ctx.bool(
            &f("allow_hf_artifacts"),
            u.allow_hf_artifacts.as_ref(),
            d.allow_hf_artifacts,
        ),
        pinned_artifacts,
        artifact_cache_dir: ctx.path(&f("artifact_cache_dir"), u.artifact_cache_dir.as_ref()),
        overlap_score_credit: ctx.float(
            &f("overlap_score_credit"),
            u.overlap_score_credit.as_ref(),
            d.overlap_score_credit,
            0.0,
            MAX_KV_WEIGHT,
        ),
        prefill_load_scale: ctx.float(
            &f("prefill_load_scale"),
            u.prefill_load_scale.as_ref(),
            d.prefill_load_scale,
            0.0,
            MAX_KV_WEIGHT,
        ),
        router_temperature: ctx.float(
            &f("router_temperature"),
            u.router_temperature.as_ref(),
            d.router_temperature,
            0.0,
            MAX_KV_WEIGHT,
        ),
        send_token_data: ctx.bool(&f("send_token_data"), u.send_token_data.as_ref(), false),
        conditional_disaggregation,
    }
}

/// A broker id: lowercase DNS name (`[a-z0-9-]` labels separated by `.`), no wildcard, since a
/// client certificate's DNS SAN must equal it (BUS-13).
fn valid_broker_id(id: &str) -> bool {
    (1..=253).contains(&id.len())
        && id.split('.').all(|l| {
            (1..=63).contains(&l.len())
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// `dynamo.event_bus` (BUS-38, BUS-21, BUS-28, BUS-39).
pub(crate) fn event_bus(ctx: &mut Ctx<'_>, u: Option<&UserEventBus>) -> EventBusConfig {
    const BASE: &str = "dynamo.event_bus";
    let d = EventBusConfig::default();
    let Some(u) = u else { return d };
    let f = |k: &str| join(BASE, k);
    let enabled = ctx.bool(&f("enabled"), u.enabled.as_ref(), false);
    let listen = match ctx.string(&f("listen"), u.listen.as_ref()) {
        Some(text) => match super::addr::parse_socket_addr(&text) {
            Ok(a) if a.port() == 0 => {
                ctx.error(&f("listen"), &text, "needs an explicit non-zero port");
                None
            }
            Ok(a) => Some(a),
            Err(reason) => {
                ctx.error(&f("listen"), &text, reason);
                None
            }
        },
        None => None,
    };
    if enabled && u.listen.is_none() {
        ctx.error(
            &f("listen"),
            MISSING,
            "is required when event_bus.enabled is true",
        );
    }
    let tls = u.tls.as_ref().and_then(|t| {
        let tf = |k: &str| join(&join(BASE, "tls"), k);
        let cert = ctx.path(&tf("cert"), t.cert.as_ref());
        if t.cert.is_none() {
            ctx.error(&tf("cert"), MISSING, "is required");
        }
        let key = match &t.key {
            Some(Scalar::Str(s)) if !s.trim().is_empty() => Some(Secret::new(s.clone())),
            Some(_) => {
                ctx.error_masked(&tf("key"), "must be a non-empty path");
                None
            }
            None => {
                ctx.error(&tf("key"), MISSING, "is required");
                None
            }
        };
        let client_ca = ctx.path(&tf("client_ca"), t.client_ca.as_ref());
        Some(EventBusTls {
            cert: cert?,
            key: key?,
            client_ca,
        })
    });
    if enabled && u.tls.is_none() {
        ctx.error(
            &f("tls"),
            MISSING,
            "is required when event_bus.enabled is true (TLS 1.3 only)",
        );
    }
    let has_client_ca = tls.as_ref().is_some_and(|t| t.client_ca.is_some());
    let brokers = brokers(ctx, u.brokers.as_deref().unwrap_or(&[]), has_client_ca);
    if enabled && brokers.is_empty() {
        ctx.warn(
            &f("brokers"),
            "no brokers configured: every session will be refused",
        );
    }
    let max_sessions = ctx.uint(
        &f("max_sessions"),
        u.max_sessions.as_ref(),
        u64::from(d.max_sessions),
        1,
        4096,
    ) as u32;
    let max_streams_per_session = ctx.uint(
        &f("max_streams_per_session"),
        u.max_streams_per_session.as_ref(),
        u64::from(d.max_streams_per_session),
        1,
        65536,
    ) as u32;
    let max_session_buffer_bytes = ctx.size(
        &f("max_session_buffer_bytes"),
        u.max_session_buffer_bytes.as_ref(),
        d.max_session_buffer_bytes,
        64 << 10,
        16 << 30,
    );
    // BUS-28: at least 64 KiB per stream.
    let floor = u64::from(max_streams_per_session) * (64 << 10);
    if max_session_buffer_bytes < floor {
        let shown = u.max_session_buffer_bytes.as_ref().map_or_else(
            || d.max_session_buffer_bytes.to_string(),
            ToString::to_string,
        );
        ctx.error(
            &f("max_session_buffer_bytes"),
            shown,
            format!(
                "must be at least max_streams_per_session × 64 KiB = {floor} bytes \
                 ({max_streams_per_session} streams)"
            ),
        );
    }
    let (lo, hi) = (Duration::from_millis(100), Duration::from_secs(3600));
    let heartbeat_interval = ctx.duration(
        &f("heartbeat_interval"),
        u.heartbeat_interval.as_ref(),
        d.heartbeat_interval,
        lo,
        hi,
    );
    let idle_timeout = ctx.duration(
        &f("idle_timeout"),
        u.idle_timeout.as_ref(),
        d.idle_timeout,
        lo,
        hi,
    );
    if idle_timeout <= heartbeat_interval {
        ctx.warn(
            &f("idle_timeout"),
            "idle_timeout is not longer than heartbeat_interval: idle sessions may be closed \
             between heartbeats",
        );
    }
    EventBusConfig {
        enabled,
        listen,
        tls,
        brokers,
        max_sessions,
        max_streams_per_session,
        max_session_buffer_bytes,
        heartbeat_interval,
        idle_timeout,
    }
}

/// `dynamo.event_bus.brokers[]`.
fn brokers(ctx: &mut Ctx<'_>, list: &[UserBroker], has_client_ca: bool) -> Vec<BrokerConfig> {
    let mut ids = HashSet::new();
    let mut out = Vec::new();
    for (i, b) in list.iter().enumerate() {
        let base = index("dynamo.event_bus.brokers", i);
        let f = |k: &str| join(&base, k);
        let id = match ctx.required_string(&f("id"), b.id.as_ref()) {
            Some(id) if !valid_broker_id(&id) => {
                ctx.error(
                    &f("id"),
                    &id,
                    "must be a lowercase DNS name without wildcard (it must equal the client \
                     certificate's DNS SAN)",
                );
                None
            }
            Some(id) if !ids.insert(id.clone()) => {
                ctx.error(&f("id"), &id, "duplicate broker id");
                None
            }
            other => other,
        };
        let role = match &b.role {
            None => BrokerRole::Broker,
            Some(Scalar::Str(s)) if s == "broker" => BrokerRole::Broker,
            Some(Scalar::Str(s)) if s == "kv_listener" => BrokerRole::KvListener,
            Some(s) => {
                ctx.error(&f("role"), s, "must be broker or kv_listener");
                BrokerRole::Broker
            }
        };
        let token_hash = ctx.token_hash(&f("token_hash"), b.token_hash.as_ref());
        if b.token_hash.is_none() && !has_client_ca {
            ctx.error(
                &f("token_hash"),
                MISSING,
                "a broker needs a token_hash, or event_bus.tls.client_ca for certificate auth",
            );
        }
        let mut namespaces: Vec<String> = Vec::new();
        for (j, s) in b.namespaces.iter().flatten().enumerate() {
            let nf = index(&f("namespaces"), j);
            if let Some(ns) = check_namespace(ctx, &nf, s) {
                if namespaces.contains(&ns) {
                    ctx.error(&nf, &ns, "duplicate namespace");
                } else {
                    namespaces.push(ns);
                }
            }
        }
        let mut backends: Vec<String> = Vec::new();
        for (j, s) in b.backends.iter().flatten().enumerate() {
            let bf = index(&f("backends"), j);
            match ctx.string(&bf, Some(s)) {
                Some(n) if n.is_empty() => ctx.error(&bf, "\"\"", "must not be empty"),
                Some(n) if backends.contains(&n) => ctx.error(&bf, &n, "duplicate backend"),
                Some(n) => backends.push(n),
                None => {}
            }
        }
        match role {
            BrokerRole::Broker => {
                if b.backends.is_some() {
                    ctx.error(
                        &f("backends"),
                        "[..]",
                        "backends applies to role kv_listener only",
                    );
                }
                if namespaces.is_empty() {
                    // BUS-21.
                    ctx.warn(
                        &f("namespaces"),
                        "empty namespaces allow-list: this broker may declare every Dynamo \
                         namespace",
                    );
                }
            }
            BrokerRole::KvListener => {
                if b.namespaces.is_some() {
                    ctx.error(
                        &f("namespaces"),
                        "[..]",
                        "namespaces applies to role broker only",
                    );
                }
                if backends.is_empty() {
                    ctx.warn(
                        &f("backends"),
                        "a kv_listener without backends can never receive a stream",
                    );
                }
            }
        }
        if let Some(id) = id {
            out.push(BrokerConfig {
                id,
                role,
                token_hash,
                namespaces,
                backends,
            });
        }
    }
    out
}

/// `dynamo.peers`.
pub(crate) fn peers(ctx: &mut Ctx<'_>, u: Option<&UserPeers>) -> PeersConfig {
    const BASE: &str = "dynamo.peers";
    let Some(u) = u else {
        return PeersConfig::default();
    };
    let f = |k: &str| join(BASE, k);
    let addr = |ctx: &mut Ctx<'_>, field: &str, v: &Scalar| -> Option<SocketAddr> {
        let text = ctx.string(field, Some(v))?;
        match parse_socket_addr(&text) {
            Ok(a) if a.port() == 0 => {
                ctx.error(field, &text, "needs an explicit non-zero port");
                None
            }
            Ok(a) => Some(a),
            Err(reason) => {
                ctx.error(field, &text, reason);
                None
            }
        }
    };
    let listen = u.listen.as_ref().and_then(|v| addr(ctx, &f("listen"), v));
    let mut replicas: Vec<SocketAddr> = Vec::new();
    let given = u.replicas.as_deref().unwrap_or(&[]);
    if given.len() > MAX_PEERS {
        ctx.error(
            &f("replicas"),
            given.len(),
            format!("at most {MAX_PEERS} replicas"),
        );
    }
    for (i, v) in given.iter().enumerate().take(MAX_PEERS) {
        let field = format!("{}[{i}]", f("replicas"));
        let Some(a) = addr(ctx, &field, v) else {
            continue;
        };
        if replicas.contains(&a) {
            ctx.error(&field, a, "is listed twice");
        } else if Some(a) == listen {
            ctx.error(&field, a, "is this replica's own listen address");
        } else {
            replicas.push(a);
        }
    }
    let key = match &u.key {
        Some(Scalar::Str(s)) => interpolate(ctx, &f("key"), s).and_then(|text| {
            parse_key(&text)
                .map_err(|reason| ctx.error_masked(&f("key"), reason))
                .ok()
        }),
        Some(_) => {
            ctx.error_masked(&f("key"), "must be a string of 32 hex digits");
            None
        }
        None => None,
    };
    let on = u.listen.is_some() || !given.is_empty();
    if on {
        if u.listen.is_none() {
            ctx.error(
                &f("listen"),
                MISSING,
                "is required with dynamo.peers.replicas",
            );
        }
        if given.is_empty() {
            ctx.error(&f("replicas"), MISSING, "needs at least one other replica");
        }
        if u.key.is_none() {
            ctx.error(
                &f("key"),
                MISSING,
                "is required: every datagram is authenticated",
            );
        }
    }
    PeersConfig {
        listen,
        replicas,
        key,
    }
}
