//! `POST /v1/completions` on a REAL Dynamo 1.6.1 fleet (issue 14): `dynamo.mocker` workers
//! behind direct-mode frontends, which answer 200 only to a request carrying a correct pin, and
//! the router with `dynamo.kv` on and the tiny model pinned.
//!
//! - The official `openai` client (`tests/clients/openai_completions.py`) sends string,
//!   token-id and batch prompts, buffered and streamed, to an aggregated and a disaggregated
//!   model: every answer is 200 with one choice per prompt, pinned to a worker of the model
//!   (and its prefill worker), and the frontend counted the prompt tokens the router hashed.
//! - A repeated long completions prompt is picked `kv_aware` with overlap, on the worker that
//!   holds it; its token ids, sent as a token-id prompt, land there too; the hash-parity watchdog
//!   confirms the engine stored every prompt under the router's hashes.
//! - With `send_token_data`, the frontend uses the router's ids for a single text prompt (its
//!   `[SIDECAR-SKIP-TOKENIZE]` line) and tokenizes a batch and a token-id prompt itself, so
//!   every prompt of a batch is answered as sent.
//! - An unknown model is the OpenAI 404, a body without a usable `prompt` the OpenAI 400 with
//!   its reason; neither reaches the shim.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo-kv")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::RouterProcess;
use common::client::{Response, get};
use common::fleet::{Fleet, FleetSpec, Role};
use common::kv::wait_view;
use common::kv_pick::{kv_router, kv_selection, skip_counts, tiny_model_digests, wait_kv_ready};
use common::pyclient::run_script;
use common::router::metric_value;
use serde_json::{Value, json};

const AGG: &str = "tiny-agg";
const DISAGG: &str = "tiny-disagg";
const MAX_TOKENS: u64 = 3;
const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/clients/openai_completions.py"
);

/// A completions prompt of several 64-token blocks, distinct per `n`.
fn long_prompt(n: usize) -> String {
    (0..12)
        .map(|i| format!("Document {n}, paragraph {i}: the router keeps this prefix warm. "))
        .collect()
}

fn post(r: &RouterProcess, body: &Value) -> Response {
    let bytes = body.to_string().into_bytes();
    common::client::post(r.addr(), "/v1/completions", &bytes, &[("x-backend", "")])
}

fn count(r: &RouterProcess, family: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(&r.metrics(), family, labels).unwrap_or(0.0)
}

/// The sum of every series of the frontends' metric `family` (1.6.1 exposes
/// `dynamo_frontend_requests_started_total{endpoint,model,request_type}` and
/// `dynamo_frontend_failures_total{class,reason}`).
fn frontend_total(fleet: &Fleet, family: &str) -> f64 {
    fleet
        .info
        .frontend_processes
        .iter()
        .map(|f| {
            let text = get(f.addr, "/metrics").text();
            text.lines()
                .filter(|l| l.starts_with(family) && l[family.len()..].starts_with(['{', ' ']))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        })
        .sum()
}

#[test]
fn every_prompt_shape_is_pinned_buffered_and_streamed_with_the_official_client() {
    let fleet = Fleet::start(&FleetSpec::new().agg(AGG, 2).disagg(DISAGG, 1, 1));
    let r = kv_router(&fleet, &tiny_model_digests(), "");
    // kv-events publishers: the two aggregated workers and the prefill worker.
    wait_kv_ready(&r, 3);
    let ids = |model: &str, role: Role| -> BTreeSet<String> {
        fleet
            .workers_of(model)
            .into_iter()
            .filter(|w| w.role == role)
            .map(|w| w.instance_id.to_string())
            .collect()
    };
    // (prompt, prompts in it, prompt tokens when the frontend counts them exactly)
    let prompts = [
        (json!("Say hello to the router"), 1, None),
        (json!([11, 12, 13, 14, 15]), 1, Some(5)),
        (json!(["a b", "c d e"]), 2, Some(5)),
        (json!([[1, 2, 3], [4]]), 2, Some(4)),
    ];
    let mut args = vec![
        "--base-url".to_string(),
        format!("http://{}/v1", r.addr()),
        "--model".into(),
        AGG.into(),
        "--model".into(),
        DISAGG.into(),
        "--max-tokens".into(),
        MAX_TOKENS.to_string(),
        "--header".into(),
        "x-backend:".into(),
    ];
    for (p, _, _) in &prompts {
        args.push("--prompt".into());
        args.push(p.to_string());
    }
    let lines = run_script(SCRIPT, &args, Duration::from_secs(120));
    assert_eq!(lines.len(), 2 * prompts.len() * 2, "{lines:#?}");
    for line in &lines {
        assert_eq!(line["ok"], true, "{line}");
        let model = line["model"].as_str().unwrap();
        let (prompt, n, prompt_tokens) = &prompts[line["prompt_index"].as_u64().unwrap() as usize];
        let headers = &line["headers"];
        let worker = headers["x-continuum-worker-instance-id"]
            .as_str()
            .unwrap_or("");
        if model == AGG {
            assert!(ids(AGG, Role::Aggregated).contains(worker), "{line}");
            assert_eq!(
                headers.get("x-continuum-prefill-instance-id"),
                None,
                "{line}"
            );
        } else {
            assert!(ids(DISAGG, Role::Decode).contains(worker), "{line}");
            let prefill = headers["x-continuum-prefill-instance-id"]
                .as_str()
                .unwrap_or("");
            assert!(ids(DISAGG, Role::Prefill).contains(prefill), "{line}");
        }
        assert_eq!(
            line["texts"].as_array().unwrap().len(),
            *n,
            "{prompt}: {line}"
        );
        assert_eq!(line["finish_reasons"], json!(vec!["length"; *n]), "{line}");
        let usage = &line["usage"];
        assert_eq!(usage["completion_tokens"], MAX_TOKENS * *n as u64, "{line}");
        if let Some(t) = prompt_tokens {
            assert_eq!(usage["prompt_tokens"], *t, "{prompt}: {line}");
        }
        if line["stream"] == true {
            assert_eq!(line["usage_chunks"], 1, "{line}");
            assert!(line["chunks"].as_u64().unwrap() > MAX_TOKENS, "{line}");
        }
    }
    // Every request went through the shim pinned and KV-aware: one selection each, every
    // prompt prepared (none skipped), the pinned answers relayed.
    let m = r.metrics();
    let total = lines.len() as f64;
    assert_eq!(
        kv_selection(&r, "overlap") + kv_selection(&r, "no_overlap"),
        total,
        "{m}"
    );
    assert_eq!(
        count(
            &r,
            "continuum_http_requests_total",
            &[("route", "completions"), ("status", "200")]
        ),
        total,
        "{m}"
    );

    // Every request reached a frontend pinned: started there, none failed (an unpinned or
    // wrongly pinned request is a failure of a direct-mode frontend).
    let started = frontend_total(&fleet, "dynamo_frontend_requests_started_total");
    assert!(started >= total, "{started} < {total}");
    assert_eq!(
        frontend_total(&fleet, "dynamo_frontend_failures_total"),
        0.0
    );

    // What the router answers itself, before any shim request: an unknown model, a body
    // without a usable prompt. No frontend sees them.
    let resp = post(&r, &json!({"model": "no-such-model", "prompt": "x"}));
    assert_eq!(resp.status, 404, "{}", resp.text());
    assert_eq!(
        resp.json()["error"]["code"],
        "model_not_found",
        "{}",
        resp.text()
    );
    for (body, reason) in [
        (json!({"model": AGG}), "no `prompt`"),
        (json!({"model": AGG, "prompt": ""}), "`prompt` is empty"),
        (json!({"model": AGG, "prompt": []}), "`prompt` is empty"),
        (
            json!({"model": AGG, "prompt": 7}),
            "must be a string or an array",
        ),
        (json!({"prompt": "x"}), "no `model`"),
    ] {
        let resp = post(&r, &body);
        assert_eq!(resp.status, 400, "{body}: {}", resp.text());
        let err = &resp.json()["error"];
        assert_eq!(err["type"], "invalid_request_error", "{}", resp.text());
        assert!(
            err["message"].as_str().unwrap_or("").contains(reason),
            "{body}: {}",
            resp.text()
        );
    }
    assert_eq!(
        frontend_total(&fleet, "dynamo_frontend_requests_started_total"),
        started,
        "nothing reached a frontend"
    );
    assert_eq!(
        frontend_total(&fleet, "dynamo_frontend_failures_total"),
        0.0
    );
}

/// The official client sends each of `prompts` (buffered, streamed or both) to `r`.
fn official(r: &RouterProcess, prompts: &[Value], stream: &str) -> Vec<Value> {
    let mut args = vec![
        "--base-url".to_string(),
        format!("http://{}/v1", r.addr()),
        "--model".into(),
        AGG.into(),
        "--max-tokens".into(),
        "2".into(),
        "--header".into(),
        "x-backend:".into(),
        "--stream".into(),
        stream.into(),
    ];
    for p in prompts {
        args.push("--prompt".into());
        args.push(p.to_string());
    }
    let lines = run_script(SCRIPT, &args, Duration::from_secs(60));
    for line in &lines {
        assert_eq!(line["ok"], true, "{line}");
    }
    lines
}

fn worker_in(line: &Value) -> u64 {
    line["headers"]["x-continuum-worker-instance-id"]
        .as_str()
        .unwrap_or_else(|| panic!("not pinned: {line}"))
        .parse()
        .unwrap()
}

#[test]
fn a_repeated_long_completions_prompt_is_picked_where_its_prefix_is_cached() {
    let fleet = Fleet::start(&FleetSpec::new().agg(AGG, 2));
    let r = kv_router(&fleet, &tiny_model_digests(), "");
    wait_kv_ready(&r, 2);
    let prompt = long_prompt(1);
    let first = official(&r, &[json!(prompt)], "buffered");
    let home = worker_in(&first[0]);
    let prompt_tokens = first[0]["usage"]["prompt_tokens"].as_u64().unwrap();
    let blocks = prompt_tokens / 64;
    assert!(blocks >= 4, "a long prompt: {prompt_tokens} tokens");
    assert_eq!(kv_selection(&r, "no_overlap"), 1.0);
    wait_view(
        "the prompt's blocks indexed",
        &r,
        Duration::from_secs(10),
        |v| {
            let held = v.rows.get(&(home, 0)).map_or(0, |row| row.blocks);
            if held < blocks {
                return Err(format!("worker {home} holds {held} of {blocks} blocks"));
            }
            Ok(())
        },
    );
    // Explained: the frontend's token count, every block on the worker that holds it.
    let explain = common::kv_pick::explain(
        &r,
        "?format=completions",
        json!({"model": AGG, "prompt": prompt})
            .to_string()
            .as_bytes(),
        None,
    );
    assert_eq!(explain.status, 200, "{}", explain.text());
    let v = explain.json();
    assert_eq!(v["prompt"]["token_count"], prompt_tokens, "{v}");
    assert_eq!(v["choice"]["decode"]["worker_id"], home.to_string(), "{v}");
    assert_eq!(v["choice"]["overlap_blocks"], blocks, "{v}");
    let tokenizer = tokenizers::Tokenizer::from_file(format!(
        "{}tokenizer.json",
        common::kv_pick::TINY_MODEL_DIR
    ))
    .unwrap();
    let ids: Vec<u32> = tokenizer
        .encode(prompt.as_str(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(ids.len() as u64, prompt_tokens, "the frontend's own count");
    // The same text, its ids as a token-id prompt, and a batch led by it, each buffered and
    // streamed: all picked with overlap on the worker that holds the prefix.
    let before = kv_selection(&r, "overlap");
    let again = official(
        &r,
        &[
            json!(prompt),
            json!(ids),
            json!([prompt, "and a second prompt"]),
        ],
        "both",
    );
    assert_eq!(again.len(), 6);
    for line in &again {
        assert_eq!(worker_in(line), home, "left the prefix's worker: {line}");
    }
    assert_eq!(kv_selection(&r, "overlap"), before + 6.0);
    let kv_aware = count(
        &r,
        "continuum_dynamo_selection_total",
        &[("role", "decode"), ("reason", "kv_aware")],
    );
    assert_eq!(kv_aware, 7.0);
    // The watchdog: the engine stored the first prompt under the router's hashes.
    r.wait_metric(
        "continuum_dynamo_kv_prediction_hits_total",
        &[("model", AGG)],
        1.0,
        Duration::from_secs(10),
    );
    assert_eq!(
        metric_value(
            &r.metrics(),
            "continuum_dynamo_kv_prediction_misses_total",
            &[("model", AGG)]
        ),
        Some(0.0)
    );
}

#[test]
fn token_data_carries_a_single_text_prompt_only() {
    let fleet = Fleet::start(&FleetSpec::new().agg(AGG, 1).arg("--dyn-log", "info"));
    let r = kv_router(&fleet, &tiny_model_digests(), "    send_token_data: true\n");
    wait_kv_ready(&r, 1);
    let text = long_prompt(2);
    let ask = |prompt: Value| -> u64 {
        let resp = post(
            &r,
            &json!({"model": AGG, "prompt": prompt, "max_tokens": 2}),
        );
        assert_eq!(resp.status, 200, "{}", resp.text());
        resp.json()["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    assert_eq!(skip_counts(&fleet).len(), 0);
    // A single text prompt: the frontend takes the router's ids, and counts them.
    let tokens = ask(json!(text));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while skip_counts(&fleet).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(skip_counts(&fleet).len(), 1, "the frontend used token_data");
    assert!(tokens > 64, "{tokens}");
    // A batch: each prompt tokenized by the frontend (were the first prompt's ids sent as
    // token_data, both prompts would count `tokens`).
    assert_eq!(ask(json!([text, "a b"])), tokens + 2);
    // Token ids are the prompt already.
    assert_eq!(ask(json!([5, 6, 7])), 3);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        skip_counts(&fleet).len(),
        1,
        "no token_data for a batch or token ids"
    );
}
