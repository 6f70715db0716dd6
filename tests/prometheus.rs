//! The operator's alerting rules and Grafana dashboard (issue 37, item 7), checked with the real
//! Prometheus tools against real routers:
//!
//! - `deploy/prometheus/continuum-router.rules.yml` passes `promtool check rules`, and its unit
//!   tests (`deploy/prometheus/tests/*.yml`) pass `promtool test rules`; every alert there has a
//!   case that fires it and one that does not, every recording rule an expression test;
//! - `deploy/grafana/continuum-router.json` is a well-formed dashboard whose every panel reads the
//!   `${DS_PROMETHEUS}` datasource;
//! - a real Prometheus server scraping two real routers in front of a real Dynamo 1.6.1 fleet
//!   (one with KV-aware picking pinned and direct subscriptions, one over the broker transport
//!   with no broker and nothing pinned), with the rules loaded: every metric name the rules and
//!   the dashboard use is one the routers export, every recording rule produces series, every
//!   rule evaluates without error, every dashboard query returns series, and the alerts that the
//!   broker router's state calls for go pending on it alone.
//!
//! `promtool` and `prometheus` come from the Debian package `prometheus` (tests/run.sh installs
//! it); nothing is installed here. Everything binds 127.0.0.1; every wait is bounded.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(all(feature = "dynamo-kv", feature = "dynamo-event-bus"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::broker::token_hash;
use common::fleet::{Fleet, FleetSpec};
use common::kv_pick::{kv_config, kv_router, system_prompt, tiny_model_digests, wait_kv_ready};
use common::prometheus::{PrometheusServer, promtool};
use common::tunnel::Bus;
use common::{RouterProcess, TempDir, chat};
use serde_json::{Value, json};
use serde_yaml_ng::Value as Yaml;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const MODEL: &str = "tiny-agg";
const JOB: &str = "continuum-router";
/// Bound for the scraped data to satisfy every check.
const SETTLE_WITHIN: Duration = Duration::from_secs(90);

fn rules_path() -> PathBuf {
    Path::new(ROOT).join("deploy/prometheus/continuum-router.rules.yml")
}

fn rule_tests() -> Vec<PathBuf> {
    let dir = Path::new(ROOT).join("deploy/prometheus/tests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no rule tests in {}", dir.display());
    files
}

fn yaml(path: &Path) -> Yaml {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn dashboard() -> Value {
    let path = Path::new(ROOT).join("deploy/grafana/continuum-router.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn s<'a>(v: &'a Yaml, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Yaml::as_str)
}

/// One rule of the rules file.
struct Rule {
    /// The alert or record name.
    name: String,
    alert: bool,
    expr: String,
    raw: Yaml,
}

fn rules() -> Vec<Rule> {
    let doc = yaml(&rules_path());
    let mut out = Vec::new();
    for group in doc["groups"].as_sequence().expect("groups") {
        for r in group["rules"].as_sequence().expect("rules") {
            let (name, alert) = match (s(r, "alert"), s(r, "record")) {
                (Some(a), None) => (a, true),
                (None, Some(rec)) => (rec, false),
                _ => panic!("a rule is neither one alert nor one record: {r:?}"),
            };
            out.push(Rule {
                name: name.to_owned(),
                alert,
                expr: s(r, "expr").expect("expr").to_owned(),
                raw: r.clone(),
            });
        }
    }
    out
}

/// Every dashboard panel with targets (rows excluded), nested row panels included.
fn panels(dash: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        if p["type"] == "row" {
            out.extend(p["panels"].as_array().cloned().unwrap_or_default());
        } else {
            out.push(p.clone());
        }
    }
    out
}

fn exprs(dash: &Value) -> Vec<(String, String)> {
    panels(dash)
        .iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or("?").to_owned();
            p["targets"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |t| (title.clone(), t["expr"].as_str().unwrap_or("").to_owned()))
        })
        .collect()
}

/// Every exported-metric name in `expr`: identifiers starting `continuum_` or
/// `disaggregated_` (recording rules, `continuum:...`, are not exported names).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut word = String::new();
    for c in expr.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            if (word.starts_with("continuum_") || word.starts_with("disaggregated_"))
                && !word.contains(':')
            {
                out.insert(word.clone());
            }
            word.clear();
        }
    }
    out
}

/// Whether the scrape `text` declares `name` (a histogram's `_bucket`, `_sum` and `_count`
/// through its base name).
fn exported(text: &str, name: &str) -> bool {
    if text.contains(&format!("# TYPE {name} ")) {
        return true;
    }
    ["_bucket", "_sum", "_count"].iter().any(|suffix| {
        name.strip_suffix(suffix)
            .is_some_and(|base| text.contains(&format!("# TYPE {base} histogram")))
    })
}

#[test]
fn rules_pass_promtool_and_every_alert_is_tested_both_ways() {
    let rules_file = rules_path();
    let rules_arg = rules_file.to_str().expect("utf-8 path");
    let check = promtool(&["check", "rules", rules_arg]);
    let check_text = format!("{}{}", check.stdout, check.stderr);
    assert_eq!(check.code, Some(0), "promtool check rules:\n{}", check_text);
    let all = rules();
    assert!(
        check_text.contains(&format!("{} rules found", all.len())),
        "promtool counted other rules than the file has ({}):\n{}",
        all.len(),
        check_text
    );

    let tests = rule_tests();
    let mut args = vec!["test", "rules"];
    args.extend(tests.iter().map(|p| p.to_str().expect("utf-8 path")));
    let run = promtool(&args);
    let run_text = format!("{}{}", run.stdout, run.stderr);
    assert_eq!(run.code, Some(0), "promtool test rules:\n{run_text}");
    assert_eq!(
        run_text.matches("SUCCESS").count(),
        tests.len(),
        "one SUCCESS per test file expected:\n{}",
        run_text
    );

    // What the unit tests cover: per alert, whether a case expects it to fire and whether one
    // expects it quiet; the expressions the expression tests evaluate.
    let mut fires: BTreeSet<String> = BTreeSet::new();
    let mut quiet: BTreeSet<String> = BTreeSet::new();
    let mut tested_exprs = String::new();
    for file in &tests {
        let doc = yaml(file);
        for t in doc["tests"].as_sequence().expect("tests") {
            for case in t["alert_rule_test"].as_sequence().into_iter().flatten() {
                let name = s(case, "alertname").expect("alertname").to_owned();
                let expected = case["exp_alerts"].as_sequence().map_or(0, Vec::len);
                if expected > 0 {
                    for a in case["exp_alerts"].as_sequence().into_iter().flatten() {
                        assert!(
                            s(&a["exp_labels"], "severity").is_some()
                                && s(&a["exp_annotations"], "summary").is_some()
                                && s(&a["exp_annotations"], "description").is_some(),
                            "{}: {name}: every expected alert names its severity, summary and \
                             description: {a:?}",
                            file.display()
                        );
                    }
                    fires.insert(name);
                } else {
                    quiet.insert(name);
                }
            }
            for case in t["promql_expr_test"].as_sequence().into_iter().flatten() {
                tested_exprs.push_str(s(case, "expr").expect("expr"));
                tested_exprs.push('\n');
            }
        }
    }
    let mut alerts = 0;
    for r in &all {
        if r.alert {
            alerts += 1;
            assert!(fires.contains(&r.name), "no test case fires {}", r.name);
            assert!(
                quiet.contains(&r.name),
                "no test case keeps {} quiet",
                r.name
            );
            assert!(s(&r.raw, "for").is_some(), "{} has no `for`", r.name);
            let severity = s(&r.raw["labels"], "severity");
            assert!(
                matches!(severity, Some("warning" | "critical")),
                "{}: severity {severity:?}",
                r.name
            );
            for key in ["summary", "description"] {
                assert!(
                    s(&r.raw["annotations"], key).is_some_and(|t| !t.trim().is_empty()),
                    "{} has no {key}",
                    r.name
                );
            }
        } else {
            assert!(
                r.name.starts_with("continuum:"),
                "recording rule {} is not named continuum:...",
                r.name
            );
            assert!(
                tested_exprs.contains(&r.name),
                "no expression test evaluates {}",
                r.name
            );
        }
    }
    let unknown: Vec<&String> = fires
        .union(&quiet)
        .filter(|n| !all.iter().any(|r| r.alert && &r.name == *n))
        .collect();
    assert!(unknown.is_empty(), "tests name unknown alerts: {unknown:?}");
    assert!(alerts >= 10, "only {alerts} alerts");
}

#[test]
fn dashboard_is_well_formed() {
    let dash = dashboard();
    let schema = dash["schemaVersion"].as_u64().expect("schemaVersion");
    assert!((36..=41).contains(&schema), "schemaVersion {schema}");
    assert!(dash["uid"].as_str().is_some_and(|u| !u.is_empty()));
    let vars = dash["templating"]["list"].as_array().expect("templating");
    assert!(
        vars.iter().any(|v| v["name"] == "DS_PROMETHEUS"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "no DS_PROMETHEUS datasource variable: {vars:?}"
    );
    let ds = json!({"type": "prometheus", "uid": "${DS_PROMETHEUS}"});
    let mut ids = BTreeSet::new();
    for p in dash["panels"].as_array().expect("panels") {
        let id = p["id"].as_u64().expect("panel id");
        assert!(ids.insert(id), "panel id {id} twice");
        let g = &p["gridPos"];
        let (x, w) = (g["x"].as_u64().expect("x"), g["w"].as_u64().expect("w"));
        assert!(x + w <= 24 && g["h"].as_u64().is_some(), "gridPos {g}");
    }
    let all = panels(&dash);
    assert!(all.len() >= 20, "only {} panels", all.len());
    for p in &all {
        assert_eq!(p["datasource"], ds, "panel {}", p["title"]);
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {} has no target", p["title"]);
        let mut refs = BTreeSet::new();
        for t in targets {
            assert_eq!(t["datasource"], ds, "panel {} target {t}", p["title"]);
            assert!(refs.insert(t["refId"].as_str().expect("refId")));
            assert!(
                t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
                "panel {} target without expr",
                p["title"]
            );
        }
    }
    // The panels the operator needs, each found by what it queries.
    let text: String = exprs(&dash).into_iter().map(|(_, e)| e + "\n").collect();
    for needed in [
        "continuum_http_requests_total",
        "continuum_http_request_duration_seconds_bucket",
        "continuum_dynamo_selection_total",
        "continuum_dynamo_worker_kv_used_blocks",
        "continuum_dynamo_load_subscriptions",
        "continuum_dynamo_kv_subscriptions",
        "continuum_dynamo_kv_index_blocks",
        "continuum_dynamo_kv_events_total",
        "disaggregated_errors_total",
        "continuum_backend_health",
        "continuum_upstream_ejections_total",
        "continuum_dynamo_event_bus_sessions",
        "continuum_config_generation",
    ] {
        assert!(text.contains(needed), "no panel queries {needed}");
    }
}

/// Router B: the fleet over the broker transport (no broker runs: every subscription waits
/// `pending`), its event bus listener accepting broker `b-one` for the fleet's namespace, KV on
/// with nothing pinned.
fn broker_router(fleet: &Fleet, bus: &Bus) -> RouterProcess {
    let mut cfg = kv_config(fleet, &[], "");
    let load = "  load:\n    direct_allow_cidrs";
    assert!(cfg.extra_yaml.contains(load), "{}", cfg.extra_yaml);
    cfg.extra_yaml = cfg.extra_yaml.replace(
        load,
        "  load:\n    transport: broker\n    direct_allow_cidrs",
    );
    let namespaces: Vec<&str> = fleet.info.frontends.keys().map(String::as_str).collect();
    cfg.extra_yaml.push_str(&format!(
        "  event_bus:\n    enabled: true\n    listen: \"127.0.0.1:{}\"\n    tls: {{ cert: \"{}\", \
         key: \"{}\" }}\n    brokers:\n      - {{ id: b-one, token_hash: \"{}\", namespaces: [{}] \
         }}\n",
        bus.port,
        bus.cert.display(),
        bus.key.display(),
        token_hash("prometheus-test-broker-token"),
        namespaces.join(", ")
    ));
    RouterProcess::start(&cfg)
}

fn chat_ok(r: &RouterProcess, messages: &[Value]) {
    let body = json!({"model": MODEL, "messages": messages, "max_tokens": 4}).to_string();
    let resp = chat(r.addr(), body.as_bytes(), &[]);
    assert_eq!(resp.status, 200, "{}\n{}", resp.text(), r.stderr());
}

/// Bounded traffic: `conversations` x `turns` chat requests (each turn extends the
/// conversation, so later turns have a cached prefix), two model listings and two requests for
/// a path that does not exist (404).
fn traffic(r: &RouterProcess, conversations: usize, turns: usize) {
    for c in 0..conversations {
        let mut history = vec![json!({"role": "system", "content": system_prompt(c)})];
        for turn in 0..turns {
            history.push(json!({"role": "user", "content": format!("Turn {turn}: rule {turn}?")}));
            chat_ok(r, &history);
            history.push(json!({"role": "assistant", "content": "Noted."}));
        }
    }
    for _ in 0..2 {
        assert_eq!(r.get("/v1/models").status, 200);
        assert_eq!(r.get("/no/such/path").status, 404);
    }
}

/// `expr` with Grafana's variables replaced: the global interval macros by durations the 1 s
/// scrape fills, and each of the dashboard's query variables by `values[name]`.
fn substitute(expr: &str, values: &BTreeMap<String, String>) -> String {
    let mut e = expr
        .replace("$__rate_interval", "5s")
        .replace("$__interval", "2s")
        .replace("$__range", "1m");
    for (name, v) in values {
        e = e
            .replace(&format!("${{{name}}}"), v)
            .replace(&format!("${name}"), v);
    }
    assert!(!e.contains('$'), "an unknown variable is left in {e}");
    e
}

/// `label_values(selector, label)` as the PromQL Grafana runs for it.
fn label_values_query(q: &str, values: &BTreeMap<String, String>) -> (String, String) {
    let inner = q
        .trim()
        .strip_prefix("label_values(")
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("variable query {q} is not label_values(selector, label)"));
    let (selector, label) = inner
        .rsplit_once(',')
        .unwrap_or_else(|| panic!("variable query {q} has no label"));
    let label = label.trim().to_owned();
    (
        format!(
            "count by ({label}) ({})",
            substitute(selector.trim(), values)
        ),
        label,
    )
}

fn series_label(series: &Value, label: &str) -> String {
    series["metric"][label].as_str().unwrap_or("").to_owned()
}

#[test]
fn dashboard_and_rules_evaluate_on_live_routers() {
    let started = Instant::now();
    let fleet = Fleet::start(&FleetSpec::new().agg(MODEL, 2));
    let workers = fleet.info.workers.len();
    assert!(workers >= 2, "{:?}", fleet.info.workers);

    // Router A: KV-aware, artifacts pinned, direct subscriptions.
    let a = kv_router(&fleet, &tiny_model_digests(), "");
    wait_kv_ready(&a, workers);
    // Router B: broker transport without a broker, nothing pinned.
    let bus_dir = TempDir::new("prometheus-bus");
    let bus = Bus::new(bus_dir.path());
    let b = broker_router(&fleet, &bus);
    let inst_a = a.addr().to_string();
    let inst_b = b.addr().to_string();

    let rules_file = rules_path();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - \"{}\"\nscrape_configs:\n  - job_name: {JOB}\n    static_configs:\n      \
         - targets: [\"{inst_a}\", \"{inst_b}\"]\n",
        rules_file.display()
    );
    let prom = PrometheusServer::start(&config);
    // Traffic only once both routers were scraped: a counter's first sample must precede its
    // increase for a rate to see it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while prom.query(&format!("up{{job=\"{JOB}\"}} == 1")).len() < 2 {
        assert!(
            Instant::now() < deadline,
            "prometheus did not scrape both routers within 30s: {:?}",
            prom.query("up")
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    traffic(&a, 3, 3);
    traffic(&b, 2, 1);

    // Every metric name the rules and the dashboard use is declared by the routers' scrape.
    let scraped = a.metrics() + &b.metrics();
    let dash = dashboard();
    let all_rules = rules();
    let mut names = BTreeSet::new();
    for r in &all_rules {
        names.extend(metric_names(&r.expr));
    }
    for (_, e) in exprs(&dash) {
        names.extend(metric_names(&e));
    }
    assert!(names.len() >= 20, "too few names found: {names:?}");
    let missing: Vec<&String> = names.iter().filter(|n| !exported(&scraped, n)).collect();
    assert!(
        missing.is_empty(),
        "used but not exported by the routers: {missing:?}\n{scraped}"
    );

    // The dashboard's variables: $job is the scrape job, $instance both routers.
    let mut values = BTreeMap::new();
    values.insert("job".to_owned(), JOB.to_owned());
    values.insert("instance".to_owned(), format!("{inst_a}|{inst_b}"));
    let vars: Vec<Value> = dash["templating"]["list"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|v| v["type"] == "query")
        .collect();
    for v in &vars {
        let name = v["name"].as_str().expect("variable name");
        assert!(values.contains_key(name), "no test value for ${name}");
    }
    let records: Vec<&Rule> = all_rules.iter().filter(|r| !r.alert).collect();
    let dash_exprs: Vec<(String, String)> = exprs(&dash)
        .into_iter()
        .map(|(t, e)| (t, substitute(&e, &values)))
        .collect();

    // Poll (bounded) until every check holds; report what still fails at the deadline.
    let deadline = Instant::now() + SETTLE_WITHIN;
    let mut rounds = 0;
    loop {
        rounds += 1;
        let mut failing: Vec<String> = Vec::new();
        for v in &vars {
            let q = v["query"]["query"]
                .as_str()
                .or_else(|| v["query"].as_str())
                .expect("variable query");
            let (promql, label) = label_values_query(q, &values);
            let got: BTreeSet<String> = prom
                .query(&promql)
                .iter()
                .map(|s| series_label(s, &label))
                .collect();
            let want: BTreeSet<String> = match label.as_str() {
                "job" => [JOB.to_owned()].into(),
                "instance" => [inst_a.clone(), inst_b.clone()].into(),
                other => panic!("no expectation for variable label {other}"),
            };
            if got != want {
                failing.push(format!("variable {q}: {got:?}, want {want:?}"));
            }
        }
        for (title, e) in &dash_exprs {
            if prom.query(e).is_empty() {
                failing.push(format!("panel {title:?}: no series for {e}"));
            }
        }
        for r in &records {
            if prom.query(&r.name).is_empty() {
                failing.push(format!("recording rule {} produced no series", r.name));
            }
        }
        let groups = prom.api("/api/v1/rules");
        let mut evaluated = 0;
        for g in groups["groups"].as_array().into_iter().flatten() {
            for r in g["rules"].as_array().into_iter().flatten() {
                if r["lastEvaluation"]
                    .as_str()
                    .is_some_and(|t| !t.starts_with("0001-"))
                {
                    evaluated += 1;
                }
                if r["health"] != "ok" {
                    failing.push(format!(
                        "rule {} health {} ({})",
                        r["name"], r["health"], r["lastError"]
                    ));
                }
            }
        }
        if evaluated != all_rules.len() {
            failing.push(format!(
                "{evaluated} of {} rules evaluated by prometheus",
                all_rules.len()
            ));
        }
        // Router B's state calls for three alerts; router A's for none of them.
        let alerts = prom.api("/api/v1/alerts")["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let active = |name: &str, inst: &str, extra: &[(&str, &str)]| {
            alerts.iter().any(|al| {
                al["labels"]["alertname"] == name
                    && al["labels"]["instance"] == inst
                    && extra.iter().all(|(k, v)| al["labels"][*k] == *v)
            })
        };
        for (name, extra) in [
            (
                "ContinuumSubscriptionsStuck",
                &[
                    ("family", "kv_metrics"),
                    ("state", "pending"),
                    ("transport", "broker"),
                ][..],
            ),
            (
                "ContinuumSubscriptionsStuck",
                &[
                    ("family", "kv-events"),
                    ("state", "pending"),
                    ("transport", "broker"),
                ][..],
            ),
            ("ContinuumBrokerNamespaceUncovered", &[][..]),
            ("ContinuumKvArtifactsUnpinned", &[][..]),
        ] {
            if !active(name, &inst_b, extra) {
                failing.push(format!("{name} {extra:?} not active on router B"));
            }
            if active(name, &inst_a, &[]) {
                failing.push(format!("{name} active on router A"));
            }
        }
        for name in [
            "ContinuumDiscoveryDisconnected",
            "ContinuumNoHealthyBackend",
        ] {
            if alerts.iter().any(|al| al["labels"]["alertname"] == name) {
                failing.push(format!(
                    "{name} active although discovery and backends are up"
                ));
            }
        }
        if failing.is_empty() {
            eprintln!(
                "{} dashboard queries, {} recording rules, {} rules: all satisfied after {rounds} \
                 rounds; active alerts {:?}; test time {:?}",
                dash_exprs.len(),
                records.len(),
                all_rules.len(),
                alerts
                    .iter()
                    .map(|al| format!(
                        "{} {} {}",
                        al["labels"]["alertname"], al["labels"]["instance"], al["state"]
                    ))
                    .collect::<Vec<_>>(),
                started.elapsed()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after {SETTLE_WITHIN:?}:\n{}\n\nrouter A metrics:\n{}\nrouter B metrics:\n{}",
            failing.join("\n"),
            a.metrics(),
            b.metrics()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let _: SocketAddr = prom.addr();
}
