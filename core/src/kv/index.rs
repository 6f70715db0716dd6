//! One shard's KV-overlap index, single writer (KV-IDX-06/07/08).
//!
//! Role: [`IndexWriter`] applies one shard's decoded `stored` / `removed` / `cleared` events
//! (after the [`super::handler`] rules) and publishes them to the readers of every shard
//! ([`super::shared`]). Nodes are built from the root along the `tokens_hash` path; a node is
//! identified by its path hash ([`path_hash`]), so the nodes sit in one flat table keyed by path
//! hash (a hashed radix tree). Each rank has a slot (its bit in every owner set; the lowest free
//! slot is reused first) and a map from engine `block_hash` to path hash
//! ([`super::arena::KeyMap`]); two engine hashes may name one node, so a rank's hold on a node is
//! reference counted: it owns the node while at least one of its engine hashes points there.
//! A call loads the table lines its first blocks need (and those of the previous batch's
//! replay) before it uses them, so the cache misses of a batch overlap instead of queueing.
//!
//! Accounting: a *block* of a rank is one engine hash it holds ([`IndexWriter::rank_blocks`]); an
//! *ownership* is one `(rank, block)` pair, charged to the shared [`Budget`] (so every map entry the
//! index keeps is bounded); a *node* is one path hash owned by at least one rank of this index.
//!
//! Invariants:
//! - KV-IDX-08: a block is admitted only if its rank stays within [`Caps::blocks_per_rank`], the
//!   budget grants an ownership and, when the rank does not own the node yet, the node stays
//!   within [`Caps::owners_per_node`] and (for a new node) the budget grants a node; otherwise it
//!   is refused and so is the rest of its chain (later blocks hang under it); nothing else changes;
//! - a `stored` whose parent engine hash the rank does not hold changes nothing
//!   (`parent_missing`);
//! - a stored block whose engine hash the rank already holds for the same node is a no-op
//!   (applied); for another node, the old mapping is dropped first (the engine reused the hash);
//! - `nodes() == nodes in the writer's copy`, `ownerships() == Σ rank_blocks`, and both are what
//!   this index holds of the budget (given back on drop); a rank's slot is freed only once it
//!   holds nothing (so no owner set still has its bit);
//! - the writer never reads the published copy and readers never see unpublished writes, except
//!   that a writer left unpublished for [`MAX_UNPUBLISHED_OPS`] ops publishes by itself (between
//!   two operations, never inside one) so its journal stays bounded.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::arena::KeyMap;
use super::budget::Budget;
use super::keyed::Keyed;
use super::shared::{BATCH, IndexReaders, Op, Published, Table};
use super::{EngineHash, MAX_BLOCKS_PER_RANK, MAX_OWNERS_PER_NODE, StoredBlock, path_hash};
use crate::load::LoadKey;
use crate::picker::BlockHash;

/// Per-index caps (KV-IDX-08); [`Caps::DEFAULT`] in production, smaller in tests and fuzzing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Blocks (engine hashes) one rank may hold.
    pub blocks_per_rank: usize,
    /// Ranks one node may have.
    pub owners_per_node: usize,
}

impl Caps {
    /// [`MAX_BLOCKS_PER_RANK`] and [`MAX_OWNERS_PER_NODE`].
    pub const DEFAULT: Caps = Caps {
        blocks_per_rank: MAX_BLOCKS_PER_RANK,
        owners_per_node: MAX_OWNERS_PER_NODE,
    };
}

impl Default for Caps {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What one [`IndexWriter::store`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreResult {
    /// Blocks applied (including re-stores of blocks already held).
    pub applied: u32,
    /// Blocks refused by a cap: the first refused one and every block after it.
    pub over_capacity: u32,
    /// The parent engine hash is not held by the rank: nothing applied.
    pub parent_missing: bool,
}

/// A new index charged to `budget`, with the KV-IDX-08 caps.
pub fn new_index(budget: Arc<Budget>) -> (IndexWriter, IndexReaders) {
    new_index_with_caps(budget, Caps::DEFAULT)
}

/// A new index with other per-index caps (tests, fuzzing).
pub fn new_index_with_caps(budget: Arc<Budget>, caps: Caps) -> (IndexWriter, IndexReaders) {
    let keyed = Keyed::random();
    let shared = Arc::new(ArcSwap::from_pointee(Table::new(keyed)));
    let writer = IndexWriter {
        shared: Arc::clone(&shared),
        work: Arc::new(Table::new(keyed)),
        lag: Vec::new(),
        st: State {
            budget,
            caps,
            keyed,
            journal: Vec::new(),
            ranks: Vec::new(),
            free: BinaryHeap::new(),
            slots: HashMap::with_hasher(keyed),
            nodes: 0,
            ownerships: 0,
            credit: Credit::default(),
        },
    };
    (writer, IndexReaders::new(shared))
}

/// The writer of one shard's index (`Send`; one per index).
pub struct IndexWriter {
    shared: Arc<Published>,
    /// The copy the writer mutates; readers are on the other one.
    work: Arc<Table>,
    /// Ops the published copy has and `work` does not yet (replayed before the next write).
    lag: Vec<Op>,
    st: State,
}

impl fmt::Debug for IndexWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IndexWriter")
            .field("caps", &self.st.caps)
            .field("ranks", &self.st.slots.len())
            .field("nodes", &self.st.nodes)
            .field("ownerships", &self.st.ownerships)
            .finish_non_exhaustive()
    }
}

/// One rank's writer-private state.
struct Rank {
    key: LoadKey,
    /// Engine hash → path hash of its node.
    entries: KeyMap,
    /// Nodes this rank reaches through more than one engine hash: references beyond the first.
    extra: HashMap<u64, u32, Keyed>,
}

/// What [`State::detach`] did.
enum Detach {
    /// The rank did not hold the engine hash.
    NotHeld,
    /// Dropped; the rank still owns the node through another engine hash.
    StillHeld,
    /// Dropped, and it was the rank's last reference to this node (its path hash).
    Leave(u64),
}

/// Budget reserved (or freed) during one call and not yet settled with the shared [`Budget`].
#[derive(Debug, Default)]
struct Credit {
    nodes: usize,
    ownerships: usize,
}

/// Ops kept for readers between two publishes. The caller publishes after every batch (at most
/// a few thousand ops); a writer left unpublished publishes by itself, before an operation, once
/// this many are pending, so its journal (and the lag it leaves) stays bounded.
pub const MAX_UNPUBLISHED_OPS: usize = 1 << 16;

/// Reservations are taken from the budget in chunks of at most this many (and at most what the
/// call still needs), then what is left is given back at the end of the call.
const CREDIT_CHUNK: usize = 64;

/// The writer-private state (everything but the two table copies).
struct State {
    budget: Arc<Budget>,
    caps: Caps,
    keyed: Keyed,
    /// Ops applied to `work` since the last publish (the published copy lacks them).
    journal: Vec<Op>,
    ranks: Vec<Option<Rank>>,
    /// Free slots, lowest first.
    free: BinaryHeap<Reverse<u32>>,
    slots: HashMap<LoadKey, u32, Keyed>,
    nodes: usize,
    ownerships: usize,
    credit: Credit,
}

/// `work`, once no reader holds it any more, with the ops it missed replayed.
fn caught_up<'a>(work: &'a mut Arc<Table>, lag: &mut Vec<Op>) -> &'a mut Table {
    // Only readers that loaded this copy before the last `publish` can still hold it, each for
    // one `find_matches`; no new reader can reach it (it is not in the `ArcSwap`).
    let mut spins = 0u32;
    while Arc::strong_count(work) > 1 {
        if spins < 128 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        spins = spins.saturating_add(1);
    }
    // Unique by now, so this never clones; `make_mut` (not `get_mut`) only to stay panic-free.
    let table = Arc::make_mut(work);
    table.apply_all(lag);
    lag.clear();
    const KEEP: usize = 16_384;
    if lag.capacity() > KEEP {
        lag.shrink_to(KEEP);
    }
    table
}

impl IndexWriter {
    /// Stores `blocks` for `rank` as a chain under `parent` (`None`: from the root): block `i`'s
    /// parent is block `i - 1`.
    pub fn store(
        &mut self,
        rank: LoadKey,
        parent: Option<EngineHash>,
        blocks: &[StoredBlock],
    ) -> StoreResult {
        self.bound_journal();
        // Start the first blocks' loads before the replay, so the two overlap.
        std::hint::black_box(self.st.prewarm_store(&self.work, rank, parent, blocks));
        let t = caught_up(&mut self.work, &mut self.lag);
        self.st.store(t, rank, parent, blocks)
    }

    fn bound_journal(&mut self) {
        if self.st.journal.len() >= MAX_UNPUBLISHED_OPS {
            self.publish();
        }
    }

    /// Drops `hashes` from `rank` (hashes it does not hold are ignored); returns how many it held.
    pub fn remove(&mut self, rank: LoadKey, hashes: &[EngineHash]) -> u32 {
        let Some(slot) = self.st.slots.get(&rank).copied() else {
            return 0;
        };
        self.bound_journal();
        // Start the first hashes' loads before the replay, so the two overlap.
        let mut warm = self.st.rank(slot).map_or(0, |rk| {
            let head = hashes.get(..BATCH).unwrap_or(hashes);
            head.iter().fold(0, |a, eh| a ^ rk.entries.touch(eh.0))
        });
        let t = caught_up(&mut self.work, &mut self.lag);
        let mut n = 0u32;
        for few in hashes.chunks(BATCH) {
            // Stage by stage, so the cache misses of the few overlap: the rank's entries, then
            // the buckets of the nodes it lets go of.
            if let Some(rk) = self.st.rank(slot) {
                warm ^= few.iter().fold(0, |a, eh| a ^ rk.entries.touch(eh.0));
            }
            let mut leaving = [0u64; BATCH];
            let mut k = 0;
            for eh in few {
                match self.st.detach(slot, *eh) {
                    Detach::NotHeld => continue,
                    Detach::Leave(path) => {
                        if let Some(l) = leaving.get_mut(k) {
                            *l = path;
                            k += 1;
                        }
                    }
                    Detach::StillHeld => {}
                }
                n = n.saturating_add(1);
            }
            let leaving = leaving.get(..k).unwrap_or(&[]);
            warm ^= leaving.iter().fold(0, |a, p| a ^ t.touch(*p));
            for &path in leaving {
                self.st.leave(t, slot, path);
            }
        }
        std::hint::black_box(warm);
        self.st.settle();
        self.st.close_if_empty(t, slot);
        n
    }

    /// Drops every block of `rank`; returns how many it held.
    pub fn clear_rank(&mut self, rank: LoadKey) -> u32 {
        let Some(slot) = self.st.slots.get(&rank).copied() else {
            return 0;
        };
        self.bound_journal();
        let t = caught_up(&mut self.work, &mut self.lag);
        self.st.clear_slot(t, slot)
    }

    /// Makes everything written so far visible to readers, as one whole state. Cheap: a pointer
    /// swap; the copy swapped out is brought up to date at the next write.
    pub fn publish(&mut self) {
        if self.st.journal.is_empty() {
            return;
        }
        if !self.lag.is_empty() {
            // Not reachable (a write always catches up first), kept for safety.
            caught_up(&mut self.work, &mut self.lag);
        }
        let old = self.shared.swap(Arc::clone(&self.work));
        self.work = old;
        std::mem::swap(&mut self.lag, &mut self.st.journal);
    }

    /// Blocks (engine hashes) `rank` holds.
    pub fn rank_blocks(&self, rank: LoadKey) -> usize {
        self.st
            .slots
            .get(&rank)
            .and_then(|&s| self.st.rank(s))
            .map_or(0, |r| r.entries.len())
    }

    /// Every rank holding at least one block, with its block count (in no particular order).
    pub fn ranks(&self) -> impl Iterator<Item = (LoadKey, usize)> + '_ {
        self.st
            .ranks
            .iter()
            .flatten()
            .map(|r| (r.key, r.entries.len()))
    }

    /// Nodes of this index.
    pub fn nodes(&self) -> usize {
        self.st.nodes
    }

    /// Ownerships (`(rank, block)` pairs) of this index: the sum of [`Self::rank_blocks`].
    pub fn ownerships(&self) -> usize {
        self.st.ownerships
    }

    /// This index's per-index caps.
    pub fn caps(&self) -> Caps {
        self.st.caps
    }

    /// The writer's copy (tests: memory and consistency checks).
    #[cfg(test)]
    pub(crate) fn work_table(&mut self) -> &Table {
        caught_up(&mut self.work, &mut self.lag)
    }
}

impl Drop for IndexWriter {
    fn drop(&mut self) {
        self.st.budget.release_nodes(self.st.nodes);
        self.st.budget.release_ownerships(self.st.ownerships);
    }
}

impl State {
    fn rank(&self, slot: u32) -> Option<&Rank> {
        self.ranks.get(slot as usize).and_then(Option::as_ref)
    }

    fn rank_mut(&mut self, slot: u32) -> Option<&mut Rank> {
        self.ranks.get_mut(slot as usize).and_then(Option::as_mut)
    }

    /// Applies `op` to the writer's copy and journals it; returns what [`Table::apply`] does.
    fn op(&mut self, t: &mut Table, op: Op) -> bool {
        let changed = t.apply(&op);
        self.journal.push(op);
        changed
    }

    fn store(
        &mut self,
        t: &mut Table,
        rank: LoadKey,
        parent: Option<EngineHash>,
        blocks: &[StoredBlock],
    ) -> StoreResult {
        let mut r = StoreResult::default();
        let slot = self.slots.get(&rank).copied();
        let mut parent_path = match parent {
            None => None,
            Some(eh) => match slot.and_then(|s| self.rank(s)?.entries.get(eh.0)) {
                Some(p) => Some(BlockHash(p)),
                None => {
                    r.parent_missing = true;
                    return r;
                }
            },
        };
        if blocks.is_empty() {
            return r;
        }
        let slot = match slot {
            Some(s) => s,
            None => self.open_slot(t, rank),
        };
        let mut warm = 0u64;
        'chain: for (c, few) in blocks.chunks(BATCH).enumerate() {
            // The few's paths, then their lines warmed stage by stage (see `remove`).
            let mut paths = [0u64; BATCH];
            let mut prev = parent_path;
            for (p, b) in paths.iter_mut().zip(few) {
                let path = path_hash(prev, b.tokens_hash);
                *p = path.0;
                prev = Some(path);
            }
            if let Some(rk) = self.rank(slot) {
                for (p, b) in paths.iter().zip(few) {
                    warm ^= rk.entries.touch(b.block_hash.0) ^ t.touch(*p);
                }
            }
            for (j, (b, &path)) in few.iter().zip(&paths).enumerate() {
                let left = blocks.len() - c * BATCH - j;
                if !self.admit(t, slot, b.block_hash, path, left) {
                    r.over_capacity = u32::try_from(left).unwrap_or(u32::MAX);
                    break 'chain;
                }
                r.applied = r.applied.saturating_add(1);
            }
            parent_path = prev;
        }
        std::hint::black_box(warm);
        self.settle();
        self.close_if_empty(t, slot);
        r
    }

    /// Loads what the first [`BATCH`] blocks of a [`Self::store`] will touch (a read of `t`,
    /// which readers may still hold: only the plain loads, nothing is written).
    fn prewarm_store(
        &self,
        t: &Table,
        rank: LoadKey,
        parent: Option<EngineHash>,
        blocks: &[StoredBlock],
    ) -> u64 {
        let Some(rk) = self.slots.get(&rank).and_then(|&s| self.rank(s)) else {
            return 0;
        };
        let mut prev = match parent {
            None => None,
            Some(eh) => match rk.entries.get(eh.0) {
                Some(p) => Some(BlockHash(p)),
                None => return 0,
            },
        };
        let mut warm = 0;
        for b in blocks.iter().take(BATCH) {
            let path = path_hash(prev, b.tokens_hash);
            warm ^= rk.entries.touch(b.block_hash.0) ^ t.touch(path.0);
            prev = Some(path);
        }
        warm
    }

    /// Admits one block; `false`: refused by a cap (nothing changed but a dropped old mapping of
    /// the same engine hash).
    fn admit(&mut self, t: &mut Table, slot: u32, eh: EngineHash, path: u64, left: usize) -> bool {
        let Some(rk) = self.rank(slot) else {
            return false;
        };
        match rk.entries.get(eh.0) {
            Some(p) if p == path => return true,
            Some(_) => {
                self.unref(t, slot, eh);
            }
            None => {}
        }
        if self
            .rank(slot)
            .is_none_or(|rk| rk.entries.len() >= self.caps.blocks_per_rank)
        {
            return false;
        }
        if !self.take_ownership(left) {
            return false;
        }
        let state = t.owner_state(path, slot);
        if let Some((_, true)) = state {
            if let Some(rk) = self.rank_mut(slot) {
                let c = rk.extra.entry(path).or_insert(0);
                *c = c.saturating_add(1);
            }
        } else {
            let room = match state {
                Some((n, _)) => (n as usize) < self.caps.owners_per_node,
                None => self.take_node(left),
            };
            if !room {
                self.credit.ownerships += 1;
                return false;
            }
            if self.op(t, Op::Add { path, slot }) {
                self.nodes += 1;
            }
        }
        if let Some(rk) = self.rank_mut(slot) {
            rk.entries.insert(eh.0, path);
        }
        self.ownerships += 1;
        true
    }

    /// `slot` lets go of node `path` (its last reference to it).
    fn leave(&mut self, t: &mut Table, slot: u32, path: u64) {
        if self.op(t, Op::Remove { path, slot }) {
            self.nodes = self.nodes.saturating_sub(1);
            self.credit.nodes += 1;
        }
    }

    /// Drops engine hash `eh` of `slot`; returns whether the rank held it.
    fn unref(&mut self, t: &mut Table, slot: u32, eh: EngineHash) -> bool {
        match self.detach(slot, eh) {
            Detach::NotHeld => false,
            Detach::StillHeld => true,
            Detach::Leave(n) => {
                self.leave(t, slot, n);
                true
            }
        }
    }

    /// The rank-side half of [`Self::unref`]: drops the mapping and its ownership; the caller
    /// must [`Self::leave`] the node on [`Detach::Leave`].
    fn detach(&mut self, slot: u32, eh: EngineHash) -> Detach {
        let Some(rk) = self.rank_mut(slot) else {
            return Detach::NotHeld;
        };
        let Some(n) = rk.entries.remove(eh.0) else {
            return Detach::NotHeld;
        };
        let shared = !rk.extra.is_empty()
            && match rk.extra.get_mut(&n) {
                Some(c) if *c > 1 => {
                    *c -= 1;
                    true
                }
                Some(_) => {
                    rk.extra.remove(&n);
                    true
                }
                None => false,
            };
        self.ownerships = self.ownerships.saturating_sub(1);
        self.credit.ownerships += 1;
        if shared {
            Detach::StillHeld
        } else {
            Detach::Leave(n)
        }
    }

    fn clear_slot(&mut self, t: &mut Table, slot: u32) -> u32 {
        let Some(mut rk) = self.ranks.get_mut(slot as usize).and_then(Option::take) else {
            return 0;
        };
        let held = rk.entries.len();
        for (_, n) in rk.entries.iter() {
            // Each node once: skip the references beyond the first.
            if let Some(c) = rk.extra.get_mut(&n).filter(|c| **c > 0) {
                *c -= 1;
                continue;
            }
            self.leave(t, slot, n);
        }
        self.ownerships = self.ownerships.saturating_sub(held);
        self.credit.ownerships += held;
        self.settle();
        self.free_slot(t, slot, rk.key);
        u32::try_from(held).unwrap_or(u32::MAX)
    }

    fn open_slot(&mut self, t: &mut Table, key: LoadKey) -> u32 {
        let slot = match self.free.pop() {
            Some(Reverse(s)) => s,
            None => {
                self.ranks.push(None);
                u32::try_from(self.ranks.len() - 1).unwrap_or(u32::MAX)
            }
        };
        let need = slot as usize / 64 + 1;
        if need > t.words() {
            let words = need.max(t.words().saturating_mul(2));
            self.op(
                t,
                Op::Widen {
                    words: u32::try_from(words).unwrap_or(u32::MAX),
                },
            );
        }
        if let Some(r) = self.ranks.get_mut(slot as usize) {
            *r = Some(Rank {
                key,
                entries: KeyMap::new(self.keyed),
                extra: HashMap::with_hasher(self.keyed),
            });
        }
        self.slots.insert(key, slot);
        self.op(
            t,
            Op::Key {
                slot,
                key: Some(key),
            },
        );
        slot
    }

    fn close_if_empty(&mut self, t: &mut Table, slot: u32) {
        let Some(r) = self.ranks.get_mut(slot as usize) else {
            return;
        };
        if let Some(key) = r.as_ref().filter(|r| r.entries.is_empty()).map(|r| r.key) {
            *r = None;
            self.free_slot(t, slot, key);
        }
    }

    /// Forgets a slot whose rank is already gone from `ranks`.
    fn free_slot(&mut self, t: &mut Table, slot: u32, key: LoadKey) {
        self.slots.remove(&key);
        self.free.push(Reverse(slot));
        self.op(t, Op::Key { slot, key: None });
    }

    fn take_ownership(&mut self, left: usize) -> bool {
        if self.credit.ownerships == 0 {
            self.credit.ownerships = self.budget.reserve_ownerships(left.min(CREDIT_CHUNK));
        }
        if self.credit.ownerships == 0 {
            return false;
        }
        self.credit.ownerships -= 1;
        true
    }

    fn take_node(&mut self, left: usize) -> bool {
        if self.credit.nodes == 0 {
            self.credit.nodes = self.budget.reserve_nodes(left.min(CREDIT_CHUNK));
        }
        if self.credit.nodes == 0 {
            return false;
        }
        self.credit.nodes -= 1;
        true
    }

    /// Gives the call's unused or freed budget back.
    fn settle(&mut self) {
        self.budget
            .release_nodes(std::mem::take(&mut self.credit.nodes));
        self.budget
            .release_ownerships(std::mem::take(&mut self.credit.ownerships));
    }
}
