//! Test helpers: keys, samples, live sets and instants.

use std::time::Duration;

use crate::clock::Instant;
use crate::discovery::{InstanceId, PublisherId};

use super::{LiveSet, LiveWorker, LoadKey, LoadStore, Sample};

pub(crate) fn key(worker: u64, rank: u32) -> LoadKey {
    LoadKey::new(InstanceId::new(worker), rank)
}

pub(crate) fn at_ms(ms: u64) -> Instant {
    Instant::from_origin(Duration::from_millis(ms))
}

pub(crate) fn sample(pid: u64, seq: u64, decode: Option<u64>, prefill: Option<u64>) -> Sample {
    Sample {
        publisher_id: PublisherId::new(pid),
        sequence: seq,
        active_decode_blocks: decode,
        active_prefill_tokens: prefill,
        kv_used_blocks: None,
    }
}

pub(crate) fn worker(id: u64, start: u32, size: u32) -> LiveWorker {
    LiveWorker::new(InstanceId::new(id), "dynamo", start, size)
}

/// A store whose live set is `workers`.
pub(crate) fn store_with(workers: Vec<LiveWorker>) -> LoadStore {
    let s = LoadStore::new();
    s.set_live_and_retain(&LiveSet::new(workers));
    s
}
