//! Figure (1), apply throughput on one core, and the trace half of figure (3), the memory each
//! index holds once the main trace is applied.
//!
//! Each index applies the fill (untimed), then the window (timed) in [`CHUNKS`] chunks of
//! envelopes, the indexes taking turns chunk by chunk so that load from other processes lands on
//! all of them alike. Each chunk runs on one thread:
//! - ours: the chunk's envelopes in trace order, each to its rank's shard writer, publishing
//!   per the batch policy (and all shards at the end of the chunk); the clock brackets the loop;
//! - CRTC: the lane is held at a [`Gate`] while the chunk's events and a `Flush` marker are
//!   queued; the time runs from opening the gate to the marker's acknowledgement, so it is the
//!   lane thread alone, on its core, draining a queue, as a `ThreadPoolIndexer` lane does;
//! - RadixTree: the chunk's `RouterEvent`s are built first, then applied in a timed loop.
//! - the bound ([`crate::bound`]), last in each turn: the chunk's envelopes in a timed loop.
//!
//! Memory: every step touches one index only and nothing else allocates meanwhile, so the
//! live-bytes change across an index's own steps is what it holds. For the CRTC, the drained
//! channel's queue capacity is measured separately and subtracted, and its stale-child sweep
//! (which the pool runs every 5 minutes) is run before the second reading.

use std::ops::Range;
use std::time::Instant;

use dynamo_kv_router::RadixTree;
use dynamo_kv_router::indexer::WorkerTask;

use crate::alloc::{allocations, live_bytes, live_chunk_bytes};
use crate::bound::Bound;
use crate::ours::{Arenas, Ours};
use crate::theirs::{self, EventIds, Lane};
use crate::trace::{Block, Rank, Trace};
use crate::warnings::{self, GATE_WORKER, Gate};

/// Timed chunks per index (fewer when the window has fewer envelopes).
pub(crate) const CHUNKS: usize = 10;

/// One index's figures (1) and (3, trace).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Applied {
    /// Block events (stored blocks + removed hashes) of the window.
    pub(crate) events: u64,
    pub(crate) secs: f64,
    /// Bytes held after the whole main trace (requested; malloc chunks).
    pub(crate) bytes: usize,
    pub(crate) chunks: usize,
    /// CRTC: after its stale-child sweep (requested; malloc chunks).
    pub(crate) swept: Option<(usize, usize)>,
    /// Events refused or warned about.
    pub(crate) errors: u64,
    /// Allocations made while the window was applied (all threads).
    pub(crate) allocs: u64,
}

impl Applied {
    pub(crate) fn rate(&self) -> f64 {
        self.events as f64 / self.secs
    }
}

/// The three indexes after the main trace, and the bound.
pub(crate) struct Applied3 {
    pub(crate) ours: Ours,
    pub(crate) lane: Lane,
    pub(crate) radix: Option<RadixTree>,
    pub(crate) figures: [Applied; 3],
    /// The least-work index's run ([`crate::bound`]).
    pub(crate) bound: BoundRun,
}

/// The bound's figure (its time and bytes) and what it held after the trace.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BoundRun {
    pub(crate) figure: Applied,
    /// `(rank, engine hash)` pairs held.
    pub(crate) ownerships: usize,
    /// Distinct path hashes held.
    pub(crate) blocks: usize,
}

/// Accumulates the live-bytes change (requested, malloc chunks) of the steps of one index.
#[derive(Debug, Default)]
struct Held(isize, isize);

impl Held {
    fn step<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let before = (live_bytes() as isize, live_chunk_bytes() as isize);
        let r = f();
        self.0 += live_bytes() as isize - before.0;
        self.1 += live_chunk_bytes() as isize - before.1;
        r
    }

    fn bytes(&self) -> (usize, usize) {
        (self.0.max(0) as usize, self.1.max(0) as usize)
    }
}

fn minus(a: (usize, usize), b: (usize, usize)) -> (usize, usize) {
    (a.0.saturating_sub(b.0), a.1.saturating_sub(b.1))
}

/// The gate event: a `stored` block of [`GATE_WORKER`] under a parent it never stored.
fn gate_event(ids: &mut EventIds) -> WorkerTask {
    let rank = Rank {
        worker_id: GATE_WORKER,
        dp_rank: 0,
        shard: 0,
    };
    let block = Block {
        engine: 1,
        tokens: 1,
    };
    let data = theirs::stored(Some(2), std::iter::once(block));
    WorkerTask::Event(theirs::event(ids, 0, rank, data))
}

/// The window's chunks as envelope ranges.
pub(crate) fn chunks(t: &Trace) -> Vec<Range<usize>> {
    let (start, end) = (t.split, t.main.envelopes.len());
    let n = CHUNKS.min(end - start).max(1);
    (0..n)
        .map(|i| start + (end - start) * i / n..start + (end - start) * (i + 1) / n)
        .collect()
}

/// Applies the main trace to all three indexes (see the module docs).
pub(crate) fn run(
    t: &Trace,
    ar: &Arenas,
    batch: u32,
    with_radix: bool,
    crtc_ids: &mut EventIds,
    radix_ids: &mut EventIds,
    gate_ids: &mut EventIds,
) -> Applied3 {
    let mut mem = [Held::default(), Held::default(), Held::default()];
    let mut bound_mem = Held::default();
    let mut bound_secs = 0f64;
    let mut secs = [0f64; 3];
    let mut errors = [0u64; 3];
    let mut allocs = [0u64; 3];
    let fill = 0..t.split;

    // Fills.
    let mut o = mem[0].step(|| {
        let mut o = Ours::new(t.shape.shards, batch);
        for e in &t.main.envelopes[fill.clone()] {
            o.apply(&t.main, ar, &t.ranks, e);
        }
        o.publish_all();
        o
    });
    let warned = warnings::count();
    let mut max_queued = 0usize;
    let lane = mem[1].step(|| {
        let mut q = theirs::Queue::new();
        for e in &t.main.envelopes[fill.clone()] {
            theirs::router_events(&t.main, e, &t.ranks, crtc_ids, |ev| {
                q.push(WorkerTask::Event(ev));
            });
        }
        max_queued = q.len() + 1;
        let lane = q.start();
        lane.flush();
        lane
    });
    let mut radix = with_radix.then(|| {
        mem[2].step(|| {
            let mut tree = RadixTree::new();
            for e in &t.main.envelopes[fill.clone()] {
                theirs::router_events(&t.main, e, &t.ranks, radix_ids, |ev| {
                    errors[2] += u64::from(tree.apply_event(ev).is_err());
                });
            }
            tree
        })
    });

    let mut bound = bound_mem.step(|| {
        let mut b = Bound::default();
        for e in &t.main.envelopes[fill.clone()] {
            b.apply(&t.main, e);
        }
        b
    });

    // The window, chunk by chunk, the indexes taking turns (the bound last).
    for c in chunks(t) {
        let envs = &t.main.envelopes[c];
        mem[0].step(|| {
            let a = allocations();
            let start = Instant::now();
            for e in envs {
                o.apply(&t.main, ar, &t.ranks, e);
            }
            o.publish_all();
            secs[0] += start.elapsed().as_secs_f64();
            allocs[0] += allocations() - a;
        });
        let rx = mem[1].step(|| {
            Gate::arm();
            lane.send(gate_event(gate_ids));
            let mut n = 2;
            for e in envs {
                theirs::router_events(&t.main, e, &t.ranks, crtc_ids, |ev| {
                    lane.send(WorkerTask::Event(ev));
                    n += 1;
                });
            }
            max_queued = max_queued.max(n);
            let (m, rx) = theirs::marker();
            lane.send(m);
            if !Gate::wait_paused() {
                eprintln!("kv-index-bench: the CRTC lane never reached the gate; giving up");
                std::process::exit(1);
            }
            rx
        });
        mem[1].step(|| {
            let a = allocations();
            let start = Instant::now();
            Gate::open();
            let _ = rx.blocking_recv();
            secs[1] += start.elapsed().as_secs_f64();
            allocs[1] += allocations() - a;
        });
        if let Some(tree) = radix.as_mut() {
            let evs = mem[2].step(|| {
                let mut v = Vec::new();
                for e in envs {
                    theirs::router_events(&t.main, e, &t.ranks, radix_ids, |ev| v.push(ev));
                }
                v
            });
            mem[2].step(|| {
                let a = allocations();
                let start = Instant::now();
                for ev in evs {
                    errors[2] += u64::from(tree.apply_event(ev).is_err());
                }
                secs[2] += start.elapsed().as_secs_f64();
                allocs[2] += allocations() - a;
            });
        }
        bound_mem.step(|| {
            let start = Instant::now();
            for e in envs {
                bound.apply(&t.main, e);
            }
            bound_secs += start.elapsed().as_secs_f64();
        });
    }
    errors[0] = o.refusals.total();
    errors[1] = warnings::count() - warned;
    let chan = theirs::drained_channel_bytes(max_queued);
    let crtc_bytes = minus(mem[1].bytes(), chan);
    mem[1].step(|| lane.sweep());
    let crtc_swept = minus(mem[1].bytes(), chan);

    let (s, r) = t.main.block_events(&t.main.envelopes[t.split..]);
    let events = s + r;
    let fig = |i: usize, bytes: (usize, usize), swept: Option<(usize, usize)>| Applied {
        events,
        secs: secs[i],
        bytes: bytes.0,
        chunks: bytes.1,
        swept,
        errors: errors[i],
        allocs: allocs[i],
    };
    let figures = [
        fig(0, mem[0].bytes(), None),
        fig(1, crtc_bytes, Some(crtc_swept)),
        fig(2, mem[2].bytes(), None),
    ];
    let (bytes, chunks) = bound_mem.bytes();
    let bound = BoundRun {
        figure: Applied {
            events,
            secs: bound_secs,
            bytes,
            chunks,
            swept: None,
            errors: 0,
            allocs: 0,
        },
        ownerships: bound.ownerships(),
        blocks: bound.blocks(),
    };
    Applied3 {
        ours: o,
        lane,
        radix,
        figures,
        bound,
    }
}
