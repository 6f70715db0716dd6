//! Ageing of a cut-off `kv-events` subscription through the broker transport (BROKER-10,
//! TEST-05's ageing case, with the real broker): the subscription's rank is indexed through a
//! real `continuum-event-broker`; the broker is SIGKILLed and none takes its place; the rank
//! stays indexed while the subscription waits pending, and is cleared, with a `warn` naming the
//! cut-off subscription, once it has been pending for 60 s (`KV_EVENTS_STALE_AFTER`). The
//! subscription itself stays, pending, ready for a broker to come back.
//!
//! About 70 s of wall time: the 60 s are the rule under test, not a tunable of the test.

#![cfg(all(feature = "dynamo-kv", feature = "dynamo-event-bus"))]
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::TempDir;
use common::etcd::EtcdServer;
use common::kube::FakeApiServer;
use common::kv::{kv_message, refs};
use common::tunnel::{
    Bus, EVENTS_ID, TOKEN_ONE, advertise, block, broker, kv_row, relayed_by, router, seed, stored,
    sub_row, wait_until,
};
use common::zmq::ZmqPublisher;

/// The ageing rule (BROKER-10), and how long past it the check may take (the KV upkeep runs
/// every 250 ms; the admin rows follow at once).
const STALE_AFTER: Duration = Duration::from_secs(60);
const SLACK: Duration = Duration::from_secs(15);

#[test]
fn a_kv_events_subscription_pending_for_a_minute_loses_its_ranks_with_a_warning() {
    let dir = TempDir::new("broker-ageing");
    let bus = Bus::new(dir.path());
    let etcd = EtcdServer::start();
    let pm = ZmqPublisher::start();
    let mut pk = ZmqPublisher::start();
    seed(&etcd, &pm.endpoint(), &pk.endpoint(), None);
    let api = FakeApiServer::start();
    advertise(&api, &pm.endpoint(), &pk.endpoint());
    let tunnel = router(&etcd, "broker", Some(&bus));
    let one = broker("b-one", TOKEN_ONE, &bus, &api);
    one.wait_healthy(Duration::from_secs(20));
    wait_until("relayed by b-one", &tunnel, || {
        relayed_by(&tunnel, "kv-events", EVENTS_ID)
    });
    assert!(pk.wait_subscribed(Duration::from_secs(20)).is_some());
    let chain = [block(1), block(2), block(3)];
    pk.send(&refs(&kv_message(EVENTS_ID, 1, &[stored(1, None, &chain)])));
    wait_until("the rank indexed", &tunnel, || {
        (kv_row(&tunnel) == Some((3, 1))).then_some(())
    });

    let killed = Instant::now();
    one.kill();
    wait_until("pending once the broker died", &tunnel, || {
        let row = sub_row(&tunnel, "kv-events", EVENTS_ID)?;
        (row["state"] == "pending").then_some(())
    });
    // Well inside the minute: still indexed (a broker that comes back in time loses nothing).
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(kv_row(&tunnel), Some((3, 1)), "cleared too early");
    assert!(!tunnel.stderr().contains("ranks were cleared"));

    let deadline = killed + STALE_AFTER + SLACK;
    loop {
        if kv_row(&tunnel).is_none_or(|(blocks, _)| blocks == 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rank was not cleared {:?} after the broker died; stderr:\n{}",
            STALE_AFTER + SLACK,
            tunnel.stderr()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let aged = killed.elapsed();
    assert!(
        aged >= STALE_AFTER,
        "cleared after {aged:?}, before the rule's 60 s"
    );
    let log = tunnel.stderr();
    let warn = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("ranks were cleared"))
        .unwrap_or_else(|| panic!("no warn line; stderr:\n{log}"));
    assert!(warn.contains(&EVENTS_ID.to_string()), "{warn}");
    let row = sub_row(&tunnel, "kv-events", EVENTS_ID).expect("the subscription stays");
    assert_eq!(row["state"], "pending", "{row}");
}
