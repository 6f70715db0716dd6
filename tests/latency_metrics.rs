//! Where a request's time goes, on `/metrics` (issue 37 item 6): the router's own added time,
//! the upstream's time to first byte and, for an event stream, the time to its first event, per
//! route and path (`plain|shim`); the pick and prompt-pipeline time on the shim path with
//! `dynamo.kv`, over a real Dynamo 1.6.1 fleet.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{MockBackend, RouterConfig, RouterProcess, chat, metric_value};

const BODY: &[u8] = br#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#;
const STREAM: &[u8] =
    br#"{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

fn value(m: &str, name: &str, route: &str, path: &str) -> f64 {
    metric_value(m, name, &[("route", route), ("path", path)]).unwrap_or(0.0)
}

#[test]
fn plain_requests_report_router_time_first_byte_and_first_event() {
    let b = MockBackend::start("b1");
    let mut cfg = RouterConfig::default().backend("b1", &b.url(), &["m1"]);
    cfg.shards = "1".into();
    let r = RouterProcess::start(&cfg);

    // Two buffered answers.
    for _ in 0..2 {
        assert_eq!(chat(r.addr(), BODY, &[]).status, 200);
    }
    // One event stream whose first event comes 60 ms after its head.
    let events = b.push_sse();
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(60));
        events.send(b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n");
        events.send(b"data: [DONE]\n\n");
        events.finish();
    });
    let streamed = chat(r.addr(), STREAM, &[]);
    sender.join().unwrap();
    assert_eq!(streamed.status, 200, "{}", streamed.text());

    let m = r.metrics();
    let (route, path) = ("chat_completions", "plain");
    let count = |name: &str| value(&m, &format!("{name}_count"), route, path);
    let sum = |name: &str| value(&m, &format!("{name}_sum"), route, path);
    assert_eq!(count("continuum_router_added_seconds"), 3.0, "{m}");
    assert_eq!(count("continuum_upstream_first_byte_seconds"), 3.0, "{m}");
    assert_eq!(count("continuum_time_to_first_event_seconds"), 1.0, "{m}");
    // The stream's wait is the backend's, not the router's: after the head, before the event.
    let first_event = sum("continuum_time_to_first_event_seconds");
    assert!(
        first_event >= 0.06,
        "first event after {first_event} s:\n{m}"
    );
    let added = sum("continuum_router_added_seconds");
    assert!(added < 0.06 && added > 0.0, "router-added {added} s:\n{m}");
    // The router-added time is part of the whole request's.
    let whole = metric_value(
        &m,
        "continuum_http_request_duration_seconds_sum",
        &[("route", route)],
    )
    .unwrap();
    assert!(added < whole, "{added} >= {whole}");
    // No shim path here, and no pick.
    assert_eq!(
        value(&m, "continuum_router_added_seconds_count", route, "shim"),
        0.0
    );
    assert!(!m.contains("continuum_pick_seconds_count"), "{m}");
    // Buckets are cumulative and end at the count.
    assert_eq!(
        metric_value(
            &m,
            "continuum_router_added_seconds_bucket",
            &[("route", route), ("path", path), ("le", "+Inf")]
        ),
        Some(3.0)
    );
}

#[cfg(feature = "dynamo-kv")]
#[test]
fn the_shim_path_reports_the_pick_and_the_prompt_pipeline() {
    use common::fleet::{Fleet, FleetSpec};
    use common::kv_pick::{kv_router, tiny_model_digests, wait_kv_ready};

    let fleet = Fleet::start(&FleetSpec::new().agg("tiny-agg", 2));
    let r = kv_router(&fleet, &tiny_model_digests(), "");
    wait_kv_ready(&r, 2);
    let body =
        br#"{"model":"tiny-agg","messages":[{"role":"user","content":"hello"}],"max_tokens":4}"#;
    for _ in 0..3 {
        let resp = chat(r.addr(), body, &[]);
        assert_eq!(resp.status, 200, "{}", resp.text());
    }
    let m = r.metrics();
    let (route, path) = ("chat_completions", "shim");
    for name in [
        "continuum_router_added_seconds",
        "continuum_upstream_first_byte_seconds",
        "continuum_pick_seconds",
        "continuum_prompt_pipeline_seconds",
    ] {
        assert_eq!(
            value(&m, &format!("{name}_count"), route, path),
            3.0,
            "{name}:\n{m}"
        );
    }
    // The pick and the pipeline are inside the router's time.
    let added = value(&m, "continuum_router_added_seconds_sum", route, path);
    let inside = value(&m, "continuum_pick_seconds_sum", route, path)
        + value(&m, "continuum_prompt_pipeline_seconds_sum", route, path);
    assert!(inside > 0.0 && inside < added, "{inside} vs {added}:\n{m}");
    assert_eq!(
        value(&m, "continuum_router_added_seconds_count", route, "plain"),
        0.0
    );
}
