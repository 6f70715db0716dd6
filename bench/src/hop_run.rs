//! What the reports of `fleet-hop` and `sim-hop` share about their measured
//! wrk runs: the fields of a run's sample ([`hop_sample!`]), its identity
//! (path and round), its errors, CPU per request, the pairing of direct and
//! router runs by round, the table cells and lines both reports print the
//! same way, and where the router and the load run ([`Placement`]).
//!
//! Invariants: pure functions over the runs; a round counts only when both
//! its runs are there; a missing or zero denominator gives NaN, never a
//! made-up number.

use std::io::Write;

use crate::child::available_cpus;
use crate::cpu::CpuTime;
use crate::numbers::{per, signed_us};
use crate::shim_load::Path;
use crate::wrk::WrkReport;

/// Where each process of a hop benchmark runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placement {
    /// The router's CPU.
    pub(crate) router: usize,
    /// The CPU of the load side: the fleet (or the bench's sim) and wrk.
    pub(crate) load: usize,
}

impl Placement {
    /// The router on `router_cpu` (at most the last CPU), the load on CPU 1;
    /// with fewer than 2 CPUs, all on CPU 0, with a warning naming
    /// `load_side` (`fleet`, `sim`).
    pub(crate) fn choose(router_cpu: usize, load_side: &str) -> Placement {
        let cpus = available_cpus();
        if cpus >= 2 {
            Placement {
                router: router_cpu.min(cpus - 1),
                load: 1,
            }
        } else {
            eprintln!("warning: fewer than 2 CPUs: router, {load_side} and wrk all share CPU 0");
            Placement { router: 0, load: 0 }
        }
    }
}

/// One measured wrk run of either benchmark.
pub(crate) trait HopRun {
    /// Direct or through the router.
    fn path(&self) -> Path;
    /// 1-based round.
    fn round(&self) -> u32;
    /// wrk's report.
    fn wrk(&self) -> &WrkReport;
    /// The router's CPU during the run.
    fn router_cpu(&self) -> CpuTime;
    /// Whether the router was running (and so sampled) during the run.
    fn router_ran(&self) -> bool;

    /// `direct#1`, `router#2`, ...
    fn label(&self) -> String {
        format!("{}#{}", self.path().as_str(), self.round())
    }

    /// Non-2xx responses plus socket errors.
    fn errors(&self) -> u64 {
        self.wrk().non_2xx + self.wrk().socket_errors
    }

    /// Microseconds of `cpu` per request of this run.
    fn per_req(&self, cpu: CpuTime) -> f64 {
        per(cpu.total() * 1e6, self.wrk().requests as f64)
    }
}

/// Declares a benchmark's `Sample` struct: one measured wrk run and the CPU
/// used around it. The fields both benchmarks have (path, round, wrk's
/// report, wall time, the router's CPU and whether it ran, wrk's CPU and
/// the rest of the machine's) are written here; the fields given are the
/// benchmark's own, between the router's CPU and wrk's. The struct
/// implements [`HopRun`].
macro_rules! hop_sample {
    ($($(#[$doc:meta])* $field:ident: $ty:ty,)*) => {
        /// One measured wrk run and the CPU used around it.
        #[derive(Debug, Clone)]
        pub(crate) struct Sample {
            /// Direct or through the router.
            pub(crate) path: $crate::shim_load::Path,
            /// 1-based round.
            pub(crate) round: u32,
            /// wrk's report.
            pub(crate) wrk: $crate::wrk::WrkReport,
            /// Wall time of the run, seconds.
            pub(crate) elapsed: f64,
            /// The router process (idle in direct runs: discovery, kv_metrics ingest).
            pub(crate) router_cpu: $crate::cpu::CpuTime,
            /// Whether the router was running (and so sampled) during the run.
            pub(crate) router_ran: bool,
            $($(#[$doc])* pub(crate) $field: $ty,)*
            /// wrk.
            pub(crate) wrk_cpu: $crate::cpu::CpuTime,
            /// Busy CPU of everything else on the machine.
            pub(crate) other_cpu: f64,
        }

        impl $crate::hop_run::HopRun for Sample {
            fn path(&self) -> $crate::shim_load::Path {
                self.path
            }
            fn round(&self) -> u32 {
                self.round
            }
            fn wrk(&self) -> &$crate::wrk::WrkReport {
                &self.wrk
            }
            fn router_cpu(&self) -> $crate::cpu::CpuTime {
                self.router_cpu
            }
            fn router_ran(&self) -> bool {
                self.router_ran
            }
        }
    };
}
pub(crate) use hop_sample;

/// The runs of one comparison, split by path and paired by round.
#[derive(Debug)]
pub(crate) struct Paired<'a, S> {
    /// The direct runs, in the order given.
    pub(crate) direct: Vec<&'a S>,
    /// The router runs, in the order given.
    pub(crate) router: Vec<&'a S>,
    /// (direct, router) of each round with both runs.
    pairs: Vec<(&'a S, &'a S)>,
}

impl<S: HopRun> Paired<'_, S> {
    /// Router − direct of `f` for each paired round.
    pub(crate) fn deltas(&self, f: fn(&WrkReport) -> f64) -> Vec<f64> {
        self.pairs
            .iter()
            .map(|(d, r)| f(r.wrk()) - f(d.wrk()))
            .collect()
    }
}

/// Splits `runs` (in any order) by path and pairs rounds by number; `None`
/// unless some round has both runs.
pub(crate) fn pair<S: HopRun>(runs: &[S]) -> Option<Paired<'_, S>> {
    let of = |p: Path| -> Vec<&S> { runs.iter().filter(|s| s.path() == p).collect() };
    let (direct, router) = (of(Path::Direct), of(Path::Router));
    let pairs: Vec<(&S, &S)> = direct
        .iter()
        .filter_map(|d| Some((*d, *router.iter().find(|r| r.round() == d.round())?)))
        .collect();
    if pairs.is_empty() {
        return None;
    }
    Some(Paired {
        direct,
        router,
        pairs,
    })
}

/// `text`, in parentheses for a direct run (where the router serves nothing).
pub(crate) fn bracket_direct(path: Path, text: String) -> String {
    match path {
        Path::Direct => format!("({text})"),
        Path::Router => text,
    }
}

/// The router's `cpu-s` and `us/req` cells of a row: `-` when it did not
/// run, in parentheses in a direct run.
pub(crate) fn router_cells<S: HopRun>(s: &S) -> (String, String) {
    if !s.router_ran() {
        return ("-".to_owned(), "-".to_owned());
    }
    (
        format!("{:.2}", s.router_cpu().total()),
        bracket_direct(s.path(), format!("{:.1}", s.per_req(s.router_cpu()))),
    )
}

/// The line that replaces the comparison when the router is missing.
pub(crate) fn not_measured(out: &mut impl Write, why: &str) -> std::io::Result<()> {
    writeln!(out, "router        (not measured: {why})")
}

/// With several rounds, prints the per-round p50 deltas; returns what the
/// added-latency line says about rounds (` (median of N rounds)` or nothing).
pub(crate) fn per_round(out: &mut impl Write, p50_deltas_us: &[f64]) -> std::io::Result<String> {
    let rounds = p50_deltas_us.len();
    if rounds <= 1 {
        return Ok(String::new());
    }
    let each: Vec<String> = p50_deltas_us.iter().map(|&d| signed_us(d)).collect();
    writeln!(out, "p50 router - direct, per round: {}", each.join(" "))?;
    Ok(format!(" (median of {rounds} rounds)"))
}

/// Prints a warning for every run with errors.
pub(crate) fn warnings<S: HopRun>(out: &mut impl Write, runs: &[S]) -> std::io::Result<()> {
    for s in runs.iter().filter(|s| s.errors() > 0) {
        writeln!(
            out,
            "warning: {}: {} non-2xx responses, {} socket errors; its figures include failures",
            s.label(),
            s.wrk().non_2xx,
            s.wrk().socket_errors
        )?;
    }
    Ok(())
}
