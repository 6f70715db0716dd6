#![cfg(feature = "dynamo")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
//! End-to-end test of `dynamo.discovery.source: file`: the router binary reads a
//! directory written exactly as Dynamo's FileStore writes it (bucket directories, percent-encoded
//! file names, temp file then rename) with the recorded Dynamo 1.6.1 fleet, and the result is
//! read through `GET /admin/dynamo/workers`. Every wait is a poll against a deadline.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::filestore::{file_of, write_fixture};
use common::{RouterConfig, RouterProcess, STEP, TempDir};
use serde_json::Value;

const WORKERS: &str = "/admin/dynamo/workers";
/// The frontends are never called here.
const FRONTEND_URL: &str = "http://127.0.0.1:9";

fn router_config(root: &Path) -> RouterConfig {
    let mut cfg = RouterConfig::default()
        .backend("fe-agg", FRONTEND_URL, &["tiny-agg"])
        .backend("fe-disagg", FRONTEND_URL, &["tiny-disagg"]);
    cfg.disaggregated_serving = true;
    let root = Value::String(root.display().to_string());
    cfg.extra_yaml = format!(
        "dynamo:\n  enabled: true\n  discovery:\n    source: file\n    file:\n      root: {root}\n      \
         ttl: 10m\n      namespaces: [agg, disagg]\n  shim:\n    pools:\n      \
         - {{ namespace: agg, backends: [fe-agg] }}\n      \
         - {{ namespace: disagg, backends: [fe-disagg] }}\n"
    );
    cfg
}

fn wait_view(r: &RouterProcess, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + STEP;
    loop {
        let resp = r.get(WORKERS);
        assert_eq!(resp.status, 200, "{WORKERS}: {}", resp.text());
        let v = resp.json();
        if pred(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "waited {STEP:?} for {what}; last view:\n{v:#}\nrouter stderr:\n{}",
            r.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn count(v: &Value) -> usize {
    v["workers"].as_array().map_or(0, Vec::len)
}

#[test]
fn file_source_serves_the_fixture_fleet_and_follows_the_directory() {
    let dir = TempDir::new("file-store");
    // The root does not exist when the router starts: it must not create it.
    let root = dir.path().join("dynamo_store_kv");
    let r = RouterProcess::start(&router_config(&root));
    let v = wait_view(&r, "an empty, connected file source", |v| {
        v["connected"] == true && count(v) == 0
    });
    assert_eq!(v["source"], "file");
    assert_eq!(v["signals"]["load"], true);
    assert_eq!(v["signals"]["capacity"], true);
    assert_eq!(v["namespaces"], serde_json::json!(["agg", "disagg"]));
    assert!(!root.exists(), "the router created the store root");

    write_fixture(&root);
    let v = wait_view(&r, "the 4 fixture workers", |v| count(v) == 4);
    assert_eq!(
        v["load_publishers"].as_u64().map(|n| n > 0),
        Some(true),
        "{v:#}"
    );

    std::fs::remove_file(file_of(
        &root,
        "v1/instances/agg/backend/generate/6a6ca22d4998ac16",
    ))
    .unwrap();
    let v = wait_view(&r, "the deleted worker gone", |v| count(v) == 3);
    assert!(
        v["workers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w["instance_id"] != "6a6ca22d4998ac16"),
        "{v:#}"
    );
}
