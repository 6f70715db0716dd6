//! `--breakdown`: where our index spends its time, measured from outside (no profiler needed):
//! the window of figure (1) re-applied to fresh indexes, each call timed alone, once with the
//! trace's shards and once with one shard (no node duplicated across shards; its `find_matches`
//! on the figure-(2) queries shows what the merge over shards costs), and the memory after the
//! trace split into the node tables (what readers walk) and the rest (the writers' per-rank
//! engine-hash maps and bookkeeping).

use std::fmt::Write as _;
use std::time::Instant;

use continuum_core::kv::EngineHash;
use continuum_core::kv::index::IndexWriter;
use continuum_core::kv::shared::Merged;
use continuum_core::picker::{OverlapSource, PromptBlocks};

use crate::alloc::live_bytes;
use crate::apply;
use crate::matches::Lat;
use crate::ours::{self, Arenas, Ours};
use crate::trace::{BLOCK_TOKENS, Op, Trace};

#[derive(Debug, Default, Clone, Copy)]
struct Split {
    prefetch_ns: u64,
    store_ns: u64,
    remove_ns: u64,
    stored: u64,
    removed: u64,
    stores: u64,
    removes: u64,
}

impl Split {
    fn total_ns(&self) -> u64 {
        self.prefetch_ns + self.store_ns + self.remove_ns
    }
}

fn ns(t: Instant) -> u64 {
    t.elapsed().as_nanos() as u64
}

/// Fill untimed, then the window timed per call.
fn run(t: &Trace, ar: &Arenas, shards: u32) -> (Ours, Split) {
    let mut o = Ours::new(shards);
    for e in &t.main.envelopes[..t.split] {
        o.apply(&t.main, ar, &t.ranks, e);
    }
    let mut s = Split::default();
    let keys: Vec<_> = t.ranks.iter().map(|&r| ours::key(r)).collect();
    for c in apply::chunks(t) {
        for e in &t.main.envelopes[c] {
            let shard = o.shard_of(t.ranks[e.rank as usize]);
            let k = keys[e.rank as usize];
            let w = &mut o.writers[shard];
            let start = Instant::now();
            w.prefetch(t.main.ops(e).iter().map(|op| ours::upcoming(op, k, ar)));
            s.prefetch_ns += ns(start);
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
                        s.store_ns += ns(start);
                        s.stored += u64::from(len);
                        s.stores += 1;
                    }
                    Op::Remove { start: at, len } => {
                        let _ = w.remove(k, ar.removed_slice(at, len));
                        s.remove_ns += ns(start);
                        s.removed += u64::from(len);
                        s.removes += 1;
                    }
                }
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
        "    {name:<10} {:>6.2} M/s | per stored block {:>4.0} ns ({:.0}% of the time, {} calls), per removed hash {:>4.0} ns ({:.0}%, {} calls), prefetch {:.0}%",
        ev / (s.total_ns() as f64 / 1e9) / 1e6,
        per(s.store_ns, s.stored),
        100.0 * s.store_ns as f64 / s.total_ns().max(1) as f64,
        s.stores,
        per(s.remove_ns, s.removed),
        100.0 * s.remove_ns as f64 / s.total_ns().max(1) as f64,
        s.removes,
        100.0 * s.prefetch_ns as f64 / s.total_ns().max(1) as f64,
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
pub(crate) fn report(t: &Trace, ar: &Arenas) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  breakdown of ours (each call timed alone; fresh indexes, same fill and window):"
    );
    let shards = t.shape.shards;
    let queries: Vec<_> = t.queries.iter().map(|q| ours::query(&q.blocks)).collect();
    let (o, a) = run(t, ar, shards);
    line(&mut out, &format!("{shards} shards"), &a);
    let cold = fastest(&o, &queries, 5, true);
    let warm = fastest(&o, &queries, 5, false);
    // Memory: all, the node tables as the writers report them, then nothing.
    let l0 = live_bytes();
    let tables: usize = o.writers.iter().map(IndexWriter::table_bytes).sum();
    drop(o);
    let l2 = live_bytes();
    let (o1, c) = run(t, ar, 1);
    line(&mut out, "1 shard", &c);
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
        "    memory after the trace: {:.1} MB in all; the node tables (what readers walk) {:.1} MB; the rest (per-rank engine-hash maps, slot maps, bookkeeping) {:.1} MB",
        (l0 - l2) as f64 / 1e6,
        tables as f64 / 1e6,
        (l0 - l2).saturating_sub(tables) as f64 / 1e6
    );
    out
}
