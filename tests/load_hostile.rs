//! Hostile publishers: raw TCP peers that break ZMTP in the ways LOAD-ZMTP-16 names. Each is a
//! discovered `kv_metrics` publisher of a live worker; the router must count each as
//! `transport_refused`, back off and reconnect, keep serving, and keep its memory flat (a
//! declared 2^63-byte frame allocates nothing).
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::etcd::{EtcdServer, read_dump};
use common::{RouterConfig, RouterProcess, metric_value};
use continuum_core::zmtp::wire;

const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/fixtures/dynamo-1.6.1"
);
const WORKER: &str = "6a6ca22d4998ac0b";

#[derive(Clone, Copy, Debug)]
enum Peer {
    /// Answers with HTTP instead of a ZMTP greeting.
    WrongGreeting,
    /// A greeting offering the PLAIN mechanism.
    PlainMechanism,
    /// A valid handshake, then a data frame declaring 2^63 bytes.
    HugeFrame,
    /// A valid greeting dripped one byte every 300 ms.
    SlowDrip,
    /// A valid greeting, then silence: no READY ever.
    NeverReady,
}

/// A hostile peer on a loopback port; counts the connections it accepted.
fn hostile(kind: Peer) -> (u16, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut s) = conn else { return };
            count.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
                let mut sink = [0u8; 4096];
                match kind {
                    Peer::WrongGreeting => {
                        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
                    }
                    Peer::PlainMechanism => {
                        let mut g = wire::peer_greeting(0);
                        g[12..17].copy_from_slice(b"PLAIN");
                        let _ = s.write_all(&g);
                    }
                    Peer::HugeFrame => {
                        let _ = s.write_all(&wire::peer_handshake(0, b"PUB"));
                        let _ = s.read(&mut sink);
                        let mut f = vec![0x02u8]; // LONG data frame, last
                        f.extend_from_slice(&(1u64 << 63).to_be_bytes());
                        f.extend_from_slice(&[0u8; 1024]);
                        let _ = s.write_all(&f);
                    }
                    Peer::SlowDrip => {
                        for b in wire::peer_greeting(0) {
                            if s.write_all(&[b]).is_err() {
                                return;
                            }
                            std::thread::sleep(Duration::from_millis(300));
                        }
                    }
                    Peer::NeverReady => {
                        let _ = s.write_all(&wire::peer_greeting(0));
                    }
                }
                // Hold the connection until the router gives up on it.
                while let Ok(n) = s.read(&mut sink) {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    });
    (port, accepted)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn hostile_publishers_are_refused_backed_off_and_cost_no_memory() {
    let kinds = [
        Peer::WrongGreeting,
        Peer::PlainMechanism,
        Peer::HugeFrame,
        Peer::SlowDrip,
        Peer::NeverReady,
    ];
    let peers: Vec<(Peer, u16, Arc<AtomicUsize>)> = kinds
        .iter()
        .map(|k| {
            let (port, n) = hostile(*k);
            (*k, port, n)
        })
        .collect();
    let etcd = EtcdServer::start();
    let dump = read_dump(Path::new(&format!("{FIXTURES}/etcd-dump.txt")));
    let channel_template = dump
        .iter()
        .find(|(k, _)| k.ends_with("/topic/kv_metrics/a3d9516d245b1"))
        .map(|(_, v)| v.clone())
        .unwrap();
    for (k, v) in &dump {
        if k.ends_with(WORKER)
            && (k.starts_with("v1/instances/agg/backend/generate/") || k.starts_with("v1/mdc/"))
        {
            etcd.put(k, v);
        }
    }
    for (i, (_, port, _)) in peers.iter().enumerate() {
        let id = 0x00c0_ffee_0000u64 + i as u64;
        let mut rec: serde_json::Value = serde_json::from_str(&channel_template).unwrap();
        rec["instance_id"] = id.into();
        rec["transport"]["config"]["endpoint"] = format!("tcp://127.0.0.1:{port}").into();
        etcd.put(
            &format!("v1/event_channels/namespace/agg/component/backend/endpoint/generate/topic/kv_metrics/{id:x}"),
            &rec.to_string(),
        );
    }
    let mut cfg = RouterConfig::default().backend("fe-agg", "http://127.0.0.1:9", &["tiny-agg"]);
    cfg.extra_yaml = format!(
        "dynamo:\n  enabled: true\n  discovery:\n    source: etcd\n    etcd:\n      endpoints: [\"{}\"]\n      \
         namespaces: [agg]\n  load:\n    direct_allow_cidrs: [\"127.0.0.0/8\"]\n  shim:\n    backends: [fe-agg]\n",
        etcd.endpoint()
    );
    let r = RouterProcess::start(&cfg);
    let pid = r.pid();
    let rss_start = rss_kib(pid);

    // Every peer is refused and reconnected to at least once (backoff, not a give-up).
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let all_retried = peers.iter().all(|(_, _, n)| n.load(Ordering::SeqCst) >= 2);
        let refused = metric_value(
            &r.metrics(),
            "continuum_dynamo_load_events_total",
            &[("result", "transport_refused")],
        )
        .unwrap_or(0.0);
        if all_retried && refused >= peers.len() as f64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every hostile peer was refused and retried: {:?}, transport_refused={refused}; stderr:\n{}",
            peers
                .iter()
                .map(|(k, _, n)| (*k, n.load(Ordering::SeqCst)))
                .collect::<Vec<_>>(),
            r.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Still serving, nothing applied, memory flat (well under one 2^63 frame, or any growth).
    assert_eq!(r.get("/health").status, 200);
    let text = r.metrics();
    assert_eq!(
        metric_value(
            &text,
            "continuum_dynamo_load_events_total",
            &[("result", "applied")]
        ),
        Some(0.0)
    );
    let rss_end = rss_kib(pid);
    assert!(
        rss_end < rss_start + 16 * 1024,
        "RSS grew from {rss_start} KiB to {rss_end} KiB"
    );
}
