//! The Helm chart (`deploy/helm/continuum-router/`) as the real `helm template` renders it, and
//! `helm lint --strict`: with the default values it renders the Kustomize base (no grant, no
//! token); `dynamoPodDiscovery.enabled` adds a Role granting only get, list and watch on Pods in
//! `dynamoPodDiscovery.namespace`, bound to the router's own ServiceAccount, the token mount and
//! an egress policy to `dynamoPodDiscovery.apiServerPorts` (DISC-K8S-POD-21, -22);
//! `dynamoPodDiscovery.metadata` adds DynamoWorkerMetadata and EndpointSlices and egress to the
//! workers' publishers (DISC-K8S-META-24). The router config each mode ships passes the router's
//! own `config validate`, and each mode renders the same objects, rules, token mount, egress and
//! router config as the corresponding `kubectl kustomize` rendering of `deploy/kubernetes/`.
//!
//! helm: `$CONTINUUM_HELM`, else what `deploy/helm/install-helm.sh --print` names (tests/run.sh
//! installs it).
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::kube::kubectl_bin;
use common::{TempDir, run_cli, wait_bounded};
use serde_yaml_ng::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/helm/continuum-router");
const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/helm/examples");
const KUSTOMIZE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/kubernetes");
/// The release name that gives the chart's objects the names of `deploy/kubernetes/`.
const RELEASE: &str = "continuum-router";
/// The fleet namespace of the Kustomize overlays and of the example values.
const FLEET: &str = "dynamo";

/// What a bounded run of a command gave: success, stdout, stderr.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs `bin args` (at most 60 s; killed after that).
fn run(bin: &str, args: &[&str]) -> Run {
    let tmp = TempDir::new("deploy-helm");
    let out = tmp.path().join("out");
    let err = tmp.path().join("err");
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {bin}: {e}"));
    let status = wait_bounded(&mut child, Duration::from_secs(60))
        .unwrap_or_else(|| panic!("`{bin} {}` did not exit within 60 s", args.join(" ")));
    Run {
        ok: status.success(),
        stdout: std::fs::read_to_string(&out).unwrap(),
        stderr: std::fs::read_to_string(&err).unwrap_or_default(),
    }
}

/// The helm executable: `$CONTINUUM_HELM`, else the install script's `--print`.
fn helm_bin() -> String {
    if let Ok(h) = std::env::var("CONTINUUM_HELM") {
        return h;
    }
    let script = format!("{ROOT}/deploy/helm/install-helm.sh");
    let r = run(&script, &["--print"]);
    assert!(r.ok, "{script} --print: {}", r.stderr);
    let helm = r.stdout.trim().to_owned();
    assert!(
        std::path::Path::new(&helm).is_file(),
        "no helm at {helm}: run deploy/helm/install-helm.sh (tests/run.sh does) or set CONTINUUM_HELM"
    );
    helm
}

/// The YAML documents of a multi-document stream (`---` lines between them), comments-only and
/// empty ones left out.
fn documents(text: &str) -> Vec<Value> {
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

/// `--values` arguments for the example values files named.
fn values_args(values: &[&str]) -> Vec<String> {
    values
        .iter()
        .flat_map(|v| ["--values".to_owned(), format!("{EXAMPLES}/{v}")])
        .collect()
}

/// `helm template <release> <chart> --namespace <ns> [--values ..] [--set ..]`: the outcome.
fn try_template(release: &str, namespace: &str, values: &[&str], sets: &[&str]) -> Run {
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
    assert!(r.ok, "helm template {values:?} {sets:?}: {}", r.stderr);
    assert!(
        !r.stderr.to_lowercase().contains("warning"),
        "helm template {values:?} {sets:?}: {}",
        r.stderr
    );
    documents(&r.stdout)
}

/// The documents `kubectl kustomize deploy/kubernetes/<dir>` renders.
fn kustomize(dir: &str) -> Vec<Value> {
    let r = run(
        &kubectl_bin(),
        &["kustomize", &format!("{KUSTOMIZE}/{dir}")],
    );
    assert!(r.ok, "kubectl kustomize {dir}: {}", r.stderr);
    documents(&r.stdout)
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect()
}

/// The one object of `kind` in `docs`.
fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let all = of_kind(docs, kind);
    assert_eq!(all.len(), 1, "{kind}: {all:?}");
    all[0]
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_sequence()
        .map(|s| s.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The router config a rendering ships, checked by `continuum-router config validate`, and what
/// the validator printed (its warnings).
fn validate_shipped_config(docs: &[Value]) -> (String, String) {
    let yaml = one(docs, "ConfigMap")["data"]["router.yaml"]
        .as_str()
        .expect("router.yaml")
        .to_owned();
    let dir = TempDir::new("helm-shipped-config");
    let path = dir.write("router.yaml", &yaml);
    let out = run_cli(&["config", "validate", "--config", &path.to_string_lossy()]);
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    (yaml, out.stdout + &out.stderr)
}

/// The Pod spec of the one Deployment.
fn pod_spec(docs: &[Value]) -> &Value {
    &one(docs, "Deployment")["spec"]["template"]["spec"]
}

/// `sub`'s entries are all in `map` (label selectors against labels).
fn is_submap(sub: &Value, map: &Value) -> bool {
    let (Some(sub), Some(map)) = (sub.as_mapping(), map.as_mapping()) else {
        return false;
    };
    !sub.is_empty() && sub.iter().all(|(k, v)| map.get(k) == Some(v))
}

/// Every egress port of `protocol` as (pod selector labels, namespace selector labels, port,
/// endPort).
fn egress(docs: &[Value], protocol: &str) -> Vec<(Value, Value, i64, Option<i64>)> {
    let np = one(docs, "NetworkPolicy");
    np["spec"]["egress"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|r| {
            let to = r["to"][0]["podSelector"]["matchLabels"].clone();
            let ns = r["to"][0]["namespaceSelector"]["matchLabels"].clone();
            r["ports"]
                .as_sequence()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|p| p["protocol"].as_str() == Some(protocol))
                .filter_map(move |p| {
                    Some((
                        to.clone(),
                        ns.clone(),
                        p["port"].as_i64()?,
                        p["endPort"].as_i64(),
                    ))
                })
        })
        .collect()
}

type Rule<'a> = (Vec<&'a str>, Vec<&'a str>, Vec<&'a str>);

/// The Role's rules as (apiGroups, resources, verbs).
fn rules(role: &Value) -> Vec<Rule<'_>> {
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

/// What both discovery modes share: no cluster-wide grant; the Role in `fleet`, bound to the
/// router's own ServiceAccount (in `release_ns`), which mounts the token; the Deployment mounts
/// it too; egress to the API server on exactly `api_ports`. Returns the Role.
fn check_binding_token_and_egress<'a>(
    docs: &'a [Value],
    fleet: &str,
    release_ns: &str,
    api_ports: &[i64],
) -> &'a Value {
    assert!(
        of_kind(docs, "ClusterRole").is_empty() && of_kind(docs, "ClusterRoleBinding").is_empty()
    );
    let role = one(docs, "Role");
    assert_eq!(role["metadata"]["namespace"].as_str(), Some(fleet));
    // Every verb of every rule is a read.
    for (_, _, verbs) in rules(role) {
        assert!(
            !verbs.is_empty() && verbs.iter().all(|v| ["get", "list", "watch"].contains(v)),
            "{verbs:?}"
        );
    }
    let binding = one(docs, "RoleBinding");
    assert_eq!(binding["metadata"]["namespace"].as_str(), Some(fleet));
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["roleRef"]["kind"].as_str(), Some("Role"));
    let sa = one(docs, "ServiceAccount");
    assert_eq!(sa["metadata"]["namespace"].as_str(), Some(release_ns));
    let subjects = binding["subjects"].as_sequence().unwrap();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0]["kind"].as_str(), Some("ServiceAccount"));
    assert_eq!(subjects[0]["name"], sa["metadata"]["name"]);
    assert_ne!(subjects[0]["name"].as_str(), Some("default"));
    assert_eq!(subjects[0]["namespace"].as_str(), Some(release_ns));
    assert_eq!(sa["automountServiceAccountToken"].as_bool(), Some(true));
    let pod = pod_spec(docs);
    assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(true));
    assert_eq!(pod["serviceAccountName"], sa["metadata"]["name"]);
    // The egress policy selects the router's Pods, and reaches the API server on the ports named.
    let np = one(docs, "NetworkPolicy");
    assert_eq!(np["metadata"]["namespace"].as_str(), Some(release_ns));
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
        .filter(|(to, _, p, _)| to.is_null() && *p != 53)
        .map(|(_, _, p, _)| p)
        .collect();
    assert_eq!(api, api_ports);
    role
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
        assert!(r.ok, "helm lint {values:?}: {report}");
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
    let kinds: BTreeSet<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["ConfigMap", "Deployment", "Service", "ServiceAccount"])
    );
    let sa = one(&docs, "ServiceAccount");
    assert_eq!(sa["automountServiceAccountToken"].as_bool(), Some(false));
    let dep = one(&docs, "Deployment");
    let pod = pod_spec(&docs);
    assert_eq!(pod["serviceAccountName"], sa["metadata"]["name"]);
    assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(false));
    // The Service and the Deployment select the same Pods, which carry those labels.
    let selector = &dep["spec"]["selector"]["matchLabels"];
    assert_eq!(one(&docs, "Service")["spec"]["selector"], *selector);
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
        one(&docs, "ConfigMap")["metadata"]["name"]
    );
    assert_eq!(
        c["volumeMounts"][0]["mountPath"].as_str(),
        Some("/etc/continuum")
    );
    // The default config is the base's, to the byte, and it validates.
    let (yaml, _) = validate_shipped_config(&docs);
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
    let role = check_binding_token_and_egress(&docs, FLEET, FLEET, &[443, 6443]);
    assert_eq!(
        role["metadata"]["name"].as_str(),
        Some("continuum-router-dynamo-pod-reader")
    );
    assert_eq!(
        rules(role),
        vec![(vec![""], vec!["pods"], vec!["get", "list", "watch"])]
    );
    // No port range: Pods carry no publishers.
    assert!(
        egress(&docs, "TCP").iter().all(|(.., end)| end.is_none()),
        "{docs:?}"
    );
    // The shipped config reads the Pods of that namespace.
    let (yaml, _) = validate_shipped_config(&docs);
    let config: Value = serde_yaml_ng::from_str(&yaml).unwrap();
    let discovery = &config["dynamo"]["discovery"];
    assert_eq!(discovery["source"].as_str(), Some("kubernetes_pods"));
    assert_eq!(
        discovery["kubernetes"]["namespace"].as_str(),
        Some(FLEET),
        "{yaml}"
    );
}

#[cfg(feature = "dynamo")]
#[test]
fn metadata_discovery_grants_only_read_verbs_on_its_three_resources() {
    let docs = template(RELEASE, FLEET, &["dynamo-metadata-discovery.yaml"], &[]);
    let role = check_binding_token_and_egress(&docs, FLEET, FLEET, &[443, 6443]);
    let read = vec!["get", "list", "watch"];
    assert_eq!(
        rules(role),
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
    // DNS, the frontends, and the workers' publishers on the unprivileged range, to the
    // operator's worker Pods only.
    let udp = egress(&docs, "UDP");
    assert!(udp.iter().any(|(_, _, p, _)| *p == 53), "{udp:?}");
    let tcp = egress(&docs, "TCP");
    assert!(tcp.iter().any(|(_, _, p, _)| *p == 53), "{tcp:?}");
    assert!(
        tcp.iter().any(|(to, _, p, _)| *p == 8000
            && to["nvidia.com/dynamo-component-type"].as_str() == Some("frontend")),
        "{tcp:?}"
    );
    assert!(
        tcp.iter().any(|(to, _, p, end)| *p == 1024
            && *end == Some(65535)
            && to["nvidia.com/dynamo-discovery-backend"].as_str() == Some("kubernetes")),
        "{tcp:?}"
    );
    let ranges: Vec<_> = tcp.iter().filter(|(.., end)| end.is_some()).collect();
    assert!(
        ranges.iter().all(
            |(to, ..)| to["nvidia.com/dynamo-discovery-backend"].as_str() == Some("kubernetes")
        ),
        "{ranges:?}"
    );
    // The shipped config reads the metadata of that namespace, names no model, and validates
    // without any warning.
    let (yaml, report) = validate_shipped_config(&docs);
    assert!(!report.contains("warning"), "{report}");
    let config: Value = serde_yaml_ng::from_str(&yaml).unwrap();
    let discovery = &config["dynamo"]["discovery"];
    assert_eq!(discovery["source"].as_str(), Some("kubernetes"), "{yaml}");
    let kube = &discovery["kubernetes"];
    assert_eq!(kube["namespace"].as_str(), Some(FLEET), "{yaml}");
    assert!(
        kube.get("model").is_none() && kube.get("models").is_none(),
        "{yaml}"
    );
}

/// The values alone, without the example files: the Role and RoleBinding go in
/// `dynamoPodDiscovery.namespace` while the router, its ServiceAccount and its egress policy stay
/// in the release namespace (the binding names the account there, the egress rules look for the
/// frontends and workers in the fleet namespace); `apiServerPorts` sets the API server's egress.
#[test]
fn the_values_place_the_grant_in_the_fleet_namespace_and_set_the_api_server_ports() {
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
    let role = check_binding_token_and_egress(&docs, "fleet-a", "routers", &[443, 8443]);
    assert_eq!(
        role["metadata"]["name"].as_str(),
        Some("edge-continuum-router-dynamo-pod-reader")
    );
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
        .filter(|(to, ..)| !to.is_null())
        .collect();
    assert_eq!(to_pods.len(), 2, "{to_pods:?}");
    for (_, ns, ..) in &to_pods {
        assert_eq!(
            ns["kubernetes.io/metadata.name"].as_str(),
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
    check_binding_token_and_egress(&pods_only, "fleet-a", "routers", &[443, 6443]);
    assert_eq!(rules(one(&pods_only, "Role")).len(), 1);
    assert!(
        egress(&pods_only, "TCP")
            .iter()
            .all(|(.., end)| end.is_none())
    );
}

#[test]
fn values_the_chart_cannot_honour_are_refused() {
    // `metadata` without `enabled` would grant nothing the config needs.
    let r = try_template(RELEASE, FLEET, &[], &["dynamoPodDiscovery.metadata=true"]);
    assert!(!r.ok, "{}", r.stdout);
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
        assert!(!r.ok, "{set}: {}", r.stdout);
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
