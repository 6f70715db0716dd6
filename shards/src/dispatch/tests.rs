//! Unit tests of the dispatch logic without sockets: the `Exchange` through prepare and the
//! per-backend conversion (its state across attempts), and the loops' decisions over scripted
//! attempt outcomes.

use continuum_core::config::dynamo::ShimAnswers;
use continuum_core::config::{BackendConfig, ResponsesApi};
use continuum_core::shim::{
    RepickReason, RequestMode, ShimDecision, ShimOutcome, UnifiedFallback, decide,
};
use continuum_core::upstream::{DispatchError, ErrorKind, Phase};

use super::attempt::{PlainStep, plain_step, retry_on_fresh_connection};
use super::exchange::{Answer, Body, Conversion, Exchange, ExchangeBufs};
use super::shim::{PinnedStep, RepickCheck, StepPolicy, pinned_step};
use super::{CHAT_PATH, Ingress, convert, prepare};
use crate::http::respond::LocalError;
use crate::http::{Outcome, Request, ResponseSink};

pub(super) fn request(path: &str, body: &str) -> Request {
    let raw = format!(
        "POST {path} HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    Request::parsed(raw.as_bytes())
}

pub(crate) struct Parts {
    pub(crate) req: Request,
    pub(crate) sink: ResponseSink,
    pub(crate) bufs: ExchangeBufs,
}

impl Parts {
    pub(crate) fn new(path: &str, body: &str) -> Self {
        Self {
            req: request(path, body),
            sink: ResponseSink::detached(),
            bufs: ExchangeBufs::default(),
        }
    }

    pub(super) fn exchange(&mut self, ingress: Ingress) -> Exchange<'_> {
        Exchange::new(&mut self.req, &mut self.sink, &mut self.bufs, ingress)
    }
}

pub(crate) fn status_of(buf: &[u8]) -> u16 {
    let text = String::from_utf8_lossy(buf);
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

pub(crate) fn json_of(buf: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(buf);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or(serde_json::Value::Null)
}

#[test]
fn a_clean_chat_body_is_forwarded_as_sent() {
    let body = r#"{"model":"m","stream":true,"messages":[]}"#;
    let mut p = Parts::new("/v1/chat/completions", body);
    let mut ex = p.exchange(Ingress::Chat);
    let prepared = prepare::prepare(&mut ex).unwrap();
    assert_eq!(
        ex.body,
        Body::Client,
        "nothing to strip: the client's bytes go out"
    );
    assert_eq!(ex.bytes(ex.body), body.as_bytes());
    assert_eq!(&ex.bytes(ex.body)[prepared.model], b"m");
    assert_eq!(prepared.mode, RequestMode::Streaming);
    assert_eq!(ex.req.pins_stripped, 0);
}

#[test]
fn client_pin_fields_are_stripped_into_the_prepared_body() {
    let body =
        r#"{"model":"m","backend_instance_id":7,"nvext":{"token_data":[1,2]},"messages":[]}"#;
    let mut p = Parts::new("/v1/chat/completions", body);
    let mut ex = p.exchange(Ingress::Chat);
    let prepared = prepare::prepare(&mut ex).unwrap();
    assert_eq!(ex.body, Body::Prepared);
    let v: serde_json::Value = serde_json::from_slice(ex.bytes(ex.body)).unwrap();
    assert!(v.get("backend_instance_id").is_none());
    assert!(v.pointer("/nvext/token_data").is_none());
    assert_eq!(&ex.bytes(ex.body)[prepared.model], b"m");
    assert_eq!(prepared.mode, RequestMode::Buffered);
    assert_eq!(ex.req.pins_stripped, 1);
}

/// A completions body is prepared as a chat body is (pins and `token_data` stripped, a stripped
/// body re-serialised), and its `prompt` must be a non-empty string or array; whitespace is a
/// prompt, an array's elements are not judged here.
#[test]
fn a_completions_body_is_stripped_and_needs_a_prompt() {
    let body = r#"{"model":"m","prompt":[1,2],"nvext":{"token_data":[9]},"dp_rank":0}"#;
    let mut p = Parts::new("/v1/completions", body);
    let mut ex = p.exchange(Ingress::Completions);
    prepare::prepare(&mut ex).unwrap();
    let v: serde_json::Value = serde_json::from_slice(ex.bytes(ex.body)).unwrap();
    assert_eq!(v["prompt"], serde_json::json!([1, 2]));
    assert!(v.pointer("/nvext/token_data").is_none() && v.get("dp_rank").is_none());
    for ok in [
        r#"{"model":"m","prompt":" "}"#,
        r#"{"model":"m","prompt":["a"]}"#,
        r#"{"model":"m","prompt":[[]]}"#,
    ] {
        let mut p = Parts::new("/v1/completions", ok);
        assert!(
            prepare::prepare(&mut p.exchange(Ingress::Completions)).is_ok(),
            "{ok}"
        );
    }
    for (bad, reason) in [
        (r#"{"model":"m"}"#, "no `prompt`"),
        (r#"{"model":"m","prompt":""}"#, "`prompt` is empty"),
        (r#"{"model":"m","prompt":[ ]}"#, "`prompt` is empty"),
        (
            r#"{"model":"m","prompt":null}"#,
            "must be a string or an array",
        ),
        (
            r#"{"model":"m","prompt":{"a":1}}"#,
            "must be a string or an array",
        ),
        (
            r#"{"model":"m","prompt":"a","prompt":"b"}"#,
            "more than once",
        ),
    ] {
        let mut p = Parts::new("/v1/completions", bad);
        let outcome = prepare::prepare(&mut p.exchange(Ingress::Completions)).unwrap_err();
        assert_eq!(outcome.status, 400, "{bad}");
        let err = &json_of(&p.sink.buf)["error"];
        assert!(
            err["message"].as_str().unwrap().contains(reason),
            "{bad}: {err}"
        );
    }
    // A chat body needs no prompt.
    let mut p = Parts::new("/v1/chat/completions", r#"{"model":"m","messages":[]}"#);
    assert!(prepare::prepare(&mut p.exchange(Ingress::Chat)).is_ok());
}

#[test]
fn unusable_bodies_are_answered_in_the_clients_shape() {
    let mut p = Parts::new("/v1/chat/completions", r#"{"messages":[]}"#);
    let mut ex = p.exchange(Ingress::Chat);
    let outcome = prepare::prepare(&mut ex).unwrap_err();
    assert_eq!(outcome.status, 400);
    assert_eq!(json_of(&p.sink.buf)["error"]["code"], "bad_request");

    let mut p = Parts::new("/v1/messages", r#"{"model":"m"}"#);
    let mut ex = p.exchange(Ingress::Messages);
    let outcome = prepare::prepare(&mut ex).unwrap_err();
    assert_eq!(outcome.status, 400);
    assert_eq!(status_of(&p.sink.buf), 400);
    assert_eq!(json_of(&p.sink.buf)["type"], "error", "Anthropic-shaped");
}

#[test]
fn an_anthropic_body_becomes_chat_before_the_scan() {
    let body = r#"{"model":"claude","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut p = Parts::new("/v1/messages", body);
    let mut ex = p.exchange(Ingress::Messages);
    let prepared = prepare::prepare(&mut ex).unwrap();
    assert_eq!(ex.body, Body::Prepared);
    assert!(matches!(ex.convert, Some(Conversion::Anthropic(_))));
    let v: serde_json::Value = serde_json::from_slice(ex.bytes(ex.body)).unwrap();
    assert_eq!(v["messages"][0]["content"], "hi");
    assert_eq!(&ex.bytes(ex.body)[prepared.model], b"claude");
    assert_eq!(
        ex.upstream_path(ex.body),
        Some(CHAT_PATH),
        "sent to the chat path"
    );
    assert_eq!(prepared.mode, RequestMode::Streaming);
}

pub(super) fn backend(api: ResponsesApi) -> BackendConfig {
    let yaml = "backends:\n  - {name: b, type: openai, url: \"http://127.0.0.1:1\", models: [m]}\n";
    let (mut cfg, _) =
        continuum_core::config::Config::from_yaml(yaml, &continuum_core::config::NoEnv).unwrap();
    let mut b = cfg.backends.remove(0);
    b.responses_api = api;
    b
}

#[test]
fn a_responses_request_is_converted_per_backend_and_once_per_request() {
    let body = r#"{"model":"m","input":"hello"}"#;
    let mut p = Parts::new("/v1/responses", body);
    let mut ex = p.exchange(Ingress::Responses);
    prepare::prepare(&mut ex).unwrap();
    // A chat-only backend: the chat conversion, sent to the chat path, answer converted back.
    let b = convert::for_backend(&mut ex, &backend(ResponsesApi::Chat)).unwrap();
    assert_eq!(b, Body::Alt);
    assert_eq!(ex.upstream_path(b), Some(CHAT_PATH));
    assert!(matches!(ex.convert, Some(Conversion::Responses(_))));
    let first = ex.bytes(Body::Alt).to_vec();
    assert!(!first.is_empty());
    // A native backend on the next attempt: the client's body, nothing converted.
    let b = convert::for_backend(&mut ex, &backend(ResponsesApi::Native)).unwrap();
    assert_eq!(b, Body::Client);
    assert_eq!(ex.upstream_path(b), None);
    assert!(ex.convert.is_none());
    // Back to a chat backend: the conversion made once is reused.
    let b = convert::for_backend(&mut ex, &backend(ResponsesApi::Chat)).unwrap();
    assert_eq!(b, Body::Alt);
    assert_eq!(ex.bytes(Body::Alt), &first[..]);
}

#[test]
fn a_fresh_exchange_carries_nothing_from_the_last_one() {
    let mut p = Parts::new(
        "/v1/messages",
        r#"{"model":"c","max_tokens":1,"messages":[]}"#,
    );
    {
        let mut ex = p.exchange(Ingress::Messages);
        prepare::prepare(&mut ex).unwrap();
        assert!(ex.convert.is_some());
    }
    assert!(
        !p.bufs.prepared.is_empty(),
        "the connection's buffers keep the converted body"
    );
    // The next exchange on the same connection's buffers sends the client's own bytes, to the
    // client's own path, with nothing to convert back.
    let ex = p.exchange(Ingress::Chat);
    assert!(ex.convert.is_none() && ex.responses_ctx.is_none());
    assert_eq!(ex.body, Body::Client);
    assert_eq!(ex.bytes(ex.body), ex.req.body());
    assert_eq!(ex.upstream_path(ex.body), None);
}

const OK: Outcome = Outcome {
    status: 200,
    keep_alive: true,
};

#[test]
fn plain_loop_decisions() {
    assert_eq!(plain_step(Ok(Answer::Done(OK))), PlainStep::Answered(OK));
    assert_eq!(plain_step(Ok(Answer::Held(503))), PlainStep::RelayHeld(503));
    assert_eq!(
        plain_step(Err(DispatchError::CONNECT)),
        PlainStep::NextReplica(LocalError::UpstreamUnavailable),
        "nothing was sent: the next replica"
    );
    let timeout = DispatchError::new(ErrorKind::Timeout, Phase::Head);
    assert_eq!(
        plain_step(Err(timeout)),
        PlainStep::Answer(LocalError::UpstreamTimeout)
    );
    let bad = DispatchError::new(ErrorKind::Protocol, Phase::Head);
    assert_eq!(
        plain_step(Err(bad)),
        PlainStep::Answer(LocalError::UpstreamProtocol)
    );
    assert_eq!(
        plain_step(Err(timeout.in_body())),
        PlainStep::Abort,
        "the answer had started"
    );
    assert_eq!(
        plain_step(Err(DispatchError::CLIENT_GONE)),
        PlainStep::Abort
    );
}

#[test]
fn only_a_stale_reused_connection_is_retried_on_a_fresh_one() {
    assert!(retry_on_fresh_connection(DispatchError::closed(
        Phase::Head,
        true
    )));
    assert!(retry_on_fresh_connection(DispatchError::closed(
        Phase::Request,
        true
    )));
    assert!(!retry_on_fresh_connection(DispatchError::closed(
        Phase::Head,
        false
    )));
    assert!(!retry_on_fresh_connection(DispatchError::CONNECT));
    assert!(!retry_on_fresh_connection(DispatchError::new(
        ErrorKind::Reset,
        Phase::Head
    )));
}

#[test]
fn pinned_loop_decisions_follow_the_table() {
    use RequestMode::{Buffered, Streaming};
    use UnifiedFallback::{Allowed, Disabled};
    let step = |r, mode, fb, left| pinned_step(r, b"", policy(mode, fb, left, RepickCheck::Spent));
    assert_eq!(
        step(Ok(Answer::Done(OK)), Buffered, Allowed, false),
        PinnedStep::Answered(OK)
    );
    // A connect failure keeps the pins while a replica is left (SHIM-16).
    assert_eq!(
        step(Err(DispatchError::CONNECT), Buffered, Allowed, true),
        PinnedStep::Decided(ShimDecision::RetrySamePins)
    );
    assert_eq!(
        step(Err(DispatchError::CONNECT), Buffered, Allowed, false),
        PinnedStep::Decided(decide(ShimOutcome::ConnectFailed, Buffered, Allowed, false))
    );
    // A transport failure before any answer byte: the table's transport rule.
    for kind in [
        ErrorKind::Timeout,
        ErrorKind::Reset,
        ErrorKind::Protocol,
        ErrorKind::Closed,
    ] {
        for (mode, fb) in [(Buffered, Allowed), (Streaming, Disabled)] {
            let e = DispatchError::new(kind, Phase::Head);
            assert_eq!(
                step(Err(e), mode, fb, true),
                PinnedStep::Decided(decide(ShimOutcome::TransportFailed, mode, fb, false)),
                "{kind:?}"
            );
            // After the client saw bytes: abort, never a fallback (SHIM-17).
            assert_eq!(step(Err(e.in_body()), mode, fb, true), PinnedStep::Abort);
        }
    }
    assert_eq!(
        step(Err(DispatchError::CLIENT_GONE), Buffered, Allowed, true),
        PinnedStep::Abort
    );
    // Held answers: whatever the table says, a relay relays the held bytes.
    for status in [400u16, 404, 429, 500, 503] {
        for (mode, fb) in [(Buffered, Allowed), (Streaming, Disabled)] {
            let want = match decide(ShimOutcome::Answered { status, body: b"" }, mode, fb, false) {
                ShimDecision::Relay => PinnedStep::RelayHeld(status),
                d => PinnedStep::Decided(d),
            };
            assert_eq!(
                step(Ok(Answer::Held(status)), mode, fb, false),
                want,
                "{status}"
            );
        }
    }
    // The direct-mode rejection is classified, never relayed or retried (SHIM-18); the 1.6.1
    // frontend's pin rejection falls back unpinned (SHIM-19/20); the client's own 400 is relayed.
    let rejection = format!(
        r#"{{"error":{{"message":"{}"}}}}"#,
        continuum_core::ingress::errors::DIRECT_MODE_PREFILL_ID_ERROR
    );
    let got = pinned_step(
        Ok(Answer::Held(400)),
        rejection.as_bytes(),
        policy(
            Buffered,
            Allowed,
            true,
            RepickCheck::Open { pin_gone: true },
        ),
    );
    assert!(
        matches!(got, PinnedStep::Decided(ShimDecision::Fail(_))),
        "{got:?}"
    );
    let pin = br#"{"message":"Invalid request","type":"Bad Request","code":400}"#;
    let held400 = |body: &[u8], answers| {
        pinned_step(
            Ok(Answer::Held(400)),
            body,
            StepPolicy {
                answers,
                ..policy(Buffered, Allowed, true, RepickCheck::Spent)
            },
        )
    };
    assert_eq!(
        held400(pin, ShimAnswers::Dynamo16),
        PinnedStep::Decided(ShimDecision::FallbackUnified)
    );
    let own = br#"{"message":"Validation: messages is required"}"#;
    assert_eq!(
        held400(own, ShimAnswers::Dynamo16),
        PinnedStep::RelayHeld(400)
    );
    // The strict table: the same validation answer is a shim failure, and falls back.
    assert_eq!(
        held400(own, ShimAnswers::Strict),
        PinnedStep::Decided(ShimDecision::FallbackUnified)
    );
}

fn policy(
    mode: RequestMode,
    fallback: UnifiedFallback,
    replica_left: bool,
    repick: RepickCheck,
) -> StepPolicy {
    StepPolicy {
        mode,
        fallback,
        replica_left,
        answers: ShimAnswers::Dynamo16,
        repick,
    }
}

/// Issue 38: a held answer that says the pinned worker is gone asks for a re-pick while one is
/// open, in both modes (a streaming 400 would otherwise be relayed, SHIM-21), and never after.
#[test]
fn a_dead_pin_asks_for_one_repick_before_the_table() {
    use RequestMode::{Buffered, Streaming};
    use UnifiedFallback::{Allowed, Disabled};
    let unavailable = br#"{"message":"Service temporarily unavailable","code":503}"#;
    let pin = br#"{"message":"Invalid request","type":"Bad Request","code":400}"#;
    let failed = br#"{"message":"Failed to generate completions","code":500}"#;
    let open = RepickCheck::Open { pin_gone: false };
    let gone = RepickCheck::Open { pin_gone: true };
    for (mode, fb) in [(Buffered, Allowed), (Streaming, Disabled)] {
        let step = |status, body: &[u8], check| {
            pinned_step(
                Ok(Answer::Held(status)),
                body,
                policy(mode, fb, false, check),
            )
        };
        assert_eq!(
            step(503, unavailable, open),
            PinnedStep::Repick(RepickReason::WorkerUnavailable, 503)
        );
        assert_eq!(
            step(400, pin, open),
            PinnedStep::Repick(RepickReason::WorkerUnknown, 400)
        );
        // A 500 only when the router holds a pinned worker gone.
        assert_eq!(
            step(500, failed, gone),
            PinnedStep::Repick(RepickReason::WorkerFailed, 500)
        );
        assert!(matches!(step(500, failed, open), PinnedStep::Decided(_)));
        // Spent: the table alone.
        let table =
            |status, body| match decide(ShimOutcome::Answered { status, body }, mode, fb, false) {
                ShimDecision::Relay => PinnedStep::RelayHeld(status),
                d => PinnedStep::Decided(d),
            };
        for (status, body) in [(503, &unavailable[..]), (400, &pin[..]), (500, &failed[..])] {
            assert_eq!(step(status, body, RepickCheck::Spent), table(status, body));
        }
        // Transport results are never re-picks (SHIM-16 keeps the pins for replica failures).
        let e = DispatchError::new(ErrorKind::Reset, Phase::Head);
        assert!(matches!(
            pinned_step(Err(e), b"", policy(mode, fb, false, gone)),
            PinnedStep::Decided(_)
        ));
    }
}

/// `x-tenant-id` (1.6.1's cache-salt override): the last non-empty, trimmed value, any case.
#[test]
fn the_tenant_is_the_last_non_empty_x_tenant_id() {
    let with = |headers: &str| {
        let raw = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\n{headers}content-length: 2\r\n\r\n{{}}"
        );
        Request::parsed(raw.as_bytes())
    };
    let r = with("x-tenant-id: a\r\nX-Tenant-Id:  b \r\nx-tenant-id:   \r\n");
    assert_eq!(super::tenant_id(&r), Some("b"));
    let r = with("x-tenant-id:  \r\n");
    assert_eq!(super::tenant_id(&r), None);
    assert_eq!(super::tenant_id(&with("")), None);
}
