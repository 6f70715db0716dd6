//! One shard's KV-overlap index, single writer (KV-IDX-06/07/08).
//!
//! Role: [`IndexWriter`] applies one shard's decoded `stored` / `removed` / `cleared` events
//! (after the [`super::handler`] rules) to the one node table the readers of every shard walk
//! ([`super::nodes`], [`super::shared`]): each change is visible as it is made. Nodes are built from the root along the `tokens_hash` path; a node is
//! identified by its path hash ([`path_hash`]), so the nodes sit in one flat table keyed by path
//! hash (a hashed radix tree). Each rank has a slot (its bit in every owner set; the lowest free
//! slot is reused first) and a map from engine `block_hash` to path hash
//! ([`super::arena::KeyMap`]); two engine hashes may name one node, so a rank's hold on a node is
//! reference counted: it owns the node while at least one of its engine hashes points there.
//! A call loads the table lines its first blocks need before it uses them, and
//! [`IndexWriter::prefetch`] asks for a whole decoded batch's lines before the handler applies it,
//! so the cache misses of a batch overlap instead of queueing.
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
//! - a freed slot is given to another rank only once no reader holds a slot map from before it
//!   was freed (the retired maps' strong counts; `ArcSwap::swap` counts every guard still on the
//!   old map before it returns it), so no reader names a rank's blocks after a rank that held the
//!   slot before.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::arena::KeyMap;
use super::budget::Budget;
use super::keyed::Keyed;
use super::nodes::{MAX_BUCKET_OWNERS, NodeWriter};
use super::shared::{IndexReaders, Keys, Published};
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

/// Blocks or hashes of one call whose cache lines are loaded together (see `remove`).
const BATCH: usize = 16;

/// A new index with other per-index caps (tests, fuzzing); `owners_per_node` is clamped to what a
/// bucket counts (65,535, far above [`MAX_OWNERS_PER_NODE`]).
pub fn new_index_with_caps(budget: Arc<Budget>, caps: Caps) -> (IndexWriter, IndexReaders) {
    let keyed = Keyed::random();
    let caps = Caps {
        owners_per_node: caps.owners_per_node.min(MAX_BUCKET_OWNERS),
        ..caps
    };
    let (nodes, published) = NodeWriter::new(keyed);
    let keys = Arc::new(ArcSwap::from_pointee(Keys::default()));
    let writer = IndexWriter {
        nodes,
        st: State {
            budget,
            caps,
            keyed,
            keys_pub: Arc::clone(&keys),
            keys: Keys::default(),
            retired: Vec::new(),
            quarantine: Vec::new(),
            ranks: Vec::new(),
            free: BinaryHeap::new(),
            slots: HashMap::with_hasher(keyed),
            nodes: 0,
            ownerships: 0,
            credit: Credit::default(),
        },
    };
    let shared = Published {
        nodes: published,
        keys,
    };
    (writer, IndexReaders::new(shared))
}

/// One event a writer is about to apply, as [`IndexWriter::prefetch`] sees it.
#[derive(Debug, Clone, Copy)]
pub enum Upcoming<'a> {
    /// A `store(rank, parent, blocks)`.
    Store {
        rank: LoadKey,
        parent: Option<EngineHash>,
        blocks: &'a [StoredBlock],
    },
    /// A `remove(rank, hashes)`.
    Remove {
        rank: LoadKey,
        hashes: &'a [EngineHash],
    },
}

impl Upcoming<'_> {
    /// The rank the event is for.
    fn rank(&self) -> LoadKey {
        match *self {
            Upcoming::Store { rank, .. } | Upcoming::Remove { rank, .. } => rank,
        }
    }
}

/// Blocks or hashes per event [`IndexWriter::prefetch`] asks lines for.
const PREFETCH_PER_EVENT: usize = 8;

/// Lines [`IndexWriter::prefetch`] asks for per stage, at most (about what a core keeps in flight).
const PREFETCH_LINES: usize = 32;

/// The first [`PREFETCH_PER_EVENT`] items of an event's blocks or hashes (what a prefetch stage
/// asks lines for).
fn per_event<T>(items: &[T]) -> &[T] {
    items.get(..PREFETCH_PER_EVENT).unwrap_or(items)
}

/// Runs `f` over `events` (it returns the lines it asked for) until [`PREFETCH_LINES`] are asked.
fn lines_bounded<'a>(
    events: impl Iterator<Item = Upcoming<'a>>,
    mut f: impl FnMut(Upcoming<'a>) -> usize,
) {
    let mut lines = 0usize;
    for ev in events {
        if lines >= PREFETCH_LINES {
            break;
        }
        lines += f(ev);
    }
}

/// The writer of one shard's index (`Send`; one per index).
pub struct IndexWriter {
    nodes: NodeWriter,
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

/// Reservations are taken from the budget in chunks of at most this many (and at most what the
/// call still needs), then what is left is given back at the end of the call.
const CREDIT_CHUNK: usize = 64;

/// The writer-private state (everything but the node table).
struct State {
    budget: Arc<Budget>,
    caps: Caps,
    keyed: Keyed,
    /// Where readers load the slot map from.
    keys_pub: Arc<ArcSwap<Keys>>,
    /// The slot map as last published.
    keys: Keys,
    /// Slot maps replaced since a reader may still hold them (dropped once only this holds them).
    retired: Vec<Arc<Keys>>,
    /// Freed slots, each with the layout of the first map without it: reusable once no reader
    /// holds a map of a lower layout.
    quarantine: Vec<(u32, u64)>,
    ranks: Vec<Option<Rank>>,
    /// Free slots, lowest first.
    free: BinaryHeap<Reverse<u32>>,
    slots: HashMap<LoadKey, u32, Keyed>,
    nodes: usize,
    ownerships: usize,
    credit: Credit,
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
        self.st.store(&mut self.nodes, rank, parent, blocks)
    }

    /// Drops `hashes` from `rank` (hashes it does not hold are ignored); returns how many it held.
    pub fn remove(&mut self, rank: LoadKey, hashes: &[EngineHash]) -> u32 {
        let Some(slot) = self.st.slots.get(&rank).copied() else {
            return 0;
        };
        let t = &mut self.nodes;
        let mut warm = 0u64;
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
        self.st.close_if_empty(slot);
        n
    }

    /// Asks the CPU for the cache lines the first blocks of `events` will touch, so that their
    /// misses overlap across events instead of one event's after another's (a decode step is a
    /// one-hash removal and a one-block store, each a chain of two misses). Two stages: the ranks'
    /// engine-hash buckets (the removed hashes, the stored blocks and their parents), then, reading
    /// those, the node buckets (each removed hash's node, each stored block's path under its
    /// parent). A hint: it changes nothing, and `events` is walked twice (at most
    /// [`PREFETCH_PER_EVENT`] blocks of each event, [`PREFETCH_LINES`] lines per stage).
    pub fn prefetch<'a>(&self, events: impl Iterator<Item = Upcoming<'a>> + Clone) {
        let st = &self.st;
        let rank = |ev: &Upcoming<'_>| st.slots.get(&ev.rank()).and_then(|&s| st.rank(s));
        // Stage 1: the engine-hash buckets.
        lines_bounded(events.clone(), |ev| {
            let Some(rk) = rank(&ev) else { return 0 };
            match ev {
                Upcoming::Store { parent, blocks, .. } => {
                    if let Some(eh) = parent {
                        rk.entries.prefetch(eh.0);
                    }
                    let head = per_event(blocks);
                    for b in head {
                        rk.entries.prefetch(b.block_hash.0);
                    }
                    1 + head.len()
                }
                Upcoming::Remove { hashes, .. } => {
                    let head = per_event(hashes);
                    for eh in head {
                        rk.entries.prefetch(eh.0);
                    }
                    head.len()
                }
            }
        });
        // Stage 2: the node buckets, through what stage 1 asked for.
        lines_bounded(events, |ev| {
            let Some(rk) = rank(&ev) else { return 0 };
            match ev {
                Upcoming::Store { parent, blocks, .. } => {
                    let mut prev = match parent {
                        None => None,
                        Some(eh) => match rk.entries.get(eh.0) {
                            Some(p) => Some(BlockHash(p)),
                            None => return 0,
                        },
                    };
                    let head = per_event(blocks);
                    for b in head {
                        let path = path_hash(prev, b.tokens_hash);
                        self.nodes.prefetch(path.0);
                        prev = Some(path);
                    }
                    head.len()
                }
                Upcoming::Remove { hashes, .. } => {
                    let head = per_event(hashes);
                    for eh in head {
                        if let Some(p) = rk.entries.get(eh.0) {
                            self.nodes.prefetch(p);
                        }
                    }
                    head.len()
                }
            }
        });
    }

    /// Drops every block of `rank`; returns how many it held.
    pub fn clear_rank(&mut self, rank: LoadKey) -> u32 {
        let Some(slot) = self.st.slots.get(&rank).copied() else {
            return 0;
        };
        self.st.clear_slot(&mut self.nodes, slot)
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

    /// Bytes the node table holds (its buckets and spill arena, as readers see it).
    pub fn table_bytes(&self) -> usize {
        self.nodes.nodes().bytes()
    }

    /// `rank`'s slot (tests).
    #[cfg(test)]
    pub(crate) fn slot_of(&self, rank: LoadKey) -> Option<u32> {
        self.st.slots.get(&rank).copied()
    }

    /// The node table's writer (tests: consistency checks).
    #[cfg(test)]
    pub(crate) fn node_table(&self) -> &NodeWriter {
        &self.nodes
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

    fn store(
        &mut self,
        t: &mut NodeWriter,
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
        self.close_if_empty(slot);
        r
    }

    /// Admits one block; `false`: refused by a cap (nothing changed but a dropped old mapping of
    /// the same engine hash).
    fn admit(
        &mut self,
        t: &mut NodeWriter,
        slot: u32,
        eh: EngineHash,
        path: u64,
        left: usize,
    ) -> bool {
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
            if t.add(path, slot) {
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
    fn leave(&mut self, t: &mut NodeWriter, slot: u32, path: u64) {
        if t.remove(path, slot) {
            self.nodes = self.nodes.saturating_sub(1);
            self.credit.nodes += 1;
        }
    }

    /// Drops engine hash `eh` of `slot`; returns whether the rank held it.
    fn unref(&mut self, t: &mut NodeWriter, slot: u32, eh: EngineHash) -> bool {
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

    fn clear_slot(&mut self, t: &mut NodeWriter, slot: u32) -> u32 {
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
        self.free_slot(slot, rk.key);
        u32::try_from(held).unwrap_or(u32::MAX)
    }

    fn open_slot(&mut self, t: &mut NodeWriter, key: LoadKey) -> u32 {
        self.release_quarantine();
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
            t.widen(words);
        }
        if let Some(r) = self.ranks.get_mut(slot as usize) {
            *r = Some(Rank {
                key,
                entries: KeyMap::new(self.keyed),
                extra: HashMap::with_hasher(self.keyed),
            });
        }
        self.slots.insert(key, slot);
        self.set_key(slot, Some(key));
        slot
    }

    fn close_if_empty(&mut self, slot: u32) {
        let Some(r) = self.ranks.get_mut(slot as usize) else {
            return;
        };
        if let Some(key) = r.as_ref().filter(|r| r.entries.is_empty()).map(|r| r.key) {
            *r = None;
            self.free_slot(slot, key);
        }
    }

    /// Forgets a slot whose rank is already gone from `ranks` (it owns no node any more); the
    /// slot is reusable once no reader holds a map naming that rank.
    fn free_slot(&mut self, slot: u32, key: LoadKey) {
        self.slots.remove(&key);
        self.set_key(slot, None);
        self.quarantine.push((slot, self.keys.layout));
    }

    /// Publishes a slot map with `slot` naming `key` (`None`: free).
    fn set_key(&mut self, slot: u32, key: Option<LoadKey>) {
        let keys = &mut self.keys.keys;
        let i = slot as usize;
        if keys.len() <= i {
            keys.resize(i + 1, None);
        }
        if let Some(k) = keys.get_mut(i) {
            *k = key;
        }
        while keys.last() == Some(&None) {
            keys.pop();
        }
        self.keys.layout = self.keys.layout.wrapping_add(1);
        let old = self.keys_pub.swap(Arc::new(self.keys.clone()));
        self.retired.retain(|k| Arc::strong_count(k) > 1);
        if Arc::strong_count(&old) > 1 {
            self.retired.push(old);
        }
    }

    /// Moves the quarantined slots no reader can still name into the free list.
    fn release_quarantine(&mut self) {
        if self.quarantine.is_empty() {
            return;
        }
        self.retired.retain(|k| Arc::strong_count(k) > 1);
        let oldest = self.retired.iter().map(|k| k.layout).min();
        let free = &mut self.free;
        self.quarantine.retain(|&(slot, freed)| {
            let named = oldest.is_some_and(|o| o < freed);
            if !named {
                free.push(Reverse(slot));
            }
            named
        });
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
