#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
//! The Anthropic Messages and Responses ingresses on the data plane (INGRESS-01..08) against a
//! scripted OpenAI backend: conversion of the request and of the answer (buffered and SSE),
//! Anthropic-shaped errors, `nvext.token_data` and pin fields removed from every body.

mod common;

use common::{MockBackend, Reply, RouterConfig, RouterProcess, STEP, chat};
use serde_json::{Value, json};

fn router(backend: &MockBackend) -> RouterProcess {
    RouterProcess::start(&RouterConfig::default().backend("b", &backend.url(), &["m"]))
}

fn post(r: &RouterProcess, path: &str, body: &Value) -> common::Response {
    let bytes = serde_json::to_vec(body).unwrap();
    let raw = common::request_bytes(
        "POST",
        path,
        &[("Content-Type", "application/json")],
        Some(&bytes),
    );
    common::client::roundtrip(r.addr(), &raw).unwrap()
}

/// POST `body` to `path` on a client thread (the test feeds the backend meanwhile).
fn post_in_thread(
    r: &RouterProcess,
    path: &'static str,
    body: Value,
) -> std::thread::JoinHandle<common::Response> {
    let addr = r.addr();
    std::thread::spawn(move || {
        let bytes = serde_json::to_vec(&body).unwrap();
        let raw = common::request_bytes(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            Some(&bytes),
        );
        common::client::roundtrip(addr, &raw).unwrap()
    })
}

/// One upstream chat chunk event.
fn chunk(id: &str, delta: Value, finish: Value) -> String {
    format!(
        "data: {}\n\n",
        json!({"id": id, "object": "chat.completion.chunk", "created": 1,
               "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    )
}

fn messages_body(stream: bool) -> Value {
    json!({
        "model": "m",
        "max_tokens": 16,
        "system": "be brief",
        "stream": stream,
        "messages": [{"role": "user", "content": "hello"}],
    })
}

#[test]
fn messages_are_converted_to_chat_and_the_answer_back() {
    let b = MockBackend::start("b");
    let r = router(&b);
    for path in ["/v1/messages", "/anthropic/v1/messages"] {
        let resp = post(&r, path, &messages_body(false));
        assert_eq!(resp.status, 200, "{}", resp.text());
        let v = resp.json();
        assert_eq!(v["type"], "message");
        assert_eq!(v["role"], "assistant");
        assert_eq!(v["model"], "m");
        assert_eq!(v["content"][0]["type"], "text");
        assert_eq!(v["content"][0]["text"], "hi");
        assert_eq!(v["stop_reason"], "end_turn");
    }
    let got = b.wait_requests(2, STEP);
    for req in &got {
        assert_eq!(req.path, "/v1/chat/completions");
        let chat: Value = serde_json::from_slice(&req.body).unwrap();
        assert_eq!(chat["model"], "m");
        assert_eq!(
            chat["messages"][0],
            json!({"role": "system", "content": "be brief"})
        );
        assert_eq!(
            chat["messages"][1],
            json!({"role": "user", "content": "hello"})
        );
        assert_eq!(chat["max_tokens"], 16);
    }
}

#[test]
fn streamed_messages_become_anthropic_events() {
    let b = MockBackend::start("b");
    let r = router(&b);
    let sse = b.push_sse();
    let client = post_in_thread(&r, "/v1/messages", messages_body(true));
    b.wait_requests(1, STEP);
    let id = "chatcmpl-1";
    sse.send(
        chunk(
            id,
            json!({"role": "assistant", "content": "Hel"}),
            Value::Null,
        )
        .as_bytes(),
    );
    sse.send(chunk(id, json!({"content": "lo"}), Value::Null).as_bytes());
    sse.send(chunk(id, json!({}), json!("stop")).as_bytes());
    sse.send(b"data: [DONE]\n\n");
    sse.finish();
    let resp = client.join().unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    let text = resp.text();
    let events: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(events.first(), Some(&"message_start"), "{text}");
    assert_eq!(events.last(), Some(&"message_stop"), "{text}");
    assert!(events.contains(&"content_block_delta"), "{text}");
    let deltas: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v["type"] == "content_block_delta")
        .map(|v| v["delta"]["text"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(deltas, "Hello");
    // The converted request asked for a stream with usage.
    let req = &b.requests()[0];
    let chat: Value = serde_json::from_slice(&req.body).unwrap();
    assert_eq!(chat["stream"], true);
    assert_eq!(chat["stream_options"]["include_usage"], true);
}

#[test]
fn messages_errors_are_anthropic_shaped() {
    let b = MockBackend::start("b");
    let r = router(&b);
    // Unknown model: the router's own 404.
    let mut body = messages_body(false);
    body["model"] = json!("nope");
    let resp = post(&r, "/v1/messages", &body);
    assert_eq!(resp.status, 404);
    let v = resp.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "not_found_error");
    // Invalid Anthropic request: 400 before any dispatch.
    let resp = post(&r, "/v1/messages", &json!({"model": "m", "messages": "x"}));
    assert_eq!(resp.status, 400);
    assert_eq!(resp.json()["error"]["type"], "invalid_request_error");
    // An upstream 429 keeps its status and message, in the Anthropic shape.
    b.push_reply(Reply::Full {
        status: 429,
        headers: vec![("Content-Type".into(), "application/json".into())],
        body: br#"{"error":{"message":"slow down","type":"rate_limit","code":429}}"#.to_vec(),
    });
    let resp = post(&r, "/v1/messages", &messages_body(false));
    assert_eq!(resp.status, 429);
    let v = resp.json();
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert_eq!(v["error"]["message"], "slow down");
    assert_eq!(b.request_count(), 1);
}

#[test]
fn token_data_and_pin_fields_never_reach_a_backend() {
    let b = MockBackend::start("b");
    let r = router(&b);
    let body = json!({
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "nvext": {"token_data": [1, 2, 3], "backend_instance_id": 7, "greed_sampling": true},
        "dp_rank": 1,
    });
    let resp = chat(r.addr(), &serde_json::to_vec(&body).unwrap(), &[]);
    assert_eq!(resp.status, 200, "{}", resp.text());
    let resp = post(
        &r,
        "/v1/responses",
        &json!({"model": "m", "input": "x", "n\u{0076}ext": {"token_data": [1]}}),
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    let got = b.wait_requests(2, STEP);
    let chat_sent: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(chat_sent["nvext"], json!({"greed_sampling": true}));
    assert_eq!(chat_sent.get("dp_rank"), None);
    assert_eq!(chat_sent["model"], "m");
    assert_eq!(
        got[1].path, "/v1/responses",
        "native passthrough keeps the path"
    );
    let responses_sent: Value = serde_json::from_slice(&got[1].body).unwrap();
    assert_eq!(responses_sent.get("nvext"), None, "{responses_sent}");
    assert_eq!(responses_sent["input"], "x");
    // A body without such fields is forwarded byte for byte.
    let plain = br#"{"model":"m","messages":[{"role":"user","content":"y"}]}"#;
    chat(r.addr(), plain, &[]);
    assert_eq!(b.wait_requests(3, STEP)[2].body, plain.to_vec());
}

fn responses_router(backend: &MockBackend) -> RouterProcess {
    let mut cfg = RouterConfig::default().backend("b", &backend.url(), &["m"]);
    cfg.backends[0].responses_api = Some("chat".into());
    RouterProcess::start(&cfg)
}

#[test]
fn responses_are_converted_for_a_chat_only_backend() {
    let b = MockBackend::start("b");
    let r = responses_router(&b);
    let resp = post(
        &r,
        "/v1/responses",
        &json!({"model": "m", "instructions": "be brief", "input": "hello",
                "max_output_tokens": 9, "nvext": {"token_data": [1]}}),
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    let v = resp.json();
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["output"][0]["content"][0]["text"], "hi");
    let req = b.wait_requests(1, STEP).pop().unwrap();
    assert_eq!(req.path, "/v1/chat/completions");
    let chat: Value = serde_json::from_slice(&req.body).unwrap();
    assert_eq!(
        chat["messages"][0],
        json!({"role": "system", "content": "be brief"})
    );
    assert_eq!(chat["max_tokens"], 9);
    assert_eq!(chat.get("nvext"), None);
    // Unsupported stateful fields are the client's error, in the OpenAI shape.
    let resp = post(
        &r,
        "/v1/responses",
        &json!({"model": "m", "input": "x", "previous_response_id": "resp_1"}),
    );
    resp.assert_json_error(400);
    assert_eq!(b.request_count(), 1);
    // Compaction is never converted nor pinned: passed through.
    let resp = post(
        &r,
        "/v1/responses/compact",
        &json!({"model": "m", "input": "x"}),
    );
    assert_eq!(resp.status, 200);
    assert_eq!(b.wait_requests(2, STEP)[1].path, "/v1/responses/compact");
}

#[test]
fn streamed_responses_are_converted_to_response_events() {
    let b = MockBackend::start("b");
    let r = responses_router(&b);
    let sse = b.push_sse();
    let client = post_in_thread(
        &r,
        "/v1/responses",
        json!({"model": "m", "input": "hi", "stream": true}),
    );
    b.wait_requests(1, STEP);
    let id = "chatcmpl-9";
    sse.send(
        chunk(
            id,
            json!({"role": "assistant", "content": "He"}),
            Value::Null,
        )
        .as_bytes(),
    );
    sse.send(chunk(id, json!({"content": "y"}), json!("stop")).as_bytes());
    sse.send(b"data: [DONE]\n\n");
    sse.finish();
    let resp = client.join().unwrap();
    assert_eq!(resp.status, 200);
    let text = resp.text();
    let types: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .map(|v| v["type"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        types.first().map(String::as_str),
        Some("response.created"),
        "{text}"
    );
    assert_eq!(
        types.last().map(String::as_str),
        Some("response.completed"),
        "{text}"
    );
    assert!(
        types.iter().any(|t| t == "response.output_text.delta"),
        "{text}"
    );
}
