//! The router of `kv-route`'s `router kv` row: `fleet-hop`'s router config (one shard, etcd
//! discovery, the direct-mode frontend as the shim pool) plus `dynamo.kv` with the tiny model's
//! tokenizer and tokenizer config pinned by their blake3 digests, its start, the bounded wait
//! until it has loaded the pinned artifacts and connected every worker's `kv-events`, and the
//! readers of its KV selection counters.
//!
//! Invariants: the digests are computed from the fixture files the workers' cards name, as an
//! operator pins them after `b3sum`; every wait is bounded by the ready timeout; counters are
//! read as whole numbers, absent ones as 0.

use std::time::Instant;

use serde_json::Value;

use crate::child::Supervised;
use crate::error::BenchError;
use crate::fleet_hop::router::{self as fleet_router, Launch};
use crate::router_probe::{get, labelled_counters, selections_text, wait_for};

/// The `kv:` block of the router's `dynamo:` section.
pub(crate) fn kv_yaml(pinned: &[String]) -> String {
    let list: Vec<String> = pinned
        .iter()
        .map(|p| Value::String(p.clone()).to_string())
        .collect();
    format!(
        "  kv:\n    enabled: true\n    pinned_artifacts: [{}]\n",
        list.join(", ")
    )
}

/// Starts the KV router as `launch` says, its `dynamo:` section extended (after the launch's
/// own lines) by the `kv:` block pinning `pinned`, and waits until it discovered every worker, proxied the chat body, loaded
/// the pinned artifacts and connected every `kv-events` publisher.
pub(crate) fn start(
    launch: Launch<'_>,
    pinned: &[String],
) -> Result<(Supervised, u16), BenchError> {
    let extra = format!("{}{}", launch.dynamo_extra, kv_yaml(pinned));
    let (mut router, port) = fleet_router::start(&Launch {
        dynamo_extra: &extra,
        ..launch
    })?;
    let (fleet, ready) = (launch.fleet, launch.ready);
    let deadline = Instant::now() + ready;
    let n = fleet.workers.len();
    wait_for(&mut router, deadline, ready, || kv_ready(port, n))?;
    Ok((router, port))
}

/// Whether the router loaded its pinned artifacts and has `publishers` connected `kv-events`
/// subscriptions.
pub(crate) fn kv_ready(port: u16, publishers: usize) -> Result<(), String> {
    let metrics = String::from_utf8_lossy(&get(port, "/metrics")?).into_owned();
    let loaded = counter(&metrics, "continuum_dynamo_kv_artifacts_total", "loaded");
    if loaded == 0 {
        return Err(format!(
            "pinned artifacts not loaded yet (artifacts: {})",
            pairs_text(&counters(&metrics, "continuum_dynamo_kv_artifacts_total"))
        ));
    }
    let admin = get(port, "/admin/dynamo/workers")?;
    let connected = connected_kv_events(&admin);
    if connected < publishers {
        return Err(format!(
            "{connected} of {publishers} kv-events subscriptions connected"
        ));
    }
    Ok(())
}

/// Connected `kv-events` subscriptions of an `/admin/dynamo/workers` body.
pub(crate) fn connected_kv_events(admin: &[u8]) -> usize {
    let Ok(v) = serde_json::from_slice::<Value>(admin) else {
        return 0;
    };
    v["subscriptions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["family"] == "kv-events" && s["state"] == "connected")
        .count()
}

/// Every `name{result="..."} N` counter of a metrics text, as `(result, N)`, in text order.
pub(crate) fn counters(metrics: &str, name: &str) -> Vec<(String, u64)> {
    labelled_counters(metrics, &format!("{name}{{result=\""))
}

/// The `result` counter of `name`, 0 when absent.
pub(crate) fn counter(metrics: &str, name: &str, result: &str) -> u64 {
    counters(metrics, name)
        .into_iter()
        .find(|(r, _)| r == result)
        .map_or(0, |(_, n)| n)
}

/// `after - before` per label (labels of `after`; missing in `before` = 0).
pub(crate) fn delta(after: &[(String, u64)], before: &[(String, u64)]) -> Vec<(String, u64)> {
    after
        .iter()
        .map(|(label, n)| {
            let b = before
                .iter()
                .find(|(l, _)| l == label)
                .map_or(0, |(_, n)| *n);
            (label.clone(), n.saturating_sub(b))
        })
        .collect()
}

/// `label=N, ...` of the non-zero pairs, or `none`.
pub(crate) fn pairs_text(pairs: &[(String, u64)]) -> String {
    let nonzero: Vec<(String, u64)> = pairs.iter().filter(|(_, n)| *n > 0).cloned().collect();
    selections_text(&nonzero)
}

/// The router's metrics text (empty if it cannot be read).
pub(crate) fn metrics(port: u16) -> String {
    get(port, "/metrics")
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn kv_block_and_counters() {
        let y = kv_yaml(&["blake3:ab".into(), "blake3:cd".into()]);
        assert_eq!(
            y,
            "  kv:\n    enabled: true\n    pinned_artifacts: [\"blake3:ab\", \"blake3:cd\"]\n"
        );
        let m = "# HELP x\n\
                 continuum_dynamo_kv_selection_total{result=\"overlap\"} 56\n\
                 continuum_dynamo_kv_selection_total{result=\"no_overlap\"} 8\n\
                 continuum_dynamo_kv_selection_total{result=\"artifact_unpinned\"} 0\n\
                 continuum_dynamo_kv_artifacts_total{result=\"loaded\"} 2\n";
        let sel = counters(m, "continuum_dynamo_kv_selection_total");
        assert_eq!(sel.len(), 3);
        assert_eq!(pairs_text(&sel), "overlap=56, no_overlap=8");
        assert_eq!(
            counter(m, "continuum_dynamo_kv_artifacts_total", "loaded"),
            2
        );
        assert_eq!(
            counter(m, "continuum_dynamo_kv_artifacts_total", "failed"),
            0
        );
        let before = vec![("overlap".to_owned(), 6)];
        assert_eq!(delta(&sel, &before)[0], ("overlap".to_owned(), 50));
        assert_eq!(pairs_text(&[]), "none");
        let admin = br#"{"subscriptions":[{"family":"kv-events","state":"connected"},
            {"family":"kv-events","state":"connecting"},{"family":"kv_metrics","state":"connected"}]}"#;
        assert_eq!(connected_kv_events(admin), 1);
    }

    #[test]
    fn digests_of_the_fixture() {
        let dir = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/fixtures/tiny-model"
        ));
        if !dir.join("tokenizer.json").is_file() {
            return; // the shared fixtures are not checked out here
        }
        // The checksums the fleet's cards carry for these files (`sim/src/records.rs`).
        assert_eq!(
            crate::fleet_rows::digests(dir).unwrap(),
            [
                "blake3:a7bb92ed896079ec4872a416916bf7910d50feb8ca39ddeaaf54ae107843c6bb",
                "blake3:52ee138fd0408ba7ae1c04fe5cc7442814568aea496215cdf68dd24176201cee",
            ]
        );
    }
}
