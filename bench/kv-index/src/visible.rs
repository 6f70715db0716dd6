//! Figure (4): event-to-visible latency. A writer applies one envelope; a
//! reader on another thread (another shard) polls `find_matches` with the prefix that envelope
//! completes until the envelope's rank shows it whole. The latency is from just before the
//! writer starts applying to the poll that first sees it (so it includes up to one poll).
//!
//! - ours: the writer is the shard's own thread: `IndexWriter::store`/`remove` (visible as
//!   applied); the reader holds one `IndexReader` per shard and reads through `Merged`;
//! - CRTC: the writer sends the envelope's events to the lane's channel (what
//!   `ThreadPoolIndexer::apply_event` does: the router's event task hands them to a lane
//!   thread), the lane applies them, the reader calls `find_matches` on the shared tree.
//!
//! Between envelopes the writer sleeps (`park`) until the reader is polling for the next one,
//! so a waiting writer takes no CPU from the lane or the reader on a 2-core machine. A poll that
//! has not seen its envelope after [`GIVE_UP`] counts as missed.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use continuum_core::kv::shared::Merged;
use continuum_core::picker::{OverlapSource, PromptBlocks};
use dynamo_kv_router::indexer::{SyncIndexer, WorkerTask};

use crate::matches::Lat;
use crate::ours::{self, Arenas, Ours};
use crate::theirs::{self, EventIds, Lane};
use crate::trace::{BLOCK_TOKENS, Trace};

pub(crate) const GIVE_UP: Duration = Duration::from_millis(200);

/// An envelope of at least this many block events is "large" (a prefill), else "small" (a
/// decode step).
pub(crate) const LARGE: u64 = 16;

#[derive(Debug, Clone)]
pub(crate) struct Visibility {
    pub(crate) lat: Lat,
    /// The same latencies split by envelope size (see [`LARGE`]).
    pub(crate) small: Lat,
    pub(crate) large: Lat,
    pub(crate) missed: u64,
}

impl Visibility {
    fn new() -> Self {
        Self {
            lat: Lat::new(),
            small: Lat::new(),
            large: Lat::new(),
            missed: 0,
        }
    }
}

/// Whether tail envelope `i` is large.
fn large(t: &Trace, i: usize) -> bool {
    let (s, r) = t.tail.block_events(&t.tail.envelopes[i..=i]);
    s + r >= LARGE
}

/// The hand-off between the writer (this thread) and the reader.
struct Handoff {
    /// `i + 1` once the reader polls for envelope `i`; `usize::MAX` when it is done.
    ready: AtomicUsize,
    /// When the writer began envelope `ready - 1`, in ns since `base`.
    t0: AtomicU64,
    base: Instant,
}

impl Handoff {
    fn new() -> Self {
        Self {
            ready: AtomicUsize::new(0),
            t0: AtomicU64::new(0),
            base: Instant::now(),
        }
    }

    fn now(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    /// Writer: waits until the reader polls for envelope `i`; false once it stopped.
    fn wait_ready(&self, i: usize) -> bool {
        loop {
            let r = self.ready.load(Ordering::Acquire);
            if r == usize::MAX {
                return false;
            }
            if r > i {
                return true;
            }
            thread::park_timeout(Duration::from_millis(50));
        }
    }

    /// Writer: about to apply.
    fn start(&self) {
        self.t0.store(self.now(), Ordering::Release);
    }

    /// Reader: polls `seen` until true; records the latency or a miss.
    fn poll(&self, vis: &mut Visibility, large: bool, mut seen: impl FnMut() -> bool) {
        let began = Instant::now();
        loop {
            if seen() {
                let t1 = self.now();
                let t0 = self.t0.load(Ordering::Acquire);
                let ns = t1.saturating_sub(t0);
                vis.lat.record(ns);
                if large {
                    vis.large.record(ns);
                } else {
                    vis.small.record(ns);
                }
                return;
            }
            if began.elapsed() > GIVE_UP {
                vis.missed += 1;
                return;
            }
        }
    }
}

/// How many envelopes figure (4) uses: the tail, at most `n`.
fn count(t: &Trace, n: usize) -> usize {
    t.tail.envelopes.len().min(n)
}

pub(crate) fn ours(o: &mut Ours, t: &Trace, ar: &Arenas, n: usize, seconds: f64) -> Visibility {
    let n = count(t, n);
    let keys: Vec<_> = t.visible[..n]
        .iter()
        .map(|v| ours::key(t.ranks[v.rank as usize]))
        .collect();
    let queries: Vec<_> = t.visible[..n]
        .iter()
        .map(|v| ours::query(&v.path))
        .collect();
    let readers = o.readers.clone();
    let h = Handoff::new();
    let writer = thread::current();
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    thread::scope(|s| {
        let reader = s.spawn(|| {
            let handles = Ours::handles(&readers);
            let m = Merged(&handles);
            let mut vis = Visibility::new();
            for i in 0..n {
                if Instant::now() > deadline {
                    break;
                }
                let (want, len) = (keys[i], queries[i].len() as u32);
                let prompt = PromptBlocks {
                    block_size: BLOCK_TOKENS as u32,
                    hashes: &queries[i],
                };
                h.ready.store(i + 1, Ordering::Release);
                writer.unpark();
                h.poll(&mut vis, large(t, i), || {
                    let mut hit = false;
                    m.find_matches(prompt, &mut |k, d| hit |= k == want && d >= len);
                    hit
                });
            }
            h.ready.store(usize::MAX, Ordering::Release);
            writer.unpark();
            vis
        });
        for i in 0..n {
            if !h.wait_ready(i) {
                break;
            }
            h.start();
            o.apply(&t.tail, ar, &t.ranks, &t.tail.envelopes[i]);
        }
        reader.join().unwrap_or_else(|_| std::process::abort())
    })
}

/// A baseline lane (CRTC or Flash): its events sent to its channel, read on another thread.
pub(crate) fn lane<B: SyncIndexer + Send + Sync + 'static>(
    lane: &Lane<B>,
    t: &Trace,
    ids: &mut EventIds,
    n: usize,
    seconds: f64,
) -> Visibility {
    let n = count(t, n);
    let workers: Vec<_> = t.visible[..n]
        .iter()
        .map(|v| theirs::worker(t.ranks[v.rank as usize]))
        .collect();
    let queries: Vec<_> = t.visible[..n]
        .iter()
        .map(|v| theirs::query(&v.path))
        .collect();
    let mut events: Vec<Vec<_>> = t.tail.envelopes[..n]
        .iter()
        .map(|e| {
            let mut v = Vec::new();
            theirs::router_events(&t.tail, e, &t.ranks, ids, |ev| v.push(ev));
            v
        })
        .collect();
    let tree = lane.tree().clone();
    let h = Handoff::new();
    let writer = thread::current();
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let vis = thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut vis = Visibility::new();
            for i in 0..n {
                if Instant::now() > deadline {
                    break;
                }
                let (want, len) = (workers[i], queries[i].len() as u32);
                h.ready.store(i + 1, Ordering::Release);
                writer.unpark();
                h.poll(&mut vis, large(t, i), || {
                    let s = tree.find_matches(&queries[i], false);
                    s.scores.get(&want).is_some_and(|&d| d >= len)
                });
            }
            h.ready.store(usize::MAX, Ordering::Release);
            writer.unpark();
            vis
        });
        for (i, evs) in events.iter_mut().enumerate() {
            if !h.wait_ready(i) {
                break;
            }
            h.start();
            for ev in evs.drain(..) {
                lane.send(WorkerTask::Event(ev));
            }
        }
        reader.join().unwrap_or_else(|_| std::process::abort())
    });
    // Whatever the reader gave up on is still applied before the lane is used again.
    lane.flush();
    vis
}
