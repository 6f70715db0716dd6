//! Figure (5), scaling: what a second core buys each design while pickers read.
//!
//! - Ours: the window applied by one shard (one writer on one thread) and by two shards (two
//!   writers, each on its own thread, each applying the envelopes of its ranks: the shard the
//!   router would give each worker's publisher with two shards, `subscriptions::shard_of`),
//!   pinned to CPUs 0 and 1. The two threads start together at a barrier;
//!   the time runs until the later one is done.
//! - Theirs: dynamo-kv-router's `ThreadPoolIndexer` over a `ConcurrentRadixTreeCompressed`, and
//!   over a `PositionalIndexer` (Flash, strided), each with 1 and with 2 event threads
//!   (`router_event_threads`), fed with `enqueue_event` from the bench
//!   thread as the router's event loop feeds it (ranks stick to a thread), timed from the first
//!   enqueue to `flush_and_wait`. Its lanes cannot be held while the window is queued, so its
//!   figure includes the enqueueing thread competing for the two cores; ours has no such thread
//!   (our shards apply what they decode themselves).
//! - Pickers: in every run one reader thread answers the trace's queries in turn, one every
//!   [`PICK_EVERY`] (a few thousand picks per second), through the same read path a pick uses
//!   (`Merged` over every shard; the pool's inline `find_matches`).
//!
//! Each index is filled (untimed) with the trace's fill first. Ratios: each design's 2-core rate
//! over its 1-core rate (target for ours ≥ 1.8x), and ours over theirs at each width.
//!
//! Invariant: every thread ends before `run` returns; nothing is shared between runs.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use continuum_core::discovery::ids::PublisherId;
use continuum_core::kv::shared::Merged;
use continuum_core::picker::{OverlapSource as _, PromptBlocks};
use continuum_core::subscriptions::shard_of;
use dynamo_kv_router::indexer::SyncIndexer;
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, ThreadPoolIndexer};

use crate::ours::{self, Arenas, Ours};
use crate::theirs::{self, EventIds};
use crate::trace::{BLOCK_TOKENS, Rank, Trace};

/// How often the picker thread asks.
pub(crate) const PICK_EVERY: Duration = Duration::from_micros(250);

/// Figure (5): block events per second of the window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scaling {
    /// Ours with 1 and 2 shards.
    pub(crate) ours: [f64; 2],
    /// The thread pool over a CRTC with 1 and 2 event threads.
    pub(crate) theirs: [f64; 2],
    /// The thread pool over a `PositionalIndexer` (Flash, strided) with 1 and 2 event threads.
    pub(crate) flash: [f64; 2],
    /// Picks answered during the six runs.
    pub(crate) picks: u64,
    /// The larger of our two shards' share of the window's block events (0.5: even).
    pub(crate) larger_share: f64,
}

fn pin(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write within it; sched_setaffinity(0)
    // targets the calling thread and only reads the set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Runs `picker(i)` for query after query until `stop`, one every [`PICK_EVERY`]; the count.
fn picking(stop: &AtomicBool, queries: usize, mut picker: impl FnMut(usize)) -> u64 {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        picker(n as usize % queries.max(1));
        n += 1;
        std::thread::sleep(PICK_EVERY);
    }
    n
}

/// Ours with `shards` writers on as many threads: the window's rate, the picks and the largest
/// shard's share of the window's block events.
fn ours_run(t: &Trace, ar: &Arenas, shards: u32) -> (f64, u64, f64) {
    // Each worker's ranks on the shard the router would give its publisher with `shards` shards.
    let ranks: Vec<Rank> = t
        .ranks
        .iter()
        .map(|r| Rank {
            shard: shard_of(PublisherId::new(r.worker_id), shards as usize) as u32,
            ..*r
        })
        .collect();
    let mut o = Ours::new(shards);
    for e in &t.main.envelopes[..t.split] {
        o.apply(&t.main, ar, &ranks, e);
    }
    let window = &t.main.envelopes[t.split..];
    let (s, r) = t.main.block_events(window);
    let per_shard: Vec<Vec<usize>> = (0..shards as usize)
        .map(|sh| {
            (0..window.len())
                .filter(|&i| o.shard_of(ranks[window[i].rank as usize]) == sh)
                .collect()
        })
        .collect();
    let largest = per_shard
        .iter()
        .map(|mine| {
            let envs: Vec<_> = mine.iter().map(|&i| window[i]).collect();
            let (s, r) = t.main.block_events(&envs);
            s + r
        })
        .max()
        .unwrap_or(0);
    let share = largest as f64 / (s + r).max(1) as f64;
    let queries: Vec<_> = t.queries.iter().map(|q| ours::query(&q.blocks)).collect();
    let (mut writers, readers) = o.into_parts();
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(writers.len() + 1);
    let (secs, picks) = std::thread::scope(|sc| {
        let picker = sc.spawn(|| {
            let handles = Ours::handles(&readers);
            let merged = Merged(&handles);
            picking(&stop, queries.len(), |i| {
                let mut acc = 0u32;
                merged.find_matches(
                    PromptBlocks {
                        block_size: BLOCK_TOKENS as u32,
                        hashes: &queries[i],
                    },
                    &mut |_, d| acc = acc.wrapping_add(d),
                );
                black_box(acc);
            })
        });
        let threads: Vec<_> = writers
            .iter_mut()
            .zip(&per_shard)
            .enumerate()
            .map(|(cpu, (w, mine))| {
                let (barrier, ranks) = (&barrier, &ranks);
                sc.spawn(move || {
                    pin(cpu);
                    barrier.wait();
                    for &i in mine {
                        let e = &window[i];
                        ours::apply_to(w, &t.main, ar, ranks[e.rank as usize], e);
                    }
                    Instant::now()
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let ends: Vec<Instant> = threads.into_iter().filter_map(|h| h.join().ok()).collect();
        let end = ends.into_iter().max().unwrap_or(start);
        stop.store(true, Ordering::Relaxed);
        let picks = picker.join().unwrap_or(0);
        (end.saturating_duration_since(start).as_secs_f64(), picks)
    });
    ((s + r) as f64 / secs.max(1e-9), picks, share)
}

/// The thread pool over `backend` with `threads` event threads: the window's rate and the picks.
fn theirs_run<B: SyncIndexer + Send + Sync + 'static>(
    t: &Trace,
    backend: B,
    threads: usize,
) -> (f64, u64) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().build() else {
        return (f64::NAN, 0);
    };
    let pool = Arc::new(ThreadPoolIndexer::new(
        backend,
        threads,
        BLOCK_TOKENS as u32,
    ));
    let mut ids = EventIds::new(t.ranks.len());
    for e in &t.main.envelopes[..t.split] {
        theirs::router_events(&t.main, e, &t.ranks, &mut ids, |ev| {
            let _ = pool.enqueue_event(ev);
        });
    }
    let _ = rt.block_on(pool.flush_and_wait());
    let window = &t.main.envelopes[t.split..];
    let (s, r) = t.main.block_events(window);
    let queries: Vec<_> = t.queries.iter().map(|q| theirs::query(&q.blocks)).collect();
    let stop = AtomicBool::new(false);
    let (secs, picks) = std::thread::scope(|sc| {
        let reader = Arc::clone(&pool);
        let stop = &stop;
        let queries = &queries;
        let picker = sc.spawn(move || {
            let backend = reader.backend();
            picking(stop, queries.len(), |i| {
                black_box(backend.find_matches(&queries[i], false));
            })
        });
        let start = Instant::now();
        for e in window {
            theirs::router_events(&t.main, e, &t.ranks, &mut ids, |ev| {
                let _ = pool.enqueue_event(ev);
            });
        }
        let _ = rt.block_on(pool.flush_and_wait());
        let secs = start.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        (secs, picker.join().unwrap_or(0))
    });
    ((s + r) as f64 / secs.max(1e-9), picks)
}

/// Figure (5) on `t`.
pub(crate) fn run(t: &Trace, ar: &Arenas) -> Scaling {
    let (o1, p1, _) = ours_run(t, ar, 1);
    let (o2, p2, larger_share) = ours_run(t, ar, 2);
    let (t1, p3) = theirs_run(t, ConcurrentRadixTreeCompressed::new(), 1);
    let (t2, p4) = theirs_run(t, ConcurrentRadixTreeCompressed::new(), 2);
    let flash = || theirs::flash(theirs::FLASH_MODES[0]);
    let (f1, p5) = theirs_run(t, flash(), 1);
    let (f2, p6) = theirs_run(t, flash(), 2);
    Scaling {
        ours: [o1, o2],
        theirs: [t1, t2],
        flash: [f1, f2],
        picks: p1 + p2 + p3 + p4 + p5 + p6,
        larger_share,
    }
}
