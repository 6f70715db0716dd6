//! Shim replica lists and the model map, built from real configs.

use std::net::SocketAddr;

use super::ShimRoutes;
use crate::config::BackendIdx;
use crate::config::tests_cfg_a::BACKENDS;
use crate::config::{Config, NoEnv};

fn config(dynamo: &str) -> Config {
    let yaml = format!("{BACKENDS}{dynamo}\n");
    match Config::from_yaml(&yaml, &NoEnv) {
        Ok((c, _)) => c,
        Err(e) => panic!("invalid test config: {:#?}", e.errors),
    }
}

fn all_resolved(c: &Config) -> Vec<Option<SocketAddr>> {
    c.backends
        .iter()
        .map(|_| Some(SocketAddr::from(([127, 0, 0, 1], 1))))
        .collect()
}

const POOLS: &str = r#"
dynamo:
  enabled: true
  discovery: { etcd: { endpoints: ["http://etcd:2379"], namespaces: [prod, canary] } }
  load: { direct_allow_cidrs: [10.0.0.0/8] }
  shim:
    pools:
      - { namespace: prod, backends: [fe-a, fe-int, fe-off] }
      - { namespace: canary, backends: [fe-b] }
    model_map: { qwen3-32b: "Qwen/Qwen3-32B", small: "Qwen/Qwen3-0.6B" }
"#;

#[test]
fn pools_list_usable_replicas_per_namespace_in_config_order() {
    let c = config(POOLS);
    let r = ShimRoutes::build(&c, &all_resolved(&c));
    // fe-off is disabled; fe-int is internal but a valid shim replica.
    assert_eq!(r.replicas("prod"), &[BackendIdx(0), BackendIdx(2)]);
    assert_eq!(r.replicas("canary"), &[BackendIdx(1)]);
    assert!(r.replicas("other").is_empty());
    assert!(r.any_usable());
}

#[test]
fn unresolved_replicas_are_left_out_and_an_empty_pool_is_not_usable() {
    let c = config(POOLS);
    let mut addrs = all_resolved(&c);
    addrs[1] = None; // fe-b, canary's only replica
    addrs[0] = None; // fe-a
    let r = ShimRoutes::build(&c, &addrs);
    assert_eq!(r.replicas("prod"), &[BackendIdx(2)]);
    assert!(r.replicas("canary").is_empty());
    assert!(r.any_usable());
    addrs[2] = None;
    let r = ShimRoutes::build(&c, &addrs);
    assert!(!r.any_usable());
}

#[test]
fn shared_backends_serve_the_single_namespace() {
    let c = config(
        r#"
dynamo:
  enabled: true
  discovery: { etcd: { endpoints: ["http://etcd:2379"], namespaces: [prod] } }
  load: { direct_allow_cidrs: [10.0.0.0/8] }
  shim: { backends: [fe-b, fe-a] }
"#,
    );
    let r = ShimRoutes::build(&c, &all_resolved(&c));
    assert_eq!(r.replicas("prod"), &[BackendIdx(1), BackendIdx(0)]);
    // The model map is empty: the client model is matched as it is.
    assert_eq!(r.dynamo_model("Qwen/Qwen3-0.6B"), "Qwen/Qwen3-0.6B");
}

#[test]
fn model_map_translates_only_listed_models() {
    let c = config(POOLS);
    let r = ShimRoutes::build(&c, &all_resolved(&c));
    assert_eq!(r.dynamo_model("qwen3-32b"), "Qwen/Qwen3-32B");
    assert_eq!(r.dynamo_model("small"), "Qwen/Qwen3-0.6B");
    assert_eq!(r.dynamo_model("Qwen/Qwen3-32B"), "Qwen/Qwen3-32B");
    assert_eq!(r.dynamo_model("unknown"), "unknown");
    assert_eq!(r.dynamo_model(""), "");
}

#[test]
fn no_shim_section_means_no_usable_replica() {
    let c = config("");
    let r = ShimRoutes::build(&c, &all_resolved(&c));
    assert!(!r.any_usable());
    assert!(r.replicas("dynamo").is_empty());
}

#[test]
fn candidate_namespaces_are_followed_and_have_a_replica() {
    use crate::picker::NamespaceSet;
    let c = config(POOLS);
    let mut addrs = all_resolved(&c);
    addrs[1] = None; // canary's only replica
    let r = ShimRoutes::build(&c, &addrs);
    assert!(r.contains_namespace("prod"));
    assert!(!r.contains_namespace("canary"), "no usable replica");
    assert!(!r.contains_namespace("other"), "not followed, no pool");
}

/// RELOAD-08: with one shared list, a namespace the config no longer follows is not a candidate
/// even though `replicas` would serve it.
#[test]
fn shared_backends_serve_only_followed_namespaces() {
    use crate::picker::NamespaceSet;
    let c = config(
        r#"
dynamo:
  enabled: true
  discovery: { etcd: { endpoints: ["http://etcd:2379"], namespaces: [prod] } }
  load: { direct_allow_cidrs: [10.0.0.0/8] }
  shim: { backends: [fe-a] }
"#,
    );
    let r = ShimRoutes::build(&c, &all_resolved(&c));
    assert!(r.contains_namespace("prod"));
    assert!(!r.contains_namespace("old"));
    assert!(!r.replicas("old").is_empty());
}

/// SHIM-04/05: the shim path belongs to the disaggregated orchestrator.
#[test]
fn orchestrator_disabled_means_no_usable_replica() {
    let yaml = format!(
        "{}{POOLS}\n",
        BACKENDS.replace(
            "disaggregated_serving: { enabled: true }",
            "disaggregated_serving: { enabled: false }"
        )
    );
    assert!(yaml.contains("enabled: false }"));
    let c = match Config::from_yaml(&yaml, &NoEnv) {
        Ok((c, _)) => c,
        Err(e) => panic!("invalid test config: {:#?}", e.errors),
    };
    let r = ShimRoutes::build(&c, &all_resolved(&c));
    assert!(!r.any_usable());
}

#[test]
fn the_client_models_are_what_a_chat_request_would_be_pinned_for() {
    use crate::discovery::Role;
    use crate::picker::test_support::{fleet, worker};
    let c = config(POOLS);
    let r = ShimRoutes::build(&c, &all_resolved(&c));
    let f = fleet(vec![
        // Mapped: listed under its client names only.
        worker("prod", 1, Role::Aggregated, "Qwen/Qwen3-32B"),
        worker("canary", 2, Role::Decode, "Qwen/Qwen3-32B"),
        // Unmapped: listed as itself, once for two namespaces.
        worker("prod", 3, Role::Decode, "llama"),
        worker("canary", 4, Role::Aggregated, "llama"),
        worker("prod", 5, Role::Prefill, "llama"),
        // Prefill workers alone give no pick.
        worker("prod", 6, Role::Prefill, "prefill-only"),
        // A namespace the config does not follow is no candidate.
        worker("other", 7, Role::Aggregated, "elsewhere"),
        // A model named like a client model mapped elsewhere is unreachable under that name.
        worker("prod", 8, Role::Aggregated, "small"),
        worker("prod", 9, Role::Unknown, "unknown-role"),
    ]);
    assert_eq!(r.client_models(&f), ["llama", "qwen3-32b"]);
    // A chat request is pinned for a listed name and for a mapped model's own name.
    for pinned in ["llama", "qwen3-32b", "Qwen/Qwen3-32B"] {
        assert!(r.pins(&f, pinned), "{pinned}");
    }
    for not in [
        "prefill-only",
        "elsewhere",
        "small",
        "unknown-role",
        "nothing",
    ] {
        assert!(!r.pins(&f, not), "{not}");
    }
    // The model the map's other client name points at appears once it is served.
    let mut more = f.workers.clone();
    more.push(worker("canary", 10, Role::Decode, "Qwen/Qwen3-0.6B"));
    assert_eq!(
        r.client_models(&fleet(more)),
        ["llama", "qwen3-32b", "small"]
    );
    // A namespace without a usable replica is no candidate either: canary's only one gone.
    let mut addrs = all_resolved(&c);
    addrs[1] = None;
    let r = ShimRoutes::build(&c, &addrs);
    let only_canary = fleet(vec![worker("canary", 2, Role::Decode, "Qwen/Qwen3-32B")]);
    assert!(r.client_models(&only_canary).is_empty());
    assert_eq!(r.client_models(&f), ["llama", "qwen3-32b"]);
    // No usable replica at all: nothing is pinned.
    let none = ShimRoutes::build(&c, &vec![None; c.backends.len()]);
    assert!(none.client_models(&f).is_empty());
    assert!(!none.pins(&f, "llama"));
}
