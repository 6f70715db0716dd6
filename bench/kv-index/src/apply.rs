//! Figure (1), apply throughput on one core, and the trace half of figure (3), the memory each
//! index holds once the main trace is applied.
//!
//! Each index applies the fill (untimed), then the window (timed) in [`CHUNKS`] chunks of
//! envelopes, the indexes taking turns chunk by chunk so that load from other processes lands on
//! all of them alike. Each chunk runs on one thread:
//! - ours: the chunk's envelopes in trace order, each to its rank's shard writer (visible to
//!   readers as applied: there is no publish step); the clock brackets the loop;
//! - CRTC and the two Flash (`PositionalIndexer`) lanes: the lane is held at a [`Gate`] while the
//!   chunk's events and a `Flush` marker are queued; the time runs from opening the gate to the
//!   marker's acknowledgement, so it is the lane thread alone, on its core, draining a queue, as
//!   a `ThreadPoolIndexer` lane does;
//! - RadixTree: the chunk's `RouterEvent`s are built first, then applied in a timed loop.
//! - the bound ([`crate::bound`]), last in each turn: the chunk's envelopes in a timed loop.
//!
//! Memory: every step touches one index only and nothing else allocates meanwhile, so the
//! live-bytes change across an index's own steps is what it holds. For the lanes, the drained
//! channel's queue capacity is measured separately and subtracted; the CRTC's stale-child sweep
//! (which the pool runs every 5 minutes) is run before its second reading.

use std::ops::Range;
use std::time::Instant;

use dynamo_kv_router::indexer::{SyncIndexer, WorkerTask};
use dynamo_kv_router::{PositionalIndexer, RadixTree};

use crate::alloc::{allocations, live_bytes, live_chunk_bytes};
use crate::bound::Bound;
use crate::ours::{Arenas, Ours};
use crate::theirs::{self, EventIds, Lane};
use crate::trace::{Block, Rank, Trace};
use crate::warnings::{self, GATE_WORKER, Gate};

/// Timed chunks per index (fewer when the window has fewer envelopes).
pub(crate) const CHUNKS: usize = 10;

/// The figures' order: ours, the CRTC lane, the Flash lanes (strided, binary), the RadixTree.
pub(crate) const INDEXES: usize = 5;
const OURS: usize = 0;
const CRTC: usize = 1;
const FLASH: [usize; 2] = [2, 3];
const RADIX: usize = 4;

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

/// The indexes after the main trace, and the bound.
pub(crate) struct AppliedAll {
    pub(crate) ours: Ours,
    pub(crate) lane: Lane,
    pub(crate) flash: [Lane<PositionalIndexer>; 2],
    /// The Flash lanes' next event ids (figure 4 continues them).
    pub(crate) flash_ids: [EventIds; 2],
    pub(crate) radix: Option<RadixTree>,
    /// In [`INDEXES`] order; the RadixTree's is zero when it did not run.
    pub(crate) figures: [Applied; INDEXES],
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

/// A lane over `backend` with the envelopes `envs` applied (queued first, then drained).
fn filled<T: SyncIndexer + Send + Sync + 'static>(
    t: &Trace,
    envs: Range<usize>,
    ids: &mut EventIds,
    backend: T,
    max_queued: &mut usize,
) -> Lane<T> {
    let mut q = theirs::Queue::new();
    for e in &t.main.envelopes[envs] {
        theirs::router_events(&t.main, e, &t.ranks, ids, |ev| {
            q.push(WorkerTask::Event(ev));
        });
    }
    *max_queued = (*max_queued).max(q.len() + 1);
    let lane = q.start_with(backend);
    lane.flush();
    lane
}

/// What one lane spent on the window so far.
#[derive(Debug, Default)]
struct LaneTime {
    secs: f64,
    allocs: u64,
    errors: u64,
}

/// One timed chunk on `lane`: held at the gate while the chunk is queued, then timed from
/// opening the gate to the chunk's marker.
#[allow(clippy::too_many_arguments)]
fn lane_chunk<T: SyncIndexer + Send + Sync + 'static>(
    lane: &Lane<T>,
    t: &Trace,
    envs: &[crate::trace::Envelope],
    ids: &mut EventIds,
    gate_ids: &mut EventIds,
    mem: &mut Held,
    time: &mut LaneTime,
    max_queued: &mut usize,
) {
    let warned = warnings::count();
    let rx = mem.step(|| {
        Gate::arm();
        lane.send(gate_event(gate_ids));
        let mut n = 2;
        for e in envs {
            theirs::router_events(&t.main, e, &t.ranks, ids, |ev| {
                lane.send(WorkerTask::Event(ev));
                n += 1;
            });
        }
        *max_queued = (*max_queued).max(n);
        let (m, rx) = theirs::marker();
        lane.send(m);
        if !Gate::wait_paused() {
            eprintln!("kv-index-bench: a baseline lane never reached the gate; giving up");
            std::process::exit(1);
        }
        rx
    });
    mem.step(|| {
        let a = allocations();
        let start = Instant::now();
        Gate::open();
        let _ = rx.blocking_recv();
        time.secs += start.elapsed().as_secs_f64();
        time.allocs += allocations() - a;
    });
    time.errors += warnings::count() - warned;
}

/// The window's chunks as envelope ranges.
pub(crate) fn chunks(t: &Trace) -> Vec<Range<usize>> {
    let (start, end) = (t.split, t.main.envelopes.len());
    let n = CHUNKS.min(end - start).max(1);
    (0..n)
        .map(|i| start + (end - start) * i / n..start + (end - start) * (i + 1) / n)
        .collect()
}

/// Applies the main trace to every index (see the module docs).
pub(crate) fn run(
    t: &Trace,
    ar: &Arenas,
    with_radix: bool,
    crtc_ids: &mut EventIds,
    radix_ids: &mut EventIds,
    gate_ids: &mut EventIds,
) -> AppliedAll {
    let mut mem: [Held; INDEXES] = Default::default();
    let mut bound_mem = Held::default();
    let mut bound_secs = 0f64;
    let mut times: [LaneTime; INDEXES] = Default::default();
    let fill = 0..t.split;
    let mut flash_ids = [EventIds::new(t.ranks.len()), EventIds::new(t.ranks.len())];

    // Fills.
    let mut o = mem[OURS].step(|| {
        let mut o = Ours::new(t.shape.shards);
        for e in &t.main.envelopes[fill.clone()] {
            o.apply(&t.main, ar, &t.ranks, e);
        }
        o
    });
    let mut max_queued = 0usize;
    let warned = warnings::count();
    let lane = mem[CRTC].step(|| {
        filled(
            t,
            fill.clone(),
            crtc_ids,
            dynamo_kv_router::ConcurrentRadixTreeCompressed::new(),
            &mut max_queued,
        )
    });
    times[CRTC].errors += warnings::count() - warned;
    let flash = [0, 1].map(|i| {
        let warned = warnings::count();
        let lane = mem[FLASH[i]].step(|| {
            filled(
                t,
                fill.clone(),
                &mut flash_ids[i],
                theirs::flash(theirs::FLASH_MODES[i]),
                &mut max_queued,
            )
        });
        times[FLASH[i]].errors += warnings::count() - warned;
        lane
    });
    let mut radix = with_radix.then(|| {
        mem[RADIX].step(|| {
            let mut tree = RadixTree::new();
            for e in &t.main.envelopes[fill.clone()] {
                theirs::router_events(&t.main, e, &t.ranks, radix_ids, |ev| {
                    times[RADIX].errors += u64::from(tree.apply_event(ev).is_err());
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
        mem[OURS].step(|| {
            let a = allocations();
            let start = Instant::now();
            for e in envs {
                o.apply(&t.main, ar, &t.ranks, e);
            }
                times[OURS].secs += start.elapsed().as_secs_f64();
            times[OURS].allocs += allocations() - a;
        });
        let [_, m_crtc, m_strided, m_binary, m_radix] = &mut mem;
        let [_, t_crtc, t_strided, t_binary, t_radix] = &mut times;
        lane_chunk(
            &lane,
            t,
            envs,
            crtc_ids,
            gate_ids,
            m_crtc,
            t_crtc,
            &mut max_queued,
        );
        let [ids_strided, ids_binary] = &mut flash_ids;
        lane_chunk(
            &flash[0],
            t,
            envs,
            ids_strided,
            gate_ids,
            m_strided,
            t_strided,
            &mut max_queued,
        );
        lane_chunk(
            &flash[1],
            t,
            envs,
            ids_binary,
            gate_ids,
            m_binary,
            t_binary,
            &mut max_queued,
        );
        if let Some(tree) = radix.as_mut() {
            let evs = m_radix.step(|| {
                let mut v = Vec::new();
                for e in envs {
                    theirs::router_events(&t.main, e, &t.ranks, radix_ids, |ev| v.push(ev));
                }
                v
            });
            m_radix.step(|| {
                let a = allocations();
                let start = Instant::now();
                for ev in evs {
                    t_radix.errors += u64::from(tree.apply_event(ev).is_err());
                }
                t_radix.secs += start.elapsed().as_secs_f64();
                t_radix.allocs += allocations() - a;
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
    times[OURS].errors = o.refusals.total();
    let chan = theirs::drained_channel_bytes(max_queued);
    let crtc_bytes = minus(mem[CRTC].bytes(), chan);
    mem[CRTC].step(|| lane.sweep());
    let crtc_swept = minus(mem[CRTC].bytes(), chan);

    let (s, r) = t.main.block_events(&t.main.envelopes[t.split..]);
    let events = s + r;
    let fig = |i: usize, bytes: (usize, usize), swept: Option<(usize, usize)>| Applied {
        events,
        secs: times[i].secs,
        bytes: bytes.0,
        chunks: bytes.1,
        swept,
        errors: times[i].errors,
        allocs: times[i].allocs,
    };
    let figures = [
        fig(OURS, mem[OURS].bytes(), None),
        fig(CRTC, crtc_bytes, Some(crtc_swept)),
        fig(FLASH[0], minus(mem[FLASH[0]].bytes(), chan), None),
        fig(FLASH[1], minus(mem[FLASH[1]].bytes(), chan), None),
        fig(RADIX, mem[RADIX].bytes(), None),
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
    AppliedAll {
        ours: o,
        lane,
        flash,
        flash_ids,
        radix,
        figures,
        bound,
    }
}
