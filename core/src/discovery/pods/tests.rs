//! The `kubernetes_pods` rules one by one (DISC-K8S-POD-03..12, -20, Q-43), on Pod objects
//! shaped like the Dynamo operator's.

use serde_json::{Value, json};

use super::*;
use crate::config::dynamo::KubeModel;

/// A worker Pod as the operator labels it, Running and Ready.
fn pod(name: &str, ns: &str, ctype: &str, sub: Option<&str>, component: Option<&str>) -> Value {
    let mut labels = json!({
        keys::DISCOVERY_BACKEND: "kubernetes",
        keys::DISCOVERY_ENABLED: "true",
        keys::DYNAMO_NAMESPACE: ns,
        keys::COMPONENT_TYPE: ctype,
    });
    if let Some(s) = sub {
        labels[keys::SUB_COMPONENT_TYPE] = s.into();
    }
    if let Some(c) = component {
        labels[keys::COMPONENT] = c.into();
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "dynamo", "labels": labels,
                      "uid": "0b6c1c5e-1", "resourceVersion": "1" },
        "status": { "phase": "Running",
                    "conditions": [ { "type": "Initialized", "status": "True" },
                                    { "type": "Ready", "status": "True" } ] }
    })
}

fn facts(v: &Value) -> PodFacts {
    pod_facts(v).unwrap()
}

fn cfg(model: Option<&str>, models: &[(&str, &str, Option<&str>)]) -> KubernetesConfig {
    KubernetesConfig {
        namespace: Some("dynamo".into()),
        dynamo_namespaces: vec!["ns-a".into(), "ns-b".into()],
        model: model.map(Into::into),
        models: models
            .iter()
            .map(|(c, m, ns)| KubeModel {
                component: (*c).into(),
                model: (*m).into(),
                dynamo_namespace: ns.map(Into::into),
            })
            .collect(),
        ..KubernetesConfig::default()
    }
}

#[test]
fn the_selector_names_the_discovery_labels_and_the_dynamo_namespaces() {
    let base =
        "nvidia.com/dynamo-discovery-backend=kubernetes,nvidia.com/dynamo-discovery-enabled=true";
    assert_eq!(
        label_selector(&["solar".into()]),
        format!("{base},nvidia.com/dynamo-namespace=solar")
    );
    assert_eq!(
        label_selector(&["a".into(), "b".into()]),
        format!("{base},nvidia.com/dynamo-namespace in (a,b)")
    );
    assert_eq!(label_selector(&[]), base);
}

#[test]
fn roles_follow_the_component_type_then_the_sub_type() {
    for (ctype, sub, want) in [
        (Some("prefill"), None, Some(Role::Prefill)),
        (Some("decode"), Some("prefill"), Some(Role::Decode)),
        (Some("worker"), Some("prefill"), Some(Role::Prefill)),
        (Some("worker"), Some("decode"), Some(Role::Decode)),
        (Some("worker"), None, Some(Role::Aggregated)),
        (Some("worker"), Some("main"), Some(Role::Aggregated)),
        (Some("frontend"), None, None),
        (Some("planner"), None, None),
        (Some("epp"), None, None),
        (Some("default"), None, None),
        (Some("Worker"), None, None),
        (None, Some("decode"), None),
    ] {
        assert_eq!(pod_role(ctype, sub), want, "{ctype:?} / {sub:?}");
    }
}

#[test]
fn only_running_ready_pods_not_being_deleted_are_workers() {
    let c = cfg(Some("m"), &[]);
    let ready = pod("w-0", "ns-a", "worker", None, None);
    assert!(matches!(
        classify(&facts(&ready), &c),
        PodVerdict::Worker { .. }
    ));
    let mut pending = ready.clone();
    pending["status"]["phase"] = "Pending".into();
    let mut unready = ready.clone();
    unready["status"]["conditions"][1]["status"] = "False".into();
    let mut no_conditions = ready.clone();
    no_conditions["status"]["conditions"] = json!([]);
    let mut deleting = ready.clone();
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:00Z".into();
    let mut no_status = ready.clone();
    no_status.as_object_mut().unwrap().remove("status");
    for (what, p) in [
        ("pending", pending),
        ("unready", unready),
        ("no conditions", no_conditions),
        ("deleting", deleting),
        ("no status", no_status),
    ] {
        assert_eq!(classify(&facts(&p), &c), PodVerdict::NotReady, "{what}");
    }
}

#[test]
fn a_worker_gets_its_role_namespace_and_model() {
    let c = cfg(Some("solar-pro4"), &[]);
    let p = facts(&pod(
        "w-1",
        "ns-b",
        "worker",
        Some("decode"),
        Some("VllmWorker"),
    ));
    assert_eq!(
        classify(&p, &c),
        PodVerdict::Worker {
            namespace: "ns-b".into(),
            role: Role::Decode,
            model: "solar-pro4".into(),
            component: "VllmWorker".into(),
        }
    );
    // Not a worker type, another Dynamo namespace, no namespace label at all.
    assert_eq!(
        classify(&facts(&pod("fe", "ns-a", "frontend", None, None)), &c),
        PodVerdict::NotAWorker
    );
    assert_eq!(
        classify(&facts(&pod("w", "ns-z", "worker", None, None)), &c),
        PodVerdict::ForeignNamespace
    );
    let mut unlabelled = pod("w", "ns-a", "worker", None, None);
    unlabelled["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove(keys::DYNAMO_NAMESPACE);
    assert_eq!(
        classify(&facts(&unlabelled), &c),
        PodVerdict::ForeignNamespace
    );
}

#[test]
fn per_component_models_match_exactly_and_unmatched_pods_are_held_unpublished() {
    let c = cfg(
        None,
        &[
            ("VllmWorker-decodeheavy", "solar-pro4", None),
            (
                "VllmWorker-prefillheavy",
                "solar-pro4-longcontext",
                Some("ns-a"),
            ),
        ],
    );
    let model_of = |component: Option<&str>, ns: &str| match classify(
        &facts(&pod("w", ns, "worker", None, component)),
        &c,
    ) {
        PodVerdict::Worker { model, .. } => Some(model),
        PodVerdict::Unmapped => None,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        model_of(Some("VllmWorker-decodeheavy"), "ns-a").as_deref(),
        Some("solar-pro4")
    );
    assert_eq!(
        model_of(Some("VllmWorker-prefillheavy"), "ns-a").as_deref(),
        Some("solar-pro4-longcontext")
    );
    // The entry names ns-a only; case matters; a Pod without the label maps to nothing.
    assert_eq!(model_of(Some("VllmWorker-prefillheavy"), "ns-b"), None);
    assert_eq!(model_of(Some("vllmworker-decodeheavy"), "ns-a"), None);
    assert_eq!(model_of(None, "ns-a"), None);
    let mut t = PodTable::default();
    t.upsert(
        facts(&pod("odd", "ns-a", "worker", None, Some("Other"))),
        UnixMillis(1),
    );
    let w = t.workers(&c);
    assert!(w.workers.is_empty());
    assert_eq!(w.unmapped, vec!["odd".to_owned()]);
}

#[test]
fn container_discovery_mode_is_refused() {
    let mut p = pod("w-c", "ns-a", "worker", None, None);
    p["metadata"]["annotations"] = json!({ keys::DISCOVERY_MODE: "container" });
    let c = cfg(Some("m"), &[]);
    assert_eq!(classify(&facts(&p), &c), PodVerdict::ContainerMode);
    let mut t = PodTable::default();
    t.upsert(facts(&p), UnixMillis(1));
    assert_eq!(t.workers(&c).container_mode, vec!["w-c".to_owned()]);
    // Pod mode (the default) is fine.
    p["metadata"]["annotations"] = json!({ keys::DISCOVERY_MODE: "pod" });
    assert!(matches!(
        classify(&facts(&p), &c),
        PodVerdict::Worker { .. }
    ));
}

#[test]
fn malformed_pod_objects_are_refused_with_a_reason() {
    assert_eq!(pod_facts(&json!([])), Err(PodError::NotAPod));
    assert_eq!(pod_facts(&json!({ "metadata": 3 })), Err(PodError::NotAPod));
    assert_eq!(pod_facts(&json!({ "metadata": {} })), Err(PodError::NoName));
    assert_eq!(
        pod_facts(&json!({ "metadata": { "name": "" } })),
        Err(PodError::NoName)
    );
    assert_eq!(
        pod_facts(&json!({ "metadata": { "name": "x".repeat(MAX_NAME + 1) } })),
        Err(PodError::NameTooLong)
    );
    let mut long_label = pod("w", "ns-a", "worker", None, None);
    long_label["metadata"]["labels"][keys::COMPONENT] = "c".repeat(MAX_LABEL_VALUE + 1).into();
    assert_eq!(
        pod_facts(&long_label),
        Err(PodError::BadLabel(keys::COMPONENT))
    );
    let mut number = pod("w", "ns-a", "worker", None, None);
    number["metadata"]["labels"][keys::COMPONENT_TYPE] = 7.into();
    assert_eq!(
        pod_facts(&number),
        Err(PodError::BadLabel(keys::COMPONENT_TYPE))
    );
    let mut annotation = pod("w", "ns-a", "worker", None, None);
    annotation["metadata"]["annotations"] = json!({ keys::DISCOVERY_MODE: ["container"] });
    assert_eq!(
        pod_facts(&annotation),
        Err(PodError::BadLabel(keys::DISCOVERY_MODE))
    );
    // The longest allowed values are kept.
    let mut longest = pod(&"n".repeat(MAX_NAME), "ns-a", "worker", None, None);
    longest["metadata"]["labels"][keys::COMPONENT] = "c".repeat(MAX_LABEL_VALUE).into();
    assert!(pod_facts(&longest).is_ok());
}

#[test]
fn workers_carry_dynamos_id_of_the_pod_name_and_no_capacity() {
    let c = cfg(Some("m"), &[]);
    let mut t = PodTable::default();
    assert_eq!(
        t.upsert(
            facts(&pod("worker-0", "ns-a", "prefill", None, None)),
            UnixMillis(5)
        ),
        PodChange::Held
    );
    let w = t.workers(&c);
    assert_eq!(w.workers.len(), 1);
    let worker = &w.workers[0];
    assert_eq!(worker.instance_id.get(), 1_186_445_869_714_687);
    assert_eq!(worker.instance_id.to_string(), "1186445869714687");
    assert_eq!(
        worker.instance_id.hex(),
        format!("{:x}", 1_186_445_869_714_687u64)
    );
    assert_eq!(
        (worker.role, worker.endpoint.as_str()),
        (Role::Prefill, "generate")
    );
    assert_eq!(worker.capacity, Capacity::default());
    assert_eq!(
        (worker.dp_start_rank, worker.dp_size, worker.block_size),
        (None, None, None)
    );
    assert!(worker.request_transport().is_none() && worker.card.is_none());
}

#[test]
fn two_names_with_one_id_are_both_left_out() {
    let c = cfg(Some("m"), &[]);
    let mut t = PodTable::default();
    for name in ["a-0", "a-1", "b-0"] {
        t.upsert(
            facts(&pod(name, "ns-a", "worker", None, None)),
            UnixMillis(1),
        );
    }
    // Force a collision between the two `a-` Pods.
    let w = t.workers_by(&c, |name| {
        InstanceId::new(if name.starts_with("a-") { 7 } else { 8 })
    });
    assert_eq!(w.duplicates, vec!["a-0".to_owned(), "a-1".to_owned()]);
    assert_eq!(w.workers.len(), 1);
    assert_eq!(w.workers[0].instance_id, InstanceId::new(8));
    // Only workers collide: an unready Pod with the same id takes nothing away.
    let mut t = PodTable::default();
    t.upsert(
        facts(&pod("a-0", "ns-a", "worker", None, None)),
        UnixMillis(1),
    );
    let mut unready = pod("a-1", "ns-a", "worker", None, None);
    unready["status"]["phase"] = "Failed".into();
    t.upsert(facts(&unready), UnixMillis(1));
    let w = t.workers_by(&c, |_| InstanceId::new(7));
    assert!(w.duplicates.is_empty());
    assert_eq!(w.workers.len(), 1);
}

#[test]
fn the_table_holds_at_most_max_pods_and_keeps_serving() {
    let c = cfg(Some("m"), &[]);
    let listed: Vec<PodFacts> = (0..=MAX_PODS)
        .map(|i| facts(&pod(&format!("w-{i:05}"), "ns-a", "worker", None, None)))
        .collect();
    let mut t = PodTable::default();
    t.replace_all(listed, UnixMillis(1));
    assert_eq!((t.len(), t.over_cap()), (MAX_PODS, 1));
    // The first ones by name are held: the last name is the one refused.
    assert_eq!(t.remove(&format!("w-{MAX_PODS:05}")), PodChange::Unchanged);
    let extra = facts(&pod("zz", "ns-a", "worker", None, None));
    assert_eq!(t.upsert(extra.clone(), UnixMillis(2)), PodChange::OverCap);
    assert_eq!(t.over_cap(), 2);
    assert_eq!(t.workers(&c).workers.len(), MAX_PODS);
    // Room again after a removal.
    assert_eq!(t.remove("w-00000"), PodChange::Removed);
    assert_eq!(t.upsert(extra, UnixMillis(3)), PodChange::Held);
}

#[test]
fn a_full_list_replaces_the_table_and_keeps_first_seen() {
    let c = cfg(Some("m"), &[]);
    let mut t = PodTable::default();
    t.upsert(
        facts(&pod("stays", "ns-a", "worker", None, None)),
        UnixMillis(10),
    );
    t.upsert(
        facts(&pod("changes", "ns-a", "worker", None, None)),
        UnixMillis(10),
    );
    t.upsert(
        facts(&pod("vanishes", "ns-a", "worker", None, None)),
        UnixMillis(10),
    );
    assert_eq!(
        t.upsert(
            facts(&pod("stays", "ns-a", "worker", None, None)),
            UnixMillis(11)
        ),
        PodChange::Unchanged
    );
    t.replace_all(
        vec![
            facts(&pod("stays", "ns-a", "worker", None, None)),
            facts(&pod("changes", "ns-a", "worker", Some("decode"), None)),
            facts(&pod("new", "ns-a", "worker", None, None)),
        ],
        UnixMillis(20),
    );
    let w = t.workers(&c);
    let by = |n: &str| {
        w.workers
            .iter()
            .find(|x| x.instance_id == hash_pod_name(n))
            .map(|x| (x.first_seen, x.last_updated, x.role))
    };
    assert_eq!(
        by("stays"),
        Some((UnixMillis(10), UnixMillis(10), Role::Aggregated))
    );
    assert_eq!(
        by("changes"),
        Some((UnixMillis(10), UnixMillis(20), Role::Decode))
    );
    assert_eq!(
        by("new"),
        Some((UnixMillis(20), UnixMillis(20), Role::Aggregated))
    );
    assert_eq!(by("vanishes"), None);
    assert_eq!((t.len(), t.over_cap()), (3, 0));
}
