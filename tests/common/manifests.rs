//! The router's Kubernetes manifests as rendered YAML, for `tests/deploy_kubernetes.rs`
//! (`kubectl kustomize deploy/kubernetes/`) and `tests/deploy_helm.rs` (`helm template` of
//! `deploy/helm/continuum-router/`): the rendering helpers, and the properties both renderings
//! of each mode must have.
//!
//! - [`assert_base_grants_nothing`]: no grant, no token, non-root and read-only, a config that
//!   validates;
//! - [`assert_pod_discovery`], [`assert_metadata_discovery`]: a Role granting only get, list and
//!   watch (DISC-RO-08, DISC-K8S-POD-21) on exactly the mode's resources, in the fleet namespace,
//!   bound to the router's own ServiceAccount, which alone mounts the token; egress to the API
//!   server (DISC-K8S-POD-22) and, for `source: kubernetes`, to the workers' publishers only
//!   (DISC-K8S-META-24); the shipped router config passes `config validate`;
//! - [`assert_discovery_grant`]: the grant, token and egress checks alone, for any release name,
//!   namespaces and API server ports.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use serde_yaml_ng::Value;

use super::kube::kubectl_bin;
use super::{CliOutput, TempDir, run_bounded, run_cli};

/// `deploy/kubernetes/`.
pub const KUSTOMIZE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/kubernetes");
/// The fleet namespace of the Kustomize overlays and of the Helm example values.
pub const FLEET: &str = "dynamo";
/// The router's ServiceAccount (and object names) in `deploy/kubernetes/` and in the chart
/// released as `continuum-router`.
pub const ACCOUNT: &str = "continuum-router";
/// The discovery Role's name in `deploy/kubernetes/` and in the chart released as
/// `continuum-router`.
pub const ROLE: &str = "continuum-router-dynamo-pod-reader";
/// The API server ports the egress policy opens unless told otherwise.
pub const API_SERVER_PORTS: [i64; 2] = [443, 6443];
/// The only verbs a Role may grant.
pub const READ: [&str; 3] = ["get", "list", "watch"];

/// Runs `bin args` (at most 60 s; killed after that).
pub fn run(bin: &str, args: &[&str]) -> CliOutput {
    let mut cmd = Command::new(bin);
    cmd.args(args);
    run_bounded(cmd, Duration::from_secs(60))
}

/// The YAML documents of a multi-document stream (`---` lines between them), comments-only and
/// empty ones left out.
pub fn documents(text: &str) -> Vec<Value> {
    let mut docs = Vec::new();
    let mut cur = String::new();
    for line in text.lines().chain(std::iter::once("---")) {
        if line == "---" {
            let v: Value = serde_yaml_ng::from_str(&cur).unwrap_or_else(|e| panic!("{e}: {cur}"));
            if !v.is_null() {
                docs.push(v);
            }
            cur.clear();
        } else {
            cur.push_str(line);
            cur.push('\n');
        }
    }
    docs
}

/// The documents `kubectl kustomize deploy/kubernetes/<dir>` renders.
pub fn kustomize(dir: &str) -> Vec<Value> {
    let r = run(
        &kubectl_bin(),
        &["kustomize", &format!("{KUSTOMIZE}/{dir}")],
    );
    assert!(r.ok(), "kubectl kustomize {dir}: {}", r.stderr);
    documents(&r.stdout)
}

pub fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect()
}

/// The one object of `kind` in `docs`.
pub fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let all = of_kind(docs, kind);
    assert_eq!(all.len(), 1, "{kind}: {all:?}");
    all[0]
}

/// The strings of a YAML sequence (none for anything else).
pub fn strs(v: &Value) -> Vec<&str> {
    v.as_sequence()
        .map(|s| s.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The Pod spec of the one Deployment.
pub fn pod_spec(docs: &[Value]) -> &Value {
    &one(docs, "Deployment")["spec"]["template"]["spec"]
}

/// `sub`'s entries are all in `map` (label selectors against labels).
pub fn is_submap(sub: &Value, map: &Value) -> bool {
    let (Some(sub), Some(map)) = (sub.as_mapping(), map.as_mapping()) else {
        return false;
    };
    !sub.is_empty() && sub.iter().all(|(k, v)| map.get(k) == Some(v))
}

/// The router config a rendering ships, checked by `continuum-router config validate`, and what
/// the validator printed (its warnings).
pub fn validate_shipped_config(docs: &[Value]) -> (String, String) {
    let yaml = one(docs, "ConfigMap")["data"]["router.yaml"]
        .as_str()
        .expect("router.yaml")
        .to_owned();
    let dir = TempDir::new("shipped-config");
    let path = dir.write("router.yaml", &yaml);
    let out = run_cli(&["config", "validate", "--config", &path.to_string_lossy()]);
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    (yaml, out.stdout + &out.stderr)
}

/// One egress port of the NetworkPolicy.
#[derive(Debug)]
pub struct Egress {
    /// The rule's first destination's Pod selector labels (null: no Pod selector).
    pub to: Value,
    /// That destination's namespace selector labels (null: none).
    pub namespaces: Value,
    pub port: i64,
    pub end_port: Option<i64>,
}

/// Every egress port of `protocol` in the one NetworkPolicy.
pub fn egress(docs: &[Value], protocol: &str) -> Vec<Egress> {
    let np = one(docs, "NetworkPolicy");
    np["spec"]["egress"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|r| {
            let to = r["to"][0]["podSelector"]["matchLabels"].clone();
            let namespaces = r["to"][0]["namespaceSelector"]["matchLabels"].clone();
            r["ports"]
                .as_sequence()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|p| p["protocol"].as_str() == Some(protocol))
                .filter_map(move |p| {
                    Some(Egress {
                        to: to.clone(),
                        namespaces: namespaces.clone(),
                        port: p["port"].as_i64()?,
                        end_port: p["endPort"].as_i64(),
                    })
                })
        })
        .collect()
}

pub type Rule<'a> = (Vec<&'a str>, Vec<&'a str>, Vec<&'a str>);

/// The Role's rules as (apiGroups, resources, verbs).
pub fn rules(role: &Value) -> Vec<Rule<'_>> {
    role["rules"]
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
        .collect()
}

/// The base (no discovery), as rendered for the release `continuum-router`: exactly a
/// ServiceAccount, a ConfigMap, a Service and a Deployment; no Role, no binding, no token mount
/// (on the ServiceAccount nor on the Pod, which runs as the router's own account); the Service
/// selects the Deployment's Pods; non-root, read-only root filesystem, no privilege escalation, no
/// capabilities; probes on /health, memory requests and limits, the config mounted from the
/// ConfigMap; and that config validates. Returns the shipped config.
pub fn assert_base_grants_nothing(docs: &[Value]) -> String {
    let kinds: BTreeSet<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["ConfigMap", "Deployment", "Service", "ServiceAccount"])
    );
    assert!(of_kind(docs, "Role").is_empty() && of_kind(docs, "RoleBinding").is_empty());
    let sa = one(docs, "ServiceAccount");
    assert_eq!(sa["automountServiceAccountToken"].as_bool(), Some(false));
    let dep = one(docs, "Deployment");
    let pod = pod_spec(docs);
    assert_eq!(pod["serviceAccountName"], sa["metadata"]["name"]);
    assert_eq!(pod["serviceAccountName"].as_str(), Some(ACCOUNT));
    assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(false));
    // The Service and the Deployment select the same Pods, which carry those labels.
    let selector = &dep["spec"]["selector"]["matchLabels"];
    assert_eq!(
        one(docs, "Service")["spec"]["selector"],
        *selector,
        "selectors differ"
    );
    assert!(is_submap(
        selector,
        &dep["spec"]["template"]["metadata"]["labels"]
    ));
    // Non-root, read-only root filesystem, no privilege escalation, no capabilities.
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    assert!(pod["securityContext"]["runAsUser"].as_i64().unwrap() > 0);
    let containers = pod["containers"].as_sequence().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(strs(&sc["capabilities"]["drop"]), vec!["ALL"]);
    // Probes on /health, resources, the config from the ConfigMap.
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(c[probe]["httpGet"]["path"].as_str(), Some("/health"));
        assert_eq!(c[probe]["httpGet"]["port"].as_str(), Some("http"));
    }
    assert!(c["resources"]["requests"]["memory"].is_string(), "{c:?}");
    assert!(c["resources"]["limits"]["memory"].is_string(), "{c:?}");
    assert_eq!(
        strs(&c["args"]),
        vec!["--config", "/etc/continuum/router.yaml"]
    );
    assert_eq!(
        pod["volumes"][0]["configMap"]["name"],
        one(docs, "ConfigMap")["metadata"]["name"]
    );
    assert_eq!(
        c["volumeMounts"][0]["mountPath"].as_str(),
        Some("/etc/continuum")
    );
    validate_shipped_config(docs).0
}

/// Where a discovery grant goes and what it names.
#[derive(Debug, Clone, Copy)]
pub struct Grant<'a> {
    /// The fleet namespace: the Role and the RoleBinding go there.
    pub fleet: &'a str,
    /// The router's namespace: its ServiceAccount and its egress policy.
    pub release_namespace: &'a str,
    /// The router's ServiceAccount.
    pub account: &'a str,
    /// The Role's name.
    pub role: &'a str,
    /// The API server ports the egress policy opens, exactly.
    pub api_ports: &'a [i64],
}

impl<'a> Grant<'a> {
    /// `deploy/kubernetes/` and the chart released as `continuum-router` in the fleet namespace
    /// `fleet`: everything in `fleet`, the default names and API server ports.
    pub fn in_fleet(fleet: &'a str) -> Self {
        Grant {
            fleet,
            release_namespace: fleet,
            account: ACCOUNT,
            role: ROLE,
            api_ports: &API_SERVER_PORTS,
        }
    }
}

/// What both discovery modes share: no cluster-wide grant; one Role, `grant.role` in
/// `grant.fleet`, every verb of which is a read; bound (in `grant.fleet`) to the router's own
/// ServiceAccount `grant.account` alone (in `grant.release_namespace`), which mounts the token;
/// the Deployment runs as that account and mounts the token too; the egress policy (in
/// `grant.release_namespace`) selects the router's Pods and reaches the API server on exactly
/// `grant.api_ports`. Returns the Role.
pub fn assert_discovery_grant<'a>(docs: &'a [Value], grant: &Grant<'_>) -> &'a Value {
    assert!(
        of_kind(docs, "ClusterRole").is_empty() && of_kind(docs, "ClusterRoleBinding").is_empty()
    );
    let role = one(docs, "Role");
    assert_eq!(role["metadata"]["name"].as_str(), Some(grant.role));
    assert_eq!(role["metadata"]["namespace"].as_str(), Some(grant.fleet));
    // Every verb of every rule is a read.
    for (_, _, verbs) in rules(role) {
        assert!(
            !verbs.is_empty() && verbs.iter().all(|v| READ.contains(v)),
            "{verbs:?}"
        );
    }
    let binding = one(docs, "RoleBinding");
    assert_eq!(binding["metadata"]["namespace"].as_str(), Some(grant.fleet));
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["roleRef"]["kind"].as_str(), Some("Role"));
    // Bound to the router's own ServiceAccount, which mounts the token.
    let sa = one(docs, "ServiceAccount");
    assert_eq!(
        sa["metadata"]["namespace"].as_str(),
        Some(grant.release_namespace)
    );
    let subjects = binding["subjects"].as_sequence().unwrap();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0]["kind"].as_str(), Some("ServiceAccount"));
    assert_eq!(subjects[0]["name"], sa["metadata"]["name"]);
    assert_eq!(subjects[0]["name"].as_str(), Some(grant.account));
    assert_ne!(subjects[0]["name"].as_str(), Some("default"));
    assert_eq!(
        subjects[0]["namespace"].as_str(),
        Some(grant.release_namespace)
    );
    assert_eq!(sa["automountServiceAccountToken"].as_bool(), Some(true));
    let pod = pod_spec(docs);
    assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(true));
    assert_eq!(pod["serviceAccountName"], sa["metadata"]["name"]);
    assert_eq!(pod["serviceAccountName"].as_str(), Some(grant.account));
    // The egress policy selects the router's Pods, and reaches the API server on the ports named.
    let np = one(docs, "NetworkPolicy");
    assert_eq!(
        np["metadata"]["namespace"].as_str(),
        Some(grant.release_namespace)
    );
    assert_eq!(strs(&np["spec"]["policyTypes"]), vec!["Egress"]);
    assert!(
        is_submap(
            &np["spec"]["podSelector"]["matchLabels"],
            &one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
        ),
        "{np:?}"
    );
    // The API server rule: the ports with no destination at all, besides DNS.
    let api: Vec<i64> = egress(docs, "TCP")
        .into_iter()
        .filter(|e| e.to.is_null() && e.port != 53)
        .map(|e| e.port)
        .collect();
    assert_eq!(api, grant.api_ports);
    role
}

/// No TCP egress port range: Pods carry no publishers.
pub fn assert_no_port_range(docs: &[Value]) {
    let tcp = egress(docs, "TCP");
    assert!(tcp.iter().all(|e| e.end_port.is_none()), "{tcp:?}");
}

/// `source: kubernetes_pods` (the pod-discovery overlay, the chart with
/// `dynamo-pod-discovery.yaml`) with everything in `fleet`: [`assert_discovery_grant`] with the
/// default names and API server ports; the Role grants get, list and watch on Pods and nothing
/// else; no egress port range; the shipped config validates and reads the Pods of `fleet`.
pub fn assert_pod_discovery(docs: &[Value], fleet: &str) {
    let role = assert_discovery_grant(docs, &Grant::in_fleet(fleet));
    assert_eq!(rules(role), vec![(vec![""], vec!["pods"], READ.to_vec())]);
    assert_no_port_range(docs);
    // The shipped config reads the Pods of that namespace.
    let (yaml, _) = validate_shipped_config(docs);
    let config: Value = serde_yaml_ng::from_str(&yaml).unwrap();
    let discovery = &config["dynamo"]["discovery"];
    assert_eq!(
        discovery["source"].as_str(),
        Some("kubernetes_pods"),
        "{yaml}"
    );
    assert_eq!(
        discovery["kubernetes"]["namespace"].as_str(),
        Some(fleet),
        "{yaml}"
    );
}

/// `source: kubernetes` (the metadata-discovery overlay, the chart with
/// `dynamo-metadata-discovery.yaml`) with everything in `fleet`: [`assert_discovery_grant`] with
/// the default names and API server ports; the Role grants get, list and watch on Pods,
/// DynamoWorkerMetadata and EndpointSlices and nothing else; egress to DNS, the frontends and the
/// workers' publishers on 1024-65535, no port range to anything but the worker Pods; the shipped
/// config validates without any warning, reads the metadata of `fleet` and names no model.
pub fn assert_metadata_discovery(docs: &[Value], fleet: &str) {
    let role = assert_discovery_grant(docs, &Grant::in_fleet(fleet));
    assert_eq!(
        rules(role),
        vec![
            (vec![""], vec!["pods"], READ.to_vec()),
            (
                vec!["nvidia.com"],
                vec!["dynamoworkermetadatas"],
                READ.to_vec()
            ),
            (
                vec!["discovery.k8s.io"],
                vec!["endpointslices"],
                READ.to_vec()
            ),
        ]
    );
    // DNS, the frontends, and the workers' publishers on the unprivileged range, to the
    // operator's worker Pods only.
    let udp = egress(docs, "UDP");
    assert!(udp.iter().any(|e| e.port == 53), "{udp:?}");
    let tcp = egress(docs, "TCP");
    assert!(tcp.iter().any(|e| e.port == 53), "{tcp:?}");
    assert!(
        tcp.iter().any(|e| e.port == 8000
            && e.to["nvidia.com/dynamo-component-type"].as_str() == Some("frontend")),
        "{tcp:?}"
    );
    let worker =
        |e: &Egress| e.to["nvidia.com/dynamo-discovery-backend"].as_str() == Some("kubernetes");
    assert!(
        tcp.iter()
            .any(|e| e.port == 1024 && e.end_port == Some(65535) && worker(e)),
        "{tcp:?}"
    );
    // No port range reaches anything but the worker Pods.
    let ranges: Vec<_> = tcp.iter().filter(|e| e.end_port.is_some()).collect();
    assert!(ranges.iter().all(|e| worker(e)), "{ranges:?}");
    // The shipped config reads the metadata of that namespace and names no model (this source
    // ignores `model` / `models` with a warning): it validates without any warning.
    let (yaml, report) = validate_shipped_config(docs);
    assert!(!report.contains("warning"), "{report}");
    let config: Value = serde_yaml_ng::from_str(&yaml).unwrap();
    let discovery = &config["dynamo"]["discovery"];
    assert_eq!(discovery["source"].as_str(), Some("kubernetes"), "{yaml}");
    let kube = &discovery["kubernetes"];
    assert_eq!(kube["namespace"].as_str(), Some(fleet), "{yaml}");
    assert!(kube["dynamo_namespace"].is_string(), "{yaml}");
    assert!(kube["watch_reconnect_backoff"].is_mapping(), "{yaml}");
    assert!(
        kube.get("model").is_none() && kube.get("models").is_none(),
        "{yaml}"
    );
}
