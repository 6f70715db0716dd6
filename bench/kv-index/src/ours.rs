//! Ours: continuum-core's `kv` index, one [`IndexWriter`] per shard over one router-wide
//! [`Budget`], read through `kv::shared::Merged` as a shard reads at pick time.
//!
//! A rank's events go to the shard that owns its worker's publisher
//! (`subscriptions::shard_of`, as the router assigns subscriptions); what a writer applies is
//! visible to readers as it is applied (the index has no publish step).

use std::sync::Arc;

use continuum_core::discovery::InstanceId;
use continuum_core::kv::budget::Budget;
use continuum_core::kv::index::{IndexWriter, Upcoming, new_index};
use continuum_core::kv::shared::{IndexReader, IndexReaders};
use continuum_core::kv::{EngineHash, StoredBlock, TokensHash};
use continuum_core::load::LoadKey;
use continuum_core::picker::BlockHash;

use crate::trace::{Block, Envelope, Events, Op, Rank};

/// An [`Events`]' arenas in our types (converted once, outside every timed loop).
#[derive(Debug, Default)]
pub(crate) struct Arenas {
    stored: Vec<StoredBlock>,
    removed: Vec<EngineHash>,
}

impl Arenas {
    pub(crate) fn stored_slice(&self, start: u32, len: u32) -> &[StoredBlock] {
        &self.stored[start as usize..(start + len) as usize]
    }

    pub(crate) fn removed_slice(&self, start: u32, len: u32) -> &[EngineHash] {
        &self.removed[start as usize..(start + len) as usize]
    }

    pub(crate) fn of(ev: &Events) -> Self {
        Self {
            stored: ev.stored.iter().map(|&b| stored_block(b)).collect(),
            removed: ev.removed.iter().map(|&h| EngineHash(h)).collect(),
        }
    }
}

pub(crate) fn stored_block(b: Block) -> StoredBlock {
    StoredBlock {
        block_hash: EngineHash(b.engine),
        tokens_hash: TokensHash(b.tokens),
    }
}

/// Our rank key.
pub(crate) fn key(rank: Rank) -> LoadKey {
    LoadKey::new(InstanceId::new(rank.worker_id), rank.dp_rank)
}

/// A query as the picker asks it: the prompt's path hashes.
pub(crate) fn query(blocks: &[Block]) -> Vec<BlockHash> {
    blocks.iter().map(|b| BlockHash(b.engine)).collect()
}

/// What our index refused or did not hold (all 0 on a trace that stays within the caps).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Refusals {
    pub(crate) over_capacity: u64,
    pub(crate) parent_missing: u64,
    pub(crate) remove_missing: u64,
}

impl Refusals {
    pub(crate) fn total(&self) -> u64 {
        self.over_capacity + self.parent_missing + self.remove_missing
    }
}

/// Trace op `op` of rank `k` as `IndexWriter::prefetch` takes it.
#[inline]
pub(crate) fn upcoming<'a>(op: &Op, k: LoadKey, ar: &'a Arenas) -> Upcoming<'a> {
    match *op {
        Op::Store { parent, start, len } => Upcoming::Store {
            rank: k,
            parent: parent.map(EngineHash),
            blocks: &ar.stored[start as usize..(start + len) as usize],
        },
        Op::Remove { start, len } => Upcoming::Remove {
            rank: k,
            hashes: &ar.removed[start as usize..(start + len) as usize],
        },
    }
}

/// Applies envelope `e` of `rank` to writer `w` as the shard's handler applies a decoded batch
/// (`IndexWriter::prefetch` over its events, then each event); what it refused.
#[inline]
pub(crate) fn apply_to(
    w: &mut IndexWriter,
    ev: &Events,
    ar: &Arenas,
    rank: Rank,
    e: &Envelope,
) -> Refusals {
    let k = key(rank);
    let mut r = Refusals::default();
    w.prefetch(ev.ops(e).iter().map(|op| upcoming(op, k, ar)));
    for op in ev.ops(e) {
        match *op {
            Op::Store { parent, start, len } => {
                let blocks = &ar.stored[start as usize..(start + len) as usize];
                let s = w.store(k, parent.map(EngineHash), blocks);
                r.over_capacity += u64::from(s.over_capacity);
                r.parent_missing += u64::from(s.parent_missing);
            }
            Op::Remove { start, len } => {
                let hashes = &ar.removed[start as usize..(start + len) as usize];
                let held = w.remove(k, hashes);
                r.remove_missing += u64::from(len - held.min(len));
            }
        }
    }
    r
}

/// The shards' indexes.
pub(crate) struct Ours {
    pub(crate) budget: Arc<Budget>,
    pub(crate) writers: Vec<IndexWriter>,
    pub(crate) readers: Vec<IndexReaders>,
    pub(crate) refusals: Refusals,
}

impl Ours {
    pub(crate) fn new(shards: u32) -> Self {
        let budget = Arc::new(Budget::new());
        let (writers, readers) = (0..shards).map(|_| new_index(Arc::clone(&budget))).unzip();
        Self {
            budget,
            writers,
            readers,
            refusals: Refusals::default(),
        }
    }

    /// Applies one envelope to its rank's shard.
    #[inline]
    pub(crate) fn apply(&mut self, ev: &Events, ar: &Arenas, ranks: &[Rank], e: &Envelope) {
        let rank = ranks[e.rank as usize];
        let shard = self.shard_of(rank);
        let w = &mut self.writers[shard];
        let r = apply_to(w, ev, ar, rank, e);
        self.refusals.over_capacity += r.over_capacity;
        self.refusals.parent_missing += r.parent_missing;
        self.refusals.remove_missing += r.remove_missing;
    }

    /// The writer of `rank` (the trace's shard; all on one when there is one writer).
    pub(crate) fn shard_of(&self, rank: Rank) -> usize {
        rank.shard as usize % self.writers.len()
    }

    /// The writers and the reader factories, apart (to drop them one after the other).
    pub(crate) fn into_parts(self) -> (Vec<IndexWriter>, Vec<IndexReaders>) {
        (self.writers, self.readers)
    }

    /// One reader per shard for the calling thread.
    pub(crate) fn handles(readers: &[IndexReaders]) -> Vec<IndexReader> {
        readers.iter().map(IndexReaders::handle).collect()
    }

    pub(crate) fn nodes(&self) -> usize {
        self.writers.iter().map(IndexWriter::nodes).sum()
    }

    pub(crate) fn ownerships(&self) -> usize {
        self.writers.iter().map(IndexWriter::ownerships).sum()
    }
}
