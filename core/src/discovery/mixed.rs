//! Detection of newly mixed `(namespace, model)` pairs in published views (PICK-15/16).
//!
//! Role: a namespace that serves one model with both prefill-or-decode workers and aggregated
//! workers cannot be served by `dynamo.frontend --router-mode direct` (Dynamo 1.5.0). When a pair
//! first becomes mixed, report it once with worker counts per role.
//!
//! Invariants:
//! - a pair is reported when it becomes mixed and not again while it stays mixed; once it stops
//!   being mixed it is forgotten, so a later relapse is reported again;
//! - one publication lists at most [`MAX_LISTED_MIXED`] pairs (sorted), the rest in one
//!   [`Diagnostic::MixedSummary`];
//! - only workers with a model and a routable role count; `unknown` workers are never routed.

use std::collections::{BTreeMap, BTreeSet};

use super::diag::{Diagnostic, MAX_LISTED_MIXED, Sink};
use super::fleet::{FleetView, Role};
use super::records::clip;

/// Remembers which pairs are mixed in the last published view.
#[derive(Debug, Default)]
pub struct MixedTracker {
    mixed: BTreeSet<(String, String)>,
}

#[derive(Default)]
struct Counts {
    prefill: usize,
    decode: usize,
    aggregated: usize,
}

impl MixedTracker {
    /// Observes a newly published view and reports the pairs that became mixed in it.
    pub(crate) fn observe(&mut self, view: &FleetView, sink: &mut Sink) {
        let mut counts: BTreeMap<(&str, &str), Counts> = BTreeMap::new();
        for w in &view.workers {
            let Some(model) = w.model.as_deref() else {
                continue;
            };
            let c = counts.entry((w.namespace.as_str(), model)).or_default();
            match w.role {
                Role::Prefill => c.prefill += 1,
                Role::Decode => c.decode += 1,
                Role::Aggregated => c.aggregated += 1,
                Role::Unknown => {}
            }
        }
        let mut now = BTreeSet::new();
        let mut fresh = Vec::new();
        for ((ns, model), c) in counts {
            if c.aggregated == 0 || c.prefill + c.decode == 0 {
                continue;
            }
            let pair = (ns.to_owned(), model.to_owned());
            if !self.mixed.contains(&pair) {
                fresh.push((ns, model, c));
            }
            now.insert(pair);
        }
        let total = fresh.len();
        for (ns, model, c) in fresh.into_iter().take(MAX_LISTED_MIXED) {
            sink.push(Diagnostic::MixedNamespace {
                namespace: ns.to_owned(),
                model: clip(model),
                prefill: c.prefill,
                decode: c.decode,
                aggregated: c.aggregated,
            });
        }
        if total > MAX_LISTED_MIXED {
            sink.push(Diagnostic::MixedSummary {
                logged: MAX_LISTED_MIXED,
                omitted: total - MAX_LISTED_MIXED,
            });
        }
        self.mixed = now;
    }
}
