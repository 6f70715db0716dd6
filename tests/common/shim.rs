//! The recorded Dynamo 1.6.1 fleet behind scripted shim replicas, for the shim-path tests
//! (`tests/shim_dispatch.rs`, `tests/shim_reload.rs`): a file store with two aggregated
//! `tiny-agg` workers in namespace `agg` and a prefill/decode pair serving `tiny-disagg` in
//! `disagg`, one `MockBackend` per namespace's pool, and a plain backend serving both models
//! (and one only it serves) for the unified fallback.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::filestore::write_fixture;
use super::{
    MockBackend, RecordedRequest, Reply, RouterConfig, RouterProcess, STEP, TempDir, metric_value,
};

pub const AGG: &str = "tiny-agg";
pub const DISAGG: &str = "tiny-disagg";
pub const AGG_IDS: [u64; 2] = [0x6a6c_a22d_4998_ac0b, 0x6a6c_a22d_4998_ac16];
pub const PREFILL_ID: u64 = 0x6a6c_a22d_4998_ac07;
pub const DECODE_ID: u64 = 0x6a6c_a22d_4998_ac09;
/// A model only the plain backend serves.
pub const PLAIN_ONLY: &str = "plain-only";
pub const REJECTION: &str = "Prefill worker ID required in Direct routing mode";

pub struct Setup {
    _dir: TempDir,
    /// The file store root.
    pub root: PathBuf,
    /// The config the router started with.
    pub cfg: RouterConfig,
    pub router: RouterProcess,
    pub shim_agg: MockBackend,
    pub shim_disagg: MockBackend,
    pub unified: MockBackend,
}

/// The router over the fixture fleet. `agg_pool` / `disagg_pool` are extra replica URLs listed
/// before the scripted shim of each pool (e.g. a refusing one).
pub fn setup(fallback: bool, agg_first: Option<String>) -> Setup {
    let dir = TempDir::new("shim-dispatch");
    let root = dir.path().join("store");
    write_fixture(&root);
    let shim_agg = MockBackend::start("shim-agg");
    let shim_disagg = MockBackend::start("shim-disagg");
    let unified = MockBackend::start("unified");
    let mut cfg = RouterConfig::default()
        .backend("shim-agg", &shim_agg.url(), &[])
        .backend("shim-disagg", &shim_disagg.url(), &[])
        .backend("unified", &unified.url(), &[AGG, DISAGG, PLAIN_ONLY]);
    let mut agg_pool = vec!["shim-agg"];
    if let Some(url) = &agg_first {
        cfg = cfg.backend("shim-dead", url, &[]);
        agg_pool.insert(0, "shim-dead");
    }
    cfg.disaggregated_serving = true;
    cfg.fallback_to_unified = fallback;
    cfg.connect_retries = 2;
    cfg.extra_yaml = dynamo_yaml(&root, &agg_pool.join(", "), true);
    let router = RouterProcess::start(&cfg);
    let deadline = Instant::now() + STEP;
    loop {
        let v = router.get("/admin/dynamo/workers").json();
        if v["workers"].as_array().map_or(0, Vec::len) == 4 {
            break;
        }
        assert!(Instant::now() < deadline, "fleet not discovered: {v:#}");
        std::thread::sleep(Duration::from_millis(50));
    }
    Setup {
        _dir: dir,
        root,
        cfg,
        router,
        shim_agg,
        shim_disagg,
        unified,
    }
}

pub fn pin(r: &RecordedRequest, name: &str) -> Option<u64> {
    r.header(name).map(|v| {
        v.parse::<u64>()
            .unwrap_or_else(|_| panic!("{name}: {v:?} is not decimal"))
    })
}

pub fn metric(s: &Setup, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(&s.router.metrics(), name, labels).unwrap_or(0.0)
}

pub fn error_body(status: u16, body: &str) -> Reply {
    Reply::Full {
        status,
        headers: vec![("Content-Type".into(), "application/json".into())],
        body: body.as_bytes().to_vec(),
    }
}

/// The `dynamo:` section: the file store at `root`, the `agg` pool `agg_pool` (comma-separated
/// backend names) and, when `with_disagg`, the `disagg` namespace and its pool.
pub fn dynamo_yaml(root: &std::path::Path, agg_pool: &str, with_disagg: bool) -> String {
    let root_json = Value::String(root.display().to_string());
    let (namespaces, disagg_pool) = if with_disagg {
        (
            "[agg, disagg]",
            "      - { namespace: disagg, backends: [shim-disagg] }\n",
        )
    } else {
        ("[agg]", "")
    };
    format!(
        "dynamo:\n  enabled: true\n  discovery:\n    source: file\n    file:\n      root: {root_json}\n      \
         ttl: 10m\n      namespaces: {namespaces}\n  load:\n    direct_allow_cidrs: [\"127.0.0.0/8\"]\n  \
         shim:\n    pools:\n      - {{ namespace: agg, backends: [{agg_pool}] }}\n{disagg_pool}"
    )
}
