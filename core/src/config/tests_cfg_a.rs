//! One test per rule CFG-01..CFG-14 of the `dynamo` section (each checks the violation's field
//! path and that the valid neighbour passes).

use std::time::Duration;

use super::dynamo::{DiscoverySource, EtcdScheme, LoadTransport};
use super::tests_basic::{err, has_error, has_warning, ok};
use super::{Config, ConfigErrors, NoEnv, Warning};

/// Backends every dynamo test can reference, with the shim switch on.
pub(crate) const BACKENDS: &str = r#"
disaggregated_serving: { enabled: true }
backends:
  - { name: fe-a, type: openai, url: "http://10.0.0.5:8000" }
  - { name: fe-b, type: openai, url: "http://10.0.0.6:8000" }
  - { name: fe-int, type: openai, url: "http://10.0.0.7:8000", internal: true }
  - { name: fe-off, type: openai, url: "http://10.0.0.8:8000", enabled: false }
"#;

/// The backends plus a `dynamo` section.
pub(super) fn with(dynamo: &str) -> String {
    format!("{BACKENDS}{dynamo}\n")
}

/// An enabled etcd config whose `discovery.etcd` mapping body is `body`.
pub(super) fn etcd(body: &str) -> String {
    with(&format!(
        "dynamo: {{ enabled: true, discovery: {{ etcd: {{ {body} }} }}, \
         load: {{ direct_allow_cidrs: [10.0.0.0/8] }}, shim: {{ backends: [fe-a] }} }}"
    ))
}

/// An enabled config with `source` and `discovery.kubernetes` body `body`, shim `shim`.
pub(super) fn kube(source: &str, body: &str, shim: &str) -> String {
    with(&format!(
        "dynamo: {{ enabled: true, discovery: {{ source: {source}, kubernetes: {{ {body} }} }}, \
         load: {{ direct_allow_cidrs: [10.0.0.0/8] }}, shim: {{ {shim} }} }}"
    ))
}

/// Valid and without warnings.
pub(super) fn clean(yaml: &str) -> Config {
    let (c, w) = ok(yaml);
    assert!(w.is_empty(), "unexpected warnings: {w:#?}");
    c
}

/// Invalid with an error at `field`.
pub(super) fn rejects(yaml: &str, field: &str) -> ConfigErrors {
    let e = err(yaml);
    assert!(has_error(&e, field), "no error at {field}: {:#?}", e.errors);
    e
}

/// Valid with a warning at `field`.
pub(super) fn warns(yaml: &str, field: &str) -> Vec<Warning> {
    let (_, w) = ok(yaml);
    assert!(has_warning(&w, field), "no warning at {field}: {w:#?}");
    w
}

const SVC: &str = "endpoints: [\"http://etcd.dynamo.svc:2379\"]";

#[test]
fn cfg_01_every_recognised_key_is_accepted_and_others_rejected() {
    let full = r#"
dynamo:
  enabled: true
  discovery:
    source: etcd
    etcd:
      endpoints: ["https://etcd-0.dynamo.svc:2379", "etcd-1.dynamo.svc:2379"]
      namespace: "dynamo"
      namespaces: ["prod", "canary"]
      tls: { ca_cert: /etc/etcd/ca.pem, client_cert: /etc/etcd/c.pem, client_key: /etc/etcd/k.pem, server_name: etcd.internal }
      auth: { username: router, password: "hunter2" }
      watch_reconnect_backoff: { initial: 500ms, max: 30s }
    kubernetes:
      namespace: dynamo
      dynamo_namespace: dyn-a
      model: m
      watch_reconnect_backoff: { initial: 1s, max: 1m }
  load: { max_staleness: 3s, direct_allow_cidrs: ["10.0.0.0/8"], transport: direct }
  shim:
    pools:
      - { namespace: prod, backends: [fe-a] }
      - { namespace: canary, backends: [fe-b] }
    model_map: { qwen3-32b: "Qwen/Qwen3-32B" }
  kv:
    enabled: true
    allow_http_artifacts: true
    allow_hf_artifacts: false
    pinned_artifacts: ["blake3:0000000000000000000000000000000000000000000000000000000000000000"]
    artifact_cache_dir: /var/cache/continuum
    overlap_score_credit: 1.0
    prefill_load_scale: 1.0
    router_temperature: 0.0
    send_token_data: false
    conditional_disaggregation: { enabled: false, decode_busy_threshold: 0.8 }
  event_bus:
    enabled: true
    listen: "0.0.0.0:7443"
    tls: { cert: /tls.crt, key: /tls.key, client_ca: /ca.crt }
    brokers:
      - { id: broker-a.dynamo, role: broker, token_hash: "sha256:0000000000000000000000000000000000000000000000000000000000000000", namespaces: [prod] }
      - { id: kv-listener-a, role: kv_listener, backends: [fe-a] }
    max_sessions: 64
    max_streams_per_session: 1024
    max_session_buffer_bytes: 67108864
    heartbeat_interval: 10s
    idle_timeout: 30s
"#;
    let (c, _) = ok(&with(full));
    assert_eq!(
        c.dynamo.discovery.etcd.namespaces,
        vec!["prod".to_owned(), "canary".to_owned()]
    );
    assert_eq!(c.dynamo.shim.pools.len(), 2);
    assert_eq!(c.dynamo.event_bus.brokers.len(), 2);
    let bad = full
        .replace("server_name:", "sever_name:")
        .replace("transport: direct", "transprt: direct");
    let e = err(&with(&bad));
    assert!(
        has_error(&e, "dynamo.discovery.etcd.tls.sever_name"),
        "{:#?}",
        e.errors
    );
    assert!(has_error(&e, "dynamo.load.transprt"), "{:#?}", e.errors);
}

#[test]
fn cfg_02_defaults() {
    let c = clean(&etcd(SVC));
    let d = &c.dynamo;
    assert_eq!(d.discovery.source, DiscoverySource::Etcd);
    assert_eq!(d.discovery.etcd.namespace, "dynamo");
    assert_eq!(d.discovery.etcd.namespaces, vec!["dynamo".to_owned()]);
    assert_eq!(
        d.discovery.etcd.watch_reconnect_backoff.initial,
        Duration::from_millis(500)
    );
    assert_eq!(
        d.discovery.etcd.watch_reconnect_backoff.max,
        Duration::from_secs(30)
    );
    assert_eq!(d.load.max_staleness, Duration::from_secs(3));
    assert_eq!(d.load.transport, LoadTransport::Direct);
    let (c, _) = ok("dynamo: { enabled: false }");
    assert!(
        c.dynamo.load.direct_allow_cidrs.is_none(),
        "omitted = allow all (legacy)"
    );
    assert_eq!(
        c.dynamo
            .discovery
            .kubernetes
            .watch_reconnect_backoff
            .initial,
        Duration::from_millis(500)
    );
}

#[test]
fn cfg_03_password_env_interpolation() {
    let yaml = etcd(
        "endpoints: [\"https://etcd.dynamo.svc:2379\"], tls: { ca_cert: /ca.pem }, \
         auth: { username: router, password: \"${ETCD_PASSWORD}\" }",
    );
    let env = |name: &str| (name == "ETCD_PASSWORD").then(|| "s3cret".to_owned());
    let (c, w) = Config::from_yaml(&yaml, &env).unwrap();
    assert!(w.is_empty(), "{w:#?}");
    assert_eq!(
        c.dynamo.discovery.etcd.auth.unwrap().password.expose(),
        "s3cret"
    );
    let e = Config::from_yaml(&yaml, &NoEnv).unwrap_err();
    let f = e
        .errors
        .iter()
        .find(|f| f.field == "dynamo.discovery.etcd.auth.password")
        .unwrap();
    assert_eq!(f.value, "********");
    assert!(f.reason.contains("ETCD_PASSWORD"), "{}", f.reason);
    // Only the whole value is interpolated; username is never interpolated.
    let literal = yaml
        .replace("\"${ETCD_PASSWORD}\"", "\"pre-${X}\"")
        .replace("router", "\"${USER}\"");
    let (c, _) = Config::from_yaml(&literal, &env).unwrap();
    let a = c.dynamo.discovery.etcd.auth.unwrap();
    assert_eq!(
        (a.username.as_str(), a.password.expose()),
        ("${USER}", "pre-${X}")
    );
}

#[test]
fn cfg_04_section_is_validated_even_when_disabled() {
    let e = err(
        "dynamo: { enabled: false, discovery: { etcd: { endpoints: [\"http://u:p@etcd:2379\"] } } }",
    );
    assert!(
        has_error(&e, "dynamo.discovery.etcd.endpoints[0]"),
        "{:#?}",
        e.errors
    );
    let (c, w) = ok(
        "dynamo: { enabled: false, discovery: { etcd: { endpoints: [\"http://etcd.x.svc:2379\"] } } }",
    );
    assert!(!c.dynamo.enabled);
    assert!(w.is_empty(), "{w:#?}");
}

#[test]
fn cfg_05_endpoint_forms_and_count() {
    let c = clean(&etcd(
        "endpoints: [\"http://10.1.2.3:2379\", \"etcd.dynamo.svc:2379\", \"[::1]:2379\"]",
    ));
    let eps = &c.dynamo.discovery.etcd.endpoints;
    assert_eq!(
        (eps[1].scheme, eps[1].host.as_str(), eps[1].port),
        (EtcdScheme::Http, "etcd.dynamo.svc", 2379)
    );
    assert_eq!(eps[2].host, "::1");
    rejects(&etcd("endpoints: []"), "dynamo.discovery.etcd.endpoints");
    rejects(
        &with("dynamo: { enabled: true, shim: { backends: [fe-a] } }"),
        "dynamo.discovery.etcd.endpoints",
    );
    let many: Vec<String> = (0..17).map(|i| format!("\"10.0.0.{i}:2379\"")).collect();
    rejects(
        &etcd(&format!("endpoints: [{}]", many.join(", "))),
        "dynamo.discovery.etcd.endpoints",
    );
    clean(&etcd(&format!("endpoints: [{}]", many[..16].join(", "))));
    rejects(
        &etcd("endpoints: [\"::1:2379\"]"),
        "dynamo.discovery.etcd.endpoints[0]",
    );
}

#[test]
fn cfg_06_endpoint_with_credentials_query_fragment_or_path_rejected() {
    for bad in [
        "http://user:pass@etcd.dynamo.svc:2379",
        "http://user@etcd.dynamo.svc:2379",
        "http://etcd.dynamo.svc:2379?x=1",
        "http://etcd.dynamo.svc:2379?",
        "http://etcd.dynamo.svc:2379#",
        "http://etcd.dynamo.svc:2379#frag",
        "http://etcd.dynamo.svc:2379/v3",
        "http://etcd.dynamo.svc:2379/",
        "http://etcd.dynamo.svc",
        "etcd.dynamo.svc",
        "ftp://etcd.dynamo.svc:2379",
    ] {
        rejects(
            &etcd(&format!("endpoints: [\"{bad}\"]")),
            "dynamo.discovery.etcd.endpoints[0]",
        );
    }
    clean(&etcd("endpoints: [\"http://etcd.dynamo.svc:2379\"]"));
}

#[test]
fn cfg_07_scheme_consistency() {
    let f0 = "dynamo.discovery.etcd.endpoints[1]";
    rejects(
        &etcd("endpoints: [\"http://a.svc:2379\", \"https://b.svc:2379\"]"),
        f0,
    );
    rejects(
        &etcd("endpoints: [\"https://a.svc:2379\", \"http://b.svc:2379\"], tls: { ca_cert: /ca }"),
        f0,
    );
    // Scheme-less (Q-17): https with a tls block, http without; then the same rule applies.
    let c = clean(&etcd(
        "endpoints: [\"https://a.svc:2379\", \"b.svc:2379\"], tls: { ca_cert: /ca }",
    ));
    assert!(
        c.dynamo
            .discovery
            .etcd
            .endpoints
            .iter()
            .all(|e| e.scheme == EtcdScheme::Https)
    );
    rejects(
        &etcd("endpoints: [\"https://a.svc:2379\", \"b.svc:2379\"]"),
        f0,
    );
    clean(&etcd("endpoints: [\"http://a.svc:2379\", \"b.svc:2379\"]"));
}

#[test]
fn cfg_08_namespace_characters() {
    for bad in ["\"\"", "\"a/b\"", "\"a b\"", "\"a\\tb\"", "\"a\\u0001\""] {
        rejects(
            &etcd(&format!("{SVC}, namespace: {bad}")),
            "dynamo.discovery.etcd.namespace",
        );
        rejects(
            &etcd(&format!("{SVC}, namespaces: [ok, {bad}]")),
            "dynamo.discovery.etcd.namespaces[1]",
        );
    }
    let c = clean(&etcd(&format!("{SVC}, namespace: dynamo-prod_1.x")));
    assert_eq!(
        c.dynamo.discovery.etcd.namespaces,
        vec!["dynamo-prod_1.x".to_owned()]
    );
}

#[test]
fn cfg_09_namespaces_unique_bounded_and_exclusive_with_non_default_namespace() {
    let pools = "shim: { pools: [ { namespace: a, backends: [fe-a] }, { namespace: b, backends: [fe-b] } ] }";
    let mk = |etcd_body: &str| {
        with(&format!(
            "dynamo: {{ enabled: true, discovery: {{ etcd: {{ {SVC}, {etcd_body} }} }}, \
             load: {{ direct_allow_cidrs: [10.0.0.0/8] }}, {pools} }}"
        ))
    };
    rejects(
        &mk("namespaces: [a, b, a]"),
        "dynamo.discovery.etcd.namespaces[2]",
    );
    let many: Vec<String> = (0..17).map(|i| format!("n{i}")).collect();
    rejects(
        &mk(&format!("namespaces: [{}]", many.join(", "))),
        "dynamo.discovery.etcd.namespaces",
    );
    rejects(
        &mk("namespace: prod, namespaces: [a, b]"),
        "dynamo.discovery.etcd.namespaces",
    );
    // Q-18: an explicit default namespace is accepted and namespaces wins.
    let c = clean(&mk("namespace: dynamo, namespaces: [a, b]"));
    assert_eq!(c.dynamo.namespaces(), ["a".to_owned(), "b".to_owned()]);
    clean(&mk("namespaces: [a, b]"));
}

#[test]
fn cfg_10_several_namespaces_need_pools_not_backends() {
    let e = rejects(
        &etcd(&format!("{SVC}, namespaces: [a, b]")),
        "dynamo.shim.backends",
    );
    assert!(
        e.errors.iter().any(|f| f.reason.contains("shim.pools")),
        "{:#?}",
        e.errors
    );
    clean(&etcd(&format!("{SVC}, namespaces: [a]")));
}

#[test]
fn cfg_11_client_cert_and_key_together() {
    let base = "endpoints: [\"https://etcd.x.svc:2379\"]";
    rejects(
        &etcd(&format!("{base}, tls: {{ client_cert: /c.pem }}")),
        "dynamo.discovery.etcd.tls.client_key",
    );
    rejects(
        &etcd(&format!("{base}, tls: {{ client_key: /k.pem }}")),
        "dynamo.discovery.etcd.tls.client_cert",
    );
    clean(&etcd(&format!(
        "{base}, tls: {{ client_cert: /c.pem, client_key: /k.pem }}"
    )));
}

#[test]
fn cfg_12_show_masks_password_key_and_token_hashes() {
    let hash = format!("sha256:{}", "cd".repeat(32));
    let yaml = format!(
        "admin: {{ token_hash: \"{hash}\" }}\n{}",
        etcd(
            "endpoints: [\"https://etcd.x.svc:2379\"], \
             tls: { ca_cert: /etc/ca-cert.pem, client_cert: /etc/client-cert.pem, client_key: /etc/secret-key.pem }, \
             auth: { username: router, password: \"${PW}\" }"
        )
    );
    let env = |n: &str| (n == "PW").then(|| "pa55word-value".to_owned());
    let (c, _) = Config::from_yaml(&yaml, &env).unwrap();
    for text in [c.show_masked(), c.show_json().to_string(), format!("{c:?}")] {
        assert!(!text.contains("pa55word-value"), "password leaked: {text}");
        assert!(
            !text.contains("secret-key.pem"),
            "client_key leaked: {text}"
        );
        assert!(!text.contains(&"cd".repeat(32)), "token hash shown: {text}");
    }
    let shown = c.show_masked();
    assert!(
        shown.contains("/etc/ca-cert.pem") && shown.contains("/etc/client-cert.pem"),
        "{shown}"
    );
    let j = c.show_json();
    let etcd = &j["dynamo"]["discovery"]["etcd"];
    assert_eq!(etcd["auth"]["password"], "********");
    assert_eq!(etcd["tls"]["client_key"], "********");
    assert_eq!(j["admin"]["token_hash"], "sha256:********");
}

#[test]
fn cfg_13_auth_over_plaintext_warns() {
    let auth = "auth: { username: u, password: p }";
    warns(
        &etcd(&format!("{SVC}, {auth}")),
        "dynamo.discovery.etcd.auth",
    );
    clean(&etcd(&format!(
        "endpoints: [\"https://etcd.x.svc:2379\"], tls: {{ ca_cert: /ca }}, {auth}"
    )));
}

#[test]
fn cfg_14_backoff_max_at_least_initial() {
    rejects(
        &etcd(&format!(
            "{SVC}, watch_reconnect_backoff: {{ initial: 2s, max: 1s }}"
        )),
        "dynamo.discovery.etcd.watch_reconnect_backoff.max",
    );
    rejects(
        &etcd(&format!(
            "{SVC}, watch_reconnect_backoff: {{ initial: 1m }}"
        )),
        "dynamo.discovery.etcd.watch_reconnect_backoff.max",
    );
    rejects(
        &kube(
            "kubernetes",
            "namespace: dynamo, dynamo_namespace: d, watch_reconnect_backoff: { initial: 5s, max: 4s }",
            "backends: [fe-a]",
        ),
        "dynamo.discovery.kubernetes.watch_reconnect_backoff.max",
    );
    clean(&etcd(&format!(
        "{SVC}, watch_reconnect_backoff: {{ initial: 1s, max: 1s }}"
    )));
}
