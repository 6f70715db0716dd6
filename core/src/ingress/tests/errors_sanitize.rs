//! Unit tests of `core::ingress`: errors sanitize.
use serde_json::{Value, json};

use crate::ingress::IngressError;
use crate::ingress::errors::{ClassifiedError, ErrorClass};
use crate::ingress::sanitize::{responses_passthrough, strip_client_pins_value};

fn parse(b: &[u8]) -> Value {
    serde_json::from_slice(b).unwrap()
}

#[test]
fn prefill_decode_unavailable_in_every_shape() {
    let e = ClassifiedError::prefill_decode_unavailable();
    assert_eq!(e.status(), 503);
    let a = parse(&e.anthropic_body());
    assert_eq!(a["type"], "error");
    assert_eq!(
        a["error"]["type"],
        "disaggregated_prefill_decode_unavailable"
    );
    assert!(
        a["error"]["message"]
            .as_str()
            .unwrap()
            .contains("direct routing mode")
    );
    let o = parse(&e.openai_body());
    assert_eq!(
        o["error"],
        json!({"message": e.message, "type": "service_unavailable", "param": null,
               "code": "disaggregated_prefill_decode_unavailable"})
    );
    assert_eq!(parse(&e.responses_body()), o);
    let ev = super::parse_events(&e.responses_sse_event(7));
    assert_eq!(ev[0].0, "error");
    assert_eq!(ev[0].1["code"], "disaggregated_prefill_decode_unavailable");
    assert_eq!(ev[0].1["sequence_number"], 7);
    let ev = super::parse_events(&e.anthropic_sse_event());
    assert_eq!(ev[0].1, a);
}

#[test]
fn statuses_and_types() {
    let cases = [
        (
            ErrorClass::InvalidRequest,
            400,
            "invalid_request_error",
            "invalid_request_error",
        ),
        (
            ErrorClass::Authentication,
            401,
            "authentication_error",
            "authentication_error",
        ),
        (
            ErrorClass::Permission,
            403,
            "permission_error",
            "permission_error",
        ),
        (
            ErrorClass::NotFound,
            404,
            "not_found_error",
            "invalid_request_error",
        ),
        (
            ErrorClass::RequestTooLarge,
            413,
            "request_too_large",
            "invalid_request_error",
        ),
        (
            ErrorClass::RateLimited,
            429,
            "rate_limit_error",
            "rate_limit_error",
        ),
        (ErrorClass::Internal, 500, "api_error", "server_error"),
        (
            ErrorClass::UpstreamProtocol,
            502,
            "api_error",
            "upstream_error",
        ),
        (
            ErrorClass::Overloaded,
            503,
            "overloaded_error",
            "service_unavailable",
        ),
        (
            ErrorClass::UpstreamTimeout,
            504,
            "timeout_error",
            "upstream_error",
        ),
        (
            ErrorClass::DisaggregatedDecodeFailed,
            502,
            "disaggregated_decode_failed",
            "upstream_error",
        ),
    ];
    for (class, status, at, ot) in cases {
        let e = ClassifiedError::new(class, "m \"quoted\"");
        assert_eq!(e.status(), status);
        assert_eq!(parse(&e.anthropic_body())["error"]["type"], at);
        assert_eq!(
            parse(&e.anthropic_body())["error"]["message"],
            "m \"quoted\""
        );
        assert_eq!(parse(&e.openai_body())["error"]["type"], ot);
        assert_eq!(parse(&e.openai_body())["error"]["code"], class.code());
    }
    let ie = IngressError::InvalidRequest("bad".into());
    assert_eq!(ClassifiedError::from(&ie).status(), 400);
    assert_eq!(
        ClassifiedError::from(&IngressError::LineTooLong { cap: 1 }).status(),
        502
    );
}

#[test]
fn strips_token_data_and_pins() {
    let mut body = json!({
        "model":"m","messages":[],"dp_rank":1,"decode_worker_id":5,
        "nvext":{"token_data":[1,2],"backend_instance_id":7,"prefill_worker_id":3,
                 "decode_worker_id":4,"dp_rank":0,"prefill_dp_rank":1,"ignore_eos":true}
    });
    assert!(strip_client_pins_value(&mut body));
    assert_eq!(
        body,
        json!({"model":"m","messages":[],"nvext":{"ignore_eos":true}})
    );
    assert!(!strip_client_pins_value(&mut body));

    let mut only = json!({"model":"m","nvext":{"token_data":[1]}});
    assert!(strip_client_pins_value(&mut only));
    assert_eq!(only, json!({"model":"m"}));

    let mut untouched = json!({"model":"m","nvext":{}});
    assert!(!strip_client_pins_value(&mut untouched));
    assert_eq!(untouched, json!({"model":"m","nvext":{}}));
    assert!(!strip_client_pins_value(&mut json!([1])));
}

#[test]
fn responses_passthrough_keeps_bytes_when_clean() {
    let clean = br#"{"model":"gpt-oss-20b", "input":"hi" }"#;
    let p = responses_passthrough(clean).unwrap();
    assert_eq!(p.body, clean.to_vec());
    assert_eq!(p.model, "gpt-oss-20b");
    assert!(!p.removed);

    let dirty = br#"{"model":"gpt-oss-20b","input":"hi","nvext":{"token_data":[1,2,3]}}"#;
    let p = responses_passthrough(dirty).unwrap();
    assert!(p.removed);
    assert_eq!(parse(&p.body), json!({"model":"gpt-oss-20b","input":"hi"}));

    assert!(matches!(
        responses_passthrough(br#"{"input":"x"}"#),
        Err(IngressError::InvalidRequest(_))
    ));
    assert!(matches!(
        responses_passthrough(b"x"),
        Err(IngressError::InvalidJson(_))
    ));
}

#[test]
fn direct_mode_rejection_classification() {
    use crate::ingress::errors::is_direct_mode_rejection;
    let body = br#"{"error":{"message":"Prefill worker ID required in Direct routing mode","type":"invalid_request_error"}}"#;
    assert!(is_direct_mode_rejection(400, body));
    assert!(is_direct_mode_rejection(503, body));
    assert!(
        !is_direct_mode_rejection(500, body),
        "SHIM-19: generic 500 goes to decode failure"
    );
    assert!(
        !is_direct_mode_rejection(200, body),
        "INGRESS-07: in-stream is relayed"
    );
    assert!(!is_direct_mode_rejection(
        400,
        br#"{"error":{"message":"bad"}}"#
    ));
}
