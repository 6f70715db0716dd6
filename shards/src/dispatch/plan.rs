//! Plan: run the shard's picker for one request (PICK-*, SHIM-05..07) and record the dispatch.
//!
//! Inputs: the snapshot's fleet, the load store and every shard's unanswered-dispatch table
//! (through [`Signals`]), the prompt-size estimate (PICK-02). The selection events are counted
//! (OBS-05) and each pinned worker's dispatch is recorded in this shard's [`DispatchLedger`]
//! (LOAD-STORE-10), to be marked finished when the request ends.
//!
//! The picker is built per shard by a [`PickerFactory`], from the shard's [`PickerEnv`], and can
//! be replaced at run time (API-06, [`super::Dispatcher::set_picker`]).

use std::sync::Arc;

use continuum_core::clock::Instant;
use continuum_core::discovery::FleetView;
use continuum_core::headers::PinHeaders;
use continuum_core::kv::shared::{IndexReader, Merged};
use continuum_core::load::{
    DispatchId, DispatchLedger, DispatchLoad, DispatchRole, InflightReader, LoadKey, LoadView,
};
use continuum_core::picker::{
    LoadBasedPicker, PickInput, PickerCursors, Picks, StoreLoads, WorkerPicker,
    estimate_prompt_tokens,
};
use continuum_core::snapshot::{BackendIdx, RouterSnapshot};

use super::Dispatcher;
use crate::signals::Signals;

/// What a picker factory may use of its shard.
#[derive(Debug, Clone)]
pub struct PickerEnv {
    /// The shard's index.
    pub shard: usize,
    /// The cross-shard read side (load store, dispatch ledgers; later the KV indexes).
    pub signals: Arc<Signals>,
}

/// Builds one shard's [`WorkerPicker`] on that shard's thread (PICK-17, API-06): cheap to
/// clone, shareable across threads; the picker it builds is shard-local.
#[derive(Clone)]
pub struct PickerFactory {
    name: &'static str,
    build: Arc<BuildPicker>,
}

/// What a [`PickerFactory`] calls.
type BuildPicker = dyn Fn(&PickerEnv) -> Box<dyn WorkerPicker> + Send + Sync;

impl PickerFactory {
    /// A factory named `name` (logs, `ShardSet::picker`).
    pub fn new(
        name: &'static str,
        build: impl Fn(&PickerEnv) -> Box<dyn WorkerPicker> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name,
            build: Arc::new(build),
        }
    }

    /// The factory's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// A picker for the shard of `env`.
    pub fn build(&self, env: &PickerEnv) -> Box<dyn WorkerPicker> {
        (self.build)(env)
    }
}

impl std::fmt::Debug for PickerFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PickerFactory")
            .field("name", &self.name)
            .finish()
    }
}

/// The default picker: [`LoadBasedPicker`] (PICK-01), its cursors starting at the shard's
/// index so that shards do not round-robin in lockstep.
pub fn load_based_picker() -> PickerFactory {
    PickerFactory::new("load_based", |env: &PickerEnv| {
        let start = env.shard as u64;
        Box::new(LoadBasedPicker::with_cursors(PickerCursors {
            decode: start,
            prefill: start,
        }))
    })
}

/// The picker a config asks for. Every config selects [`load_based_picker`] today; the KV-aware
/// picker will be selected here by `dynamo.kv.enabled` once it is built. The control thread
/// calls this on every reload and replaces the shards' picker when the answer changes (API-06).
pub fn picker_for(_config: &continuum_core::config::Config) -> PickerFactory {
    load_based_picker()
}

/// A pick refreshes the shard's dispatch ledger (a walk over every key it has dispatched to) at
/// most this often: at 1,000 workers the walk costs about as much as the pick itself
/// (`continuum-bench pick`, rows `pick p/d` and `refresh+p/d`), and between refreshes other
/// shards' readers already correct answered and expired records themselves.
const PICK_REFRESH_EVERY: std::time::Duration = std::time::Duration::from_millis(1);

/// The shard-local state one pick reads and writes.
#[derive(Debug)]
pub(super) struct Picking {
    pub(super) picker: Box<dyn WorkerPicker>,
    pub(super) ledger: DispatchLedger,
    /// This shard's read handles on every shard's KV index (merged at pick time).
    kv: Vec<IndexReader>,
    /// When the ledger was last refreshed by a pick.
    refreshed: Option<Instant>,
}

impl Picking {
    pub(super) fn new(
        ledger: DispatchLedger,
        picker: Box<dyn WorkerPicker>,
        kv: Vec<IndexReader>,
    ) -> Self {
        Self {
            picker,
            ledger,
            kv,
            refreshed: None,
        }
    }

    /// Refresh the ledger if the last refresh is older than [`PICK_REFRESH_EVERY`].
    fn refresh_ledger(&mut self, view: &LoadView<'_>, now: Instant) {
        let due = self
            .refreshed
            .is_none_or(|t| now.saturating_since(t) >= PICK_REFRESH_EVERY);
        if due {
            self.ledger.refresh(view, now);
            self.refreshed = Some(now);
        }
    }
}

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
    pub(super) pins: PinHeaders,
    pub(super) namespace: &'s str,
    pub(super) replicas: &'s [BackendIdx],
    pub(super) dispatched: [Option<DispatchId>; 2],
}

impl Dispatcher {
    /// Run the picker for `client_model`. `body` is the request body, for the prompt-size
    /// estimate (PICK-02).
    pub(super) fn plan<'s>(
        &self,
        snap: &'s RouterSnapshot,
        client_model: &str,
        body: &[u8],
    ) -> Plan<'s> {
        if !snap.shim.any_usable() {
            return Plan::Off;
        }
        let fleet: &'s FleetView = &snap.fleet;
        let now = crate::clock::now();
        let view = self.signals.store.view();
        let reader = InflightReader::new(&self.signals.inflight);
        let loads = StoreLoads::new(&view, &reader);
        let prompt = estimate_prompt_tokens(body);
        let mut guard = self.picking.borrow_mut();
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
            prompt_blocks: &[],
            overlap: &Merged(&st.kv),
        };
        // One candidate: a pinned request is never re-picked (SHIM-16/17).
        let mut picks = Picks::new(1);
        if st.picker.pick(&input, &mut picks).is_err() {
            return Plan::NoWorker;
        }
        let Some(pick) = picks.first().copied() else {
            return Plan::NoWorker;
        };
        // Re-borrow what the dispatch keeps from the snapshot (the pick itself borrows the body).
        let Some(decode) = fleet.worker(pick.namespace, pick.decode.instance_id) else {
            return Plan::NoWorker;
        };
        let namespace: &'s str = &decode.namespace;
        for e in pick.events() {
            self.metrics.dynamo.selection(e);
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

    /// Mark the dispatches recorded for a pinned request finished.
    pub(super) fn finish(&self, dispatched: [Option<DispatchId>; 2]) {
        let mut st = self.picking.borrow_mut();
        for id in dispatched.into_iter().flatten() {
            st.ledger.finish(id);
        }
    }
}
