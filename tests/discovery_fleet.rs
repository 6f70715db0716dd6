//! Discovery against a REAL Dynamo 1.6.1 fleet (etcd + mocker workers + direct-mode frontends,
//! started by `tests/fleet/`): the operator view lists every worker with the role, model, block
//! size, capacity and data-parallel ranks the workers registered, both id forms agree with etcd,
//! and a worker killed with SIGKILL disappears once its lease expires (DISC-RO-05).
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::fleet::{Fleet, FleetSpec};
use common::{RouterConfig, RouterProcess};
use serde_json::Value;

const TTL: u32 = 3;

fn q(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

fn router_for(fleet: &Fleet) -> RouterProcess {
    let agg = fleet.info.frontends["agg"][0].clone();
    let disagg = fleet.info.frontends["disagg"][0].clone();
    let mut cfg = RouterConfig::default()
        .backend("fe-agg", &agg, &["tiny-agg"])
        .backend("fe-disagg", &disagg, &["tiny-disagg"]);
    cfg.disaggregated_serving = true;
    cfg.extra_yaml = format!(
        "dynamo:\n  enabled: true\n  discovery:\n    source: etcd\n    etcd:\n      endpoints: [{}]\n      \
         namespaces: [agg, disagg]\n      watch_reconnect_backoff: {{ initial: \"100ms\", max: \"1s\" }}\n  \
         shim:\n    pools:\n      - {{ namespace: agg, backends: [fe-agg] }}\n      - {{ namespace: disagg, backends: [fe-disagg] }}\n",
        q(&fleet.info.etcd_endpoint)
    );
    RouterProcess::start(&cfg)
}

/// Poll the admin view until `done` holds (bounded).
fn wait_view(
    r: &RouterProcess,
    what: &str,
    timeout: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let v = r.get("/admin/dynamo/workers").json();
        if done(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what} not reached within {timeout:?}; last view {v:#}\nrouter stderr:\n{}",
            r.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn workers(v: &Value) -> &Vec<Value> {
    v["workers"].as_array().unwrap()
}

#[test]
fn the_operator_view_matches_the_real_fleet_and_follows_lease_expiry() {
    let mut fleet = Fleet::start(
        &FleetSpec::new()
            .agg("tiny-agg", 2)
            .disagg("tiny-disagg", 1, 1)
            .lease_ttl(TTL),
    );
    let r = router_for(&fleet);
    let expected = fleet.info.workers.len();
    assert_eq!(expected, 4, "{:?}", fleet.info.workers);
    let v = wait_view(&r, "every worker listed", Duration::from_secs(20), |v| {
        v["connected"] == true && workers(v).len() == expected
    });
    assert_eq!(v["source"], "etcd");
    assert_eq!(
        v["signals"],
        serde_json::json!({"load": true, "capacity": true})
    );

    for fw in &fleet.info.workers {
        let w = workers(&v)
            .iter()
            .find(|w| w["instance_id"] == fw.instance_id_hex.as_str())
            .unwrap_or_else(|| panic!("worker {} missing from {v:#}", fw.instance_id_hex));
        assert_eq!(
            w["worker_id"],
            fw.instance_id.to_string(),
            "decimal form: {w}"
        );
        assert_eq!(w["namespace"], fw.namespace.as_str(), "{w}");
        assert_eq!(w["component"], fw.component.as_str(), "{w}");
        assert_eq!(w["model"], fw.model.as_str(), "{w}");
        let role = format!("{:?}", fw.role).to_ascii_lowercase();
        assert_eq!(w["role"], role.as_str(), "{w}");
        assert_eq!(w["block_size"], fleet.info.block_size, "{w}");
        assert_eq!(w["dp_start_rank"], 0, "{w}");
        assert_eq!(w["dp_size"], 1, "{w}");
        assert!(
            w["capacity"]["total_kv_blocks"]
                .as_u64()
                .is_some_and(|n| n > 0),
            "{w}"
        );
        assert!(
            w["capacity"]["max_num_batched_tokens"]
                .as_u64()
                .is_some_and(|n| n > 0),
            "{w}"
        );
        let text = w.to_string();
        assert!(
            !text.contains("tcp://") && !text.contains(&fw.tcp),
            "internal address leaked: {w}"
        );
    }
    let publishers: u64 = fleet
        .info
        .workers
        .iter()
        .filter(|w| w.kv_metrics.is_some())
        .count() as u64;
    assert_eq!(v["load_publishers"], publishers, "{v:#}");

    let victim = fleet
        .info
        .workers
        .iter()
        .find(|w| w.namespace == "agg")
        .unwrap()
        .clone();
    let killed = Instant::now();
    fleet.kill(&victim.instance_id_hex, "SIGKILL");
    let bound = Duration::from_secs(u64::from(TTL) + 5);
    let after = wait_view(&r, "the killed worker gone", bound, |v| {
        workers(v)
            .iter()
            .all(|w| w["instance_id"] != victim.instance_id_hex.as_str())
    });
    assert_eq!(workers(&after).len(), expected - 1, "{after:#}");
    eprintln!(
        "killed worker left the view {:.2}s after SIGKILL (lease TTL {TTL}s)",
        killed.elapsed().as_secs_f64()
    );
}
