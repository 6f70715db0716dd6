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
    assert_eq!(c.server.upstream_connect_timeout, Duration::from_secs(5));
    assert_eq!(c.server.upstream_response_timeout, Duration::from_secs(600));
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
  timeouts: { header_read: "500ms", keepalive: "2m", upstream_connect: "1s", upstream_response: "1h", drain: "45s" }
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
        c.server.upstream_response_timeout,
        Duration::from_secs(3600)
    );
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
