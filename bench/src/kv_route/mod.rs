//! `kv-route`: the routing quality of the router's KV-aware picking against Dynamo's own KV
//! router, on a REAL Dynamo 1.6.1 mocker fleet (`--speedup-ratio 1`, so prefill time follows the
//! uncached prompt tokens), with the same seeded multi-turn workload ([`workload`]) in every row:
//!
//! - `dynamo kv`: clients → `dynamo.frontend --router-mode kv`; the worker of each request comes
//!   from that frontend's `route request completed` log line ([`dynamo_log`]);
//! - `router kv`: clients → continuum-router (`dynamo.kv` on, the tiny model's artifacts pinned)
//!   → `dynamo.frontend --router-mode direct`; the worker from `x-continuum-worker-instance-id`,
//!   which the router sends because the clients send an empty `x-backend` ([`router`]);
//! - `pinned`: clients → the direct-mode frontend, conversation `c` pinned to worker `c mod N`:
//!   the reference a client gets by pinning each conversation itself;
//! - `router x2` (`--replicas 2`): clients → nginx (round-robin `upstream`, [`replicas`]) → two
//!   routers configured as the `router kv` row's, each on its own port and CPU → the direct-mode
//!   frontend; every request is its own connection, so nginx alternates replicas per request and
//!   a conversation's turns land on both.
//!
//! Each row runs on a fresh fleet (fleet.py started, loaded, torn down), so no row inherits
//! another's caches. `--rounds N` repeats the three rows, alternating their order. The load
//! ([`load`]) is one client thread per conversation, all concurrent, each sending its turns in
//! order, streamed with `include_usage` ([`stream`]); the report ([`report`]) gives per row the
//! cached share of prompt tokens, the requests per worker and TTFT p50/p99, then the
//! router/dynamo ratios and the targets.
//!
//! Invariants: every child is owned by a [`Supervised`] or a [`Fleet`] and torn down on every
//! exit path (router first, then the fleet); every wait is bounded (fleet and router readiness by
//! the ready timeout, each request by its socket timeout, each row's load by the row timeout);
//! the load is bounded by `conversations × turns` requests per row; all traffic is on 127.0.0.1;
//! exit code 0 only if the `dynamo kv` baseline was measured.

mod broker;
mod dynamo_log;
mod load;
mod replicas;
mod report;
pub(crate) mod router;
pub(crate) mod stream;
pub(crate) mod workload;

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::child::{self, Supervised};
use crate::cpu;
use crate::error::BenchError;
use crate::fleet_hop::check_direct;
use crate::fleet_hop::fleet::{Fleet, FleetInfo, FleetSpec};
use crate::fleet_hop::router::Launch;
use crate::fleet_rows::{KvFleet, Resolved, run_rounds};
use crate::router_probe::decode_selections;
use crate::shim_load;
use crate::tempdir::TempDir;
use load::{LoadSpec, Loaded};
use report::{Kind, Record, RowRun};
use workload::MODEL;

/// The header naming the worker the router picked.
const WORKER_HEADER: &str = "x-continuum-worker-instance-id";
/// The extra frontend arguments of the `dynamo kv` row.
const KV_FRONTEND_ARGS: &str = "--router-mode kv";
/// How long the frontend's log may take to show every request's route line.
const LOG_WAIT: Duration = Duration::from_secs(10);

/// What went wrong in `kv-route` beyond a child or an I/O failure.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KvRouteError {
    /// The baseline row never ran to the end.
    #[error("the `dynamo kv` baseline was not measured: {0}")]
    NoBaseline(String),
}

impl From<KvRouteError> for crate::error::BenchError {
    fn from(e: KvRouteError) -> Self {
        Self::stage(crate::error::Stage::KvRoute, e)
    }
}

/// Options of `kv-route`.
#[derive(Debug, Clone)]
pub(crate) struct KvRouteOptions {
    /// Mocker workers of each fleet.
    pub(crate) workers: u32,
    /// `--speedup-ratio` of the mockers.
    pub(crate) speedup_ratio: u64,
    /// Concurrent conversations (client threads).
    pub(crate) conversations: usize,
    /// Turns per conversation.
    pub(crate) turns: usize,
    /// `max_tokens` of every request.
    pub(crate) max_tokens: u32,
    /// Workload seed.
    pub(crate) seed: u64,
    /// Repetitions of the three rows, alternating their order.
    pub(crate) rounds: u32,
    /// Where the fleet and the router come from.
    pub(crate) fleet: KvFleet,
    /// Socket timeout of every request, seconds.
    pub(crate) request_timeout_secs: u64,
    /// Wall time a row's load may take, seconds.
    pub(crate) row_timeout_secs: u64,
    /// Which rows run.
    pub(crate) rows: Rows,
    /// Router replicas behind nginx in the `router x2` row; 1: no such row.
    pub(crate) replicas: u32,
    /// nginx, the front of the `router x2` row.
    pub(crate) nginx_bin: PathBuf,
    /// Whether the `router x2` replicas share their dispatches (`dynamo.peers`, `--peers`).
    pub(crate) gossip: Gossip,
}

/// Whether router replicas tell each other their dispatches (`dynamo.peers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gossip {
    /// Each replica counts only its own in-flight requests.
    Off,
    /// Each replica also counts the others' (`dynamo.peers` over loopback UDP).
    On,
}

/// The `dynamo.peers` lines of replica `me` among replicas listening on `ports` (a fixed bench
/// key: loopback only).
fn peers_yaml(ports: &[u16], me: usize) -> String {
    let others: Vec<String> = ports
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != me)
        .map(|(_, p)| format!("\"127.0.0.1:{p}\""))
        .collect();
    format!(
        "  peers:\n    listen: \"127.0.0.1:{}\"\n    replicas: [{}]\n    key: \"{}\"\n",
        ports.get(me).copied().unwrap_or(0),
        others.join(", "),
        "6b762d726f7574652d72657069636173"
    )
}

/// Which rows `kv-route` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rows {
    /// `dynamo kv`, `router kv`, `pinned`.
    Standard,
    /// And `router kv, broker` (`--broker`): the router's subscriptions relayed by a real broker.
    WithBroker,
}

impl Default for KvRouteOptions {
    fn default() -> Self {
        Self {
            workers: 4,
            speedup_ratio: 1,
            conversations: 8,
            turns: 8,
            max_tokens: 16,
            seed: 1,
            rounds: 1,
            fleet: KvFleet::default(),
            request_timeout_secs: 60,
            row_timeout_secs: 600,
            rows: Rows::Standard,
            replicas: 1,
            gossip: Gossip::Off,
            nginx_bin: PathBuf::from("nginx"),
        }
    }
}

impl KvRouteOptions {
    /// The CI smoke sizes: 2 turns of 4 conversations.
    pub(crate) fn quick(&mut self) {
        self.turns = 2;
        self.conversations = 4;
    }
}

/// Everything a row needs besides its kind and round.
struct Setup<'a> {
    opts: &'a KvRouteOptions,
    python: PathBuf,
    /// The router binary and the pinned digests, or why the router row cannot run.
    router: Result<(PathBuf, Vec<String>), String>,
    dir: TempDir,
    fleet_cpus: Vec<usize>,
}

/// Runs the benchmark and prints the report on stdout.
pub(crate) fn run(opts: &KvRouteOptions) -> Result<(), BenchError> {
    let Resolved { python, router } = opts.fleet.resolve()?;
    let setup = Setup {
        opts,
        python,
        router,
        dir: TempDir::new()?,
        fleet_cpus: (0..child::available_cpus().max(1)).collect(),
    };
    let mut out = std::io::stdout().lock();
    header(&mut out, &setup).map_err(BenchError::io("writing the report"))?;
    let (rows, missing) = run_rounds(
        "kv-route",
        opts.rounds,
        |round| report::round_order(round, opts.rows == Rows::WithBroker, opts.replicas > 1),
        Kind::label,
        |kind, round| run_row(&setup, kind, round),
    )?;
    report::render(&mut out, &rows, &missing).map_err(BenchError::io("writing the report"))?;
    match missing.iter().find(|(k, _)| *k == Kind::Dynamo) {
        Some((_, why)) => Err(KvRouteError::NoBaseline(why.clone()).into()),
        None => Ok(()),
    }
}

/// One row on a fresh fleet: start it (and the router), load it, attribute every request to
/// its worker, tear everything down.
fn run_row(setup: &Setup<'_>, kind: Kind, round: u32) -> Result<RowRun, BenchError> {
    let opts = setup.opts;
    let router_parts = match (kind, &setup.router) {
        (Kind::Router | Kind::RouterBroker | Kind::RouterX2, Ok(parts)) => Some(parts),
        (Kind::Router | Kind::RouterBroker | Kind::RouterX2, Err(why)) => {
            return Err(BenchError::io("starting the router")(
                std::io::Error::other(why.clone()),
            ));
        }
        _ => None,
    };
    let ready = Duration::from_secs(opts.fleet.ready_timeout_secs);
    let log = setup.dir.path().join(format!(
        "fleet-{}-{round}.log",
        kind.label().replace(' ', "-")
    ));
    let mut fleet = Fleet::start(&FleetSpec {
        python: &setup.python,
        script: &opts.fleet.fleet_script,
        model: MODEL,
        workers: opts.workers,
        speedup_ratio: opts.speedup_ratio,
        frontend_args: if kind == Kind::Dynamo {
            KV_FRONTEND_ARGS
        } else {
            ""
        },
        cpus: &setup.fleet_cpus,
        ready_timeout: ready,
        log: &log,
    })?;
    let info = fleet.info().clone();
    let ids: Vec<u64> = info.workers.iter().map(|w| w.instance_id).collect();
    let probe_body = shim_load::chat_body(MODEL, 1);
    let worker_pins = shim_load::decimal_pins(ids.iter().copied());
    let mut notes = Vec::new();
    // Declared after `fleet`, so dropped (stopped) before the fleet's teardown; the broker
    // before the router is declared, so it outlives it.
    let mut relay: Option<Supervised> = None;
    let mut routed: Vec<(Supervised, u16)> = Vec::new();
    // The `router x2` row's nginx: declared after the routers, so stopped before them.
    let mut front: Option<Supervised> = None;
    let (port, pins, worker_header) = match kind {
        Kind::Dynamo => {
            check_direct(&info, &[Vec::new()], &probe_body, ready)?;
            (info.frontend_port, Vec::new(), None)
        }
        Kind::Pinned => {
            check_direct(&info, &worker_pins, &probe_body, ready)?;
            notes.push(format!(
                "conversation c pinned to worker c mod {} ({} + {} 0)",
                ids.len(),
                shim_load::WORKER_PIN,
                shim_load::DP_RANK_PIN
            ));
            (info.frontend_port, worker_pins, None)
        }
        Kind::Router | Kind::RouterBroker | Kind::RouterX2 => {
            let Some((bin, pinned)) = router_parts else {
                return Err(BenchError::io("starting the router")(
                    std::io::Error::other("no router binary"),
                ));
            };
            check_direct(&info, &worker_pins, &probe_body, ready)?;
            let name = format!("router-{}-{round}", kind.label().replace([' ', ','], "-"));
            // The broker row: the listener's config, and the broker (it dials until the router
            // listens); the router is ready once every kv-events subscription is connected,
            // which over a broker means relayed.
            let prepared = match kind {
                Kind::RouterBroker => Some(broker::prepare(&setup.dir, &name)?),
                _ => None,
            };
            if let Some(p) = &prepared {
                relay = Some(broker::start(
                    p,
                    &info,
                    &setup.dir,
                    &format!("{name}-broker"),
                    &setup.fleet_cpus,
                )?);
                notes.push(
                    "dynamo.load.transport: broker; kv_metrics and kv-events relayed by \
                     continuum-event-broker (etcd discovery) over TLS 1.3 + HTTP/2 on loopback"
                        .to_owned(),
                );
            }
            eprintln!("kv-route: starting the router and waiting for discovery and KV ...");
            let dynamo_extra = prepared.as_ref().map_or("", |p| p.dynamo_extra.as_str());
            let load_extra = prepared.as_ref().map_or("", |p| p.load_extra);
            let launch = Launch {
                bin,
                dir: &setup.dir,
                cpu: 0,
                fleet: &info,
                model: MODEL,
                chat_body: &probe_body,
                ready,
                dynamo_extra,
                load_extra,
                name: &name,
            };
            // An `x-backend` (even empty) makes the router name the picked worker (SHIM-15).
            let disclose = vec![vec![("x-backend", String::new())]];
            if kind == Kind::RouterX2 {
                // The same router config per replica, each on its own port and CPU.
                let cpus = child::available_cpus().max(1);
                let gossip_ports = (0..opts.replicas)
                    .map(|_| crate::probe::free_port())
                    .collect::<Result<Vec<u16>, _>>()?;
                for i in 0..opts.replicas as usize {
                    let name = format!("{name}-r{}", i + 1);
                    let extra = match opts.gossip {
                        Gossip::Off => dynamo_extra.to_owned(),
                        Gossip::On => format!("{dynamo_extra}{}", peers_yaml(&gossip_ports, i)),
                    };
                    routed.push(router::start(
                        Launch {
                            cpu: i % cpus,
                            name: &name,
                            dynamo_extra: &extra,
                            ..launch
                        },
                        pinned,
                    )?);
                }
                if opts.gossip == Gossip::On {
                    notes.push(format!(
                        "the replicas share their dispatches (dynamo.peers, UDP ports {gossip_ports:?})"
                    ));
                }
                let ports: Vec<u16> = routed.iter().map(|(_, p)| *p).collect();
                eprintln!(
                    "kv-route: starting nginx in front of the {} replicas ...",
                    ports.len()
                );
                let (nginx, port) = replicas::start(
                    &opts.nginx_bin,
                    &setup.dir,
                    &ports,
                    &setup.fleet_cpus,
                    &probe_body,
                    WORKER_HEADER,
                    ready,
                )?;
                front = Some(nginx);
                notes.push(format!(
                    "{} router replicas (ports {ports:?}, CPUs 0..{}) behind nginx round robin on \
                     port {port}, one connection per request",
                    ports.len(),
                    ports.len().min(cpus) - 1,
                ));
                (port, disclose, Some(WORKER_HEADER))
            } else {
                let (r, port) = router::start(launch, pinned)?;
                routed.push((r, port));
                (port, disclose, Some(WORKER_HEADER))
            }
        }
    };
    let before: Vec<String> = routed.iter().map(|(_, p)| router::metrics(*p)).collect();
    // CPU of the frontend (and the routers) over the load: what each hop costs per request.
    let cpu_of = |pid: i32| crate::cpu::tree(pid).ok();
    let routers_cpu = |routed: &[(Supervised, u16)]| -> Option<crate::cpu::CpuTime> {
        if routed.is_empty() {
            return None;
        }
        routed
            .iter()
            .try_fold(crate::cpu::CpuTime::default(), |acc, (r, _)| {
                let c = cpu_of(r.pid())?;
                Some(crate::cpu::CpuTime {
                    user: acc.user + c.user,
                    system: acc.system + c.system,
                })
            })
    };
    let cpu_before = (cpu_of(info.frontend_pid), routers_cpu(&routed));
    let loaded = load::run(&LoadSpec {
        port,
        pins: &pins,
        worker_header,
        seed: opts.seed,
        conversations: opts.conversations,
        turns: opts.turns,
        max_tokens: opts.max_tokens,
        io_timeout: Duration::from_secs(opts.request_timeout_secs),
        deadline: Instant::now() + Duration::from_secs(opts.row_timeout_secs),
    });
    if crate::signals::interrupted() {
        return Err(BenchError::Interrupted);
    }
    let cpu_after = (cpu_of(info.frontend_pid), routers_cpu(&routed));
    fleet.ensure_running()?;
    for (r, _) in &mut routed {
        r.ensure_running()?;
    }
    if let Some(n) = &mut front {
        n.ensure_running()?;
    }
    if let Some(b) = &mut relay {
        b.ensure_running()?;
    }
    let (note, picker_cpu_us) = cpu_note(kind, loaded.sent.len(), cpu_before, cpu_after);
    notes.push(note);
    let records = match kind {
        Kind::Dynamo => dynamo_records(&loaded, &info, &mut notes),
        Kind::Router | Kind::RouterBroker | Kind::RouterX2 => {
            for (i, ((_, p), before)) in routed.iter().zip(&before).enumerate() {
                let note = router_note(before, &router::metrics(*p));
                notes.push(match kind {
                    Kind::RouterX2 => format!("replica {} (port {p}): {note}", i + 1),
                    _ => note,
                });
            }
            records(&loaded, |s| {
                s.out.header.as_deref().and_then(|h| h.parse().ok())
            })
        }
        Kind::Pinned => records(&loaded, |s| ids.get(s.conversation % ids.len()).copied()),
    };
    drop(front);
    drop(routed);
    drop(relay);
    Ok(RowRun {
        picker_cpu_us,
        kind,
        round,
        workers: ids,
        records,
        errors: loaded.errors,
        secs: loaded.secs,
        notes,
    })
}

/// CPU per request of the frontend and, in the router row, of the router (the process trees'
/// user + system time over the load, divided by the requests sent); with the figure of the hop
/// that picks (Dynamo's KV frontend, or the router).
fn cpu_note(
    kind: Kind,
    requests: usize,
    before: (Option<crate::cpu::CpuTime>, Option<crate::cpu::CpuTime>),
    after: (Option<crate::cpu::CpuTime>, Option<crate::cpu::CpuTime>),
) -> (String, Option<f64>) {
    let per = |b: Option<crate::cpu::CpuTime>, a: Option<crate::cpu::CpuTime>| {
        Some(a?.since(b?).total() * 1e6 / requests.max(1) as f64)
    };
    let frontend = per(before.0, after.0);
    let router = per(before.1, after.1);
    let fe = match kind {
        Kind::Dynamo => "frontend (--router-mode kv)",
        Kind::Router | Kind::RouterBroker | Kind::RouterX2 | Kind::Pinned => {
            "frontend (--router-mode direct)"
        }
    };
    let us = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{v:.0} us"));
    let picker = match kind {
        Kind::Dynamo => frontend,
        Kind::Router | Kind::RouterBroker | Kind::RouterX2 => router,
        Kind::Pinned => None,
    };
    let note = match (kind, router, frontend) {
        (Kind::Router | Kind::RouterBroker | Kind::RouterX2, Some(r), Some(f)) if f > 0.0 => {
            format!(
                "CPU per request: {} {} ({:.2}x the {fe} behind it, {})",
                if kind == Kind::RouterX2 {
                    "routers (both replicas together)"
                } else {
                    "router"
                },
                us(Some(r)),
                r / f,
                us(Some(f))
            )
        }
        _ => format!("CPU per request: {fe} {}", us(frontend)),
    };
    (note, picker)
}

/// The records of `loaded`, each request's worker given by `worker`.
fn records(loaded: &Loaded, worker: impl Fn(&load::Sent) -> Option<u64>) -> Vec<Record> {
    loaded
        .sent
        .iter()
        .map(|s| Record {
            conversation: s.conversation,
            turn: s.turn,
            ttft: s.out.ttft,
            prompt_tokens: s.out.prompt_tokens.unwrap_or(0),
            cached_tokens: s.out.cached_tokens.unwrap_or(0),
            worker: worker(s),
        })
        .collect()
}

/// The `dynamo kv` row's records: each response id looked up in the frontend's route lines
/// (re-read until all are there, at most [`LOG_WAIT`]).
fn dynamo_records(loaded: &Loaded, info: &FleetInfo, notes: &mut Vec<String>) -> Vec<Record> {
    let deadline = Instant::now() + LOG_WAIT;
    let routes = loop {
        let routes = dynamo_log::read(&info.frontend_log);
        let map = dynamo_log::by_request_id(&routes);
        let all = loaded
            .sent
            .iter()
            .all(|s| want(s).is_some_and(|id| map.contains_key(id)));
        if all || Instant::now() >= deadline {
            break routes;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let map = dynamo_log::by_request_id(&routes);
    let found: HashMap<&str, (u64, Option<u64>)> = loaded
        .sent
        .iter()
        .filter_map(|s| {
            let id = want(s)?;
            let r = map.get(id)?;
            Some((id, (r.worker_id, r.overlap_blocks)))
        })
        .collect();
    let overlaps: Vec<u64> = found.values().filter_map(|(_, o)| *o).collect();
    notes.push(format!(
        "{} of {} requests matched a `route request completed` line of the frontend's log \
         ({} lines); overlap_blocks mean {:.1}",
        found.len(),
        loaded.sent.len(),
        routes.len(),
        crate::numbers::per(overlaps.iter().sum::<u64>() as f64, overlaps.len() as f64),
    ));
    records(loaded, |s| found.get(want(s)?).map(|(w, _)| *w))
}

/// The frontend's request id of an answered request (its chunks' `id` without `chatcmpl-`).
fn want(s: &load::Sent) -> Option<&str> {
    s.out.id.as_deref().map(dynamo_log::request_id)
}

/// What the router's counters say about the load's picks (`before` and `after` are metrics
/// texts taken around the load).
fn router_note(before: &str, after: &str) -> String {
    const SEL: &str = "continuum_dynamo_kv_selection_total";
    let sel = router::delta(
        &router::counters(after, SEL),
        &router::counters(before, SEL),
    );
    let dec = router::delta(&decode_selections(after), &decode_selections(before));
    let total: u64 = dec.iter().map(|(_, n)| n).sum();
    let kv_aware = dec
        .iter()
        .find(|(r, _)| r == "kv_aware")
        .map_or(0, |(_, n)| *n);
    format!(
        "KV-aware picks {kv_aware} of {total} decode picks ({:.1}%); {SEL} during the load: {}; \
         decode picks: {}",
        100.0 * crate::numbers::per(kv_aware as f64, total as f64),
        router::pairs_text(&sel),
        router::pairs_text(&dec),
    )
}

fn header(out: &mut impl Write, s: &Setup<'_>) -> std::io::Result<()> {
    let o = s.opts;
    let cpus = match s.fleet_cpus.as_slice() {
        [one] => format!("CPU {one}"),
        all => format!("CPUs 0-{}", all.len() - 1),
    };
    writeln!(
        out,
        "kv-route: a fresh Dynamo 1.6.1 fleet per row: {} mocker workers of {MODEL} \
         (--speedup-ratio {}, block size 64), etcd, 1 frontend; fleet on {cpus}, router \
         (1 shard) on CPU 0, clients unpinned",
        o.workers, o.speedup_ratio,
    )?;
    writeln!(
        out,
        "workload: {} conversations x {} turns, seed {}: one client thread per conversation, \
         all concurrent; a distinct ~1,000-token system prompt, then per turn a ~50-150-token \
         user message and the answer; max_tokens {}; streamed with include_usage; {} round(s), \
         row order alternating",
        o.conversations, o.turns, o.seed, o.max_tokens, o.rounds,
    )?;
    writeln!(
        out,
        "rows: dynamo kv = dynamo.frontend {KV_FRONTEND_ARGS} (worker from its log); router kv = \
         continuum-router (dynamo.kv on, tokenizer.json + tokenizer_config.json pinned) -> \
         dynamo.frontend --router-mode direct (worker from {WORKER_HEADER}, the clients sending an empty x-backend); pinned = the direct \
         frontend, conversation c pinned to worker c mod {}",
        o.workers,
    )?;
    if o.replicas > 1 {
        writeln!(
            out,
            "router x2 = {} router kv replicas (the same config, each its own port and CPU) \
             behind nginx round robin (one connection per request, so turns alternate \
             replicas), the worker from {WORKER_HEADER} as nginx relays it",
            o.replicas
        )?;
    }
    if o.rows == Rows::WithBroker {
        writeln!(
            out,
            "router kv, broker = the router kv row with dynamo.load.transport: broker: its \
             kv_metrics and kv-events subscriptions relayed by a real continuum-event-broker \
             (etcd discovery, on the fleet's CPUs) through the router's event bus listener"
        )?;
    }
    writeln!(
        out,
        "TTFT = request written -> first SSE event with non-empty delta content; cached share = \
         sum cached_tokens / sum prompt_tokens (usage chunk); 1-min loadavg at start: {}",
        cpu::loadavg().map_or("?".into(), |l| format!("{l:.2}")),
    )
}
