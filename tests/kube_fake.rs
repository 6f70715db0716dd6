#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Fidelity of the fake Kubernetes API server (`tests/k8s/fake_apiserver.py`,
//! [`common::kube::FakeApiServer`]) that the Kubernetes discovery tests run against.
//!
//! The real `kubectl` is the client that proves it: discovery, lists (selectors, chunked
//! paging through continue tokens from one snapshot), gets, the custom resource, watches
//! (ADDED, MODIFIED, DELETED, objects entering and leaving a selector), 401, 403 and 405 as
//! kubectl reports them. The watch faults and the protocol details kubectl never shows are
//! checked on the wire in `tests/kube_fake_wire.rs`.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::STEP;
use common::kube::{
    ENDPOINT_SLICES, FakeApiServer, NAMESPACE, PODS, USER, WORKER_METADATAS, curl, curl_as,
    endpoint_slice, is_status, parse, pod_ip, put_worker, rv, worker, worker_metadata,
};
use serde_json::{Value, json};

/// The strings at these keys of `v` (`""` where none): one assertion for several fields.
fn strs<'a>(v: &'a Value, keys: &[&str]) -> Vec<&'a str> {
    keys.iter().map(|k| v[*k].as_str().unwrap_or("")).collect()
}

/// A watch event's type and object name.
fn type_and_name(ev: &Value) -> [&str; 2] {
    [
        ev["type"].as_str().unwrap_or(""),
        ev["object"]["metadata"]["name"].as_str().unwrap_or(""),
    ]
}

/// A request count of the fake's stats.
fn count(api: &FakeApiServer, resource: &str, key: &str) -> u64 {
    api.stats()[resource][key].as_u64().unwrap()
}

/// The names in a list.
fn names_of(list: &Value) -> Vec<String> {
    let items = list["items"]
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"));
    items
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

/// `kubectl args...` that must succeed; its stdout.
fn ok(api: &FakeApiServer, args: &[&str]) -> String {
    let out = api.kubectl(args);
    let cmd = args.join(" ");
    assert_eq!(
        out.code,
        Some(0),
        "`kubectl {cmd}`: {}\n{}",
        out.stderr,
        api.stderr()
    );
    out.stdout
}

/// `kubectl args...` that must fail with `needle` in its stderr.
fn fails(api: &FakeApiServer, args: &[&str], needle: &str) {
    let out = api.kubectl(args);
    let cmd = args.join(" ");
    assert_ne!(
        out.code,
        Some(0),
        "`kubectl {cmd}` succeeded: {}",
        out.stdout
    );
    assert!(
        out.stderr.contains(needle),
        "`kubectl {cmd}`: {}",
        out.stderr
    );
}

/// `kubectl args... -o json`, parsed.
fn json_of(api: &FakeApiServer, args: &[&str]) -> Value {
    parse(&ok(api, &[args, &["-o", "json"][..]].concat()))
}

/// The names `kubectl get pods -l selector` prints.
fn selected(api: &FakeApiServer, selector: &str) -> BTreeSet<String> {
    let out = ok(api, &["get", "pods", "-l", selector, "-o", "name"]);
    out.lines()
        .map(|l| l.trim_start_matches("pod/").to_owned())
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

#[test]
fn kubectl_lists_and_gets_the_pods_that_were_put() {
    let api = FakeApiServer::start();
    let stored = put_worker(&api, "w-b", "solar", Some("decode"), true);
    put_worker(&api, "w-a", "solar", Some("prefill"), false);
    api.put(PODS, "elsewhere", &worker("w-other", "solar", None, true));
    assert_eq!(stored["kind"], "Pod");
    assert_eq!(stored["metadata"]["namespace"], NAMESPACE);

    let list = json_of(&api, &["get", "pods"]);
    assert_eq!(
        names_of(&list),
        ["w-a", "w-b"],
        "sorted, this namespace only"
    );
    let labels = &list["items"][1]["metadata"]["labels"];
    assert_eq!(labels["nvidia.com/dynamo-namespace"], "solar");
    assert_eq!(labels["nvidia.com/dynamo-sub-component-type"], "decode");
    assert_eq!(list["items"][1]["status"]["podIP"], pod_ip("w-b"));
    assert_eq!(list["items"][0]["status"]["phase"], "Pending");

    let one = json_of(&api, &["get", "pod", "w-b"]);
    assert_eq!(one["kind"], "Pod");
    assert_eq!(one["metadata"]["uid"], stored["metadata"]["uid"]);
    assert_eq!(rv(&one), rv(&stored));
    assert_eq!(
        one["metadata"]["labels"]["nvidia.com/dynamo-discovery-enabled"],
        "true"
    );
    let ready = &one["status"]["conditions"].as_array().unwrap();
    assert!(
        ready
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True"),
        "{one:#}"
    );
    let other = ok(&api, &["get", "pods", "-n", "elsewhere", "-o", "name"]);
    assert_eq!(other.trim(), "pod/w-other");

    // An update keeps the uid and bumps the resourceVersion.
    let again = put_worker(&api, "w-b", "solar", Some("decode"), false);
    assert_eq!(again["metadata"]["uid"], stored["metadata"]["uid"]);
    assert!(rv(&again) > rv(&stored), "{again}");
    assert_eq!(
        json_of(&api, &["get", "pod", "w-b"])["status"]["phase"],
        "Pending"
    );
    // A missing object: kubectl's wording of the server's NotFound Status.
    fails(&api, &["get", "pod", "nope"], r#"pods "nope" not found"#);
    assert!(count(&api, PODS, "gets") >= 3);
    assert!(count(&api, PODS, "lists") >= 2);
}

#[test]
fn kubectl_label_selectors_filter_as_the_server_does() {
    let api = FakeApiServer::start();
    put_worker(&api, "a-0", "alpha", Some("prefill"), true);
    put_worker(&api, "a-1", "alpha", None, true);
    put_worker(&api, "b-0", "beta", Some("decode"), true);
    put_worker(&api, "c-0", "gamma", None, true);
    let mut plain = worker("x-0", "alpha", None, true);
    plain["metadata"]["labels"] = json!({"app": "other"});
    api.put(PODS, NAMESPACE, &plain);

    let ns = "nvidia.com/dynamo-namespace";
    let sub = "nvidia.com/dynamo-sub-component-type";
    assert_eq!(selected(&api, &format!("{ns}=alpha")), set(&["a-0", "a-1"]));
    assert_eq!(selected(&api, &format!("{ns}==beta")), set(&["b-0"]));
    assert_eq!(
        selected(&api, &format!("{ns} in (alpha,gamma)")),
        set(&["a-0", "a-1", "c-0"])
    );
    // `!=` and `notin` match Pods without the label too.
    assert_eq!(
        selected(&api, &format!("{ns}!=alpha")),
        set(&["b-0", "c-0", "x-0"])
    );
    assert_eq!(
        selected(&api, &format!("{ns} notin (alpha,beta)")),
        set(&["c-0", "x-0"])
    );
    assert_eq!(selected(&api, sub), set(&["a-0", "b-0"]));
    assert_eq!(
        selected(&api, &format!("!{sub}")),
        set(&["a-1", "c-0", "x-0"])
    );
    // The router's own selector (core's `label_selector`): the AND of every requirement.
    let router = format!(
        "nvidia.com/dynamo-discovery-backend=kubernetes,nvidia.com/dynamo-discovery-enabled=true,\
         {ns} in (alpha,beta)"
    );
    assert_eq!(selected(&api, &router), set(&["a-0", "a-1", "b-0"]));
    let sent = &api.stats()[PODS]["last_list"]["labelSelector"];
    assert_eq!(
        sent,
        router.as_str(),
        "the selector reached the server as sent"
    );
    fails(
        &api,
        &["get", "pods", "-l", "a in ()"],
        "unable to parse requirement",
    );
}

#[test]
fn kubectl_reads_endpoint_slices_and_the_worker_metadata_custom_resource() {
    let api = FakeApiServer::start();
    let slice = endpoint_slice(
        "solar-worker-abcde",
        "solar-worker",
        &[("w-0", true), ("w-1", false)],
    );
    api.put(ENDPOINT_SLICES, NAMESPACE, &slice);
    let card = json!({"model_cards": {"k": {"component": "backend", "instance_id": 7}}});
    api.put(WORKER_METADATAS, NAMESPACE, &worker_metadata("w-0", &card));
    api.put(
        WORKER_METADATAS,
        NAMESPACE,
        &worker_metadata("w-1", &json!({})),
    );

    let slices = json_of(&api, &["get", "endpointslices"]);
    assert_eq!(names_of(&slices), ["solar-worker-abcde"]);
    let s = &slices["items"][0];
    assert_eq!(
        strs(s, &["apiVersion", "kind"]),
        ["discovery.k8s.io/v1", "EndpointSlice"]
    );
    assert_eq!(s["addressType"], "IPv4");
    assert_eq!(
        s["metadata"]["labels"]["kubernetes.io/service-name"],
        "solar-worker"
    );
    let eps = s["endpoints"].as_array().unwrap();
    assert_eq!(eps.len(), 2);
    assert_eq!(
        eps[0]["targetRef"],
        json!({"kind": "Pod", "name": "w-0", "namespace": NAMESPACE})
    );
    assert_eq!(eps[0]["addresses"], json!([pod_ip("w-0")]));
    assert_eq!(eps[1]["conditions"]["ready"], false);

    // The custom resource by its plural, singular, kind and group-qualified names.
    let crs = json_of(&api, &["get", "dynamoworkermetadatas"]);
    assert_eq!(names_of(&crs), ["w-0", "w-1"]);
    assert_eq!(crs["items"][0]["spec"]["data"], card);
    for name in [
        "dynamoworkermetadata",
        "DynamoWorkerMetadata",
        "dynamoworkermetadatas.nvidia.com",
    ] {
        let one = json_of(&api, &["get", name, "w-0"]);
        assert_eq!(one["apiVersion"], "nvidia.com/v1alpha1", "{name}");
        assert_eq!(one["kind"], "DynamoWorkerMetadata", "{name}");
        assert_eq!(one["spec"]["data"], card, "{name}");
    }
    let not_found = r#"dynamoworkermetadatas.nvidia.com "w-9" not found"#;
    fails(&api, &["get", "dynamoworkermetadata", "w-9"], not_found);
    assert!(count(&api, WORKER_METADATAS, "lists") >= 1);
    assert!(count(&api, ENDPOINT_SLICES, "lists") >= 1);
}

#[test]
fn list_items_are_encoded_as_the_real_server_encodes_them() {
    // kubectl fills in what lists leave out, so this is read on the wire.
    let api = FakeApiServer::start();
    put_worker(&api, "w-0", "solar", None, true);
    api.put(
        WORKER_METADATAS,
        NAMESPACE,
        &worker_metadata("w-0", &json!({})),
    );
    let (code, out, err) = curl(&api, "/api/v1/namespaces/dynamo/pods", &[], 10);
    assert_eq!(code, Some(0), "{err}");
    let pods = parse(&out);
    assert_eq!(strs(&pods, &["kind", "apiVersion"]), ["PodList", "v1"]);
    assert!(pods["metadata"]["resourceVersion"].is_string(), "{pods}");
    assert_eq!(pods["metadata"].get("continue"), None, "{pods}");
    assert_eq!(
        pods["items"][0].get("kind"),
        None,
        "built-in items carry no kind: {pods}"
    );
    assert_eq!(pods["items"][0].get("apiVersion"), None, "{pods}");
    let (_, out, _) = curl(
        &api,
        "/apis/nvidia.com/v1alpha1/namespaces/dynamo/dynamoworkermetadatas",
        &[],
        10,
    );
    let crs = parse(&out);
    assert_eq!(crs["kind"], "DynamoWorkerMetadataList");
    assert_eq!(crs["metadata"]["continue"], "", "{crs}");
    assert_eq!(
        crs["items"][0]["kind"], "DynamoWorkerMetadata",
        "CR items keep it: {crs}"
    );
    // Across namespaces; an unknown resource is a 404 Status.
    assert_eq!(
        names_of(&parse(&curl(&api, "/api/v1/pods", &[], 10).1)),
        ["w-0"]
    );
    let st = parse(&curl(&api, "/api/v1/namespaces/dynamo/services", &[], 10).1);
    assert!(is_status(&st, "NotFound", 404), "{st}");
}

#[test]
fn kubectl_chunked_list_pages_through_continue_tokens_of_one_snapshot() {
    let api = FakeApiServer::start();
    for i in 1..=5 {
        put_worker(&api, &format!("p{i}"), "solar", None, true);
    }
    let chunked = ["get", "pods", "--chunk-size=2", "-o", "name"];
    let all = ["pod/p1", "pod/p2", "pod/p3", "pod/p4", "pod/p5"];
    assert_eq!(ok(&api, &chunked).lines().collect::<Vec<_>>(), all);
    let stats = api.stats();
    let log = stats[PODS]["list_log"].as_array().unwrap();
    let pages: Vec<&Value> = log.iter().filter(|l| l["limit"] == "2").collect();
    assert!(pages.len() >= 3, "{stats:#}");
    assert!(pages[0]["continue"].is_null(), "{stats:#}");
    assert!(
        pages.iter().filter(|l| l["continue"].is_string()).count() >= 2,
        "{stats:#}"
    );

    // Pages are served from the first page's snapshot: changes made while paging are not seen.
    api.slow_pages(600);
    let lists0 = count(&api, PODS, "lists");
    let out = std::thread::scope(|scope| {
        let listing = scope.spawn(|| ok(&api, &chunked));
        api.wait_stats(STEP, |s| s[PODS]["lists"].as_u64() > Some(lists0));
        std::thread::sleep(Duration::from_millis(150)); // the first page's snapshot is taken
        put_worker(&api, "p0", "solar", None, true);
        api.delete(PODS, NAMESPACE, "p5");
        listing.join().unwrap() // bounded: a kubectl run is killed after 30 s
    });
    assert_eq!(out.lines().collect::<Vec<_>>(), all, "one snapshot");
    api.slow_pages(0);
    let now = ["pod/p0", "pod/p1", "pod/p2", "pod/p3", "pod/p4"];
    assert_eq!(ok(&api, &chunked).lines().collect::<Vec<_>>(), now);
}

#[test]
fn kubectl_watch_sees_added_modified_and_deleted() {
    let api = FakeApiServer::start();
    put_worker(&api, "w-old", "solar", None, true);
    let mut w = api.kubectl_watch(&["get", "pods", "-w", "--output-watch-events", "-o", "json"]);
    let first = w.next_json(STEP).unwrap();
    assert_eq!(type_and_name(&first), ["ADDED", "w-old"]);
    let stats = api.wait_open_watches(PODS, 1, STEP);
    assert_eq!(
        stats[PODS]["last_watch"]["resourceVersion"], stats["resource_version"],
        "kubectl watches from its list's resourceVersion: {stats:#}"
    );

    let added = put_worker(&api, "w-new", "solar", None, false);
    let ev = w.next_json(STEP).unwrap();
    assert_eq!(type_and_name(&ev), ["ADDED", "w-new"]);
    assert_eq!(ev["object"]["kind"], "Pod");
    assert_eq!(rv(&ev["object"]), rv(&added));
    put_worker(&api, "w-new", "solar", None, true);
    let ev = w.next_json(STEP).unwrap();
    assert_eq!(ev["type"], "MODIFIED", "{ev}");
    assert_eq!(ev["object"]["status"]["phase"], "Running");
    let gone = api.delete(PODS, NAMESPACE, "w-new");
    let ev = w.next_json(STEP).unwrap();
    assert_eq!(type_and_name(&ev), ["DELETED", "w-new"]);
    assert_eq!(
        rv(&ev["object"]),
        rv(&gone),
        "the DELETED object has the deletion's version"
    );
    assert!(rv(&gone) > rv(&added));
    // Objects of another namespace or resource never reach this watch.
    api.put(PODS, "elsewhere", &worker("w-x", "solar", None, true));
    api.put(
        WORKER_METADATAS,
        NAMESPACE,
        &worker_metadata("w-x", &json!({})),
    );
    assert!(w.next_line(Duration::from_millis(500)).is_none());
    drop(w);
    api.wait_open_watches(PODS, 0, STEP);
}

#[test]
fn kubectl_watch_with_a_selector_sees_pods_enter_and_leave_it() {
    let api = FakeApiServer::start();
    let mut w = api.kubectl_watch(&["get", "pods", "-w", "-l", "role=in", "-o", "name"]);
    api.wait_open_watches(PODS, 1, STEP);
    let mut pod = worker("w-0", "solar", None, true);
    let mut put_role = |role: &str| {
        pod["metadata"]["labels"]["role"] = json!(role);
        api.put(PODS, NAMESPACE, &pod);
    };
    put_role("out");
    assert!(
        w.next_line(Duration::from_millis(400)).is_none(),
        "not selected yet"
    );
    put_role("in");
    assert_eq!(w.expect_line(STEP), "pod/w-0");
    put_role("out");
    assert_eq!(
        w.expect_line(STEP),
        "pod/w-0",
        "leaving the selector is an event too"
    );
    drop(w);

    // The same, as events: entering is ADDED, leaving is DELETED (with the content it had).
    let watch = [
        "get",
        "pods",
        "-w",
        "-l",
        "role=in",
        "--output-watch-events",
        "-o",
        "json",
    ];
    let mut w = api.kubectl_watch(&watch);
    api.wait_open_watches(PODS, 1, STEP);
    put_role("in");
    assert_eq!(w.next_json(STEP).unwrap()["type"], "ADDED");
    put_role("in");
    assert_eq!(w.next_json(STEP).unwrap()["type"], "MODIFIED");
    put_role("out");
    let ev = w.next_json(STEP).unwrap();
    assert_eq!(ev["type"], "DELETED", "{ev}");
    assert_eq!(ev["object"]["metadata"]["labels"]["role"], "in", "{ev}");
}

#[test]
fn a_wrong_token_is_unauthorized() {
    let api = FakeApiServer::start();
    put_worker(&api, "w-0", "solar", None, true);
    let bad = api.kubeconfig_with_token("not-the-token");
    let out = api.kubectl_with(&bad, &["get", "pods", "-o", "name"]);
    assert_ne!(out.code, Some(0));
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    assert!(
        out.stderr.contains("You must be logged in to the server"),
        "{}",
        out.stderr
    );
    let stats = api.stats();
    assert!(stats["rejected_401"].as_u64().unwrap() >= 1, "{stats:#}");
    assert_eq!(stats[PODS]["lists"], 0, "{stats:#}");
    // On the wire: the Status kube-apiserver sends.
    let (_, out, _) = curl_as(&api, "nope", "/api/v1/namespaces/dynamo/pods", &[], 10);
    let unauthorized = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": "Unauthorized", "reason": "Unauthorized", "code": 401});
    assert_eq!(parse(&out), unauthorized);
    assert_eq!(ok(&api, &["get", "pods", "-o", "name"]).trim(), "pod/w-0");
}

#[test]
fn a_denied_verb_is_forbidden_with_rbac_wording() {
    let api = FakeApiServer::start();
    put_worker(&api, "w-0", "solar", None, true);
    let denied = |verb: &str, what: &str, group: &str| {
        format!(
            r#"{what} is forbidden: User "{USER}" cannot {verb} resource "{}" in API group "{group}" in the namespace "dynamo""#,
            what.split(['.', ' ']).next().unwrap()
        )
    };
    api.allow_verbs(&["get", "list"]);
    let mut w = api.kubectl_watch(&["get", "pods", "-w", "-o", "name"]);
    assert_eq!(w.expect_line(STEP), "pod/w-0", "the list is allowed");
    let status = w
        .wait_exit(STEP)
        .expect("kubectl gives up on a forbidden watch");
    assert!(!status.success());
    let err = w.stderr();
    assert!(err.contains("Forbidden"), "{err}");
    // Debian's kubectl 1.20 decodes a watch's error body as an object, not a Status, and prints
    // "unknown (get pods)"; newer ones print the server's message.
    assert!(
        !err.contains("is forbidden") || err.contains(&denied("watch", "pods", "")),
        "{err}"
    );
    let st = parse(&curl(&api, "/api/v1/namespaces/dynamo/pods?watch=1", &[], 10).1);
    assert!(is_status(&st, "Forbidden", 403), "{st}");
    assert_eq!(st["details"], json!({"kind": "pods"}));
    assert_eq!(st["message"], denied("watch", "pods", ""));

    api.allow_verbs(&["get", "watch"]);
    let cr = "dynamoworkermetadatas.nvidia.com";
    fails(
        &api,
        &["get", "dynamoworkermetadatas"],
        &denied("list", cr, "nvidia.com"),
    );
    api.allow_verbs(&["list", "watch"]);
    fails(
        &api,
        &["get", "pod", "w-0"],
        &denied("get", r#"pods "w-0""#, ""),
    );
    assert!(api.stats()["rejected_403"].as_u64().unwrap() >= 4);
    api.allow_verbs(&["get", "list", "watch"]);
    assert_eq!(
        ok(&api, &["get", "pod", "w-0", "-o", "name"]).trim(),
        "pod/w-0"
    );
}

#[test]
fn writes_through_the_api_are_refused() {
    let api = FakeApiServer::start();
    let path = api.dir().join("pod.json");
    std::fs::write(&path, worker("w-0", "solar", None, true).to_string()).unwrap();
    // (Client-side validation would need /openapi, which the fake does not serve.)
    let file = path.to_str().unwrap();
    let refused = format!(
        "(MethodNotAllowed): error when creating \"{file}\": the server does not allow this \
         method on the requested resource"
    );
    fails(&api, &["create", "--validate=false", "-f", file], &refused);
    let pod = "/api/v1/namespaces/dynamo/pods/w-0";
    let (_, out, _) = curl(&api, pod, &["-X", "DELETE", "-w", "\n%{http_code}"], 10);
    assert!(out.ends_with("\n405"), "{out}");
    assert_eq!(count(&api, PODS, "objects"), 0);
}
