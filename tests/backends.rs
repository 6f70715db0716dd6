//! Backends an operator can trust, end to end with real processes on loopback: a replica frozen
//! with SIGSTOP is ejected after a bounded number of first-byte timeouts and re-admitted after
//! SIGCONT; health checks take replicas out and bring them back; a flapping one stays out;
//! ejection never empties a pool; an all-down pool answers fast; the retry budget bounds
//! retries; idle and deadline timeouts cut what they should and nothing else.

#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::health::{state, wait_state};
use common::stub::StubBackend;
use common::{
    MockBackend, Reply, RouterConfig, RouterProcess, STEP, chat, chat_body, metric_value,
};

fn counter(r: &RouterProcess, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(&r.metrics(), name, labels).unwrap_or(0.0)
}

/// One buffered chat request; the status and the backend that answered (`x-backend`).
fn ask(r: &RouterProcess, marker: &str) -> (u16, String) {
    let resp = chat(
        r.addr(),
        &chat_body("m", marker, false),
        &[("x-backend", "")],
    );
    let backend = resp.header("x-backend").unwrap_or("").to_owned();
    (resp.status, backend)
}

const HEALTH_INTERVAL: Duration = Duration::from_millis(500);

#[test]
fn a_frozen_replica_costs_bounded_timeouts_then_leaves_and_returns_after_sigcont() {
    let a = StubBackend::start("a");
    let b = StubBackend::start("b");
    // Failures eject after 2; the health check would take 3 × 500 ms to notice alone, so the
    // first requests meet the frozen replica through passive detection first.
    let keys = [
        "outlier: { consecutive_failures: 2, base_ejection: 60s }",
        "health_check: { path: /health, interval: 500ms, timeout: 300ms, healthy_threshold: 1, unhealthy_threshold: 3 }",
    ];
    let mut cfg = RouterConfig::default()
        .backend_with("a", &a.url(), &["m"], &keys)
        .backend_with("b", &b.url(), &["m"], &keys);
    cfg.upstream_first_byte = "400ms".into();
    cfg.connect_retries = 0;
    let r = RouterProcess::start(&cfg);
    let mut served = std::collections::BTreeSet::new();
    for i in 0..8 {
        let (status, backend) = ask(&r, &format!("warm {i}"));
        assert_eq!(status, 200);
        served.insert(backend);
    }
    assert_eq!(
        served.len(),
        2,
        "both replicas serve before the freeze: {served:?}"
    );

    a.freeze();
    let mut timeouts = 0;
    let mut statuses = Vec::new();
    for i in 0..30 {
        let (status, backend) = ask(&r, &format!("frozen {i}"));
        if status == 504 {
            timeouts += 1;
        } else {
            assert_eq!((status, backend.as_str()), (200, "b"), "request {i}");
        }
        statuses.push(status);
    }
    // At most the configured failures per shard (2 shards), then never again.
    assert!(
        timeouts >= 1,
        "the frozen replica was never tried: {statuses:?}"
    );
    assert!(
        timeouts <= 2 * 2,
        "{timeouts} first-byte timeouts: {statuses:?}"
    );
    assert!(
        statuses[statuses.len() - 20..].iter().all(|s| *s == 200),
        "later requests all succeed on b: {statuses:?}"
    );
    assert!(
        counter(
            &r,
            "continuum_upstream_ejections_total",
            &[("backend", "a")]
        ) >= 1.0
    );
    wait_state(&r, "a", &["unhealthy"], STEP);

    a.thaw();
    let back = wait_state(&r, "a", &["healthy", "half_open"], STEP);
    assert!(
        back <= HEALTH_INTERVAL + Duration::from_millis(1500),
        "re-admitted {back:?} after SIGCONT (interval {HEALTH_INTERVAL:?})"
    );
    // It takes traffic again (its half-open trial succeeds and closes the breaker).
    let mut again = false;
    for i in 0..10 {
        let (status, backend) = ask(&r, &format!("thawed {i}"));
        assert_eq!(status, 200);
        again |= backend == "a";
    }
    assert!(again, "a never served again after SIGCONT");
    assert_eq!(state(&r, "a"), "healthy");
}

#[test]
fn an_all_frozen_pool_answers_at_once_and_a_killed_one_fast() {
    let a = StubBackend::start("a");
    let b = StubBackend::start("b");
    let hc = ["health_check: { interval: 200ms, timeout: 100ms, unhealthy_threshold: 2 }"];
    let mut cfg = RouterConfig::default()
        .backend_with("a", &a.url(), &["m"], &hc)
        .backend_with("b", &b.url(), &["m"], &hc);
    cfg.upstream_first_byte = "30s".into();
    let r = RouterProcess::start(&cfg);
    assert_eq!(ask(&r, "up").0, 200);
    a.freeze();
    b.freeze();
    wait_state(&r, "a", &["unhealthy"], STEP);
    wait_state(&r, "b", &["unhealthy"], STEP);
    let t0 = Instant::now();
    let resp = chat(r.addr(), &chat_body("m", "all down", false), &[]);
    let v = resp.assert_json_error(503);
    assert_eq!(v["code"], "no_healthy_upstream", "{v}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
    drop(a);
    drop(b);
    // Killed (connections refused), passive detection only: a fast classified 502.
    let mut cfg = RouterConfig::default()
        .backend("a", &common::refusing_url(), &["m"])
        .backend("b", &common::refusing_url(), &["m"]);
    cfg.upstream_first_byte = "30s".into();
    let r = RouterProcess::start(&cfg);
    for i in 0..6 {
        let t0 = Instant::now();
        let resp = chat(
            r.addr(),
            &chat_body("m", &format!("killed {i}"), false),
            &[],
        );
        let v = resp.assert_json_error(502);
        assert_eq!(v["code"], "upstream_unavailable", "{v}");
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "took {:?}",
            t0.elapsed()
        );
    }
    // Both refused, but the cap keeps one of the two in rotation.
    let ejected = ["a", "b"]
        .iter()
        .filter(|n| state(&r, n) == "ejected")
        .count();
    assert!(ejected <= 1, "{ejected} of 2 ejected");
}

#[test]
fn ejection_never_empties_a_pool_of_failing_replicas() {
    let backends: Vec<MockBackend> = (0..4)
        .map(|i| MockBackend::start(&format!("f{i}")))
        .collect();
    for b in &backends {
        b.set_handler(|_| Reply::json_status(500, br#"{"error":{"message":"boom"}}"#));
    }
    let keys =
        ["outlier: { consecutive_failures: 1, base_ejection: 60s, max_ejection_percent: 50 }"];
    let mut cfg = RouterConfig::default();
    for b in &backends {
        cfg = cfg.backend_with(b.name(), &b.url(), &["m"], &keys);
    }
    let r = RouterProcess::start(&cfg);
    for i in 0..40 {
        // Every failure is relayed as the backend's own 500 (nothing retried after sending).
        let (status, _) = ask(&r, &format!("fail {i}"));
        assert_eq!(status, 500);
    }
    let out: Vec<String> = backends
        .iter()
        .filter(|b| state(&r, b.name()) != "healthy")
        .map(|b| b.name().to_owned())
        .collect();
    assert_eq!(out.len(), 2, "exactly half of the pool is out: {out:?}");
    // The two in rotation took every request after the ejections.
    let late: usize = backends
        .iter()
        .filter(|b| !out.contains(&b.name().to_owned()))
        .map(MockBackend::request_count)
        .sum();
    assert!(late >= 36, "{late} of 40 on the replicas in rotation");
}

#[test]
fn a_flapping_health_endpoint_keeps_its_replica_out_until_it_passes_in_a_row() {
    let a = MockBackend::start("a");
    let b = MockBackend::start("b");
    let hc = [
        "health_check: { interval: 150ms, timeout: 100ms, healthy_threshold: 2, unhealthy_threshold: 1 }",
    ];
    let cfg = RouterConfig::default()
        .backend_with("a", &a.url(), &["m"], &hc)
        .backend_with("b", &b.url(), &["m"], &hc);
    let r = RouterProcess::start(&cfg);
    a.set_health_status(503);
    wait_state(&r, "a", &["unhealthy"], STEP);
    // Flap: after every probe, answer the next one the other way.
    let start = a.health_probes();
    let deadline = Instant::now() + STEP;
    while a.health_probes() < start + 12 {
        let n = a.health_probes();
        a.set_health_status(if (n - start).is_multiple_of(2) {
            200
        } else {
            503
        });
        assert_eq!(state(&r, "a"), "unhealthy", "re-admitted while flapping");
        let before = a.request_count();
        assert_eq!(ask(&r, "flap").0, 200);
        assert_eq!(a.request_count(), before, "a got traffic while flapping");
        while a.health_probes() == n {
            assert!(Instant::now() < deadline, "probes stopped");
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    a.set_health_status(200);
    wait_state(&r, "a", &["healthy"], STEP);
    let mut reached = false;
    for i in 0..6 {
        reached |= ask(&r, &format!("steady {i}")).1 == "a";
    }
    assert!(reached, "a never served after passing twice in a row");
}

#[test]
fn the_retry_budget_bounds_retries_during_an_outage() {
    let live = MockBackend::start("live");
    // The dead replica is never ejected here, so only the budget bounds the retries.
    let mut cfg = RouterConfig::default()
        .backend_with(
            "dead",
            &common::refusing_url(),
            &["m"],
            &["outlier: { enabled: false }"],
        )
        .backend_with(
            "live",
            &live.url(),
            &["m"],
            &["outlier: { enabled: false }"],
        );
    cfg.connect_retries = 1;
    cfg.server_yaml = "  retry_budget: { ratio: 0.1, min_retries_per_second: 0 }\n".into();
    let r = RouterProcess::start(&cfg);
    let requests = 200;
    let mut failed = 0;
    for i in 0..requests {
        match ask(&r, &format!("outage {i}")).0 {
            200 => {}
            502 => failed += 1,
            s => panic!("status {s}"),
        }
    }
    let retries = counter(&r, "continuum_upstream_retries_total", &[]);
    let denied = counter(&r, "continuum_upstream_retries_denied_total", &[]);
    // About half the requests meet the dead replica first and want one retry each.
    assert!(
        retries <= 0.1 * f64::from(requests) + 2.0,
        "{retries} retries for {requests} requests at ratio 0.1"
    );
    assert!(retries >= 1.0, "no retry at all");
    assert!(denied >= 50.0, "{denied} retries denied");
    assert_eq!(
        failed as f64, denied,
        "each denied retry is a failed request"
    );
    assert_eq!(live.request_count() as f64, f64::from(requests) - denied);
}

#[test]
fn idle_and_deadline_timeouts_cut_streams_only_when_they_should() {
    let backend = MockBackend::start("s");
    let mut cfg = RouterConfig::default().backend("s", &backend.url(), &["m"]);
    cfg.upstream_idle = "400ms".into();
    cfg.shards = "1".into();
    let r = RouterProcess::start(&cfg);
    // A live stream longer than every timeout but with short gaps: relayed whole.
    let sse = backend.push_sse();
    let mut conn = common::Conn::open(r.addr());
    conn.send_all(&common::chat_bytes(&chat_body("m", "live", true), &[]));
    let sender = std::thread::spawn(move || {
        for i in 0..8 {
            std::thread::sleep(Duration::from_millis(150));
            sse.send(format!("data: {{\"n\":{i}}}\n\n").as_bytes());
        }
        sse.finish();
    });
    let mut body = conn.stream_response(STEP).unwrap();
    let all = body.finish(STEP).unwrap();
    sender.join().unwrap();
    assert!(
        String::from_utf8_lossy(&all).contains("\"n\":7"),
        "the live stream was cut"
    );
    // A stream that stalls longer than upstream_idle: the client connection is closed.
    let sse = backend.push_sse();
    let mut conn = common::Conn::open(r.addr());
    conn.send_all(&common::chat_bytes(&chat_body("m", "stall", true), &[]));
    sse.send(b"data: {\"first\":1}\n\n");
    let mut body = conn.stream_response(STEP).unwrap();
    body.expect_next(b"data: {\"first\":1}\n\n", STEP).unwrap();
    drop(body);
    let t0 = Instant::now();
    assert!(conn.wait_closed(STEP), "a stalled stream was kept open");
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "cut before the idle timeout"
    );
    drop(sse);

    // request_deadline on the backend: even a live stream ends at the deadline.
    let backend = MockBackend::start("d");
    let mut cfg = RouterConfig::default().backend_with(
        "d",
        &backend.url(),
        &["m"],
        &["timeouts: { request_deadline: 1s }"],
    );
    cfg.shards = "1".into();
    let r = RouterProcess::start(&cfg);
    let sse = backend.push_sse();
    let mut conn = common::Conn::open(r.addr());
    let t0 = Instant::now();
    conn.send_all(&common::chat_bytes(&chat_body("m", "deadline", true), &[]));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let feeder = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            for i in 0..40 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                sse.send(format!("data: {{\"n\":{i}}}\n\n").as_bytes());
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let _ = conn.stream_response(STEP).unwrap();
    assert!(
        conn.wait_closed(STEP),
        "the deadline did not end the stream"
    );
    let took = t0.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    feeder.join().unwrap();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "closed after {took:?} with a 1 s deadline"
    );
}
