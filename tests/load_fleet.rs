//! Load signals from a REAL Dynamo 1.6.1 fleet: every worker's `kv_metrics` publisher is
//! subscribed, on the shard its publisher-id hash names, and the worker gauges rise while
//! requests run through the real frontend and fall back to 0 after (publishers send a sample when
//! load starts and one when it returns to zero).
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::fleet::{Fleet, FleetSpec, Role};
use common::{RouterProcess, chat, metric_value};
use continuum_core::discovery::PublisherId;
use continuum_core::subscriptions::shard_of;

const SHARDS: usize = 2;

fn router_for(fleet: &Fleet) -> RouterProcess {
    let mut cfg = fleet.router_config();
    cfg.shards = SHARDS.to_string();
    RouterProcess::start(&cfg)
}

fn kv_used(text: &str, worker_hex: &str) -> Option<f64> {
    metric_value(
        text,
        "continuum_dynamo_worker_kv_used_blocks",
        &[("worker", worker_hex)],
    )
}

#[test]
fn every_publisher_is_subscribed_on_its_shard_and_gauges_follow_real_load() {
    let fleet = Fleet::start(
        &FleetSpec::new()
            .agg("tiny-agg", 2)
            .disagg("tiny-disagg", 1, 1),
    );
    let r = router_for(&fleet);
    let publishers: Vec<u64> = fleet
        .info
        .workers
        .iter()
        .filter_map(|w| w.publishers.get("kv_metrics").map(|p| p.publisher_id))
        .collect();
    assert!(publishers.len() >= 3, "{:?}", fleet.info.workers);

    // Every kv_metrics publisher connected, on the shard its hash names.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = r.get("/admin/dynamo/workers").json();
        let rows = v["subscriptions"].as_array().cloned().unwrap_or_default();
        let done = publishers.iter().all(|id| {
            rows.iter().any(|row| {
                row["publisher_id"]
                    .as_str()
                    .and_then(|s| s.parse::<u64>().ok())
                    == Some(*id)
                    && row["state"] == "connected"
                    && row["shard"] == shard_of(PublisherId::new(*id), SHARDS)
            })
        });
        if done {
            assert_eq!(v["load_publishers"], publishers.len(), "{v:#}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "subscriptions not all connected on their shards: {rows:#?}\n{}",
            r.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Load through the real frontend, pinned to one aggregated worker: its gauge rises above 0
    // while requests run, then returns to 0.
    let victim = fleet
        .info
        .workers
        .iter()
        .find(|w| w.role == Role::Aggregated)
        .unwrap()
        .clone();
    let fe = fleet.frontend("agg");
    let pin = victim.instance_id.to_string();
    let body = br#"{"model":"tiny-agg","messages":[{"role":"user","content":"tell me a long story about routers and caches and blocks"}],"max_tokens":256}"#;
    let load = std::thread::spawn(move || {
        let mut handles = Vec::new();
        for _ in 0..4 {
            let pin = pin.clone();
            handles.push(std::thread::spawn(move || {
                for _ in 0..3 {
                    let resp = chat(fe, body, &[("x-dynamo-worker-instance-id", &pin)]);
                    assert_eq!(resp.status, 200, "{}", resp.text());
                }
            }));
        }
        for h in handles {
            h.join().unwrap();
        }
    });
    let mut peak = 0.0f64;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !load.is_finished() && Instant::now() < deadline {
        if let Some(v) = kv_used(&r.metrics(), &victim.instance_id_hex) {
            peak = peak.max(v);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    load.join().unwrap();
    assert!(
        peak > 0.0,
        "the pinned worker's kv_used_blocks never rose above 0 while requests ran"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if kv_used(&r.metrics(), &victim.instance_id_hex) == Some(0.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "gauge did not return to 0:\n{}",
            r.metrics()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = r.metrics();
    assert!(
        metric_value(
            &text,
            "continuum_dynamo_load_events_total",
            &[("result", "applied")]
        )
        .unwrap_or(0.0)
            >= 2.0,
        "{text}"
    );
    eprintln!(
        "peak kv_used_blocks of {} under load: {peak}",
        victim.instance_id_hex
    );
}
