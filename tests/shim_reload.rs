#![cfg(feature = "dynamo")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
//! Reloading the shim config on a running router (RELOAD-02, RELOAD-08): pool changes apply from
//! the next request without restarting discovery, and a namespace removed from the config is
//! never pinned again even while its workers are still in the fleet view.

mod common;

use std::time::Duration;

use common::shim::{AGG, DISAGG, dynamo_yaml, metric, pin, setup};
use common::{MockBackend, STEP, chat, chat_body};

#[test]
fn a_new_pool_replica_takes_the_next_request_without_a_discovery_restart() {
    let s = setup(true, None);
    let resp = chat(s.router.addr(), &chat_body(AGG, "before", false), &[]);
    assert_eq!(resp.status, 200);
    assert_eq!(s.shim_agg.request_count(), 1);
    let restarts_before = metric(
        &s,
        "continuum_dynamo_discovery_events_total",
        &[("kind", "restart")],
    );
    // Replace the agg pool's replica by a new one.
    let fresh = MockBackend::start("shim-fresh");
    let mut cfg = s.cfg.clone().backend("shim-fresh", &fresh.url(), &[]);
    cfg.extra_yaml = dynamo_yaml(&s.root, "shim-fresh", true);
    let generation = s.router.generation();
    s.router.write_config(&cfg);
    s.router.sighup();
    s.router.wait_generation(generation + 1, STEP);
    let resp = chat(s.router.addr(), &chat_body(AGG, "after", false), &[]);
    assert_eq!(resp.status, 200, "{}", resp.text());
    let r = fresh.wait_requests(1, STEP).pop().unwrap();
    assert!(
        pin(&r, "x-dynamo-worker-instance-id").is_some(),
        "still pinned"
    );
    assert_eq!(
        s.shim_agg.request_count(),
        1,
        "the old replica is out of the pool"
    );
    assert_eq!(
        metric(
            &s,
            "continuum_dynamo_discovery_events_total",
            &[("kind", "restart")]
        ),
        restarts_before,
        "a pool change does not restart discovery"
    );
}

#[test]
fn a_namespace_dropped_from_the_config_is_never_pinned_again() {
    let s = setup(true, None);
    let resp = chat(s.router.addr(), &chat_body(DISAGG, "before", false), &[]);
    assert_eq!(resp.status, 200);
    assert_eq!(s.shim_disagg.request_count(), 1);
    let mut cfg = s.cfg.clone();
    cfg.extra_yaml = dynamo_yaml(&s.root, "shim-agg", false);
    let generation = s.router.generation();
    s.router.write_config(&cfg);
    s.router.sighup();
    s.router.wait_generation(generation + 1, STEP);
    // From the next request on, whether or not discovery has pruned the namespace yet, the
    // disaggregated model has no candidate: it goes to plain routing, unpinned.
    for i in 0..3 {
        let resp = chat(
            s.router.addr(),
            &chat_body(DISAGG, &format!("after-{i}"), false),
            &[],
        );
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(resp.header("x-continuum-routing-path"), Some("no_worker"));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(s.shim_disagg.request_count(), 1);
    assert_eq!(s.unified.request_count(), 3);
    // The other namespace keeps being pinned.
    let resp = chat(s.router.addr(), &chat_body(AGG, "agg", false), &[]);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("x-continuum-routing-path"), Some("unified"));
}
