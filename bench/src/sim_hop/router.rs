//! The router of `sim-hop`: its config (one shard, file-store discovery of
//! the simulated fleet, the sim shim as its internal shim backend), its
//! start, and the staged wait until it is ready to be measured: every worker
//! discovered, every kv_metrics subscription connected, every worker's load
//! sample fresh, and one chat completion served through the shim path.
//!
//! Invariants: the router is pinned to one CPU (shard and control thread
//! included); each stage is timed and bounded by one shared deadline; a
//! stage that does not pass says how far it got, with the router's open
//! descriptors against its RLIMIT_NOFILE, so an fd limit shows as such.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::fleet::{MODEL, NAMESPACE};
use crate::child::Supervised;
use crate::error::BenchError;
use crate::probe;
use crate::router_probe::{self, discovered, shim_answers, wait_for};
use crate::servers::router_command;
use crate::tempdir::TempDir;

/// Router YAML: `port` on loopback, one shard on `cpu`, file-store
/// discovery under `root`, the sim shim at `shim` as the shim backend.
pub(crate) fn yaml(port: u16, cpu: usize, root: &Path, shim: SocketAddr) -> String {
    // A JSON string is a valid YAML double-quoted scalar.
    let root = Value::String(root.to_string_lossy().into_owned()).to_string();
    let server = router_probe::server_yaml(port, cpu);
    format!(
        "{server}backends:
  - name: sim-shim
    type: openai
    url: \"http://{shim}\"
    models: [\"{MODEL}\"]
    internal: true
disaggregated_serving: {{ enabled: true, fallback_to_unified: false }}
dynamo:
  enabled: true
  discovery:
    source: file
    file:
      root: {root}
      namespaces: [\"{NAMESPACE}\"]
  load:
    direct_allow_cidrs: [\"127.0.0.0/8\"]
  shim:
    backends: [sim-shim]
"
    )
}

/// How long each readiness stage took from the router's start, and its
/// descriptors once ready.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Ready {
    /// The router's log.
    pub(crate) log: PathBuf,
    /// `GET /health` answered 200.
    pub(crate) health: Duration,
    /// `/admin/dynamo/workers` listed every worker.
    pub(crate) discovered: Duration,
    /// Every kv_metrics subscription connected.
    pub(crate) subscribed: Duration,
    /// Every worker's load sample fresh.
    pub(crate) fresh: Duration,
    /// A chat completion came back through the shim path.
    pub(crate) answered: Duration,
    /// The router's descriptors once ready.
    pub(crate) fds: Option<Fds>,
}

/// A process's open descriptors and soft RLIMIT_NOFILE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fds {
    /// Entries of `/proc/<pid>/fd`.
    pub(crate) open: usize,
    /// Soft "Max open files" of `/proc/<pid>/limits`.
    pub(crate) soft: u64,
}

impl std::fmt::Display for Fds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} fds open, soft RLIMIT_NOFILE {}",
            self.open, self.soft
        )
    }
}

/// `pid`'s open descriptors and soft limit, if readable.
pub(crate) fn fds(pid: i32) -> Option<Fds> {
    let open = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    Some(Fds {
        open,
        soft: soft_nofile(&limits)?,
    })
}

/// The soft "Max open files" of a `/proc/<pid>/limits` text.
fn soft_nofile(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// What the router needs to start against one fleet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start<'a> {
    /// The router binary.
    pub(crate) bin: &'a Path,
    /// Its CPU.
    pub(crate) cpu: usize,
    /// Its soft RLIMIT_NOFILE; `None`: inherited from the bench.
    pub(crate) nofile: Option<u64>,
    /// The fleet's file-store root.
    pub(crate) root: &'a Path,
    /// The sim shim.
    pub(crate) shim: SocketAddr,
    /// Every worker's instance id.
    pub(crate) ids: &'a [u64],
    /// The chat request to send through it.
    pub(crate) chat_body: &'a str,
    /// Bound of the whole wait.
    pub(crate) ready: Duration,
}

/// Starts the router and waits until it is ready (module docs).
pub(crate) fn start(
    s: &Start<'_>,
    dir: &TempDir,
    name: &str,
) -> Result<(Supervised, u16, Ready), BenchError> {
    let port = probe::free_port()?;
    let conf = dir.write(&format!("{name}.yaml"), &yaml(port, s.cpu, s.root, s.shim))?;
    let log = dir.path().join(format!("{name}.log"));
    let mut cmd = router_command(s.bin, &conf, &log)?;
    if let Some(n) = s.nofile {
        // SAFETY: the closure only calls getrlimit and setrlimit
        // (async-signal-safe) on a value copied before fork.
        unsafe {
            cmd.pre_exec(move || {
                let mut r = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                r.rlim_cur = n.min(r.rlim_max);
                if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let t0 = Instant::now();
    let mut router = Supervised::spawn("router", cmd, &[s.cpu], Some(&log))?;
    let pid = router.pid();
    let n = s.ids.len();
    let stage = |router: &mut Supervised, check: &dyn Fn() -> Result<(), String>| {
        wait_for(router, t0 + s.ready, s.ready, check)
            .map_err(|e| diagnose(e, pid, &log, n))
            .map(|()| t0.elapsed())
    };
    let health = stage(&mut router, &|| match probe::status(port, probe::HEALTH) {
        Ok(200) => Ok(()),
        Ok(code) => Err(format!("GET /health answered {code}")),
        Err(e) => Err(format!("GET /health: {e}")),
    })?;
    let discovered = stage(&mut router, &|| discovered(port, s.ids))?;
    let subscribed = stage(&mut router, &|| subscribed(port, n as u64))?;
    let fresh = stage(&mut router, &|| all_fresh(port, n))?;
    let answered = stage(&mut router, &|| shim_answers(port, s.chat_body))?;
    let ready = Ready {
        log,
        health,
        discovered,
        subscribed,
        fresh,
        answered,
        fds: fds(pid),
    };
    Ok((router, port, ready))
}

/// A readiness failure with the router's descriptors against its limit in
/// its first line, and whether its log shows EMFILE.
fn diagnose(e: BenchError, pid: i32, log: &Path, workers: usize) -> BenchError {
    let BenchError::NotReady {
        what,
        secs,
        detail,
        log: tail,
    } = e
    else {
        return e;
    };
    let text = std::fs::read_to_string(log).unwrap_or_default();
    BenchError::NotReady {
        what,
        secs,
        detail: format!("{detail}{}", fd_note(fds(pid), &text, workers)),
        log: tail,
    }
}

/// The router's descriptors and whether its log shows EMFILE, after the runs.
pub(crate) fn after_runs(pid: i32, log: &Path, workers: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    fd_note(fds(pid), &text, workers)
        .trim_start_matches("; router: ")
        .to_owned()
}

/// `; router: N fds open, soft RLIMIT_NOFILE S`, and a plain statement
/// when the router's log shows it ran out of descriptors.
fn fd_note(fds: Option<Fds>, log: &str, workers: usize) -> String {
    let mut note = fds.map_or(String::new(), |f| format!("; router: {f}"));
    let emfile = log.matches("Too many open files").count();
    if emfile > 0 {
        note.push_str(&format!(
            "; its log has {emfile} \"Too many open files\" (EMFILE): the router hit its \
             RLIMIT_NOFILE; it needs ~1 fd per kv_metrics publisher ({workers} here) plus its \
             listener, client and upstream connections"
        ));
    }
    note
}

/// Subscription counts by state, from `continuum_dynamo_load_subscriptions`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SubCounts {
    /// `pending`.
    pub(crate) pending: u64,
    /// `connecting`.
    pub(crate) connecting: u64,
    /// `connected`.
    pub(crate) connected: u64,
    /// `backoff`.
    pub(crate) backoff: u64,
}

/// Parses `continuum_dynamo_load_subscriptions{state=...}` from `/metrics`.
pub(crate) fn sub_counts(metrics: &str) -> SubCounts {
    const PREFIX: &str = "continuum_dynamo_load_subscriptions{state=\"";
    let mut c = SubCounts::default();
    for l in metrics.lines() {
        let Some(rest) = l.strip_prefix(PREFIX) else {
            continue;
        };
        let Some((state, tail)) = rest.split_once('"') else {
            continue;
        };
        let Some(n) = tail
            .rsplit_once(' ')
            .and_then(|(_, v)| v.trim().parse::<f64>().ok())
        else {
            continue;
        };
        // Gauges of whole counts, printed as numbers.
        let n = n as u64;
        match state {
            "pending" => c.pending += n,
            "connecting" => c.connecting += n,
            "connected" => c.connected += n,
            "backoff" => c.backoff += n,
            _ => {}
        }
    }
    c
}

/// Whether `want` kv_metrics subscriptions are connected.
fn subscribed(port: u16, want: u64) -> Result<(), String> {
    let body = router_probe::get(port, "/metrics")?;
    let c = sub_counts(&String::from_utf8_lossy(&body));
    if c.connected >= want {
        return Ok(());
    }
    Err(format!(
        "{} of {want} kv_metrics subscriptions connected (pending {}, connecting {}, backoff {})",
        c.connected, c.pending, c.connecting, c.backoff
    ))
}

/// Workers of an `/admin/dynamo/workers` body whose every rank has a fresh
/// load sample.
pub(crate) fn fresh_workers(body: &[u8]) -> usize {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return 0;
    };
    v["workers"].as_array().map_or(0, |ws| {
        ws.iter()
            .filter(|w| {
                w["load"].as_array().is_some_and(|ranks| {
                    !ranks.is_empty() && ranks.iter().all(|r| r["fresh"] == true)
                })
            })
            .count()
    })
}

/// Whether all `want` workers have fresh load samples.
fn all_fresh(port: u16, want: usize) -> Result<(), String> {
    let body = router_probe::get(port, "/admin/dynamo/workers")?;
    let n = fresh_workers(&body);
    if n >= want {
        Ok(())
    } else {
        Err(format!("{n} of {want} workers have a fresh load sample"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use continuum_core::config::{Config, NoEnv};

    #[test]
    fn the_config_is_valid_and_pins_one_shard() {
        let root = Path::new("/tmp/continuum-sim \"q\" root");
        let shim: SocketAddr = "127.0.0.1:41234".parse().unwrap();
        let y = yaml(9000, 0, root, shim);
        assert!(y.contains(
            "bind_address: \"127.0.0.1:9000\"\n  shards: 1\n  cpu_affinity: [0]\n  control_cpu: 0\n"
        ));
        let (c, _) = Config::from_yaml(&y, &NoEnv).unwrap();
        assert!(c.dynamo.enabled && c.disaggregated_serving.enabled);
        assert_eq!(c.dynamo.discovery.file.root.as_deref(), root.to_str());
        assert_eq!(c.dynamo.discovery.file.namespaces, [NAMESPACE]);
        assert!(c.backends[0].internal);
    }

    #[test]
    fn reads_subscriptions_freshness_and_limits() {
        let m = "# TYPE continuum_dynamo_load_subscriptions gauge\n\
                 continuum_dynamo_load_subscriptions{state=\"pending\",transport=\"direct\"} 3\n\
                 continuum_dynamo_load_subscriptions{state=\"connected\",transport=\"direct\"} 997\n\
                 continuum_dynamo_load_subscriptions{state=\"backoff\",transport=\"direct\"} 0\n";
        assert_eq!(
            sub_counts(m),
            SubCounts {
                pending: 3,
                connecting: 0,
                connected: 997,
                backoff: 0
            }
        );
        let body = br#"{"workers":[
            {"load":[{"dp_rank":0,"fresh":true}]},
            {"load":[{"dp_rank":0,"fresh":false}]},
            {"load":[]},
            {"load":[{"dp_rank":0,"fresh":true},{"dp_rank":1,"fresh":true}]}]}"#;
        assert_eq!(fresh_workers(body), 2);
        assert_eq!(fresh_workers(b"nope"), 0);
        let f = Some(Fds {
            open: 512,
            soft: 512,
        });
        let note = fd_note(
            f,
            "x Too many open files (os error 24)\ny Too many open files",
            1000,
        );
        assert!(
            note.starts_with("; router: 512 fds open, soft RLIMIT_NOFILE 512; its log has 2"),
            "{note}"
        );
        assert!(note.contains("(1000 here)"), "{note}");
        assert_eq!(fd_note(None, "fine", 10), "");
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(soft_nofile(limits), Some(1024));
        let me = i32::try_from(std::process::id()).unwrap();
        assert!(fds(me).is_some_and(|f| f.open > 0 && f.soft > 0));
    }
}
