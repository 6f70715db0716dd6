//! CFG-04 and ADMIN-08 end to end: the router built without the Dynamo features (`cargo build
//! -p continuum-router`, which tests/run.sh copies to `target/featureless/`) validates a Dynamo
//! config exactly as the release build does, warns loudly for each feature it lacks, and serves
//! plain routing; `/admin/dynamo/*` is not mounted there.
//!
//! The featureless binary: [`featureless_bin`].
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;

use common::client::post;
use common::router::featureless_bin;
use common::{
    CliOutput, MockBackend, RouterConfig, RouterProcess, TempDir, free_port, get, run_cli,
    run_cli_of,
};

/// Discovery on an etcd nobody listens on, the shim on the one backend, KV-aware picks and the
/// event bus: every feature a featureless build lacks.
const DYNAMO: &str = "dynamo:\n  enabled: true\n  discovery:\n    source: etcd\n    etcd:\n      \
endpoints: [\"http://127.0.0.1:9\"]\n  load:\n    direct_allow_cidrs: [127.0.0.0/8]\n  shim:\n    \
backends: [fe]\n  kv:\n    enabled: true\n  event_bus:\n    enabled: true\n    listen: \"127.0.0.1:7443\"\n    \
tls: { cert: /nonexistent/cert.pem, key: /nonexistent/key.pem }\n    brokers: [ { id: b.dynamo, token_hash: \
\"sha256:0000000000000000000000000000000000000000000000000000000000000000\", namespaces: [dynamo] } ]\n";

fn config(url: &str) -> RouterConfig {
    let mut cfg = RouterConfig::default().backend("fe", url, &["m"]);
    cfg.shards = "1".into();
    cfg.disaggregated_serving = true;
    cfg.extra_yaml = DYNAMO.into();
    cfg
}

/// `warning: FIELD: ...` lines naming a build feature.
fn unbuilt_warnings(out: &CliOutput) -> Vec<String> {
    format!("{}\n{}", out.stdout, out.stderr)
        .lines()
        .filter(|l| l.starts_with("warning: ") && l.contains("this binary was built without"))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_featureless_build_validates_a_dynamo_config_as_the_release_build_does_and_warns() {
    let bin = featureless_bin();
    let dir = TempDir::new("featureless");
    let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let path = dir.write("ok.yaml", &config("http://127.0.0.1:9").to_yaml(addr));
    let path = path.to_str().unwrap();

    let full = run_cli(&["config", "validate", "--config", path]);
    assert_eq!(full.code, Some(0), "{full:?}");
    assert!(unbuilt_warnings(&full).is_empty(), "{full:?}");

    let bare = run_cli_of(&bin, &["config", "validate", "--config", path]);
    assert_eq!(
        bare.code,
        Some(0),
        "the featureless build refused: {bare:?}"
    );
    let warnings = unbuilt_warnings(&bare);
    for (field, feature) in [
        ("dynamo.enabled", "`dynamo`"),
        ("dynamo.kv.enabled", "`dynamo-kv`"),
        ("dynamo.event_bus.enabled", "`dynamo-event-bus`"),
    ] {
        assert!(
            warnings
                .iter()
                .any(|w| w.starts_with(&format!("warning: {field}: ")) && w.contains(feature)),
            "no warning for {field}: {bare:?}"
        );
    }
    assert_eq!(warnings.len(), 3, "{warnings:#?}");
    // Every other line (the config's own warnings) is the same in both builds.
    let others = |o: &CliOutput| -> Vec<String> {
        o.stdout
            .lines()
            .filter(|l| !l.contains("this binary was built without"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(others(&bare), others(&full));

    // An invalid Dynamo section is refused by both, with the same lines.
    let bad = dir.write(
        "bad.yaml",
        &config("http://127.0.0.1:9")
            .to_yaml(addr)
            .replace("source: etcd", "source: zookeeper"),
    );
    let bad = bad.to_str().unwrap();
    let full = run_cli(&["config", "validate", "--config", bad]);
    let bare = run_cli_of(&bin, &["config", "validate", "--config", bad]);
    assert_eq!(full.code, Some(1), "{full:?}");
    assert_eq!(bare.code, Some(1), "{bare:?}");
    assert!(full.stdout.contains("dynamo.discovery.source"), "{full:?}");
    assert_eq!(bare.stdout, full.stdout);

    // `config show` prints what runs: the features off, the reason on stderr.
    let show = run_cli_of(&bin, &["config", "show", "--config", path]);
    assert_eq!(show.code, Some(0), "{show:?}");
    assert_eq!(unbuilt_warnings(&show).len(), 3, "{show:?}");

    let version = run_cli_of(&bin, &["version"]);
    assert!(version.stdout.contains("features: none"), "{version:?}");
    let version = run_cli(&["version"]);
    assert!(
        version
            .stdout
            .contains("features: dynamo dynamo-kv dynamo-event-bus"),
        "{version:?}"
    );
}

#[test]
fn a_featureless_build_warns_at_startup_and_serves_plain_routing() {
    let backend = MockBackend::start("fe");
    let mut cfg = config(&backend.url());
    cfg.binary = Some(featureless_bin());
    let router = RouterProcess::start(&cfg);
    let log = router.stderr();
    for field in [
        "dynamo.enabled",
        "dynamo.kv.enabled",
        "dynamo.event_bus.enabled",
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains("WARN") && l.contains(field) && l.contains("built without")),
            "no startup warning for {field}:\n{log}"
        );
    }

    let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let r = post(router.addr(), "/v1/chat/completions", body, &[]);
    assert_eq!(r.status, 200, "{:?}", r.text());
    let seen = backend.wait_requests(1, std::time::Duration::from_secs(5));
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/v1/chat/completions");
    let pins: Vec<_> = seen[0]
        .headers
        .iter()
        .filter(|(k, _)| k.to_ascii_lowercase().starts_with("x-dynamo-"))
        .collect();
    assert!(pins.is_empty(), "plain routing sent pins: {pins:?}");

    // ADMIN-08: the Dynamo admin routes are not mounted.
    assert_eq!(get(router.addr(), "/admin/dynamo/workers").status, 404);
    let explain = post(router.addr(), "/admin/dynamo/explain", body, &[]);
    assert_eq!(explain.status, 404, "{:?}", explain.text());
    // Nothing listens for brokers and nothing subscribes.
    let metrics = router.metrics();
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("continuum_dynamo_kv_subscriptions{") && !l.ends_with(" 0")),
        "{metrics}"
    );
}
