//! Readiness probes and metric readers for a router serving a Dynamo fleet
//! through its shim path, shared by `fleet-hop` and `sim-hop`: bounded
//! polling, `GET /admin/dynamo/workers`, one chat completion that must carry
//! `x-continuum-routing-path`, and `continuum_dynamo_selection_total`.
//!
//! Invariants: every wait is bounded by its deadline and stops early when
//! the router exits or the driver is interrupted; admin and metrics bodies
//! are read up to [`BIG_BODY`], so a 1,000-worker fleet's views fit.

use std::thread::sleep;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::child::Supervised;
use crate::error::BenchError;
use crate::probe;

/// Header the shim path sets on every response it produced.
pub(crate) const ROUTING_PATH: &str = "x-continuum-routing-path";

/// Largest admin or metrics body read (a 1,000-worker admin view is ~1 MB).
pub(crate) const BIG_BODY: u64 = 64 * 1024 * 1024;

/// The `server:` section of a router config: `port` on loopback, one shard,
/// the shard and the control thread on `cpu`.
pub(crate) fn server_yaml(port: u16, cpu: usize) -> String {
    format!(
        "server:
  bind_address: \"127.0.0.1:{port}\"
  shards: 1
  cpu_affinity: [{cpu}]
  control_cpu: {cpu}
"
    )
}

/// What a benchmark makes of a router that failed with `e`: an interrupt
/// stays an error; anything else is said on stderr and becomes the reason
/// the router's figures are missing.
pub(crate) fn lost(e: BenchError) -> Result<String, BenchError> {
    if matches!(e, BenchError::Interrupted) {
        return Err(e);
    }
    eprintln!("router failed: {e}");
    Ok(format!("router failed: {e}"))
}

/// Polls `check` (`Ok(())` when done, `Err(detail)` otherwise) every
/// 100 ms until the deadline; `ready` is only quoted in the error.
pub(crate) fn wait_for(
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

/// `GET path` on the router, body as bytes, or why not (non-200 included).
pub(crate) fn get(port: u16, path: &str) -> Result<Vec<u8>, String> {
    let r = probe::request_capped(port, "GET", path, &[], "", BIG_BODY)
        .map_err(|e| format!("GET {path}: {e}"))?;
    if r.status != 200 {
        return Err(format!("GET {path} answered {}: {}", r.status, r.text()));
    }
    Ok(r.body)
}

/// Whether `GET /admin/dynamo/workers` lists every worker of `ids`.
pub(crate) fn discovered(port: u16, ids: &[u64]) -> Result<(), String> {
    let body = get(port, "/admin/dynamo/workers")?;
    let listed = listed_worker_ids(&body);
    let missing: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|id| !listed.contains(id))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} of {} workers not discovered yet (first missing: {:?}; {} listed)",
            missing.len(),
            ids.len(),
            &missing[..missing.len().min(5)],
            listed.len(),
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
pub(crate) fn shim_answers(port: u16, chat_body: &str) -> Result<(), String> {
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

/// Every counter line of `metrics` starting with `prefix` (the metric name and the label
/// opening, up to the label's value: `name{label="`), as `(label value, count)`, in text order.
pub(crate) fn labelled_counters(metrics: &str, prefix: &str) -> Vec<(String, u64)> {
    metrics
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(prefix)?;
            let (label, count) = rest.split_once("\"}")?;
            let n = count.trim().parse::<f64>().ok()?;
            // Counters are whole numbers printed as floats or integers.
            Some((label.to_owned(), n.max(0.0) as u64))
        })
        .collect()
}

/// The router's `continuum_dynamo_selection_total` lines for decode picks,
/// as `reason=count` pairs with a non-zero count.
pub(crate) fn decode_selections(metrics: &str) -> Vec<(String, u64)> {
    const PREFIX: &str = "continuum_dynamo_selection_total{role=\"decode\",reason=\"";
    let mut picks = labelled_counters(metrics, PREFIX);
    picks.retain(|(_, n)| *n > 0);
    picks
}

/// Selections as `reason=count, ...`, or `none`.
pub(crate) fn selections_text(selections: &[(String, u64)]) -> String {
    if selections.is_empty() {
        return "none".to_owned();
    }
    let picks: Vec<String> = selections
        .iter()
        .map(|(reason, n)| format!("{reason}={n}"))
        .collect();
    picks.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

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
