//! The cap-fill half of figure (3): each index alone, filled by the same [`CapFill`], its bytes
//! read with the counting allocator, then dropped before the next one is built.
//!
//! Ours applies every `stored` event in place; the CRTC lane is fed through a channel of 1,024
//! tasks (the filler waits when it is full), whose drained queue capacity is measured and
//! subtracted, and its stale-child sweep is run before the reading.

use std::time::Instant;

use continuum_core::kv::EngineHash;
use dynamo_kv_router::indexer::{SyncIndexer, WorkerTask};
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, RadixTree};

use crate::alloc::{live_bytes, live_chunk_bytes};
use crate::capfill::CapFill;
use crate::ours::{self, Ours};
use crate::theirs::{self, EventIds, Lane};
use crate::trace::Rank;
use crate::warnings;

const LANE_BOUND: usize = 1024;

/// What one index holds after the fill.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held {
    pub(crate) bytes: usize,
    /// With every allocation rounded up to its malloc chunk.
    pub(crate) chunks: usize,
    /// Our own counts (`None` for Dynamo's, which has the fill's).
    pub(crate) nodes: Option<u64>,
    pub(crate) ownerships: Option<u64>,
    pub(crate) secs: f64,
    pub(crate) errors: u64,
}

pub(crate) fn ours(fill: &CapFill, ranks: &[Rank], shards: u32) -> Held {
    let keys: Vec<_> = ranks.iter().map(|&r| ours::key(r)).collect();
    let mut blocks = Vec::with_capacity(256);
    let base = live_bytes();
    let base_chunks = live_chunk_bytes();
    let start = Instant::now();
    let mut o = Ours::new(shards);
    let mut errors = 0u64;
    fill.for_each(|r, parent, bs| {
        blocks.clear();
        blocks.extend(bs.iter().map(|&b| ours::stored_block(b)));
        let w = &mut o.writers[ranks[r as usize].shard as usize];
        let res = w.store(keys[r as usize], parent.map(EngineHash), &blocks);
        errors += u64::from(res.over_capacity) + u64::from(res.parent_missing);
    });
    let secs = start.elapsed().as_secs_f64();
    let bytes = live_bytes().saturating_sub(base);
    let chunks = live_chunk_bytes().saturating_sub(base_chunks);
    Held {
        bytes,
        chunks,
        nodes: Some(o.nodes() as u64),
        ownerships: Some(o.ownerships() as u64),
        secs,
        errors,
    }
}

/// A lane over `backend` filled with `fill` (the CRTC's stale-child sweep run before the
/// reading when `sweep` is given).
pub(crate) fn lane<T: SyncIndexer + Send + Sync + 'static>(
    fill: &CapFill,
    ranks: &[Rank],
    backend: T,
    sweep: Option<fn(&Lane<T>)>,
) -> Held {
    let chan = theirs::drained_channel_bytes(LANE_BOUND);
    let mut ids = EventIds::new(ranks.len());
    let warned = warnings::count();
    let base = live_bytes();
    let base_chunks = live_chunk_bytes();
    let start = Instant::now();
    let lane = Lane::bounded(backend, LANE_BOUND);
    fill.for_each(|r, parent, bs| {
        let data = theirs::stored(parent, bs.iter().copied());
        lane.send(WorkerTask::Event(theirs::event(
            &mut ids,
            r,
            ranks[r as usize],
            data,
        )));
    });
    lane.flush();
    let secs = start.elapsed().as_secs_f64();
    if let Some(sweep) = sweep {
        sweep(&lane);
    }
    let bytes = live_bytes().saturating_sub(base + chan.0);
    let chunks = live_chunk_bytes().saturating_sub(base_chunks + chan.1);
    drop(lane);
    Held {
        bytes,
        chunks,
        nodes: None,
        ownerships: None,
        secs,
        errors: warnings::count() - warned,
    }
}

/// The CRTC lane filled with `fill`, swept.
pub(crate) fn crtc(fill: &CapFill, ranks: &[Rank]) -> Held {
    lane(
        fill,
        ranks,
        ConcurrentRadixTreeCompressed::new(),
        Some(Lane::sweep),
    )
}

pub(crate) fn radix(fill: &CapFill, ranks: &[Rank]) -> Held {
    let mut ids = EventIds::new(ranks.len());
    let base = live_bytes();
    let base_chunks = live_chunk_bytes();
    let start = Instant::now();
    let mut tree = RadixTree::new();
    let mut errors = 0u64;
    fill.for_each(|r, parent, bs| {
        let data = theirs::stored(parent, bs.iter().copied());
        let ev = theirs::event(&mut ids, r, ranks[r as usize], data);
        errors += u64::from(tree.apply_event(ev).is_err());
    });
    let secs = start.elapsed().as_secs_f64();
    let bytes = live_bytes().saturating_sub(base);
    let chunks = live_chunk_bytes().saturating_sub(base_chunks);
    drop(tree);
    Held {
        bytes,
        chunks,
        nodes: None,
        ownerships: None,
        secs,
        errors,
    }
}
