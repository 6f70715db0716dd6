//! Where a pinned request goes: the shim replicas of each Dynamo namespace and the model map.
//!
//! Role: built once per snapshot from the config and the resolved backend addresses, read by
//! every shard per request without allocating.
//!
//! Invariants:
//! - a replica is usable when its backend is enabled and its address resolved; `internal`
//!   backends are usable here (a shim replica is typically hidden from plain model routing);
//! - with `shim.pools` a namespace's replicas are its pool's; with `shim.backends` (allowed only
//!   while at most one namespace is followed, CFG-16) the list serves every namespace;
//! - replicas keep config order, each listed once; a namespace without usable replicas has an
//!   empty slice and is left out of picking (SHIM-05);
//! - nothing is usable unless both `dynamo.enabled` and `disaggregated_serving.enabled` are set:
//!   the shim path is the disaggregated orchestrator's (SHIM-04/05);
//! - a namespace is a picking candidate only while the live config follows it and it has a
//!   usable replica (DISC-MULTI-05, RELOAD-08), so a worker left in the fleet view of a
//!   namespace just removed from the config is never pinned;
//! - the model map only translates the client model for matching workers; the request body keeps
//!   the client's model (SHIM-05).

use std::net::SocketAddr;

use crate::config::BackendIdx;
use crate::config::{BackendName, Config};
use crate::discovery::{FleetView, Role, Worker};
use crate::picker::NamespaceSet;

/// The shim replicas per namespace and the client→Dynamo model map of one snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShimRoutes {
    /// `shim.backends`: one list for every namespace.
    shared: Vec<BackendIdx>,
    /// `shim.pools`: namespace → replicas, in config order.
    pools: Vec<(String, Vec<BackendIdx>)>,
    /// `shim.model_map`, sorted by client model.
    model_map: Vec<(String, String)>,
    /// The namespaces the live config follows; empty = every namespace (Kubernetes discovery
    /// without a namespace list).
    followed: Vec<String>,
}

impl ShimRoutes {
    /// Build from `config` and the resolved address of each backend (indexed like
    /// `config.backends`).
    pub fn build(config: &Config, backend_addrs: &[Option<SocketAddr>]) -> Self {
        let usable = |names: &[BackendName]| -> Vec<BackendIdx> {
            let mut out: Vec<BackendIdx> = Vec::with_capacity(names.len());
            for name in names {
                let Some(i) = config.backends.iter().position(|b| b.name == *name) else {
                    continue;
                };
                let b = &config.backends[i];
                let resolved = backend_addrs.get(i).copied().flatten().is_some();
                let idx = BackendIdx(u32::try_from(i).unwrap_or(u32::MAX));
                if b.enabled && resolved && !out.contains(&idx) {
                    out.push(idx);
                }
            }
            out
        };
        let shim = &config.dynamo.shim;
        if !(config.dynamo.enabled && config.disaggregated_serving.enabled) {
            return Self::default();
        }
        Self {
            shared: usable(&shim.backends),
            pools: shim
                .pools
                .iter()
                .map(|p| (p.namespace.clone(), usable(&p.backends)))
                .collect(),
            model_map: shim
                .model_map
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            followed: config.dynamo.namespaces().to_vec(),
        }
    }

    /// The usable replicas serving `namespace` (empty when none).
    pub fn replicas(&self, namespace: &str) -> &[BackendIdx] {
        if self.pools.is_empty() {
            return &self.shared;
        }
        self.pools
            .iter()
            .find(|(ns, _)| ns == namespace)
            .map_or(&[][..], |(_, r)| r.as_slice())
    }

    /// Every replica list: the shared one and each namespace's pool (some may be empty).
    pub fn pools(&self) -> impl Iterator<Item = &[BackendIdx]> {
        std::iter::once(self.shared.as_slice()).chain(self.pools.iter().map(|(_, r)| r.as_slice()))
    }

    /// Whether any namespace has a usable replica (the shim path is available at all).
    pub fn any_usable(&self) -> bool {
        !self.shared.is_empty() || self.pools.iter().any(|(_, r)| !r.is_empty())
    }

    /// Whether the live config follows `namespace`.
    pub fn follows(&self, namespace: &str) -> bool {
        self.followed.is_empty() || self.followed.iter().any(|n| n == namespace)
    }

    /// The Dynamo model name workers are matched against for a client model: its
    /// `shim.model_map` entry, or the client model itself.
    pub fn dynamo_model<'a>(&'a self, client_model: &'a str) -> &'a str {
        self.model_map
            .binary_search_by(|(k, _)| k.as_str().cmp(client_model))
            .map_or(client_model, |i| self.model_map[i].1.as_str())
    }
}

impl ShimRoutes {
    /// The client models a chat request is pinned for now (`GET /v1/models`): for every model a
    /// worker of a candidate namespace serves in a role that can take the decode side (decode or
    /// aggregated; prefill workers alone give no pick), the client models `model_map` translates
    /// to it, else the model itself unless it is a client model mapped elsewhere (a request for
    /// it would not reach these workers). Sorted, each once; empty while no namespace has a
    /// usable replica.
    pub fn client_models<'a>(&'a self, fleet: &'a FleetView) -> Vec<&'a str> {
        if !self.any_usable() {
            return Vec::new();
        }
        let mut served: Vec<&str> = self
            .decode_sides(fleet)
            .filter_map(|w| w.model.as_deref())
            .collect();
        served.sort_unstable();
        served.dedup();
        let mut out = Vec::new();
        for model in served {
            let before = out.len();
            let clients = self.model_map.iter().filter(|(_, m)| m == model);
            out.extend(clients.map(|(c, _)| c.as_str()));
            if out.len() == before && self.dynamo_model(model) == model {
                out.push(model);
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Whether a chat request for `client_model` is pinned now: some worker of a candidate
    /// namespace serves its Dynamo model in a role that can take the decode side (also true of
    /// a mapped model asked for by its own name, which [`ShimRoutes::client_models`] lists only
    /// under its client names).
    pub fn pins(&self, fleet: &FleetView, client_model: &str) -> bool {
        let model = self.dynamo_model(client_model);
        self.any_usable()
            && self
                .decode_sides(fleet)
                .any(|w| w.model.as_deref() == Some(model))
    }

    /// The workers of candidate namespaces that can take a pick's decode side.
    fn decode_sides<'a>(&'a self, fleet: &'a FleetView) -> impl Iterator<Item = &'a Worker> {
        fleet
            .workers
            .iter()
            .filter(|w| matches!(w.role, Role::Decode | Role::Aggregated))
            .filter(|w| self.contains_namespace(&w.namespace))
    }
}

/// The picker's candidate namespaces: followed by the live config and with a usable replica.
impl NamespaceSet for ShimRoutes {
    fn contains_namespace(&self, namespace: &str) -> bool {
        self.follows(namespace) && !self.replicas(namespace).is_empty()
    }
}

#[cfg(test)]
mod tests;
