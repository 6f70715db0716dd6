//! Classified errors rendered in each ingress's own shape.
//!
//! Role: the router classifies a failure once ([`ErrorClass`]) and renders it as an Anthropic
//! body (`{"type":"error","error":{"type","message"}}`), an OpenAI body
//! (`{"error":{"message","type","param","code"}}`) or a Responses body (the same OpenAI shape,
//! which is what `/v1/responses` answers for a failed request) or a Responses SSE `error` event.
//!
//! Invariants: the HTTP status depends on the class only; messages are escaped through
//! `serde_json`; the disaggregation errors carry their spec code (INGRESS-06, SHIM-18/20) in the
//! OpenAI `code` and in the Anthropic `error.type`.

use serde_json::{Value, json};

use super::to_bytes;

/// A failure class, independent of the client protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// 400: the client request is invalid.
    InvalidRequest,
    /// 401.
    Authentication,
    /// 403.
    Permission,
    /// 404: no such model or route.
    NotFound,
    /// 413.
    RequestTooLarge,
    /// 429.
    RateLimited,
    /// 500: internal failure.
    Internal,
    /// 502: the backend answered something unusable.
    UpstreamProtocol,
    /// 503: overloaded / no capacity.
    Overloaded,
    /// 504.
    UpstreamTimeout,
    /// 503 `disaggregated_prefill_decode_unavailable`: direct-mode prefill rejection (SHIM-18,
    /// INGRESS-06).
    DisaggregatedPrefillDecodeUnavailable,
    /// 502 `disaggregated_decode_failed` (SHIM-20, fallback disabled).
    DisaggregatedDecodeFailed,
}

impl ErrorClass {
    /// The HTTP status for this class.
    pub fn status(self) -> u16 {
        match self {
            ErrorClass::InvalidRequest => 400,
            ErrorClass::Authentication => 401,
            ErrorClass::Permission => 403,
            ErrorClass::NotFound => 404,
            ErrorClass::RequestTooLarge => 413,
            ErrorClass::RateLimited => 429,
            ErrorClass::Internal => 500,
            ErrorClass::UpstreamProtocol | ErrorClass::DisaggregatedDecodeFailed => 502,
            ErrorClass::Overloaded | ErrorClass::DisaggregatedPrefillDecodeUnavailable => 503,
            ErrorClass::UpstreamTimeout => 504,
        }
    }

    /// The Anthropic `error.type`.
    pub fn anthropic_type(self) -> &'static str {
        match self {
            ErrorClass::InvalidRequest => "invalid_request_error",
            ErrorClass::Authentication => "authentication_error",
            ErrorClass::Permission => "permission_error",
            ErrorClass::NotFound => "not_found_error",
            ErrorClass::RequestTooLarge => "request_too_large",
            ErrorClass::RateLimited => "rate_limit_error",
            ErrorClass::Internal | ErrorClass::UpstreamProtocol => "api_error",
            ErrorClass::Overloaded => "overloaded_error",
            ErrorClass::UpstreamTimeout => "timeout_error",
            ErrorClass::DisaggregatedPrefillDecodeUnavailable
            | ErrorClass::DisaggregatedDecodeFailed => self.code(),
        }
    }

    /// The OpenAI `error.type`.
    pub fn openai_type(self) -> &'static str {
        match self {
            ErrorClass::InvalidRequest | ErrorClass::NotFound | ErrorClass::RequestTooLarge => {
                "invalid_request_error"
            }
            ErrorClass::Authentication => "authentication_error",
            ErrorClass::Permission => "permission_error",
            ErrorClass::RateLimited => "rate_limit_error",
            ErrorClass::Internal => "server_error",
            ErrorClass::UpstreamProtocol
            | ErrorClass::UpstreamTimeout
            | ErrorClass::DisaggregatedDecodeFailed => "upstream_error",
            ErrorClass::Overloaded | ErrorClass::DisaggregatedPrefillDecodeUnavailable => {
                "service_unavailable"
            }
        }
    }

    /// The machine-readable code (OpenAI `error.code`).
    pub fn code(self) -> &'static str {
        match self {
            ErrorClass::InvalidRequest => "bad_request",
            ErrorClass::Authentication => "unauthorized",
            ErrorClass::Permission => "forbidden",
            ErrorClass::NotFound => "not_found",
            ErrorClass::RequestTooLarge => "body_too_large",
            ErrorClass::RateLimited => "rate_limited",
            ErrorClass::Internal => "internal_error",
            ErrorClass::UpstreamProtocol => "upstream_protocol_error",
            ErrorClass::Overloaded => "overloaded",
            ErrorClass::UpstreamTimeout => "upstream_timeout",
            ErrorClass::DisaggregatedPrefillDecodeUnavailable => {
                "disaggregated_prefill_decode_unavailable"
            }
            ErrorClass::DisaggregatedDecodeFailed => "disaggregated_decode_failed",
        }
    }
}

/// A classified error with its client-facing message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassifiedError {
    /// The class.
    pub class: ErrorClass,
    /// The message shown to the client.
    pub message: String,
}

impl ClassifiedError {
    /// Builds an error.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        Self {
            class,
            message: message.into(),
        }
    }

    /// The INGRESS-06 / SHIM-18 direct-mode prefill rejection.
    pub fn prefill_decode_unavailable() -> Self {
        Self::new(
            ErrorClass::DisaggregatedPrefillDecodeUnavailable,
            "disaggregated prefill/decode unavailable: the frontend requires a prefill worker \
             id in direct routing mode (fleet view out of sync)",
        )
    }

    /// The HTTP status.
    pub fn status(&self) -> u16 {
        self.class.status()
    }

    /// The Anthropic-shaped JSON value.
    pub fn anthropic_value(&self) -> Value {
        json!({"type": "error", "error": {"type": self.class.anthropic_type(), "message": self.message}})
    }

    /// The Anthropic-shaped body.
    pub fn anthropic_body(&self) -> Vec<u8> {
        to_bytes(&self.anthropic_value())
    }

    /// The Anthropic SSE `error` event (for failures after `message_start`).
    pub fn anthropic_sse_event(&self) -> Vec<u8> {
        super::sse::event_bytes("error", &self.anthropic_value())
    }

    /// The OpenAI-shaped JSON value.
    pub fn openai_value(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.class.openai_type(),
            "param": Value::Null,
            "code": self.class.code(),
        }})
    }

    /// The OpenAI-shaped body (chat completions).
    pub fn openai_body(&self) -> Vec<u8> {
        to_bytes(&self.openai_value())
    }

    /// The Responses-shaped body of a failed `/v1/responses` request (the OpenAI shape).
    pub fn responses_body(&self) -> Vec<u8> {
        self.openai_body()
    }

    /// The Responses SSE `error` event, for failures after `response.created`.
    pub fn responses_sse_event(&self, sequence_number: u64) -> Vec<u8> {
        let v = json!({
            "type": "error",
            "code": self.class.code(),
            "message": self.message,
            "param": Value::Null,
            "sequence_number": sequence_number,
        });
        super::sse::event_bytes("error", &v)
    }
}

impl From<&super::IngressError> for ClassifiedError {
    fn from(e: &super::IngressError) -> Self {
        Self::new(e.class(), e.to_string())
    }
}

/// The frontend's direct-mode rejection text (`DIRECT_MODE_PREFILL_ID_ERROR`, SHIM-18).
pub const DIRECT_MODE_PREFILL_ID_ERROR: &str = "Prefill worker ID required in Direct routing mode";

/// Whether a non-2xx upstream answer (buffered body, or the body of a non-2xx streaming
/// response before the stream starts, Q-40) is the direct-mode prefill rejection that
/// INGRESS-06 / SHIM-18 turn into 503 `disaggregated_prefill_decode_unavailable`.
///
/// A 500 is never one, even if it contains the text: SHIM-19 sends a rejection wrapped in a
/// generic 500 body down the decode-failure path. A 2xx is never one either: a rejection inside
/// an open 200 stream is relayed as is (INGRESS-07).
pub fn is_direct_mode_rejection(status: u16, body: &[u8]) -> bool {
    !(200..300).contains(&status)
        && status != 500
        && memchr::memmem::find(body, DIRECT_MODE_PREFILL_ID_ERROR.as_bytes()).is_some()
}

/// The message the Dynamo 1.6.1 frontend answers, with 400, for a pin it cannot use (unknown,
/// departed, of another model, hex, missing): `{"message":"Invalid request","type":"Bad
/// Request","code":400}`. Its request validation errors carry other messages.
pub const PIN_REJECTION_MESSAGE: &str = "Invalid request";

/// Whether a non-2xx shim answer is the client's own error (its request is invalid, whoever it
/// is sent to), to be relayed rather than treated as a shim failure: 401, 403, 413, 415, 422, and
/// a 400 whose message is not the frontend's pin rejection ([`PIN_REJECTION_MESSAGE`]). A 400
/// without a readable message counts as a pin rejection, so a doubtful answer still falls back.
pub fn is_client_error(status: u16, body: &[u8]) -> bool {
    match status {
        400 => {
            let v: Option<Value> = serde_json::from_slice(body).ok();
            let message = v.as_ref().and_then(|v| {
                v.get("message")
                    .or_else(|| v.pointer("/error/message"))
                    .and_then(Value::as_str)
            });
            message.is_some_and(|m| m != PIN_REJECTION_MESSAGE)
        }
        401 | 403 | 413 | 415 | 422 => true,
        _ => false,
    }
}
