//! A hung shim replica on a REAL Dynamo 1.6.1 fleet (`tests/fleet/`): two `dynamo.frontend
//! --router-mode direct` replicas of one shim pool in front of a mocker worker; one frontend is
//! frozen with SIGSTOP (its kernel still accepts connections, it never answers). Driven by the
//! official `openai` client: the frozen replica costs at most the configured first-byte timeouts
//! per shard (each a classified 502 `disaggregated_decode_failed`, fallback being off), every later request succeeds on the other replica, and the frozen one is back
//! within one health interval of SIGCONT.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::fleet::{Fleet, FleetSpec};
use common::health::wait_state;
use common::pyclient::OpenAiChat;
use common::{RouterProcess, STEP};

const AGG: &str = "tiny-agg";
const INTERVAL: Duration = Duration::from_millis(500);

/// Signal a frontend's process group (fleet.py starts each in its own session).
fn signal_group(pid: u64, sig: libc::c_int) {
    // SAFETY: kill(2) on a process group the fleet started for this test.
    let rc = unsafe { libc::kill(-(pid as libc::pid_t), sig) };
    assert_eq!(rc, 0, "kill(-{pid}, {sig})");
}

#[test]
fn a_frozen_frontend_replica_is_ejected_and_readmitted_with_the_official_client() {
    let fleet = Fleet::start(&FleetSpec::new().agg(AGG, 1).frontend_replicas(2));
    let urls = fleet.info.frontends["agg"].clone();
    assert_eq!(urls.len(), 2, "two frontends: {urls:?}");
    let pid_of = |url: &str| {
        fleet.info.raw["frontend_processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["url"] == url)
            .and_then(|p| p["pid"].as_u64())
            .unwrap_or_else(|| panic!("no pid for {url}"))
    };
    let frozen_pid = pid_of(&urls[0]);

    let mut cfg = fleet.router_config();
    let keys = [
        "outlier: { consecutive_failures: 2, base_ejection: 60s }",
        // Slow to condemn (10 failed probes, 5 s) so the client's first requests meet the frozen
        // replica through passive detection; quick to forgive (one pass).
        "health_check: { path: /health, interval: 500ms, timeout: 300ms, healthy_threshold: 1, unhealthy_threshold: 10 }",
    ];
    cfg.backends.clear();
    cfg = cfg
        .backend_with("fe0", &urls[0], &[], &keys)
        .backend_with("fe1", &urls[1], &[], &keys);
    cfg.extra_yaml = cfg
        .extra_yaml
        .replace("backends: [fe-agg]", "backends: [fe0, fe1]");
    assert!(cfg.extra_yaml.contains("[fe0, fe1]"), "{}", cfg.extra_yaml);
    cfg.fallback_to_unified = false;
    cfg.connect_retries = 0;
    cfg.upstream_first_byte = "2s".into();
    let r = RouterProcess::start(&cfg);
    // Discovery done: a request succeeds through the shim path.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = OpenAiChat::new(r.addr(), AGG).run();
        if out[0].0["ok"] == true {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the fleet never served: {:?}",
            out[0].0
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let warm = OpenAiChat::new(r.addr(), AGG)
        .n(6)
        .header("x-backend", "")
        .run();
    let served: std::collections::BTreeSet<String> = warm
        .iter()
        .map(|c| {
            assert_eq!(c.0["ok"], true, "{}", c.0);
            c.0["headers"]["x-backend"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    assert_eq!(served.len(), 2, "both replicas serve: {served:?}");

    signal_group(frozen_pid, libc::SIGSTOP);
    let frozen = OpenAiChat::new(r.addr(), AGG)
        .n(16)
        .header("x-backend", "")
        .timeout(Duration::from_secs(15))
        .run();
    let failed: Vec<&serde_json::Value> = frozen
        .iter()
        .map(|c| &c.0)
        .filter(|v| v["ok"] != true)
        .collect();
    for f in &failed {
        // The first-byte timeout on the shim path is a decode failure (SHIM-20; fallback off).
        assert_eq!(f["status"], 502, "{f}");
        assert!(
            f["body"]
                .as_str()
                .unwrap_or("")
                .contains("disaggregated_decode_failed"),
            "{f}"
        );
    }
    assert!(!failed.is_empty(), "the frozen replica was never tried");
    assert!(
        failed.len() <= 2 * 2,
        "{} first-byte timeouts",
        failed.len()
    );
    let mut by_index: Vec<&serde_json::Value> = frozen.iter().map(|c| &c.0).collect();
    by_index.sort_by_key(|v| v["index"].as_u64());
    for v in &by_index[8..] {
        assert_eq!(v["ok"], true, "later requests succeed: {v}");
        assert_eq!(v["headers"]["x-backend"], "fe1", "{v}");
    }
    wait_state(&r, "fe0", &["unhealthy"], STEP);

    signal_group(frozen_pid, libc::SIGCONT);
    let back = wait_state(&r, "fe0", &["healthy", "half_open"], STEP);
    assert!(
        back <= INTERVAL + Duration::from_millis(1500),
        "back {back:?} after SIGCONT (interval {INTERVAL:?})"
    );
    let after = OpenAiChat::new(r.addr(), AGG)
        .n(8)
        .header("x-backend", "")
        .run();
    assert!(after.iter().all(|c| c.0["ok"] == true), "{after:?}");
    assert!(
        after.iter().any(|c| c.0["headers"]["x-backend"] == "fe0"),
        "fe0 never served again"
    );
}
