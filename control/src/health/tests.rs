use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::Duration;

use continuum_core::config::{Config, NoEnv, OutlierPolicy};
use continuum_core::discovery::FleetView;
use continuum_core::health::{Admission, HealthState};

use super::*;

fn hc(healthy: u32, unhealthy: u32) -> HealthCheck {
    HealthCheck {
        path: "/health".into(),
        interval: Duration::from_millis(100),
        timeout: Duration::from_millis(100),
        healthy_threshold: healthy,
        unhealthy_threshold: unhealthy,
    }
}

#[test]
fn streaks_cross_thresholds_once_and_a_flap_resets_them() {
    let h = ReplicaHealth::default();
    let c = hc(2, 3);
    let mut s = Streaks::default();
    assert_eq!(s.failed(&c, &h, 1), Change::None);
    assert_eq!(s.failed(&c, &h, 2), Change::None);
    assert_eq!(s.failed(&c, &h, 3), Change::Down);
    assert!(h.actively_down());
    assert_eq!(s.failed(&c, &h, 4), Change::None);
    // Flapping: pass, fail, pass, fail... never two passes in a row, never back.
    for t in 0..10 {
        assert_eq!(s.passed(&c, &h, 10 + 2 * t), Change::None);
        assert_eq!(s.failed(&c, &h, 11 + 2 * t), Change::None);
        assert!(h.actively_down());
    }
    assert_eq!(s.passed(&c, &h, 50), Change::None);
    assert_eq!(s.passed(&c, &h, 51), Change::Up);
    assert!(!h.actively_down());
    // Healthy and passing: nothing to change.
    assert_eq!(s.passed(&c, &h, 52), Change::None);
}

/// A table of one pool of two backends (so one may be ejected).
fn pool_table() -> continuum_core::health::HealthTable {
    continuum_core::health::HealthTable::carried(
        None,
        vec![("a".into(), None), ("b".into(), None)],
        vec![vec![BackendIdx(0), BackendIdx(1)]],
    )
}

#[test]
fn only_passes_after_an_ejection_end_it_early() {
    let t = pool_table();
    let h = t.get(BackendIdx(0)).unwrap();
    let c = hc(2, 3);
    let mut s = Streaks::default();
    // Passing all along...
    for now in 0..5 {
        assert_eq!(s.passed(&c, h, now), Change::None);
    }
    // ...then ejected by failed requests (the health endpoint kept passing).
    let p = OutlierPolicy {
        consecutive_failures: 1,
        ..OutlierPolicy::default()
    };
    assert!(matches!(
        t.failed(BackendIdx(0), 10, &p, false),
        continuum_core::health::FailureEffect::Ejected { .. }
    ));
    assert_eq!(
        s.passed(&c, h, 20),
        Change::None,
        "one pass since the ejection"
    );
    assert_eq!(h.state(20), HealthState::Ejected);
    assert_eq!(s.passed(&c, h, 30), Change::Up);
    assert_eq!(h.state(30), HealthState::HalfOpen);
    assert_eq!(h.admit(31), Admission::Trial);
}

/// A loopback HTTP server answering every request with the status in `status` (0: accept and
/// never answer), counting requests.
fn status_server() -> (SocketAddr, Arc<AtomicU16>, Arc<AtomicU64>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let status = Arc::new(AtomicU16::new(200));
    let hits = Arc::new(AtomicU64::new(0));
    let (st, n) = (status.clone(), hits.clone());
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { return };
            let mut buf = [0u8; 1024];
            let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
            let got = c.read(&mut buf).unwrap_or(0);
            if !buf[..got].starts_with(b"GET /base/health HTTP/1.1\r\n") {
                continue; // not the probe we expect: never answered, the probe fails
            }
            n.fetch_add(1, Ordering::Relaxed);
            let s = st.load(Ordering::Relaxed);
            if s == 0 {
                std::thread::sleep(Duration::from_millis(300));
                continue;
            }
            let _ = write!(c, "HTTP/1.1 {s} X\r\ncontent-length: 0\r\n\r\n");
        }
    });
    (addr, status, hits)
}

fn snapshot(addr: SocketAddr, previous: Option<&RouterSnapshot>, check: bool) -> RouterSnapshot {
    let hc = if check {
        "health_check: { path: /health, interval: 100ms, timeout: 50ms, healthy_threshold: 1, unhealthy_threshold: 2 }"
    } else {
        "health_check: { enabled: false }"
    };
    let yaml = format!(
        "backends:\n  - {{ name: a, type: openai, url: \"http://{addr}/base\", models: [m], {hc} }}\n  \
         - {{ name: b, type: openai, url: \"http://127.0.0.1:9\", models: [m] }}\n"
    );
    let (config, _) = Config::from_yaml(&yaml, &NoEnv).unwrap();
    RouterSnapshot::build(
        1,
        Arc::new(config),
        vec![Some(addr), Some(SocketAddr::from(([127, 0, 0, 1], 9)))],
        Arc::default(),
        Arc::new(FleetView::default()),
        Arc::default(),
        previous,
    )
}

async fn wait_for(h: &ReplicaHealth, down: bool) {
    for _ in 0..100 {
        if h.actively_down() == down {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("replica never became actively_down == {down}");
}

#[test]
fn probes_take_a_failing_replica_out_and_bring_it_back() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (addr, status, hits) = status_server();
        let snap = snapshot(addr, None, true);
        let mut checks = HealthChecks::default();
        checks.reconcile(&snap);
        assert_eq!(checks.len(), 1, "one backend has a check");
        let h = snap.health.get(BackendIdx(0)).unwrap();
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(!h.actively_down());
        assert!(hits.load(Ordering::Relaxed) >= 2, "probes were sent");
        status.store(503, Ordering::Relaxed);
        wait_for(h, true).await;
        status.store(200, Ordering::Relaxed);
        wait_for(h, false).await;
        // A replica that accepts and never answers times out.
        status.store(0, Ordering::Relaxed);
        wait_for(h, true).await;
        // The same backend in the next snapshot keeps its task and its state.
        let next = snapshot(addr, Some(&snap), true);
        checks.reconcile(&next);
        assert_eq!(checks.len(), 1);
        assert!(next.health.get(BackendIdx(0)).unwrap().actively_down());
        // Its check turned off: no task, and the old verdict no longer keeps it out.
        let off = snapshot(addr, Some(&next), false);
        checks.reconcile(&off);
        assert_eq!(checks.len(), 0);
        assert!(!off.health.get(BackendIdx(0)).unwrap().actively_down());
    });
}
