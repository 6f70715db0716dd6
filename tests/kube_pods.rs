//! `source: kubernetes_pods` end to end against the fake API server (`tests/k8s/`, proven
//! faithful with kubectl in `tests/kube_fake.rs`): the router lists and watches the operator's
//! Pods through the `kube` crate over TLS with a bearer token, publishes exactly the ready
//! worker Pods under Dynamo's ids (SipHash of the Pod name), follows readiness and deletion
//! within a second, lists again after every watch end (410, early EOF, stall, the normal
//! `timeoutSeconds` end) with `connected` staying 1 through normal cycles, keeps its last view
//! when its token lacks a verb, and pins requests to the workers it found.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::kube::{
    FakeApiServer, operator_pod, pinned_ids, pod_id, router_over, wait_workers, worker_ids,
};
use common::{MockBackend, RouterProcess, STEP, chat, chat_body, metric_value};

const NS: &str = "dynamo";
const DYN_NS: &str = "solar";
const MODEL: &str = "solar-pro4";
/// Watches the server ends after 1 s, stalled after 3 s of silence.
const FAST_CYCLE: &str = "      watch_timeout: 1s\n      watch_idle_timeout: 3s\n";

/// The router over the fake's Pods, its shim a scripted backend.
fn router(api: &FakeApiServer, shim: &MockBackend, kube_extra: &str) -> RouterProcess {
    let kubernetes = format!(
        "      namespace: {NS}\n      dynamo_namespace: {DYN_NS}\n      model: {MODEL}\n      \
         watch_reconnect_backoff: {{ initial: 100ms, max: 1s }}\n{kube_extra}"
    );
    router_over(api, shim, "kubernetes_pods", &kubernetes)
}

fn metric(r: &RouterProcess, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(&r.metrics(), name, labels).unwrap_or(0.0)
}

fn put_worker(api: &FakeApiServer, name: &str, ready: bool) {
    api.put(
        "pods",
        NS,
        &operator_pod(name, DYN_NS, "worker", None, Some("VllmWorker"), ready),
    );
}

#[test]
fn ready_worker_pods_appear_under_their_ids_and_follow_readiness_and_deletion() {
    let api = FakeApiServer::start();
    put_worker(&api, "solar-worker-0", true);
    put_worker(&api, "solar-worker-1", true);
    put_worker(&api, "solar-worker-2", false);
    api.put(
        "pods",
        NS,
        &operator_pod("solar-frontend-0", DYN_NS, "frontend", None, None, true),
    );
    api.put(
        "pods",
        NS,
        &operator_pod("other-worker-0", "other", "worker", None, None, true),
    );
    let shim = MockBackend::start("shim");
    let r = router(&api, &shim, "");
    wait_workers(&r, &["solar-worker-0", "solar-worker-1"], STEP);
    let v = r.get("/admin/dynamo/workers").json();
    assert_eq!(
        v["signals"],
        serde_json::json!({"load": false, "capacity": false})
    );
    let stats = api.stats();
    let list = &stats["pods"]["last_list"];
    assert_eq!(list["limit"], "500", "{stats:#}");
    assert!(
        list["labelSelector"]
            .as_str()
            .is_some_and(|s| s.contains("nvidia.com/dynamo-namespace=solar")),
        "{stats:#}"
    );
    // Readiness, deletion and a new Pod change the view within a second each.
    put_worker(&api, "solar-worker-2", true);
    let took = wait_workers(
        &r,
        &["solar-worker-0", "solar-worker-1", "solar-worker-2"],
        STEP,
    );
    assert!(took < Duration::from_secs(1), "ready after {took:?}");
    put_worker(&api, "solar-worker-0", false);
    let took = wait_workers(&r, &["solar-worker-1", "solar-worker-2"], STEP);
    assert!(took < Duration::from_secs(1), "unready after {took:?}");
    api.delete("pods", NS, "solar-worker-1");
    let took = wait_workers(&r, &["solar-worker-2"], STEP);
    assert!(took < Duration::from_secs(1), "deleted after {took:?}");
    assert_eq!(metric(&r, "continuum_dynamo_discovery_connected", &[]), 1.0);
}

#[test]
fn requests_are_pinned_to_the_pods_found_with_their_decimal_ids() {
    let api = FakeApiServer::start();
    for n in ["solar-worker-a", "solar-worker-b"] {
        put_worker(&api, n, true);
    }
    let shim = MockBackend::start("shim");
    let r = router(&api, &shim, "");
    wait_workers(&r, &["solar-worker-a", "solar-worker-b"], STEP);
    let seen: BTreeSet<u64> = pinned_ids(&r, &shim, MODEL, 4).into_iter().collect();
    // No data-parallel rank is known for Pods (DISC-K8S-POD-07).
    assert!(
        shim.wait_requests(4, STEP)
            .iter()
            .all(|req| req.header("x-dynamo-dp-rank").is_none())
    );
    let want: BTreeSet<u64> = ["solar-worker-a", "solar-worker-b"]
        .iter()
        .map(|n| pod_id(n))
        .collect();
    assert_eq!(seen, want, "round robin over both Pods");
}

#[test]
fn every_watch_end_lists_again_and_normal_ends_keep_connected() {
    let api = FakeApiServer::start();
    put_worker(&api, "solar-worker-0", true);
    let shim = MockBackend::start("shim");
    let r = router(&api, &shim, FAST_CYCLE);
    wait_workers(&r, &["solar-worker-0"], STEP);
    // Normal ends: the server closes each watch after 1 s; `connected` never drops.
    let t0 = Instant::now();
    let lists0 = api.stats()["pods"]["lists"].as_u64().unwrap();
    while t0.elapsed() < Duration::from_millis(3500) {
        assert_eq!(
            metric(&r, "continuum_dynamo_discovery_connected", &[]),
            1.0,
            "connected dropped during a normal cycle at {:?}",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
    let stats = api.stats();
    assert!(
        stats["pods"]["lists"].as_u64().unwrap() >= lists0 + 2,
        "{stats:#}"
    );
    assert_eq!(stats["pods"]["last_watch"]["timeoutSeconds"], "1");
    // 410 Gone, an early EOF and a stall each end the session with their own reason, and the
    // next one lists everything again (the next watch meets the fault).
    for (fault, reason) in [
        ("gone", "answered 410"),
        ("error_event", "resourceVersion expired"),
        ("eof", "transport"),
        ("stall", "watch stalled"),
    ] {
        let before = api.stats()["pods"]["lists"].as_u64().unwrap();
        api.fault("pods", fault, 0, 1);
        let deadline = Instant::now() + Duration::from_secs(15);
        while !r.stderr().contains(reason) {
            assert!(
                Instant::now() < deadline,
                "no session end with {reason:?} after {fault}:\n{}",
                r.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        while api.stats()["pods"]["lists"].as_u64().unwrap() < before + 2 {
            assert!(Instant::now() < deadline, "no re-list after {fault}");
            std::thread::sleep(Duration::from_millis(50));
        }
        wait_workers(&r, &["solar-worker-0"], STEP);
    }
}

#[test]
fn a_token_without_the_watch_verb_fails_clearly_and_keeps_the_last_view() {
    let api = FakeApiServer::start();
    put_worker(&api, "solar-worker-0", true);
    let shim = MockBackend::start("shim");
    let r = router(&api, &shim, FAST_CYCLE);
    wait_workers(&r, &["solar-worker-0"], STEP);
    api.allow_verbs(&["get", "list"]);
    let deadline = Instant::now() + STEP;
    while !r.stderr().contains("Forbidden") {
        assert!(
            Instant::now() < deadline,
            "no Forbidden in:\n{}",
            r.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(worker_ids(&r).len(), 1, "the last view is kept");
    assert_eq!(metric(&r, "continuum_dynamo_discovery_connected", &[]), 0.0);
    let resp = chat(r.addr(), &chat_body(MODEL, "still", false), &[]);
    assert_eq!(resp.status, 200, "{}", resp.text());
}

#[test]
fn pods_beyond_the_cap_are_refused_and_counted_and_the_rest_serve() {
    // 16,384 are held (the first by name); the 16,385th is refused and counted.
    const CAP: usize = 16_384;
    let api = FakeApiServer::start();
    let pods: Vec<serde_json::Value> = (0..=CAP)
        .map(|i| {
            operator_pod(
                &format!("solar-worker-{i:05}"),
                DYN_NS,
                "worker",
                None,
                Some("VllmWorker"),
                true,
            )
        })
        .collect();
    api.put_many("pods", NS, &pods);
    let shim = MockBackend::start("shim");
    let r = router(&api, &shim, "");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = worker_ids(&r).len();
        if n == CAP {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{n} workers; stderr:\n{}",
            r.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let ids = worker_ids(&r);
    assert!(ids.contains(&pod_id("solar-worker-00000")));
    assert!(
        !ids.contains(&pod_id(&format!("solar-worker-{CAP:05}"))),
        "the last by name is the one refused"
    );
    assert_eq!(
        metric(
            &r,
            "continuum_dynamo_discovery_events_total",
            &[("kind", "refused")]
        ),
        1.0
    );
    let stats = api.stats();
    assert!(
        stats["pods"]["lists"].as_u64().unwrap() >= 33,
        "pages of 500: {stats:#}"
    );
    let resp = chat(r.addr(), &chat_body(MODEL, "at the cap", false), &[]);
    assert_eq!(resp.status, 200, "{}", resp.text());
}
