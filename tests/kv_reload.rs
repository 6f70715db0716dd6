//! RELOAD-16 end to end: `dynamo.kv.*` applies by reload without touching the load path or
//! discovery. A real etcd holds worker A of the captured 1.6.1 fleet with its `kv_metrics` and
//! `kv-events` channels (and `v1/event_sources`), each pointed at a REAL libzmq publisher. With
//! the KV family off nothing subscribes to kv-events; a reload switching it on subscribes and
//! indexes, while the `kv_metrics` subscription keeps its connection (its publisher sees no new
//! subscription) and the registry keeps its worker (`first_seen` unchanged); switching it off
//! again empties the index, again without touching either.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo-kv")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::etcd::{EtcdServer, read_dump};
use common::kv::{KV_WAIT, KvView, kv_yaml, same, wait_view};
use common::zmq::ZmqPublisher;
use common::{RouterConfig, RouterProcess};
use serde_json::Value;

const KV_FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/fixtures/dynamo-1.6.1/kv-events"
);
const WORKER_HEX: &str = "6a6ca22d7a7ef009";
const KV_SUFFIX: &str = "17beee254453c3";
const LOAD_SUFFIX: &str = "5aebfd54cd59b";
/// How long a subscription that should not happen is waited for.
const QUIET: Duration = Duration::from_secs(3);

fn seed(etcd: &EtcdServer, kv: &str, load: &str) {
    let dump = read_dump(Path::new(&format!(
        "{KV_FIXTURES}/etcd-dump-with-event-sources.txt"
    )));
    let channel = "v1/event_channels/namespace/agg/component/backend/endpoint/generate/topic";
    for (k, v) in dump {
        if k == format!("v1/instances/agg/backend/generate/{WORKER_HEX}")
            || k == format!("v1/mdc/agg/backend/generate/{WORKER_HEX}")
            || k.ends_with(&format!("/topic/kv-events/{KV_SUFFIX}"))
                && k.starts_with("v1/event_sources/")
        {
            etcd.put(&k, &v);
        } else if k == format!("{channel}/kv-events/{KV_SUFFIX}")
            || k == format!("{channel}/kv_metrics/{LOAD_SUFFIX}")
        {
            let mut rec: Value = serde_json::from_str(&v).unwrap();
            let endpoint = if k.contains("/kv-events/") { kv } else { load };
            rec["transport"]["config"]["endpoint"] = endpoint.into();
            etcd.put(&k, &rec.to_string());
        }
    }
}

fn config(etcd: &EtcdServer, kv: bool) -> RouterConfig {
    let mut cfg = RouterConfig::default().backend("fe-agg", "http://127.0.0.1:9", &["tiny-agg"]);
    let mut yaml = kv_yaml(&etcd.endpoint(), &[("agg", "fe-agg")]);
    if !kv {
        yaml = yaml.replace("  kv:\n    enabled: true\n", "  kv:\n    enabled: false\n");
        assert!(yaml.contains("enabled: false"), "{yaml}");
    }
    cfg.extra_yaml = yaml;
    cfg
}

fn first_seen(r: &RouterProcess) -> String {
    let v = r.get("/admin/dynamo/workers").json();
    let w = v["workers"]
        .as_array()
        .and_then(|ws| ws.iter().find(|w| w["instance_id"] == WORKER_HEX))
        .unwrap_or_else(|| panic!("worker {WORKER_HEX} missing: {v:#}"));
    w["first_seen"].as_str().expect("first_seen").to_owned()
}

/// The captured messages of worker A's kv-events publisher, in capture order.
fn captured_a() -> Vec<Vec<Vec<u8>>> {
    let text = std::fs::read_to_string(format!("{KV_FIXTURES}/raw-frames.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|m| m["frames_hex"][1] == format!("00{KV_SUFFIX}"))
        .map(|m| {
            m["frames_hex"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| {
                    let h = h.as_str().unwrap();
                    (0..h.len())
                        .step_by(2)
                        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
                        .collect()
                })
                .collect()
        })
        .collect()
}

#[test]
fn kv_settings_apply_by_reload_without_restarting_the_load_path_or_discovery() {
    let etcd = EtcdServer::start();
    let mut kv_pub = ZmqPublisher::start();
    let mut load_pub = ZmqPublisher::start();
    seed(&etcd, &kv_pub.endpoint(), &load_pub.endpoint());
    let r = RouterProcess::start(&config(&etcd, false));

    assert_eq!(
        load_pub.wait_subscribed(Duration::from_secs(15)).as_deref(),
        Some("kv_metrics"),
        "{}",
        r.stderr()
    );
    assert_eq!(
        kv_pub.wait_subscribed(QUIET),
        None,
        "kv-events subscribed while off"
    );
    let seen = first_seen(&r);
    let view = KvView::read(&r);
    same("kv-events rows while off", view.subscriptions.len(), 0).unwrap();
    same("kv_event_publishers while off", view.publishers, 1).unwrap();

    // On by reload: the kv-events publisher is subscribed, the load subscription is not redone.
    let generation = r.generation();
    r.write_config(&config(&etcd, true));
    r.sighup();
    r.wait_generation(generation + 1, Duration::from_secs(15));
    assert_eq!(
        kv_pub.wait_subscribed(Duration::from_secs(15)).as_deref(),
        Some("kv-events"),
        "{}",
        r.stderr()
    );
    let messages = captured_a();
    assert!(!messages.is_empty());
    let first: Vec<&[u8]> = messages[0].iter().map(Vec::as_slice).collect();
    kv_pub.send(&first);
    let worker_id = u64::from_str_radix(WORKER_HEX, 16).unwrap();
    wait_view("the first captured batch indexed", &r, KV_WAIT, |v| {
        same("applied", v.count("applied"), 1)?;
        let row = v.rows.get(&(worker_id, 0)).copied();
        same("a row for rank 0", row.map(|r| r.blocks > 0), Some(true))
    });
    assert_eq!(
        load_pub.wait_subscribed(QUIET),
        None,
        "the kv_metrics subscription reconnected on a kv reload"
    );
    assert_eq!(first_seen(&r), seen, "discovery's registry was reset");

    // Off again: the index empties; still nothing else moves.
    let generation = r.generation();
    r.write_config(&config(&etcd, false));
    r.sighup();
    r.wait_generation(generation + 1, Duration::from_secs(15));
    wait_view("kv off empties the index", &r, KV_WAIT, |v| {
        same("rows", v.rows.len(), 0)?;
        same("kv-events subscriptions", v.subscriptions.len(), 0)?;
        same("index_blocks", v.index_blocks, Some(0))?;
        same("index_ownerships", v.index_ownerships, Some(0))
    });
    assert_eq!(load_pub.wait_subscribed(QUIET), None);
    assert_eq!(first_seen(&r), seen);
}
