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

use super::{LoadKey, MAX_LOAD_KEYS, mix_key as mix};

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
    /// Which `set_live_and_retain` published this map (0: the empty map of a new store).
    pub(crate) generation: u64,
    pub(crate) live: LiveSet,
    /// Sorted by key.
    pub(crate) keys: Vec<KeyEntry>,
    /// `keys` by key, hashed (what a pick's lookups use).
    index: KeyIndex,
}

impl SlotMap {
    /// The map of `keys` (sorted by key) for `live`, with its lookup index.
    pub(crate) fn new(generation: u64, live: LiveSet, keys: Vec<KeyEntry>) -> Self {
        let index = KeyIndex::build(&keys);
        Self {
            generation,
            live,
            keys,
            index,
        }
    }

    /// The entry of `key`: one probe run of the hashed index (a pick looks up every candidate
    /// rank, so this replaced a binary search over all keys).
    pub(crate) fn entry(&self, key: LoadKey) -> Option<&KeyEntry> {
        self.index.find(&self.keys, key)
    }
}

/// An open-addressing index over a generation's keys: each bucket holds `1 + position in
/// keys`, or 0 when empty; linear probing, at most half the buckets used, so every probe run
/// ends at an empty bucket. Keys are fleet-chosen, so the bucket of a key is a keyed mix
/// (splitmix64's finaliser of the key and a per-map secret from `std`'s `RandomState`): no input
/// can steer keys into one long probe run.
#[derive(Debug, Default)]
struct KeyIndex {
    seed: u64,
    buckets: Box<[u32]>,
}

impl KeyIndex {
    fn build(keys: &[KeyEntry]) -> Self {
        use std::hash::BuildHasher as _;
        let seed = std::collections::hash_map::RandomState::new().hash_one(0x6b65_7973_u64);
        let n = keys.len().saturating_mul(2).max(8).next_power_of_two();
        let mut buckets = vec![0u32; n].into_boxed_slice();
        let mask = n - 1;
        for (pos, e) in keys.iter().enumerate() {
            let Ok(tag) = u32::try_from(pos + 1) else {
                break;
            };
            let mut i = mix(e.key, seed) & mask;
            while buckets.get(i).is_some_and(|&b| b != 0) {
                i = (i + 1) & mask;
            }
            if let Some(b) = buckets.get_mut(i) {
                *b = tag;
            }
        }
        Self { seed, buckets }
    }

    fn find<'k>(&self, keys: &'k [KeyEntry], key: LoadKey) -> Option<&'k KeyEntry> {
        let n = self.buckets.len();
        if n == 0 {
            return None;
        }
        let mask = n - 1;
        let mut i = mix(key, self.seed) & mask;
        for _ in 0..n {
            let tag = *self.buckets.get(i)?;
            let e = keys.get(usize::try_from(tag).ok()?.checked_sub(1)?)?;
            if e.key == key {
                return Some(e);
            }
            i = (i + 1) & mask;
        }
        None
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(worker: u64, rank: u32, pos: u32) -> KeyEntry {
        KeyEntry {
            key: LoadKey::new(InstanceId::new(worker), rank),
            slot: pos,
            epoch: u64::from(pos) + 1,
            worker: 0,
        }
    }

    /// Every admitted key is found with its own entry, and keys not admitted are not, for
    /// maps from empty to a few thousand keys (dense ids, ids differing only in high bits,
    /// many ranks of one worker): the hashed index answers as the binary search it replaced.
    #[test]
    fn the_index_finds_exactly_the_admitted_keys() {
        for n in [0usize, 1, 2, 7, 8, 9, 100, 1000, 4097] {
            let mut keys: Vec<KeyEntry> = (0..n as u64)
                .map(|i| {
                    let worker = match i % 3 {
                        0 => i,
                        1 => i << 40,
                        _ => 77,
                    };
                    entry(worker, (i % 5) as u32 + (i as u32 / 3), i as u32)
                })
                .collect();
            keys.sort_by_key(|e| e.key);
            keys.dedup_by_key(|e| e.key);
            let map = SlotMap::new(0, LiveSet::default(), keys.clone());
            for e in &keys {
                assert_eq!(map.entry(e.key), Some(e), "n={n}: {e:?}");
                let by_search = keys.binary_search_by_key(&e.key, |k| k.key).ok();
                assert_eq!(by_search.map(|i| &keys[i]), map.entry(e.key));
            }
            for probe in [
                (5u64, 1_000_000u32),
                (u64::MAX, 0),
                (77, u32::MAX),
                (3 << 40, 9),
            ] {
                let key = LoadKey::new(InstanceId::new(probe.0), probe.1);
                let present = keys.iter().any(|e| e.key == key);
                assert_eq!(map.entry(key).is_some(), present, "n={n}: {key:?}");
            }
        }
    }

    #[test]
    fn an_empty_map_finds_nothing() {
        let map = SlotMap::default();
        assert_eq!(map.entry(LoadKey::new(InstanceId::new(1), 0)), None);
    }
}
