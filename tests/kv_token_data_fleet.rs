//! `nvext.token_data` on a REAL Dynamo 1.6.1 fleet (KV-PICK-10/11, NG-02): two `dynamo.mocker`
//! workers behind a direct-mode frontend, two routers over them with `dynamo.kv` on and the tiny
//! model pinned, one with `send_token_data: true`.
//!
//! The observable: 1.6.1's preprocessor (`OpenAIPreprocessor::gather_tokens`) logs
//! `[SIDECAR-SKIP-TOKENIZE] Found nvext.token_data … token_count=N` at info level exactly when a
//! request carries `nvext.token_data`, and then uses those ids as the prompt, so the answer's
//! `usage.prompt_tokens` is their count. Every request also carries a client `token_data` of
//! three ids: were it forwarded, the prompt would be 3 tokens.
//! - with `send_token_data`, each pinned request is answered 200, the frontend logs one skip line
//!   whose `token_count` is the answer's `prompt_tokens`, and that count is the full rendered
//!   prompt's (the client's three ids never arrive, KV-PICK-11);
//! - without it, the same request is answered with the same `prompt_tokens` (the frontend's own
//!   tokenisation agrees with the router's ids) and no skip line is logged.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo-kv")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::fleet::{Fleet, FleetSpec};
use common::kv_pick::{
    kv_router, kv_selections, skip_counts, system_prompt, tiny_model_digests, wait_kv_ready,
};
use common::{RouterProcess, chat};
use serde_json::json;

const AGG: &str = "tiny-agg";
/// One chat request with a client `token_data` of three ids; returns `usage.prompt_tokens`.
fn ask(r: &RouterProcess, i: usize) -> u64 {
    let body = json!({
        "model": AGG,
        "messages": [
            {"role": "system", "content": system_prompt(i)},
            {"role": "user", "content": format!("question {i}")},
        ],
        "max_tokens": 4,
        "nvext": {"token_data": [1, 2, 3]},
    });
    let resp = chat(r.addr(), body.to_string().as_bytes(), &[("x-backend", "")]);
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert!(
        resp.header("x-continuum-worker-instance-id").is_some(),
        "pinned: {:?}",
        resp.headers
    );
    resp.json()["usage"]["prompt_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no usage: {}", resp.text()))
}

/// Waits until the frontends have logged `n` skip lines; returns them.
fn wait_skips(fleet: &Fleet, n: usize) -> Vec<u64> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let counts = skip_counts(fleet);
        if counts.len() >= n || std::time::Instant::now() > deadline {
            return counts;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn kv_pick_10_the_frontend_uses_the_routers_token_ids() {
    let fleet = Fleet::start(&FleetSpec::new().agg(AGG, 2).arg("--dyn-log", "info"));
    let digests = tiny_model_digests();
    let with = kv_router(&fleet, &digests, "    send_token_data: true\n");
    let without = kv_router(&fleet, &digests, "");
    for r in [&with, &without] {
        wait_kv_ready(r, 2);
    }
    assert!(
        skip_counts(&fleet).is_empty(),
        "no token_data before the test"
    );
    let mut expected = 0;
    for i in 0..3 {
        let prompt = ask(&with, i);
        expected += 1;
        let skips = wait_skips(&fleet, expected);
        assert_eq!(
            skips.len(),
            expected,
            "one skip line per request: {skips:?}"
        );
        assert_eq!(
            skips.last().copied(),
            Some(prompt),
            "the frontend's prompt is the router's token_data"
        );
        assert!(
            prompt > 100,
            "the full rendered prompt, not the client's 3 ids: {prompt}"
        );
        // The same request without send_token_data: tokenised by the frontend, same count.
        assert_eq!(
            ask(&without, i),
            prompt,
            "router and frontend agree on the ids"
        );
    }
    // The control requests logged nothing: one more token_data request adds exactly one line.
    let prompt = ask(&with, 9);
    let skips = wait_skips(&fleet, expected + 1);
    assert_eq!(skips.len(), expected + 1, "{skips:?}");
    assert_eq!(skips.last().copied(), Some(prompt));
    // `with` served the three asks and the last one; `without` the three controls.
    for (r, served) in [(&with, 4.0), (&without, 3.0)] {
        let m = r.metrics();
        let kv = |result| kv_selections(&m, result);
        assert_eq!(
            kv("overlap") + kv("no_overlap"),
            served,
            "every prompt prepared:\n{m}"
        );
        assert_eq!(
            kv("artifact_unpinned") + kv("tokenizer_unavailable"),
            0.0,
            "{m}"
        );
    }
}
