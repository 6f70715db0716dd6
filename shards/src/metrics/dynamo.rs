//! The shim path's counters: `continuum_dynamo_selection_total{role, reason}` (OBS-05),
//! `disaggregated_errors_total{phase}` and `disaggregated_requests_total{routing_path}` (OBS-13,
//! SHIM-22), and `continuum_dynamo_repicks_total{reason}` (issue 38).
//!
//! Like every shard counter, each cell has one writer (its shard) and is summed at scrape. The
//! label sets are closed enums from `core`. The two `disaggregated_*` families keep the names the
//! specification gives them (no `continuum_` prefix), so dashboards written from the spec work.
//! No per-stage duration histogram exists: prefill and decode run inside the shim (SHIM-22).

use super::bump;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use continuum_core::picker::{SelectionEvent, SelectionReason, SelectionRole};
use continuum_core::shim::{ErrorPhase, RepickReason, RoutingPath};

const ROLES: [SelectionRole; 2] = [SelectionRole::Prefill, SelectionRole::Decode];
/// Every `reason` of OBS-05 (KV-PICK-17), `conditional_bypass` included (KV-PICK-14).
const REASONS: [&str; 5] = [
    "load",
    "round_robin_stale",
    "no_prefill_pool",
    "kv_aware",
    "conditional_bypass",
];
const PHASES: [ErrorPhase; 2] = [ErrorPhase::Orchestration, ErrorPhase::Decode];

/// The index of `r` in [`REASONS`] (a match, not a label search: this runs twice per pick).
fn reason_index(r: SelectionReason) -> usize {
    match r {
        SelectionReason::Load => 0,
        SelectionReason::RoundRobinStale => 1,
        SelectionReason::NoPrefillPool => 2,
        SelectionReason::KvAware => 3,
        SelectionReason::ConditionalBypass => 4,
    }
}

fn role_index(r: SelectionRole) -> usize {
    match r {
        SelectionRole::Prefill => 0,
        SelectionRole::Decode => 1,
    }
}

fn phase_index(p: ErrorPhase) -> usize {
    match p {
        ErrorPhase::Orchestration => 0,
        ErrorPhase::Decode => 1,
    }
}

fn repick_index(r: RepickReason) -> usize {
    RepickReason::ALL.iter().position(|x| *x == r).unwrap_or(0)
}

fn path_index(p: RoutingPath) -> usize {
    RoutingPath::ALL.iter().position(|x| *x == p).unwrap_or(0)
}

/// One shard's shim-path counters.
#[derive(Debug, Default)]
pub(crate) struct DynamoCounters {
    selection: [[AtomicU64; REASONS.len()]; ROLES.len()],
    errors: [AtomicU64; PHASES.len()],
    requests: [AtomicU64; RoutingPath::ALL.len()],
    repicks: [AtomicU64; RepickReason::ALL.len()],
}

impl DynamoCounters {
    /// Count one selection event.
    pub(crate) fn selection(&self, e: SelectionEvent) {
        bump(&self.selection[role_index(e.role)][reason_index(e.reason)]);
    }

    /// Count one `disaggregated_errors_total{phase}`.
    pub(crate) fn error(&self, phase: ErrorPhase) {
        bump(&self.errors[phase_index(phase)]);
    }

    /// Count one re-pick after a dead pinned worker.
    pub(crate) fn repick(&self, reason: RepickReason) {
        bump(&self.repicks[repick_index(reason)]);
    }

    /// Count one orchestrated request by the path it finally took.
    pub(crate) fn request(&self, path: RoutingPath) {
        bump(&self.requests[path_index(path)]);
    }
}

/// Append the three families, summed over `shards`.
pub(crate) fn render<'a>(
    out: &mut String,
    shards: impl Iterator<Item = &'a DynamoCounters> + Clone,
) {
    let _ = writeln!(
        out,
        "# HELP continuum_dynamo_selection_total Worker selections by stage and reason.\n\
         # TYPE continuum_dynamo_selection_total counter"
    );
    for role in ROLES {
        for (ri, reason) in REASONS.iter().enumerate() {
            let v: u64 = shards
                .clone()
                .map(|s| s.selection[role_index(role)][ri].load(Relaxed))
                .sum();
            let _ = writeln!(
                out,
                "continuum_dynamo_selection_total{{role=\"{}\",reason=\"{reason}\"}} {v}",
                role.label()
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP disaggregated_errors_total Shim-path failures by phase.\n\
         # TYPE disaggregated_errors_total counter"
    );
    for phase in PHASES {
        let v: u64 = shards
            .clone()
            .map(|s| s.errors[phase_index(phase)].load(Relaxed))
            .sum();
        let _ = writeln!(
            out,
            "disaggregated_errors_total{{phase=\"{}\"}} {v}",
            phase.label()
        );
    }
    let _ = writeln!(
        out,
        "# HELP disaggregated_requests_total Orchestrated requests by the routing path they took.\n\
         # TYPE disaggregated_requests_total counter"
    );
    for path in RoutingPath::ALL {
        let v: u64 = shards
            .clone()
            .map(|s| s.requests[path_index(path)].load(Relaxed))
            .sum();
        let _ = writeln!(
            out,
            "disaggregated_requests_total{{routing_path=\"{}\"}} {v}",
            path.label()
        );
    }
    let _ = writeln!(
        out,
        "# HELP continuum_dynamo_repicks_total Pinned requests picked again because the shim said \
         the pinned worker is gone, by why.\n\
         # TYPE continuum_dynamo_repicks_total counter"
    );
    for reason in RepickReason::ALL {
        let v: u64 = shards
            .clone()
            .map(|s| s.repicks[repick_index(reason)].load(Relaxed))
            .sum();
        let _ = writeln!(
            out,
            "continuum_dynamo_repicks_total{{reason=\"{}\"}} {v}",
            reason.label()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_indices_name_their_labels() {
        for r in [
            SelectionReason::Load,
            SelectionReason::RoundRobinStale,
            SelectionReason::NoPrefillPool,
            SelectionReason::KvAware,
            SelectionReason::ConditionalBypass,
        ] {
            assert_eq!(REASONS[reason_index(r)], r.label());
        }
    }

    #[test]
    fn counts_are_summed_per_label_across_shards() {
        let a = DynamoCounters::default();
        let b = DynamoCounters::default();
        let e = SelectionEvent {
            role: SelectionRole::Prefill,
            reason: SelectionReason::NoPrefillPool,
        };
        a.selection(e);
        b.selection(e);
        b.selection(SelectionEvent {
            role: SelectionRole::Decode,
            reason: SelectionReason::Load,
        });
        a.error(ErrorPhase::Orchestration);
        b.request(RoutingPath::FallbackUnified);
        a.repick(RepickReason::WorkerUnknown);
        b.repick(RepickReason::WorkerUnknown);
        let mut out = String::new();
        render(&mut out, [&a, &b].into_iter());
        assert!(out.contains(
            "continuum_dynamo_selection_total{role=\"prefill\",reason=\"no_prefill_pool\"} 2\n"
        ));
        assert!(
            out.contains("continuum_dynamo_selection_total{role=\"decode\",reason=\"load\"} 1\n")
        );
        assert!(
            out.contains(
                "continuum_dynamo_selection_total{role=\"decode\",reason=\"kv_aware\"} 0\n"
            )
        );
        assert!(out.contains("disaggregated_errors_total{phase=\"orchestration\"} 1\n"));
        assert!(out.contains("disaggregated_errors_total{phase=\"decode\"} 0\n"));
        assert!(
            out.contains("disaggregated_requests_total{routing_path=\"fallback_unified\"} 1\n")
        );
        assert!(out.contains("continuum_dynamo_repicks_total{reason=\"worker_unknown\"} 2\n"));
        assert!(out.contains("continuum_dynamo_repicks_total{reason=\"worker_failed\"} 0\n"));
    }
}
