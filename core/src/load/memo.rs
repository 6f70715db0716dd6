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
//! - a set read ([`LoadMemo::refresh`]) answers each probe as a single read of its hint, else
//!   of its key's current slot, would, digested, and goes to the entries only for the probes
//!   whose checks in the set no longer hold (`super::probes`);
//! - the memo grows to the highest slot read (at most [`super::MAX_LOAD_KEYS`] entries) and
//!   allocates only when it grows.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;

use super::digest::LoadDigest;
use super::dispatch::{InflightReader, InflightTable};
use super::probes::{Held, NO_CELL, ProbeSet, SourceId};
use super::rules::KeyLoad;
use super::seqcell::{GROUP_SHIFT, Stamps};
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
    now: Instant,
    t: u64,
    store: Stamps<'a>,
    taken: [Stamps<'a>; QUICK_TABLES],
    tables: &'a [Arc<InflightTable>],
    /// The store's group stamps, then the first [`QUICK_TABLES`] tables'.
    groups: [Stamps<'a>; QUICK_TABLES + 1],
}

impl<'a> Quick<'a> {
    fn new(view: &'a LoadView<'_>, tables: &'a [Arc<InflightTable>], now: Instant) -> Self {
        let mut taken = [Stamps::default(); QUICK_TABLES];
        let mut groups = [Stamps::default(); QUICK_TABLES + 1];
        groups[0] = view.groups();
        for ((s, g), table) in taken.iter_mut().zip(groups.iter_mut().skip(1)).zip(tables) {
            *s = table.stamps();
            *g = table.groups();
        }
        Self {
            now,
            t: nanos(now),
            store: view.stamps(),
            taken,
            tables,
            groups,
        }
    }

    /// Whether `slot`'s in-flight stamps are `kept` (one per table, in table order).
    #[inline]
    fn tables_match(&self, slot: u32, kept: &[u32]) -> bool {
        let (taken, rest) = kept.split_at(kept.len().min(QUICK_TABLES));
        let further = self.tables.get(QUICK_TABLES..).unwrap_or_default();
        taken
            .iter()
            .zip(&self.taken)
            .all(|(k, t)| t.get(slot) == *k)
            && rest.iter().zip(further).all(|(k, t)| t.stamp(slot) == *k)
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

impl SourceId {
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
    source: SourceId,
    entries: Vec<Entry>,
    /// Each entry's digest.
    digests: Vec<LoadDigest>,
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
        let q = Quick::new(view, inflight.tables(), now);
        let i = self.entry(view, inflight, slot, now, &q)?;
        self.loads.get(i).copied()
    }

    /// Brings every answer of `set` up to date for `now` and returns them in probe order: each
    /// what [`KeyLoad::assess_hinted`] would return for its probe, digested
    /// ([`LoadDigest::of`]). A probe whose checks still hold keeps its answer: a probe in a
    /// group of cells whose group stamps did not change is not looked at, the others are
    /// checked by their cells' stamps. The rest are answered from the probe's hint when it is
    /// current, else from its key's current cell, through this memo's entries (`super::probes`
    /// has the set's invariants).
    pub fn refresh<'s>(
        &mut self,
        view: &LoadView<'_>,
        inflight: &InflightReader<'_>,
        set: &'s mut ProbeSet,
        now: Instant,
    ) -> &'s [LoadDigest] {
        let tables = inflight.tables();
        self.start(view, tables);
        let q = Quick::new(view, tables, now);
        let n = tables.len();
        let len = set.probes.len();
        let whole = set.source != self.source
            || q.t < set.read_at
            || q.t >= set.until
            || set.held.len() != len
            || set.digests.len() != len;
        set.renewed.clear();
        set.renewed_all = whole;
        if whole {
            set.reset(self.source, n);
            for i in 0..len {
                self.renew(view, inflight, &q, set, i);
            }
            set.regroup();
            return &set.digests;
        }
        // Group stamps first, then the cells' (module docs of `super::seqcell`).
        let groups = set.mark_dirty(&q.groups, n);
        let mut moved = false;
        let mut check = |memo: &mut Self, set: &mut ProbeSet, i: usize| {
            if !memo.holds(&q, set, i, n) {
                set.renewed.push(u32::try_from(i).unwrap_or(u32::MAX));
                moved |= memo.renew(view, inflight, &q, set, i);
            }
        };
        if groups == 0 {
            for i in 0..len {
                check(self, set, i);
            }
        } else {
            for w in 0..set.dirty.len() {
                let mut bits = set.dirty.get(w).copied().unwrap_or(0);
                while bits != 0 {
                    let g = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    for k in set.group_range(g) {
                        let i = set.grouped.get(k).map_or(usize::MAX, |&i| i as usize);
                        check(self, set, i);
                    }
                }
            }
            for k in 0..set.unheld.len() {
                let i = set.unheld.get(k).map_or(usize::MAX, |&i| i as usize);
                set.renewed.push(u32::try_from(i).unwrap_or(u32::MAX));
                moved |= self.renew(view, inflight, &q, set, i);
            }
        }
        if moved {
            set.regroup();
        }
        &set.digests
    }

    /// Whether probe `i`'s answer in `set` still holds: it came from a cell whose store and
    /// in-flight stamps are as when it was read.
    #[inline]
    fn holds(&self, q: &Quick<'_>, set: &ProbeSet, i: usize, n: usize) -> bool {
        let (Some(h), Some(kept)) = (set.held.get(i), set.stamps.get(i * n..(i + 1) * n)) else {
            return false;
        };
        h.slot != NO_CELL && h.store == q.store.get(h.slot) && q.tables_match(h.slot, kept)
    }

    /// Answers probe `i` of `set` anew (from its hint's entry, else its key's cell's, else a
    /// direct read) with its checks. Returns whether the cell it was answered from changed.
    fn renew(
        &mut self,
        view: &LoadView<'_>,
        inflight: &InflightReader<'_>,
        q: &Quick<'_>,
        set: &mut ProbeSet,
        i: usize,
    ) -> bool {
        let Some(p) = set.probes.get(i).copied() else {
            return false;
        };
        let now = q.now;
        let n = q.tables.len();
        let hinted = p
            .hint
            .and_then(|s| self.entry(view, inflight, s, now, q).map(|e| (s, e)));
        let entry = hinted.or_else(|| {
            let slot = view.slot(p.key).ok()?;
            self.entry(view, inflight, slot, now, q).map(|e| (slot, e))
        });
        let (Some(h), Some(d), Some(kept)) = (
            set.held.get_mut(i),
            set.digests.get_mut(i),
            set.stamps.get_mut(i * n..(i + 1) * n),
        ) else {
            return false;
        };
        let before = h.slot;
        match entry.and_then(|(s, e)| Some((s, e, self.entries.get(e)?, self.digests.get(e)?))) {
            Some((s, e, entry, digest)) => {
                *d = *digest;
                *h = Held {
                    slot: s.slot,
                    store: entry.store,
                };
                set.read_at = set.read_at.max(entry.read_at);
                set.until = set.until.min(entry.until);
                let from = self.stamps.get(e * n..(e + 1) * n).unwrap_or_default();
                for (k, f) in kept.iter_mut().zip(from) {
                    *k = *f;
                }
                set.need_groups = set.need_groups.max((s.slot >> GROUP_SHIFT) as usize + 1);
            }
            None => {
                *d = LoadDigest::of(&KeyLoad::assess(view, inflight, p.key, now));
                *h = Held::NONE;
            }
        }
        h.slot != before
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
        q.tables_match(slot.slot, self.stamps.get(i * n..(i + 1) * n)?)
            .then_some(i)
    }

    /// Starts over when `view` and `tables` are not the memo's source.
    fn start(&mut self, view: &LoadView<'_>, tables: &[Arc<InflightTable>]) {
        let source = SourceId::of(view, tables);
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
