//! Test helpers: workers, fleets, a map-backed [`LoadSource`] and samples.

use std::collections::HashMap;
use std::time::Duration;

use crate::clock::Instant;
use crate::discovery::{Capacity, FleetView, InstanceId, PublisherId, Role, UnixMillis, Worker};
use crate::load::rules::KeyLoad;
use crate::load::{Inflight, KeyRead, LoadKey, Sample, SampleView};

use super::LoadSource;

pub(crate) const MAX_AGE: Duration = Duration::from_secs(3);

pub(crate) fn at_ms(ms: u64) -> Instant {
    Instant::from_origin(Duration::from_millis(ms))
}

/// A worker of `model` with generous capacity, block size 16 and no dp declaration.
pub(crate) fn worker(ns: &str, id: u64, role: Role, model: &str) -> Worker {
    Worker {
        namespace: ns.to_owned(),
        instance_id: InstanceId::new(id),
        component: role.as_str().to_owned(),
        endpoint: "generate".to_owned(),
        role,
        model: Some(model.to_owned()),
        block_size: Some(16),
        capacity: Capacity {
            total_kv_blocks: Some(1000),
            max_num_batched_tokens: Some(8192),
            max_num_seqs: None,
            context_length: None,
        },
        dp_start_rank: None,
        dp_size: None,
        disaggregated_endpoint: None,
        card: None,
        first_seen: UnixMillis(0),
        last_updated: UnixMillis(0),
        transport: None,
    }
}

/// A fleet view with the workers sorted as the reducer publishes them.
pub(crate) fn fleet(mut workers: Vec<Worker>) -> FleetView {
    workers.sort_by(|a, b| {
        (a.namespace.as_str(), a.instance_id).cmp(&(b.namespace.as_str(), b.instance_id))
    });
    FleetView {
        workers,
        publishers: Vec::new(),
    }
}

/// Loads held in a map; absent keys have no sample and no in-flight additions.
#[derive(Debug, Default, Clone)]
pub(crate) struct MapLoads(pub HashMap<LoadKey, KeyLoad>);

impl MapLoads {
    pub(crate) fn key(id: u64, rank: u32) -> LoadKey {
        LoadKey::new(InstanceId::new(id), rank)
    }

    /// Sets the sample of `(id, rank)`, received at `at`.
    pub(crate) fn sample(
        &mut self,
        id: u64,
        rank: u32,
        at: Instant,
        decode: Option<u64>,
        prefill: Option<u64>,
        kv_used: Option<u64>,
    ) -> &mut Self {
        let e = self.0.entry(Self::key(id, rank)).or_default();
        e.read = KeyRead {
            sample: Some(SampleView {
                sample: Sample {
                    publisher_id: PublisherId::new(id),
                    sequence: 1,
                    active_decode_blocks: decode,
                    active_prefill_tokens: prefill,
                    kv_used_blocks: kv_used,
                },
                received_at: at,
            }),
            last_receipt: Some(at),
        };
        self
    }

    /// Sets the in-flight additions of `(id, rank)`.
    pub(crate) fn inflight(&mut self, id: u64, rank: u32, inflight: Inflight) -> &mut Self {
        self.0.entry(Self::key(id, rank)).or_default().inflight = inflight;
        self
    }
}

impl LoadSource for MapLoads {
    fn key_load(&self, key: LoadKey, _now: Instant) -> KeyLoad {
        self.0.get(&key).copied().unwrap_or_default()
    }
}

/// splitmix64: a tiny seeded generator for the differential tests (no dependency).
pub(crate) struct Rng {
    state: u64,
    /// How often [`Rng::opt`] gives `Some(0)` when it gives a value, in percent.
    zero_percent: u64,
}

impl Rng {
    /// A generator from `seed`; `opt` yields `Some(0)` `zero_percent` of the time it yields.
    pub(crate) fn new(seed: u64, zero_percent: u64) -> Self {
        Self {
            state: seed,
            zero_percent,
        }
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// `None` `none_percent` of the time, else `Some(0)` or a value below `max`.
    pub(crate) fn opt(&mut self, none_percent: u64, max: u64) -> Option<u64> {
        if self.chance(none_percent) {
            None
        } else if self.chance(self.zero_percent) {
            Some(0)
        } else {
            Some(self.below(max))
        }
    }

    pub(crate) fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[usize::try_from(self.below(from.len() as u64)).unwrap_or(0)]
    }
}
