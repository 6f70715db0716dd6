//! `sim-hop`: the router's added latency and CPU in front of the simulated
//! Dynamo fleet (`continuum-sim`) at 10, 100 and 1,000 aggregated workers,
//! against the same requests sent straight to the sim's direct-mode shim
//! with the bench's pins. It is the issue's "the same simulator, scaled to
//! 1,000+ workers, is the load source for benchmarks".
//!
//! One run, per fleet size: the fleet starts inside the bench process
//! ([`fleet`]: `LatencyModel::ZERO`, small completions), the router starts
//! with file-store discovery of it and the sim shim as its shim backend, and
//! is awaited until it lists every worker, every kv_metrics subscription is
//! connected, every load sample is fresh and one request took the shim path
//! ([`router`]). Then, for each wrk concurrency and round, the same load runs
//! twice, each after its own unmeasured warm-up: (a) straight to the shim,
//! pins rotated over all N workers, (b) through the router, unpinned. Round 1
//! runs (a) first; later rounds alternate. The report ([`report`]) compares
//! latency and CPU per request, shows how the picker spread the requests,
//! and ends with how each figure scales from the smallest fleet.
//!
//! Invariants: the router runs alone on CPU 0 (unless `--router-cpu 1`);
//! the bench process (and so the sim's threads) and wrk share CPU 1,
//! identically in both runs; one fleet and one router at a time, the router
//! torn down before its fleet; only one load runs at a time; every wait is
//! bounded.

pub(crate) mod fleet;
mod report;
pub(crate) mod router;

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::child::{self, Supervised};
use crate::cpu::{self, CpuTime};
use crate::error::BenchError;
use crate::hop_run::Placement;
use crate::router_probe;
use crate::shim_load::{self, Path};
use crate::tempdir::TempDir;
use crate::wrk::WrkRun;
use fleet::{MODEL, Sim};
use report::{Block, Sample};

/// Options of `sim-hop`.
#[derive(Debug, Clone)]
pub(crate) struct SimHopOptions {
    /// Seconds of measured load per run.
    pub(crate) duration_secs: u64,
    /// Seconds of unmeasured load before each run.
    pub(crate) warmup_secs: u64,
    /// Fleet sizes, ascending; the first is the scaling baseline.
    pub(crate) workers: Vec<usize>,
    /// wrk connection counts, one comparison each.
    pub(crate) connections: Vec<u32>,
    /// Direct/router pairs per fleet size and connection count.
    pub(crate) rounds: u32,
    /// `max_tokens` of every request, and the sim's completion tokens.
    pub(crate) max_tokens: u32,
    /// Periodic kv_metrics interval of every simulated worker, ms; 0: only
    /// on load changes.
    pub(crate) publish_ms: u64,
    /// Router binary; `None` means next to the current executable.
    pub(crate) router_bin: Option<PathBuf>,
    /// wrk binary.
    pub(crate) wrk_bin: PathBuf,
    /// Seconds without load over which the router's idle CPU is measured, per fleet.
    pub(crate) idle_secs: u64,
    /// Seconds the router may take to be ready, per fleet.
    pub(crate) ready_timeout_secs: u64,
    /// CPU of the router (the sim and wrk are on CPU 1); 1 puts all on one CPU.
    pub(crate) router_cpu: usize,
    /// Soft RLIMIT_NOFILE of the router; `None`: inherited from the bench.
    pub(crate) router_nofile: Option<u64>,
    /// Nice value of the driver (and so of every process of the run); 0 leaves it.
    pub(crate) nice: i32,
}

impl Default for SimHopOptions {
    fn default() -> Self {
        Self {
            duration_secs: 10,
            warmup_secs: 2,
            workers: vec![10, 100, 1000],
            connections: vec![1, 8],
            rounds: 2,
            max_tokens: 4,
            publish_ms: 500,
            router_bin: None,
            wrk_bin: PathBuf::from("wrk"),
            idle_secs: 5,
            ready_timeout_secs: 60,
            router_cpu: 0,
            router_nofile: None,
            nice: 0,
        }
    }
}

/// Decode selections by reason, as `continuum_dynamo_selection_total` counts them.
type Selections = Vec<(String, u64)>;

/// What every fleet's run shares.
#[derive(Debug)]
struct Ctx<'a> {
    opts: &'a SimHopOptions,
    place: Placement,
    dir: &'a TempDir,
    router_bin: &'a std::path::Path,
}

/// Runs the benchmark and prints the report on stdout.
pub(crate) fn run(opts: &SimHopOptions) -> Result<(), BenchError> {
    let place = Placement::choose(opts.router_cpu, "sim");
    let router_bin = child::sibling_or(opts.router_bin.as_deref(), "continuum-router")?;
    if opts.nice != 0 {
        child::set_nice(opts.nice)?;
    }
    let max_workers = opts.workers.iter().copied().max().unwrap_or(0);
    let max_conns = opts.connections.iter().copied().max().unwrap_or(1);
    fleet::ensure_nofile(max_workers, fleet::bench_fds_needed(max_workers, max_conns))?;
    // Before any thread exists: the sim's threads inherit the mask.
    fleet::pin_self(place.load)?;
    let dir = TempDir::new()?;
    let ctx = Ctx {
        opts,
        place,
        dir: &dir,
        router_bin: &router_bin,
    };
    let mut out = std::io::stdout().lock();
    let w = BenchError::io("writing the report");
    header(&mut out, opts, place).map_err(w)?;
    if !router_bin.is_file() {
        eprintln!(
            "router: {} not found; run `cargo build --release -p continuum-router --features \
             continuum-router/dynamo`. Reporting the direct baseline only.",
            router_bin.display()
        );
    }
    let mut blocks = Vec::new();
    for &n in &opts.workers {
        blocks.extend(run_fleet(&ctx, n, &mut out)?);
    }
    for &c in &opts.connections {
        let of_c: Vec<&Block> = blocks.iter().filter(|b| b.connections == c).collect();
        report::scaling(&mut out, c, &of_c).map_err(BenchError::io("writing the report"))?;
    }
    Ok(())
}

/// One fleet size: start the fleet and the router, measure every
/// concurrency, print each block as it completes.
fn run_fleet(ctx: &Ctx<'_>, n: usize, out: &mut impl Write) -> Result<Vec<Block>, BenchError> {
    let opts = ctx.opts;
    let w = || BenchError::io("writing the report");
    writeln!(out, "\n=== fleet of {n} workers ===").map_err(w())?;
    eprintln!("sim-hop: starting a simulated fleet of {n} workers ...");
    let t0 = Instant::now();
    let publish = (opts.publish_ms > 0).then(|| Duration::from_millis(opts.publish_ms));
    let sim = Sim::start(fleet::spec(n, opts.max_tokens, publish))?;
    let started = t0.elapsed();
    let ready = Duration::from_secs(opts.ready_timeout_secs);
    let body = shim_load::chat_body(MODEL, opts.max_tokens);
    let pins = shim_load::decimal_pins(sim.ids().iter().copied());
    sim.check_direct(&pins, &body, Instant::now() + ready)?;
    writeln!(
        out,
        "sim: {n} workers up in {:.2} s; a request pinned to each answered 200 by {:.2} s",
        started.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    )
    .map_err(w())?;
    let direct_script = ctx.dir.write(
        &format!("direct-{n}.lua"),
        &shim_load::lua_script(&body, &pins),
    )?;
    let router_script = ctx
        .dir
        .write("router.lua", &shim_load::lua_script(&body, &[Vec::new()]))?;

    // Declared after `sim`, so dropped (stopped) before the fleet.
    let (mut routed, log) = match start_router(ctx, &sim, &body, n, out)? {
        Ok((r, port, log)) => (Ok((r, port)), Some(log)),
        Err(why) => (Err(why), None),
    };
    let quiet = match &routed {
        Ok((r, _)) => {
            let q = quiet(opts.idle_secs, r.pid())?;
            writeln!(
                out,
                "idle (no load, {:.1} s): router {:.3} cpu-s/s ({:.0}% in the kernel), sim {:.3} cpu-s/s",
                q.secs,
                q.router_rate(),
                100.0 * q.router.system / q.router.total().max(f64::MIN_POSITIVE),
                q.sim.total() / q.secs,
            )
            .map_err(w())?;
            q
        }
        Err(_) => report::Quiet::default(),
    };
    let mut blocks = Vec::new();
    for &connections in &opts.connections {
        let mut block = Block {
            workers: n,
            quiet,
            connections,
            ..Block::default()
        };
        for round in 1..=opts.rounds {
            for path in shim_load::round_order(round) {
                if crate::signals::interrupted() {
                    return Err(BenchError::Interrupted);
                }
                let mut run = WrkRun {
                    bin: &opts.wrk_bin,
                    port: sim.shim().port(),
                    threads: 1,
                    connections,
                    secs: opts.duration_secs,
                    cpus: &[ctx.place.load],
                    script: &direct_script,
                };
                let pid = routed.as_ref().ok().map(|(r, _)| r.pid());
                if path == Path::Direct {
                    eprintln!("{n} workers -c {connections} round {round}: direct ...");
                    warm_up(opts, run, ctx.dir)?;
                    let (s, picks) = measure(opts, run, ctx.dir, &sim, pid, path, round)?;
                    fleet::accumulate(&mut block.direct_picks, &picks);
                    block.runs.push(s);
                    continue;
                }
                let Ok((router, port)) = &mut routed else {
                    continue;
                };
                eprintln!("{n} workers -c {connections} round {round}: router ...");
                run.port = *port;
                run.script = &router_script;
                let r = measure_routed(opts, run, ctx.dir, &sim, router, *port, round);
                match r {
                    Ok((s, picks, selections)) => {
                        fleet::accumulate(&mut block.router_picks, &picks);
                        add_selections(&mut block.selections, &selections);
                        block.runs.push(s);
                    }
                    Err(e) => routed = Err(router_probe::lost(e)?),
                }
            }
        }
        block.router_missing = routed
            .as_ref()
            .err()
            .map(|why| why.lines().next().unwrap_or_default().to_owned());
        report::block(out, &block).map_err(w())?;
        blocks.push(block);
    }
    if let Ok((r, _)) = &routed
        && let Some(log) = &log
    {
        let note = router::after_runs(r.pid(), log, n);
        writeln!(out, "router after the runs: {note}").map_err(w())?;
    }
    drop(routed);
    drop(sim);
    Ok(blocks)
}

/// Starts the router for `sim`; a router that fails is reported (`Err`
/// with the reason) so that the direct baseline is still measured.
fn start_router(
    ctx: &Ctx<'_>,
    sim: &Sim,
    body: &str,
    n: usize,
    out: &mut impl Write,
) -> Result<Result<(Supervised, u16, PathBuf), String>, BenchError> {
    let w = || BenchError::io("writing the report");
    if !ctx.router_bin.is_file() {
        let why = format!("{} not found", ctx.router_bin.display());
        writeln!(out, "router: {why}").map_err(w())?;
        return Ok(Err(why));
    }
    eprintln!("sim-hop: starting the router and waiting for discovery of {n} workers ...");
    let start = router::Start {
        bin: ctx.router_bin,
        cpu: ctx.place.router,
        nofile: ctx.opts.router_nofile,
        root: sim.fleet().root(),
        shim: sim.shim(),
        ids: sim.ids(),
        chat_body: body,
        ready: Duration::from_secs(ctx.opts.ready_timeout_secs),
    };
    let max_conns = ctx.opts.connections.iter().copied().max().unwrap_or(1);
    let need = fleet::router_fds_needed(n, max_conns);
    match router::start(&start, ctx.dir, &format!("router-{n}")) {
        Ok((r, port, ready)) => {
            let fds = ready
                .fds
                .map_or("fds unknown".to_owned(), |f| f.to_string());
            let short = ready.fds.is_some_and(|f| f.soft < need);
            let warn = if short {
                "; WARNING: its limit is below that, requests may fail with EMFILE"
            } else {
                ""
            };
            writeln!(
                out,
                "router: ready {:.2} s after start (health {:.2} s, {n} workers discovered {:.2} s, \
                 {n} kv_metrics subscriptions connected {:.2} s, all load samples fresh {:.2} s, \
                 shim path answered {:.2} s); {fds} (it needs ~1 per publisher: ~{need} \
                 here{warn})",
                ready.answered.as_secs_f64(),
                ready.health.as_secs_f64(),
                ready.discovered.as_secs_f64(),
                ready.subscribed.as_secs_f64(),
                ready.fresh.as_secs_f64(),
                ready.answered.as_secs_f64(),
            )
            .map_err(w())?;
            Ok(Ok((r, port, ready.log)))
        }
        Err(BenchError::Interrupted) => Err(BenchError::Interrupted),
        Err(e) => {
            eprintln!("router failed: {e}");
            writeln!(out, "router: FAILED: {e}").map_err(w())?;
            Ok(Err(format!("router failed: {e}")))
        }
    }
}

/// A router run: [`measure`] bracketed by two scrapes of the router's
/// decode selections (outside the CPU window), and the router still alive.
fn measure_routed(
    opts: &SimHopOptions,
    run: WrkRun<'_>,
    dir: &TempDir,
    sim: &Sim,
    router: &mut Supervised,
    port: u16,
    round: u32,
) -> Result<(Sample, Vec<u64>, Selections), BenchError> {
    let scrape = |port| -> Result<Selections, BenchError> {
        let m = router_probe::get(port, "/metrics").map_err(|e| {
            BenchError::io("reading the router's /metrics")(std::io::Error::other(e))
        })?;
        Ok(router_probe::decode_selections(&String::from_utf8_lossy(
            &m,
        )))
    };
    warm_up(opts, run, dir)?;
    let before = scrape(port)?;
    let (s, picks) = measure(opts, run, dir, sim, Some(router.pid()), Path::Router, round)?;
    let after = scrape(port)?;
    router.ensure_running()?;
    let mut delta = after;
    for (reason, n) in &mut delta {
        let was = before
            .iter()
            .find(|(r, _)| r == reason)
            .map_or(0, |(_, b)| *b);
        *n = n.saturating_sub(was);
    }
    delta.retain(|(_, n)| *n > 0);
    Ok((s, picks, delta))
}

/// Adds `add`'s counts to `acc`, reason by reason.
fn add_selections(acc: &mut Vec<(String, u64)>, add: &[(String, u64)]) {
    for (reason, n) in add {
        match acc.iter_mut().find(|(r, _)| r == reason) {
            Some((_, m)) => *m += n,
            None => acc.push((reason.clone(), *n)),
        }
    }
}

/// CPU of every sampled party at one instant.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    router: CpuTime,
    sim: CpuTime,
    machine: CpuTime,
    reaped: CpuTime,
}

fn snapshot(router: Option<i32>) -> Result<Snapshot, BenchError> {
    Ok(Snapshot {
        router: router.map(cpu::tree).transpose()?.unwrap_or_default(),
        sim: cpu::own_process(),
        machine: cpu::machine_busy()?,
        reaped: cpu::reaped_children(),
    })
}

/// The router's and the sim's CPU over `secs` without load.
fn quiet(secs: u64, router: i32) -> Result<report::Quiet, BenchError> {
    let before = snapshot(Some(router))?;
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(secs);
    while Instant::now() < end {
        if crate::signals::interrupted() {
            return Err(BenchError::Interrupted);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = snapshot(Some(router))?;
    Ok(report::Quiet {
        secs: t0.elapsed().as_secs_f64(),
        router: after.router.since(before.router),
        sim: after.sim.since(before.sim),
    })
}

/// Runs `run` for the warm-up, unmeasured (if `--warmup` is not 0).
fn warm_up(opts: &SimHopOptions, mut run: WrkRun<'_>, dir: &TempDir) -> Result<(), BenchError> {
    if opts.warmup_secs > 0 {
        run.secs = opts.warmup_secs;
        run.run(dir)?;
    }
    Ok(())
}

/// Runs `run` measured, with CPU and the sim's per-worker requests sampled
/// just before and just after it.
fn measure(
    opts: &SimHopOptions,
    mut run: WrkRun<'_>,
    dir: &TempDir,
    sim: &Sim,
    router: Option<i32>,
    path: Path,
    round: u32,
) -> Result<(Sample, Vec<u64>), BenchError> {
    run.secs = opts.duration_secs;
    let picks_before = sim.picks();
    let before = snapshot(router)?;
    let t0 = Instant::now();
    let wrk = run.run(dir)?;
    let elapsed = t0.elapsed().as_secs_f64();
    let after = snapshot(router)?;
    let picks = fleet::delta(&sim.picks(), &picks_before);
    let router_cpu = after.router.since(before.router);
    let sim_cpu = after.sim.since(before.sim);
    let wrk_cpu = after.reaped.since(before.reaped);
    let other = cpu::rest(
        after.machine.since(before.machine),
        &[router_cpu, sim_cpu, wrk_cpu],
    );
    Ok((
        Sample {
            path,
            round,
            wrk,
            elapsed,
            router_cpu,
            router_ran: router.is_some(),
            sim_cpu,
            wrk_cpu,
            other_cpu: other,
        },
        picks,
    ))
}

fn header(out: &mut impl Write, opts: &SimHopOptions, place: Placement) -> std::io::Result<()> {
    let sizes: Vec<String> = opts.workers.iter().map(usize::to_string).collect();
    let conns: Vec<String> = opts.connections.iter().map(u32::to_string).collect();
    let publish = if opts.publish_ms > 0 {
        format!("every {} ms and on every load change", opts.publish_ms)
    } else {
        "on load changes only".to_owned()
    };
    writeln!(
        out,
        "sim-hop: continuum-sim fleets of {} aggregated workers of {MODEL} (LatencyModel::ZERO, \
         {} completion tokens, kv_metrics {publish}) inside the bench process, pinned with wrk \
         to CPU {}; router (1 shard, file-store discovery, the sim shim as shim backend) on CPU {}",
        sizes.join(", "),
        opts.max_tokens,
        place.load,
        place.router,
    )?;
    writeln!(
        out,
        "load: wrk -t1 -c{{{}}} -d{}s (+{} s warm-up) per run, {} round(s) per fleet size and \
         concurrency; POST /v1/chat/completions, max_tokens {}; nice {}",
        conns.join(","),
        opts.duration_secs,
        opts.warmup_secs,
        opts.rounds,
        opts.max_tokens,
        opts.nice,
    )?;
    writeln!(
        out,
        "direct = sim shim with the bench's pins ({} round-robin over all the fleet's workers, \
         decimal, + {} 0); router = no pins",
        shim_load::WORKER_PIN,
        shim_load::DP_RANK_PIN,
    )?;
    let (soft, hard) = fleet::nofile();
    let router_nofile = opts
        .router_nofile
        .map_or("inherited from the bench".to_owned(), |n| {
            format!("{n} (--router-nofile)")
        });
    writeln!(
        out,
        "open files: bench soft RLIMIT_NOFILE {soft} (hard {hard}); router's soft limit: \
         {router_nofile}; 1-min loadavg at start: {}",
        cpu::loadavg().map_or("?".into(), |l| format!("{l:.2}")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections_add_up_by_reason() {
        let mut acc = Vec::new();
        add_selections(&mut acc, &[("load".into(), 5)]);
        add_selections(
            &mut acc,
            &[("round_robin_stale".into(), 1), ("load".into(), 7)],
        );
        assert_eq!(
            acc,
            vec![("load".into(), 12), ("round_robin_stale".into(), 1)]
        );
    }

    #[test]
    fn header_names_the_placement_and_limits() {
        let mut buf = Vec::new();
        header(
            &mut buf,
            &SimHopOptions::default(),
            Placement { router: 0, load: 1 },
        )
        .unwrap();
        let t = String::from_utf8(buf).unwrap();
        assert!(
            t.contains("fleets of 10, 100, 1000 aggregated workers"),
            "{t}"
        );
        assert!(
            t.contains("pinned with wrk to CPU 1; router (1 shard"),
            "{t}"
        );
        assert!(t.contains("wrk -t1 -c{1,8} -d10s (+2 s warm-up)"), "{t}");
        assert!(t.contains("every 500 ms and on every load change"), "{t}");
        assert!(
            t.contains("router's soft limit: inherited from the bench"),
            "{t}"
        );
    }
}
