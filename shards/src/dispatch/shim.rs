//! The shim path (SHIM-01..22): pick the workers, pin them on the request to the namespace's
//! `dynamo.frontend --router-mode direct` replicas, and carry out `core::shim::decide` on each
//! attempt's outcome.
//!
//! Per request: [`plan`] runs the shard's picker over the published fleet, the load store and
//! every shard's unanswered dispatches, counts the selection events (OBS-05) and records the
//! dispatch in the shard's ledger (LOAD-STORE-10); [`dispatch`] sends the request with the pins
//! to the pool's replicas in rotation and follows the decision table.
//!
//! Invariants:
//! - workers are picked once per request: a connect retry keeps the pins (SHIM-16), a failure
//!   after the stream started aborts the client connection without a re-pick (SHIM-17), and the
//!   unified fallback is sent without any pin through plain model routing (SHIM-20);
//! - `disaggregated_requests_total{routing_path}` is counted exactly once per orchestrated
//!   request, with the path that answered; `disaggregated_errors_total{phase}` once per failed
//!   pinned request (SHIM-18..20, OBS-13);
//! - every dispatch recorded at pick time is marked finished when the request ends, whatever
//!   the outcome;
//! - a non-2xx answer is held back whole (bounded) before anything reaches the client, so a
//!   failure can still fall back or become the classified error.

use continuum_core::discovery::FleetView;
use continuum_core::headers::{PinHeaders, RoutingHeaders};
use continuum_core::ingress::errors::{ClassifiedError, ErrorClass};
use continuum_core::load::{DispatchId, DispatchLoad, DispatchRole, InflightReader, LoadKey};
use continuum_core::picker::{PickInput, StoreLoads, estimate_prompt_tokens};
use continuum_core::shim::{
    RequestMode, RoutingPath, ShimDecision, ShimOutcome, UnifiedFallback, decide,
};
use continuum_core::snapshot::{BackendIdx, ModelRoute, RouterSnapshot};

use super::{Attempt, Failure, FailureHandling, Sent, plain, relay, send_to};
use crate::conn::{BodyRef, ClientConn, Outcome};
use crate::respond::{self, Persistence};
use crate::shard::Shard;

/// What the orchestrator decided for one request.
#[derive(Debug)]
pub(super) enum Plan<'s> {
    /// The orchestrator is off or no shim replica is usable: plain routing.
    Off,
    /// No worker serves the model in a candidate namespace (SHIM-08).
    NoWorker,
    /// The workers are picked.
    Pinned(Pinned<'s>),
}

impl Plan<'_> {
    /// Whether nothing will serve the request on the shim path.
    pub(super) fn is_none(&self) -> bool {
        !matches!(self, Plan::Pinned(_))
    }
}

/// A pick, as the dispatch needs it.
#[derive(Debug)]
pub(super) struct Pinned<'s> {
    pins: PinHeaders,
    namespace: &'s str,
    replicas: &'s [BackendIdx],
    dispatched: [Option<DispatchId>; 2],
}

/// Run the picker for `client_model` (PICK-*, SHIM-05..07). `body` is the request body, for the
/// prompt-size estimate (PICK-02).
pub(super) fn plan<'s>(
    shard: &Shard,
    snap: &'s RouterSnapshot,
    client_model: &str,
    body: &[u8],
) -> Plan<'s> {
    if !snap.shim.any_usable() {
        return Plan::Off;
    }
    let fleet: &'s FleetView = &snap.fleet;
    let now = crate::clock::now();
    let view = shard.load.store.view();
    let reader = InflightReader::new(&shard.load.inflight);
    let loads = StoreLoads::new(&view, &reader);
    let prompt = estimate_prompt_tokens(body);
    let mut guard = shard.pick_state.borrow_mut();
    let st = &mut *guard;
    st.refresh_ledger(&view, now);
    let input = PickInput {
        fleet,
        loads: &loads,
        model: snap.shim.dynamo_model(client_model),
        namespaces: &snap.shim,
        prompt_tokens: prompt,
        now,
        max_staleness: snap.config.dynamo.load.max_staleness,
    };
    let Ok(pick) = shard.picker.pick(&input, &mut st.cursors, &mut st.scratch) else {
        return Plan::NoWorker;
    };
    // Re-borrow what the dispatch keeps from the snapshot (the pick itself borrows the body).
    let Some(decode) = fleet.worker(pick.namespace, pick.decode.instance_id) else {
        return Plan::NoWorker;
    };
    let namespace: &'s str = &decode.namespace;
    for e in pick.events() {
        shard.metrics.dynamo.selection(e);
    }
    let tokens = prompt.get();
    let decode_role = if pick.prefill.is_some() {
        DispatchRole::PairDecode
    } else {
        DispatchRole::Aggregated
    };
    let d = st.ledger.dispatch(
        &view,
        LoadKey {
            worker_id: pick.decode.instance_id,
            dp_rank: pick.decode.dp_rank,
        },
        DispatchLoad::for_role(decode_role, tokens, decode.block_size),
        now,
    );
    let p = pick.prefill.and_then(|p| {
        let block = fleet
            .worker(namespace, p.instance_id)
            .and_then(|w| w.block_size);
        st.ledger.dispatch(
            &view,
            LoadKey {
                worker_id: p.instance_id,
                dp_rank: p.dp_rank,
            },
            DispatchLoad::for_role(DispatchRole::PairPrefill, tokens, block),
            now,
        )
    });
    Plan::Pinned(Pinned {
        pins: pick.pin_headers(),
        namespace,
        replicas: snap.shim.replicas(namespace),
        dispatched: [d, p],
    })
}

/// What the dispatch needs to know about the request besides its pins.
#[derive(Debug, Clone, Copy)]
pub(super) struct Request<'r> {
    /// The client model's plain route (for the unified fallback).
    pub(super) route: Option<&'r ModelRoute>,
    /// Buffered or streaming (the failure rules differ, SHIM-21).
    pub(super) mode: RequestMode,
    /// The upstream path when it is not the client's.
    pub(super) upstream_path: Option<&'static [u8]>,
    /// The client protocol.
    pub(super) ingress: super::Ingress,
}

/// Dispatch a pinned request and follow the decision table.
pub(super) async fn dispatch(
    shard: &Shard,
    snap: &RouterSnapshot,
    c: &mut ClientConn,
    body: &BodyRef,
    pinned: Pinned<'_>,
    req: Request<'_>,
) -> Outcome {
    let outcome = attempts(shard, snap, c, body, &pinned, req).await;
    let mut st = shard.pick_state.borrow_mut();
    for id in pinned.dispatched.into_iter().flatten() {
        st.ledger.finish(id);
    }
    outcome
}

async fn attempts(
    shard: &Shard,
    snap: &RouterSnapshot,
    c: &mut ClientConn,
    body: &BodyRef,
    pinned: &Pinned<'_>,
    req: Request<'_>,
) -> Outcome {
    let Request {
        route,
        mode,
        upstream_path,
        ingress,
    } = req;
    let path = RoutingPath::of_pins(pinned.pins.prefill.is_some());
    let attempt = Attempt {
        pins: Some(pinned.pins),
        routing: Some(RoutingHeaders {
            path: path.label(),
            pins: Some(pinned.pins),
            namespace: Some(pinned.namespace),
        }),
        on_failure: FailureHandling::Hold,
        upstream_path,
        ingress,
    };
    let fallback =
        UnifiedFallback::from_config(snap.config.disaggregated_serving.fallback_to_unified);
    let budget = (1 + snap.config.server.connect_retries as usize).min(pinned.replicas.len());
    let start = shard.next_shim_cursor();
    let mut n = 0;
    let decision = loop {
        let Some(&idx) = pinned
            .replicas
            .get((start + n) % pinned.replicas.len().max(1))
        else {
            // The namespace lost its replicas between pick and dispatch: nothing was sent.
            break decide(ShimOutcome::ConnectFailed, mode, fallback, false);
        };
        if n > 0 {
            shard.metrics.upstream_retry();
        }
        n += 1;
        let replica_left = n < budget;
        let sent = send_to(shard, snap, c, body, idx, &attempt).await;
        let decision = match sent {
            Ok(Sent::Relayed(outcome)) => {
                shard.metrics.dynamo.request(path);
                return outcome;
            }
            Err(Failure::Answered(outcome)) => {
                shard.metrics.dynamo.request(path);
                return outcome;
            }
            Err(Failure::Abort) => {
                // The stream had started (or the client left): SHIM-17, no re-pick.
                shard.metrics.dynamo.request(path);
                return Outcome::aborted();
            }
            Err(Failure::Connect) => {
                decide(ShimOutcome::ConnectFailed, mode, fallback, replica_left)
            }
            Err(Failure::Transport(_)) => {
                decide(ShimOutcome::TransportFailed, mode, fallback, false)
            }
            Ok(Sent::Held(status)) => {
                let d = decide(
                    ShimOutcome::Answered {
                        status,
                        body: &c.held,
                    },
                    mode,
                    fallback,
                    false,
                );
                if d == ShimDecision::Relay {
                    shard.metrics.dynamo.request(path);
                    let Some(backend) = snap.backend(idx) else {
                        return c.local_error(crate::respond::LocalError::UpstreamUnavailable);
                    };
                    return relay::write_held(c, status, backend, &attempt);
                }
                d
            }
        };
        if decision != ShimDecision::RetrySamePins {
            break decision;
        }
    };
    if let Some(phase) = decision.error_phase() {
        shard.metrics.dynamo.error(phase);
    }
    match decision {
        ShimDecision::FallbackUnified if route.is_some() => {
            shard.metrics.dynamo.request(RoutingPath::FallbackUnified);
            let attempt = Attempt {
                routing: Some(RoutingHeaders {
                    path: RoutingPath::FallbackUnified.label(),
                    pins: None,
                    namespace: None,
                }),
                upstream_path,
                ingress,
                ..Attempt::PLAIN
            };
            plain(shard, snap, c, body, route, &attempt).await
        }
        // Fallback configured but no plain route serves the model: it cannot happen.
        ShimDecision::FallbackUnified => {
            shard.metrics.dynamo.request(path);
            classified(c, ErrorClass::DisaggregatedDecodeFailed, path)
        }
        ShimDecision::Fail(class) => {
            shard.metrics.dynamo.request(path);
            classified(c, class, path)
        }
        // Relay and MidStream returned above; RetrySamePins only loops.
        ShimDecision::Relay | ShimDecision::MidStream | ShimDecision::RetrySamePins => {
            shard.metrics.dynamo.request(path);
            Outcome::aborted()
        }
    }
}

/// Answer with a classified error in the OpenAI shape, with the routing path header.
fn classified(c: &mut ClientConn, class: ErrorClass, path: RoutingPath) -> Outcome {
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
    let keep_alive = c.head.keep_alive;
    c.wbuf.clear();
    respond::write_classified(
        &mut c.wbuf,
        err.status(),
        &respond::classified_body(&err, c.error_shape),
        RoutingHeaders {
            path: path.label(),
            pins: None,
            namespace: None,
        },
        Persistence::of(keep_alive, c.head.http10),
    );
    Outcome {
        status: err.status(),
        keep_alive,
    }
}
