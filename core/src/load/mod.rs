//! The `kv_metrics` load store and the best-effort rules pickers apply to it.
//!
//! Role: everything between a decoded `ActiveLoad` sample (produced by the ZMTP/msgpack codecs of
//! another module, handed in as a [`Sample`]) and a picker's cost: per-subscription dedup
//! ([`SubscriptionCursor`], LOAD-STORE-01/14), the cross-core store keyed by [`LoadKey`]
//! ([`LoadStore`], LOAD-STORE-02..05/15/18/19, LOAD-ZMTP-10/11), the live-worker admission gate
//! ([`LiveSet`]), unanswered-dispatch accounting ([`DispatchLedger`], LOAD-STORE-10..12), the
//! classification and selection rules ([`rules`], LOAD-STORE-06..13, PICK-05..08) and the
//! metrics hooks ([`metrics`], LOAD-MET-01..03, OBS-04/Q-21). Decisions: `docs/decisions.md` ("The load store").
//!
//! Design (measured numbers in `docs/decisions.md`):
//! - one logical store: a fixed table of at most [`MAX_LOAD_KEYS`] cells, each 64 bytes (one cache
//!   line) of `AtomicU64` words guarded by an even/odd version (a seqlock built from atomics only;
//!   the crate forbids `unsafe`). The control thread assigns each live `(worker, dp_rank)` a slot
//!   and an epoch once per registry generation and publishes the immutable key→slot map through
//!   one `ArcSwap`;
//! - **read** (`fresh`, `last`, any picker on any shard): one `ArcSwap` guard load per
//!   [`LoadView`] (amortised over a whole pick), a binary search of the sorted key map, then the
//!   seqlock read: two `Acquire`/`Relaxed` version loads and seven `Relaxed` word loads — no lock,
//!   no read-modify-write, no allocation; a torn read is retried;
//! - **write** (`apply`, `discard_publisher`, slot re-keying): one uncontended
//!   `compare_exchange` on the cell version (even→odd), seven `Relaxed` stores, one `Release`
//!   store. In steady state a key is written only by the shard owning its publisher, so the
//!   version CAS never contends; it exists so that the rare overlaps (a restarted publisher owned
//!   by another shard during the 5 s grace, the control thread clearing a departed worker) stay
//!   correct without a lock on the read path;
//! - in-flight dispatches: each shard owns a [`DispatchLedger`] (single writer, exact, shard-local)
//!   and publishes per-key summaries into its own [`InflightTable`] (same seqlock cells), which
//!   pickers on every shard sum ([`InflightReader`]).
//!
//! Invariants:
//! - deterministic and runtime-free: time is always an argument ([`Instant`]), no I/O, no
//!   randomness, no panics; `apply` and `fresh` never allocate;
//! - a sample is visible only for a key of the current live set that has a slot; after
//!   [`LoadStore::set_live_and_retain`] returns, no sample or gauge series of a departed worker
//!   can be observed (slot epochs make writes through a stale map fail);
//! - a reader never observes a torn sample: every field it returns was written by one `apply`.

mod cursor;
mod digest;
mod dispatch;
mod live;
mod memo;
pub mod metrics;
mod probes;
mod records;
pub mod rules;
mod seqcell;
mod store;

#[cfg(test)]
mod bench_tests;
#[cfg(test)]
mod concurrency_tests;
#[cfg(test)]
mod diff_tests;
#[cfg(test)]
mod store_tests;
#[cfg(test)]
mod test_support;

use std::time::Duration;

use thiserror::Error;

use crate::clock::Instant;
use crate::discovery::{InstanceId, PublisherId};

pub use cursor::{CursorVerdict, SubscriptionCursor};
pub use digest::{DigestStanding, FreshWindow, LoadDigest, StageFigures};
pub use dispatch::{
    DispatchId, DispatchLedger, DispatchLoad, DispatchRole, Finished, Inflight, InflightReader,
    InflightTable, MAX_RECORDS_PER_KEY, Summary, request_blocks,
};
pub use live::{LiveSet, LiveWorker, RetainReport};
pub use memo::LoadMemo;
pub use probes::{ProbeSet, RankProbe, Renewed};
/// Cells per group stamp, as a shift (tests spread their keys over several groups).
#[cfg(test)]
pub(crate) use seqcell::GROUP_SHIFT;
pub use store::{ApplyOutcome, KeyRead, LoadStore, LoadView, Refusal, SlotRef};

/// The load store holds at most this many `(worker, dp_rank)` keys (LOAD-STORE-18).
pub const MAX_LOAD_KEYS: usize = 65_536;

/// An unanswered dispatch stops counting after this long (LOAD-STORE-10); a stalled judgement
/// ends with it.
pub const DISPATCH_TTL: Duration = Duration::from_secs(30);

/// A worker that received a stall-eligible request and sent no sample for this long may be
/// stalled (LOAD-STORE-11).
pub const STALL_AFTER: Duration = Duration::from_secs(5);

/// A request of at least this many blocks makes its worker eligible for the stall judgement
/// (LOAD-STORE-11, Q-28).
pub const STALL_MIN_BLOCKS: u64 = 2;

/// Default `dynamo.load.max_staleness` (LOAD-STORE-05).
pub const DEFAULT_MAX_STALENESS: Duration = Duration::from_secs(3);

/// Smallest accepted `dynamo.load.max_staleness` (LOAD-STORE-05).
pub const MIN_MAX_STALENESS: Duration = Duration::from_millis(100);

/// Largest accepted `dynamo.load.max_staleness` (LOAD-STORE-05).
pub const MAX_MAX_STALENESS: Duration = Duration::from_secs(300);

/// The store key: one data-parallel rank of one worker. `worker_id` is the worker's instance id
/// (Dynamo's `worker_id`, API-05).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LoadKey {
    /// The worker's instance id.
    pub worker_id: InstanceId,
    /// The data-parallel rank inside the worker.
    pub dp_rank: u32,
}

impl LoadKey {
    /// The key `(worker_id, dp_rank)`.
    pub const fn new(worker_id: InstanceId, dp_rank: u32) -> Self {
        Self { worker_id, dp_rank }
    }
}

/// One decoded `ActiveLoad` sample with its envelope identity (input of [`LoadStore::apply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// The publisher incarnation that sent it (frame and envelope ids already checked equal).
    pub publisher_id: PublisherId,
    /// The envelope sequence number.
    pub sequence: u64,
    /// `active_decode_blocks`, nil on Dynamo 1.4.2 `dynamo.vllm` (PICK-03).
    pub active_decode_blocks: Option<u64>,
    /// `active_prefill_tokens`, nil on `dynamo.vllm`.
    pub active_prefill_tokens: Option<u64>,
    /// `kv_used_blocks`.
    pub kv_used_blocks: Option<u64>,
}

/// A stored sample as a reader sees it: the sample and its receipt time (LOAD-STORE-03).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleView {
    /// The sample as applied.
    pub sample: Sample,
    /// When this router received it; freshness is judged by this, never by `published_at`.
    pub received_at: Instant,
}

impl SampleView {
    /// Whether the sample was received within `max_age` of `now` (an age of exactly `max_age` is
    /// fresh; a receipt after `now`, possible with per-shard coarse clocks, has age zero).
    pub fn is_fresh(&self, max_age: Duration, now: Instant) -> bool {
        now.saturating_since(self.received_at) <= max_age
    }

    /// The decode-stage backlog field: `active_decode_blocks`, or `kv_used_blocks` when it is nil
    /// (PICK-03).
    pub fn decode_blocks(&self) -> Option<u64> {
        self.sample
            .active_decode_blocks
            .or(self.sample.kv_used_blocks)
    }

    /// The prefill-stage backlog field: `active_prefill_tokens`.
    pub fn prefill_tokens(&self) -> Option<u64> {
        self.sample.active_prefill_tokens
    }

    /// Whether the sample shows backlog: a present decode field (with the PICK-03 fallback) or
    /// prefill field above zero. A sample with every field nil shows none (LOAD-STORE-07/08).
    pub fn shows_backlog(&self) -> bool {
        self.decode_blocks().is_some_and(|v| v > 0) || self.prefill_tokens().is_some_and(|v| v > 0)
    }
}

/// `dynamo.load.max_staleness` outside `100ms..=5m` (LOAD-STORE-05).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("max_staleness {0:?} is outside 100ms..=5m")]
pub struct StalenessOutOfRange(pub Duration);

/// Nanoseconds since the clock origin, saturating (a `u64` of nanoseconds covers 584 years).
pub(crate) fn nanos(t: Instant) -> u64 {
    duration_nanos(t.since_origin())
}

/// `d` in nanoseconds, saturating.
pub(crate) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The instant `n` nanoseconds after the origin.
pub(crate) fn instant(n: u64) -> Instant {
    Instant::from_origin(Duration::from_nanos(n))
}

/// A bucket hash of `key` under a table's secret `seed` (splitmix64's finaliser), for the
/// open-addressing tables keyed by rank (the store's key index, a pick's rank index).
pub(crate) fn mix_key(key: LoadKey, seed: u64) -> usize {
    let mut z =
        key.worker_id.get() ^ seed ^ u64::from(key.dp_rank).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    // Truncation on 32-bit targets keeps the low bits, the ones the masks use.
    (z ^ (z >> 31)) as usize
}
