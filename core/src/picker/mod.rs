//! The worker picker: chooses the decode `(instance, dp_rank)` and, for a disaggregated pair, the
//! prefill `(instance, dp_rank)` of one request (SHIM-06/07, PICK-01..14, DISC-MULTI-05..07).
//!
//! Role: a pure function of the published [`FleetView`], the load store's read side (through a
//! [`LoadSource`], normally [`StoreLoads`] over a [`LoadView`] and an [`InflightReader`]), the
//! client model (already mapped through `shim.model_map` by the caller), the namespaces that still
//! have usable shim replicas ([`NamespaceSet`], DISC-MULTI-05), the estimated prompt size
//! ([`estimate_prompt_tokens`], PICK-02), `now`, `max_staleness` and the caller's shard-local
//! per-stage round-robin cursors ([`PickerCursors`]). It returns a [`Pick`] or [`NoWorker`] (the
//! caller then falls through to plain disaggregated or unified routing, SHIM-08) and the
//! selection events the caller counts in `continuum_dynamo_selection_total{role, reason}`
//! ([`SelectionEvent`], OBS-05); nothing is counted here.
//!
//! [`WorkerPicker`] is the replaceable interface (PICK-17); [`LoadBasedPicker`] is the default
//! load-only implementation; [`KvAwarePicker`] (`kv_aware`, KV-PICK-01..09) scores the ranks that
//! prefill with Dynamo's KV-overlap cost and falls back to the load-only rules without prompt
//! blocks.
//!
//! Invariants:
//! - deterministic: no clock reads and no OS randomness; the same inputs, cursors (and, for the
//!   KV-aware picker at a positive temperature, the same injected [`UnitSource`] draws) give the
//!   same pick and the same cursor advance (one step per stage that selects);
//! - `unknown` workers, workers of other models and workers of namespaces outside the
//!   [`NamespaceSet`] are never candidates;
//! - a prefill worker is only ever paired with a **decode** worker of the **same** namespace; an
//!   aggregated decode pick never carries a prefill (PICK-11, DISC-MULTI-06);
//! - a rank header is present exactly when the worker's card declares `data_parallel_size`,
//!   rank 0 included (SHIM-12);
//! - a successful pick yields exactly two selection events: one `decode` and one `prefill`
//!   (`load`, `round_robin_stale` or `no_prefill_pool`).
//!
//! Cost: with the fleet's [`FleetCandidates`] (built once per fleet view), one pass over the
//! model's ranks in the candidate namespaces; without it, one pass over `fleet.workers` (two over
//! each candidate namespace's run). Then one load-store read per candidate `(worker, rank)` (a
//! hashed key lookup, a seqlock read plus one per shard's in-flight table), then
//! [`crate::load::rules::select`]; O(candidate ranks) with the table. It allocates nothing once the
//! caller-owned [`PickScratch`] has grown to the largest candidate set seen.

mod candidates;
mod estimate;
mod kv_aware;
mod kv_conditional;
mod kv_cost;
mod lanes;
mod load_based;
mod positions;
mod rank_index;

#[cfg(test)]
mod diff_support;
#[cfg(test)]
mod diff_tests;
#[cfg(test)]
mod kept_lists_tests;
#[cfg(test)]
mod kv_aware_tests;
#[cfg(test)]
mod kv_conditional_tests;
#[cfg(test)]
mod kv_cost_tests;
#[cfg(test)]
mod kv_diff_tests;
#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod tests;

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use crate::clock::Instant;
use crate::discovery::{FleetView, InstanceId};
use crate::headers::PinHeaders;
use crate::load::rules::{KeyLoad, SelectReason};
use crate::load::{InflightReader, LoadDigest, LoadKey, LoadMemo, LoadView, ProbeSet, SlotRef};

pub use crate::rng::{SplitMix64, UnitSource};
pub use candidates::{FleetCandidates, MAX_CANDIDATES, RankCard, RankRef};
pub use estimate::{PromptTokens, estimate_prompt_tokens};
pub use kv_aware::{KvAwarePicker, KvScratch, KvStatus, ScoredCandidate, score_candidates};
pub use kv_conditional::{
    BypassDecision, ConditionalDisagg, DecodeRank, EFF_ISL_RATIO_THRESHOLD, EFF_ISL_THRESHOLD,
    conditional_decode_cost, decide_bypass,
};
pub use kv_cost::{
    KvParams, KvRequest, KvTerms, decode_cost_blocks, kv_cost, softmax_sample_index,
};
pub use load_based::{LoadBasedPicker, PickScratch, pick_load_based};
pub use positions::{PartPositions, Positions, RankPositions};

/// Where a picker reads each candidate's load: the store's sample and the in-flight additions.
pub trait LoadSource {
    /// What is known about `key` at `now` (see [`KeyLoad::assess`]).
    fn key_load(&self, key: LoadKey, now: Instant) -> KeyLoad;

    /// The same through a cell hint ([`RankCard::slot`]); the default ignores the hint.
    fn rank_load(&self, key: LoadKey, hint: Option<SlotRef>, now: Instant) -> KeyLoad {
        let _ = hint;
        self.key_load(key, now)
    }

    /// Brings the answers of `set` up to date for `now` and returns them in probe order: each
    /// the digest of its [`LoadSource::rank_load`] at `now` (one call per stage of a pick; the
    /// default reads every load).
    fn read_digests<'s>(&self, set: &'s mut ProbeSet, now: Instant) -> &'s [LoadDigest] {
        set.fill(|p| LoadDigest::of(&self.rank_load(p.key, p.hint, now)))
    }
}

/// The production [`LoadSource`]: a store view and every shard's in-flight tables, optionally
/// through the shard's [`LoadMemo`] (a pick then reads only the cells that changed since the
/// shard's last pick; `crate::load` has the memo's invariants).
#[derive(Clone, Copy)]
pub struct StoreLoads<'a, 'v, 't> {
    view: &'a LoadView<'v>,
    inflight: &'a InflightReader<'t>,
    memo: Option<&'a RefCell<LoadMemo>>,
}

impl<'a, 'v, 't> StoreLoads<'a, 'v, 't> {
    /// Reads through `view` and `inflight` (take one [`LoadView`] per pick).
    pub fn new(view: &'a LoadView<'v>, inflight: &'a InflightReader<'t>) -> Self {
        Self {
            view,
            inflight,
            memo: None,
        }
    }

    /// [`StoreLoads::new`] through `memo` (the calling shard's own).
    pub fn memoised(
        view: &'a LoadView<'v>,
        inflight: &'a InflightReader<'t>,
        memo: &'a RefCell<LoadMemo>,
    ) -> Self {
        Self {
            view,
            inflight,
            memo: Some(memo),
        }
    }

    fn through_memo(&self, slot: SlotRef, now: Instant) -> Option<KeyLoad> {
        let mut memo = self.memo?.try_borrow_mut().ok()?;
        memo.load(self.view, self.inflight, slot, now)
    }
}

impl fmt::Debug for StoreLoads<'_, '_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreLoads").finish_non_exhaustive()
    }
}

impl LoadSource for StoreLoads<'_, '_, '_> {
    fn key_load(&self, key: LoadKey, now: Instant) -> KeyLoad {
        if self.memo.is_some()
            && let Ok(slot) = self.view.slot(key)
            && let Some(load) = self.through_memo(slot, now)
        {
            return load;
        }
        KeyLoad::assess(self.view, self.inflight, key, now)
    }

    fn rank_load(&self, key: LoadKey, hint: Option<SlotRef>, now: Instant) -> KeyLoad {
        if let Some(slot) = hint
            && let Some(load) = self.through_memo(slot, now)
        {
            return load;
        }
        if self.memo.is_some() {
            return self.key_load(key, now);
        }
        KeyLoad::assess_hinted(self.view, self.inflight, key, hint, now)
    }

    fn read_digests<'s>(&self, set: &'s mut ProbeSet, now: Instant) -> &'s [LoadDigest] {
        match self.memo.and_then(|m| m.try_borrow_mut().ok()) {
            Some(mut memo) => memo.refresh(self.view, self.inflight, set, now),
            None => set.fill(|p| LoadDigest::of(&self.rank_load(p.key, p.hint, now))),
        }
    }
}

/// The namespaces that still have a usable shim replica after visibility filtering and per-key
/// policy (DISC-MULTI-05). Only their workers are candidates.
pub trait NamespaceSet {
    /// Whether `namespace` is a candidate namespace.
    fn contains_namespace(&self, namespace: &str) -> bool;
}

macro_rules! namespace_set_for {
    ($($t:ty),*) => {$(
        impl NamespaceSet for $t {
            fn contains_namespace(&self, namespace: &str) -> bool {
                self.iter().any(|n| AsRef::<str>::as_ref(n) == namespace)
            }
        }
    )*};
}

namespace_set_for!(
    &[&str],
    &[String],
    &[Arc<str>],
    Vec<&str>,
    Vec<String>,
    Vec<Arc<str>>
);

impl<const N: usize> NamespaceSet for [&str; N] {
    fn contains_namespace(&self, namespace: &str) -> bool {
        self.contains(&namespace)
    }
}

/// Every input of one pick except the cursors and the scratch space.
#[derive(Clone, Copy)]
pub struct PickInput<'a> {
    /// The published fleet view.
    pub fleet: &'a FleetView,
    /// Load samples and in-flight additions.
    pub loads: &'a dyn LoadSource,
    /// The Dynamo model name (the client model mapped through `shim.model_map`).
    pub model: &'a str,
    /// The candidate namespaces (DISC-MULTI-05).
    pub namespaces: &'a dyn NamespaceSet,
    /// The request's estimated prompt size (PICK-02).
    pub prompt_tokens: PromptTokens,
    /// The pick time (injected; never read from a clock here).
    pub now: Instant,
    /// `dynamo.load.max_staleness`.
    pub max_staleness: Duration,
    /// The request's prompt block hashes, one entry per block size among the candidates
    /// (empty until the prompt pipeline computes them; a load-only picker ignores them).
    pub prompt_blocks: &'a [PromptBlocks<'a>],
    /// Where the per-rank KV overlap of those blocks is read (every shard's index, merged).
    pub overlap: &'a dyn OverlapSource,
    /// The candidate table built from this very `fleet` (`None`: the picker scans the fleet's
    /// workers; both give the same candidates, the table without touching every worker).
    pub candidates: Option<&'a FleetCandidates>,
}

/// The hash of one KV block along its prefix path (Dynamo's sequence hash of the block's
/// tokens, chained to its parent's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u64);

/// A request's prompt, cut into blocks of one size, as the hashes of its block prefixes.
#[derive(Debug, Clone, Copy)]
pub struct PromptBlocks<'a> {
    /// The block size in tokens (`kv_cache_block_size` of the workers it applies to).
    pub block_size: u32,
    /// The hashes of the prompt's full blocks, from the first.
    pub hashes: &'a [BlockHash],
}

/// Per-rank KV overlap: how many contiguous prefix blocks of a prompt each `(worker, dp_rank)`
/// already holds (KV-IDX `find_matches`). Implemented over every shard's KV index.
pub trait OverlapSource {
    /// Calls `visit(key, blocks)` once for every rank holding at least the prompt's first block.
    fn find_matches(&self, prompt: PromptBlocks<'_>, visit: &mut dyn FnMut(LoadKey, u32));

    /// [`OverlapSource::find_matches`] for the ranks that are candidates in `positions`, each
    /// reported as its first position there: `visit(position, blocks)`. `cache` keeps what the
    /// source needs to map its own rank numbering to positions across calls (the default looks
    /// every reported key up and keeps nothing).
    fn find_positions(
        &self,
        prompt: PromptBlocks<'_>,
        positions: &dyn Positions,
        cache: &mut RankPositions,
        visit: &mut dyn FnMut(u32, u32),
    ) {
        let _ = cache;
        self.find_matches(prompt, &mut |key, blocks| {
            if let Some(p) = positions.first(key) {
                visit(p, blocks);
            }
        });
    }

    /// The reports of [`OverlapSource::find_positions`] written into `best`: `best[position]`
    /// raised to at least `blocks` for each (positions beyond `best` are ignored). A source may
    /// write them without a call per rank.
    fn fill_positions(
        &self,
        prompt: PromptBlocks<'_>,
        positions: &dyn Positions,
        cache: &mut RankPositions,
        best: &mut [u32],
    ) {
        self.find_positions(prompt, positions, cache, &mut |p, blocks| {
            if let Some(b) = best.get_mut(p as usize) {
                *b = (*b).max(blocks);
            }
        });
    }
}

/// No KV index: no rank holds anything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoOverlap;

impl OverlapSource for NoOverlap {
    fn find_matches(&self, _prompt: PromptBlocks<'_>, _visit: &mut dyn FnMut(LoadKey, u32)) {}
}

impl fmt::Debug for PickInput<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PickInput")
            .field("workers", &self.fleet.workers.len())
            .field("model", &self.model)
            .field("prompt_tokens", &self.prompt_tokens)
            .field("now", &self.now)
            .field("max_staleness", &self.max_staleness)
            .field("prompt_blocks", &self.prompt_blocks.len())
            .finish_non_exhaustive()
    }
}

/// The caller-owned, shard-local per-stage round-robin cursors (PICK-06/07). Each stage's cursor
/// advances by one per selection of that stage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PickerCursors {
    /// The decode stage's cursor (decode and aggregated candidates).
    pub decode: u64,
    /// The prefill stage's cursor.
    pub prefill: u64,
}

/// The `role` label of `continuum_dynamo_selection_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SelectionRole {
    /// The prefill stage.
    Prefill,
    /// The decode stage (decode or aggregated worker).
    Decode,
}

impl SelectionRole {
    /// The `role` label.
    pub const fn label(self) -> &'static str {
        match self {
            SelectionRole::Prefill => "prefill",
            SelectionRole::Decode => "decode",
        }
    }
}

/// The `reason` label of `continuum_dynamo_selection_total` the pickers produce (the closed
/// OBS-05 set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SelectionReason {
    /// Lowest defined cost (PICK-06).
    Load,
    /// Round-robin over all candidates (PICK-07, LOAD-STORE-09).
    RoundRobinStale,
    /// No prefill worker was chosen: the decode side is aggregated (PICK-14), or its namespace
    /// has no prefill worker for the model (SHIM-07).
    NoPrefillPool,
    /// Chosen by the KV-overlap cost (KV-PICK-01..03, KV-PICK-09).
    KvAware,
    /// Conditional disaggregation: the chosen decode worker prefills locally, no prefill worker
    /// is pinned (KV-PICK-12..14).
    ConditionalBypass,
}

impl SelectionReason {
    /// The `reason` label.
    pub const fn label(self) -> &'static str {
        match self {
            SelectionReason::Load => "load",
            SelectionReason::RoundRobinStale => "round_robin_stale",
            SelectionReason::NoPrefillPool => "no_prefill_pool",
            SelectionReason::KvAware => "kv_aware",
            SelectionReason::ConditionalBypass => "conditional_bypass",
        }
    }
}

impl From<SelectReason> for SelectionReason {
    fn from(r: SelectReason) -> Self {
        match r {
            SelectReason::Load => SelectionReason::Load,
            SelectReason::RoundRobinStale => SelectionReason::RoundRobinStale,
        }
    }
}

/// One increment of `continuum_dynamo_selection_total{role, reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SelectionEvent {
    /// `role`.
    pub role: SelectionRole,
    /// `reason`.
    pub reason: SelectionReason,
}

/// One chosen `(instance, dp_rank)` and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chosen {
    /// The worker's instance id.
    pub instance_id: InstanceId,
    /// The data-parallel rank (0 when the card declares none).
    pub dp_rank: u32,
    /// Why it was chosen.
    pub reason: SelectionReason,
}

/// The rank headers to send: present exactly when the worker's card declares
/// `data_parallel_size`, rank 0 included (SHIM-12).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DpRankHeaders {
    /// `x-dynamo-dp-rank`.
    pub decode_rank: Option<u32>,
    /// `x-dynamo-prefill-dp-rank`.
    pub prefill_rank: Option<u32>,
}

/// The KV outcome of a pick the KV-overlap cost decided, for
/// `continuum_dynamo_kv_selection_total{result}` (KV-PICK-09: `overlap` when `overlap_blocks > 0`,
/// else `no_overlap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvOutcome {
    /// Contiguous prompt-prefix blocks the rank that prefills already holds.
    pub overlap_blocks: u32,
    /// That rank's block size in tokens (0 when its card declares none).
    pub block_size: u32,
}

/// A successful pick; the namespace is borrowed from the fleet view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick<'f> {
    /// The namespace of the decode worker and, if any, of the prefill worker (DISC-MULTI-06).
    pub namespace: &'f str,
    /// The decode (or aggregated) worker.
    pub decode: Chosen,
    /// The prefill worker of a disaggregated pair; `None` is the aggregated fallback (SHIM-07).
    pub prefill: Option<Chosen>,
    /// The rank headers.
    pub dp_rank_headers: DpRankHeaders,
    /// The KV outcome of the rank that prefills (the prefill worker of a pair, else the decode
    /// worker), when the KV-overlap cost decided the pick; `None` for a load-only pick.
    pub kv: Option<KvOutcome>,
}

impl Pick<'_> {
    /// The two selection events to count: decode, then prefill (`no_prefill_pool` without one;
    /// `conditional_bypass` for both roles when the decode worker prefills locally, KV-PICK-14).
    pub fn events(&self) -> [SelectionEvent; 2] {
        let no_prefill = if self.decode.reason == SelectionReason::ConditionalBypass {
            SelectionReason::ConditionalBypass
        } else {
            SelectionReason::NoPrefillPool
        };
        [
            SelectionEvent {
                role: SelectionRole::Decode,
                reason: self.decode.reason,
            },
            SelectionEvent {
                role: SelectionRole::Prefill,
                reason: self.prefill.map_or(no_prefill, |p| p.reason),
            },
        ]
    }

    /// Whether conditional disaggregation decided that the decode worker prefills locally
    /// (KV-PICK-12..14): only the decode worker is pinned.
    pub fn is_conditional_bypass(&self) -> bool {
        self.prefill.is_none() && self.decode.reason == SelectionReason::ConditionalBypass
    }

    /// The pin headers to write on the shim request (SHIM-11/12).
    pub fn pin_headers(&self) -> PinHeaders {
        PinHeaders {
            worker: self.decode.instance_id.get(),
            worker_rank: self.dp_rank_headers.decode_rank,
            prefill: self.prefill.map(|p| p.instance_id.get()),
            prefill_rank: self.dp_rank_headers.prefill_rank,
        }
    }
}

/// No routable decode or aggregated worker serves the model in any candidate namespace: the
/// caller falls through (SHIM-08). Nothing is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("no worker serves the model in any candidate namespace")]
pub struct NoWorker;

/// The most candidates one pick returns ([`Picks`]).
pub const MAX_PICKS: usize = 4;

/// A pick's ordered candidates, best first: the caller dispatches to the first and falls back
/// to the next (pingora's selection contract). Fixed capacity, on the stack: filling it never
/// allocates. The caller says how many it wants ([`Picks::new`]); a picker returns at most that
/// many, and at least one whenever it returns `Ok`.
#[derive(Debug, Clone, Copy)]
pub struct Picks<'f> {
    items: [Option<Pick<'f>>; MAX_PICKS],
    len: usize,
    limit: usize,
}

impl<'f> Picks<'f> {
    /// An empty list that accepts up to `want` candidates (clamped to `1..=MAX_PICKS`).
    pub fn new(want: usize) -> Self {
        Self {
            items: [None; MAX_PICKS],
            len: 0,
            limit: want.clamp(1, MAX_PICKS),
        }
    }

    /// How many candidates the caller wants.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Whether another candidate is wanted.
    pub fn wants_more(&self) -> bool {
        self.len < self.limit
    }

    /// Append `pick` after the ones already there; ignored once [`Self::limit`] is reached.
    pub fn push(&mut self, pick: Pick<'f>) {
        if self.len < self.limit {
            self.items[self.len] = Some(pick);
            self.len += 1;
        }
    }

    /// Forget every candidate (the limit stays).
    pub fn clear(&mut self) {
        self.items = [None; MAX_PICKS];
        self.len = 0;
    }

    /// The best candidate.
    pub fn first(&self) -> Option<&Pick<'f>> {
        self.items[0].as_ref()
    }

    /// The candidates, best first.
    pub fn iter(&self) -> impl Iterator<Item = &Pick<'f>> {
        self.items.iter().take(self.len).flatten()
    }

    /// How many candidates there are.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A replaceable worker picker (PICK-17, API-06). Each shard owns one instance (built on its
/// thread by a factory, rebuilt when the active picker is replaced at run time), so a picker
/// keeps its own cursors and scratch space in `self`: nothing in this trait names a particular
/// picker's types.
pub trait WorkerPicker: fmt::Debug {
    /// The picker's name (logs, the admin view).
    fn name(&self) -> &'static str;

    /// Picks for one request: fills `out` (cleared first) with up to `out.limit()` ordered
    /// candidates, best first. `Ok` means at least one candidate.
    fn pick<'f>(&mut self, input: &PickInput<'f>, out: &mut Picks<'f>) -> Result<(), NoWorker>;

    /// A copy that makes the pick this picker would make next: the same parameters and cursor
    /// positions, fresh scratch space and, for a sampling picker, its own fixed sample source
    /// (so a positive-temperature preview is one representative draw). A dry run (`POST
    /// /admin/dynamo/explain`) picks on the copy and leaves `self` untouched. `None`: this
    /// picker cannot be previewed.
    fn preview(&self) -> Option<Box<dyn WorkerPicker>> {
        None
    }
}
