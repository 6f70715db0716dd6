//! Candidates resolved once per fleet view (issue 11, item 7): per model, its namespace runs and
//! every routable rank of its workers in candidate order, so a pick walks small arrays of
//! `(worker index, rank, role)` instead of every worker of the fleet with two string compares
//! each.
//!
//! Role: [`FleetCandidates::build`] runs where a fleet view is published (the snapshot build, on
//! the control thread); a picker reads it through [`super::PickInput::candidates`]. The pickers
//! visit ranks through [`visit_ranks`] and [`visit_namespace_ranks`], which read the table when
//! the input has one for its fleet and fall back to scanning the fleet otherwise: both orders
//! and sets are the same (the differential tests run the pickers both ways).
//! The scan's rules live here too ([`serves`], [`run_end`], [`declared_ranks`],
//! [`MAX_CANDIDATES`]), so the table and the scan cannot drift apart.
//!
//! Invariants:
//! - a model's ranks are its routable workers' declared ranks (PICK-04) in `fleet.workers` order,
//!   then ascending rank, grouped by namespace run, exactly what the scan yields;
//! - a model whose ranks would exceed [`MAX_CANDIDATES`] is not tabulated (its picks scan), so a
//!   fleet-declared `data_parallel_size` can never make the table large;
//! - a table answers only for the fleet view it was built from ([`FleetCandidates::is_for`]): it
//!   keeps a `Weak` of that view's allocation, so a later view can never share its address;
//! - every rank carries the figures a pick reads ([`RankCard`]: instance id, block size,
//!   capacities) and, when the table was built against a load-store generation, the rank's cell
//!   ([`SlotRef`]) as a hint: a read through a hint checks the cell's epoch and falls back to the
//!   key lookup when the cell was reassigned, so a stale hint costs a lookup, never a wrong load.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crate::discovery::{FleetView, InstanceId, Role, Worker};
use crate::load::{LoadKey, LoadView, MAX_LOAD_KEYS, SlotRef};

use super::PickInput;

/// The most candidates one stage considers (the load store holds at most this many keys).
pub const MAX_CANDIDATES: usize = MAX_LOAD_KEYS;

/// The ranks `w` declares, ascending (PICK-04): `dp_start_rank .. dp_start_rank + dp_size`, one
/// rank 0 without a declaration; ranks whose number would overflow `u32` are left out.
pub(super) fn declared_ranks(w: &Worker) -> impl Iterator<Item = u32> {
    let start = w.dp_start_rank.unwrap_or(0);
    let size = w.dp_size.unwrap_or(1).max(1);
    (0..size).map_while(move |k| start.checked_add(k))
}

/// Whether `w` serves `model` and may be routed.
pub(super) fn serves(w: &Worker, model: &str) -> bool {
    w.role.is_routable() && w.model.as_deref() == Some(model)
}

/// The end (exclusive) of the run of workers sharing `workers[start]`'s namespace. Workers are
/// sorted by namespace (`FleetView`), so the run is found by binary search: a pick over a
/// large namespace compares a few names, not one per worker.
pub(super) fn run_end(workers: &[Worker], start: usize) -> usize {
    let Some(first) = workers.get(start) else {
        return start;
    };
    workers.get(start..).map_or(start, |rest| {
        start + rest.partition_point(|w| w.namespace == first.namespace)
    })
}

/// The namespace runs of `input.fleet.workers` in the candidate set (DISC-MULTI-05), in order:
/// `(index of the run's first worker, the run, whether it is a prefill/decode pool for the model,
/// i.e. has both prefill and decode workers serving it)`.
fn candidate_runs<'a>(
    input: &'a PickInput<'_>,
) -> impl Iterator<Item = (usize, &'a [Worker], bool)> + 'a {
    let workers = input.fleet.workers.as_slice();
    let mut start = 0;
    std::iter::from_fn(move || {
        while start < workers.len() {
            let end = run_end(workers, start);
            let run = workers.get(start..end).unwrap_or(&[]);
            let first = start;
            start = end.max(start + 1);
            if run
                .first()
                .is_some_and(|w| input.namespaces.contains_namespace(&w.namespace))
            {
                let (has_prefill, has_decode) = roles_in(run, input.model);
                return Some((first, run, has_prefill && has_decode));
            }
        }
        None
    })
}

/// Which roles serve the model in a namespace run: `(has_prefill, has_decode)`.
fn roles_in(run: &[Worker], model: &str) -> (bool, bool) {
    let mut prefill = false;
    let mut decode = false;
    for w in run.iter().filter(|w| serves(w, model)) {
        prefill |= w.role == Role::Prefill;
        decode |= w.role == Role::Decode;
    }
    (prefill, decode)
}

/// One rank of a model's worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankRef {
    /// Index of the worker in `fleet.workers`.
    pub worker: u32,
    /// The declared rank.
    pub rank: u32,
    /// The worker's role (never `Unknown`: such workers are not routed).
    pub role: Role,
    /// What a pick reads of the worker, copied so that a pick never touches `Worker`.
    pub card: RankCard,
}

impl RankRef {
    /// The rank `rank` of `fleet.workers[worker]`, with no cell hint.
    pub(super) fn of(worker: u32, w: &Worker, rank: u32) -> Self {
        Self {
            worker,
            rank,
            role: w.role,
            card: RankCard {
                instance_id: w.instance_id,
                block_size: w.block_size,
                total_kv_blocks: w.capacity.total_kv_blocks,
                max_num_batched_tokens: w.capacity.max_num_batched_tokens,
                slot: None,
            },
        }
    }

    /// The load-store key of this rank.
    pub fn key(&self) -> LoadKey {
        LoadKey::new(self.card.instance_id, self.rank)
    }
}

/// The figures of a rank's worker a pick reads, and the rank's load-store cell when known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankCard {
    /// The worker's instance id.
    pub instance_id: InstanceId,
    /// `kv_cache_block_size`.
    pub block_size: Option<u32>,
    /// `runtime_config.total_kv_blocks`.
    pub total_kv_blocks: Option<u64>,
    /// `runtime_config.max_num_batched_tokens`.
    pub max_num_batched_tokens: Option<u64>,
    /// The rank's cell in the load-store generation the table was bound to (a hint: module docs).
    pub slot: Option<SlotRef>,
}

/// One namespace run of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Run {
    /// Index in `fleet.workers` of the run's first worker (of any model).
    start: usize,
    /// Whether the namespace has both prefill and decode workers serving the model.
    pool: bool,
    /// The model's ranks in this run.
    ranks: Vec<RankRef>,
}

/// Every model's runs, for one fleet view.
#[derive(Debug, Default)]
pub struct FleetCandidates {
    /// Unique per built table in this process (0: the empty default), so a picker can tell
    /// whether the candidate list it kept came from this very table.
    serial: u64,
    fleet: Weak<FleetView>,
    /// The load-store generation whose cells the ranks carry, if any.
    bound: Option<u64>,
    /// Sorted by model name.
    models: Vec<(Box<str>, Vec<Run>)>,
}

impl FleetCandidates {
    /// The table of `fleet` (O(workers + ranks)), without cell hints.
    pub fn build(fleet: &Arc<FleetView>) -> Self {
        Self::build_with(fleet, None)
    }

    /// The table of `fleet` with every rank's cell in `load`'s generation (O(workers + ranks)
    /// lookups). Build it after the store admitted this fleet's keys.
    pub fn build_bound(fleet: &Arc<FleetView>, load: &LoadView<'_>) -> Self {
        Self::build_with(fleet, Some(load))
    }

    /// This table with every rank's cell hint read from `load`'s generation (O(ranks) lookups).
    pub fn rebound(&self, load: &LoadView<'_>) -> Self {
        let models = self
            .models
            .iter()
            .map(|(name, runs)| {
                let mut runs = runs.clone();
                for r in runs.iter_mut().flat_map(|run| run.ranks.iter_mut()) {
                    r.card.slot = load.slot(r.key()).ok();
                }
                (name.clone(), runs)
            })
            .collect();
        Self {
            serial: next_serial(),
            fleet: self.fleet.clone(),
            bound: Some(load.generation()),
            models,
        }
    }

    /// The load-store generation this table's hints come from (`None`: no hints).
    pub fn bound_to(&self) -> Option<u64> {
        self.bound
    }

    fn build_with(fleet: &Arc<FleetView>, load: Option<&LoadView<'_>>) -> Self {
        let workers = fleet.workers.as_slice();
        // (model, runs, ranks so far); a model past the cap is dropped and remembered in `over`.
        let mut models: Vec<(Box<str>, Vec<Run>, usize)> = Vec::new();
        let mut over: Vec<Box<str>> = Vec::new();
        for (index, w) in workers.iter().enumerate() {
            let Some(model) = w.model.as_deref() else {
                continue;
            };
            let Ok(worker) = u32::try_from(index) else {
                break;
            };
            if !w.role.is_routable() || over.iter().any(|m| **m == *model) {
                continue;
            }
            let at = match models.binary_search_by(|(m, ..)| (**m).cmp(model)) {
                Ok(i) => i,
                Err(i) => {
                    models.insert(i, (model.into(), Vec::new(), 0));
                    i
                }
            };
            let Some((_, runs, total)) = models.get_mut(at) else {
                continue;
            };
            let n = declared_ranks(w).take(MAX_CANDIDATES + 1).count();
            if *total + n > MAX_CANDIDATES {
                // More ranks than a stage may hold: this model's picks scan instead.
                over.push(model.into());
                models.remove(at);
                continue;
            }
            *total += n;
            let same_run = runs.last().is_some_and(|r| {
                workers
                    .get(r.start)
                    .is_some_and(|first| first.namespace == w.namespace)
            });
            if !same_run {
                let start = workers.partition_point(|x| x.namespace < w.namespace);
                runs.push(Run {
                    start,
                    pool: false,
                    ranks: Vec::new(),
                });
            }
            if let Some(run) = runs.last_mut() {
                run.ranks.extend(declared_ranks(w).map(|rank| {
                    let mut r = RankRef::of(worker, w, rank);
                    r.card.slot = load.and_then(|v| v.slot(r.key()).ok());
                    r
                }));
            }
        }
        let models = models
            .into_iter()
            .map(|(name, mut runs, _)| {
                for r in &mut runs {
                    let has = |role| r.ranks.iter().any(|k| k.role == role);
                    r.pool = has(Role::Prefill) && has(Role::Decode);
                }
                (name, runs)
            })
            .collect();
        Self {
            serial: next_serial(),
            fleet: Arc::downgrade(fleet),
            bound: load.map(LoadView::generation),
            models,
        }
    }

    /// This table's serial: distinct for every table built in this process.
    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// Whether this table was built from `fleet`.
    pub fn is_for(&self, fleet: &Arc<FleetView>) -> bool {
        std::ptr::eq(self.fleet.as_ptr(), Arc::as_ptr(fleet))
    }

    fn runs(&self, model: &str) -> Option<&[Run]> {
        self.models
            .binary_search_by(|(m, _)| (**m).cmp(model))
            .ok()
            .and_then(|i| self.models.get(i))
            .map(|(_, runs)| runs.as_slice())
    }
}

/// A serial for a new table (never 0).
fn next_serial() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// For the table's runs of `input.model`, in order, whether each run's namespace is a candidate
/// namespace of `input`: with the table and the model, what decides [`visit_ranks`]' ranks.
/// `None` without a table for the model (the pick scans the fleet).
fn included_runs<'a>(
    input: &'a PickInput<'_>,
) -> Option<(&'a FleetCandidates, impl Iterator<Item = bool> + Clone + 'a)> {
    let table = input.candidates?;
    let runs = table.runs(input.model)?;
    let workers = input.fleet.workers.as_slice();
    let included = runs.iter().map(move |run| {
        let ns = workers.get(run.start).map_or("", |w| w.namespace.as_str());
        input.namespaces.contains_namespace(ns)
    });
    Some((table, included))
}

/// Which ranks a kept candidate list holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scope {
    /// The stage's ranks across the candidate namespaces ([`visit_ranks`] with the list's own
    /// role predicate).
    Candidates,
    /// The `role` workers of the namespace run starting at `start` ([`visit_namespace_ranks`]).
    Namespace { start: usize, role: Role },
}

/// What a picker's kept candidate list was built from (a stage list of one scratch; each list
/// always uses one role predicate): a pick whose table, model and candidate namespaces (or
/// namespace run and role) are the same reuses the list instead of walking the table again.
#[derive(Debug, Default)]
pub(super) struct ListId {
    /// The table serial and scope of the last build from a table (`None`: rebuild).
    built: Option<(u64, Scope)>,
    /// The model of the last build.
    model: String,
    /// With [`Scope::Candidates`]: per run of the model, whether it was a candidate namespace.
    included: Vec<bool>,
}

impl ListId {
    /// Whether the list built last holds `scope`'s ranks for `input`. When not, records
    /// `input` and `scope` as what the caller now builds (the caller must rebuild the list).
    /// Without a table for the model it answers `false` and records nothing (a scan is not
    /// kept). Allocates only when the model name or the number of runs grows.
    pub(super) fn holds(&mut self, input: &PickInput<'_>, scope: Scope) -> bool {
        let Some((table, included)) = included_runs(input) else {
            self.built = None;
            return false;
        };
        let id = (table.serial(), scope);
        let mut same = self.built == Some(id) && self.model == input.model;
        if scope == Scope::Candidates && !self.included.iter().copied().eq(included.clone()) {
            same = false;
            self.included.clear();
            self.included.extend(included);
        }
        if same {
            return true;
        }
        self.built = Some(id);
        if self.model != input.model {
            self.model.clear();
            self.model.push_str(input.model);
        }
        false
    }
}

/// Calls `f(rank, pool)` for every rank of `input.model`'s routable workers in the candidate
/// namespaces whose role `wants(role, pool)`, in candidate order (`pool`: the rank's namespace
/// has both prefill and decode workers for the model), until `f` breaks. A worker whose role is
/// not wanted is skipped whole: its declared ranks (fleet-chosen, up to 2^32) are never listed.
pub(super) fn visit_ranks(
    input: &PickInput<'_>,
    wants: &dyn Fn(Role, bool) -> bool,
    f: &mut dyn FnMut(RankRef, bool) -> ControlFlow<()>,
) {
    let workers = input.fleet.workers.as_slice();
    if let Some(runs) = input.candidates.and_then(|c| c.runs(input.model)) {
        for run in runs {
            let ns = workers.get(run.start).map_or("", |w| w.namespace.as_str());
            if !input.namespaces.contains_namespace(ns) {
                continue;
            }
            for &r in &run.ranks {
                if wants(r.role, run.pool) && f(r, run.pool).is_break() {
                    return;
                }
            }
        }
        return;
    }
    for (start, run, pool) in candidate_runs(input) {
        let mut each = |r| f(r, pool);
        if scan_run(
            run,
            start,
            input.model,
            &|role| wants(role, pool),
            &mut each,
        )
        .is_break()
        {
            return;
        }
    }
}

/// The scan: `f(rank)` for every rank of `model`'s routable workers in `run` (whose first worker
/// is `fleet.workers[start]`) whose role `wants`, in order, until `f` breaks.
fn scan_run(
    run: &[Worker],
    start: usize,
    model: &str,
    wants: &dyn Fn(Role) -> bool,
    f: &mut dyn FnMut(RankRef) -> ControlFlow<()>,
) -> ControlFlow<()> {
    for (offset, w) in run.iter().enumerate() {
        if !serves(w, model) || !wants(w.role) {
            continue;
        }
        let Ok(worker) = u32::try_from(start + offset) else {
            return ControlFlow::Break(());
        };
        for rank in declared_ranks(w) {
            f(RankRef::of(worker, w, rank))?;
        }
    }
    ControlFlow::Continue(())
}

/// Calls `f(rank)` for every rank of `input.model`'s `role` workers in the namespace run
/// starting at `ns_start` (whatever the candidate namespaces), in order, until `f` breaks.
pub(super) fn visit_namespace_ranks(
    input: &PickInput<'_>,
    ns_start: usize,
    role: Role,
    f: &mut dyn FnMut(RankRef) -> ControlFlow<()>,
) {
    let workers = input.fleet.workers.as_slice();
    if let Some(runs) = input.candidates.and_then(|c| c.runs(input.model)) {
        if let Ok(i) = runs.binary_search_by_key(&ns_start, |r| r.start)
            && let Some(run) = runs.get(i)
        {
            for &r in &run.ranks {
                if r.role == role && f(r).is_break() {
                    return;
                }
            }
        }
        return;
    }
    let ns_end = run_end(workers, ns_start);
    let run = workers.get(ns_start..ns_end).unwrap_or(&[]);
    let _ = scan_run(run, ns_start, input.model, &|r| r == role, f);
}

#[cfg(test)]
#[path = "candidates_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "candidates_bound_tests.rs"]
mod bound_tests;
