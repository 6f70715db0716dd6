//! Rendering of `sim-hop` measurements: per fleet size and concurrency, one
//! row per measured run (direct, router), the router's added latency, its
//! CPU per request (total, idle, marginal), how the picker spread requests
//! over the workers, and at the end how each figure scales with the fleet,
//! as a ratio to the smallest fleet of the same run.
//!
//! Invariants: pure formatting over [`Block`]s; a missing router prints the
//! reason instead of comparisons, never made-up numbers; latency deltas are
//! the median of per-round deltas (each round pairs a direct run with the
//! router run next to it); CPU figures are totals over all rounds divided by
//! total requests (or wall time, for rates); the router's idle cost comes
//! from a window without load, not from the direct runs (whose requests make
//! the workers publish load samples the router ingests).

use std::io::Write;

use crate::cpu::CpuTime;
use crate::hop_run::{self, HopRun, hop_sample};
use crate::numbers::{Spread, latency, median, per, signed_us};
use crate::router_probe;

hop_sample! {
    /// The bench process: the simulated fleet's threads (and the idle driver).
    sim_cpu: CpuTime,
}

/// CPU over a window without any load, after the router was ready.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Quiet {
    /// Wall time, seconds.
    pub(crate) secs: f64,
    /// The router: file-store discovery and periodic kv_metrics ingest.
    pub(crate) router: CpuTime,
    /// The sim: keep-alive of its files and periodic kv_metrics.
    pub(crate) sim: CpuTime,
}

impl Quiet {
    /// Router CPU-s per wall second.
    pub(crate) fn router_rate(&self) -> f64 {
        per(self.router.total(), self.secs)
    }
}

/// One fleet size at one concurrency: its runs and what the picker did.
#[derive(Debug, Clone, Default)]
pub(crate) struct Block {
    /// Workers in the fleet.
    pub(crate) workers: usize,
    /// The router's CPU without load (the same for every block of a fleet).
    pub(crate) quiet: Quiet,
    /// wrk connections.
    pub(crate) connections: u32,
    /// Measured runs, in the order they ran.
    pub(crate) runs: Vec<Sample>,
    /// Requests the sim served on each worker during the measured router runs.
    pub(crate) router_picks: Vec<u64>,
    /// The same during the measured direct runs.
    pub(crate) direct_picks: Vec<u64>,
    /// The router's decode selections by reason during the measured router runs.
    pub(crate) selections: Vec<(String, u64)>,
    /// Why the router figures are missing, if they are.
    pub(crate) router_missing: Option<String>,
}

/// The comparison of one [`Block`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Summary {
    /// Requests per second over all direct runs.
    pub(crate) direct_rps: f64,
    /// Requests per second over all router runs.
    pub(crate) router_rps: f64,
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
    /// Router CPU-s per wall second without load (its idle cost).
    pub(crate) idle_rate: f64,
    /// Router CPU-s per wall second during the direct runs: idle cost plus
    /// ingesting the load samples the direct requests made the workers send.
    pub(crate) watch_rate: f64,
    /// Router CPU per request in the router runs minus the idle rate over
    /// their wall time, microseconds: what routing itself costs.
    pub(crate) marginal_us: f64,
    /// Sim CPU per request, direct runs, microseconds.
    pub(crate) sim_direct_us: f64,
    /// Sim CPU per request, router runs, microseconds.
    pub(crate) sim_router_us: f64,
    /// Spread of the router runs' requests over the workers.
    pub(crate) router_spread: Option<Spread>,
    /// Spread of the direct runs' requests (the bench's rotation).
    pub(crate) direct_spread: Option<Spread>,
    /// Share of decode picks made by load, percent.
    pub(crate) by_load_pct: f64,
}

/// Compares the runs of one block; rounds are paired by number. `None`
/// unless some round has both runs and the router was not lost.
pub(crate) fn summarize(b: &Block) -> Option<Summary> {
    if b.router_missing.is_some() {
        return None;
    }
    let paired = hop_run::pair(&b.runs)?;
    let (direct, router) = (&paired.direct, &paired.router);
    let sum = |v: &[&Sample], f: &dyn Fn(&Sample) -> f64| -> f64 { v.iter().map(|s| f(s)).sum() };
    let (d_req, r_req) = (
        sum(direct, &|s| s.wrk.requests as f64),
        sum(router, &|s| s.wrk.requests as f64),
    );
    let (d_wall, r_wall) = (sum(direct, &|s| s.elapsed), sum(router, &|s| s.elapsed));
    let r_cpu = sum(router, &|s| s.router_cpu.total());
    let idle_rate = b.quiet.router_rate();
    let p50_deltas_us = paired.deltas(|w| w.p50_us);
    let total: u64 = b.selections.iter().map(|(_, n)| n).sum();
    let load: u64 = b
        .selections
        .iter()
        .filter(|(r, _)| r == "load")
        .map(|(_, n)| n)
        .sum();
    Some(Summary {
        direct_rps: per(d_req, d_wall),
        router_rps: per(r_req, r_wall),
        added_p50_us: median(p50_deltas_us.clone()),
        p50_deltas_us,
        added_p99_us: median(paired.deltas(|w| w.p99_us)),
        router_us: per(r_cpu * 1e6, r_req),
        router_sys_pct: per(100.0 * sum(router, &|s| s.router_cpu.system), r_cpu),
        idle_rate,
        watch_rate: per(sum(direct, &|s| s.router_cpu.total()), d_wall),
        marginal_us: per((r_cpu - idle_rate * r_wall) * 1e6, r_req),
        sim_direct_us: per(sum(direct, &|s| s.sim_cpu.total()) * 1e6, d_req),
        sim_router_us: per(sum(router, &|s| s.sim_cpu.total()) * 1e6, r_req),
        router_spread: Spread::of(&b.router_picks),
        direct_spread: Spread::of(&b.direct_picks),
        by_load_pct: per(100.0 * load as f64, total as f64),
    })
}

const COLUMNS: &str = "run           req/s        p50        p99  rtr cpu-s  rtr us/req  rtr usr/sys  \
                       sim cpu-s  sim us/req  wrk cpu-s  other cpu-s  errors";

/// Prints one block: its rows (in the order they ran), the comparison and
/// the picker's spread.
pub(crate) fn block(out: &mut impl Write, b: &Block) -> std::io::Result<()> {
    writeln!(out, "\n== {} workers, -c {} ==", b.workers, b.connections)?;
    writeln!(out, "{COLUMNS}")?;
    for s in &b.runs {
        row(out, s)?;
    }
    if let Some(why) = &b.router_missing {
        hop_run::not_measured(out, why)?;
    }
    if let Some(s) = summarize(b) {
        let over = hop_run::per_round(out, &s.p50_deltas_us)?;
        writeln!(
            out,
            "added latency (router - direct){over}: p50 {}, p99 {}; throughput router/direct {:.2}x",
            signed_us(s.added_p50_us),
            signed_us(s.added_p99_us),
            s.router_rps / s.direct_rps,
        )?;
        writeln!(
            out,
            "router CPU per request: {:.1} us ({:.0}% in the kernel); marginal (minus its idle \
             {:.3} cpu-s/s): {:.1} us/request; during the direct runs it used {:.3} cpu-s/s",
            s.router_us, s.router_sys_pct, s.idle_rate, s.marginal_us, s.watch_rate,
        )?;
        writeln!(
            out,
            "sim CPU per request: direct {:.1} us, router {:.1} us",
            s.sim_direct_us, s.sim_router_us,
        )?;
        writeln!(
            out,
            "router decode picks (measured router runs): {} ({:.1}% by load)",
            router_probe::selections_text(&b.selections),
            s.by_load_pct,
        )?;
        writeln!(
            out,
            "requests per worker (sim): router runs {}; direct runs (bench's rotation) {}",
            spread(s.router_spread),
            spread(s.direct_spread),
        )?;
    }
    hop_run::warnings(out, &b.runs)
}

/// A spread, with the CV a uniformly random choice would give for the same
/// mean (Poisson: 1/sqrt(mean)), to tell balancing from chance.
fn spread(s: Option<Spread>) -> String {
    match s {
        Some(s) => format!(
            "min {} max {} (max/min {:.2}, CV {:.1}%; random would give ~{:.1}%; {} workers)",
            s.min,
            s.max,
            s.max_over_min(),
            s.cv_pct,
            100.0 / (s.total as f64 / s.workers as f64).sqrt(),
            s.workers
        ),
        None => "-".to_owned(),
    }
}

fn row(out: &mut impl Write, s: &Sample) -> std::io::Result<()> {
    let usr = per(100.0 * s.router_cpu.user, s.router_cpu.total());
    let (rtr_cpu, rtr_us) = hop_run::router_cells(s);
    let rtr_split = if s.router_ran {
        hop_run::bracket_direct(s.path, format!("{:.0}/{:.0}", usr, 100.0 - usr))
    } else {
        "-".to_owned()
    };
    writeln!(
        out,
        "{:<9} {:>9.0} {:>10} {:>10} {:>10} {:>11} {:>12} {:>10.2} {:>11.1} {:>10.2} {:>12.2} {:>7}",
        s.label(),
        s.wrk.rps,
        latency(s.wrk.p50_us),
        latency(s.wrk.p99_us),
        rtr_cpu,
        rtr_us,
        rtr_split,
        s.sim_cpu.total(),
        s.per_req(s.sim_cpu),
        s.wrk_cpu.total(),
        s.other_cpu,
        s.errors(),
    )
}

/// Prints, for connection count `connections`, how each figure scales from
/// the first block (the smallest fleet) to the others.
pub(crate) fn scaling(
    out: &mut impl Write,
    connections: u32,
    blocks: &[&Block],
) -> std::io::Result<()> {
    let Some(first) = blocks.first() else {
        return Ok(());
    };
    let base = summarize(first);
    writeln!(
        out,
        "\n== scaling with the fleet, -c {connections} (xN: ratio to the {}-worker figure) ==",
        first.workers
    )?;
    writeln!(
        out,
        "workers  direct req/s  router req/s  added p50  added p99  rtr us/req      x  \
         marginal us/req      x  idle cpu-s/s      x  picks CV  max/min  by load"
    )?;
    for b in blocks {
        let Some(s) = summarize(b) else {
            let why = b.router_missing.as_deref().unwrap_or("no complete round");
            writeln!(out, "{:>7}  (router not measured: {why})", b.workers)?;
            continue;
        };
        // A baseline of 0 (under one 10 ms tick) or NaN has no meaningful ratio.
        let ratio = |f: fn(&Summary) -> f64| match &base {
            Some(bs) if f(bs) > 0.0 && f(bs).is_finite() && f(&s).is_finite() => {
                format!("{:.2}", f(&s) / f(bs))
            }
            _ => "-".to_owned(),
        };
        let (cv, mm) = s.router_spread.map_or(("-".into(), "-".into()), |p| {
            (
                format!("{:.1}%", p.cv_pct),
                format!("{:.2}", p.max_over_min()),
            )
        });
        writeln!(
            out,
            "{:>7} {:>13.0} {:>13.0} {:>10} {:>10} {:>11.1} {:>6} {:>16.1} {:>6} {:>13.3} {:>6} {:>9} {:>8} {:>7.1}%",
            b.workers,
            s.direct_rps,
            s.router_rps,
            signed_us(s.added_p50_us),
            signed_us(s.added_p99_us),
            s.router_us,
            ratio(|s| s.router_us),
            s.marginal_us,
            ratio(|s| s.marginal_us),
            s.idle_rate,
            ratio(|s| s.idle_rate),
            cv,
            mm,
            s.by_load_pct,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shim_load::Path;
    use crate::wrk::WrkReport;

    fn sample(path: Path, round: u32, p50: f64, router: f64, sim: f64) -> Sample {
        Sample {
            path,
            round,
            wrk: WrkReport {
                requests: 10_000,
                rps: 1000.0,
                p50_us: p50,
                p99_us: 2.0 * p50,
                non_2xx: 0,
                socket_errors: 0,
            },
            elapsed: 10.0,
            router_cpu: CpuTime {
                user: router / 2.0,
                system: router / 2.0,
            },
            router_ran: true,
            sim_cpu: CpuTime {
                user: sim,
                system: 0.0,
            },
            wrk_cpu: CpuTime::default(),
            other_cpu: 0.0,
        }
    }

    fn block_of(workers: usize, router_cpu: f64, idle: f64) -> Block {
        Block {
            workers,
            quiet: Quiet {
                secs: 10.0,
                router: CpuTime {
                    user: idle,
                    system: 0.0,
                },
                sim: CpuTime::default(),
            },
            connections: 8,
            runs: vec![
                sample(Path::Direct, 1, 100.0, 2.0 * idle, 0.3),
                sample(Path::Router, 1, 140.0, router_cpu, 0.3),
                sample(Path::Router, 2, 150.0, router_cpu, 0.3),
                sample(Path::Direct, 2, 100.0, 2.0 * idle, 0.3),
            ],
            router_picks: vec![1000; workers],
            direct_picks: vec![1000; workers],
            selections: vec![("load".into(), 19_000), ("round_robin_stale".into(), 1000)],
            router_missing: None,
        }
    }

    #[test]
    fn summary_pairs_rounds_and_splits_idle_from_marginal() {
        // 0.3 s per 10,000 requests = 30 us/req; idle 0.1 s per 10 s = 0.01 cpu-s/s.
        let s = summarize(&block_of(10, 0.3, 0.1)).unwrap();
        assert_eq!(s.p50_deltas_us, vec![40.0, 50.0]);
        assert!((s.added_p50_us - 45.0).abs() < 1e-9, "{s:?}");
        assert!((s.router_us - 30.0).abs() < 1e-9, "{s:?}");
        assert!((s.router_sys_pct - 50.0).abs() < 1e-9, "{s:?}");
        assert!((s.idle_rate - 0.01).abs() < 1e-12, "{s:?}");
        assert!((s.watch_rate - 0.02).abs() < 1e-12, "{s:?}");
        assert!((s.marginal_us - 20.0).abs() < 1e-9, "{s:?}");
        assert!((s.sim_direct_us - 30.0).abs() < 1e-9, "{s:?}");
        assert!((s.by_load_pct - 95.0).abs() < 1e-9, "{s:?}");
        assert!((s.direct_rps - 1000.0).abs() < 1e-9);
        assert_eq!(s.router_spread.map(|p| p.max_over_min()), Some(1.0));
    }

    #[test]
    fn block_and_scaling_render() {
        let small = block_of(10, 0.3, 0.1);
        let mut big = block_of(1000, 0.6, 0.5);
        big.router_picks = (0..1000).map(|i| 15 + (i % 11)).collect();
        let mut buf = Vec::new();
        block(&mut buf, &big).unwrap();
        let t = String::from_utf8(buf).unwrap();
        assert!(t.contains("== 1000 workers, -c 8 =="), "{t}");
        assert!(t.contains("per round: +40us +50us"), "{t}");
        assert!(
            t.contains(
                "(median of 2 rounds): p50 +45us, p99 +90us; throughput router/direct 1.00x"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "60.0 us (50% in the kernel); marginal (minus its idle 0.050 cpu-s/s): \
                 10.0 us/request; during the direct runs it used 0.100 cpu-s/s"
            ),
            "{t}"
        );
        assert!(
            t.contains("load=19000, round_robin_stale=1000 (95.0% by load)"),
            "{t}"
        );
        assert!(t.contains("router runs min 15 max 25 (max/min 1.67"), "{t}");
        // Mean 20 requests per worker: random choice would give 1/sqrt(20) = 22.4%.
        assert!(t.contains("random would give ~22.4%; 1000 workers)"), "{t}");
        assert!(t.contains("(100.0)") && t.contains("(50/50)"), "{t}");
        let at = |l: &str| t.find(l).unwrap();
        assert!(at("router#2") < at("direct#2"));

        let mut buf = Vec::new();
        scaling(&mut buf, 8, &[&small, &big]).unwrap();
        let t = String::from_utf8(buf).unwrap();
        assert!(t.contains("ratio to the 10-worker figure"), "{t}");
        let last = t.lines().last().unwrap();
        // router us/req 60 = 2.00x; marginal 10 vs 20 = 0.50x; idle 0.05 vs 0.01 = 5.00x.
        assert!(last.trim_start().starts_with("1000"), "{t}");
        assert!(
            last.contains(" 60.0   2.00 ") && last.contains(" 10.0   0.50 "),
            "{t}"
        );
        assert!(last.contains("0.050   5.00"), "{t}");
    }

    #[test]
    fn missing_router_prints_the_reason() {
        let mut b = block_of(1000, 0.3, 0.0);
        b.runs.retain(|s| s.path == Path::Direct);
        for s in &mut b.runs {
            s.router_ran = false;
        }
        b.router_missing = Some("router not ready after 60 s: 990 of 1000 connected".into());
        let mut buf = Vec::new();
        block(&mut buf, &b).unwrap();
        let t = String::from_utf8(buf).unwrap();
        assert!(t.contains("not measured: router not ready"), "{t}");
        assert!(!t.contains("added latency"), "{t}");
        assert!(summarize(&b).is_none());
        let mut buf = Vec::new();
        scaling(&mut buf, 8, &[&block_of(10, 0.3, 0.1), &b]).unwrap();
        let t = String::from_utf8(buf).unwrap();
        assert!(
            t.contains("   1000  (router not measured: router not ready"),
            "{t}"
        );
        // An idle baseline under one tick gives no ratio.
        let mut buf = Vec::new();
        scaling(
            &mut buf,
            8,
            &[&block_of(10, 0.3, 0.0), &block_of(100, 0.3, 0.1)],
        )
        .unwrap();
        let t = String::from_utf8(buf).unwrap();
        let last = t.lines().last().unwrap();
        assert!(last.contains(" 0.010      - "), "{t}");
    }
}
