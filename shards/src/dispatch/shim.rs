//! The shim path's attempts (SHIM-09..22): send a pinned request to the namespace's
//! `dynamo.frontend --router-mode direct` replicas in rotation and carry out
//! `continuum_core::shim::decide` on each attempt's outcome.
//!
//! Invariants:
//! - workers are picked once per request: a connect retry keeps the pins (SHIM-16), a failure
//!   after the stream started aborts the client connection without a re-pick (SHIM-17), and the
//!   unified fallback is sent without any pin through plain model routing (SHIM-20);
//! - `disaggregated_requests_total{routing_path}` is counted exactly once per orchestrated
//!   request, with the path that answered; `disaggregated_errors_total{phase}` once per failed
//!   pinned request (SHIM-18..20, OBS-13);
//! - the dispatches recorded at pick time are marked finished when the request ends, whatever
//!   the outcome — also when the client leaves and the request's future is dropped;
//! - a non-2xx answer is held back whole (bounded) before anything reaches the client, so a
//!   failure can still fall back or become the classified error.

use continuum_core::config::dynamo::ShimAnswers;
use continuum_core::headers::RoutingHeaders;
use continuum_core::ingress::errors::{ClassifiedError, ErrorClass};
use continuum_core::load::DispatchId;
use continuum_core::shim::{
    RequestMode, RoutingPath, ShimDecision, ShimOutcome, UnifiedFallback, decide, decide_with,
};
use continuum_core::snapshot::{ModelRoute, RouterSnapshot};
use continuum_core::upstream::{DispatchError, ErrorKind};

use super::Dispatcher;
use super::choose::{Tried, choose};
use super::exchange::{Answer, Attempt, Exchange, FailureHandling};
use super::plan::Pinned;
use super::relay;
use crate::clock;
use crate::http::Outcome;
use crate::http::respond::{self, LocalError};

/// What the dispatch needs to know about the request besides its pins.
#[derive(Debug, Clone, Copy)]
pub(super) struct Request<'r> {
    /// The client model's plain route (for the unified fallback).
    pub(super) route: Option<&'r ModelRoute>,
    /// Buffered or streaming (the failure rules differ, SHIM-21).
    pub(super) mode: RequestMode,
}

/// Marks a pinned request's dispatches finished when dropped: at the end of the request, or
/// when its future is dropped because the client left.
struct Dispatched<'d> {
    dispatcher: &'d Dispatcher,
    ids: [Option<DispatchId>; 2],
}

impl Drop for Dispatched<'_> {
    fn drop(&mut self) {
        self.dispatcher.finish(self.ids);
    }
}

impl Dispatcher {
    /// Dispatch a pinned request and follow the decision table.
    pub(super) async fn dispatch_pinned(
        &self,
        snap: &RouterSnapshot,
        ex: &mut Exchange<'_>,
        pinned: Pinned<'_>,
        req: Request<'_>,
    ) -> Outcome {
        let _dispatched = Dispatched {
            dispatcher: self,
            ids: pinned.dispatched,
        };
        self.pinned_attempts(snap, ex, &pinned, req).await
    }

    async fn pinned_attempts(
        &self,
        snap: &RouterSnapshot,
        ex: &mut Exchange<'_>,
        pinned: &Pinned<'_>,
        req: Request<'_>,
    ) -> Outcome {
        let Request { route, mode } = req;
        let (attempt, path) = pinned_attempt(pinned);
        let fallback =
            UnifiedFallback::from_config(snap.config.disaggregated_serving.fallback_to_unified);
        let budget = (1 + snap.config.server.connect_retries as usize).min(pinned.replicas.len());
        let start = self.next_shim_cursor();
        let mut tried = Tried::default();
        let mut n = 0;
        let decision = loop {
            // Each attempt reads the clock: the pick (tokenizing, the index) came in between.
            let begun = clock::instant();
            let Ok(chosen) = choose(
                snap,
                pinned.replicas,
                start,
                &mut tried,
                clock::ms_at(begun),
                ex.key,
            ) else {
                // No replica left to send to (none, or all unhealthy): nothing was sent.
                break decide(ShimOutcome::ConnectFailed, mode, fallback, false);
            };
            if n > 0 && !self.retry_allowed() {
                break decide(ShimOutcome::ConnectFailed, mode, fallback, false);
            }
            n += 1;
            let replica_left = n < budget;
            let idx = chosen.idx;
            let result = self.send_to(snap, ex, idx, &attempt, begun).await;
            self.report(snap, chosen, &result);
            let answers = snap.config.dynamo.shim.answers;
            let step = pinned_step(result, &ex.bufs.held, mode, fallback, replica_left, answers);
            let decision = match step {
                PinnedStep::Answered(outcome) => {
                    self.metrics.dynamo.request(path);
                    return outcome;
                }
                PinnedStep::RelayHeld(status) => {
                    self.metrics.dynamo.request(path);
                    let Some(backend) = snap.backend(idx) else {
                        return ex.local_error(LocalError::UpstreamUnavailable);
                    };
                    return relay::write_held(ex, status, backend, &attempt);
                }
                PinnedStep::Abort => {
                    // The stream had started (or the client left): SHIM-17, no re-pick.
                    self.metrics.dynamo.request(path);
                    return Outcome::aborted();
                }
                PinnedStep::Decided(d) => d,
            };
            if decision != ShimDecision::RetrySamePins {
                break decision;
            }
        };
        if let Some(phase) = decision.error_phase() {
            self.metrics.dynamo.error(phase);
        }
        // The unified fallback is one more attempt: within the retry budget.
        let decision = match decision {
            ShimDecision::FallbackUnified if !self.retry_allowed() => {
                ShimDecision::Fail(ErrorClass::DisaggregatedDecodeFailed)
            }
            d => d,
        };
        match decision {
            ShimDecision::FallbackUnified if route.is_some() => {
                self.metrics.dynamo.request(RoutingPath::FallbackUnified);
                self.plain(snap, ex, route, &FALLBACK_ATTEMPT, clock::instant())
                    .await
            }
            // Fallback configured but no plain route serves the model: it cannot happen.
            ShimDecision::FallbackUnified => {
                self.metrics.dynamo.request(path);
                classified(ex, ErrorClass::DisaggregatedDecodeFailed, path)
            }
            ShimDecision::Fail(class) => {
                self.metrics.dynamo.request(path);
                classified(ex, class, path)
            }
            // Relay and MidStream returned above; RetrySamePins only loops.
            ShimDecision::Relay | ShimDecision::MidStream | ShimDecision::RetrySamePins => {
                self.metrics.dynamo.request(path);
                Outcome::aborted()
            }
        }
    }
}

/// The shim attempt of a pinned request and its routing path: the picker's pins (only the
/// decode worker's, with its rank, for an aggregated worker or a conditional bypass: path
/// `unified`, KV-PICK-14), and the shim body when it carries `nvext.token_data` (KV-PICK-10).
pub(super) fn pinned_attempt<'p>(pinned: &'p Pinned<'_>) -> (Attempt<'p>, RoutingPath) {
    let path = RoutingPath::of_pins(pinned.pins.prefill.is_some());
    let attempt = Attempt {
        pins: Some(pinned.pins),
        routing: Some(RoutingHeaders {
            path: path.label(),
            pins: Some(pinned.pins),
            namespace: Some(pinned.namespace),
        }),
        on_failure: FailureHandling::Hold,
        body: pinned.body,
    };
    (attempt, path)
}

/// The unified fallback (SHIM-20): plain routing, no pin, the request's own body (never the
/// shim body with `token_data`, KV-PICK-11).
pub(super) const FALLBACK_ATTEMPT: Attempt<'static> = Attempt {
    routing: Some(RoutingHeaders {
        path: RoutingPath::FallbackUnified.label(),
        pins: None,
        namespace: None,
    }),
    ..Attempt::PLAIN
};

/// What the pinned loop does after one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PinnedStep {
    /// The client has its answer (relayed, converted, or the router's own).
    Answered(Outcome),
    /// Relay the held answer as it is (the decision table says so).
    RelayHeld(u16),
    /// The client saw part of an answer (or left): close it, no re-pick (SHIM-17).
    Abort,
    /// Everything else: what the decision table says (retry, fallback, classified error).
    Decided(ShimDecision),
}

/// The pinned loop's decision for one attempt's result: the attempt's failure mapped onto the
/// decision table's outcomes (`continuum_core::shim::decide`). `held` is the held answer's body.
pub(super) fn pinned_step(
    result: Result<Answer, DispatchError>,
    held: &[u8],
    mode: RequestMode,
    fallback: UnifiedFallback,
    replica_left: bool,
    answers: ShimAnswers,
) -> PinnedStep {
    match result {
        Ok(Answer::Done(outcome)) => PinnedStep::Answered(outcome),
        Ok(Answer::Held(status)) => {
            match decide_with(
                ShimOutcome::Answered { status, body: held },
                mode,
                fallback,
                false,
                answers,
            ) {
                ShimDecision::Relay => PinnedStep::RelayHeld(status),
                d => PinnedStep::Decided(d),
            }
        }
        // Nothing was sent: a refused connect or a failed TLS handshake.
        Err(e) if matches!(e.kind, ErrorKind::Connect | ErrorKind::Tls) => PinnedStep::Decided(
            decide(ShimOutcome::ConnectFailed, mode, fallback, replica_left),
        ),
        Err(e) if e.answerable() => {
            PinnedStep::Decided(decide(ShimOutcome::TransportFailed, mode, fallback, false))
        }
        Err(_) => PinnedStep::Abort,
    }
}

/// Answer with a classified error in the client's shape, with the routing path header.
fn classified(ex: &mut Exchange<'_>, class: ErrorClass, path: RoutingPath) -> Outcome {
    let err = match class {
        ErrorClass::DisaggregatedPrefillDecodeUnavailable => {
            ClassifiedError::prefill_decode_unavailable()
        }
        ErrorClass::DisaggregatedDecodeFailed => ClassifiedError::new(
            class,
            "the pinned request failed in the Dynamo frontend and unified fallback is disabled \
             or unavailable",
        ),
        _ => ClassifiedError::new(class, "the Dynamo frontend request failed"),
    };
    let keep_alive = ex.req.head.keep_alive;
    ex.sink.buf.clear();
    respond::write_classified(
        &mut ex.sink.buf,
        err.status(),
        &respond::classified_body(&err, ex.shape),
        RoutingHeaders {
            path: path.label(),
            pins: None,
            namespace: None,
        },
        ex.req.persistence(),
    );
    Outcome {
        status: err.status(),
        keep_alive,
    }
}
