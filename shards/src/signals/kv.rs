//! The KV family's cross-shard state: every shard's index read side, its `kv-events` counters
//! and its per-rank summary rows, and the router-wide capacity budget (KV-IDX-05..11, OBS-10).
//!
//! Each shard owns one index (written only by its ingest: the publishers whose id hashes to it)
//! and hands out readers to every shard's picker: the merge at pick time is a disjoint union,
//! since each publisher, and so each `(worker, dp_rank)`, lives on exactly one shard.
//!
//! Invariants:
//! - `events[i]`, `rows[i]` and the writer of `readers[i]` belong to shard `i` alone;
//! - the per-rank rows are a summary republished by their shard at most every
//!   [`ROWS_EVERY`] and after every clear, so an admin read never touches an index;
//! - the index writers are handed out once, each to its own shard ([`KvSignals::take_writer`]).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use continuum_core::clock::Instant;
use continuum_core::kv::Outcome;
use continuum_core::kv::budget::Budget;
use continuum_core::kv::index::{IndexWriter, new_index};
use continuum_core::kv::shared::{IndexReader, IndexReaders};
use continuum_core::load::LoadKey;

use super::parity::ParityBoard;

/// How often a shard republishes its per-rank rows while events arrive.
pub const ROWS_EVERY: Duration = Duration::from_millis(200);

/// One indexed rank, as `/admin/dynamo/workers` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankRow {
    /// The rank.
    pub key: LoadKey,
    /// Blocks it holds in the index.
    pub blocks: usize,
    /// The last `event_id` applied or skipped for it.
    pub last_event_id: u64,
    /// When that event arrived.
    pub last_event_at: Instant,
}

/// `continuum_dynamo_kv_events_total{result}` of one shard.
#[derive(Debug, Default)]
pub struct KvEventCounters([AtomicU64; Outcome::ALL.len()]);

impl KvEventCounters {
    /// Add `n` events of `outcome`.
    pub fn add(&self, outcome: Outcome, n: u64) {
        if n > 0
            && let Some(c) = self.0.get(outcome.index())
        {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The current count of `outcome`.
    pub fn get(&self, outcome: Outcome) -> u64 {
        self.0
            .get(outcome.index())
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

/// The KV family's state every shard reads.
#[derive(Debug)]
pub struct KvSignals {
    /// Nodes and ownerships of every shard's index together (KV-IDX-08).
    pub budget: Arc<Budget>,
    /// Every shard's index read side.
    pub readers: Box<[IndexReaders]>,
    /// Every shard's event counters.
    pub events: Box<[KvEventCounters]>,
    /// Every shard's per-rank rows.
    pub rows: Box<[ArcSwap<Vec<RankRow>>]>,
    /// The hash-parity watchdog's per-model verdicts.
    pub parity: ParityBoard,
    writers: Mutex<Vec<Option<IndexWriter>>>,
}

impl KvSignals {
    /// One empty index per shard, all charged to one budget.
    pub fn new(shards: usize) -> Self {
        let shards = shards.max(1);
        let budget = Arc::new(Budget::new());
        let (writers, readers): (Vec<_>, Vec<_>) =
            (0..shards).map(|_| new_index(budget.clone())).unzip();
        Self {
            budget,
            readers: readers.into_boxed_slice(),
            events: (0..shards).map(|_| KvEventCounters::default()).collect(),
            rows: (0..shards)
                .map(|_| ArcSwap::from_pointee(Vec::new()))
                .collect(),
            writers: Mutex::new(writers.into_iter().map(Some).collect()),
            parity: ParityBoard::default(),
        }
    }

    /// Shard `shard`'s index writer, the first time it is asked for (`None` after that).
    pub fn take_writer(&self, shard: usize) -> Option<IndexWriter> {
        let mut w = self
            .writers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        w.get_mut(shard).and_then(Option::take)
    }

    /// One read handle on every shard's index, for a picker on the calling thread.
    pub fn handles(&self) -> Vec<IndexReader> {
        self.readers.iter().map(IndexReaders::handle).collect()
    }

    /// Shard `shard`'s counters (at least one set exists).
    pub fn events(&self, shard: usize) -> &KvEventCounters {
        self.events.get(shard).unwrap_or(&self.events[0])
    }

    /// When `rank` last sent an event, as its shard last republished its rows.
    pub fn last_event(&self, rank: LoadKey) -> Option<Instant> {
        self.rows.iter().find_map(|r| {
            r.load()
                .iter()
                .find(|row| row.key == rank)
                .map(|row| row.last_event_at)
        })
    }

    /// Every indexed rank of `worker_id`, over all shards, by rank.
    pub fn ranks_of(&self, worker_id: continuum_core::discovery::InstanceId) -> Vec<RankRow> {
        let mut out: Vec<RankRow> = self
            .rows
            .iter()
            .flat_map(|r| {
                r.load()
                    .iter()
                    .filter(|row| row.key.worker_id == worker_id)
                    .copied()
                    .collect::<Vec<_>>()
            })
            .collect();
        out.sort_by_key(|r| r.key.dp_rank);
        out
    }

    /// Append `continuum_dynamo_kv_events_total{result}` (summed over shards) and the index
    /// gauges (no per-block labels).
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = writeln!(
            out,
            "# HELP continuum_dynamo_kv_events_total kv-events by result (per event).\n\
             # TYPE continuum_dynamo_kv_events_total counter"
        );
        for o in Outcome::ALL {
            let n: u64 = self.events.iter().map(|c| c.get(o)).sum();
            let _ = writeln!(
                out,
                "continuum_dynamo_kv_events_total{{result=\"{}\"}} {n}",
                o.label()
            );
        }
        let _ = writeln!(
            out,
            "# HELP continuum_dynamo_kv_index_blocks Nodes in the KV index (all shards).\n\
             # TYPE continuum_dynamo_kv_index_blocks gauge\n\
             continuum_dynamo_kv_index_blocks {}\n\
             # HELP continuum_dynamo_kv_index_ownerships (rank, block) ownerships in the KV index (all shards).\n\
             # TYPE continuum_dynamo_kv_index_ownerships gauge\n\
             continuum_dynamo_kv_index_ownerships {}",
            self.budget.nodes(),
            self.budget.ownerships()
        );
        self.parity.render_metrics(out);
    }
}
