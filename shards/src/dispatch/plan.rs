//! Plan: run the shard's picker for one request (PICK-*, SHIM-05..07) and record the dispatch.
//!
//! Inputs: the snapshot's fleet, the load store and every shard's unanswered-dispatch table
//! (through [`Signals`]), the prompt-size estimate (PICK-02). The selection events are counted
//! (OBS-05) and each pinned worker's dispatch is recorded in this shard's [`DispatchLedger`]
//! (LOAD-STORE-10), to be marked finished when the request ends.
//!
//! The picker is built per shard by a [`PickerFactory`], from the shard's [`PickerEnv`], and can
//! be replaced at run time (API-06, [`super::Dispatcher::set_picker`]).

use std::cell::RefCell;
use std::sync::Arc;

use continuum_core::artifacts::KvSelection;
use continuum_core::clock::Instant;
use continuum_core::discovery::{FleetView, InstanceId};
use continuum_core::headers::PinHeaders;
use continuum_core::kv::parity::{Oracle, Predictions, Verdict};
use continuum_core::kv::shared::{IndexReader, Merged};
use continuum_core::load::{
    DispatchId, DispatchLedger, DispatchLoad, DispatchRole, InflightReader, LoadKey, LoadMemo,
    LoadView,
};
use continuum_core::picker::{
    BlockHash, ConditionalDisagg, KvAwarePicker, KvOutcome, KvParams, LoadBasedPicker, Pick,
    PickInput, PickerCursors, Picks, PromptBlocks, PromptTokens, SplitMix64, StoreLoads,
    WorkerPicker, estimate_prompt_tokens,
};
use continuum_core::prompt::BodyFormat;
use continuum_core::snapshot::{BackendIdx, RouterSnapshot};

use super::Dispatcher;
use super::avoid::{Filtered, FleetFilter, repick_avoid};
use super::exchange::Body;
use super::prompt::{Deferral, Prepared, ShardPrompts};
use super::token_data::write_shim_body;
use crate::metrics::phases::PhaseTimes;
use crate::peers::dispatch_event;
use crate::signals::Signals;
use continuum_core::peers::PeerEvent;

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
    /// What distinguishes two factories of the same picker: its parameters' exact bits.
    settings: [u64; 4],
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
            settings: [0; 4],
            build: Arc::new(build),
        }
    }

    /// The same factory, told apart from others of its name by `settings` (its parameters'
    /// bits, compared exactly): a reload that changes them replaces the picker (API-06).
    pub fn with_settings(mut self, settings: [u64; 4]) -> Self {
        self.settings = settings;
        self
    }

    /// Whether `self` and `other` build the same picker with the same parameters.
    pub fn same_as(&self, other: &PickerFactory) -> bool {
        self.name == other.name && self.settings == other.settings
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
            .field("settings", &self.settings)
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

/// The KV-aware picker (KV-PICK-01..09) with `params`, and conditional disaggregation when
/// `conditional` is set (KV-PICK-12..15): each shard's instance draws its softmax samples from
/// its own generator, seeded apart per shard and per process. Without prompt blocks (KV off for
/// the model, or its prompt could not be prepared) it picks exactly as [`load_based_picker`].
pub fn kv_aware_picker(params: KvParams, conditional: Option<ConditionalDisagg>) -> PickerFactory {
    let gate = conditional.map(|c| c.decode_busy_threshold.unwrap_or(-1.0));
    let settings = [
        params.overlap_score_credit,
        params.prefill_load_scale,
        params.temperature,
        gate.unwrap_or(-2.0),
    ]
    .map(f64::to_bits);
    PickerFactory::new("kv_aware", move |env: &PickerEnv| {
        let start = env.shard as u64;
        let seed = prompt_seed() ^ start;
        Box::new(
            KvAwarePicker::new(params, Box::new(SplitMix64::new(seed)))
                .with_cursors(PickerCursors {
                    decode: start,
                    prefill: start,
                })
                .with_conditional(conditional),
        )
    })
    .with_settings(settings)
}

/// The picker a config asks for: [`kv_aware_picker`] when `dynamo.kv.enabled`, else
/// [`load_based_picker`]. The control thread calls this on every reload and replaces the
/// shards' picker when the answer (or its parameters) changes (API-06).
pub fn picker_for(config: &continuum_core::config::Config) -> PickerFactory {
    if config.dynamo.kv.enabled {
        let kv = &config.dynamo.kv;
        kv_aware_picker(
            KvParams::from(kv),
            ConditionalDisagg::from_config(&kv.conditional_disaggregation),
        )
    } else {
        load_based_picker()
    }
}

/// A per-shard seed for the segment caches' hash (the caches compare texts exactly; the seed
/// only spreads keys).
fn prompt_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x6b76_5f70_726f_6d70);
    h.finish()
}

/// No prompt blocks yet (what [`Prepared::blocks`] fills).
pub(super) const NO_BLOCKS: [PromptBlocks<'static>; 2] = [PromptBlocks {
    block_size: 0,
    hashes: &[],
}; 2];

/// The prompt size the picker weighs (its `isl`): the rendered token count when the pipeline
/// prepared the prompt, else the estimate from the body (PICK-02).
pub(super) fn prompt_size(prepared: &Prepared<'_>, body: &[u8]) -> PromptTokens {
    match prepared {
        Prepared::Blocks { tokens, .. } => *tokens,
        _ => estimate_prompt_tokens(body),
    }
}

/// The picker's input for one request of `model` (the Dynamo model) in `snap`.
pub(super) fn pick_input<'a>(
    snap: &'a RouterSnapshot,
    model: &'a str,
    loads: &'a StoreLoads<'_, '_, '_>,
    now: Instant,
    prompt: PromptTokens,
    blocks: &'a [PromptBlocks<'a>],
    overlap: &'a Merged<'_>,
) -> PickInput<'a> {
    PickInput {
        fleet: &snap.fleet,
        loads,
        model,
        namespaces: &snap.shim,
        prompt_tokens: prompt,
        now,
        max_staleness: snap.config.dynamo.load.max_staleness,
        prompt_blocks: blocks,
        overlap,
        candidates: snap.candidates(),
    }
}

/// What `continuum_dynamo_kv_selection_total{result}` counts for a selection whose pick carried
/// `kv` (KV-PICK-09); `None` while KV is off.
pub(super) fn kv_result(
    prepared: &Prepared<'_>,
    kv: Option<KvOutcome>,
    bypass: bool,
) -> Option<KvSelection> {
    match (prepared, kv) {
        (Prepared::Off, _) => None,
        // KV-PICK-14: the decode worker prefills locally.
        _ if bypass => Some(KvSelection::Bypass),
        (_, Some(o)) if o.overlap_blocks > 0 => Some(KvSelection::Overlap),
        (_, Some(_)) => Some(KvSelection::NoOverlap),
        (Prepared::Skip(r), None) => Some(*r),
        (Prepared::Blocks { .. }, None) => Some(KvSelection::TokenizerUnavailable),
    }
}

/// What the hash-parity watchdog predicts after `pick` (issue 11, item 6): the rank that
/// prefills will hold the prompt's deepest block of its block size. `None` for a load-only
/// pick, and when that rank already held every block (it stores nothing new).
pub(super) fn prediction(
    pick: &Pick<'_>,
    blocks: &[PromptBlocks<'_>],
) -> Option<(LoadKey, BlockHash)> {
    let kv = pick.kv?;
    let prompt = blocks.iter().find(|b| b.block_size == kv.block_size)?;
    let last = *prompt.hashes.last()?;
    if usize::try_from(kv.overlap_blocks).ok()? >= prompt.hashes.len() {
        return None;
    }
    let who = pick.prefill.unwrap_or(pick.decode);
    Some((
        LoadKey {
            worker_id: who.instance_id,
            dp_rank: who.dp_rank,
        },
        last,
    ))
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
    pub(super) kv: Vec<IndexReader>,
    /// When the ledger was last refreshed by a pick.
    refreshed: Option<Instant>,
    /// The prompt pipeline's shard-local caches and scratch (KV-aware selection).
    pub(super) prompts: ShardPrompts,
    /// The hash-parity watchdog's predictions waiting for a verdict.
    pub(super) predictions: Predictions,
    /// This shard's memo of candidate loads: a pick reads only the cells that changed since
    /// (`continuum_core::load::LoadMemo`).
    pub(super) memo: RefCell<LoadMemo>,
    /// The fleet without the suspect workers, as last built (issue 38).
    filter: FleetFilter,
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
            prompts: ShardPrompts::new(prompt_seed()),
            predictions: Predictions::new(),
            memo: RefCell::new(LoadMemo::new()),
            filter: FleetFilter::default(),
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

/// What a plan writes besides its answer.
#[derive(Debug)]
pub(super) struct PlanOut<'x> {
    /// The shim attempts' body, when it carries `nvext.token_data` (KV-PICK-10).
    pub(super) shim_body: &'x mut Vec<u8>,
    /// The request's phase times: the prompt pipeline's and the pick's are filed here.
    pub(super) times: &'x mut PhaseTimes,
}

/// What a plan is asked besides the model and the body.
#[derive(Debug, Clone, Copy)]
pub(super) struct PlanAsk<'a> {
    /// How the prompt pipeline reads the body (`None`: it does not).
    pub(super) format: Option<BodyFormat>,
    /// The request's `x-tenant-id` (the cache salt's override).
    pub(super) tenant: Option<&'a str>,
    /// The first pick or a re-pick.
    pub(super) pick_for: PickFor<'a>,
}

/// Which pick a plan makes.
#[derive(Debug, Clone, Copy)]
pub(super) enum PickFor<'a> {
    /// The request's first pick: suspect workers only while no other worker can serve.
    First,
    /// Again after the shim said a pinned worker is gone (issue 38): never these workers (nor
    /// a suspect one); no worker left is [`Plan::NoWorker`].
    Repick(&'a [InstanceId]),
}

/// A pick, as the dispatch needs it.
#[derive(Debug)]
pub(super) struct Pinned<'s> {
    pub(super) pins: PinHeaders,
    pub(super) namespace: &'s str,
    pub(super) replicas: &'s [BackendIdx],
    pub(super) dispatched: [Option<DispatchId>; 2],
    /// The body the shim attempts send instead of the request's: [`Body::Shim`] when it carries
    /// `nvext.token_data` (KV-PICK-10).
    pub(super) body: Option<Body>,
}

impl Dispatcher {
    /// Run the picker for `client_model`. `body` is the request body: a body the pipeline
    /// reads (`ask.format`) goes through the model's prompt pipeline when `dynamo.kv` is on
    /// (KV-TOK-11..17), else it gives the prompt-size estimate (PICK-02). With
    /// `dynamo.kv.send_token_data` and a prepared prompt, the pinned request's body with
    /// `nvext.token_data` is written to `out.shim_body` (KV-PICK-10); the pick's and the
    /// pipeline's durations to `out.times`.
    pub(super) fn plan<'s>(
        &self,
        snap: &'s RouterSnapshot,
        client_model: &str,
        body: &[u8],
        ask: PlanAsk<'_>,
        out: PlanOut<'_>,
    ) -> Plan<'s> {
        let PlanAsk {
            format,
            tenant,
            pick_for,
        } = ask;
        let PlanOut { shim_body, times } = out;
        if !snap.shim.any_usable() {
            return Plan::Off;
        }
        let fleet: &'s FleetView = &snap.fleet;
        let planned = crate::clock::instant();
        let now = crate::clock::at(planned);
        let view = self.signals.store.view();
        let reader = InflightReader::new(&self.signals.inflight);
        let model = snap.shim.dynamo_model(client_model);
        let mut guard = self.picking.borrow_mut();
        let st = &mut *guard;
        st.refresh_ledger(&view, now);
        let Picking {
            picker,
            ledger,
            kv,
            prompts,
            predictions,
            memo,
            filter,
            ..
        } = &mut *st;
        let loads = StoreLoads::memoised(&view, &reader, memo);
        let prepared = prompts.prepare(snap, model, body, format, tenant, Deferral::Encode);
        let picking = if matches!(prepared, Prepared::Off) {
            planned
        } else {
            let t = crate::clock::instant();
            times.prompt = Some(t.saturating_duration_since(planned));
            t
        };
        let prompt = prompt_size(&prepared, body);
        let mut blocks = NO_BLOCKS;
        let n = prepared.blocks(&mut blocks);
        let overlap = Merged(kv);
        let mut input = pick_input(
            snap,
            model,
            &loads,
            now,
            prompt,
            blocks.get(..n).unwrap_or(&[]),
            &overlap,
        );
        // Issue 38: the view without the workers most likely dead.
        let suspects = &self.signals.suspects;
        let narrowed = match pick_for {
            PickFor::First => filter.without_suspects(snap, suspects),
            PickFor::Repick(pins) => Filtered::of(fleet, &repick_avoid(pins, suspects)),
        };
        if let Some(f) = &narrowed {
            input.fleet = &f.fleet;
            input.candidates = Some(&f.candidates);
        }
        // One candidate: a retry keeps its pins (SHIM-16/17); a re-pick is a new plan.
        let mut picks = Picks::new(1);
        let mut picked = picker.pick(&input, &mut picks);
        if picked.is_err() && narrowed.is_some() && matches!(pick_for, PickFor::First) {
            // Only suspects serve the model: they are still better than no worker.
            input.fleet = fleet;
            input.candidates = snap.candidates();
            picked = picker.pick(&input, &mut picks);
        }
        times.pick = Some(crate::clock::instant().saturating_duration_since(picking));
        if picked.is_err() {
            return Plan::NoWorker;
        }
        let Some(pick) = picks.first().copied() else {
            return Plan::NoWorker;
        };
        // KV-PICK-09: every selection of a model with KV on says how KV took part.
        if let Some(r) = kv_result(&prepared, pick.kv, pick.is_conditional_bypass()) {
            self.metrics.kv_selection.count(r);
        }
        if let Some((rank, block)) = prediction(&pick, blocks.get(..n).unwrap_or(&[])) {
            predictions.post(model, rank, block, now);
        }

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
        let decode_key = LoadKey {
            worker_id: pick.decode.instance_id,
            dp_rank: pick.decode.dp_rank,
        };
        let decode_load = DispatchLoad::for_role(decode_role, tokens, decode.block_size);
        let d = ledger.dispatch(&view, decode_key, decode_load, now);
        let prefill = pick.prefill.map(|p| {
            let block = fleet
                .worker(namespace, p.instance_id)
                .and_then(|w| w.block_size);
            let key = LoadKey {
                worker_id: p.instance_id,
                dp_rank: p.dp_rank,
            };
            (
                key,
                DispatchLoad::for_role(DispatchRole::PairPrefill, tokens, block),
            )
        });
        let p = prefill.and_then(|(key, load)| ledger.dispatch(&view, key, load, now));
        if let (Some(peer), Some(shared)) = (&self.peer, &self.signals.peers) {
            // Tell the other replicas (dynamo.peers, issue 38).
            let events = [
                d.map(|id| dispatch_event(id, decode_key, decode_load)),
                p.zip(prefill)
                    .map(|(id, (key, load))| dispatch_event(id, key, load)),
            ];
            let n = events.iter().flatten().count();
            let mut batch = [PeerEvent::Finish { seq: 0 }; 2];
            for (slot, e) in batch.iter_mut().zip(events.into_iter().flatten()) {
                *slot = e;
            }
            peer.send(shared, batch.get(..n).unwrap_or(&[]));
        }
        // KV-PICK-10: the ids the router rendered for this very body, on the shim body only.
        let token_data = match &prepared {
            Prepared::Blocks {
                token_data: Some(ids),
                ..
            } if snap.config.dynamo.kv.send_token_data => write_shim_body(body, ids, shim_body),
            _ => false,
        };
        Plan::Pinned(Pinned {
            pins: pick.pin_headers(),
            namespace,
            replicas: snap.shim.replicas(namespace),
            dispatched: [d, p],
            body: token_data.then_some(Body::Shim),
        })
    }

    /// Settle this shard's hash-parity predictions and record the verdicts (the shard's
    /// housekeeping calls it; never a request).
    pub(crate) fn check_predictions(&self) {
        let mut st = self.picking.borrow_mut();
        let Picking {
            kv, predictions, ..
        } = &mut *st;
        if predictions.is_empty() {
            return;
        }
        let oracle = IndexOracle {
            readers: kv,
            signals: &self.signals,
        };
        let now = crate::clock::now();
        // Settle first (index reads), then take the router-wide lock only to count.
        let mut settled: Vec<(Box<str>, Verdict)> = Vec::new();
        predictions.check(now, &oracle, &mut |model, v| {
            settled.push((model.into(), v))
        });
        if !settled.is_empty() {
            self.signals.kv.parity.record_all(|record| {
                for (model, v) in &settled {
                    record(model, *v);
                }
            });
        }
    }

    /// Mark the dispatches recorded for a pinned request finished.
    pub(super) fn finish(&self, dispatched: [Option<DispatchId>; 2]) {
        if dispatched.iter().all(Option::is_none) {
            return;
        }
        let view = self.signals.store.view();
        let now = crate::clock::now();
        let mut st = self.picking.borrow_mut();
        for id in dispatched.into_iter().flatten() {
            st.ledger.finish(&view, id, now);
        }
        if let (Some(peer), Some(shared)) = (&self.peer, &self.signals.peers) {
            let mut batch = [PeerEvent::Finish { seq: 0 }; 2];
            let mut n = 0;
            for (slot, id) in batch.iter_mut().zip(dispatched.into_iter().flatten()) {
                *slot = PeerEvent::Finish { seq: id.seq() };
                n += 1;
            }
            peer.send(shared, batch.get(..n).unwrap_or(&[]));
        }
    }
}

/// The watchdog's oracle on one shard: every shard's index through this shard's readers, and
/// when each rank last sent an event (its shard's republished rows).
struct IndexOracle<'a> {
    readers: &'a [IndexReader],
    signals: &'a Signals,
}

impl Oracle for IndexOracle<'_> {
    fn holds(&self, rank: LoadKey, block: BlockHash) -> bool {
        Merged(self.readers).holds(rank, block)
    }

    fn last_event(&self, rank: LoadKey) -> Option<Instant> {
        self.signals.kv.last_event(rank)
    }
}
