//! The OpenAI surface on a REAL Dynamo 1.6.1 fleet (issue 14), as SDKs and benchmark tools use it:
//!
//! - `models.list()` (the official `openai` client) returns the fleet's models, gains a model when
//!   a worker of it registers and loses it when its last worker dies, and a listed model is one a
//!   request is pinned for;
//! - NVIDIA's AIPerf (pinned, its own venv) profiles the router with `--endpoint-type completions`
//!   and `chat`, `--streaming`, and reports no error; every request was picked KV-aware.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo-kv")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::RouterProcess;
use common::aiperf::Profile;
use common::client::post;
use common::fleet::{Fleet, FleetSpec};
use common::kv_pick::{kv_router, kv_selections, tiny_model_digests, wait_kv_ready};
use common::pyclient::run_script;
use common::router::metric_value;
use serde_json::{Value, json};

const AGG: &str = "tiny-agg";
const DISAGG: &str = "tiny-disagg";
const NEW: &str = "tiny-new";
const OPENAI_MODELS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/clients/openai_models.py"
);

/// `models.list()` and `models.retrieve(NEW)` with the official client.
fn models(r: &RouterProcess) -> (Vec<String>, Value) {
    let args = vec![
        "--base-url".to_string(),
        format!("http://{}/v1", r.addr()),
        "--retrieve".into(),
        NEW.into(),
    ];
    let out = run_script(OPENAI_MODELS, &args, Duration::from_secs(30));
    let listed = out[0]["listed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    (listed, out[0]["retrieved"][NEW].clone())
}

/// Waits (bounded) until the router's raw list is `want`.
fn wait_listed(r: &RouterProcess, want: &[&str], within: Duration) {
    let end = Instant::now() + within;
    loop {
        let v = r.get("/v1/models").json();
        let ids: Vec<&str> = v["data"]
            .as_array()
            .map(|a| a.iter().filter_map(|m| m["id"].as_str()).collect())
            .unwrap_or_default();
        if ids == want {
            return;
        }
        assert!(Instant::now() < end, "listed {ids:?}, want {want:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn complete(r: &RouterProcess, model: &str) -> common::Response {
    let body = json!({"model": model, "prompt": "hello", "max_tokens": 2}).to_string();
    post(
        r.addr(),
        "/v1/completions",
        body.as_bytes(),
        &[("x-backend", "")],
    )
}

#[test]
fn the_models_list_follows_the_real_fleet_as_workers_come_and_go() {
    let mut fleet = Fleet::start(
        &FleetSpec::new()
            .agg(AGG, 1)
            .disagg(DISAGG, 1, 1)
            .lease_ttl(3),
    );
    let r = RouterProcess::start(&fleet.router_config());
    wait_listed(&r, &[AGG, DISAGG], Duration::from_secs(20));
    let (listed, new) = models(&r);
    assert_eq!(listed, [AGG, DISAGG]);
    assert_eq!(new["status"], 404, "{new}");

    if fleet.release() < (1, 6, 0) {
        // Dynamo before 1.6 serves one model per endpoint (FLEET-03): a worker of a new model
        // on `agg/backend/generate` exits at once, so there is no new model to follow here.
        common::fleet::compat_skip("ai-dynamo before 1.6 serves one model per endpoint");
        return;
    }
    // A worker of a new model registers: listed, retrievable, and a request for it is pinned
    // to that worker (the frontend answers only a correct pin).
    let w = fleet.add("agg", NEW);
    wait_listed(&r, &[AGG, DISAGG, NEW], Duration::from_secs(20));
    let (listed, new) = models(&r);
    assert_eq!(listed, [AGG, DISAGG, NEW]);
    assert_eq!(new["ok"], true, "{new}");
    let end = Instant::now() + Duration::from_secs(20);
    let resp = loop {
        // The frontend learns the model from etcd too; until it has, it answers 404.
        let resp = complete(&r, NEW);
        if resp.status == 200 || Instant::now() > end {
            break resp;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        resp.header("x-continuum-worker-instance-id"),
        Some(w.instance_id.to_string().as_str())
    );

    // Its last worker dies: once the lease is gone the model is not listed, and not found.
    fleet.kill(&w.instance_id_hex, "SIGKILL");
    wait_listed(&r, &[AGG, DISAGG], Duration::from_secs(30));
    let (listed, new) = models(&r);
    assert_eq!(listed, [AGG, DISAGG]);
    assert_eq!(new["status"], 404, "{new}");
    let resp = complete(&r, NEW);
    assert_eq!(resp.status, 404, "{}", resp.text());
    assert_eq!(resp.json()["error"]["code"], "model_not_found");
}

#[test]
fn aiperf_profiles_completions_and_chat_through_the_router_without_errors() {
    let fleet = Fleet::start(&FleetSpec::new().agg(AGG, 2));
    let r = kv_router(&fleet, &tiny_model_digests(), "");
    wait_kv_ready(&r, 2);
    let requests = 24;
    for (endpoint_type, route) in [("completions", "completions"), ("chat", "chat_completions")] {
        let export = Profile {
            addr: r.addr(),
            model: AGG,
            endpoint_type,
            requests,
            concurrency: 4,
            input_tokens: 300,
            output_tokens: 8,
            headers: &[],
            deadline: Duration::from_secs(180),
        }
        .run();
        assert_eq!(
            export["error_summary"],
            json!([]),
            "{endpoint_type}: {export}"
        );
        assert_eq!(export["request_error_rate"]["avg"], 0.0, "{endpoint_type}");
        assert_eq!(
            export["request_count"]["avg"],
            f64::from(requests),
            "{endpoint_type}"
        );
        assert_eq!(
            export["time_to_first_token"]["count"], requests,
            "{endpoint_type}: every request streamed a first token"
        );
        assert_eq!(
            metric_value(
                &r.metrics(),
                "continuum_http_requests_total",
                &[("route", route), ("status", "200")]
            ),
            Some(f64::from(requests)),
            "{endpoint_type}"
        );
    }
    let m = r.metrics();
    let kv = |result| kv_selections(&m, result);
    assert_eq!(
        kv("overlap") + kv("no_overlap"),
        f64::from(2 * requests),
        "every request picked KV-aware:\n{m}"
    );
}
