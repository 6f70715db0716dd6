//! The event-bus tunnel end to end (TEST-06, BROKER-01..14): real libzmq publishers (pyzmq), a
//! real etcd the routers discover the fleet from, the fake Kubernetes API server the brokers
//! discover their advertised publishers from (`DynamoWorkerMetadata`), real
//! `continuum-event-broker` child processes dialling the router's listener over TLS with a
//! bearer token, and two routers side by side: one `transport: direct`, one `transport: broker`.
//!
//! 1. Pending: before any broker connects, every broker subscription is `pending`, the namespace
//!    uncovered (`broker_coverage`, the pending gauges); the direct router is connected.
//! 2. Parity: the same `kv_metrics` and `kv-events` streams (a duplicate sequence, a late one,
//!    another publisher's id, a removal, an `event_id` gap) reach both routers, direct and
//!    through the broker, and leave identical load store and KV index states.
//! 3. Unadvertised: a publisher in etcd but not in the broker's metadata is refused
//!    `target_not_advertised` and never connects through the broker.
//! 4. Broker SIGKILL: every subscription turns pending; events sent meanwhile are missed; a new
//!    broker restores the subscriptions without restarting anything (the router's generation
//!    does not move), and the next event reveals the missed ones as a `gap`.
//! 5. Two brokers: a new broker moves no open stream; SIGKILL the one carrying the streams and
//!    they move to the other.

#![cfg(all(feature = "dynamo-kv", feature = "dynamo-event-bus"))]
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::etcd::EtcdServer;
use common::kube::FakeApiServer;
use common::kv::{kv_message, refs};
use common::tunnel::{
    Bus, EVENTS_ID, HIDDEN_ID, TOKEN_ONE, TOKEN_TWO, WAIT, advertise, block, broker, kv_row,
    metrics_frames, metrics_id, relayed_by, router, seed, stored, sub_row, wait_until, worker,
};
use common::zmq::ZmqPublisher;
use common::{RouterProcess, TempDir, metric_value};
use continuum_core::discovery::InstanceId;
use continuum_core::kv::EngineHash;
use continuum_core::kv::encode::{KvDataRef, KvEventRef};
use continuum_core::kv::event::Tier;
use serde_json::{Value, json};

/// What must be identical between the direct and the broker router: every worker's load
/// samples (their fields) and KV rows (blocks, last event id), the event counters and the index
/// gauges. Ages and freshness are left out (they depend on when the page is read).
fn state(r: &RouterProcess) -> Value {
    let admin = r.get("/admin/dynamo/workers").json();
    let workers: Vec<Value> = admin["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            let load: Vec<Value> = w["load"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|l| {
                    json!([
                        l["dp_rank"],
                        l["active_decode_blocks"],
                        l["active_prefill_tokens"],
                        l["kv_used_blocks"]
                    ])
                })
                .collect();
            let kv: Vec<Value> = w["kv"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|k| json!([k["dp_rank"], k["blocks"], k["last_event_id"]]))
                .collect();
            json!({"worker": w["worker_id"], "load": load, "kv": kv})
        })
        .collect();
    let text = r.metrics();
    let count = |name: &str, result: &str| metric_value(&text, name, &[("result", result)]);
    let mut counters = serde_json::Map::new();
    for result in [
        "applied",
        "duplicate",
        "identity_mismatch",
        "gap",
        "malformed",
        "stale",
    ] {
        counters.insert(
            format!("load/{result}"),
            json!(count("continuum_dynamo_load_events_total", result)),
        );
        counters.insert(
            format!("kv/{result}"),
            json!(count("continuum_dynamo_kv_events_total", result)),
        );
    }
    json!({
        "workers": workers,
        "counters": counters,
        "index_blocks": metric_value(&text, "continuum_dynamo_kv_index_blocks", &[]),
        "index_ownerships": metric_value(&text, "continuum_dynamo_kv_index_ownerships", &[]),
    })
}

fn kv_count(r: &RouterProcess, result: &str) -> f64 {
    metric_value(
        &r.metrics(),
        "continuum_dynamo_kv_events_total",
        &[("result", result)],
    )
    .unwrap_or(0.0)
}

#[test]
fn subscriptions_run_through_real_brokers_as_they_run_direct_and_survive_a_broker_sigkill() {
    let dir = TempDir::new("broker-tunnel");
    let bus = Bus::new(dir.path());
    let etcd = EtcdServer::start();
    let mut pm = ZmqPublisher::start();
    let mut pk = ZmqPublisher::start();
    let hidden = ZmqPublisher::start();
    seed(
        &etcd,
        &pm.endpoint(),
        &pk.endpoint(),
        Some(&hidden.endpoint()),
    );
    let api = FakeApiServer::start();
    advertise(&api, &pm.endpoint(), &pk.endpoint());

    let direct = router(&etcd, "direct", None);
    let tunnel = router(&etcd, "broker", Some(&bus));
    for p in [&mut pm, &mut pk] {
        assert!(
            p.wait_subscribed(WAIT).is_some(),
            "direct router subscribes"
        );
    }

    // 1. No broker yet: pending, uncovered, counted per family and namespace.
    for (family, id) in [
        ("kv_metrics", metrics_id()),
        ("kv-events", EVENTS_ID),
        ("kv_metrics", HIDDEN_ID),
    ] {
        wait_until("broker subscriptions pending", &tunnel, || {
            let row = sub_row(&tunnel, family, id)?;
            (row["state"] == "pending"
                && row["transport"] == "broker"
                && row.get("broker").is_none())
            .then_some(())
        });
    }
    let admin = tunnel.get("/admin/dynamo/workers").json();
    assert_eq!(
        admin["broker_coverage"]["agg"],
        json!({"covered": false, "brokers": 0, "pending_subscriptions": 3}),
        "{admin:#}"
    );
    let text = tunnel.metrics();
    for (labels, want) in [
        (vec![("family", "kv_metrics"), ("namespace", "agg")], 2.0),
        (vec![("family", "kv-events"), ("namespace", "agg")], 1.0),
    ] {
        assert_eq!(
            metric_value(
                &text,
                "continuum_dynamo_broker_pending_subscriptions",
                &labels
            ),
            Some(want),
            "{text}"
        );
    }
    assert_eq!(
        metric_value(
            &text,
            "continuum_dynamo_load_subscriptions",
            &[("state", "pending"), ("transport", "broker")]
        ),
        Some(2.0)
    );
    assert!(
        direct
            .get("/admin/dynamo/workers")
            .json()
            .get("broker_coverage")
            .is_none()
    );

    // A broker connects: the pending subscriptions wake and connect through it.
    let one = broker("b-one", TOKEN_ONE, &bus, &api);
    one.wait_healthy(WAIT);
    for p in [&mut pm, &mut pk] {
        assert!(
            p.wait_subscribed(WAIT).is_some(),
            "the broker relays the tunnel router's subscription; broker stderr:\n{}",
            one.stderr()
        );
    }
    for (family, id) in [("kv_metrics", metrics_id()), ("kv-events", EVENTS_ID)] {
        let by = wait_until("relayed by b-one", &tunnel, || {
            relayed_by(&tunnel, family, id)
        });
        assert_eq!(by, "b-one");
    }
    let admin = tunnel.get("/admin/dynamo/workers").json();
    assert_eq!(
        admin["broker_coverage"]["agg"]["covered"], true,
        "{admin:#}"
    );
    assert_eq!(admin["broker_coverage"]["agg"]["brokers"], 1, "{admin:#}");
    let text = admin.to_string();
    assert!(
        !text.contains("tcp://") && !text.contains(&pm.port.to_string()),
        "{text}"
    );

    // 3. The hidden publisher is refused by the broker and never connects.
    wait_until("target_not_advertised at the broker", &tunnel, || {
        one.get("/metrics")
            .contains("continuum_event_broker_refusals_total{reason=\"target_not_advertised\"} ")
            .then_some(())
            .filter(|()| {
                !one.get("/metrics").contains(
                    "continuum_event_broker_refusals_total{reason=\"target_not_advertised\"} 0",
                )
            })
    });
    let row = sub_row(&tunnel, "kv_metrics", HIDDEN_ID).unwrap();
    assert_ne!(row["state"], "connected", "{row}");

    // 2. Parity: the same streams, direct and through the broker.
    let chain = [block(1), block(2), block(3)];
    let child = [block(4)];
    let after_gap = [block(10), block(11)];
    let events: Vec<[Vec<u8>; 4]> = vec![
        kv_message(EVENTS_ID, 1, &[stored(1, None, &chain)]),
        kv_message(EVENTS_ID, 2, &[stored(2, Some(3), &child)]),
        // The same sequence again: a duplicate.
        kv_message(EVENTS_ID, 2, &[stored(2, Some(3), &child)]),
        kv_message(
            EVENTS_ID,
            3,
            &[KvEventRef {
                worker: InstanceId::new(worker()),
                dp_rank: 0,
                event_id: 3,
                tier: Tier::Device,
                data: KvDataRef::Removed {
                    hashes: &[EngineHash(4)],
                },
            }],
        ),
        // Another publisher's id on this channel.
        kv_message(EVENTS_ID + 7, 4, &[stored(4, Some(3), &child)]),
        // event_id 4 never comes: a gap.
        kv_message(EVENTS_ID, 5, &[stored(5, None, &after_gap)]),
    ];
    for n in [1, 1, 2, 4, 3] {
        pm.send(&refs(&metrics_frames(n)));
    }
    for m in &events {
        pk.send(&refs(m));
    }
    let want = wait_until("both routers applied every message", &tunnel, || {
        let a = state(&direct);
        let b = state(&tunnel);
        // The rows are republished at most every 250 ms: wait for the last event's.
        let done = kv_count(&direct, "gap") == 1.0 && kv_row(&direct) == Some((2, 5));
        (done && a == b).then_some(a)
    });
    assert_eq!(kv_row(&tunnel), Some((2, 5)), "{want:#}");

    // 4. SIGKILL the broker: every subscription turns pending.
    let generation = tunnel.generation();
    one.kill();
    for (family, id) in [("kv_metrics", metrics_id()), ("kv-events", EVENTS_ID)] {
        wait_until("pending after the broker died", &tunnel, || {
            let row = sub_row(&tunnel, family, id)?;
            (row["state"] == "pending" && row.get("broker").is_none()).then_some(())
        });
    }
    assert_eq!(
        tunnel.get("/admin/dynamo/workers").json()["broker_coverage"]["agg"]["covered"],
        false
    );
    // Missed while no broker relays: event 6.
    pk.send(&refs(&kv_message(
        EVENTS_ID,
        6,
        &[stored(6, Some(11), &[block(12)])],
    )));
    wait_until("the direct router applied event 6", &direct, || {
        (kv_row(&direct) == Some((3, 6))).then_some(())
    });
    // A new broker (another id) restores them without a restart of anything.
    let two = broker("b-two", TOKEN_TWO, &bus, &api);
    two.wait_healthy(WAIT);
    for p in [&mut pm, &mut pk] {
        assert!(
            p.wait_subscribed(WAIT).is_some(),
            "resubscribed through b-two"
        );
    }
    for (family, id) in [("kv_metrics", metrics_id()), ("kv-events", EVENTS_ID)] {
        let by = wait_until("relayed by b-two", &tunnel, || {
            relayed_by(&tunnel, family, id)
        });
        assert_eq!(by, "b-two");
    }
    assert_eq!(
        tunnel.generation(),
        generation,
        "no new snapshot, no restart"
    );
    // Event 7 reveals the missed event 6 as a gap: the rank is cleared, then 7 applied.
    pk.send(&refs(&kv_message(
        EVENTS_ID,
        7,
        &[stored(7, None, &[block(20)])],
    )));
    wait_until("the missed event became a gap", &tunnel, || {
        (kv_count(&tunnel, "gap") == 2.0 && kv_row(&tunnel) == Some((1, 7))).then_some(())
    });
    // Load samples flow again.
    pm.send(&refs(&metrics_frames(5)));
    wait_until("a load sample through b-two", &tunnel, || {
        let t = tunnel.metrics();
        (metric_value(
            &t,
            "continuum_dynamo_load_events_total",
            &[("result", "applied")],
        ) == metric_value(
            &direct.metrics(),
            "continuum_dynamo_load_events_total",
            &[("result", "applied")],
        ))
        .then_some(())
    });

    // 5. A second broker moves no open stream; killing the carrier moves them to it.
    let three = broker("b-one", TOKEN_ONE, &bus, &api);
    three.wait_healthy(WAIT);
    wait_until("two brokers cover agg", &tunnel, || {
        (tunnel.get("/admin/dynamo/workers").json()["broker_coverage"]["agg"]["brokers"] == 2)
            .then_some(())
    });
    std::thread::sleep(Duration::from_millis(600));
    for (family, id) in [("kv_metrics", metrics_id()), ("kv-events", EVENTS_ID)] {
        assert_eq!(relayed_by(&tunnel, family, id).as_deref(), Some("b-two"));
    }
    let killed = Instant::now();
    two.kill();
    for (family, id) in [("kv_metrics", metrics_id()), ("kv-events", EVENTS_ID)] {
        wait_until("moved to b-one", &tunnel, || {
            (relayed_by(&tunnel, family, id).as_deref() == Some("b-one")).then_some(())
        });
    }
    let moved = killed.elapsed();
    eprintln!("streams moved to the surviving broker {moved:?} after the SIGKILL");
    assert!(moved < Duration::from_secs(5), "{moved:?}");

    // 6. Switch the tunnel router to direct by reload (RELOAD-17): nothing is cleared, the
    // kv-events subscription keeps its cursors, so an event it missed is a gap.
    let before = kv_row(&tunnel);
    assert_eq!(before, Some((1, 7)));
    let generation = tunnel.generation();
    let text = std::fs::read_to_string(tunnel.config_path()).unwrap();
    tunnel.write_raw_config(&text.replace("transport: broker", "transport: direct"));
    tunnel.sighup();
    tunnel.wait_generation(generation + 1, WAIT);
    for (family, id) in [("kv_metrics", metrics_id()), ("kv-events", EVENTS_ID)] {
        wait_until("connected directly", &tunnel, || {
            let row = sub_row(&tunnel, family, id)?;
            (row["state"] == "connected"
                && row["transport"] == "direct"
                && row.get("broker").is_none())
            .then_some(())
        });
    }
    for p in [&mut pm, &mut pk] {
        assert!(
            p.wait_subscribed(WAIT).is_some(),
            "the tunnel router subscribes directly"
        );
    }
    assert_eq!(kv_row(&tunnel), before, "the switch cleared nothing");
    assert!(
        tunnel
            .get("/admin/dynamo/workers")
            .json()
            .get("broker_coverage")
            .is_none()
    );
    // Event 8 is never sent: 9 is a gap on the inherited cursor.
    pk.send(&refs(&kv_message(
        EVENTS_ID,
        9,
        &[stored(9, None, &[block(30), block(31)])],
    )));
    wait_until("a gap on the inherited cursor", &tunnel, || {
        (kv_count(&tunnel, "gap") == 3.0 && kv_row(&tunnel) == Some((2, 9))).then_some(())
    });
    drop(three);
}
