//! The Anthropic Messages and Responses ingresses end to end on a REAL Dynamo 1.6.1 fleet with
//! the official clients. Messages (`anthropic`, `tests/clients/anthropic_messages.py`): the
//! router converts each request to chat, picks and pins the workers, and converts the real
//! frontend's answer back. Responses (`openai`, `tests/clients/openai_responses.py`): native
//! passthrough to the frontend's own `/v1/responses`, pinned by model. Buffered and streamed,
//! for the aggregated and the disaggregated model (the frontend rejects wrong or missing pins,
//! so a success proves them).
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::fleet::{Fleet, FleetSpec};
use common::pyclient::run_script;
use common::{RouterProcess, metric_value};

const AGG: &str = "tiny-agg";
const DISAGG: &str = "tiny-disagg";
const ANTHROPIC: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/clients/anthropic_messages.py"
);
const RESPONSES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/clients/openai_responses.py"
);

/// A fleet with both models and a router without fallback that sees every worker.
fn fleet_and_router() -> (Fleet, RouterProcess) {
    let fleet = Fleet::start(&FleetSpec::new().agg(AGG, 1).disagg(DISAGG, 1, 1));
    let mut cfg = fleet.router_config();
    cfg.fallback_to_unified = false;
    let r = RouterProcess::start(&cfg);
    let deadline = Instant::now() + Duration::from_secs(20);
    while r.get("/admin/dynamo/workers").json()["workers"]
        .as_array()
        .map_or(0, Vec::len)
        < fleet.info.workers.len()
    {
        assert!(Instant::now() < deadline, "fleet not discovered");
        std::thread::sleep(Duration::from_millis(50));
    }
    (fleet, r)
}

/// The client script's arguments: the base URL, both models, 2 requests each way, 8 tokens.
fn client_args(base_url: String, tokens_flag: &str) -> Vec<String> {
    [
        "--base-url",
        &base_url,
        "--model",
        AGG,
        "--model",
        DISAGG,
        "--n",
        "2",
        tokens_flag,
        "8",
        "--timeout",
        "10",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn path_count(r: &RouterProcess, path: &str) -> f64 {
    metric_value(
        &r.metrics(),
        "disaggregated_requests_total",
        &[("routing_path", path)],
    )
    .unwrap_or(0.0)
}

#[test]
fn official_anthropic_client_buffered_and_streamed_on_both_models() {
    let (_fleet, r) = fleet_and_router();
    let args = client_args(format!("http://{}", r.addr()), "--max-tokens");
    let results = run_script(ANTHROPIC, &args, Duration::from_secs(120));
    assert_eq!(results.len(), 8, "{results:#?}");
    for res in &results {
        assert_eq!(res["ok"], true, "{res:#}\nrouter stderr:\n{}", r.stderr());
        assert_eq!(res["type"], "message", "{res:#}");
        assert_eq!(res["role"], "assistant");
        assert_eq!(res["response_model"], res["model"]);
        assert!(!res["text"].as_str().unwrap().is_empty(), "{res:#}");
        // The mocker always generates max_tokens tokens.
        assert_eq!(res["stop_reason"], "max_tokens", "{res:#}");
        assert_eq!(res["usage"]["output_tokens"], 8, "{res:#}");
        assert!(
            res["usage"]["input_tokens"].as_u64().unwrap() > 0,
            "{res:#}"
        );
        if res["stream"] == true {
            let events: Vec<&str> = res["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e.as_str().unwrap())
                .collect();
            assert_eq!(events.first(), Some(&"message_start"), "{events:?}");
            assert_eq!(events.last(), Some(&"message_stop"), "{events:?}");
            assert!(res["text_deltas"].as_u64().unwrap() >= 1, "{res:#}");
        }
    }
    assert_eq!(path_count(&r, "unified"), 4.0);
    assert_eq!(path_count(&r, "disaggregated"), 4.0);
    assert_eq!(
        metric_value(
            &r.metrics(),
            "continuum_http_requests_total",
            &[("route", "messages"), ("status", "200")]
        ),
        Some(8.0)
    );
}

#[test]
fn official_openai_client_responses_pass_through_pinned_on_both_models() {
    let (_fleet, r) = fleet_and_router();
    let args = client_args(format!("http://{}/v1", r.addr()), "--max-output-tokens");
    let results = run_script(RESPONSES, &args, Duration::from_secs(120));
    assert_eq!(results.len(), 8, "{results:#?}");
    for res in &results {
        assert_eq!(res["ok"], true, "{res:#}\nrouter stderr:\n{}", r.stderr());
        assert_eq!(res["response_model"], res["model"]);
        assert!(!res["text"].as_str().unwrap().is_empty(), "{res:#}");
        // The mocker stops at max_output_tokens: the frontend reports it as incomplete.
        assert_eq!(res["status"], "incomplete", "{res:#}");
        assert_eq!(res["output_tokens"], 8, "{res:#}");
        if res["stream"] == true {
            let events = res["events"].as_array().unwrap();
            assert_eq!(events.first().unwrap(), "response.created", "{events:?}");
        }
    }
    assert_eq!(path_count(&r, "unified"), 4.0);
    assert_eq!(path_count(&r, "disaggregated"), 4.0);
}
