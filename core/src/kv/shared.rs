//! The read side of the shard indexes: what every shard reads at pick time (KV-IDX-07).
//!
//! Role: a shard's index is read through its node table ([`super::nodes::Nodes`]; a request's
//! [`BlockHash`]es look nodes up directly by path hash) and its slot → rank map ([`Keys`]). An
//! owner set is a bitset over the index's rank *slots* (bit `s`: the rank in slot `s` owns the
//! node). Both are published by the single writer ([`super::index::IndexWriter`]) through an
//! `ArcSwap` each; the node table is written in place (see [`super::nodes`] for its concurrency
//! argument), the slot map is replaced whole whenever a slot is given or freed.
//!
//! What a reader sees: every node it uses is one whole state of that node, and each block is
//! seen as it stood when the walk looked at it (writes become visible as they are made, block by
//! block, as in Dynamo's own concurrent indexes; there is no batch boundary). A slot is given to
//! another rank only once no reader still holds a slot map naming its previous rank
//! ([`super::index`]), so a reader never reports one rank's blocks under another's name.
//!
//! Match walk: per rank, the length of the longest run of prompt blocks the rank owns
//! contiguously from the root. The walk keeps the set of ranks still matching as a bitset
//! (`active`, first the first node's owners), its size and the range of its words that may be
//! non-zero; per prompt block it looks the node up and visits the ranks of `active & !owners` at
//! the current depth (they stop there) and keeps `active & owners`. Cheapest first:
//! - an inline node over the one word `active` still has, with no rank stopping: one compare;
//! - a spilled node with as many owners as `active` and the same fingerprint (the XOR over the
//!   set's words of a keyed 64-bit mix of each non-zero word, kept in the bucket; `active`'s is
//!   computed only when needed, after ranks dropped, at one mix per live word, not per rank):
//!   the same set, skipped without reading its chunk;
//! - otherwise the AND-NOT word by word over `active`'s live words (the chunk's words copied and
//!   checked against the node's version first; a node that changed meanwhile is read again).
//!
//! Collision argument (the one inexact step): for a different set of the same size to pass, the
//! XOR of the mixes of both sets' words, over the words where they differ (at least one), must
//! be zero. A word's mix is the splitmix64 finaliser of the word XORed with a per-word key
//! derived from a per-index secret from `std`'s `RandomState` (for each word a bijection; an
//! empty word mixes to 0); slots are ours and the secret is unknown to the fleet, so no input
//! can steer the mixes, and modelling the finaliser as a random function (the usual model for
//! it), that XOR is uniform over 2^64 values: a false skip has probability 2^-64 per tested
//! depth. Its only effect would be one rank's overlap miscounted for one request, never a panic
//! or a rank of another index.
//!
//! Invariants:
//! - readers take no lock and never write; the writer never waits for a reader;
//! - `find_matches` allocates nothing beyond its handle's reused scratch and never panics
//!   (re-entered from its own callback, it falls back to a fresh scratch);
//! - `find_positions` reports ranks through the caller's slot → position map, which it rebuilds
//!   whenever the map was made for another index (indexes are numbered per process), another
//!   slot map (each [`Keys`] carries the count of slot changes it includes) or another candidate
//!   list (`crate::picker::positions`); `fill_positions` writes the same reports into the
//!   caller's array by position, the walk compiled with the write inlined (no call per rank:
//!   what a pick uses).

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

use super::nodes::{MAX_RETRIES, Nodes, Owners};
use crate::load::LoadKey;
use crate::picker::{
    BlockHash, OverlapSource, PartPositions, Positions, PromptBlocks, RankPositions,
};

/// How many blocks ahead of itself a walk asks for buckets.
const AHEAD: usize = 16;

/// The node-table size from which a walk prefetches (a core's L2 here; below it the table's lines
/// are mostly cached and the prefetches would be pure overhead).
const PREFETCH_ABOVE_BYTES: usize = 1 << 20;

/// One version of an index's slot → rank map.
#[derive(Debug, Clone, Default)]
pub(crate) struct Keys {
    pub(crate) keys: Vec<Option<LoadKey>>,
    /// How many slot changes this version includes (what a reader's position cache is keyed by).
    pub(crate) layout: u64,
}

impl Keys {
    fn key(&self, slot: u32) -> Option<LoadKey> {
        self.keys.get(slot as usize).copied().flatten()
    }
}

/// A walk's reused buffers.
#[derive(Debug, Default)]
struct Scratch {
    active: Vec<u64>,
    chunk: Vec<u64>,
}

/// Visits every slot set in `set` (bit `b` of word `wi`: slot `64 wi + b`); returns how many
/// (the walk's count of the ranks left, without a popcount: the baseline x86-64 target has
/// no popcount instruction, and a word's leavers are few).
fn visit_word(wi: usize, mut set: u64, depth: u32, visit: &mut impl FnMut(u32, u32)) -> u32 {
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

/// The match walk over `nodes`, reporting each rank as its slot (`visit(slot, blocks)`).
fn walk(nodes: &Nodes, hashes: &[BlockHash], s: &mut Scratch, visit: &mut impl FnMut(u32, u32)) {
    let Scratch { active, chunk } = s;
    chunk.resize(nodes.words(), 0);
    let mut walk = Walk {
        active,
        chunk,
        lo: 0,
        hi: 0,
        depth: 0,
        count: 0,
        fp: None,
    };
    let mut epoch = nodes.epoch();
    // A table that fits the caches is not worth the prefetches' instructions.
    let ahead = if nodes.bucket_bytes() > PREFETCH_ABOVE_BYTES {
        AHEAD
    } else {
        0
    };
    for h in hashes.iter().take(ahead) {
        nodes.prefetch(h.0);
    }
    'blocks: for (i, h) in hashes.iter().enumerate() {
        if ahead > 0
            && let Some(next) = hashes.get(i + ahead)
        {
            nodes.prefetch(next.0);
        }
        for _ in 0..MAX_RETRIES {
            let Some(seen) = nodes.get(h.0, &mut epoch) else {
                break 'blocks;
            };
            match walk.step(nodes, seen.owners(), visit) {
                Step::Deeper => continue 'blocks,
                Step::Done => return,
                Step::Changed => {}
            }
        }
        // The node kept changing under this read: end the match here.
        break;
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
        let _ = visit_word(i, a, depth, visit);
    }
}

/// What one [`Walk::step`] did.
enum Step {
    /// One block deeper.
    Deeper,
    /// No rank is left (every rank visited).
    Done,
    /// The node changed while its chunk was read: nothing done, read it again.
    Changed,
}

/// The state of one match walk: the ranks still matching after `depth` blocks.
struct Walk<'s> {
    active: &'s mut Vec<u64>,
    /// A spilled set's words, as last copied.
    chunk: &'s mut Vec<u64>,
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
    /// Goes one block deeper, into a node with `owners`, visiting the ranks that stop here.
    fn step(&mut self, t: &Nodes, owners: Owners, visit: &mut impl FnMut(u32, u32)) -> Step {
        if self.depth == 0 {
            self.active.clear();
            self.active.resize(t.words(), 0);
            match owners {
                Owners::Inline { at, bits } => {
                    if let Some(a) = self.active.get_mut(at) {
                        *a = bits;
                    }
                    (self.lo, self.hi) = (at, at + 1);
                    (self.count, self.fp) = (bits.count_ones(), None);
                }
                Owners::Spilled { owners, fp, seen } => {
                    let n = self.active.len();
                    if !t.chunk_into(&seen, 0, n, self.active) {
                        return Step::Changed;
                    }
                    (self.lo, self.hi) = (0, n);
                    (self.count, self.fp) = (owners, Some(fp));
                }
            }
            self.depth = 1;
            return Step::Deeper;
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
            return Step::Deeper;
        }
        if let Owners::Spilled { owners, fp, .. } = owners
            && owners == self.count
        {
            let active = &*self.active;
            let mine = *self.fp.get_or_insert_with(|| {
                let words = active.iter().enumerate().take(hi).skip(lo);
                words.fold(0, |f, (w, a)| f ^ t.keyed().word_mix(w, *a))
            });
            if mine == fp {
                // The same set (fingerprint argument in the module docs): no rank stops here,
                // and the chunk need not be read.
                self.depth = depth.saturating_add(1);
                return Step::Deeper;
            }
        }
        if let Owners::Spilled { seen, .. } = owners
            && !t.chunk_into(&seen, lo, hi, self.chunk)
        {
            return Step::Changed;
        }
        let Some(act) = self.active.get_mut(lo..hi) else {
            return Step::Done;
        };
        match owners {
            Owners::Inline { at, bits } => {
                for (i, a) in act.iter_mut().enumerate() {
                    let keep = if lo + i == at { bits } else { 0 };
                    let gone = *a & !keep;
                    if gone != 0 {
                        let left = visit_word(lo + i, gone, depth, visit);
                        *a &= keep;
                        self.count = self.count.saturating_sub(left);
                        self.fp = None;
                    }
                }
            }
            Owners::Spilled { .. } => {
                for (i, (a, o)) in act.iter_mut().zip(self.chunk.iter()).enumerate() {
                    let gone = *a & !*o;
                    if gone != 0 {
                        let left = visit_word(lo + i, gone, depth, visit);
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
            return Step::Done;
        }
        self.depth = depth.saturating_add(1);
        Step::Deeper
    }
}

/// The publication points of one index.
#[derive(Clone)]
pub(crate) struct Published {
    pub(crate) nodes: Arc<ArcSwap<Nodes>>,
    pub(crate) keys: Arc<ArcSwap<Keys>>,
}

/// A factory of readers of one shard's index (`Clone + Send + Sync`): hand it to every thread
/// that reads, and make one [`IndexReader`] there.
#[derive(Clone)]
pub struct IndexReaders {
    shared: Published,
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
    pub(crate) fn new(shared: Published) -> Self {
        Self {
            shared,
            id: NEXT_INDEX.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// A reader for the calling thread.
    pub fn handle(&self) -> IndexReader {
        IndexReader {
            shared: self.shared.clone(),
            id: self.id,
            scratch: RefCell::new(Scratch::default()),
        }
    }
}

/// One thread's reader of one shard's index (`Send`, not `Sync`).
pub struct IndexReader {
    shared: Published,
    /// The index's number.
    id: u64,
    scratch: RefCell<Scratch>,
}

impl fmt::Debug for IndexReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IndexReader").finish_non_exhaustive()
    }
}

impl IndexReader {
    /// Calls `visit(rank, blocks)` once for every rank of this index owning `hashes[0]`, with the
    /// number of blocks it owns contiguously from the first (KV-IDX-07), as the read finds them.
    ///
    /// `visit` runs while this read holds the index's tables: keep it short.
    pub fn find_matches(&self, hashes: &[BlockHash], visit: &mut dyn FnMut(LoadKey, u32)) {
        let keys = self.shared.keys.load();
        let nodes = self.shared.nodes.load();
        self.with_scratch(|s| {
            walk(&nodes, hashes, s, &mut |slot, depth| {
                if let Some(k) = keys.key(slot) {
                    visit(k, depth);
                }
            });
        });
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
        let keys = self.shared.keys.load();
        cache.ensure(
            (self.id, keys.layout, keys.keys.len()),
            |s| keys.key(s),
            positions,
        );
        let nodes = self.shared.nodes.load();
        let mut by_slot = |slot: u32, blocks: u32| {
            if let Some(p) = cache.get(slot) {
                report(p, blocks);
            }
        };
        self.with_scratch(|s| walk(&nodes, hashes, s, &mut by_slot));
    }

    /// Runs `f` with this handle's walk scratch.
    fn with_scratch(&self, f: impl FnOnce(&mut Scratch)) {
        match self.scratch.try_borrow_mut() {
            Ok(mut s) => f(&mut s),
            // Re-entered from a visit: correct, just not allocation-free.
            Err(_) => f(&mut Scratch::default()),
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
    /// any shard's index, as the read finds it.
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
mod tests;
