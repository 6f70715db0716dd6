//! `POST /admin/dynamo/explain` through the admin route, without sockets: each format through
//! the whole entry (query parameter, preparation, conversion to chat), refused formats, bodies
//! and methods, and admin access. The answer's content and "no state changes" are tested at the
//! dispatcher (`crate::dispatch`'s `explain_tests`, whose fixtures these reuse).

use serde_json::{Value, json};

use crate::dispatch::explain_tests::{MODEL, body, dispatcher, explain_chat, snapshot};
use crate::dispatch::tests::{Parts, json_of, status_of};

#[test]
fn messages_and_responses_bodies_are_explained_as_they_would_be_routed() {
    let snap = snapshot("");
    let (d, _) = dispatcher(&snap);
    let system = "You are terse. ".repeat(40);
    let chat = json!({"model": MODEL, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "hi"}]});
    let anthropic = json!({"model": MODEL, "max_tokens": 8, "system": system,
        "messages": [{"role": "user", "content": "hi"}]});
    let as_chat = explain_chat(&d, &snap, &chat.to_string());

    // Through the whole entry (query parameter, preparation, conversion to chat).
    let mut p = Parts::new(
        "/admin/dynamo/explain?format=messages",
        &anthropic.to_string(),
    );
    let v = super::dynamo::explain(&snap, &d, &mut p.req, &mut p.sink, &mut p.bufs);
    assert_eq!(v.status, 200);
    let v = json_of(&p.sink.buf);
    assert_eq!(v["format"], "messages");
    assert!(as_chat["prompt"]["token_count"].as_u64().unwrap() > 64);
    assert_eq!(
        v["prompt"], as_chat["prompt"],
        "an Anthropic body hashes as its chat form"
    );

    // A Responses body is not rendered: KV is skipped and the pick is load-based.
    let responses = json!({"model": MODEL, "input": "hi"}).to_string();
    let mut p = Parts::new("/admin/dynamo/explain?x=1&format=responses", &responses);
    super::dynamo::explain(&snap, &d, &mut p.req, &mut p.sink, &mut p.bufs);
    let v = json_of(&p.sink.buf);
    assert_eq!(v["format"], "responses");
    assert_eq!(v["kv"]["skipped"], "render_unavailable");
    assert_eq!(v["kv"]["result"], "render_unavailable");
    assert_eq!(v["prompt"]["token_count"], Value::Null);
    assert_eq!(v["prompt"]["blocks"], json!([]));
    assert_eq!(v["candidates"], json!([]));
    // No load sample yet: the load picker rotates.
    assert_eq!(v["choice"]["decode"]["reason"], "round_robin_stale");

    // An unknown format, a body without a model, another method: refused.
    for (path, b, status) in [
        ("/admin/dynamo/explain?format=xml", chat.to_string(), 400),
        (
            "/admin/dynamo/explain",
            json!({"messages": []}).to_string(),
            400,
        ),
    ] {
        let mut p = Parts::new(path, &b);
        super::dynamo::explain(&snap, &d, &mut p.req, &mut p.sink, &mut p.bufs);
        assert_eq!(status_of(&p.sink.buf), status, "{path}");
    }
    let raw = b"GET /admin/dynamo/explain HTTP/1.1\r\nhost: r\r\n\r\n";
    let mut p = Parts::new("/admin/dynamo/explain", "");
    p.req = crate::http::Request::parsed(raw);
    super::dynamo::explain(&snap, &d, &mut p.req, &mut p.sink, &mut p.bufs);
    assert_eq!(status_of(&p.sink.buf), 405);
}

#[test]
fn explain_needs_the_admin_token_when_one_is_configured() {
    // sha256 of "continuum-test-admin-token" (the e2e tests' token).
    let snap = snapshot(
        "admin:\n  token_hash: \"sha256:5bcfbe13c3a47f58a028afe52e4e1b77d5042254ab8f63a35ba8e50e18956bcb\"\n",
    );
    let (d, _) = dispatcher(&snap);
    let b = body("hi");
    let mut p = Parts::new("/admin/dynamo/explain", &b);
    super::dynamo::explain(&snap, &d, &mut p.req, &mut p.sink, &mut p.bufs);
    assert_eq!(status_of(&p.sink.buf), 401);
    let raw = format!(
        "POST /admin/dynamo/explain HTTP/1.1\r\nhost: r\r\nauthorization: Bearer continuum-test-admin-token\r\n\
         content-length: {}\r\n\r\n{b}",
        b.len()
    );
    p.req = crate::http::Request::parsed(raw.as_bytes());
    super::dynamo::explain(&snap, &d, &mut p.req, &mut p.sink, &mut p.bufs);
    assert_eq!(status_of(&p.sink.buf), 200);
    assert_eq!(json_of(&p.sink.buf)["outcome"], "pinned");
}
