//! `--breakdown`: where our index spends its time, measured from outside (no profiler needed):
//! the window of figure (1) re-applied to fresh indexes in three variants, each call timed alone:
//! - as measured: the shards, publish per `--batch`;
//! - publish once per chunk: the writers' second copy then replays a whole chunk's ops in the
//!   chunk's first call, so that call's time is the replay share (the copy-and-replay cost of
//!   publishing every envelope shows as the difference to the first variant);
//! - one shard: no node duplicated across shards; its `find_matches` on the figure-(2) queries
//!   shows what the merge over shards costs.

use std::fmt::Write as _;
use std::time::Instant;

use continuum_core::kv::EngineHash;
use continuum_core::kv::shared::Merged;
use continuum_core::picker::{OverlapSource, PromptBlocks};

use crate::alloc::live_bytes;
use crate::apply;
use crate::matches::Lat;
use crate::ours::{self, Arenas, Ours};
use crate::trace::{BLOCK_TOKENS, Op, Trace};

#[derive(Debug, Default, Clone, Copy)]
struct Split {
    store_ns: u64,
    remove_ns: u64,
    publish_ns: u64,
    /// Variant 2: the first call of each shard in each chunk (which replays that shard's part of
    /// the previous chunk).
    first_ns: u64,
    stored: u64,
    removed: u64,
    stores: u64,
    removes: u64,
    publishes: u64,
}

impl Split {
    fn total_ns(&self) -> u64 {
        self.store_ns + self.remove_ns + self.publish_ns + self.first_ns
    }
}

fn ns(t: Instant) -> u64 {
    t.elapsed().as_nanos() as u64
}

/// Fill untimed, then the window timed per call; `batch = None`: publish once per chunk.
fn run(t: &Trace, ar: &Arenas, shards: u32, batch: Option<u32>) -> (Ours, Split) {
    let mut o = Ours::new(shards, batch.unwrap_or(u32::MAX));
    for e in &t.main.envelopes[..t.split] {
        o.apply(&t.main, ar, &t.ranks, e);
    }
    o.publish_all();
    let mut s = Split::default();
    let keys: Vec<_> = t.ranks.iter().map(|&r| ours::key(r)).collect();
    let mut pending = vec![0u32; shards as usize];
    let every = batch.unwrap_or(u32::MAX);
    for c in apply::chunks(t) {
        let mut firsts = vec![batch.is_none(); shards as usize];
        for e in &t.main.envelopes[c] {
            let shard = o.shard_of(t.ranks[e.rank as usize]);
            let first = &mut firsts[shard];
            let k = keys[e.rank as usize];
            let w = &mut o.writers[shard];
            for op in t.main.ops(e) {
                let start = Instant::now();
                match *op {
                    Op::Store {
                        parent,
                        start: at,
                        len,
                    } => {
                        let blocks = ar.stored_slice(at, len);
                        let _ = w.store(k, parent.map(EngineHash), blocks);
                        let d = ns(start);
                        if *first {
                            s.first_ns += d;
                        } else {
                            s.store_ns += d;
                        }
                        s.stored += u64::from(len);
                        s.stores += 1;
                    }
                    Op::Remove { start: at, len } => {
                        let _ = w.remove(k, ar.removed_slice(at, len));
                        let d = ns(start);
                        if *first {
                            s.first_ns += d;
                        } else {
                            s.remove_ns += d;
                        }
                        s.removed += u64::from(len);
                        s.removes += 1;
                    }
                }
                *first = false;
            }
            let p = &mut pending[shard];
            *p += 1;
            if *p >= every {
                *p = 0;
                let start = Instant::now();
                w.publish();
                s.publish_ns += ns(start);
                s.publishes += 1;
            }
        }
        for (w, p) in o.writers.iter_mut().zip(&mut pending) {
            if *p > 0 {
                *p = 0;
                let start = Instant::now();
                w.publish();
                s.publish_ns += ns(start);
                s.publishes += 1;
            }
        }
    }
    (o, s)
}

fn line(out: &mut String, name: &str, s: &Split) {
    let ev = (s.stored + s.removed).max(1) as f64;
    let per = |x: u64, n: u64| x as f64 / n.max(1) as f64;
    let _ = writeln!(
        out,
        "    {name:<34} {:>6.2} M/s | per stored block {:>4.0} ns ({:.0}% of the time), per removed hash {:>4.0} ns ({:.0}%), per publish {:>5.0} ns ({} publishes, {:.0}%){}",
        ev / (s.total_ns() as f64 / 1e9) / 1e6,
        per(s.store_ns, s.stored),
        100.0 * s.store_ns as f64 / s.total_ns().max(1) as f64,
        per(s.remove_ns, s.removed),
        100.0 * s.remove_ns as f64 / s.total_ns().max(1) as f64,
        per(s.publish_ns, s.publishes),
        s.publishes,
        100.0 * s.publish_ns as f64 / s.total_ns().max(1) as f64,
        if s.first_ns > 0 {
            format!(
                ", each shard's first call of a chunk (replaying the previous chunk on the other copy) {:.0}%",
                100.0 * s.first_ns as f64 / s.total_ns() as f64
            )
        } else {
            String::new()
        }
    );
}

/// Each query's fastest of `reps` `find_matches` calls over `o`'s shards: `cold` runs the passes
/// over all queries one after the other (other queries' nodes in between, as in figure 2), else
/// each query `reps` times back to back (its nodes in cache).
fn fastest(
    o: &Ours,
    queries: &[Vec<continuum_core::picker::BlockHash>],
    reps: usize,
    cold: bool,
) -> Vec<u64> {
    let handles = Ours::handles(&o.readers);
    let m = Merged(&handles);
    let mut best = vec![u64::MAX; queries.len()];
    let mut call = |i: usize| {
        let mut acc = 0u32;
        let start = Instant::now();
        m.find_matches(
            PromptBlocks {
                block_size: BLOCK_TOKENS as u32,
                hashes: &queries[i],
            },
            &mut |_, d| acc = acc.wrapping_add(d),
        );
        best[i] = best[i].min(ns(start));
        std::hint::black_box(acc);
    };
    if cold {
        for _ in 0..reps {
            for i in 0..queries.len() {
                call(i);
            }
        }
    } else {
        for i in 0..queries.len() {
            for _ in 0..reps {
                call(i);
            }
        }
    }
    best
}

fn p50_p99(v: &[u64]) -> String {
    let mut l = Lat::new();
    for &x in v {
        l.record(x);
    }
    format!("{:.2} / {:.2} us", l.q(0.5) / 1e3, l.q(0.99) / 1e3)
}

/// The breakdown lines for the report.
pub(crate) fn report(t: &Trace, ar: &Arenas, batch: u32) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  breakdown of ours (each call timed alone; fresh indexes, same fill and window):"
    );
    let shards = t.shape.shards;
    let queries: Vec<_> = t.queries.iter().map(|q| ours::query(&q.blocks)).collect();
    let (o, a) = run(t, ar, shards, Some(batch));
    line(
        &mut out,
        &format!("{shards} shards, publish every {batch}"),
        &a,
    );
    let cold = fastest(&o, &queries, 5, true);
    let warm = fastest(&o, &queries, 5, false);
    // Memory: all, then without the writers (the published copy and the readers), then nothing.
    let l0 = live_bytes();
    let (writers, readers) = o.into_parts();
    drop(writers);
    let l1 = live_bytes();
    drop(readers);
    let l2 = live_bytes();
    let (b_o, b) = run(t, ar, shards, None);
    drop(b_o);
    line(
        &mut out,
        &format!("{shards} shards, publish once per chunk"),
        &b,
    );
    let (o1, c) = run(t, ar, 1, Some(batch));
    line(&mut out, &format!("1 shard, publish every {batch}"), &c);
    let cold1 = fastest(&o1, &queries, 5, true);
    let warm1 = fastest(&o1, &queries, 5, false);
    drop(o1);
    let _ = writeln!(
        out,
        "    find_matches, each query's fastest of 5, p50 / p99: {shards} shards {} interleaved, {} back to back; 1 shard {} interleaved, {} back to back",
        p50_p99(&cold),
        p50_p99(&warm),
        p50_p99(&cold1),
        p50_p99(&warm1)
    );
    // The slowest 1% of queries (interleaved) against all of them.
    let mut order: Vec<usize> = (0..cold.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(cold[i]));
    let slow = &order[..(order.len() / 100).max(1)];
    let mean = |idx: &mut dyn Iterator<Item = usize>, f: &dyn Fn(usize) -> f64| {
        let v: Vec<f64> = idx.map(f).collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let ranks = |i: usize| t.queries[i].truth.len() as f64;
    let deep = |i: usize| {
        t.queries[i]
            .truth
            .iter()
            .map(|&(_, d)| d)
            .max()
            .unwrap_or(0) as f64
    };
    let _ = writeln!(
        out,
        "    slowest 1% of queries: {:.0} ranks hold their first block (all queries: {:.0}), deepest match {:.0} blocks (all: {:.0})",
        mean(&mut slow.iter().copied(), &ranks),
        mean(&mut (0..cold.len()), &ranks),
        mean(&mut slow.iter().copied(), &deep),
        mean(&mut (0..cold.len()), &deep)
    );
    let _ = writeln!(
        out,
        "    memory after the trace: {:.1} MB in all; the published copy and its readers {:.1} MB; the writers (their own copy, per-rank engine-hash maps, journal) {:.1} MB",
        (l0 - l2) as f64 / 1e6,
        (l1 - l2) as f64 / 1e6,
        (l0 - l1) as f64 / 1e6
    );
    out
}
