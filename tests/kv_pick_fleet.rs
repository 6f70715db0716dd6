//! KV-aware picking on a REAL Dynamo 1.6.1 fleet (issue 11): three `dynamo.mocker` workers
//! behind a direct-mode frontend, the router with `dynamo.kv` on.
//!
//! - With the tiny model's tokenizer and tokenizer config pinned, the router loads them from the
//!   paths the workers' cards name (KV-TOK-01/02/07), renders and hashes each chat request
//!   (KV-TOK-11..17), and picks by the KV cost (KV-PICK-01..09): every later turn of a
//!   conversation lands on the worker that holds its prefix, counted `overlap` and `kv_aware`,
//!   and the frontend answers each pinned request 200.
//! - With nothing pinned, the artifacts are never loaded: counted `unpinned` once, logged with
//!   the slot, URI kind and checksum, and every request is still served by load-based selection,
//!   counted `artifact_unpinned` (KV-TOK-08).
//! - The hash-parity watchdog counts the KV-aware picks whose chosen worker stored the prompt
//!   under the predicted hashes (`continuum_dynamo_kv_prediction_hits_total{model}`), none missed;
//!   a load-based pick predicts nothing.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo-kv")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::fleet::{Fleet, FleetSpec};
use common::kv::{KvView, wait_view};
use common::kv_pick::{kv_router, kv_selection, system_prompt, tiny_model_digests, wait_kv_ready};
use common::router::metric_value;
use common::{RouterProcess, chat};
use serde_json::{Value, json};

const AGG: &str = "tiny-agg";
const MAX_TOKENS: u32 = 4;

fn router_for(fleet: &Fleet, pinned: &[String]) -> RouterProcess {
    kv_router(fleet, pinned, "")
}

fn turn_body(messages: &[Value]) -> Vec<u8> {
    json!({"model": AGG, "messages": messages, "max_tokens": MAX_TOKENS})
        .to_string()
        .into_bytes()
}

/// Send one turn; returns the pinned worker and the assistant's answer.
fn send(r: &RouterProcess, messages: &[Value]) -> (u64, String) {
    let resp = chat(r.addr(), &turn_body(messages), &[("x-backend", "")]);
    assert_eq!(resp.status, 200, "{}", resp.text());
    let worker: u64 = resp
        .header("x-continuum-worker-instance-id")
        .unwrap_or_else(|| panic!("no worker named: {:?}", resp.headers))
        .parse()
        .unwrap();
    let answer = resp.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    (worker, answer)
}

#[test]
fn every_later_turn_lands_on_the_worker_that_holds_its_prefix() {
    let fleet = Fleet::start(&FleetSpec::new().agg(AGG, 3));
    let workers: BTreeSet<u64> = fleet.info.workers.iter().map(|w| w.instance_id).collect();
    assert_eq!(workers.len(), 3);
    let r = router_for(&fleet, &tiny_model_digests());
    wait_kv_ready(&r, 3);

    let conversations = 3;
    let turns = 4;
    let mut histories: Vec<Vec<Value>> = (0..conversations)
        .map(|c| vec![json!({"role": "system", "content": system_prompt(c)})])
        .collect();
    let mut homes: Vec<Option<u64>> = vec![None; conversations];
    for turn in 0..turns {
        for c in 0..conversations {
            let h = &mut histories[c];
            h.push(json!({"role": "user", "content": format!("Turn {turn} of conversation {c}: what does rule {turn} say?")}));
            let before = kv_selection(&r, "overlap");
            let held_before = KvView::read(&r).rows;
            let (worker, answer) = send(&r, h);
            assert!(workers.contains(&worker), "{worker} not in {workers:?}");
            match homes[c] {
                None => homes[c] = Some(worker),
                Some(home) => {
                    assert_eq!(
                        worker, home,
                        "turn {turn} of conversation {c} left the worker holding its prefix"
                    );
                    assert_eq!(
                        kv_selection(&r, "overlap"),
                        before + 1.0,
                        "turn {turn} of conversation {c} was picked with overlap"
                    );
                }
            }
            h.push(json!({"role": "assistant", "content": answer}));
            if turn == 0 {
                // The worker announces the conversation's first blocks (a new system prompt:
                // more than it held before); let the index see them before the next turn.
                let held = held_before.get(&(worker, 0)).map_or(0, |row| row.blocks);
                wait_view(
                    "the first turn's blocks indexed",
                    &r,
                    Duration::from_secs(10),
                    |v| {
                        let blocks = v.rows.get(&(worker, 0)).map_or(0, |row| row.blocks);
                        if blocks <= held {
                            return Err(format!(
                                "worker {worker} holds {blocks} blocks, had {held}"
                            ));
                        }
                        Ok(())
                    },
                );
            }
        }
    }
    let m = r.metrics();
    let kv_aware = metric_value(
        &m,
        "continuum_dynamo_selection_total",
        &[("role", "decode"), ("reason", "kv_aware")],
    )
    .unwrap_or(0.0);
    let total = (conversations * turns) as f64;
    assert_eq!(kv_aware, total, "every pick was kv_aware:\n{m}");
    let overlap = kv_selection(&r, "overlap");
    assert!(
        overlap >= ((turns - 1) * conversations) as f64,
        "later turns overlap: {overlap}"
    );
    assert_eq!(
        kv_selection(&r, "overlap") + kv_selection(&r, "no_overlap"),
        total
    );
    for skipped in [
        "tokenizer_unavailable",
        "artifact_unpinned",
        "render_unavailable",
        "prompt_too_large",
    ] {
        assert_eq!(kv_selection(&r, skipped), 0.0, "{skipped}:\n{m}");
    }
    // The hash-parity watchdog: the worker each pick chose stored the prompt under the hashes
    // the router predicted (every first turn at least, picked with no overlap at all), and no
    // prediction missed.
    let hits = r.wait_metric(
        "continuum_dynamo_kv_prediction_hits_total",
        &[("model", AGG)],
        conversations as f64,
        Duration::from_secs(10),
    );
    assert!(hits <= total, "at most one prediction per pick: {hits}");
    let m = r.metrics();
    assert_eq!(
        metric_value(
            &m,
            "continuum_dynamo_kv_prediction_misses_total",
            &[("model", AGG)]
        ),
        Some(0.0),
        "{m}"
    );
    assert!(!r.stderr().contains("predictions keep missing"));
}

#[test]
fn an_unpinned_tokenizer_is_never_loaded_and_selection_stays_load_based() {
    let fleet = Fleet::start(&FleetSpec::new().agg(AGG, 2));
    let digests = tiny_model_digests();
    // Only the tokenizer config is pinned: the tokenizer itself is not.
    let r = router_for(&fleet, &digests[1..]);
    r.wait_metric(
        "continuum_dynamo_kv_artifacts_total",
        &[("result", "unpinned")],
        1.0,
        Duration::from_secs(30),
    );
    for i in 0..4 {
        let messages = [
            json!({"role": "system", "content": system_prompt(9)}),
            json!({"role": "user", "content": format!("question {i}")}),
        ];
        send(&r, &messages);
    }
    let m = r.metrics();
    assert_eq!(kv_selection(&r, "artifact_unpinned"), 4.0, "{m}");
    let decode = |reason| {
        metric_value(
            &m,
            "continuum_dynamo_selection_total",
            &[("role", "decode"), ("reason", reason)],
        )
        .unwrap_or(0.0)
    };
    assert_eq!(decode("kv_aware"), 0.0, "{m}");
    assert_eq!(decode("load") + decode("round_robin_stale"), 4.0, "{m}");
    assert_eq!(
        kv_selection(&r, "overlap") + kv_selection(&r, "no_overlap"),
        0.0,
        "{m}"
    );
    assert_eq!(
        metric_value(
            &m,
            "continuum_dynamo_kv_prediction_hits_total",
            &[("model", AGG)]
        ),
        None,
        "a load-based pick predicts nothing:\n{m}"
    );
    assert_eq!(
        metric_value(
            &m,
            "continuum_dynamo_kv_artifacts_total",
            &[("result", "unpinned")]
        ),
        Some(1.0),
        "counted once per model"
    );
    assert_eq!(
        metric_value(
            &m,
            "continuum_dynamo_kv_artifacts_total",
            &[("result", "loaded")]
        ),
        Some(0.0)
    );
    let log = r.stderr();
    assert!(
        log.contains(&digests[0])
            && (log.contains("slot=\"tokenizer\"") || log.contains("slot=tokenizer")),
        "the log names the slot and the checksum to review:\n{log}"
    );
    // 1.6 cards name local files; earlier releases name them on the Hub.
    let kinds: &[&str] = if fleet.release() >= (1, 6, 0) {
        &["path", "file"]
    } else {
        &["hf"]
    };
    assert!(
        kinds.iter().any(|k| {
            log.contains(&format!("uri_kind=\"{k}\"")) || log.contains(&format!("uri_kind={k}"))
        }),
        "the log names the location's kind:\n{log}"
    );
    assert_eq!(
        log.matches("pinned_artifacts").count(),
        1,
        "logged once per model:\n{log}"
    );
}

#[test]
fn a_long_cold_prompt_is_load_routed_then_kv_routed_once_encoded() {
    let fleet = Fleet::start(&FleetSpec::new().agg(AGG, 2));
    let r = router_for(&fleet, &tiny_model_digests());
    r.wait_metric(
        "continuum_dynamo_kv_artifacts_total",
        &[("result", "loaded")],
        1.0,
        Duration::from_secs(30),
    );
    // A system prompt of about 20 KiB: more uncached text than a shard tokenizes inline.
    let long: String = (100..112).map(system_prompt).collect();
    assert!(long.len() > 16 * 1024, "{}", long.len());
    let messages = [
        json!({"role": "system", "content": long}),
        json!({"role": "user", "content": "which rule applies?"}),
    ];
    // The first request: picked by load, counted prompt_too_large, answered.
    send(&r, &messages);
    assert_eq!(kv_selection(&r, "prompt_too_large"), 1.0);
    assert_eq!(
        kv_selection(&r, "overlap") + kv_selection(&r, "no_overlap"),
        0.0
    );
    // Its segments are encoded in the background; the same prompt is then prepared inline on
    // that shard (each shard warms its own cache), so within a few requests it is KV-routed.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while kv_selection(&r, "overlap") + kv_selection(&r, "no_overlap") == 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the long prompt was never KV-routed:\n{}",
            r.metrics()
        );
        std::thread::sleep(Duration::from_millis(100));
        send(&r, &messages);
    }
}
