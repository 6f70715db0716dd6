//! One test per rule CFG-15..CFG-29 of the `dynamo` section (each checks the violation's field
//! path and that the valid neighbour passes).

use std::net::IpAddr;
use std::time::Duration;

use super::tests_basic::ok;
use super::tests_cfg_a::{clean, etcd, kube, rejects, warns, with};

const SVC: &str = "endpoints: [\"http://etcd.dynamo.svc:2379\"]";

/// An enabled etcd config with the given `load` and `shim` bodies.
fn dyn_cfg(load: &str, shim: &str) -> String {
    with(&format!(
        "dynamo: {{ enabled: true, discovery: {{ etcd: {{ {SVC}, namespaces: [a, b] }} }}, \
         load: {{ {load} }}, shim: {{ {shim} }} }}"
    ))
}

const POOLS: &str =
    "pools: [ { namespace: a, backends: [fe-a] }, { namespace: b, backends: [fe-b] } ]";
const CIDRS: &str = "direct_allow_cidrs: [10.0.0.0/8]";

#[test]
fn cfg_15_max_staleness_range() {
    for bad in ["99ms", "5m1s", "301s", "1h"] {
        let bad = if bad == "5m1s" { "301000ms" } else { bad };
        rejects(
            &dyn_cfg(&format!("{CIDRS}, max_staleness: {bad}"), POOLS),
            "dynamo.load.max_staleness",
        );
    }
    let c = clean(&dyn_cfg(&format!("{CIDRS}, max_staleness: 100ms"), POOLS));
    assert_eq!(c.dynamo.load.max_staleness, Duration::from_millis(100));
    clean(&dyn_cfg(&format!("{CIDRS}, max_staleness: 5m"), POOLS));
}

#[test]
fn cfg_16_shim_backends_must_be_configured_unique_and_bounded() {
    rejects(
        &etcd(SVC).replace("backends: [fe-a]", "backends: [nope]"),
        "dynamo.shim.backends[0]",
    );
    rejects(
        &etcd(SVC).replace("backends: [fe-a]", "backends: [fe-a, fe-a]"),
        "dynamo.shim.backends[1]",
    );
    let many: Vec<String> = (0..65).map(|i| format!("b{i}")).collect();
    rejects(
        &etcd(SVC).replace(
            "backends: [fe-a]",
            &format!("backends: [{}]", many.join(", ")),
        ),
        "dynamo.shim.backends",
    );
    clean(&etcd(SVC).replace("backends: [fe-a]", "backends: [fe-a, fe-b]"));
}

#[test]
fn cfg_17_model_map_pairs() {
    let mk = |map: &str| dyn_cfg(CIDRS, &format!("{POOLS}, model_map: {map}"));
    rejects(
        &mk("{ qwen3-32b: \"\" }"),
        "dynamo.shim.model_map.qwen3-32b",
    );
    rejects(
        &mk("{ \"\": \"Qwen/Qwen3-32B\" }"),
        "dynamo.shim.model_map.\"\"",
    );
    let big: Vec<String> = (0..1025).map(|i| format!("m{i}: d{i}")).collect();
    rejects(
        &mk(&format!("{{ {} }}", big.join(", "))),
        "dynamo.shim.model_map",
    );
    let c = clean(&mk("{ qwen3-32b: \"Qwen/Qwen3-32B\" }"));
    assert_eq!(c.dynamo.shim.model_map["qwen3-32b"], "Qwen/Qwen3-32B");
}

#[test]
fn cfg_18_shim_pool_warnings() {
    // Pools while disaggregated_serving is off.
    let off = dyn_cfg(CIDRS, POOLS).replace("disaggregated_serving: { enabled: true }", "");
    warns(&off, "dynamo.shim.pools");
    // Pools while dynamo is off.
    let disabled =
        dyn_cfg(CIDRS, POOLS).replace("enabled: true, discovery", "enabled: false, discovery");
    warns(&disabled, "dynamo.shim.pools");
    // A pool holding an internal or a disabled backend.
    let pools = "pools: [ { namespace: a, backends: [fe-a, fe-int] }, { namespace: b, backends: [fe-off] } ]";
    let w = warns(&dyn_cfg(CIDRS, pools), "dynamo.shim.pools[0].backends[1]");
    assert!(
        w.iter()
            .any(|w| w.field == "dynamo.shim.pools[1].backends[0]"),
        "{w:#?}"
    );
    clean(&dyn_cfg(CIDRS, POOLS));
}

#[test]
fn cfg_19_allow_cidrs_v4_v6_at_most_64() {
    let c = clean(&dyn_cfg(
        "direct_allow_cidrs: [10.0.0.0/8, \"fd00::/8\", 192.168.1.0/24]",
        POOLS,
    ));
    assert_eq!(
        c.dynamo.load.direct_allow_cidrs.as_ref().map(Vec::len),
        Some(3)
    );
    rejects(
        &dyn_cfg("direct_allow_cidrs: [10.0.0.0/33]", POOLS),
        "dynamo.load.direct_allow_cidrs[0]",
    );
    rejects(
        &dyn_cfg("direct_allow_cidrs: [pod-network]", POOLS),
        "dynamo.load.direct_allow_cidrs[0]",
    );
    let many: Vec<String> = (0..65).map(|i| format!("10.{i}.0.0/16")).collect();
    rejects(
        &dyn_cfg(&format!("direct_allow_cidrs: [{}]", many.join(", ")), POOLS),
        "dynamo.load.direct_allow_cidrs",
    );
    clean(&dyn_cfg(
        &format!("direct_allow_cidrs: [{}]", many[..64].join(", ")),
        POOLS,
    ));
}

#[test]
fn cfg_20_allow_list_is_typed_for_checks_on_resolved_addresses() {
    // The connector checks resolved socket addresses against typed networks (no strings).
    let c = clean(&dyn_cfg(
        "direct_allow_cidrs: [10.0.0.0/8, \"fd00::/8\"]",
        POOLS,
    ));
    let nets = c.dynamo.load.direct_allow_cidrs.unwrap();
    let inside: IpAddr = "10.42.0.7".parse().unwrap();
    let inside6: IpAddr = "fd00::1".parse().unwrap();
    let outside: IpAddr = "203.0.113.9".parse().unwrap();
    assert!(nets.iter().any(|n| n.contains(&inside)));
    assert!(nets.iter().any(|n| n.contains(&inside6)));
    assert!(!nets.iter().any(|n| n.contains(&outside)));
}

#[test]
fn cfg_21_omitted_allow_list_suggests_pod_cidr() {
    let w = warns(
        &dyn_cfg("max_staleness: 3s", POOLS),
        "dynamo.load.direct_allow_cidrs",
    );
    assert!(w.iter().any(|w| w.message.contains("Pod CIDR")), "{w:#?}");
    let (c, _) = ok(&dyn_cfg("max_staleness: 3s", POOLS));
    assert!(
        c.dynamo.load.direct_allow_cidrs.is_none(),
        "legacy allow-all kept"
    );
    clean(&dyn_cfg(CIDRS, POOLS));
}

#[test]
fn cfg_22_external_looking_etcd_warns_in_direct_mode() {
    for ext in [
        "http://etcd.example.com:2379",
        "http://203.0.113.5:2379",
        "http://etcd:2379",
    ] {
        warns(
            &etcd(&format!("endpoints: [\"{ext}\"]")),
            "dynamo.discovery.etcd.endpoints[0]",
        );
    }
    for int in [
        "http://etcd.dynamo.svc:2379",
        "http://etcd.dynamo.svc.cluster.local:2379",
        "http://10.1.2.3:2379",
        "http://172.20.0.1:2379",
        "http://192.168.0.2:2379",
        "http://127.0.0.1:2379",
        "http://localhost:2379",
        "http://169.254.1.1:2379",
        "http://[fd12::1]:2379",
        "http://[fe80::1]:2379",
        "http://[::1]:2379",
    ] {
        clean(&etcd(&format!("endpoints: [\"{int}\"]")));
    }
    // Broker transport with the event bus neither warns about the endpoint nor about the
    // transport; without the bus it says that broker subscriptions stay pending (BROKER-12).
    let broker = etcd("endpoints: [\"http://etcd.example.com:2379\"]").replace(
        "load: { direct_allow_cidrs: [10.0.0.0/8] }",
        "load: { transport: broker }, event_bus: { enabled: true, listen: \"0.0.0.0:7443\", \
         tls: { cert: /c, key: /k }, brokers: [ { id: b1, token_hash: \"sha256:0000000000000000000000000000000000000000000000000000000000000000\", namespaces: [dynamo] } ] }",
    );
    let (_, w) = ok(&broker);
    assert!(
        !super::tests_basic::has_warning(&w, "dynamo.load.transport"),
        "{w:#?}"
    );
    assert!(
        !super::tests_basic::has_warning(&w, "dynamo.discovery.etcd.endpoints[0]"),
        "{w:#?}"
    );
    let no_bus = etcd("endpoints: [\"http://etcd.example.com:2379\"]").replace(
        "load: { direct_allow_cidrs: [10.0.0.0/8] }",
        "load: { transport: broker }",
    );
    let w = warns(&no_bus, "dynamo.load.transport");
    assert_eq!(w.len(), 1, "{w:#?}");
    assert!(w[0].to_string().contains("stay pending"), "{w:#?}");
}

#[test]
fn cfg_23_one_pool_per_namespace_and_backend_in_one_pool() {
    rejects(
        &dyn_cfg(CIDRS, "pools: [ { namespace: a, backends: [fe-a] } ]"),
        "dynamo.shim.pools",
    );
    rejects(
        &dyn_cfg(
            CIDRS,
            "pools: [ { namespace: a, backends: [fe-a] }, { namespace: b, backends: [fe-a] } ]",
        ),
        "dynamo.shim.pools[1].backends[0]",
    );
    rejects(
        &dyn_cfg(
            CIDRS,
            "pools: [ { namespace: a, backends: [fe-a] }, { namespace: a, backends: [fe-b] } ]",
        ),
        "dynamo.shim.pools[1].namespace",
    );
    rejects(
        &dyn_cfg(
            CIDRS,
            "pools: [ { namespace: a, backends: [fe-a] }, { namespace: c, backends: [fe-b] } ]",
        ),
        "dynamo.shim.pools[1].namespace",
    );
    rejects(
        &dyn_cfg(
            CIDRS,
            "pools: [ { namespace: a, backends: [fe-a] }, { namespace: b, backends: [ghost] } ]",
        ),
        "dynamo.shim.pools[1].backends[0]",
    );
    rejects(
        &dyn_cfg(
            CIDRS,
            "pools: [ { namespace: a, backends: [fe-a] }, { namespace: b } ]",
        ),
        "dynamo.shim.pools[1].backends",
    );
    clean(&dyn_cfg(CIDRS, POOLS));
}

#[test]
fn cfg_24_kubernetes_dynamo_namespaces() {
    let pools = "pools: [ { namespace: a, backends: [fe-a] }, { namespace: b, backends: [fe-b] } ]";
    rejects(
        &kube(
            "kubernetes",
            "namespace: dynamo, dynamo_namespace: a, dynamo_namespaces: [a, b]",
            pools,
        ),
        "dynamo.discovery.kubernetes.dynamo_namespaces",
    );
    rejects(
        &kube(
            "kubernetes",
            "namespace: dynamo, dynamo_namespaces: [a, b, a]",
            pools,
        ),
        "dynamo.discovery.kubernetes.dynamo_namespaces[2]",
    );
    let many: Vec<String> = (0..17).map(|i| format!("n{i}")).collect();
    rejects(
        &kube(
            "kubernetes",
            &format!(
                "namespace: dynamo, dynamo_namespaces: [{}]",
                many.join(", ")
            ),
            pools,
        ),
        "dynamo.discovery.kubernetes.dynamo_namespaces",
    );
    let c = clean(&kube(
        "kubernetes",
        "namespace: dynamo, dynamo_namespaces: [a, b]",
        pools,
    ));
    assert_eq!(c.dynamo.namespaces(), ["a".to_owned(), "b".to_owned()]);
    assert_eq!(
        c.dynamo.discovery.kubernetes.namespace.as_deref(),
        Some("dynamo")
    );
}

#[test]
fn cfg_25_pods_models_name_their_namespace_when_several() {
    let pools = "pools: [ { namespace: a, backends: [fe-a] }, { namespace: b, backends: [fe-b] } ]";
    let body = |m1: &str| {
        format!(
            "namespace: dynamo, dynamo_namespaces: [a, b], models: [ {{ component: W, model: m {m1} }}, \
             {{ component: W, model: m, dynamo_namespace: b }} ]"
        )
    };
    let w = {
        let e = rejects(
            &kube("kubernetes_pods", &body(""), pools),
            "dynamo.discovery.kubernetes.models[0].dynamo_namespace",
        );
        e.warnings
    };
    assert!(w.iter().any(|w| w.field == "dynamo.discovery.source"));
    let (c, _) = ok(&kube(
        "kubernetes_pods",
        &body(", dynamo_namespace: a"),
        pools,
    ));
    assert_eq!(c.dynamo.discovery.kubernetes.models.len(), 2);
}

#[test]
fn cfg_26_kubernetes_names_and_model_choice() {
    let shim = "backends: [fe-a]";
    rejects(
        &kube(
            "kubernetes_pods",
            "namespace: Dynamo_NS, dynamo_namespace: d, model: m",
            shim,
        ),
        "dynamo.discovery.kubernetes.namespace",
    );
    rejects(
        &kube(
            "kubernetes_pods",
            "namespace: dynamo, dynamo_namespace: \"-bad-\", model: m",
            shim,
        ),
        "dynamo.discovery.kubernetes.dynamo_namespace",
    );
    rejects(
        &kube(
            "kubernetes_pods",
            "namespace: dynamo, dynamo_namespace: \"\", model: m",
            shim,
        ),
        "dynamo.discovery.kubernetes.dynamo_namespace",
    );
    rejects(
        &kube("kubernetes_pods", "dynamo_namespace: d, model: m", shim),
        "dynamo.discovery.kubernetes.namespace",
    );
    rejects(
        &kube("kubernetes_pods", "namespace: dynamo, model: m", shim),
        "dynamo.discovery.kubernetes.dynamo_namespace",
    );
    // Exactly one of model / models.
    rejects(
        &kube(
            "kubernetes_pods",
            "namespace: dynamo, dynamo_namespace: d",
            shim,
        ),
        "dynamo.discovery.kubernetes.model",
    );
    rejects(
        &kube(
            "kubernetes_pods",
            "namespace: dynamo, dynamo_namespace: d, model: m, models: [ { component: W, model: m } ]",
            shim,
        ),
        "dynamo.discovery.kubernetes.model",
    );
    // unique by (dynamo_namespace, component).
    rejects(
        &kube(
            "kubernetes_pods",
            "namespace: dynamo, dynamo_namespace: d, models: [ { component: W, model: m }, { component: W, model: n } ]",
            shim,
        ),
        "dynamo.discovery.kubernetes.models[1].component",
    );
    let many: Vec<String> = (0..257)
        .map(|i| format!("{{ component: c{i}, model: m }}"))
        .collect();
    rejects(
        &kube(
            "kubernetes_pods",
            &format!(
                "namespace: dynamo, dynamo_namespace: d, models: [{}]",
                many.join(", ")
            ),
            shim,
        ),
        "dynamo.discovery.kubernetes.models",
    );
    let (c, _) = ok(&kube(
        "kubernetes_pods",
        "namespace: dynamo, dynamo_namespace: dynamo-solar-pro4, models: [ { component: VllmWorker-decodeheavy, model: solar-pro4 }, { component: VllmWorker-prefillheavy, model: solar-pro4-longcontext } ]",
        shim,
    ));
    assert_eq!(
        c.dynamo.discovery.kubernetes.models[1].model,
        "solar-pro4-longcontext"
    );
}

#[test]
fn cfg_27_kubernetes_source_ignores_model_with_warning() {
    let shim = "backends: [fe-a]";
    warns(
        &kube(
            "kubernetes",
            "namespace: dynamo, dynamo_namespace: d, model: m",
            shim,
        ),
        "dynamo.discovery.kubernetes.model",
    );
    warns(
        &kube(
            "kubernetes",
            "namespace: dynamo, dynamo_namespace: d, models: [ { component: W, model: m } ]",
            shim,
        ),
        "dynamo.discovery.kubernetes.models",
    );
    clean(&kube(
        "kubernetes",
        "namespace: dynamo, dynamo_namespace: d",
        shim,
    ));
}

#[test]
fn cfg_28_pods_source_warns_round_robin() {
    let w = warns(
        &kube(
            "kubernetes_pods",
            "namespace: dynamo, dynamo_namespace: d, model: m",
            "backends: [fe-a]",
        ),
        "dynamo.discovery.source",
    );
    assert!(
        w.iter().any(|w| w.message.contains("round-robin")),
        "{w:#?}"
    );
    assert_eq!(w.len(), 1, "{w:#?}");
}

#[test]
fn cfg_29_conditional_disaggregation_warns() {
    let kv = |on: &str| {
        etcd(SVC).replace(
            "shim: {",
            &format!("kv: {{ conditional_disaggregation: {{ enabled: {on} }} }}, shim: {{"),
        )
    };
    warns(&kv("true"), "dynamo.kv.conditional_disaggregation.enabled");
    let c = clean(&kv("false"));
    assert!(!c.dynamo.kv.conditional_disaggregation.enabled);
}

#[test]
fn q36_shim_answer_table_is_chosen_explicitly() {
    use super::dynamo::ShimAnswers;
    let c = clean(&dyn_cfg(CIDRS, POOLS));
    assert_eq!(c.dynamo.shim.answers, ShimAnswers::Dynamo16);
    let c = clean(&dyn_cfg(CIDRS, &format!("{POOLS}, answers: strict")));
    assert_eq!(c.dynamo.shim.answers, ShimAnswers::Strict);
    assert_eq!(c.show_json()["dynamo"]["shim"]["answers"], "strict");
    rejects(
        &dyn_cfg(CIDRS, &format!("{POOLS}, answers: dynamo_1_5")),
        "dynamo.shim.answers",
    );
}

#[test]
fn kube_watch_timeouts_default_to_the_spec_and_must_leave_room_for_a_timely_end() {
    let body = "namespace: dynamo, dynamo_namespace: a, model: m";
    let shim = "backends: [fe-a]";
    let c = &ok(&kube("kubernetes_pods", body, shim)).0;
    let k = &c.dynamo.discovery.kubernetes;
    assert_eq!(
        (k.watch_timeout, k.watch_idle_timeout),
        (Duration::from_secs(290), Duration::from_secs(320))
    );
    let c = &ok(&kube(
        "kubernetes_pods",
        &format!("{body}, watch_timeout: 3s, watch_idle_timeout: 5s"),
        shim,
    ))
    .0;
    let k = &c.dynamo.discovery.kubernetes;
    assert_eq!(
        (k.watch_timeout, k.watch_idle_timeout),
        (Duration::from_secs(3), Duration::from_secs(5))
    );
    for (extra, field) in [
        ("watch_timeout: 1500ms", "watch_timeout"),
        ("watch_timeout: 0s", "watch_timeout"),
        ("watch_timeout: 2h", "watch_timeout"),
        (
            "watch_timeout: 60s, watch_idle_timeout: 60s",
            "watch_idle_timeout",
        ),
        ("watch_idle_timeout: 100s", "watch_idle_timeout"),
    ] {
        rejects(
            &kube("kubernetes_pods", &format!("{body}, {extra}"), shim),
            &format!("dynamo.discovery.kubernetes.{field}"),
        );
    }
}
