//! `pick`: the latency of one worker pick alone, for fleets of 10, 100 and 1,000 simulated
//! workers (issue: "report the pick latency alone (p50/p99) for 10, 100 and 1,000 simulated
//! workers"), with allocations per pick (goal: 0 after warm-up).
//!
//! What is timed is the path a shard runs for each request ([`sim`]): `LoadStore::view`,
//! an `InflightReader` over two shards' in-flight tables wrapped in `StoreLoads`,
//! `estimate_prompt_tokens` over a ~2 KiB chat body, `LoadBasedPicker::pick`, the pick's pin
//! headers written into a reused `Vec<u8>`, and a `DispatchLedger::dispatch` record of each chosen
//! side. The fleets ([`fleet`]) are reduced from Dynamo-shaped etcd records by the discovery
//! reducer; the load store holds a fresh sample with varied loads for every `(worker, rank)`.
//! The baseline, run in the same command over the same worker list, is a trivial round-robin
//! choice plus the same header rendering (`rr`); the report gives every pick figure as a ratio to
//! the `rr` row of the same fleet and to the same row at 10 workers ([`measure`] has the method).
//!
//! Invariants: nothing is written outside memory; the run is bounded by the iteration cap and the
//! time budget of each row; a fleet that does not reduce to the intended workers is an error, not
//! a measurement.

mod fleet;
mod measure;
mod sim;

use std::fmt::Write as _;
use std::time::Duration;

use measure::{Budget, RowFigures, TimerCost};
use sim::{Activity, FixedWork, Kind, Sim};

/// Fleet sizes measured, in workers.
pub(crate) const SIZES: [u32; 3] = [10, 100, 1_000];

/// Options of `pick`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PickOptions {
    /// Measured operations per row, at most.
    pub(crate) iterations: u64,
    /// Untimed operations per row before measuring.
    pub(crate) warmup: u64,
    /// Wall time per row, at most.
    pub(crate) time: Duration,
}

impl Default for PickOptions {
    fn default() -> Self {
        Self {
            iterations: 200_000,
            warmup: 20_000,
            time: Duration::from_secs(2),
        }
    }
}

/// Why `pick` could not measure.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PickError {
    /// The reducer did not materialise the intended fleet.
    #[error(
        "the {workers}-worker fleet did not reduce as intended: {what} (diagnostics: {diagnostics})"
    )]
    Fleet {
        /// Fleet size.
        workers: u32,
        /// What differed.
        what: String,
        /// The reducer's first diagnostics.
        diagnostics: String,
    },
    /// The load store did not admit or store every key.
    #[error(
        "load store: {keys} (worker, rank) keys, {admitted} admitted, {applied} samples applied"
    )]
    Store {
        /// Keys of the fleet.
        keys: usize,
        /// Keys the store admitted.
        admitted: usize,
        /// Samples that applied.
        applied: usize,
    },
    /// A pick found no worker.
    #[error("no worker picked for model {model} among {workers} workers")]
    NoWorker {
        /// The model.
        model: &'static str,
        /// Fleet size.
        workers: usize,
    },
    /// A histogram could not be created (a bug of the bench).
    #[error("histogram: {0}")]
    Histogram(#[from] hdrhistogram::CreationError),
}

impl From<PickError> for crate::error::BenchError {
    fn from(e: PickError) -> Self {
        Self::stage(crate::error::Stage::Pick, e)
    }
}

/// The figures of one fleet size.
#[derive(Debug, Clone)]
pub(crate) struct SizeReport {
    /// Workers in the fleet.
    pub(crate) workers: u32,
    /// Aggregated, prefill and decode workers.
    pub(crate) roles: (usize, usize, usize),
    /// Workers declaring `data_parallel_size: 2`.
    pub(crate) dp2: usize,
    /// `(worker, rank)` keys in the load store.
    pub(crate) keys: usize,
    /// One row per operation kind, in [`PLAN`] order.
    pub(crate) rows: Vec<RowFigures>,
}

/// Everything `pick` measured.
#[derive(Debug, Clone)]
pub(crate) struct PickReport {
    /// The options of the run.
    pub(crate) opts: PickOptions,
    /// Chat body size, bytes.
    pub(crate) body_bytes: usize,
    /// Its estimated prompt tokens.
    pub(crate) prompt_tokens: u64,
    /// The cost of reading the clock.
    pub(crate) timer: TimerCost,
    /// One entry per fleet size, in [`SIZES`] order.
    pub(crate) sizes: Vec<SizeReport>,
}

/// The rows of every fleet size: `(sim, kind)`. Sim 0 carries the baseline and the estimate
/// alone; every pick row has a simulated shard (store, ledgers, memo) of its own, as a shard
/// picks for every request: a shard shared with rows that do not pick would let the fleet
/// publish for hundreds of operations between two of its picks. The last one publishes in
/// bursts ([`sim::Activity::Burst`]).
const PLAN: [(usize, Kind); 9] = [
    (0, Kind::Rr),
    (0, Kind::Fixed(FixedWork::Short)),
    (0, Kind::Fixed(FixedWork::Long)),
    (0, Kind::Estimate),
    (1, Kind::PickAgg),
    (2, Kind::PickPd),
    (3, Kind::PickKvAgg),
    (4, Kind::RefreshPickPd),
    (5, Kind::BurstPickAgg),
];

/// The production pick rows, whose allocations the goal is about.
const PICK_ROWS: [Kind; 3] = [Kind::PickAgg, Kind::PickPd, Kind::PickKvAgg];

/// Measures every fleet size.
pub(crate) fn run(opts: PickOptions) -> Result<PickReport, PickError> {
    let body = fleet::chat_body(fleet::PD_MODEL);
    let timer = measure::timer_cost(100_000)?;
    let budget = Budget {
        warmup: opts.warmup,
        iterations: opts.iterations.max(1),
        time: opts.time,
    };
    let mut sizes = Vec::with_capacity(SIZES.len());
    for workers in SIZES {
        eprintln!("pick: {workers} workers...");
        let f = fleet::build(workers)?;
        let shard = |activity| Sim::new(&f.view, body.as_bytes(), activity);
        let mut sims = [
            shard(Activity::Staggered)?,
            shard(Activity::Staggered)?,
            shard(Activity::Staggered)?,
            shard(Activity::Staggered)?,
            shard(Activity::Staggered)?,
            shard(Activity::Burst)?,
        ];
        if let Some(s) = sims.iter().find(|s| s.keys() != f.keys) {
            return Err(PickError::Store {
                keys: f.keys,
                admitted: s.keys(),
                applied: s.keys(),
            });
        }
        let rows = measure::rows(&mut sims, &PLAN, &budget, timer)?;
        sizes.push(SizeReport {
            workers,
            roles: (f.aggregated, f.prefill, f.decode),
            dp2: f.dp2,
            keys: f.keys,
            rows,
        });
    }
    Ok(PickReport {
        opts,
        body_bytes: body.len(),
        prompt_tokens: continuum_core::picker::estimate_prompt_tokens(body.as_bytes()).get(),
        timer,
        sizes,
    })
}

impl PickReport {
    /// The figures of `kind` at `workers`.
    pub(crate) fn row(&self, workers: u32, kind: Kind) -> Option<&RowFigures> {
        self.sizes
            .iter()
            .find(|s| s.workers == workers)?
            .rows
            .iter()
            .find(|r| r.kind == kind)
    }

    /// The rows of `kinds` whose measured batches allocated, with their fleet size.
    fn allocating(&self, kinds: &[Kind]) -> Vec<(u32, &RowFigures)> {
        let mut rows = self.all(kinds);
        rows.retain(|(_, r)| r.allocs > 0);
        rows
    }

    /// Every row of `kinds`, with its fleet size.
    fn all(&self, kinds: &[Kind]) -> Vec<(u32, &RowFigures)> {
        self.sizes
            .iter()
            .flat_map(|s| s.rows.iter().map(move |r| (s.workers, r)))
            .filter(|(_, r)| kinds.contains(&r.kind))
            .collect()
    }

    /// The report as printed.
    pub(crate) fn render(&self) -> String {
        let mut r = String::new();
        self.render_preamble(&mut r);
        for size in &self.sizes {
            self.render_size(&mut r, size);
        }
        self.render_summary(&mut r);
        r
    }

    fn render_preamble(&self, r: &mut String) {
        let _ = writeln!(
            r,
            "pick: one pick on a shard, the production path: LoadStore::view, InflightReader over \
             2 shards' in-flight tables + StoreLoads, estimate_prompt_tokens over a {b}-byte chat \
             body ({t} tokens), LoadBasedPicker::pick, Pick::pin_headers written into a reused \
             Vec<u8>, DispatchLedger::dispatch of the decode side (and of the prefill side)",
            b = self.body_bytes,
            t = self.prompt_tokens,
        );
        let _ = writeln!(
            r,
            "baseline rr: the next worker of the same fleet.workers in turn + the same pin-header \
             rendering. Diagnostics: estimate = estimate_prompt_tokens alone (part of every \
             pick); refresh+p/d = DispatchLedger::refresh (its docs: \"call before each pick\") \
             then the p/d path; burst agg = the agg path right after every key published at \
             once (the worst case: each pick reads every candidate's cells again); fixed 2k / 6k = \
             the same work every time (that many dependent loads around a 128 KiB table), whose \
             p99/p50 is the tail the machine alone adds (the reference for the pick rows' p99s). Every pick row runs on a shard \
             state of its own"
        );
        let _ = writeln!(
            r,
            "fleets (one namespace, Dynamo-shaped etcd records through the discovery reducer): \
             half aggregated `{agg}`, half `{pd}` (1/4 prefill, 3/4 decode), 1/3 with \
             data_parallel_size 2; every (worker, rank) gets a fresh sample with new loads every \
             {round} operations ({ms} ms simulated at {us} us per operation), the keys in turn \
             (staggered, as independent workers publish), and the other shard dispatches to a \
             random key after every fourth sample; the ledger starts with one dispatch to every \
             key",
            agg = fleet::AGG_MODEL,
            pd = fleet::PD_MODEL,
            round = sim::ROUND_EVERY,
            ms = sim::ROUND_EVERY * sim::STEP.as_micros() as u64 / 1_000,
            us = sim::STEP.as_micros(),
        );
        let _ = writeln!(
            r,
            "timer: two consecutive Instant::now() calls are {m:.1} ns apart (median; p99 {p:.1} \
             ns; {n} pairs). A row whose batch is above 1 times batches of that many operations \
             (timer <= 5% of a batch) and records each batch's mean, so its percentiles are of \
             batch means",
            m = self.timer.median_ns,
            p = self.timer.p99_ns,
            n = self.timer.samples,
        );
        let _ = writeln!(
            r,
            "per row: at most {i} measured operations or {s:.1} s, after {w} warm-up operations; \
             the rows of one fleet are measured interleaved; allocs/op counts allocations inside \
             the timed batches only, in dispatch/op those made inside DispatchLedger::dispatch",
            i = self.opts.iterations,
            s = self.opts.time.as_secs_f64(),
            w = self.opts.warmup,
        );
    }

    fn render_size(&self, r: &mut String, size: &SizeReport) {
        let (agg, pre, dec) = size.roles;
        let _ = writeln!(
            r,
            "\n== {w} workers: {agg} aggregated, {pre} prefill, {dec} decode ({dp2} with \
             data_parallel_size 2); {k} (worker, rank) keys ==",
            w = size.workers,
            dp2 = size.dp2,
            k = size.keys,
        );
        let _ = writeln!(
            r,
            "{:<11} {:>7} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11} {:>7} {:>7} {:>8} {:>8} \
             {:>7} {:>7}",
            "row",
            "ops",
            "batch",
            "p50 ns",
            "p99 ns",
            "p99.9 ns",
            "mean ns",
            "allocs/op",
            "dispatch/op",
            "by load",
            "prefill",
            "p50/rr",
            "p99/rr",
            "p50/10w",
            "p99/10w",
        );
        let rr = self.row(size.workers, Kind::Rr);
        let smallest = SIZES[0];
        for f in &size.rows {
            let base10 = self.row(smallest, f.kind);
            let ratio = |a: f64, b: Option<f64>| match b {
                Some(b) if b > 0.0 => format!("{:.2}x", a / b),
                _ => "-".to_owned(),
            };
            let picks = f.kind.is_pick();
            let share = |n: u64| {
                if picks {
                    format!("{:.1}%", 100.0 * n as f64 / f.outcomes.ops.max(1) as f64)
                } else {
                    "-".to_owned()
                }
            };
            let dispatch = if picks {
                format!(
                    "{:.5}",
                    f.outcomes.dispatch_allocs as f64 / f.ops.max(1) as f64
                )
            } else {
                "-".to_owned()
            };
            let _ = writeln!(
                r,
                "{:<11} {:>7} {:>5} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.5} {:>11} {:>7} {:>7} \
                 {:>8} {:>8} {:>7} {:>7}",
                f.kind.label(),
                f.ops,
                f.batch,
                f.p50_ns,
                f.p99_ns,
                f.p999_ns,
                f.mean_ns,
                f.allocs_per_op(),
                dispatch,
                share(f.outcomes.by_load),
                share(f.outcomes.with_prefill),
                ratio(f.p50_ns, rr.map(|b| b.p50_ns)),
                ratio(f.p99_ns, rr.map(|b| b.p99_ns)),
                ratio(f.p50_ns, base10.map(|b| b.p50_ns)),
                ratio(f.p99_ns, base10.map(|b| b.p99_ns)),
            );
        }
    }

    /// Each pick row's p99/p50 beside the fixed row's of the same fleet: how much of a pick's
    /// tail the machine alone accounts for.
    fn render_tails(&self, r: &mut String) {
        let tail = |f: &RowFigures| f.p99_ns / f.p50_ns.max(1e-9);
        for workers in SIZES {
            let mut line = format!("tails (p99/p50) at {workers:>4} workers:");
            for work in [FixedWork::Short, FixedWork::Long] {
                if let Some(f) = self.row(workers, Kind::Fixed(work)) {
                    let _ = write!(
                        line,
                        " {} {:.2}x (p50 {:.1} us);",
                        Kind::Fixed(work).label(),
                        tail(f),
                        f.p50_ns / 1e3
                    );
                }
            }
            for kind in PICK_ROWS {
                if let Some(f) = self.row(workers, kind) {
                    let _ = write!(
                        line,
                        " {} {:.2}x (p50 {:.1} us);",
                        kind.label(),
                        tail(f),
                        f.p50_ns / 1e3
                    );
                }
            }
            let _ = writeln!(r, "{}", line.trim_end_matches(';'));
        }
    }

    fn render_summary(&self, r: &mut String) {
        let smallest = SIZES[0];
        let _ = writeln!(
            r,
            "\nratios: p50/rr and p99/rr divide by the rr row of the same fleet; p50/10w and \
             p99/10w by the same row at {smallest} workers. by load = decode sides chosen by the \
             row's cost (load; kv_aware for pick kv), not round-robin; prefill = picks that carried a prefill worker"
        );
        for kind in PICK_ROWS {
            for workers in SIZES {
                if let (Some(a), Some(b), Some(rr)) = (
                    self.row(workers, kind),
                    self.row(smallest, kind),
                    self.row(workers, Kind::Rr),
                ) {
                    let _ = writeln!(
                        r,
                        "{l} at {workers:>4} workers: p50 {x:7.1}x rr, p99 {z:7.1}x rr, p50 \
                         {y:5.2}x its {smallest}-worker p50",
                        l = kind.label(),
                        x = a.p50_ns / rr.p50_ns.max(1e-9),
                        z = a.p99_ns / rr.p99_ns.max(1e-9),
                        y = a.p50_ns / b.p50_ns.max(1e-9),
                    );
                }
            }
        }
        if let (Some(e), Some(p)) = (
            self.row(smallest, Kind::Estimate),
            self.row(smallest, Kind::PickAgg),
        ) {
            let _ = writeln!(
                r,
                "estimate_prompt_tokens alone is {:.0}% of the {smallest}-worker pick agg p50",
                100.0 * e.p50_ns / p.p50_ns.max(1e-9)
            );
        }
        self.render_tails(r);
        let allocating = self.allocating(&PICK_ROWS);
        if allocating.is_empty() {
            let _ = writeln!(r, "allocations after warm-up: 0 in every pick row (goal 0)");
        }
        for (w, f) in allocating {
            let _ = writeln!(
                r,
                "allocations after warm-up: {l} at {w} workers made {n} allocations in {o} \
                 operations ({a:.5} per op; goal 0), {d} of them inside DispatchLedger::dispatch",
                l = f.kind.label(),
                n = f.allocs,
                o = f.ops,
                a = f.allocs_per_op(),
                d = f.outcomes.dispatch_allocs,
            );
        }
        for (w, f) in self.all(&[PICK_ROWS.as_slice(), &[Kind::BurstPickAgg]].concat()) {
            let _ = writeln!(
                r,
                "load memo: {l} at {w} workers read {c:.1} candidate loads per pick from the cells \
                 (the memo answered the rest; each key publishes every {round} operations, or \
                 before every pick in burst agg)",
                round = sim::ROUND_EVERY,
                l = f.kind.label(),
                c = f.outcomes.cell_reads as f64 / f.ops.max(1) as f64,
            );
        }
        for (w, f) in self.allocating(&[Kind::RefreshPickPd]) {
            let _ = writeln!(
                r,
                "refresh+p/d at {w} workers: {a:.4} allocations per op ({d:.4} inside dispatch)",
                a = f.allocs_per_op(),
                d = f.outcomes.dispatch_allocs as f64 / f.ops.max(1) as f64,
            );
        }
        if let Some(load) = crate::cpu::loadavg() {
            let _ = writeln!(
                r,
                "load average at the end: {load:.2} (other jobs inflate the absolute times and \
                 the p99s; compare the ratios)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_run_reports_every_size_and_row() {
        let report = run(PickOptions {
            iterations: 400,
            warmup: 400,
            time: Duration::from_secs(5),
        })
        .unwrap();
        for workers in SIZES {
            for (_, kind) in PLAN {
                let row = report.row(workers, kind).unwrap();
                assert!(
                    row.ops > 0 && row.p50_ns > 0.0,
                    "{workers} {kind:?}: {row:?}"
                );
                if kind.is_pick() {
                    assert_eq!(row.outcomes.ops, row.ops, "{workers} {kind:?}");
                    assert_eq!(row.outcomes.by_load, row.ops, "{workers} {kind:?}");
                }
                if matches!(kind, Kind::Rr | Kind::Estimate | Kind::Fixed(_)) {
                    assert_eq!(row.allocs, 0, "{workers} {kind:?}: {row:?}");
                }
                // The goal is 0 allocations per pick after warm-up. What the pick path may
                // allocate is the dispatch ledger's record pool growing past its peak (kept
                // afterwards): nothing outside DispatchLedger::dispatch may allocate.
                if kind.is_pick() {
                    assert_eq!(
                        row.allocs,
                        row.outcomes.dispatch_allocs,
                        "{workers} workers, {}: allocations outside dispatch: {row:?}",
                        kind.label()
                    );
                }
            }
        }
        let text = report.render();
        for needle in [
            "== 10 workers",
            "== 100 workers",
            "== 1000 workers",
            "\nrr ",
            "\nfixed 2k ",
            "\nfixed 6k ",
            "tails (p99/p50) at ",
            "\nestimate ",
            "\npick agg ",
            "\npick p/d ",
            "\nrefresh+p/d ",
            "\nburst agg ",
            "allocations after warm-up: ",
            "load memo: pick agg at ",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }
}
