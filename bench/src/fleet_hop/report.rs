//! Rendering of `fleet-hop` measurements: per concurrency, one row per
//! measured run (direct, router), then the router's added latency, its CPU
//! per request as a share of the frontend's, and the goals.
//!
//! Invariants: pure formatting over [`Sample`]s; a missing router prints
//! the reason instead of comparisons, never made-up numbers; with several
//! rounds, latency deltas are the median of per-round deltas (each round
//! pairs a direct run with the router run next to it) and CPU figures are
//! totals over all rounds divided by total requests; the CPU goal divides
//! by the frontend's CPU per request in the direct runs.

use std::io::Write;

use crate::cpu::CpuTime;
use crate::hop_run::{self, HopRun, hop_sample};
use crate::numbers::{latency, median, per, signed_us};

/// Goal of the issue: added p50 latency, microseconds.
pub(crate) const GOAL_ADDED_P50_US: f64 = 100.0;
/// Goal of the issue: router CPU per request as a share of the frontend's, percent.
pub(crate) const GOAL_CPU_SHARE_PCT: f64 = 5.0;

hop_sample! {
    /// The frontend process.
    frontend_cpu: CpuTime,
    /// All mocker workers.
    workers_cpu: CpuTime,
}

/// Microseconds of `cpu` per request over `samples`.
fn us_per_req(samples: &[&Sample], cpu: impl Fn(&Sample) -> CpuTime) -> f64 {
    let requests: u64 = samples.iter().map(|s| s.wrk.requests).sum();
    let secs: f64 = samples.iter().map(|s| cpu(s).total()).sum();
    per(secs * 1e6, requests as f64)
}

/// The comparison of one concurrency level.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Summary {
    /// Router p50 − direct p50 of each round with both runs, microseconds.
    pub(crate) p50_deltas_us: Vec<f64>,
    /// Median of [`p50_deltas_us`](Self::p50_deltas_us).
    pub(crate) added_p50_us: f64,
    /// Median over rounds of router p99 − direct p99, microseconds.
    pub(crate) added_p99_us: f64,
    /// Router CPU per request in the router runs, microseconds.
    pub(crate) router_us: f64,
    /// Share of that CPU spent in the kernel, percent.
    pub(crate) router_sys_pct: f64,
    /// Router CPU per direct request while it only watched the fleet, microseconds.
    pub(crate) router_idle_us: f64,
    /// Frontend CPU per request in the direct runs, microseconds: the
    /// denominator of the goal.
    pub(crate) frontend_us: f64,
    /// Frontend CPU per request in the router runs, microseconds.
    pub(crate) frontend_routed_us: f64,
}

impl Summary {
    /// Router CPU per request as a share of the frontend's (direct runs), percent.
    pub(crate) fn cpu_share_pct(&self) -> f64 {
        100.0 * self.router_us / self.frontend_us
    }
}

/// Compares the runs of one concurrency level (in any order); rounds are
/// paired by number. `None` unless some round has both runs.
pub(crate) fn summarize(runs: &[Sample]) -> Option<Summary> {
    let paired = hop_run::pair(runs)?;
    let (direct, router) = (&paired.direct, &paired.router);
    let p50_deltas_us = paired.deltas(|w| w.p50_us);
    let sys: f64 = router.iter().map(|s| s.router_cpu.system).sum();
    let all: f64 = router.iter().map(|s| s.router_cpu.total()).sum();
    Some(Summary {
        added_p50_us: median(p50_deltas_us.clone()),
        p50_deltas_us,
        added_p99_us: median(paired.deltas(|w| w.p99_us)),
        router_us: us_per_req(router, |s| s.router_cpu),
        router_sys_pct: 100.0 * sys / all,
        router_idle_us: us_per_req(direct, |s| s.router_cpu),
        frontend_us: us_per_req(direct, |s| s.frontend_cpu),
        frontend_routed_us: us_per_req(router, |s| s.frontend_cpu),
    })
}

const COLUMNS: &str = "run           req/s        p50        p99  fe cpu-s  fe util  fe us/req  \
                       rtr cpu-s  rtr us/req  wkr cpu-s  wrk cpu-s  other cpu-s  errors";

/// Prints one concurrency level: its rows (`runs`, in the order they ran),
/// the comparison and the goals; `router_missing` replaces the comparison.
pub(crate) fn block(
    out: &mut impl Write,
    connections: u32,
    runs: &[Sample],
    router_missing: Option<&str>,
) -> std::io::Result<()> {
    writeln!(out, "\n== -c {connections} ==")?;
    writeln!(out, "{COLUMNS}")?;
    for s in runs {
        row(out, s)?;
    }
    let summary = match router_missing {
        Some(why) => {
            hop_run::not_measured(out, why)?;
            None
        }
        None => summarize(runs),
    };
    if let Some(s) = summary {
        let over = hop_run::per_round(out, &s.p50_deltas_us)?;
        writeln!(
            out,
            "added latency (router - direct){over}: p50 {}, p99 {}",
            signed_us(s.added_p50_us),
            signed_us(s.added_p99_us),
        )?;
        writeln!(
            out,
            "router CPU per request: {:.1} us ({:.0}% in the kernel) = {:.1}% of the frontend's \
             {:.0} us/request in the direct runs ({:.0} us/request in the router runs); router \
             idle in the direct runs: {:.1} us/request",
            s.router_us,
            s.router_sys_pct,
            s.cpu_share_pct(),
            s.frontend_us,
            s.frontend_routed_us,
            s.router_idle_us,
        )?;
        let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
        writeln!(
            out,
            "goal: added p50 <= {GOAL_ADDED_P50_US:.0} us: {} ({})",
            verdict(s.added_p50_us <= GOAL_ADDED_P50_US),
            signed_us(s.added_p50_us),
        )?;
        writeln!(
            out,
            "goal: router CPU/request <= {GOAL_CPU_SHARE_PCT:.0}% of the frontend's: {} ({:.1}%)",
            verdict(s.cpu_share_pct() <= GOAL_CPU_SHARE_PCT),
            s.cpu_share_pct(),
        )?;
    }
    hop_run::warnings(out, runs)
}

fn row(out: &mut impl Write, s: &Sample) -> std::io::Result<()> {
    let (rtr_cpu, rtr_us) = hop_run::router_cells(s);
    writeln!(
        out,
        "{:<9} {:>9.0} {:>10} {:>10} {:>9.2} {:>7.0}% {:>10.0} {:>10} {:>11} {:>10.2} {:>10.2} {:>12.2} {:>7}",
        s.label(),
        s.wrk.rps,
        latency(s.wrk.p50_us),
        latency(s.wrk.p99_us),
        s.frontend_cpu.total(),
        100.0 * s.frontend_cpu.total() / s.elapsed,
        s.per_req(s.frontend_cpu),
        rtr_cpu,
        rtr_us,
        s.workers_cpu.total(),
        s.wrk_cpu.total(),
        s.other_cpu,
        s.errors(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shim_load::Path;
    use crate::wrk::WrkReport;

    fn sample(path: Path, round: u32, p50: f64, p99: f64, router: f64, fe: f64) -> Sample {
        Sample {
            path,
            round,
            wrk: WrkReport {
                requests: 10_000,
                rps: 1000.0,
                p50_us: p50,
                p99_us: p99,
                non_2xx: 0,
                socket_errors: 0,
            },
            elapsed: 10.0,
            router_cpu: CpuTime {
                user: router,
                system: 0.0,
            },
            router_ran: true,
            frontend_cpu: CpuTime {
                user: fe,
                system: 0.0,
            },
            workers_cpu: CpuTime::default(),
            wrk_cpu: CpuTime::default(),
            other_cpu: 0.0,
        }
    }

    #[test]
    fn goals_met_and_missed() {
        // 10,000 requests: 0.3 s of router = 30 us/req; 8 s of frontend = 800 us/req.
        let runs = [
            sample(Path::Direct, 1, 1500.0, 4000.0, 0.05, 8.0),
            sample(Path::Router, 1, 1580.0, 4300.0, 0.3, 9.0),
        ];
        let mut buf = Vec::new();
        block(&mut buf, 1, &runs, None).unwrap();
        let s = String::from_utf8(buf).unwrap();
        assert!(s.contains("p50 +80us, p99 +300us"), "{s}");
        assert!(
            s.contains(
                "30.0 us (0% in the kernel) = 3.8% of the frontend's 800 us/request in the \
                 direct runs (900 us/request in the router runs)"
            ),
            "{s}"
        );
        assert!(s.contains("idle in the direct runs: 5.0 us/request"), "{s}");
        assert!(s.contains("goal: added p50 <= 100 us: met (+80us)"), "{s}");
        assert!(s.contains("<= 5% of the frontend's: met (3.8%)"), "{s}");
        assert!(s.contains("direct#1") && s.contains("(5.0)") && s.contains("1.500ms"));
        assert!(!s.contains("per round"), "{s}");

        let runs = [
            sample(Path::Direct, 1, 1500.0, 4000.0, 0.05, 8.0),
            sample(Path::Router, 1, 1700.0, 3900.0, 0.92, 8.0),
        ];
        let mut buf = Vec::new();
        block(&mut buf, 8, &runs, None).unwrap();
        let s = String::from_utf8(buf).unwrap();
        assert!(s.contains("== -c 8 =="), "{s}");
        assert!(s.contains("p50 +200us, p99 -100us"), "{s}");
        assert!(
            s.contains("goal: added p50 <= 100 us: NOT met (+200us)"),
            "{s}"
        );
        assert!(s.contains("NOT met (11.5%)"), "{s}");
    }

    #[test]
    fn rounds_pair_by_number_take_the_median_delta_and_pool_cpu() {
        // Run order A B B A A B: round 2 ran router first.
        let runs = [
            sample(Path::Direct, 1, 1000.0, 2000.0, 0.0, 8.0),
            sample(Path::Router, 1, 1050.0, 2100.0, 0.2, 8.0),
            sample(Path::Router, 2, 1900.0, 2100.0, 0.4, 8.0),
            sample(Path::Direct, 2, 2000.0, 2000.0, 0.0, 8.0),
            sample(Path::Direct, 3, 1000.0, 2000.0, 0.0, 8.0),
            sample(Path::Router, 3, 1070.0, 2100.0, 0.3, 8.0),
        ];
        let s = summarize(&runs).unwrap();
        assert_eq!(s.p50_deltas_us, vec![50.0, -100.0, 70.0]);
        assert!((s.added_p50_us - 50.0).abs() < 1e-9, "{s:?}");
        assert!((s.router_us - 30.0).abs() < 1e-9, "{s:?}");
        assert!((s.cpu_share_pct() - 3.75).abs() < 1e-9, "{s:?}");
        let mut buf = Vec::new();
        block(&mut buf, 1, &runs, None).unwrap();
        let text = String::from_utf8(buf).unwrap();
        let at = |l: &str| text.find(l).unwrap();
        assert!(at("router#2") < at("direct#2") && at("direct#2") < at("direct#3"));
        assert!(text.contains("per round: +50us -100us +70us"), "{text}");
        assert!(text.contains("(median of 3 rounds): p50 +50us"), "{text}");
    }

    #[test]
    fn missing_router_prints_the_reason() {
        let mut runs = [sample(Path::Direct, 1, 1500.0, 4000.0, 0.0, 8.0)];
        runs[0].router_ran = false;
        let mut buf = Vec::new();
        block(&mut buf, 1, &runs, Some("no binary")).unwrap();
        let s = String::from_utf8(buf).unwrap();
        assert!(s.contains("          -           -"), "{s}");
        assert!(
            s.contains("not measured: no binary") && !s.contains("goal:"),
            "{s}"
        );
        assert!(summarize(&runs).is_none());
    }
}
