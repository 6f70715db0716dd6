//! Ingress protocol conversion: Anthropic Messages and OpenAI Responses ⇄ OpenAI chat completions.
//!
//! Role: the router's backends (`dynamo.frontend` replicas) speak OpenAI chat completions only
//! (and, for some replicas, native `/v1/responses`). This module turns the other client
//! protocols into chat bodies and turns chat answers (buffered JSON or SSE) back into the
//! client's protocol. It also strips client-sent pinning and token fields (KV-PICK-11,
//! INGRESS-04, Q-38) and renders classified errors in each ingress's own shape (INGRESS-06).
//!
//! Invariants:
//! - pure functions over bytes and `serde_json` values: no I/O, no clock, no randomness (ids are
//!   derived from the upstream ids; `created_at` is taken from the upstream `created`);
//! - every malformed input yields a typed [`IngressError`], never a panic;
//! - the client's `model` string is preserved verbatim in converted requests;
//! - streaming converters buffer at most one pending SSE line/event, capped
//!   ([`sse::DEFAULT_LINE_CAP`] by default), and fail with [`IngressError::LineTooLong`] beyond;
//! - streaming output is a function of the concatenated input only: the same bytes split
//!   anywhere produce the same output bytes.
//!
//! Choices not dictated by the spec are recorded in `docs/decisions.md` (section "Ingress conversion").

pub mod anthropic_req;
pub mod anthropic_resp;
pub mod anthropic_stream;
mod chunk_walk;
pub mod errors;
pub mod responses;
pub mod responses_stream;
pub mod sanitize;
pub mod sse;

#[cfg(test)]
mod tests;

/// Why a conversion failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IngressError {
    /// The client body is not JSON (or not a JSON object).
    #[error("request body is not a JSON object: {0}")]
    InvalidJson(String),
    /// The client body is JSON but not a valid request of its protocol.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The upstream chat answer could not be understood.
    #[error("malformed upstream response: {0}")]
    MalformedUpstream(String),
    /// A pending SSE line or event grew beyond the cap.
    #[error("upstream SSE line or event exceeds {cap} bytes")]
    LineTooLong {
        /// The cap in bytes.
        cap: usize,
    },
}

impl IngressError {
    /// The error class to render to the client for this failure.
    pub fn class(&self) -> errors::ErrorClass {
        match self {
            IngressError::InvalidJson(_) | IngressError::InvalidRequest(_) => {
                errors::ErrorClass::InvalidRequest
            }
            IngressError::MalformedUpstream(_) | IngressError::LineTooLong { .. } => {
                errors::ErrorClass::UpstreamProtocol
            }
        }
    }
}

pub(crate) fn parse_object(
    body: &[u8],
) -> Result<serde_json::Map<String, serde_json::Value>, IngressError> {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => Err(IngressError::InvalidJson(
            "top level is not an object".into(),
        )),
        Err(e) => Err(IngressError::InvalidJson(e.to_string())),
    }
}

pub(crate) fn parse_upstream(
    body: &[u8],
) -> Result<serde_json::Map<String, serde_json::Value>, IngressError> {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => Err(IngressError::MalformedUpstream(
            "top level is not an object".into(),
        )),
        Err(e) => Err(IngressError::MalformedUpstream(e.to_string())),
    }
}

pub(crate) fn to_bytes(v: &serde_json::Value) -> Vec<u8> {
    // Serialising a `Value` to a Vec cannot fail (string keys, no I/O errors).
    serde_json::to_vec(v).unwrap_or_default()
}

pub(crate) fn to_string(v: &serde_json::Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}
