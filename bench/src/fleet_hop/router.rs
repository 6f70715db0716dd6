//! The router of `fleet-hop`: its config (one shard, etcd discovery of the
//! fleet, a shim pool of the one frontend), its start, and the wait until it
//! has discovered every worker and proxied one chat completion through the
//! shim path.
//!
//! Invariants: the router is pinned to one CPU (shard and control thread
//! included); it is only returned once `GET /admin/dynamo/workers` lists
//! every worker of the fleet and a chat completion came back 200 with
//! `x-continuum-routing-path` (so requests take the shim path, with pins);
//! every wait is bounded by the ready timeout.

use std::path::Path;
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::fleet::FleetInfo;
use crate::child::Supervised;
use crate::error::BenchError;
use crate::probe;
use crate::servers::set_log;
use crate::tempdir::TempDir;

/// Header the shim path sets on every response it produced.
pub(crate) const ROUTING_PATH: &str = "x-continuum-routing-path";

/// Router YAML: `port` on loopback, one shard on `cpu`, the fleet's frontend
/// as the shim pool of its namespace, serving `model`.
pub(crate) fn yaml(port: u16, cpu: usize, fleet: &FleetInfo, model: &str) -> String {
    let q = |s: &str| Value::String(s.to_owned()).to_string();
    let ns = &fleet.namespace;
    format!(
        "server:
  bind_address: \"127.0.0.1:{port}\"
  shards: 1
  cpu_affinity: [{cpu}]
  control_cpu: {cpu}
backends:
  - name: fe-{ns}
    type: openai
    url: {url}
    models: [{model}]
disaggregated_serving: {{ enabled: true, fallback_to_unified: false }}
dynamo:
  enabled: true
  discovery:
    source: etcd
    etcd:
      endpoints: [{etcd}]
      namespaces: [{nsq}]
  load:
    direct_allow_cidrs: [\"127.0.0.0/8\"]
  shim:
    pools:
      - {{ namespace: {nsq}, backends: [fe-{ns}] }}
",
        url = q(&fleet.frontend_url),
        model = q(model),
        etcd = q(&fleet.etcd_endpoint),
        nsq = q(ns),
    )
}

/// Starts the router for `fleet` on `cpu` and waits until it has discovered
/// every worker and proxied `chat_body` through the shim path.
pub(crate) fn start(
    bin: &Path,
    dir: &TempDir,
    cpu: usize,
    fleet: &FleetInfo,
    model: &str,
    chat_body: &str,
    ready: Duration,
) -> Result<(Supervised, u16), BenchError> {
    let port = probe::free_port()?;
    let conf = dir.write("router.yaml", &yaml(port, cpu, fleet, model))?;
    let log = dir.path().join("router.log");
    let mut cmd = Command::new(bin);
    cmd.arg("--config").arg(&conf);
    // Per-request logging would measure the logger.
    if std::env::var_os("CONTINUUM_LOG").is_none() {
        cmd.env("CONTINUUM_LOG", "warn");
    }
    set_log(&mut cmd, &log)?;
    let mut router = Supervised::spawn("router", cmd, &[cpu], Some(&log))?;
    probe::wait_ready(&mut router, port, probe::HEALTH, ready)?;
    let deadline = Instant::now() + ready;
    wait_for(&mut router, deadline, ready, || discovered(port, fleet))?;
    wait_for(&mut router, deadline, ready, || {
        shim_answers(port, chat_body)
    })?;
    Ok((router, port))
}

/// Polls `check` (`Ok(())` when done, `Err(detail)` otherwise) until the deadline.
fn wait_for(
    router: &mut Supervised,
    deadline: Instant,
    ready: Duration,
    mut check: impl FnMut() -> Result<(), String>,
) -> Result<(), BenchError> {
    loop {
        if crate::signals::interrupted() {
            return Err(BenchError::Interrupted);
        }
        router.ensure_running()?;
        let detail = match check() {
            Ok(()) => return Ok(()),
            Err(d) => d,
        };
        if Instant::now() >= deadline {
            return Err(BenchError::NotReady {
                what: "router",
                secs: ready.as_secs(),
                detail,
                log: router.log_tail(),
            });
        }
        sleep(Duration::from_millis(100));
    }
}

/// Whether `GET /admin/dynamo/workers` lists every worker of the fleet.
fn discovered(port: u16, fleet: &FleetInfo) -> Result<(), String> {
    let r = probe::request(port, "GET", "/admin/dynamo/workers", &[], "")
        .map_err(|e| format!("GET /admin/dynamo/workers: {e}"))?;
    if r.status != 200 {
        return Err(format!(
            "GET /admin/dynamo/workers answered {}: {}",
            r.status,
            r.text()
        ));
    }
    let listed = listed_worker_ids(&r.body);
    let missing: Vec<u64> = fleet
        .workers
        .iter()
        .map(|w| w.instance_id)
        .filter(|id| !listed.contains(id))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "workers not discovered yet: {missing:?} (listed: {listed:?})"
        ))
    }
}

/// The decimal `worker_id`s of an `/admin/dynamo/workers` body.
pub(crate) fn listed_worker_ids(body: &[u8]) -> Vec<u64> {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    v["workers"]
        .as_array()
        .map(|ws| {
            ws.iter()
                .filter_map(|w| w["worker_id"].as_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a chat completion through the router comes back 200 from the
/// shim path.
fn shim_answers(port: u16, chat_body: &str) -> Result<(), String> {
    let r = probe::request(port, "POST", "/v1/chat/completions", &[], chat_body)
        .map_err(|e| format!("POST /v1/chat/completions: {e}"))?;
    match (r.status, r.header(ROUTING_PATH)) {
        (200, Some(_)) => Ok(()),
        (200, None) => Err(format!(
            "200 without {ROUTING_PATH}: the request did not take the shim path"
        )),
        (code, _) => Err(format!(
            "POST /v1/chat/completions answered {code}: {}",
            r.text()
        )),
    }
}

/// The router's `continuum_dynamo_selection_total` lines for decode picks,
/// as `reason=count` pairs (to show how the shim picked during the run).
pub(crate) fn decode_selections(metrics: &str) -> Vec<(String, u64)> {
    const PREFIX: &str = "continuum_dynamo_selection_total{role=\"decode\",reason=\"";
    metrics
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(PREFIX)?;
            let (reason, count) = rest.split_once("\"}")?;
            let n = count.trim().parse::<f64>().ok()?;
            // Counters are whole numbers printed as floats.
            (n > 0.0).then(|| (reason.to_owned(), n as u64))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet_hop::fleet::Worker;

    fn fleet() -> FleetInfo {
        FleetInfo {
            etcd_endpoint: "http://127.0.0.1:2379".into(),
            namespace: "agg".into(),
            frontend_url: "http://127.0.0.1:8000".into(),
            frontend_port: 8000,
            frontend_pid: 1,
            workers: vec![Worker {
                instance_id: 42,
                pid: 2,
            }],
            dir: "/tmp/continuum-fleet-x".into(),
        }
    }

    #[test]
    fn yaml_pins_one_shard_and_uses_the_shim_pool() {
        let y = yaml(9000, 0, &fleet(), "tiny-agg");
        assert!(y.contains(
            "bind_address: \"127.0.0.1:9000\"\n  shards: 1\n  cpu_affinity: [0]\n  control_cpu: 0\n"
        ));
        assert!(y.contains("url: \"http://127.0.0.1:8000\"\n    models: [\"tiny-agg\"]"));
        assert!(y.contains("endpoints: [\"http://127.0.0.1:2379\"]"));
        assert!(y.contains("- { namespace: \"agg\", backends: [fe-agg] }"));
        assert!(y.contains("disaggregated_serving: { enabled: true"));
        assert!(y.contains("direct_allow_cidrs: [\"127.0.0.0/8\"]"));
    }

    #[test]
    fn reads_worker_ids_and_selections() {
        let body = br#"{"workers":[{"worker_id":"42"},{"worker_id":"7"},{"instance_id":"2a"}]}"#;
        assert_eq!(listed_worker_ids(body), vec![42, 7]);
        assert!(listed_worker_ids(b"nope").is_empty());
        let m = "# TYPE x counter\n\
                 continuum_dynamo_selection_total{role=\"decode\",reason=\"load\"} 120\n\
                 continuum_dynamo_selection_total{role=\"decode\",reason=\"kv_aware\"} 0\n\
                 continuum_dynamo_selection_total{role=\"prefill\",reason=\"no_prefill_pool\"} 121\n";
        assert_eq!(decode_selections(m), vec![("load".to_owned(), 120)]);
    }
}
