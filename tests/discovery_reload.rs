#![cfg(feature = "dynamo")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
//! End-to-end tests of discovery reloads (RELOAD-04..07) against a REAL etcd (`/usr/bin/etcd`): the router binary
//! watches an etcd loaded with the recorded Dynamo 1.6.1 fleet
//! (`../shared/fixtures/dynamo-1.6.1/etcd-dump.txt`, namespaces `agg` and `disagg`, 4 workers),
//! and every test reads the result through `GET /admin/dynamo/workers` and `/metrics`.
//!
//! Each test owns its etcd and its router; every wait is a poll against a deadline.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::discovery::{
    CONNECTED, Discovery, EVENTS, FIXTURE, FIXTURE_WORKERS, fixture_ids, fixture_pairs,
    fixture_setup, ids, metric, new_worker, router_config, set, view, wait_fleet, wait_view,
    worker,
};
use common::etcd::EtcdServer;
use common::{RouterProcess, STEP};
use serde_json::json;

/// Reload `namespaces: [agg, disagg]` -> `[agg]`: the disagg workers are pruned, the agg
/// workers stay throughout (same `first_seen`), and one watcher restart is counted (RELOAD-07).
#[test]
fn reload_removing_a_namespace_prunes_only_its_workers() {
    let (etcd, r) = fixture_setup();
    let before = view(&r);
    let restarts = metric(&r, EVENTS, &[("kind", "restart")]);
    let g0 = r.generation();
    let mut d = Discovery::new(&etcd);
    d.namespaces = vec!["agg"];
    r.write_config(&router_config(&d));
    r.sighup();
    let agg = set(&["6a6ca22d4998ac0b", "6a6ca22d4998ac16"]);
    let deadline = Instant::now() + STEP;
    let after = loop {
        let v = view(&r);
        let now = ids(&v);
        assert!(
            now.is_superset(&agg),
            "the kept namespace's workers vanished during the reload: {v:#}"
        );
        if now == agg && v["namespaces"] == json!(["agg"]) && v["connected"] == true {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "disagg not pruned within {STEP:?}: {v:#}\nrouter stderr:\n{}",
            r.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(r.generation() > g0);
    for hex in agg {
        assert_eq!(
            worker(&after, &hex)["first_seen"],
            worker(&before, &hex)["first_seen"],
            "kept worker {hex} was re-created"
        );
    }
    assert_eq!(
        metric(&r, EVENTS, &[("kind", "restart")]),
        restarts + 1.0,
        "one watcher restart for the namespaces change"
    );
}

/// Reload `dynamo.enabled: false`: `enabled: false` with empty lists (ADMIN-07) and no restart
/// counted (RELOAD-05); enabling again starts a watcher (counted) and the fleet comes back.
#[test]
fn reload_disabling_discovery_empties_the_view_without_a_restart() {
    let (etcd, r) = fixture_setup();
    let restarts = metric(&r, EVENTS, &[("kind", "restart")]);
    let mut d = Discovery::new(&etcd);
    d.enabled = false;
    r.write_config(&router_config(&d));
    r.sighup();
    let v = wait_view(&r, "enabled: false", STEP, |v| v["enabled"] == false);
    assert_eq!(v["connected"], false, "{v:#}");
    assert_eq!(v["workers"], json!([]), "{v:#}");
    assert_eq!(v["load_publishers"], 0, "{v:#}");
    assert_eq!(v["kv_event_publishers"], 0, "{v:#}");
    assert_eq!(v["subscriptions"], json!([]), "{v:#}");
    assert_eq!(metric(&r, CONNECTED, &[]), 0.0);
    assert_eq!(
        metric(&r, EVENTS, &[("kind", "restart")]),
        restarts,
        "disabling is not a restart"
    );

    d.enabled = true;
    r.write_config(&router_config(&d));
    r.sighup();
    wait_fleet(&r, &fixture_ids());
    assert_eq!(
        metric(&r, EVENTS, &[("kind", "restart")]),
        restarts + 1.0,
        "enabling starts a watcher (reason enabled)"
    );
}

/// Reload of only `watch_reconnect_backoff`: the watcher restarts (counted) but the fleet is
/// kept throughout, with the same `first_seen` (RELOAD-06, DISC-ETCD-09).
#[test]
fn reload_changing_only_the_backoff_keeps_the_fleet() {
    let (etcd, r) = fixture_setup();
    let before = view(&r);
    let restarts = metric(&r, EVENTS, &[("kind", "restart")]);
    let mut d = Discovery::new(&etcd);
    d.backoff_initial = "200ms";
    r.write_config(&router_config(&d));
    r.sighup();
    let deadline = Instant::now() + STEP;
    loop {
        let v = view(&r);
        assert_eq!(
            ids(&v),
            fixture_ids(),
            "the fleet changed during a backoff-only reload: {v:#}"
        );
        if metric(&r, EVENTS, &[("kind", "restart")]) == restarts + 1.0 && v["connected"] == true {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no restart counted within {STEP:?}; router stderr:\n{}",
            r.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The new watcher's resync is done once connected; the view is still the same workers.
    let after = wait_fleet(&r, &fixture_ids());
    for (_, hex, ..) in FIXTURE_WORKERS {
        assert_eq!(
            worker(&after, hex)["first_seen"],
            worker(&before, hex)["first_seen"],
            "worker {hex} was re-created"
        );
    }
}

/// Reload to another etcd (a connection change): the registry is reset and then holds exactly
/// the new etcd's fleet, and one restart is counted (RELOAD-04, DISC-ETCD-08).
#[test]
fn reload_to_another_etcd_replaces_the_fleet() {
    let (_etcd_a, r) = fixture_setup();
    let restarts = metric(&r, EVENTS, &[("kind", "restart")]);
    let etcd_b = EtcdServer::start();
    for (k, v) in fixture_pairs() {
        if k.contains("/disagg/") {
            etcd_b.put(&k, &v);
        }
    }
    let only_b = new_worker("agg", 0x6a6c_a22d_4998_ac37, "tiny-agg", 32);
    only_b.put(&etcd_b);
    r.write_config(&router_config(&Discovery::new(&etcd_b)));
    r.sighup();
    wait_fleet(
        &r,
        &set(&["6a6ca22d4998ac07", "6a6ca22d4998ac09", &only_b.hex()]),
    );
    assert_eq!(
        metric(&r, EVENTS, &[("kind", "restart")]),
        restarts + 1.0,
        "one restart for the endpoints change"
    );
}

/// A router started while etcd is down serves anyway, reports `connected: false`, and picks the
/// fleet up once etcd comes up (DISC-ETCD-03 backoff and retry from step 1).
#[test]
fn router_started_before_etcd_connects_when_etcd_comes_up() {
    let mut etcd = EtcdServer::start();
    etcd.load_dump(Path::new(FIXTURE));
    etcd.stop();
    let r = RouterProcess::start(&router_config(&Discovery::new(&etcd)));
    let deadline = Instant::now() + STEP;
    while !r.stderr().contains("session ended") {
        assert!(
            Instant::now() < deadline,
            "no failed discovery session logged; stderr:\n{}",
            r.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let v = view(&r);
    assert_eq!(
        (&v["enabled"], &v["connected"]),
        (&json!(true), &json!(false))
    );
    assert_eq!(v["workers"], json!([]));
    assert_eq!(metric(&r, CONNECTED, &[]), 0.0);
    etcd.restart();
    wait_fleet(&r, &fixture_ids());
    assert_eq!(metric(&r, CONNECTED, &[]), 1.0);
}
