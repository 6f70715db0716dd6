#![cfg(feature = "dynamo")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
//! The shim path end to end against scripted shim replicas (SHIM-05..22, OBS-05, OBS-13): the
//! router discovers the recorded Dynamo 1.6.1 fleet from a file store (two aggregated
//! `tiny-agg` workers in namespace `agg`; a prefill/decode pair serving `tiny-disagg` in
//! `disagg`), picks, pins and dispatches to `MockBackend`s standing in for each namespace's
//! `dynamo.frontend --router-mode direct`, and follows the failure table. A plain backend serves
//! both models for the unified fallback. No load samples arrive (the fixture's publishers are
//! not running), so the picker round-robins (`round_robin_stale`).

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::client::post;
use common::shim::{
    AGG, AGG_IDS, DECODE_ID, DISAGG, PLAIN_ONLY, PREFILL_ID, REJECTION, error_body, metric, pin,
    setup,
};
use common::{Reply, STEP, chat, chat_body, is_pin_header, refusing_url};

#[test]
fn aggregated_requests_carry_decimal_pins_and_rotate_over_the_workers() {
    let s = setup(true, None);
    let mut seen = BTreeSet::new();
    for i in 0..4 {
        let body = chat_body(AGG, &format!("agg-{i}"), false);
        // A client pin never changes the pick (SHIM-09/13).
        let resp = chat(
            s.router.addr(),
            &body,
            &[("x-dynamo-worker-instance-id", "12345")],
        );
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(resp.header("x-continuum-routing-path"), Some("unified"));
        // Identifiers only with x-backend (SHIM-15).
        assert_eq!(resp.header("x-continuum-worker-instance-id"), None);
        assert_eq!(resp.header("x-backend"), None);
        let r = s.shim_agg.wait_requests(i + 1, STEP).pop().unwrap();
        let worker = pin(&r, "x-dynamo-worker-instance-id").unwrap();
        assert!(AGG_IDS.contains(&worker), "{worker}");
        assert_eq!(pin(&r, "x-dynamo-prefill-instance-id"), None);
        // The fixture cards declare `data_parallel_size` (1): rank 0 is sent (SHIM-12).
        assert_eq!(pin(&r, "x-dynamo-dp-rank"), Some(0));
        assert_eq!(r.body, body, "the body keeps the client's model");
        seen.insert(worker);
    }
    assert_eq!(seen.len(), 2, "round-robin without load samples: {seen:?}");
    assert_eq!(s.unified.request_count(), 0);
    assert_eq!(
        metric(
            &s,
            "continuum_dynamo_selection_total",
            &[("role", "decode"), ("reason", "round_robin_stale")]
        ),
        4.0
    );
    assert_eq!(
        metric(
            &s,
            "continuum_dynamo_selection_total",
            &[("role", "prefill"), ("reason", "no_prefill_pool")]
        ),
        4.0
    );
    assert_eq!(
        metric(
            &s,
            "disaggregated_requests_total",
            &[("routing_path", "unified")]
        ),
        4.0
    );
}

#[test]
fn disaggregated_requests_pin_the_prefill_and_decode_pair_and_disclose_with_x_backend() {
    let s = setup(true, None);
    let resp = chat(
        s.router.addr(),
        &chat_body(DISAGG, "pair", false),
        &[("x-backend", ""), ("X-Dynamo-Prefill-Instance-Id", "1")],
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    let r = s.shim_disagg.wait_requests(1, STEP).pop().unwrap();
    assert_eq!(pin(&r, "x-dynamo-worker-instance-id"), Some(DECODE_ID));
    assert_eq!(pin(&r, "x-dynamo-prefill-instance-id"), Some(PREFILL_ID));
    assert_eq!(pin(&r, "x-dynamo-dp-rank"), Some(0));
    assert_eq!(pin(&r, "x-dynamo-prefill-dp-rank"), Some(0));
    assert_eq!(
        r.headers.iter().filter(|(n, _)| is_pin_header(n)).count(),
        4,
        "only the router's pins: {:?}",
        r.headers
    );
    assert_eq!(
        resp.header("x-continuum-routing-path"),
        Some("disaggregated")
    );
    assert_eq!(resp.header("x-backend"), Some("shim-disagg"));
    assert_eq!(
        resp.header("x-continuum-worker-instance-id"),
        Some(DECODE_ID.to_string().as_str())
    );
    assert_eq!(
        resp.header("x-continuum-prefill-instance-id"),
        Some(PREFILL_ID.to_string().as_str())
    );
    assert_eq!(resp.header("x-continuum-dynamo-namespace"), Some("disagg"));
    assert!(resp.headers.iter().all(|(n, _)| !is_pin_header(n)));
    assert_eq!(s.shim_agg.request_count(), 0);
}

#[test]
fn direct_mode_rejection_is_503_without_retry_or_fallback() {
    let s = setup(true, None);
    for stream in [false, true] {
        s.shim_disagg.push_reply(error_body(
            400,
            &format!("{{\"message\":\"{REJECTION}\",\"type\":\"Bad Request\",\"code\":400}}"),
        ));
        let resp = chat(s.router.addr(), &chat_body(DISAGG, "rej", stream), &[]);
        let err = resp.assert_json_error(503);
        assert_eq!(err["code"], "disaggregated_prefill_decode_unavailable");
        assert_eq!(
            resp.header("x-continuum-routing-path"),
            Some("disaggregated")
        );
    }
    assert_eq!(s.shim_disagg.request_count(), 2, "never retried");
    assert_eq!(s.unified.request_count(), 0, "never falls back");
    assert_eq!(
        metric(
            &s,
            "disaggregated_errors_total",
            &[("phase", "orchestration")]
        ),
        2.0
    );
    assert_eq!(
        metric(&s, "disaggregated_errors_total", &[("phase", "decode")]),
        0.0
    );
}

#[test]
fn wrapped_500_and_other_failures_fall_back_unified_without_pins() {
    let s = setup(true, None);
    // SHIM-19: the rejection wrapped in a 500 takes the decode path.
    s.shim_disagg.push_reply(error_body(
        500,
        &format!("{{\"error\":\"Failed to generate completions: {REJECTION}\"}}"),
    ));
    let resp = chat(s.router.addr(), &chat_body(DISAGG, "wrapped", false), &[]);
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["backend"], "unified");
    assert_eq!(
        resp.header("x-continuum-routing-path"),
        Some("fallback_unified")
    );
    let r = s.unified.wait_requests(1, STEP).pop().unwrap();
    assert!(
        r.headers.iter().all(|(n, _)| !is_pin_header(n)),
        "unified fallback carries no pins: {:?}",
        r.headers
    );
    // A buffered 400 (a pin the frontend no longer knows) with no other worker to pick (the
    // model's one prefill/decode pair) also falls back (SHIM-20).
    s.shim_disagg.push_reply(error_body(
        400,
        "{\"message\":\"Invalid request\",\"type\":\"Bad Request\",\"code\":400}",
    ));
    let resp = chat(s.router.addr(), &chat_body(DISAGG, "stale-pin", false), &[]);
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(s.unified.request_count(), 2);
    assert_eq!(s.shim_disagg.request_count(), 2, "no second pinned attempt");
    assert_eq!(
        metric(&s, "disaggregated_errors_total", &[("phase", "decode")]),
        2.0
    );
    assert_eq!(
        metric(
            &s,
            "disaggregated_requests_total",
            &[("routing_path", "fallback_unified")]
        ),
        2.0
    );
}

#[test]
fn without_fallback_a_shim_failure_is_disaggregated_decode_failed() {
    let s = setup(false, None);
    s.shim_disagg
        .push_reply(error_body(502, "{\"error\":\"engine gone\"}"));
    let resp = chat(s.router.addr(), &chat_body(DISAGG, "nofb", false), &[]);
    let err = resp.assert_json_error(502);
    assert_eq!(err["code"], "disaggregated_decode_failed");
    // A transport failure (the shim closes without answering) is the same failure.
    s.shim_agg.push_reply(Reply::Close);
    let resp = chat(s.router.addr(), &chat_body(AGG, "closed", false), &[]);
    let err = resp.assert_json_error(502);
    assert_eq!(err["code"], "disaggregated_decode_failed");
    assert_eq!(s.unified.request_count(), 0);
    assert_eq!(
        metric(&s, "disaggregated_errors_total", &[("phase", "decode")]),
        2.0
    );
}

/// Issue 38: the shim says the pinned worker is gone (1.6.1's 400 `Invalid request` after the
/// lease, 503 `Service temporarily unavailable` before it) and nothing reached the client: the
/// router picks once more without that worker, buffered or streamed, and counts why.
#[test]
fn a_gone_pinned_worker_is_picked_again_without_it() {
    let s = setup(true, None);
    let gone = [
        (
            400,
            "{\"message\":\"Invalid request\",\"type\":\"Bad Request\",\"code\":400}",
        ),
        (
            503,
            "{\"message\":\"Service temporarily unavailable\",\"code\":503}",
        ),
    ];
    for (i, (status, body)) in gone.into_iter().enumerate() {
        for stream in [false, true] {
            let before = s.shim_agg.request_count();
            s.shim_agg.push_reply(error_body(status, body));
            let resp = chat(s.router.addr(), &chat_body(AGG, "gone", stream), &[]);
            assert_eq!(resp.status, 200, "{status} {stream}: {}", resp.text());
            assert_eq!(resp.header("x-continuum-routing-path"), Some("unified"));
            let tried = s.shim_agg.wait_requests(before + 2, STEP);
            let first = pin(&tried[before], "x-dynamo-worker-instance-id").unwrap();
            let again = pin(&tried[before + 1], "x-dynamo-worker-instance-id").unwrap();
            assert_ne!(first, again, "never the gone worker again");
            assert!(AGG_IDS.contains(&again));
        }
        let reason = if i == 0 {
            "worker_unknown"
        } else {
            "worker_unavailable"
        };
        assert_eq!(
            metric(&s, "continuum_dynamo_repicks_total", &[("reason", reason)]),
            2.0
        );
    }
    assert_eq!(s.unified.request_count(), 0, "no fallback was needed");
    assert_eq!(metric(&s, "disaggregated_errors_total", &[]), 0.0);
    // Once per request: a second gone answer is the table's (buffered: the fallback).
    let pin_400 = gone[0].1;
    s.shim_agg.push_reply(error_body(400, pin_400));
    s.shim_agg.push_reply(error_body(400, pin_400));
    let resp = chat(s.router.addr(), &chat_body(AGG, "gone-twice", false), &[]);
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["backend"], "unified");
    assert_eq!(
        metric(
            &s,
            "continuum_dynamo_repicks_total",
            &[("reason", "worker_unknown")]
        ),
        3.0
    );
}

#[test]
fn streaming_relays_a_plain_4xx_but_falls_back_on_5xx_429_and_408() {
    let s = setup(true, None);
    let body_400 = "{\"message\":\"Validation: messages must not be empty\",\"code\":400}";
    s.shim_agg.push_reply(error_body(400, body_400));
    let resp = chat(s.router.addr(), &chat_body(AGG, "s400", true), &[]);
    assert_eq!(resp.status, 400);
    assert_eq!(
        resp.text(),
        body_400,
        "relayed as the shim sent it (SHIM-21)"
    );
    assert_eq!(s.unified.request_count(), 0);
    for (i, status) in [503u16, 429, 408].into_iter().enumerate() {
        s.shim_agg
            .push_reply(error_body(status, "{\"error\":\"busy\"}"));
        let resp = chat(s.router.addr(), &chat_body(AGG, "sfb", true), &[]);
        assert_eq!(resp.status, 200, "{status}: {}", resp.text());
        assert_eq!(s.unified.request_count(), i + 1, "{status} falls back");
    }
}

#[test]
fn connect_failure_retries_the_next_replica_with_the_same_pins() {
    let s = setup(false, Some(refusing_url()));
    for i in 0..2 {
        let resp = chat(
            s.router.addr(),
            &chat_body(AGG, &format!("cf-{i}"), false),
            &[],
        );
        assert_eq!(resp.status, 200, "{}", resp.text());
    }
    let got = s.shim_agg.wait_requests(2, STEP);
    let pins: BTreeSet<u64> = got
        .iter()
        .map(|r| pin(r, "x-dynamo-worker-instance-id").unwrap())
        .collect();
    assert!(pins.iter().all(|p| AGG_IDS.contains(p)), "{pins:?}");
    assert!(metric(&s, "continuum_upstream_retries_total", &[]) >= 1.0);
    assert_eq!(
        metric(&s, "disaggregated_errors_total", &[("phase", "decode")]),
        0.0
    );
}

#[test]
fn a_stream_failing_after_it_started_is_cut_without_fallback() {
    let s = setup(true, None);
    let sse = s.shim_agg.push_sse();
    let addr = s.router.addr();
    let client = std::thread::spawn(move || {
        let mut conn = common::Conn::open(addr);
        conn.send_all(&common::chat_bytes(&chat_body(AGG, "mid", true), &[]));
        let mut body = conn.stream_response(STEP).unwrap();
        body.expect_next(b"data: {\"x\":1}\n\n", STEP).unwrap();
        body.finish(STEP).is_err()
    });
    std::thread::sleep(Duration::from_millis(200));
    sse.send(b"data: {\"x\":1}\n\n");
    std::thread::sleep(Duration::from_millis(200));
    sse.abort();
    let cut = client.join().unwrap();
    assert!(cut, "the client must see the stream cut, not a clean end");
    assert_eq!(
        s.unified.request_count(),
        0,
        "no fallback after the stream started"
    );
}

#[test]
fn a_model_no_worker_serves_falls_through_to_plain_routing() {
    let s = setup(true, None);
    let resp = chat(s.router.addr(), &chat_body(PLAIN_ONLY, "x", false), &[]);
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["backend"], "unified");
    assert_eq!(resp.header("x-continuum-routing-path"), Some("no_worker"));
    let r = s.unified.wait_requests(1, STEP).pop().unwrap();
    assert!(r.headers.iter().all(|(n, _)| !is_pin_header(n)));
    assert_eq!(
        metric(
            &s,
            "disaggregated_requests_total",
            &[("routing_path", "no_worker")]
        ),
        1.0
    );
    assert_eq!(
        s.shim_agg.request_count() + s.shim_disagg.request_count(),
        0
    );
    let resp = chat(s.router.addr(), &chat_body("not-served", "x", false), &[]);
    let err = resp.assert_json_error(404);
    assert_eq!(err["code"], "model_not_found");
}

/// INGRESS-01/02/06: the Anthropic ingress pins like chat (from the converted body) and renders
/// the direct-mode rejection as its own 503.
#[test]
fn anthropic_messages_are_pinned_and_the_rejection_is_anthropic_shaped() {
    let s = setup(true, None);
    let body = serde_json::json!({
        "model": DISAGG, "max_tokens": 8,
        "messages": [{"role": "user", "content": "pin me"}],
    });
    let bytes = serde_json::to_vec(&body).unwrap();
    let send = || {
        let raw = common::request_bytes(
            "POST",
            "/v1/messages",
            &[("Content-Type", "application/json")],
            Some(&bytes),
        );
        common::client::roundtrip(s.router.addr(), &raw).unwrap()
    };
    let resp = send();
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["type"], "message");
    let r = s.shim_disagg.wait_requests(1, STEP).pop().unwrap();
    assert_eq!(r.path, "/v1/chat/completions");
    assert_eq!(pin(&r, "x-dynamo-worker-instance-id"), Some(DECODE_ID));
    assert_eq!(pin(&r, "x-dynamo-prefill-instance-id"), Some(PREFILL_ID));
    s.shim_disagg.push_reply(error_body(
        400,
        &format!("{{\"message\":\"{REJECTION}\",\"type\":\"Bad Request\",\"code\":400}}"),
    ));
    let resp = send();
    assert_eq!(resp.status, 503, "{}", resp.text());
    let v = resp.json();
    assert_eq!(v["type"], "error");
    assert_eq!(
        v["error"]["type"],
        "disaggregated_prefill_decode_unavailable"
    );
}

/// Dynamo 1.7's admission gate: the pinned worker is full and the frontend answers 529 before any
/// work (the real nightly's body). Relayed, buffered and streamed, even with the unified fallback
/// allowed; no decode failure counted; an Anthropic client gets `overloaded_error`.
#[test]
fn dynamo_1_7s_overload_is_relayed_not_resent_unpinned() {
    const BODY: &str =
        r#"{"message":"Service temporarily overloaded","type":"Overloaded","code":529}"#;
    let s = setup(true, None);
    for stream in [false, true] {
        s.shim_agg.push_reply(error_body(529, BODY));
        let resp = chat(s.router.addr(), &chat_body(AGG, "full", stream), &[]);
        assert_eq!(resp.status, 529, "stream {stream}: {}", resp.text());
        assert_eq!(resp.text(), BODY, "relayed as the frontend sent it");
    }
    assert_eq!(s.unified.request_count(), 0, "not resent without pins");
    assert_eq!(
        metric(&s, "disaggregated_errors_total", &[("phase", "decode")]),
        0.0
    );
    s.shim_agg.push_reply(error_body(529, BODY));
    let bytes = serde_json::to_vec(&serde_json::json!({
        "model": AGG, "max_tokens": 8, "messages": [{"role": "user", "content": "full"}],
    }))
    .unwrap();
    let raw = common::request_bytes(
        "POST",
        "/v1/messages",
        &[("Content-Type", "application/json")],
        Some(&bytes),
    );
    let resp = common::client::roundtrip(s.router.addr(), &raw).unwrap();
    let v = resp.json();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "overloaded_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("overloaded")),
        "{v}"
    );
}

/// A request the frontend finds invalid is the client's error: relayed as the frontend sent it,
/// neither counted as a shim failure nor sent again without pins.
#[test]
fn the_frontends_validation_400_is_relayed_to_the_client() {
    let s = setup(true, None);
    let body = "{\"message\":\"Validation: stream_options can only be set with stream\",\
                \"type\":\"Bad Request\",\"code\":400}";
    s.shim_agg.push_reply(error_body(400, body));
    let resp = chat(s.router.addr(), &chat_body(AGG, "invalid", false), &[]);
    assert_eq!(resp.status, 400);
    assert_eq!(resp.text(), body);
    assert_eq!(resp.header("x-continuum-routing-path"), Some("unified"));
    assert_eq!(s.unified.request_count(), 0);
    assert_eq!(
        metric(&s, "disaggregated_errors_total", &[("phase", "decode")]),
        0.0
    );
}

/// A non-2xx answer is held whole for the decision only up to 256 KiB: a larger one is an
/// unusable answer (a shim failure: fallback), a smaller one is read and judged as usual.
#[test]
fn a_held_answer_is_capped_at_256_kib() {
    let s = setup(true, None);
    let padded = |len: usize| {
        let msg = format!("Validation: {}", "x".repeat(len));
        format!("{{\"message\":\"{msg}\",\"type\":\"Bad Request\",\"code\":400}}")
    };
    let under = padded(200 * 1024);
    s.shim_agg.push_reply(error_body(400, &under));
    let resp = chat(s.router.addr(), &chat_body(AGG, "under", false), &[]);
    assert_eq!(resp.status, 400, "a client error under the cap is relayed");
    assert_eq!(resp.text().len(), under.len());
    s.shim_agg.push_reply(error_body(400, &padded(300 * 1024)));
    let resp = chat(s.router.addr(), &chat_body(AGG, "over", false), &[]);
    assert_eq!(
        resp.status, 200,
        "over the cap: a shim failure, then the fallback"
    );
    assert_eq!(resp.json()["backend"], "unified");
    assert_eq!(
        metric(&s, "disaggregated_errors_total", &[("phase", "decode")]),
        1.0
    );
}

/// Issue 14: every proxied route answers an unknown model (its 404, in the route's shape) and an
/// unusable body (400 with the reason) itself, so nothing reaches a shim replica or the plain
/// backend; a completions body for a fleet model is pinned like chat, buffered and streamed,
/// with the client's pins and `nvext.token_data` stripped.
#[test]
fn every_route_refuses_what_it_cannot_route_and_pins_completions() {
    let s = setup(true, None);
    let send = |path: &str, body: &str| post(s.router.addr(), path, body.as_bytes(), &[]);
    let unknown = [
        (
            "/v1/chat/completions",
            r#"{"model":"nope","messages":[{"role":"user","content":"x"}]}"#,
        ),
        ("/v1/completions", r#"{"model":"nope","prompt":"x"}"#),
        ("/v1/responses", r#"{"model":"nope","input":"x"}"#),
        ("/v1/responses/compact", r#"{"model":"nope","input":"x"}"#),
        ("/v1/embeddings", r#"{"model":"nope","input":"x"}"#),
    ];
    for (path, body) in unknown {
        let err = send(path, body).assert_json_error(404);
        assert_eq!(err["code"], "model_not_found", "{path}");
    }
    let messages = r#"{"model":"nope","max_tokens":4,"messages":[{"role":"user","content":"x"}]}"#;
    for path in ["/v1/messages", "/anthropic/v1/messages"] {
        let resp = send(path, messages);
        assert_eq!(resp.status, 404, "{path}: {}", resp.text());
        assert_eq!(resp.json()["error"]["type"], "not_found_error", "{path}");
    }
    let resp = s.router.get("/v1/models/nope");
    assert_eq!(resp.assert_json_error(404)["code"], "model_not_found");

    let paths = [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/v1/messages",
    ];
    for path in paths {
        for (body, reason) in [
            ("not json", ""),
            (r#"{"prompt":"x","input":"x","messages":[]}"#, "model"),
            (r#"{"model":7,"prompt":"x"}"#, "model"),
        ] {
            let resp = send(path, body);
            assert_eq!(resp.status, 400, "{path} {body}: {}", resp.text());
            let err = &resp.json()["error"];
            assert_eq!(err["type"], "invalid_request_error", "{path} {body}");
            let message = err["message"].as_str().unwrap_or("");
            assert!(message.contains(reason), "{path} {body}: {message}");
        }
    }
    for (body, reason) in [
        (format!(r#"{{"model":"{AGG}"}}"#), "no `prompt`"),
        (
            format!(r#"{{"model":"{AGG}","prompt":""}}"#),
            "`prompt` is empty",
        ),
    ] {
        let err = send("/v1/completions", &body).assert_json_error(400);
        assert!(err["message"].as_str().unwrap().contains(reason), "{err}");
    }
    assert_eq!(
        s.shim_agg.request_count() + s.shim_disagg.request_count() + s.unified.request_count(),
        0,
        "nothing reached a shim or the plain backend"
    );

    // A completions body for a fleet model: pinned like chat, client pins stripped.
    for (i, stream) in [false, true].into_iter().enumerate() {
        let body = format!(
            r#"{{"model":"{AGG}","prompt":[1,2,3],"stream":{stream},"backend_instance_id":9,"nvext":{{"token_data":[7]}}}}"#
        );
        let resp = send("/v1/completions", &body);
        assert_eq!(resp.status, 200, "{}", resp.text());
        let r = s.shim_agg.wait_requests(i + 1, STEP).pop().unwrap();
        assert_eq!(r.path, "/v1/completions");
        assert!(AGG_IDS.contains(&pin(&r, "x-dynamo-worker-instance-id").unwrap()));
        let sent: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(sent["prompt"], serde_json::json!([1, 2, 3]));
        assert!(sent.get("backend_instance_id").is_none(), "{sent}");
        assert!(sent.pointer("/nvext/token_data").is_none(), "{sent}");
    }
    assert_eq!(s.unified.request_count(), 0);
}
