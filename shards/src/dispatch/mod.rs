//! Per-request dispatch: one [`Exchange`] per proxied request, run through prepare → plan →
//! attempts → relay.
//!
//! - **prepare** ([`prepare`]): convert an Anthropic body to chat, find `model` and `stream` in
//!   one bounded scan, strip client pin fields and `nvext.token_data` (INGRESS-01/02/04);
//! - **keys** ([`keys`], when `auth` is on): the client's API key identified before anything
//!   else, its model, rate and concurrency checked once the model is known;
//! - **plan** ([`plan`]): when the disaggregated orchestrator runs and a discovered worker serves
//!   the model, the shard's [`WorkerPicker`] picks and the pick is recorded in the shard's
//!   dispatch ledger (PICK-*, SHIM-05..07); otherwise plain model routing;
//! - **attempts** ([`shim`] for pinned requests, [`Dispatcher::plain`] otherwise): a pooled or new
//!   upstream connection per attempt, connect failures moving to the next replica
//!   (`connect_retries`), a stale pooled connection replaced once, the shim decision table
//!   (`continuum_core::shim::decide`) on pinned answers;
//! - **relay** ([`relay`], [`convert`]): the answer to the client, read for write, or converted.
//!
//! `explain` (builds with Dynamo discovery) runs prepare and plan as a dry run for
//! `POST /admin/dynamo/explain`: the same preparation, pipeline and candidates, the pick made
//! on a copy of the picker, nothing recorded.
//!
//! Every attempt that produces no answer ends in one classified
//! [`continuum_core::upstream::DispatchError`]; the loops decide from its kind, phase and
//! retryability alone. Nothing is sent twice once it may have reached a backend, except by the
//! shim path's configured unified fallback (SHIM-20).
//!
//! Invariants: the dispatcher is shard-local (`RefCell`/`Cell`, never shared); its pool, cursors
//! and picker state are touched only between awaits; every dispatch recorded at pick time is
//! marked finished when the request ends, whatever the outcome.

mod attempt;
mod avoid;
mod choose;
mod conn;
mod convert;
mod encoder;
mod exchange;
#[cfg(feature = "dynamo")]
mod explain;
#[cfg(test)]
#[cfg(feature = "dynamo")]
pub(crate) mod explain_tests;
pub(crate) mod keys;
mod plan;
mod pool;
mod prepare;
mod prompt;
mod relay;
#[cfg(test)]
mod relay_tests;
mod shim;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_kv;
mod token_data;
mod upstream;

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use continuum_core::config::RetryBudgetConfig;
use continuum_core::load::DispatchLedger;
use continuum_core::picker::WorkerPicker;
use continuum_core::prompt::BodyFormat;
use continuum_core::prompt::request::{TENANT_ID_HEADER, resolve_cache_salt};
use continuum_core::retry_budget::RetryBudget;
use continuum_core::shim::RoutingPath;
use continuum_core::snapshot::RouterSnapshot;

use crate::clock;
use crate::http::respond::LocalError;
use crate::http::{Outcome, Request, ResponseSink};
use crate::metrics::{AuthFailure, ShardMetrics};
use crate::signals::Signals;
use exchange::Attempt;
use pool::Pool;

pub(crate) use exchange::{Exchange, ExchangeBufs};
pub use plan::{PickerEnv, PickerFactory, kv_aware_picker, load_based_picker, picker_for};

/// Which client protocol a proxied request arrived in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ingress {
    /// `POST /v1/chat/completions`: relayed as is.
    Chat,
    /// `POST /v1/completions`: relayed as is, pinned like chat.
    Completions,
    /// Anthropic Messages: converted to chat, the answer converted back ([`convert`]).
    Messages,
    /// `POST /v1/responses`: native passthrough, pinned by model (INGRESS-05).
    Responses,
    /// `POST /v1/responses/compact`: passthrough, never pinned (INGRESS-08).
    ResponsesCompact,
    /// `POST /v1/embeddings`: passthrough by model, never pinned (the shim path is for
    /// generation).
    Embeddings,
}

impl Ingress {
    /// How the prompt pipeline reads this ingress's body (`None`: it cannot, the pick weighs
    /// the body's size estimate).
    fn prompt_format(self) -> Option<BodyFormat> {
        match self {
            Ingress::Chat | Ingress::Messages => Some(BodyFormat::Chat),
            Ingress::Completions => Some(BodyFormat::Completion),
            Ingress::Responses | Ingress::ResponsesCompact | Ingress::Embeddings => None,
        }
    }
}

/// The path converted requests are sent to.
const CHAT_PATH: &[u8] = b"/v1/chat/completions";

/// One shard's dispatch state: the upstream pool, the plain-routing cursors, the shim replica
/// cursor and the picker with its dispatch ledger.
#[derive(Debug)]
pub(crate) struct Dispatcher {
    metrics: Arc<ShardMetrics>,
    signals: Arc<Signals>,
    pool: RefCell<Pool>,
    /// Plain routing: the rotation position of each route slot of the current snapshot.
    cursors: RefCell<Vec<usize>>,
    /// Rotation over each namespace's shim replicas (one cursor for all pools).
    shim_cursor: Cell<usize>,
    picking: RefCell<plan::Picking>,
    /// This shard's retry budget (`server.retry_budget`, its share of the floor).
    budget: RefCell<RetryBudget>,
    /// The budget's config, to notice a reload.
    budget_cfg: Cell<RetryBudgetConfig>,
    shard: usize,
    /// This shard's side of the dispatch gossip with the other replicas (`dynamo.peers`).
    peer: Option<crate::peers::PeerSender>,
}

impl Dispatcher {
    /// The dispatcher of shard `shard`, recording dispatches in `ledger` (whose table is this
    /// shard's entry of `signals.inflight`).
    pub(crate) fn new(
        shard: usize,
        metrics: Arc<ShardMetrics>,
        signals: Arc<Signals>,
        ledger: DispatchLedger,
        picker: Box<dyn WorkerPicker>,
    ) -> Self {
        let kv = signals.kv.handles();
        let budget_cfg = RetryBudgetConfig::default();
        let budget = RetryBudget::new(&budget_cfg, signals.shards());
        let peer = signals.peers.as_ref().and_then(|p| {
            crate::peers::PeerSender::new(p, shard)
                .map_err(|e| tracing::warn!(shard, error = %e, "no dispatch gossip socket"))
                .ok()
        });
        Self {
            peer,
            budget: RefCell::new(budget),
            budget_cfg: Cell::new(budget_cfg),
            metrics,
            signals,
            pool: RefCell::new(Pool::default()),
            cursors: RefCell::new(Vec::new()),
            shim_cursor: Cell::new(shard),
            picking: RefCell::new(plan::Picking::new(ledger, picker, kv)),
            shard,
        }
    }

    /// A new snapshot is in force: its route slots start their rotations afresh.
    pub(crate) fn on_snapshot(&self) {
        self.cursors.borrow_mut().clear();
    }

    /// Replace the active picker (API-06); the next pick uses it.
    pub(crate) fn set_picker(&self, picker: Box<dyn WorkerPicker>) {
        let mut p = self.picking.borrow_mut();
        tracing::info!(
            shard = self.shard,
            from = p.picker.name(),
            to = picker.name(),
            "picker replaced"
        );
        p.picker = picker;
    }

    /// Keep the dispatch ledger's published summaries exact while no pick refreshes them.
    pub(crate) fn refresh_ledger(&self) {
        let view = self.signals.store.view();
        self.picking
            .borrow_mut()
            .ledger
            .refresh(&view, crate::clock::now());
    }

    /// The rotation position for the next request of route `slot`, advancing the cursor.
    fn next_cursor(&self, slot: usize) -> usize {
        let mut cursors = self.cursors.borrow_mut();
        if cursors.len() <= slot {
            // Start each shard at a different position so shards do not move in lockstep.
            cursors.resize(slot + 1, self.shard);
        }
        let v = cursors[slot];
        cursors[slot] = v.wrapping_add(1);
        v
    }

    /// A request arrived at `now_ms`: it deposits into the retry budget (reconfigured first after
    /// a reload).
    fn deposit(&self, cfg: &RetryBudgetConfig, now_ms: u64) {
        let mut budget = self.budget.borrow_mut();
        if self.budget_cfg.get() != *cfg {
            budget.reconfigure(cfg, self.signals.shards());
            self.budget_cfg.set(*cfg);
        }
        budget.on_request(now_ms / 1000);
    }

    /// The next position in a shim pool's replica rotation.
    fn next_shim_cursor(&self) -> usize {
        let v = self.shim_cursor.get();
        self.shim_cursor.set(v.wrapping_add(1));
        v
    }

    /// Proxy one request of `ingress`: the shim path when the orchestrator runs and a worker
    /// serves the model, plain model routing otherwise.
    pub(crate) async fn serve(
        &self,
        snap: &RouterSnapshot,
        req: &mut Request,
        sink: &mut ResponseSink,
        bufs: &mut ExchangeBufs,
        ingress: Ingress,
    ) -> Outcome {
        self.deposit(&snap.config.server.retry_budget, clock::ms_at(req.started));
        let mut ex = Exchange::new(req, sink, bufs, ingress);
        let outcome = self.exchange(snap, &mut ex, ingress).await;
        self.metrics
            .phases
            .record(ex.req.route, ex.started, &ex.times);
        outcome
    }

    /// [`Dispatcher::serve`]'s exchange, from the API key to the answer.
    async fn exchange<'a>(
        &self,
        snap: &'a RouterSnapshot,
        ex: &mut Exchange<'a>,
        ingress: Ingress,
    ) -> Outcome {
        if let Some(auth) = &snap.auth {
            match keys::identify(auth, ex.req) {
                Ok(k) => ex.key = Some(k),
                Err(e) => {
                    self.metrics.auth_failed(if e == LocalError::ApiKeyMissing {
                        AuthFailure::Missing
                    } else {
                        AuthFailure::Invalid
                    });
                    return ex.local_error(e);
                }
            }
        }
        let prepared = match prepare::prepare(ex) {
            Ok(p) => p,
            Err(outcome) => return outcome,
        };
        let found = {
            let (body, shim_body) = exchange::body_and_shim(ex.req, ex.bufs, ex.body);
            match body
                .get(prepared.model.clone())
                .and_then(continuum_core::json_scan::unescape_simple)
            {
                None => Err(LocalError::ModelNotFound),
                // The key's model and budgets, once the model is known and before anything is
                // picked (a refused request spends nothing); the in-flight slot is held until
                // the request ends.
                Some(model) => match ex
                    .key
                    .map(|k| keys::admit(k, &model, clock::ns_at(ex.started)))
                {
                    Some(Err(e)) => Err(e),
                    admitted => {
                        let slot = admitted.and_then(Result::ok);
                        let route = snap.route(&model);
                        let planned = match ingress {
                            Ingress::ResponsesCompact | Ingress::Embeddings => plan::Plan::Off,
                            _ => self.plan(
                                snap,
                                &model,
                                body,
                                plan::PlanAsk {
                                    format: ingress.prompt_format(),
                                    tenant: tenant_id(ex.req),
                                    pick_for: plan::PickFor::First,
                                },
                                plan::PlanOut {
                                    shim_body,
                                    times: &mut ex.times,
                                },
                            ),
                        };
                        if route.is_none() && planned.is_none() {
                            Err(LocalError::ModelNotFound)
                        } else {
                            Ok((route, planned, slot))
                        }
                    }
                },
            }
        };
        let (route, planned, _in_flight) = match found {
            Ok(f) => f,
            Err(e) => return ex.local_error(e),
        };
        match planned {
            plan::Plan::Pinned(p) => {
                let req = shim::Request {
                    model: prepared.model,
                    route,
                    mode: prepared.mode,
                };
                self.dispatch_pinned(snap, ex, p, req).await
            }
            plan::Plan::NoWorker => {
                // SHIM-08: no worker serves the model; plain routing, unpinned.
                self.metrics.dynamo.request(RoutingPath::NoWorker);
                let attempt = Attempt {
                    routing: Some(continuum_core::headers::RoutingHeaders {
                        path: RoutingPath::NoWorker.label(),
                        pins: None,
                        namespace: None,
                    }),
                    ..Attempt::PLAIN
                };
                self.plain(snap, ex, route, &attempt, clock::instant())
                    .await
            }
            // Nothing ran between the request's start and its dispatch: the first attempt
            // begins with the request, on its clock reading.
            plan::Plan::Off => {
                let begun = ex.started;
                self.plain(snap, ex, route, &Attempt::PLAIN, begun).await
            }
        }
    }
}

impl Dispatcher {
    /// Plan the request in `ex` again, leaving out `avoid` (issue 38): the client model is read
    /// again from the body at `model`, as the first plan read it. Rare (a dead pinned worker), so
    /// it may allocate. No model (it cannot happen: the first plan read it): no worker.
    fn replan<'s>(
        &self,
        snap: &'s RouterSnapshot,
        ex: &mut Exchange<'_>,
        model: std::ops::Range<usize>,
        avoid: &[continuum_core::discovery::InstanceId],
    ) -> plan::Plan<'s> {
        let format = ex.ingress.prompt_format();
        let tenant = tenant_id(ex.req).map(str::to_owned);
        let (body, shim_body) = exchange::body_and_shim(ex.req, ex.bufs, ex.body);
        let Some(client_model) = body
            .get(model)
            .and_then(continuum_core::json_scan::unescape_simple)
            .map(|m| m.into_owned())
        else {
            return plan::Plan::NoWorker;
        };
        self.plan(
            snap,
            &client_model,
            body,
            plan::PlanAsk {
                format,
                tenant: tenant.as_deref(),
                pick_for: plan::PickFor::Repick(avoid),
            },
            plan::PlanOut {
                shim_body,
                times: &mut ex.times,
            },
        )
    }
}

/// The last non-empty `x-tenant-id` value (1.6.1 takes it as the request's cache salt; the rule
/// is core's [`resolve_cache_salt`], the body's salt applied later by the prompt pipeline).
fn tenant_id(req: &Request) -> Option<&str> {
    let values = req
        .head
        .headers
        .iter()
        .filter(|h| {
            req.span(&h.name)
                .eq_ignore_ascii_case(TENANT_ID_HEADER.as_bytes())
        })
        .filter_map(|h| std::str::from_utf8(req.span(&h.value)).ok());
    resolve_cache_salt(values, None)
}
