//! KV-aware picking over a real Dynamo fleet (the `dynamo-kv` tests): the tiny model's artifact
//! digests an operator pins, the router config with `dynamo.kv` on, conversation-sized system
//! prompts, readiness, and `POST /admin/dynamo/explain`.
//!
//! Every wait here is bounded by a deadline.

use std::time::Duration;

use super::client::{Response, request_bytes, roundtrip};
use super::config::RouterConfig;
use super::fleet::Fleet;
use super::kv::{same, wait_view};
use super::router::RouterProcess;

/// The tiny model's fixture directory (tokenizer and config of the fleet's mockers).
pub const TINY_MODEL_DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/fixtures/tiny-model/"
);

/// The blake3 digests of the tiny model's tokenizer and tokenizer config (what an operator pins
/// after reviewing them with `b3sum`).
pub fn tiny_model_digests() -> Vec<String> {
    ["tokenizer.json", "tokenizer_config.json"]
        .iter()
        .map(|f| {
            let path = TINY_MODEL_DIR.to_owned() + f;
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            format!("blake3:{}", blake3::hash(&bytes).to_hex())
        })
        .collect()
}

/// The fleet's router config with `dynamo.kv` on, `pinned` artifacts and `extra` lines of
/// `dynamo.kv` (each indented by four spaces, e.g. `"    send_token_data: true\n"`).
pub fn kv_config(fleet: &Fleet, pinned: &[String], extra: &str) -> RouterConfig {
    let mut cfg = fleet.router_config();
    let list: Vec<String> = pinned.iter().map(|p| format!("\"{p}\"")).collect();
    cfg.extra_yaml.push_str(&format!(
        "  kv:\n    enabled: true\n    pinned_artifacts: [{}]\n{extra}",
        list.join(", ")
    ));
    cfg
}

/// A router over `fleet` started from [`kv_config`].
pub fn kv_router(fleet: &Fleet, pinned: &[String], extra: &str) -> RouterProcess {
    RouterProcess::start(&kv_config(fleet, pinned, extra))
}

/// A system prompt of several 64-token blocks, distinct per conversation.
pub fn system_prompt(conversation: usize) -> String {
    (0..10)
        .map(|i| {
            format!(
                "Conversation {conversation}, rule {i}: keep every answer short, cite the rule \
                 number, and never route a turn away from the worker that holds its prefix. "
            )
        })
        .collect()
}

/// Waits (bounded) until `r` has loaded the pinned artifacts and `publishers` kv-events
/// subscriptions are connected.
pub fn wait_kv_ready(r: &RouterProcess, publishers: usize) {
    r.wait_metric(
        "continuum_dynamo_kv_artifacts_total",
        &[("result", "loaded")],
        1.0,
        Duration::from_secs(30),
    );
    wait_view(
        "every kv-events publisher connected",
        r,
        Duration::from_secs(30),
        |v| {
            let ids: Vec<u64> = v.subscriptions.keys().copied().collect();
            same("kv-events subscriptions", ids.len(), publishers)?;
            same("all connected", v.connected(&ids), true)
        },
    );
}

/// `POST /admin/dynamo/explain` (`query` appended to the path, e.g. `?format=messages`) with
/// `body`, as bearer `token` when given.
pub fn explain(r: &RouterProcess, query: &str, body: &[u8], token: Option<&str>) -> Response {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(b) = &bearer {
        headers.push(("Authorization", b.as_str()));
    }
    let path = format!("/admin/dynamo/explain{query}");
    roundtrip(
        r.addr(),
        &request_bytes("POST", &path, &headers, Some(body)),
    )
    .unwrap_or_else(|e| panic!("POST {path}: {e}"))
}
