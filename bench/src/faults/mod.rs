//! `faults`: fault injection on a REAL Dynamo 1.6.1 mocker fleet under a multi-turn streaming
//! chat load (`kv-route`'s workload and client, [`load`]), each scenario ([`inject`]) on a fresh
//! fleet (`--workers` aggregated mockers, `--speedup-ratio 1`, etcd leases of `--lease-ttl`
//! seconds): a worker SIGKILLed or SIGSTOPped, a frontend of the router's shim pool killed, etcd
//! killed and restarted, etcd's history compacted, a worker's publishers flapping, a storm of
//! config reloads. Rows: `router` (clients → continuum-router, `dynamo.kv` on → direct-mode
//! frontend(s), as `kv-route`'s router row) and, for `worker-kill`, `dynamo kv` (clients →
//! `dynamo.frontend --router-mode kv`) with the same seed and timeline.
//!
//! Per row ([`report`]): requests sent, ok, failed by kind, slow, lost ([`classify`]); the
//! client-facing process's open fds and RSS, and the router's subscriptions, before and after
//! ([`observe`]); after the scenario, whether the router lists every live worker (and no dead
//! one) and still routes.
//!
//! Invariants: every child is owned by a [`Supervised`] or a [`Fleet`] and torn down on every
//! exit path (router first, then the fleet, which continues any stopped process before its
//! teardown); every wait is bounded (readiness by the ready timeout, each request by the request
//! timeout, each injection by its own bounds, the load by its deadline); all traffic is on
//! 127.0.0.1; exit code 0 only if every scenario ran.

mod classify;
mod inject;
mod load;
mod observe;
mod report;
mod router;

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::child::{self, Supervised};
use crate::error::BenchError;
use crate::fleet_hop::check_direct;
use crate::fleet_hop::fleet::{Fleet, FleetSpec};
use crate::fleet_rows::{KvFleet, Resolved};
use crate::kv_route::workload::MODEL;
use crate::router_probe::shim_answers;
use crate::shim_load;
use crate::tempdir::TempDir;
use classify::{Outcome, Tally};
pub(crate) use inject::Scenario;
use inject::{Ctx, Injected, Target};
use load::LoadPlan;
use report::Row;

/// How long the router may take, after the load, to list exactly the live workers.
const SETTLE: Duration = Duration::from_secs(20);
/// Failures quoted per row.
const QUOTED: usize = 5;

/// What went wrong in `faults` beyond a child or an I/O failure.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FaultsError {
    /// Some rows did not run.
    #[error("{0} row(s) did not run: {1}")]
    NotRun(usize, String),
}

impl From<FaultsError> for BenchError {
    fn from(e: FaultsError) -> Self {
        Self::stage(crate::error::Stage::Faults, e)
    }
}

/// Options of `faults`.
#[derive(Debug, Clone)]
pub(crate) struct FaultsOptions {
    /// Scenarios to run, in order.
    pub(crate) scenarios: Vec<Scenario>,
    /// Mocker workers of each fleet.
    pub(crate) workers: u32,
    /// Workload seed.
    pub(crate) seed: u64,
    /// Concurrent conversations (client threads).
    pub(crate) conversations: usize,
    /// Turns per conversation.
    pub(crate) turns: usize,
    /// `max_tokens` of every request.
    pub(crate) max_tokens: u32,
    /// Socket timeout and deadline of every request, seconds.
    pub(crate) request_timeout_secs: u64,
    /// fleet.py's `--lease-ttl`.
    pub(crate) lease_ttl_secs: u64,
    /// How long `publisher-flap` flaps, seconds.
    pub(crate) flap_secs: u64,
    /// Where the fleet and the router come from.
    pub(crate) fleet: KvFleet,
}

impl Default for FaultsOptions {
    fn default() -> Self {
        Self {
            scenarios: Scenario::ALL.to_vec(),
            workers: 4,
            seed: 1,
            conversations: 8,
            turns: 6,
            max_tokens: 16,
            request_timeout_secs: 60,
            lease_ttl_secs: 3,
            flap_secs: 60,
            fleet: KvFleet::default(),
        }
    }
}

impl FaultsOptions {
    /// The CI smoke: `worker-kill` and `reload-storm`, 2 conversations of 3 turns.
    pub(crate) fn quick(&mut self) {
        self.scenarios = vec![Scenario::WorkerKill, Scenario::ReloadStorm];
        self.conversations = 2;
        self.turns = 3;
    }
}

/// Everything a row needs besides its scenario and target.
struct Setup<'a> {
    opts: &'a FaultsOptions,
    python: PathBuf,
    router: Result<(PathBuf, Vec<String>), String>,
    dir: TempDir,
    cpus: Vec<usize>,
}

/// Runs the scenarios and prints the report on stdout.
pub(crate) fn run(opts: &FaultsOptions) -> Result<(), BenchError> {
    let Resolved { python, router } = opts.fleet.resolve()?;
    let setup = Setup {
        opts,
        python,
        router,
        dir: TempDir::new()?,
        cpus: (0..child::available_cpus().max(1)).collect(),
    };
    let mut rows = Vec::new();
    let mut missing = Vec::new();
    for &scenario in &opts.scenarios {
        for &target in scenario.targets() {
            eprintln!("faults: {} / {} ...", scenario.name(), target.label());
            match run_row(&setup, scenario, target) {
                Ok(r) => rows.push(r),
                Err(BenchError::Interrupted) => return Err(BenchError::Interrupted),
                Err(e) => {
                    eprintln!(
                        "faults: {} / {} failed: {e}",
                        scenario.name(),
                        target.label()
                    );
                    let first = e.to_string().lines().next().unwrap_or_default().to_owned();
                    missing.push((scenario, target, first));
                }
            }
        }
    }
    let mut out = std::io::stdout().lock();
    header(&mut out, opts).map_err(BenchError::io("writing the report"))?;
    report::render(&mut out, &rows, &missing).map_err(BenchError::io("writing the report"))?;
    if missing.is_empty() {
        Ok(())
    } else {
        let names: Vec<String> = missing
            .iter()
            .map(|(s, t, _)| format!("{} / {}", s.name(), t.label()))
            .collect();
        Err(FaultsError::NotRun(missing.len(), names.join(", ")).into())
    }
}

/// One row on a fresh fleet: start it (and the router), load it, inject the fault mid-load,
/// look again, tear everything down.
fn run_row(setup: &Setup<'_>, scenario: Scenario, target: Target) -> Result<Row, BenchError> {
    let opts = setup.opts;
    let router_parts = match target {
        Target::Router => Some(setup.router.as_ref().map_err(|why| {
            BenchError::io("starting the router")(std::io::Error::other(why.clone()))
        })?),
        Target::Dynamo => None,
    };
    let ready = Duration::from_secs(opts.fleet.ready_timeout_secs);
    let name = format!("{}-{}", scenario.name(), target.label().replace(' ', "-"));
    let log = setup.dir.path().join(format!("fleet-{name}.log"));
    let extra: Vec<String> = [
        "--lease-ttl".to_owned(),
        scenario.lease_ttl(opts.lease_ttl_secs).to_string(),
        "--frontend-replicas".to_owned(),
        scenario.frontends().to_string(),
    ]
    .into();
    let mut fleet = Fleet::start_with(
        &FleetSpec {
            python: &setup.python,
            script: &opts.fleet.fleet_script,
            model: MODEL,
            workers: opts.workers,
            speedup_ratio: 1,
            frontend_args: if target == Target::Dynamo {
                "--router-mode kv"
            } else {
                ""
            },
            cpus: &setup.cpus,
            ready_timeout: ready,
            log: &log,
        },
        &extra,
    )?;
    let info = fleet.info().clone();
    let probe_body = shim_load::chat_body(MODEL, 1);
    let mut notes = vec![format!(
        "etcd lease TTL {} s",
        scenario.lease_ttl(opts.lease_ttl_secs)
    )];
    // Declared after `fleet`, so dropped (stopped) before the fleet's teardown.
    let mut routed: Option<(Supervised, u16)> = None;
    let port = match router_parts {
        None => {
            check_direct(&info, &[Vec::new()], &probe_body, ready)?;
            info.frontend_port
        }
        Some((bin, pinned)) => {
            let pins = shim_load::decimal_pins(info.workers.iter().map(|w| w.instance_id));
            check_direct(&info, &pins, &probe_body, ready)?;
            let frontends: Vec<String> = inject::frontends(&mut fleet)?
                .into_iter()
                .map(|(url, _, _)| url)
                .collect();
            notes.push(format!("shim pool: {} frontend(s)", frontends.len()));
            eprintln!("faults: starting the router and waiting for discovery and KV ...");
            let spec = router::RouterSpec {
                bin,
                pinned,
                dir: &setup.dir,
                fleet: &info,
                frontends: &frontends,
                chat_body: &probe_body,
                ready,
                name: &format!("router-{name}"),
            };
            let (r, p) = router::start(&spec)?;
            routed = Some((r, p));
            p
        }
    };
    let router_port = routed.as_ref().map(|(_, p)| *p);
    let watched = routed.as_ref().map_or(info.frontend_pid, |(r, _)| r.pid());
    let before = observe::snapshot(watched, router_port);
    let metrics_before = router_port.map(crate::kv_route::router::metrics);

    let flap = Duration::from_secs(opts.flap_secs);
    let request_timeout = Duration::from_secs(opts.request_timeout_secs);
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let plan = LoadPlan {
        port,
        seed: opts.seed,
        conversations: opts.conversations,
        turns: opts.turns,
        max_tokens: opts.max_tokens,
        request_timeout,
        stop: &stop,
        deadline: start + inject::WARMUP + scenario.longest(flap) + scenario.tail(),
    };
    let mut ctx = Ctx {
        fleet: &mut fleet,
        router_pid: routed.as_ref().map(|(r, _)| r.pid()),
        flap,
        start,
    };
    let (loaded, injected) = std::thread::scope(|s| {
        let load = s.spawn(|| load::run(&plan));
        let injected = inject::run(scenario, &mut ctx)
            .and_then(|i| inject::pause(scenario.tail()).map(|()| i));
        stop.store(true, Ordering::SeqCst);
        (load.join().unwrap_or_default(), injected)
    });
    let Injected { what, notes: how } = injected?;
    notes.extend(how);

    let mut tally = Tally::default();
    let mut quoted = Vec::new();
    for a in &loaded.attempts {
        tally.add(&a.outcome, a.secs);
        let why = match &a.outcome {
            Outcome::Ok => continue,
            Outcome::Failed { kind, detail } => format!("{}: {detail}", kind.label()),
            Outcome::Lost(d) => format!("lost: {d}"),
        };
        if quoted.len() < QUOTED {
            quoted.push(format!("@{:.1}s +{:.2}s {why}", a.at, a.secs));
        }
    }
    let (mut listed, mut routes_after) = (None, None);
    if let Some((r, p)) = &mut routed {
        if let Err(e) = r.ensure_running() {
            notes.push(format!("ROUTER EXITED: {e}"));
        } else {
            let status = fleet.command("status", Duration::from_secs(20))?;
            let alive = inject::alive_workers(&status);
            listed = Some(settle(*p, &alive, &mut notes));
            routes_after = Some(shim_answers(*p, &probe_body).is_ok());
            if let Some(mb) = &metrics_before {
                let after = crate::kv_route::router::metrics(*p);
                for (metric, label) in [
                    ("continuum_dynamo_repicks_total", "reason"),
                    ("continuum_config_reloads_total", "result"),
                    ("continuum_upstream_errors_total", "class"),
                ] {
                    let d = observe::counter_delta(mb, &after, metric, label);
                    notes.push(format!("{metric} during the row: {d}"));
                }
            }
        }
    }
    let after = observe::snapshot(watched, router_port);
    if fleet.ensure_running().is_err() {
        notes.push("FLEET DOWN: fleet.py or its first frontend exited during the row".into());
    }
    if quoted.is_empty() {
        notes.push("no failed or lost request".into());
    } else {
        notes.push(format!(
            "first {} of {} failed or lost requests (start, duration, class: status and body \
             or error):",
            quoted.len(),
            tally.failed + tally.lost
        ));
        notes.extend(quoted.into_iter().map(|q| format!("  {q}")));
    }
    drop(routed);
    Ok(Row {
        scenario,
        target,
        injected: what,
        tally,
        secs: loaded.secs,
        before,
        after,
        listed,
        routes_after,
        notes,
    })
}

/// Waits at most [`SETTLE`] for the router on `port` to list exactly the `alive` workers;
/// returns (alive ones listed, alive, dead ones listed) at the end.
fn settle(port: u16, alive: &[u64], notes: &mut Vec<String>) -> (usize, usize, usize) {
    let start = Instant::now();
    loop {
        let listed = observe::listed(port).unwrap_or_default();
        let ok = alive.iter().filter(|id| listed.contains(id)).count();
        let dead = listed.iter().filter(|id| !alive.contains(id)).count();
        let exact = ok == alive.len() && dead == 0;
        if exact || start.elapsed() >= SETTLE || crate::signals::interrupted() {
            notes.push(format!(
                "after the load the router listed {ok} of the {} live workers and {dead} dead \
                 one(s) ({} after {:.1} s)",
                alive.len(),
                if exact { "exact" } else { "NOT exact" },
                start.elapsed().as_secs_f64()
            ));
            return (ok, alive.len(), dead);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn header(out: &mut impl Write, o: &FaultsOptions) -> std::io::Result<()> {
    writeln!(
        out,
        "faults: each row on a fresh Dynamo 1.6.1 fleet: {} mocker workers of {MODEL} \
         (--speedup-ratio 1), etcd (--lease-ttl {}; 30 in etcd-restart), 1 frontend (2 in shim-kill); router (1 shard, \
         dynamo.kv on) on CPU 0",
        o.workers, o.lease_ttl_secs,
    )?;
    writeln!(
        out,
        "load: {} concurrent clients, each running conversations of {} turns (seed {}, \
         max_tokens {}, streamed), a fresh conversation after the last turn or a failed one; \
         {} s before the injection, the scenario's tail after it; request timeout {} s",
        o.conversations,
        o.turns,
        o.seed,
        o.max_tokens,
        inject::WARMUP.as_secs(),
        o.request_timeout_secs,
    )?;
    writeln!(
        out,
        "classes: ok = 2xx with [DONE] or usage and no error event; failed = http (non-2xx), \
         sse-error (error event), truncated (ended early), no-response; lost = timed out; slow = \
         ok and > {} s. fds, RSS: the router (dynamo kv row: the frontend) before→after; subs: \
         c connected, t connecting, p pending, b backoff\n",
        classify::SLOW.as_secs(),
    )
}
