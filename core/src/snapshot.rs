//! Immutable routing snapshots published by the control thread and read by every shard.
//!
//! The control thread builds a [`RouterSnapshot`] from a validated [`Config`] (and, in later
//! milestones, the discovered fleet), wraps it in an `Arc`, stores it in one `ArcSwap` and then
//! bumps the generation. A shard compares the published generation with the one it cached and
//! reloads its `Arc` only when they differ; everything a request needs to route is in one
//! snapshot, so a request never mixes two configs.
//!
//! Invariants:
//! - `generation` strictly increases across publications;
//! - [`ModelRoute::replicas`] holds only enabled, non-internal backends serving the model, each
//!   repeated `weight` times in an interleaved order (smooth weighted round robin by cursor);
//! - backend indices are positions in the snapshot config's `backends` (and in
//!   [`RouterSnapshot::backend_addrs`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::artifacts::PromptTable;
use crate::auth::AuthTable;
use crate::config::{BackendConfig, Config};
use crate::discovery::{FleetView, PublisherId};
use crate::health::HealthTable;
use crate::load::LoadView;
use crate::picker::FleetCandidates;
use crate::prompt::PromptPipeline;
use crate::shim::ShimRoutes;
use crate::subscriptions::Refusal;
use crate::tls::{BackendTlsTable, UpstreamTls};

pub use crate::config::BackendIdx;

/// The backends serving one client model id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRoute {
    /// Dense index of this route in its snapshot (`0..models.len()`), so shards keep their
    /// round-robin cursors in a plain vector.
    pub slot: usize,
    /// Weighted rotation of backend indices; a shard-local cursor walks it.
    pub replicas: Vec<BackendIdx>,
}

impl ModelRoute {
    /// The replica at rotation position `cursor` (wrapping). `None` only for an empty route,
    /// which a snapshot never contains.
    pub fn replica_at(&self, cursor: usize) -> Option<BackendIdx> {
        if self.replicas.is_empty() {
            return None;
        }
        self.replicas.get(cursor % self.replicas.len()).copied()
    }
}

/// Largest weight honoured in the rotation; larger weights are clamped so a rotation stays small.
pub const MAX_ROTATION_WEIGHT: u32 = 64;

/// Client model id → its route. Hashed with foldhash, not SipHash: every proxied request looks
/// its model up here (SipHash was ~200 instructions of a hop's ~15,000, docs/decisions.md "The
/// hop's cost"). Flooding needs inserts, and the keys come from the config alone; a client's
/// model name is only ever looked up.
pub type ModelRoutes = HashMap<String, ModelRoute, foldhash::fast::RandomState>;

/// Everything a shard needs to route a request, for one generation.
#[derive(Debug)]
pub struct RouterSnapshot {
    /// Publication number; strictly increasing.
    pub generation: u64,
    /// The config this snapshot was built from.
    pub config: Arc<Config>,
    /// Client model id → replicas.
    pub models: ModelRoutes,
    /// Model ids in config order, for `GET /v1/models`.
    pub model_ids: Vec<String>,
    /// Resolved socket address of each backend, indexed like `config.backends`; `None` for a
    /// backend whose name did not resolve (it is then left out of every route).
    pub backend_addrs: Vec<Option<SocketAddr>>,
    /// The TLS context of each `https://` backend, indexed like `config.backends`. An
    /// `https://` backend without one is left out of every route, like an unresolved one.
    pub backend_tls: BackendTlsTable,
    /// The discovered Dynamo fleet (empty when discovery is off or has not seeded yet).
    pub fleet: Arc<FleetView>,
    /// The fleet's candidates per model, resolved once per fleet view (see [`Self::candidates`]).
    pub fleet_candidates: Arc<FleetCandidates>,
    /// Where each subscribed publisher may be connected: resolved once by the control thread and
    /// checked against `load.direct_allow_cidrs` (CFG-20). A publisher missing here has not been
    /// resolved yet.
    pub publisher_addrs: Arc<PublisherAddrs>,
    /// The direct-mode shim replicas per namespace and the model map (SHIM-03/05).
    pub shim: ShimRoutes,
    /// Every backend's shared health (outlier ejection, active checks), by backend index, with
    /// the pools its ejection cap is computed over: each model's replicas and each shim pool.
    pub health: HealthTable,
    /// The client API keys with their shared budgets (carried by key name); `None` without
    /// `auth`.
    pub auth: Option<AuthTable>,
    /// Per Dynamo model, the loaded prompt pipeline or why KV selection is skipped (empty
    /// while `dynamo.kv` is off; set by the control thread's KV supervisor).
    pub prompts: Arc<Prompts>,
}

/// The published per-model prompt pipelines.
pub type Prompts = PromptTable<PromptPipeline>;

/// Resolved and policy-checked publisher addresses.
pub type PublisherAddrs = HashMap<PublisherId, Result<SocketAddr, Refusal>>;

impl RouterSnapshot {
    /// Build the snapshot for `config` with the given generation. `backend_addrs` holds the
    /// resolved address of each backend (same order as `config.backends`) and `backend_tls`
    /// the TLS context of each `https://` one; resolution and reading trust anchors are I/O
    /// and happen in the control thread before this call.
    pub fn build(
        generation: u64,
        config: Arc<Config>,
        backend_addrs: Vec<Option<SocketAddr>>,
        backend_tls: BackendTlsTable,
        fleet: Arc<FleetView>,
        publisher_addrs: Arc<PublisherAddrs>,
        previous: Option<&RouterSnapshot>,
    ) -> Self {
        // An https backend that has no TLS context cannot be reached: route it like an
        // unresolved one.
        let backend_addrs: Vec<Option<SocketAddr>> = backend_addrs
            .into_iter()
            .enumerate()
            .map(|(i, a)| {
                let https = config.backends.get(i).is_some_and(|b| b.tls.is_some());
                let has_tls = backend_tls.get(i).is_some_and(Option::is_some);
                a.filter(|_| !https || has_tls)
            })
            .collect();
        let mut per_model: HashMap<String, Vec<(BackendIdx, u32)>> = HashMap::new();
        let mut model_ids = Vec::new();
        for (i, b) in config.backends.iter().enumerate() {
            if !routable(b) || backend_addrs.get(i).copied().flatten().is_none() {
                continue;
            }
            let idx = BackendIdx(u32::try_from(i).unwrap_or(u32::MAX));
            for m in &b.models {
                let entry = per_model.entry(m.clone()).or_default();
                if entry.is_empty() {
                    model_ids.push(m.clone());
                }
                if !entry.iter().any(|(e, _)| *e == idx) {
                    entry.push((idx, b.weight.clamp(1, MAX_ROTATION_WEIGHT)));
                }
            }
        }
        let models = model_ids
            .iter()
            .enumerate()
            .filter_map(|(slot, m)| {
                let weighted = per_model.get(m)?;
                Some((
                    m.clone(),
                    ModelRoute {
                        slot,
                        replicas: smooth_rotation(weighted),
                    },
                ))
            })
            .collect();
        let shim = ShimRoutes::build(&config, &backend_addrs);
        let health = health_table(previous, &config, &backend_addrs, &models, &shim);
        let auth = config
            .auth
            .as_ref()
            .map(|a| AuthTable::build(&config, a, previous.and_then(|p| p.auth.as_ref())));
        // Candidates are a function of the fleet view alone: a snapshot of the same view (a
        // config reload) keeps the previous table.
        let fleet_candidates = match previous {
            Some(p) if p.fleet_candidates.is_for(&fleet) => Arc::clone(&p.fleet_candidates),
            _ => Arc::new(FleetCandidates::build(&fleet)),
        };
        Self {
            health,
            auth,
            generation,
            fleet_candidates,
            config,
            shim,
            models,
            model_ids,
            backend_addrs,
            backend_tls,
            fleet,
            publisher_addrs,
            prompts: Arc::default(),
        }
    }

    /// The same snapshot with its candidate table's cell hints read from `load` (the control
    /// thread calls this after the store admitted the fleet's keys); a table already bound to
    /// `load`'s generation is kept as is.
    pub fn with_load_slots(mut self, load: &LoadView<'_>) -> Self {
        if self.fleet_candidates.bound_to() != Some(load.generation()) {
            self.fleet_candidates = Arc::new(self.fleet_candidates.rebound(load));
        }
        self
    }

    /// The same snapshot with `prompts` as its prompt pipelines (the control thread's KV
    /// supervisor's table).
    pub fn with_prompts(mut self, prompts: Arc<Prompts>) -> Self {
        self.prompts = prompts;
        self
    }

    /// The candidate table of `fleet`, for a pick (`None` if `fleet` was replaced after the
    /// build: the picker then scans the fleet).
    pub fn candidates(&self) -> Option<&FleetCandidates> {
        Some(&*self.fleet_candidates).filter(|c| c.is_for(&self.fleet))
    }

    /// The resolved address of the backend at `idx`.
    pub fn backend_addr(&self, idx: BackendIdx) -> Option<SocketAddr> {
        self.backend_addrs.get(idx.0 as usize).copied().flatten()
    }

    /// The TLS context of the `https://` backend at `idx`.
    pub fn backend_tls(&self, idx: BackendIdx) -> Option<&UpstreamTls> {
        self.backend_tls.get(idx.0 as usize)?.as_ref()
    }

    /// The backend config at `idx`.
    pub fn backend(&self, idx: BackendIdx) -> Option<&BackendConfig> {
        self.config.backends.get(idx.0 as usize)
    }

    /// The route for a client model id.
    pub fn route(&self, model: &str) -> Option<&ModelRoute> {
        self.models.get(model)
    }
}

/// The health table of a new snapshot: state carried from `previous` for unchanged backends,
/// groups from the routes.
fn health_table(
    previous: Option<&RouterSnapshot>,
    config: &Config,
    backend_addrs: &[Option<SocketAddr>],
    models: &ModelRoutes,
    shim: &ShimRoutes,
) -> HealthTable {
    let keys = config
        .backends
        .iter()
        .enumerate()
        .map(|(i, b)| (b.name.0.clone(), backend_addrs.get(i).copied().flatten()))
        .collect();
    let mut groups: Vec<Vec<BackendIdx>> = Vec::new();
    let mut add = |replicas: &[BackendIdx]| {
        let mut g: Vec<BackendIdx> = Vec::with_capacity(replicas.len());
        for r in replicas {
            if !g.contains(r) {
                g.push(*r);
            }
        }
        g.sort_by_key(|b| b.0);
        if !g.is_empty() && !groups.contains(&g) {
            groups.push(g);
        }
    };
    for route in models.values() {
        add(&route.replicas);
    }
    for pool in shim.pools() {
        add(pool);
    }
    HealthTable::carried(previous.map(|p| &p.health), keys, groups)
}

fn routable(b: &BackendConfig) -> bool {
    b.enabled && !b.internal
}

/// Smooth weighted round robin (nginx's algorithm) unrolled into one full period, so replicas of
/// higher weight are interleaved rather than bunched.
fn smooth_rotation(weighted: &[(BackendIdx, u32)]) -> Vec<BackendIdx> {
    let total: i64 = weighted.iter().map(|(_, w)| i64::from(*w)).sum();
    let mut current: Vec<i64> = vec![0; weighted.len()];
    let mut out = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
    for _ in 0..total {
        let mut best = 0usize;
        for (i, (_, w)) in weighted.iter().enumerate() {
            current[i] += i64::from(*w);
            if current[i] > current[best] {
                best = i;
            }
        }
        current[best] -= total;
        out.push(weighted[best].0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smooth_rotation_interleaves_by_weight() {
        let a = BackendIdx(0);
        let b = BackendIdx(1);
        let r = smooth_rotation(&[(a, 2), (b, 1)]);
        assert_eq!(r, vec![a, b, a]);
        let r = smooth_rotation(&[(a, 1), (b, 1)]);
        assert_eq!(r, vec![a, b]);
        let r = smooth_rotation(&[(a, 5), (b, 1)]);
        assert_eq!(r.iter().filter(|x| **x == a).count(), 5);
        assert_eq!(r.len(), 6);
    }

    #[test]
    fn replica_at_wraps() {
        let route = ModelRoute {
            slot: 0,
            replicas: vec![BackendIdx(3), BackendIdx(4)],
        };
        assert_eq!(route.replica_at(0), Some(BackendIdx(3)));
        assert_eq!(route.replica_at(3), Some(BackendIdx(4)));
        assert_eq!(
            ModelRoute {
                slot: 0,
                replicas: vec![]
            }
            .replica_at(1),
            None
        );
    }
}
