//! The cross-core load store: one seqlock cell per admitted `(worker, dp_rank)`.
//!
//! Role: [`LoadStore`] holds the last applied sample of every admitted key with its receipt time
//! (LOAD-STORE-02/03), answers freshness queries (LOAD-STORE-04/05/19), discards a publisher's
//! samples (LOAD-STORE-14) and swaps the live set and key map in one call per registry generation
//! (LOAD-STORE-15). [`LoadView`] pins one generation's map for a batch of reads (one pick).
//!
//! Cell words: `[epoch << 8 | flags, publisher_id, sequence, decode, prefill, kv_used,
//! received_at_ns]`. The epoch is unique per slot assignment; a cell whose epoch differs from the
//! map entry belongs to another key and reads as empty, and writes through a stale map are refused.
//!
//! Invariants:
//! - per key, a sample from the stored publisher applies only with a higher sequence; a sample
//!   from another publisher always applies (restarted publisher, LOAD-STORE-02);
//! - discarding keeps the last receipt time (flag `HAS_RECEIPT`): it still answers dispatches
//!   made before it (LOAD-STORE-10), but the key then reads as "never published" (quiet);
//! - the data path (`apply`, `fresh`, `last`, `discard_publisher`) never allocates and never
//!   takes the control mutex, which only serialises `set_live_and_retain` callers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};

use crate::clock::Instant;
use crate::discovery::PublisherId;

use super::live::{KeyEntry, LiveSet, RetainReport, SlotMap, plan};
use super::seqcell::{SeqTable, Stamps};
use super::{
    DEFAULT_MAX_STALENESS, LoadKey, MAX_MAX_STALENESS, MIN_MAX_STALENESS, Sample, SampleView,
    StalenessOutOfRange, duration_nanos, instant, nanos,
};

pub(crate) const WORDS: usize = 7;
const META: usize = 0;
const PUBLISHER: usize = 1;
const SEQUENCE: usize = 2;
const DECODE: usize = 3;
const PREFILL: usize = 4;
const KV_USED: usize = 5;
const RECEIVED: usize = 6;

const HAS_SAMPLE: u64 = 1;
const HAS_DECODE: u64 = 1 << 1;
const HAS_PREFILL: u64 = 1 << 2;
const HAS_KV_USED: u64 = 1 << 3;
const HAS_RECEIPT: u64 = 1 << 4;
const FLAG_BITS: u32 = 8;
const FLAG_MASK: u64 = (1 << FLAG_BITS) - 1;

/// The outcome of [`LoadStore::apply`]; each maps to one `load_events_total` label
/// ([`ApplyOutcome::result`], in `metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// Stored (`result="applied"`, Q-21).
    Applied,
    /// Same publisher, sequence not above the stored one (`duplicate`, LOAD-STORE-02).
    Duplicate,
    /// Refused by the admission gate.
    Refused(Refusal),
}

/// Why a key has no cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The worker is not in the live set, or the rank is not one it declared (LOAD-ZMTP-10).
    IdentityMismatch,
    /// The key is live but the store is at its 65,536-key cap (LOAD-ZMTP-11, LOAD-STORE-18).
    OverCapacity,
}

/// An admitted key's cell in one generation (slot and epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRef {
    pub(crate) slot: u32,
    pub(crate) epoch: u64,
}

/// What the store holds for one key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyRead {
    /// The last applied sample, unless discarded since.
    pub sample: Option<SampleView>,
    /// When the last sample was received, kept across discards; it answers dispatches made
    /// before it (LOAD-STORE-10).
    pub last_receipt: Option<Instant>,
}

/// Control-thread state: slot allocation.
#[derive(Debug, Default)]
struct Control {
    free: Vec<u32>,
    next_unused: u32,
    next_epoch: u64,
    /// The generation of the last published map.
    generation: u64,
}

/// The load store (module docs: `super`).
#[derive(Debug)]
pub struct LoadStore {
    map: ArcSwap<SlotMap>,
    cells: SeqTable<WORDS>,
    max_staleness_ns: AtomicU64,
    control: Mutex<Control>,
}

impl Default for LoadStore {
    fn default() -> Self {
        Self::new()
    }
}

impl LoadStore {
    /// An empty store: no live workers (every sample is `identity_mismatch`), max staleness 3 s.
    pub fn new() -> Self {
        Self {
            map: ArcSwap::from_pointee(SlotMap::default()),
            cells: SeqTable::new(),
            max_staleness_ns: AtomicU64::new(duration_nanos(DEFAULT_MAX_STALENESS)),
            control: Mutex::new(Control::default()),
        }
    }

    /// Sets `dynamo.load.max_staleness` for [`LoadStore::fresh_default`]; effective for the next
    /// query on every shard (hot reload, LOAD-STORE-05).
    pub fn set_max_staleness(&self, d: Duration) -> Result<(), StalenessOutOfRange> {
        if !(MIN_MAX_STALENESS..=MAX_MAX_STALENESS).contains(&d) {
            return Err(StalenessOutOfRange(d));
        }
        self.max_staleness_ns
            .store(duration_nanos(d), Ordering::Relaxed);
        Ok(())
    }

    /// The current `max_staleness`.
    pub fn max_staleness(&self) -> Duration {
        Duration::from_nanos(self.max_staleness_ns.load(Ordering::Relaxed))
    }

    /// Pins the current generation's map for a batch of operations.
    pub fn view(&self) -> LoadView<'_> {
        LoadView {
            store: self,
            map: self.map.load(),
        }
    }

    /// Applies a sample received at `received_at` (LOAD-STORE-02/03, LOAD-ZMTP-10/11).
    pub fn apply(&self, key: LoadKey, sample: &Sample, received_at: Instant) -> ApplyOutcome {
        self.view().apply(key, sample, received_at)
    }

    /// The sample of `key` if it was received within `max_age` of `now` (LOAD-STORE-04).
    pub fn fresh(&self, key: LoadKey, max_age: Duration, now: Instant) -> Option<SampleView> {
        self.view().fresh(key, max_age, now)
    }

    /// [`LoadStore::fresh`] with the configured `max_staleness` (LOAD-STORE-05).
    pub fn fresh_default(&self, key: LoadKey, now: Instant) -> Option<SampleView> {
        self.fresh(key, self.max_staleness(), now)
    }

    /// The last applied sample of `key`, whatever its age.
    pub fn last(&self, key: LoadKey) -> Option<SampleView> {
        self.view().read(key).sample
    }

    /// Discards every sample whose last writer is `publisher` (all dp ranks): on every connect
    /// and every sequence gap (LOAD-STORE-14, Q-22). Returns how many samples were discarded.
    /// Cost: one seqlock read per admitted key, one write per discarded sample; no allocation.
    pub fn discard_publisher(&self, publisher: PublisherId) -> usize {
        let map = self.map.load();
        let mut discarded = 0usize;
        for e in &map.keys {
            let w = self.cells.read(e.slot);
            if !held_from(&w, e.epoch, publisher) {
                continue;
            }
            let done = self.cells.update(e.slot, false, |w| {
                if !held_from(w, e.epoch, publisher) {
                    return (false, false);
                }
                w[META] &= !(HAS_SAMPLE | HAS_DECODE | HAS_PREFILL | HAS_KV_USED);
                (true, true)
            });
            if done == Some(true) {
                discarded += 1;
            }
        }
        discarded
    }

    /// Installs the live set of a new registry generation in one call (LOAD-STORE-15): the
    /// admission gate changes, departed workers' (and dropped ranks') samples are cleared, so
    /// their gauge series vanish from the next render (LOAD-MET-03), and new keys get empty cells
    /// up to the cap (LOAD-STORE-18). Control path: allocates; serialised by a mutex the data
    /// path never takes.
    pub fn set_live_and_retain(&self, live: &LiveSet) -> RetainReport {
        let mut ctl = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        let old = self.map.load_full();
        let plan = plan(&old, live);
        for e in &plan.removed {
            self.cells.update(e.slot, false, |w| {
                let mine = w[META] >> FLAG_BITS == e.epoch;
                if mine {
                    *w = [0; WORDS];
                }
                (mine, ())
            });
            ctl.free.push(e.slot);
        }
        let mut keys = plan.retained;
        let retained = keys.len();
        for (key, worker) in plan.added {
            let slot = match ctl.free.pop() {
                Some(s) => s,
                None => {
                    let s = ctl.next_unused;
                    ctl.next_unused = s.saturating_add(1);
                    s
                }
            };
            ctl.next_epoch = ctl.next_epoch.wrapping_add(1) & (u64::MAX >> FLAG_BITS);
            if ctl.next_epoch == 0 {
                ctl.next_epoch = 1;
            }
            let epoch = ctl.next_epoch;
            let written = self.cells.update(slot, true, |w| {
                *w = [0; WORDS];
                w[META] = epoch << FLAG_BITS;
                (true, ())
            });
            if written.is_some() {
                keys.push(KeyEntry {
                    key,
                    slot,
                    epoch,
                    worker,
                });
            }
        }
        keys.sort_by_key(|e| e.key);
        let report = RetainReport {
            keys: keys.len(),
            retained,
            removed: plan.removed.len(),
            over_capacity: plan.over_capacity,
        };
        ctl.generation = ctl.generation.wrapping_add(1);
        self.map
            .store(Arc::new(SlotMap::new(ctl.generation, live.clone(), keys)));
        report
    }

    /// Number of admitted keys in the current generation.
    pub fn key_count(&self) -> usize {
        self.map.load().keys.len()
    }

    /// Number of keys currently holding a sample (a full scan; for tests and the admin view).
    pub fn samples_held(&self) -> usize {
        let view = self.view();
        view.map
            .keys
            .iter()
            .filter(|e| view.read_slot(slot_ref(e)).sample.is_some())
            .count()
    }
}

fn slot_ref(e: &KeyEntry) -> SlotRef {
    SlotRef {
        slot: e.slot,
        epoch: e.epoch,
    }
}

fn held_from(w: &[u64; WORDS], epoch: u64, publisher: PublisherId) -> bool {
    w[META] >> FLAG_BITS == epoch && w[META] & HAS_SAMPLE != 0 && w[PUBLISHER] == publisher.get()
}

fn opt(flags: u64, bit: u64, v: u64) -> Option<u64> {
    (flags & bit != 0).then_some(v)
}

/// One generation's map pinned for a batch of reads and writes (one pick, one message).
#[derive(Debug)]
pub struct LoadView<'a> {
    store: &'a LoadStore,
    map: Guard<Arc<SlotMap>>,
}

impl LoadView<'_> {
    /// The cell of `key`, or why it has none.
    pub fn slot(&self, key: LoadKey) -> Result<SlotRef, Refusal> {
        if let Some(e) = self.map.entry(key) {
            return Ok(slot_ref(e));
        }
        match self.map.live.worker(key.worker_id) {
            Some(w) if w.has_rank(key.dp_rank) => Err(Refusal::OverCapacity),
            _ => Err(Refusal::IdentityMismatch),
        }
    }

    /// What the store holds for a slot (empty if the slot now belongs to another key).
    pub fn read_slot(&self, s: SlotRef) -> KeyRead {
        self.read_slot_checked(s).unwrap_or_default()
    }

    /// The store this view reads.
    pub(crate) fn store(&self) -> &LoadStore {
        self.store
    }

    /// The stamp of a slot's cell (`super::seqcell`): load it before [`Self::read_slot`].
    pub(crate) fn stamp(&self, slot: u32) -> u32 {
        self.store.cells.stamp(slot)
    }

    /// Every cell's stamp ([`LoadView::stamp`] for many slots).
    pub(crate) fn stamps(&self) -> Stamps<'_> {
        self.store.cells.stamps()
    }

    /// Every group of cells' stamp (`super::seqcell`'s group stamps).
    pub(crate) fn groups(&self) -> Stamps<'_> {
        self.store.cells.groups()
    }

    /// What the store holds for a slot, `None` if the slot now belongs to another key.
    pub(crate) fn read_slot_checked(&self, s: SlotRef) -> Option<KeyRead> {
        let w = self.store.cells.read(s.slot);
        let flags = w[META] & FLAG_MASK;
        if w[META] >> FLAG_BITS != s.epoch {
            return None;
        }
        if flags & HAS_RECEIPT == 0 {
            return Some(KeyRead::default());
        }
        let received_at = instant(w[RECEIVED]);
        let sample = (flags & HAS_SAMPLE != 0).then(|| SampleView {
            sample: Sample {
                publisher_id: PublisherId::new(w[PUBLISHER]),
                sequence: w[SEQUENCE],
                active_decode_blocks: opt(flags, HAS_DECODE, w[DECODE]),
                active_prefill_tokens: opt(flags, HAS_PREFILL, w[PREFILL]),
                kv_used_blocks: opt(flags, HAS_KV_USED, w[KV_USED]),
            },
            received_at,
        });
        Some(KeyRead {
            sample,
            last_receipt: Some(received_at),
        })
    }

    /// What the store holds for `key` (empty if it has no cell).
    pub fn read(&self, key: LoadKey) -> KeyRead {
        self.slot(key)
            .map(|s| self.read_slot(s))
            .unwrap_or_default()
    }

    /// See [`LoadStore::fresh`].
    pub fn fresh(&self, key: LoadKey, max_age: Duration, now: Instant) -> Option<SampleView> {
        self.read(key).sample.filter(|s| s.is_fresh(max_age, now))
    }

    /// See [`LoadStore::fresh_default`].
    pub fn fresh_default(&self, key: LoadKey, now: Instant) -> Option<SampleView> {
        self.fresh(key, self.store.max_staleness(), now)
    }

    /// See [`LoadStore::apply`].
    pub fn apply(&self, key: LoadKey, sample: &Sample, received_at: Instant) -> ApplyOutcome {
        let s = match self.slot(key) {
            Ok(s) => s,
            Err(r) => return ApplyOutcome::Refused(r),
        };
        let outcome = self.store.cells.update(s.slot, false, |w| {
            if w[META] >> FLAG_BITS != s.epoch {
                // The worker departed after this view was pinned.
                return (false, ApplyOutcome::Refused(Refusal::IdentityMismatch));
            }
            let held = w[META] & HAS_SAMPLE != 0;
            if held && w[PUBLISHER] == sample.publisher_id.get() && sample.sequence <= w[SEQUENCE] {
                return (false, ApplyOutcome::Duplicate);
            }
            let mut flags = HAS_SAMPLE | HAS_RECEIPT;
            let mut put = |idx: usize, bit: u64, v: Option<u64>| {
                w[idx] = v.unwrap_or(0);
                if v.is_some() {
                    flags |= bit;
                }
            };
            put(DECODE, HAS_DECODE, sample.active_decode_blocks);
            put(PREFILL, HAS_PREFILL, sample.active_prefill_tokens);
            put(KV_USED, HAS_KV_USED, sample.kv_used_blocks);
            w[META] = s.epoch << FLAG_BITS | flags;
            w[PUBLISHER] = sample.publisher_id.get();
            w[SEQUENCE] = sample.sequence;
            w[RECEIVED] = nanos(received_at);
            (true, ApplyOutcome::Applied)
        });
        outcome.unwrap_or(ApplyOutcome::Refused(Refusal::IdentityMismatch))
    }

    /// Which admission (`set_live_and_retain` call) published this view's map: slots read from
    /// one generation stay valid while later views report the same number.
    pub fn generation(&self) -> u64 {
        self.map.generation
    }

    /// The live set of this generation.
    pub fn live(&self) -> &LiveSet {
        &self.map.live
    }

    /// Admitted keys in ascending order with the namespace of their worker.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&KeyEntry, &str)> + '_ {
        self.map.keys.iter().map(|e| {
            let ns = self
                .map
                .live
                .workers()
                .get(e.worker as usize)
                .map_or("", |w| &*w.namespace);
            (e, ns)
        })
    }

    pub(crate) fn read_entry(&self, e: &KeyEntry) -> KeyRead {
        self.read_slot(slot_ref(e))
    }
}
