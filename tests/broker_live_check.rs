//! `scripts/dynamo-broker-live-check.sh` (FLEET-06, FLEET-08..10) run against the local broker
//! tunnel of `tests/broker_tunnel.rs` ([`common::tunnel`]): a real etcd, pyzmq publishers, the
//! fake Kubernetes API server advertising them and holding the broker's Pod (built from the
//! `deploy/kubernetes/event-broker` Deployment as `kubectl kustomize` renders it, its `metrics`
//! port the broker process's), a router with `transport: broker`, the event bus over TLS and admin
//! auth on, and a real `continuum-event-broker`. The script reads the broker's metrics through
//! the fake's Pod proxy, exactly as it would through a real API server.
//!
//! 1. Usage: no `ROUTER_ADMIN_TOKEN`, `--probe-image` without `--bus-url`, an unknown flag: exit
//!    2 before any request.
//! 2. Connected with traffic (a `kv_metrics` and a `kv-events` message and a chat request every
//!    200 ms): exit 0; the report names the broker of each subscription, the router's bus
//!    sessions, the broker's sessions, streams and refusals, and frame counts bounded by what
//!    the router's own counters moved during the run.
//! 3. Read-only: during that run the fake API server saw only GETs (a list of the broker Pods
//!    and one Pod proxy read). With `--max-staleness-ms` below the scrape interval, check 2
//!    fails on the gap alone.
//! 4. Check 3 with a stand-in kubectl whose `run` executes the Pod's command locally: the Pod it
//!    asks for is `--rm`, non-root (65534), and the latency estimate is half the median
//!    handshake to the real bus listener.
//! 5. Broker SIGKILLed: check 1 fails naming every row that is not connected, exit 1.

#![cfg(all(feature = "dynamo-kv", feature = "dynamo-event-bus"))]
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use common::etcd::EtcdServer;
use common::kube::{FakeApiServer, kubectl_bin, pod_ip};
use common::kv::{kv_message, refs};
use common::tunnel::{
    Bus, EVENTS_ID, TOKEN_ONE, WAIT, advertise, block, broker, load_message, metrics_id,
    relayed_by, router_config, seed, stored, sub_row, wait_until,
};
use common::zmq::ZmqPublisher;
use common::{
    ADMIN_TOKEN, ADMIN_TOKEN_HASH, RouterProcess, TempDir, chat, chat_body, metric_value,
    wait_bounded,
};
use serde_json::{Value, json};

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/scripts/dynamo-broker-live-check.sh"
);
const BROKER_DEPLOY: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/deploy/kubernetes/event-broker"
);
/// The broker Pod's name in the fake.
const BROKER_POD: &str = "continuum-event-broker-7c9d5b8f4-x2k4p";
/// Bound on one run of the script (its window plus a few kubectl and curl calls).
const RUN_WITHIN: Duration = Duration::from_secs(45);

/// What one run of the script left.
struct Run {
    code: Option<i32>,
    out: String,
    err: String,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
            self.code, self.out, self.err
        )
    }
}

impl Run {
    /// The report's line starting (after its indentation) with `prefix`.
    fn line(&self, prefix: &str) -> &str {
        self.out
            .lines()
            .map(str::trim_start)
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line `{prefix}...` in the report:\n{self}"))
    }

    /// The numbers of the report's line `prefix...`, after the prefix.
    fn numbers(&self, prefix: &str) -> Vec<f64> {
        numbers(&self.line(prefix)[prefix.len()..])
    }
}

/// Every decimal number in `s`, in order.
fn numbers(s: &str) -> Vec<f64> {
    s.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter(|w| w.chars().any(|c| c.is_ascii_digit()))
        .map(|w| w.trim_matches('.').parse().unwrap())
        .collect()
}

/// Runs the script with `args` and exactly this environment beyond the inherited one (never an
/// inherited `ROUTER_ADMIN_TOKEN`).
fn run(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let out = dir.join("script.out");
    let err = dir.join("script.err");
    let mut child = Command::new("bash")
        .arg(SCRIPT)
        .args(args)
        .env_remove("ROUTER_ADMIN_TOKEN")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("spawn bash");
    let status = wait_bounded(&mut child, RUN_WITHIN)
        .unwrap_or_else(|| panic!("the script outlived {RUN_WITHIN:?}"));
    Run {
        code: status.code(),
        out: std::fs::read_to_string(&out).unwrap_or_default(),
        err: std::fs::read_to_string(&err).unwrap_or_default(),
    }
}

/// The broker's Pod as the Deployment of `deploy/kubernetes/event-broker` makes it (its
/// template's labels and spec as `kubectl kustomize` renders them), Running, its `metrics`
/// container port set to where the broker process listens.
fn broker_pod(api: &FakeApiServer, metrics_port: u16) -> Value {
    let out = api.kubectl(&["kustomize", BROKER_DEPLOY]);
    assert_eq!(out.code, Some(0), "kubectl kustomize: {}", out.stderr);
    let deployment: Value = out
        .stdout
        .split("\n---\n")
        .filter_map(|d| serde_yaml_ng::from_str::<Value>(d).ok())
        .find(|d| d["kind"] == "Deployment")
        .expect("the broker's Deployment");
    let template = &deployment["spec"]["template"];
    let mut spec = template["spec"].clone();
    let mut found = false;
    for c in spec["containers"].as_array_mut().unwrap() {
        for p in c["ports"].as_array_mut().into_iter().flatten() {
            if p["name"] == "metrics" {
                // What the script assumes when a Pod names no metrics port.
                assert_eq!(p["containerPort"], 9464, "{p}");
                p["containerPort"] = json!(metrics_port);
                found = true;
            }
        }
    }
    assert!(found, "no metrics port in {spec}");
    let started = "2026-12-01T10:00:00Z";
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": BROKER_POD, "labels": template["metadata"]["labels"]},
        "spec": spec,
        "status": {
            "phase": "Running",
            "podIP": pod_ip(BROKER_POD),
            "startTime": started,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": started}],
        },
    })
}

/// Every sample of counter `name` summed.
fn total(text: &str, name: &str) -> f64 {
    let prefix = format!("{name}{{");
    text.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The router's counters the report's figures must stay within.
#[derive(Debug, Clone, Copy)]
struct Counters {
    load_total: f64,
    load_applied: f64,
    kv_total: f64,
    selections_load: f64,
    selections_stale: f64,
}

impl Counters {
    fn read(r: &RouterProcess) -> Counters {
        let text = r.metrics();
        let get = |name: &str, labels: &[(&str, &str)]| -> f64 {
            metric_value(&text, name, labels).unwrap_or(0.0)
        };
        let selections = |reason: &str| {
            ["decode", "prefill"]
                .iter()
                .map(|role| {
                    get(
                        "continuum_dynamo_selection_total",
                        &[("role", role), ("reason", reason)],
                    )
                })
                .sum()
        };
        Counters {
            load_total: total(&text, "continuum_dynamo_load_events_total"),
            load_applied: get(
                "continuum_dynamo_load_events_total",
                &[("result", "applied")],
            ),
            kv_total: total(&text, "continuum_dynamo_kv_events_total"),
            selections_load: selections("load"),
            selections_stale: selections("round_robin_stale"),
        }
    }
}

/// Publishes a `kv_metrics` and a `kv-events` message and sends a chat request every 200 ms
/// until stopped; returns the publishers.
struct Traffic {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<(ZmqPublisher, ZmqPublisher)>,
}

impl Traffic {
    fn start(mut pm: ZmqPublisher, mut pk: ZmqPublisher, router: SocketAddr) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::spawn(move || {
            let mut seq = 0_u64;
            while !flag.load(Ordering::Relaxed) {
                seq += 1;
                pm.send(&refs(&load_message(seq, seq % 64)));
                let blocks = [block(1000 + seq)];
                pk.send(&refs(&kv_message(
                    EVENTS_ID,
                    seq,
                    &[stored(seq, None, &blocks)],
                )));
                let _ = chat(router, &chat_body("tiny-agg", "hi", false), &[]);
                std::thread::sleep(Duration::from_millis(200));
            }
            (pm, pk)
        });
        Traffic { stop, handle }
    }

    fn stop(self) -> (ZmqPublisher, ZmqPublisher) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("the traffic thread")
    }
}

/// A stand-in kubectl: `run` writes its arguments (one a line) to `$SHIM_LOG` and executes the
/// command after `--` here; anything else is the real kubectl.
const KUBECTL_SHIM: &str = r#"#!/bin/sh
for a in "$@"; do
    if [ "$a" = run ]; then
        printf '%s\n' "$@" >"$SHIM_LOG"
        while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done
        shift
        exec "$@"
    fi
done
exec "$SHIM_REAL_KUBECTL" "$@"
"#;

#[test]
fn the_live_check_passes_on_a_working_tunnel_fails_without_a_broker_and_stays_read_only() {
    let dir = TempDir::new("live-check");
    let bus = Bus::new(dir.path());
    let etcd = EtcdServer::start();
    let mut pm = ZmqPublisher::start();
    let mut pk = ZmqPublisher::start();
    seed(&etcd, &pm.endpoint(), &pk.endpoint(), None);
    let api = FakeApiServer::start();
    advertise(&api, &pm.endpoint(), &pk.endpoint());
    let mut cfg = router_config(&etcd, "broker", Some(&bus));
    cfg.token_hash = Some(ADMIN_TOKEN_HASH.into());
    // Chat requests then go through the shim, which selects a worker for each.
    cfg.disaggregated_serving = true;
    let router = RouterProcess::start(&cfg);

    let url = format!("http://{}", router.addr());
    let kubeconfig = api.kubeconfig().to_string_lossy().into_owned();
    let cache = dir.path().join("kube-cache").to_string_lossy().into_owned();
    let env = [
        ("ROUTER_ADMIN_TOKEN", ADMIN_TOKEN),
        ("KUBECONFIG", kubeconfig.as_str()),
        ("KUBECACHEDIR", cache.as_str()),
    ];
    let base = [
        "--context",
        "fake",
        "--namespace",
        "dynamo",
        "--router-url",
        url.as_str(),
    ];
    let with = |more: &[&'static str]| -> Vec<&str> { base.iter().chain(more).copied().collect() };

    // 1. Usage errors: exit 2, before any request to the API server.
    let requests = |s: &Value| s["requests"].clone();
    let before = api.stats();
    let r = run(dir.path(), &with(&["--window", "1"]), &env[1..]);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(r.err.contains("ROUTER_ADMIN_TOKEN"), "{r}");
    let r = run(
        dir.path(),
        &with(&["--probe-image", "curlimages/curl:8.11.1"]),
        &env,
    );
    assert_eq!(r.code, Some(2), "{r}");
    assert!(r.err.contains("--bus-url is required"), "{r}");
    let r = run(dir.path(), &with(&["--windows", "3"]), &env);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(r.err.contains("unknown argument: --windows"), "{r}");
    assert_eq!(requests(&api.stats()), requests(&before));

    // The broker, its Pod where the script looks for it, its subscriptions connected.
    let one = broker("b-one", TOKEN_ONE, &bus, &api);
    let port: u16 = one.metrics.rsplit(':').next().unwrap().parse().unwrap();
    api.put("pods", "dynamo", &broker_pod(&api, port));
    one.wait_healthy(WAIT);
    for p in [&mut pm, &mut pk] {
        assert!(p.wait_subscribed(WAIT).is_some(), "relayed subscription");
    }
    for (family, id) in [("kv_metrics", metrics_id()), ("kv-events", EVENTS_ID)] {
        let by = wait_until("relayed by b-one", &router, || {
            relayed_by(&router, family, id)
        });
        assert_eq!(by, "b-one");
    }
    // The Pod proxy answers only for a stored Pod.
    let missing = api.kubectl(&[
        "get",
        "--raw",
        "/api/v1/namespaces/dynamo/pods/nope:1/proxy/metrics",
    ]);
    assert_ne!(missing.code, Some(0), "{missing:?}");
    assert!(
        missing.stderr.contains(r#"pods "nope" not found"#),
        "{missing:?}"
    );

    // 2. Traffic flowing: every check passes.
    let traffic = Traffic::start(pm, pk, router.addr());
    wait_until("load samples flowing", &router, || {
        (Counters::read(&router).load_applied >= 2.0).then_some(())
    });
    let stats_before = api.stats();
    let c0 = Counters::read(&router);
    let r = run(
        dir.path(),
        &with(&["--window", "3", "--max-staleness-ms", "3000"]),
        &env,
    );
    let c1 = Counters::read(&router);
    let stats_after = api.stats();
    eprintln!("the live check on a working tunnel:\n{r}");
    assert_eq!(r.code, Some(0), "{r}");
    assert!(r.out.contains("RESULT: PASS"), "{r}");
    for (family, id) in [("kv_metrics", metrics_id()), ("kv-events", EVENTS_ID)] {
        let row = r.line(&format!("{family:<11} {id} "));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                family,
                &id.to_string(),
                "agg/backend",
                "connected",
                "broker",
                "b-one"
            ],
            "{r}"
        );
    }
    assert_eq!(
        r.line("router: continuum_dynamo_event_bus_sessions"),
        "router: continuum_dynamo_event_bus_sessions 1",
        "{r}"
    );
    assert!(
        r.line("broker Pod ").starts_with(&format!(
            "broker Pod {BROKER_POD} (Running), metrics port {port}"
        )),
        "{r}"
    );
    assert_eq!(r.numbers("continuum_event_broker_sessions "), [1.0], "{r}");
    assert_eq!(r.numbers("continuum_event_broker_streams "), [2.0], "{r}");
    assert_eq!(
        r.numbers(r#"continuum_event_broker_refusals_total{reason="target_not_advertised"}"#),
        [0.0],
        "{r}"
    );
    // Frame counts: what the router counted during the window, so within what it counted
    // during the whole run, and at least a frame a second.
    let load = r.numbers("kv_metrics frames:");
    let (decoded, applied) = (load[0], load[1]);
    assert!(
        (3.0..=c1.load_total - c0.load_total).contains(&decoded)
            && (3.0..=c1.load_applied - c0.load_applied).contains(&applied)
            && applied <= decoded,
        "{load:?} against {c0:?} .. {c1:?}\n{r}"
    );
    let kv = r.numbers("kv-events:");
    assert!(
        kv[0] >= 3.0 && kv[0] <= c1.kv_total - c0.kv_total && kv[1] >= 3.0,
        "{kv:?} against {c0:?} .. {c1:?}\n{r}"
    );
    // A sample every 200 ms, scraped once a second: the gap is the scrape interval.
    let gap = r.numbers("largest gap between applied load samples:")[0];
    assert!((900.0..=2100.0).contains(&gap), "{gap}\n{r}");
    // The share of fresh-load selections among what the router counted.
    let picked =
        (c1.selections_load - c0.selections_load) + (c1.selections_stale - c0.selections_stale);
    // Every chat request of the traffic is a selection: the report sees some of them.
    let n = r.numbers("selections on fresh load:");
    let (pct, fresh, stale) = (n[0], n[1], n[2]);
    assert!(
        (1.0..=picked).contains(&(fresh + stale)),
        "{n:?} against {c0:?} .. {c1:?}\n{r}"
    );
    assert!(
        (pct - 100.0 * fresh / (fresh + stale)).abs() < 0.06,
        "{n:?}\n{r}"
    );
    assert!(r.out.contains("skipped (no --probe-image"), "{r}");

    // 3. Read-only: only GETs reached the API server, among them one list of the broker Pods
    // and one read of its metrics through the Pod proxy.
    let methods: Vec<&String> = stats_after["requests"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(methods, ["GET"], "{stats_after}");
    let delta = |s: &Value, k: &str| s["pods"][k].as_u64().unwrap();
    assert_eq!(
        delta(&stats_after, "proxies") - delta(&stats_before, "proxies"),
        1
    );
    assert!(delta(&stats_after, "lists") > delta(&stats_before, "lists"));

    // A staleness limit below the scrape interval: the gap check fails, and says by how much.
    let r = run(
        dir.path(),
        &with(&["--window", "1", "--max-staleness-ms", "500"]),
        &env,
    );
    assert_eq!(r.code, Some(1), "{r}");
    assert!(r.out.contains("PASS: 2 subscriptions"), "{r}");
    let gap = r.numbers("FAIL: the largest gap,");
    assert!(gap[0] >= 900.0 && gap[1] == 500.0, "{r}");
    assert!(
        r.line("RESULT: FAIL").ends_with("check 2 (load freshness)"),
        "{r}"
    );

    // 4. Check 3, its Pod run here by a stand-in kubectl, against the real bus listener.
    let shim = dir.path().join("kubectl-shim.sh");
    std::fs::write(&shim, KUBECTL_SHIM).unwrap();
    let shim_log = dir.path().join("kubectl-run.args");
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (shim_path, log_path, real) = (
        shim.to_string_lossy().into_owned(),
        shim_log.to_string_lossy().into_owned(),
        kubectl_bin(),
    );
    let bus_url = format!("https://127.0.0.1:{}", bus.port);
    let mut probe_env = env.to_vec();
    probe_env.extend([
        ("CONTINUUM_KUBECTL", shim_path.as_str()),
        ("SHIM_LOG", log_path.as_str()),
        ("SHIM_REAL_KUBECTL", real.as_str()),
    ]);
    let mut args = with(&[
        "--window",
        "1",
        "--max-staleness-ms",
        "3000",
        "--probe-count",
        "5",
    ]);
    args.extend([
        "--probe-image",
        "curlimages/curl:8.11.1",
        "--bus-url",
        bus_url.as_str(),
    ]);
    let r = run(dir.path(), &args, &probe_env);
    eprintln!("with --probe-image:\n{r}");
    assert_eq!(r.code, Some(0), "{r}");
    assert_eq!(r.numbers("handshakes completed:"), [5.0, 5.0], "{r}");
    let medians = r.numbers("median TCP connect:");
    let estimate = r.numbers("one-way bus latency estimate")[0];
    assert!(medians[1] > 0.0 && medians[1] >= medians[0], "{r}");
    assert!((estimate - medians[1] / 2.0).abs() < 0.002, "{r}");
    let recorded = std::fs::read_to_string(&shim_log).unwrap();
    let argv: Vec<&str> = recorded.lines().collect();
    for flag in ["--rm", "-i", "--restart=Never", "curlimages/curl:8.11.1"] {
        assert!(argv.contains(&flag), "{flag} missing: {argv:?}");
    }
    let at = |flag: &str| argv[argv.iter().position(|a| *a == flag).unwrap() + 1];
    assert_eq!(at("-n"), "dynamo");
    assert_eq!(at("--context"), "fake");
    let pod = at("run");
    let overrides: Value = serde_json::from_str(at("--overrides")).unwrap();
    let sc = &overrides["spec"]["securityContext"];
    assert_eq!(
        (&sc["runAsNonRoot"], &sc["runAsUser"]),
        (&json!(true), &json!(65534))
    );
    assert_eq!(overrides["spec"]["containers"][0]["name"], pod);
    assert_eq!(
        overrides["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"],
        false
    );
    let (_pm, _pk) = traffic.stop();

    // 5. The broker dies: every subscription turns pending and check 1 fails, naming them.
    one.kill();
    for (family, id) in [("kv_metrics", metrics_id()), ("kv-events", EVENTS_ID)] {
        wait_until("pending after the broker died", &router, || {
            let row = sub_row(&router, family, id)?;
            (row["state"] == "pending").then_some(())
        });
    }
    let r = run(dir.path(), &with(&["--window", "1"]), &env);
    eprintln!("after the broker died:\n{r}");
    assert_eq!(r.code, Some(1), "{r}");
    assert!(
        r.out
            .contains("FAIL: 2 of 2 subscriptions not connected through a broker"),
        "{r}"
    );
    for (family, id) in [("kv_metrics", metrics_id()), ("kv-events", EVENTS_ID)] {
        let want = format!(
            "not connected: {family} publisher {id} (agg/backend): state pending, transport \
             broker, no broker"
        );
        assert!(r.out.contains(&want), "{want}\n{r}");
    }
    assert_eq!(
        r.line("router: continuum_dynamo_event_bus_sessions"),
        "router: continuum_dynamo_event_bus_sessions 0",
        "{r}"
    );
    // The traffic stopped: nothing decoded, nothing selected.
    assert_eq!(r.numbers("kv_metrics frames:"), [0.0, 0.0], "{r}");
    assert!(
        r.line("selections on fresh load:").contains("no traffic"),
        "{r}"
    );
    assert!(
        r.line("WARN: metrics unreachable")
            .contains("ServiceUnavailable")
            || r.line("WARN: metrics unreachable")
                .contains("connection refused"),
        "{r}"
    );
    assert!(
        r.line("RESULT: FAIL")
            .contains("check 1 (subscriptions through a broker)"),
        "{r}"
    );
}
