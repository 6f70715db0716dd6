//! What this binary was built with, and the refusal of configs that need more (BUILD-01..03).
//!
//! A config that validates must do what it says: `dynamo.enabled` in a build without the `dynamo`
//! feature or `dynamo.kv.enabled` without `dynamo-kv` is an error of `config validate`, of
//! startup and of every reload — never a log line and a silently disabled feature. (Every
//! discovery source is implemented in a `dynamo` build.) `dynamo.event_bus.enabled` needs
//! `dynamo-event-bus`.
//!
//! Invariant: [`Config::check_build`] only reads the config; it never changes what validated.

use super::{Config, FieldError};

/// The optional features compiled into the running binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Build {
    /// Cargo feature `dynamo`: discovery (etcd, file store, Kubernetes) and load ingest.
    pub dynamo: bool,
    /// Cargo feature `dynamo-kv`: kv-events ingest and the KV index (KV-IDX-01).
    pub dynamo_kv: bool,
    /// Cargo feature `dynamo-event-bus`: the event bus listener (BUS-01).
    pub event_bus: bool,
}

impl Build {
    /// A build with every feature (tests of the refusal rules use narrower ones).
    pub const FULL: Build = Build {
        dynamo: true,
        dynamo_kv: true,
        event_bus: true,
    };
}

impl Config {
    /// Every setting of this config that `build` cannot honour, as field errors.
    pub fn check_build(&self, build: Build) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let d = &self.dynamo;
        if d.enabled && !build.dynamo {
            errors.push(FieldError {
                field: "dynamo.enabled".into(),
                value: "true".into(),
                reason: "this binary was built without the `dynamo` feature".into(),
            });
        }
        if d.kv.enabled && !build.dynamo_kv {
            errors.push(FieldError {
                field: "dynamo.kv.enabled".into(),
                value: "true".into(),
                reason: "this binary was built without the `dynamo-kv` feature".into(),
            });
        }
        if d.event_bus.enabled && !build.event_bus {
            errors.push(FieldError {
                field: "dynamo.event_bus.enabled".into(),
                value: "true".into(),
                reason: "this binary was built without the `dynamo-event-bus` feature".into(),
            });
        }
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NoEnv;

    fn config(yaml: &str) -> Config {
        Config::from_yaml(yaml, &NoEnv).expect("valid").0
    }

    const BASE: &str = "backends: []\n";

    #[test]
    fn a_plain_config_fits_every_build() {
        let c = config(BASE);
        for dynamo in [false, true] {
            for dynamo_kv in [false, true] {
                assert!(
                    c.check_build(Build {
                        dynamo,
                        dynamo_kv,
                        event_bus: false
                    })
                    .is_empty()
                );
            }
        }
    }

    #[test]
    fn dynamo_without_the_feature_is_refused_with_field_value_and_reason() {
        let c = config(
            "dynamo:\n  enabled: true\n  discovery:\n    source: etcd\n    etcd:\n      endpoints: [\"http://127.0.0.1:2379\"]\n",
        );
        assert!(c.check_build(Build::FULL).is_empty());
        let errs = c.check_build(Build {
            dynamo: false,
            dynamo_kv: false,
            event_bus: false,
        });
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].field, "dynamo.enabled");
        assert_eq!(errs[0].value, "true");
        assert!(errs[0].reason.contains("`dynamo` feature"));
    }

    #[test]
    fn kv_without_its_feature_is_refused() {
        let c = config(
            "dynamo:\n  enabled: true\n  discovery:\n    source: etcd\n    etcd:\n      endpoints: [\"http://127.0.0.1:2379\"]\n  kv:\n    enabled: true\n",
        );
        assert!(c.check_build(Build::FULL).is_empty());
        let errs = c.check_build(Build {
            dynamo: true,
            dynamo_kv: false,
            event_bus: true,
        });
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].field, "dynamo.kv.enabled");
    }

    /// BUS-01: the listener needs `dynamo-event-bus`; the section itself is validated the same in
    /// every build.
    #[test]
    fn an_enabled_event_bus_needs_its_feature() {
        let c = config(
            "dynamo:\n  event_bus:\n    enabled: true\n    listen: \"0.0.0.0:7443\"\n    tls: { cert: /c, key: /k }\n    \
             brokers: [ { id: b.dynamo, token_hash: \"sha256:0000000000000000000000000000000000000000000000000000000000000000\", namespaces: [dynamo] } ]\n",
        );
        assert!(c.check_build(Build::FULL).is_empty());
        let errs = c.check_build(Build {
            dynamo: true,
            dynamo_kv: true,
            event_bus: false,
        });
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].field, "dynamo.event_bus.enabled");
        assert!(errs[0].reason.contains("`dynamo-event-bus` feature"));
        let off = config("dynamo:\n  event_bus:\n    enabled: false\n");
        assert!(
            off.check_build(Build {
                dynamo: false,
                dynamo_kv: false,
                event_bus: false
            })
            .is_empty()
        );
    }

    #[test]
    fn both_kubernetes_sources_fit_a_dynamo_build() {
        let kube = |source: &str, extra: &str| {
            config(&format!(
                "backends:\n  - {{ name: fe, type: openai, url: \"http://127.0.0.1:9\" }}\n\
                 dynamo:\n  enabled: true\n  discovery:\n    source: {source}\n    kubernetes:\n      \
                 namespace: dynamo\n      dynamo_namespace: ns\n{extra}  shim:\n    backends: [fe]\n"
            ))
        };
        for c in [
            kube("kubernetes_pods", "      model: m\n"),
            kube("kubernetes", ""),
        ] {
            assert!(c.check_build(Build::FULL).is_empty());
            let errs = c.check_build(Build {
                dynamo: false,
                dynamo_kv: false,
                event_bus: false,
            });
            assert_eq!(errs.len(), 1, "{errs:?}");
            assert_eq!(errs[0].field, "dynamo.enabled");
        }
    }
}
