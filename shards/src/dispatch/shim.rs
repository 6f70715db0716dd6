//! The shim path's attempts (SHIM-09..22): send a pinned request to the namespace's
//! `dynamo.frontend --router-mode direct` replicas in rotation and carry out
//! `continuum_core::shim::decide` on each attempt's outcome.
//!
//! Invariants:
//! - a connect retry keeps the pins (SHIM-16), a failure after the stream started aborts the
//!   client connection without a re-pick (SHIM-17), and the unified fallback is sent without any
//!   pin through plain model routing (SHIM-20);
//! - workers are picked again at most once per request, only when the shim's held answer says
//!   the pinned worker is gone (`continuum_core::shim::repick_reason`) and the retry budget
//!   allows, never the gone worker again; with no other worker the first answer decides as the
//!   table says (issue 38, docs/decisions.md);
//! - `disaggregated_requests_total{routing_path}` is counted exactly once per orchestrated
//!   request, with the path that answered; `disaggregated_errors_total{phase}` once per failed
//!   pinned request (SHIM-18..20, OBS-13);
//! - the dispatches recorded at pick time are marked finished when the request ends, whatever
//!   the outcome — also when the client leaves and the request's future is dropped;
//! - a non-2xx answer is held back whole (bounded) before anything reaches the client, so a
//!   failure can still fall back or become the classified error.

use continuum_core::config::dynamo::ShimAnswers;
use continuum_core::discovery::InstanceId;
use continuum_core::headers::RoutingHeaders;
use continuum_core::ingress::errors::{ClassifiedError, ErrorClass};
use continuum_core::load::DispatchId;
use continuum_core::shim::{
    RepickReason, RequestMode, RoutingPath, ShimDecision, ShimOutcome, UnifiedFallback, decide,
    decide_with, repick_reason,
};
use continuum_core::snapshot::{BackendIdx, ModelRoute, RouterSnapshot};
use continuum_core::upstream::{DispatchError, ErrorKind};

use super::Dispatcher;
use super::choose::{Tried, choose};
use super::exchange::{Answer, Attempt, Exchange, FailureHandling};
use super::plan::{Pinned, Plan};
use super::relay;
use crate::clock;
use crate::http::Outcome;
use crate::http::respond::{self, LocalError};
use crate::signals::suspects::Suspects;

/// What the dispatch needs to know about the request besides its pins.
#[derive(Debug, Clone)]
pub(super) struct Request<'r> {
    /// Where the client model is in the request body (a re-pick reads it again).
    pub(super) model: std::ops::Range<usize>,
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
    /// Dispatch a pinned request and follow the decision table; when the shim says the pinned
    /// worker is gone and nothing reached the client, pick once more without it (issue 38).
    pub(super) async fn dispatch_pinned(
        &self,
        snap: &RouterSnapshot,
        ex: &mut Exchange<'_>,
        pinned: Pinned<'_>,
        req: Request<'_>,
    ) -> Outcome {
        let first = Dispatched {
            dispatcher: self,
            ids: pinned.dispatched,
        };
        let held = match self
            .pinned_attempts(snap, ex, &pinned, &req, Repick::Open)
            .await
        {
            PinnedEnd::Done(outcome) => return outcome,
            PinnedEnd::Repick(held) => held,
        };
        // The first pick's dispatches are over, whatever follows.
        drop(first);
        let gone = gone_pins(snap, &self.signals.suspects, &pinned);
        let again = if self.retry_allowed() {
            self.replan(snap, ex, req.model.clone(), &gone)
        } else {
            Plan::NoWorker
        };
        let Plan::Pinned(next) = again else {
            // No other worker (or no budget): the first answer decides, as without a re-pick.
            return self.held_decision(snap, ex, &pinned, &req, held).await;
        };
        self.metrics.dynamo.repick(held.reason);
        let _next = Dispatched {
            dispatcher: self,
            ids: next.dispatched,
        };
        match self
            .pinned_attempts(snap, ex, &next, &req, Repick::Spent)
            .await
        {
            PinnedEnd::Done(outcome) => outcome,
            // `Repick::Spent` never asks for another; answer as the table says.
            PinnedEnd::Repick(held) => self.held_decision(snap, ex, &next, &req, held).await,
        }
    }

    async fn pinned_attempts(
        &self,
        snap: &RouterSnapshot,
        ex: &mut Exchange<'_>,
        pinned: &Pinned<'_>,
        req: &Request<'_>,
        repick: Repick,
    ) -> PinnedEnd {
        let mode = req.mode;
        let (attempt, path) = pinned_attempt(pinned);
        let fallback = unified_fallback(snap);
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
            let repick = match (repick, &result) {
                (Repick::Open, Ok(Answer::Held(_))) => RepickCheck::Open {
                    pin_gone: !gone_pins_known(snap, &self.signals.suspects, pinned).is_empty(),
                },
                _ => RepickCheck::Spent,
            };
            let policy = StepPolicy {
                mode,
                fallback,
                replica_left,
                answers,
                repick,
            };
            let decision = match pinned_step(result, &ex.bufs.held, policy) {
                PinnedStep::Answered(outcome) => {
                    self.metrics.dynamo.request(path);
                    return PinnedEnd::Done(outcome);
                }
                PinnedStep::RelayHeld(status) => {
                    self.metrics.dynamo.request(path);
                    return PinnedEnd::Done(relay_held(snap, ex, idx, status, &attempt));
                }
                PinnedStep::Repick(reason, status) => {
                    return PinnedEnd::Repick(Held {
                        reason,
                        status,
                        idx,
                    });
                }
                PinnedStep::Abort => {
                    // The stream had started (or the client left): SHIM-17, no re-pick.
                    self.metrics.dynamo.request(path);
                    return PinnedEnd::Done(Outcome::aborted());
                }
                PinnedStep::Decided(d) => d,
            };
            if decision != ShimDecision::RetrySamePins {
                break decision;
            }
        };
        PinnedEnd::Done(self.conclude(snap, ex, decision, req, path).await)
    }

    /// Answer a re-pick that could not happen (or a held answer after one) as the decision
    /// table says for that answer, still held in `ex.bufs.held`.
    async fn held_decision(
        &self,
        snap: &RouterSnapshot,
        ex: &mut Exchange<'_>,
        pinned: &Pinned<'_>,
        req: &Request<'_>,
        held: Held,
    ) -> Outcome {
        let (attempt, path) = pinned_attempt(pinned);
        let fallback = unified_fallback(snap);
        let outcome = ShimOutcome::Answered {
            status: held.status,
            body: &ex.bufs.held,
        };
        let answers = snap.config.dynamo.shim.answers;
        match decide_with(outcome, req.mode, fallback, false, answers) {
            ShimDecision::Relay => {
                self.metrics.dynamo.request(path);
                relay_held(snap, ex, held.idx, held.status, &attempt)
            }
            d => self.conclude(snap, ex, d, req, path).await,
        }
    }

    /// Carry out a decision that ends the pinned attempts: the unified fallback or a classified
    /// error, counted once.
    async fn conclude(
        &self,
        snap: &RouterSnapshot,
        ex: &mut Exchange<'_>,
        decision: ShimDecision,
        req: &Request<'_>,
        path: RoutingPath,
    ) -> Outcome {
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
            ShimDecision::FallbackUnified if req.route.is_some() => {
                self.metrics.dynamo.request(RoutingPath::FallbackUnified);
                self.plain(snap, ex, req.route, &FALLBACK_ATTEMPT, clock::instant())
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
            // Relay and MidStream end the attempts themselves; RetrySamePins only loops.
            ShimDecision::Relay | ShimDecision::MidStream | ShimDecision::RetrySamePins => {
                self.metrics.dynamo.request(path);
                Outcome::aborted()
            }
        }
    }
}

/// `disaggregated_serving.fallback_to_unified` of `snap`.
fn unified_fallback(snap: &RouterSnapshot) -> UnifiedFallback {
    UnifiedFallback::from_config(snap.config.disaggregated_serving.fallback_to_unified)
}

/// Relay the held answer of the attempt on backend `idx` as it is.
fn relay_held(
    snap: &RouterSnapshot,
    ex: &mut Exchange<'_>,
    idx: BackendIdx,
    status: u16,
    attempt: &Attempt<'_>,
) -> Outcome {
    match snap.backend(idx) {
        Some(backend) => relay::write_held(ex, status, backend, attempt),
        None => ex.local_error(LocalError::UpstreamUnavailable),
    }
}

/// Whether a request may still be picked again (issue 38: at most once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Repick {
    /// Not re-picked yet.
    Open,
    /// Already re-picked: the table alone decides.
    Spent,
}

/// The re-pick check of one attempt's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RepickCheck {
    /// A re-pick is possible; `pin_gone` says whether the router already holds a pinned worker
    /// gone (suspect or out of the fleet view), which a 500 needs.
    Open { pin_gone: bool },
    /// No re-pick (already made, or the result is not a held answer).
    Spent,
}

/// How one attempt's result is judged ([`pinned_step`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct StepPolicy {
    pub(super) mode: RequestMode,
    pub(super) fallback: UnifiedFallback,
    /// Another replica of the pool is within the retry budget (connect failures).
    pub(super) replica_left: bool,
    pub(super) answers: ShimAnswers,
    pub(super) repick: RepickCheck,
}

/// A held answer that asks for a re-pick: why, its status, and the replica that gave it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Held {
    reason: RepickReason,
    status: u16,
    idx: BackendIdx,
}

/// How a pick's attempts ended.
enum PinnedEnd {
    /// The client has its answer.
    Done(Outcome),
    /// The shim said the pinned worker is gone; its answer is held, nothing was sent.
    Repick(Held),
}

/// The pinned workers the router's own signals hold gone: suspect (their `kv_metrics`
/// connection dropped) or no longer in the request's fleet view.
fn gone_pins_known(
    snap: &RouterSnapshot,
    suspects: &Suspects,
    pinned: &Pinned<'_>,
) -> Vec<InstanceId> {
    pin_ids(pinned)
        .filter(|&id| suspects.contains(id) || snap.fleet.worker(pinned.namespace, id).is_none())
        .collect()
}

/// The workers a re-pick leaves out: those known gone, else every pinned worker (the shim's
/// answer does not say which of a pair is dead).
fn gone_pins(snap: &RouterSnapshot, suspects: &Suspects, pinned: &Pinned<'_>) -> Vec<InstanceId> {
    let known = gone_pins_known(snap, suspects, pinned);
    if known.is_empty() {
        pin_ids(pinned).collect()
    } else {
        known
    }
}

fn pin_ids(pinned: &Pinned<'_>) -> impl Iterator<Item = InstanceId> {
    std::iter::once(pinned.pins.worker)
        .chain(pinned.pins.prefill)
        .map(InstanceId::new)
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
    /// The held answer says the pinned worker is gone (issue 38): pick again without it.
    Repick(RepickReason, u16),
    /// Everything else: what the decision table says (retry, fallback, classified error).
    Decided(ShimDecision),
}

/// The pinned loop's decision for one attempt's result: the attempt's failure mapped onto the
/// decision table's outcomes (`continuum_core::shim::decide`), a held answer that says the pinned
/// worker is gone first checked for a re-pick (`continuum_core::shim::repick_reason`, issue 38).
/// `held` is the held answer's body.
pub(super) fn pinned_step(
    result: Result<Answer, DispatchError>,
    held: &[u8],
    policy: StepPolicy,
) -> PinnedStep {
    let StepPolicy {
        mode,
        fallback,
        replica_left,
        answers,
        repick,
    } = policy;
    match result {
        Ok(Answer::Done(outcome)) => PinnedStep::Answered(outcome),
        Ok(Answer::Held(status)) => {
            if let RepickCheck::Open { pin_gone } = repick
                && let Some(reason) = repick_reason(status, held, pin_gone)
            {
                return PinnedStep::Repick(reason, status);
            }
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
