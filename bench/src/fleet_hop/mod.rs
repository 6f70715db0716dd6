//! `fleet-hop`: the router's added latency and CPU on a REAL Dynamo 1.6.1
//! fleet (mocker workers at `--speedup-ratio 1000`, so the engine delay is
//! near zero), against the same requests sent straight to the frontend.
//! Issue goals: at most 100 us added at p50, and router CPU per request at
//! most 5% of the frontend's.
//!
//! One run: fleet.py starts etcd, N aggregated mocker workers and one
//! `dynamo.frontend --router-mode direct` ([`fleet`]); the router starts
//! with etcd discovery and a shim pool of that frontend, and is awaited
//! until it lists every worker and proxies one request through the shim
//! ([`router`]). Then, for each wrk concurrency and round, the same load
//! runs twice ([`load`]): (a) straight to the frontend, pinned by the bench
//! (round-robin over the workers' decimal instance ids), then (b) through
//! the router, unpinned; each after its own unmeasured warm-up. Round 1
//! runs (a) first; later rounds alternate the order. The report
//! ([`report`]) compares latency and CPU per request.
//!
//! Invariants: the router runs alone on CPU 0 (unless `--router-cpu 1`);
//! the fleet and wrk share CPU 1 (with 2+ CPUs), identically in both runs,
//! so the frontend has the same CPU in both; only one load runs at a time; every child is
//! owned by a [`Supervised`] or the [`Fleet`] and torn down on any exit
//! path (router first, then the fleet); every wait is bounded.

pub(crate) mod fleet;
mod load;
mod report;
pub(crate) mod router;

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::child::{self, Supervised};
use crate::cpu;
use crate::error::BenchError;
use crate::hop_run::Placement;
use crate::probe;
use crate::router_probe;
use crate::shim_load::{self, Path};
use crate::tempdir::TempDir;
use crate::wrk::WrkRun;
pub(crate) use fleet::FleetError;
use fleet::{Fleet, FleetInfo, FleetSpec};
use load::Pids;
use report::Sample;

/// The aggregated model fleet.py serves (tokenizer of the shared tiny model).
const MODEL: &str = "tiny-agg";

/// Options of `fleet-hop`.
#[derive(Debug, Clone)]
pub(crate) struct FleetHopOptions {
    /// Seconds of measured load per run.
    pub(crate) duration_secs: u64,
    /// Seconds of unmeasured load before each run.
    pub(crate) warmup_secs: u64,
    /// wrk connection counts, one comparison each.
    pub(crate) connections: Vec<u32>,
    /// Direct/router pairs per connection count.
    pub(crate) rounds: u32,
    /// Mocker workers.
    pub(crate) workers: u32,
    /// `max_tokens` of every request.
    pub(crate) max_tokens: u32,
    /// `--speedup-ratio` of the mockers.
    pub(crate) speedup_ratio: u64,
    /// Router binary; `None` means next to the current executable.
    pub(crate) router_bin: Option<PathBuf>,
    /// wrk binary.
    pub(crate) wrk_bin: PathBuf,
    /// The fleet venv's python; `None` means `$CONTINUUM_FLEET_VENV` or
    /// `~/.cache/continuum-fleet/venv`, as `tests/fleet/install.sh`.
    pub(crate) python: Option<PathBuf>,
    /// `tests/fleet/fleet.py`.
    pub(crate) fleet_script: PathBuf,
    /// Seconds the fleet, then the router, may take to be ready.
    pub(crate) ready_timeout_secs: u64,
    /// CPU of the router (the fleet and wrk are on CPU 1); 1 puts all on one CPU.
    pub(crate) router_cpu: usize,
    /// Nice value the driver takes before spawning anything, so that every
    /// process of the benchmark inherits it; 0 leaves it unchanged.
    pub(crate) nice: i32,
}

impl Default for FleetHopOptions {
    fn default() -> Self {
        Self {
            duration_secs: 10,
            warmup_secs: 2,
            connections: vec![1, 8],
            rounds: 1,
            workers: 2,
            max_tokens: 4,
            speedup_ratio: 1000,
            router_bin: None,
            wrk_bin: PathBuf::from("wrk"),
            python: None,
            fleet_script: PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../tests/fleet/fleet.py"
            )),
            ready_timeout_secs: 60,
            router_cpu: 0,
            nice: 0,
        }
    }
}

/// Runs the benchmark and prints the report on stdout.
pub(crate) fn run(opts: &FleetHopOptions) -> Result<(), BenchError> {
    let place = Placement::choose(opts.router_cpu, "fleet");
    let python = opts.python.clone().unwrap_or_else(default_python);
    if !python.is_file() {
        return Err(FleetError::NoPython(python).into());
    }
    if !opts.fleet_script.is_file() {
        return Err(FleetError::NoScript(opts.fleet_script.clone()).into());
    }
    let router_bin = child::sibling_or(opts.router_bin.as_deref(), "continuum-router")?;
    if opts.nice != 0 {
        child::set_nice(opts.nice)?;
    }
    let dir = TempDir::new()?;
    let ready = Duration::from_secs(opts.ready_timeout_secs);
    let load_cpus = [place.load];

    eprintln!(
        "fleet-hop: starting the fleet ({} workers) ...",
        opts.workers
    );
    let mut fleet = Fleet::start(&FleetSpec {
        python: &python,
        script: &opts.fleet_script,
        model: MODEL,
        workers: opts.workers,
        speedup_ratio: opts.speedup_ratio,
        frontend_args: "",
        cpus: &load_cpus,
        ready_timeout: ready,
        log: &dir.path().join("fleet.log"),
    })?;
    let info = fleet.info().clone();
    eprintln!(
        "fleet-hop: fleet ready: frontend {} (pid {}), workers {:?}",
        info.frontend_url,
        info.frontend_pid,
        info.workers
            .iter()
            .map(|w| w.instance_id)
            .collect::<Vec<_>>()
    );
    let body = shim_load::chat_body(MODEL, opts.max_tokens);
    let pins = load::direct_pins(&info.workers);
    check_direct(&info, &pins, &body, ready)?;
    let direct_script = dir.write("direct.lua", &shim_load::lua_script(&body, &pins))?;
    let router_script = dir.write("router.lua", &shim_load::lua_script(&body, &[Vec::new()]))?;

    // Declared after `fleet`, so dropped (killed) before the fleet's teardown.
    let mut routed: Result<(Supervised, u16), String> = if router_bin.is_file() {
        eprintln!("fleet-hop: starting the router and waiting for discovery ...");
        match router::start(&router::Launch {
            bin: &router_bin,
            dir: &dir,
            cpu: place.router,
            fleet: &info,
            model: MODEL,
            chat_body: &body,
            ready,
            dynamo_extra: "",
            load_extra: "",
            name: "router",
        }) {
            Ok(r) => Ok(r),
            Err(e) => Err(router_probe::lost(e)?),
        }
    } else {
        let why = format!(
            "{} not found; run `cargo build --release -p continuum-router --features dynamo`",
            router_bin.display()
        );
        eprintln!("router: {why}. Reporting the direct baseline only.");
        Err(why)
    };

    let mut out = std::io::stdout().lock();
    header(&mut out, opts, &info, place).map_err(BenchError::io("writing the report"))?;
    for &connections in &opts.connections {
        let mut runs = Vec::new();
        for round in 1..=opts.rounds {
            for path in shim_load::round_order(round) {
                if crate::signals::interrupted() {
                    return Err(BenchError::Interrupted);
                }
                let pids = Pids {
                    router: routed.as_ref().ok().map(|(r, _)| r.pid()),
                    frontend: info.frontend_pid,
                    workers: info.workers.iter().map(|w| w.pid).collect(),
                };
                let mut run = WrkRun {
                    bin: &opts.wrk_bin,
                    port: info.frontend_port,
                    threads: 1,
                    connections,
                    secs: opts.duration_secs,
                    cpus: &load_cpus,
                    script: &direct_script,
                };
                if path == Path::Direct {
                    eprintln!("-c {connections} round {round}: direct ...");
                    runs.push(measure(opts, run, &dir, &pids, path, round)?);
                    fleet.ensure_running()?;
                    continue;
                }
                let Ok((router, port)) = &mut routed else {
                    continue;
                };
                eprintln!("-c {connections} round {round}: router ...");
                run.port = *port;
                run.script = &router_script;
                let r = measure(opts, run, &dir, &pids, path, round)
                    .and_then(|s| router.ensure_running().map(|()| s));
                fleet.ensure_running()?;
                match r {
                    Ok(s) => runs.push(s),
                    Err(e) => routed = Err(router_probe::lost(e)?),
                }
            }
        }
        let missing = routed
            .as_ref()
            .err()
            .map(|why| why.lines().next().unwrap_or_default());
        report::block(&mut out, connections, &runs, missing)
            .map_err(BenchError::io("writing the report"))?;
    }
    if let Ok((_, port)) = &routed {
        selections(&mut out, *port).map_err(BenchError::io("writing the report"))?;
    }
    Ok(())
}

/// One measured run; `opts` gives the durations.
fn measure(
    opts: &FleetHopOptions,
    run: WrkRun<'_>,
    dir: &TempDir,
    pids: &Pids,
    path: Path,
    round: u32,
) -> Result<Sample, BenchError> {
    load::measure(
        run,
        opts.warmup_secs,
        opts.duration_secs,
        dir,
        pids,
        path,
        round,
    )
}

/// Waits until a pinned request to each worker through the frontend is
/// answered 200, so the direct baseline measures successes (`kv-route` too).
pub(crate) fn check_direct(
    info: &FleetInfo,
    pins: &[Vec<(&'static str, String)>],
    body: &str,
    ready: Duration,
) -> Result<(), BenchError> {
    shim_load::await_pinned(
        info.frontend_port,
        pins,
        body,
        Instant::now() + ready,
        Duration::from_millis(200),
        |pins, detail| FleetError::PinnedRequest { pins, detail }.into(),
    )
}

fn header(
    out: &mut impl Write,
    opts: &FleetHopOptions,
    info: &FleetInfo,
    place: Placement,
) -> std::io::Result<()> {
    writeln!(
        out,
        "fleet-hop: Dynamo 1.6.1 fleet: {} mocker workers of {MODEL} (--speedup-ratio {}), \
         1 frontend (--router-mode direct), etcd; fleet + wrk pinned to CPU {}, \
         router (1 shard) to CPU {}",
        info.workers.len(),
        opts.speedup_ratio,
        place.load,
        place.router,
    )?;
    writeln!(
        out,
        "load: wrk -t1 -d{}s (+{} s warm-up) per run, {} round(s) per concurrency; \
         POST /v1/chat/completions, max_tokens {}; nice {}",
        opts.duration_secs, opts.warmup_secs, opts.rounds, opts.max_tokens, opts.nice,
    )?;
    writeln!(
        out,
        "direct = frontend with the bench's pins ({} round-robin over the {} workers, decimal, \
         + {} 0); router = no pins; 1-min loadavg at start: {}",
        shim_load::WORKER_PIN,
        info.workers.len(),
        shim_load::DP_RANK_PIN,
        cpu::loadavg().map_or("?".into(), |l| format!("{l:.2}")),
    )
}

/// Prints how the router's shim picked decode workers over the whole run.
fn selections(out: &mut impl Write, port: u16) -> std::io::Result<()> {
    let Ok(r) = probe::request(port, "GET", "/metrics", &[], "") else {
        return Ok(());
    };
    writeln!(
        out,
        "\nrouter decode picks over the whole run (incl. warm-ups and probes): {}",
        router_probe::selections_text(&router_probe::decode_selections(&r.text()))
    )
}

/// `$CONTINUUM_FLEET_VENV/bin/python`, else `~/.cache/continuum-fleet/venv/bin/python`.
pub(crate) fn default_python() -> PathBuf {
    let venv = std::env::var_os("CONTINUUM_FLEET_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), PathBuf::from);
            home.join(".cache/continuum-fleet/venv")
        });
    venv.join("bin/python")
}
