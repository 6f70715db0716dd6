//! The read side of the shard indexes: what every shard reads at pick time (KV-IDX-07).
//!
//! Role: a `Table` is the reader-visible state of one shard's index: the nodes, keyed by path
//! hash (so a request's [`BlockHash`]es look them up directly), each with the sorted slots of the
//! ranks owning it, and the slot → rank map. The index keeps two copies. Readers get the
//! published one from an `ArcSwap`; the single writer ([`super::index::IndexWriter`]) mutates the
//! other, which is also its own view of the nodes, then publishes it by swapping it in, and
//! brings the copy it got back up to date by replaying the ops that copy missed.
//!
//! Concurrency argument (no `unsafe` here; the type system carries it):
//! - readers only ever hold an `Arc<Table>` loaded from the `ArcSwap` for the length of one
//!   [`IndexReader::find_matches`], take no lock, and never write;
//! - the writer mutates a copy only through `Arc::make_mut` once `Arc::strong_count` is 1: a copy
//!   that is not in the `ArcSwap` can gain no new reader (no one else holds it), and after
//!   `ArcSwap::swap` returns, every reader still on the old copy is counted in its strong count
//!   (arc-swap pays the debts of fast-path guards before it returns the old value). So no reader
//!   ever sees a copy while it changes: each sees the state of one whole `publish`;
//! - the writer waits only for reads begun before its previous `publish` (one `find_matches`
//!   each, microseconds) and only at its next write; readers never wait at all.
//!
//! Match walk: per rank, the length of the longest run of prompt blocks the rank owns
//! contiguously from the root. The walk looks each prompt block up by its hash and keeps the
//! set of ranks still matching (sorted slots), visiting a rank at the depth where it stops. Each
//! node keeps a fingerprint of its owner set: the XOR of a keyed 64-bit mix of each owner's slot.
//! Per depth, cheapest first:
//! - same owner count and fingerprint as the active set: the same set, skipped in O(1);
//! - a few ranks fewer (at most one in `GALLOP_RATIO`): assuming the node's owners are a subset
//!   of the active set (the usual shape: ranks hold prefixes), the missing slots are found by
//!   galloping, O(log n) each, and the candidate is accepted only if the active fingerprint less
//!   theirs is the node's;
//! - otherwise one merge, comparing 16 slots at a time through runs that agree.
//!
//! Collision argument: for a wrong set to pass a fingerprint test, the XOR of the mixes over
//! the symmetric difference of the two sets (non-empty) must be zero. The mix is the splitmix64
//! finaliser of the slot plus a per-index secret from `std`'s `RandomState`; slots are ours and
//! the secret is unknown to the fleet, so no input can steer the mixes, and modelling the
//! finaliser as a random function (the usual model for it), that XOR is uniform over 2^64 values:
//! a false pass has probability 2^-64 per tested depth. Its only effect would be one rank's
//! overlap miscounted for one request, never a panic or a rank of another index.
//!
//! Invariants:
//! - owner lists are sorted, without duplicates, never empty (an ownerless node is removed), and
//!   every slot in them maps to a rank in the same copy;
//! - the node and slot tables hash with keys seeded per index (`RandomState`), so fleet-chosen
//!   hashes cannot pile up in one bucket (the one use of randomness in this module);
//! - `find_matches` allocates nothing beyond its handle's reused scratch and never panics
//!   (re-entered from its own callback, it falls back to a fresh scratch).

use std::cell::RefCell;
use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::load::LoadKey;
use crate::picker::{BlockHash, OverlapSource, PromptBlocks};

/// A hash-table key builder seeded per index: a folded 64×64→128-bit multiply with secret keys
/// (the construction of foldhash / aHash's fallback).
#[derive(Clone, Copy)]
pub(crate) struct Keyed {
    k0: u64,
    k1: u64,
}

impl fmt::Debug for Keyed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Keyed(<secret>)")
    }
}

impl Keyed {
    /// Fresh secret keys.
    pub(crate) fn random() -> Self {
        let s = RandomState::new();
        let k0 = s.hash_one(0x243F_6A88_85A3_08D3_u64);
        let k1 = s.hash_one(k0) | 1;
        Self { k0, k1 }
    }

    /// The fingerprint contribution of one owner slot.
    pub(crate) fn slot_mix(self, slot: u32) -> u64 {
        mix64(u64::from(slot).wrapping_add(self.k0))
    }
}

fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// The splitmix64 finaliser (a bijection of `u64`).
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The hasher [`Keyed`] builds.
#[derive(Debug)]
pub(crate) struct KeyedHasher {
    state: u64,
    k1: u64,
}

impl BuildHasher for Keyed {
    type Hasher = KeyedHasher;

    fn build_hasher(&self) -> KeyedHasher {
        KeyedHasher {
            state: self.k0,
            k1: self.k1,
        }
    }
}

impl Hasher for KeyedHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.state = fold(self.state ^ x, self.k1);
    }

    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }

    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }

    fn finish(&self) -> u64 {
        self.state
    }
}

/// One node: the ranks owning it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Node {
    /// XOR of [`Keyed::slot_mix`] over `owners`.
    fp: u64,
    /// Sorted owner slots, exact length (no spare capacity).
    owners: Box<[u32]>,
}

/// A change to a [`Table`], journalled by the writer to replay on the other copy.
#[derive(Debug)]
pub(crate) enum Op {
    /// `slot` owns node `path` (created if absent).
    Add { path: u64, slot: u32 },
    /// `slot` no longer owns node `path` (removed when ownerless).
    Remove { path: u64, slot: u32 },
    /// `slot` no longer owns any of `paths`.
    RemoveAll { slot: u32, paths: Box<[u64]> },
    /// `slot` now names `key` (`None`: free).
    Key { slot: u32, key: Option<LoadKey> },
}

/// The reader-visible state of one index (one of its two copies).
#[derive(Clone)]
pub(crate) struct Table {
    nodes: HashMap<u64, Node, Keyed>,
    keys: Vec<Option<LoadKey>>,
    keyed: Keyed,
}

impl fmt::Debug for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table")
            .field("nodes", &self.nodes.len())
            .field("slots", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl Table {
    pub(crate) fn new(keyed: Keyed) -> Self {
        Self {
            nodes: HashMap::with_hasher(keyed),
            keys: Vec::new(),
            keyed,
        }
    }

    /// Nodes in this copy (tests).
    #[cfg(test)]
    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The owner count of node `path`, `None` without the node.
    pub(crate) fn owner_count(&self, path: u64) -> Option<usize> {
        self.nodes.get(&path).map(|n| n.owners.len())
    }

    /// Whether `slot` owns node `path`.
    pub(crate) fn owns(&self, path: u64, slot: u32) -> bool {
        self.nodes
            .get(&path)
            .is_some_and(|n| n.owners.binary_search(&slot).is_ok())
    }

    /// `(rank, node)` ownerships in this copy (tests).
    #[cfg(test)]
    pub(crate) fn owner_entries(&self) -> usize {
        self.nodes.values().map(|n| n.owners.len()).sum()
    }

    /// Applies `op`; returns `(nodes created, nodes removed)`.
    pub(crate) fn apply(&mut self, op: &Op) -> (usize, usize) {
        match op {
            Op::Add { path, slot } => (usize::from(self.add(*path, *slot)), 0),
            Op::Remove { path, slot } => (0, usize::from(self.remove(*path, *slot))),
            Op::RemoveAll { slot, paths } => {
                (0, paths.iter().filter(|p| self.remove(**p, *slot)).count())
            }
            Op::Key { slot, key } => {
                let i = *slot as usize;
                if self.keys.len() <= i {
                    self.keys.resize(i + 1, None);
                }
                if let Some(k) = self.keys.get_mut(i) {
                    *k = *key;
                }
                while self.keys.last() == Some(&None) {
                    self.keys.pop();
                }
                (0, 0)
            }
        }
    }

    /// Returns whether the node was created.
    fn add(&mut self, path: u64, slot: u32) -> bool {
        let mix = self.keyed.slot_mix(slot);
        let mut created = false;
        let node = self.nodes.entry(path).or_insert_with(|| {
            created = true;
            Node::default()
        });
        if let Err(pos) = node.owners.binary_search(&slot) {
            let mut v = Vec::with_capacity(node.owners.len() + 1);
            v.extend_from_slice(&node.owners[..pos]);
            v.push(slot);
            v.extend_from_slice(&node.owners[pos..]);
            node.owners = v.into_boxed_slice();
            node.fp ^= mix;
        }
        created
    }

    /// Returns whether the node was removed (its last owner left).
    fn remove(&mut self, path: u64, slot: u32) -> bool {
        let mix = self.keyed.slot_mix(slot);
        let Some(node) = self.nodes.get_mut(&path) else {
            return false;
        };
        let Ok(pos) = node.owners.binary_search(&slot) else {
            return false;
        };
        if node.owners.len() == 1 {
            self.nodes.remove(&path);
            return true;
        }
        let mut v = Vec::with_capacity(node.owners.len() - 1);
        v.extend_from_slice(&node.owners[..pos]);
        v.extend_from_slice(&node.owners[pos + 1..]);
        node.owners = v.into_boxed_slice();
        node.fp ^= mix;
        false
    }

    fn key(&self, slot: u32) -> Option<LoadKey> {
        self.keys.get(slot as usize).copied().flatten()
    }

    /// KV-IDX-07 over this copy; see the module docs.
    fn find_matches(
        &self,
        hashes: &[BlockHash],
        scratch: &mut Scratch,
        visit: &mut dyn FnMut(LoadKey, u32),
    ) {
        let Some((first, rest)) = hashes.split_first() else {
            return;
        };
        let Some(n0) = self.nodes.get(&first.0) else {
            return;
        };
        let Scratch { cur, next, drops } = scratch;
        // The active set: a node's owner list, or `cur` (after an intersection that dropped
        // owners not active before).
        let mut node_active: Option<&[u32]> = Some(&n0.owners);
        let mut fp = n0.fp;
        let mut depth: u32 = 1;
        for h in rest {
            let Some(n) = self.nodes.get(&h.0) else {
                break;
            };
            let active: &[u32] = node_active.unwrap_or(cur);
            if n.owners.len() == active.len() && n.fp == fp {
                depth = depth.saturating_add(1);
                continue;
            }
            let fewer = active.len().saturating_sub(n.owners.len());
            if fewer > 0
                && fewer.saturating_mul(GALLOP_RATIO) <= active.len()
                && nested_drops(active, &n.owners, drops)
                && drops.iter().fold(fp, |f, s| f ^ self.keyed.slot_mix(*s)) == n.fp
            {
                // The node's owners are the active set less `drops` (a handful).
                for &s in drops.iter() {
                    if let Some(k) = self.key(s) {
                        visit(k, depth);
                    }
                }
                node_active = Some(&n.owners);
                fp = n.fp;
                depth = depth.saturating_add(1);
                continue;
            }
            let strays = self.drop_missing(active, &n.owners, depth, visit);
            if strays == 0 {
                node_active = Some(&n.owners);
                fp = n.fp;
            } else {
                next.clear();
                fp = intersect(active, &n.owners, next, self.keyed);
                std::mem::swap(cur, next);
                node_active = None;
            }
            if node_active.unwrap_or(cur).is_empty() {
                return;
            }
            depth = depth.saturating_add(1);
        }
        for &s in node_active.unwrap_or(cur) {
            if let Some(k) = self.key(s) {
                visit(k, depth);
            }
        }
    }

    /// Visits `(rank, depth)` for every slot of `active` not in `owners` (both sorted); returns
    /// how many slots of `owners` are not in `active`.
    fn drop_missing(
        &self,
        active: &[u32],
        owners: &[u32],
        depth: u32,
        visit: &mut dyn FnMut(LoadKey, u32),
    ) -> usize {
        const RUN: usize = 16;
        let (mut i, mut j, mut strays) = (0, 0, 0);
        loop {
            while let (Some(a), Some(o)) = (active.get(i..i + RUN), owners.get(j..j + RUN)) {
                if a != o {
                    break;
                }
                i += RUN;
                j += RUN;
            }
            let Some(&a) = active.get(i) else {
                break;
            };
            match owners.get(j) {
                Some(&o) if o == a => {
                    i += 1;
                    j += 1;
                }
                Some(&o) if o < a => {
                    strays += 1;
                    j += 1;
                }
                _ => {
                    if let Some(k) = self.key(a) {
                        visit(k, depth);
                    }
                    i += 1;
                }
            }
        }
        strays + owners.len().saturating_sub(j)
    }
}

/// The nested path is taken when at most one active rank in this many stops at a depth.
const GALLOP_RATIO: usize = 8;

/// Assuming `o ⊆ a` (both sorted, `o` shorter), `out = a \ o`, found by galloping: with `m`
/// slots of `a` missing from `o` before position `x`, `a[x + m] == o[x]` holds up to the next
/// missing slot and fails from there on, so each missing slot costs one exponential plus binary
/// search. Returns `false` when the assumption visibly fails (then `out` is meaningless); a
/// `true` is only a candidate, which the caller confirms with the fingerprints.
fn nested_drops(a: &[u32], o: &[u32], out: &mut Vec<u32>) -> bool {
    out.clear();
    let missing = a.len().saturating_sub(o.len());
    let mut m = 0;
    let mut x = 0;
    loop {
        x = first_mismatch(a, o, x, m);
        let Some(&ox) = o.get(x) else {
            let tail = a.get(o.len() + m..).unwrap_or(&[]);
            out.extend_from_slice(tail);
            return out.len() == missing;
        };
        match a.get(x + m) {
            Some(&ax) if ax < ox && m < missing => {
                out.push(ax);
                m += 1;
            }
            _ => return false,
        }
    }
}

/// The first `x >= from` with `a[x + m] != o[x]`, or `o.len()`; equality must hold on a prefix
/// of `from..` and fail after it.
fn first_mismatch(a: &[u32], o: &[u32], from: usize, m: usize) -> usize {
    let eq = |x: usize| o.get(x).is_some_and(|v| a.get(x + m) == Some(v));
    if !eq(from) {
        return from.min(o.len());
    }
    // `lo` matches; `hi` does not (or is past the end).
    let (mut lo, mut step) = (from, 1usize);
    let mut hi = loop {
        let probe = lo.saturating_add(step);
        if probe >= o.len() {
            break o.len();
        }
        if !eq(probe) {
            break probe;
        }
        lo = probe;
        step = step.saturating_mul(2);
    };
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if eq(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// `out = a ∩ b` (both sorted); returns the fingerprint of `out`.
fn intersect(a: &[u32], b: &[u32], out: &mut Vec<u32>, keyed: Keyed) -> u64 {
    let (mut i, mut j, mut fp) = (0, 0, 0);
    while let (Some(&x), Some(&y)) = (a.get(i), b.get(j)) {
        if x == y {
            out.push(x);
            fp ^= keyed.slot_mix(x);
            i += 1;
            j += 1;
        } else if x < y {
            i += 1;
        } else {
            j += 1;
        }
    }
    fp
}

/// A reader's reusable buffers.
#[derive(Debug, Default)]
struct Scratch {
    cur: Vec<u32>,
    next: Vec<u32>,
    drops: Vec<u32>,
}

/// The shared publication point of one index.
pub(crate) type Published = ArcSwap<Table>;

/// A factory of readers of one shard's index (`Clone + Send + Sync`): hand it to every thread
/// that reads, and make one [`IndexReader`] there.
#[derive(Clone)]
pub struct IndexReaders {
    shared: Arc<Published>,
}

impl fmt::Debug for IndexReaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IndexReaders").finish_non_exhaustive()
    }
}

impl IndexReaders {
    pub(crate) fn new(shared: Arc<Published>) -> Self {
        Self { shared }
    }

    /// A reader for the calling thread.
    pub fn handle(&self) -> IndexReader {
        IndexReader {
            shared: Arc::clone(&self.shared),
            scratch: RefCell::new(Scratch::default()),
        }
    }
}

/// One thread's reader of one shard's index (`Send`, not `Sync`).
pub struct IndexReader {
    shared: Arc<Published>,
    scratch: RefCell<Scratch>,
}

impl fmt::Debug for IndexReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IndexReader").finish_non_exhaustive()
    }
}

impl IndexReader {
    /// Calls `visit(rank, blocks)` once for every rank of this index owning `hashes[0]`, with the
    /// number of blocks it owns contiguously from the first (KV-IDX-07), as last published.
    ///
    /// `visit` runs while this read holds the published copy: keep it short, and never write to
    /// an index from it (that index's writer would wait for this read to end).
    pub fn find_matches(&self, hashes: &[BlockHash], visit: &mut dyn FnMut(LoadKey, u32)) {
        let table = self.shared.load();
        match self.scratch.try_borrow_mut() {
            Ok(mut s) => table.find_matches(hashes, &mut s, visit),
            // Re-entered from `visit`: correct, just not allocation-free.
            Err(_) => table.find_matches(hashes, &mut Scratch::default(), visit),
        }
    }
}

/// Every shard's index read as one [`OverlapSource`]: each rank lives in exactly one shard's
/// index, so the union is disjoint and every rank is visited at most once.
#[derive(Debug, Clone, Copy)]
pub struct Merged<'a>(pub &'a [IndexReader]);

impl OverlapSource for Merged<'_> {
    fn find_matches(&self, prompt: PromptBlocks<'_>, visit: &mut dyn FnMut(LoadKey, u32)) {
        for r in self.0 {
            r.find_matches(prompt.hashes, visit);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::super::budget::Budget;
    use super::super::index::new_index;
    use super::super::test_support::{blocks, key, prompt};
    use super::*;

    const L: usize = 48;
    const GROUP: u32 = 4;
    const BATCHES: usize = 1000;

    /// Batch `k` leaves group 1 holding `f(k)` blocks of the chain and group 2 `L - f(k)`.
    fn f(k: usize) -> usize {
        (k * 13) % (L + 1)
    }

    #[test]
    fn readers_never_see_a_torn_batch() {
        let tokens: Vec<u64> = (0..L as u64).map(|t| 7000 + t).collect();
        let p = prompt(&tokens);
        let (mut w, readers) = new_index(Arc::new(Budget::new()));
        // Per (group, rank) salt: the chain's blocks with that rank's engine hashes.
        let salted: Vec<Vec<_>> = (0..2 * GROUP)
            .map(|s| blocks(&tokens, 0, u64::from(s)))
            .collect();
        let stop = AtomicBool::new(false);
        let seen: Vec<BTreeSet<u32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let readers = readers.clone();
                    let (p, stop) = (&p, &stop);
                    s.spawn(move || {
                        let r = readers.handle();
                        let mut seen = BTreeSet::new();
                        let mut rounds = 0u32;
                        while !stop.load(Ordering::Relaxed) && rounds < 2_000_000 {
                            let (mut g1, mut g2) = (Vec::new(), Vec::new());
                            r.find_matches(p, &mut |k, n| {
                                let g = if k.worker_id.get() == 1 {
                                    &mut g1
                                } else {
                                    &mut g2
                                };
                                g.push(n);
                            });
                            let x = whole(&g1);
                            let y = whole(&g2);
                            assert_eq!(x + y, L as u32, "torn: group 1 {g1:?}, group 2 {g2:?}");
                            seen.insert(x);
                            rounds += 1;
                            if rounds.is_multiple_of(16) {
                                // Leave the (possibly shared) cores to the writer now and then.
                                std::thread::yield_now();
                            }
                        }
                        seen
                    })
                })
                .collect();
            let mut len = [[0usize; GROUP as usize]; 2];
            for k in 0..BATCHES {
                let target = [f(k), L - f(k)];
                for (g, t) in target.into_iter().enumerate() {
                    for rank in 0..GROUP {
                        let at = &mut len[g][rank as usize];
                        let rk = key(g as u64 + 1, rank);
                        let chain = &salted[g * GROUP as usize + rank as usize];
                        if t < *at {
                            let gone: Vec<_> = chain[t..*at].iter().map(|b| b.block_hash).collect();
                            w.remove(rk, &gone);
                        } else if t > *at {
                            let parent = at.checked_sub(1).map(|i| chain[i].block_hash);
                            w.store(rk, parent, &chain[*at..t]);
                        }
                        *at = t;
                    }
                }
                w.publish();
            }
            stop.store(true, Ordering::Relaxed);
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_default())
                .collect()
        });
        let distinct: BTreeSet<u32> = seen.iter().flatten().copied().collect();
        assert!(distinct.len() > 1, "readers saw only {distinct:?}");
    }

    /// The one count every rank of a group has (0: none visited), or a torn-state panic.
    fn whole(group: &[u32]) -> u32 {
        match group.first() {
            None => 0,
            Some(&n) => {
                assert!(
                    group.len() == GROUP as usize && group.iter().all(|m| *m == n),
                    "torn group {group:?}"
                );
                n
            }
        }
    }
}

#[cfg(test)]
mod walk_tests {
    use super::*;

    #[test]
    fn nested_drops_finds_exactly_the_missing_slots_of_a_subset() {
        let mut seed = 7u64;
        let mut rnd = move || {
            seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
            mix64(seed)
        };
        let mut out = Vec::new();
        for round in 0..3000 {
            let n = 1 + (rnd() % 200) as usize;
            let mut a: Vec<u32> = (0..n).map(|_| (rnd() % 400) as u32).collect();
            a.sort_unstable();
            a.dedup();
            let keep = 1 + rnd() % 100;
            let mut o: Vec<u32> = a.iter().copied().filter(|_| rnd() % 100 < keep).collect();
            let subset = round % 3 != 0;
            if !subset {
                // A stray: a slot not in `a`.
                o.push(1000 + (rnd() % 5) as u32);
                o.sort_unstable();
                o.dedup();
            }
            if o.len() >= a.len() {
                continue;
            }
            let ok = nested_drops(&a, &o, &mut out);
            let want: Vec<u32> = a.iter().copied().filter(|x| !o.contains(x)).collect();
            if subset {
                assert!(ok, "round {round}");
                assert_eq!(out, want, "round {round}");
            } else if ok {
                // Only a candidate: its fingerprint cannot match the node's.
                let k = Keyed::random();
                let fa = a.iter().fold(0, |f, s| f ^ k.slot_mix(*s));
                let fo = o.iter().fold(0, |f, s| f ^ k.slot_mix(*s));
                assert_ne!(
                    out.iter().fold(fa, |f, s| f ^ k.slot_mix(*s)),
                    fo,
                    "round {round}"
                );
            }
        }
    }
}
