//! The read side of the shard indexes: what every shard reads at pick time (KV-IDX-07).
//!
//! Role: a `Table` is the reader-visible state of one shard's index: its nodes in an
//! open-addressing table keyed by path hash ([`super::arena::NodeTable`]; a request's
//! [`BlockHash`]es look them up directly), each bucket holding the node's owner set, and the
//! slot → rank map. An owner set is a bitset over the index's rank *slots* (bit `s`: the rank in
//! slot `s` owns the node), kept inline in the bucket as one word when every owner falls in one
//! 64-slot word (the usual case), else spilled to a chunk of `words` words. The index keeps two
//! copies. Readers get the published one from an `ArcSwap`; the single writer
//! ([`super::index::IndexWriter`]) mutates the other, which is also its own view of the nodes,
//! then publishes it by swapping it in, and brings the copy it got back up to date by replaying
//! the [`Op`]s that copy missed: one bucket update per op (a bit set or cleared, the node
//! inserted or removed with its first or last owner), no allocation once the tables have grown.
//! The replay loads the buckets of [`BATCH`] ops before it applies them, so their cache misses
//! overlap.
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
//!   each, microseconds) and only at its next write; readers never wait at all. (Before it waits
//!   it may *read* that copy to warm its caches; reading a shared `Arc` is always allowed.)
//!
//! Match walk: per rank, the length of the longest run of prompt blocks the rank owns
//! contiguously from the root. The walk keeps the set of ranks still matching as a bitset
//! (`active`, first the first node's owners), its size and the range of its words that may be
//! non-zero; per prompt block it looks the node up and visits the ranks of `active & !owners` at
//! the current depth (they stop there) and keeps `active & owners`. Cheapest first:
//! - an inline node over the one word `active` still has, with no rank stopping: one compare;
//! - a spilled node with as many owners as `active` and the same fingerprint (the XOR of a keyed
//!   64-bit mix of each slot, kept in the bucket; `active`'s is computed only when needed, after
//!   ranks dropped): the same set, skipped without reading its chunk;
//! - otherwise the AND-NOT word by word over `active`'s live words.
//!
//! Collision argument (the one inexact step): for a different set of the same size to pass, the
//! XOR of the mixes over the symmetric difference of the two sets (non-empty) must be zero. The
//! mix is the splitmix64 finaliser of the slot plus a per-index secret from `std`'s
//! `RandomState`; slots are ours and the secret is unknown to the fleet, so no input can steer
//! the mixes, and modelling the finaliser as a random function (the usual model for it), that
//! XOR is uniform over 2^64 values: a false skip has probability 2^-64 per tested depth. Its only
//! effect would be one rank's overlap miscounted for one request, never a panic or a rank of
//! another index.
//!
//! Invariants:
//! - every node in a copy has a non-empty owner set (an ownerless node is removed by the op that
//!   clears its last bit), and every set bit is a slot mapped to a rank in the same copy;
//! - `words * 64` covers every slot in use: the writer widens the sets (an [`Op::Widen`]) before
//!   it hands out a slot beyond them (at least doubling), and reuses the lowest free slot first,
//!   so `words` stays below twice `ceil(peak ranks / 64)`; only spilled sets pay for it
//!   (`8 * words` bytes each), an inline one costs its bucket alone;
//! - both copies replay the same ops from empty, so they hold the same nodes and sets after each
//!   publish (their bucket layouts may differ; nothing depends on it);
//! - the node and slot tables hash with keys seeded per index (`RandomState`), so fleet-chosen
//!   hashes cannot pile up in one probe run (the one use of randomness in this module);
//! - `find_matches` allocates nothing beyond its handle's reused scratch and never panics
//!   (re-entered from its own callback, it falls back to a fresh scratch);
//! - `find_positions` reports ranks through the caller's slot → position map, which it rebuilds
//!   whenever the map was made for another index (indexes are numbered per process), another
//!   slot → rank map (each copy counts the slot assignments it replayed: the same count in both
//!   copies names the same map) or another candidate list (`crate::picker::positions`);
//!   `fill_positions` writes the same reports into the caller's array by position, the walk
//!   compiled with the write inlined (no call per rank: what a pick uses).

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

use super::arena::{NodeTable, Owners, word_mix};
use super::keyed::Keyed;
use crate::load::LoadKey;
use crate::picker::{
    BlockHash, OverlapSource, PartPositions, Positions, PromptBlocks, RankPositions,
};

/// A change to a [`Table`], journalled by the writer to replay on the other copy.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    /// `slot` owns node `path` (created if absent).
    Add { path: u64, slot: u32 },
    /// `slot` no longer owns node `path` (removed when ownerless).
    Remove { path: u64, slot: u32 },
    /// `slot` now names `key` (`None`: free).
    Key { slot: u32, key: Option<LoadKey> },
    /// Owner sets are `words` words from now on (more than before).
    Widen { words: u32 },
}

/// Ops or blocks warmed up together (see [`Table::apply_all`]).
pub(crate) const BATCH: usize = 16;

/// The reader-visible state of one index (one of its two copies).
#[derive(Clone)]
pub(crate) struct Table {
    nodes: NodeTable,
    keys: Vec<Option<LoadKey>>,
    /// How many [`Op::Key`]s this copy applied: both copies replay the same ops, so a count
    /// names one slot → rank map (what a reader's position cache is keyed by).
    layout: u64,
}

impl fmt::Debug for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table")
            .field("nodes", &self.nodes.len())
            .field("words", &self.nodes.words())
            .field("slots", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl Table {
    pub(crate) fn new(keyed: Keyed) -> Self {
        Self {
            nodes: NodeTable::new(keyed),
            keys: Vec::new(),
            layout: 0,
        }
    }

    /// Nodes in this copy (tests).
    #[cfg(test)]
    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// `(rank, node)` ownerships in this copy (tests).
    #[cfg(test)]
    pub(crate) fn owner_entries(&self) -> usize {
        self.nodes.owner_counts().map(|c| c as usize).sum()
    }

    /// Words per owner set (slots `0..64 * words` are usable).
    pub(crate) fn words(&self) -> usize {
        self.nodes.words()
    }

    /// The fingerprint keys.
    fn keyed(&self) -> Keyed {
        self.nodes.keyed()
    }

    /// Node `path`'s owner count and whether `slot` owns it (`None`: no such node).
    pub(crate) fn owner_state(&self, path: u64, slot: u32) -> Option<(u32, bool)> {
        self.nodes.owner_state(path, slot)
    }

    /// Reads the bucket of node `path` (a plain load, to have it cached before a batch uses it).
    pub(crate) fn touch(&self, path: u64) -> u64 {
        self.nodes.touch(path)
    }

    /// Applies `ops` in order, a few at a time: first loading every bucket the few will touch
    /// (independent loads, so their cache misses overlap), then applying them.
    pub(crate) fn apply_all(&mut self, ops: &[Op]) {
        let mut warm = 0u64;
        for few in ops.chunks(BATCH) {
            for op in few {
                if let Op::Add { path, .. } | Op::Remove { path, .. } = *op {
                    warm ^= self.nodes.touch(path);
                }
            }
            for op in few {
                self.apply(op);
            }
        }
        std::hint::black_box(warm);
    }

    /// Applies `op`; returns whether it created (`Add`) or removed (`Remove`) a node.
    pub(crate) fn apply(&mut self, op: &Op) -> bool {
        match *op {
            Op::Add { path, slot } => self.nodes.add(path, slot),
            Op::Remove { path, slot } => self.nodes.remove(path, slot),
            Op::Key { slot, key } => {
                self.layout = self.layout.wrapping_add(1);
                let i = slot as usize;
                if self.keys.len() <= i {
                    self.keys.resize(i + 1, None);
                }
                if let Some(k) = self.keys.get_mut(i) {
                    *k = key;
                }
                while self.keys.last() == Some(&None) {
                    self.keys.pop();
                }
                false
            }
            Op::Widen { words } => {
                self.nodes.widen(words as usize);
                false
            }
        }
    }

    fn key(&self, slot: u32) -> Option<LoadKey> {
        self.keys.get(slot as usize).copied().flatten()
    }

    /// Visits every slot set in `set` (bit `b` of word `wi`: slot `64 wi + b`); returns how many
    /// (the walk's count of the ranks left, without a popcount: the baseline x86-64 target has
    /// no popcount instruction, and a word's leavers are few).
    fn visit_word(
        &self,
        wi: usize,
        mut set: u64,
        depth: u32,
        visit: &mut impl FnMut(u32, u32),
    ) -> u32 {
        let mut visited = 0;
        while set != 0 {
            let slot = (wi as u32)
                .wrapping_mul(64)
                .wrapping_add(set.trailing_zeros());
            set &= set - 1;
            visit(slot, depth);
            visited += 1;
        }
        visited
    }

    /// KV-IDX-07 over this copy; see the module docs.
    fn find_matches(
        &self,
        hashes: &[BlockHash],
        active: &mut Vec<u64>,
        visit: &mut dyn FnMut(LoadKey, u32),
    ) {
        self.walk(hashes, active, &mut |slot, depth| {
            if let Some(k) = self.key(slot) {
                visit(k, depth);
            }
        });
    }

    /// The match walk, reporting each rank as its slot (`visit(slot, blocks)`).
    fn walk(&self, hashes: &[BlockHash], active: &mut Vec<u64>, visit: &mut impl FnMut(u32, u32)) {
        let mut walk = Walk {
            active,
            lo: 0,
            hi: 0,
            depth: 0,
            count: 0,
            fp: None,
        };
        for h in hashes {
            let Some(owners) = self.nodes.get(h.0) else {
                break;
            };
            if !walk.step(self, owners, visit) {
                return;
            }
        }
        let Walk {
            active,
            lo,
            hi,
            depth,
            ..
        } = walk;
        if depth == 0 {
            return;
        }
        for (i, &a) in active.iter().enumerate().take(hi).skip(lo) {
            let _ = self.visit_word(i, a, depth, visit);
        }
    }
}

/// The state of one match walk: the ranks still matching after `depth` blocks.
struct Walk<'s> {
    active: &'s mut Vec<u64>,
    /// `active` is zero outside words `lo..hi`.
    lo: usize,
    hi: usize,
    depth: u32,
    /// Ranks in `active`.
    count: u32,
    /// The fingerprint of `active`, when known (recomputed only when needed).
    fp: Option<u64>,
}

impl Walk<'_> {
    /// Goes one block deeper, into a node with `owners`, visiting the ranks that stop here;
    /// `false` once no rank is left (every rank visited).
    fn step(&mut self, t: &Table, owners: Owners<'_>, visit: &mut impl FnMut(u32, u32)) -> bool {
        if self.depth == 0 {
            self.active.clear();
            self.active.resize(t.nodes.words(), 0);
            match owners {
                Owners::Inline { at, bits } => {
                    if let Some(a) = self.active.get_mut(at) {
                        *a = bits;
                    }
                    (self.lo, self.hi) = (at, at + 1);
                    (self.count, self.fp) = (bits.count_ones(), None);
                }
                Owners::Spilled { chunk, owners, fp } => {
                    let n = chunk.len().min(self.active.len());
                    if let (Some(a), Some(c)) = (self.active.get_mut(..n), chunk.get(..n)) {
                        a.copy_from_slice(c);
                    }
                    (self.lo, self.hi) = (0, n);
                    (self.count, self.fp) = (owners, Some(fp));
                }
            }
            self.depth = 1;
            return true;
        }
        let (lo, hi, depth) = (self.lo, self.hi, self.depth);
        if let Owners::Inline { at, bits } = owners
            && hi == lo + 1
            && at == lo
            && let Some(a) = self.active.get_mut(lo)
            && *a & !bits == 0
        {
            // The usual step: one word, no rank stops here.
            self.depth = depth.saturating_add(1);
            return true;
        }
        if let Owners::Spilled { owners, fp, .. } = owners
            && owners == self.count
        {
            let (lo, hi) = (self.lo, self.hi);
            let active = &*self.active;
            let mine = *self.fp.get_or_insert_with(|| {
                let words = active.iter().enumerate().take(hi).skip(lo);
                words.fold(0, |f, (w, a)| f ^ word_mix(t.keyed(), w, *a))
            });
            if mine == fp {
                // The same set (fingerprint argument in the module docs): no rank stops here,
                // and the chunk need not be read.
                self.depth = depth.saturating_add(1);
                return true;
            }
        }
        let Some(act) = self.active.get_mut(lo..hi) else {
            return false;
        };
        match owners {
            Owners::Inline { at, bits } => {
                for (i, a) in act.iter_mut().enumerate() {
                    let keep = if lo + i == at { bits } else { 0 };
                    let gone = *a & !keep;
                    if gone != 0 {
                        let left = t.visit_word(lo + i, gone, depth, visit);
                        *a &= keep;
                        self.count = self.count.saturating_sub(left);
                        self.fp = None;
                    }
                }
            }
            Owners::Spilled { chunk, .. } => {
                let own = chunk.get(lo..hi).unwrap_or(&[]);
                for (i, (a, o)) in act.iter_mut().zip(own).enumerate() {
                    let gone = *a & !*o;
                    if gone != 0 {
                        let left = t.visit_word(lo + i, gone, depth, visit);
                        *a &= *o;
                        self.count = self.count.saturating_sub(left);
                        self.fp = None;
                    }
                }
            }
        }
        while self.lo < self.hi && self.active.get(self.lo) == Some(&0) {
            self.lo += 1;
        }
        while self.hi > self.lo && self.active.get(self.hi - 1) == Some(&0) {
            self.hi -= 1;
        }
        if self.lo == self.hi {
            return false;
        }
        self.depth = depth.saturating_add(1);
        true
    }
}

/// The shared publication point of one index.
pub(crate) type Published = ArcSwap<Table>;

/// A factory of readers of one shard's index (`Clone + Send + Sync`): hand it to every thread
/// that reads, and make one [`IndexReader`] there.
#[derive(Clone)]
pub struct IndexReaders {
    shared: Arc<Published>,
    /// The index's number (see [`NEXT_INDEX`]).
    id: u64,
}

/// Numbers indexes for the readers' position caches (an address could be reused by a later
/// index; a number is not).
static NEXT_INDEX: AtomicU64 = AtomicU64::new(1);

impl fmt::Debug for IndexReaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IndexReaders").finish_non_exhaustive()
    }
}

impl IndexReaders {
    pub(crate) fn new(shared: Arc<Published>) -> Self {
        Self {
            shared,
            id: NEXT_INDEX.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// A reader for the calling thread.
    pub fn handle(&self) -> IndexReader {
        IndexReader {
            shared: Arc::clone(&self.shared),
            id: self.id,
            scratch: RefCell::new(Vec::new()),
        }
    }
}

/// One thread's reader of one shard's index (`Send`, not `Sync`).
pub struct IndexReader {
    shared: Arc<Published>,
    /// The index's number.
    id: u64,
    scratch: RefCell<Vec<u64>>,
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
        self.with_scratch(|s| table.find_matches(hashes, s, visit));
    }

    /// [`IndexReader::find_matches`] for the ranks that are candidates in `positions`, each
    /// reported as its first position there: `visit(position, blocks)`. `cache` maps this
    /// index's rank slots to positions; it is rebuilt only when this index's slot → rank map
    /// or the candidate list changed since its last use.
    pub fn find_positions(
        &self,
        hashes: &[BlockHash],
        positions: &dyn Positions,
        cache: &mut PartPositions,
        visit: &mut dyn FnMut(u32, u32),
    ) {
        self.walk_positions(hashes, positions, cache, visit);
    }

    /// [`OverlapSource::fill_positions`] over this index: [`IndexReader::find_positions`]'s
    /// reports written into `best` by the walk itself (no call per rank).
    pub fn fill_positions(
        &self,
        hashes: &[BlockHash],
        positions: &dyn Positions,
        cache: &mut PartPositions,
        best: &mut [u32],
    ) {
        self.walk_positions(hashes, positions, cache, |p, blocks| {
            if let Some(b) = best.get_mut(p as usize) {
                *b = (*b).max(blocks);
            }
        });
    }

    /// The match walk with its reports mapped to candidate positions through `cache` (brought up
    /// to date first): `report(position, blocks)`, compiled into the walk.
    fn walk_positions(
        &self,
        hashes: &[BlockHash],
        positions: &dyn Positions,
        cache: &mut PartPositions,
        mut report: impl FnMut(u32, u32),
    ) {
        let table = self.shared.load();
        cache.ensure(
            (self.id, table.layout, table.keys.len()),
            |s| table.key(s),
            positions,
        );
        let mut by_slot = |slot: u32, blocks: u32| {
            if let Some(p) = cache.get(slot) {
                report(p, blocks);
            }
        };
        self.with_scratch(|s| table.walk(hashes, s, &mut by_slot));
    }

    /// Runs `f` with this handle's walk scratch.
    fn with_scratch(&self, f: impl FnOnce(&mut Vec<u64>)) {
        match self.scratch.try_borrow_mut() {
            Ok(mut s) => f(&mut s),
            // Re-entered from a visit: correct, just not allocation-free.
            Err(_) => f(&mut Vec::new()),
        }
    }
}

/// Every shard's index read as one [`OverlapSource`]: each rank lives in exactly one shard's
/// index, so the union is disjoint and every rank is visited at most once.
#[derive(Debug, Clone, Copy)]
pub struct Merged<'a>(pub &'a [IndexReader]);

impl Merged<'_> {
    /// Calls `f` with every shard's reader and its part of `cache` (part `i` is reader `i`'s).
    fn each_part(
        &self,
        cache: &mut RankPositions,
        mut f: impl FnMut(&IndexReader, &mut PartPositions),
    ) {
        for (i, r) in self.0.iter().enumerate() {
            if let Some(part) = cache.part(i) {
                f(r, part);
            }
        }
    }

    /// Whether `rank` owns the node `block` (any depth: a node is found by its path hash) in
    /// any shard's index, as last published.
    pub fn holds(&self, rank: LoadKey, block: BlockHash) -> bool {
        let mut found = false;
        for r in self.0 {
            r.find_matches(std::slice::from_ref(&block), &mut |k, _| found |= k == rank);
            if found {
                return true;
            }
        }
        false
    }
}

impl OverlapSource for Merged<'_> {
    fn find_matches(&self, prompt: PromptBlocks<'_>, visit: &mut dyn FnMut(LoadKey, u32)) {
        for r in self.0 {
            r.find_matches(prompt.hashes, visit);
        }
    }

    fn find_positions(
        &self,
        prompt: PromptBlocks<'_>,
        positions: &dyn Positions,
        cache: &mut RankPositions,
        visit: &mut dyn FnMut(u32, u32),
    ) {
        self.each_part(cache, |r, part| {
            r.find_positions(prompt.hashes, positions, part, visit);
        });
    }

    fn fill_positions(
        &self,
        prompt: PromptBlocks<'_>,
        positions: &dyn Positions,
        cache: &mut RankPositions,
        best: &mut [u32],
    ) {
        self.each_part(cache, |r, part| {
            r.fill_positions(prompt.hashes, positions, part, best);
        });
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
