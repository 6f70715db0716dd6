//! The Kubernetes manifests (`deploy/kubernetes/`) as `kubectl kustomize` renders them: the
//! Roles grant only get, list and watch (DISC-RO-08, DISC-K8S-POD-21), bound to the router's
//! own ServiceAccount, whose token only the discovery overlays mount; the egress policy lets the
//! router reach the API server (DISC-K8S-POD-22) and, for `source: kubernetes`, the workers'
//! publishers (DISC-K8S-META-24); and the router config each one ships passes the router's own
//! `config validate`. The checks are `common::manifests`', which `tests/deploy_helm.rs` runs on
//! the Helm chart's renderings too.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::manifests;

#[test]
fn the_base_mounts_no_token_and_grants_nothing() {
    let docs = manifests::kustomize("base");
    manifests::assert_base_grants_nothing(&docs);
    // Kustomize's Pods carry exactly the selector's labels (Helm's add the chart's own).
    let dep = manifests::one(&docs, "Deployment");
    assert_eq!(
        dep["spec"]["template"]["metadata"]["labels"],
        dep["spec"]["selector"]["matchLabels"]
    );
}

#[cfg(feature = "dynamo")]
#[test]
fn the_pod_discovery_overlay_grants_only_read_verbs_on_pods_to_the_routers_own_account() {
    let docs = manifests::kustomize("overlays/dynamo-pod-discovery");
    manifests::assert_pod_discovery(&docs, manifests::FLEET);
}

#[cfg(feature = "dynamo")]
#[test]
fn the_metadata_discovery_overlay_grants_only_read_verbs_on_its_three_resources() {
    let docs = manifests::kustomize("overlays/dynamo-metadata-discovery");
    manifests::assert_metadata_discovery(&docs, manifests::FLEET);
}
