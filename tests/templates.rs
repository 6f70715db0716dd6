//! CFG-30: the config templates in `deploy/config-templates/` validate in the release build and
//! in a build without the Dynamo features (CFG-04), and the router starts with each one and does
//! what it says, with only the template's placeholders (addresses, paths, digests) replaced by
//! this test's: a real Dynamo 1.6.1 fleet for the etcd templates (pins sent, KV picks made), the
//! file store, the fake Kubernetes API server, and a real `curl --http2` broker session for the
//! event bus.
#![cfg(feature = "dynamo-event-bus")]
#![cfg(feature = "dynamo-kv")]
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::client::{request_bytes, roundtrip};
use common::fleet::{Fleet, FleetSpec};
use common::kube::{FakeApiServer, operator_pod};
use common::kv_pick::{explain, tiny_model_digests, wait_kv_ready};
use common::pki::TestCa;
use common::router::featureless_bin;
use common::{RouterConfig, RouterProcess, TempDir, free_port, metric_value, run_cli, run_cli_of};
use serde_json::Value;
use sha2::Digest as _;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/config-templates");

/// Every template, and the warnings `config validate` may print for it (anything else fails).
const TEMPLATES: &[(&str, &[&str])] = &[
    ("dynamo-direct-shim.yaml", &[]),
    ("dynamo-kv-aware.yaml", &[]),
    ("dynamo-event-bus.yaml", &[]),
    ("discovery-file.yaml", &[]),
    ("discovery-kubernetes.yaml", &[]),
    // Inherent to the source: Pods carry no load or capacity.
    (
        "discovery-kubernetes-pods.yaml",
        &["dynamo.discovery.source: kubernetes_pods provides no capacity or load signals"],
    ),
];

fn template(name: &str) -> String {
    let path = Path::new(DIR).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `text` with each `(placeholder, value)` replaced; every placeholder must be in it, so a
/// template that drops one fails here rather than running with the operator's address.
fn fill(text: &str, subs: &[(&str, String)]) -> String {
    let mut out = text.to_string();
    for (from, to) in subs {
        assert!(
            out.contains(from),
            "placeholder `{from}` missing from:\n{text}"
        );
        out = out.replace(from, to);
    }
    out
}

/// `name` filled with `subs`, bound to the router's test address.
fn filled(name: &str, subs: Vec<(&'static str, String)>) -> impl Fn(SocketAddr) -> String {
    let text = template(name);
    move |addr| {
        let mut all = subs.clone();
        all.push(("0.0.0.0:8080", addr.to_string()));
        fill(&text, &all)
    }
}

fn wait_until<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "{what}: not within {secs} s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The instance ids `/admin/dynamo/workers` lists.
fn worker_ids(r: &RouterProcess) -> Vec<u64> {
    let v = r.get("/admin/dynamo/workers").json();
    let mut ids: Vec<u64> = v["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w["worker_id"].as_str()?.parse().ok())
        .collect();
    ids.sort_unstable();
    ids
}

fn chat(r: &RouterProcess, model: &str) -> (u16, Option<String>, String) {
    let body = format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"hello"}}],"max_tokens":4}}"#
    );
    let resp = roundtrip(
        r.addr(),
        &request_bytes(
            "POST",
            "/v1/chat/completions",
            &[("Content-Type", "application/json"), ("x-backend", "")],
            Some(body.as_bytes()),
        ),
    )
    .unwrap_or_else(|e| panic!("chat {model}: {e}"));
    (
        resp.status,
        resp.header("x-continuum-worker-instance-id")
            .map(str::to_string),
        resp.text(),
    )
}

#[test]
fn every_template_validates_in_the_release_build_and_without_the_features() {
    let bare = featureless_bin();
    let mut seen = std::fs::read_dir(DIR)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect::<Vec<_>>();
    seen.sort();
    let mut listed: Vec<String> = TEMPLATES.iter().map(|(n, _)| (*n).to_string()).collect();
    listed.sort();
    assert_eq!(seen, listed, "a template is not tested here, or gone");
    for (name, allowed) in TEMPLATES {
        let path = Path::new(DIR).join(name);
        let path = path.to_str().unwrap();
        let full = run_cli(&["config", "validate", "--config", path]);
        assert_eq!(full.code, Some(0), "{name}: {full:?}");
        for line in full.stdout.lines().filter(|l| l.starts_with("warning: ")) {
            assert!(
                allowed.iter().any(|a| line.contains(a)),
                "{name}: unexpected warning {line}"
            );
        }
        let out = run_cli_of(&bare, &["config", "validate", "--config", path]);
        assert_eq!(out.code, Some(0), "{name} (featureless): {out:?}");
        assert!(
            out.stdout
                .contains("this binary was built without the `dynamo` feature"),
            "{name} (featureless): {out:?}"
        );
    }
}

/// dynamo-direct-shim.yaml and dynamo-kv-aware.yaml over a real 1.6.1 fleet in Dynamo namespace
/// `dynamo`: every worker discovered, chats answered with pins, and with the KV template (its
/// artifacts pinned, as its comment says) KV-aware picks.
#[test]
fn the_etcd_templates_route_a_real_fleet() {
    let fleet = Fleet::start(&FleetSpec::new().agg_in("dynamo", "tiny-agg", 2));
    let frontend = fleet.info.frontends["dynamo"][0].clone();
    let mut want: Vec<u64> = fleet.info.workers.iter().map(|w| w.instance_id).collect();
    want.sort_unstable();
    let common = vec![
        (
            "http://dynamo-frontend.dynamo.svc.cluster.local:8000",
            frontend,
        ),
        (
            "http://etcd.dynamo.svc.cluster.local:2379",
            fleet.info.etcd_endpoint.clone(),
        ),
        ("10.0.0.0/8", "127.0.0.0/8".to_string()),
    ];

    let shim = RouterProcess::start_yaml(
        &RouterConfig::default(),
        &filled("dynamo-direct-shim.yaml", common.clone()),
    );
    wait_until("every worker discovered (direct shim)", 30, || {
        (worker_ids(&shim) == want).then_some(())
    });
    let (status, pinned, text) = chat(&shim, "tiny-agg");
    assert_eq!(status, 200, "{text}");
    let pinned: u64 = pinned
        .unwrap_or_else(|| panic!("no pin reported: {text}"))
        .parse()
        .unwrap();
    assert!(want.contains(&pinned), "{pinned} not in {want:?}");
    drop(shim);

    let digests: Vec<String> = tiny_model_digests()
        .iter()
        .map(|d| format!("\"{d}\""))
        .collect();
    let mut kv_subs = common;
    kv_subs.push((
        "pinned_artifacts: []",
        format!("pinned_artifacts: [{}]", digests.join(", ")),
    ));
    let kv = RouterProcess::start_yaml(
        &RouterConfig::default(),
        &filled("dynamo-kv-aware.yaml", kv_subs),
    );
    wait_until("every worker discovered (KV)", 30, || {
        (worker_ids(&kv) == want).then_some(())
    });
    wait_kv_ready(&kv, want.len());
    let body = br#"{"model":"tiny-agg","messages":[{"role":"user","content":"hello"}]}"#;
    let e = explain(&kv, "", body, None);
    assert_eq!(e.status, 200, "{}", e.text());
    let v: Value = e.json();
    assert_eq!(v["kv"]["enabled"], true, "{v}");
    let (status, pinned, text) = chat(&kv, "tiny-agg");
    assert_eq!(status, 200, "{text}");
    assert!(pinned.is_some(), "{text}");
    // The pick was KV-aware: made over the index with the pinned tokenizer, not skipped.
    let m = kv.metrics();
    let kv_picks: f64 = ["overlap", "no_overlap"]
        .iter()
        .map(|r| {
            metric_value(&m, "continuum_dynamo_kv_selection_total", &[("result", r)]).unwrap_or(0.0)
        })
        .sum();
    assert!(kv_picks >= 1.0, "no KV-aware pick:\n{m}");
}

/// discovery-file.yaml over a file store the simulator writes.
#[test]
fn the_file_template_discovers_the_file_store() {
    let dir = TempDir::new("template-file");
    let root = dir.path().join("kv");
    common::filestore::write_fixture(&root);
    let r = RouterProcess::start_yaml(
        &RouterConfig::default(),
        &filled(
            "discovery-file.yaml",
            vec![
                ("/var/lib/dynamo/kv", root.display().to_string()),
                ("namespaces: [dynamo]", "namespaces: [agg]".into()),
            ],
        ),
    );
    // The recorded fleet's two aggregated workers of namespace `agg`, and nothing else.
    let mut want = common::shim::AGG_IDS.to_vec();
    want.sort_unstable();
    wait_until("the agg workers from the file store", 15, || {
        (worker_ids(&r) == want).then_some(())
    });
}

/// The two Kubernetes templates against the fake API server (a kubeconfig, as outside a Pod):
/// the metadata source watches DynamoWorkerMetadata and EndpointSlices, the Pod source finds a
/// ready worker Pod labelled with the template's Dynamo namespace.
#[test]
fn the_kubernetes_templates_watch_the_api_server() {
    let api = FakeApiServer::start();
    api.put(
        "pods",
        "dynamo",
        &operator_pod(
            "worker-0",
            "dynamo",
            "worker",
            None,
            Some("VllmWorker"),
            true,
        ),
    );
    let cfg = RouterConfig {
        env: vec![(
            "KUBECONFIG".into(),
            api.kubeconfig().to_string_lossy().into_owned(),
        )],
        ..RouterConfig::default()
    };
    let cidr = || vec![("10.0.0.0/8", "127.0.0.0/8".to_string())];

    let meta = RouterProcess::start_yaml(&cfg, &filled("discovery-kubernetes.yaml", cidr()));
    api.wait_open_watches("dynamoworkermetadatas", 1, Duration::from_secs(20));
    api.wait_open_watches("endpointslices", 1, Duration::from_secs(20));
    drop(meta);

    let pods = RouterProcess::start_yaml(&cfg, &filled("discovery-kubernetes-pods.yaml", cidr()));
    api.wait_open_watches("pods", 1, Duration::from_secs(20));
    let ids = wait_until("the worker Pod discovered", 20, || {
        let ids = worker_ids(&pods);
        (!ids.is_empty()).then_some(ids)
    });
    assert_eq!(ids.len(), 1, "{ids:?}");
}

fn sha256_hex(text: &str) -> String {
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// dynamo-event-bus.yaml: its listener, with a generated CA's certificate and the template's own
/// token digest (of `change-me`), opens a session for `curl --http2` and refuses another token.
#[test]
fn the_event_bus_template_serves_a_broker_session() {
    let dir = TempDir::new("template-bus");
    let ca = TestCa::new(dir.path(), "ca", "template bus CA");
    let server = ca.server(dir.path(), "bus", &["localhost", "127.0.0.1"]);
    let port = free_port();
    let text = template("dynamo-event-bus.yaml");
    assert!(
        text.contains(&sha256_hex("change-me")),
        "the comment says its digest is of change-me"
    );
    let subs = vec![
        ("0.0.0.0:7443", format!("127.0.0.1:{port}")),
        (
            "/etc/continuum/bus/tls.crt",
            server.cert.display().to_string(),
        ),
        (
            "/etc/continuum/bus/tls.key",
            server.key.display().to_string(),
        ),
    ];
    let r = RouterProcess::start_yaml(
        &RouterConfig::default(),
        &filled("dynamo-event-bus.yaml", subs),
    );
    wait_until("the listener answers", 15, || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    let session = |token: &str| -> Value {
        let hello = dir.path().join("hello.ndjson");
        std::fs::write(
            &hello,
            "{\"type\":\"hello\",\"role\":\"broker\",\"client_id\":\"broker-a.dynamo\",\"versions\":[1],\"dynamo_namespaces\":[\"dynamo\"]}\n",
        )
        .unwrap();
        let out = Command::new("curl")
            .args(["-sS", "--http2", "--max-time", "2", "--cacert"])
            .arg(&ca.pem)
            .args(["-H", &format!("authorization: Bearer {token}")])
            .args(["-H", "continuum-bus-version: 1", "--data-binary"])
            .arg(format!("@{}", hello.display()))
            .arg(format!("https://localhost:{port}/bus/v1/session"))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(stdout.lines().next().unwrap_or_default()).unwrap_or_else(|_| {
            panic!(
                "curl: {stdout} / {} / router: {}",
                String::from_utf8_lossy(&out.stderr),
                r.stderr()
            )
        })
    };
    let welcome = session("change-me");
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    let refused = session("not-the-token");
    assert_eq!(refused["error"]["code"], "unauthenticated", "{refused}");
}

/// The spec's path for the templates (CFG-30) leads to the same files.
#[test]
fn the_spec_path_names_the_same_templates() {
    let spec: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "docs/shared/llm-skills/config-templates",
    ]
    .iter()
    .collect();
    for name in [
        "dynamo-direct-shim.yaml",
        "dynamo-kv-aware.yaml",
        "dynamo-event-bus.yaml",
    ] {
        assert_eq!(
            std::fs::read_to_string(spec.join(name)).unwrap(),
            template(name),
            "{name}"
        );
    }
}
