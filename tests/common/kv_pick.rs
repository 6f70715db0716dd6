//! KV-aware picking over a real Dynamo fleet (the `dynamo-kv` tests): the tiny model's artifact
//! digests an operator pins, the router config with `dynamo.kv` on, conversation-sized system
//! prompts, readiness, and `POST /admin/dynamo/explain`.
//!
//! Every wait here is bounded by a deadline.

use std::time::Duration;

use super::backend::{MockBackend, Reply};
use super::client::{Response, request_bytes, roundtrip};
use super::config::RouterConfig;
use super::fleet::Fleet;
use super::kv::{same, wait_view};
use super::router::RouterProcess;
use super::router::metric_value;

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
///
/// A fleet before Dynamo 1.6 names its card's files on the Hub (`hf://<model>/<file>`, the same
/// digests): the router then reads them from [`hub`] (`allow_hf_artifacts`, `HF_ENDPOINT`), as
/// an operator of such a fleet points it at the Hub or a mirror.
pub fn kv_config(fleet: &Fleet, pinned: &[String], extra: &str) -> RouterConfig {
    let mut cfg = fleet.router_config();
    let list: Vec<String> = pinned.iter().map(|p| format!("\"{p}\"")).collect();
    let hf = if fleet.release() < (1, 6, 0) {
        cfg.env.push(("HF_ENDPOINT".into(), hub().url()));
        "    allow_hf_artifacts: true\n"
    } else {
        ""
    };
    cfg.extra_yaml.push_str(&format!(
        "  kv:\n    enabled: true\n    pinned_artifacts: [{}]\n{hf}{extra}",
        list.join(", ")
    ));
    cfg
}

/// A Hugging Face Hub stand-in on loopback for this test process (the real Hub is out of reach
/// here): `GET /<repo>/resolve/<rev>/<file>` answers the tiny model's fixture file of that name,
/// whatever the repo (the fleet serves the fixture under each model name), 404 otherwise.
pub fn hub() -> &'static MockBackend {
    static HUB: std::sync::OnceLock<MockBackend> = std::sync::OnceLock::new();
    HUB.get_or_init(|| {
        let hub = MockBackend::start("hub");
        hub.set_handler(|req| {
            let file = req
                .path
                .split_once("/resolve/")
                .and_then(|(_, rest)| rest.split_once('/'))
                .map(|(_, file)| file)
                .filter(|f| !f.contains("..") && !f.contains('/'));
            match file.and_then(|f| std::fs::read(format!("{TINY_MODEL_DIR}{f}")).ok()) {
                Some(body) => Reply::Full {
                    status: 200,
                    headers: vec![("Content-Type".into(), "application/octet-stream".into())],
                    body,
                },
                None => Reply::json_status(404, br#"{"error":"Entry not found"}"#),
            }
        });
        hub
    })
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

/// `continuum_dynamo_kv_selection_total{result}` in the metrics text `m` (0 when absent).
pub fn kv_selections(m: &str, result: &str) -> f64 {
    metric_value(
        m,
        "continuum_dynamo_kv_selection_total",
        &[("result", result)],
    )
    .unwrap_or(0.0)
}

/// [`kv_selections`] of `r`'s metrics now.
pub fn kv_selection(r: &RouterProcess, result: &str) -> f64 {
    kv_selections(&r.metrics(), result)
}

/// What 1.6.1's preprocessor logs (info level) when a request carries `nvext.token_data`.
pub const SKIP_TOKENIZE: &str = "[SIDECAR-SKIP-TOKENIZE]";

/// Every [`SKIP_TOKENIZE`] line the fleet's frontends logged, with its `token_count`.
pub fn skip_counts(fleet: &Fleet) -> Vec<u64> {
    let mut counts = Vec::new();
    for f in &fleet.info.frontend_processes {
        let text = Fleet::log_text(&f.log);
        for line in text.lines().filter(|l| l.contains(SKIP_TOKENIZE)) {
            let n = line.split("token_count").nth(1).and_then(|rest| {
                let digits: String = rest
                    .chars()
                    .skip_while(|c| !c.is_ascii_digit())
                    .take_while(char::is_ascii_digit)
                    .collect();
                digits.parse().ok()
            });
            counts.push(n.unwrap_or_else(|| panic!("no token_count in {line:?}")));
        }
    }
    counts
}
