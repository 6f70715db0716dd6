#![cfg(feature = "dynamo")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
//! `GET /v1/models` and `GET /v1/models/{id}` list what the router can route now (issue 14): the
//! configured backends' models, then the live fleet's client models (through
//! `dynamo.shim.model_map`), read by the official `openai` client. The fleet is the recorded
//! Dynamo 1.6.1 one in a file store (two aggregated `tiny-agg` workers in `agg`, a prefill/decode
//! pair serving `tiny-disagg` in `disagg`), changed under the router: a worker of a new model
//! registers, then leaves. `POST /v1/embeddings` is plain model routing: never pinned, even for a
//! model the fleet serves.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use common::client::roundtrip;
use common::filestore::{FIXTURE, publish, remove, write_fixture};
use common::pyclient::run_script;
use common::{MockBackend, RouterConfig, RouterProcess, STEP, TempDir, request_bytes};

const OPENAI_MODELS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/clients/openai_models.py"
);

/// The records of agg worker `…ac0b` as a worker `…ac30` of `model` (same card otherwise).
fn new_worker_records(model: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(FIXTURE).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let old_decimal = 0x6a6c_a22d_4998_ac0b_u64.to_string();
    let new_decimal = 0x6a6c_a22d_4998_ac30_u64.to_string();
    lines
        .chunks(2)
        .filter(|kv| {
            kv[0] == "v1/instances/agg/backend/generate/6a6ca22d4998ac0b"
                || kv[0] == "v1/mdc/agg/backend/generate/6a6ca22d4998ac0b"
        })
        .map(|kv| {
            let key = kv[0].replace("6a6ca22d4998ac0b", "6a6ca22d4998ac30");
            let value = kv[1]
                .replace("6a6ca22d4998ac0b", "6a6ca22d4998ac30")
                .replace(&old_decimal, &new_decimal)
                .replace("\"tiny-agg\"", &format!("\"{model}\""));
            (key, value)
        })
        .collect()
}

fn listed(router: &RouterProcess) -> Vec<String> {
    let r = router.get("/v1/models");
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "list", "{v}");
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert_eq!(m["object"], "model", "{m}");
            m["id"].as_str().unwrap().to_owned()
        })
        .collect()
}

fn wait_listed(router: &RouterProcess, want: &[&str]) {
    let deadline = Instant::now() + STEP;
    loop {
        let got = listed(router);
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "listed {got:?}, want {want:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn dynamo_yaml(root: &Path) -> String {
    let root_json = Value::String(root.display().to_string());
    format!(
        "dynamo:\n  enabled: true\n  discovery:\n    source: file\n    file:\n      root: {root_json}\n      \
         ttl: 10m\n      namespaces: [agg, disagg]\n  load:\n    direct_allow_cidrs: [\"127.0.0.0/8\"]\n  \
         shim:\n    pools:\n      - {{ namespace: agg, backends: [shim-agg] }}\n      \
         - {{ namespace: disagg, backends: [shim-disagg] }}\n    model_map: {{ agg-client: tiny-agg }}\n"
    )
}

/// The recorded fleet in a file store behind one shim replica per namespace, and a plain
/// backend serving `plain_model`.
struct Setup {
    _dir: TempDir,
    root: std::path::PathBuf,
    shim_agg: MockBackend,
    shim_disagg: MockBackend,
    plain: MockBackend,
    router: RouterProcess,
}

fn setup(plain_model: &str) -> Setup {
    let dir = TempDir::new("models");
    let root = dir.path().join("store");
    write_fixture(&root);
    let shim_agg = MockBackend::start("shim-agg");
    let shim_disagg = MockBackend::start("shim-disagg");
    let plain = MockBackend::start("plain");
    let mut cfg = RouterConfig::default()
        .backend("shim-agg", &shim_agg.url(), &[])
        .backend("shim-disagg", &shim_disagg.url(), &[])
        .backend("plain", &plain.url(), &[plain_model]);
    cfg.disaggregated_serving = true;
    cfg.extra_yaml = dynamo_yaml(&root);
    let router = RouterProcess::start(&cfg);
    Setup {
        _dir: dir,
        root,
        shim_agg,
        shim_disagg,
        plain,
        router,
    }
}

#[test]
fn the_models_list_follows_the_fleet_and_the_official_client_reads_it() {
    let s = setup("plain-only");
    let (root, router) = (&s.root, &s.router);

    // Configured models first, then the fleet's client models: `tiny-agg` under its mapped name.
    wait_listed(router, &["plain-only", "agg-client", "tiny-disagg"]);

    let base = format!("http://{}/v1", router.addr());
    let sdk = |retrieve: &[&str]| {
        let mut args = vec!["--base-url".to_owned(), base.clone()];
        for id in retrieve {
            args.extend(["--retrieve".to_owned(), (*id).to_owned()]);
        }
        let out = run_script(OPENAI_MODELS, &args, Duration::from_secs(60));
        assert_eq!(out.len(), 1, "{out:?}");
        out.into_iter().next().unwrap()
    };
    let v = sdk(&[
        "agg-client",
        "tiny-agg",
        "plain-only",
        "tiny-disagg",
        "nope",
    ]);
    assert_eq!(
        v["listed"],
        serde_json::json!(["plain-only", "agg-client", "tiny-disagg"])
    );
    let got = &v["retrieved"];
    for id in ["agg-client", "plain-only", "tiny-disagg"] {
        assert_eq!(got[id]["ok"], true, "{id}: {v}");
        assert_eq!(got[id]["id"], id, "{v}");
        assert_eq!(got[id]["object"], "model", "{v}");
    }
    // A mapped model's own name is routed too (a chat request for it is pinned), so it is found.
    assert_eq!(got["tiny-agg"]["ok"], true, "{v}");
    // An unknown model: the OpenAI-shaped 404.
    assert_eq!(got["nope"]["ok"], false, "{v}");
    assert_eq!(got["nope"]["status"], 404, "{v}");
    let body: Value = serde_json::from_str(got["nope"]["body"].as_str().unwrap()).unwrap();
    assert!(body["error"]["message"].is_string(), "{body}");

    // An id with a slash, escaped or not, names one model.
    let records = new_worker_records("org/tiny-new");
    for (k, val) in &records {
        publish(root, k, val);
    }
    wait_listed(
        router,
        &["plain-only", "agg-client", "org/tiny-new", "tiny-disagg"],
    );
    for path in ["/v1/models/org/tiny-new", "/v1/models/org%2Ftiny-new"] {
        let r = router.get(path);
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(r.json()["id"], "org/tiny-new", "{path}");
    }
    let v = sdk(&["org/tiny-new"]);
    assert_eq!(v["retrieved"]["org/tiny-new"]["ok"], true, "{v}");

    // The last worker of a model leaves: the model goes.
    for (k, _) in &records {
        remove(root, k);
    }
    wait_listed(router, &["plain-only", "agg-client", "tiny-disagg"]);
    assert_eq!(router.get("/v1/models/org/tiny-new").status, 404);
    // The aggregated workers leave: `agg-client` goes with them (no plain backend serves it).
    for id in ["6a6ca22d4998ac0b", "6a6ca22d4998ac16"] {
        remove(root, &format!("v1/instances/agg/backend/generate/{id}"));
    }
    wait_listed(router, &["plain-only", "tiny-disagg"]);
    let r = router.get("/v1/models/agg-client");
    assert_eq!(r.status, 404, "{}", r.text());
}

#[test]
fn embeddings_go_to_the_plain_backend_of_their_model_unpinned() {
    let s = setup("tiny-agg");
    let (router, shim_agg, shim_disagg, plain) = (&s.router, &s.shim_agg, &s.shim_disagg, &s.plain);
    wait_listed(router, &["tiny-agg", "agg-client", "tiny-disagg"]);
    let post = |body: &[u8]| {
        let headers = [("Content-Type", "application/json")];
        let raw = request_bytes("POST", "/v1/embeddings", &headers, Some(body));
        roundtrip(router.addr(), &raw).unwrap()
    };
    // The fleet serves `tiny-agg` and a chat request for it would be pinned through the shim;
    // an embeddings request for it goes to the plain backend as sent, with no pin.
    let body = br#"{"model":"tiny-agg","input":"hello"}"#;
    let r = post(body);
    assert_eq!(r.status, 200, "{}", r.text());
    let got = plain.wait_requests(1, STEP).pop().unwrap();
    assert_eq!(got.method, "POST");
    assert_eq!(got.path, "/v1/embeddings");
    assert_eq!(got.body, body);
    assert!(
        got.headers
            .iter()
            .all(|(n, _)| !n.to_ascii_lowercase().starts_with("x-dynamo-")),
        "{:?}",
        got.headers
    );
    assert_eq!(shim_agg.request_count(), 0);
    // Only the fleet serves `agg-client` (a client name of the map): embeddings are not routed
    // to the fleet, so it is an unknown model here.
    let r = post(br#"{"model":"agg-client","input":"hello"}"#);
    let err = r.assert_json_error(404);
    assert!(err["message"].is_string(), "{err}");
    assert_eq!(shim_agg.request_count(), 0);
    // A malformed body: 400 with the reason.
    let r = post(br#"{"input":"hello"}"#);
    let err = r.assert_json_error(400);
    assert!(
        err["message"].as_str().unwrap_or("").contains("model"),
        "{err}"
    );
    assert_eq!(plain.request_count(), 1);
    assert_eq!(shim_agg.request_count() + shim_disagg.request_count(), 0);
}
