//! One simulated worker's identity and live counters, shared by the shim (which changes the
//! load), the publisher (which reports it) and the caller (which reads [`WorkerStats`]).
//!
//! Role: [`Worker`] holds the static [`WorkerInfo`] and, per data-parallel rank, the active
//! requests, the prefill tokens still being prefilled and the KV blocks held. A request takes a
//! [`LoadGuard`] on the rank it was pinned to; the guard gives its load back when dropped, on
//! every path (completion, client gone, fleet stopped).
//!
//! Invariants:
//! - every change of a rank's load wakes the worker's publisher ([`Worker::changed`]), which
//!   coalesces wake-ups: at most one sample per rank goes out per wake;
//! - counters are atomics: readers on any thread see each counter exactly, but a sample is not an
//!   atomic snapshot of all three (as with a real scheduler's metrics, fine for a load signal);
//! - a killed worker ([`Worker::alive`] false) keeps its counters for in-flight requests; the
//!   shim refuses new pins to it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use continuum_core::discovery::{InstanceId, PublisherId, Role};
use continuum_core::dynamo_event::ActiveLoad;
use tokio::sync::Notify;

use crate::spec::LoadFields;

/// What a worker is: fixed for its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    /// Namespace.
    pub namespace: String,
    /// Component (`backend` or `prefill`).
    pub component: String,
    /// Served model.
    pub model: String,
    /// Role.
    pub role: Role,
    /// Instance id (`worker_id`; decimal in pins, hex in keys).
    pub instance_id: InstanceId,
    /// Data-parallel ranks (`0..dp_size`).
    pub dp_size: u32,
    /// The `kv_metrics` publisher incarnation.
    pub publisher_id: PublisherId,
    /// Where the publisher listens.
    pub publisher_addr: SocketAddr,
}

/// The load last published by a worker, summed over its ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PublishedLoad {
    /// `active_decode_blocks`.
    pub active_decode_blocks: u64,
    /// `active_prefill_tokens`.
    pub active_prefill_tokens: u64,
    /// `kv_used_blocks`.
    pub kv_used_blocks: u64,
}

/// A worker's counters at one moment.
#[derive(Debug, Clone)]
pub struct WorkerStats {
    /// The worker.
    pub info: Arc<WorkerInfo>,
    /// Whether it is registered (not killed).
    pub alive: bool,
    /// Requests in flight on it, all ranks.
    pub active: u32,
    /// Requests the shim served with this worker pinned (decode or prefill pin).
    pub picks: u64,
    /// The last published sample, summed over ranks; `None` before the first.
    pub published: Option<PublishedLoad>,
    /// Time since the last publication; `None` before the first.
    pub since_publish: Option<Duration>,
    /// `kv_metrics` messages published (one per rank per publication).
    pub messages: u64,
}

/// One rank's live load.
#[derive(Debug, Default)]
pub(crate) struct RankLoad {
    active: AtomicU32,
    prefill_tokens: AtomicU64,
    decode_blocks: AtomicU64,
}

/// A worker's shared state.
#[derive(Debug)]
pub(crate) struct Worker {
    pub(crate) info: Arc<WorkerInfo>,
    ranks: Box<[RankLoad]>,
    alive: AtomicBool,
    picks: AtomicU64,
    /// Wakes the publisher.
    pub(crate) changed: Notify,
    /// Last publication: fleet-relative milliseconds + 1 (0: never), and the summed sample.
    published_at: AtomicU64,
    published: [AtomicU64; 3],
    messages: AtomicU64,
}

impl Worker {
    pub(crate) fn new(info: WorkerInfo) -> Worker {
        let ranks = (0..info.dp_size.max(1))
            .map(|_| RankLoad::default())
            .collect();
        Worker {
            info: Arc::new(info),
            ranks,
            alive: AtomicBool::new(true),
            picks: AtomicU64::new(0),
            changed: Notify::new(),
            published_at: AtomicU64::new(0),
            published: Default::default(),
            messages: AtomicU64::new(0),
        }
    }

    /// Whether the worker is registered.
    pub(crate) fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Marks the worker killed; false if it already was.
    pub(crate) fn kill(&self) -> bool {
        self.alive.swap(false, Ordering::AcqRel)
    }

    /// Counts one pinned request.
    pub(crate) fn pick(&self) {
        self.picks.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests active on `rank`.
    pub(crate) fn active(&self, rank: u32) -> u32 {
        self.rank(rank)
            .map_or(0, |r| r.active.load(Ordering::Relaxed))
    }

    fn rank(&self, rank: u32) -> Option<&RankLoad> {
        self.ranks.get(usize::try_from(rank).ok()?)
    }

    /// Starts a request on `rank` (which must be below `dp_size`): `prefill_tokens` to prefill
    /// and `blocks` KV blocks held until the guard drops. Returns the guard and how many other
    /// requests were active on the rank.
    pub(crate) fn begin(
        self: &Arc<Self>,
        rank: u32,
        prefill_tokens: u64,
        blocks: u64,
    ) -> (LoadGuard, u32) {
        let mut others = 0;
        if let Some(r) = self.rank(rank) {
            others = r.active.fetch_add(1, Ordering::Relaxed);
            r.prefill_tokens
                .fetch_add(prefill_tokens, Ordering::Relaxed);
            r.decode_blocks.fetch_add(blocks, Ordering::Relaxed);
        }
        self.changed.notify_one();
        let guard = LoadGuard {
            worker: self.clone(),
            rank,
            prefill_tokens,
            blocks,
        };
        (guard, others)
    }

    /// The `ActiveLoad` of `rank` now.
    pub(crate) fn sample(&self, rank: u32, fields: LoadFields) -> ActiveLoad {
        let (prefill, blocks) = self.rank(rank).map_or((0, 0), |r| {
            (
                r.prefill_tokens.load(Ordering::Relaxed),
                r.decode_blocks.load(Ordering::Relaxed),
            )
        });
        let (decode, prefill) = match fields {
            LoadFields::All => (Some(blocks), Some(prefill)),
            LoadFields::KvUsedOnly => (None, None),
        };
        ActiveLoad {
            worker_id: self.info.instance_id,
            dp_rank: rank,
            active_decode_blocks: decode,
            active_prefill_tokens: prefill,
            kv_used_blocks: Some(blocks),
        }
    }

    /// Records a publication of `samples` (one per rank) at fleet time `at`.
    pub(crate) fn record_publish(&self, at: Duration, samples: &[ActiveLoad]) {
        let sum = |f: fn(&ActiveLoad) -> Option<u64>| samples.iter().filter_map(f).sum::<u64>();
        self.published[0].store(sum(|s| s.active_decode_blocks), Ordering::Relaxed);
        self.published[1].store(sum(|s| s.active_prefill_tokens), Ordering::Relaxed);
        self.published[2].store(sum(|s| s.kv_used_blocks), Ordering::Relaxed);
        self.messages
            .fetch_add(samples.len() as u64, Ordering::Relaxed);
        let ms = u64::try_from(at.as_millis()).unwrap_or(u64::MAX - 1);
        self.published_at.store(ms + 1, Ordering::Release);
    }

    /// The counters, `now` being fleet time.
    pub(crate) fn stats(&self, now: Duration) -> WorkerStats {
        let at = self.published_at.load(Ordering::Acquire);
        let published = (at > 0).then(|| PublishedLoad {
            active_decode_blocks: self.published[0].load(Ordering::Relaxed),
            active_prefill_tokens: self.published[1].load(Ordering::Relaxed),
            kv_used_blocks: self.published[2].load(Ordering::Relaxed),
        });
        WorkerStats {
            info: self.info.clone(),
            alive: self.alive(),
            active: (0..self.info.dp_size).map(|r| self.active(r)).sum(),
            picks: self.picks.load(Ordering::Relaxed),
            published,
            since_publish: (at > 0).then(|| now.saturating_sub(Duration::from_millis(at - 1))),
            messages: self.messages.load(Ordering::Relaxed),
        }
    }
}

/// A request's hold on a rank's load; dropping it gives the load back and wakes the publisher.
#[derive(Debug)]
pub(crate) struct LoadGuard {
    worker: Arc<Worker>,
    rank: u32,
    prefill_tokens: u64,
    blocks: u64,
}

impl LoadGuard {
    /// The prefill is done: its tokens leave `active_prefill_tokens`.
    pub(crate) fn prefill_done(&mut self) {
        if self.prefill_tokens == 0 {
            return;
        }
        if let Some(r) = self.worker.rank(self.rank) {
            r.prefill_tokens
                .fetch_sub(self.prefill_tokens, Ordering::Relaxed);
        }
        self.prefill_tokens = 0;
        self.worker.changed.notify_one();
    }

    /// Other requests active on this rank now.
    pub(crate) fn others(&self) -> u32 {
        self.worker.active(self.rank).saturating_sub(1)
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        if let Some(r) = self.worker.rank(self.rank) {
            r.active.fetch_sub(1, Ordering::Relaxed);
            r.prefill_tokens
                .fetch_sub(self.prefill_tokens, Ordering::Relaxed);
            r.decode_blocks.fetch_sub(self.blocks, Ordering::Relaxed);
        }
        self.worker.changed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(dp: u32) -> Arc<Worker> {
        Arc::new(Worker::new(WorkerInfo {
            namespace: "ns".into(),
            component: "backend".into(),
            model: "m".into(),
            role: Role::Aggregated,
            instance_id: InstanceId::new(7),
            dp_size: dp,
            publisher_id: PublisherId::new(8),
            publisher_addr: SocketAddr::from(([127, 0, 0, 1], 1)),
        }))
    }

    #[test]
    fn guards_account_load_per_rank() {
        let w = worker(2);
        let (mut a, others_a) = w.begin(1, 100, 3);
        let (b, others_b) = w.begin(1, 50, 2);
        assert_eq!((others_a, others_b), (0, 1));
        assert_eq!((w.active(0), w.active(1)), (0, 2));
        assert_eq!(a.others(), 1);
        let s = w.sample(1, LoadFields::All);
        assert_eq!(
            (
                s.active_decode_blocks,
                s.active_prefill_tokens,
                s.kv_used_blocks
            ),
            (Some(5), Some(150), Some(5))
        );
        a.prefill_done();
        assert_eq!(w.sample(1, LoadFields::All).active_prefill_tokens, Some(50));
        let s = w.sample(1, LoadFields::KvUsedOnly);
        assert_eq!((s.active_decode_blocks, s.kv_used_blocks), (None, Some(5)));
        drop((a, b));
        let s = w.sample(1, LoadFields::All);
        assert_eq!(
            (s.active_decode_blocks, s.active_prefill_tokens, w.active(1)),
            (Some(0), Some(0), 0)
        );
        assert_eq!(w.sample(0, LoadFields::All).worker_id, InstanceId::new(7));
    }

    #[test]
    fn stats_report_the_last_publication() {
        let w = worker(1);
        assert!(w.stats(Duration::ZERO).published.is_none());
        let (_g, _) = w.begin(0, 10, 1);
        w.pick();
        let sample = w.sample(0, LoadFields::All);
        w.record_publish(Duration::from_millis(500), &[sample]);
        let s = w.stats(Duration::from_millis(1_700));
        assert_eq!(s.since_publish, Some(Duration::from_millis(1_200)));
        assert_eq!((s.active, s.picks, s.messages), (1, 1, 1));
        assert_eq!(
            s.published,
            Some(PublishedLoad {
                active_decode_blocks: 1,
                active_prefill_tokens: 10,
                kv_used_blocks: 1
            })
        );
    }
}
