//! Fixture equivalence (DISC-K8S-META-25, TEST-09): the real Dynamo 1.6.1 etcd dump
//! (`../shared/fixtures/dynamo-1.6.1/etcd-dump.txt`) and the same records published as
//! `DynamoWorkerMetadata` resources of four Pods give the same fleet view.
//!
//! Under Kubernetes discovery a worker's id is the hash of its Pod name, not an etcd lease, so
//! the dump's four lease ids are first rewritten, in keys and values alike, to the ids of four
//! Pod names shaped like the operator's; that rewritten dump is the etcd side. The resource side
//! groups the same key/value pairs by Pod (endpoint and card records by their id, event sources
//! by their worker, event channels with their kv-events source or with a Pod of their
//! component) into one resource per Pod, each value the dump's text unchanged, and lists every
//! Pod ready in one EndpointSlice.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;

use super::*;
use crate::discovery::fleet::FleetView;
use crate::discovery::ids::UnixMillis;
use crate::discovery::pod_hash::hash_pod_name;
use crate::discovery::reducer::{KvEvent, Reducer};

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

fn dump() -> Vec<(String, String)> {
    let path = format!(
        "{}/../../shared/fixtures/dynamo-1.6.1/etcd-dump.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("fixture {path} is missing ({e})"));
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .map(|kv| (kv[0].to_owned(), kv[1].to_owned()))
        .collect()
}

/// The dump with every lease id (hex in keys and transports, decimal in values) replaced by
/// its Pod's id.
fn rewritten() -> Vec<(String, String)> {
    let mut kvs = dump();
    for (lease, pod) in PODS {
        let old = u64::from_str_radix(lease, 16).unwrap();
        let new = hash_pod_name(pod).get();
        for (k, v) in &mut kvs {
            *k = k.replace(lease, &format!("{new:x}"));
            *v = v
                .replace(lease, &format!("{new:x}"))
                .replace(&old.to_string(), &new.to_string());
        }
    }
    kvs
}

fn reduce(kvs: &[(KeyBytes, ValueBytes)]) -> Arc<FleetView> {
    let mut r = Reducer::new();
    r.begin_resync();
    for (k, v) in kvs {
        r.apply(KvEvent::Put { key: k, value: v }, UnixMillis(1));
    }
    r.end_resync();
    r.materialize()
}

fn as_records(kvs: &[(String, String)]) -> State {
    kvs.iter()
        .map(|(k, v)| (k.as_bytes().into(), Arc::from(v.as_bytes())))
        .collect()
}

/// Which Pod supplies each record.
fn owner_of(key: &str, value: &str, sources: &BTreeMap<String, String>) -> String {
    let ids: BTreeMap<String, &str> = PODS
        .iter()
        .map(|(_, p)| (format!("{:x}", hash_pod_name(p).get()), *p))
        .collect();
    let segs: Vec<&str> = key.split('/').collect();
    if let Some(rest) = key
        .strip_prefix("v1/instances/")
        .or(key.strip_prefix("v1/mdc/"))
    {
        let id = rest.split('/').nth(3).unwrap();
        return ids[id].to_owned();
    }
    if key.starts_with("v1/event_sources/") {
        let v: Value = serde_json::from_str(value).unwrap();
        let worker = v["metadata"]["worker"]["worker_id"].as_u64().unwrap();
        return ids[&format!("{worker:x}")].to_owned();
    }
    let suffix = key.strip_prefix("v1/event_channels/").unwrap();
    if let Some(pod) = sources.get(suffix) {
        return pod.clone();
    }
    // namespace/<ns>/component/<c>/...: the first Pod of that component.
    let (ns, component) = (segs[3], segs[5]);
    PODS.iter()
        .map(|(_, p)| *p)
        .find(|p| p.starts_with(ns) && (component == "prefill") == p.contains("prefill"))
        .unwrap()
        .to_owned()
}

/// One resource's JSON text per Pod, values inserted as the dump's text.
fn resources(kvs: &[(String, String)]) -> Vec<String> {
    let mut sources = BTreeMap::new();
    for (k, v) in kvs {
        if let Some(suffix) = k.strip_prefix("v1/event_sources/") {
            sources.insert(suffix.to_owned(), owner_of(k, v, &BTreeMap::new()));
        }
    }
    let mut by_pod: BTreeMap<String, BTreeMap<&str, Vec<String>>> = BTreeMap::new();
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
        let entry = format!("{}:{v}", serde_json::to_string(suffix).unwrap());
        by_pod
            .entry(owner_of(k, v, &sources))
            .or_default()
            .entry(map)
            .or_default()
            .push(entry);
    }
    by_pod
        .into_iter()
        .map(|(pod, maps)| {
            let data: Vec<String> = maps
                .into_iter()
                .map(|(m, entries)| format!("\"{m}\":{{{}}}", entries.join(",")))
                .collect();
            format!(
                r#"{{"apiVersion":"nvidia.com/v1alpha1","kind":"DynamoWorkerMetadata","metadata":{{"name":"{pod}","namespace":"dynamo","uid":"uid-{pod}","resourceVersion":"1","ownerReferences":[{{"apiVersion":"v1","kind":"Pod","name":"{pod}","uid":"pod-{pod}"}}]}},"spec":{{"data":{{{}}}}}}}"#,
                data.join(",")
            )
        })
        .collect()
}

fn join_view(ready: &[&str]) -> (Arc<FleetView>, State) {
    let kvs = rewritten();
    let filter = NamespaceFilter::new(&["agg".to_owned(), "disagg".to_owned()]);
    let listed: Vec<Resource> = resources(&kvs)
        .iter()
        .map(|text| read_resource(text, &filter).unwrap())
        .collect();
    for r in &listed {
        assert!(
            matches!(r.body, Body::Valid(_)),
            "{} rejected: {:?}",
            r.name,
            r.body
        );
    }
    let slice = SliceFacts {
        name: "dynamo-workers-x7k2q".into(),
        ready: ready.iter().map(|p| (*p).to_owned()).collect(),
    };
    let mut j = MetaJoin::new();
    let state = j.replace_all(listed, vec![slice]);
    assert!(j.take_rejections().is_empty());
    (reduce(&state), state)
}

#[test]
fn the_same_records_as_resources_give_the_etcd_dumps_fleet_view() {
    let etcd = reduce(&as_records(&rewritten()));
    let pods: Vec<&str> = PODS.iter().map(|(_, p)| *p).collect();
    let (kube, state) = join_view(&pods);
    assert_eq!(state.len(), dump().len(), "every record supplied once");
    assert_eq!(*kube, *etcd);
    // And the view is the fleet: four workers under their Pods' ids, with publishers.
    let ids: BTreeSet<u64> = kube.workers.iter().map(|w| w.instance_id.get()).collect();
    let want: BTreeSet<u64> = pods.iter().map(|p| hash_pod_name(p).get()).collect();
    assert_eq!(ids, want);
    assert!(kube.workers.iter().all(|w| w.model.is_some()));
    assert!(!kube.publishers.is_empty());
}

#[test]
fn an_unready_pod_leaves_exactly_its_own_records_out() {
    let prefill = PODS[3].1;
    let others: Vec<&str> = PODS
        .iter()
        .map(|(_, p)| *p)
        .filter(|p| *p != prefill)
        .collect();
    let (kube, state) = join_view(&others);
    // The etcd view of the dump without the prefill Pod's records.
    let kvs = rewritten();
    let mut sources = BTreeMap::new();
    for (k, v) in &kvs {
        if let Some(suffix) = k.strip_prefix("v1/event_sources/") {
            sources.insert(suffix.to_owned(), owner_of(k, v, &BTreeMap::new()));
        }
    }
    let kept: Vec<(String, String)> = kvs
        .iter()
        .filter(|(k, v)| owner_of(k, v, &sources) != prefill)
        .cloned()
        .collect();
    assert!(kept.len() < kvs.len());
    assert_eq!(state.len(), kept.len());
    assert_eq!(*kube, *reduce(&as_records(&kept)));
    let prefill_id = hash_pod_name(prefill);
    assert!(kube.workers.iter().all(|w| w.instance_id != prefill_id));
    assert_eq!(kube.workers.len(), 3);
}
