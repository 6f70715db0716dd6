//! What discovery should be running for a config, and how a reload moves from one plan to the
//! next (RELOAD-04..07, 13; ). Pure: unit-tested without any watcher.

use continuum_core::config::Config;
use continuum_core::config::dynamo::{DiscoverySource, EtcdConfig};

/// The discovery a config asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum DiscoveryPlan {
    /// Watch etcd with these settings (namespaces are the effective list).
    Etcd(EtcdConfig),
}

/// Why a config asks for no discovery even though `dynamo.enabled` is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotRunnable {
    /// The binary was built without the `dynamo` feature (CFG-04).
    FeatureMissing,
    /// The configured source is not implemented in this build.
    SourceUnsupported(DiscoverySource),
}

/// The plan for `config`: `Ok(None)` when discovery is disabled.
pub fn plan_for(config: &Config) -> Result<Option<DiscoveryPlan>, NotRunnable> {
    let d = &config.dynamo;
    if !d.enabled {
        return Ok(None);
    }
    if !cfg!(feature = "dynamo") {
        return Err(NotRunnable::FeatureMissing);
    }
    match d.discovery.source {
        DiscoverySource::Etcd => Ok(Some(DiscoveryPlan::Etcd(d.discovery.etcd.clone()))),
        other => Err(NotRunnable::SourceUnsupported(other)),
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
    }
}

fn classify_etcd(a: &EtcdConfig, b: &EtcdConfig) -> Transition {
    if a == b {
        return Transition::Keep;
    }
    if a.endpoints != b.endpoints || a.tls != b.tls || a.auth != b.auth {
        return Transition::Restart(RestartReason::Connection, Registry::Reset);
    }
    if a.namespaces != b.namespaces {
        let kept = a.namespaces.iter().any(|ns| b.namespaces.contains(ns));
        return if kept {
            // The new watcher's resync sweeps only the removed namespaces' records; the kept
            // graphs keep routing (RELOAD-07).
            Transition::Restart(RestartReason::Namespaces, Registry::KeepUntilResync)
        } else {
            Transition::Restart(RestartReason::Namespace, Registry::Reset)
        };
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
        let DiscoveryPlan::Etcd(mut c) = p.clone();
        f(&mut c);
        DiscoveryPlan::Etcd(c)
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
}
