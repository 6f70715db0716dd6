//! The shim decision table, one test per rule, then invariants over every status.

use super::*;

const REJECTION: &[u8] =
    br#"{"error":{"message":"Prefill worker ID required in Direct routing mode","code":400}}"#;
const WRAPPED: &[u8] = br#"{"message":"Failed to generate completions: Prefill worker ID required in Direct routing mode"}"#;
const OTHER: &[u8] = br#"{"error":{"message":"worker 42 not found"}}"#;
/// The real 1.6.1 frontend's answer to an unusable pin.
const PIN_400: &[u8] = br#"{"message":"Invalid request","type":"Bad Request","code":400}"#;
/// The real 1.6.1 frontend's request validation error.
const VALIDATION_400: &[u8] =
    br#"{"message":"Validation: stream_options can only be set with stream","type":"Bad Request","code":400}"#;

use RequestMode::{Buffered, Streaming};
use UnifiedFallback::{Allowed, Disabled};

/// The real 1.7 nightly frontend's answer when the pinned worker's admission gate is full.
const OVERLOAD_529: &[u8] =
    br#"{"message":"Service temporarily overloaded","type":"Overloaded","code":529}"#;

fn answered(status: u16, body: &[u8]) -> ShimOutcome<'_> {
    ShimOutcome::Answered { status, body }
}

#[test]
fn shim_16_connect_failure_retries_with_the_same_pins_while_replicas_remain() {
    for mode in [Buffered, Streaming] {
        for fb in [Allowed, Disabled] {
            assert_eq!(
                decide(ShimOutcome::ConnectFailed, mode, fb, true),
                ShimDecision::RetrySamePins
            );
        }
    }
    // Out of replicas: a shim failure like any other.
    assert_eq!(
        decide(ShimOutcome::ConnectFailed, Buffered, Allowed, false),
        ShimDecision::FallbackUnified
    );
    assert_eq!(
        decide(ShimOutcome::ConnectFailed, Streaming, Disabled, false),
        ShimDecision::Fail(ErrorClass::DisaggregatedDecodeFailed)
    );
}

#[test]
fn shim_17_mid_stream_failure_never_repicks_or_falls_back() {
    for fb in [Allowed, Disabled] {
        let d = decide(ShimOutcome::FailedMidStream, Streaming, fb, true);
        assert_eq!(d, ShimDecision::MidStream);
        assert_eq!(d.error_phase(), None);
    }
}

#[test]
fn shim_18_direct_mode_rejection_is_a_503_in_phase_orchestration_without_retry() {
    for status in [400, 404, 422, 503] {
        for mode in [Buffered, Streaming] {
            for fb in [Allowed, Disabled] {
                let d = decide(answered(status, REJECTION), mode, fb, true);
                assert_eq!(
                    d,
                    ShimDecision::Fail(ErrorClass::DisaggregatedPrefillDecodeUnavailable),
                    "status {status} {mode:?} {fb:?}"
                );
                assert_eq!(d.error_phase(), Some(ErrorPhase::Orchestration));
                assert_eq!(
                    ErrorClass::DisaggregatedPrefillDecodeUnavailable.status(),
                    503
                );
            }
        }
    }
}

#[test]
fn shim_19_rejection_wrapped_in_a_500_takes_the_decode_failure_path() {
    let d = decide(answered(500, WRAPPED), Buffered, Allowed, true);
    assert_eq!(d, ShimDecision::FallbackUnified);
    assert_eq!(d.error_phase(), Some(ErrorPhase::Decode));
    assert_eq!(
        decide(answered(500, WRAPPED), Buffered, Disabled, true),
        ShimDecision::Fail(ErrorClass::DisaggregatedDecodeFailed)
    );
}

#[test]
fn shim_20_other_failures_fall_back_or_fail_as_configured() {
    for outcome in [
        ShimOutcome::TransportFailed,
        answered(502, OTHER),
        answered(400, PIN_400),
        answered(400, b"not json"),
        answered(404, OTHER),
    ] {
        let d = decide(outcome, Buffered, Allowed, true);
        assert_eq!(d, ShimDecision::FallbackUnified, "{outcome:?}");
        assert_eq!(d.error_phase(), Some(ErrorPhase::Decode));
        let d = decide(outcome, Buffered, Disabled, true);
        assert_eq!(d, ShimDecision::Fail(ErrorClass::DisaggregatedDecodeFailed));
        assert_eq!(d.error_phase(), Some(ErrorPhase::Decode));
    }
}

#[test]
fn the_clients_own_errors_are_relayed_not_retried() {
    for (status, body) in [
        (400, VALIDATION_400),
        (400, OTHER),
        (401, OTHER),
        (413, b"" as &[u8]),
        (422, OTHER),
    ] {
        for mode in [Buffered, Streaming] {
            for fb in [Allowed, Disabled] {
                let d = decide(answered(status, body), mode, fb, true);
                assert_eq!(d, ShimDecision::Relay, "{status} {mode:?}");
                assert_eq!(d.error_phase(), None);
            }
        }
    }
}

#[test]
fn shim_21_streaming_falls_back_only_on_transport_5xx_429_408() {
    for outcome in [
        ShimOutcome::TransportFailed,
        answered(500, OTHER),
        answered(503, b""),
        answered(429, OTHER),
        answered(408, OTHER),
        answered(302, b""),
    ] {
        assert_eq!(
            decide(outcome, Streaming, Allowed, true),
            ShimDecision::FallbackUnified,
            "{outcome:?}"
        );
    }
    for status in [400, 401, 403, 404, 409, 413, 422] {
        let d = decide(answered(status, OTHER), Streaming, Allowed, true);
        assert_eq!(d, ShimDecision::Relay, "{status}");
        assert_eq!(d.error_phase(), None);
    }
}

#[test]
fn ingress_07_success_is_relayed_even_with_the_rejection_text_inside() {
    for mode in [Buffered, Streaming] {
        assert_eq!(
            decide(answered(200, REJECTION), mode, Disabled, true),
            ShimDecision::Relay
        );
    }
}

#[test]
fn invariants_over_every_status() {
    for status in 100..600u16 {
        for body in [
            REJECTION,
            WRAPPED,
            OTHER,
            PIN_400,
            VALIDATION_400,
            b"" as &[u8],
        ] {
            for mode in [Buffered, Streaming] {
                for fb in [Allowed, Disabled] {
                    for left in [true, false] {
                        let d = decide(answered(status, body), mode, fb, left);
                        // An answer is never retried on another replica.
                        assert_ne!(d, ShimDecision::RetrySamePins);
                        assert_ne!(d, ShimDecision::MidStream);
                        let ok = (200..300).contains(&status);
                        let rejection =
                            !ok && status != 500 && (body == REJECTION || body == WRAPPED);
                        assert_eq!(
                            d.error_phase() == Some(ErrorPhase::Orchestration),
                            rejection,
                            "{status} {mode:?}"
                        );
                        if ok {
                            assert_eq!(d, ShimDecision::Relay);
                        }
                        // Fallback happens only when allowed; a relayed failure only for a
                        // plain 4xx or the 1.7 overload, and when buffered only for the
                        // client's own error.
                        if d == ShimDecision::FallbackUnified {
                            assert_eq!(fb, Allowed);
                        }
                        if d == ShimDecision::Relay && !ok && status != OVERLOADED {
                            assert!((400..500).contains(&status) && status != 408 && status != 429);
                            if mode == Buffered {
                                assert!(is_client_error(status, body), "{status}");
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn phase_labels() {
    assert_eq!(ErrorPhase::Orchestration.label(), "orchestration");
    assert_eq!(ErrorPhase::Decode.label(), "decode");
    assert_eq!(UnifiedFallback::from_config(true), Allowed);
    assert_eq!(UnifiedFallback::from_config(false), Disabled);
}

#[test]
fn the_strict_answer_table_makes_every_buffered_non_2xx_a_shim_failure() {
    use crate::config::dynamo::ShimAnswers;
    let validation =
        br#"{"message":"Validation: messages must not be empty","type":"Bad Request","code":400}"#;
    for (status, body) in [
        (400, &validation[..]),
        (401, b"{}"),
        (422, b"{}"),
        (413, b""),
    ] {
        assert!(
            answer_is_clients(ShimAnswers::Dynamo16, status, body),
            "{status}"
        );
        assert!(
            !answer_is_clients(ShimAnswers::Strict, status, body),
            "{status}"
        );
        let out = ShimOutcome::Answered { status, body };
        let buffered =
            |fallback, answers| decide_with(out, RequestMode::Buffered, fallback, false, answers);
        assert_eq!(
            buffered(UnifiedFallback::Allowed, ShimAnswers::Dynamo16),
            ShimDecision::Relay
        );
        assert_eq!(
            buffered(UnifiedFallback::Allowed, ShimAnswers::Strict),
            ShimDecision::FallbackUnified
        );
        assert_eq!(
            buffered(UnifiedFallback::Disabled, ShimAnswers::Strict),
            ShimDecision::Fail(ErrorClass::DisaggregatedDecodeFailed)
        );
    }
    // The pin rejection is a failure under both; SHIM-18 and SHIM-21 are the same under both.
    let pin = br#"{"message":"Invalid request","type":"Bad Request","code":400}"#;
    assert!(!answer_is_clients(ShimAnswers::Dynamo16, 400, pin));
    let rejection = format!(
        "{{\"message\":\"{}\"}}",
        crate::ingress::errors::DIRECT_MODE_PREFILL_ID_ERROR
    );
    for answers in [ShimAnswers::Dynamo16, ShimAnswers::Strict] {
        let out = ShimOutcome::Answered {
            status: 400,
            body: rejection.as_bytes(),
        };
        assert_eq!(
            decide_with(
                out,
                RequestMode::Buffered,
                UnifiedFallback::Allowed,
                false,
                answers
            ),
            ShimDecision::Fail(ErrorClass::DisaggregatedPrefillDecodeUnavailable)
        );
        let out = ShimOutcome::Answered {
            status: 404,
            body: b"{}",
        };
        assert_eq!(
            decide_with(
                out,
                RequestMode::Streaming,
                UnifiedFallback::Allowed,
                false,
                answers
            ),
            ShimDecision::Relay
        );
    }
}

#[test]
fn dynamo_1_7s_overload_is_relayed_buffered_and_streamed_and_is_no_decode_failure() {
    for mode in [Buffered, Streaming] {
        for fb in [Allowed, Disabled] {
            let d = decide(answered(OVERLOADED, OVERLOAD_529), mode, fb, true);
            assert_eq!(d, ShimDecision::Relay, "{mode:?} {fb:?}");
            assert_eq!(d.error_phase(), None);
            // Under `strict` every non-2xx is a failure, this one too.
            let strict = decide_with(
                answered(OVERLOADED, OVERLOAD_529),
                mode,
                fb,
                true,
                ShimAnswers::Strict,
            );
            assert_ne!(strict, ShimDecision::Relay, "{mode:?} {fb:?}");
        }
    }
    // A 503 is still a shim failure (the unified fallback when allowed).
    assert_eq!(
        decide(answered(503, OVERLOAD_529), Buffered, Allowed, true),
        ShimDecision::FallbackUnified
    );
}

/// The real 1.6.1 frontend's answer to a pin on a worker whose process died before its lease.
const UNAVAILABLE_503: &[u8] =
    br#"{"message":"Service temporarily unavailable","type":"Service Unavailable","code":503}"#;
/// The 1.6.1 frontend's answer once a disaggregated model lost its prefill pool.
const NOT_READY_503: &[u8] =
    br#"{"message":"Model `m` is not ready to serve requests yet.","code":503}"#;
/// 1.4.2's (and 1.6.1's engine-error) answer.
const FAILED_500: &[u8] = br#"{"message":"Failed to generate completions","code":500}"#;

#[test]
fn a_dead_pinned_worker_is_a_repick_and_nothing_else_is() {
    use RepickReason::{WorkerFailed, WorkerUnavailable, WorkerUnknown};
    // Before the lease expires, and after: whether or not the router already knows.
    for gone in [false, true] {
        assert_eq!(
            repick_reason(503, UNAVAILABLE_503, gone),
            Some(WorkerUnavailable)
        );
        assert_eq!(repick_reason(400, PIN_400, gone), Some(WorkerUnknown));
        // A 400 without a readable message is a pin rejection too (as in the table).
        assert_eq!(repick_reason(400, b"oops", gone), Some(WorkerUnknown));
        // The client's own errors and the other 503s are not the worker's.
        assert_eq!(repick_reason(400, VALIDATION_400, gone), None);
        assert_eq!(repick_reason(503, NOT_READY_503, gone), None);
        assert_eq!(repick_reason(529, OVERLOAD_529, gone), None);
        assert_eq!(repick_reason(422, b"{}", gone), None);
        // SHIM-18's rejection is the router's own orchestration, never a re-pick.
        assert_eq!(repick_reason(400, REJECTION, gone), None);
        assert_eq!(repick_reason(503, WRAPPED, gone), None);
    }
    // A 500 is a re-pick only when the router holds a pinned worker gone.
    assert_eq!(repick_reason(500, FAILED_500, true), Some(WorkerFailed));
    assert_eq!(repick_reason(500, FAILED_500, false), None);
    // The OpenAI error shape carries the same message.
    assert_eq!(
        repick_reason(
            503,
            br#"{"error":{"message":"Service temporarily unavailable"}}"#,
            false
        ),
        Some(WorkerUnavailable)
    );
    for status in (200..300).chain([301, 404, 408, 429, 502, 504]) {
        assert_eq!(
            repick_reason(status, UNAVAILABLE_503, true),
            None,
            "{status}"
        );
    }
    let labels: Vec<_> = RepickReason::ALL.iter().map(|r| r.label()).collect();
    assert_eq!(
        labels,
        ["worker_unavailable", "worker_unknown", "worker_failed"]
    );
}
