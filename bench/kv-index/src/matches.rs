//! Figure (2): `find_matches` latency for 128-block prompts over every rank, and whether each
//! index's answers agree with the trace's exact answer.
//!
//! Each index answers the same queries in the same order: ours through `Merged` over one reader
//! per shard (as a shard reads at pick time), the CRTC through its `find_matches` (as
//! `ThreadPoolIndexer::find_matches` calls it inline, `early_exit = false`), the RadixTree
//! through `find_matches` (its `Vec` argument built per call, as its API takes it by value). The
//! indexes take turns, 64 calls each, so load from other processes lands on all alike; every
//! call is timed alone with `Instant` (a call costs hundreds of timer reads or more).

use std::collections::HashMap;
use std::time::Instant;

use hdrhistogram::Histogram;

use crate::trace::Query;

/// A latency histogram in nanoseconds (1 ns to 60 s, 3 significant digits).
#[derive(Debug, Clone)]
pub(crate) struct Lat(Histogram<u64>);

impl Lat {
    pub(crate) fn new() -> Self {
        match Histogram::new_with_bounds(1, 60_000_000_000, 3) {
            Ok(h) => Self(h),
            // The bounds are constants within hdrhistogram's limits.
            Err(_) => std::process::abort(),
        }
    }

    pub(crate) fn record(&mut self, ns: u64) {
        self.0.saturating_record(ns.max(1));
    }

    /// The `q` quantile in nanoseconds.
    pub(crate) fn q(&self, q: f64) -> f64 {
        self.0.value_at_quantile(q) as f64
    }

    pub(crate) fn len(&self) -> u64 {
        self.0.len()
    }
}

/// How many queries an index answered exactly as the trace says.
#[derive(Debug, Clone, Default)]
pub(crate) struct Agreement {
    pub(crate) agree: u64,
    pub(crate) total: u64,
    /// The first disagreement, described.
    pub(crate) first: Option<String>,
}

/// Checks `find(query, out)` (which fills `out` with `(rank index, blocks)`) on every query.
pub(crate) fn agreement(
    queries: &[Query],
    mut find: impl FnMut(usize, &mut Vec<(u32, u32)>),
) -> Agreement {
    let mut a = Agreement::default();
    let mut out = Vec::new();
    for (i, q) in queries.iter().enumerate() {
        out.clear();
        find(i, &mut out);
        out.sort_unstable();
        a.total += 1;
        if out == q.truth {
            a.agree += 1;
        } else if a.first.is_none() {
            let got: HashMap<u32, u32> = out.iter().copied().collect();
            let want: HashMap<u32, u32> = q.truth.iter().copied().collect();
            let wrong = want.iter().filter(|(r, d)| got.get(r) != Some(d)).count();
            let extra = got.keys().filter(|r| !want.contains_key(r)).count();
            a.first = Some(format!(
                "query {i}: {} ranks expected, {} reported, {wrong} wrong or missing, {extra} extra",
                want.len(),
                got.len()
            ));
        }
    }
    a
}

/// One index under measurement: its name and a call answering query `i`.
pub(crate) type Caller<'a> = Box<dyn FnMut(usize) + 'a>;

/// One caller's latencies: every call, and each query's fastest call (its cost without
/// interference from other processes, when the query was called more than once).
#[derive(Debug, Clone)]
pub(crate) struct Timed {
    pub(crate) all: Lat,
    pub(crate) fastest: Lat,
}

/// Times `iterations` calls of every caller (interleaved, 64 at a time, after 256 untimed
/// ones), stopping early at `seconds` per caller.
pub(crate) fn measure(
    queries: usize,
    iterations: u64,
    seconds: f64,
    callers: &mut [Caller<'_>],
) -> Vec<Timed> {
    let mut lats: Vec<Lat> = callers.iter().map(|_| Lat::new()).collect();
    let mut fastest: Vec<Vec<u64>> = callers.iter().map(|_| vec![u64::MAX; queries]).collect();
    for c in callers.iter_mut() {
        for i in 0..256 {
            c(i % queries);
        }
    }
    let deadline =
        Instant::now() + std::time::Duration::from_secs_f64(seconds * callers.len() as f64);
    let mut done = vec![0u64; callers.len()];
    while done.iter().any(|&d| d < iterations) && Instant::now() < deadline {
        for (k, c) in callers.iter_mut().enumerate() {
            for _ in 0..64 {
                if done[k] >= iterations {
                    break;
                }
                let q = (done[k] % queries as u64) as usize;
                let t = Instant::now();
                c(q);
                let ns = t.elapsed().as_nanos() as u64;
                lats[k].record(ns);
                fastest[k][q] = fastest[k][q].min(ns);
                done[k] += 1;
            }
        }
    }
    lats.into_iter()
        .zip(fastest)
        .map(|(all, f)| {
            let mut fastest = Lat::new();
            for ns in f.into_iter().filter(|&n| n != u64::MAX) {
                fastest.record(ns);
            }
            Timed { all, fastest }
        })
        .collect()
}
