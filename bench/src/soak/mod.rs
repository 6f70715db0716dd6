//! `soak`: the router for `--minutes` at about 80% of its maximum rate in front of the simulated
//! fleet (`continuum-sim`, in this process, file-store discovery, as `sim-hop` runs it) while
//! workers join and leave every `--churn-secs`, sampling the router every `--sample-secs`: RSS,
//! open descriptors, `kv_metrics` subscriptions by state, workers listed. The report
//! ([`report`]) gives the requests (ok, churn errors, other errors), the RSS drift, the
//! descriptor and subscription ranges against the fleet size, and PASS/MISS per tolerance.
//!
//! Steps: start the fleet ([`crate::sim_hop`]'s spec: `LatencyModel::ZERO`, N aggregated
//! workers) and the router (`sim-hop`'s config and staged readiness); calibrate the maximum rate
//! with a closed-loop load through the router (`--connections` keep-alive clients in this
//! process, [`client`]) for `--calibrate-secs` after a 1 s warm-up; then drive `--load-percent`
//! of it open loop (a paced in-process client: request `i` is due at `i / rate`, latency counted
//! from then) while the driver thread joins a worker ([`continuum_sim::SimFleet::add_worker`])
//! and kills the oldest every `--churn-secs` (the fleet stays at N) and samples the router.
//!
//! Invariants: the router runs alone on its CPU (shard and control thread), the bench process
//! (the sim's threads and the clients) on the other; the router is stopped before the fleet;
//! every wait is bounded (readiness by `--ready-timeout`, every request by the I/O timeout, the
//! load by its end); an interrupt or the router's exit stops the load at once; all traffic is on
//! 127.0.0.1.

mod client;
mod report;

use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use continuum_sim::{InstanceId, Role};

use crate::child::{self, Supervised};
use crate::cpu;
use crate::error::BenchError;
use crate::hop_run::Placement;
use crate::router_probe;
use crate::shim_load;
use crate::sim_hop::fleet::{self as sim_fleet, MODEL, NAMESPACE, Sim};
use crate::sim_hop::router as sim_router;
use crate::tempdir::TempDir;
use client::{LoadSpec, Pace, Tally};
use report::{Sample, Soaked};

/// Bound of every socket operation of the load.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Unmeasured closed-loop load before the calibration.
const CALIBRATION_WARMUP: Duration = Duration::from_secs(1);
/// Sample rows printed at most.
const MAX_ROWS: usize = 40;

/// Options of `soak`.
#[derive(Debug, Clone)]
pub(crate) struct SoakOptions {
    /// Minutes of soak load.
    pub(crate) minutes: f64,
    /// Seconds between churn steps (one join, one leave); 0: no churn.
    pub(crate) churn_secs: u64,
    /// Fleet size, held by the churn.
    pub(crate) workers: usize,
    /// Client connections (threads), calibration and soak.
    pub(crate) connections: u32,
    /// Target rate; `None`: `load_percent` of the calibrated maximum.
    pub(crate) rate: Option<u64>,
    /// Percent of the calibrated maximum to drive.
    pub(crate) load_percent: u32,
    /// Seconds of the closed-loop calibration.
    pub(crate) calibrate_secs: u64,
    /// Seconds between samples of the router.
    pub(crate) sample_secs: u64,
    /// Seconds of the soak not judged; `None`: min(60 s, a quarter of the run).
    pub(crate) warmup_secs: Option<u64>,
    /// `max_tokens` of every request, and the sim's completion tokens.
    pub(crate) max_tokens: u32,
    /// Periodic kv_metrics interval, ms; 0: on load changes only.
    pub(crate) publish_ms: u64,
    /// Router binary; `None`: next to this executable.
    pub(crate) router_bin: Option<PathBuf>,
    /// Seconds the router may take to be ready.
    pub(crate) ready_timeout_secs: u64,
    /// The router's CPU (the bench's is the other).
    pub(crate) router_cpu: usize,
}

impl Default for SoakOptions {
    fn default() -> Self {
        Self {
            minutes: 30.0,
            churn_secs: 1,
            workers: 16,
            connections: 8,
            rate: None,
            load_percent: 80,
            calibrate_secs: 5,
            sample_secs: 10,
            warmup_secs: None,
            max_tokens: 4,
            publish_ms: 500,
            router_bin: None,
            ready_timeout_secs: 60,
            router_cpu: 0,
        }
    }
}

impl SoakOptions {
    /// The CI smoke: half a minute, sampled every 2 s, a 2 s calibration.
    pub(crate) fn quick(&mut self) {
        self.minutes = 0.5;
        self.sample_secs = 2;
        self.calibrate_secs = 2;
    }

    /// The soak's length.
    pub(crate) fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.minutes * 60.0)
    }

    /// Seconds not judged.
    pub(crate) fn warmup(&self) -> f64 {
        self.warmup_secs
            .map_or((self.minutes * 15.0).min(60.0), |s| s as f64)
    }
}

/// What went wrong in `soak` beyond a child or an I/O failure.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SoakError {
    /// No router binary.
    #[error(
        "{0} not found; run `cargo build --release -p continuum-router --features \
         continuum-router/dynamo` (or bench/run.sh --soak)"
    )]
    NoRouter(PathBuf),
    /// The calibration served nothing.
    #[error("the calibration through the router served no request: {0}")]
    Calibration(String),
    /// The router stopped during the soak.
    #[error("the router failed during the soak: {0}")]
    RouterLost(String),
}

impl From<SoakError> for BenchError {
    fn from(e: SoakError) -> Self {
        BenchError::Setup(format!("soak: {e}"))
    }
}

/// Runs the soak and prints the report on stdout; an error when a tolerance is missed.
pub(crate) fn run(opts: &SoakOptions) -> Result<(), BenchError> {
    let place = Placement::choose(opts.router_cpu, "sim");
    let router_bin = child::sibling_or(opts.router_bin.as_deref(), "continuum-router")?;
    if !router_bin.is_file() {
        return Err(SoakError::NoRouter(router_bin).into());
    }
    let n = opts.workers;
    // The fleet plus the joiner of a churn step, the clients and the router's connections.
    sim_fleet::ensure_nofile(n, sim_fleet::bench_fds_needed(n + 2, opts.connections))?;
    // Before any thread exists: the sim's threads and the clients inherit the mask.
    sim_fleet::pin_self(place.load)?;
    let dir = TempDir::new()?;
    let mut out = std::io::stdout().lock();
    let w = || BenchError::io("writing the report");
    header(&mut out, opts, place).map_err(w())?;

    eprintln!("soak: starting a simulated fleet of {n} workers ...");
    let publish = (opts.publish_ms > 0).then(|| Duration::from_millis(opts.publish_ms));
    let sim = Sim::start(sim_fleet::spec(n, opts.max_tokens, publish))?;
    let ready = Duration::from_secs(opts.ready_timeout_secs);
    let body = shim_load::chat_body(MODEL, opts.max_tokens);
    let pins = shim_load::decimal_pins(sim.ids().iter().copied());
    sim.check_direct(&pins, &body, Instant::now() + ready)?;
    eprintln!("soak: starting the router ...");
    let start = sim_router::Start {
        bin: &router_bin,
        cpu: place.router,
        nofile: None,
        root: sim.fleet().root(),
        shim: sim.shim(),
        ids: sim.ids(),
        chat_body: &body,
        ready,
    };
    // Declared after `sim`: dropped (stopped) before the fleet.
    let (mut router, port, readiness) = sim_router::start(&start, &dir, "router-soak")?;
    writeln!(
        out,
        "router: ready {:.2} s after start ({n} workers discovered {:.2} s, subscriptions \
         connected {:.2} s); {}",
        readiness.answered.as_secs_f64(),
        readiness.discovered.as_secs_f64(),
        readiness.subscribed.as_secs_f64(),
        readiness
            .fds
            .map_or("fds unknown".to_owned(), |f| f.to_string()),
    )
    .map_err(w())?;
    let request = client::chat_request(port, &body);

    let rate = match opts.rate {
        Some(r) => {
            writeln!(out, "rate: {r} req/s (--rate; no calibration)").map_err(w())?;
            r as f64
        }
        None => {
            eprintln!(
                "soak: calibrating the maximum rate ({} s) ...",
                opts.calibrate_secs
            );
            let max = calibrate(opts, &request, port, router.pid(), &mut out)?;
            router.ensure_running()?;
            max * f64::from(opts.load_percent) / 100.0
        }
    };

    eprintln!(
        "soak: {:.1} min at {rate:.0} req/s, a worker joining and one leaving every {} s ...",
        opts.minutes, opts.churn_secs
    );
    let soaked = soak(opts, &sim, &mut router, port, &request, rate)?;
    let log = dir.path().join("router-soak.log");
    let passed = report::render(&mut out, &soaked, MAX_ROWS).map_err(w())?;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let noisy: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    let errors = noisy.iter().filter(|l| l.contains(" ERROR ")).count();
    writeln!(
        out,
        "router log: {} WARN and {errors} ERROR lines{}",
        noisy.len() - errors,
        noisy.first().map_or(String::new(), |l| format!(
            "; first: {}",
            l.chars().take(240).collect::<String>()
        )),
    )
    .map_err(w())?;
    drop(router);
    drop(sim);
    if passed {
        writeln!(out, "soak: every target PASS").map_err(w())?;
        Ok(())
    } else {
        writeln!(out, "soak: at least one target MISS").map_err(w())?;
        Err(BenchError::Setup(
            "soak: at least one target missed (see the report)".into(),
        ))
    }
}

/// The closed-loop maximum rate through the router (answers 200 per second), printed with the
/// CPU of each side.
fn calibrate(
    opts: &SoakOptions,
    request: &[u8],
    port: u16,
    router_pid: i32,
    out: &mut impl Write,
) -> Result<f64, BenchError> {
    let spec = |start: Instant, secs: Duration| LoadSpec {
        port,
        request,
        connections: opts.connections as usize,
        pace: Pace::Closed,
        start,
        end: start + secs,
        io_timeout: IO_TIMEOUT,
        stop: None,
    };
    let _ = client::run(&spec(Instant::now(), CALIBRATION_WARMUP));
    if crate::signals::interrupted() {
        return Err(BenchError::Interrupted);
    }
    let (r0, b0) = (cpu::tree(router_pid)?, cpu::own_process());
    let (t, secs) = client::run(&spec(
        Instant::now(),
        Duration::from_secs(opts.calibrate_secs),
    ));
    if crate::signals::interrupted() {
        return Err(BenchError::Interrupted);
    }
    let (r1, b1) = (cpu::tree(router_pid)?, cpu::own_process());
    if t.ok == 0 {
        return Err(SoakError::Calibration(
            t.errors
                .first()
                .cloned()
                .unwrap_or_else(|| "no answer".into()),
        )
        .into());
    }
    let max = t.ok as f64 / secs;
    writeln!(
        out,
        "calibration: closed loop, {} connections, {secs:.1} s: {max:.0} req/s ({} errors), \
         p50 {}, p99 {}; router {:.2} cpu-s/s, bench (sim + clients) {:.2} cpu-s/s; target {}% \
         = {:.0} req/s",
        opts.connections,
        t.failed(),
        crate::numbers::latency(t.latency.value_at_quantile(0.5) as f64),
        crate::numbers::latency(t.latency.value_at_quantile(0.99) as f64),
        r1.since(r0).total() / secs,
        b1.since(b0).total() / secs,
        opts.load_percent,
        max * f64::from(opts.load_percent) / 100.0,
    )
    .map_err(BenchError::io("writing the report"))?;
    Ok(max)
}

/// The soak proper: the open-loop load on its own threads, the churn and the samples on this
/// one.
fn soak(
    opts: &SoakOptions,
    sim: &Sim,
    router: &mut Supervised,
    port: u16,
    request: &[u8],
    rate: f64,
) -> Result<Soaked, BenchError> {
    let n = opts.workers;
    let fleet = sim.fleet();
    let pid = router.pid();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let start = Instant::now();
    let end = start + opts.duration();
    let spec = LoadSpec {
        port,
        request,
        connections: opts.connections as usize,
        pace: Pace::Open { rate },
        start,
        end,
        io_timeout: IO_TIMEOUT,
        stop: Some(&stop),
    };
    let departed0 = fleet.departed_refusals();
    let cpu0 = cpu::tree(pid).ok().map(|c| c.total());
    let mut live: VecDeque<InstanceId> = sim.ids().iter().map(|&id| InstanceId::new(id)).collect();
    let (mut joined, mut left) = (0u64, 0u64);
    let mut churn_failures: (u64, Option<String>) = (0, None);
    let mut fail = |why: String| {
        churn_failures.0 += 1;
        churn_failures.1.get_or_insert(why);
    };
    let mut samples = Vec::new();
    let mut lost: Option<String> = None;
    let churn = (opts.churn_secs > 0).then(|| Duration::from_secs(opts.churn_secs));
    let sample_every = Duration::from_secs(opts.sample_secs);
    let (tally, secs) = std::thread::scope(|scope| {
        let load = scope.spawn(|| client::run(&spec));
        let mut next_churn = churn.map(|c| start + c);
        let mut next_sample = start;
        loop {
            let now = Instant::now();
            if now >= end || crate::signals::interrupted() {
                break;
            }
            if let Err(e) = router.ensure_running() {
                lost = Some(e.to_string());
                break;
            }
            // A churn step due together with a sample goes first: the sample then sees the
            // router right after a join and a leave, the least settled moment.
            if let (Some(at), Some(every)) = (next_churn, churn)
                && now >= at
            {
                match fleet.add_worker(NAMESPACE, MODEL, Role::Aggregated) {
                    Ok(w) => {
                        joined += 1;
                        live.push_back(w.instance_id);
                    }
                    Err(e) => fail(format!("add_worker: {e}")),
                }
                if live.len() > n
                    && let Some(oldest) = live.pop_front()
                {
                    match fleet.kill(oldest) {
                        Ok(()) => left += 1,
                        Err(e) => fail(format!("kill: {e}")),
                    }
                }
                next_churn = Some(at + every);
            }
            if now >= next_sample {
                samples.push(sample(pid, port, start, cpu0, live.len()));
                next_sample += sample_every;
            }
            let wake = [Some(end), Some(next_sample), next_churn]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(end);
            std::thread::sleep(
                wake.saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(100)),
            );
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        load.join().unwrap_or_else(|_| (Tally::default(), 0.0))
    });
    if crate::signals::interrupted() {
        return Err(BenchError::Interrupted);
    }
    if let Some(why) = lost {
        return Err(SoakError::RouterLost(why).into());
    }
    // One last sample, after the load.
    samples.push(sample(pid, port, start, cpu0, live.len()));
    router.ensure_running()?;
    Ok(Soaked {
        workers: n,
        rate,
        secs,
        tally,
        departed: fleet.departed_refusals().saturating_sub(departed0),
        joined,
        left,
        churn_failures,
        samples,
        warmup_secs: opts.warmup(),
    })
}

/// One sample of the router (module docs); what cannot be read is `None`.
fn sample(pid: i32, port: u16, start: Instant, cpu0: Option<f64>, live: usize) -> Sample {
    let at = start.elapsed().as_secs_f64();
    let rss_kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| report::vm_rss_kib(&s));
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()
        .map(Iterator::count);
    let subs = router_probe::get(port, "/metrics")
        .ok()
        .map(|m| sim_router::sub_counts(&String::from_utf8_lossy(&m)));
    let listed = router_probe::get(port, "/admin/dynamo/workers")
        .ok()
        .map(|b| router_probe::listed_worker_ids(&b).len());
    let cpu = match (cpu0, cpu::tree(pid)) {
        (Some(c0), Ok(c)) => Some(c.total() - c0),
        _ => None,
    };
    Sample {
        at,
        rss_kib,
        fds,
        subs,
        listed,
        live,
        cpu,
    }
}

fn header(out: &mut impl Write, o: &SoakOptions, place: Placement) -> std::io::Result<()> {
    let rate = match o.rate {
        Some(r) => format!("{r} req/s (--rate)"),
        None => format!(
            "{}% of the maximum a {} s closed-loop calibration measures",
            o.load_percent, o.calibrate_secs
        ),
    };
    let churn = if o.churn_secs == 0 {
        "no churn".to_owned()
    } else {
        format!(
            "every {} s a worker joins (SimFleet::add_worker: publisher, shim, file-store \
             records) and the oldest leaves (SimFleet::kill), so the fleet stays at {}",
            o.churn_secs, o.workers
        )
    };
    writeln!(
        out,
        "soak: {:.1} min; continuum-sim fleet of {} aggregated workers of {MODEL} \
         (LatencyModel::ZERO, {} completion tokens) inside the bench process on CPU {}; router \
         (1 shard, file-store discovery, the sim shim as shim backend) on CPU {}",
        o.minutes, o.workers, o.max_tokens, place.load, place.router,
    )?;
    writeln!(out, "churn: {churn}")?;
    writeln!(
        out,
        "load: open loop at {rate}: {} keep-alive client threads in the bench process, request i \
         due at i/rate (latency from then, as wrk2); POST /v1/chat/completions, max_tokens {}",
        o.connections, o.max_tokens,
    )?;
    writeln!(
        out,
        "samples every {} s: VmRSS and /proc/PID/fd of the router, \
         continuum_dynamo_load_subscriptions by state, /admin/dynamo/workers; the first {:.0} s \
         are not judged; 1-min loadavg at start: {}",
        o.sample_secs,
        o.warmup(),
        cpu::loadavg().map_or("?".into(), |l| format!("{l:.2}")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_warmup() {
        let mut o = SoakOptions::default();
        assert_eq!((o.minutes, o.churn_secs, o.sample_secs), (30.0, 1, 10));
        assert_eq!(o.warmup(), 60.0);
        o.quick();
        assert_eq!(o.duration(), Duration::from_secs(30));
        assert_eq!(o.warmup(), 7.5);
        o.warmup_secs = Some(3);
        assert_eq!(o.warmup(), 3.0);
        let mut buf = Vec::new();
        header(&mut buf, &o, Placement { router: 0, load: 1 }).unwrap();
        let t = String::from_utf8(buf).unwrap();
        assert!(
            t.contains("soak: 0.5 min; continuum-sim fleet of 16"),
            "{t}"
        );
        assert!(
            t.contains("the oldest leaves (SimFleet::kill), so the fleet stays at 16"),
            "{t}"
        );
        assert!(
            t.contains("open loop at 80% of the maximum a 2 s closed-loop"),
            "{t}"
        );
    }
}
