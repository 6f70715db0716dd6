//! Shared helpers of the discovery end-to-end tests against a real etcd
//! (`tests/discovery_etcd.rs`, `tests/discovery_reload.rs`): the fixture fleet, router configs
//! with discovery, and waits on the admin view and the discovery metrics.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::etcd::{EtcdServer, read_dump};
use super::{RouterConfig, RouterProcess, STEP, metric_value};

pub const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/fixtures/dynamo-1.6.1/etcd-dump.txt"
);
pub const CONNECTED: &str = "continuum_dynamo_discovery_connected";
pub const EVENTS: &str = "continuum_dynamo_discovery_events_total";
pub const WORKERS: &str = "/admin/dynamo/workers";
/// The frontends are never called here (port 9, discard: nothing listens on loopback).
pub const FRONTEND_URL: &str = "http://127.0.0.1:9";

/// The fixture's workers: (namespace, instance id hex, component, role, model).
pub const FIXTURE_WORKERS: [(&str, &str, &str, &str, &str); 4] = [
    (
        "agg",
        "6a6ca22d4998ac0b",
        "backend",
        "aggregated",
        "tiny-agg",
    ),
    (
        "agg",
        "6a6ca22d4998ac16",
        "backend",
        "aggregated",
        "tiny-agg",
    ),
    (
        "disagg",
        "6a6ca22d4998ac07",
        "prefill",
        "prefill",
        "tiny-disagg",
    ),
    (
        "disagg",
        "6a6ca22d4998ac09",
        "backend",
        "decode",
        "tiny-disagg",
    ),
];

// ---------------------------------------------------------------------------------------------
// Config

/// What the `dynamo:` section of a test config holds.
pub struct Discovery<'a> {
    pub etcd: &'a EtcdServer,
    pub enabled: bool,
    pub namespaces: Vec<&'static str>,
    /// `auth.username`; the password is `${<password_env>}` from the router's environment.
    pub auth_user: Option<&'static str>,
    /// The environment variable named in `auth.password`.
    pub password_env: &'static str,
    /// `watch_reconnect_backoff.initial`.
    pub backoff_initial: &'static str,
}

impl<'a> Discovery<'a> {
    pub fn new(etcd: &'a EtcdServer) -> Self {
        Discovery {
            etcd,
            enabled: true,
            namespaces: vec!["agg", "disagg"],
            auth_user: None,
            password_env: "ETCD_PASSWORD",
            backoff_initial: "100ms",
        }
    }
}

pub fn q(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// The router config: one frontend backend per namespace, the shim pools matching the
/// namespaces, discovery from `d.etcd`.
pub fn router_config(d: &Discovery<'_>) -> RouterConfig {
    let mut cfg = RouterConfig::default()
        .backend("fe-agg", FRONTEND_URL, &["tiny-agg"])
        .backend("fe-disagg", FRONTEND_URL, &["tiny-disagg"]);
    cfg.disaggregated_serving = true;
    let mut y = String::from("dynamo:\n");
    y.push_str(&format!("  enabled: {}\n", d.enabled));
    y.push_str("  discovery:\n    source: etcd\n    etcd:\n");
    y.push_str(&format!("      endpoints: [{}]\n", q(&d.etcd.endpoint())));
    let ns: Vec<String> = d.namespaces.iter().map(|n| q(n)).collect();
    y.push_str(&format!("      namespaces: [{}]\n", ns.join(", ")));
    y.push_str(&format!(
        "      watch_reconnect_backoff: {{ initial: {}, max: \"1s\" }}\n",
        q(d.backoff_initial)
    ));
    if let Some(user) = d.auth_user {
        y.push_str(&format!(
            "      auth: {{ username: {}, password: \"${{{}}}\" }}\n",
            q(user),
            d.password_env
        ));
    }
    if let Some(t) = d.etcd.tls_files() {
        y.push_str(&format!(
            "      tls: {{ ca_cert: {}, client_cert: {}, client_key: {} }}\n",
            q(&t.ca_cert.display().to_string()),
            q(&t.client_cert.display().to_string()),
            q(&t.client_key.display().to_string())
        ));
    }
    y.push_str("  shim:\n    pools:\n");
    for n in &d.namespaces {
        let backend = if *n == "agg" { "fe-agg" } else { "fe-disagg" };
        y.push_str(&format!(
            "      - {{ namespace: {}, backends: [{}] }}\n",
            q(n),
            q(backend)
        ));
    }
    cfg.extra_yaml = y;
    cfg
}

// ---------------------------------------------------------------------------------------------
// Reading the router

pub fn view(r: &RouterProcess) -> Value {
    let resp = r.get(WORKERS);
    assert_eq!(
        resp.status,
        200,
        "{WORKERS} answered {}: {}",
        resp.status,
        resp.text()
    );
    resp.json()
}

/// Polls the admin view until `pred` holds; returns that view, or panics after `timeout`.
pub fn wait_view(
    r: &RouterProcess,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let v = view(r);
        if pred(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "waited {timeout:?} for {what}; last view:\n{v:#}\nrouter stderr:\n{}",
            r.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The hex instance ids in a view.
pub fn ids(v: &Value) -> BTreeSet<String> {
    v["workers"]
        .as_array()
        .unwrap_or_else(|| panic!("no workers array in {v}"))
        .iter()
        .map(|w| {
            w["instance_id"]
                .as_str()
                .expect("hex instance_id")
                .to_owned()
        })
        .collect()
}

pub fn set(hex: &[&str]) -> BTreeSet<String> {
    hex.iter().map(|s| (*s).to_owned()).collect()
}

pub fn fixture_ids() -> BTreeSet<String> {
    FIXTURE_WORKERS.iter().map(|w| w.1.to_owned()).collect()
}

pub fn worker<'v>(v: &'v Value, hex: &str) -> &'v Value {
    v["workers"]
        .as_array()
        .and_then(|ws| ws.iter().find(|w| w["instance_id"] == hex))
        .unwrap_or_else(|| panic!("worker {hex} not in view {v:#}"))
}

pub fn metric(r: &RouterProcess, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(&r.metrics(), name, labels).unwrap_or(0.0)
}

/// Polls `/metrics` until `name{labels}` equals `want`.
pub fn wait_metric_eq(r: &RouterProcess, name: &str, labels: &[(&str, &str)], want: f64) {
    let deadline = Instant::now() + STEP;
    loop {
        let v = metric(r, name, labels);
        if v == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name}{labels:?} stayed {v} (want {want}) for {STEP:?}; router stderr:\n{}",
            r.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until discovery is connected and the view holds exactly `want`.
pub fn wait_fleet(r: &RouterProcess, want: &BTreeSet<String>) -> Value {
    wait_view(r, &format!("connected with workers {want:?}"), STEP, |v| {
        v["connected"] == true && ids(v) == *want
    })
}

// ---------------------------------------------------------------------------------------------
// Records modelled on the fixture

pub fn fixture_pairs() -> Vec<(String, String)> {
    read_dump(Path::new(FIXTURE))
}

pub fn fixture_value(key: &str) -> String {
    fixture_pairs()
        .into_iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("{key} not in the fixture"))
        .1
}

/// A new worker's `generate` Endpoint record and base card, modelled on the fixture's
/// `agg/backend` worker `6a6ca22d4998ac0b`, under a new lease id.
pub struct NewWorker {
    pub id: u64,
    pub instance_key: String,
    pub instance_value: String,
    pub card_key: String,
    pub card_value: String,
}

pub fn new_worker(ns: &str, id: u64, model: &str, total_kv_blocks: u64) -> NewWorker {
    let hex = format!("{id:x}");
    let mut inst: Value = serde_json::from_str(&fixture_value(
        "v1/instances/agg/backend/generate/6a6ca22d4998ac0b",
    ))
    .unwrap();
    inst["namespace"] = json!(ns);
    inst["instance_id"] = json!(id);
    inst["transport"] = json!({"tcp": format!("127.0.0.1:35917/{hex}/{ns}/backend/generate")});
    let mut card: Value = serde_json::from_str(&fixture_value(
        "v1/mdc/agg/backend/generate/6a6ca22d4998ac0b",
    ))
    .unwrap();
    card["namespace"] = json!(ns);
    card["instance_id"] = json!(id);
    card["card_json"]["display_name"] = json!(model);
    card["card_json"]["slug"] = json!(model);
    card["card_json"]["runtime_config"]["total_kv_blocks"] = json!(total_kv_blocks);
    NewWorker {
        id,
        instance_key: format!("v1/instances/{ns}/backend/generate/{hex}"),
        instance_value: inst.to_string(),
        card_key: format!("v1/mdc/{ns}/backend/generate/{hex}"),
        card_value: card.to_string(),
    }
}

impl NewWorker {
    pub fn hex(&self) -> String {
        format!("{:x}", self.id)
    }

    pub fn put(&self, etcd: &EtcdServer) {
        etcd.put(&self.instance_key, &self.instance_value);
        etcd.put(&self.card_key, &self.card_value);
    }
}

/// etcd loaded with the fixture, and a router watching it.
pub fn fixture_setup() -> (EtcdServer, RouterProcess) {
    let etcd = EtcdServer::start();
    etcd.load_dump(Path::new(FIXTURE));
    let r = RouterProcess::start(&router_config(&Discovery::new(&etcd)));
    wait_fleet(&r, &fixture_ids());
    (etcd, r)
}

// ---------------------------------------------------------------------------------------------
// Tests
