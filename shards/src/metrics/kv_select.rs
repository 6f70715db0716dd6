//! The KV-aware selection counters: `continuum_dynamo_kv_selection_total{result}` (KV-PICK-09,
//! OBS-12), one cell per result and shard, and the control thread's
//! `continuum_dynamo_kv_artifacts_total{result}` (OBS-11).
//!
//! Invariants: both label sets are the closed enums of `continuum_core::artifacts`, every label
//! rendered (zeros included) so the families never change shape; each shard cell has one writer.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use continuum_core::artifacts::{ArtifactResult, KvSelection};

/// One shard's `kv_selection_total` cells, in `KvSelection::ALL` order.
#[derive(Debug, Default)]
pub(crate) struct KvSelectionCounters([AtomicU64; KvSelection::ALL.len()]);

impl KvSelectionCounters {
    /// Count one selection with `result`.
    pub(crate) fn count(&self, result: KvSelection) {
        if let Some(c) = self.0.get(result.index()) {
            super::bump(c);
        }
    }

    /// The count of `result` (tests, admin).
    #[cfg(test)]
    pub(crate) fn get(&self, result: KvSelection) -> u64 {
        self.0.get(result.index()).map_or(0, |c| c.load(Relaxed))
    }
}

/// Render both families.
pub(crate) fn render<'a>(
    out: &mut String,
    shards: impl Iterator<Item = &'a KvSelectionCounters> + Clone,
    artifacts: &[AtomicU64; ArtifactResult::ALL.len()],
) {
    let _ = writeln!(
        out,
        "# HELP continuum_dynamo_kv_selection_total KV-aware selections by result (and why KV was skipped).\n\
         # TYPE continuum_dynamo_kv_selection_total counter"
    );
    for r in KvSelection::ALL {
        let v: u64 = shards
            .clone()
            .map(|s| s.0.get(r.index()).map_or(0, |c| c.load(Relaxed)))
            .sum();
        let _ = writeln!(
            out,
            "continuum_dynamo_kv_selection_total{{result=\"{}\"}} {v}",
            r.label()
        );
    }
    let _ = writeln!(
        out,
        "# HELP continuum_dynamo_kv_artifacts_total Tokenizer and chat-template artifacts by outcome.\n\
         # TYPE continuum_dynamo_kv_artifacts_total counter"
    );
    for (r, c) in ArtifactResult::ALL.iter().zip(artifacts) {
        let _ = writeln!(
            out,
            "continuum_dynamo_kv_artifacts_total{{result=\"{}\"}} {}",
            r.label(),
            c.load(Relaxed)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_label_renders_and_shards_are_summed() {
        let a = KvSelectionCounters::default();
        let b = KvSelectionCounters::default();
        a.count(KvSelection::Overlap);
        b.count(KvSelection::Overlap);
        b.count(KvSelection::ArtifactUnpinned);
        assert_eq!(b.get(KvSelection::ArtifactUnpinned), 1);
        let artifacts: [AtomicU64; ArtifactResult::ALL.len()] = Default::default();
        artifacts[ArtifactResult::Unpinned.index()].store(3, Relaxed);
        let mut out = String::new();
        render(&mut out, [&a, &b].into_iter(), &artifacts);
        assert!(out.contains("continuum_dynamo_kv_selection_total{result=\"overlap\"} 2\n"));
        assert!(
            out.contains("continuum_dynamo_kv_selection_total{result=\"artifact_unpinned\"} 1\n")
        );
        assert!(out.contains("continuum_dynamo_kv_selection_total{result=\"bypass\"} 0\n"));
        assert!(out.contains("continuum_dynamo_kv_artifacts_total{result=\"unpinned\"} 3\n"));
        let series = out.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(series, KvSelection::ALL.len() + ArtifactResult::ALL.len());
    }
}
