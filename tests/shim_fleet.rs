//! The shim path end to end on a REAL Dynamo 1.6.1 fleet (etcd, `dynamo.mocker` workers, one
//! `dynamo.frontend --router-mode direct` per namespace; `tests/fleet/`): the router discovers
//! the workers in etcd, subscribes to their `kv_metrics`, picks, pins and dispatches to the
//! namespace's frontend. The real frontend answers 400/500 to a wrong or missing pin, so a
//! success proves the pins. Clients: the official `openai` Python package
//! (`tests/clients/openai_chat.py`) and raw HTTP. Every request is timeboxed; every wait has a
//! deadline. Findings about the frontend are in `tests/fleet/README.md`.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::client::{RESPONSE_TIMEOUT, chat_bytes, roundtrip};
use common::fleet::{Fleet, FleetSpec, Role};
use common::pyclient::{ClientResult, OpenAiChat, StreamMode};
use common::{Response, RouterProcess, chat, get, metric_value};
use serde_json::Value;

const AGG: &str = "tiny-agg";
const DISAGG: &str = "tiny-disagg";
const TTL: u32 = 3;
const MAX_TOKENS: u32 = 8;
/// What the 1.6.1 frontend answers for a disaggregated model without a live prefill worker.
const NOT_READY: &str = "Model `tiny-disagg` is not ready to serve requests yet";

/// The router over `fleet` ([`Fleet::router_config`]), once it sees every worker.
fn router_for(fleet: &Fleet, fallback: bool) -> RouterProcess {
    let mut cfg = fleet.router_config();
    cfg.fallback_to_unified = fallback;
    let r = RouterProcess::start(&cfg);
    let all: BTreeSet<u64> = fleet.info.workers.iter().map(|w| w.instance_id).collect();
    wait_routed(&r, |ids| *ids == all, "every fleet worker discovered", 20);
    r
}

/// The instance ids in the router's fleet view.
fn routed_ids(r: &RouterProcess) -> BTreeSet<u64> {
    let v = r.get("/admin/dynamo/workers").json();
    v["workers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|w| w["worker_id"].as_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Polls the router's fleet view until `done`; returns how long that took.
fn wait_routed(
    r: &RouterProcess,
    done: impl Fn(&BTreeSet<u64>) -> bool,
    what: &str,
    secs: u64,
) -> Duration {
    let start = Instant::now();
    loop {
        let ids = routed_ids(r);
        if done(&ids) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "{what}: not within {secs}s; the router sees {ids:?}\n{}",
            r.get("/admin/dynamo/workers").text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until every worker's `kv_metrics` publisher is connected.
fn wait_subscribed(r: &RouterProcess, fleet: &Fleet) {
    let want: Vec<u64> = fleet
        .info
        .workers
        .iter()
        .filter_map(|w| w.publishers.get("kv_metrics").map(|p| p.publisher_id))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = r.get("/admin/dynamo/workers").json();
        let rows = v["subscriptions"].as_array().cloned().unwrap_or_default();
        let connected = |id: u64| {
            rows.iter().any(|row| {
                row["publisher_id"].as_str().and_then(|s| s.parse().ok()) == Some(id)
                    && row["state"] == "connected"
            })
        };
        if want.iter().all(|id| connected(*id)) {
            return;
        }
        assert!(Instant::now() < deadline, "subscriptions: {rows:#?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn body(model: &str, stream: bool) -> Vec<u8> {
    format!(
        "{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"shim fleet\"}}],\
         \"max_tokens\":{MAX_TOKENS},\"stream\":{stream}}}"
    )
    .into_bytes()
}

/// One chat request (timeboxed by the client's response timeout); the answer and its latency.
fn post(addr: SocketAddr, model: &str, stream: bool, headers: &[(&str, &str)]) -> (Response, f64) {
    let start = Instant::now();
    let resp = chat(addr, &body(model, stream), headers);
    (resp, start.elapsed().as_secs_f64())
}

fn metric(r: &RouterProcess, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(&r.metrics(), name, labels).unwrap_or(0.0)
}

/// Asserts a parsed successful completion: text, finish reason, usage, model; for streams the
/// chunk accounting, the usage chunk and `data: [DONE]` on the wire.
fn assert_parsed_completion(res: &ClientResult) {
    let what = format!("{} stream={}: {:#}", res.model(), res.streamed(), res.0);
    assert!(res.ok(), "{what}");
    assert!(
        !res.str("text").unwrap_or("").is_empty(),
        "empty text: {what}"
    );
    assert_eq!(res.str("finish_reason"), Some("length"), "{what}");
    assert_eq!(res.str("response_model"), Some(res.model()), "{what}");
    let usage = &res.0["usage"];
    assert_eq!(usage["completion_tokens"], MAX_TOKENS, "{what}");
    assert!(usage["prompt_tokens"].as_u64().unwrap_or(0) > 0, "{what}");
    if res.streamed() {
        let content = res.int("content_chunks").unwrap_or(0);
        assert!(
            (1..=u64::from(MAX_TOKENS)).contains(&content),
            "content chunks: {what}"
        );
        // Content chunks, the finish chunk and the usage chunk (choices: []).
        assert!(res.int("chunks").unwrap_or(0) > content, "{what}");
        assert_eq!(res.int("usage_chunks"), Some(1), "{what}");
        assert_eq!(res.0["raw_done"], true, "no `data: [DONE]`: {what}");
    }
}

#[test]
fn official_openai_client_chats_buffered_and_streamed_on_both_models() {
    let fleet = Fleet::start(&FleetSpec::new().agg(AGG, 2).disagg(DISAGG, 1, 1));
    // No fallback: a success can only be the pinned request the real frontend accepted.
    let r = router_for(&fleet, false);
    let agg: BTreeSet<u64> = fleet
        .workers_of(AGG)
        .iter()
        .map(|w| w.instance_id)
        .collect();
    let prefill = fleet.worker(DISAGG, Role::Prefill).instance_id;
    let decode = fleet.worker(DISAGG, Role::Decode).instance_id;

    let results = OpenAiChat::new(r.addr(), AGG)
        .model(DISAGG)
        .stream(StreamMode::Both)
        .n(2)
        .max_tokens(MAX_TOKENS)
        .header("x-backend", "")
        .run();
    assert_eq!(results.len(), 8);
    for res in &results {
        assert_parsed_completion(res);
        let h = res.headers();
        if res.model() == AGG {
            assert_eq!(
                h.get("x-continuum-routing-path").map(String::as_str),
                Some("unified")
            );
            assert_eq!(h.get("x-backend").map(String::as_str), Some("fe-agg"));
            assert!(agg.contains(&res.worker().unwrap()), "{h:?}");
            assert_eq!(res.prefill(), None, "{h:?}");
            assert_eq!(
                h.get("x-continuum-dynamo-namespace").map(String::as_str),
                Some("agg")
            );
        } else {
            assert_eq!(
                h.get("x-continuum-routing-path").map(String::as_str),
                Some("disaggregated")
            );
            assert_eq!(h.get("x-backend").map(String::as_str), Some("fe-disagg"));
            assert_eq!((res.worker(), res.prefill()), (Some(decode), Some(prefill)));
            assert_eq!(h.get("x-continuum-dp-rank").map(String::as_str), Some("0"));
            assert_eq!(
                h.get("x-continuum-prefill-dp-rank").map(String::as_str),
                Some("0")
            );
            assert_eq!(
                h.get("x-continuum-dynamo-namespace").map(String::as_str),
                Some("disagg")
            );
        }
    }
    let t = r.metrics();
    let m = |name: &str, l: &[(&str, &str)]| metric_value(&t, name, l).unwrap_or(0.0);
    let path = |p| m("disaggregated_requests_total", &[("routing_path", p)]);
    assert_eq!((path("disaggregated"), path("unified")), (4.0, 4.0), "{t}");
    assert_eq!(path("fallback_unified") + path("no_worker"), 0.0, "{t}");
    assert_eq!(m("disaggregated_errors_total", &[]), 0.0, "{t}");
    assert_eq!(
        m("continuum_dynamo_selection_total", &[("role", "decode")]),
        8.0
    );
    assert_eq!(
        m(
            "continuum_dynamo_selection_total",
            &[("role", "prefill"), ("reason", "no_prefill_pool")]
        ),
        4.0,
        "aggregated picks carry no prefill: {t}"
    );
}

#[test]
fn client_sent_pin_headers_never_change_the_pick() {
    let fleet = Fleet::start(&FleetSpec::new().agg(AGG, 2).disagg(DISAGG, 1, 1));
    let r = router_for(&fleet, false);
    let mut agg: Vec<u64> = fleet
        .workers_of(AGG)
        .iter()
        .map(|w| w.instance_id)
        .collect();
    agg.sort_unstable();
    let prefill = fleet.worker(DISAGG, Role::Prefill).instance_id;
    let decode = fleet.worker(DISAGG, Role::Decode).instance_id;

    // The official client pinning one valid aggregated worker on every request: the router
    // still spreads over both (the pin is dropped and replaced).
    let forced = agg[0].to_string();
    let results = OpenAiChat::new(r.addr(), AGG)
        .stream(StreamMode::Both)
        .n(4)
        .header("x-backend", "")
        .header("x-dynamo-worker-instance-id", &forced)
        .run();
    let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
    for res in &results {
        assert_parsed_completion(res);
        *counts.entry(res.worker().unwrap()).or_default() += 1;
    }
    assert_eq!(
        counts.keys().copied().collect::<Vec<_>>(),
        agg,
        "the router picks, not the client: {counts:?}"
    );

    // Raw HTTP with pins the real frontend would reject (400) if they reached it: a bogus
    // decimal id, a hex id, the other model's worker, swapped disaggregated ids.
    let bogus: [(&str, Vec<(&str, String)>); 5] = [
        (AGG, vec![("x-dynamo-worker-instance-id", "12345".into())]),
        (
            AGG,
            vec![("X-Dynamo-Worker-Instance-Id", format!("{:x}", agg[1]))],
        ),
        (
            AGG,
            vec![("x-dynamo-worker-instance-id", prefill.to_string())],
        ),
        (
            DISAGG,
            vec![
                ("x-dynamo-worker-instance-id", prefill.to_string()),
                ("x-dynamo-prefill-instance-id", decode.to_string()),
            ],
        ),
        (DISAGG, vec![("x-dynamo-prefill-instance-id", "999".into())]),
    ];
    for (model, pins) in &bogus {
        for stream in [false, true] {
            let mut headers: Vec<(&str, &str)> =
                pins.iter().map(|(n, v)| (*n, v.as_str())).collect();
            headers.push(("x-backend", ""));
            let (resp, _) = post(r.addr(), model, stream, &headers);
            assert_eq!(resp.status, 200, "{model} {pins:?}: {}", resp.text());
            let worker: u64 = resp
                .header("x-continuum-worker-instance-id")
                .unwrap()
                .parse()
                .unwrap();
            if *model == AGG {
                assert!(agg.contains(&worker), "{worker}");
                assert_eq!(resp.header("x-continuum-prefill-instance-id"), None);
            } else {
                assert_eq!(worker, decode);
                assert_eq!(
                    resp.header("x-continuum-prefill-instance-id"),
                    Some(prefill.to_string().as_str())
                );
            }
            assert!(
                resp.headers.iter().all(|(n, _)| !common::is_pin_header(n)),
                "{:?}",
                resp.headers
            );
        }
    }
    // A streamed answer's last bytes can leave before its shard counts the pins it stripped
    // (shards/src/http/conn.rs): read the counter until it has them all, for at most a second.
    let stripped = || metric(&r, "continuum_client_pin_headers_stripped_total", &[]);
    for _ in 0..50 {
        if stripped() >= 8.0 + 12.0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(stripped() >= 8.0 + 12.0, "{}", r.metrics());
    assert_eq!(metric(&r, "disaggregated_errors_total", &[]), 0.0);
}

#[test]
fn concurrent_streams_spread_over_the_workers_by_load() {
    let fleet = Fleet::start(&FleetSpec::new().agg(AGG, 2));
    let r = router_for(&fleet, false);
    wait_subscribed(&r, &fleet);
    let agg: Vec<u64> = fleet
        .workers_of(AGG)
        .iter()
        .map(|w| w.instance_id)
        .collect();
    const N: u32 = 32;
    // 8 in flight, 128 tokens each (about 1 s on the mocker): the streams overlap, and each
    // worker publishes kv_metrics when its load changes.
    let results = OpenAiChat::new(r.addr(), AGG)
        .stream(StreamMode::Streamed)
        .n(N)
        .concurrency(8)
        .max_tokens(128)
        .timeout(Duration::from_secs(30))
        .header("x-backend", "")
        .run();
    let mut counts: BTreeMap<u64, u32> = BTreeMap::new();
    for res in &results {
        assert!(res.ok(), "{:#}", res.0);
        assert_eq!(res.str("finish_reason"), Some("length"), "{:#}", res.0);
        assert_eq!(res.0["usage"]["completion_tokens"], 128, "{:#}", res.0);
        assert_eq!(res.0["raw_done"], true);
        *counts.entry(res.worker().unwrap()).or_default() += 1;
    }
    let t = r.metrics();
    let sel = |reason| {
        metric_value(
            &t,
            "continuum_dynamo_selection_total",
            &[("role", "decode"), ("reason", reason)],
        )
        .unwrap_or(0.0)
    };
    let (load, stale) = (sel("load"), sel("round_robin_stale"));
    let applied = metric_value(
        &t,
        "continuum_dynamo_load_events_total",
        &[("result", "applied")],
    )
    .unwrap_or(0.0);
    eprintln!(
        "{N} concurrent streams: picks per worker {counts:?}; decode selections: load {load}, \
         round_robin_stale {stale}; kv_metrics samples applied {applied}"
    );
    assert_eq!(load + stale, f64::from(N), "{t}");
    for id in &agg {
        let share = counts.get(id).copied().unwrap_or(0);
        assert!(
            share * 5 >= N,
            "worker {id} got {share}/{N} (< 20%): {counts:?}"
        );
    }
    assert!(applied >= 2.0, "kv_metrics samples reached the store: {t}");
    assert!(
        load >= 1.0,
        "no load-based pick although samples were fresh: {t}"
    );
}

/// One request of the kill probe: when it was sent, what came back.
#[derive(Debug, Clone)]
struct Probe {
    sent: Instant,
    status: u16,
    worker: Option<u64>,
    code: Option<String>,
}

/// Sequential buffered requests with `x-backend` until `stop`.
fn probe_loop(addr: SocketAddr, stop: &AtomicBool) -> Vec<Probe> {
    let mut out = Vec::new();
    let raw = chat_bytes(&body(AGG, false), &[("x-backend", "")]);
    while !stop.load(Ordering::SeqCst) {
        let sent = Instant::now();
        let probe = match roundtrip(addr, &raw) {
            Ok(resp) => Probe {
                sent,
                status: resp.status,
                worker: resp
                    .header("x-continuum-worker-instance-id")
                    .and_then(|v| v.parse().ok()),
                code: serde_json::from_slice::<Value>(&resp.body)
                    .ok()
                    .and_then(|v| v["error"]["code"].as_str().map(str::to_string)),
            },
            Err(e) => Probe {
                sent,
                status: 0,
                worker: None,
                code: Some(e),
            },
        };
        out.push(probe);
        std::thread::sleep(Duration::from_millis(50));
    }
    out
}

/// Seconds from `t0` to `t`, negative when `t` is earlier.
fn since(t0: Instant, t: Instant) -> f64 {
    match t.checked_duration_since(t0) {
        Some(d) => d.as_secs_f64(),
        None => -(t0 - t).as_secs_f64(),
    }
}

#[test]
fn a_sigkilled_worker_stops_being_picked_within_the_lease_bound() {
    let mut fleet = Fleet::start(&FleetSpec::new().agg(AGG, 2).lease_ttl(TTL));
    let r = router_for(&fleet, false);
    wait_subscribed(&r, &fleet);
    let victim = fleet.info.workers[0].clone();
    let survivor = fleet.info.workers[1].instance_id;
    // Both workers serve before the kill.
    let mut seen = BTreeSet::new();
    for _ in 0..12 {
        let (resp, _) = post(r.addr(), AGG, false, &[("x-backend", "")]);
        assert_eq!(resp.status, 200, "{}", resp.text());
        seen.insert(
            resp.header("x-continuum-worker-instance-id")
                .unwrap()
                .to_string(),
        );
        if seen.len() == 2 {
            break;
        }
    }
    assert_eq!(
        seen.len(),
        2,
        "both workers picked before the kill: {seen:?}"
    );

    // Probe through the kill, the lease expiry and the router's discovery, then 1.5 s more.
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let stop = stop.clone();
        let addr = r.addr();
        std::thread::spawn(move || probe_loop(addr, &stop))
    };
    std::thread::sleep(Duration::from_millis(300));
    let killed = Instant::now();
    fleet.kill(&victim.instance_id_hex, "SIGKILL");
    let exited = killed.elapsed().as_secs_f64();
    // Poll both, alternately: the lease's keys in etcd and the router's fleet view.
    let bound = Duration::from_secs(u64::from(TTL) + 5);
    let (mut lease_gone, mut dropped) = (None, None);
    while lease_gone.is_none() || dropped.is_none() {
        if dropped.is_none() && !routed_ids(&r).contains(&victim.instance_id) {
            dropped = Some(killed.elapsed().as_secs_f64());
        }
        if lease_gone.is_none() && fleet.lease_keys(&victim.instance_id_hex).is_empty() {
            lease_gone = Some(killed.elapsed().as_secs_f64());
        }
        assert!(
            killed.elapsed() < bound,
            "{bound:?} after SIGKILL: lease gone at {lease_gone:?}, router dropped it at \
             {dropped:?}; the router sees {:?}",
            routed_ids(&r)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (lease_gone, dropped) = (lease_gone.unwrap(), dropped.unwrap());
    // Every key of the dead worker is gone, not only those on its lease.
    fleet
        .wait_lease_gone(&victim.instance_id_hex, Duration::from_secs(2))
        .unwrap_or_else(|left| panic!("keys of the dead worker left: {left:?}"));
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::SeqCst);
    let probes = prober.join().unwrap();
    let at = |p: &Probe| since(killed, p.sent);

    // Once the router dropped it, every request succeeds on the survivor.
    let after: Vec<&Probe> = probes.iter().filter(|p| at(p) > dropped).collect();
    assert!(
        after.len() >= 5,
        "too few probes after the drop: {probes:#?}"
    );
    for p in &after {
        assert_eq!(
            (p.status, p.worker),
            (200, Some(survivor)),
            "after the router dropped the dead worker: {p:?}\nall: {probes:#?}"
        );
    }
    // Before that, a pick of the dead worker fails fast and classified (no fallback here): the
    // frontend answers 503 for the dead pinned instance, the router 502.
    for p in probes.iter().filter(|p| p.status != 200) {
        assert_eq!(
            (p.status, p.code.as_deref()),
            (502, Some("disaggregated_decode_failed")),
            "{p:?}"
        );
    }
    assert!(
        probes
            .iter()
            .all(|p| p.worker != Some(victim.instance_id) || at(p) < exited),
        "a success disclosed the dead worker after it exited ({exited:.2}s): {probes:#?}"
    );
    // A request the dead worker got: a failure, or a success pinned to it (sent before it died).
    let last_dead = probes
        .iter()
        .filter(|p| p.status != 200 || p.worker == Some(victim.instance_id))
        .map(at)
        .next_back()
        .unwrap_or(f64::NEG_INFINITY);
    let unpicked = probes.iter().map(at).find(|t| *t > last_dead);
    let failed: Vec<String> = probes
        .iter()
        .filter(|p| p.status != 200)
        .map(|p| format!("{:.2}s", at(p)))
        .collect();
    let failures = failed.len();
    eprintln!(
        "SIGKILL at 0 (worker gone at {exited:.2}s): last request to the dead worker sent at \
         {last_dead:.2}s, none from {:.2}s on; lease gone at {lease_gone:.2}s (TTL {TTL}s); the \
         router's fleet view dropped it at {dropped:.2}s (discovery lag {:.2}s); {} probes, \
         {failures} failed with 502 (sent at {failed:?})",
        unpicked.unwrap_or(f64::NAN),
        dropped - lease_gone,
        probes.len(),
    );
    // The unanswered-dispatch accounting (LOAD-STORE-10) keeps the failed pick on the dead
    // worker's backlog (no sample ever clears it), so the picker steers away long before the
    // lease expires; round-robin would fail about every other probe until the drop.
    assert!(
        failures <= 3,
        "{failures} failed probes before the drop: {probes:#?}"
    );
    assert!(
        dropped <= f64::from(TTL) + 4.0,
        "router dropped the dead worker {dropped:.2}s after the kill"
    );
    assert!(
        dropped - lease_gone <= 2.0,
        "discovery lag {:.2}s",
        dropped - lease_gone
    );
}

/// Sends `model` buffered and streamed; returns the answers (each within the client timeout).
fn both_ways(r: &RouterProcess, model: &str) -> Vec<Response> {
    [false, true]
        .into_iter()
        .map(|stream| {
            let (resp, secs) = post(r.addr(), model, stream, &[("x-backend", "")]);
            assert!(
                secs < RESPONSE_TIMEOUT.as_secs_f64() / 2.0,
                "{model} stream={stream} took {secs:.2}s"
            );
            resp
        })
        .collect()
}

#[test]
fn without_prefill_workers_the_disaggregated_model_fails_fast_and_classified() {
    let mut fleet = Fleet::start(
        &FleetSpec::new()
            .agg(AGG, 1)
            .disagg(DISAGG, 1, 1)
            .lease_ttl(TTL),
    );
    let strict = router_for(&fleet, false);
    let lenient = router_for(&fleet, true);
    let prefill = fleet.worker(DISAGG, Role::Prefill).clone();
    let decode = fleet.worker(DISAGG, Role::Decode).instance_id;
    let fe = fleet.frontend("disagg");
    for r in [&strict, &lenient] {
        for resp in both_ways(r, DISAGG) {
            assert_eq!(resp.status, 200, "{}", resp.text());
            assert_eq!(
                resp.header("x-continuum-routing-path"),
                Some("disaggregated")
            );
        }
    }

    fleet.kill(&prefill.instance_id_hex, "SIGKILL");
    // Within the lease the router still pins the dead prefill worker; the frontend fails it.
    let (during, _) = post(strict.addr(), DISAGG, false, &[]);
    let err = during.assert_json_error(502);
    assert_eq!(err["code"], "disaggregated_decode_failed");
    eprintln!(
        "within the lease: {} {:?} (path {:?})",
        during.status,
        during.text(),
        during.header("x-continuum-routing-path")
    );

    let bound = Duration::from_secs(u64::from(TTL) + 5);
    fleet
        .wait_lease_gone(&prefill.instance_id_hex, bound)
        .unwrap_or_else(|left| panic!("lease keys left {bound:?} after SIGKILL: {left:?}"));
    for r in [&strict, &lenient] {
        wait_routed(
            r,
            |ids| !ids.contains(&prefill.instance_id),
            "prefill dropped",
            5,
        );
    }
    // The real frontend: once the prefill worker's lease is gone the model is "not ready" (503),
    // whatever the pins, and it is no longer listed.
    let pin = decode.to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    let direct = loop {
        let (resp, _) = post(fe, DISAGG, false, &[("x-dynamo-worker-instance-id", &pin)]);
        if resp.status == 503 {
            break resp;
        }
        assert!(
            Instant::now() < deadline,
            "the frontend still answers {} {:?} to a decode-only pin",
            resp.status,
            resp.text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let v = direct.json();
    assert!(
        v["message"].as_str().unwrap_or("").starts_with(NOT_READY),
        "{v}"
    );
    assert_eq!(v["code"], 503, "{v}");
    assert_eq!(get(fe, "/v1/models").json()["data"], Value::Array(vec![]));

    // fallback_to_unified: false -> the decode-only pin (SHIM-07) fails: 502
    // disaggregated_decode_failed, phase "decode" (the frontend never sends the direct-mode
    // rejection text in a body, so SHIM-18's 503 does not apply).
    let before = strict.metrics();
    let m0 = |name: &str, l: &[(&str, &str)]| metric_value(&before, name, l).unwrap_or(0.0);
    for resp in both_ways(&strict, DISAGG) {
        let err = resp.assert_json_error(502);
        assert_eq!(err["code"], "disaggregated_decode_failed");
        assert_eq!(resp.header("x-continuum-routing-path"), Some("unified"));
    }
    let client = OpenAiChat::new(strict.addr(), DISAGG)
        .stream(StreamMode::Both)
        .timeout(Duration::from_secs(5))
        .run();
    for res in &client {
        assert_eq!(res.status(), Some(502), "{:#}", res.0);
        assert!(
            res.str("body")
                .unwrap_or("")
                .contains("disaggregated_decode_failed"),
            "{:#}",
            res.0
        );
    }
    let after = strict.metrics();
    let d =
        |name: &str, l: &[(&str, &str)]| metric_value(&after, name, l).unwrap_or(0.0) - m0(name, l);
    assert_eq!(
        d("disaggregated_errors_total", &[("phase", "decode")]),
        4.0,
        "{after}"
    );
    assert_eq!(
        d("disaggregated_errors_total", &[("phase", "orchestration")]),
        0.0
    );
    assert_eq!(
        d(
            "disaggregated_requests_total",
            &[("routing_path", "unified")]
        ),
        4.0
    );
    assert_eq!(
        d(
            "continuum_dynamo_selection_total",
            &[("role", "prefill"), ("reason", "no_prefill_pool")]
        ),
        4.0
    );

    // fallback_to_unified: true -> the unified fallback goes, unpinned, to the only plain backend
    // serving the model: the same frontend, which answers its 503 "not ready"; relayed as is.
    let before = lenient.metrics();
    let m0 = |name: &str, l: &[(&str, &str)]| metric_value(&before, name, l).unwrap_or(0.0);
    for resp in both_ways(&lenient, DISAGG) {
        assert_eq!(resp.status, 503, "{}", resp.text());
        assert!(
            resp.json()["message"]
                .as_str()
                .unwrap_or("")
                .starts_with(NOT_READY),
            "{}",
            resp.text()
        );
        assert_eq!(
            resp.header("x-continuum-routing-path"),
            Some("fallback_unified")
        );
        assert_eq!(resp.header("x-backend"), Some("fe-disagg"));
    }
    let after = lenient.metrics();
    let d =
        |name: &str, l: &[(&str, &str)]| metric_value(&after, name, l).unwrap_or(0.0) - m0(name, l);
    assert_eq!(
        d("disaggregated_errors_total", &[("phase", "decode")]),
        2.0,
        "{after}"
    );
    assert_eq!(
        d(
            "disaggregated_requests_total",
            &[("routing_path", "fallback_unified")]
        ),
        2.0
    );

    // The aggregated model keeps serving through both routers.
    for r in [&strict, &lenient] {
        for resp in both_ways(r, AGG) {
            assert_eq!(resp.status, 200, "{}", resp.text());
            assert_eq!(resp.header("x-continuum-routing-path"), Some("unified"));
        }
    }
}

/// Dynamo 1.7's worker admission gate (its limit is the worker's `max_num_seqs`, here 1): with
/// more requests in flight than the one worker admits, the frontend answers 529 `Service
/// temporarily overloaded` and the router relays it (docs/shim.md), never a 502 or an unpinned
/// resend. Runs on 1.7 fleets (the compatibility run, tests/compat/run.sh); earlier releases have
/// no gate and queue instead.
#[test]
fn dynamo_1_7s_admission_gate_overload_reaches_the_client_as_529() {
    let release = common::fleet::installed_release();
    if release < (1, 7, 0) {
        common::fleet::compat_skip(&format!(
            "the fleet venv has ai-dynamo {release:?}, without the admission gate"
        ));
        return;
    }
    let fleet = Fleet::start(
        &FleetSpec::new()
            .agg(AGG, 1)
            .speedup_ratio(0.05)
            .mocker_args("--max-num-seqs 1"),
    );
    let r = router_for(&fleet, true);
    wait_subscribed(&r, &fleet);
    let addr = r.addr();
    let answers: Vec<(u16, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|i| {
                s.spawn(move || {
                    let (resp, _) = post(addr, AGG, i % 2 == 0, &[]);
                    (resp.status, resp.text())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let overloaded: Vec<_> = answers.iter().filter(|(s, _)| *s == 529).collect();
    assert!(
        answers.iter().all(|(s, _)| *s == 200 || *s == 529),
        "{answers:?}"
    );
    assert!(
        !overloaded.is_empty(),
        "the gate never refused: {answers:?}"
    );
    assert!(
        answers.iter().any(|(s, _)| *s == 200),
        "nothing admitted: {answers:?}"
    );
    for (_, body) in &overloaded {
        assert!(body.contains("Service temporarily overloaded"), "{body}");
    }
    assert_eq!(
        metric(&r, "disaggregated_errors_total", &[("phase", "decode")]),
        0.0
    );
}
