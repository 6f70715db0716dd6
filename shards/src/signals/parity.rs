//! The hash-parity watchdog's router-wide side: per-model verdict counts
//! (`continuum_dynamo_kv_prediction_hits_total{model}` / `..._misses_total{model}`) and the
//! once-per-model warning when a model's predictions keep missing (issue 11, item 6).
//!
//! Every shard settles its own predictions ([`continuum_core::kv::parity::Predictions`], in its
//! housekeeping task, never on a request) and records the verdicts here.
//!
//! Invariants: the mutex is taken only to record a shard's verdicts (at most
//! [`continuum_core::kv::parity::PENDING`] per shard per housekeeping round) and by a scrape;
//! never by a request. At most [`MAX_MODELS`] models are kept (verdicts of others are not
//! counted), so fleet-chosen model names cannot grow it without bound.

use std::collections::BTreeMap;
use std::sync::Mutex;

use continuum_core::kv::parity::{ModelParity, Verdict};

/// Models whose verdicts are counted.
pub const MAX_MODELS: usize = 256;

/// Every model's verdicts.
#[derive(Debug, Default)]
pub struct ParityBoard {
    models: Mutex<BTreeMap<Box<str>, ModelParity>>,
}

impl ParityBoard {
    /// Record verdicts under one lock: `settle` is handed a recorder to call per verdict.
    pub fn record_all(&self, settle: impl FnOnce(&mut dyn FnMut(&str, Verdict))) {
        let mut models = self
            .models
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        settle(&mut |model, v| {
            if !models.contains_key(model) {
                if models.len() >= MAX_MODELS {
                    return;
                }
                models.insert(model.into(), ModelParity::default());
            }
            let Some(counts) = models.get_mut(model) else {
                return;
            };
            if counts.record(v) {
                tracing::warn!(
                    model,
                    hits = counts.hits,
                    misses = counts.misses,
                    "KV hash predictions keep missing: the workers chosen by KV-aware picks \
                     store this model's prompts under other block hashes than the router \
                     computes (block size, cache salt, LoRA or chat-template drift?), so KV \
                     overlap is never found; see continuum_dynamo_kv_prediction_misses_total"
                );
            }
        });
    }

    /// `(hits, misses)` of `model` (zeros when none recorded).
    #[cfg(test)]
    pub fn counts(&self, model: &str) -> (u64, u64) {
        let models = self
            .models
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        models.get(model).map_or((0, 0), |c| (c.hits, c.misses))
    }

    /// Append both families, one sample per model recorded.
    pub fn render_metrics(&self, out: &mut String) {
        use continuum_core::load::metrics::escape_label;
        use std::fmt::Write as _;
        let models = self
            .models
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (name, what, pick) in [
            (
                "continuum_dynamo_kv_prediction_hits_total",
                "stored by the chosen rank under the predicted hashes",
                (|c: &ModelParity| c.hits) as fn(&ModelParity) -> u64,
            ),
            (
                "continuum_dynamo_kv_prediction_misses_total",
                "never stored by the chosen rank under the predicted hashes while its events flowed",
                |c: &ModelParity| c.misses,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} KV-aware picks whose prompt blocks were {what}.\n# TYPE {name} counter"
            );
            for (model, c) in models.iter() {
                out.push_str(name);
                out.push_str("{model=\"");
                escape_label(out, model);
                let _ = writeln!(out, "\"}} {}", pick(c));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use continuum_core::kv::parity::WARN_STREAK;

    #[test]
    fn verdicts_are_counted_per_model_and_rendered_escaped() {
        let b = ParityBoard::default();
        b.record_all(|r| {
            r("a", Verdict::Hit);
            r("a", Verdict::Miss);
            r("b\"x", Verdict::Miss);
        });
        b.record_all(|r| r("a", Verdict::Hit));
        assert_eq!(b.counts("a"), (2, 1));
        assert_eq!(b.counts("b\"x"), (0, 1));
        assert_eq!(b.counts("c"), (0, 0));
        let mut out = String::new();
        b.render_metrics(&mut out);
        assert!(out.contains("continuum_dynamo_kv_prediction_hits_total{model=\"a\"} 2\n"));
        assert!(out.contains("continuum_dynamo_kv_prediction_misses_total{model=\"a\"} 1\n"));
        assert!(out.contains("continuum_dynamo_kv_prediction_misses_total{model=\"b\\\"x\"} 1\n"));
        assert!(out.contains("# TYPE continuum_dynamo_kv_prediction_hits_total counter"));
    }

    #[test]
    fn models_beyond_the_cap_are_not_counted() {
        let b = ParityBoard::default();
        b.record_all(|r| {
            for i in 0..MAX_MODELS + 5 {
                r(&format!("m{i}"), Verdict::Miss);
            }
        });
        assert_eq!(b.counts("m0"), (0, 1));
        assert_eq!(b.counts(&format!("m{}", MAX_MODELS - 1)), (0, 1));
        assert_eq!(b.counts(&format!("m{MAX_MODELS}")), (0, 0));
        // Known models keep counting.
        b.record_all(|r| {
            for _ in 0..WARN_STREAK {
                r("m0", Verdict::Miss);
            }
        });
        assert_eq!(b.counts("m0"), (0, 1 + u64::from(WARN_STREAK)));
    }
}
