//! A stage list's probes with their loads kept in list order (issue 11, "pick at scale").
//!
//! Role: a pick reads the loads of the same candidate list pick after pick (a stage list lives
//! until the fleet or the snapshot changes). [`ProbeSet`] keeps, next to each probe, its last
//! answer as a [`LoadDigest`] and what that answer was checked against: the cell it came from,
//! that cell's store stamp and its in-flight stamps, and, per group of cells, the group stamps
//! (`super::seqcell`) as last loaded. A memoised read of the set ([`super::LoadMemo::refresh`])
//! loads the group stamps first, checks by cell stamps only the probes of groups that changed
//! (the set keeps its probes sorted by their cells' groups), and goes to the memo's per-cell
//! entries only for the probes whose cells changed; the digests come back as one contiguous
//! slice in probe order, with the list of those it renewed.
//!
//! Invariants:
//! - after a memoised read at `now`, every digest is what [`super::rules::KeyLoad::assess_hinted`]
//!   would return for its probe at `now`, digested (the per-cell memo's invariants, checked by
//!   its differential test through sets kept across steps);
//! - a set's checks are trusted only for the memo source (store and in-flight tables) they were
//!   taken from, only from the latest read time among its answers and only before the earliest
//!   instant at which time alone could change one of them; otherwise every probe is read again;
//! - a probe in a group whose group stamps are all as loaded at the last read keeps its answer
//!   unchecked: no write to that group's cells has finished since (a write still in progress is
//!   seen at the next read, as with cell stamps);
//! - every probe answered from a cell is in exactly one group run of `grouped` (re-sorted when
//!   an answer moves to another cell); a probe without a cell (its key is not in the store) is
//!   in `unheld` and read again on every read;
//! - a set filled by another source ([`ProbeSet::fill`]) holds no checks;
//! - the set allocates only when it grows.

use super::LoadKey;
use super::digest::LoadDigest;
use super::seqcell::{GROUP_SHIFT, Stamps};
use super::store::SlotRef;

/// One candidate of a set: its key and its cell hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankProbe {
    /// The key.
    pub key: LoadKey,
    /// The key's cell in some earlier view of the store (see
    /// [`super::rules::KeyLoad::assess_hinted`]).
    pub hint: Option<SlotRef>,
}

/// The slot of a probe whose answer has no cell to check (read again every time).
pub(super) const NO_CELL: u32 = u32::MAX;

/// What a probe's answer was checked against: the cell it was read from and that cell's store
/// stamp (its in-flight stamps are in [`ProbeSet::stamps`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Held {
    pub(super) slot: u32,
    pub(super) store: u32,
}

impl Held {
    pub(super) const NONE: Self = Self {
        slot: NO_CELL,
        store: 0,
    };
}

/// Which store and in-flight tables a set's checks come from (addresses, compared only;
/// `len == usize::MAX` for none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SourceId {
    pub(super) store: usize,
    pub(super) tables: usize,
    pub(super) len: usize,
}

impl SourceId {
    /// No memo source: checks taken under it are never trusted.
    pub(super) const NONE: Self = Self {
        store: 0,
        tables: 0,
        len: usize::MAX,
    };
}

impl Default for SourceId {
    fn default() -> Self {
        Self::NONE
    }
}

/// A stage list's probes and their last answers, in list order (module docs).
#[derive(Debug, Default)]
pub struct ProbeSet {
    pub(super) probes: Vec<RankProbe>,
    /// Each probe's last answer.
    pub(super) digests: Vec<LoadDigest>,
    /// Each probe's checks.
    pub(super) held: Vec<Held>,
    /// `probes.len() * source.len` in-flight stamps, per probe in table order.
    pub(super) stamps: Vec<u32>,
    /// The source the checks come from.
    pub(super) source: SourceId,
    /// The latest read time (ns) among the answers.
    pub(super) read_at: u64,
    /// The earliest instant (ns) at which time alone could change an answer.
    pub(super) until: u64,
    /// The probes the last read answered anew (unless `renewed_all`).
    pub(super) renewed: Vec<u32>,
    /// Whether the last read answered every probe anew.
    pub(super) renewed_all: bool,
    /// Per cell group, the group stamps of the store and each in-flight table (`1 + tables`
    /// values per group) as loaded at the last read; empty when none are to be trusted.
    pub(super) seen: Vec<u32>,
    /// One past the highest group of a cell an answer was read from (a bound).
    pub(super) need_groups: usize,
    /// Groups whose stamps changed since the last read (bits; scratch of a read).
    pub(super) dirty: Vec<u64>,
    /// The probes answered from a cell, by the cell's group (ascending), each group's run
    /// starting at `starts[g]`.
    pub(super) grouped: Vec<u32>,
    /// Where each group's run in `grouped` starts (one more entry than groups).
    pub(super) starts: Vec<u32>,
    /// The probes answered without a cell (read again every time).
    pub(super) unheld: Vec<u32>,
}

/// Which answers the last read of a set gave anew (every other answer is the one before).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewed<'a> {
    /// Every answer.
    All,
    /// The answers at these probe indices (each once, in no particular order).
    These(&'a [u32]),
}

impl ProbeSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty set with room for `n` probes.
    pub fn with_capacity(n: usize) -> Self {
        Self {
            probes: Vec::with_capacity(n),
            digests: Vec::with_capacity(n),
            held: Vec::with_capacity(n),
            ..Self::default()
        }
    }

    /// Removes every probe.
    pub fn clear(&mut self) {
        self.probes.clear();
        self.digests.clear();
        self.forget();
    }

    /// Appends a probe (its answer is read on the next read).
    pub fn push(&mut self, probe: RankProbe) {
        self.probes.push(probe);
        self.digests.clear();
        self.forget();
    }

    /// The probes, in list order.
    pub fn probes(&self) -> &[RankProbe] {
        &self.probes
    }

    /// The answers of the last read, in probe order (as that read returned them; none before
    /// the first read after a change of probes).
    pub fn answers(&self) -> &[LoadDigest] {
        &self.digests
    }

    /// Which answers the last read gave anew: a caller that keeps figures derived from the
    /// answers (index for index) updates only these.
    pub fn renewed(&self) -> Renewed<'_> {
        if self.renewed_all {
            Renewed::All
        } else {
            Renewed::These(&self.renewed)
        }
    }

    /// Sets every probe's answer to `read(probe)` and drops the checks (a source without a
    /// memo). Returns the answers in probe order.
    pub fn fill(&mut self, mut read: impl FnMut(&RankProbe) -> LoadDigest) -> &[LoadDigest] {
        self.forget();
        self.renewed_all = true;
        self.digests.clear();
        self.digests.extend(self.probes.iter().map(&mut read));
        &self.digests
    }

    /// Drops the checks: the next memoised read reads every probe again.
    fn forget(&mut self) {
        self.source = SourceId::NONE;
    }

    /// Drops every answer and check, ready to answer every probe anew under `source` with
    /// `tables` in-flight tables.
    pub(super) fn reset(&mut self, source: SourceId, tables: usize) {
        let len = self.probes.len();
        self.held.clear();
        self.held.resize(len, Held::NONE);
        self.digests.clear();
        self.digests.resize(len, LoadDigest::default());
        self.stamps.clear();
        self.stamps.resize(len.saturating_mul(tables), 0);
        self.source = source;
        self.read_at = 0;
        self.until = u64::MAX;
        self.seen.clear();
        self.need_groups = 0;
    }

    /// Sorts the probes by the group of the cell each was answered from (`grouped`, `starts`)
    /// and lists those answered without one (`unheld`): a counting sort, run when an answer
    /// moved to another cell.
    pub(super) fn regroup(&mut self) {
        let groups = self.need_groups;
        self.starts.clear();
        self.starts.resize(groups + 1, 0);
        self.unheld.clear();
        for (i, h) in self.held.iter().enumerate() {
            let i = u32::try_from(i).unwrap_or(u32::MAX);
            match self.starts.get_mut((h.slot >> GROUP_SHIFT) as usize + 1) {
                Some(c) if h.slot != NO_CELL => *c += 1,
                _ => self.unheld.push(i),
            }
        }
        for g in 0..groups {
            let prior = self.starts.get(g).copied().unwrap_or(0);
            if let Some(c) = self.starts.get_mut(g + 1) {
                *c += prior;
            }
        }
        let held = self.held.len() - self.unheld.len();
        self.grouped.clear();
        self.grouped.resize(held, 0);
        // Fill each group's run from its start (`starts[g]` advances, then is restored).
        for (i, h) in self.held.iter().enumerate() {
            if h.slot == NO_CELL {
                continue;
            }
            let g = (h.slot >> GROUP_SHIFT) as usize;
            if let Some(at) = self.starts.get_mut(g) {
                if let Some(slot) = self.grouped.get_mut(*at as usize) {
                    *slot = u32::try_from(i).unwrap_or(u32::MAX);
                }
                *at += 1;
            }
        }
        // Now `starts[g]` is where group g + 1 starts: shift back by one.
        self.starts.rotate_right(1);
        if let Some(first) = self.starts.first_mut() {
            *first = 0;
        }
    }

    /// The positions in `grouped` of the probes answered from group `g`'s cells.
    pub(super) fn group_range(&self, g: usize) -> std::ops::Range<usize> {
        let at = |g: usize| self.starts.get(g).map_or(0, |&s| s as usize);
        at(g)..at(g + 1).max(at(g))
    }

    /// Loads the group stamps (`groups`: the store's, then each of `tables` in-flight
    /// tables'; none are kept beyond [`Quick`](super::memo)'s) of every group an answer may
    /// come from, marks in `dirty` the groups whose stamps differ from `seen` (or were not
    /// seen), and keeps them in `seen`. Returns how many groups it covered (0: every probe is
    /// checked by its own stamps). Call it before checking any cell's stamps.
    pub(super) fn mark_dirty(&mut self, groups: &[Stamps<'_>], tables: usize) -> usize {
        let width = tables + 1;
        if width > groups.len() {
            self.seen.clear();
            return 0;
        }
        let count = self.need_groups;
        // `seen` has `width` values per group: only a table count change (a new source, so a
        // reset) could make it another width.
        let valid = (self.seen.len() / width).min(count);
        self.dirty.clear();
        self.dirty.resize(count.div_ceil(64), 0);
        self.seen.resize(count.saturating_mul(width), 0);
        for (g, row) in self.seen.chunks_exact_mut(width).take(count).enumerate() {
            let mut changed = g >= valid;
            for (kept, stamps) in row.iter_mut().zip(groups) {
                let now = stamps.get(g as u32);
                changed |= *kept != now;
                *kept = now;
            }
            if changed && let Some(w) = self.dirty.get_mut(g / 64) {
                *w |= 1 << (g % 64);
            }
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::InstanceId;

    fn probe(id: u64) -> RankProbe {
        RankProbe {
            key: LoadKey::new(InstanceId::new(id), 0),
            hint: None,
        }
    }

    #[test]
    fn fill_answers_in_probe_order_and_drops_the_checks() {
        let mut set = ProbeSet::with_capacity(4);
        for id in [3, 1, 2] {
            set.push(probe(id));
        }
        set.source = SourceId {
            store: 1,
            tables: 2,
            len: 1,
        };
        let order: Vec<u64> = set.probes().iter().map(|p| p.key.worker_id.get()).collect();
        assert_eq!(order, [3, 1, 2]);
        let got = set.fill(|_| LoadDigest::default()).len();
        assert_eq!(got, 3);
        assert_eq!(set.source, SourceId::NONE);
        set.clear();
        assert!(set.probes().is_empty());
    }
}
