//! Client API keys at run time: which key a request carries, and each key's budgets shared by
//! every shard (a token bucket of requests per second and a count of requests in flight).
//!
//! Role: [`AuthTable`] lives in the snapshot, built from `auth.keys` with each key's
//! [`KeyState`] carried into the next snapshot by key name (so a reload that keeps a key keeps
//! its budget, and a removed key is gone from the next request on). The data plane identifies
//! the key ([`AuthTable::identify`]), checks its model, then spends its rate and concurrency
//! budgets ([`KeyState::try_rate`], [`KeyState::enter`]).
//!
//! Invariants:
//! - identification hashes the presented key once and compares the digest with every
//!   configured digest in constant time, without an early exit, so the time taken does not
//!   depend on which key (if any) matched;
//! - the rate budget is a GCRA (a token bucket kept as one "theoretical arrival time" atomic):
//!   over any window, a key is admitted at most `burst + rate × window` requests, on all shards
//!   together, with one compare-and-swap per request and no lock;
//! - the concurrency count never exceeds `max_concurrent` (a failed increment is undone) and is
//!   decremented exactly once per admitted request ([`InFlight`] drops it);
//! - times are nanoseconds on one process-wide monotonic timeline, passed in by the caller.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::config::{ApiKeyConfig, AuthConfig, BackendIdx, Config, KeyRate};

/// Why a keyed request was refused (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Over its requests per second.
    RateLimited,
    /// Over its `max_concurrent`.
    Concurrency,
    /// The model is not in its `allowed_models`.
    Model,
    /// None of the backends that serve the request is in its `allowed_backends`.
    Backend,
}

impl Refusal {
    /// Every reason, in label order.
    pub const ALL: [Refusal; 4] = [
        Refusal::RateLimited,
        Refusal::Concurrency,
        Refusal::Model,
        Refusal::Backend,
    ];

    /// The metric label.
    pub const fn label(self) -> &'static str {
        match self {
            Refusal::RateLimited => "rate_limited",
            Refusal::Concurrency => "concurrency",
            Refusal::Model => "model",
            Refusal::Backend => "backend",
        }
    }
}

/// One key's shared budgets and counters.
#[derive(Debug, Default)]
pub struct KeyState {
    /// GCRA theoretical arrival time, ns.
    tat: AtomicU64,
    inflight: AtomicU32,
    admitted: AtomicU64,
    refused: [AtomicU64; 4],
}

impl KeyState {
    /// Spend one request of `rate` at `now_ns`; when over, the time until one fits (ns).
    pub fn try_rate(&self, now_ns: u64, rate: &KeyRate) -> Result<(), u64> {
        let interval = (1e9 / rate.requests_per_second).max(1.0) as u64;
        let tolerance = interval.saturating_mul(u64::from(rate.burst));
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let next = tat.max(now_ns).saturating_add(interval);
            let ahead = next - now_ns;
            if ahead > tolerance {
                return Err(ahead - tolerance);
            }
            match self
                .tat
                .compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(seen) => tat = seen,
            }
        }
    }

    /// Enter one request under `max` in flight; `None` when the key is at its limit.
    pub fn enter(&self, max: Option<u32>) -> Option<InFlight<'_>> {
        let n = self.inflight.fetch_add(1, Ordering::AcqRel);
        if max.is_some_and(|m| n >= m) {
            self.inflight.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(InFlight { state: self })
    }

    /// Requests in flight now.
    pub fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Count an admitted request.
    pub fn admitted(&self) {
        self.admitted.fetch_add(1, Ordering::Relaxed);
    }

    /// Count a refusal.
    pub fn refused(&self, why: Refusal) {
        self.refused[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Admitted requests so far.
    pub fn admitted_total(&self) -> u64 {
        self.admitted.load(Ordering::Relaxed)
    }

    /// Refusals for `why` so far.
    pub fn refused_total(&self, why: Refusal) -> u64 {
        self.refused[why as usize].load(Ordering::Relaxed)
    }
}

/// One admitted request of a key: leaves the in-flight count when dropped.
#[derive(Debug)]
pub struct InFlight<'k> {
    state: &'k KeyState,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.state.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One configured key in a snapshot.
#[derive(Debug)]
pub struct KeyEntry {
    /// Its config.
    pub config: ApiKeyConfig,
    /// Its shared state.
    pub state: Arc<KeyState>,
    /// Its `allowed_backends` as indices of the snapshot's backends, sorted; `None`: all.
    pub backends: Option<Vec<BackendIdx>>,
}

impl KeyEntry {
    /// Whether the key may use `model`.
    pub fn allows_model(&self, model: &str) -> bool {
        self.config
            .allowed_models
            .as_ref()
            .is_none_or(|m| m.iter().any(|x| x == model))
    }

    /// Whether the key's requests may reach backend `idx`.
    pub fn allows_backend(&self, idx: BackendIdx) -> bool {
        self.backends
            .as_ref()
            .is_none_or(|b| b.binary_search_by_key(&idx.0, |x| x.0).is_ok())
    }
}

/// The keys of one snapshot.
#[derive(Debug)]
pub struct AuthTable {
    keys: Vec<KeyEntry>,
}

impl AuthTable {
    /// The table for `config`'s `auth`, carrying each key's state from `previous` by name.
    pub fn build(config: &Config, auth: &AuthConfig, previous: Option<&AuthTable>) -> Self {
        let keys = auth
            .keys
            .iter()
            .map(|k| {
                let state = previous
                    .and_then(|p| p.keys.iter().find(|e| e.config.name == k.name))
                    .map_or_else(Arc::default, |e| e.state.clone());
                let backends = k.allowed_backends.as_ref().map(|names| {
                    let mut idx: Vec<BackendIdx> = names
                        .iter()
                        .filter_map(|n| config.backends.iter().position(|b| b.name == *n))
                        .map(|i| BackendIdx(u32::try_from(i).unwrap_or(u32::MAX)))
                        .collect();
                    idx.sort_by_key(|b| b.0);
                    idx
                });
                KeyEntry {
                    config: k.clone(),
                    state,
                    backends,
                }
            })
            .collect();
        Self { keys }
    }

    /// The key `presented` is, if any: every digest compared in constant time.
    pub fn identify(&self, presented: &[u8]) -> Option<&KeyEntry> {
        use sha2::Digest;
        let digest: [u8; 32] = sha2::Sha256::digest(presented).into();
        let mut found = usize::MAX;
        for (i, k) in self.keys.iter().enumerate() {
            let mut diff = 0u8;
            for (a, b) in digest.iter().zip(k.config.key_hash.0.iter()) {
                diff |= a ^ b;
            }
            // Branch-free select: keep `i` when equal (hashes are unique, so at most one is).
            let eq = usize::from(diff == 0);
            found = found * (1 - eq) + i * eq;
        }
        self.keys.get(found)
    }

    /// Every key, in config order.
    pub fn keys(&self) -> &[KeyEntry] {
        &self.keys
    }
}

#[cfg(test)]
mod tests;
