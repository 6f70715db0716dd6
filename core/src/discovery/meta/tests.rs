//! The metadata source's rules, one by one (DISC-K8S-META-04..06, -09, -11, -13..18, -23).

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::*;
use crate::discovery::pod_hash::hash_pod_name;

const NS: &str = "dyn";

fn filter() -> NamespaceFilter {
    NamespaceFilter::new(&[NS.to_owned()])
}

fn id(pod: &str) -> u64 {
    hash_pod_name(pod).get()
}

/// The `spec.data` of a worker Pod: its endpoint and card under its id, and a kv_metrics
/// channel whose publisher id is `publisher`.
fn data(pod: &str, publisher: u64, model: &str) -> Value {
    let id = id(pod);
    let hex = format!("{id:x}");
    json!({
        "endpoints": {
            format!("{NS}/backend/generate/{hex}"): {
                "type": "Endpoint", "namespace": NS, "component": "backend",
                "endpoint": "generate", "instance_id": id,
                "transport": {"tcp": format!("10.244.0.1:9000/{hex}/{NS}/backend/generate")},
            }
        },
        "model_cards": {
            format!("{NS}/backend/generate/{hex}"): {
                "type": "Model", "namespace": NS, "component": "backend",
                "endpoint": "generate", "instance_id": id,
                "card_json": {"display_name": model, "kv_cache_block_size": 64},
            }
        },
        "event_channels": {
            format!("namespace/{NS}/component/backend/endpoint/generate/topic/kv_metrics/{publisher:x}"): {
                "type": "EventChannel",
                "scope": {"kind": "endpoint", "endpoint": {"namespace": NS, "component": "backend", "name": "generate"}},
                "topic": "kv_metrics", "instance_id": publisher,
                "transport": {"kind": "Zmq", "config": {"endpoint": "tcp://10.244.0.1:5555"}},
            }
        },
        "event_sources": null,
    })
}

fn cr(name: &str, uid: &str, version: &str, data: Value) -> String {
    json!({
        "apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoWorkerMetadata",
        "metadata": {"name": name, "namespace": "dynamo", "uid": uid, "resourceVersion": version,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": "p-1"}]},
        "spec": {"data": data},
    })
    .to_string()
}

fn read(text: &str) -> Resource {
    read_resource(text, &filter()).unwrap()
}

fn worker(pod: &str, uid: &str, version: &str) -> Resource {
    read(&cr(pod, uid, version, data(pod, 7, "m")))
}

fn keys(r: &Resource) -> Vec<String> {
    match &r.body {
        Body::Valid(recs) => recs
            .iter()
            .map(|r| String::from_utf8(r.key.to_vec()).unwrap())
            .collect(),
        Body::Bad { kind, reason } => panic!("rejected {kind:?}: {reason}"),
    }
}

fn kind_of(r: &Resource) -> DiscoveryEventKind {
    match &r.body {
        Body::Bad { kind, .. } => *kind,
        Body::Valid(_) => panic!("accepted"),
    }
}

fn slice(name: &str, ready: &[&str]) -> SliceFacts {
    SliceFacts {
        name: name.into(),
        ready: ready.iter().map(|s| (*s).to_owned()).collect(),
    }
}

/// (puts, deletes) by key text.
fn split(changes: &[RecordChange]) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut puts = BTreeSet::new();
    let mut dels = BTreeSet::new();
    for c in changes {
        match c {
            RecordChange::Put(k, _) => puts.insert(String::from_utf8(k.to_vec()).unwrap()),
            RecordChange::Delete(k) => dels.insert(String::from_utf8(k.to_vec()).unwrap()),
        };
    }
    (puts, dels)
}

#[test]
fn a_resource_becomes_etcd_records_with_the_values_as_sent() {
    let text = cr("w-0", "u1", "5", data("w-0", 7, "m"));
    let r = read(&text);
    assert_eq!(
        (r.name.as_str(), r.uid.as_str(), r.version.as_str()),
        ("w-0", "u1", "5")
    );
    let hex = format!("{:x}", id("w-0"));
    assert_eq!(
        keys(&r),
        vec![
            format!(
                "v1/event_channels/namespace/{NS}/component/backend/endpoint/generate/topic/kv_metrics/7"
            ),
            format!("v1/instances/{NS}/backend/generate/{hex}"),
            format!("v1/mdc/{NS}/backend/generate/{hex}"),
        ]
    );
    // The value bytes are the server's text, unchanged (DISC-K8S-META-01).
    let Body::Valid(recs) = &r.body else { panic!() };
    let sent: Value = serde_json::from_str(&text).unwrap();
    let endpoint = &sent["spec"]["data"]["endpoints"][format!("{NS}/backend/generate/{hex}")];
    let held: Value = serde_json::from_slice(&recs[1].value).unwrap();
    assert_eq!(&held, endpoint);
    let raw = std::str::from_utf8(&recs[1].value).unwrap();
    assert!(text.contains(raw), "{raw} is a slice of the object's text");
}

#[test]
fn null_and_absent_maps_are_empty_and_event_sources_are_kept() {
    let r = read(&cr("w-0", "u", "1", json!({"endpoints": null})));
    assert!(keys(&r).is_empty());
    let r = read(&cr("w-0", "u", "1", json!({})));
    assert!(keys(&r).is_empty());
    let src = format!("namespace/{NS}/component/backend/endpoint/generate/topic/kv-events/9");
    let r = read(&cr(
        "w-0",
        "u",
        "1",
        json!({"event_sources": {src.clone(): {"type": "EventSource", "publisher_id": 9}}}),
    ));
    assert_eq!(keys(&r), vec![format!("v1/event_sources/{src}")]);
}

#[test]
fn a_spec_or_data_that_is_not_an_object_is_malformed() {
    for spec in [
        json!(null),
        json!("x"),
        json!({"data": null}),
        json!({"data": [1]}),
        json!({"data": {"endpoints": "x"}}),
        json!({"data": {"model_cards": [1]}}),
    ] {
        let text = json!({"metadata": {"name": "w-0", "uid": "u"}, "spec": spec}).to_string();
        assert_eq!(
            kind_of(&read(&text)),
            DiscoveryEventKind::Malformed,
            "{spec}"
        );
    }
    let text = json!({"metadata": {"name": "w-0"}}).to_string();
    assert_eq!(kind_of(&read(&text)), DiscoveryEventKind::Malformed);
}

#[test]
fn objects_without_a_name_cannot_be_read() {
    for text in [
        "[]",
        "{}",
        r#"{"metadata": {"name": ""}}"#,
        r#"{"metadata": {"name": 3}}"#,
        "nope",
    ] {
        assert!(read_resource(text, &filter()).is_err(), "{text}");
    }
    let long = json!({"metadata": {"name": "a".repeat(254)}, "spec": {"data": {}}});
    assert_eq!(
        read_resource(&long.to_string(), &filter()),
        Err(ObjectError::NoName)
    );
    assert_eq!(
        object_name(r#"{"metadata":{"name":"w-1"}}"#).unwrap(),
        "w-1"
    );
}

#[test]
fn only_records_of_the_configured_dynamo_namespaces_are_kept() {
    let mut d = data("w-0", 7, "m");
    let hex = format!("{:x}", id("w-0"));
    let other = json!({"type": "Endpoint", "instance_id": id("w-0")});
    d["endpoints"][format!("other/backend/generate/{hex}")] = other.clone();
    // A namespace that merely starts like the configured one is another namespace.
    d["endpoints"][format!("{NS}x/backend/generate/{hex}")] = other;
    d["event_channels"]["namespace/other/component/backend/endpoint/generate/topic/kv_metrics/8"] =
        json!({"type": "EventChannel", "instance_id": 8});
    let got = keys(&read(&cr("w-0", "u", "1", d)));
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(
        got.iter()
            .all(|k| !k.contains("other") && !k.contains("dynx"))
    );
    // Two namespaces configured: both kept.
    let two = NamespaceFilter::new(&[NS.to_owned(), "other".to_owned()]);
    let mut d = data("w-0", 7, "m");
    d["event_channels"]["namespace/other/component/backend/endpoint/generate/topic/kv_metrics/8"] =
        json!({"type": "EventChannel", "instance_id": 8});
    let r = read_resource(&cr("w-0", "u", "1", d), &two).unwrap();
    assert_eq!(keys(&r).len(), 4);
}

#[test]
fn an_id_that_is_not_the_pod_names_hash_rejects_the_whole_resource() {
    let hex = format!("{:x}", id("w-0"));
    let ep = format!("{NS}/backend/generate/{hex}");
    type Edit<'a> = Box<dyn Fn(&mut Value) + 'a>;
    let cases: Vec<Edit<'_>> = vec![
        // The key names another id.
        Box::new(|d| {
            let v = d["endpoints"].as_object_mut().unwrap().remove(&ep).unwrap();
            d["endpoints"][format!("{NS}/backend/generate/1f")] = v;
        }),
        // The value names another id.
        Box::new(|d| d["model_cards"][&ep]["instance_id"] = json!(id("w-1"))),
        // The value names none.
        Box::new(|d| {
            d["endpoints"][&ep]
                .as_object_mut()
                .unwrap()
                .remove("instance_id");
        }),
        // The value is not an object.
        Box::new(|d| d["endpoints"][&ep] = json!("x")),
        // The key has no id segment.
        Box::new(|d| d["endpoints"][format!("{NS}/backend")] = json!({"instance_id": 1})),
        // A record of another namespace is checked too.
        Box::new(|d| d["endpoints"]["other/backend/generate/1"] = json!({"instance_id": 1})),
    ];
    for (i, case) in cases.iter().enumerate() {
        let mut d = data("w-0", 7, "m");
        case(&mut d);
        assert_eq!(
            kind_of(&read(&cr("w-0", "u", "1", d))),
            DiscoveryEventKind::Mismatch,
            "case {i}"
        );
    }
    // Event channels carry their publisher's id, not the worker's: exempt.
    let d = data("w-0", 0x1234, "m");
    assert_eq!(keys(&read(&cr("w-0", "u", "1", d))).len(), 3);
    // The same records under another resource name are another worker's: mismatch.
    assert_eq!(
        kind_of(&read(&cr("w-1", "u", "1", data("w-0", 7, "m")))),
        DiscoveryEventKind::Mismatch
    );
}

#[test]
fn a_resource_named_unlike_its_owner_pod_is_refused_as_container_mode() {
    let mut v: Value = serde_json::from_str(&cr("w-0-sidecar", "u", "1", json!({}))).unwrap();
    v["metadata"]["ownerReferences"][0]["name"] = json!("w-0");
    assert_eq!(kind_of(&read(&v.to_string())), DiscoveryEventKind::Refused);
    // The main container's resource is named like the Pod: accepted. So is one with no owner.
    assert!(keys(&read(&cr("w-0", "u", "1", data("w-0", 7, "m")))).len() == 3);
    let mut v: Value = serde_json::from_str(&cr("w-0", "u", "1", data("w-0", 7, "m"))).unwrap();
    v["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("ownerReferences");
    assert_eq!(keys(&read(&v.to_string())).len(), 3);
}

#[test]
fn too_many_records_or_a_huge_key_are_malformed() {
    let mut d = json!({"event_channels": {}});
    for i in 0..=MAX_ENTRIES_PER_RESOURCE {
        d["event_channels"][format!("namespace/{NS}/x/{i}")] = json!({});
    }
    assert_eq!(
        kind_of(&read(&cr("w-0", "u", "1", d))),
        DiscoveryEventKind::Malformed
    );
    let mut d = json!({"event_channels": {}});
    for i in 0..MAX_ENTRIES_PER_RESOURCE {
        d["event_channels"][format!("namespace/{NS}/x/{i}")] = json!({});
    }
    assert_eq!(
        keys(&read(&cr("w-0", "u", "1", d))).len(),
        MAX_ENTRIES_PER_RESOURCE
    );
    let d = json!({"event_channels": {"k".repeat(MAX_KEY_BYTES + 1): {}}});
    assert_eq!(
        kind_of(&read(&cr("w-0", "u", "1", d))),
        DiscoveryEventKind::Malformed
    );
}

#[test]
fn a_slice_lists_only_endpoints_that_say_ready_true() {
    let v = json!({
        "metadata": {"name": "s1"},
        "endpoints": [
            {"conditions": {"ready": true}, "targetRef": {"kind": "Pod", "name": "a"}},
            {"conditions": {"ready": false}, "targetRef": {"name": "b"}},
            {"conditions": {}, "targetRef": {"name": "c"}},
            {"conditions": {"ready": "true"}, "targetRef": {"name": "d"}},
            {"conditions": {"ready": true}},
            {"targetRef": {"name": "e"}},
        ],
    });
    assert_eq!(slice_facts(&v).unwrap(), slice("s1", &["a"]));
    assert_eq!(
        slice_facts(&json!({"metadata": {"name": "s"}})).unwrap(),
        slice("s", &[])
    );
    assert_eq!(
        slice_facts(&json!({"metadata": {"name": "s"}, "endpoints": {}})),
        Err(SliceError::Endpoints)
    );
    let many: Vec<Value> = (0..=MAX_SLICE_ENDPOINTS).map(|_| json!({})).collect();
    assert_eq!(
        slice_facts(&json!({"metadata": {"name": "s"}, "endpoints": many})),
        Err(SliceError::Endpoints)
    );
    assert!(slice_facts(&json!({"endpoints": []})).is_err());
}

#[test]
fn records_are_put_while_ready_and_deleted_when_unready_or_gone() {
    let mut j = MetaJoin::new();
    // Held but not ready: nothing yet.
    assert!(j.upsert(worker("w-0", "u", "1")).is_empty());
    let (puts, dels) = split(&j.upsert_slice(slice("s", &["w-0"])));
    assert_eq!((puts.len(), dels.len()), (3, 0));
    let (puts, dels) = split(&j.upsert_slice(slice("s", &[])));
    assert_eq!((puts.len(), dels.len()), (0, 3));
    assert_eq!(j.keys(), 0);
    // Ready again: the held records come back; the same resource again changes nothing.
    assert_eq!(split(&j.upsert_slice(slice("s", &["w-0"]))).0.len(), 3);
    assert!(j.upsert(worker("w-0", "u", "1")).is_empty());
    let (puts, dels) = split(&j.remove_resource("w-0"));
    assert_eq!((puts.len(), dels.len()), (0, 3));
    assert_eq!((j.resources(), j.bytes(), j.keys()), (0, 0, 0));
    // A resource that arrives after its Pod is ready is put at once.
    assert_eq!(split(&j.upsert(worker("w-0", "u", "1"))).0.len(), 3);
}

#[test]
fn a_modified_resource_sends_only_the_records_that_changed() {
    let mut j = MetaJoin::new();
    let _ = j.upsert_slice(slice("s", &["w-0"]));
    let _ = j.upsert(worker("w-0", "u", "1"));
    // Same records, new resourceVersion (a status or label change): nothing.
    assert!(j.upsert(worker("w-0", "u", "2")).is_empty());
    // The card changes.
    let changed = j.upsert(read(&cr("w-0", "u", "3", data("w-0", 7, "m2"))));
    let hex = format!("{:x}", id("w-0"));
    assert_eq!(
        split(&changed),
        (
            BTreeSet::from([format!("v1/mdc/{NS}/backend/generate/{hex}")]),
            BTreeSet::new()
        )
    );
    // The channel goes away, another publisher's comes.
    let changed = j.upsert(read(&cr("w-0", "u", "4", data("w-0", 8, "m2"))));
    let ch = |p: u64| {
        format!(
            "v1/event_channels/namespace/{NS}/component/backend/endpoint/generate/topic/kv_metrics/{p:x}"
        )
    };
    assert_eq!(
        split(&changed),
        (BTreeSet::from([ch(8)]), BTreeSet::from([ch(7)]))
    );
}

#[test]
fn a_slice_event_changes_only_the_pods_of_that_slice() {
    let mut j = MetaJoin::new();
    for p in ["a", "b"] {
        let _ = j.upsert(read(&cr(p, "u", "1", data(p, id(p), "m"))));
    }
    let _ = j.upsert_slice(slice("s1", &["a"]));
    let _ = j.upsert_slice(slice("s2", &["b", "a"]));
    assert_eq!(j.keys(), 6);
    // a is still ready through s2.
    assert!(j.upsert_slice(slice("s1", &[])).is_empty());
    let (puts, dels) = split(&j.remove_slice("s2"));
    assert_eq!((puts.len(), dels.len()), (0, 6));
    let (puts, _) = split(&j.upsert_slice(slice("s1", &["b"])));
    assert!(puts.iter().all(|k| !k.contains(&format!("{:x}", id("a")))));
    assert_eq!(puts.len(), 3);
}

#[test]
fn a_key_several_resources_supply_stays_until_the_last_goes() {
    let mut j = MetaJoin::new();
    let _ = j.upsert_slice(slice("s", &["a", "b"]));
    // Both supply the same kv_metrics channel (publisher 7) with different values.
    let mut db = data("b", 7, "m");
    let ch = format!("namespace/{NS}/component/backend/endpoint/generate/topic/kv_metrics/7");
    db["event_channels"][&ch]["transport"]["config"]["endpoint"] = json!("tcp://10.244.0.2:5555");
    let _ = j.upsert(read(&cr("b", "u", "1", db)));
    let _ = j.upsert(read(&cr("a", "u", "1", data("a", 7, "m"))));
    let key = format!("v1/event_channels/{ch}");
    let value_of = |j: &MetaJoin| {
        j.state()
            .into_iter()
            .find(|(k, _)| **k == *key.as_bytes())
            .map(|(_, v)| String::from_utf8(v.to_vec()).unwrap())
    };
    // The first supplier by name wins: a.
    assert!(value_of(&j).unwrap().contains("10.244.0.1"));
    let (puts, dels) = split(&j.remove_resource("a"));
    assert!(
        puts.contains(&key) && !dels.contains(&key),
        "{puts:?} {dels:?}"
    );
    assert!(value_of(&j).unwrap().contains("10.244.0.2"));
    let (_, dels) = split(&j.remove_resource("b"));
    assert!(dels.contains(&key));
    assert_eq!(j.keys(), 0);
}

#[test]
fn a_malformed_update_keeps_the_last_valid_records_of_the_same_uid() {
    let mut j = MetaJoin::new();
    let _ = j.upsert_slice(slice("s", &["w-0"]));
    let _ = j.upsert(worker("w-0", "u", "1"));
    // spec.data is a string: malformed.
    let bad = |v: &str, uid: &str| read(&cr("w-0", uid, v, json!("x")));
    assert_eq!(kind_of(&bad("2", "u")), DiscoveryEventKind::Malformed);
    assert!(j.upsert(bad("2", "u")).is_empty());
    assert_eq!(j.keys(), 3);
    assert_eq!(j.take_rejections().len(), 1);
    // The same bad version again (a re-list): not counted again.
    let _ = j.upsert(bad("2", "u"));
    assert!(j.take_rejections().is_empty());
    let state = j.replace_all(vec![bad("2", "u")], vec![slice("s", &["w-0"])]);
    assert_eq!(state.len(), 3, "kept across a re-list");
    assert!(j.take_rejections().is_empty());
    // A newer bad version is counted.
    let _ = j.upsert(bad("3", "u"));
    assert_eq!(j.take_rejections().len(), 1);
    // A bad resource of another uid (the Pod was recreated): the old records go.
    let (_, dels) = split(&j.upsert(bad("4", "other")));
    assert_eq!(dels.len(), 3);
    assert_eq!((j.resources(), j.take_rejections().len()), (0, 1));
    // Valid again: counted nothing, records back.
    assert_eq!(split(&j.upsert(worker("w-0", "other", "5"))).0.len(), 3);
    assert!(j.take_rejections().is_empty());
}

#[test]
fn a_mismatched_update_keeps_the_last_valid_records_but_a_refusal_drops_them() {
    let mut j = MetaJoin::new();
    let _ = j.upsert_slice(slice("s", &["w-0"]));
    let _ = j.upsert(worker("w-0", "u", "1"));
    let mut d = data("w-0", 7, "m");
    let hex = format!("{:x}", id("w-0"));
    d["endpoints"][format!("{NS}/backend/generate/{hex}")]["instance_id"] = json!(1);
    let r = read(&cr("w-0", "u", "2", d));
    assert_eq!(kind_of(&r), DiscoveryEventKind::Mismatch);
    assert!(j.upsert(r).is_empty());
    let rej = j.take_rejections();
    assert_eq!(rej.len(), 1);
    assert_eq!(rej[0].kind, DiscoveryEventKind::Mismatch);
    let mut v: Value = serde_json::from_str(&cr("w-0", "u", "3", json!({}))).unwrap();
    v["metadata"]["ownerReferences"][0]["name"] = json!("w");
    let (_, dels) = split(&j.upsert(read(&v.to_string())));
    assert_eq!(dels.len(), 3);
}

#[test]
fn caps_reject_new_resources_as_malformed_and_refuse_extra_slices() {
    let lim = Limits {
        resources: 2,
        bytes: 4096,
        slices: 1,
    };
    let mut j = MetaJoin::with_limits(lim);
    let _ = j.upsert(worker("a", "u", "1"));
    let _ = j.upsert(worker("b", "u", "1"));
    assert!(j.upsert(worker("c", "u", "1")).is_empty());
    let rej = j.take_rejections();
    assert_eq!((rej.len(), rej[0].kind), (1, DiscoveryEventKind::Malformed));
    assert_eq!(j.resources(), 2);
    // Updates of held resources are still taken.
    let _ = j.upsert(read(&cr("a", "u", "2", data("a", 9, "m"))));
    assert!(j.take_rejections().is_empty());
    // Bytes: a resource whose records would pass the total is refused; the others stay.
    let mut big = data("b", 7, "m");
    let hex = format!("{:x}", id("b"));
    big["model_cards"][format!("{NS}/backend/generate/{hex}")]["card_json"]["pad"] =
        json!("x".repeat(4096));
    let before = j.bytes();
    let _ = j.upsert(read(&cr("b", "u", "2", big)));
    assert_eq!(j.take_rejections()[0].kind, DiscoveryEventKind::Malformed);
    assert_eq!((j.bytes(), j.resources()), (before, 2));
    let _ = j.upsert_slice(slice("s1", &["a"]));
    assert!(j.upsert_slice(slice("s2", &["b"])).is_empty());
    assert_eq!(j.take_rejections()[0].kind, DiscoveryEventKind::Refused);
    assert_eq!(j.slices(), 1);
}

#[test]
fn the_spec_caps_hold_16384_resources() {
    let mut j = MetaJoin::new();
    assert_eq!(j.limits(), Limits::default());
    let small = |n: &str| Resource {
        name: n.to_owned(),
        uid: String::new(),
        version: String::new(),
        body: Body::Valid(Vec::new().into()),
    };
    let mut all: Vec<Resource> = (0..=MAX_RESOURCES)
        .map(|i| small(&format!("w-{i:05}")))
        .collect();
    all.sort_by(|a, b| a.name.cmp(&b.name));
    let _ = j.replace_all(all, Vec::new());
    assert_eq!(j.resources(), MAX_RESOURCES);
    let rej = j.take_rejections();
    assert_eq!(rej.len(), 1);
    assert_eq!(
        rej[0].name,
        format!("w-{MAX_RESOURCES:05}"),
        "the last by name"
    );
}

#[test]
fn a_relist_replaces_everything_and_drops_what_vanished() {
    let mut j = MetaJoin::new();
    let _ = j.upsert_slice(slice("s", &["a", "b"]));
    let _ = j.upsert(worker("a", "u", "1"));
    let _ = j.upsert(worker("b", "u", "1"));
    let state = j.replace_all(vec![worker("b", "u", "1")], vec![slice("s", &["a", "b"])]);
    let hex_a = format!("{:x}", id("a"));
    assert!(
        state
            .iter()
            .all(|(k, _)| !String::from_utf8_lossy(k).contains(&hex_a))
    );
    // b's endpoint and card, and the channel of publisher 7 that b supplies too.
    assert_eq!((j.resources(), j.keys(), state.len()), (1, 3, 3));
}

#[test]
fn a_card_over_1_mib_keeps_its_typed_fields_and_drops_the_rest() {
    use crate::discovery::ids::UnixMillis;
    use crate::discovery::reducer::{KvEvent, Reducer};
    let mut d = data("w-0", 7, "big-model");
    let hex = format!("{:x}", id("w-0"));
    let card = &mut d["model_cards"][format!("{NS}/backend/generate/{hex}")]["card_json"];
    card["chat_template"] = json!("x".repeat(2 * 1024 * 1024));
    let mut j = MetaJoin::new();
    let state = j.replace_all(
        vec![read(&cr("w-0", "u", "1", d))],
        vec![slice("s", &["w-0"])],
    );
    let mut r = Reducer::new();
    r.begin_resync();
    for (k, v) in &state {
        r.apply(KvEvent::Put { key: k, value: v }, UnixMillis(1));
    }
    r.end_resync();
    let view = r.materialize();
    assert_eq!(view.workers.len(), 1);
    let w = &view.workers[0];
    // DISC-K8S-META-07: classified like an etcd card: typed fields kept, the opaque card not.
    assert_eq!(
        (w.model.as_deref(), w.block_size, w.card.is_none()),
        (Some("big-model"), Some(64), true)
    );
}
