//! What discovery should be running for a config, and how a reload moves from one plan to the
//! next (RELOAD-04..07, 13; ). Pure: unit-tested without any watcher.

use std::path::PathBuf;
use std::time::Duration;

use continuum_core::config::Config;
use continuum_core::config::dynamo::{
    DiscoveryConfig, DiscoverySource, EtcdConfig, KubernetesConfig,
};

/// The discovery a config asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum DiscoveryPlan {
    /// Watch etcd with these settings (namespaces are the effective list).
    Etcd(EtcdConfig),
    /// Watch Dynamo's file store.
    File(FilePlan),
    /// List and watch the fleet's Pods through the Kubernetes API (DISC-K8S-POD).
    KubernetesPods(KubernetesConfig),
    /// List and watch `DynamoWorkerMetadata` resources and EndpointSlices (DISC-K8S-META).
    KubernetesMetadata(KubernetesConfig),
}

/// `dynamo.discovery.file` with its root resolved (the config requires it for this source).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePlan {
    /// The store root (absolute).
    pub root: PathBuf,
    /// Files whose mtime is older than this are absent.
    pub ttl: Duration,
    /// The effective namespace list.
    pub namespaces: Vec<String>,
}

/// Why a config asks for no discovery even though `dynamo.enabled` is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotRunnable {
    /// The binary was built without the `dynamo` feature (CFG-04).
    FeatureMissing,
    /// A setting the source needs is absent (validation rejects this; kept typed, not assumed).
    MissingSetting(&'static str),
}

/// The plan for `config`: `Ok(None)` when discovery is disabled.
pub fn plan_for(config: &Config) -> Result<Option<DiscoveryPlan>, NotRunnable> {
    let d = &config.dynamo;
    if !d.enabled {
        return Ok(None);
    }
    plan_for_discovery(&d.discovery).map(Some)
}

/// The plan for an enabled discovery section (the router's, or one another program embeds: the
/// event broker).
pub fn plan_for_discovery(d: &DiscoveryConfig) -> Result<DiscoveryPlan, NotRunnable> {
    if !cfg!(feature = "dynamo") {
        return Err(NotRunnable::FeatureMissing);
    }
    match d.source {
        DiscoverySource::Etcd => Ok(DiscoveryPlan::Etcd(d.etcd.clone())),
        DiscoverySource::File => {
            let f = &d.file;
            let Some(root) = &f.root else {
                return Err(NotRunnable::MissingSetting("dynamo.discovery.file.root"));
            };
            Ok(DiscoveryPlan::File(FilePlan {
                root: PathBuf::from(root),
                ttl: f.ttl,
                namespaces: f.namespaces.clone(),
            }))
        }
        DiscoverySource::KubernetesPods | DiscoverySource::Kubernetes => {
            let k = &d.kubernetes;
            if k.namespace.is_none() {
                return Err(NotRunnable::MissingSetting(
                    "dynamo.discovery.kubernetes.namespace",
                ));
            }
            Ok(if d.source == DiscoverySource::Kubernetes {
                DiscoveryPlan::KubernetesMetadata(k.clone())
            } else {
                DiscoveryPlan::KubernetesPods(k.clone())
            })
        }
    }
}

/// The reason logged (and carried by the restart counter's log line) for a watcher restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartReason {
    /// Discovery was switched on.
    Enabled,
    /// The namespace changed entirely.
    Namespace,
    /// Namespaces were added or removed while others stay (RELOAD-07).
    Namespaces,
    /// Endpoints, TLS or auth changed.
    Connection,
    /// Only `watch_reconnect_backoff` changed (RELOAD-06).
    Backoff,
    /// The discovery source changed (RELOAD-13).
    Source,
}

impl RestartReason {
    /// The log value.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartReason::Enabled => "enabled",
            RestartReason::Namespace => "namespace",
            RestartReason::Namespaces => "namespaces",
            RestartReason::Connection => "connection",
            RestartReason::Backoff => "backoff",
            RestartReason::Source => "source",
        }
    }
}

/// What happens to the registry across a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registry {
    /// Clear it now and start from an empty fleet with a new reducer.
    Reset,
    /// Keep serving the current fleet until the new watcher's first resync replaces it; the
    /// reducer (and so `first_seen`) carries over (RELOAD-06/07, Q-09).
    KeepUntilResync,
}

/// How to get from the running plan to the new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Nothing to do.
    Keep,
    /// Stop the watcher and clear the registry; not counted as a restart (RELOAD-05).
    Stop,
    /// Stop the running watcher (if any) and start a new one.
    Restart(RestartReason, Registry),
}

/// Classify a reload.
pub fn classify(old: Option<&DiscoveryPlan>, new: Option<&DiscoveryPlan>) -> Transition {
    match (old, new) {
        (None, None) => Transition::Keep,
        (Some(_), None) => Transition::Stop,
        (None, Some(_)) => Transition::Restart(RestartReason::Enabled, Registry::Reset),
        (Some(DiscoveryPlan::Etcd(a)), Some(DiscoveryPlan::Etcd(b))) => classify_etcd(a, b),
        (Some(DiscoveryPlan::File(a)), Some(DiscoveryPlan::File(b))) => classify_file(a, b),
        (Some(DiscoveryPlan::KubernetesPods(a)), Some(DiscoveryPlan::KubernetesPods(b))) => {
            classify_pods(a, b)
        }
        (
            Some(DiscoveryPlan::KubernetesMetadata(a)),
            Some(DiscoveryPlan::KubernetesMetadata(b)),
        ) => classify_metadata(a, b),
        // Another source: the records come from elsewhere; start over (RELOAD-13).
        (Some(_), Some(_)) => Transition::Restart(RestartReason::Source, Registry::Reset),
    }
}

/// Another Kubernetes namespace is another fleet; anything else (Dynamo namespaces, models,
/// timers) is re-read by the next list while the current view keeps serving.
fn classify_pods(a: &KubernetesConfig, b: &KubernetesConfig) -> Transition {
    if a == b {
        return Transition::Keep;
    }
    if a.namespace != b.namespace {
        return Transition::Restart(RestartReason::Namespace, Registry::Reset);
    }
    if a.dynamo_namespaces != b.dynamo_namespaces {
        return namespaces_changed(&a.dynamo_namespaces, &b.dynamo_namespaces);
    }
    if a.watch_reconnect_backoff != b.watch_reconnect_backoff {
        return Transition::Restart(RestartReason::Backoff, Registry::KeepUntilResync);
    }
    Transition::Restart(RestartReason::Connection, Registry::KeepUntilResync)
}

/// As for Pods (DISC-K8S-META-26), except that `model` and `models` mean nothing to this source
/// (the cards name the models): a change of only those keeps the watcher (RELOAD-15).
fn classify_metadata(a: &KubernetesConfig, b: &KubernetesConfig) -> Transition {
    let unmodelled = |c: &KubernetesConfig| KubernetesConfig {
        model: None,
        models: Vec::new(),
        ..c.clone()
    };
    classify_pods(&unmodelled(a), &unmodelled(b))
}

/// A namespace-list change: prune when some namespace stays (RELOAD-07), else start over.
fn namespaces_changed(a: &[String], b: &[String]) -> Transition {
    let kept = a.iter().any(|ns| b.contains(ns));
    if kept {
        // The new watcher's resync sweeps only the removed namespaces' records; the kept
        // graphs keep routing (RELOAD-07).
        Transition::Restart(RestartReason::Namespaces, Registry::KeepUntilResync)
    } else {
        Transition::Restart(RestartReason::Namespace, Registry::Reset)
    }
}

fn classify_file(a: &FilePlan, b: &FilePlan) -> Transition {
    if a == b {
        return Transition::Keep;
    }
    // Another directory or another liveness rule: what was read no longer holds.
    if a.root != b.root || a.ttl != b.ttl {
        return Transition::Restart(RestartReason::Connection, Registry::Reset);
    }
    namespaces_changed(&a.namespaces, &b.namespaces)
}

fn classify_etcd(a: &EtcdConfig, b: &EtcdConfig) -> Transition {
    if a == b {
        return Transition::Keep;
    }
    if a.endpoints != b.endpoints || a.tls != b.tls || a.auth != b.auth {
        return Transition::Restart(RestartReason::Connection, Registry::Reset);
    }
    if a.namespaces != b.namespaces {
        return namespaces_changed(&a.namespaces, &b.namespaces);
    }
    if a.watch_reconnect_backoff != b.watch_reconnect_backoff {
        return Transition::Restart(RestartReason::Backoff, Registry::KeepUntilResync);
    }
    // Only the scalar `namespace` spelling changed while the effective list stayed: nothing runs
    // differently.
    Transition::Keep
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use continuum_core::config::dynamo::{Backoff, EtcdEndpoint, EtcdScheme};

    use super::*;

    fn etcd(ns: &[&str]) -> DiscoveryPlan {
        DiscoveryPlan::Etcd(EtcdConfig {
            endpoints: vec![EtcdEndpoint {
                scheme: EtcdScheme::Http,
                host: "127.0.0.1".into(),
                port: 2379,
            }],
            namespaces: ns.iter().map(|s| (*s).to_string()).collect(),
            ..EtcdConfig::default()
        })
    }

    fn with(p: &DiscoveryPlan, f: impl FnOnce(&mut EtcdConfig)) -> DiscoveryPlan {
        let DiscoveryPlan::Etcd(mut c) = p.clone() else {
            panic!("not an etcd plan: {p:?}");
        };
        f(&mut c);
        DiscoveryPlan::Etcd(c)
    }

    fn file(root: &str, ttl: u64, ns: &[&str]) -> DiscoveryPlan {
        DiscoveryPlan::File(FilePlan {
            root: PathBuf::from(root),
            ttl: Duration::from_secs(ttl),
            namespaces: ns.iter().map(|s| (*s).to_string()).collect(),
        })
    }

    #[test]
    fn file_root_or_ttl_change_resets() {
        let a = file("/kv", 10, &["dynamo"]);
        assert_eq!(classify(Some(&a), Some(&a)), Transition::Keep);
        assert_eq!(
            classify(None, Some(&a)),
            Transition::Restart(RestartReason::Enabled, Registry::Reset)
        );
        assert_eq!(classify(Some(&a), None), Transition::Stop);
        for b in [
            file("/other", 10, &["dynamo"]),
            file("/kv", 30, &["dynamo"]),
        ] {
            assert_eq!(
                classify(Some(&a), Some(&b)),
                Transition::Restart(RestartReason::Connection, Registry::Reset)
            );
        }
    }

    #[test]
    fn file_namespace_changes_prune_or_reset() {
        let a = file("/kv", 10, &["prod", "canary"]);
        let b = file("/kv", 10, &["prod"]);
        assert_eq!(
            classify(Some(&a), Some(&b)),
            Transition::Restart(RestartReason::Namespaces, Registry::KeepUntilResync)
        );
        let c = file("/kv", 10, &["other"]);
        assert_eq!(
            classify(Some(&b), Some(&c)),
            Transition::Restart(RestartReason::Namespace, Registry::Reset)
        );
    }

    #[test]
    fn switching_between_etcd_and_file_is_a_source_restart_with_reset() {
        let e = etcd(&["dynamo"]);
        let f = file("/kv", 10, &["dynamo"]);
        let want = Transition::Restart(RestartReason::Source, Registry::Reset);
        assert_eq!(classify(Some(&e), Some(&f)), want, "RELOAD-13");
        assert_eq!(classify(Some(&f), Some(&e)), want, "RELOAD-13");
    }

    #[test]
    fn plan_for_the_file_source() {
        let yaml = "dynamo: { enabled: true, discovery: { source: file, file: { root: /srv/kv, \
                    ttl: 20s, namespaces: [a] } }, load: { direct_allow_cidrs: [10.0.0.0/8] } }";
        let (config, _) = Config::from_yaml(yaml, &continuum_core::config::NoEnv)
            .unwrap_or_else(|e| panic!("{:#?}", e.errors));
        let plan = plan_for(&config);
        if cfg!(feature = "dynamo") {
            assert_eq!(plan, Ok(Some(file("/srv/kv", 20, &["a"]))));
        } else {
            assert_eq!(plan, Err(NotRunnable::FeatureMissing));
        }
    }

    #[test]
    fn kv_settings_never_restart_discovery() {
        // RELOAD-16: every `dynamo.kv` field applies without a discovery restart.
        let base = "dynamo: { enabled: true, discovery: { source: file, file: { root: /srv/kv, \
                    namespaces: [a] } }";
        let before = format!("{base} }}");
        let after = format!(
            "{base}, kv: {{ enabled: true, overlap_score_credit: 2.0, router_temperature: 0.5, \
             send_token_data: true }} }}"
        );
        let plan = |yaml: &str| {
            let (config, _) = Config::from_yaml(yaml, &continuum_core::config::NoEnv)
                .unwrap_or_else(|e| panic!("{:#?}", e.errors));
            assert_eq!(config.dynamo.kv.enabled, yaml.contains("kv:"));
            plan_for(&config)
        };
        let (a, b) = (plan(&before), plan(&after));
        assert_eq!(a, b);
        if let (Ok(a), Ok(b)) = (a, b) {
            assert_eq!(classify(a.as_ref(), b.as_ref()), Transition::Keep);
        }
    }

    #[test]
    fn enable_disable_and_no_change() {
        let a = etcd(&["dynamo"]);
        assert_eq!(classify(None, None), Transition::Keep);
        assert_eq!(classify(Some(&a), Some(&a)), Transition::Keep);
        assert_eq!(
            classify(Some(&a), None),
            Transition::Stop,
            "disabling is not a restart (RELOAD-05)"
        );
        assert_eq!(
            classify(None, Some(&a)),
            Transition::Restart(RestartReason::Enabled, Registry::Reset)
        );
    }

    #[test]
    fn connection_changes_reset_the_registry() {
        let a = etcd(&["dynamo"]);
        let b = with(&a, |c| c.endpoints[0].port = 2380);
        assert_eq!(
            classify(Some(&a), Some(&b)),
            Transition::Restart(RestartReason::Connection, Registry::Reset)
        );
        let b = with(&a, |c| {
            c.auth = Some(continuum_core::config::dynamo::EtcdAuth {
                username: "u".into(),
                password: continuum_core::config::dynamo::Secret::new("p".into()),
            })
        });
        assert_eq!(
            classify(Some(&a), Some(&b)),
            Transition::Restart(RestartReason::Connection, Registry::Reset)
        );
    }

    #[test]
    fn namespace_changes_prune_or_reset() {
        let a = etcd(&["prod", "canary"]);
        let b = etcd(&["prod"]);
        assert_eq!(
            classify(Some(&a), Some(&b)),
            Transition::Restart(RestartReason::Namespaces, Registry::KeepUntilResync)
        );
        let c = etcd(&["other"]);
        assert_eq!(
            classify(Some(&b), Some(&c)),
            Transition::Restart(RestartReason::Namespace, Registry::Reset)
        );
    }

    #[test]
    fn backoff_only_keeps_the_snapshot() {
        let a = etcd(&["dynamo"]);
        let b = with(&a, |c| {
            c.watch_reconnect_backoff = Backoff {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(60),
            }
        });
        assert_eq!(
            classify(Some(&a), Some(&b)),
            Transition::Restart(RestartReason::Backoff, Registry::KeepUntilResync)
        );
    }

    fn pods(namespace: &str, dynamo: &[&str]) -> DiscoveryPlan {
        DiscoveryPlan::KubernetesPods(KubernetesConfig {
            namespace: Some(namespace.into()),
            dynamo_namespaces: dynamo.iter().map(|s| (*s).to_string()).collect(),
            model: Some("m".into()),
            ..KubernetesConfig::default()
        })
    }

    #[test]
    fn pod_source_reloads_reset_only_for_another_kubernetes_namespace() {
        let a = pods("dynamo", &["x", "y"]);
        assert_eq!(classify(Some(&a), Some(&a.clone())), Transition::Keep);
        assert_eq!(
            classify(Some(&a), Some(&pods("other", &["x", "y"]))),
            Transition::Restart(RestartReason::Namespace, Registry::Reset)
        );
        assert_eq!(
            classify(Some(&a), Some(&pods("dynamo", &["x"]))),
            Transition::Restart(RestartReason::Namespaces, Registry::KeepUntilResync)
        );
        let DiscoveryPlan::KubernetesPods(mut remodelled) = a.clone() else {
            unreachable!()
        };
        remodelled.model = Some("other-model".into());
        assert_eq!(
            classify(Some(&a), Some(&DiscoveryPlan::KubernetesPods(remodelled))),
            Transition::Restart(RestartReason::Connection, Registry::KeepUntilResync)
        );
        // Another source entirely starts over.
        assert_eq!(
            classify(Some(&a), Some(&etcd(&["x"]))),
            Transition::Restart(RestartReason::Source, Registry::Reset)
        );
    }

    fn metadata(namespace: &str, dynamo: &[&str]) -> DiscoveryPlan {
        let DiscoveryPlan::KubernetesPods(k) = pods(namespace, dynamo) else {
            unreachable!()
        };
        DiscoveryPlan::KubernetesMetadata(k)
    }

    #[test]
    fn metadata_source_reloads_follow_the_pod_rules_but_ignore_models() {
        let a = metadata("dynamo", &["x", "y"]);
        assert_eq!(classify(Some(&a), Some(&a.clone())), Transition::Keep);
        assert_eq!(
            classify(Some(&a), Some(&metadata("other", &["x", "y"]))),
            Transition::Restart(RestartReason::Namespace, Registry::Reset)
        );
        assert_eq!(
            classify(Some(&a), Some(&metadata("dynamo", &["x"]))),
            Transition::Restart(RestartReason::Namespaces, Registry::KeepUntilResync)
        );
        assert_eq!(
            classify(Some(&a), Some(&metadata("dynamo", &["z"]))),
            Transition::Restart(RestartReason::Namespace, Registry::Reset)
        );
        // RELOAD-15: only model / models changed: the watcher and the registry stay.
        let DiscoveryPlan::KubernetesMetadata(mut remodelled) = a.clone() else {
            unreachable!()
        };
        remodelled.model = Some("other-model".into());
        remodelled.models = vec![];
        assert_eq!(
            classify(
                Some(&a),
                Some(&DiscoveryPlan::KubernetesMetadata(remodelled.clone()))
            ),
            Transition::Keep
        );
        remodelled.watch_timeout = Duration::from_secs(10);
        assert_eq!(
            classify(
                Some(&a),
                Some(&DiscoveryPlan::KubernetesMetadata(remodelled))
            ),
            Transition::Restart(RestartReason::Connection, Registry::KeepUntilResync)
        );
        // RELOAD-13: from or to another source.
        assert_eq!(
            classify(Some(&a), Some(&pods("dynamo", &["x", "y"]))),
            Transition::Restart(RestartReason::Source, Registry::Reset)
        );
    }
}
