//! `source: kubernetes` end to end against the fake API server (`tests/k8s/`, proven faithful
//! with kubectl in `tests/kube_fake.rs`): the router lists and watches `DynamoWorkerMetadata`
//! resources and the operator's EndpointSlices through the `kube` crate over TLS, publishes the
//! workers whose Pods a slice lists ready, with their cards (model, capacity) and their
//! `kv_metrics` publishers (it subscribes to a real libzmq one), follows slices and resources
//! within a second, rejects a resource with a foreign id whole, lists both collections again
//! whenever either watch ends, keeps `connected` at 1 through normal cycles, keeps its last view
//! when its token lacks a verb, and pins requests to the workers it found with their decimal
//! ids (the SipHash of the Pod name).
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::kube::{
    FakeApiServer, endpoint_slice, pinned_ids, pod_id, router_over, wait_workers, worker_ids,
    worker_metadata,
};
use common::zmq::ZmqPublisher;
use common::{MockBackend, RouterProcess, STEP, chat, chat_body, metric_value};
use serde_json::{Value, json};

const NS: &str = "dynamo";
const DYN_NS: &str = "solar";
const MODEL: &str = "solar-pro4";
const CRS: &str = "dynamoworkermetadatas";
const SLICES: &str = "endpointslices";
/// Watches the server ends after 1 s, stalled after 3 s of silence.
const FAST_CYCLE: &str = "      watch_timeout: 1s\n      watch_idle_timeout: 3s\n";

/// The `spec.data` a 1.6.1 aggregated worker of Pod `pod` writes (the shapes of the real
/// records in `../shared/fixtures/dynamo-1.6.1/etcd-dump.txt`), its card naming `model`, its
/// kv_metrics channel (publisher `publisher`) at `zmq`.
fn records(pod: &str, model: &str, publisher: u64, zmq: &str) -> Value {
    let id = pod_id(pod);
    let hex = format!("{id:x}");
    let ep = format!("{DYN_NS}/backend/generate/{hex}");
    json!({
        "endpoints": {
            ep.clone(): {
                "type": "Endpoint", "component": "backend", "endpoint": "generate",
                "namespace": DYN_NS, "instance_id": id,
                "transport": {"tcp": format!("10.244.1.7:35917/{hex}/{DYN_NS}/backend/generate")},
                "device_type": "cuda", "request_plane_codec": "msgpack",
            }
        },
        "model_cards": {
            ep: {
                "type": "Model", "namespace": DYN_NS, "component": "backend",
                "endpoint": "generate", "instance_id": id,
                "card_json": {
                    "display_name": model, "slug": model, "kv_cache_block_size": 64,
                    "context_length": 4096,
                    "runtime_config": {"total_kv_blocks": 1024, "max_num_seqs": 64,
                        "max_num_batched_tokens": 8192, "data_parallel_size": 1},
                },
            }
        },
        "event_channels": {
            format!("namespace/{DYN_NS}/component/backend/endpoint/generate/topic/kv_metrics/{publisher:x}"): {
                "type": "EventChannel",
                "scope": {"kind": "endpoint", "endpoint": {"namespace": DYN_NS, "component": "backend", "name": "generate"}},
                "topic": "kv_metrics", "instance_id": publisher,
                "transport": {"kind": "Zmq", "config": {"endpoint": zmq}},
            }
        },
        "event_sources": null,
    })
}

/// A resource as the operator's worker writes it: named and owned by its Pod.
fn resource(pod: &str, data: &Value) -> Value {
    let mut cr = worker_metadata(pod, data);
    cr["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "v1", "kind": "Pod", "name": pod, "uid": format!("pod-uid-{pod}"),
        "controller": false, "blockOwnerDeletion": false,
    }]);
    cr
}

fn put_worker(api: &FakeApiServer, pod: &str, publisher: u64) {
    api.put(
        CRS,
        NS,
        &resource(pod, &records(pod, MODEL, publisher, "tcp://127.0.0.1:9")),
    );
}

fn put_slice(api: &FakeApiServer, name: &str, pods: &[(&str, bool)]) {
    api.put(SLICES, NS, &endpoint_slice(name, "solar-backend", pods));
}

/// The router over the fake's resources and slices, its shim a scripted backend.
fn router(api: &FakeApiServer, shim: &MockBackend, kube_extra: &str) -> RouterProcess {
    let kubernetes = format!(
        "      namespace: {NS}\n      dynamo_namespace: {DYN_NS}\n      \
         watch_reconnect_backoff: {{ initial: 100ms, max: 1s }}\n{kube_extra}"
    );
    router_over(api, shim, "kubernetes", &kubernetes)
}

fn workers(r: &RouterProcess) -> Vec<Value> {
    let v = r.get("/admin/dynamo/workers").json();
    v["workers"].as_array().cloned().unwrap_or_default()
}

/// Whether admin row `w` is the worker of Pod `pod` (its decimal id).
fn is_worker(w: &Value, pod: &str) -> bool {
    w["worker_id"].as_str().and_then(|s| s.parse::<u64>().ok()) == Some(pod_id(pod))
}

fn metric(r: &RouterProcess, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(&r.metrics(), name, labels).unwrap_or(0.0)
}

fn wait_for(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ok() {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The fake with one ready worker, and the router over it (found already).
fn one_worker(kube_extra: &str) -> (FakeApiServer, MockBackend, RouterProcess) {
    let api = FakeApiServer::start();
    put_worker(&api, "solar-worker-0", 0x11);
    put_slice(&api, "s", &[("solar-worker-0", true)]);
    let shim = MockBackend::start("shim");
    let r = router(&api, &shim, kube_extra);
    wait_workers(&r, &["solar-worker-0"], STEP);
    (api, shim, r)
}

/// How often each collection was listed so far.
fn lists(api: &FakeApiServer) -> (u64, u64) {
    let st = api.stats();
    let n = |res: &str| st[res]["lists"].as_u64().unwrap();
    (n(CRS), n(SLICES))
}

/// Waits until both collections were listed again (a list is its pages plus the final one, so
/// at least two more requests each) since `before`.
fn wait_relisted(api: &FakeApiServer, before: (u64, u64), what: &str) {
    wait_for(
        &format!("both re-listed after {what}"),
        Duration::from_secs(15),
        || {
            let now = lists(api);
            now.0 >= before.0 + 2 && now.1 >= before.1 + 2
        },
    );
}

#[test]
fn ready_workers_appear_with_their_cards_and_follow_slices_and_resources() {
    let api = FakeApiServer::start();
    put_worker(&api, "solar-worker-0", 0x11);
    put_worker(&api, "solar-worker-1", 0x12);
    put_worker(&api, "solar-worker-2", 0x13);
    put_slice(
        &api,
        "solar-backend-abcde",
        &[
            ("solar-worker-0", true),
            ("solar-worker-1", true),
            ("solar-worker-2", false),
        ],
    );
    let shim = MockBackend::start("shim");
    let r = router(&api, &shim, "");
    wait_workers(&r, &["solar-worker-0", "solar-worker-1"], STEP);
    let v = r.get("/admin/dynamo/workers").json();
    assert_eq!(v["signals"], json!({"load": true, "capacity": true}));
    let w0 = workers(&r)
        .into_iter()
        .find(|w| is_worker(w, "solar-worker-0"))
        .unwrap();
    // The model and capacity come from the card; the Pod's transport address is not shown.
    assert_eq!(w0["model"], MODEL, "{w0:#}");
    assert_eq!(
        w0["capacity"]["total_kv_blocks"], 1024,
        "capacity from the card: {w0:#}"
    );
    assert_eq!(w0["capacity"]["context_length"], 4096, "{w0:#}");
    assert!(!v.to_string().contains("10.244.1.7"), "{v:#}");
    // Both lists: resources unselected, 32 per page; slices by the operator's labels, 500.
    let stats = api.stats();
    assert_eq!(stats[CRS]["last_list"]["limit"], "32", "{stats:#}");
    assert!(
        stats[CRS]["last_list"]["labelSelector"].is_null(),
        "{stats:#}"
    );
    assert_eq!(stats[SLICES]["last_list"]["limit"], "500", "{stats:#}");
    assert_eq!(
        stats[SLICES]["last_list"]["labelSelector"],
        "nvidia.com/dynamo-discovery-backend=kubernetes,nvidia.com/dynamo-discovery-enabled=true"
    );
    // A slice event, a resource change and a deletion each change the view within a second.
    put_slice(
        &api,
        "solar-backend-abcde",
        &[
            ("solar-worker-0", true),
            ("solar-worker-1", false),
            ("solar-worker-2", true),
        ],
    );
    let took = wait_workers(&r, &["solar-worker-0", "solar-worker-2"], STEP);
    assert!(
        took < Duration::from_secs(1),
        "slice followed after {took:?}"
    );
    api.put(
        CRS,
        NS,
        &resource(
            "solar-worker-2",
            &records("solar-worker-2", "solar-mini", 0x13, "tcp://127.0.0.1:9"),
        ),
    );
    let t0 = Instant::now();
    wait_for("the modified card", STEP, || {
        workers(&r)
            .iter()
            .any(|w| is_worker(w, "solar-worker-2") && w["model"] == "solar-mini")
    });
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "card followed after {:?}",
        t0.elapsed()
    );
    api.delete(CRS, NS, "solar-worker-0");
    let took = wait_workers(&r, &["solar-worker-2"], STEP);
    assert!(
        took < Duration::from_secs(1),
        "deletion followed after {took:?}"
    );
    assert_eq!(metric(&r, "continuum_dynamo_discovery_connected", &[]), 1.0);
}

#[test]
fn requests_are_pinned_to_the_workers_found_and_their_publisher_is_subscribed() {
    let mut publisher = ZmqPublisher::start();
    let api = FakeApiServer::start();
    for (pod, p) in [("solar-worker-a", 0x21), ("solar-worker-b", 0x22)] {
        api.put(
            CRS,
            NS,
            &resource(pod, &records(pod, MODEL, p, &publisher.endpoint())),
        );
    }
    put_slice(
        &api,
        "solar-backend-x",
        &[("solar-worker-a", true), ("solar-worker-b", true)],
    );
    let shim = MockBackend::start("shim");
    let r = router(&api, &shim, "");
    wait_workers(&r, &["solar-worker-a", "solar-worker-b"], STEP);
    // The kv_metrics publisher the resources name is subscribed by the router's ZMTP client.
    assert_eq!(
        publisher
            .wait_subscribed(Duration::from_secs(15))
            .as_deref(),
        Some("kv_metrics"),
        "the router subscribed; stderr:\n{}",
        r.stderr()
    );
    let want: BTreeSet<u64> = ["solar-worker-a", "solar-worker-b"]
        .iter()
        .map(|n| pod_id(n))
        .collect();
    let pins = pinned_ids(&r, &shim, MODEL, 6);
    assert!(
        pins.iter().all(|p| want.contains(p)),
        "{pins:?} are not all workers found"
    );
    let seen: BTreeSet<u64> = pins.into_iter().collect();
    assert_eq!(seen, want, "both workers served");
}

#[test]
fn a_resource_with_a_foreign_id_is_rejected_whole_and_counted() {
    let api = FakeApiServer::start();
    put_worker(&api, "solar-worker-0", 0x11);
    // Pod solar-worker-1's resource carries worker 0's records: its id is not its name's.
    api.put(
        CRS,
        NS,
        &resource(
            "solar-worker-1",
            &records("solar-worker-0", MODEL, 0x12, "tcp://127.0.0.1:9"),
        ),
    );
    put_slice(
        &api,
        "s",
        &[("solar-worker-0", true), ("solar-worker-1", true)],
    );
    let shim = MockBackend::start("shim");
    let r = router(&api, &shim, "");
    wait_workers(&r, &["solar-worker-0"], STEP);
    wait_for("the mismatch counted", STEP, || {
        metric(
            &r,
            "continuum_dynamo_discovery_events_total",
            &[("kind", "mismatch")],
        ) == 1.0
    });
    // Its channel (publisher 0x12) is not taken either: the whole resource is out, and only
    // worker 0's kv_metrics publisher is known.
    let v = r.get("/admin/dynamo/workers").json();
    assert_eq!(v["load_publishers"], 1, "{v:#}");
    assert!(r.stderr().contains("mismatch"), "{}", r.stderr());
}

#[test]
fn either_watch_ending_lists_both_again_and_normal_ends_keep_connected() {
    let (api, _shim, r) = one_worker(FAST_CYCLE);
    // Normal ends: the server closes each watch after 1 s; `connected` never drops.
    let t0 = Instant::now();
    let before = lists(&api);
    while t0.elapsed() < Duration::from_millis(3500) {
        assert_eq!(
            metric(&r, "continuum_dynamo_discovery_connected", &[]),
            1.0,
            "connected dropped during a normal cycle at {:?}",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
    let now = lists(&api);
    assert!(
        now.0 >= before.0 + 2 && now.1 >= before.1 + 2,
        "{before:?} -> {now:?}"
    );
    let stats = api.stats();
    assert_eq!(stats[CRS]["last_watch"]["timeoutSeconds"], "1", "{stats:#}");
    assert_eq!(
        stats[SLICES]["last_watch"]["timeoutSeconds"], "1",
        "{stats:#}"
    );
    // A fault on ONE stream ends the session with its reason, and both are listed again.
    for (res, fault, reason) in [
        (SLICES, "gone", "answered 410"),
        (CRS, "error_event", "resourceVersion expired"),
        (SLICES, "eof", "EndpointSlice watch: transport"),
        (CRS, "eof", "DynamoWorkerMetadata watch: transport"),
    ] {
        let before = lists(&api);
        api.fault(res, fault, 0, 1);
        let deadline = Instant::now() + Duration::from_secs(15);
        while !r.stderr().contains(reason) {
            assert!(
                Instant::now() < deadline,
                "no session end with {reason:?} after {fault} on {res}:\n{}",
                r.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        wait_relisted(&api, before, &format!("{fault} on {res}"));
        wait_workers(&r, &["solar-worker-0"], STEP);
    }
}

#[test]
fn stalled_watches_are_detected_and_both_are_listed_again() {
    let (api, _shim, r) = one_worker(FAST_CYCLE);
    let before = lists(&api);
    // The next watch of each sends its headers and then nothing: past `watch_idle_timeout` (3 s)
    // the session ends as stalled (a watch that ends on time never gets there: the idle deadline
    // is validated to be longer than `watch_timeout`).
    api.fault(CRS, "stall", 0, 1);
    api.fault(SLICES, "stall", 0, 1);
    wait_for("a stall", Duration::from_secs(20), || {
        r.stderr().contains("watch stalled: no event for 3s")
    });
    assert_eq!(
        worker_ids(&r).len(),
        1,
        "the view is kept through the stall"
    );
    wait_relisted(&api, before, "the stall");
    wait_for("connected again", Duration::from_secs(10), || {
        metric(&r, "continuum_dynamo_discovery_connected", &[]) == 1.0
    });
    wait_workers(&r, &["solar-worker-0"], STEP);
}

#[test]
fn a_token_without_a_verb_fails_clearly_keeps_the_last_view_and_relists_after() {
    let (api, _shim, r) = one_worker(FAST_CYCLE);
    api.allow_verbs(&["get", "list"]);
    wait_for("a Forbidden in the log", STEP, || {
        r.stderr().contains("Forbidden")
    });
    assert_eq!(worker_ids(&r).len(), 1, "the last view is kept");
    wait_for("connected 0", STEP, || {
        metric(&r, "continuum_dynamo_discovery_connected", &[]) == 0.0
    });
    let resp = chat(r.addr(), &chat_body(MODEL, "still", false), &[]);
    assert_eq!(resp.status, 200, "{}", resp.text());
    // While the router cannot watch, worker 0 goes and worker 1 comes.
    api.delete(CRS, NS, "solar-worker-0");
    put_worker(&api, "solar-worker-1", 0x12);
    put_slice(&api, "s", &[("solar-worker-1", true)]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        worker_ids(&r),
        [pod_id("solar-worker-0")].into(),
        "still the last view"
    );
    // The verb back: the router recovers on its own, and its re-list drops what vanished in the
    // gap and adds what came.
    api.allow_verbs(&["get", "list", "watch"]);
    wait_for("connected again", Duration::from_secs(10), || {
        metric(&r, "continuum_dynamo_discovery_connected", &[]) == 1.0
    });
    wait_workers(&r, &["solar-worker-1"], STEP);
}
