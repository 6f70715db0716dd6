use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use super::*;

fn policy(failures: u32, pct: u8) -> OutlierPolicy {
    OutlierPolicy {
        consecutive_failures: failures,
        base_ejection: Duration::from_secs(10),
        max_ejection: Duration::from_secs(60),
        max_ejection_percent: pct,
    }
}

fn table(n: usize, groups: Vec<Vec<u32>>) -> HealthTable {
    HealthTable::carried(
        None,
        (0..n).map(|i| (format!("b{i}"), None)).collect(),
        groups
            .into_iter()
            .map(|g| g.into_iter().map(BackendIdx).collect())
            .collect(),
    )
}

const A: BackendIdx = BackendIdx(0);
const B: BackendIdx = BackendIdx(1);

#[test]
fn a_streak_ejects_at_the_threshold_and_a_success_resets_it() {
    let t = table(2, vec![vec![0, 1]]);
    let p = policy(3, 50);
    assert_eq!(t.failed(A, 1_000, &p, false), FailureEffect::Counted);
    assert_eq!(t.failed(A, 1_001, &p, false), FailureEffect::Counted);
    t.get(A).unwrap().succeeded(None);
    assert_eq!(t.failed(A, 1_003, &p, false), FailureEffect::Counted);
    assert_eq!(t.failed(A, 1_004, &p, false), FailureEffect::Counted);
    assert_eq!(
        t.failed(A, 1_005, &p, false),
        FailureEffect::Ejected { until_ms: 11_005 }
    );
    let a = t.get(A).unwrap();
    assert_eq!(a.admit(1_006), Admission::Ejected);
    assert_eq!(a.state(1_006), HealthState::Ejected);
    assert_eq!(a.ejections(), 1);
    // Failures reported by requests still in flight while ejected change nothing.
    assert_eq!(t.failed(A, 2_000, &p, false), FailureEffect::Counted);
    assert_eq!(a.admit(11_004), Admission::Ejected);
    assert_eq!(t.get(B).unwrap().admit(2_000), Admission::Open);
}

#[test]
fn half_open_lets_one_trial_through_and_its_outcome_decides() {
    let t = table(2, vec![vec![0, 1]]);
    let p = policy(1, 50);
    let a = t.get(A).unwrap();
    assert!(matches!(
        t.failed(A, 1_000, &p, false),
        FailureEffect::Ejected { .. }
    ));
    assert_eq!(a.state(11_000), HealthState::HalfOpen);
    assert_eq!(a.admit(11_000), Admission::Trial);
    // One trial at a time.
    assert_eq!(a.admit(11_001), Admission::Ejected);
    // A trial dropped without an outcome (the client left) frees the slot.
    drop(Trial::new(a));
    assert_eq!(a.admit(11_002), Admission::Trial);
    // A failed trial ejects again, for twice the base time.
    assert_eq!(
        t.failed(A, 11_003, &p, true),
        FailureEffect::Ejected { until_ms: 31_003 }
    );
    assert_eq!(a.admit(31_002), Admission::Ejected);
    assert_eq!(a.admit(31_003), Admission::Trial);
    a.succeeded(Some(31_010));
    assert_eq!(a.admit(31_011), Admission::Open);
    assert_eq!(a.state(31_011), HealthState::Healthy);
}

#[test]
fn a_flapping_replica_is_ejected_for_longer_each_time_until_it_stays_quiet() {
    let t = table(2, vec![vec![0, 1]]);
    let p = policy(2, 50);
    let a = t.get(A).unwrap();
    let mut now = 0;
    let mut times = Vec::new();
    for _ in 0..8 {
        // Two failures, ejected; the trial succeeds, and it fails again soon after.
        t.failed(A, now + 1, &p, false);
        let FailureEffect::Ejected { until_ms } = t.failed(A, now + 2, &p, false) else {
            panic!("not ejected");
        };
        times.push(until_ms - (now + 2));
        assert_eq!(a.admit(until_ms - 1), Admission::Ejected);
        assert_eq!(a.admit(until_ms), Admission::Trial);
        a.succeeded(Some(until_ms));
        now = until_ms + 1_000;
    }
    assert_eq!(
        times,
        [
            10_000, 20_000, 30_000, 40_000, 50_000, 60_000, 60_000, 60_000
        ]
    );
    // Quiet for max_ejection: the next ejection is back to the base time.
    now += 60_000;
    t.failed(A, now, &p, false);
    assert_eq!(
        t.failed(A, now + 1, &p, false),
        FailureEffect::Ejected {
            until_ms: now + 1 + 10_000
        }
    );
}

#[test]
fn the_cap_never_ejects_the_last_replica_nor_more_than_the_share() {
    let p = policy(1, 50);
    // Two replicas: only one may go.
    let t = table(2, vec![vec![0, 1]]);
    assert!(matches!(
        t.failed(A, 1, &p, false),
        FailureEffect::Ejected { .. }
    ));
    assert_eq!(t.failed(B, 2, &p, false), FailureEffect::Capped);
    assert_eq!(t.get(B).unwrap().admit(3), Admission::Open);
    // A lone replica is never ejected.
    let t = table(1, vec![vec![0]]);
    assert_eq!(t.failed(A, 1, &p, false), FailureEffect::Capped);
    // Ten replicas at 30%: three.
    let t = table(10, vec![(0..10).collect()]);
    let p30 = policy(1, 30);
    let ejected = (0..10)
        .filter(|i| {
            matches!(
                t.failed(BackendIdx(*i), 5, &p30, false),
                FailureEffect::Ejected { .. }
            )
        })
        .count();
    assert_eq!(ejected, 3);
    // A replica in two pools is held to the tighter one; actively unhealthy ones count as out.
    let t = table(4, vec![vec![0, 1, 2, 3], vec![0, 1]]);
    t.get(B).unwrap().set_active(false, 1);
    assert_eq!(t.failed(A, 2, &p, false), FailureEffect::Capped);
    t.get(B).unwrap().set_active(true, 3);
    assert!(matches!(
        t.failed(A, 4, &p, false),
        FailureEffect::Ejected { .. }
    ));
    // A backend in no pool (not routable) is never ejected.
    let t = table(2, vec![]);
    assert_eq!(t.failed(A, 1, &p, false), FailureEffect::Capped);
}

#[test]
fn the_active_verdict_takes_a_replica_out_and_passing_ends_an_ejection_early() {
    let t = table(2, vec![vec![0, 1]]);
    let p = policy(1, 50);
    let a = t.get(A).unwrap();
    a.set_active(false, 5);
    assert_eq!(a.admit(6), Admission::Unhealthy);
    assert_eq!(a.state(6), HealthState::Unhealthy);
    assert!(a.actively_down());
    a.set_active(true, 7);
    assert_eq!(a.admit(8), Admission::Open);
    let FailureEffect::Ejected { until_ms } = t.failed(A, 100, &p, false) else {
        panic!("not ejected");
    };
    assert_eq!(until_ms, 10_100);
    // Passing probes: half-open now, not at 10_100; the trial still decides.
    a.set_active(true, 200);
    assert_eq!(a.state(200), HealthState::HalfOpen);
    assert_eq!(a.admit(201), Admission::Trial);
    assert_eq!(a.admit(202), Admission::Ejected);
    assert!(matches!(
        t.failed(A, 203, &p, true),
        FailureEffect::Ejected { .. }
    ));
    // A pass after the ejection already ended changes nothing further.
    let b = t.get(B).unwrap();
    b.set_active(true, 300);
    assert_eq!(b.admit(301), Admission::Open);
}

#[test]
fn a_new_table_keeps_state_for_unchanged_backends_only() {
    let addr = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 9000)));
    let other = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 9001)));
    let t1 = HealthTable::carried(
        None,
        vec![("a".into(), addr), ("b".into(), addr)],
        vec![vec![A, B]],
    );
    t1.get(A).unwrap().set_active(false, 1);
    t1.get(B).unwrap().set_active(false, 1);
    // `a` stays as it was (moved to index 1); `b` changed its address: fresh state.
    let t2 = HealthTable::carried(
        Some(&t1),
        vec![("b".into(), other), ("a".into(), addr)],
        vec![vec![A, B]],
    );
    assert!(t2.get(B).unwrap().actively_down());
    assert!(!t2.get(A).unwrap().actively_down());
    assert_eq!(t2.name(0), Some("b"));
    assert!(Arc::ptr_eq(&t1.eject_lock, &t2.eject_lock));
}

/// Many shards failing the replicas of one pool at once: the cap holds at every moment, not only
/// in the end (exhaustive over thread interleavings is loom's job; this runs the real atomics
/// and the real mutex under contention).
#[test]
fn concurrent_failures_never_take_more_than_the_cap_out() {
    for round in 0..50u64 {
        let t = Arc::new(table(4, vec![vec![0, 1, 2, 3]]));
        let p = policy(2, 50);
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (t, stop) = (t.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut worst = 0;
                while !stop.load(Ordering::Relaxed) {
                    let out = (0..4)
                        .filter(|i| t.get(BackendIdx(*i)).is_some_and(ReplicaHealth::out))
                        .count();
                    worst = worst.max(out);
                }
                worst
            })
        };
        let workers: Vec<_> = (0..6u32)
            .map(|w| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for k in 0..200u64 {
                        let idx = BackendIdx((w + k as u32) % 4);
                        let _ = t.failed(idx, round * 1_000 + k, &p, false);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        let worst = watcher.join().unwrap();
        let out = (0..4)
            .filter(|i| t.get(BackendIdx(*i)).unwrap().out())
            .count();
        assert_eq!(
            out, 2,
            "round {round}: the cap of 2 of 4 is reached exactly"
        );
        assert!(worst <= 2, "round {round}: {worst} of 4 were out at once");
    }
}

#[test]
fn probe_status_reads_only_a_complete_http1_status_line() {
    assert_eq!(probe_status(b"HTTP/1.1 200 OK\r\n"), Ok(Some(200)));
    assert_eq!(probe_status(b"HTTP/1.0 503\r\nx: y"), Ok(Some(503)));
    assert_eq!(probe_status(b"HTTP/1.1 20"), Ok(None));
    assert_eq!(probe_status(b""), Ok(None));
    for bad in [
        &b"HTTP/2 200 OK\r\n"[..],
        b"HTTP/1.1 2000 OK\r\n",
        b"HTTP/1.1 2x0 OK\r\n",
        b"SSH-2.0-OpenSSH\r\n",
        b"HTTP/1.1 \r\n",
        // Found by the `health_probe` fuzz target: a status code must be 100..=999.
        b"HTTP/1.0 006 Service\r\n",
        b"HTTP/1.1 099\r\n",
    ] {
        assert_eq!(probe_status(bad), Err(ProbeError::Malformed), "{bad:?}");
    }
    assert_eq!(
        probe_status(&[b'a'; MAX_STATUS_LINE + 1]),
        Err(ProbeError::Malformed)
    );
    assert_eq!(probe_status(&[b'a'; MAX_STATUS_LINE]), Ok(None));
    // A status line that only ends past the limit stays refused once the limit was passed.
    let mut long = b"HTTP/1.1 200 ".to_vec();
    long.resize(MAX_STATUS_LINE + 10, b'x');
    long.extend_from_slice(b"\r\n");
    assert_eq!(probe_status(&long), Err(ProbeError::Malformed));
}
