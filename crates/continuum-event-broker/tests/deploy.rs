//! The broker's Kubernetes manifests (`deploy/kubernetes/event-broker`, FLEET-07) as the real
//! `kubectl kustomize` renders them: read-only RBAC on exactly the two resources its discovery
//! reads, the token as a mounted Secret file (never an argument or environment variable), the
//! egress it needs, and a shipped config the binary's `config validate` accepts.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use serde_yaml_ng::Value;

const DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/kubernetes/event-broker"
);
const BIN: &str = env!("CARGO_BIN_EXE_continuum-event-broker");

fn render() -> Vec<Value> {
    let out = Command::new("kubectl")
        .args(["kustomize", DIR])
        .output()
        .expect("kubectl (tests/run.sh installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .split("\n---\n")
        .map(|d| serde_yaml_ng::from_str(d).unwrap())
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect()
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_sequence()
        .map(|s| s.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

#[test]
fn the_manifests_grant_read_only_metadata_and_mount_the_token_as_a_file() {
    let docs = render();
    assert!(
        of_kind(&docs, "ClusterRole").is_empty() && of_kind(&docs, "ClusterRoleBinding").is_empty()
    );
    let role = of_kind(&docs, "Role")[0];
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
            (
                vec!["nvidia.com"],
                vec!["dynamoworkermetadatas"],
                read.clone()
            ),
            (vec!["discovery.k8s.io"], vec!["endpointslices"], read),
        ]
    );
    let ns = role["metadata"]["namespace"].as_str().unwrap();
    let binding = of_kind(&docs, "RoleBinding")[0];
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(
        binding["subjects"][0]["name"].as_str(),
        Some("continuum-event-broker")
    );
    assert_eq!(binding["subjects"][0]["namespace"].as_str(), Some(ns));

    let pod = &of_kind(&docs, "Deployment")[0]["spec"]["template"]["spec"];
    assert_eq!(
        pod["serviceAccountName"].as_str(),
        Some("continuum-event-broker")
    );
    let container = &pod["containers"][0];
    let args = strs(&container["args"]).join(" ");
    assert!(
        !args.contains("token"),
        "no token on the command line: {args}"
    );
    assert!(
        container.get("env").is_none(),
        "no token in the environment"
    );
    assert_eq!(
        container["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );
    let token_volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["secret"]["secretName"].as_str() == Some("continuum-event-broker-token"))
        .expect("the token Secret is a volume");
    let mount = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["name"] == token_volume["name"])
        .unwrap();
    let token_path = format!("{}/token", mount["mountPath"].as_str().unwrap());

    // Egress: the API server, DNS, the router's bus, the workers.
    let np = of_kind(&docs, "NetworkPolicy")[0];
    let ports: Vec<i64> = np["spec"]["egress"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|r| r["ports"].as_sequence().cloned().unwrap_or_default())
        .filter_map(|p| p["port"].as_i64())
        .collect();
    for p in [443, 6443, 53, 7443, 1024] {
        assert!(ports.contains(&p), "{p} missing from {ports:?}");
    }

    // The shipped config: it reads the token from where the Secret is mounted, watches the
    // fleet namespace, and validates (with a token file standing in for the Secret).
    let cm = of_kind(&docs, "ConfigMap")
        .into_iter()
        .find(|c| c["metadata"]["name"].as_str() == Some("continuum-event-broker-config"))
        .unwrap();
    let yaml = cm["data"]["broker.yaml"].as_str().unwrap();
    let config: Value = serde_yaml_ng::from_str(yaml).unwrap();
    assert_eq!(
        config["router"]["token_file"].as_str(),
        Some(token_path.as_str())
    );
    assert_eq!(
        config["discovery"]["kubernetes"]["namespace"].as_str(),
        Some(ns)
    );
    let dir = std::env::temp_dir().join(format!("broker-deploy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, "a-token").unwrap();
    let file = dir.join("broker.yaml");
    std::fs::write(&file, yaml.replace(&token_path, &token.to_string_lossy())).unwrap();
    let out = Command::new(BIN)
        .args(["config", "validate", "--config"])
        .arg(&file)
        .env_remove("CONTINUUM_BROKER_TOKEN")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
