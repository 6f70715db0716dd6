//! What fleet to simulate: namespaces, models, worker counts, ranks, the latency model and the
//! publish cadence ([`SimSpec`], built with [`SimSpecBuilder`]).
//!
//! Role: plain data, validated once by [`SimSpec::validate`] before anything is started.
//!
//! Invariants (checked by `validate`):
//! - at least one namespace, each with at least one model, and at least one worker in all;
//! - namespace and model names are non-empty; namespaces are unique, and so are models within a
//!   namespace (one topology per model: a model never mixes aggregated and prefill/decode
//!   workers, which the real direct-mode frontend cannot serve);
//! - a disaggregated model has at least one prefill and one decode worker;
//! - `dp_size`, `block_size` and `total_kv_blocks` are at least 1; the TTL is at least 1 s.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::SimError;

/// How a model is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// `workers` aggregated workers (component `backend`, `worker_type: aggregated`).
    Aggregated {
        /// Worker count.
        workers: usize,
    },
    /// Prefill workers (component `prefill`) and decode workers (component `backend`, card
    /// `worker_type: decode`, as Dynamo 1.6.1 registers them).
    Disaggregated {
        /// Prefill worker count.
        prefill: usize,
        /// Decode worker count.
        decode: usize,
    },
}

impl Topology {
    /// Workers of this topology.
    pub fn workers(self) -> usize {
        match self {
            Topology::Aggregated { workers } => workers,
            Topology::Disaggregated { prefill, decode } => prefill + decode,
        }
    }
}

/// One served model in a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// The model name (card `display_name`, the request's `model`).
    pub name: String,
    /// Its workers.
    pub topology: Topology,
    /// Data-parallel ranks per worker (card `data_parallel_size`, ranks `0..dp_size`).
    pub dp_size: u32,
}

/// One Dynamo namespace: its models and, in the simulator, its own frontend shim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceSpec {
    /// The namespace name.
    pub name: String,
    /// Its models.
    pub models: Vec<ModelSpec>,
}

/// Which `ActiveLoad` fields a worker fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadFields {
    /// All three: `active_decode_blocks`, `active_prefill_tokens`, `kv_used_blocks`.
    #[default]
    All,
    /// Only `kv_used_blocks`, the other two nil, as Dynamo 1.6.1's mocker publishes.
    KvUsedOnly,
}

/// Simulated latency, a pure function of the worker's load (its other active requests).
///
/// A request's time to first token is `base + per_active × (other requests active on the worker
/// doing the prefill)`; each completion token then takes `per_token + per_token_per_active ×
/// (other requests active on the decoding worker)`, measured again at every token; the whole
/// request never takes longer than `max_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencyModel {
    /// Fixed time to first token of an idle worker.
    pub base: Duration,
    /// Added to the time to first token per other active request on the prefill side.
    pub per_active: Duration,
    /// Time per completion token on an idle worker.
    pub per_token: Duration,
    /// Added to each token's time per other active request on the decode side.
    pub per_token_per_active: Duration,
    /// Upper bound of one request's total simulated time.
    pub max_total: Duration,
}

impl Default for LatencyModel {
    fn default() -> Self {
        LatencyModel {
            base: Duration::from_millis(30),
            per_active: Duration::from_millis(20),
            per_token: Duration::from_millis(5),
            per_token_per_active: Duration::from_millis(2),
            max_total: Duration::from_secs(30),
        }
    }
}

impl LatencyModel {
    /// No simulated latency at all (for throughput benchmarks of the router itself).
    pub const ZERO: LatencyModel = LatencyModel {
        base: Duration::ZERO,
        per_active: Duration::ZERO,
        per_token: Duration::ZERO,
        per_token_per_active: Duration::ZERO,
        max_total: Duration::ZERO,
    };

    /// Time to first token when `others` other requests are active on the prefilling worker.
    pub fn ttft(&self, others: u32) -> Duration {
        self.base
            .saturating_add(self.per_active.saturating_mul(others))
            .min(self.max_total)
    }

    /// Time of one completion token when `others` other requests are active on the decoding
    /// worker.
    pub fn token(&self, others: u32) -> Duration {
        self.per_token
            .saturating_add(self.per_token_per_active.saturating_mul(others))
            .min(self.max_total)
    }

    /// The whole request's time when the loads stay as given: `ttft(prefill_others) + tokens ×
    /// token(decode_others)`, at most `max_total`.
    pub fn total(&self, prefill_others: u32, decode_others: u32, tokens: u32) -> Duration {
        self.ttft(prefill_others)
            .saturating_add(self.token(decode_others).saturating_mul(tokens))
            .min(self.max_total)
    }
}

/// Everything [`crate::SimFleet::start`] needs.
#[derive(Debug, Clone, PartialEq)]
pub struct SimSpec {
    /// The namespaces.
    pub namespaces: Vec<NamespaceSpec>,
    /// The file-store root (`DYN_FILE_KV`); `None`: a fresh temporary directory, removed when
    /// the fleet stops.
    pub root: Option<PathBuf>,
    /// The records' TTL: files are touched every `ttl / 3` (Dynamo's keep-alive).
    pub ttl: Duration,
    /// Periodic `kv_metrics` publication, besides the ones on every load change. `None`: only
    /// on load changes, as Dynamo does.
    pub publish_interval: Option<Duration>,
    /// Which `ActiveLoad` fields are filled.
    pub load_fields: LoadFields,
    /// The latency model.
    pub latency: LatencyModel,
    /// Card `kv_cache_block_size`.
    pub block_size: u32,
    /// Card `runtime_config.total_kv_blocks` (per rank).
    pub total_kv_blocks: u64,
    /// Completion tokens of a request that sets no smaller `max_tokens`.
    pub completion_tokens: u32,
    /// Seed of the worker and publisher ids; `None`: from the clock and the process id.
    pub seed: Option<u64>,
}

impl SimSpec {
    /// A builder with the defaults and no namespace yet.
    pub fn builder() -> SimSpecBuilder {
        SimSpecBuilder {
            spec: SimSpec {
                namespaces: Vec::new(),
                root: None,
                ttl: Duration::from_secs(10),
                publish_interval: Some(Duration::from_millis(500)),
                load_fields: LoadFields::All,
                latency: LatencyModel::default(),
                block_size: 64,
                total_kv_blocks: 16_384,
                completion_tokens: 16,
                seed: None,
            },
        }
    }

    /// The demo's fleet: namespace `demo` with `demo-agg` on `agg_workers` aggregated workers and
    /// `demo-disagg` on one prefill and two decode workers.
    pub fn demo(agg_workers: usize) -> SimSpec {
        SimSpec::builder()
            .namespace("demo")
            .aggregated("demo-agg", agg_workers)
            .disaggregated("demo-disagg", 1, 2)
            .build()
    }

    /// Total workers.
    pub fn worker_count(&self) -> usize {
        self.namespaces
            .iter()
            .flat_map(|n| &n.models)
            .map(|m| m.topology.workers())
            .sum()
    }

    /// Checks the invariants in the module docs.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |m: String| Err(SimError::Spec(m));
        if self.namespaces.is_empty() {
            return bad("no namespace".into());
        }
        if self.worker_count() == 0 {
            return bad("no worker".into());
        }
        if self.block_size == 0 || self.total_kv_blocks == 0 {
            return bad("block_size and total_kv_blocks must be at least 1".into());
        }
        if self.ttl < Duration::from_secs(1) {
            return bad("ttl must be at least 1s".into());
        }
        for (i, ns) in self.namespaces.iter().enumerate() {
            if ns.name.is_empty() {
                return bad("empty namespace name".into());
            }
            if self.namespaces[..i].iter().any(|o| o.name == ns.name) {
                return bad(format!("namespace {} listed twice", ns.name));
            }
            if ns.models.is_empty() {
                return bad(format!("namespace {} has no model", ns.name));
            }
            for (j, m) in ns.models.iter().enumerate() {
                if m.name.is_empty() {
                    return bad(format!("empty model name in namespace {}", ns.name));
                }
                if ns.models[..j].iter().any(|o| o.name == m.name) {
                    return bad(format!("model {} listed twice in {}", m.name, ns.name));
                }
                if m.dp_size == 0 {
                    return bad(format!("model {}: dp_size must be at least 1", m.name));
                }
                if let Topology::Disaggregated { prefill, decode } = m.topology
                    && (prefill == 0 || decode == 0)
                {
                    return bad(format!(
                        "model {}: a disaggregated model needs prefill and decode workers",
                        m.name
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Builds a [`SimSpec`]; model methods apply to the namespace opened last.
#[derive(Debug, Clone)]
pub struct SimSpecBuilder {
    spec: SimSpec,
}

impl SimSpecBuilder {
    /// Opens a namespace; the following model methods add to it.
    pub fn namespace(mut self, name: &str) -> Self {
        self.spec.namespaces.push(NamespaceSpec {
            name: name.to_owned(),
            models: Vec::new(),
        });
        self
    }

    fn model(mut self, name: &str, topology: Topology) -> Self {
        if self.spec.namespaces.is_empty() {
            self = self.namespace("dynamo");
        }
        if let Some(ns) = self.spec.namespaces.last_mut() {
            ns.models.push(ModelSpec {
                name: name.to_owned(),
                topology,
                dp_size: 1,
            });
        }
        self
    }

    /// Adds a model on `workers` aggregated workers (namespace `dynamo` if none is open).
    pub fn aggregated(self, model: &str, workers: usize) -> Self {
        self.model(model, Topology::Aggregated { workers })
    }

    /// Adds a model on `prefill` prefill and `decode` decode workers.
    pub fn disaggregated(self, model: &str, prefill: usize, decode: usize) -> Self {
        self.model(model, Topology::Disaggregated { prefill, decode })
    }

    /// Sets the data-parallel size of the model added last.
    pub fn dp_size(mut self, dp_size: u32) -> Self {
        if let Some(m) = self
            .spec
            .namespaces
            .last_mut()
            .and_then(|n| n.models.last_mut())
        {
            m.dp_size = dp_size;
        }
        self
    }

    /// The file-store root (default: a fresh temporary directory).
    pub fn root(mut self, root: impl Into<PathBuf>) -> Self {
        self.spec.root = Some(root.into());
        self
    }

    /// The records' TTL (default 10 s).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.spec.ttl = ttl;
        self
    }

    /// Periodic publication (default every 500 ms; `None`: on load changes only).
    pub fn publish_interval(mut self, every: Option<Duration>) -> Self {
        self.spec.publish_interval = every;
        self
    }

    /// Which `ActiveLoad` fields are filled (default all).
    pub fn load_fields(mut self, fields: LoadFields) -> Self {
        self.spec.load_fields = fields;
        self
    }

    /// The latency model.
    pub fn latency(mut self, latency: LatencyModel) -> Self {
        self.spec.latency = latency;
        self
    }

    /// Card `kv_cache_block_size` (default 64).
    pub fn block_size(mut self, block_size: u32) -> Self {
        self.spec.block_size = block_size;
        self
    }

    /// Card `total_kv_blocks` (default 16,384).
    pub fn total_kv_blocks(mut self, blocks: u64) -> Self {
        self.spec.total_kv_blocks = blocks;
        self
    }

    /// Completion tokens per request (default 16; a smaller `max_tokens` wins).
    pub fn completion_tokens(mut self, tokens: u32) -> Self {
        self.spec.completion_tokens = tokens;
        self
    }

    /// A fixed id seed, for reproducible ids.
    pub fn seed(mut self, seed: u64) -> Self {
        self.spec.seed = Some(seed);
        self
    }

    /// The spec (validated by [`crate::SimFleet::start`]).
    pub fn build(self) -> SimSpec {
        self.spec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_grows_with_load() {
        let m = LatencyModel::default();
        let ttfts: Vec<Duration> = (0..5).map(|n| m.ttft(n)).collect();
        let tokens: Vec<Duration> = (0..5).map(|n| m.token(n)).collect();
        assert!(ttfts.windows(2).all(|w| w[0] < w[1]), "{ttfts:?}");
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
        assert_eq!(m.ttft(0), Duration::from_millis(30));
        assert_eq!(m.ttft(3), Duration::from_millis(90));
        assert_eq!(m.token(2), Duration::from_millis(9));
        assert_eq!(m.total(0, 0, 16), Duration::from_millis(30 + 16 * 5));
        assert!(m.total(4, 4, 16) > m.total(1, 1, 16));
        assert_eq!(m.total(u32::MAX, u32::MAX, u32::MAX), m.max_total);
        assert_eq!(LatencyModel::ZERO.total(100, 100, 100), Duration::ZERO);
    }

    #[test]
    fn demo_spec_is_valid() {
        let s = SimSpec::demo(3);
        s.validate().unwrap();
        assert_eq!(s.worker_count(), 6);
        assert_eq!(s.namespaces[0].name, "demo");
    }

    #[test]
    fn invalid_specs_are_refused() {
        let b = SimSpec::builder;
        for s in [
            b().build(),
            b().namespace("a").build(),
            b().aggregated("m", 0).build(),
            b().aggregated("m", 1).aggregated("m", 1).build(),
            b().disaggregated("m", 0, 1).build(),
            b().aggregated("m", 1).dp_size(0).build(),
            b().namespace("a")
                .aggregated("m", 1)
                .namespace("a")
                .aggregated("n", 1)
                .build(),
            b().aggregated("m", 1)
                .ttl(Duration::from_millis(10))
                .build(),
        ] {
            assert!(matches!(s.validate(), Err(SimError::Spec(_))), "{s:?}");
        }
        b().aggregated("m", 1)
            .aggregated("n", 2)
            .dp_size(2)
            .build()
            .validate()
            .unwrap();
    }
}
