//! A benchmark-sized fleet: 1,200 workers over 3 namespaces start on the simulator's two
//! threads, register in the file store, and every one materialises through the router's reducer.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

mod common;

use std::time::{Duration, Instant};

use common::{Subscriber, chat};
use continuum_core::discovery::Family;
use continuum_sim::{Role, SimFleet, SimSpec, WORKER_HEADER};

#[test]
fn twelve_hundred_workers() {
    let spec = SimSpec::builder()
        .namespace("a")
        .aggregated("big-agg", 500)
        .namespace("b")
        .disaggregated("big-disagg", 100, 300)
        .namespace("c")
        .aggregated("big-dp", 300)
        .dp_size(2)
        .publish_interval(Some(Duration::from_secs(1)))
        .build();
    let started = Instant::now();
    let fleet = SimFleet::start(spec).unwrap();
    eprintln!("1,200 workers started in {:?}", started.elapsed());
    assert_eq!(fleet.workers().len(), 1200);

    let (_, view) = common::view_of(fleet.root());
    assert_eq!(view.workers.len(), 1200);
    assert_eq!(view.publishers_of(Family::KvMetrics).count(), 1200);
    assert_eq!(
        view.workers
            .iter()
            .filter(|w| w.role == Role::Prefill)
            .count(),
        100
    );

    // The last worker's publisher and the namespace's shim both answer.
    let last = fleet.workers_of("big-dp", Role::Aggregated).pop().unwrap();
    let s = Subscriber::connect(last.publisher_addr)
        .next(Duration::from_secs(30))
        .unwrap();
    assert_eq!(s.load.worker_id, last.instance_id);
    let id = last.instance_id.to_string();
    let r = chat(
        fleet.shim_addr("c").unwrap(),
        "big-dp",
        false,
        &[(WORKER_HEADER, &id)],
    );
    assert_eq!(r.status, 200, "{}", r.text());
}
