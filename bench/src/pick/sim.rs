//! One simulated shard of `pick` and the fleet's load around it.
//!
//! Role: owns a real [`LoadStore`] whose live set is the fleet's, two simulated shards'
//! [`DispatchLedger`]s (this shard's and the other's, whose [`InflightTable`]s every pick reads)
//! and the shard-local picker state, and runs one operation at a time ([`Sim::op`]): the `rr`
//! baseline, the production pick path, or one of three diagnostics ([`Kind`]). Between timed
//! batches the caller lets the fleet publish ([`Sim::advance`]): each `(worker, rank)` gets a
//! fresh sample with new pseudo-random loads every `ROUND_EVERY` operations, the keys in turn
//! (staggered, as independent workers publish: about `keys / ROUND_EVERY` per operation), and
//! the other shard dispatches to a random key after every fourth sample; both shards finish
//! each dispatch [`REQUEST_OPS`] operations after making it. A shard of [`Activity::Burst`]
//! instead lets every key publish at once before each operation, so that each pick reads
//! every candidate's cells again (the worst case, its own diagnostic row). The pick reads loads
//! through the shard's `LoadMemo`, as the shards do.
//!
//! Invariants: time is simulated (the core clock's [`Instant`], `STEP` per operation), so every
//! sample is fresh and no dispatch expires or stalls; the sequence of picks is deterministic for a
//! given operation order; nothing in [`Sim::op`] is timed by this module.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use continuum_core::clock::Instant;
use continuum_core::discovery::{FleetView, InstanceId, PublisherId};
use continuum_core::headers::PinHeaders;
use continuum_core::kv::budget::Budget;
use continuum_core::kv::index::{IndexWriter, new_index};
use continuum_core::kv::shared::{IndexReader, Merged};
use continuum_core::kv::{EngineHash, StoredBlock, TokensHash, path_hash};
use continuum_core::load::{
    ApplyOutcome, DEFAULT_MAX_STALENESS, DispatchId, DispatchLedger, DispatchLoad, DispatchRole,
    InflightReader, InflightTable, LiveSet, LoadKey, LoadMemo, LoadStore, LoadView, Sample,
};
use continuum_core::picker::{
    BlockHash, FleetCandidates, KvAwarePicker, KvParams, LoadBasedPicker, NoOverlap, PickInput,
    Picks, PromptBlocks, PromptTokens, SelectionReason, SplitMix64, StoreLoads, WorkerPicker,
    estimate_prompt_tokens,
};

use super::PickError;
use super::fleet::{
    AGG_MODEL, BLOCK_SIZE, MAX_BATCHED_TOKENS, NAMESPACE, PD_MODEL, TOTAL_KV_BLOCKS,
};
use crate::alloc::thread_allocations;

/// Simulated time per operation (a shard picking 10,000 times a second).
pub(crate) const STEP: Duration = Duration::from_micros(100);
/// Operations between two samples of one key (20 ms of simulated time).
pub(crate) const ROUND_EVERY: u64 = 200;

/// How the simulated fleet publishes its samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activity {
    /// Each key every [`ROUND_EVERY`] operations, the keys in turn.
    Staggered,
    /// Every key at once before each operation.
    Burst,
}
/// Prompt tokens of each of the other shard's dispatches.
const OTHER_SHARD_PROMPT: u64 = 512;
/// Operations a request stays in flight before its dispatch finishes (100 ms of simulated
/// time): both shards finish their dispatches, as real shards do when responses end, so the
/// ledgers hold a steady number of records instead of growing for the 30 s expiry.
pub(crate) const REQUEST_OPS: u64 = 1_000;

/// What one operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Baseline: next worker of `fleet.workers` in turn, plus the same pin-header rendering.
    Rr,
    /// The production pick path for the aggregated model.
    PickAgg,
    /// The production pick path for the prefill/decode model.
    PickPd,
    /// Diagnostic: `estimate_prompt_tokens` over the chat body alone.
    Estimate,
    /// Diagnostic: `DispatchLedger::refresh` (documented as "call before each pick"), then the
    /// prefill/decode pick path. Run on a `Sim` of its own: refreshing empties the ledger, which
    /// would change what the other rows' dispatches do.
    RefreshPickPd,
    /// The production KV-aware pick for the aggregated model: a [`PROMPT_BLOCKS`]-block prompt
    /// matched against two shards' KV indexes (every rank holding a prefix of it), then the KV
    /// cost (tokenization excluded: the hashes are given).
    PickKvAgg,
    /// Diagnostic: the aggregated pick right after every key published (run on a shard of
    /// [`Activity::Burst`]).
    BurstPickAgg,
    /// Reference for the tails: the same work every time, [`FixedWork::steps`] dependent loads
    /// around one cycle through a [`CHASE_BYTES`] table (memory like a pick's, in the caches
    /// like a pick's), so its p99 over its p50 is what the machine alone adds to the tail of an
    /// operation that long (interrupts, the hypervisor, cache shared with other tenants: the
    /// longer the operation, the likelier one of them lands in it).
    Fixed(FixedWork),
}

/// The two lengths of [`Kind::Fixed`]: about a load-only pick's and a KV pick's p50.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FixedWork {
    /// 2,048 steps.
    Short,
    /// 6,144 steps.
    Long,
}

impl FixedWork {
    const fn steps(self) -> u32 {
        match self {
            FixedWork::Short => 2_048,
            FixedWork::Long => 6_144,
        }
    }
}

/// Size of the [`Kind::Fixed`] table (a pick's working set at 1,000 workers is of this order).
const CHASE_BYTES: usize = 128 * 1024;

/// One cycle through every entry of a [`CHASE_BYTES`] table in a pseudo-random order (Sattolo's
/// shuffle), so each load depends on the last and the prefetcher cannot guess the next.
fn chase_table() -> Vec<u32> {
    let n = CHASE_BYTES / std::mem::size_of::<u32>();
    let mut t: Vec<u32> = (0..n as u32).collect();
    let mut seed = 0x000C_4A5E_u64;
    for i in (1..n).rev() {
        let j = (next(&mut seed) % i as u64) as usize;
        t.swap(i, j);
    }
    // `t` as a permutation has one cycle; following `t[at]` walks it.
    t
}

/// Number of [`Kind`]s.
const KINDS: usize = 9;

/// Blocks of the KV row's prompt (an 8K-token prompt in blocks of 64).
pub(crate) const PROMPT_BLOCKS: usize = 128;

impl Kind {
    /// Row label.
    pub(crate) const fn label(self) -> &'static str {
        match self {
            Kind::Rr => "rr",
            Kind::PickAgg => "pick agg",
            Kind::PickPd => "pick p/d",
            Kind::Estimate => "estimate",
            Kind::RefreshPickPd => "refresh+p/d",
            Kind::PickKvAgg => "pick kv",
            Kind::BurstPickAgg => "burst agg",
            Kind::Fixed(FixedWork::Short) => "fixed 2k",
            Kind::Fixed(FixedWork::Long) => "fixed 6k",
        }
    }

    /// Position in per-kind arrays (`0..KINDS`).
    const fn index(self) -> usize {
        match self {
            Kind::Rr => 0,
            Kind::PickAgg => 1,
            Kind::PickPd => 2,
            Kind::Estimate => 3,
            Kind::RefreshPickPd => 4,
            Kind::PickKvAgg => 5,
            Kind::BurstPickAgg => 6,
            Kind::Fixed(FixedWork::Short) => 7,
            Kind::Fixed(FixedWork::Long) => 8,
        }
    }

    /// Whether the row runs the pick path.
    pub(crate) const fn is_pick(self) -> bool {
        self.model().is_some()
    }

    const fn model(self) -> Option<&'static str> {
        match self {
            Kind::Rr | Kind::Estimate | Kind::Fixed(_) => None,
            Kind::PickAgg | Kind::PickKvAgg | Kind::BurstPickAgg => Some(AGG_MODEL),
            Kind::PickPd | Kind::RefreshPickPd => Some(PD_MODEL),
        }
    }
}

/// What the picks of one kind chose (to show that the loads, not round-robin, decided).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Outcomes {
    /// Operations run.
    pub(crate) ops: u64,
    /// Decode sides chosen by the row's cost (`reason = load`; `kv_aware` for the KV row).
    pub(crate) by_load: u64,
    /// Picks that carried a prefill worker.
    pub(crate) with_prefill: u64,
    /// Allocations made inside `DispatchLedger::dispatch` (counted around its calls).
    pub(crate) dispatch_allocs: u64,
    /// Candidate loads the picks read from the cells (the load memo answered the others).
    pub(crate) cell_reads: u64,
}

impl Outcomes {
    /// What happened since `before` (an earlier reading of the same kind).
    pub(crate) fn since(self, before: Self) -> Self {
        Self {
            ops: self.ops.wrapping_sub(before.ops),
            by_load: self.by_load.wrapping_sub(before.by_load),
            with_prefill: self.with_prefill.wrapping_sub(before.with_prefill),
            dispatch_allocs: self.dispatch_allocs.wrapping_sub(before.dispatch_allocs),
            cell_reads: self.cell_reads.wrapping_sub(before.cell_reads),
        }
    }
}

/// The KV row's state: two shards' KV indexes in which rank `i` of the fleet holds the first
/// `(37 i) mod (PROMPT_BLOCKS + 1)` blocks of the prompt (its index on shard `i mod 2`), and the
/// prompt's block hashes. The writers are kept so the indexes stay as published.
struct KvFixture {
    _writers: Vec<IndexWriter>,
    readers: Vec<IndexReader>,
    hashes: Vec<BlockHash>,
}

impl std::fmt::Debug for KvFixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvFixture")
            .field("blocks", &self.hashes.len())
            .finish_non_exhaustive()
    }
}

impl KvFixture {
    fn new(fleet: &FleetView) -> Self {
        let budget = Arc::new(Budget::default());
        let (mut w0, r0) = new_index(budget.clone());
        let (mut w1, r1) = new_index(budget);
        let mut tokens = Vec::with_capacity(PROMPT_BLOCKS);
        let mut path = Vec::with_capacity(PROMPT_BLOCKS);
        let mut parent = None;
        let mut seed = 0x7b1d_u64;
        for _ in 0..PROMPT_BLOCKS {
            let t = TokensHash(next(&mut seed));
            let p = path_hash(parent, t);
            tokens.push(t);
            path.push(p);
            parent = Some(p);
        }
        let mut rank = 0usize;
        for w in &fleet.workers {
            let start = w.dp_start_rank.unwrap_or(0);
            for r in start..start.saturating_add(w.dp_size.unwrap_or(1).max(1)) {
                let held = (rank * 37) % (PROMPT_BLOCKS + 1);
                let blocks: Vec<StoredBlock> = tokens
                    .iter()
                    .zip(&path)
                    .take(held)
                    .map(|(t, p)| StoredBlock {
                        block_hash: EngineHash(p.0),
                        tokens_hash: *t,
                    })
                    .collect();
                let writer = if rank.is_multiple_of(2) {
                    &mut w0
                } else {
                    &mut w1
                };
                let _ = writer.store(LoadKey::new(w.instance_id, r), None, &blocks);
                rank += 1;
            }
        }
        Self {
            readers: vec![r0.handle(), r1.handle()],
            _writers: vec![w0, w1],
            hashes: path,
        }
    }
}

/// One store key with its publisher.
#[derive(Debug, Clone, Copy)]
struct KeySpec {
    key: LoadKey,
    publisher: PublisherId,
}

/// This shard's picker state and everything around it (module docs).
#[derive(Debug)]
pub(crate) struct Sim<'f> {
    fleet: &'f FleetView,
    /// The fleet's candidate table, as a snapshot holds it (built once, outside the timing).
    candidates: FleetCandidates,
    body: &'f [u8],
    namespaces: [&'static str; 1],
    /// Shared only so that the fleet's writers can hold a view while they change the shard.
    store: Arc<LoadStore>,
    keys: Vec<KeySpec>,
    ledger: DispatchLedger,
    other: DispatchLedger,
    tables: Vec<Arc<InflightTable>>,
    /// This shard's load memo (as the shard's pick path holds it).
    memo: RefCell<LoadMemo>,
    /// This shard's unfinished dispatches, with the operation count when each was made.
    outstanding: VecDeque<(u64, DispatchId)>,
    /// The other shard's unfinished dispatches, likewise.
    other_outstanding: VecDeque<(u64, DispatchId)>,
    /// Operations run.
    ops: u64,
    /// The picker as a shard holds it (a trait object with its own cursors and scratch).
    picker: Box<dyn WorkerPicker>,
    /// The KV-aware picker of the KV row, with the KV state it reads.
    kv_picker: Box<dyn WorkerPicker>,
    kv: KvFixture,
    headers: Vec<u8>,
    rr: usize,
    now: Instant,
    rng: u64,
    /// The sequence number of the samples of the current turn over the keys.
    sequence: u64,
    activity: Activity,
    /// The next key to publish (staggered).
    publish_next: usize,
    /// Publications owed, in `1 / ROUND_EVERY` of a key (staggered).
    publish_owed: u64,
    /// Samples published (every fourth is followed by a dispatch of the other shard).
    published: u64,
    outcomes: [Outcomes; KINDS],
    /// The [`Kind::Fixed`] table and where its walk stands.
    chase: Vec<u32>,
    chase_at: u32,
}

/// Finishes, in order, the dispatches of `queue` made at least [`REQUEST_OPS`] operations before
/// operation `ops`.
fn finish_due(
    ledger: &mut DispatchLedger,
    queue: &mut VecDeque<(u64, DispatchId)>,
    view: &LoadView<'_>,
    ops: u64,
    now: Instant,
) {
    while let Some(&(at, id)) = queue.front() {
        if at.saturating_add(REQUEST_OPS) > ops {
            break;
        }
        ledger.finish(view, id, now);
        queue.pop_front();
    }
}

/// splitmix64 step.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl<'f> Sim<'f> {
    /// A shard over `fleet` whose store holds a fresh sample for every `(worker, rank)` and whose
    /// ledger has dispatched once to every key (the steady state of a busy shard).
    pub(crate) fn new(
        fleet: &'f FleetView,
        body: &'f [u8],
        activity: Activity,
    ) -> Result<Self, PickError> {
        let store = Arc::new(LoadStore::new());
        let report = store.set_live_and_retain(&LiveSet::from_fleet(fleet));
        let mut keys = Vec::with_capacity(report.keys);
        for w in &fleet.workers {
            let start = w.dp_start_rank.unwrap_or(0);
            for rank in start..start.saturating_add(w.dp_size.unwrap_or(1).max(1)) {
                keys.push(KeySpec {
                    key: LoadKey::new(w.instance_id, rank),
                    publisher: PublisherId::new(w.instance_id.get() ^ 0x5a5a),
                });
            }
        }
        let ledger = DispatchLedger::new();
        let other = DispatchLedger::new();
        let tables = vec![ledger.table(), other.table()];
        // Bound to the store's generation, as the control thread publishes it.
        let candidates = FleetCandidates::build_bound(&Arc::new(fleet.clone()), &store.view());
        let mut sim = Self {
            fleet,
            candidates,
            body,
            namespaces: [NAMESPACE],
            store,
            keys,
            ledger,
            other,
            tables,
            memo: RefCell::new(LoadMemo::new()),
            outstanding: VecDeque::with_capacity(4 * REQUEST_OPS as usize),
            other_outstanding: VecDeque::with_capacity(4 * REQUEST_OPS as usize),
            ops: 0,
            picker: Box::new(LoadBasedPicker::new()),
            kv_picker: Box::new(KvAwarePicker::new(
                KvParams::default(),
                Box::new(SplitMix64::new(0x5EED)),
            )),
            kv: KvFixture::new(fleet),
            headers: Vec::with_capacity(256),
            rr: 0,
            now: Instant::from_origin(Duration::from_secs(1_000)),
            rng: 0x00C0_FFEE,
            sequence: 1,
            activity,
            publish_next: 0,
            publish_owed: 0,
            published: 0,
            outcomes: [Outcomes::default(); KINDS],
            chase: chase_table(),
            chase_at: 0,
        };
        let applied = sim.round();
        if applied != sim.keys.len() || report.keys != sim.keys.len() {
            return Err(PickError::Store {
                keys: sim.keys.len(),
                admitted: report.keys,
                applied,
            });
        }
        let prompt = estimate_prompt_tokens(body).get();
        let view = sim.store.view();
        sim.now = sim.now.saturating_add(STEP);
        for k in &sim.keys {
            let load = DispatchLoad::for_role(DispatchRole::Aggregated, prompt, Some(BLOCK_SIZE));
            if let Some(id) = sim.ledger.dispatch(&view, k.key, load, sim.now) {
                sim.outstanding.push_back((0, id));
            }
        }
        drop(view);
        Ok(sim)
    }

    /// `(worker, rank)` keys in the store.
    pub(crate) fn keys(&self) -> usize {
        self.keys.len()
    }

    /// What the operations of `kind` chose so far.
    pub(crate) fn outcomes(&self, kind: Kind) -> Outcomes {
        self.outcomes.get(kind.index()).copied().unwrap_or_default()
    }

    /// Applies a fresh sample with new loads to every key, then lets the other shard dispatch to
    /// a quarter of the keys. Returns how many samples applied.
    fn round(&mut self) -> usize {
        let store = Arc::clone(&self.store);
        let view = store.view();
        self.finish_other(&view);
        let mut applied = 0;
        for i in 0..self.keys.len() {
            applied += usize::from(self.publish(&view, i));
        }
        self.sequence += 1;
        let len = self.keys.len() as u64;
        for _ in 0..(len / 4).max(1) {
            self.other_dispatch(&view);
        }
        applied
    }

    /// Finishes the other shard's due dispatches.
    fn finish_other(&mut self, view: &LoadView<'_>) {
        finish_due(
            &mut self.other,
            &mut self.other_outstanding,
            view,
            self.ops,
            self.now,
        );
    }

    /// Applies a fresh sample with new loads to key `i`; whether it applied.
    fn publish(&mut self, view: &LoadView<'_>, i: usize) -> bool {
        let Some(k) = self.keys.get(i) else {
            return false;
        };
        let decode = next(&mut self.rng) % (TOTAL_KV_BLOCKS / 2);
        let sample = Sample {
            publisher_id: k.publisher,
            sequence: self.sequence,
            active_decode_blocks: Some(decode),
            active_prefill_tokens: Some(next(&mut self.rng) % MAX_BATCHED_TOKENS),
            kv_used_blocks: Some(decode + decode / 4),
        };
        view.apply(k.key, &sample, self.now) == ApplyOutcome::Applied
    }

    /// The other shard dispatches to a random key.
    fn other_dispatch(&mut self, view: &LoadView<'_>) {
        let len = self.keys.len() as u64;
        let i = (next(&mut self.rng) % len.max(1)) as usize;
        if let Some(k) = self.keys.get(i) {
            let load = DispatchLoad::for_role(
                DispatchRole::Aggregated,
                OTHER_SHARD_PROMPT,
                Some(BLOCK_SIZE),
            );
            if let Some(id) = self.other.dispatch(view, k.key, load, self.now) {
                self.other_outstanding.push_back((self.ops, id));
            }
        }
    }

    /// Publishes the samples `ops` operations owe, the keys in turn, each followed (every
    /// fourth) by a dispatch of the other shard.
    fn stagger(&mut self, ops: u64) {
        let store = Arc::clone(&self.store);
        let view = store.view();
        self.finish_other(&view);
        let len = self.keys.len();
        self.publish_owed += ops.saturating_mul(len as u64);
        let due = self.publish_owed / ROUND_EVERY;
        self.publish_owed %= ROUND_EVERY;
        for _ in 0..due {
            if self.publish_next >= len {
                self.publish_next = 0;
                self.sequence += 1;
            }
            self.publish(&view, self.publish_next);
            self.publish_next += 1;
            self.published += 1;
            if self.published.is_multiple_of(4) {
                self.other_dispatch(&view);
            }
        }
    }

    /// Lets `ops` operations' worth of fleet activity happen (untimed, module docs).
    pub(crate) fn advance(&mut self, ops: u64) {
        let view = self.store.view();
        finish_due(
            &mut self.ledger,
            &mut self.outstanding,
            &view,
            self.ops,
            self.now,
        );
        drop(view);
        match self.activity {
            Activity::Staggered => self.stagger(ops),
            Activity::Burst => {
                self.round();
            }
        }
    }

    /// Runs one operation (the part that is timed). Returns the rendered header length.
    pub(crate) fn op(&mut self, kind: Kind) -> Result<usize, PickError> {
        self.now = self.now.saturating_add(STEP);
        self.ops += 1;
        let Some(model) = kind.model() else {
            return Ok(match kind {
                Kind::Estimate => self.estimate_only(),
                Kind::Fixed(work) => self.fixed_work(work),
                _ => self.round_robin(),
            });
        };
        let view = self.store.view();
        if kind == Kind::RefreshPickPd {
            self.ledger.refresh(&view, self.now);
        }
        let reader = InflightReader::new(&self.tables);
        let loads = StoreLoads::memoised(&view, &reader, &self.memo);
        let kv = kind == Kind::PickKvAgg;
        let prompt = if kv {
            PromptTokens(PROMPT_BLOCKS as u64 * u64::from(BLOCK_SIZE))
        } else {
            estimate_prompt_tokens(self.body)
        };
        let blocks = [PromptBlocks {
            block_size: BLOCK_SIZE,
            hashes: &self.kv.hashes,
        }];
        let merged = Merged(&self.kv.readers);
        let input = PickInput {
            fleet: self.fleet,
            loads: &loads,
            model,
            namespaces: &self.namespaces,
            prompt_tokens: prompt,
            now: self.now,
            max_staleness: DEFAULT_MAX_STALENESS,
            prompt_blocks: if kv { &blocks } else { &[] },
            overlap: if kv { &merged } else { &NoOverlap },
            candidates: Some(&self.candidates),
        };
        let workers = self.fleet.workers.len();
        let mut picks = Picks::new(1);
        let picker = if kv {
            &mut self.kv_picker
        } else {
            &mut self.picker
        };
        let misses_before = self.memo.borrow().misses();
        let picked = picker.pick(&input, &mut picks);
        let cell_reads = self.memo.borrow().misses().wrapping_sub(misses_before);
        let Some(pick) = picked.ok().and(picks.first().copied()) else {
            return Err(PickError::NoWorker { model, workers });
        };
        self.headers.clear();
        pick.pin_headers().write_to(&mut self.headers);
        let block_size = |id: InstanceId| {
            self.fleet
                .workers
                .binary_search_by(|w| {
                    (w.namespace.as_str(), w.instance_id).cmp(&(pick.namespace, id))
                })
                .ok()
                .and_then(|i| self.fleet.workers.get(i))
                .and_then(|w| w.block_size)
        };
        let decode_role = if pick.prefill.is_some() {
            DispatchRole::PairDecode
        } else {
            DispatchRole::Aggregated
        };
        let d = pick.decode;
        let load = DispatchLoad::for_role(decode_role, prompt.get(), block_size(d.instance_id));
        let key = LoadKey::new(d.instance_id, d.dp_rank);
        let allocs_before = thread_allocations();
        let id = black_box(self.ledger.dispatch(&view, key, load, self.now));
        let mut ids = [id, None];
        if let Some(p) = pick.prefill {
            let load = DispatchLoad::for_role(
                DispatchRole::PairPrefill,
                prompt.get(),
                block_size(p.instance_id),
            );
            let key = LoadKey::new(p.instance_id, p.dp_rank);
            ids[1] = black_box(self.ledger.dispatch(&view, key, load, self.now));
        }
        let dispatch_allocs = thread_allocations().wrapping_sub(allocs_before);
        // Within the capacity reserved above (at most two per operation, finished after
        // `REQUEST_OPS` operations), so this allocates nothing.
        let ops = self.ops;
        self.outstanding
            .extend(ids.into_iter().flatten().map(|id| (ops, id)));
        if let Some(o) = self.outcomes.get_mut(kind.index()) {
            o.ops += 1;
            // The row's own cost decided: `load`, or `kv_aware` for the KV row (a KV pick that
            // fell back to load would mean its fixture matched nothing).
            let by_cost = if kind == Kind::PickKvAgg {
                SelectionReason::KvAware
            } else {
                SelectionReason::Load
            };
            o.by_load += u64::from(d.reason == by_cost);
            o.with_prefill += u64::from(pick.prefill.is_some());
            o.dispatch_allocs += dispatch_allocs;
            o.cell_reads += cell_reads;
        }
        Ok(black_box(&self.headers).len())
    }

    /// The prompt estimate alone.
    fn estimate_only(&mut self) -> usize {
        if let Some(o) = self.outcomes.get_mut(Kind::Estimate.index()) {
            o.ops += 1;
        }
        estimate_prompt_tokens(black_box(self.body)).get() as usize
    }

    /// The tail reference: `work`'s steps around the chase table, from where the last left
    /// off (the same work every time).
    fn fixed_work(&mut self, work: FixedWork) -> usize {
        if let Some(o) = self.outcomes.get_mut(Kind::Fixed(work).index()) {
            o.ops += 1;
        }
        let mut at = self.chase_at;
        for _ in 0..work.steps() {
            at = self.chase.get(at as usize).copied().unwrap_or(0);
        }
        self.chase_at = black_box(at);
        at as usize
    }

    /// The baseline: the next worker in turn, its pin header rendered the same way.
    fn round_robin(&mut self) -> usize {
        let workers = &self.fleet.workers;
        self.rr = if self.rr + 1 >= workers.len() {
            0
        } else {
            self.rr + 1
        };
        let Some(w) = workers.get(self.rr) else {
            return 0;
        };
        let pins = PinHeaders {
            worker: w.instance_id.get(),
            worker_rank: w.dp_size.map(|_| w.dp_start_rank.unwrap_or(0)),
            prefill: None,
            prefill_rank: None,
        };
        self.headers.clear();
        pins.write_to(&mut self.headers);
        if let Some(o) = self.outcomes.get_mut(Kind::Rr.index()) {
            o.ops += 1;
        }
        black_box(&self.headers).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pick::fleet;

    #[test]
    fn picks_follow_the_loads_and_carry_prefill_for_pd() {
        let f = fleet::build(100).unwrap();
        let body = fleet::chat_body(PD_MODEL);
        let mut sim = Sim::new(&f.view, body.as_bytes(), Activity::Staggered).unwrap();
        assert_eq!(sim.keys(), f.keys);
        for _ in 0..1_000 {
            for kind in [Kind::Rr, Kind::PickAgg, Kind::PickPd, Kind::PickKvAgg] {
                assert!(sim.op(kind).unwrap() > 0);
            }
            sim.advance(3);
        }
        let agg = sim.outcomes(Kind::PickAgg);
        let pd = sim.outcomes(Kind::PickPd);
        assert_eq!((agg.ops, agg.by_load, agg.with_prefill), (1_000, 1_000, 0));
        assert_eq!((pd.ops, pd.by_load, pd.with_prefill), (1_000, 1_000, 1_000));
        let kv = sim.outcomes(Kind::PickKvAgg);
        assert_eq!((kv.ops, kv.by_load, kv.with_prefill), (1_000, 1_000, 0));
        assert_eq!(sim.outcomes(Kind::Rr).ops, 1_000);
    }

    /// The fixed rows' table is one cycle through every entry: the walk comes back to its start
    /// after exactly as many steps as there are entries, and not before (so every step loads a
    /// new entry and a row's work does not depend on where its walk stands).
    #[test]
    fn the_chase_table_is_one_cycle_through_every_entry() {
        let t = chase_table();
        assert_eq!(t.len() * std::mem::size_of::<u32>(), CHASE_BYTES);
        let mut at = 0_u32;
        for step in 1..=t.len() {
            at = t[at as usize];
            if at == 0 {
                assert_eq!(step, t.len(), "back at the start after {step} steps");
            }
        }
        assert_eq!(at, 0);
    }
}
