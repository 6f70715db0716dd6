//! An encoder of `kv-events` payloads (msgpack arrays of `RouterEvent`), for tests, fuzzing and
//! benchmarks.
//!
//! Role: write what a Dynamo 1.6.1 publisher sends, byte for byte as rmp-serde does (smallest
//! integer and length forms, `None` as nil, variant names as strings): [`Encoding::Map`] is
//! `rmp_serde::to_vec_named` (the wire form), [`Encoding::Array`] is `rmp_serde::to_vec`. Every
//! event carries `residency_domain: "worker"`, `start_position: nil` and `mm_extra_info: nil`, as
//! the 1.6.1 captures do; [`Tier::Other`] is written as `host_pinned`.
//!
//! Invariants: [`KvBatch::decode`](super::event::KvBatch::decode) of an encoded batch gives back
//! its events, blocks and hashes; `encode(decode(captured)) == captured` for the 1.6.1 captures.

use super::event::{
    BLOCK_FIELDS, CACHE_EVENT_FIELDS, DATA_VARIANTS, KvBatch, KvData, KvEvent, REMOVE_FIELDS,
    ROUTER_EVENT_FIELDS, STORE_FIELDS, TIER_VARIANTS, Tier,
};
use super::{EngineHash, StoredBlock};
use crate::discovery::ids::InstanceId;
pub use crate::dynamo_event::Encoding;
use crate::dynamo_event::encode::{header, key};
use crate::dynamo_event::msgpack::{
    write_array_len, write_map_len, write_opt_u64, write_str, write_u64,
};

/// What an event to encode does, its blocks or hashes borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDataRef<'a> {
    /// `{"stored": {parent_hash, start_position: nil, blocks}}`.
    Stored {
        /// `parent_hash`.
        parent: Option<EngineHash>,
        /// `blocks`, in chain order.
        blocks: &'a [StoredBlock],
    },
    /// `{"removed": {block_hashes}}`.
    Removed {
        /// `block_hashes`.
        hashes: &'a [EngineHash],
    },
    /// `"cleared"`.
    Cleared,
}

/// One `RouterEvent` to encode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvEventRef<'a> {
    /// `worker_id`.
    pub worker: InstanceId,
    /// `event.dp_rank`.
    pub dp_rank: u32,
    /// `event.event_id`.
    pub event_id: u64,
    /// `storage_tier`.
    pub tier: Tier,
    /// `event.data`.
    pub data: KvDataRef<'a>,
}

/// The events of a decoded batch, with their blocks and hashes, ready to encode again.
pub fn event_refs(batch: &KvBatch) -> Vec<KvEventRef<'_>> {
    batch
        .events()
        .iter()
        .map(|ev| event_ref(batch, ev))
        .collect()
}

/// One event of `batch` with its blocks or hashes.
pub fn event_ref<'a>(batch: &'a KvBatch, ev: &KvEvent) -> KvEventRef<'a> {
    let data = match &ev.data {
        KvData::Stored { parent, blocks } => KvDataRef::Stored {
            parent: *parent,
            blocks: batch.blocks(blocks.clone()),
        },
        KvData::Removed { hashes } => KvDataRef::Removed {
            hashes: batch.hashes(hashes.clone()),
        },
        KvData::Cleared => KvDataRef::Cleared,
    };
    KvEventRef {
        worker: ev.worker,
        dp_rank: ev.dp_rank,
        event_id: ev.event_id,
        tier: ev.tier,
        data,
    }
}

/// Appends `{variant: ` (the value follows).
fn variant(out: &mut Vec<u8>, name: &str) {
    write_map_len(out, 1);
    write_str(out, name.as_bytes());
}

/// Appends a batch: a msgpack array of `RouterEvent`.
pub fn encode_batch(events: &[KvEventRef<'_>], enc: Encoding, out: &mut Vec<u8>) {
    write_array_len(out, events.len());
    for ev in events {
        encode_event(ev, enc, out);
    }
}

/// Appends one `RouterEvent`.
pub fn encode_event(ev: &KvEventRef<'_>, enc: Encoding, out: &mut Vec<u8>) {
    let [worker_id, storage_tier, residency_domain, event, ..] = ROUTER_EVENT_FIELDS;
    let [event_id, data, dp_rank] = CACHE_EVENT_FIELDS;
    let [stored, removed, cleared] = DATA_VARIANTS;
    let [device, host_pinned, ..] = TIER_VARIANTS;
    header(out, enc, 4);
    key(out, enc, worker_id);
    write_u64(out, ev.worker.get());
    key(out, enc, storage_tier);
    let tier = match ev.tier {
        Tier::Device => device,
        Tier::Other => host_pinned,
    };
    write_str(out, tier.as_bytes());
    key(out, enc, residency_domain);
    write_str(out, b"worker");
    key(out, enc, event);
    header(out, enc, CACHE_EVENT_FIELDS.len());
    key(out, enc, event_id);
    write_u64(out, ev.event_id);
    key(out, enc, data);
    match ev.data {
        KvDataRef::Stored { parent, blocks } => {
            let [parent_hash, start_position, blocks_key] = STORE_FIELDS;
            variant(out, stored);
            header(out, enc, STORE_FIELDS.len());
            key(out, enc, parent_hash);
            write_opt_u64(out, parent.map(|p| p.0));
            key(out, enc, start_position);
            write_opt_u64(out, None);
            key(out, enc, blocks_key);
            write_array_len(out, blocks.len());
            let [block_hash, tokens_hash, mm_extra_info] = BLOCK_FIELDS;
            for b in blocks {
                header(out, enc, BLOCK_FIELDS.len());
                key(out, enc, block_hash);
                write_u64(out, b.block_hash.0);
                key(out, enc, tokens_hash);
                write_u64(out, b.tokens_hash.0);
                key(out, enc, mm_extra_info);
                write_opt_u64(out, None);
            }
        }
        KvDataRef::Removed { hashes } => {
            variant(out, removed);
            header(out, enc, REMOVE_FIELDS.len());
            key(out, enc, REMOVE_FIELDS[0]);
            write_array_len(out, hashes.len());
            for h in hashes {
                write_u64(out, h.0);
            }
        }
        KvDataRef::Cleared => write_str(out, cleared.as_bytes()),
    }
    key(out, enc, dp_rank);
    write_u64(out, u64::from(ev.dp_rank));
}
