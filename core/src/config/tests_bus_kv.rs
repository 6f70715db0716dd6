//! Tests of `dynamo.event_bus` (BUS-07, BUS-21, BUS-28, BUS-38, BUS-39), `dynamo.kv`
//! (KV-PICK-16, KV-TOK-07, Q-42 ranges) and of the `show` output parsing back.

use std::time::Duration;

use super::dynamo::BrokerRole;
use super::tests_basic::{err, has_error, ok};
use super::tests_cfg_a::{clean, etcd, rejects, warns};
use super::{Config, NoEnv};

const SVC: &str = "endpoints: [\"http://etcd.dynamo.svc:2379\"]";
const ZERO_HASH: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// An enabled etcd config plus an `event_bus` mapping body.
fn bus(body: &str) -> String {
    etcd(SVC).replace("shim: {", &format!("event_bus: {{ {body} }}, shim: {{"))
}

fn broker(extra: &str) -> String {
    format!(
        "brokers: [ {{ id: broker-a.dynamo, token_hash: \"{ZERO_HASH}\", namespaces: [dynamo] {extra} }} ]"
    )
}

fn enabled_bus(extra: &str) -> String {
    bus(&format!(
        "enabled: true, listen: \"0.0.0.0:7443\", tls: {{ cert: /c, key: /k }}, {}{extra}",
        broker("")
    ))
}

#[test]
fn bus_38_defaults_and_keys() {
    let (c, _) = ok("dynamo: {}");
    let b = &c.dynamo.event_bus;
    assert!(!b.enabled);
    assert_eq!((b.max_sessions, b.max_streams_per_session), (64, 1024));
    assert_eq!(b.max_session_buffer_bytes, 67_108_864);
    assert_eq!(b.heartbeat_interval, Duration::from_secs(10));
    assert_eq!(b.idle_timeout, Duration::from_secs(30));
    assert_eq!(b.per_stream_buffer_bytes(), 16 << 10);
    let c = clean(&enabled_bus(
        ", max_sessions: 8, heartbeat_interval: 5s, idle_timeout: 1m",
    ));
    let b = &c.dynamo.event_bus;
    assert_eq!(b.listen.unwrap().port(), 7443);
    assert_eq!(b.brokers[0].role, BrokerRole::Broker);
    assert_eq!(b.max_sessions, 8);
    rejects(&bus("enabled: true"), "dynamo.event_bus.listen");
    rejects(&bus("enabled: true"), "dynamo.event_bus.tls");
    rejects(
        &bus("enabled: true, listen: \"0.0.0.0:7443\", tls: { cert: /c }"),
        "dynamo.event_bus.tls.key",
    );
    rejects(
        &enabled_bus(", max_sessions: 0"),
        "dynamo.event_bus.max_sessions",
    );
}

#[test]
fn bus_07_listen_port_must_not_overlap_bind_address() {
    let on = |listen: &str, bind: &str| {
        format!(
            "server: {{ bind_address: \"{bind}\" }}\n{}",
            enabled_bus("").replace("0.0.0.0:7443", listen)
        )
    };
    rejects(
        &on("0.0.0.0:8080", "127.0.0.1:8080"),
        "dynamo.event_bus.listen",
    );
    rejects(
        &on("127.0.0.1:8080", "127.0.0.1:8080"),
        "dynamo.event_bus.listen",
    );
    rejects(
        &on("[::]:8080", "127.0.0.1:8080"),
        "dynamo.event_bus.listen",
    );
    rejects(
        &on("10.0.0.1:9000", "0.0.0.0:9000"),
        "dynamo.event_bus.listen",
    );
    clean(&on("0.0.0.0:7443", "127.0.0.1:8080"));
    clean(&on("10.0.0.1:8080", "127.0.0.1:8080"));
}

#[test]
fn bus_21_empty_broker_namespaces_warns() {
    let yaml = bus(&format!(
        "enabled: true, listen: \"0.0.0.0:7443\", tls: {{ cert: /c, key: /k }}, \
         brokers: [ {{ id: broker-a, token_hash: \"{ZERO_HASH}\" }} ]"
    ));
    warns(&yaml, "dynamo.event_bus.brokers[0].namespaces");
    clean(&enabled_bus(""));
}

#[test]
fn bus_28_budget_at_least_64kib_per_stream() {
    rejects(
        &enabled_bus(", max_streams_per_session: 2048"),
        "dynamo.event_bus.max_session_buffer_bytes",
    );
    rejects(
        &enabled_bus(", max_streams_per_session: 16, max_session_buffer_bytes: 1048575"),
        "dynamo.event_bus.max_session_buffer_bytes",
    );
    let c = clean(&enabled_bus(
        ", max_streams_per_session: 16, max_session_buffer_bytes: 1MiB",
    ));
    assert_eq!(c.dynamo.event_bus.per_stream_buffer_bytes(), 16 << 10);
    let c = clean(&enabled_bus(
        ", max_streams_per_session: 2048, max_session_buffer_bytes: 128MiB",
    ));
    assert_eq!(c.dynamo.event_bus.max_session_buffer_bytes, 128 << 20);
}

#[test]
fn bus_39_token_hash_form() {
    let with_hash = |h: &str| {
        bus(&format!(
            "enabled: true, listen: \"0.0.0.0:7443\", tls: {{ cert: /c, key: /k }}, \
         brokers: [ {{ id: b1, token_hash: \"{h}\", namespaces: [dynamo] }} ]"
        ))
    };
    for bad in [
        "plain-token-value".to_owned(),
        format!("sha256:{}", "AA".repeat(32)),
        format!("sha256:{}", "a".repeat(63)),
        format!("sha1:{}", "a".repeat(64)),
    ] {
        let e = rejects(&with_hash(&bad), "dynamo.event_bus.brokers[0].token_hash");
        let f = e
            .errors
            .iter()
            .find(|f| f.field.ends_with("token_hash"))
            .unwrap();
        assert!(
            !f.value.contains("plain-token-value"),
            "token echoed: {}",
            f.value
        );
    }
    clean(&with_hash(ZERO_HASH));
    // Without a token hash a broker needs certificate auth (client_ca).
    let no_hash = bus(
        "enabled: true, listen: \"0.0.0.0:7443\", tls: { cert: /c, key: /k }, brokers: [ { id: b1, namespaces: [dynamo] } ]",
    );
    rejects(&no_hash, "dynamo.event_bus.brokers[0].token_hash");
    clean(&no_hash.replace("key: /k }", "key: /k, client_ca: /ca }"));
}

#[test]
fn bus_broker_entries_are_checked() {
    let entry = |e: &str| {
        bus(&format!(
            "enabled: true, listen: \"0.0.0.0:7443\", tls: {{ cert: /c, key: /k, client_ca: /ca }}, brokers: [ {e} ]"
        ))
    };
    rejects(
        &entry("{ id: \"*.dynamo\", namespaces: [dynamo] }"),
        "dynamo.event_bus.brokers[0].id",
    );
    rejects(
        &entry("{ id: Broker-A, namespaces: [dynamo] }"),
        "dynamo.event_bus.brokers[0].id",
    );
    rejects(
        &entry("{ id: b, namespaces: [dynamo] }, { id: b, namespaces: [dynamo] }"),
        "dynamo.event_bus.brokers[1].id",
    );
    rejects(
        &entry("{ id: b, role: relay, namespaces: [dynamo] }"),
        "dynamo.event_bus.brokers[0].role",
    );
    rejects(
        &entry("{ id: b, role: kv_listener, namespaces: [dynamo], backends: [fe-a] }"),
        "dynamo.event_bus.brokers[0].namespaces",
    );
    rejects(
        &entry("{ id: b, namespaces: [dynamo], backends: [fe-a] }"),
        "dynamo.event_bus.brokers[0].backends",
    );
    // BUS-45 reading: an allowance for an unknown backend is never used.
    warns(
        &entry("{ id: kv-a, role: kv_listener, backends: [ghost] }"),
        "dynamo.event_bus.brokers[0].backends[0]",
    );
    let c = clean(&entry("{ id: kv-a, role: kv_listener, backends: [fe-a] }"));
    assert_eq!(c.dynamo.event_bus.brokers[0].role, BrokerRole::KvListener);
}

#[test]
fn kv_pick_16_defaults() {
    let (c, _) = ok("dynamo: { kv: { enabled: true } }");
    let k = &c.dynamo.kv;
    assert!(k.enabled && k.allow_http_artifacts && !k.allow_hf_artifacts && !k.send_token_data);
    assert!(k.pinned_artifacts.is_empty() && k.artifact_cache_dir.is_none());
    assert_eq!(
        (
            k.overlap_score_credit,
            k.prefill_load_scale,
            k.router_temperature
        ),
        (1.0, 1.0, 0.0)
    );
    assert!(!k.conditional_disaggregation.enabled);
    assert!(k.conditional_disaggregation.decode_busy_threshold.is_none());
    let (d, _) = ok("");
    assert!(!d.dynamo.kv.enabled && d.dynamo.kv.allow_http_artifacts);
}

#[test]
fn kv_ranges_q42() {
    let kv = |body: &str| format!("dynamo: {{ kv: {{ {body} }} }}");
    for bad in [
        "overlap_score_credit: -0.1",
        "overlap_score_credit: 100.5",
        "overlap_score_credit: .nan",
        "prefill_load_scale: .inf",
        "prefill_load_scale: lots",
        "router_temperature: -1",
        "router_temperature: 101",
        "conditional_disaggregation: { decode_busy_threshold: 1.5 }",
        "conditional_disaggregation: { decode_busy_threshold: -0.5 }",
        "send_token_data: 1",
        "artifact_cache_dir: \"\"",
    ] {
        let e = err(&kv(bad));
        assert_eq!(e.errors.len(), 1, "{bad}: {:#?}", e.errors);
        assert!(
            e.errors[0].field.starts_with("dynamo.kv."),
            "{bad}: {:?}",
            e.errors[0]
        );
    }
    let (c, _) = ok(&kv(
        "overlap_score_credit: 0, prefill_load_scale: 100, router_temperature: 0.5, \
                         conditional_disaggregation: { decode_busy_threshold: 1 }",
    ));
    assert_eq!(c.dynamo.kv.prefill_load_scale, 100.0);
    assert_eq!(
        c.dynamo.kv.conditional_disaggregation.decode_busy_threshold,
        Some(1.0)
    );
}

#[test]
fn kv_tok_07_pinned_artifacts_are_blake3_digests() {
    let good = format!("blake3:{}", "0f".repeat(32));
    let (c, _) = ok(&format!(
        "dynamo: {{ kv: {{ pinned_artifacts: [\"{good}\"] }} }}"
    ));
    assert_eq!(c.dynamo.kv.pinned_artifacts[0].to_string(), good);
    for bad in [
        format!("blake3:{}", "0F".repeat(32)),
        format!("sha256:{}", "0f".repeat(32)),
        "blake3:abc".to_owned(),
    ] {
        let e = err(&format!(
            "dynamo: {{ kv: {{ pinned_artifacts: [\"{good}\", \"{bad}\"] }} }}"
        ));
        assert!(
            has_error(&e, "dynamo.kv.pinned_artifacts[1]"),
            "{:#?}",
            e.errors
        );
    }
}

#[test]
fn show_output_parses_back_to_the_same_config() {
    let yaml = format!(
        "server: {{ shards: 3, cpu_affinity: [0, 1], limits: {{ max_body_bytes: 2MiB }}, timeouts: {{ drain: 1500ms }} }}\n{}",
        bus(
            "enabled: true, listen: \"0.0.0.0:7443\", tls: { cert: /c, key: /k, client_ca: /ca }, \
             max_sessions: 9, brokers: [ { id: b1, namespaces: [dynamo] }, \
             { id: kv-1, role: kv_listener, backends: [fe-a] } ]"
        )
        .replace(
            "shim: {",
            &format!("kv: {{ enabled: true, pinned_artifacts: [\"blake3:{}\"], router_temperature: 0.25 }}, shim: {{ model_map: {{ a: b }}, ", "1f".repeat(32)),
        )
    );
    let (c, _) = ok(&yaml);
    let shown = c.show_masked();
    // Masked secrets differ by design; everything else round-trips.
    let (mut back, _) =
        Config::from_yaml(&shown, &NoEnv).unwrap_or_else(|e| panic!("{shown}\n{:#?}", e.errors));
    back.dynamo.event_bus.tls = c.dynamo.event_bus.tls.clone();
    assert_eq!(back, c, "{shown}");
}
