//! What this binary was built with, and what a config asks of a build that lacks it (CFG-04,
//! BUILD-01..03).
//!
//! A build without a feature parses and validates its config section exactly as a full build
//! does; what it cannot do is then switched off in the config it runs, with one loud warning per
//! feature (printed by `config validate`, logged at startup and on every reload). So a config
//! that validates anywhere validates everywhere, and a featureless build serves plain routing:
//! - `dynamo.enabled` without `dynamo`: discovery, load ingest and the shim pins are off (such a
//!   build also lacks the two features below, which imply `dynamo`);
//! - `dynamo.kv.enabled` without `dynamo-kv`: load-based picks, no prompt pipeline;
//! - `dynamo.event_bus.enabled` without `dynamo-event-bus`: no listener.
//!
//! Invariant: [`Config::fit_build`] only ever switches features off; every other field is the
//! file's, so a full build's config is returned unchanged and without warnings.

use super::{Config, Warning};

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
    /// A build with every feature (the official release binaries, BUILD-03).
    pub const FULL: Build = Build {
        dynamo: true,
        dynamo_kv: true,
        event_bus: true,
    };

    /// Each optional feature's Cargo name and whether this build has it, in dependency order.
    pub fn features(self) -> [(&'static str, bool); 3] {
        [
            ("dynamo", self.dynamo),
            ("dynamo-kv", self.dynamo_kv),
            ("dynamo-event-bus", self.event_bus),
        ]
    }
}

/// The warning for `field`, set in the file, that needs `feature`, which this build lacks.
fn unbuilt(field: &str, feature: &str, effect: &str) -> Warning {
    Warning {
        field: field.into(),
        message: format!(
            "this binary was built without the `{feature}` feature: {effect} (the official release build has it: scripts/build-release.sh)"
        ),
    }
}

impl Config {
    /// This config as `build` can run it: every feature the build lacks switched off, with one
    /// warning per setting that asked for it (CFG-04). Nothing else changes.
    pub fn fit_build(mut self, build: Build) -> (Config, Vec<Warning>) {
        let d = &mut self.dynamo;
        // The section each feature runs, in `Build::features` order.
        let sections = [
            (
                "dynamo.enabled",
                &mut d.enabled,
                "discovery is disabled and requests are routed to the configured backends without pins",
            ),
            (
                "dynamo.kv.enabled",
                &mut d.kv.enabled,
                "kv-events are not indexed and picks are load-based",
            ),
            (
                "dynamo.event_bus.enabled",
                &mut d.event_bus.enabled,
                "the event bus listener is not started and no broker can dial this router",
            ),
        ];
        let mut warnings = Vec::new();
        for ((feature, built), (field, enabled, effect)) in
            build.features().into_iter().zip(sections)
        {
            if !built && *enabled {
                warnings.push(unbuilt(field, feature, effect));
                *enabled = false;
            }
        }
        (self, warnings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NoEnv;

    fn config(yaml: &str) -> Config {
        Config::from_yaml(yaml, &NoEnv).expect("valid").0
    }

    /// Every combination of the three features.
    fn builds() -> impl Iterator<Item = Build> {
        (0..8u8).map(|b| Build {
            dynamo: b & 1 != 0,
            dynamo_kv: b & 2 != 0,
            event_bus: b & 4 != 0,
        })
    }

    const ETCD: &str = "dynamo:\n  enabled: true\n  discovery:\n    source: etcd\n    etcd:\n      endpoints: [\"http://127.0.0.1:2379\"]\n";

    const BUS: &str = "  event_bus:\n    enabled: true\n    listen: \"0.0.0.0:7443\"\n    tls: { cert: /c, key: /k }\n    \
         brokers: [ { id: b.dynamo, token_hash: \"sha256:0000000000000000000000000000000000000000000000000000000000000000\", namespaces: [dynamo] } ]\n";

    #[test]
    fn a_plain_config_fits_every_build_unchanged() {
        let c = config("backends: []\n");
        for build in builds() {
            let (fitted, warnings) = c.clone().fit_build(build);
            assert_eq!(fitted, c, "{build:?}");
            assert!(warnings.is_empty(), "{build:?}: {warnings:?}");
        }
    }

    #[test]
    fn the_full_build_runs_every_feature_as_written() {
        let c = config(&format!("{ETCD}  kv:\n    enabled: true\n{BUS}"));
        let (fitted, warnings) = c.clone().fit_build(Build::FULL);
        assert_eq!(fitted, c);
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    /// CFG-04: without `dynamo` the section validates the same, discovery is off with a warning
    /// naming the field, the feature and the release build, and nothing else changes.
    #[test]
    fn dynamo_without_the_feature_warns_and_switches_only_discovery_off() {
        let c = config(ETCD);
        assert!(c.dynamo.enabled);
        let (fitted, warnings) = c.clone().fit_build(Build {
            dynamo: false,
            dynamo_kv: false,
            event_bus: false,
        });
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0].field, "dynamo.enabled");
        assert!(
            warnings[0].message.contains("`dynamo` feature"),
            "{warnings:?}"
        );
        assert!(
            warnings[0].message.contains("discovery is disabled"),
            "{warnings:?}"
        );
        assert!(
            warnings[0].message.contains("build-release"),
            "{warnings:?}"
        );
        assert!(!fitted.dynamo.enabled);
        let mut expected = c;
        expected.dynamo.enabled = false;
        assert_eq!(fitted, expected);
    }

    #[test]
    fn kv_without_its_feature_picks_by_load() {
        let c = config(&format!("{ETCD}  kv:\n    enabled: true\n"));
        let (fitted, warnings) = c.clone().fit_build(Build {
            dynamo: true,
            dynamo_kv: false,
            event_bus: true,
        });
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0].field, "dynamo.kv.enabled");
        assert!(warnings[0].message.contains("load-based"), "{warnings:?}");
        assert!(fitted.dynamo.enabled, "discovery stays");
        assert!(!fitted.dynamo.kv.enabled);
        // Every other kv setting is the file's.
        let mut expected = c;
        expected.dynamo.kv.enabled = false;
        assert_eq!(fitted, expected);
    }

    /// BUS-01: the listener needs `dynamo-event-bus`; the section is validated the same in every
    /// build.
    #[test]
    fn an_enabled_event_bus_without_its_feature_is_not_started() {
        let c = config(&format!("dynamo:\n{BUS}"));
        let (fitted, warnings) = c.clone().fit_build(Build {
            dynamo: true,
            dynamo_kv: true,
            event_bus: false,
        });
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0].field, "dynamo.event_bus.enabled");
        assert!(
            warnings[0].message.contains("`dynamo-event-bus` feature"),
            "{warnings:?}"
        );
        assert!(!fitted.dynamo.event_bus.enabled);
        assert_eq!(fitted.dynamo.event_bus.listen, c.dynamo.event_bus.listen);
    }

    /// A warning per setting the build cannot honour, whichever features it lacks; a feature the
    /// build has is never touched.
    #[test]
    fn each_missing_feature_warns_once_and_only_for_what_the_file_enables() {
        let c = config(&format!("{ETCD}  kv:\n    enabled: true\n{BUS}"));
        for build in builds() {
            let (fitted, warnings) = c.clone().fit_build(build);
            let fields: Vec<&str> = warnings.iter().map(|w| w.field.as_str()).collect();
            let mut expected = Vec::new();
            if !build.dynamo {
                expected.push("dynamo.enabled");
            }
            if !build.dynamo_kv {
                expected.push("dynamo.kv.enabled");
            }
            if !build.event_bus {
                expected.push("dynamo.event_bus.enabled");
            }
            assert_eq!(fields, expected, "{build:?}");
            assert_eq!(fitted.dynamo.enabled, build.dynamo, "{build:?}");
            assert_eq!(fitted.dynamo.kv.enabled, build.dynamo_kv, "{build:?}");
            assert_eq!(
                fitted.dynamo.event_bus.enabled, build.event_bus,
                "{build:?}"
            );
            // Fitting twice changes nothing more and warns no more.
            let (again, more) = fitted.clone().fit_build(build);
            assert_eq!(again, fitted);
            assert!(more.is_empty(), "{build:?}: {more:?}");
        }
    }

    #[test]
    fn both_kubernetes_sources_validate_in_a_build_without_dynamo() {
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
            assert!(c.clone().fit_build(Build::FULL).1.is_empty());
            let (fitted, warnings) = c.fit_build(Build {
                dynamo: false,
                dynamo_kv: false,
                event_bus: false,
            });
            assert_eq!(warnings.len(), 1, "{warnings:?}");
            assert_eq!(warnings[0].field, "dynamo.enabled");
            assert!(!fitted.dynamo.enabled);
        }
    }
}
