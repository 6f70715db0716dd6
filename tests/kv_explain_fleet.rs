//! `POST /admin/dynamo/explain` on a REAL Dynamo 1.6.1 fleet (issue 11, item 5): two
//! `dynamo.mocker` workers (block size 64) behind a direct-mode frontend, the router with
//! `dynamo.kv` on, the tiny model's artifacts pinned and an admin token configured.
//!
//! - Parity: for every request of `fixtures/dynamo-1.6.1/kv-events/requests.jsonl`, the block
//!   hashes explain reports are the `block_hash` values the engine stored for the blocks within
//!   the prompt (`decoded.jsonl`: 86 blocks; 2 stored blocks made of generated tokens are beyond
//!   the prompt), and the token count is the frontend's recorded `prompt_tokens`.
//! - Admin access: without the token (or with a wrong one) explain is refused exactly as
//!   `GET /admin/dynamo/workers` is.
//! - No answer names an address: no `127.0.0.1`, no URL, no frontend, worker or publisher port.
//! - What it explains is what happens: after a conversation's first turn is indexed, explain
//!   names the worker holding the prefix with its overlap, and the next real turn lands there.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo-kv")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::fleet::{Fleet, FleetSpec};
use common::kv_pick::{explain, kv_config, tiny_model_digests};
use common::{ADMIN_TOKEN, ADMIN_TOKEN_HASH, RouterProcess, chat, get_with};
use serde_json::{Value, json};

const AGG: &str = "tiny-agg";

fn jsonl(rel: &str) -> Vec<Value> {
    let path = format!("{}/../shared/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Every port the fleet listens or publishes on: none may appear after a `:` in an answer.
fn fleet_ports(fleet: &Fleet) -> Vec<u16> {
    let mut ports: Vec<u16> = fleet
        .info
        .frontend_processes
        .iter()
        .map(|f| f.addr.port())
        .collect();
    let tail = |s: &str| s.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
    for w in &fleet.info.workers {
        ports.extend(tail(&w.tcp));
        ports.extend(w.publishers.values().filter_map(|p| tail(&p.endpoint)));
    }
    ports.extend(tail(&fleet.info.etcd_endpoint));
    ports
}

/// Panics if `text` names an address: a loopback host, a URL, or `:<port>` of the fleet.
fn assert_no_address(text: &str, ports: &[u16]) {
    for needle in ["127.0.0.1", "localhost", "tcp://", "http://", "https://"] {
        assert!(!text.contains(needle), "{needle} in {text}");
    }
    for port in ports {
        let p = format!(":{port}");
        let named = text.match_indices(&p).any(|(i, _)| {
            !text[i + p.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
        });
        assert!(!named, "port {port} in {text}");
    }
}

fn explained(r: &RouterProcess, body: &[u8], ports: &[u16]) -> Value {
    let resp = explain(r, "", body, Some(ADMIN_TOKEN));
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_no_address(&resp.text(), ports);
    resp.json()
}

fn start(fleet: &Fleet) -> RouterProcess {
    let mut cfg = kv_config(fleet, &tiny_model_digests(), "");
    cfg.token_hash = Some(ADMIN_TOKEN_HASH.to_owned());
    let r = RouterProcess::start(&cfg);
    r.wait_metric(
        "continuum_dynamo_kv_artifacts_total",
        &[("result", "loaded")],
        1.0,
        Duration::from_secs(30),
    );
    // Every worker's kv-events publisher subscribed (a stored event before that is lost).
    r.wait_metric(
        "continuum_dynamo_kv_subscriptions",
        &[("state", "connected"), ("transport", "direct")],
        fleet.info.workers.len() as f64,
        Duration::from_secs(30),
    );
    r
}

#[test]
fn explain_hashes_equal_the_blocks_dynamo_1_6_1_stored_and_name_no_address() {
    let fleet = Fleet::start(&FleetSpec::new().agg(AGG, 2));
    assert_eq!(fleet.info.block_size, 64);
    let ports = fleet_ports(&fleet);
    let r = start(&fleet);

    // Admin access exactly as the other admin route: 401 without the token or with another.
    let body = json!({"model": AGG, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    for token in [None, Some("not-the-token")] {
        let bearer = token.map(|t| format!("Bearer {t}"));
        let auth: Vec<(&str, &str)> = bearer
            .iter()
            .map(|b| ("Authorization", b.as_str()))
            .collect();
        let workers = get_with(r.addr(), "/admin/dynamo/workers", &auth);
        let resp = explain(&r, "", body.as_bytes(), token);
        assert_eq!(resp.status, 401, "{}", resp.text());
        assert_eq!(
            resp.status, workers.status,
            "as /admin/dynamo/workers with {token:?}"
        );
        assert_no_address(&resp.text(), &ports);
    }

    let requests = jsonl("dynamo-1.6.1/kv-events/requests.jsonl");
    let events = jsonl("dynamo-1.6.1/kv-events/decoded.jsonl");
    let (mut checked, mut beyond) = (0, 0);
    for req in &requests {
        let step = req["step"].as_str().unwrap();
        // The tiny-dp steps were served by another model of the same artifacts: the hashes
        // depend on the tokens only.
        let body =
            json!({"model": AGG, "messages": req["messages"], "max_tokens": req["max_tokens"]});
        let v = explained(&r, body.to_string().as_bytes(), &ports);
        assert_eq!(v["dynamo_model"], AGG, "{step}");
        assert_eq!(v["kv"]["enabled"], true, "{step}");
        assert_eq!(v["kv"]["skipped"], Value::Null, "{step}: {v}");
        let tokens = req["usage"]["prompt_tokens"].as_u64().unwrap();
        assert_eq!(v["prompt"]["token_count"], tokens, "{step}");
        assert_eq!(v["outcome"], "pinned", "{step}: {v}");
        let blocks = v["prompt"]["blocks"].as_array().unwrap();
        assert_eq!(blocks.len(), 1, "{step}: one block size in the fleet");
        assert_eq!(blocks[0]["block_size"], 64);
        let hashes: Vec<u64> = blocks[0]["hashes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_str().unwrap().parse().unwrap())
            .collect();
        assert_eq!(
            hashes.len() as u64,
            tokens / 64,
            "{step}: complete blocks only"
        );
        for e in events.iter().filter(|e| e["step"] == req["step"]) {
            let Some(stored) = e["router_event"]["event"]["data"].get("stored") else {
                continue;
            };
            // A stored run continues its parent's block (or starts the prompt).
            let first = match stored["parent_hash"].as_u64() {
                None => Some(0),
                Some(parent) => hashes.iter().position(|h| *h == parent).map(|i| i + 1),
            };
            for (j, block) in stored["blocks"].as_array().unwrap().iter().enumerate() {
                let Some(i) = first.map(|f| f + j).filter(|&i| i < hashes.len()) else {
                    beyond += 1;
                    continue;
                };
                assert_eq!(
                    hashes[i],
                    block["block_hash"].as_u64().unwrap(),
                    "{step}: block {i}"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(requests.len(), 16, "the fixture's requests");
    assert_eq!((checked, beyond), (86, 2));
    eprintln!("parity: {checked}/86 stored blocks of 16 requests ({beyond} beyond the prompt)");
}

#[test]
fn explain_names_the_worker_the_next_turn_lands_on() {
    let fleet = Fleet::start(&FleetSpec::new().agg(AGG, 2));
    let ports = fleet_ports(&fleet);
    let r = start(&fleet);
    let system: String = (0..10)
        .map(|i| format!("Rule {i}: answer in one line and name the rule you followed. "))
        .collect();
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": "What does rule 1 say?"}),
    ];
    let turn = |messages: &[Value]| {
        json!({"model": AGG, "messages": messages, "max_tokens": 4})
            .to_string()
            .into_bytes()
    };
    let first = chat(r.addr(), &turn(&messages), &[("x-backend", "")]);
    assert_eq!(first.status, 200, "{}", first.text());
    let home = first
        .header("x-continuum-worker-instance-id")
        .unwrap()
        .to_owned();
    let answer = first.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    messages.push(json!({"role": "assistant", "content": answer}));
    messages.push(json!({"role": "user", "content": "And rule 2?"}));
    let next = turn(&messages);

    // Explain until the first turn's blocks are indexed (bounded): then the home worker holds
    // the prefix, and explain says it will be chosen for it.
    let deadline = Instant::now() + Duration::from_secs(15);
    let v = loop {
        let v = explained(&r, &next, &ports);
        if v["choice"]["overlap_blocks"].as_u64().unwrap_or(0) > 0 {
            break v;
        }
        assert!(Instant::now() < deadline, "never indexed: {v}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(v["choice"]["decode"]["worker_id"], home.as_str(), "{v}");
    assert_eq!(v["choice"]["decode"]["reason"], "kv_aware");
    assert_eq!(v["kv"]["result"], "overlap");
    let holder = v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["worker_id"] == home.as_str())
        .unwrap();
    assert_eq!(holder["overlap_blocks"], v["choice"]["overlap_blocks"]);
    assert_eq!(v["candidates"].as_array().unwrap().len(), 2);

    let before = r.metrics();
    let resp = chat(r.addr(), &next, &[("x-backend", "")]);
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        resp.header("x-continuum-worker-instance-id"),
        Some(home.as_str())
    );
    // Explaining counted no selection: only the two real turns are in the counters.
    let m = r.metrics();
    let selections = |text: &str| {
        common::metric_value(
            text,
            "continuum_dynamo_selection_total",
            &[("role", "decode"), ("reason", "kv_aware")],
        )
        .unwrap_or(0.0)
    };
    assert_eq!(selections(&before), 1.0, "{before}");
    assert_eq!(selections(&m), 2.0, "{m}");
}
