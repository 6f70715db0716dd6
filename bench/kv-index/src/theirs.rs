//! The baseline, dynamo-kv-router 1.6.1's indexers, driven the way its router drives them.
//!
//! - [`Lane`]: `ConcurrentRadixTreeCompressed` (CRTC), the backend of the
//!   `ThreadPoolIndexer<ConcurrentRadixTreeCompressed>` the 1.6.1 router builds for
//!   `--router-mode kv` (its default `router_event_threads` is 4; `scheduling/config.rs`). A
//!   `ThreadPoolIndexer` lane is one OS thread running the backend's `SyncIndexer::worker` loop
//!   over a flume channel of `WorkerTask`s, with reads (`find_matches`) inline on the caller's
//!   thread (`indexer/thread_pool.rs`). A `Lane` is exactly one such lane, built from the crate's
//!   public pieces so the bench can feed it a prefilled channel and time it on one core; all
//!   ranks go to it (the pool's sticky assignment would spread them over 4 lanes writing one
//!   shared tree).
//! - `PositionalIndexer` ("Flash"): the position-keyed index of the same crate, in the same kind
//!   of lane ([`Lane`] is generic over the crate's `SyncIndexer`), once with each search mode
//!   (`Strided`, the default, and `Binary`, `DYN_ROUTER_POSITIONAL_SEARCH_MODE`), jump size
//!   [`FLASH_JUMP`].
//! - `RadixTree`: the single-threaded tree behind `KvIndexer` (`router_event_threads: 1`),
//!   `apply_event` / `find_matches` called directly.
//!
//! Events are built as the router receives them: `RouterEvent { worker_id, event: KvCacheEvent
//! { event_id, data, dp_rank } }` with device storage tier, per-rank increasing `event_id`s, no
//! `start_position`, no multimodal info.

use std::sync::Arc;
use std::thread::JoinHandle;

use dynamo_kv_router::indexer::positional::SearchMode;
use dynamo_kv_router::indexer::{SyncIndexer, WorkerTask};
use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, LocalBlockHash, RouterEvent, WorkerWithDpRank,
};
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, PositionalIndexer};
use tokio::sync::oneshot;

use crate::trace::{Block, Envelope, Events, Op, Rank};

/// The next `event_id` of every rank.
#[derive(Debug, Clone)]
pub(crate) struct EventIds(Vec<u64>);

impl EventIds {
    pub(crate) fn new(ranks: usize) -> Self {
        Self(vec![1; ranks])
    }
}

/// The `RouterEvent`s of one envelope, in order.
pub(crate) fn router_events(
    ev: &Events,
    e: &Envelope,
    ranks: &[Rank],
    ids: &mut EventIds,
    mut out: impl FnMut(RouterEvent),
) {
    let rank = ranks[e.rank as usize];
    for op in ev.ops(e) {
        let data = match *op {
            Op::Store { parent, start, len } => {
                stored(parent, ev.stored(start, len).iter().copied())
            }
            Op::Remove { start, len } => KvCacheEventData::Removed(KvCacheRemoveData {
                block_hashes: ev
                    .removed(start, len)
                    .iter()
                    .map(|&h| ExternalSequenceBlockHash(h))
                    .collect(),
            }),
        };
        out(event(ids, e.rank, rank, data));
    }
}

/// A `stored` event's data.
pub(crate) fn stored(parent: Option<u64>, blocks: impl Iterator<Item = Block>) -> KvCacheEventData {
    KvCacheEventData::Stored(KvCacheStoreData {
        parent_hash: parent.map(ExternalSequenceBlockHash),
        start_position: None,
        blocks: blocks
            .map(|b| KvCacheStoredBlockData {
                block_hash: ExternalSequenceBlockHash(b.engine),
                tokens_hash: LocalBlockHash(b.tokens),
                mm_extra_info: None,
            })
            .collect(),
    })
}

/// Rank `index`'s event with its next `event_id`.
pub(crate) fn event(
    ids: &mut EventIds,
    index: u32,
    rank: Rank,
    data: KvCacheEventData,
) -> RouterEvent {
    let id = &mut ids.0[index as usize];
    let event_id = *id;
    *id += 1;
    RouterEvent::new(
        rank.worker_id,
        KvCacheEvent {
            event_id,
            data,
            dp_rank: rank.dp_rank,
        },
    )
}

/// Dynamo's rank key.
pub(crate) fn worker(rank: Rank) -> WorkerWithDpRank {
    WorkerWithDpRank::new(rank.worker_id, rank.dp_rank)
}

/// A query as Dynamo's router asks it: the prompt's `LocalBlockHash`es (tokens hashes).
pub(crate) fn query(blocks: &[Block]) -> Vec<LocalBlockHash> {
    blocks.iter().map(|b| LocalBlockHash(b.tokens)).collect()
}

/// A `Flush` task and the receiver that fires when the lane reaches it.
pub(crate) fn marker() -> (WorkerTask, oneshot::Receiver<()>) {
    let (tx, rx) = oneshot::channel();
    (WorkerTask::Flush(tx), rx)
}

/// The `PositionalIndexer` jump size: the value the crate's own tests and benches use.
pub(crate) const FLASH_JUMP: usize = 32;

/// A `PositionalIndexer` with `mode`.
pub(crate) fn flash(mode: SearchMode) -> PositionalIndexer {
    PositionalIndexer::new_with_mode(FLASH_JUMP, mode)
}

/// The two search modes of the Flash lanes, in report order.
pub(crate) const FLASH_MODES: [SearchMode; 2] = [SearchMode::Strided, SearchMode::Binary];

/// Tasks queued for a lane that has not started yet.
pub(crate) struct Queue {
    tx: flume::Sender<WorkerTask>,
    rx: flume::Receiver<WorkerTask>,
    n: usize,
}

impl Queue {
    pub(crate) fn new() -> Self {
        let (tx, rx) = flume::unbounded();
        Self { tx, rx, n: 0 }
    }

    pub(crate) fn push(&mut self, task: WorkerTask) {
        let _ = self.tx.send(task);
        self.n += 1;
    }

    pub(crate) fn len(&self) -> usize {
        self.n
    }

    /// Starts a lane over `backend` on everything queued (so it runs alone on its core until it
    /// drains).
    pub(crate) fn start_with<T: SyncIndexer + Send + Sync + 'static>(self, backend: T) -> Lane<T> {
        Lane::start(backend, self.tx, self.rx)
    }
}

/// One `ThreadPoolIndexer` lane over a backend, a CRTC unless said otherwise (see the module
/// docs).
pub(crate) struct Lane<T: SyncIndexer + Send + Sync + 'static = ConcurrentRadixTreeCompressed> {
    tree: Arc<T>,
    tx: Option<flume::Sender<WorkerTask>>,
    thread: Option<JoinHandle<()>>,
}

impl Lane {
    /// Runs the tree's stale-child sweep (the pool schedules it every 5 minutes).
    pub(crate) fn sweep(&self) {
        self.tree.run_cleanup_task();
    }
}

impl<T: SyncIndexer + Send + Sync + 'static> Lane<T> {
    /// A lane over `backend` fed through a channel of `bound` tasks (the sender waits when it
    /// is full).
    pub(crate) fn bounded(backend: T, bound: usize) -> Self {
        let (tx, rx) = flume::bounded(bound);
        Self::start(backend, tx, rx)
    }

    fn start(backend: T, tx: flume::Sender<WorkerTask>, rx: flume::Receiver<WorkerTask>) -> Self {
        let tree = Arc::new(backend);
        let t = Arc::clone(&tree);
        let thread = std::thread::Builder::new()
            .name("dynamo-lane".into())
            .spawn(move || {
                let _ = t.worker(rx, None);
            });
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("kv-index-bench: cannot start a baseline lane thread: {e}");
                std::process::exit(1);
            }
        };
        Lane {
            tree,
            tx: Some(tx),
            thread,
        }
    }

    pub(crate) fn send(&self, task: WorkerTask) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(task);
        }
    }

    /// Waits until the lane has applied everything sent so far.
    pub(crate) fn flush(&self) {
        let (m, rx) = marker();
        self.send(m);
        let _ = rx.blocking_recv();
    }

    pub(crate) fn tree(&self) -> &Arc<T> {
        &self.tree
    }
}

impl<T: SyncIndexer + Send + Sync + 'static> Drop for Lane<T> {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Heap bytes (requested, malloc chunks) an unbounded flume channel keeps after `n` tasks were
/// queued and all received: its queue's capacity, which stays allocated. Measured, not assumed.
pub(crate) fn drained_channel_bytes(n: usize) -> (usize, usize) {
    use crate::alloc::{live_bytes, live_chunk_bytes};
    let (tx, rx) = flume::unbounded::<WorkerTask>();
    let before = (live_bytes(), live_chunk_bytes());
    for _ in 0..n {
        let _ = tx.send(WorkerTask::Terminate);
    }
    while rx.try_recv().is_ok() {}
    let after = (live_bytes(), live_chunk_bytes());
    drop((tx, rx));
    (
        after.0.saturating_sub(before.0),
        after.1.saturating_sub(before.1),
    )
}
