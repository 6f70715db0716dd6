//! A dead worker on a REAL Dynamo fleet (issue 38), seen by the official `openai` client:
//!
//! - **re-pick**: the router cannot see the workers' `kv_metrics` (every publisher outside
//!   `direct_allow_cidrs`), so nothing tells it a SIGKILLed worker is gone before its lease
//!   expires; requests pinned to it get the frontend's 503 `Service temporarily unavailable`,
//!   and the router picks again without that worker: every request succeeds, none is answered by
//!   the dead worker, `continuum_dynamo_repicks_total{reason="worker_unavailable"}` counts the
//!   re-picks and no `disaggregated_errors_total` is counted;
//! - **suspect**: with the publishers connected, the dead worker's `kv_metrics` connection drops
//!   at the kill; the router marks it suspect within moments (long before the 30 s lease), and
//!   from then on picks only the live workers, without a single re-pick.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::fleet::{Fleet, FleetSpec};
use common::pyclient::{OpenAiChat, StreamMode};
use common::{RouterProcess, metric_value};

const AGG: &str = "tiny-agg";

/// Every worker of the fleet, as the router lists them.
fn wait_listed(r: &RouterProcess, n: usize) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let v = r.get("/admin/dynamo/workers").json();
        if v["workers"].as_array().map_or(0, Vec::len) == n {
            return;
        }
        assert!(Instant::now() < end, "{v:#}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn metric(r: &RouterProcess, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(&r.get("/metrics").text(), name, labels).unwrap_or(0.0)
}

/// `n` chat requests each way through the official client, one at a time, naming the worker.
fn chats(r: &RouterProcess, n: u32) -> Vec<common::pyclient::ClientResult> {
    OpenAiChat::new(r.addr(), AGG)
        .stream(StreamMode::Both)
        .n(n)
        .max_tokens(4)
        .header("x-backend", "")
        .timeout(Duration::from_secs(20))
        .run()
}

/// Every request succeeded and none was answered by `dead`; the workers that answered.
fn all_ok_without(results: &[common::pyclient::ClientResult], dead: u64) -> BTreeSet<u64> {
    for res in results {
        assert!(res.ok(), "a request failed: {res:?}");
        assert_ne!(
            res.worker(),
            Some(dead),
            "answered by the dead worker: {res:?}"
        );
    }
    results.iter().filter_map(|r| r.worker()).collect()
}

#[test]
fn a_dead_pinned_worker_is_picked_again_not_returned_to_the_client() {
    let mut fleet = Fleet::start(&FleetSpec::new().agg(AGG, 3));
    if fleet.release() < (1, 6, 0) {
        // 1.4.2 answers a dead pin with the generic 500 of an engine error: re-picked only when
        // the router holds the worker gone, which needs its publisher (the other test).
        common::fleet::compat_skip("before 1.6 a dead pin is a generic 500, not a 503");
        return;
    }
    let mut cfg = fleet.router_config();
    cfg.extra_yaml = no_publishers(&cfg.extra_yaml);
    let r = RouterProcess::start(&cfg);
    wait_listed(&r, 3);
    let warm = chats(&r, 3);
    assert_eq!(
        all_ok_without(&warm, 0).len(),
        3,
        "round-robin over the three"
    );

    let victim = fleet.info.workers[1].clone();
    fleet.kill(&victim.instance_id_hex, "SIGKILL");
    let errors = metric(&r, "disaggregated_errors_total", &[]);
    let results = chats(&r, 6);
    let served = all_ok_without(&results, victim.instance_id);
    assert_eq!(served.len(), 2, "the two live workers serve: {served:?}");
    let repicks = metric(
        &r,
        "continuum_dynamo_repicks_total",
        &[("reason", "worker_unavailable")],
    );
    assert!(
        repicks >= 1.0,
        "the dead worker was pinned at least once in 12 picks"
    );
    assert_eq!(
        metric(&r, "disaggregated_errors_total", &[]),
        errors,
        "a re-pick that succeeds is no shim failure"
    );
    eprintln!("12 requests after the SIGKILL, all answered; {repicks} re-picks");
}

/// `yaml` with `direct_allow_cidrs` allowing no publisher of the fleet (TEST-NET-1): the router
/// subscribes to nothing, so it gets no load sample and holds no worker suspect.
fn no_publishers(yaml: &str) -> String {
    let key = "direct_allow_cidrs: [";
    let start = yaml.find(key).expect("a fleet config lists its publishers") + key.len();
    let end = start + yaml[start..].find(']').expect("a closed list");
    format!("{}\"192.0.2.0/24\"{}", &yaml[..start], &yaml[end..])
}

#[test]
fn a_worker_whose_publisher_drops_is_suspect_long_before_its_lease() {
    let mut fleet = Fleet::start(&FleetSpec::new().agg(AGG, 3));
    let r = RouterProcess::start(&fleet.router_config());
    wait_listed(&r, 3);
    // Traffic to every worker, until each has published a load sample the router applied.
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let results = chats(&r, 3);
        assert!(results.iter().all(|x| x.ok()), "{results:?}");
        let v = r.get("/admin/dynamo/workers").json();
        let sampled = v["workers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| w["load"][0]["age_ms"].is_u64())
            .count();
        if sampled == 3 {
            break;
        }
        assert!(Instant::now() < end, "not every worker published: {v:#}");
    }
    let victim = fleet.info.workers[0].clone();
    let killed = Instant::now();
    fleet.kill(&victim.instance_id_hex, "SIGKILL");
    let end = killed + Duration::from_secs(10);
    while metric(&r, "continuum_dynamo_suspect_workers", &[]) < 1.0 {
        assert!(Instant::now() < end, "never suspect");
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = killed.elapsed();
    let v = r.get("/admin/dynamo/workers").json();
    let row = v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["worker_id"].as_str() == Some(&victim.instance_id.to_string()))
        .cloned()
        .expect("still listed: its lease has not expired");
    assert_eq!(row["suspect"], true, "{row:#}");
    let repicks = metric(&r, "continuum_dynamo_repicks_total", &[]);
    let results = chats(&r, 6);
    let served = all_ok_without(&results, victim.instance_id);
    assert_eq!(served.len(), 2, "{served:?}");
    assert_eq!(
        metric(&r, "continuum_dynamo_repicks_total", &[]),
        repicks,
        "the suspect is never pinned, so nothing is re-picked"
    );
    eprintln!(
        "suspect {:.0} ms after the SIGKILL; its lease (30 s TTL) was still alive",
        after.as_secs_f64() * 1000.0
    );
}
