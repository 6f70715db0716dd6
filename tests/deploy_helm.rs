//! The Helm chart (`deploy/helm/continuum-router/`) as the real `helm template` renders it, and
//! `helm lint --strict`: with the default values it renders the Kustomize base (no grant, no
//! token); `dynamoPodDiscovery.enabled` adds a Role granting only get, list and watch on Pods in
//! `dynamoPodDiscovery.namespace`, bound to the router's own ServiceAccount, the token mount and
//! an egress policy to `dynamoPodDiscovery.apiServerPorts` (DISC-K8S-POD-21, -22);
//! `dynamoPodDiscovery.metadata` adds DynamoWorkerMetadata and EndpointSlices and egress to the
//! workers' publishers (DISC-K8S-META-24). The router config each mode ships passes the router's
//! own `config validate`, and each mode renders the same objects, rules, token mount, egress and
//! router config as the corresponding `kubectl kustomize` rendering of `deploy/kubernetes/`.
//! Each mode's checks are `common::manifests`', which `tests/deploy_kubernetes.rs` runs on the
//! Kustomize renderings too; what is here is the chart's own: lint, values, the differential.
//!
//! helm: `$CONTINUUM_HELM`, else what `deploy/helm/install-helm.sh --print` names (tests/run.sh
//! installs it).
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;

use common::manifests::{
    FLEET, Grant, assert_base_grants_nothing, assert_discovery_grant, assert_no_port_range,
    documents, egress, is_submap, kustomize, of_kind, one, pod_spec, rules, run,
};
#[cfg(feature = "dynamo")]
use common::manifests::{assert_metadata_discovery, assert_pod_discovery};
use serde_yaml_ng::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/helm/continuum-router");
const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/helm/examples");
/// The release name that gives the chart's objects the names of `deploy/kubernetes/`.
const RELEASE: &str = "continuum-router";

/// The helm executable: `$CONTINUUM_HELM`, else the install script's `--print`.
fn helm_bin() -> String {
    if let Ok(h) = std::env::var("CONTINUUM_HELM") {
        return h;
    }
    let script = format!("{ROOT}/deploy/helm/install-helm.sh");
    let r = run(&script, &["--print"]);
    assert!(r.ok(), "{script} --print: {}", r.stderr);
    let helm = r.stdout.trim().to_owned();
    assert!(
        std::path::Path::new(&helm).is_file(),
        "no helm at {helm}: run deploy/helm/install-helm.sh (tests/run.sh does) or set CONTINUUM_HELM"
    );
    helm
}

/// `--values` arguments for the example values files named.
fn values_args(values: &[&str]) -> Vec<String> {
    values
        .iter()
        .flat_map(|v| ["--values".to_owned(), format!("{EXAMPLES}/{v}")])
        .collect()
}

/// `helm template <release> <chart> --namespace <ns> [--values ..] [--set ..]`: the outcome.
fn try_template(
    release: &str,
    namespace: &str,
    values: &[&str],
    sets: &[&str],
) -> common::CliOutput {
    let mut args: Vec<String> = vec![
        "template".into(),
        release.into(),
        CHART.into(),
        "--namespace".into(),
        namespace.into(),
    ];
    args.extend(values_args(values));
    for s in sets {
        args.push("--set".into());
        args.push((*s).into());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run(&helm_bin(), &args)
}

/// The documents `helm template` renders; it must succeed without a warning.
fn template(release: &str, namespace: &str, values: &[&str], sets: &[&str]) -> Vec<Value> {
    let r = try_template(release, namespace, values, sets);
    assert!(r.ok(), "helm template {values:?} {sets:?}: {}", r.stderr);
    assert!(
        !r.stderr.to_lowercase().contains("warning"),
        "helm template {values:?} {sets:?}: {}",
        r.stderr
    );
    documents(&r.stdout)
}

#[test]
fn helm_lint_passes_for_the_defaults_and_both_discovery_examples() {
    let helm = helm_bin();
    for values in [
        vec![],
        vec!["dynamo-pod-discovery.yaml"],
        vec!["dynamo-metadata-discovery.yaml"],
    ] {
        let mut args = vec!["lint".to_owned(), "--strict".to_owned(), CHART.to_owned()];
        args.extend(values_args(&values));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = run(&helm, &args);
        let report = format!("{}{}", r.stdout, r.stderr);
        assert!(r.ok(), "helm lint {values:?}: {report}");
        assert!(
            report.contains("1 chart(s) linted, 0 chart(s) failed"),
            "{report}"
        );
        assert!(
            !report.contains("[WARNING]") && !report.contains("[ERROR]"),
            "{report}"
        );
    }
}

#[test]
fn the_defaults_render_the_base_no_grant_no_token_non_root_read_only() {
    let docs = template(RELEASE, "default", &[], &[]);
    let yaml = assert_base_grants_nothing(&docs);
    // The default config is the base's, to the byte.
    let base = kustomize("base");
    assert_eq!(
        Some(yaml.as_str()),
        one(&base, "ConfigMap")["data"]["router.yaml"].as_str()
    );
}

#[cfg(feature = "dynamo")]
#[test]
fn pod_discovery_grants_only_read_verbs_on_pods_to_the_routers_own_account() {
    let docs = template(RELEASE, FLEET, &["dynamo-pod-discovery.yaml"], &[]);
    assert_pod_discovery(&docs, FLEET);
}

#[cfg(feature = "dynamo")]
#[test]
fn metadata_discovery_grants_only_read_verbs_on_its_three_resources() {
    let docs = template(RELEASE, FLEET, &["dynamo-metadata-discovery.yaml"], &[]);
    assert_metadata_discovery(&docs, FLEET);
}

/// The values alone, without the example files: the Role and RoleBinding go in
/// `dynamoPodDiscovery.namespace` while the router, its ServiceAccount and its egress policy stay
/// in the release namespace (the binding names the account there, the egress rules look for the
/// frontends and workers in the fleet namespace); `apiServerPorts` sets the API server's egress.
#[test]
fn the_values_place_the_grant_in_the_fleet_namespace_and_set_the_api_server_ports() {
    let edge = Grant {
        fleet: "fleet-a",
        release_namespace: "routers",
        account: "edge-continuum-router",
        role: "edge-continuum-router-dynamo-pod-reader",
        api_ports: &[443, 8443],
    };
    let docs = template(
        "edge",
        "routers",
        &[],
        &[
            "dynamoPodDiscovery.enabled=true",
            "dynamoPodDiscovery.metadata=true",
            "dynamoPodDiscovery.namespace=fleet-a",
            "dynamoPodDiscovery.apiServerPorts={443,8443}",
        ],
    );
    let role = assert_discovery_grant(&docs, &edge);
    assert_eq!(rules(role).len(), 3);
    for kind in ["ServiceAccount", "Deployment", "Service", "ConfigMap"] {
        assert_eq!(
            one(&docs, kind)["metadata"]["namespace"].as_str(),
            Some("routers"),
            "{kind}"
        );
    }
    // Frontends and workers are in the fleet namespace: every rule with a destination says so.
    let to_pods: Vec<_> = egress(&docs, "TCP")
        .into_iter()
        .filter(|e| !e.to.is_null())
        .collect();
    assert_eq!(to_pods.len(), 2, "{to_pods:?}");
    for e in &to_pods {
        assert_eq!(
            e.namespaces["kubernetes.io/metadata.name"].as_str(),
            Some("fleet-a"),
            "{to_pods:?}"
        );
    }
    // Pods only: one rule, and no port range.
    let pods_only = template(
        "edge",
        "routers",
        &[],
        &[
            "dynamoPodDiscovery.enabled=true",
            "dynamoPodDiscovery.namespace=fleet-a",
        ],
    );
    let role = assert_discovery_grant(
        &pods_only,
        &Grant {
            api_ports: &[443, 6443],
            ..edge
        },
    );
    assert_eq!(rules(role).len(), 1);
    assert_no_port_range(&pods_only);
}

#[test]
fn values_the_chart_cannot_honour_are_refused() {
    // `metadata` without `enabled` would grant nothing the config needs.
    let r = try_template(RELEASE, FLEET, &[], &["dynamoPodDiscovery.metadata=true"]);
    assert!(!r.ok(), "{}", r.stdout);
    assert!(
        r.stderr
            .contains("dynamoPodDiscovery.metadata needs dynamoPodDiscovery.enabled"),
        "{}",
        r.stderr
    );
    // A misspelt switch and an impossible port fail the schema rather than render nothing.
    for set in [
        "dynamoPodDiscovery.enable=true",
        "dynamoPodDiscovery.apiServerPorts={0}",
        "dynamoPodDiscovery.namespace=Not_A_Namespace",
    ] {
        let r = try_template(RELEASE, FLEET, &[], &[set]);
        assert!(!r.ok(), "{set}: {}", r.stdout);
        assert!(r.stderr.contains("schema"), "{set}: {}", r.stderr);
    }
}

/// `(kind, name, namespace)` of every object.
fn identities(docs: &[Value]) -> BTreeSet<(String, String, String)> {
    docs.iter()
        .map(|d| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (
                s(&d["kind"]),
                s(&d["metadata"]["name"]),
                s(&d["metadata"]["namespace"]),
            )
        })
        .collect()
}

/// Helm's rendering of a mode against Kustomize's: the same objects (kind, name, namespace), the
/// same Role rules and binding, the same token mount, egress and Pod spec, the same router config.
fn same_as_kustomize(helm: &[Value], kustomize: &[Value]) {
    assert_eq!(identities(helm), identities(kustomize));
    // Role rules (verbs included), the binding.
    let roles = of_kind(kustomize, "Role");
    assert_eq!(of_kind(helm, "Role").len(), roles.len());
    if !roles.is_empty() {
        assert_eq!(one(helm, "Role")["rules"], roles[0]["rules"]);
        for key in ["roleRef", "subjects"] {
            assert_eq!(
                one(helm, "RoleBinding")[key],
                one(kustomize, "RoleBinding")[key],
                "{key}"
            );
        }
    }
    // The egress policy, but for Helm's extra selector label.
    let nps = of_kind(kustomize, "NetworkPolicy");
    assert_eq!(of_kind(helm, "NetworkPolicy").len(), nps.len());
    if !nps.is_empty() {
        let (h, k) = (&one(helm, "NetworkPolicy")["spec"], &nps[0]["spec"]);
        assert_eq!(h["egress"], k["egress"]);
        assert_eq!(h["policyTypes"], k["policyTypes"]);
        assert!(is_submap(
            &k["podSelector"]["matchLabels"],
            &h["podSelector"]["matchLabels"]
        ));
    }
    assert_eq!(
        one(helm, "ServiceAccount")["automountServiceAccountToken"],
        one(kustomize, "ServiceAccount")["automountServiceAccountToken"]
    );
    // The Deployment: replicas and the Pod spec field by field (Helm adds imagePullPolicy).
    let (hd, kd) = (one(helm, "Deployment"), one(kustomize, "Deployment"));
    assert_eq!(hd["spec"]["replicas"], kd["spec"]["replicas"]);
    let (hp, kp) = (pod_spec(helm), pod_spec(kustomize));
    for key in [
        "serviceAccountName",
        "automountServiceAccountToken",
        "securityContext",
        "terminationGracePeriodSeconds",
        "volumes",
    ] {
        assert_eq!(hp[key], kp[key], "pod {key}");
    }
    let (hc, kc) = (&hp["containers"], &kp["containers"]);
    assert_eq!(hc.as_sequence().unwrap().len(), 1);
    assert_eq!(kc.as_sequence().unwrap().len(), 1);
    for key in [
        "name",
        "image",
        "args",
        "ports",
        "readinessProbe",
        "livenessProbe",
        "resources",
        "securityContext",
        "volumeMounts",
    ] {
        assert_eq!(hc[0][key], kc[0][key], "container {key}");
    }
    assert_eq!(
        one(helm, "Service")["spec"]["ports"],
        one(kustomize, "Service")["spec"]["ports"]
    );
    // The same router config (as parsed YAML).
    let config = |docs: &[Value]| -> Value {
        serde_yaml_ng::from_str(
            one(docs, "ConfigMap")["data"]["router.yaml"]
                .as_str()
                .unwrap(),
        )
        .unwrap()
    };
    assert_eq!(config(helm), config(kustomize));
}

#[test]
fn each_mode_renders_what_its_kustomize_overlay_renders() {
    // The base has no namespace of its own: Helm's objects go in the release namespace, the
    // identities compare without it.
    let strip = |docs: Vec<Value>| -> Vec<Value> {
        docs.into_iter()
            .map(|mut d| {
                if let Some(m) = d["metadata"].as_mapping_mut() {
                    m.remove("namespace");
                }
                d
            })
            .collect()
    };
    same_as_kustomize(
        &strip(template(RELEASE, "default", &[], &[])),
        &kustomize("base"),
    );
    same_as_kustomize(
        &template(RELEASE, FLEET, &["dynamo-pod-discovery.yaml"], &[]),
        &kustomize("overlays/dynamo-pod-discovery"),
    );
    same_as_kustomize(
        &template(RELEASE, FLEET, &["dynamo-metadata-discovery.yaml"], &[]),
        &kustomize("overlays/dynamo-metadata-discovery"),
    );
    // And the comparison is not vacuous: the modes differ from each other.
    assert_ne!(
        identities(&template(
            RELEASE,
            FLEET,
            &["dynamo-pod-discovery.yaml"],
            &[]
        )),
        identities(&template(RELEASE, FLEET, &[], &[]))
    );
    assert_ne!(
        one(
            &template(RELEASE, FLEET, &["dynamo-pod-discovery.yaml"], &[]),
            "Role"
        )["rules"],
        one(&kustomize("overlays/dynamo-metadata-discovery"), "Role")["rules"]
    );
}
