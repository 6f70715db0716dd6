#![cfg(feature = "dynamo")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
//! End-to-end tests of Dynamo discovery against a REAL etcd (`/usr/bin/etcd`): the router binary
//! watches an etcd loaded with the recorded Dynamo 1.6.1 fleet
//! (`../shared/fixtures/dynamo-1.6.1/etcd-dump.txt`, namespaces `agg` and `disagg`, 4 workers),
//! and every test reads the result through `GET /admin/dynamo/workers` and `/metrics`.
//!
//! Each test owns its etcd and its router; every wait is a poll against a deadline.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::discovery::{
    CONNECTED, Discovery, FIXTURE, FIXTURE_WORKERS, WORKERS, fixture_ids, fixture_pairs,
    fixture_setup, fixture_value, ids, metric, new_worker, router_config, set, view, wait_fleet,
    wait_metric_eq, wait_view, worker,
};
use common::etcd::{EtcdOptions, EtcdServer, READER_USER};
use common::{RouterProcess, STEP, free_port};
use serde_json::{Value, json};

/// The recorded fleet appears with its roles (`agg` aggregated; `disagg` prefill, and decode on
/// component `backend`), models, block size, capacity and both id forms (ADMIN-02/03/06/09).
#[test]
fn fixture_fleet_appears_with_roles_models_and_capacity() {
    let (_etcd, r) = fixture_setup();
    let v = view(&r);
    assert_eq!(v["enabled"], true, "{v:#}");
    assert_eq!(v["connected"], true, "{v:#}");
    assert_eq!(v["source"], "etcd");
    assert_eq!(v["signals"], json!({"load": true, "capacity": true}));
    assert_eq!(v["namespaces"], json!(["agg", "disagg"]));
    assert_eq!(v["generation"].as_u64(), Some(r.generation()));
    assert_eq!(v["load_publishers"], 4, "kv_metrics channels: {v:#}");
    assert_eq!(v["kv_event_publishers"], 3, "kv-events channels: {v:#}");
    assert!(v["subscriptions"].is_array(), "{v:#}");
    assert_eq!(v["workers"].as_array().map(Vec::len), Some(4));
    for (ns, hex, component, role, model) in FIXTURE_WORKERS {
        let w = worker(&v, hex);
        assert_eq!(w["namespace"], ns, "{w:#}");
        assert_eq!(w["component"], component, "{w:#}");
        assert_eq!(w["role"], role, "{w:#}");
        assert_eq!(w["model"], model, "{w:#}");
        assert_eq!(w["endpoint"], "generate", "{w:#}");
        assert_eq!(w["block_size"], 64, "{w:#}");
        assert_eq!((&w["dp_start_rank"], &w["dp_size"]), (&json!(0), &json!(1)));
        assert_eq!(w["capacity"]["total_kv_blocks"], 16384, "{w:#}");
        assert_eq!(w["capacity"]["max_num_batched_tokens"], 8192, "{w:#}");
        assert_eq!(w["capacity"]["max_num_seqs"], 256, "{w:#}");
        // Both id forms name the same lease: lowercase hex and decimal.
        let decimal = w["worker_id"].as_str().expect("worker_id is a string");
        assert_eq!(
            decimal.parse::<u64>().unwrap(),
            u64::from_str_radix(hex, 16).unwrap(),
            "{w:#}"
        );
        for t in ["first_seen", "last_updated"] {
            let s = w[t]
                .as_str()
                .unwrap_or_else(|| panic!("{t} not a string: {w:#}"));
            assert!(
                s.len() >= 25 && s.as_bytes()[10] == b'T' && (s.ends_with("+00:00")),
                "{t} is not RFC 3339 with offset: {s}"
            );
        }
    }
    // The decode worker's decimal id as the frontend reports it.
    assert_eq!(
        worker(&v, "6a6ca22d4998ac09")["worker_id"],
        "7668682580897082377"
    );
    // Nothing internal leaves the router (ADMIN-06).
    let text = r.get(WORKERS).text();
    for secret in [
        "tcp://",
        "35917",
        "36297",
        "43657",
        "hf_config_json",
        "card_json",
    ] {
        assert!(!text.contains(secret), "{secret:?} leaked: {text}");
    }
    assert_eq!(metric(&r, CONNECTED, &[]), 1.0);
}

/// A worker put into etcd appears, and deleting its records removes it (DISC-ETCD-01).
#[test]
fn put_and_delete_of_a_worker_are_reflected() {
    let (etcd, r) = fixture_setup();
    let g0 = r.generation();
    let w = new_worker("agg", 0x6a6c_a22d_4998_ac30, "tiny-agg", 4096);
    w.put(&etcd);
    let mut want = fixture_ids();
    want.insert(w.hex());
    let v = wait_view(&r, "the new worker with its card", STEP, |v| {
        ids(v) == want && worker(v, &w.hex())["capacity"]["total_kv_blocks"] == 4096
    });
    let nw = worker(&v, &w.hex());
    assert_eq!(nw["worker_id"], w.id.to_string());
    assert_eq!(nw["role"], "aggregated");
    assert_eq!(nw["model"], "tiny-agg");
    assert_eq!(nw["namespace"], "agg");
    assert!(r.generation() > g0);

    let g1 = r.generation();
    assert_eq!(etcd.delete(&w.instance_key), 1);
    wait_view(&r, "the deleted worker gone", STEP, |v| {
        ids(v) == fixture_ids()
    });
    assert!(r.generation() > g1);
    // The card alone makes no worker; deleting it too keeps the fixture fleet.
    assert_eq!(etcd.delete(&w.card_key), 1);
    let g2 = r.generation();
    // A fixture worker deleted through etcd disappears as well.
    assert_eq!(
        etcd.delete("v1/instances/disagg/prefill/generate/6a6ca22d4998ac07"),
        1
    );
    wait_view(&r, "the fixture prefill worker gone", STEP, |v| {
        ids(v) == set(&["6a6ca22d4998ac0b", "6a6ca22d4998ac16", "6a6ca22d4998ac09"])
    });
    assert!(r.generation() > g2);
}

/// A worker whose lease expires disappears: etcd deletes its keys and the router treats that
/// as an ordinary delete (DISC-RO-05); the router never keeps the lease alive (DISC-RO-02).
#[test]
fn worker_disappears_when_its_lease_expires() {
    let (etcd, r) = fixture_setup();
    let w = new_worker("agg", 0x6a6c_a22d_4998_ac31, "tiny-agg", 2048);
    // A lower bound of the last (re)start of the lease's TTL.
    let mut renewed_at = Instant::now();
    let lease = etcd.put_with_lease(
        &[
            (&w.instance_key, &w.instance_value),
            (&w.card_key, &w.card_value),
        ],
        2,
    );
    let mut want = fixture_ids();
    want.insert(w.hex());
    // Until the router shows the worker, renew the lease (a slow machine must not let it expire
    // unseen); from then on nobody renews it.
    let deadline = Instant::now() + STEP;
    while ids(&view(&r)) != want {
        assert!(
            Instant::now() < deadline,
            "the leased worker never appeared; router stderr:\n{}",
            r.stderr()
        );
        renewed_at = Instant::now();
        etcd.keep_alive_once(&lease);
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_view(
        &r,
        "the leased worker gone after its 2 s lease",
        Duration::from_secs(15),
        |v| ids(v) == fixture_ids(),
    );
    assert!(
        renewed_at.elapsed() >= Duration::from_millis(1500),
        "gone {:?} after the last renewal, before the lease could expire",
        renewed_at.elapsed()
    );
    assert!(!etcd.exists(&w.instance_key), "etcd still holds the key");
    assert_eq!(view(&r)["connected"], true);
}

/// Re-putting identical values publishes nothing (API-08, DISC-ETCD-11); a real change does.
#[test]
fn generation_ignores_identical_reputs_and_moves_on_a_change() {
    let (etcd, r) = fixture_setup();
    let before = view(&r);
    let g0 = r.generation();
    // A heartbeat-like re-put of the same bytes, for every record of worker ac16.
    for (k, v) in fixture_pairs() {
        if k.ends_with("/6a6ca22d4998ac16") {
            etcd.put(&k, &v);
        }
    }
    // Then a real change of another worker: watch events arrive in order, so once it shows the
    // re-puts have been applied too.
    let key = "v1/mdc/agg/backend/generate/6a6ca22d4998ac0b";
    let mut card: Value = serde_json::from_str(&fixture_value(key)).unwrap();
    card["card_json"]["runtime_config"]["total_kv_blocks"] = json!(8192);
    etcd.put(key, &card.to_string());
    let after = wait_view(&r, "the changed capacity", STEP, |v| {
        worker(v, "6a6ca22d4998ac0b")["capacity"]["total_kv_blocks"] == 8192
    });
    assert_eq!(
        r.generation(),
        g0 + 1,
        "exactly one publication for the one real change"
    );
    assert_eq!(after["generation"].as_u64(), Some(g0 + 1));
    assert_eq!(
        worker(&after, "6a6ca22d4998ac16"),
        worker(&before, "6a6ca22d4998ac16"),
        "identical re-puts changed the worker"
    );
    // The same change again is idempotent too; the next real change moves on.
    etcd.put(key, &card.to_string());
    card["card_json"]["runtime_config"]["total_kv_blocks"] = json!(4096);
    etcd.put(key, &card.to_string());
    wait_view(&r, "the second change", STEP, |v| {
        worker(v, "6a6ca22d4998ac0b")["capacity"]["total_kv_blocks"] == 4096
    });
    assert_eq!(r.generation(), g0 + 2);
}

/// Keys deleted while the router was disconnected, with the history compacted past its watch
/// revision, are gone after the reconnect: each pass is a full resync (DISC-ETCD-03/04), and
/// surviving workers keep `first_seen` (DISC-ETCD-07).
#[test]
fn resync_after_an_outage_drops_keys_deleted_and_compacted_away() {
    let (mut etcd, r) = fixture_setup();
    let gone = new_worker("agg", 0x6a6c_a22d_4998_ac32, "tiny-agg", 1024);
    gone.put(&etcd);
    let mut want = fixture_ids();
    want.insert(gone.hex());
    let before = wait_fleet(&r, &want);
    let watched_rev = etcd.revision();

    // Outage: the router loses etcd.
    let port = etcd.client_port();
    etcd.stop();
    wait_metric_eq(&r, CONNECTED, &[], 0.0);
    // Maintenance on a port the router does not know: deletes, a new worker, a compaction.
    etcd.restart_on_port(free_port());
    assert_eq!(etcd.delete(&gone.instance_key), 1);
    assert_eq!(etcd.delete(&gone.card_key), 1);
    assert_eq!(
        etcd.delete("v1/instances/agg/backend/generate/6a6ca22d4998ac16"),
        1
    );
    let added = new_worker("disagg", 0x6a6c_a22d_4998_ac33, "tiny-disagg", 512);
    added.put(&etcd);
    let compacted = etcd.compact();
    assert!(compacted > watched_rev);
    let old = etcd.try_etcdctl(&[
        "get",
        "v1/instances/",
        "--prefix",
        &format!("--rev={watched_rev}"),
    ]);
    assert!(
        old.as_ref().is_err_and(|e| e.contains("compacted")),
        "the router's watch revision {watched_rev} is still readable: {old:?}"
    );
    etcd.stop();
    etcd.restart_on_port(port);

    let after = wait_fleet(
        &r,
        &set(&[
            "6a6ca22d4998ac0b",
            "6a6ca22d4998ac07",
            "6a6ca22d4998ac09",
            &added.hex(),
        ]),
    );
    assert_eq!(worker(&after, &added.hex())["model"], "tiny-disagg");
    assert_eq!(
        worker(&after, "6a6ca22d4998ac0b")["first_seen"],
        worker(&before, "6a6ca22d4998ac0b")["first_seen"],
        "first_seen must survive a resync"
    );
    assert_eq!(metric(&r, CONNECTED, &[]), 1.0);
}

/// etcd killed and restarted: `connected` drops to 0 and returns to 1, the view is the same
/// without a new generation (idempotent resync), and the new watch delivers changes.
#[test]
fn etcd_restart_disconnects_and_the_view_recovers() {
    let (mut etcd, mut r) = fixture_setup();
    assert_eq!(metric(&r, CONNECTED, &[]), 1.0);
    let g0 = r.generation();
    etcd.stop();
    wait_metric_eq(&r, CONNECTED, &[], 0.0);
    assert_eq!(view(&r)["connected"], false);
    assert!(r.wait_exit(Duration::ZERO).is_none(), "router exited");
    etcd.restart();
    wait_metric_eq(&r, CONNECTED, &[], 1.0);
    let v = wait_fleet(&r, &fixture_ids());
    assert_eq!(
        r.generation(),
        g0,
        "an identical resync must not publish (DISC-ETCD-11)"
    );
    assert_eq!(v["generation"].as_u64(), Some(g0));
    // The new watch is live.
    let w = new_worker("disagg", 0x6a6c_a22d_4998_ac34, "tiny-disagg", 256);
    w.put(&etcd);
    let mut want = fixture_ids();
    want.insert(w.hex());
    wait_fleet(&r, &want);
}

/// A user whose role may only READ `v1/` is enough (DISC-RO-01): seed and watch work, with the
/// password interpolated from the router's environment (`${ETCD_PASSWORD}`).
#[test]
fn read_only_etcd_user_is_enough() {
    let mut etcd = EtcdServer::start();
    etcd.load_dump(Path::new(FIXTURE));
    etcd.enable_auth("reader-pass-e2e");
    // The role really is read-only.
    let denied = etcd.etcdctl_as_reader(&["put", "v1/instances/agg/x", "{}"]);
    assert!(
        denied
            .as_ref()
            .is_err_and(|e| e.contains("permission denied")),
        "reader could write: {denied:?}"
    );
    let mut d = Discovery::new(&etcd);
    d.auth_user = Some(READER_USER);
    let mut cfg = router_config(&d);
    cfg.env
        .push(("ETCD_PASSWORD".into(), "reader-pass-e2e".into()));
    let r = RouterProcess::start(&cfg);
    wait_fleet(&r, &fixture_ids());
    let w = new_worker("agg", 0x6a6c_a22d_4998_ac35, "tiny-agg", 128);
    w.put(&etcd); // as root
    let mut want = fixture_ids();
    want.insert(w.hex());
    wait_fleet(&r, &want);
    // etcd restarted (its auth tokens are gone): the router authenticates again and watches.
    etcd.stop();
    wait_metric_eq(&r, CONNECTED, &[], 0.0);
    etcd.restart();
    assert_eq!(etcd.delete(&w.instance_key), 1);
    wait_fleet(&r, &fixture_ids());
    assert!(
        !r.stderr().contains("reader-pass-e2e"),
        "the password reached the log"
    );
}

/// A wrong password: discovery stays disconnected with an empty fleet, keeps retrying, and the
/// router keeps serving.
#[test]
fn wrong_etcd_password_stays_disconnected_without_crashing() {
    let mut etcd = EtcdServer::start();
    etcd.load_dump(Path::new(FIXTURE));
    etcd.enable_auth("reader-pass-e2e");
    let mut d = Discovery::new(&etcd);
    d.auth_user = Some(READER_USER);
    let mut cfg = router_config(&d);
    cfg.env.push(("ETCD_PASSWORD".into(), "wrong-pass".into()));
    cfg.env
        .push(("ETCD_PASSWORD_FIXED".into(), "reader-pass-e2e".into()));
    let mut r = RouterProcess::start(&cfg);
    // Two failed sessions logged: it tried, failed and tried again.
    let deadline = Instant::now() + STEP;
    while r.stderr().matches("session ended").count() < 2 {
        assert!(
            Instant::now() < deadline,
            "no two failed discovery sessions logged within {STEP:?}; stderr:\n{}",
            r.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let v = view(&r);
    assert_eq!(v["enabled"], true);
    assert_eq!(v["connected"], false, "{v:#}");
    assert_eq!(v["workers"], json!([]), "{v:#}");
    assert_eq!(metric(&r, CONNECTED, &[]), 0.0);
    assert!(r.wait_exit(Duration::ZERO).is_none(), "router exited");
    assert_eq!(r.get("/health").status, 200);
    assert!(
        !r.stderr().contains("wrong-pass"),
        "the password reached the log"
    );
}

/// TLS to etcd with certificates generated here (CA, server cert for 127.0.0.1 / localhost,
/// client certificate required by `--client-cert-auth`): discovery works over `https://`.
#[test]
fn discovery_over_tls_with_client_certificates() {
    let etcd = EtcdServer::start_with(EtcdOptions { tls: true });
    assert!(etcd.endpoint().starts_with("https://"));
    etcd.load_dump(Path::new(FIXTURE));
    let r = RouterProcess::start(&router_config(&Discovery::new(&etcd)));
    wait_fleet(&r, &fixture_ids());
    let w = new_worker("agg", 0x6a6c_a22d_4998_ac36, "tiny-agg", 64);
    w.put(&etcd);
    let mut want = fixture_ids();
    want.insert(w.hex());
    wait_fleet(&r, &want);
}
