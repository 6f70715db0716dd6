//! The live-worker admission gate and the per-generation key→slot map.
//!
//! Role: [`LiveSet`] is what the control thread derives from each published
//! [`FleetView`]: every worker id with its declared dp ranks and namespace. [`SlotMap`] is the
//! immutable map the store publishes for that generation: sorted live workers (the gate) and the
//! sorted admitted keys with their cell slot and epoch.
//!
//! Invariants:
//! - a worker's ranks are `dp_start_rank .. dp_start_rank + dp_size`; an undeclared start is 0 and
//!   an undeclared or zero size is 1 (so an undeclared worker has exactly rank 0); the range is
//!   clipped at `u32::MAX` and never enumerated beyond what the key cap admits;
//! - at most [`MAX_LOAD_KEYS`] keys are admitted; keys admitted in the previous generation keep
//!   their slot and epoch (and so their sample), new keys are admitted in ascending
//!   `(worker_id, dp_rank)` order until the cap (LOAD-STORE-18);
//! - a worker id appearing twice (two namespaces) keeps its first occurrence in `FleetView` order;
//!   discovery already rejects such collisions, so this is only a total fallback.

use std::collections::HashSet;
use std::sync::Arc;

use crate::discovery::{FleetView, InstanceId};

use super::{LoadKey, MAX_LOAD_KEYS};

/// One live worker: its id, namespace and declared dp ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveWorker {
    /// The worker's instance id.
    pub worker_id: InstanceId,
    /// The Dynamo namespace (the `namespace` gauge label).
    pub namespace: Arc<str>,
    /// First declared rank.
    pub dp_start: u32,
    /// Number of declared ranks, at least 1.
    pub dp_size: u32,
}

impl LiveWorker {
    /// A live worker; a `dp_size` of 0 is read as 1.
    pub fn new(worker_id: InstanceId, namespace: &str, dp_start: u32, dp_size: u32) -> Self {
        Self {
            worker_id,
            namespace: Arc::from(namespace),
            dp_start,
            dp_size: dp_size.max(1),
        }
    }

    /// Whether `rank` is one of the declared ranks.
    pub fn has_rank(&self, rank: u32) -> bool {
        u64::from(rank) >= u64::from(self.dp_start)
            && u64::from(rank) < u64::from(self.dp_start) + u64::from(self.dp_size)
    }

    fn ranks(&self) -> impl Iterator<Item = u32> + '_ {
        let end = (u64::from(self.dp_start) + u64::from(self.dp_size)).min(u64::from(u32::MAX) + 1);
        (u64::from(self.dp_start)..end).filter_map(|r| u32::try_from(r).ok())
    }
}

/// The live workers of one registry generation, sorted by worker id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveSet {
    workers: Vec<LiveWorker>,
}

impl LiveSet {
    /// Builds the gate from explicit workers (sorted here; a repeated id keeps the first).
    pub fn new(workers: impl IntoIterator<Item = LiveWorker>) -> Self {
        let mut seen = HashSet::new();
        let mut workers: Vec<LiveWorker> = workers
            .into_iter()
            .filter(|w| seen.insert(w.worker_id))
            .collect();
        workers.sort_by_key(|w| w.worker_id);
        Self { workers }
    }

    /// Every worker of the view with its declared ranks.
    pub fn from_fleet(view: &FleetView) -> Self {
        let mut namespaces: Vec<Arc<str>> = Vec::new();
        Self::new(view.workers.iter().map(|w| {
            let ns = match namespaces.iter().find(|n| ***n == *w.namespace) {
                Some(n) => Arc::clone(n),
                None => {
                    let n: Arc<str> = Arc::from(w.namespace.as_str());
                    namespaces.push(Arc::clone(&n));
                    n
                }
            };
            LiveWorker {
                worker_id: w.instance_id,
                namespace: ns,
                dp_start: w.dp_start_rank.unwrap_or(0),
                dp_size: w.dp_size.unwrap_or(1).max(1),
            }
        }))
    }

    /// The workers, sorted by id.
    pub fn workers(&self) -> &[LiveWorker] {
        &self.workers
    }

    /// The worker with this id.
    pub fn worker(&self, id: InstanceId) -> Option<&LiveWorker> {
        self.workers
            .binary_search_by_key(&id, |w| w.worker_id)
            .ok()
            .and_then(|i| self.workers.get(i))
    }
}

/// One admitted key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyEntry {
    pub(crate) key: LoadKey,
    pub(crate) slot: u32,
    pub(crate) epoch: u64,
    /// Index of the worker in `SlotMap::live`.
    pub(crate) worker: u32,
}

/// The published map of one generation.
#[derive(Debug, Default)]
pub(crate) struct SlotMap {
    pub(crate) live: LiveSet,
    /// Sorted by key.
    pub(crate) keys: Vec<KeyEntry>,
}

impl SlotMap {
    pub(crate) fn entry(&self, key: LoadKey) -> Option<&KeyEntry> {
        self.keys
            .binary_search_by_key(&key, |e| e.key)
            .ok()
            .and_then(|i| self.keys.get(i))
    }
}

/// What one [`super::LoadStore::set_live_and_retain`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetainReport {
    /// Keys admitted in this generation (at most `MAX_LOAD_KEYS`).
    pub keys: usize,
    /// Keys carried over from the previous generation with their samples.
    pub retained: usize,
    /// Keys of departed workers (or dropped ranks) removed with their samples and series.
    pub removed: usize,
    /// Live keys that got no slot because the cap was reached; their samples are `over_capacity`.
    pub over_capacity: usize,
}

/// A planned generation: the keys kept from `old`, the keys removed, and the new keys in order.
pub(crate) struct Plan {
    pub(crate) retained: Vec<KeyEntry>,
    pub(crate) removed: Vec<KeyEntry>,
    pub(crate) added: Vec<(LoadKey, u32)>,
    pub(crate) over_capacity: usize,
}

/// Plans the next generation. Bounded: at most `2 * MAX_LOAD_KEYS` keys are enumerated whatever
/// the declared dp sizes.
pub(crate) fn plan(old: &SlotMap, live: &LiveSet) -> Plan {
    let mut retained = Vec::new();
    let mut removed = Vec::new();
    for e in &old.keys {
        match live
            .workers
            .binary_search_by_key(&e.key.worker_id, |w| w.worker_id)
        {
            Ok(i)
                if live
                    .workers
                    .get(i)
                    .is_some_and(|w| w.has_rank(e.key.dp_rank)) =>
            {
                let mut kept = *e;
                kept.worker = u32::try_from(i).unwrap_or(u32::MAX);
                retained.push(kept);
            }
            _ => removed.push(*e),
        }
    }
    let kept: HashSet<LoadKey> = retained.iter().map(|e| e.key).collect();
    let mut added = Vec::new();
    let mut over_capacity = 0usize;
    let mut total = retained.len();
    'outer: for (i, w) in live.workers.iter().enumerate() {
        for rank in w.ranks() {
            let key = LoadKey::new(w.worker_id, rank);
            if kept.contains(&key) {
                continue;
            }
            if total >= MAX_LOAD_KEYS {
                over_capacity = over_capacity.saturating_add(1);
                // Counting every refused key of a huge declared range would be unbounded.
                if over_capacity >= MAX_LOAD_KEYS {
                    break 'outer;
                }
                continue;
            }
            added.push((key, u32::try_from(i).unwrap_or(u32::MAX)));
            total += 1;
        }
    }
    Plan {
        retained,
        removed,
        added,
        over_capacity,
    }
}
