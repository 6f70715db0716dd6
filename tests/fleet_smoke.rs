//! Smoke test of the real-fleet harness (`tests/fleet/`, `common::fleet`): a REAL Dynamo 1.6.1
//! fleet (etcd, mocker workers, `dynamo.frontend --router-mode direct`) on loopback, driven with
//! raw HTTP. It pins down the frontend answers later routing work relies on (see
//! ../shared/fixtures/README.md) and that a killed worker leaves etcd when its lease expires.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::fleet::{Fleet, FleetSpec, Role};
use common::{Response, chat, get};

const AGG: &str = "tiny-agg";
const DISAGG: &str = "tiny-disagg";
const WORKER: &str = "x-dynamo-worker-instance-id";
// The header Dynamo 1.6.1 reads the prefill worker from ("Prefill worker ID required in Direct
// routing mode ... Expected prefill_worker_id to be set via x-dynamo-prefill-instance-id").
const PREFILL: &str = "x-dynamo-prefill-instance-id";

fn body(model: &str, stream: bool) -> Vec<u8> {
    format!(
        "{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"fleet smoke\"}}],\
         \"max_tokens\":4,\"stream\":{stream}}}"
    )
    .into_bytes()
}

fn post(addr: SocketAddr, model: &str, stream: bool, headers: &[(&str, &str)]) -> Response {
    chat(addr, &body(model, stream), headers)
}

fn assert_status(resp: &Response, status: u16, what: &str) {
    assert_eq!(
        resp.status,
        status,
        "{what}: expected {status}, got {} with body {:?}",
        resp.status,
        resp.text()
    );
}

fn assert_completion(resp: &Response, model: &str, what: &str) {
    assert_status(resp, 200, what);
    let v = resp.json();
    assert_eq!(v["model"], model, "{what}: {v}");
    assert!(
        v["choices"][0]["message"]["content"].is_string(),
        "{what}: no content in {v}"
    );
}

fn assert_stream(resp: &Response, what: &str) {
    assert_status(resp, 200, what);
    assert!(
        resp.header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream")),
        "{what}: headers {:?}",
        resp.headers
    );
    let text = resp.text();
    assert!(
        text.contains("\"chat.completion.chunk\"") && text.trim_end().ends_with("data: [DONE]"),
        "{what}: not a complete SSE stream: {text:?}"
    );
}

fn assert_dynamo_error(resp: &Response, status: u16, message: &str, what: &str) {
    assert_status(resp, status, what);
    let v = resp.json();
    assert_eq!(v["message"], message, "{what}: {v}");
    assert_eq!(v["code"], status, "{what}: {v}");
}

#[test]
fn direct_mode_pins_against_the_real_frontend() {
    let fleet = Fleet::start(&FleetSpec::new().agg(AGG, 1).disagg(DISAGG, 1, 1));
    let agg = fleet.worker(AGG, Role::Aggregated);
    let prefill = fleet.worker(DISAGG, Role::Prefill);
    let decode = fleet.worker(DISAGG, Role::Decode);

    // The JSON matches the fixtures' layout: components, decimal = hex ids, publishers.
    assert_eq!(
        (agg.component.as_str(), agg.namespace.as_str()),
        ("backend", "agg")
    );
    assert_eq!(
        (prefill.component.as_str(), decode.component.as_str()),
        ("prefill", "backend")
    );
    for w in &fleet.info.workers {
        assert_eq!(format!("{:x}", w.instance_id), w.instance_id_hex, "{w:?}");
        let kv = w.kv_metrics.as_deref().unwrap_or_else(|| panic!("{w:?}"));
        // FLEET-05: the port comes from discovery; 1.6 binds the event plane to loopback here,
        // earlier releases advertise the host's first routable address.
        if fleet.release() >= (1, 6, 0) {
            assert!(kv.starts_with("tcp://127.0.0.1:"), "{w:?}");
        } else {
            let (host, port) = kv
                .trim_start_matches("tcp://")
                .rsplit_once(':')
                .unwrap_or_else(|| panic!("{w:?}"));
            assert!(host.parse::<std::net::Ipv4Addr>().is_ok(), "{w:?}");
            assert!(port.parse::<u16>().is_ok_and(|p| p > 0), "{w:?}");
        }
        let keys = fleet.lease_keys(&w.instance_id_hex);
        let ns = &w.namespace;
        let c = &w.component;
        let hex = &w.instance_id_hex;
        for key in [
            format!("v1/instances/{ns}/{c}/generate/{hex}"),
            format!("v1/mdc/{ns}/{c}/generate/{hex}"),
        ] {
            assert!(keys.contains(&key), "{key} not on lease {hex}: {keys:?}");
        }
    }
    // Decode workers publish no kv-events (the card says kv_event_publishing_enabled: false).
    assert!(!decode.publishers.contains_key("kv-events"), "{decode:?}");
    assert!(agg.publishers.contains_key("kv-events"), "{agg:?}");

    // One frontend per namespace, scoped with --namespace: each lists only its own model.
    let agg_fe = fleet.frontend("agg");
    let disagg_fe = fleet.frontend("disagg");
    assert_ne!(agg_fe, disagg_fe);
    let models = get(agg_fe, "/v1/models").json();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, [AGG], "{models}");

    // Aggregated: decimal id -> 200 (buffered and stream); hex or missing id -> 400.
    let dec = agg.instance_id.to_string();
    assert_completion(
        &post(agg_fe, AGG, false, &[(WORKER, &dec)]),
        AGG,
        "agg, decimal id",
    );
    assert_stream(
        &post(agg_fe, AGG, true, &[(WORKER, &dec)]),
        "agg stream, decimal id",
    );
    // A hex id is no id (FLEET-05). 1.6 says `Invalid request`; 1.4 and 1.5 name the missing id.
    let no_pin = if fleet.release() >= (1, 6, 0) {
        "Invalid request"
    } else {
        "worker ID required for aggregated request in Direct routing mode"
    };
    assert_dynamo_error(
        &post(agg_fe, AGG, false, &[(WORKER, &agg.instance_id_hex)]),
        400,
        no_pin,
        "agg, hex id",
    );
    assert_dynamo_error(&post(agg_fe, AGG, false, &[]), 400, no_pin, "agg, no id");
    // The disaggregated model is not served by the agg namespace's frontend.
    assert_status(
        &post(
            agg_fe,
            DISAGG,
            false,
            &[(WORKER, &decode.instance_id.to_string())],
        ),
        404,
        "disagg model on the agg frontend",
    );

    // Disaggregated: decode + prefill ids -> 200; decode only -> 500.
    let d = decode.instance_id.to_string();
    let p = prefill.instance_id.to_string();
    assert_completion(
        &post(disagg_fe, DISAGG, false, &[(WORKER, &d), (PREFILL, &p)]),
        DISAGG,
        "disagg, decode + prefill ids",
    );
    assert_stream(
        &post(disagg_fe, DISAGG, true, &[(WORKER, &d), (PREFILL, &p)]),
        "disagg stream, decode + prefill ids",
    );
    assert_dynamo_error(
        &post(disagg_fe, DISAGG, false, &[(WORKER, &d)]),
        500,
        "Failed to generate completions",
        "disagg, decode id only",
    );
}

#[test]
fn a_killed_worker_leaves_etcd_when_its_lease_expires() {
    const TTL: u32 = 3;
    let mut fleet = Fleet::start(&FleetSpec::new().agg(AGG, 2).lease_ttl(TTL));
    let victim = fleet.info.workers[0].clone();
    let survivor = fleet.info.workers[1].clone();
    let fe = fleet.frontend("agg");
    assert_completion(
        &post(fe, AGG, false, &[(WORKER, &victim.instance_id.to_string())]),
        AGG,
        "victim before the kill",
    );
    let keys_before = fleet.lease_keys(&victim.instance_id_hex);
    assert!(
        keys_before.len() >= 3,
        "instances, mdc and event channels: {keys_before:?}"
    );

    let killed_at = Instant::now();
    let answer = fleet.kill(&victim.instance_id_hex, "SIGKILL");
    assert_eq!(answer["exit"], -9, "{answer}");
    assert_eq!(answer["pid"], victim.pid, "{answer}");

    // While the lease lives, the frontend still knows the instance but cannot reach it.
    let during = post(fe, AGG, false, &[(WORKER, &victim.instance_id.to_string())]);
    assert_ne!(during.status, 200, "{:?}", during.text());

    let bound = Duration::from_secs(u64::from(TTL) + 3);
    fleet
        .wait_lease_gone(&victim.instance_id_hex, bound)
        .unwrap_or_else(|left| panic!("still in etcd {bound:?} after SIGKILL: {left:?}"));
    let gone_after = killed_at.elapsed();
    assert!(gone_after <= bound, "{gone_after:?}");
    eprintln!(
        "lease {} (TTL {TTL}s) gone {:.2}s after SIGKILL; meanwhile the frontend answered {} {:?}",
        victim.instance_id_hex,
        gone_after.as_secs_f64(),
        during.status,
        during.text()
    );
    let all = fleet.etcd_keys("v1/");
    assert!(
        !all.iter().any(|k| keys_before.contains(k)),
        "keys of the dead worker left: {all:?}"
    );
    assert!(
        all.contains(&format!(
            "v1/instances/agg/backend/generate/{}",
            survivor.instance_id_hex
        )),
        "{all:?}"
    );

    // After expiry the id is unknown (bounded wait for the frontend's watch): 400 from 1.5 on,
    // 500 `Failed to generate completions` on 1.4.2 (a shim failure to the router either way;
    // issue 38 re-picks it); the survivor still serves.
    let unknown = if fleet.release() >= (1, 5, 0) {
        400
    } else {
        500
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = post(fe, AGG, false, &[(WORKER, &victim.instance_id.to_string())]);
        if r.status == unknown {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "dead id still answered {} 10 s after its keys left etcd: {:?}",
            r.status,
            r.text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_completion(
        &post(
            fe,
            AGG,
            false,
            &[(WORKER, &survivor.instance_id.to_string())],
        ),
        AGG,
        "survivor",
    );

    let status = fleet.status();
    assert_eq!(status["workers"][0]["alive"], false, "{status}");
    assert_eq!(status["workers"][1]["alive"], true, "{status}");

    // Teardown leaves nothing behind: every process group gone, temp dir removed.
    let mut pids: Vec<i32> = fleet
        .info
        .workers
        .iter()
        .map(|w| w.pid)
        .chain(fleet.info.frontend_processes.iter().map(|f| f.pid))
        .map(|p| i32::try_from(p).unwrap())
        .collect();
    pids.push(i32::try_from(fleet.info.raw["etcd"]["pid"].as_u64().unwrap()).unwrap());
    let dir = fleet.info.dir.clone();
    drop(fleet);
    for pid in pids {
        // SAFETY: signal 0 only checks for existence.
        let r = unsafe { libc::kill(-pid, 0) };
        assert_eq!(r, -1, "process group {pid} survived teardown");
    }
    assert!(!dir.exists(), "{} left behind", dir.display());
}
