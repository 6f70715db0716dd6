//! What the router does with the outcome of one attempt on a direct-mode shim replica.
//!
//! Role: the decision table of SHIM-16..21, INGRESS-06/07 and Q-40 as a pure function, so the
//! data plane only reports what happened ([`ShimOutcome`]) and carries out the returned
//! [`ShimDecision`]. Nothing here performs I/O or reads a clock.
//!
//! Invariants:
//! - workers are never picked again within a request: a retry keeps the same pins (SHIM-16) and a
//!   failure after the stream started follows the mid-stream rules without a re-pick (SHIM-17);
//! - the direct-mode prefill rejection (a non-2xx, non-500 answer carrying
//!   `Prefill worker ID required in Direct routing mode`) is never retried and never falls back:
//!   it is a 503 `disaggregated_prefill_decode_unavailable` counted in phase `orchestration`
//!   (SHIM-18), for buffered and for not-yet-started streaming requests alike;
//! - every other failure is counted in phase `decode` and then falls back to a unified request
//!   without pins or fails with `disaggregated_decode_failed`, as configured (SHIM-19/20); a
//!   streaming request falls back only on a pre-stream transport failure or a 5xx, 429 or 408,
//!   and any other 4xx is relayed to the client (SHIM-21); a stray 1xx/3xx final status (the
//!   router follows no redirects) counts as a failure, like a 5xx;
//! - a buffered non-2xx answer is a shim failure (SHIM-20; the real frontend answers 400
//!   `Invalid request` when a pin names a worker it no longer knows), except the client's own
//!   errors ([`is_client_error`]: a 400 with another message, such as the frontend's request
//!   validation, and 401/403/413/415/422), which are relayed like a streaming request's 4xx:
//!   sending an invalid request again without pins cannot help, and it is not the fleet's
//!   failure. Which answers those are is one table ([`answer_is_clients`]), switchable to the
//!   spec's strict reading (`dynamo.shim.answers: strict`) so another frontend version's texts
//!   cannot silently flip relay and fallback;
//! - beyond the table, one answer class says the **pinned worker** is gone rather than the shim
//!   ([`repick_reason`], issue 38): before anything reached the client the data plane may pick
//!   again once without that worker. That is not SHIM-16's retry (a shim replica failure keeps
//!   its pins); docs/decisions.md records the distinction.

mod routes;

pub use routes::ShimRoutes;

use crate::config::dynamo::ShimAnswers;
use crate::ingress::errors::{ErrorClass, is_client_error, is_direct_mode_rejection};

/// Whether the client asked for a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestMode {
    /// One JSON answer.
    Buffered,
    /// `stream: true`.
    Streaming,
}

/// `disaggregated_serving.fallback_to_unified`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnifiedFallback {
    /// Retry a failed pinned request once as a unified request without instance-id headers.
    Allowed,
    /// Answer `disaggregated_decode_failed` instead.
    Disabled,
}

impl UnifiedFallback {
    /// From the config flag.
    pub fn from_config(enabled: bool) -> Self {
        if enabled {
            Self::Allowed
        } else {
            Self::Disabled
        }
    }
}

/// What happened on one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShimOutcome<'a> {
    /// The connection could not be opened; nothing was sent.
    ConnectFailed,
    /// The request may have been sent, but no response head arrived (reset, timeout, bad head).
    TransportFailed,
    /// A response head arrived before anything was relayed. `body` is the buffered body, or the
    /// body of a non-2xx answer (empty for a 2xx stream, which is relayed as it comes).
    Answered {
        /// The HTTP status.
        status: u16,
        /// The body read so far (bounded by the caller).
        body: &'a [u8],
    },
    /// The stream had started (bytes reached the client) and then failed.
    FailedMidStream,
}

/// The phase label of `disaggregated_errors_total{phase}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorPhase {
    /// The router's own orchestration was wrong (the fleet view is out of sync).
    Orchestration,
    /// The pinned request failed in the shim.
    Decode,
}

impl ErrorPhase {
    /// The metric label value.
    pub fn label(self) -> &'static str {
        match self {
            ErrorPhase::Orchestration => "orchestration",
            ErrorPhase::Decode => "decode",
        }
    }
}

/// The `routing_path` of one orchestrated request: the label of `disaggregated_requests_total`
/// and the value of the `x-continuum-routing-path` response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoutingPath {
    /// Pinned to a prefill and a decode worker of one namespace.
    Disaggregated,
    /// Pinned to one worker only (an aggregated worker, or no prefill worker for the model):
    /// the aggregated fallback of SHIM-07, `unified` as KV-PICK-14 names it.
    Unified,
    /// A pinned attempt failed and the request was sent again, without pins, through plain model
    /// routing (SHIM-20).
    FallbackUnified,
    /// No worker serves the model: the request went through plain model routing unpinned
    /// (SHIM-08).
    NoWorker,
}

impl RoutingPath {
    /// Every path, in label order.
    pub const ALL: [RoutingPath; 4] = [
        RoutingPath::Disaggregated,
        RoutingPath::Unified,
        RoutingPath::FallbackUnified,
        RoutingPath::NoWorker,
    ];

    /// The label and header value.
    pub const fn label(self) -> &'static str {
        match self {
            RoutingPath::Disaggregated => "disaggregated",
            RoutingPath::Unified => "unified",
            RoutingPath::FallbackUnified => "fallback_unified",
            RoutingPath::NoWorker => "no_worker",
        }
    }

    /// The path of a pinned request: disaggregated with a prefill pin, else unified.
    pub const fn of_pins(prefill_pinned: bool) -> Self {
        if prefill_pinned {
            RoutingPath::Disaggregated
        } else {
            RoutingPath::Unified
        }
    }
}

/// What the data plane does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShimDecision {
    /// Relay the answer to the client as it is.
    Relay,
    /// Send the same request with the same pins to another replica of the same pool (SHIM-16).
    RetrySamePins,
    /// Answer with this error class; no retry, no fallback.
    Fail(ErrorClass),
    /// Send the request once more as a unified request without instance-id headers (SHIM-20).
    FallbackUnified,
    /// Apply the mid-stream rules of the relay (SHIM-17): no re-pick, no fallback.
    MidStream,
}

impl ShimDecision {
    /// The `disaggregated_errors_total` phase this decision counts, if any.
    pub fn error_phase(self) -> Option<ErrorPhase> {
        match self {
            ShimDecision::Fail(ErrorClass::DisaggregatedPrefillDecodeUnavailable) => {
                Some(ErrorPhase::Orchestration)
            }
            ShimDecision::Fail(ErrorClass::DisaggregatedDecodeFailed)
            | ShimDecision::FallbackUnified => Some(ErrorPhase::Decode),
            _ => None,
        }
    }
}

/// Why a pinned request is picked again (`continuum_dynamo_repicks_total{reason}`, issue 38).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepickReason {
    /// 503 `Service temporarily unavailable`: the frontend could not reach the pinned worker
    /// (Dynamo 1.6.1 and 1.7 between a worker's death and its lease's expiry: the request plane
    /// is refused, an `Unavailable` error).
    WorkerUnavailable,
    /// 400 `Invalid request` (or a 400 without a readable message): the frontend no longer knows
    /// the pinned worker (1.6.1 after the lease expired).
    WorkerUnknown,
    /// A 500 while a pinned worker is gone by the router's own signals (its `kv_metrics`
    /// connection dropped, or it left the fleet view): Dynamo 1.4.2's answer to a dead pin is a
    /// generic 500 `Failed to generate completions`. A 500 for a worker the router still sees
    /// alive is an engine error and is not re-picked.
    WorkerFailed,
}

impl RepickReason {
    /// Every reason, in label order.
    pub const ALL: [RepickReason; 3] = [
        RepickReason::WorkerUnavailable,
        RepickReason::WorkerUnknown,
        RepickReason::WorkerFailed,
    ];

    /// The metric label.
    pub const fn label(self) -> &'static str {
        match self {
            RepickReason::WorkerUnavailable => "worker_unavailable",
            RepickReason::WorkerUnknown => "worker_unknown",
            RepickReason::WorkerFailed => "worker_failed",
        }
    }
}

/// The message of Dynamo's `Unavailable` answer (503): the request plane could not reach the
/// worker (`lib/llm/src/http/service/error.rs`, `DynamoErrorType::Unavailable`).
pub const WORKER_UNAVAILABLE_MESSAGE: &str = "Service temporarily unavailable";

/// Whether a non-2xx answer the shim gave before anything reached the client says the pinned
/// worker is gone, and why ([`RepickReason`]). `pin_gone` says whether the router's own signals
/// already hold one of the pinned workers gone (only a 500 needs it). The direct-mode prefill
/// rejection (SHIM-18) and Dynamo 1.7's 529 are never re-picks; neither is a client's own error
/// ([`is_client_error`]), under either answer table.
pub fn repick_reason(status: u16, body: &[u8], pin_gone: bool) -> Option<RepickReason> {
    if is_direct_mode_rejection(status, body) {
        return None;
    }
    match status {
        503 if message_is(body, WORKER_UNAVAILABLE_MESSAGE) => {
            Some(RepickReason::WorkerUnavailable)
        }
        400 if !is_client_error(status, body) => Some(RepickReason::WorkerUnknown),
        500 if pin_gone => Some(RepickReason::WorkerFailed),
        _ => None,
    }
}

/// Whether the answer body's message (Dynamo's `{"message"}` or OpenAI's `{"error":{"message"}}`)
/// is exactly `want`.
fn message_is(body: &[u8], want: &str) -> bool {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return false;
    };
    v.get("message")
        .or_else(|| v.pointer("/error/message"))
        .and_then(serde_json::Value::as_str)
        == Some(want)
}

/// Dynamo 1.7's answer when the pinned worker's admission gate refuses the request before any
/// work (`{"message":"Service temporarily overloaded","type":"Overloaded","code":529}`). Its own
/// frontend gives the client exactly this, and clients retry it (the OpenAI and Anthropic SDKs
/// retry every status from 500); it is not a failed decode, so under `dynamo_1_6` it is relayed,
/// buffered or streamed, and counts no `disaggregated_errors_total`.
pub const OVERLOADED: u16 = 529;

/// Whether a buffered non-2xx shim answer is the client's own error (relayed) rather than a shim
/// failure, under `answers`. The one table, by status:
///
/// | status | `dynamo_1_6` (default) | `strict` |
/// |---|---|---|
/// | 400, message `Invalid request` (the 1.6 pin rejection), or no readable message | failure | failure |
/// | 400, any other message (request validation) | client's | failure |
/// | 401, 403, 413, 415, 422 | client's | failure |
/// | 529 ([`OVERLOADED`], Dynamo 1.7's admission gate; streamed answers too) | client's | failure |
/// | every other non-2xx | failure | failure |
///
/// The direct-mode prefill rejection (SHIM-18) and the streaming rules (SHIM-21) come before this
/// table and are the same under both.
pub fn answer_is_clients(answers: ShimAnswers, status: u16, body: &[u8]) -> bool {
    match answers {
        ShimAnswers::Dynamo16 => is_client_error(status, body),
        ShimAnswers::Strict => false,
    }
}

/// [`decide_with`] under the default answer table (`dynamo_1_6`).
pub fn decide(
    outcome: ShimOutcome<'_>,
    mode: RequestMode,
    fallback: UnifiedFallback,
    replica_left: bool,
) -> ShimDecision {
    decide_with(outcome, mode, fallback, replica_left, ShimAnswers::Dynamo16)
}

/// Decides what follows `outcome`. `replica_left` says whether another replica of the same pool
/// is still within the retry budget (only a connect failure uses it); `answers` is the
/// configured answer table ([`answer_is_clients`]).
pub fn decide_with(
    outcome: ShimOutcome<'_>,
    mode: RequestMode,
    fallback: UnifiedFallback,
    replica_left: bool,
    answers: ShimAnswers,
) -> ShimDecision {
    let decode_failure = match fallback {
        UnifiedFallback::Allowed => ShimDecision::FallbackUnified,
        UnifiedFallback::Disabled => ShimDecision::Fail(ErrorClass::DisaggregatedDecodeFailed),
    };
    match outcome {
        ShimOutcome::ConnectFailed if replica_left => ShimDecision::RetrySamePins,
        ShimOutcome::ConnectFailed | ShimOutcome::TransportFailed => decode_failure,
        ShimOutcome::FailedMidStream => ShimDecision::MidStream,
        ShimOutcome::Answered { status, .. } if (200..300).contains(&status) => ShimDecision::Relay,
        ShimOutcome::Answered { status, body } if is_direct_mode_rejection(status, body) => {
            ShimDecision::Fail(ErrorClass::DisaggregatedPrefillDecodeUnavailable)
        }
        ShimOutcome::Answered { status, .. }
            if status == OVERLOADED && answers == ShimAnswers::Dynamo16 =>
        {
            ShimDecision::Relay
        }
        ShimOutcome::Answered { status, body } => match mode {
            RequestMode::Buffered if answer_is_clients(answers, status, body) => {
                ShimDecision::Relay
            }
            RequestMode::Buffered => decode_failure,
            RequestMode::Streaming
                if (400..500).contains(&status) && status != 408 && status != 429 =>
            {
                ShimDecision::Relay
            }
            RequestMode::Streaming => decode_failure,
        },
    }
}

#[cfg(test)]
mod tests;
