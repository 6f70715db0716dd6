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
use std::time::{Duration, Instant};

use serde_json::Value;

use super::fleet::FleetInfo;
use crate::child::Supervised;
use crate::error::BenchError;
use crate::probe;
use crate::router_probe::{discovered, server_yaml, shim_answers, wait_for};
use crate::servers::router_command;
use crate::tempdir::TempDir;

/// Router YAML: `port` on loopback, one shard on `cpu`, the fleet's frontend
/// as the shim pool of its namespace, serving `model`.
pub(crate) fn yaml(port: u16, cpu: usize, fleet: &FleetInfo, model: &str) -> String {
    let q = |s: &str| Value::String(s.to_owned()).to_string();
    let ns = &fleet.namespace;
    let server = server_yaml(port, cpu);
    format!(
        "{server}backends:
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

/// What [`start`] starts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Launch<'a> {
    /// The router binary.
    pub(crate) bin: &'a Path,
    /// Where its config and log go.
    pub(crate) dir: &'a TempDir,
    /// The CPU it is pinned to.
    pub(crate) cpu: usize,
    /// The fleet it routes for.
    pub(crate) fleet: &'a FleetInfo,
    /// The model its shim pool serves.
    pub(crate) model: &'a str,
    /// The chat body of the readiness probe.
    pub(crate) chat_body: &'a str,
    /// How long each readiness wait may take.
    pub(crate) ready: Duration,
    /// Lines appended to the config's `dynamo:` section (indented by two spaces, e.g. a `kv:`
    /// block); empty for none.
    pub(crate) dynamo_extra: &'a str,
    /// Lines appended to the config's `dynamo.load:` block (indented by four spaces, e.g.
    /// `transport: broker`); empty for none.
    pub(crate) load_extra: &'a str,
    /// Names the config and log (`<name>.yaml`, `<name>.log`), so several routers can share
    /// `dir`.
    pub(crate) name: &'a str,
}

/// Starts the router and waits until it has discovered every worker of the fleet and proxied
/// the chat body through the shim path.
pub(crate) fn start(l: &Launch<'_>) -> Result<(Supervised, u16), BenchError> {
    let Launch {
        bin,
        dir,
        cpu,
        fleet,
        model,
        chat_body,
        ready,
        dynamo_extra,
        load_extra,
        name,
    } = *l;
    let port = probe::free_port()?;
    let conf = dir.write(
        &format!("{name}.yaml"),
        &(yaml(port, cpu, fleet, model).replacen(
            "  load:\n",
            &format!("  load:\n{load_extra}"),
            1,
        ) + dynamo_extra),
    )?;
    let log = dir.path().join(format!("{name}.log"));
    let cmd = router_command(bin, &conf, &log)?;
    let mut router = Supervised::spawn("router", cmd, &[cpu], Some(&log))?;
    probe::wait_ready(&mut router, port, probe::HEALTH, ready)?;
    let deadline = Instant::now() + ready;
    let ids: Vec<u64> = fleet.workers.iter().map(|w| w.instance_id).collect();
    wait_for(&mut router, deadline, ready, || discovered(port, &ids))?;
    wait_for(&mut router, deadline, ready, || {
        shim_answers(port, chat_body)
    })?;
    Ok((router, port))
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
            frontend_log: "/tmp/continuum-fleet-x/frontend1-agg.log".into(),
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
}
