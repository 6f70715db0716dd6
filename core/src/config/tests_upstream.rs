//! Tests of the upstream timeouts, health checks, outlier ejection, the retry budget and
//! `https://` backends' `tls`: their defaults, per-backend overrides, the shim replicas' default
//! health check, every refusal, and the `config show` round trip.

use std::time::Duration;

use super::tests_basic::{err, ok};
use super::tests_cfg_a::rejects;
use super::{
    BackendTls, Config, HealthCheck, NoEnv, OutlierPolicy, TlsRoots, UpstreamTimeouts, UrlScheme,
};

const ONE: &str =
    "backends: [ { name: a, type: openai, url: \"http://127.0.0.1:9000\", models: [m] } ]\n";

fn backend(extra: &str) -> String {
    format!(
        "backends: [ {{ name: a, type: openai, url: \"http://127.0.0.1:9000\", models: [m], \
         {extra} }} ]\n"
    )
}

#[test]
fn defaults_are_outlier_on_and_no_health_check_for_plain_backends() {
    let (c, _) = ok(ONE);
    let b = &c.backends[0];
    assert_eq!(b.timeouts, UpstreamTimeouts::default());
    assert_eq!(b.health_check, None);
    assert_eq!(b.outlier, Some(OutlierPolicy::default()));
    let o = OutlierPolicy::default();
    assert_eq!(
        (
            o.consecutive_failures,
            o.base_ejection,
            o.max_ejection,
            o.max_ejection_percent
        ),
        (5, Duration::from_secs(30), Duration::from_secs(300), 50)
    );
}

#[test]
fn backend_timeouts_override_the_server_ones_key_by_key() {
    let (c, _) = ok(&format!(
        "server: {{ timeouts: {{ upstream_connect: 2s, upstream_first_byte: 30s, upstream_idle: 10s }} }}\n{}",
        backend("timeouts: { upstream_first_byte: 500ms, request_deadline: 1m }")
    ));
    assert_eq!(
        c.backends[0].timeouts,
        UpstreamTimeouts {
            connect: Duration::from_secs(2),
            first_byte: Duration::from_millis(500),
            idle: Duration::from_secs(10),
            deadline: Some(Duration::from_secs(60)),
        }
    );
}

#[test]
fn the_old_response_timeout_is_refused_with_its_replacements_named() {
    let e = rejects(
        &format!("server: {{ timeouts: {{ upstream_response: 10m }} }}\n{ONE}"),
        "server.timeouts.upstream_response",
    );
    assert!(e.errors[0].reason.contains("upstream_first_byte"));
    rejects(
        &format!("server: {{ timeouts: {{ upstream_idle: 0ms }} }}\n{ONE}"),
        "server.timeouts.upstream_idle",
    );
    rejects(
        &backend("timeouts: { request_deadline: forever }"),
        "backends[0].timeouts.request_deadline",
    );
}

#[test]
fn shim_replicas_are_health_checked_unless_turned_off() {
    let shim = |hc: &str| {
        format!(
            "backends:\n  - {{ name: fe, type: openai, url: \"http://127.0.0.1:8000\", {hc} }}\n  \
             - {{ name: other, type: openai, url: \"http://127.0.0.1:8001\", models: [m] }}\n\
             disaggregated_serving: {{ enabled: true }}\n\
             dynamo: {{ enabled: true, discovery: {{ source: file, file: {{ root: /tmp/x }} }}, \
             load: {{ direct_allow_cidrs: [127.0.0.0/8] }}, shim: {{ backends: [fe] }} }}\n"
        )
    };
    let (c, _) = ok(&shim(""));
    assert_eq!(c.backends[0].health_check, Some(HealthCheck::default()));
    assert_eq!(c.backends[0].health_check.as_ref().unwrap().path, "/health");
    assert_eq!(c.backends[1].health_check, None);
    let (c, _) = ok(&shim("health_check: { enabled: false }"));
    assert_eq!(c.backends[0].health_check, None);
    let (c, _) = ok(&shim(
        "health_check: { path: /live, interval: 1s, timeout: 200ms }",
    ));
    let h = c.backends[0].health_check.as_ref().unwrap();
    assert_eq!(
        (h.path.as_str(), h.interval, h.timeout, h.healthy_threshold),
        (
            "/live",
            Duration::from_secs(1),
            Duration::from_millis(200),
            2
        )
    );
}

#[test]
fn a_written_health_check_is_on_and_every_bad_value_is_refused() {
    let (c, _) = ok(&backend(
        "health_check: { interval: 2s, healthy_threshold: 1, unhealthy_threshold: 4 }",
    ));
    let h = c.backends[0].health_check.as_ref().unwrap();
    assert_eq!(
        (
            h.interval,
            h.timeout,
            h.healthy_threshold,
            h.unhealthy_threshold
        ),
        (Duration::from_secs(2), Duration::from_secs(2), 1, 4)
    );
    // The default timeout shrinks to a short interval rather than overlap it.
    let (c, _) = ok(&backend("health_check: { interval: 500ms }"));
    assert_eq!(
        c.backends[0].health_check.as_ref().unwrap().timeout,
        Duration::from_millis(500)
    );
    let f = "backends[0].health_check";
    rejects(
        &backend("health_check: { interval: 1s, timeout: 2s }"),
        &format!("{f}.timeout"),
    );
    rejects(
        &backend("health_check: { path: health }"),
        &format!("{f}.path"),
    );
    rejects(
        &backend("health_check: { path: \"/a b\" }"),
        &format!("{f}.path"),
    );
    rejects(
        &backend("health_check: { interval: 10ms }"),
        &format!("{f}.interval"),
    );
    rejects(
        &backend("health_check: { healthy_threshold: 0 }"),
        &format!("{f}.healthy_threshold"),
    );
    rejects(
        &backend("health_check: { enabled: false, path: /x }"),
        &format!("{f}.enabled"),
    );
}

#[test]
fn outlier_ejection_can_be_tuned_or_turned_off_but_not_half_off() {
    let (c, _) = ok(&backend(
        "outlier: { consecutive_failures: 2, base_ejection: 1s, max_ejection: 5s, max_ejection_percent: 100 }",
    ));
    assert_eq!(
        c.backends[0].outlier,
        Some(OutlierPolicy {
            consecutive_failures: 2,
            base_ejection: Duration::from_secs(1),
            max_ejection: Duration::from_secs(5),
            max_ejection_percent: 100,
        })
    );
    let (c, _) = ok(&backend("outlier: { enabled: false }"));
    assert_eq!(c.backends[0].outlier, None);
    let f = "backends[0].outlier";
    rejects(
        &backend("outlier: { consecutive_failures: 0 }"),
        &format!("{f}.consecutive_failures"),
    );
    rejects(
        &backend("outlier: { max_ejection_percent: 0 }"),
        &format!("{f}.max_ejection_percent"),
    );
    rejects(
        &backend("outlier: { base_ejection: 10s, max_ejection: 5s }"),
        &format!("{f}.max_ejection"),
    );
    rejects(
        &backend("outlier: { enabled: false, base_ejection: 1s }"),
        &format!("{f}.enabled"),
    );
}

#[test]
fn the_retry_budget_is_range_checked() {
    let (c, _) = ok("server: { retry_budget: { ratio: 0.5, min_retries_per_second: 0 } }");
    assert_eq!(c.server.retry_budget.ratio, 0.5);
    assert_eq!(c.server.retry_budget.min_retries_per_second, 0);
    rejects(
        "server: { retry_budget: { ratio: 1.5 } }",
        "server.retry_budget.ratio",
    );
    rejects(
        "server: { retry_budget: { ratio: x } }",
        "server.retry_budget.ratio",
    );
    rejects(
        "server: { retry_budget: { min_retries_per_second: -1 } }",
        "server.retry_budget.min_retries_per_second",
    );
    let e = err("server: { retry_budget: { ratio: 2, burst: 3 } }");
    assert!(e.errors.len() >= 2, "{:#?}", e.errors);
}

#[test]
fn shown_config_parses_back_to_the_same_backends_and_server() {
    let (c, _) = ok(&format!(
        "server: {{ timeouts: {{ request_deadline: 1h }}, retry_budget: {{ ratio: 0.25 }} }}\n{}\
         \x20 - {{ name: s, type: openai, url: \"https://[::1]:8443/v\", models: [m], \
         tls: {{ ca_cert: /etc/ca.pem, server_name: api.test }} }}\n\
         \x20 - {{ name: t, type: openai, url: \"https://api.example\", models: [m] }}\n",
        backend(
            "timeouts: { upstream_idle: 7s }, health_check: { path: /ping, interval: 3s }, \
             outlier: { enabled: false }"
        )
        .replace("backends: [", "backends:\n  - ")
        .replace(" } ]\n", " }\n")
    ));
    assert_eq!(c.backends.len(), 3);
    let shown = c.show_masked();
    let back = match Config::from_yaml(&shown, &NoEnv) {
        Ok((b, _)) => b,
        Err(e) => panic!("shown config does not parse back: {:#?}\n{shown}", e.errors),
    };
    assert_eq!(back.backends, c.backends);
    assert_eq!(back.server, c.server);
}

#[test]
fn https_backends_verify_with_the_system_roots_and_their_host_unless_told_otherwise() {
    let (c, _) = ok("backends:\n\
         \x20 - { name: a, type: openai, url: \"https://api.example/v1\", models: [m] }\n\
         \x20 - { name: b, type: openai, url: \"HTTPS://10.1.2.3:8443\", models: [m], \
         tls: { ca_cert: /etc/router/ca.pem, server_name: llm.internal } }\n\
         \x20 - { name: c, type: openai, url: \"http://10.1.2.4\", models: [m] }\n");
    let (a, b, p) = (&c.backends[0], &c.backends[1], &c.backends[2]);
    assert_eq!((a.url.scheme, a.url.port), (UrlScheme::Https, 443));
    assert_eq!(a.url.base_path, "/v1");
    assert_eq!(
        a.tls,
        Some(BackendTls {
            roots: TlsRoots::System,
            server_name: "api.example".into()
        })
    );
    assert_eq!(b.url.port, 8443);
    assert_eq!(
        b.tls,
        Some(BackendTls {
            roots: TlsRoots::CaFile("/etc/router/ca.pem".into()),
            server_name: "llm.internal".into()
        })
    );
    assert_eq!(
        (p.url.scheme, p.url.port, &p.tls),
        (UrlScheme::Http, 80, &None)
    );
    assert_eq!(a.url.to_string(), "https://api.example:443/v1");
}

#[test]
fn a_tls_block_that_could_not_be_used_is_refused() {
    let e = rejects(&backend("tls: { ca_cert: /ca.pem }"), "backends[0].tls");
    let reason = &e.errors[0].reason;
    assert!(reason.contains("needs an https:// url"), "{reason}");
    let https = |tls: &str| {
        format!(
            "backends: [ {{ name: a, type: openai, url: \"https://a.test\", models: [m], \
             tls: {tls} }} ]\n"
        )
    };
    for (tls, field) in [
        (
            "{ server_name: \"not a name\" }",
            "backends[0].tls.server_name",
        ),
        ("{ server_name: \"\" }", "backends[0].tls.server_name"),
        ("{ server_name: 5 }", "backends[0].tls.server_name"),
        ("{ ca_cert: \"  \" }", "backends[0].tls.ca_cert"),
        ("{ ca_cert: [a] }", "backends[0].tls.ca_cert"),
    ] {
        rejects(&https(tls), field);
    }
}
