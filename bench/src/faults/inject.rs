//! The scenarios of `faults` and their injections, each run on the driver's thread while the
//! load runs on its own: wait [`WARMUP`], inject, wait the scenario's tail, then the load is
//! told to stop.
//!
//! Invariants: every injection is bounded (each fleet.py command by [`COMMAND`], each sleep
//! by its length, checking for an interrupt every 100 ms); a process the bench stops
//! (SIGSTOP) is continued (SIGCONT) on every path that returns, errors included; signals go
//! only to the fleet's processes (through fleet.py, or by the pid fleet.py reported) and to
//! the router the bench started.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::error::BenchError;
use crate::fleet_hop::fleet::Fleet;
use crate::probe;

/// Load before the injection.
pub(crate) const WARMUP: Duration = Duration::from_secs(3);
/// How long one fleet.py command may take (a SIGKILL'd worker is awaited up to 10 s).
const COMMAND: Duration = Duration::from_secs(20);
/// How long `worker-stop` keeps the worker stopped.
const STOP_FOR: Duration = Duration::from_secs(10);
/// How long fleet.py's `add` may take (a mocker's start and registration).
const ADD: Duration = Duration::from_secs(60);
/// How long `etcd-restart` leaves etcd down.
const ETCD_DOWN: Duration = Duration::from_secs(3);
/// The least lease TTL of `etcd-restart`'s fleet (Dynamo's default).
const ETCD_RESTART_TTL: u64 = 30;
/// Keys `etcd-compact` writes before compacting.
const BURST_KEYS: usize = 1000;
/// SIGHUPs of `reload-storm`, and their interval.
const RELOADS: (usize, Duration) = (100, Duration::from_millis(50));

/// One fault scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scenario {
    /// SIGKILL one worker mid-load.
    WorkerKill,
    /// SIGSTOP one worker for 10 s, then SIGCONT.
    WorkerStop,
    /// SIGKILL one of two frontends of the router's shim pool mid-stream.
    ShimKill,
    /// SIGKILL etcd, restart it 3 s later on the same data dir and ports.
    EtcdRestart,
    /// A burst of unrelated keys, then a physical compaction past the current revision.
    EtcdCompact,
    /// One worker stopped and continued every second (its publishers flap).
    PublisherFlap,
    /// 100 SIGHUPs to the router, one every 50 ms.
    ReloadStorm,
}

/// Which client-facing hop a row loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// Clients → `dynamo.frontend --router-mode kv`.
    Dynamo,
    /// Clients → continuum-router (`dynamo.kv` on) → direct-mode frontend(s).
    Router,
}

impl Target {
    /// The row's name.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Target::Dynamo => "dynamo kv",
            Target::Router => "router",
        }
    }
}

impl Scenario {
    /// Every scenario, in run order.
    pub(crate) const ALL: [Scenario; 7] = [
        Scenario::WorkerKill,
        Scenario::WorkerStop,
        Scenario::ShimKill,
        Scenario::EtcdRestart,
        Scenario::EtcdCompact,
        Scenario::PublisherFlap,
        Scenario::ReloadStorm,
    ];

    /// The `--scenario` name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Scenario::WorkerKill => "worker-kill",
            Scenario::WorkerStop => "worker-stop",
            Scenario::ShimKill => "shim-kill",
            Scenario::EtcdRestart => "etcd-restart",
            Scenario::EtcdCompact => "etcd-compact",
            Scenario::PublisherFlap => "publisher-flap",
            Scenario::ReloadStorm => "reload-storm",
        }
    }

    /// The scenario named `name`.
    pub(crate) fn parse(name: &str) -> Option<Scenario> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The rows it runs (each on a fresh fleet).
    pub(crate) fn targets(self) -> &'static [Target] {
        match self {
            Scenario::WorkerKill => &[Target::Dynamo, Target::Router],
            _ => &[Target::Router],
        }
    }

    /// Frontends per namespace of its fleet.
    pub(crate) fn frontends(self) -> u32 {
        if self == Scenario::ShimKill { 2 } else { 1 }
    }

    /// The fleet's `--lease-ttl` given `--lease-ttl` `default`: `etcd-restart` needs leases that
    /// outlive etcd's outage (at least Dynamo's default, 30 s), or every Dynamo process exits
    /// when its lease keepalive fails, and the row only shows the fleet gone.
    pub(crate) fn lease_ttl(self, default: u64) -> u64 {
        match self {
            Scenario::EtcdRestart => default.max(ETCD_RESTART_TTL),
            _ => default,
        }
    }

    /// Load after the injection, before the load is told to stop.
    pub(crate) fn tail(self) -> Duration {
        Duration::from_secs(match self {
            Scenario::WorkerKill => 6,
            Scenario::EtcdRestart => 10,
            _ => 5,
        })
    }

    /// The longest its injection may take (for the load's deadline).
    pub(crate) fn longest(self, flap: Duration) -> Duration {
        match self {
            Scenario::WorkerStop => STOP_FOR + 2 * COMMAND,
            Scenario::EtcdRestart => ETCD_DOWN + 2 * COMMAND + ADD,
            Scenario::EtcdCompact => COMMAND * 2 + ADD,
            Scenario::PublisherFlap => flap + COMMAND * 2,
            Scenario::ReloadStorm => RELOADS.1 * RELOADS.0 as u32 + COMMAND,
            _ => COMMAND * 2,
        }
    }
}

/// What an injection can reach.
pub(crate) struct Ctx<'a> {
    /// The fleet (its stdin commands).
    pub(crate) fleet: &'a mut Fleet,
    /// The router's pid, in router rows.
    pub(crate) router_pid: Option<i32>,
    /// `--flap-secs`.
    pub(crate) flap: Duration,
    /// When the load started.
    pub(crate) start: Instant,
}

/// What was injected: a short text for the table, and details for the notes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Injected {
    /// E.g. `SIGKILL worker 1 @3.0s`.
    pub(crate) what: String,
    /// Details.
    pub(crate) notes: Vec<String>,
}

/// Sleeps `d`, waking every 100 ms to check for an interrupt.
pub(crate) fn pause(d: Duration) -> Result<(), BenchError> {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if crate::signals::interrupted() {
            return Err(BenchError::Interrupted);
        }
        std::thread::sleep((until - Instant::now()).min(Duration::from_millis(100)));
    }
    Ok(())
}

/// Waits [`WARMUP`], then injects `scenario`'s fault.
pub(crate) fn run(scenario: Scenario, ctx: &mut Ctx<'_>) -> Result<Injected, BenchError> {
    pause(WARMUP)?;
    let at = |ctx: &Ctx<'_>| ctx.start.elapsed().as_secs_f64();
    let worker = first_worker(ctx.fleet)?;
    match scenario {
        Scenario::WorkerKill => {
            let t = at(ctx);
            let r = ctx
                .fleet
                .command(&format!("kill {worker} SIGKILL"), COMMAND)?;
            Ok(Injected {
                what: format!("SIGKILL worker 1 @{t:.1}s"),
                notes: vec![format!(
                    "SIGKILL to worker {worker} (pid {}) at {t:.1} s into the load; exit {}",
                    r["pid"], r["exit"]
                )],
            })
        }
        Scenario::WorkerStop => {
            let t = at(ctx);
            ctx.fleet
                .command(&format!("kill {worker} SIGSTOP"), COMMAND)?;
            let slept = pause(STOP_FOR);
            let cont = ctx
                .fleet
                .command(&format!("kill {worker} SIGCONT"), COMMAND);
            slept?;
            cont?;
            Ok(Injected {
                what: format!("SIGSTOP worker 1 {}s @{t:.1}s", STOP_FOR.as_secs()),
                notes: vec![format!(
                    "SIGSTOP to worker {worker} at {t:.1} s, SIGCONT at {:.1} s",
                    at(ctx)
                )],
            })
        }
        Scenario::ShimKill => shim_kill(ctx, at(ctx)),
        Scenario::EtcdRestart => {
            let t = at(ctx);
            let k = ctx.fleet.command("etcd kill SIGKILL", COMMAND)?;
            pause(ETCD_DOWN)?;
            let r = ctx.fleet.command("etcd restart", COMMAND)?;
            let added = add_worker(ctx)?;
            Ok(Injected {
                what: format!(
                    "SIGKILL etcd, restart +{}s, add worker @{t:.1}s",
                    ETCD_DOWN.as_secs()
                ),
                notes: vec![
                    format!(
                        "etcd (pid {}) SIGKILLed at {t:.1} s (exit {}); restarted {} s later on the \
                     same data dir and ports as pid {}, healthy after {} s",
                        k["pid"],
                        k["exit"],
                        ETCD_DOWN.as_secs(),
                        r["pid"],
                        r["secs"]
                    ),
                    added,
                ],
            })
        }
        Scenario::EtcdCompact => etcd_compact(ctx, at(ctx)),
        Scenario::PublisherFlap => {
            let t = at(ctx);
            let until = Instant::now() + ctx.flap;
            let mut stops = 0;
            while Instant::now() < until {
                ctx.fleet
                    .command(&format!("kill {worker} SIGSTOP"), COMMAND)?;
                stops += 1;
                let slept = pause(Duration::from_secs(1));
                ctx.fleet
                    .command(&format!("kill {worker} SIGCONT"), COMMAND)?;
                slept?;
                pause(Duration::from_secs(1))?;
            }
            Ok(Injected {
                what: format!("SIGSTOP/SIGCONT worker 1 every 1s x{stops} @{t:.1}s"),
                notes: vec![format!(
                    "worker {worker} stopped 1 s, continued 1 s, {stops} times from {t:.1} s \
                     ({} s): its kv_metrics and kv-events publishers (and its lease keepalive and \
                     requests) stall while stopped",
                    ctx.flap.as_secs()
                )],
            })
        }
        Scenario::ReloadStorm => {
            let Some(pid) = ctx.router_pid else {
                return Err(BenchError::Setup("reload-storm needs the router".into()));
            };
            let t = at(ctx);
            let mut sent = 0;
            for _ in 0..RELOADS.0 {
                // SAFETY: kill has no memory-safety preconditions; `pid` is the router the
                // bench started and still owns (unreaped), so it cannot have been recycled.
                if unsafe { libc::kill(pid, libc::SIGHUP) } == 0 {
                    sent += 1;
                }
                pause(RELOADS.1)?;
            }
            Ok(Injected {
                what: format!(
                    "{sent} SIGHUP to router, 1/{}ms @{t:.1}s",
                    RELOADS.1.as_millis()
                ),
                notes: vec![format!(
                    "{sent} of {} SIGHUPs delivered to the router (pid {pid}) from {t:.1} s to \
                     {:.1} s",
                    RELOADS.0,
                    at(ctx)
                )],
            })
        }
    }
}

/// The instance id of the fleet's first worker.
fn first_worker(fleet: &Fleet) -> Result<u64, BenchError> {
    fleet
        .info()
        .workers
        .first()
        .map(|w| w.instance_id)
        .ok_or_else(|| BenchError::Setup("the fleet has no worker".into()))
}

/// The frontends of the fleet's namespace as fleet.py's `status` reports them: (url, pid, alive).
pub(crate) fn frontends(fleet: &mut Fleet) -> Result<Vec<(String, i32, bool)>, BenchError> {
    let ns = fleet.info().namespace.clone();
    let status = fleet.command("status", COMMAND)?;
    Ok(frontends_of(&status, &ns))
}

/// The frontends serving `ns` in a `status` reply.
pub(crate) fn frontends_of(status: &Value, ns: &str) -> Vec<(String, i32, bool)> {
    status["fleet"]["frontend_processes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["namespace"] == ns)
        .filter_map(|f| {
            Some((
                f["url"].as_str()?.to_owned(),
                i32::try_from(f["pid"].as_i64()?).ok()?,
                f["alive"].as_bool().unwrap_or(true),
            ))
        })
        .collect()
}

/// The instance ids of the workers alive in a `status` reply.
pub(crate) fn alive_workers(status: &Value) -> Vec<u64> {
    status["fleet"]["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| w["alive"] == true)
        .filter_map(|w| w["instance_id"].as_u64())
        .collect()
}

/// SIGKILL to the second frontend of the namespace (the first is the one the fleet wrapper
/// watches), by the pid fleet.py reported.
fn shim_kill(ctx: &mut Ctx<'_>, t: f64) -> Result<Injected, BenchError> {
    let fes = frontends(ctx.fleet)?;
    let Some((url, pid, true)) = fes.get(1).cloned() else {
        return Err(BenchError::Setup(format!(
            "shim-kill needs a second live frontend; fleet.py reports {fes:?}"
        )));
    };
    // SAFETY: kill has no memory-safety preconditions; `pid` is a frontend fleet.py reports
    // alive a moment ago (fleet.py, its parent, has not reaped it).
    let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
    if rc != 0 {
        return Err(BenchError::io(format!("SIGKILL to frontend {pid}"))(
            std::io::Error::last_os_error(),
        ));
    }
    Ok(Injected {
        what: format!("SIGKILL frontend 2 of 2 @{t:.1}s"),
        notes: vec![format!(
            "SIGKILL to frontend 2 of the shim pool ({url}, pid {pid}) at {t:.1} s"
        )],
    })
}

/// [`BURST_KEYS`] unrelated keys through etcd's v3 gateway, then a physical compaction at the
/// revision of the last one.
fn etcd_compact(ctx: &mut Ctx<'_>, t: f64) -> Result<Injected, BenchError> {
    let endpoint = ctx.fleet.info().etcd_endpoint.clone();
    let port: u16 = endpoint
        .strip_prefix("http://127.0.0.1:")
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .ok_or_else(|| BenchError::Setup(format!("etcd endpoint {endpoint} is not loopback")))?;
    let b64 = |s: &str| base64_encode(s.as_bytes());
    let post = |path: &str, body: &Value| -> Result<Value, BenchError> {
        let r = probe::request(port, "POST", path, &[], &body.to_string())
            .map_err(BenchError::io(format!("POST {path} to etcd")))?;
        if r.status != 200 {
            return Err(BenchError::Setup(format!(
                "etcd {path} answered {}: {}",
                r.status,
                r.text()
            )));
        }
        serde_json::from_slice(&r.body)
            .map_err(|e| BenchError::Setup(format!("etcd {path}: not JSON: {e}")))
    };
    let mut revision = 0u64;
    for i in 0..BURST_KEYS {
        let v = post(
            "/v3/kv/put",
            &json!({"key": b64(&format!("continuum-faults/burst/{i:05}")), "value": b64(&"x".repeat(64))}),
        )?;
        revision = v["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .or_else(|| v["header"]["revision"].as_u64())
            .unwrap_or(revision);
    }
    post(
        "/v3/kv/compaction",
        &json!({"revision": revision.to_string(), "physical": true}),
    )?;
    let compacted = ctx.start.elapsed().as_secs_f64();
    let added = add_worker(ctx)?;
    Ok(Injected {
        what: format!("{BURST_KEYS} etcd puts + compact, add worker @{t:.1}s"),
        notes: vec![
            format!(
                "{BURST_KEYS} unrelated keys put from {t:.1} s to {:.1} s, then compacted at revision \
             {revision} (physical): every watch revision before it is compacted away",
                compacted
            ),
            added,
        ],
    })
}

/// One more worker through fleet.py's `add`, after the fault: the router should list it (its
/// discovery still watches etcd).
fn add_worker(ctx: &mut Ctx<'_>) -> Result<String, BenchError> {
    let model = crate::kv_route::workload::MODEL;
    let t = ctx.start.elapsed().as_secs_f64();
    let r = ctx.fleet.command(&format!("add {model}"), ADD)?;
    Ok(format!(
        "worker {} added at {t:.1} s (registered at {:.1} s): the router must list it too",
        r["worker"]["instance_id"],
        ctx.start.elapsed().as_secs_f64()
    ))
}

/// Standard base64 with padding (etcd's gateway takes keys and values so).
pub(crate) fn base64_encode(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(A[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_names_round_trip() {
        for s in Scenario::ALL {
            assert_eq!(Scenario::parse(s.name()), Some(s));
        }
        assert_eq!(Scenario::parse("nope"), None);
        assert_eq!(Scenario::WorkerKill.targets().len(), 2);
        assert_eq!(Scenario::ShimKill.frontends(), 2);
    }

    #[test]
    fn base64_as_etcd_wants_it() {
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_encode(b"f"), "Zg==");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_encode(b"foo"), "Zm9v");
        assert_eq!(base64_encode(b"v1/instances/"), "djEvaW5zdGFuY2VzLw==");
    }

    #[test]
    fn reads_frontends_and_live_workers_from_status() {
        let status = json!({"ok": true, "cmd": "status", "fleet": {
            "frontend_processes": [
                {"url": "http://127.0.0.1:1", "namespace": "agg", "pid": 10, "alive": true},
                {"url": "http://127.0.0.1:2", "namespace": "agg", "pid": 11, "alive": false},
                {"url": "http://127.0.0.1:3", "namespace": "other", "pid": 12, "alive": true}],
            "workers": [
                {"instance_id": 5, "alive": true}, {"instance_id": 6, "alive": false},
                {"instance_id": null, "alive": true}]}});
        assert_eq!(
            frontends_of(&status, "agg"),
            vec![
                ("http://127.0.0.1:1".to_owned(), 10, true),
                ("http://127.0.0.1:2".to_owned(), 11, false)
            ]
        );
        assert_eq!(alive_workers(&status), vec![5]);
    }
}
