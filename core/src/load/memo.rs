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
//! - a batch read ([`LoadMemo::visit`]) answers each probe as a single read of its hint, else
//!   of its key's current slot, would, digested;
//! - the memo grows to the highest slot read (at most [`super::MAX_LOAD_KEYS`] entries) and
//!   allocates only when it grows.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;

use super::LoadKey;
use super::digest::LoadDigest;
use super::dispatch::{InflightReader, InflightTable};
use super::rules::KeyLoad;
use super::store::{LoadStore, LoadView, SlotRef};
use super::{MAX_LOAD_KEYS, duration_nanos, nanos};

/// How long after its read an entry may be used.
pub(crate) const MAX_ENTRY_AGE: Duration = Duration::from_secs(1);

/// One slot's memoised load: what a read checks and what stage selection reads (the full
/// [`KeyLoad`] is kept apart, in [`LoadMemo::loads`], so a pick streams only these).
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
    digest: LoadDigest,
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
    /// Each entry's full load.
    loads: Vec<KeyLoad>,
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
        let i = self.entry(view, inflight, slot, now)?;
        self.loads.get(i).copied()
    }

    /// Calls `f` once per probe, in order, with the digest of its load at `now`: what
    /// [`KeyLoad::assess_hinted`] would return for it, digested ([`LoadDigest::of`]). A probe
    /// whose hint is missing or stale is looked up by key. The digest is lent from the memo's
    /// entry (no copy per candidate).
    pub fn visit(
        &mut self,
        view: &LoadView<'_>,
        inflight: &InflightReader<'_>,
        probes: &[RankProbe],
        now: Instant,
        f: &mut dyn FnMut(&LoadDigest),
    ) {
        self.start(view, inflight.tables());
        for p in probes {
            let hinted = p.hint.and_then(|s| self.entry(view, inflight, s, now));
            let entry = hinted.or_else(|| {
                let slot = view.slot(p.key).ok()?;
                self.entry(view, inflight, slot, now)
            });
            match entry.and_then(|i| self.entries.get(i)) {
                Some(e) => f(&e.digest),
                None => f(&LoadDigest::of(&KeyLoad::assess(
                    view, inflight, p.key, now,
                ))),
            }
        }
    }

    /// Starts over when `view` and `tables` are not the memo's source.
    fn start(&mut self, view: &LoadView<'_>, tables: &[Arc<InflightTable>]) {
        let source = Source::of(view, tables);
        if source != self.source {
            self.entries.clear();
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
    ) -> Option<usize> {
        let tables = inflight.tables();
        let n = tables.len();
        let i = usize::try_from(slot.slot).ok()?;
        if i >= MAX_LOAD_KEYS {
            return None;
        }
        if i >= self.entries.len() {
            let len = (i + 1).next_power_of_two().min(MAX_LOAD_KEYS);
            self.entries.resize(len, Entry::default());
            self.loads.resize(len, KeyLoad::default());
            self.stamps.resize(len.saturating_mul(n), 0);
        }
        let t = nanos(now);
        let store = view.stamp(slot.slot);
        let entry = self.entries.get_mut(i)?;
        let stamps = self.stamps.get_mut(i * n..(i + 1) * n)?;
        let unchanged = || {
            tables
                .iter()
                .zip(stamps.iter())
                .all(|(table, s)| table.stamp(slot.slot) == *s)
        };
        if entry.epoch == slot.epoch
            && entry.store == store
            && entry.read_at <= t
            && t < entry.until
            && unchanged()
        {
            return Some(i);
        }
        self.misses = self.misses.wrapping_add(1);
        for (table, s) in tables.iter().zip(stamps.iter_mut()) {
            *s = table.stamp(slot.slot);
        }
        let Some(read) = view.read_slot_checked(slot) else {
            entry.epoch = 0;
            return None;
        };
        let (summary, until) = inflight.summary_until(slot, &read, now);
        let load = KeyLoad::with_summary(read, &summary);
        *entry = Entry {
            epoch: slot.epoch,
            store,
            read_at: t,
            until: until.min(t.saturating_add(duration_nanos(MAX_ENTRY_AGE))),
            digest: LoadDigest::of(&load),
        };
        *self.loads.get_mut(i)? = load;
        Some(i)
    }
}

#[cfg(test)]
#[path = "memo_tests.rs"]
mod tests;
