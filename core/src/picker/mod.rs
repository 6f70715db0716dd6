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
//! load-only implementation. A KV-aware picker implements the same trait.
//!
//! Invariants:
//! - deterministic: no clock reads, no randomness; the same inputs and cursors give the same pick
//!   and the same cursor advance (one step per stage that selects);
//! - `unknown` workers, workers of other models and workers of namespaces outside the
//!   [`NamespaceSet`] are never candidates;
//! - a prefill worker is only ever paired with a **decode** worker of the **same** namespace; an
//!   aggregated decode pick never carries a prefill (PICK-11, DISC-MULTI-06);
//! - a rank header is present exactly when the worker's card declares `data_parallel_size`,
//!   rank 0 included (SHIM-12);
//! - a successful pick yields exactly two selection events: one `decode` and one `prefill`
//!   (`load`, `round_robin_stale` or `no_prefill_pool`).
//!
//! Cost: one pass over `fleet.workers` (two over each candidate namespace's run), one load-store
//! read per candidate `(worker, rank)` (a seqlock read plus one per shard's in-flight table), then
//! [`crate::load::rules::select`]; O(workers + candidate ranks). It allocates nothing once the
//! caller-owned [`PickScratch`] has grown to the largest candidate set seen.

mod estimate;
mod load_based;

#[cfg(test)]
mod diff_tests;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use crate::clock::Instant;
use crate::discovery::{FleetView, InstanceId};
use crate::headers::PinHeaders;
use crate::load::rules::{KeyLoad, SelectReason};
use crate::load::{InflightReader, LoadKey, LoadView};

pub use estimate::{PromptTokens, estimate_prompt_tokens};
pub use load_based::{LoadBasedPicker, MAX_CANDIDATES, PickScratch};

/// Where a picker reads each candidate's load: the store's sample and the in-flight additions.
pub trait LoadSource {
    /// What is known about `key` at `now` (see [`KeyLoad::assess`]).
    fn key_load(&self, key: LoadKey, now: Instant) -> KeyLoad;
}

/// The production [`LoadSource`]: a store view and every shard's in-flight tables.
#[derive(Clone, Copy)]
pub struct StoreLoads<'a, 'v, 't> {
    view: &'a LoadView<'v>,
    inflight: &'a InflightReader<'t>,
}

impl<'a, 'v, 't> StoreLoads<'a, 'v, 't> {
    /// Reads through `view` and `inflight` (take one [`LoadView`] per pick).
    pub fn new(view: &'a LoadView<'v>, inflight: &'a InflightReader<'t>) -> Self {
        Self { view, inflight }
    }
}

impl fmt::Debug for StoreLoads<'_, '_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreLoads").finish_non_exhaustive()
    }
}

impl LoadSource for StoreLoads<'_, '_, '_> {
    fn key_load(&self, key: LoadKey, now: Instant) -> KeyLoad {
        KeyLoad::assess(self.view, self.inflight, key, now)
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
}

impl fmt::Debug for PickInput<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PickInput")
            .field("workers", &self.fleet.workers.len())
            .field("model", &self.model)
            .field("prompt_tokens", &self.prompt_tokens)
            .field("now", &self.now)
            .field("max_staleness", &self.max_staleness)
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

/// The `reason` label of `continuum_dynamo_selection_total` this picker produces (a subset of the
/// closed OBS-05 set; `kv_aware` and `conditional_bypass` belong to the KV-aware picker).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SelectionReason {
    /// Lowest defined cost (PICK-06).
    Load,
    /// Round-robin over all candidates (PICK-07, LOAD-STORE-09).
    RoundRobinStale,
    /// No prefill worker was chosen: the decode side is aggregated (PICK-14), or its namespace
    /// has no prefill worker for the model (SHIM-07).
    NoPrefillPool,
}

impl SelectionReason {
    /// The `reason` label.
    pub const fn label(self) -> &'static str {
        match self {
            SelectionReason::Load => "load",
            SelectionReason::RoundRobinStale => "round_robin_stale",
            SelectionReason::NoPrefillPool => "no_prefill_pool",
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
}

impl Pick<'_> {
    /// The two selection events to count: decode, then prefill (`no_prefill_pool` without one).
    pub fn events(&self) -> [SelectionEvent; 2] {
        [
            SelectionEvent {
                role: SelectionRole::Decode,
                reason: self.decode.reason,
            },
            SelectionEvent {
                role: SelectionRole::Prefill,
                reason: self
                    .prefill
                    .map_or(SelectionReason::NoPrefillPool, |p| p.reason),
            },
        ]
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

/// A replaceable worker picker (PICK-17): the registry holds one behind this trait so that a
/// KV-aware picker can replace [`LoadBasedPicker`] without changes to its callers.
pub trait WorkerPicker: Send + Sync + fmt::Debug {
    /// Picks for one request. `cursors` and `scratch` are the calling shard's own.
    fn pick<'f>(
        &self,
        input: &PickInput<'f>,
        cursors: &mut PickerCursors,
        scratch: &mut PickScratch,
    ) -> Result<Pick<'f>, NoWorker>;
}
