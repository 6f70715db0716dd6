//! `aiperf`: NVIDIA's AIPerf (pinned by `bench/aiperf/requirements.txt`, installed by
//! `bench/aiperf/install.sh`) against the router and against Dynamo's own frontend, on a REAL
//! Dynamo 1.6.1 mocker fleet, streaming, for `/v1/completions` and `/v1/chat/completions`:
//!
//! - `dynamo kv`: AIPerf → `dynamo.frontend --router-mode kv` (Dynamo routes itself);
//! - `router`: AIPerf → continuum-router (`dynamo.kv` on, the tiny model's artifacts pinned) →
//!   `dynamo.frontend --router-mode direct` with the router's pins.
//!
//! A direct-mode frontend answers only pinned requests, so AIPerf (which sends none) cannot run
//! against the router's own shim; the baseline is the frontend doing what the router does, KV
//! routing included. Each row runs on a fresh fleet (same workers, same `--speedup-ratio`), both
//! endpoints one after the other with the same seeded synthetic workload; `--rounds N` repeats
//! the rows, alternating their order. The report ([`report`]) puts TTFT, inter-token latency and
//! request latency side by side, with the router's ratio to the baseline and its added share.
//!
//! Invariants: every child is owned by a [`Supervised`] or a [`Fleet`] and torn down on every
//! exit path; every AIPerf run is bounded by its request count and by the row timeout; all
//! traffic is on 127.0.0.1; exit code 0 only if the `dynamo kv` baseline was measured.

mod report;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::child::{self, Supervised};
use crate::error::BenchError;
use crate::fleet_hop::check_direct;
use crate::fleet_hop::fleet::{Fleet, FleetInfo, FleetSpec};
use crate::fleet_hop::router::Launch;
use crate::fleet_rows::{KvFleet, Resolved, run_rounds};
use crate::kv_route::router as kv_router;
use crate::shim_load;
use crate::tempdir::TempDir;
use report::{Endpoint, Kind, Run};

/// The model every fleet serves (the tiny model's tokenizer, in the mockers' cards).
const MODEL: &str = "tiny-agg";

/// What went wrong in `aiperf` beyond a child or an I/O failure.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AiperfError {
    /// AIPerf is not installed.
    #[error("{0} not found: run bench/aiperf/install.sh (bench/run.sh --aiperf does)")]
    NoAiperf(PathBuf),
    /// AIPerf failed or wrote no export.
    #[error("aiperf {endpoint} against {row} failed ({status}):\n{log}")]
    Failed {
        /// Endpoint type.
        endpoint: &'static str,
        /// Row label.
        row: &'static str,
        /// Its exit status, or "timed out".
        status: String,
        /// The end of its log.
        log: String,
    },
    /// The export is not what AIPerf 0.13 writes.
    #[error("{path}: {why}")]
    Export {
        /// The export file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The baseline row never ran to the end.
    #[error("the `dynamo kv` baseline was not measured: {0}")]
    NoBaseline(String),
}

impl From<AiperfError> for crate::error::BenchError {
    fn from(e: AiperfError) -> Self {
        Self::stage(crate::error::Stage::Aiperf, e)
    }
}

/// Options of `aiperf`.
#[derive(Debug, Clone)]
pub(crate) struct AiperfOptions {
    /// Mocker workers of each fleet.
    pub(crate) workers: u32,
    /// `--speedup-ratio` of the mockers.
    pub(crate) speedup_ratio: u64,
    /// AIPerf `--request-count` per endpoint and row.
    pub(crate) requests: u32,
    /// AIPerf `--concurrency`.
    pub(crate) concurrency: u32,
    /// AIPerf `--synthetic-input-tokens-mean`.
    pub(crate) input_tokens: u32,
    /// AIPerf `--output-tokens-mean`.
    pub(crate) output_tokens: u32,
    /// Repetitions of the two rows, alternating their order.
    pub(crate) rounds: u32,
    /// The `aiperf` executable; `None`: `$CONTINUUM_AIPERF_VENV` or the installer's default.
    pub(crate) aiperf_bin: Option<PathBuf>,
    /// Where the fleet and the router come from (its model directory is also AIPerf's
    /// `--tokenizer`).
    pub(crate) fleet: KvFleet,
    /// Wall time one AIPerf run may take, seconds.
    pub(crate) run_timeout_secs: u64,
}

impl Default for AiperfOptions {
    fn default() -> Self {
        Self {
            workers: 2,
            speedup_ratio: 1,
            requests: 64,
            concurrency: 8,
            input_tokens: 512,
            output_tokens: 32,
            rounds: 1,
            aiperf_bin: None,
            fleet: KvFleet::default(),
            run_timeout_secs: 600,
        }
    }
}

/// `$CONTINUUM_AIPERF_VENV/bin/aiperf`, else `~/.cache/continuum-aiperf/venv/bin/aiperf` (the
/// installer's default).
fn default_aiperf() -> PathBuf {
    let venv = std::env::var_os("CONTINUUM_AIPERF_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), PathBuf::from);
            home.join(".cache/continuum-aiperf/venv")
        });
    venv.join("bin/aiperf")
}

/// Everything a row needs besides its kind and round.
struct Setup<'a> {
    opts: &'a AiperfOptions,
    python: PathBuf,
    aiperf: PathBuf,
    /// The router binary and the pinned digests, or why the router row cannot run.
    router: Result<(PathBuf, Vec<String>), String>,
    dir: TempDir,
    cpus: Vec<usize>,
}

/// Runs the benchmark and prints the report on stdout.
pub(crate) fn run(opts: &AiperfOptions) -> Result<(), BenchError> {
    let aiperf = opts.aiperf_bin.clone().unwrap_or_else(default_aiperf);
    if !aiperf.is_file() {
        return Err(AiperfError::NoAiperf(aiperf).into());
    }
    let Resolved { python, router } = opts.fleet.resolve()?;
    let setup = Setup {
        opts,
        python,
        aiperf,
        router,
        dir: TempDir::new()?,
        cpus: (0..child::available_cpus().max(1)).collect(),
    };
    let mut out = std::io::stdout().lock();
    report::header(&mut out, opts, &setup.aiperf).map_err(BenchError::io("writing the report"))?;
    let (rows, missing) = run_rounds(
        "aiperf",
        opts.rounds,
        |round| Kind::order(round).to_vec(),
        Kind::label,
        |kind, round| run_row(&setup, kind, round),
    )?;
    let runs: Vec<Run> = rows.into_iter().flatten().collect();
    report::render(&mut out, &runs, &missing).map_err(BenchError::io("writing the report"))?;
    out.flush().map_err(BenchError::io("writing the report"))?;
    match missing.iter().find(|(k, _)| *k == Kind::Dynamo) {
        Some((_, why)) => Err(AiperfError::NoBaseline(why.clone()).into()),
        None => Ok(()),
    }
}

/// One row on a fresh fleet: start it (and the router), run AIPerf for each endpoint, tear
/// everything down.
fn run_row(setup: &Setup<'_>, kind: Kind, round: u32) -> Result<Vec<Run>, BenchError> {
    let opts = setup.opts;
    let ready = Duration::from_secs(opts.fleet.ready_timeout_secs);
    let log = setup
        .dir
        .path()
        .join(format!("fleet-{}-{round}.log", kind.slug()));
    let fleet = Fleet::start(&FleetSpec {
        python: &setup.python,
        script: &opts.fleet.fleet_script,
        model: MODEL,
        workers: opts.workers,
        speedup_ratio: opts.speedup_ratio,
        frontend_args: match kind {
            Kind::Dynamo => "--router-mode kv",
            Kind::Router => "",
        },
        cpus: &setup.cpus,
        ready_timeout: ready,
        log: &log,
    })?;
    let info: FleetInfo = fleet.info().clone();
    let probe = shim_load::chat_body(MODEL, 1);
    // Declared after `fleet`, so dropped (stopped) before the fleet's teardown.
    let mut routed: Option<Supervised> = None;
    let port = match kind {
        Kind::Dynamo => {
            check_direct(&info, &[Vec::new()], &probe, ready)?;
            info.frontend_port
        }
        Kind::Router => {
            let (bin, pinned) = setup.router.as_ref().map_err(|why| {
                BenchError::io("starting the router")(std::io::Error::other(why.clone()))
            })?;
            let pins = shim_load::decimal_pins(info.workers.iter().map(|w| w.instance_id));
            check_direct(&info, &pins, &probe, ready)?;
            eprintln!("aiperf: starting the router and waiting for discovery and KV ...");
            let name = format!("router-{round}");
            let launch = Launch {
                bin,
                dir: &setup.dir,
                cpu: 0,
                fleet: &info,
                model: MODEL,
                chat_body: &probe,
                ready,
                dynamo_extra: "",
                load_extra: "",
                name: &name,
            };
            let (r, port) = kv_router::start(launch, pinned)?;
            routed = Some(r);
            port
        }
    };
    let mut runs = Vec::new();
    for endpoint in Endpoint::ALL {
        let artifacts =
            setup
                .dir
                .path()
                .join(format!("{}-{}-{round}", kind.slug(), endpoint.label()));
        let metrics = profile(setup, kind, endpoint, port, &artifacts)?;
        if let Some(r) = &mut routed {
            r.ensure_running()?;
        }
        runs.push(Run {
            kind,
            endpoint,
            round,
            metrics,
        });
    }
    drop(routed);
    drop(fleet);
    Ok(runs)
}

/// One `aiperf profile` run; its metrics.
fn profile(
    setup: &Setup<'_>,
    kind: Kind,
    endpoint: Endpoint,
    port: u16,
    artifacts: &Path,
) -> Result<report::Metrics, BenchError> {
    let opts = setup.opts;
    let log = artifacts.with_extension("log");
    let stdout = std::fs::File::create(&log).map_err(BenchError::io("creating the AIPerf log"))?;
    let stderr = stdout
        .try_clone()
        .map_err(BenchError::io("creating the AIPerf log"))?;
    let mut cmd = Command::new(&setup.aiperf);
    cmd.args(["profile", "--model", MODEL])
        .args(["--url", &format!("http://127.0.0.1:{port}")])
        .args(["--endpoint-type", endpoint.label(), "--streaming"])
        .arg("--tokenizer")
        .arg(&opts.fleet.model_dir)
        .args(["--request-count", &opts.requests.to_string()])
        .args(["--concurrency", &opts.concurrency.to_string()])
        .args([
            "--synthetic-input-tokens-mean",
            &opts.input_tokens.to_string(),
        ])
        .args(["--output-tokens-mean", &opts.output_tokens.to_string()])
        .args(["--random-seed", "1", "--ui-type", "none"])
        .arg("--artifact-dir")
        .arg(artifacts)
        // AIPerf 0.13 cannot load a local tokenizer directory in HF_HUB_OFFLINE mode.
        .env_remove("HF_HUB_OFFLINE")
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr);
    let mut p = Supervised::spawn("aiperf", cmd, &setup.cpus, Some(&log))?;
    let deadline = Instant::now() + Duration::from_secs(opts.run_timeout_secs);
    let status = p.wait_until(deadline)?;
    let failed = |status: String| AiperfError::Failed {
        endpoint: endpoint.label(),
        row: kind.label(),
        status,
        log: p.log_tail(),
    };
    match status {
        Some(s) if s.success() => {}
        Some(s) => return Err(failed(s.to_string()).into()),
        None => return Err(failed("timed out".into()).into()),
    }
    let path = artifacts.join("profile_export_aiperf.json");
    let text = std::fs::read_to_string(&path)
        .map_err(BenchError::io(format!("reading {}", path.display())))?;
    report::Metrics::parse(&text).map_err(|why| AiperfError::Export { path, why }.into())
}
