//! The best-effort rules pickers apply to load samples (LOAD-STORE-06..13, PICK-05..08).
//!
//! Role: pure functions over what the store and the in-flight tables hold for each candidate
//! ([`KeyLoad`]): classify a `(worker, rank)` ([`Standing`]), turn it into a stage backlog
//! ([`StageBacklog`]), build a load-only cost ([`Cost`], PICK-01, Q-47) and select
//! ([`select`]: lowest defined cost with round-robin ties, or round-robin over all).
//!
//! Pickers apply these rules through [`super::LoadDigest`], the compact form of a [`KeyLoad`]
//! the load memo keeps; `digest_tests.rs` holds the two equal over random loads, so the functions
//! here stay the literal statement of the rules that the rule tests (`diff_tests.rs`) exercise.
//!
//! Invariants (readings in `docs/decisions.md`):
//! - publishers are change-based, so absence of a sample is never read as "down" (LOAD-STORE-06);
//! - [`Standing::Stalled`] wins over every other standing while the stall judgement applies, and
//!   the judgement applies only if some candidate has a fresh sample (LOAD-STORE-13);
//! - a quiet candidate's backlog is 0 plus the router's own unanswered dispatches; a fresh
//!   candidate's is its sample's stage field plus those dispatches; every other candidate has an
//!   undefined cost and is never chosen while some candidate has a defined one;
//! - selection never allocates and is a pure function of the costs and the cursor.

use std::cmp::Ordering;
use std::time::Duration;

use crate::clock::Instant;

use super::dispatch::{Inflight, InflightReader, Summary};
use super::store::{KeyRead, LoadView, SlotRef};
use super::{LoadKey, SampleView};

/// A picker stage: which backlog field its cost uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// `active_prefill_tokens`.
    Prefill,
    /// `active_decode_blocks`, or `kv_used_blocks` when nil (PICK-03).
    Decode,
}

/// Everything known about one candidate `(worker, rank)` at pick time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyLoad {
    /// What the store holds.
    pub read: KeyRead,
    /// Unanswered dispatches summed over shards.
    pub inflight: Inflight,
}

impl KeyLoad {
    /// Reads one key from the store and every shard's in-flight table.
    pub fn assess(
        view: &LoadView<'_>,
        inflight: &InflightReader<'_>,
        key: LoadKey,
        now: Instant,
    ) -> Self {
        match view.slot(key) {
            Ok(s) => Self::of_slot(view.read_slot(s), inflight, s, now),
            Err(_) => Self::default(),
        }
    }

    /// [`KeyLoad::assess`] through a cell hint (a [`SlotRef`] read from some earlier view of
    /// the store): the hint is used while the cell still carries its epoch, i.e. still belongs
    /// to `key`; otherwise (or without a hint) the key is looked up.
    pub fn assess_hinted(
        view: &LoadView<'_>,
        inflight: &InflightReader<'_>,
        key: LoadKey,
        hint: Option<SlotRef>,
        now: Instant,
    ) -> Self {
        if let Some(s) = hint
            && let Some(read) = view.read_slot_checked(s)
        {
            return Self::of_slot(read, inflight, s, now);
        }
        Self::assess(view, inflight, key, now)
    }

    /// The load of one cell: the store's read, less what the router knows finished since that
    /// sample and with the router's running requests' blocks as a floor under its block figures
    /// ([`super::Summary`]), and the unanswered additions.
    fn of_slot(read: KeyRead, inflight: &InflightReader<'_>, s: SlotRef, now: Instant) -> Self {
        let sum = inflight.summary_slot(s, &read, now);
        Self::with_summary(read, &sum)
    }

    /// The load of a cell whose store read is `read` and whose in-flight summary is `sum`
    /// ([`KeyLoad::assess`]'s corrections).
    pub(crate) fn with_summary(mut read: KeyRead, sum: &Summary) -> Self {
        if let Some(view) = read.sample.as_mut() {
            let (finished, floor) = (sum.finished, sum.running.decode_blocks);
            let less = |v: Option<u64>, by: u64| v.map(|v| v.saturating_sub(by));
            let blocks = |v: Option<u64>| less(v, finished.decode_blocks).map(|v| v.max(floor));
            let sample = &mut view.sample;
            sample.active_prefill_tokens =
                less(sample.active_prefill_tokens, finished.prefill_tokens);
            sample.active_decode_blocks = blocks(sample.active_decode_blocks);
            sample.kv_used_blocks = blocks(sample.kv_used_blocks);
        }
        Self {
            read,
            inflight: sum.inflight,
        }
    }

    /// The sample, if received within `max_age`.
    pub fn fresh(&self, max_age: Duration, now: Instant) -> Option<SampleView> {
        self.read.sample.filter(|s| s.is_fresh(max_age, now))
    }
}

/// How a candidate stands (LOAD-STORE-07/08/11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// A sample received within `max_age`.
    Fresh(SampleView),
    /// No fresh sample; never published (or discarded), or the last sample showed no backlog.
    Quiet,
    /// No fresh sample; the last one showed backlog: cost undefined (LOAD-STORE-08).
    SilentWithLoad,
    /// Possibly stalled: excluded while another candidate has a defined cost (LOAD-STORE-11).
    Stalled,
}

/// Whether any candidate has a fresh sample; if none has, the stall judgement is ignored
/// (LOAD-STORE-13) and selection is round-robin (LOAD-STORE-09).
pub fn any_fresh<'a>(
    loads: impl IntoIterator<Item = &'a KeyLoad>,
    max_age: Duration,
    now: Instant,
) -> bool {
    loads.into_iter().any(|l| l.fresh(max_age, now).is_some())
}

/// Classifies one candidate. `stall_judgement` is [`any_fresh`] over the pick's candidates.
pub fn classify(
    load: &KeyLoad,
    max_age: Duration,
    now: Instant,
    stall_judgement: bool,
) -> Standing {
    if stall_judgement && load.inflight.stalled {
        return Standing::Stalled;
    }
    match load.read.sample {
        Some(s) if s.is_fresh(max_age, now) => Standing::Fresh(s),
        Some(s) if s.shows_backlog() => Standing::SilentWithLoad,
        _ => Standing::Quiet,
    }
}

/// A candidate's backlog for one stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageBacklog {
    /// The backlog, `None` when undefined.
    pub backlog: Option<u64>,
    /// A fresh sample carries this stage's field (PICK-06's "has such a sample").
    pub fresh_field: bool,
}

/// The stage backlog of a classified candidate, in-flight additions included (PICK-05/08, Q-06).
pub fn stage_backlog(standing: Standing, inflight: &Inflight, stage: Stage) -> StageBacklog {
    let extra = match stage {
        Stage::Prefill => inflight.prefill_tokens,
        Stage::Decode => inflight.decode_blocks,
    };
    let (backlog, fresh_field) = match standing {
        Standing::Fresh(s) => {
            let field = match stage {
                Stage::Prefill => s.prefill_tokens(),
                Stage::Decode => s.decode_blocks(),
            };
            (field.map(|v| v.saturating_add(extra)), field.is_some())
        }
        Standing::Quiet => (Some(extra), false),
        Standing::SilentWithLoad | Standing::Stalled => (None, false),
    };
    StageBacklog {
        backlog,
        fresh_field,
    }
}

/// A load-only cost `num / den`, compared exactly (no floating point).
#[derive(Debug, Clone, Copy)]
pub struct Cost {
    num: u64,
    den: u64,
}

impl Cost {
    /// `num / den`; `None` for a zero denominator (Q-47: zero capacity means undefined cost).
    pub fn new(num: u64, den: u64) -> Option<Self> {
        (den > 0).then_some(Self { num, den })
    }

    /// Prefill cost `backlog_tokens / max_num_batched_tokens` (PICK-01).
    pub fn prefill(backlog_tokens: u64, max_num_batched_tokens: Option<u64>) -> Option<Self> {
        Self::new(backlog_tokens, max_num_batched_tokens?)
    }

    /// Decode cost `(backlog_blocks + request_blocks) / total_kv_blocks` (PICK-01).
    pub fn decode(
        backlog_blocks: u64,
        request_blocks: u64,
        total_kv_blocks: Option<u64>,
    ) -> Option<Self> {
        Self::new(
            backlog_blocks.saturating_add(request_blocks),
            total_kv_blocks?,
        )
    }
}

impl PartialEq for Cost {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Cost {}

impl PartialOrd for Cost {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Cost {
    fn cmp(&self, other: &Self) -> Ordering {
        (u128::from(self.num) * u128::from(other.den))
            .cmp(&(u128::from(other.num) * u128::from(self.den)))
    }
}

/// One candidate as selection sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Its cost, `None` when undefined (no capacity, silent with load, stalled, fresh sample
    /// without the stage field).
    pub cost: Option<Cost>,
    /// A fresh sample carries the stage's field.
    pub fresh_field: bool,
}

/// Why a candidate was selected (`continuum_dynamo_selection_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectReason {
    /// Lowest defined cost (PICK-06).
    Load,
    /// Round-robin over all candidates: no fresh sample with the stage's field (PICK-07,
    /// LOAD-STORE-09), or no defined cost at all.
    RoundRobinStale,
}

impl SelectReason {
    /// The `reason` label.
    pub const fn label(self) -> &'static str {
        match self {
            SelectReason::Load => "load",
            SelectReason::RoundRobinStale => "round_robin_stale",
        }
    }
}

/// A selection: the candidate's index and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selection {
    /// Index into the candidate slice.
    pub index: usize,
    /// Reason.
    pub reason: SelectReason,
}

/// Selects among `candidates` (PICK-06/07). `cursor` is the per-stage round-robin cursor; it
/// advances by one per selection. `None` only for an empty slice.
pub fn select(candidates: &[Candidate], cursor: &mut u64) -> Option<Selection> {
    let mut s = Selector::default();
    for c in candidates {
        s.offer(*c);
    }
    s.finish(cursor, |i| candidates.get(i).copied())
}

/// The lowest of values offered in index order: the value, the first index holding it and how
/// many tie with it; and which tie a cursor turn chooses (ties rotate in index order: turn `t`
/// takes tie `t mod ties`). The load-only [`Selector`] and the KV picker select with it.
#[derive(Debug, Clone, Copy)]
pub struct Lowest<C> {
    best: Option<(C, usize, u64)>,
}

impl<C> Default for Lowest<C> {
    fn default() -> Self {
        Self { best: None }
    }
}

impl<C: PartialOrd + Copy> Lowest<C> {
    /// Offers value `c` at index `i` (indices ascending). A value unordered with the lowest
    /// (a NaN) is ignored.
    #[inline]
    pub fn offer(&mut self, i: usize, c: C) {
        match &mut self.best {
            None => self.best = Some((c, i, 1)),
            Some((b, first, ties)) => match c.partial_cmp(b) {
                Some(Ordering::Less) => (*b, *first, *ties) = (c, i, 1),
                Some(Ordering::Equal) => *ties += 1,
                Some(Ordering::Greater) | None => {}
            },
        }
    }

    /// The index turn `turn` chooses among the ties (`None`: nothing offered). `value_at(i)`
    /// gives the value offered at `i` again; it is asked only when the turn lands on a tie after
    /// the first, for the indices after the first below `end`.
    pub fn choose(
        &self,
        turn: u64,
        end: usize,
        mut value_at: impl FnMut(usize) -> Option<C>,
    ) -> Option<usize> {
        let (best, first, ties) = self.best?;
        let nth = usize::try_from(turn % ties).unwrap_or(0);
        if nth == 0 {
            return Some(first);
        }
        Some(
            (first + 1..end)
                .filter(|&i| value_at(i) == Some(best))
                .nth(nth - 1)
                .unwrap_or(first),
        )
    }
}

/// [`select`] one candidate at a time, for a caller that computes its candidates on the fly:
/// [`Selector::offer`] each in candidate order, then [`Selector::finish`]. One pass notes
/// whether any has the stage's fresh field, the lowest defined cost, where it first occurs and
/// how many tie with it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Selector {
    offered: usize,
    any_field: bool,
    /// The lowest cost, its first index and how many tie with it.
    lowest: Lowest<Cost>,
}

impl Selector {
    /// Offers the next candidate.
    #[inline]
    pub fn offer(&mut self, c: Candidate) {
        let i = self.offered;
        self.offered += 1;
        self.any_field |= c.fresh_field;
        if let Some(cost) = c.cost {
            self.lowest.offer(i, cost);
        }
    }

    /// The selection among the offered candidates, advancing `cursor` (none offered: `None`,
    /// the cursor unmoved). `again(i)` returns the `i`-th offered candidate again; it is asked
    /// only when the cursor lands on a tie after the first, for the candidates after it.
    pub fn finish(
        self,
        cursor: &mut u64,
        mut again: impl FnMut(usize) -> Option<Candidate>,
    ) -> Option<Selection> {
        if self.offered == 0 {
            return None;
        }
        let turn = *cursor;
        *cursor = cursor.wrapping_add(1);
        let chosen = if self.any_field {
            self.lowest
                .choose(turn, self.offered, |i| again(i).and_then(|c| c.cost))
        } else {
            None
        };
        Some(match chosen {
            Some(index) => Selection {
                index,
                reason: SelectReason::Load,
            },
            None => Selection {
                index: usize::try_from(turn % self.offered as u64).unwrap_or(0),
                reason: SelectReason::RoundRobinStale,
            },
        })
    }
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
