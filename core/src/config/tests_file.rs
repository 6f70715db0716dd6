//! Tests of `dynamo.discovery.source: file` and `dynamo.discovery.file` (DISC-SRC-05, Q-29):
//! the root requirement and shape, the TTL range, unknown keys, the namespace list (CFG-08/09,
//! and CFG-10/23 through `DynamoConfig::namespaces`) and the `config show` rendering.

use std::time::Duration;

use super::dynamo::DiscoverySource;
use super::tests_basic::{err, has_error, ok};
use super::tests_cfg_a::{clean, rejects, with};
use super::{Config, NoEnv};

const CIDRS: &str = "load: { direct_allow_cidrs: [10.0.0.0/8] }";

/// An enabled file-source config whose `discovery.file` body is `body` and shim body `shim`.
fn file_cfg(body: &str, shim: &str) -> String {
    with(&format!(
        "dynamo: {{ enabled: true, discovery: {{ source: file, file: {{ {body} }} }}, {CIDRS}, \
         shim: {{ {shim} }} }}"
    ))
}

/// The same with one namespace's shim.
fn file1(body: &str) -> String {
    file_cfg(body, "backends: [fe-a]")
}

const POOLS: &str =
    "pools: [ { namespace: a, backends: [fe-a] }, { namespace: b, backends: [fe-b] } ]";

#[test]
fn file_source_defaults() {
    let c = clean(&file1("root: /var/run/dynamo_store_kv"));
    let d = &c.dynamo.discovery;
    assert_eq!(d.source, DiscoverySource::File);
    assert_eq!(d.source.as_str(), "file");
    assert_eq!(d.file.root.as_deref(), Some("/var/run/dynamo_store_kv"));
    assert_eq!(d.file.ttl, Duration::from_secs(10));
    assert_eq!(d.file.namespaces, vec!["dynamo".to_owned()]);
    assert_eq!(c.dynamo.namespaces(), ["dynamo".to_owned()]);
    // No etcd endpoint is needed with the file source.
    assert!(d.etcd.endpoints.is_empty());
}

#[test]
fn file_root_required_when_enabled_only() {
    rejects(&file1("ttl: 10s"), "dynamo.discovery.file.root");
    rejects(
        &with(&format!(
            "dynamo: {{ enabled: true, discovery: {{ source: file }}, {CIDRS}, \
             shim: {{ backends: [fe-a] }} }}"
        )),
        "dynamo.discovery.file.root",
    );
    // Disabled: nothing runs, so nothing is required (shape rules still apply).
    let (c, _) = ok(&with(
        "dynamo: { enabled: false, discovery: { source: file } }",
    ));
    assert_eq!(c.dynamo.discovery.file.root, None);
    rejects(
        &with("dynamo: { enabled: false, discovery: { source: file, file: { root: rel } } }"),
        "dynamo.discovery.file.root",
    );
    // Another source: the file block is validated but its root is not required.
    let (c, _) = ok(&with(
        "dynamo: { enabled: true, discovery: { etcd: { endpoints: [\"http://etcd.x.svc:2379\"] }, \
         file: { ttl: 5s } }, load: { direct_allow_cidrs: [10.0.0.0/8] }, shim: { backends: [fe-a] } }",
    ));
    assert_eq!(c.dynamo.discovery.file.ttl, Duration::from_secs(5));
}

#[test]
fn file_root_must_be_absolute_without_nul() {
    for bad in ["relative/dir", "\"\"", "\"./x\"", "\"/tmp/a\\0b\"", "42"] {
        rejects(
            &file1(&format!("root: {bad}")),
            "dynamo.discovery.file.root",
        );
    }
    clean(&file1("root: \"/tmp/dir with space/kv\""));
}

#[test]
fn file_ttl_range() {
    for bad in ["999ms", "0s", "11m", "1h", "abc", "-1s"] {
        rejects(
            &file1(&format!("root: /kv, ttl: {bad}")),
            "dynamo.discovery.file.ttl",
        );
    }
    for (good, d) in [("1s", 1), ("10m", 600), ("30s", 30)] {
        let c = clean(&file1(&format!("root: /kv, ttl: {good}")));
        assert_eq!(c.dynamo.discovery.file.ttl, Duration::from_secs(d));
    }
}

#[test]
fn file_unknown_keys_rejected() {
    let e = err(&file1("root: /kv, rooot: /x, namespace: dynamo"));
    assert!(
        has_error(&e, "dynamo.discovery.file.rooot"),
        "{:#?}",
        e.errors
    );
    assert!(
        has_error(&e, "dynamo.discovery.file.namespace"),
        "only the list form exists for the file source: {:#?}",
        e.errors
    );
}

#[test]
fn file_namespaces_follow_cfg_08_and_09() {
    for bad in ["\"\"", "\"a/b\"", "\"a b\"", "\"a\\u0001\""] {
        rejects(
            &file1(&format!("root: /kv, namespaces: [{bad}]")),
            "dynamo.discovery.file.namespaces[0]",
        );
    }
    rejects(
        &file_cfg("root: /kv, namespaces: [a, b, a]", POOLS),
        "dynamo.discovery.file.namespaces[2]",
    );
    rejects(
        &file1("root: /kv, namespaces: []"),
        "dynamo.discovery.file.namespaces",
    );
    let many: Vec<String> = (0..17).map(|i| format!("n{i}")).collect();
    rejects(
        &file1(&format!("root: /kv, namespaces: [{}]", many.join(", "))),
        "dynamo.discovery.file.namespaces",
    );
    let c = clean(&file_cfg("root: /kv, namespaces: [a, b]", POOLS));
    assert_eq!(c.dynamo.namespaces(), ["a".to_owned(), "b".to_owned()]);
}

#[test]
fn file_namespaces_drive_cfg_10_and_23() {
    // CFG-10: two namespaces and shim.backends.
    rejects(
        &file_cfg("root: /kv, namespaces: [a, b]", "backends: [fe-a]"),
        "dynamo.shim.backends",
    );
    // CFG-23: a pool for a namespace the file source does not follow.
    rejects(
        &file_cfg(
            "root: /kv, namespaces: [a, b]",
            "pools: [ { namespace: a, backends: [fe-a] }, { namespace: c, backends: [fe-b] } ]",
        ),
        "dynamo.shim.pools[1].namespace",
    );
    // The etcd namespaces are not the file source's.
    rejects(
        &with(&format!(
            "dynamo: {{ enabled: true, discovery: {{ source: file, file: {{ root: /kv }}, \
             etcd: {{ namespaces: [a, b] }} }}, {CIDRS}, shim: {{ {POOLS} }} }}"
        )),
        "dynamo.shim.pools[0].namespace",
    );
}

#[test]
fn file_source_spelling() {
    let e = err(&with("dynamo: { discovery: { source: files } }"));
    let f = e
        .errors
        .iter()
        .find(|f| f.field == "dynamo.discovery.source");
    assert!(
        f.is_some_and(|f| f.reason.contains("file")),
        "{:#?}",
        e.errors
    );
}

#[test]
fn file_config_show_renders_and_parses_back() {
    let c = clean(&file_cfg(
        "root: /srv/dynamo_kv, ttl: 30s, namespaces: [a, b]",
        POOLS,
    ));
    let j = c.show_json();
    let f = &j["dynamo"]["discovery"]["file"];
    assert_eq!(j["dynamo"]["discovery"]["source"], "file");
    assert_eq!(f["root"], "/srv/dynamo_kv");
    assert_eq!(f["ttl"], "30s");
    assert_eq!(f["namespaces"], serde_json::json!(["a", "b"]));
    let shown = c.show_masked();
    let (back, _) = match Config::from_yaml(&shown, &NoEnv) {
        Ok(v) => v,
        Err(e) => panic!("shown config does not parse back: {:#?}\n{shown}", e.errors),
    };
    assert_eq!(back.dynamo.discovery, c.dynamo.discovery);
    // The default (no root) renders as null and parses back too.
    let (d, _) = ok("");
    let shown = d.show_masked();
    let (back, _) = match Config::from_yaml(&shown, &NoEnv) {
        Ok(v) => v,
        Err(e) => panic!("default show does not parse back: {:#?}\n{shown}", e.errors),
    };
    assert_eq!(back.dynamo.discovery.file, d.dynamo.discovery.file);
}

/// The section alone (the event broker embeds it): the router's rules, paths relative to it.
#[test]
fn a_discovery_section_alone_follows_the_routers_rules() {
    use super::dynamo::DiscoveryConfig;
    let (d, warnings) = DiscoveryConfig::from_yaml(
        "source: file\nfile: { root: /var/dynamo, namespaces: [a, b] }\n",
        &NoEnv,
    )
    .unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(d.source, DiscoverySource::File);
    assert_eq!(d.namespaces(), ["a", "b"]);
    let e =
        DiscoveryConfig::from_yaml("source: file\nfile: { root: relative }\nbogus: 1\n", &NoEnv)
            .unwrap_err();
    let fields: Vec<&str> = e.errors.iter().map(|e| e.field.as_str()).collect();
    assert!(
        fields.contains(&"file.root") && fields.contains(&"bogus"),
        "{fields:?}"
    );
    // Checked as for an enabled router: etcd needs its endpoints.
    assert!(DiscoveryConfig::from_yaml("source: etcd\n", &NoEnv).is_err());
}
