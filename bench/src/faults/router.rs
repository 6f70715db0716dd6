//! The router of `faults`' router rows: `kv-route`'s `router kv` config (`fleet-hop`'s one
//! shard on CPU 0, etcd discovery, `dynamo.kv` on with the tiny model's artifacts pinned) with
//! every frontend of the fleet's namespace in its shim pool (two in `shim-kill`), its start, and
//! the bounded wait until it discovered every worker, proxied a chat completion through the shim
//! path, loaded the pinned artifacts and connected every `kv-events` publisher.
//!
//! Invariants: the config only adds backends to `fleet-hop`'s (`fe-NS`, then `fe-NS-2`, ...);
//! every wait is bounded by the ready timeout; the router listens on 127.0.0.1 only.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::child::Supervised;
use crate::error::BenchError;
use crate::fleet_hop::fleet::FleetInfo;
use crate::fleet_hop::router::yaml as fleet_yaml;
use crate::kv_route::router::{kv_ready, kv_yaml};
use crate::kv_route::workload::MODEL;
use crate::probe;
use crate::router_probe::{discovered, shim_answers, wait_for};
use crate::servers::router_command;
use crate::tempdir::TempDir;

/// What [`start`] starts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RouterSpec<'a> {
    /// The router binary.
    pub(crate) bin: &'a Path,
    /// The pinned artifacts' digests.
    pub(crate) pinned: &'a [String],
    /// Where its config and log go.
    pub(crate) dir: &'a TempDir,
    /// The fleet it routes for.
    pub(crate) fleet: &'a FleetInfo,
    /// The shim pool's frontends (URLs); the first is the fleet's own.
    pub(crate) frontends: &'a [String],
    /// The chat body of the readiness probe.
    pub(crate) chat_body: &'a str,
    /// How long each readiness wait may take.
    pub(crate) ready: Duration,
    /// Names the config and log.
    pub(crate) name: &'a str,
}

/// The router config: `fleet-hop`'s, the frontends after the first added as backends of the
/// shim pool, then the `kv:` block pinning `pinned`.
pub(crate) fn yaml(
    port: u16,
    fleet: &FleetInfo,
    frontends: &[String],
    pinned: &[String],
) -> String {
    let ns = &fleet.namespace;
    let mut y = fleet_yaml(port, 0, fleet, MODEL);
    let mut names = vec![format!("fe-{ns}")];
    let mut extra = String::new();
    for (i, url) in frontends.iter().enumerate().skip(1) {
        let name = format!("fe-{ns}-{}", i + 1);
        extra.push_str(&format!(
            "  - name: {name}\n    type: openai\n    url: {}\n    models: [{}]\n",
            Value::String(url.clone()),
            Value::String(MODEL.to_owned()),
        ));
        names.push(name);
    }
    y = y.replacen(
        "disaggregated_serving:",
        &format!("{extra}disaggregated_serving:"),
        1,
    );
    y = y.replacen(
        &format!("backends: [fe-{ns}] }}"),
        &format!("backends: [{}] }}", names.join(", ")),
        1,
    );
    y + &kv_yaml(pinned)
}

/// Starts the router and waits until it is ready to route by KV.
pub(crate) fn start(s: &RouterSpec<'_>) -> Result<(Supervised, u16), BenchError> {
    let port = probe::free_port()?;
    let conf = s.dir.write(
        &format!("{}.yaml", s.name),
        &yaml(port, s.fleet, s.frontends, s.pinned),
    )?;
    let log = s.dir.path().join(format!("{}.log", s.name));
    let cmd = router_command(s.bin, &conf, &log)?;
    let mut router = Supervised::spawn("router", cmd, &[0], Some(&log))?;
    probe::wait_ready(&mut router, port, probe::HEALTH, s.ready)?;
    let deadline = Instant::now() + s.ready;
    let ids: Vec<u64> = s.fleet.workers.iter().map(|w| w.instance_id).collect();
    wait_for(&mut router, deadline, s.ready, || discovered(port, &ids))?;
    wait_for(&mut router, deadline, s.ready, || {
        shim_answers(port, s.chat_body)
    })?;
    wait_for(&mut router, deadline, s.ready, || kv_ready(port, ids.len()))?;
    Ok((router, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet_hop::fleet::Worker;

    #[test]
    fn a_second_frontend_joins_the_shim_pool() {
        let fleet = FleetInfo {
            etcd_endpoint: "http://127.0.0.1:2379".into(),
            namespace: "agg".into(),
            frontend_url: "http://127.0.0.1:8000".into(),
            frontend_port: 8000,
            frontend_pid: 1,
            frontend_log: "/tmp/continuum-fleet-x/frontend1-agg.log".into(),
            workers: vec![Worker {
                instance_id: 42,
                pid: 2,
            }],
            dir: "/tmp/continuum-fleet-x".into(),
        };
        let fes = vec![
            "http://127.0.0.1:8000".to_owned(),
            "http://127.0.0.1:8001".to_owned(),
        ];
        let y = yaml(9000, &fleet, &fes, &["blake3:ab".into()]);
        assert!(y.contains(
            "    models: [\"tiny-agg\"]\n  - name: fe-agg-2\n    type: openai\n    url: \
             \"http://127.0.0.1:8001\"\n    models: [\"tiny-agg\"]\ndisaggregated_serving:"
        ));
        assert!(y.contains("- { namespace: \"agg\", backends: [fe-agg, fe-agg-2] }"));
        assert!(y.ends_with("  kv:\n    enabled: true\n    pinned_artifacts: [\"blake3:ab\"]\n"));
        let one = yaml(9000, &fleet, &fes[..1], &[]);
        assert!(one.contains("backends: [fe-agg] }"));
        assert!(!one.contains("fe-agg-2"));
    }
}
