//! Client API keys end to end: missing, wrong and revoked-by-reload keys; a key limited to one
//! model or one backend; a rate limit that holds across two shards; the concurrency limit; the
//! router's own credential never forwarded; and the official `openai` and `anthropic` clients
//! seeing the errors they expect.

#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::pyclient::{OpenAiChat, run_script};
use common::{MockBackend, RouterConfig, RouterProcess, STEP, chat, chat_body, metric_value};

fn digest(key: &str) -> String {
    use sha2::Digest;
    let d: [u8; 32] = sha2::Sha256::digest(key.as_bytes()).into();
    format!(
        "sha256:{}",
        d.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

const ALPHA: &str = "sk-alpha-0123456789";
const BETA: &str = "sk-beta-9876543210";

/// Two backends (`a` serves m1 and m2, `b` serves m1) behind keys from `keys` (YAML list items).
fn setup(keys: &str) -> (MockBackend, MockBackend, RouterConfig) {
    let a = MockBackend::start("a");
    let b = MockBackend::start("b");
    let mut cfg = RouterConfig::default()
        .backend("a", &a.url(), &["m1", "m2"])
        .backend("b", &b.url(), &["m1"]);
    cfg.extra_yaml = format!("auth:\n  keys:\n{keys}");
    (a, b, cfg)
}

fn key(name: &str, secret: &str, extra: &str) -> String {
    format!(
        "    - {{ name: {name}, key_hash: \"{}\"{extra} }}\n",
        digest(secret)
    )
}

fn bearer(k: &str) -> String {
    format!("Bearer {k}")
}

#[test]
fn missing_wrong_and_revoked_keys_are_refused_in_each_protocols_shape() {
    let keys = key("alpha", ALPHA, "") + &key("beta", BETA, "");
    let (a, b, mut cfg) = setup(&keys);
    let r = RouterProcess::start(&cfg);
    let body = chat_body("m1", "auth", false);
    let v = chat(r.addr(), &body, &[]).assert_json_error(401);
    assert_eq!(v["code"], "missing_api_key", "{v}");
    let v = chat(r.addr(), &body, &[("authorization", "Bearer sk-nope")]).assert_json_error(401);
    assert_eq!(v["code"], "invalid_api_key", "{v}");
    // Nothing reached a backend.
    assert_eq!(a.request_count() + b.request_count(), 0);
    let ok = chat(r.addr(), &body, &[("authorization", &bearer(ALPHA))]);
    assert_eq!(ok.status, 200, "{}", ok.text());
    // `x-api-key` works too (Anthropic clients), and the credential is never forwarded.
    let ok = chat(r.addr(), &body, &[("x-api-key", BETA)]);
    assert_eq!(ok.status, 200);
    for req in a.requests().iter().chain(b.requests().iter()) {
        assert!(req.header("authorization").is_none(), "{:?}", req.headers);
        assert!(req.header("x-api-key").is_none(), "{:?}", req.headers);
    }
    // Anthropic Messages: its own error shape.
    let msg = br#"{"model":"m1","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
    let raw = common::request_bytes(
        "POST",
        "/v1/messages",
        &[
            ("x-api-key", "sk-nope"),
            ("content-type", "application/json"),
        ],
        Some(msg),
    );
    let resp = common::client::roundtrip(r.addr(), &raw).unwrap();
    assert_eq!(resp.status, 401);
    let v = resp.json();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "authentication_error", "{v}");
    // /v1/models needs a key too.
    assert_eq!(r.get("/v1/models").status, 401);

    // Revoke beta by reload: refused from the next request on; alpha unaffected.
    cfg.extra_yaml = format!("auth:\n  keys:\n{}", key("alpha", ALPHA, ""));
    let generation = r.generation();
    r.write_config(&cfg);
    r.wait_generation(generation + 1, STEP);
    let v = chat(r.addr(), &body, &[("x-api-key", BETA)]).assert_json_error(401);
    assert_eq!(v["code"], "invalid_api_key", "{v}");
    assert_eq!(
        chat(r.addr(), &body, &[("authorization", &bearer(ALPHA))]).status,
        200
    );
    let text = r.metrics();
    assert!(
        metric_value(
            &text,
            "continuum_auth_failures_total",
            &[("reason", "invalid")]
        )
        .unwrap()
            >= 2.0
    );
    assert!(
        metric_value(
            &text,
            "continuum_auth_failures_total",
            &[("reason", "missing")]
        )
        .unwrap()
            >= 1.0
    );
}

#[test]
fn a_key_reaches_only_its_models_and_backends() {
    let keys = key("m2-only", ALPHA, ", allowed_models: [m2]")
        + &key("b-only", BETA, ", allowed_backends: [b]");
    let (a, b, cfg) = setup(&keys);
    let r = RouterProcess::start(&cfg);
    let alpha = bearer(ALPHA);
    let v = chat(
        r.addr(),
        &chat_body("m1", "x", false),
        &[("authorization", &alpha)],
    )
    .assert_json_error(403);
    assert_eq!(v["code"], "model_not_allowed", "{v}");
    assert_eq!(
        chat(
            r.addr(),
            &chat_body("m2", "x", false),
            &[("authorization", &alpha)]
        )
        .status,
        200
    );
    // /v1/models lists only what the key may use.
    let models = common::get_with(r.addr(), "/v1/models", &[("authorization", &alpha)]).json();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["m2"]);
    // b-only: every m1 request lands on b, and m2 (served by a only) is refused.
    let before_a = a.request_count();
    for i in 0..8 {
        let resp = chat(
            r.addr(),
            &chat_body("m1", &format!("b {i}"), false),
            &[("x-api-key", BETA)],
        );
        assert_eq!(resp.status, 200);
    }
    assert_eq!(a.request_count(), before_a, "b-only reached a");
    assert_eq!(b.request_count(), 8);
    let v = chat(
        r.addr(),
        &chat_body("m2", "x", false),
        &[("x-api-key", BETA)],
    )
    .assert_json_error(403);
    assert_eq!(v["code"], "backend_not_allowed", "{v}");
    let text = r.metrics();
    assert_eq!(
        metric_value(
            &text,
            "continuum_key_refusals_total",
            &[("key", "m2-only"), ("reason", "model")]
        ),
        Some(1.0)
    );
    assert_eq!(
        metric_value(
            &text,
            "continuum_key_refusals_total",
            &[("key", "b-only"), ("reason", "backend")]
        ),
        Some(1.0)
    );
}

#[test]
fn a_rate_limit_holds_across_two_shards_within_ten_percent() {
    let rate = 40.0;
    let keys = key(
        "limited",
        ALPHA,
        &format!(", requests_per_second: {rate}, burst: 1"),
    );
    let (_a, _b, cfg) = setup(&keys);
    let r = RouterProcess::start(&cfg);
    let admitted = Arc::new(AtomicU64::new(0));
    let limited = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let run = Duration::from_secs(3);
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (admitted, limited, stop) = (admitted.clone(), limited.clone(), stop.clone());
            let addr = r.addr();
            std::thread::spawn(move || {
                let auth = format!("Bearer {ALPHA}");
                let mut i = 0u64;
                // Bounded: at most 3 s and 5,000 requests per worker.
                while !stop.load(Ordering::Relaxed) && i < 5_000 {
                    i += 1;
                    // A new connection each time, so both shards take requests.
                    let resp = chat(
                        addr,
                        &chat_body("m1", &format!("{w}-{i}"), false),
                        &[("authorization", &auth)],
                    );
                    match resp.status {
                        200 => admitted.fetch_add(1, Ordering::Relaxed),
                        429 => {
                            assert!(
                                resp.header("retry-after").is_some(),
                                "429 without retry-after"
                            );
                            limited.fetch_add(1, Ordering::Relaxed)
                        }
                        s => panic!("status {s}: {}", resp.text()),
                    };
                }
            })
        })
        .collect();
    std::thread::sleep(run);
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let got = admitted.load(Ordering::Relaxed) as f64;
    let want = 1.0 + rate * elapsed;
    assert!(
        limited.load(Ordering::Relaxed) > 0,
        "the limit was never reached"
    );
    assert!(
        (got - want).abs() <= 0.1 * want,
        "{got} admitted in {elapsed:.2} s at {rate}/s (want {want:.0} ± 10%)"
    );
    // Both shards took part.
    let text = r.metrics();
    for shard in ["0", "1"] {
        let n = metric_value(
            &text,
            "continuum_shard_connections_accepted_total",
            &[("shard", shard)],
        )
        .unwrap_or(0.0);
        assert!(n > 10.0, "shard {shard} accepted {n} connections");
    }
}

#[test]
fn the_concurrency_limit_counts_streams_in_flight() {
    let keys = key("two", ALPHA, ", max_concurrent: 2");
    let (a, _b, mut cfg) = setup(&keys);
    cfg.backends.truncate(1);
    let r = RouterProcess::start(&cfg);
    let auth = bearer(ALPHA);
    let s1 = a.push_sse();
    let s2 = a.push_sse();
    let mut c1 = common::Conn::open(r.addr());
    c1.send_all(&common::chat_bytes(
        &chat_body("m1", "s1", true),
        &[("authorization", &auth)],
    ));
    // The backend hands its queued streams out in arrival order: s1 must be c1's.
    a.wait_requests(1, STEP);
    let mut c2 = common::Conn::open(r.addr());
    c2.send_all(&common::chat_bytes(
        &chat_body("m1", "s2", true),
        &[("authorization", &auth)],
    ));
    a.wait_requests(2, STEP);
    let v = chat(
        r.addr(),
        &chat_body("m1", "third", false),
        &[("authorization", &auth)],
    )
    .assert_json_error(429);
    assert_eq!(v["code"], "too_many_concurrent_requests", "{v}");
    s1.finish();
    let _ = c1.stream_response(STEP).unwrap().finish(STEP).unwrap();
    // One slot is free again.
    let deadline = Instant::now() + STEP;
    loop {
        let resp = chat(
            r.addr(),
            &chat_body("m1", "fourth", false),
            &[("authorization", &auth)],
        );
        if resp.status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the finished stream kept its slot"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    s2.finish();
    let _ = c2.stream_response(STEP).unwrap().finish(STEP).unwrap();
}

#[test]
fn official_clients_see_the_errors_they_expect() {
    let keys = key("m2-only", ALPHA, ", allowed_models: [m2]")
        + &key("slow", BETA, ", requests_per_second: 0.01, burst: 1");
    let (_a, _b, cfg) = setup(&keys);
    let r = RouterProcess::start(&cfg);
    let one = |model: &str, key: &str| {
        let out = OpenAiChat::new(r.addr(), model).api_key(key).run();
        out[0].0.clone()
    };
    let wrong = one("m1", "sk-wrong");
    assert_eq!(
        (wrong["status"].as_u64(), wrong["error"].as_str()),
        (Some(401), Some("AuthenticationError")),
        "{wrong}"
    );
    let forbidden = one("m1", ALPHA);
    assert_eq!(
        (forbidden["status"].as_u64(), forbidden["error"].as_str()),
        (Some(403), Some("PermissionDeniedError")),
        "{forbidden}"
    );
    assert_eq!(one("m2", ALPHA)["ok"], true);
    assert_eq!(one("m1", BETA)["ok"], true);
    let limited = one("m1", BETA);
    assert_eq!(
        (limited["status"].as_u64(), limited["error"].as_str()),
        (Some(429), Some("RateLimitError")),
        "{limited}"
    );
    // The anthropic client (x-api-key) on /v1/messages.
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/anthropic_messages.py"
    );
    let base = format!("http://{}", r.addr());
    let run = |key: &str, model: &str| {
        let args: Vec<String> = ["--base-url", &base, "--model", model, "--api-key", key]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        run_script(script, &args, Duration::from_secs(60))
    };
    for (key, model, want) in [
        (
            "sk-wrong",
            "m2",
            (401, "AuthenticationError", "authentication_error"),
        ),
        (
            ALPHA,
            "m1",
            (403, "PermissionDeniedError", "permission_error"),
        ),
        (BETA, "m1", (429, "RateLimitError", "rate_limit_error")),
    ] {
        for line in run(key, model) {
            let got = (
                line["status"].as_u64(),
                line["error"].as_str(),
                line["error_type"].as_str(),
            );
            assert_eq!(got, (Some(want.0), Some(want.1), Some(want.2)), "{line}");
        }
    }
}
