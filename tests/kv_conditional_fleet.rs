//! Conditional disaggregation on a REAL Dynamo 1.6.1 fleet (KV-PICK-12..15): one prefill and one
//! decode `dynamo.mocker` worker behind a direct-mode frontend, the router with `dynamo.kv` on,
//! the tiny model pinned and `conditional_disaggregation.enabled: true`.
//!
//! What an operator sees on 1.6.1: the option is live (the decode worker is chosen by the
//! conditional KV score, counted `kv_aware` for the decode role instead of `load`), but 1.6.1
//! decode workers publish no `kv-events` (their cards say `kv_event_publishing_enabled: false`,
//! tests/fleet/README.md), so the router never sees a prefix on a decode worker, the policy's
//! effective input is the whole prompt, and every turn keeps its prefill/decode pair (path
//! `disaggregated`, 200, no `bypass`). The decode-only pin that a bypass sends, and that 1.6.1's
//! direct frontend would refuse (KV-PICK-15), is therefore never sent on such a fleet; its wire
//! form is tested at shard level (`shards/src/dispatch/tests_kv.rs`).
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo-kv")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::fleet::{Fleet, FleetSpec, Role};
use common::kv::wait_view;
use common::kv_pick::{kv_config, system_prompt, tiny_model_digests, wait_kv_ready};
use common::router::metric_value;
use common::{RouterProcess, chat};
use serde_json::{Value, json};

const DISAGG: &str = "tiny-disagg";

fn send(r: &RouterProcess, messages: &[Value]) -> common::client::Response {
    let body = json!({"model": DISAGG, "messages": messages, "max_tokens": 4});
    chat(r.addr(), body.to_string().as_bytes(), &[("x-backend", "")])
}

#[test]
fn kv_pick_12_on_1_6_1_decode_workers_show_no_prefix_so_pairs_are_kept() {
    let fleet = Fleet::start(&FleetSpec::new().disagg(DISAGG, 1, 1));
    let prefill = fleet.worker(DISAGG, Role::Prefill).instance_id;
    let mut cfg = kv_config(
        &fleet,
        &tiny_model_digests(),
        "    conditional_disaggregation:\n      enabled: true\n",
    );
    cfg.fallback_to_unified = false;
    let r = RouterProcess::start(&cfg);
    // Only the prefill worker publishes kv-events.
    wait_kv_ready(&r, 1);
    let mut messages = vec![json!({"role": "system", "content": system_prompt(0)})];
    let turns = 3;
    for turn in 0..turns {
        messages.push(json!({"role": "user", "content": format!("What does rule {turn} say?")}));
        let resp = send(&r, &messages);
        assert_eq!(resp.status, 200, "turn {turn}: {}", resp.text());
        assert_eq!(
            resp.header("x-continuum-routing-path"),
            Some("disaggregated")
        );
        assert_eq!(
            resp.header("x-continuum-prefill-instance-id"),
            Some(prefill.to_string().as_str())
        );
        let answer = resp.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        messages.push(json!({"role": "assistant", "content": answer}));
        // Let the prefill worker's blocks reach the index before the next turn.
        wait_view(
            "the prefill worker's blocks indexed",
            &r,
            Duration::from_secs(15),
            |v| match v.rows.get(&(prefill, 0)).map_or(0, |row| row.blocks) {
                0 => Err(format!("prefill worker {prefill} holds no blocks yet")),
                _ => Ok(()),
            },
        );
    }
    let m = r.metrics();
    let metric =
        |name: &str, labels: &[(&str, &str)]| metric_value(&m, name, labels).unwrap_or(0.0);
    let total = f64::from(turns);
    assert_eq!(
        metric(
            "continuum_dynamo_selection_total",
            &[("role", "decode"), ("reason", "kv_aware")]
        ),
        total,
        "the decode worker is chosen by the conditional KV score:\n{m}"
    );
    for (role, reason) in [
        ("decode", "conditional_bypass"),
        ("prefill", "conditional_bypass"),
    ] {
        assert_eq!(
            metric(
                "continuum_dynamo_selection_total",
                &[("role", role), ("reason", reason)]
            ),
            0.0
        );
    }
    assert_eq!(
        metric(
            "continuum_dynamo_kv_selection_total",
            &[("result", "bypass")]
        ),
        0.0
    );
    assert!(
        metric(
            "continuum_dynamo_kv_selection_total",
            &[("result", "overlap")]
        ) >= total - 1.0,
        "later turns overlap on the prefill worker:\n{m}"
    );
    assert_eq!(
        metric(
            "disaggregated_requests_total",
            &[("routing_path", "disaggregated")]
        ),
        total
    );
}
