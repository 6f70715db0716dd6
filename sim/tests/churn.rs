//! Workers joining a running fleet (`SimFleet::add_worker`) and leaving it (`SimFleet::kill`):
//! the joiner's records as the router's discovery reducer reads them, its `kv_metrics` samples
//! read with the router's own ZMTP subscriber, the shim serving its pins, and the count of pins
//! refused because they named a worker that had left.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Subscriber, chat};
use continuum_core::discovery::Family;
use continuum_sim::{LatencyModel, Role, SimError, SimFleet, SimSpec, WORKER_HEADER};

const WAIT: Duration = Duration::from_secs(20);
const AGG: &str = "agg";
const DISAGG: &str = "disagg";

fn fleet() -> SimFleet {
    SimFleet::start(
        SimSpec::builder()
            .namespace("demo")
            .aggregated(AGG, 2)
            .dp_size(2)
            .disaggregated(DISAGG, 1, 1)
            .latency(LatencyModel::ZERO)
            .completion_tokens(2)
            .publish_interval(None)
            .build(),
    )
    .unwrap()
}

#[test]
fn a_joining_worker_registers_publishes_and_serves() {
    let fleet = fleet();
    let before = fleet.workers();
    let files_before = common::read_store(fleet.root()).len();
    let w = fleet.add_worker("demo", AGG, Role::Aggregated).unwrap();

    // What it is: the model's ranks, the aggregated component, fresh ids.
    assert_eq!(
        (w.namespace.as_str(), w.model.as_str(), w.role, w.dp_size),
        ("demo", AGG, Role::Aggregated, 2)
    );
    assert_eq!(w.component, "backend");
    assert!(
        before.iter().all(|b| b.instance_id != w.instance_id
            && b.publisher_id != w.publisher_id
            && b.publisher_addr != w.publisher_addr),
        "{w:?} vs {before:?}"
    );
    assert_eq!(fleet.workers().last().unwrap().instance_id, w.instance_id);
    assert_eq!(fleet.workers_of(AGG, Role::Aggregated).len(), 3);

    // Its three records, as the router's reducer reads them.
    assert_eq!(common::read_store(fleet.root()).len(), files_before + 3);
    let (_, view) = common::view_of(fleet.root());
    let seen = view.worker("demo", w.instance_id).expect("discovered");
    assert_eq!(seen.model.as_deref(), Some(AGG));
    assert_eq!(seen.dp_size, Some(2));
    let p = view
        .publishers
        .iter()
        .find(|p| p.publisher_id == w.publisher_id)
        .expect("its kv_metrics publisher");
    assert_eq!(p.family, Family::KvMetrics);
    assert_eq!(p.tcp.port, w.publisher_addr.port());

    // Its publisher answers a subscription with one idle sample per rank.
    let mut sub = Subscriber::connect(w.publisher_addr);
    let a = sub.next(WAIT).unwrap();
    let b = sub.next(WAIT).unwrap();
    assert_eq!(
        (a.publisher_id, a.load.worker_id),
        (w.publisher_id, w.instance_id)
    );
    assert_eq!((a.load.dp_rank, b.load.dp_rank), (0, 1));

    // The shim serves a request pinned to it, and counts the pick.
    let shim = fleet.shim_addr("demo").unwrap();
    let id = w.instance_id.to_string();
    let r = chat(shim, AGG, false, &[(WORKER_HEADER, &id)]);
    assert_eq!(r.status, 200, "{}", r.text());
    let stats = fleet.stats();
    let s = stats
        .iter()
        .find(|s| s.info.instance_id == w.instance_id)
        .unwrap();
    assert!(s.alive);
    assert_eq!(s.picks, 1);

    // A disaggregated model takes a decode (or prefill) joiner.
    let d = fleet.add_worker("demo", DISAGG, Role::Decode).unwrap();
    assert_eq!((d.component.as_str(), d.dp_size), ("backend", 1));
    assert_eq!(fleet.workers_of(DISAGG, Role::Decode).len(), 2);
    let p = fleet.add_worker("demo", DISAGG, Role::Prefill).unwrap();
    assert_eq!(p.component, "prefill");
    assert_eq!(common::read_store(fleet.root()).len(), files_before + 9);
}

#[test]
fn what_the_spec_does_not_have_is_refused() {
    let fleet = fleet();
    let n = fleet.workers().len();
    for (ns, model, role) in [
        ("nope", AGG, Role::Aggregated),
        ("demo", "nope", Role::Aggregated),
        ("demo", AGG, Role::Decode),
        ("demo", DISAGG, Role::Aggregated),
    ] {
        assert!(
            matches!(fleet.add_worker(ns, model, role), Err(SimError::Spec(_))),
            "{ns} {model} {role:?}"
        );
    }
    assert_eq!(fleet.workers().len(), n);
}

#[test]
fn churn_leaves_no_files_and_counts_pins_to_departed_workers() {
    let fleet = fleet();
    let shim = fleet.shim_addr("demo").unwrap();
    let files = common::read_store(fleet.root()).len();
    // Every second a worker joins and the oldest leaves, here back to back.
    let mut gone = Vec::new();
    for _ in 0..5 {
        let oldest = fleet.workers_of(AGG, Role::Aggregated)[0].clone();
        let joined = fleet.add_worker("demo", AGG, Role::Aggregated).unwrap();
        fleet.kill(oldest.instance_id).unwrap();
        gone.push(oldest);
        assert_eq!(fleet.workers_of(AGG, Role::Aggregated).len(), 2);
        assert!(
            fleet
                .workers_of(AGG, Role::Aggregated)
                .iter()
                .any(|w| w.instance_id == joined.instance_id)
        );
    }
    assert_eq!(common::read_store(fleet.root()).len(), files);
    let (_, view) = common::view_of(fleet.root());
    for g in &gone {
        assert!(view.worker("demo", g.instance_id).is_none());
    }
    // A departed worker's pin is refused as 1.6.1 refuses an unknown one, and counted; an id
    // that never was a worker is refused without being counted.
    assert_eq!(fleet.departed_refusals(), 0);
    let dead = gone[0].instance_id.to_string();
    assert_eq!(
        chat(shim, AGG, false, &[(WORKER_HEADER, &dead)]).status,
        400
    );
    assert_eq!(
        chat(shim, AGG, false, &[(WORKER_HEADER, "12345")]).status,
        400
    );
    assert_eq!(fleet.departed_refusals(), 1);
    // The live ones serve.
    for w in fleet.workers_of(AGG, Role::Aggregated) {
        let id = w.instance_id.to_string();
        assert_eq!(chat(shim, AGG, false, &[(WORKER_HEADER, &id)]).status, 200);
    }
    assert_eq!(fleet.departed_refusals(), 1);
}
