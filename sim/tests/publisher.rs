//! Each worker's `kv_metrics` PUB socket, read with the router's own ZMTP subscriber state
//! machine (`core::zmtp::ZmtpSub`) and Dynamo message decoders (`core::dynamo_event`).
//! Deadlines are generous; nothing asserts how long anything took.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Subscriber, chat};
use continuum_sim::{
    DP_RANK_HEADER, LatencyModel, LoadFields, Role, SimFleet, SimSpec, WORKER_HEADER,
};

const WAIT: Duration = Duration::from_secs(20);

#[test]
fn samples_follow_the_load_and_stop_with_the_worker() {
    let fleet = SimFleet::start(
        SimSpec::builder()
            .aggregated("m", 2)
            .dp_size(2)
            .publish_interval(None)
            .latency(LatencyModel {
                base: Duration::from_millis(300),
                ..LatencyModel::default()
            })
            .build(),
    )
    .unwrap();
    let w = fleet.workers_of("m", Role::Aggregated)[0].clone();
    let mut sub = Subscriber::connect(w.publisher_addr);

    // Subscribing triggers a sample per rank at once, idle.
    let a = sub.next(WAIT).unwrap();
    let b = sub.next(WAIT).unwrap();
    for (s, rank) in [(&a, 0), (&b, 1)] {
        assert_eq!(s.publisher_id, w.publisher_id);
        assert_eq!(s.load.worker_id, w.instance_id);
        assert_eq!(s.load.dp_rank, rank);
        assert_eq!(
            (
                s.load.active_decode_blocks,
                s.load.active_prefill_tokens,
                s.load.kv_used_blocks
            ),
            (Some(0), Some(0), Some(0))
        );
    }
    assert_eq!(b.sequence.0, a.sequence.0 + 1);

    // A request pinned to rank 1: a loaded sample at its start, an idle one at its end.
    let shim = fleet.shim_addr("dynamo").unwrap();
    let id = w.instance_id.to_string();
    let client = std::thread::spawn(move || {
        chat(
            shim,
            "m",
            false,
            &[(WORKER_HEADER, &id), (DP_RANK_HEADER, "1")],
        )
        .status
    });
    let busy = sub.until(WAIT, |s| {
        s.load.dp_rank == 1 && s.load.kv_used_blocks > Some(0)
    });
    assert!(busy.load.active_prefill_tokens > Some(0), "{busy:?}");
    assert_eq!(busy.load.active_decode_blocks, busy.load.kv_used_blocks);
    let idle = sub.until(WAIT, |s| {
        s.load.dp_rank == 1 && s.load.kv_used_blocks == Some(0)
    });
    assert!(idle.sequence > busy.sequence);
    assert_eq!(client.join().unwrap(), 200);

    let stats = fleet
        .stats()
        .into_iter()
        .find(|s| s.info.instance_id == w.instance_id)
        .unwrap();
    assert!(stats.messages >= 4 && stats.published.is_some() && stats.since_publish.is_some());
    assert_eq!((stats.active, stats.picks), (0, 1));

    // Killing the worker closes its publisher.
    fleet.kill(w.instance_id).unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while sub.next(WAIT).is_some() {
        assert!(std::time::Instant::now() < deadline, "publisher still open");
    }
    assert!(
        std::net::TcpStream::connect(w.publisher_addr).is_err(),
        "listener closed"
    );
}

#[test]
fn periodic_samples_and_mocker_fields() {
    let fleet = SimFleet::start(
        SimSpec::builder()
            .aggregated("m", 1)
            .publish_interval(Some(Duration::from_millis(100)))
            .load_fields(LoadFields::KvUsedOnly)
            .build(),
    )
    .unwrap();
    let w = fleet.workers()[0].clone();
    let mut sub = Subscriber::connect(w.publisher_addr);
    let first = sub.next(WAIT).unwrap();
    // With no request at all, samples keep coming, in sequence.
    let mut last = first.sequence.0;
    for _ in 0..3 {
        let s = sub.next(WAIT).unwrap();
        assert!(s.sequence.0 > last);
        last = s.sequence.0;
        assert_eq!(
            (
                s.load.active_decode_blocks,
                s.load.active_prefill_tokens,
                s.load.kv_used_blocks
            ),
            (None, None, Some(0))
        );
    }
    // Two subscribers of one publisher see the same stream.
    let mut other = Subscriber::connect(w.publisher_addr);
    let s = other.next(WAIT).unwrap();
    assert_eq!(
        (s.publisher_id, s.load.worker_id),
        (w.publisher_id, w.instance_id)
    );
}
