//! A shard-local memo of key loads (issue 11, "pick at scale").
//!
//! Role: a pick reads every candidate's load: one store cell and one in-flight cell per shard,
//! each a seqlock read of one or two cache lines, then [`KeyLoad`]'s corrections. Between two
//! picks of one shard almost none of those cells change (a sample per worker every few
//! milliseconds, a dispatch or two per pick), so [`LoadMemo`] keeps, per cell slot, the last
//! [`KeyLoad`] with the stamps of the cells it was read from (`super::seqcell`) and the instant
//! until which the passing of time alone cannot change it. A memoised read loads `1 + shards`
//! stamps from dense arrays and copies the entry; a changed stamp, a passed instant or another
//! epoch reads the cells again.
//!
//! Invariants:
//! - a memoised load is what [`KeyLoad::assess_hinted`] returns for cells at least as new as the
//!   last writes whose stamps the reader saw (a stamp is loaded before its cell is read, and a
//!   read after a stamp load returns that write or a later one: the loom model in
//!   `seqcell_loom.rs`), with the time-dependent judgements of the in-flight summary (a record's
//!   expiry, a stall's onset) valid for `now` ([`super::InflightReader`] reports when they next
//!   flip); the differential test below checks memoised against direct reads step by step;
//! - an entry is used at most [`MAX_ENTRY_AGE`] after it was read and never before (a clock that
//!   went back), so a stamp could only come back to its old value after 2^32 writes of one cell
//!   within that time;
//! - one memo serves one store and one list of in-flight tables: on another it starts over;
//! - a memo call takes the stamp arrays once (`Quick`) and checks each entry against them
//!   (`LoadMemo::current`) before reading its cells again;
//! - a batch read ([`LoadMemo::visit`]) answers each probe as a single read of its hint, else
//!   of its key's current slot, would, digested;
//! - the memo grows to the highest slot read (at most [`super::MAX_LOAD_KEYS`] entries) and
//!   allocates only when it grows.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;

use super::LoadKey;
use super::digest::{DigestBatch, LoadDigest, SPARE};
use super::dispatch::{InflightReader, InflightTable};
use super::rules::KeyLoad;
use super::seqcell::Stamps;
use super::store::{LoadStore, LoadView, SlotRef};
use super::{MAX_LOAD_KEYS, duration_nanos, nanos};

/// How long after its read an entry may be used.
pub(crate) const MAX_ENTRY_AGE: Duration = Duration::from_secs(1);

/// One slot's memoised load: what a read checks (its digest, what stage selection reads, is
/// kept apart in [`LoadMemo::digests`] and the full [`KeyLoad`] in [`LoadMemo::loads`], so a
/// check streams 32-byte headers and a pick streams 56-byte digests).
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    /// The slot epoch read (0: empty; epochs start at 1).
    epoch: u64,
    /// The store cell's stamp, loaded before the read.
    store: u32,
    /// When it was read (ns).
    read_at: u64,
    /// Until when (ns, exclusive) time alone leaves it unchanged.
    until: u64,
}

/// In-flight tables whose stamp arrays a read takes once ([`Quick`]); the stamps of further
/// tables are loaded through their table.
const QUICK_TABLES: usize = 16;

/// What a memo call checks entries against: `now` in ns, the store's stamp array and the
/// in-flight tables' (the first [`QUICK_TABLES`] taken once, so that checking many entries does
/// not go through each table per entry).
struct Quick<'a> {
    t: u64,
    store: Stamps<'a>,
    taken: [Stamps<'a>; QUICK_TABLES],
    tables: &'a [Arc<InflightTable>],
}

impl<'a> Quick<'a> {
    fn new(view: &'a LoadView<'_>, tables: &'a [Arc<InflightTable>], now: Instant) -> Self {
        let mut taken = [Stamps::default(); QUICK_TABLES];
        for (s, table) in taken.iter_mut().zip(tables) {
            *s = table.stamps();
        }
        Self {
            t: nanos(now),
            store: view.stamps(),
            taken,
            tables,
        }
    }

    /// The stamp of `slot` in table `k`.
    #[inline]
    fn table_stamp(&self, k: usize, slot: u32) -> u32 {
        match self.taken.get(k) {
            Some(s) => s.get(slot),
            None => self.tables.get(k).map_or(0, |t| t.stamp(slot)),
        }
    }
}

/// One candidate of a batch read ([`LoadMemo::visit`]): its key and its cell hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankProbe {
    /// The key.
    pub key: LoadKey,
    /// The key's cell in some earlier view of the store (see [`KeyLoad::assess_hinted`]).
    pub hint: Option<SlotRef>,
}

/// Which store and tables a memo's entries come from (addresses, compared only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Source {
    store: usize,
    tables: usize,
    len: usize,
}

impl Source {
    fn of(view: &LoadView<'_>, tables: &[Arc<InflightTable>]) -> Self {
        Self {
            store: std::ptr::from_ref::<LoadStore>(view.store()).addr(),
            tables: tables.as_ptr().addr(),
            len: tables.len(),
        }
    }
}

/// The memo (module docs). One per shard; not shared.
#[derive(Debug, Default)]
pub struct LoadMemo {
    source: Source,
    entries: Vec<Entry>,
    /// Each entry's digest.
    digests: Vec<LoadDigest>,
    /// Each entry's full load.
    loads: Vec<KeyLoad>,
    /// A batch read's answer per probe (scratch of [`LoadMemo::visit`]).
    order: Vec<u32>,
    /// Digests of a batch read's probes that have no entry (scratch of [`LoadMemo::visit`]).
    spare: Vec<LoadDigest>,
    /// `entries.len() * source.len` in-flight stamps, per slot in table order.
    stamps: Vec<u32>,
    /// Loads read from the cells (not answered from an entry).
    misses: u64,
}

impl LoadMemo {
    /// An empty memo.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many loads were read from the cells rather than answered from an entry.
    pub fn misses(&self) -> u64 {
        self.misses
    }

    /// The load of `slot`'s key at `now` (as [`KeyLoad::assess_hinted`] with a hint), `None`
    /// when the cell now belongs to another key.
    pub fn load(
        &mut self,
        view: &LoadView<'_>,
        inflight: &InflightReader<'_>,
        slot: SlotRef,
        now: Instant,
    ) -> Option<KeyLoad> {
        self.start(view, inflight.tables());
        let q = Quick::new(view, inflight.tables(), now);
        let i = self.entry(view, inflight, slot, now, &q)?;
        self.loads.get(i).copied()
    }

    /// Brings every probe's entry up to date for `now`, then calls `f` once with the batch of
    /// their digests in probe order: each what [`KeyLoad::assess_hinted`] would return for the
    /// probe, digested ([`LoadDigest::of`]). A probe whose hint is missing or stale is looked
    /// up by key. The digests are lent from the memo's entries (no copy per candidate).
    pub fn visit(
        &mut self,
        view: &LoadView<'_>,
        inflight: &InflightReader<'_>,
        probes: &[RankProbe],
        now: Instant,
        f: &mut dyn FnMut(&DigestBatch<'_>),
    ) {
        let tables = inflight.tables();
        self.start(view, tables);
        let mut order = std::mem::take(&mut self.order);
        order.clear();
        self.spare.clear();
        let q = Quick::new(view, tables, now);
        for p in probes {
            // The check inline, the re-read behind a call.
            let hinted = p.hint.and_then(|s| {
                self.current(s, &q)
                    .or_else(|| self.entry(view, inflight, s, now, &q))
            });
            let entry = hinted.or_else(|| {
                let slot = view.slot(p.key).ok()?;
                self.entry(view, inflight, slot, now, &q)
            });
            let at = match entry.and_then(|i| u32::try_from(i).ok()) {
                Some(i) => i,
                None => {
                    let spare = u32::try_from(self.spare.len()).unwrap_or(0);
                    self.spare
                        .push(LoadDigest::of(&KeyLoad::assess(view, inflight, p.key, now)));
                    SPARE | spare
                }
            };
            order.push(at);
        }
        f(&DigestBatch::new(&self.digests, &self.spare, &order));
        self.order = order;
    }

    /// The index of `slot`'s entry when it is current for `q`: the same epoch, read no later
    /// than `q.t` and valid until after it, and every cell's stamp as when it was read.
    #[inline]
    fn current(&self, slot: SlotRef, q: &Quick<'_>) -> Option<usize> {
        let i = usize::try_from(slot.slot).ok()?;
        let e = self.entries.get(i)?;
        if e.epoch != slot.epoch || e.read_at > q.t || q.t >= e.until {
            return None;
        }
        if e.store != q.store.get(slot.slot) {
            return None;
        }
        let n = q.tables.len();
        let kept = self.stamps.get(i * n..(i + 1) * n)?;
        let (taken, rest) = kept.split_at(kept.len().min(QUICK_TABLES));
        let further = q.tables.get(QUICK_TABLES..).unwrap_or_default();
        (taken
            .iter()
            .zip(&q.taken)
            .all(|(k, t)| t.get(slot.slot) == *k)
            && rest
                .iter()
                .zip(further)
                .all(|(k, t)| t.stamp(slot.slot) == *k))
        .then_some(i)
    }

    /// Starts over when `view` and `tables` are not the memo's source.
    fn start(&mut self, view: &LoadView<'_>, tables: &[Arc<InflightTable>]) {
        let source = Source::of(view, tables);
        if source != self.source {
            self.entries.clear();
            self.digests.clear();
            self.loads.clear();
            self.stamps.clear();
            self.source = source;
        }
    }

    /// The index of `slot`'s entry, brought up to date for `now`; `None` when the cell now
    /// belongs to another key. The memo must have been started on `view` and `inflight`.
    #[inline]
    fn entry(
        &mut self,
        view: &LoadView<'_>,
        inflight: &InflightReader<'_>,
        slot: SlotRef,
        now: Instant,
        q: &Quick<'_>,
    ) -> Option<usize> {
        if let Some(i) = self.current(slot, q) {
            return Some(i);
        }
        let n = q.tables.len();
        let i = usize::try_from(slot.slot).ok()?;
        if i >= MAX_LOAD_KEYS {
            return None;
        }
        if i >= self.entries.len() {
            let len = (i + 1).next_power_of_two().min(MAX_LOAD_KEYS);
            self.entries.resize(len, Entry::default());
            self.digests.resize(len, LoadDigest::default());
            self.loads.resize(len, KeyLoad::default());
            self.stamps.resize(len.saturating_mul(n), 0);
        }
        self.misses = self.misses.wrapping_add(1);
        // Every stamp is loaded before its cell is read (module docs).
        let store = q.store.get(slot.slot);
        for (k, s) in self
            .stamps
            .get_mut(i * n..(i + 1) * n)?
            .iter_mut()
            .enumerate()
        {
            *s = q.table_stamp(k, slot.slot);
        }
        let entry = self.entries.get_mut(i)?;
        let Some(read) = view.read_slot_checked(slot) else {
            entry.epoch = 0;
            return None;
        };
        let (summary, until) = inflight.summary_until(slot, &read, now);
        let load = KeyLoad::with_summary(read, &summary);
        *entry = Entry {
            epoch: slot.epoch,
            store,
            read_at: q.t,
            until: until.min(q.t.saturating_add(duration_nanos(MAX_ENTRY_AGE))),
        };
        *self.digests.get_mut(i)? = LoadDigest::of(&load);
        *self.loads.get_mut(i)? = load;
        Some(i)
    }
}

#[cfg(test)]
#[path = "memo_tests.rs"]
mod tests;
