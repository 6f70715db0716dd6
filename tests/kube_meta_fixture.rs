//! The real Dynamo 1.6.1 records through both discovery paths, end to end: the fixture etcd
//! dump (`../shared/fixtures/dynamo-1.6.1/etcd-dump.txt`, namespaces `agg` and `disagg`, four
//! workers) is loaded into a real etcd for one router, and served as `DynamoWorkerMetadata`
//! resources of four Pods by the fake API server for another; both routers must list the same
//! workers with the same models, roles, ranks, block sizes and capacity, and the same publishers
//! (DISC-K8S-META-01, -25).
//!
//! Under Kubernetes discovery a worker's id is the hash of its Pod name, so the dump's lease ids
//! are first rewritten (hex in keys and transports, decimal in values) to the ids of four Pod
//! names; that rewritten dump is what the etcd router reads. Each record goes into the resource
//! of the Pod whose id it carries; records that carry a publisher id instead (event channels
//! and sources) go to a Pod of the same namespace, which the view does not depend on while every
//! Pod is ready.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::etcd::{EtcdServer, read_dump};
use common::kube::{FakeApiServer, endpoint_slice, pod_id, wait_workers, worker_metadata};
use common::{RouterConfig, RouterProcess, STEP};
use serde_json::{Value, json};

const DUMP: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/fixtures/dynamo-1.6.1/etcd-dump.txt"
);

/// The dump's worker leases and the Pods that stand for them.
const PODS: [(&str, &str); 4] = [
    ("6a6ca22d4998ac0b", "agg-vllmworker-7d9f8b6c5-4xk2p"),
    ("6a6ca22d4998ac16", "agg-vllmworker-7d9f8b6c5-9qzt7"),
    (
        "6a6ca22d4998ac09",
        "disagg-vllmdecodeworker-5b7c9d8f6-h2m4n",
    ),
    (
        "6a6ca22d4998ac07",
        "disagg-vllmprefillworker-6c8d7f9b5-r8w3j",
    ),
];

fn rewritten() -> Vec<(String, String)> {
    let mut kvs = read_dump(Path::new(DUMP));
    for (lease, pod) in PODS {
        let old = u64::from_str_radix(lease, 16).unwrap();
        let new = pod_id(pod);
        for (k, v) in &mut kvs {
            *k = k.replace(lease, &format!("{new:x}"));
            *v = v
                .replace(lease, &format!("{new:x}"))
                .replace(&old.to_string(), &new.to_string());
        }
    }
    kvs
}

/// The Pod whose resource carries a record.
fn owner(key: &str) -> &'static str {
    for (_, pod) in PODS {
        if key.ends_with(&format!("/{:x}", pod_id(pod))) {
            return pod;
        }
    }
    let ns = key.split('/').nth(3).unwrap();
    PODS.iter().find(|(_, p)| p.starts_with(ns)).unwrap().1
}

fn resources(kvs: &[(String, String)]) -> Vec<Value> {
    let mut by_pod: BTreeMap<&str, Value> = BTreeMap::new();
    for (k, v) in kvs {
        let (map, suffix) = [
            ("endpoints", "v1/instances/"),
            ("model_cards", "v1/mdc/"),
            ("event_channels", "v1/event_channels/"),
            ("event_sources", "v1/event_sources/"),
        ]
        .into_iter()
        .find_map(|(m, p)| Some((m, k.strip_prefix(p)?)))
        .unwrap();
        let data = by_pod
            .entry(owner(k))
            .or_insert_with(|| json!({"endpoints": {}, "model_cards": {}, "event_channels": {}, "event_sources": {}}));
        data[map][suffix] = serde_json::from_str(v).unwrap();
    }
    by_pod
        .into_iter()
        .map(|(pod, data)| {
            let mut cr = worker_metadata(pod, &data);
            cr["metadata"]["ownerReferences"] =
                json!([{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": format!("uid-{pod}")}]);
            cr
        })
        .collect()
}

/// A router with this `dynamo.discovery` body and environment.
fn router(discovery: &str, env: Vec<(String, String)>) -> RouterProcess {
    let mut cfg = RouterConfig::default()
        .backend("fe-agg", "http://127.0.0.1:9", &[])
        .backend("fe-disagg", "http://127.0.0.1:9", &[]);
    cfg.disaggregated_serving = true;
    cfg.env = env;
    cfg.extra_yaml = format!(
        "dynamo:\n  enabled: true\n  discovery:\n{discovery}  \
         load:\n    direct_allow_cidrs: [\"127.0.0.0/8\"]\n  shim:\n    pools:\n      \
         - {{ namespace: agg, backends: [fe-agg] }}\n      - {{ namespace: disagg, backends: [fe-disagg] }}\n"
    );
    RouterProcess::start(&cfg)
}

/// What both views must agree on: every worker without its timestamps and live signals, and
/// the publisher counts.
fn view(r: &RouterProcess) -> Value {
    let v = r.get("/admin/dynamo/workers").json();
    let mut workers: Vec<Value> = v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            let mut w = w.clone();
            for k in ["first_seen", "last_updated", "load", "kv"] {
                w.as_object_mut().unwrap().remove(k);
            }
            w
        })
        .collect();
    workers.sort_by_key(|w| w["worker_id"].as_str().unwrap().to_owned());
    json!({
        "workers": workers,
        "load_publishers": v["load_publishers"],
        "kv_event_publishers": v["kv_event_publishers"],
        "namespaces": v["namespaces"],
    })
}

#[test]
fn the_real_1_6_1_records_as_resources_give_the_etcd_routers_view() {
    let kvs = rewritten();
    let etcd = EtcdServer::start();
    for (k, v) in &kvs {
        etcd.put(k, v);
    }
    let api = FakeApiServer::start();
    for cr in resources(&kvs) {
        api.put("dynamoworkermetadatas", "dynamo", &cr);
    }
    let pods: Vec<&str> = PODS.iter().map(|(_, p)| *p).collect();
    let ready: Vec<(&str, bool)> = pods.iter().map(|p| (*p, true)).collect();
    api.put(
        "endpointslices",
        "dynamo",
        &endpoint_slice("dynamo-workers-x7k2q", "dynamo-workers", &ready),
    );
    let by_etcd = router(
        &format!(
            "    source: etcd\n    etcd:\n      endpoints: [\"{}\"]\n      namespaces: [agg, disagg]\n",
            etcd.endpoint()
        ),
        Vec::new(),
    );
    let by_kube = router(
        "    source: kubernetes\n    kubernetes:\n      namespace: dynamo\n      \
         dynamo_namespaces: [agg, disagg]\n",
        vec![(
            "KUBECONFIG".into(),
            api.kubeconfig().to_string_lossy().into_owned(),
        )],
    );
    wait_workers(&by_etcd, &pods, STEP);
    wait_workers(&by_kube, &pods, STEP);
    // The publishers arrive with the same snapshots; give both a moment to settle equal.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (a, b) = (view(&by_etcd), view(&by_kube));
        if a == b {
            // And it is the fleet: models and roles from the real cards.
            let models: Vec<&str> = a["workers"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|w| w["model"].as_str())
                .collect();
            assert_eq!(models.len(), 4, "{a:#}");
            assert!(models.contains(&"tiny-agg") && models.contains(&"tiny-disagg"));
            assert!(a["load_publishers"].as_u64().unwrap() >= 3, "{a:#}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "views differ:\netcd: {a:#}\nkubernetes: {b:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
