//! Timing of `pick`: per-operation latency histograms, allocation counts and the timer's own
//! cost.
//!
//! Method, per fleet size: each row (operation kind) is warmed up, then calibrated (the fastest
//! of four short timed runs, 256 operations each or 1/8 of the iteration cap if less, gives its
//! rough cost per operation, which sets its batch size: one operation per timed batch
//! unless the timer's own cost would exceed 5% of a batch, then just enough operations per batch
//! to bring it under that). The rows are then measured **interleaved**, a slice of
//! `SLICE_BATCHES` batches each in turn, so that load from other processes hits every row alike,
//! until each row has run its iteration cap or its time budget. Each batch is timed with
//! [`std::time::Instant`] and its mean per-operation time (in picoseconds) is recorded into an
//! hdrhistogram once per operation of the batch.
//!
//! Invariants: only the operations are inside the timed window and inside the allocation window
//! (fleet activity between batches, [`Sim::advance`], is outside both); the histograms are
//! bounded (1 ps ..= 1 s, 3 significant digits), so recording never allocates or fails; every
//! loop is bounded by the iteration cap and the time budget.

use std::hint::black_box;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::alloc::thread_allocations;

use super::PickError;
use super::sim::{Kind, Outcomes, Sim};

/// Batches per row per interleaving slice. The first operation of a slice runs after the
/// other rows' slices, each on a simulated shard of its own, have pushed its data out of the
/// caches; that is the bench's doing, not a pick's, so it must stay far below 1% of a row's
/// operations or it sets the p99. With 32 batches per slice (3% first-of-slice) the `fixed`
/// rows, the same work every time, had a p99 of 2.2-6.4x their p50; with 1,024, 1.5-1.9x.
const SLICE_BATCHES: u64 = 1024;
/// Largest batch.
const MAX_BATCH: u64 = 1024;
/// A batch lasts at least this many timer costs (so the timer is at most 5% of it).
const TIMER_SHARE: f64 = 20.0;
/// Histogram ceiling: 1 s in picoseconds.
const MAX_PS: u64 = 1_000_000_000_000;

/// How long and how much to measure.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    /// Untimed operations per row before calibration.
    pub(crate) warmup: u64,
    /// Measured operations per row, at most.
    pub(crate) iterations: u64,
    /// Wall time per row, at most (measured slices plus the fleet activity between batches).
    pub(crate) time: Duration,
}

/// The measured figures of one row.
#[derive(Debug, Clone)]
pub(crate) struct RowFigures {
    /// Operation kind.
    pub(crate) kind: Kind,
    /// Operations measured.
    pub(crate) ops: u64,
    /// Operations per timed batch.
    pub(crate) batch: u64,
    /// Median, 99th and 99.9th percentile per-operation time, ns.
    pub(crate) p50_ns: f64,
    /// See `p50_ns`.
    pub(crate) p99_ns: f64,
    /// See `p50_ns`.
    pub(crate) p999_ns: f64,
    /// Mean per-operation time, ns.
    pub(crate) mean_ns: f64,
    /// Allocations made inside the timed batches.
    pub(crate) allocs: u64,
    /// What the measured operations chose, and their allocations inside `dispatch`.
    pub(crate) outcomes: Outcomes,
}

impl RowFigures {
    /// Allocations per measured operation.
    pub(crate) fn allocs_per_op(&self) -> f64 {
        self.allocs as f64 / self.ops.max(1) as f64
    }
}

/// The cost of reading the clock, as seen by the batch timing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TimerCost {
    /// Median time between two consecutive `Instant::now()` calls, ns.
    pub(crate) median_ns: f64,
    /// 99th percentile of the same, ns.
    pub(crate) p99_ns: f64,
    /// Pairs sampled.
    pub(crate) samples: u64,
}

fn histogram() -> Result<Histogram<u64>, PickError> {
    Ok(Histogram::new_with_bounds(1, MAX_PS, 3)?)
}

/// Measures the cost of `Instant::now()` pairs.
pub(crate) fn timer_cost(samples: u64) -> Result<TimerCost, PickError> {
    let mut h = histogram()?;
    for _ in 0..samples {
        let a = Instant::now();
        let b = Instant::now();
        h.saturating_record(duration_ps(b.duration_since(a)).max(1));
    }
    Ok(TimerCost {
        median_ns: h.value_at_quantile(0.5) as f64 / 1e3,
        p99_ns: h.value_at_quantile(0.99) as f64 / 1e3,
        samples,
    })
}

fn duration_ps(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().saturating_mul(1_000)).unwrap_or(u64::MAX)
}

/// One row being measured.
struct Row {
    sim: usize,
    kind: Kind,
    outcomes_before: Outcomes,
    batch: u64,
    hist: Histogram<u64>,
    ops: u64,
    allocs: u64,
    spent: Duration,
}

impl Row {
    fn done(&self, budget: &Budget) -> bool {
        self.ops >= budget.iterations || self.spent >= budget.time
    }

    /// Runs up to `SLICE_BATCHES` timed batches.
    fn slice(&mut self, sims: &mut [Sim<'_>], budget: &Budget) -> Result<(), PickError> {
        let Some(sim) = sims.get_mut(self.sim) else {
            return Ok(());
        };
        let started = Instant::now();
        for _ in 0..SLICE_BATCHES {
            let n = self
                .batch
                .min(budget.iterations.saturating_sub(self.ops))
                .max(1);
            let allocs_before = thread_allocations();
            let t = Instant::now();
            for _ in 0..n {
                black_box(sim.op(self.kind)?);
            }
            let elapsed = t.elapsed();
            let allocs = thread_allocations().wrapping_sub(allocs_before);
            self.allocs += allocs;
            self.ops += n;
            self.hist
                .saturating_record_n((duration_ps(elapsed) / n).max(1), n);
            sim.advance(n);
            if self.ops >= budget.iterations {
                break;
            }
        }
        self.spent += started.elapsed();
        Ok(())
    }

    fn figures(&self, sims: &[Sim<'_>]) -> RowFigures {
        let q = |x: f64| self.hist.value_at_quantile(x) as f64 / 1e3;
        RowFigures {
            kind: self.kind,
            ops: self.ops,
            batch: self.batch,
            p50_ns: q(0.5),
            p99_ns: q(0.99),
            p999_ns: q(0.999),
            mean_ns: self.hist.mean() / 1e3,
            allocs: self.allocs,
            outcomes: sims
                .get(self.sim)
                .map(|s| s.outcomes(self.kind).since(self.outcomes_before))
                .unwrap_or_default(),
        }
    }
}

/// Warms up, calibrates and measures the rows of `plan` (each a kind run on `sims[index]`),
/// interleaved (module docs). A plan entry naming no sim is skipped.
pub(crate) fn rows(
    sims: &mut [Sim<'_>],
    plan: &[(usize, Kind)],
    budget: &Budget,
    timer: TimerCost,
) -> Result<Vec<RowFigures>, PickError> {
    let mut rows = Vec::with_capacity(plan.len());
    for &(index, kind) in plan {
        let Some(sim) = sims.get_mut(index) else {
            continue;
        };
        for i in 0..budget.warmup {
            black_box(sim.op(kind)?);
            if i % 16 == 15 {
                sim.advance(16);
            }
        }
        // Calibration: the rough cost of one operation (the least of a few short runs, so a
        // preemption does not inflate it) sets the batch size.
        let calib = (budget.iterations / 8).clamp(16, 256);
        let mut per_op_ns = f64::INFINITY;
        for _ in 0..4 {
            let t = Instant::now();
            for _ in 0..calib {
                black_box(sim.op(kind)?);
            }
            per_op_ns = per_op_ns.min(t.elapsed().as_nanos() as f64 / calib as f64);
            sim.advance(calib);
        }
        let want = (TIMER_SHARE * timer.median_ns / per_op_ns.max(0.1)).ceil();
        let batch = if want.is_finite() && want > 1.0 {
            (want as u64).min(MAX_BATCH)
        } else {
            1
        };
        rows.push(Row {
            sim: index,
            kind,
            outcomes_before: sim.outcomes(kind),
            batch,
            hist: histogram()?,
            ops: 0,
            allocs: 0,
            spent: Duration::ZERO,
        });
    }
    while rows.iter().any(|r| !r.done(budget)) {
        for row in rows.iter_mut().filter(|r| !r.done(budget)) {
            row.slice(sims, budget)?;
        }
    }
    Ok(rows.iter().map(|r| r.figures(sims)).collect())
}
