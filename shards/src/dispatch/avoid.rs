//! Which fleet a pick reads (issue 38): the published view, or the published view without the
//! workers that are most likely dead.
//!
//! - **Suspects** (`crate::signals::suspects`: a worker whose `kv_metrics` connection dropped)
//!   are left out while another worker can serve the request: the shard picks from the view
//!   without them and, only if that finds no worker, from the whole view. The filtered view is
//!   built once per (snapshot generation, suspect-list version) and kept in the shard's
//!   [`FleetFilter`]; while nothing was ever suspect a pick pays one atomic load.
//! - **A re-pick** after the shim said the pinned worker is gone leaves out that worker (and the
//!   suspects) for that request only; its view is built for it (a rare event, not per request).
//!
//! Invariants: a filtered view is only picked from (its workers keep the published order and
//! fields, so the pins and the dispatch ledger read the published snapshot as usual); a cached
//! view is never used for a snapshot or a suspect list other than the one it was built from.

use std::sync::Arc;

use continuum_core::discovery::{FleetView, InstanceId};
use continuum_core::picker::FleetCandidates;
use continuum_core::snapshot::RouterSnapshot;

use crate::signals::suspects::Suspects;

/// A fleet view without some workers, with its candidate table.
#[derive(Debug, Clone)]
pub(super) struct Filtered {
    pub(super) fleet: Arc<FleetView>,
    pub(super) candidates: Arc<FleetCandidates>,
}

impl Filtered {
    /// `fleet` without `avoid`; `None` when no worker of it is in `avoid`.
    pub(super) fn of(fleet: &FleetView, avoid: &[InstanceId]) -> Option<Self> {
        let fleet = Arc::new(fleet.without(avoid)?);
        let candidates = Arc::new(FleetCandidates::build(&fleet));
        Some(Self { fleet, candidates })
    }
}

/// A shard's cached view without the current suspects.
#[derive(Debug, Default)]
pub(super) struct FleetFilter {
    /// (snapshot generation, suspect-list version) the cached view was built for.
    built_for: Option<(u64, u64)>,
    view: Option<Filtered>,
}

impl FleetFilter {
    /// The view of `snap` without the current suspects; `None` when none of them is in it.
    pub(super) fn without_suspects(
        &mut self,
        snap: &RouterSnapshot,
        suspects: &Suspects,
    ) -> Option<Filtered> {
        let version = suspects.version();
        if version == 0 {
            return None;
        }
        let key = (snap.generation, version);
        if self.built_for != Some(key) {
            self.view = Filtered::of(&snap.fleet, &suspects.list());
            self.built_for = Some(key);
        }
        self.view.clone()
    }
}

/// The workers a re-pick leaves out: `pins` (the failed request's) and the current suspects.
pub(super) fn repick_avoid(pins: &[InstanceId], suspects: &Suspects) -> Vec<InstanceId> {
    let mut avoid = Vec::with_capacity(pins.len() + suspects.len());
    avoid.extend_from_slice(pins);
    avoid.extend(suspects.list().iter().filter(|id| !pins.contains(id)));
    avoid
}
