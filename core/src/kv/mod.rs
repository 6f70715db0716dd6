//! KV-overlap indexing (KV-IDX-01..12): which `(worker, dp_rank)` holds which prompt-prefix
//! blocks, fed by the workers' `kv-events` streams.
//!
//! Role, in data-flow order:
//! - [`event`]: the sans-IO decoder of a `kv-events` envelope payload (a msgpack array of
//!   `RouterEvent`s) into a reusable, bounded [`event::KvBatch`] (KV-IDX-04/05);
//! - [`handler`]: the per-subscription rules applied to each decoded event before it touches the
//!   index: storage tier, live-identity gate (KV-IDX-09), per-rank `event_id` cursor with replay and
//!   gap handling (KV-IDX-10/11), each outcome one closed [`Outcome`] label;
//! - [`index`]: one shard's radix index, single writer (the shard's ingest), nodes along the
//!   `tokens_hash` path from the root keyed by the chained path hash, per-rank engine-hash lookup with
//!   reference counts (KV-IDX-06), compile-time caps (KV-IDX-08) charged to a router-wide
//!   [`budget::Budget`];
//! - [`shared`]: the read side other shards use at pick time over the one node table each index
//!   keeps: a reader never takes a lock and never blocks the writing shard; it sees each node
//!   whole, and writes as they are made;
//! - [`parity`]: the hash-parity watchdog's predictions and verdicts (did the chosen rank store
//!   the prompt under the router's hashes?).
//!
//! Invariants:
//! - every size read from the fleet is checked against its cap before anything is allocated;
//! - nothing here panics on any input; refusals are counted, never silently dropped;
//! - the path hash of a node is Dynamo's sequence hash: `path[0] = tokens_hash[0]`,
//!   `path[i] = XXH3-64(LE path[i-1] || LE tokens_hash[i], seed 1337)` ([`path_hash`]), so a
//!   request's block hashes (`picker::BlockHash`) look nodes up directly.

mod arena;
pub mod budget;
pub mod encode;
pub mod event;
pub mod handler;
pub mod index;
mod keyed;
mod nodes;
pub mod parity;
pub mod shared;

#[cfg(test)]
mod diff_tests;
#[cfg(test)]
mod event_fixture_tests;
#[cfg(test)]
mod event_tests;
#[cfg(test)]
mod handler_tests;
#[cfg(test)]
mod index_tests;
#[cfg(test)]
mod test_support;

use crate::picker::BlockHash;

/// The seed of Dynamo's block hashing (XXH3-64) in 1.6.1.
pub const HASH_SEED: u64 = 1337;

/// Events per decoded batch (KV-IDX-04).
pub const MAX_BATCH_EVENTS: usize = 128;
/// Blocks per decoded batch, stored blocks and removed hashes together (KV-IDX-04).
pub const MAX_BATCH_BLOCKS: usize = 8192;

/// Nodes in the whole router's index (KV-IDX-08).
pub const MAX_INDEX_BLOCKS: usize = 1_048_576;
/// Blocks one `(worker, dp_rank)` may own (KV-IDX-08).
pub const MAX_BLOCKS_PER_RANK: usize = 262_144;
/// `(rank, block)` ownerships in the whole router's index (KV-IDX-08).
pub const MAX_INDEX_OWNERSHIPS: usize = 8_388_608;
/// Ranks owning one node (KV-IDX-08).
pub const MAX_OWNERS_PER_NODE: usize = 4096;
/// `(worker, dp_rank)` cursors per subscription (KV-IDX-08).
pub const MAX_CURSORS_PER_SUBSCRIPTION: usize = 4096;

/// The engine's hash of a block (`block_hash` in events; Dynamo's `ExternalSequenceBlockHash`).
/// Opaque: only ever compared, never recomputed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EngineHash(pub u64);

/// The hash of one block's tokens alone (`tokens_hash` in events; Dynamo's `LocalBlockHash`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokensHash(pub u64);

/// One stored block of a `stored` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredBlock {
    /// The engine's hash (the key of later `removed` events and of children's `parent_hash`).
    pub block_hash: EngineHash,
    /// The hash of the block's tokens (the edge label in the index).
    pub tokens_hash: TokensHash,
}

/// The path hash of the child labelled `tokens` under `parent` (`None`: the root).
pub fn path_hash(parent: Option<BlockHash>, tokens: TokensHash) -> BlockHash {
    match parent {
        None => BlockHash(tokens.0),
        Some(p) => {
            let mut buf = [0u8; 16];
            buf[..8].copy_from_slice(&p.0.to_le_bytes());
            buf[8..].copy_from_slice(&tokens.0.to_le_bytes());
            BlockHash(xxhash_rust::xxh3::xxh3_64_with_seed(&buf, HASH_SEED))
        }
    }
}

/// The result of one event or block, the closed label set of
/// `continuum_dynamo_kv_events_total{result}` (OBS-06).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// Applied to the index.
    Applied,
    /// `event_id` at or below the rank's cursor: skipped (KV-IDX-10).
    Replay,
    /// `event_id` skipped ahead: the rank was cleared, then the event applied (KV-IDX-11).
    Gap,
    /// A block beyond a KV-IDX-08 cap, or a batch beyond KV-IDX-04's.
    OverCapacity,
    /// Not a live worker, an undeclared dp rank, or not the publisher's registered source.
    IdentityMismatch,
    /// A storage tier other than `device`: counted, not indexed (KV-IDX-05).
    OtherTier,
    /// A `stored` event whose `parent_hash` the rank does not hold: not applied.
    ParentMissing,
    /// A payload that does not decode.
    Malformed,
}

impl Outcome {
    /// Every outcome, in label order.
    pub const ALL: [Outcome; 8] = [
        Outcome::Applied,
        Outcome::Replay,
        Outcome::Gap,
        Outcome::OverCapacity,
        Outcome::IdentityMismatch,
        Outcome::OtherTier,
        Outcome::ParentMissing,
        Outcome::Malformed,
    ];

    /// The `result` label.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::Replay => "replay",
            Outcome::Gap => "gap",
            Outcome::OverCapacity => "over_capacity",
            Outcome::IdentityMismatch => "identity_mismatch",
            Outcome::OtherTier => "other_tier",
            Outcome::ParentMissing => "parent_missing",
            Outcome::Malformed => "malformed",
        }
    }

    /// Its position in [`Outcome::ALL`] (for counter arrays).
    pub fn index(self) -> usize {
        self as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_hash_matches_the_captured_mocker_chain() {
        // The first two blocks of ../shared/fixtures/dynamo-1.6.1/kv-events/decoded.jsonl n=0: the
        // mocker's block_hash is Dynamo's sequence hash.
        let first = path_hash(None, TokensHash(11499245004881855015));
        assert_eq!(first, BlockHash(11499245004881855015));
        let second = path_hash(Some(first), TokensHash(9980927993777812555));
        assert_eq!(second, BlockHash(15631498246336178143));
        let third = path_hash(Some(second), TokensHash(6691808215941138033));
        assert_eq!(third, BlockHash(17998831800745204490));
    }

    #[test]
    fn labels_are_distinct_and_indexed_in_order() {
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(o.index(), i);
        }
        let mut labels: Vec<_> = Outcome::ALL.iter().map(|o| o.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Outcome::ALL.len());
    }
}
