//! Tests of the `server`, `admin`, `backends` and `disaggregated_serving` sections, durations,
//! sizes, unknown keys and error collection.

use std::time::Duration;

use super::{BackendRole, Config, ConfigErrors, NoEnv, ShardCount, Warning};

pub(super) fn ok(yaml: &str) -> (Config, Vec<Warning>) {
    match Config::from_yaml(yaml, &NoEnv) {
        Ok(v) => v,
        Err(e) => panic!("expected valid config, got {:#?}", e.errors),
    }
}

pub(super) fn err(yaml: &str) -> ConfigErrors {
    match Config::from_yaml(yaml, &NoEnv) {
        Ok((c, _)) => panic!("expected errors, got valid config {c:#?}"),
        Err(e) => e,
    }
}

/// Whether an error names `field`.
pub(super) fn has_error(e: &ConfigErrors, field: &str) -> bool {
    e.errors.iter().any(|f| f.field == field)
}

#[test]
fn empty_document_is_all_defaults() {
    let (c, w) = ok("");
    assert!(w.is_empty());
    assert_eq!(c.server.bind_address.to_string(), "127.0.0.1:8080");
    assert_eq!(c.server.shards, ShardCount::Auto);
    assert_eq!(c.server.max_body_bytes, 8 << 20);
    assert_eq!(c.server.max_header_bytes, 16 << 10);
    assert_eq!(c.server.max_headers, 100);
    assert_eq!(c.server.header_read_timeout, Duration::from_secs(10));
    assert_eq!(c.server.keepalive_timeout, Duration::from_secs(60));
    assert_eq!(c.server.upstream.connect, Duration::from_secs(5));
    assert_eq!(c.server.upstream.first_byte, Duration::from_secs(300));
    assert_eq!(c.server.upstream.idle, Duration::from_secs(120));
    assert_eq!(c.server.upstream.deadline, None);
    assert_eq!(c.server.retry_budget.ratio, 0.2);
    assert_eq!(c.server.retry_budget.min_retries_per_second, 10);
    assert_eq!(c.server.drain_timeout, Duration::from_secs(30));
    assert_eq!(c.server.connect_retries, 2);
    assert!(c.admin.token_hash.is_none());
    assert!(c.backends.is_empty());
    assert!(!c.disaggregated_serving.enabled);
    assert!(c.disaggregated_serving.fallback_to_unified);
    assert!(!c.dynamo.enabled);
}

#[test]
fn full_server_section_is_converted() {
    let (c, _) = ok(r#"
server:
  bind_address: "0.0.0.0:9000"
  shards: 4
  cpu_affinity: [0, 1, 2]
  control_cpu: 3
  limits: { max_body_bytes: "1MiB", max_header_bytes: 32768, max_headers: 64 }
  timeouts: { header_read: "500ms", keepalive: "2m", upstream_connect: "1s", upstream_first_byte: "1h", upstream_idle: "90s", request_deadline: "2h", drain: "45s" }
  connect_retries: 0
backends:
  - name: dynamo-frontend
    type: openai
    url: "http://127.0.0.1:8000/proxy/"
    role: decode
    models: ["tiny-agg"]
    weight: 7
    enabled: false
    internal: true
  - name: b2
    type: openai
    url: "http://[::1]"
"#);
    assert_eq!(c.server.bind_address.to_string(), "0.0.0.0:9000");
    assert_eq!(
        c.server.shards,
        ShardCount::Fixed(std::num::NonZeroUsize::new(4).unwrap())
    );
    assert_eq!(c.server.cpu_affinity, vec![0, 1, 2]);
    assert_eq!(c.server.control_cpu, Some(3));
    assert_eq!(c.server.max_body_bytes, 1 << 20);
    assert_eq!(c.server.max_header_bytes, 32768);
    assert_eq!(c.server.max_headers, 64);
    assert_eq!(c.server.header_read_timeout, Duration::from_millis(500));
    assert_eq!(c.server.keepalive_timeout, Duration::from_secs(120));
    assert_eq!(
        c.server.upstream,
        crate::config::UpstreamTimeouts {
            connect: Duration::from_secs(1),
            first_byte: Duration::from_secs(3600),
            idle: Duration::from_secs(90),
            deadline: Some(Duration::from_secs(7200)),
        }
    );
    // Backends without overrides inherit the server's.
    assert_eq!(c.backends[1].timeouts, c.server.upstream);
    assert_eq!(c.server.drain_timeout, Duration::from_secs(45));
    assert_eq!(c.server.connect_retries, 0);
    let b = &c.backends[0];
    assert_eq!(b.name.0, "dynamo-frontend");
    assert_eq!(
        (b.url.host.as_str(), b.url.port, b.url.base_path.as_str()),
        ("127.0.0.1", 8000, "/proxy")
    );
    assert_eq!(b.role, BackendRole::Decode);
    assert_eq!(b.models, vec!["tiny-agg".to_owned()]);
    assert_eq!((b.weight, b.enabled, b.internal), (7, false, true));
    let b2 = &c.backends[1];
    assert_eq!(
        (b2.url.host.as_str(), b2.url.port, b2.url.base_path.as_str()),
        ("::1", 80, "")
    );
    assert_eq!(
        (b2.role, b2.weight, b2.enabled, b2.internal),
        (BackendRole::Unified, 1, true, false)
    );
}

/// Whether a warning names `field`.
pub(super) fn has_warning(w: &[Warning], field: &str) -> bool {
    w.iter().any(|x| x.field == field)
}

fn err_field(yaml: &str, field: &str) -> ConfigErrors {
    let e = err(yaml);
    assert!(
        has_error(&e, field),
        "no error for {field}: {:#?}",
        e.errors
    );
    e
}

#[test]
fn durations_accept_unit_syntax() {
    let (c, _) = ok(
        "server: { timeouts: { header_read: 250ms, keepalive: 30s, drain: 5m, upstream_idle: 1h } }",
    );
    assert_eq!(c.server.header_read_timeout, Duration::from_millis(250));
    assert_eq!(c.server.keepalive_timeout, Duration::from_secs(30));
    assert_eq!(c.server.drain_timeout, Duration::from_secs(300));
    assert_eq!(c.server.upstream.idle, Duration::from_secs(3600));
}

#[test]
fn durations_reject_everything_else() {
    for bad in [
        "30", "\"30\"", "1.5s", "5d", "-1s", "\"\"", "s", "10 s", "0s", "2h",
    ] {
        let e = err_field(
            &format!("server: {{ timeouts: {{ keepalive: {bad} }} }}"),
            "server.timeouts.keepalive",
        );
        assert_eq!(e.errors.len(), 1, "{bad}: {:#?}", e.errors);
    }
    let e = err("server: { timeouts: { drain: 5d } }");
    assert!(
        e.errors[0].reason.contains("<integer><unit>"),
        "{}",
        e.errors[0].reason
    );
    let e = err("server: { timeouts: { drain: 0s } }");
    assert!(
        e.errors[0].reason.contains("1ms..=1h"),
        "{}",
        e.errors[0].reason
    );
}

#[test]
fn sizes_accept_integers_and_binary_units() {
    let (c, _) = ok("server: { limits: { max_body_bytes: 8MiB, max_header_bytes: \"16KiB\" } }");
    assert_eq!(c.server.max_body_bytes, 8 << 20);
    assert_eq!(c.server.max_header_bytes, 16 << 10);
    let (c, _) = ok("server: { limits: { max_body_bytes: 1GiB, max_header_bytes: 1024 } }");
    assert_eq!(c.server.max_body_bytes, 1 << 30);
    assert_eq!(c.server.max_header_bytes, 1024);
}

#[test]
fn sizes_reject_bad_units_and_ranges() {
    for bad in ["8MB", "1.5MiB", "-1", "lots", "1023", "2GiB"] {
        err_field(
            &format!("server: {{ limits: {{ max_body_bytes: {bad} }} }}"),
            "server.limits.max_body_bytes",
        );
    }
    err_field(
        "server: { limits: { max_header_bytes: 2MiB } }",
        "server.limits.max_header_bytes",
    );
    err_field(
        "server: { limits: { max_headers: 7 } }",
        "server.limits.max_headers",
    );
    err_field(
        "server: { limits: { max_headers: 1025 } }",
        "server.limits.max_headers",
    );
}

#[test]
fn server_scalars_are_range_checked() {
    err_field(
        "server: { bind_address: \"localhost:80\" }",
        "server.bind_address",
    );
    err_field("server: { shards: 0 }", "server.shards");
    err_field("server: { shards: 257 }", "server.shards");
    err_field("server: { shards: many }", "server.shards");
    err_field(
        "server: { cpu_affinity: [0, 1024] }",
        "server.cpu_affinity[1]",
    );
    err_field("server: { cpu_affinity: [3, 3] }", "server.cpu_affinity[1]");
    err_field("server: { control_cpu: -1 }", "server.control_cpu");
    err_field("server: { connect_retries: 9 }", "server.connect_retries");
    let (c, _) = ok("server: { shards: auto, connect_retries: 8, bind_address: \"[::1]:8080\" }");
    assert_eq!(c.server.shards, ShardCount::Auto);
    assert_eq!(c.server.connect_retries, 8);
}

#[test]
fn backends_are_validated() {
    let base = |entry: &str| format!("backends:\n  - {entry}\n");
    err_field(
        &base("{ type: openai, url: \"http://a:1\" }"),
        "backends[0].name",
    );
    err_field(
        &base("{ name: \"bad name\", type: openai, url: \"http://a:1\" }"),
        "backends[0].name",
    );
    err_field(
        &base("{ name: a, url: \"http://a:1\" }"),
        "backends[0].type",
    );
    err_field(
        &base("{ name: a, type: grpc, url: \"http://a:1\" }"),
        "backends[0].type",
    );
    let e = err_field(
        &base("{ name: a, type: openai, url: \"gopher://a:1\" }"),
        "backends[0].url",
    );
    assert_eq!(
        e.errors[0].reason,
        "unsupported scheme \"gopher\"; use http:// or https://"
    );
    for url in [
        "http://u:p@a:1",
        "http://a:1/?x=1",
        "http://a:1/#f",
        "http://:80",
        "ftp://a",
        "a:80",
        "http://a:0",
        "http://a:99999",
    ] {
        err_field(
            &base(&format!("{{ name: a, type: openai, url: \"{url}\" }}")),
            "backends[0].url",
        );
    }
    err_field(
        &base("{ name: a, type: openai, url: \"http://a:1\", role: both }"),
        "backends[0].role",
    );
    err_field(
        &base("{ name: a, type: openai, url: \"http://a:1\", weight: 0 }"),
        "backends[0].weight",
    );
    err_field(
        &base("{ name: a, type: openai, url: \"http://a:1\", weight: 1001 }"),
        "backends[0].weight",
    );
    err_field(
        &base("{ name: a, type: openai, url: \"http://a:1\", enabled: yes }"),
        "backends[0].enabled",
    );
    err_field(
        &base("{ name: a, type: openai, url: \"http://a:1\", models: [\"\"] }"),
        "backends[0].models[0]",
    );
    err_field(
        "backends:\n  - { name: a, type: openai, url: \"http://a:1\" }\n  - { name: a, type: openai, url: \"http://b:1\" }\n",
        "backends[1].name",
    );
    err_field(
        &base("{ name: a, type: openai, url: \"http://a:1\", responses_api: v2 }"),
        "backends[0].responses_api",
    );
}

#[test]
fn responses_api_defaults_to_native() {
    use super::ResponsesApi;
    let (c, _) = ok(
        "backends:\n  - { name: a, type: openai, url: \"http://a:1\" }\n  \
         - { name: b, type: openai, url: \"http://b:1\", responses_api: chat }\n",
    );
    assert_eq!(c.backends[0].responses_api, ResponsesApi::Native);
    assert_eq!(c.backends[1].responses_api, ResponsesApi::Chat);
    assert_eq!(c.show_json()["backends"][1]["responses_api"], "chat");
}

#[test]
fn admin_token_hash_must_be_sha256_lowercase_hex() {
    let good = format!("sha256:{}", "ab".repeat(32));
    let (c, _) = ok(&format!("admin: {{ token_hash: \"{good}\" }}"));
    let th = c.admin.token_hash.unwrap();
    assert_eq!(th.0[0], 0xab);
    for bad in [
        format!("sha256:{}", "AB".repeat(32)),
        "sha256:abc".to_owned(),
        "my-secret-token".to_owned(),
        "ab".repeat(32),
    ] {
        let e = err_field(
            &format!("admin: {{ token_hash: \"{bad}\" }}"),
            "admin.token_hash",
        );
        assert!(
            !e.errors[0].value.contains(&bad),
            "hash echoed: {}",
            e.errors[0].value
        );
    }
}

#[test]
fn unknown_keys_are_all_reported_with_paths() {
    let e = err(r#"
sever: {}
server: { bind_adress: "0.0.0.0:1", limits: { max_bodyy: 1 } }
backends:
  - { name: a, type: openai, url: "http://a:1" }
  - { name: b, type: openai, url: "http://b:1", wieght: 2 }
dynamo:
  discovery: { etcd: { endpoint: [] } }
  kv: { conditional_disaggregation: { enable: true } }
  event_bus: { brokers: [ { id: x, token: y } ] }
"#);
    for path in [
        "sever",
        "server.bind_adress",
        "server.limits.max_bodyy",
        "backends[1].wieght",
        "dynamo.discovery.etcd.endpoint",
        "dynamo.kv.conditional_disaggregation.enable",
        "dynamo.event_bus.brokers[0].token",
    ] {
        let f = e.errors.iter().find(|f| f.field == path);
        let f = f.unwrap_or_else(|| panic!("no unknown-key error for {path}: {:#?}", e.errors));
        assert_eq!(f.reason, "unknown key");
    }
}

#[test]
fn yaml_syntax_error_is_one_field_error() {
    let e = err("server: { bind_address: [1, 2\n");
    assert_eq!(e.errors.len(), 1);
    assert!(
        e.errors[0].reason.starts_with("invalid YAML"),
        "{:?}",
        e.errors[0]
    );
    let e = err("backends: { name: a }\n");
    assert_eq!(e.errors.len(), 1);
    assert_eq!(e.errors[0].field, "backends");
}

#[test]
fn every_error_is_collected_in_one_pass() {
    let e = err(r#"
server: { shards: 0, timeouts: { drain: 3 }, limits: { max_headers: 2 } }
admin: { token_hash: "nope" }
backends:
  - { name: a, type: openai, url: "ftp://a:1", weight: 0 }
dynamo:
  enabled: maybe
  load: { max_staleness: 1ms, transport: carrier-pigeon }
  kv: { router_temperature: -1, pinned_artifacts: ["md5:00"] }
  event_bus: { max_sessions: 0 }
"#);
    for f in [
        "server.shards",
        "server.timeouts.drain",
        "server.limits.max_headers",
        "admin.token_hash",
        "backends[0].url",
        "backends[0].weight",
        "dynamo.enabled",
        "dynamo.load.max_staleness",
        "dynamo.load.transport",
        "dynamo.kv.router_temperature",
        "dynamo.kv.pinned_artifacts[0]",
        "dynamo.event_bus.max_sessions",
    ] {
        assert!(has_error(&e, f), "missing {f}: {:#?}", e.errors);
    }
    assert_eq!(e.errors.len(), 12, "{:#?}", e.errors);
}

#[test]
fn report_renders_errors_then_warnings() {
    use super::report;
    let r = Config::from_yaml(
        "server: { shards: 0 }\ndynamo: { kv: { conditional_disaggregation: { enabled: true } } }",
        &NoEnv,
    );
    assert_eq!(report::exit_code(&r), 1);
    let text = report::render(&r);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "server.shards: 0: must be \"auto\" or an integer in 1..=256"
    );
    assert!(
        lines[1].starts_with("warning: dynamo.kv.conditional_disaggregation.enabled: "),
        "{text}"
    );
    let r = Config::from_yaml("", &NoEnv);
    assert_eq!(report::exit_code(&r), 0);
    assert_eq!(report::render(&r), "");
}
