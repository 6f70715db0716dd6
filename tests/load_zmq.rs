//! Load signals end to end: discovery (a real etcd) names a `kv_metrics` publisher, the router's
//! own bounded ZMTP client subscribes to a REAL libzmq PUB socket (pyzmq) on the shard the
//! publisher's hash names, and the captured Dynamo 1.6.1 frames land in the load store: the
//! worker gauge follows them, a replay is counted `duplicate`, and the admin view lists the
//! subscription (ADMIN-04) without its address. A publisher named by host name is looked up off
//! the control loop and subscribed at the address found.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::etcd::{EtcdServer, read_dump};
use common::zmq::ZmqPublisher;
use common::{RouterConfig, RouterProcess, metric_value};

const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/fixtures/dynamo-1.6.1"
);
const WORKER: &str = "6a6ca22d4998ac0b";
const PUBLISHER_HEX: &str = "a3d9516d245b1";
const CHANNEL: &str = "v1/event_channels/namespace/agg/component/backend/endpoint/generate/topic/kv_metrics/a3d9516d245b1";

fn frames(n: u32) -> Vec<Vec<u8>> {
    (0..4)
        .map(|k| {
            let p = format!("{FIXTURES}/frames/agg.backend.kv_metrics-{n:03}.f{k}.bin");
            std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
        })
        .collect()
}

fn send(p: &mut ZmqPublisher, n: u32) {
    let f = frames(n);
    let refs: Vec<&[u8]> = f.iter().map(Vec::as_slice).collect();
    p.send(&refs);
}

/// The agg worker's records, with its kv_metrics channel pointing at `endpoint`.
fn seed(etcd: &EtcdServer, endpoint: &str) {
    let dump = read_dump(Path::new(&format!("{FIXTURES}/etcd-dump.txt")));
    for (k, v) in dump {
        let wanted = k == format!("v1/instances/agg/backend/generate/{WORKER}")
            || k == format!("v1/mdc/agg/backend/generate/{WORKER}");
        if wanted {
            etcd.put(&k, &v);
        } else if k == CHANNEL {
            let mut rec: serde_json::Value = serde_json::from_str(&v).unwrap();
            rec["transport"]["config"]["endpoint"] = endpoint.into();
            etcd.put(&k, &rec.to_string());
        }
    }
}

fn config(etcd: &EtcdServer, load: &str) -> RouterConfig {
    let mut cfg = RouterConfig::default().backend("fe-agg", "http://127.0.0.1:9", &["tiny-agg"]);
    cfg.extra_yaml = format!(
        "dynamo:\n  enabled: true\n  discovery:\n    source: etcd\n    etcd:\n      endpoints: [\"{}\"]\n      \
         namespaces: [agg]\n  load:\n{load}  shim:\n    backends: [fe-agg]\n",
        etcd.endpoint()
    );
    cfg
}

const LOOPBACK_ONLY: &str = "    direct_allow_cidrs: [\"127.0.0.0/8\"]\n";

fn router(etcd: &EtcdServer) -> RouterProcess {
    RouterProcess::start(&config(etcd, LOOPBACK_ONLY))
}

fn wait<T>(what: &str, r: &RouterProcess, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what} not reached; router stderr:\n{}",
            r.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn gauge(text: &str) -> Option<f64> {
    metric_value(
        text,
        "continuum_dynamo_worker_kv_used_blocks",
        &[("namespace", "agg"), ("worker", WORKER), ("dp_rank", "0")],
    )
}

fn events(text: &str, result: &str) -> f64 {
    metric_value(
        text,
        "continuum_dynamo_load_events_total",
        &[("result", result)],
    )
    .unwrap_or(0.0)
}

#[test]
fn captured_samples_from_a_real_libzmq_publisher_reach_the_load_store() {
    let etcd = EtcdServer::start();
    let mut publisher = ZmqPublisher::start();
    seed(&etcd, &publisher.endpoint());
    let r = router(&etcd);

    // The router subscribes with the bare topic (LOAD-ZMTP-01).
    let topic = publisher.wait_subscribed(Duration::from_secs(15));
    assert_eq!(
        topic.as_deref(),
        Some("kv_metrics"),
        "no subscription; stderr:\n{}",
        r.stderr()
    );
    let row = wait("subscription connected", &r, || {
        let v = r.get("/admin/dynamo/workers").json();
        let rows = v["subscriptions"].as_array()?.clone();
        rows.into_iter().find(|s| s["state"] == "connected")
    });
    assert_eq!(row["family"], "kv_metrics");
    assert_eq!(
        row["publisher_id"],
        u64::from_str_radix(PUBLISHER_HEX, 16).unwrap().to_string()
    );
    assert_eq!(row["namespace"], "agg");
    assert_eq!(row["transport"], "direct");
    let admin = r.get("/admin/dynamo/workers").text();
    assert!(
        !admin.contains("tcp://") && !admin.contains(&publisher.port.to_string()),
        "{admin}"
    );

    // Message 1: kv_used_blocks = 3 (decoded.jsonl).
    send(&mut publisher, 1);
    // The gauge (the shared store) and the counter (the subscribing shard's) are written one
    // after the other; a scrape on another shard may fall between them, so wait for both.
    let text = wait("sample applied", &r, || {
        let t = r.metrics();
        (gauge(&t) == Some(3.0) && events(&t, "applied") == 1.0).then_some(t)
    });
    // Nil fields make no series (LOAD-MET-02).
    assert!(
        !text.contains("continuum_dynamo_worker_active_decode_blocks{"),
        "{text}"
    );

    // The same message again is a duplicate (LOAD-STORE-01) and changes nothing.
    send(&mut publisher, 1);
    wait("duplicate counted", &r, || {
        (events(&r.metrics(), "duplicate") == 1.0).then_some(())
    });
    assert_eq!(gauge(&r.metrics()), Some(3.0));

    // Message 2 (next sequence): back to 0 blocks.
    send(&mut publisher, 2);
    let text = wait("second sample applied", &r, || {
        let t = r.metrics();
        (gauge(&t) == Some(0.0) && events(&t, "applied") == 2.0).then_some(t)
    });
    assert_eq!(
        metric_value(
            &text,
            "continuum_dynamo_load_subscriptions",
            &[("state", "connected"), ("transport", "direct")]
        ),
        Some(1.0),
        "{text}"
    );

    // A sequence gap (10 -> 13): the publisher's held samples are discarded, then the message
    // that revealed the gap is applied (LOAD-STORE-14, Q-22), not dropped.
    let gap = generated(u64::from_str_radix(PUBLISHER_HEX, 16).unwrap(), 13, 7);
    let refs: Vec<&[u8]> = gap.iter().map(Vec::as_slice).collect();
    publisher.send(&refs);
    wait("sample after a gap applied", &r, || {
        (gauge(&r.metrics()) == Some(7.0)).then_some(())
    });

    // The worker leaves the registry: its samples and gauge series go at once (LOAD-MET-03).
    etcd.delete(&format!("v1/instances/agg/backend/generate/{WORKER}"));
    wait("departed worker's series removed", &r, || {
        gauge(&r.metrics()).is_none().then_some(())
    });
}

/// A generated kv_metrics message from `publisher`, in the array encoding (N-2 peers).
fn generated(publisher: u64, sequence: u64, kv_used_blocks: u64) -> [Vec<u8>; 4] {
    use continuum_core::discovery::{InstanceId, PublisherId, UnixMillis};
    use continuum_core::dynamo_event::{
        ActiveLoad, Encoding, EventEnvelope, Sequence, encode_active_load, encode_message,
    };
    let load = ActiveLoad {
        worker_id: InstanceId::new(u64::from_str_radix(WORKER, 16).unwrap()),
        dp_rank: 0,
        active_decode_blocks: None,
        active_prefill_tokens: None,
        kv_used_blocks: Some(kv_used_blocks),
    };
    let mut payload = Vec::new();
    encode_active_load(&load, Encoding::Array, &mut payload);
    let env = EventEnvelope {
        publisher_id: PublisherId::new(publisher),
        sequence: Sequence(sequence),
        published_at: UnixMillis(1_796_056_139_389),
        topic: b"kv_metrics",
        payload: &payload,
    };
    encode_message(&env, Encoding::Array).unwrap()
}

#[test]
fn a_restarted_publisher_replaces_samples_whatever_its_sequence() {
    let etcd = EtcdServer::start();
    let mut first = ZmqPublisher::start();
    seed(&etcd, &first.endpoint());
    let r = router(&etcd);
    assert_eq!(
        first.wait_subscribed(Duration::from_secs(15)).as_deref(),
        Some("kv_metrics")
    );
    send(&mut first, 1); // sequence 9, kv_used_blocks 3
    wait("first sample", &r, || {
        (gauge(&r.metrics()) == Some(3.0)).then_some(())
    });

    // The worker's publisher restarts: a new incarnation id and socket, sequence back to 1.
    let new_id: u64 = 0x0bad_cafe_0001;
    let mut second = ZmqPublisher::start();
    let dump = read_dump(Path::new(&format!("{FIXTURES}/etcd-dump.txt")));
    let (_, v) = dump.iter().find(|(k, _)| k == CHANNEL).unwrap();
    let mut rec: serde_json::Value = serde_json::from_str(v).unwrap();
    rec["instance_id"] = new_id.into();
    rec["transport"]["config"]["endpoint"] = second.endpoint().into();
    etcd.put(
        &CHANNEL.replace(PUBLISHER_HEX, &format!("{new_id:x}")),
        &rec.to_string(),
    );
    etcd.delete(CHANNEL);
    assert_eq!(
        second.wait_subscribed(Duration::from_secs(15)).as_deref(),
        Some("kv_metrics")
    );
    let msg = generated(new_id, 1, 5);
    let refs: Vec<&[u8]> = msg.iter().map(Vec::as_slice).collect();
    second.send(&refs);
    wait(
        "restarted publisher's sample replaces the old one",
        &r,
        || (gauge(&r.metrics()) == Some(5.0)).then_some(()),
    );
    // A message claiming the old publisher id over the new socket is an identity mismatch.
    let forged = generated(u64::from_str_radix(PUBLISHER_HEX, 16).unwrap(), 100, 9);
    let refs: Vec<&[u8]> = forged.iter().map(Vec::as_slice).collect();
    second.send(&refs);
    wait("forged id counted", &r, || {
        (metric_value(
            &r.metrics(),
            "continuum_dynamo_load_events_total",
            &[("result", "identity_mismatch")],
        ) >= Some(1.0))
        .then_some(())
    });
    assert_eq!(gauge(&r.metrics()), Some(5.0));
}

fn subscription_state(r: &RouterProcess) -> Option<String> {
    let v = r.get("/admin/dynamo/workers").json();
    v["subscriptions"].as_array()?.first()?["state"]
        .as_str()
        .map(str::to_owned)
}

fn restarts(r: &RouterProcess) -> f64 {
    metric_value(
        &r.metrics(),
        "continuum_dynamo_discovery_events_total",
        &[("kind", "restart")],
    )
    .unwrap_or(0.0)
}

#[test]
fn allow_list_and_transport_reloads_restart_only_the_subscriptions() {
    let etcd = EtcdServer::start();
    let mut publisher = ZmqPublisher::start();
    seed(&etcd, &publisher.endpoint());
    let r = router(&etcd);
    assert_eq!(
        publisher
            .wait_subscribed(Duration::from_secs(15))
            .as_deref(),
        Some("kv_metrics")
    );
    wait("connected", &r, || {
        (subscription_state(&r).as_deref() == Some("connected")).then_some(())
    });
    let restarts_before = restarts(&r);

    // The publisher's address leaves the allow list: the subscription stops and waits (RELOAD-03).
    r.write_config(&config(&etcd, "    direct_allow_cidrs: [\"10.0.0.0/8\"]\n"));
    wait("pending outside the allow list", &r, || {
        (subscription_state(&r).as_deref() == Some("pending")).then_some(())
    });
    // Back inside: a new subscription arrives at the publisher.
    r.write_config(&config(&etcd, LOOPBACK_ONLY));
    assert_eq!(
        publisher
            .wait_subscribed(Duration::from_secs(15))
            .as_deref(),
        Some("kv_metrics")
    );
    wait("connected again", &r, || {
        (subscription_state(&r).as_deref() == Some("connected")).then_some(())
    });
    // transport: broker without an event bus: pending, never a silent direct connection (BROKER-12).
    r.write_config(&config(
        &etcd,
        "    transport: broker\n    direct_allow_cidrs: [\"127.0.0.0/8\"]\n",
    ));
    wait("pending under broker transport", &r, || {
        (subscription_state(&r).as_deref() == Some("pending")).then_some(())
    });
    // Discovery itself never restarted.
    assert_eq!(
        restarts(&r),
        restarts_before,
        "a load-only reload restarted discovery"
    );
    assert_eq!(r.get("/admin/dynamo/workers").json()["connected"], true);
}

fn worker_load(r: &RouterProcess) -> serde_json::Value {
    let v = r.get("/admin/dynamo/workers").json();
    v["workers"]
        .as_array()
        .and_then(|w| w.first())
        .map(|w| w["load"][0].clone())
        .unwrap_or_default()
}

#[test]
fn samples_go_stale_by_receipt_time() {
    let etcd = EtcdServer::start();
    let mut publisher = ZmqPublisher::start();
    seed(&etcd, &publisher.endpoint());
    let r = RouterProcess::start(&config(
        &etcd,
        "    max_staleness: \"1s\"\n    direct_allow_cidrs: [\"127.0.0.0/8\"]\n",
    ));
    assert_eq!(
        publisher
            .wait_subscribed(Duration::from_secs(15))
            .as_deref(),
        Some("kv_metrics")
    );
    assert_eq!(worker_load(&r)["fresh"], false, "nothing received yet");
    // The capture's published_at is a year old: freshness must come from the receipt time.
    send(&mut publisher, 1);
    let fresh = wait("fresh sample", &r, || {
        let l = worker_load(&r);
        (l["fresh"] == true).then_some(l)
    });
    assert_eq!(fresh["kv_used_blocks"], 3, "{fresh}");
    assert!(fresh["active_decode_blocks"].is_null(), "{fresh}");
    let stale = wait("sample stale after max_staleness", &r, || {
        let l = worker_load(&r);
        (l["fresh"] == false && l["kv_used_blocks"] == 3).then_some(l)
    });
    assert!(stale["age_ms"].as_u64().unwrap() >= 1000, "{stale}");
}

#[test]
fn a_publisher_named_by_host_is_looked_up_in_the_background_and_rechecked_without_a_lookup() {
    let etcd = EtcdServer::start();
    let mut publisher = ZmqPublisher::start();
    // The record names the publisher by host name: the control thread looks it up off its loop.
    let by_name = publisher.endpoint().replace("127.0.0.1", "localhost");
    assert_ne!(by_name, publisher.endpoint());
    seed(&etcd, &by_name);
    let r = router(&etcd);
    assert_eq!(
        publisher
            .wait_subscribed(Duration::from_secs(15))
            .as_deref(),
        Some("kv_metrics"),
        "no subscription to the looked-up address; stderr:\n{}",
        r.stderr()
    );
    wait("connected", &r, || {
        (subscription_state(&r).as_deref() == Some("connected")).then_some(())
    });
    // The policy is checked again from the address found: leaving the allow list and coming
    // back need no new lookup, and the subscription follows each time.
    r.write_config(&config(&etcd, "    direct_allow_cidrs: [\"10.0.0.0/8\"]\n"));
    wait("pending outside the allow list", &r, || {
        (subscription_state(&r).as_deref() == Some("pending")).then_some(())
    });
    r.write_config(&config(&etcd, LOOPBACK_ONLY));
    wait("connected again", &r, || {
        (subscription_state(&r).as_deref() == Some("connected")).then_some(())
    });
}
