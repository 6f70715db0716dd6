//! The replica choice over a real snapshot's health table: skipping, trials, panic routing, the
//! all-unhealthy answer, and the verdicts attempts give.

use std::sync::Arc;

use continuum_core::config::{Config, NoEnv};
use continuum_core::discovery::FleetView;
use continuum_core::health::{Admission, HealthState};
use continuum_core::snapshot::{BackendIdx, RouterSnapshot};
use continuum_core::upstream::{DispatchError, ErrorKind, Phase};

use super::*;
use crate::http::Outcome;

/// Three replicas of model `m`, ejected after one failure, up to 2 of 3 (`max_ejection_percent:
/// 70`).
fn snap() -> RouterSnapshot {
    let b = |n: &str, port: u16| {
        format!(
            "  - {{ name: {n}, type: openai, url: \"http://127.0.0.1:{port}\", models: [m], \
             outlier: {{ consecutive_failures: 1, base_ejection: 10s, max_ejection_percent: 70 }} }}\n"
        )
    };
    let yaml = format!(
        "backends:\n{}{}{}",
        b("a", 9001),
        b("b", 9002),
        b("c", 9003)
    );
    let (config, _) = Config::from_yaml(&yaml, &NoEnv).unwrap();
    let addrs = (9001..=9003)
        .map(|p| Some(std::net::SocketAddr::from(([127, 0, 0, 1], p))))
        .collect();
    RouterSnapshot::build(
        1,
        Arc::new(config),
        addrs,
        Arc::default(),
        Arc::new(FleetView::default()),
        Arc::default(),
        None,
    )
}

const A: BackendIdx = BackendIdx(0);
const B: BackendIdx = BackendIdx(1);
const C: BackendIdx = BackendIdx(2);
const ALL: [BackendIdx; 3] = [A, B, C];

fn fail(s: &RouterSnapshot, chosen: Chosen<'_>, now: u64) -> Option<FailureEffect> {
    report(s, chosen, Verdict::Failure, || now)
}

#[test]
fn rotation_skips_ejected_and_unhealthy_replicas_and_tried_ones() {
    let s = snap();
    let mut tried = Tried::default();
    let first = choose(&s, &ALL, 0, &mut tried, 1, None).unwrap();
    assert_eq!(first.idx, A);
    assert!(matches!(
        fail(&s, first, 1),
        Some(FailureEffect::Ejected { .. })
    ));
    s.health.get(B).unwrap().set_active(false, 2);
    // A is ejected and B unhealthy: C, then nothing untried.
    let mut tried = Tried::default();
    assert_eq!(choose(&s, &ALL, 0, &mut tried, 3, None).unwrap().idx, C);
    assert_eq!(
        choose(&s, &ALL, 0, &mut tried, 3, None).unwrap_err(),
        NoReplica::Unhealthy
    );
    // A rotation with duplicates (weights) still tries each replica once.
    let mut tried = Tried::default();
    let weighted = [C, C, C];
    assert_eq!(
        choose(&s, &weighted, 1, &mut tried, 3, None).unwrap().idx,
        C
    );
    assert_eq!(
        choose(&s, &weighted, 1, &mut tried, 3, None).unwrap_err(),
        NoReplica::Exhausted
    );
}

#[test]
fn a_pool_of_ejected_replicas_still_serves_its_first_attempt() {
    let s = snap();
    for (i, idx) in [A, B].into_iter().enumerate() {
        let mut tried = Tried::default();
        let c = choose(&s, &[idx], 0, &mut tried, 1, None).unwrap();
        assert!(matches!(
            fail(&s, c, 1 + i as u64),
            Some(FailureEffect::Ejected { .. })
        ));
    }
    // Two of three out (the cap): C fails but stays.
    let mut tried = Tried::default();
    let c = choose(&s, &[C], 0, &mut tried, 5, None).unwrap();
    assert_eq!(fail(&s, c, 5), Some(FailureEffect::Capped));
    // Panic routing: a request over only the ejected ones still gets a first attempt...
    let mut tried = Tried::default();
    assert_eq!(choose(&s, &[A, B], 0, &mut tried, 6, None).unwrap().idx, A);
    // ...but no retry onto another ejected replica.
    assert_eq!(
        choose(&s, &[A, B], 0, &mut tried, 6, None).unwrap_err(),
        NoReplica::Unhealthy
    );
    // Unhealthy replicas are never chosen, not even as a last resort.
    s.health.get(C).unwrap().set_active(false, 7);
    let mut tried = Tried::default();
    assert_eq!(
        choose(&s, &[C], 0, &mut tried, 8, None).unwrap_err(),
        NoReplica::Unhealthy
    );
}

#[test]
fn a_half_open_replica_gets_one_trial_and_its_outcome_decides() {
    let s = snap();
    let mut tried = Tried::default();
    let c = choose(&s, &[A, B], 0, &mut tried, 1, None).unwrap();
    fail(&s, c, 1);
    let a = s.health.get(A).unwrap();
    assert_eq!(a.state(10_001), HealthState::HalfOpen);
    let mut t1 = Tried::default();
    let trial = choose(&s, &[A, B], 0, &mut t1, 10_001, None).unwrap();
    assert_eq!(trial.idx, A);
    // Meanwhile another request goes to B.
    let mut t2 = Tried::default();
    assert_eq!(
        choose(&s, &[A, B], 0, &mut t2, 10_002, None).unwrap().idx,
        B
    );
    // The client left: the trial slot is free again.
    assert_eq!(report(&s, trial, Verdict::Unknown, || 10_003), None);
    let mut t3 = Tried::default();
    let trial = choose(&s, &[A, B], 0, &mut t3, 10_004, None).unwrap();
    assert_eq!(trial.idx, A);
    assert_eq!(report(&s, trial, Verdict::Success, || 10_005), None);
    assert_eq!(a.admit(10_006), Admission::Open);
}

#[test]
fn verdicts_blame_the_replica_only_for_its_own_failures() {
    let done = |status| {
        Ok(Answer::Done(Outcome {
            status,
            keep_alive: true,
        }))
    };
    assert_eq!(verdict(&done(200)), Verdict::Success);
    assert_eq!(verdict(&done(429)), Verdict::Success);
    assert_eq!(verdict(&done(503)), Verdict::Failure);
    assert_eq!(verdict(&Ok(Answer::Held(400))), Verdict::Success);
    assert_eq!(verdict(&Ok(Answer::Held(500))), Verdict::Failure);
    for e in [
        DispatchError::CONNECT,
        DispatchError::new(ErrorKind::Timeout, Phase::Head),
        DispatchError::new(ErrorKind::Timeout, Phase::Body),
        DispatchError::new(ErrorKind::Reset, Phase::Head),
        DispatchError::new(ErrorKind::Protocol, Phase::Head),
    ] {
        assert_eq!(verdict(&Err(e)), Verdict::Failure, "{e}");
    }
    assert_eq!(verdict(&Err(DispatchError::CLIENT_GONE)), Verdict::Unknown);
}

#[test]
fn with_outlier_ejection_off_failures_change_nothing() {
    let yaml = "backends:\n  - { name: a, type: openai, url: \"http://127.0.0.1:9001\", models: [m], outlier: { enabled: false } }\n  - { name: b, type: openai, url: \"http://127.0.0.1:9002\", models: [m] }\n";
    let (config, _) = Config::from_yaml(yaml, &NoEnv).unwrap();
    let s = RouterSnapshot::build(
        1,
        Arc::new(config),
        vec![
            Some(std::net::SocketAddr::from(([127, 0, 0, 1], 9001))),
            Some(std::net::SocketAddr::from(([127, 0, 0, 1], 9002))),
        ],
        Arc::default(),
        Arc::new(FleetView::default()),
        Arc::default(),
        None,
    );
    for now in 0..20 {
        let mut tried = Tried::default();
        let c = choose(&s, &[A], 0, &mut tried, now, None).unwrap();
        assert_eq!(fail(&s, c, now), None);
    }
    assert_eq!(s.health.get(A).unwrap().admit(21), Admission::Open);
}

/// A success outside a trial only resets the streak: the report must not read the clock for it
/// (the hop reads it three times a request, docs/decisions.md "The hop's cost"); a failure does.
#[test]
fn only_reports_that_use_the_time_read_the_clock() {
    let s = snap();
    let mut tried = Tried::default();
    let chosen = choose(&s, &ALL, 0, &mut tried, 1_000, None).unwrap();
    let no_clock = || -> u64 { panic!("a plain success read the clock") };
    assert_eq!(report(&s, chosen, Verdict::Success, no_clock), None);
    let mut read = false;
    let chosen = choose(&s, &ALL, 0, &mut Tried::default(), 1_001, None).unwrap();
    let effect = report(&s, chosen, Verdict::Failure, || {
        read = true;
        1_002
    });
    assert!(read, "a failure is timed");
    assert!(matches!(effect, Some(FailureEffect::Ejected { until_ms }) if until_ms >= 1_002));
}
