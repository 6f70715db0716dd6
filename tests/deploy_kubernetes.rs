//! The Kubernetes manifests (`deploy/kubernetes/`) as `kubectl kustomize` renders them: the
//! Roles grant only get, list and watch (DISC-RO-08, DISC-K8S-POD-21), bound to the router's
//! own ServiceAccount, whose token only the discovery overlays mount; the egress policy lets the
//! router reach the API server (DISC-K8S-POD-22) and, for `source: kubernetes`, the workers'
//! publishers (DISC-K8S-META-24); and the router config each one ships passes the router's own
//! `config validate`.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::kube::kubectl_bin;
use common::{TempDir, run_cli, wait_bounded};
use serde_yaml_ng::Value;

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/kubernetes");

/// The documents `kubectl kustomize deploy/kubernetes/<dir>` renders.
fn render(dir: &str) -> Vec<Value> {
    let tmp = TempDir::new("kustomize");
    let out = tmp.path().join("out.yaml");
    let err = tmp.path().join("err");
    let mut child = Command::new(kubectl_bin())
        .args(["kustomize", &format!("{DEPLOY}/{dir}")])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("spawn kubectl");
    let status = wait_bounded(&mut child, Duration::from_secs(30)).expect("kubectl kustomize");
    assert!(
        status.success(),
        "kubectl kustomize {dir}: {}",
        std::fs::read_to_string(&err).unwrap_or_default()
    );
    let text = std::fs::read_to_string(&out).unwrap();
    // kustomize separates documents with a `---` line.
    text.split("\n---\n")
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_yaml_ng::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect()
}

#[cfg(feature = "dynamo")]
fn strs(v: &Value) -> Vec<&str> {
    v.as_sequence()
        .map(|s| s.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The router config a rendering ships, checked by `continuum-router config validate`, and what
/// the validator printed (its warnings).
fn validate_shipped_config(docs: &[Value]) -> (String, String) {
    let cms = of_kind(docs, "ConfigMap");
    assert_eq!(cms.len(), 1);
    let yaml = cms[0]["data"]["router.yaml"].as_str().expect("router.yaml");
    let dir = TempDir::new("shipped-config");
    let path = dir.write("router.yaml", yaml);
    let out = run_cli(&["config", "validate", "--config", &path.to_string_lossy()]);
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    (yaml.to_owned(), out.stdout + &out.stderr)
}

#[test]
fn the_base_mounts_no_token_and_grants_nothing() {
    let docs = render("base");
    assert!(of_kind(&docs, "Role").is_empty() && of_kind(&docs, "RoleBinding").is_empty());
    let sa = of_kind(&docs, "ServiceAccount");
    assert_eq!(sa[0]["automountServiceAccountToken"].as_bool(), Some(false));
    let dep = of_kind(&docs, "Deployment")[0];
    let pod = &dep["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"].as_str(), Some("continuum-router"));
    assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(false));
    // The Service and the Deployment select the same Pods.
    let svc = of_kind(&docs, "Service")[0];
    assert_eq!(
        svc["spec"]["selector"], dep["spec"]["selector"]["matchLabels"],
        "selectors differ"
    );
    assert_eq!(
        dep["spec"]["template"]["metadata"]["labels"],
        dep["spec"]["selector"]["matchLabels"]
    );
    validate_shipped_config(&docs);
}

#[cfg(feature = "dynamo")]
#[test]
fn the_pod_discovery_overlay_grants_only_read_verbs_on_pods_to_the_routers_own_account() {
    let docs = render("overlays/dynamo-pod-discovery");
    let roles = of_kind(&docs, "Role");
    assert_eq!(roles.len(), 1);
    let role = roles[0];
    assert_eq!(
        role["metadata"]["name"].as_str(),
        Some("continuum-router-dynamo-pod-reader")
    );
    let rules = role["rules"].as_sequence().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(strs(&rules[0]["apiGroups"]), vec![""]);
    assert_eq!(strs(&rules[0]["resources"]), vec!["pods"]);
    assert_eq!(strs(&rules[0]["verbs"]), vec!["get", "list", "watch"]);
    let ns = check_binding_token_and_egress(&docs, role);
    // The shipped config reads the Pods of that namespace.
    let (yaml, _) = validate_shipped_config(&docs);
    assert!(yaml.contains("source: kubernetes_pods"), "{yaml}");
    assert!(yaml.contains(&format!("namespace: {ns}")), "{yaml}");
}

/// What both discovery overlays share: no cluster-wide grant; the Role bound to the router's own
/// ServiceAccount, in the fleet namespace, which mounts the token; egress to the API server on
/// 443 and 6443. Returns the namespace.
#[cfg(feature = "dynamo")]
fn check_binding_token_and_egress(docs: &[Value], role: &Value) -> String {
    assert!(
        of_kind(docs, "ClusterRole").is_empty() && of_kind(docs, "ClusterRoleBinding").is_empty()
    );
    // Bound to the router's own ServiceAccount, in the fleet namespace, which mounts the token.
    let ns = role["metadata"]["namespace"].as_str().unwrap();
    let binding = of_kind(docs, "RoleBinding")[0];
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["roleRef"]["kind"].as_str(), Some("Role"));
    let subjects = binding["subjects"].as_sequence().unwrap();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0]["name"].as_str(), Some("continuum-router"));
    assert_eq!(subjects[0]["namespace"].as_str(), Some(ns));
    let sa = of_kind(docs, "ServiceAccount")[0];
    assert_eq!(sa["automountServiceAccountToken"].as_bool(), Some(true));
    let pod = &of_kind(docs, "Deployment")[0]["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(true));
    assert_eq!(pod["serviceAccountName"].as_str(), Some("continuum-router"));
    // Egress to the API server on 443 and 6443.
    let np = of_kind(docs, "NetworkPolicy")[0];
    assert_eq!(strs(&np["spec"]["policyTypes"]), vec!["Egress"]);
    let ports: Vec<i64> = egress(docs, "TCP").into_iter().map(|(_, p, _)| p).collect();
    assert!(ports.contains(&443) && ports.contains(&6443), "{ports:?}");
    ns.to_owned()
}

/// Every egress port of `protocol` as (pod selector labels, port, endPort).
#[cfg(feature = "dynamo")]
fn egress(docs: &[Value], protocol: &str) -> Vec<(Value, i64, Option<i64>)> {
    let np = of_kind(docs, "NetworkPolicy")[0];
    np["spec"]["egress"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|r| {
            let to = r["to"][0]["podSelector"]["matchLabels"].clone();
            r["ports"]
                .as_sequence()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|p| p["protocol"].as_str() == Some(protocol))
                .filter_map(move |p| Some((to.clone(), p["port"].as_i64()?, p["endPort"].as_i64())))
        })
        .collect()
}

#[cfg(feature = "dynamo")]
#[test]
fn the_metadata_discovery_overlay_grants_only_read_verbs_on_its_three_resources() {
    let docs = render("overlays/dynamo-metadata-discovery");
    let roles = of_kind(&docs, "Role");
    assert_eq!(roles.len(), 1);
    let role = roles[0];
    assert_eq!(
        role["metadata"]["name"].as_str(),
        Some("continuum-router-dynamo-pod-reader")
    );
    let rules: Vec<(Vec<&str>, Vec<&str>, Vec<&str>)> = role["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| {
            (
                strs(&r["apiGroups"]),
                strs(&r["resources"]),
                strs(&r["verbs"]),
            )
        })
        .collect();
    let read = vec!["get", "list", "watch"];
    assert_eq!(
        rules,
        vec![
            (vec![""], vec!["pods"], read.clone()),
            (
                vec!["nvidia.com"],
                vec!["dynamoworkermetadatas"],
                read.clone()
            ),
            (vec!["discovery.k8s.io"], vec!["endpointslices"], read),
        ]
    );
    let ns = check_binding_token_and_egress(&docs, role);
    // DNS, the frontends, and the workers' publishers on the unprivileged range, to the
    // operator's worker Pods only.
    let udp = egress(&docs, "UDP");
    assert!(udp.iter().any(|(_, p, _)| *p == 53), "{udp:?}");
    let tcp = egress(&docs, "TCP");
    assert!(tcp.iter().any(|(_, p, _)| *p == 53), "{tcp:?}");
    assert!(
        tcp.iter().any(|(to, p, _)| *p == 8000
            && to["nvidia.com/dynamo-component-type"].as_str() == Some("frontend")),
        "{tcp:?}"
    );
    assert!(
        tcp.iter().any(|(to, p, end)| *p == 1024
            && *end == Some(65535)
            && to["nvidia.com/dynamo-discovery-backend"].as_str() == Some("kubernetes")),
        "{tcp:?}"
    );
    // No port range reaches anything but the worker Pods.
    let ranges: Vec<_> = tcp.iter().filter(|(_, _, end)| end.is_some()).collect();
    assert!(
        ranges.iter().all(
            |(to, ..)| to["nvidia.com/dynamo-discovery-backend"].as_str() == Some("kubernetes")
        ),
        "{ranges:?}"
    );
    // The shipped config reads the metadata of that namespace and names no model (this source
    // ignores `model` / `models` with a warning): it validates without any warning.
    let (yaml, report) = validate_shipped_config(&docs);
    assert!(!report.contains("warning"), "{report}");
    let config: Value = serde_yaml_ng::from_str(&yaml).unwrap();
    let discovery = &config["dynamo"]["discovery"];
    assert_eq!(discovery["source"].as_str(), Some("kubernetes"), "{yaml}");
    let kube = &discovery["kubernetes"];
    assert_eq!(kube["namespace"].as_str(), Some(ns.as_str()), "{yaml}");
    assert!(kube["dynamo_namespace"].is_string(), "{yaml}");
    assert!(kube["watch_reconnect_backoff"].is_mapping(), "{yaml}");
    assert!(
        kube.get("model").is_none() && kube.get("models").is_none(),
        "{yaml}"
    );
}
