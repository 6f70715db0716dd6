//! Two router replicas sharing their dispatches (`dynamo.peers`, issue 38) in front of one REAL
//! Dynamo fleet: a request pinned by replica A is counted by replica B while it runs (B's
//! `continuum_peer_remote_dispatches`) and leaves B's count when it ends; every pinned request
//! sends one datagram for its dispatch and one for its end; a datagram not sent under the
//! shared key, or not a datagram at all, changes nothing but B's refusal counters.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use common::fleet::{Fleet, FleetSpec};
use common::pyclient::{OpenAiChat, StreamMode};
use common::{RouterProcess, free_port, metric_value};
use continuum_core::config::peers::{PeerKey, parse_key};
use continuum_core::discovery::InstanceId;
use continuum_core::load::{DispatchLoad, LoadKey};
use continuum_core::peers::{PeerEvent, encode};

const AGG: &str = "tiny-agg";
const KEY: &str = "00112233445566778899aabbccddeeff";

fn metric(r: &RouterProcess, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(&r.get("/metrics").text(), name, labels).unwrap_or(0.0)
}

/// Polls `metric` until `want(value)`, bounded.
fn wait_metric(
    r: &RouterProcess,
    name: &str,
    labels: &[(&str, &str)],
    want: impl Fn(f64) -> bool,
) -> f64 {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let v = metric(r, name, labels);
        if want(v) {
            return v;
        }
        assert!(Instant::now() < end, "{name}{labels:?} = {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_listed(r: &RouterProcess, n: usize) {
    let end = Instant::now() + Duration::from_secs(30);
    while r.get("/admin/dynamo/workers").json()["workers"]
        .as_array()
        .map_or(0, Vec::len)
        != n
    {
        assert!(Instant::now() < end, "workers not listed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn two_replicas_count_each_others_in_flight_requests() {
    let fleet = Fleet::start(&FleetSpec::new().agg(AGG, 2).speedup_ratio(1.0));
    let (pa, pb) = (free_port(), free_port());
    let peers = |me: u16, other: u16| {
        format!(
            "  peers:\n    listen: \"127.0.0.1:{me}\"\n    replicas: [\"127.0.0.1:{other}\"]\n    \
             key: \"{KEY}\"\n"
        )
    };
    let mut ca = fleet.router_config();
    ca.extra_yaml.push_str(&peers(pa, pb));
    let mut cb = fleet.router_config();
    cb.extra_yaml.push_str(&peers(pb, pa));
    let a = RouterProcess::start(&ca);
    let b = RouterProcess::start(&cb);
    wait_listed(&a, 2);
    wait_listed(&b, 2);

    // A long stream through A: B counts it while it runs.
    let addr = a.addr();
    let long = std::thread::spawn(move || {
        OpenAiChat::new(addr, AGG)
            .stream(StreamMode::Streamed)
            .max_tokens(400)
            .timeout(Duration::from_secs(60))
            .run()
    });
    wait_metric(&b, "continuum_peer_remote_dispatches", &[], |v| v >= 1.0);
    let results = long.join().unwrap();
    assert!(results.iter().all(|r| r.ok()), "{results:?}");
    wait_metric(&b, "continuum_peer_remote_dispatches", &[], |v| v == 0.0);

    // Four more: a dispatch and an end each, every datagram applied.
    let results = OpenAiChat::new(a.addr(), AGG).n(4).max_tokens(4).run();
    assert!(results.iter().all(|r| r.ok()), "{results:?}");
    let applied = wait_metric(
        &b,
        "continuum_peer_datagrams_received_total",
        &[("result", "applied")],
        |v| v >= 10.0,
    );
    assert_eq!(applied, 10.0, "5 requests, 2 datagrams each");
    assert_eq!(
        metric(
            &a,
            "continuum_peer_datagrams_sent_total",
            &[("result", "sent")]
        ),
        10.0
    );
    assert_eq!(
        metric(
            &b,
            "continuum_peer_datagrams_sent_total",
            &[("result", "sent")]
        ),
        0.0
    );

    // Forged and garbage datagrams from the replica's own address change nothing.
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut forged = Vec::new();
    let wrong = PeerKey([1, 2]);
    assert_ne!(parse_key(KEY).unwrap(), wrong);
    let event = PeerEvent::Dispatch {
        seq: 1,
        key: LoadKey::new(InstanceId::new(fleet.info.workers[0].instance_id), 0),
        load: DispatchLoad {
            prefill_tokens: 1_000_000,
            decode_blocks: 1_000,
            stall_eligible: false,
        },
    };
    encode(wrong, 7, &[event], &mut forged);
    s.send_to(&forged, ("127.0.0.1", pb)).unwrap();
    s.send_to(b"not a datagram", ("127.0.0.1", pb)).unwrap();
    wait_metric(
        &b,
        "continuum_peer_datagrams_received_total",
        &[("result", "bad_mac")],
        |v| v == 1.0,
    );
    wait_metric(
        &b,
        "continuum_peer_datagrams_received_total",
        &[("result", "malformed")],
        |v| v == 1.0,
    );
    assert_eq!(metric(&b, "continuum_peer_remote_dispatches", &[]), 0.0);
    assert_eq!(
        metric(
            &b,
            "continuum_peer_datagrams_received_total",
            &[("result", "applied")]
        ),
        10.0
    );
}
