//! The load-only stage's candidates as its cost reads them ([`Lane`]s), and the two ways of
//! selecting over them: costing every lane into the shared rules ([`cost_lanes`], any fleet),
//! or, when every lane shares one cost denominator and block size ([`Shape`]), comparing the
//! backlogs alone ([`scan_uniform`]).
//!
//! Role: the arithmetic of [`super::load_based`]'s `select_stage`, kept apart from the candidate
//! lists that own the lanes.
//!
//! Why the uniform scan is exact: with one denominator `den` and one request size `rb` for
//! every lane, a decode cost is `sat(backlog + rb) / den` and a prefill cost `backlog / den`,
//! so costs order as their numerators do. The scan keys each lane by its backlog clamped to
//! `cap = u64::MAX - max(rb, 1)` (an undefined cost keys as `u64::MAX`, above every defined
//! one). For decode with `rb >= 1`, `min(backlog, cap) + rb` **is** `sat(backlog + rb)`, so keys
//! order and tie exactly as the saturated numerators. Otherwise (prefill, or no request blocks)
//! clamping merges only backlogs at or above `cap`; a scan whose lowest key is `cap` therefore
//! declines ([`Scan::Declined`]) and the caller costs the lanes the general way, as it does when
//! a lane is stalled while the stall judgement applies. Everything else (which lanes are
//! defined, the fresh field, the cursor rotation over ties, round-robin when no lane has a fresh
//! field or none has a cost) is [`crate::load::rules::Selector`]'s rule, restated over keys; the
//! differential test below holds the two equal.
//!
//! Invariants: nothing here allocates beyond growing the caller's key buffer; nothing panics.

use std::num::{NonZeroU32, NonZeroU64};

use crate::load::rules::{Candidate, Cost, SelectReason, Selection, Stage};
use crate::load::{StageFigures, request_blocks};

/// A fresh sample carries the stage's field.
const HAS_FIELD: u8 = 1;
/// Not silent with load: a stale candidate's backlog is defined.
const NOT_SILENT: u8 = 1 << 1;
/// The in-flight stall flag.
const STALLED: u8 = 1 << 2;

/// One candidate as the cost loop reads it for one stage: its load's [`StageFigures`] with its
/// card's denominator, packed (40 bytes, one stream for the loop).
#[derive(Debug, Clone, Copy)]
pub(super) struct Lane {
    /// [`StageFigures::received`].
    received: u64,
    /// [`StageFigures::fresh_backlog`] (with `HAS_FIELD`).
    fresh: u64,
    /// [`StageFigures::stale_backlog`] (with `NOT_SILENT`).
    quiet: u64,
    /// The cost's denominator: `total_kv_blocks` for decode, `max_num_batched_tokens` for
    /// prefill; 0 for none (an undefined cost, Q-47).
    den: u64,
    block_size: Option<NonZeroU32>,
    flags: u8,
}

impl Lane {
    /// The lane of figures `f` under denominator `den` and block size `block_size`.
    pub(super) fn of(
        f: StageFigures,
        den: Option<NonZeroU64>,
        block_size: Option<NonZeroU32>,
    ) -> Self {
        let flag = |on: bool, flag: u8| if on { flag } else { 0 };
        Self {
            received: f.received,
            fresh: f.fresh_backlog.unwrap_or(0),
            quiet: f.stale_backlog.unwrap_or(0),
            den: den.map_or(0, NonZeroU64::get),
            block_size,
            flags: flag(f.fresh_backlog.is_some(), HAS_FIELD)
                | flag(f.stale_backlog.is_some(), NOT_SILENT)
                | flag(f.stalled, STALLED),
        }
    }
}

/// What a lane's candidate depends on besides the lane, for one pick and stage.
pub(super) struct LaneCost {
    /// [`crate::load::FreshWindow::bound`].
    bound: u64,
    prompt: u64,
    stage: Stage,
    /// The request's blocks for the last block size seen (candidates mostly share one).
    blocks: (Option<NonZeroU32>, Option<u64>),
}

impl LaneCost {
    /// The costing of one pick's stage: fresh from `bound` on, a `prompt`-token request.
    pub(super) fn new(bound: u64, prompt: u64, stage: Stage) -> Self {
        Self {
            bound,
            prompt,
            stage,
            blocks: (None, None),
        }
    }

    /// The lane's candidate without the stall judgement, and whether its sample is fresh.
    #[inline]
    pub(super) fn of(&mut self, lane: &Lane) -> (Candidate, bool) {
        let fresh = lane.received >= self.bound;
        let (defined, backlog, fresh_field) = if fresh {
            let field = lane.flags & HAS_FIELD != 0;
            (field, lane.fresh, field)
        } else {
            (lane.flags & NOT_SILENT != 0, lane.quiet, false)
        };
        let cost = match self.stage {
            Stage::Prefill => Cost::new(backlog, lane.den),
            Stage::Decode => {
                if self.blocks.0 != lane.block_size {
                    let size = lane.block_size.map(NonZeroU32::get);
                    self.blocks = (lane.block_size, request_blocks(self.prompt, size));
                }
                self.blocks
                    .1
                    .and_then(|b| Cost::new(backlog.saturating_add(b), lane.den))
            }
        };
        let candidate = Candidate {
            cost: cost.filter(|_| defined),
            fresh_field,
        };
        (candidate, fresh)
    }
}

/// Costs every lane into `sink` in order, noting the stalled ones in `stalled`; whether any
/// lane's sample is fresh.
#[inline]
pub(super) fn cost_lanes(
    lanes: &[Lane],
    cost: &mut LaneCost,
    stalled: &mut Vec<usize>,
    mut sink: impl FnMut(Candidate),
) -> bool {
    let mut judge = false;
    for (i, lane) in lanes.iter().enumerate() {
        let (candidate, fresh) = cost.of(lane);
        judge |= fresh;
        if lane.flags & STALLED != 0 {
            stalled.push(i);
        }
        sink(candidate);
    }
    judge
}

/// The cost denominator and block size every lane of a list shares (what [`scan_uniform`]
/// needs): a defined denominator, and for decode a block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shape {
    den: NonZeroU64,
    block_size: Option<NonZeroU32>,
}

impl Shape {
    /// The shape all of `lanes` share, if they share one with a defined denominator (`None` for
    /// no lanes).
    pub(super) fn of(lanes: &[Lane]) -> Option<Self> {
        let first = lanes.first()?;
        let shape = Self {
            den: NonZeroU64::new(first.den)?,
            block_size: first.block_size,
        };
        lanes
            .iter()
            .all(|l| l.den == first.den && l.block_size == first.block_size)
            .then_some(shape)
    }
}

/// The key of a lane whose cost is undefined (above every defined key, which is at most
/// `u64::MAX - 1`).
const UNDEFINED: u64 = u64::MAX;

/// What [`scan_uniform`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scan {
    /// The selection (the cursor advanced).
    Chose(Selection),
    /// No lanes (the cursor unmoved).
    Empty,
    /// The keys cannot decide exactly (module docs); the cursor unmoved.
    Declined,
}

/// Selects over `lanes` of shape `shape` for a `prompt`-token request at freshness bound
/// `bound`, as costing every lane into a [`crate::load::rules::Selector`] would (module docs),
/// or declines. `keys` is scratch space.
pub(super) fn scan_uniform(
    lanes: &[Lane],
    shape: Shape,
    (stage, bound, prompt): (Stage, u64, u64),
    cursor: &mut u64,
    keys: &mut Vec<u64>,
) -> Scan {
    if lanes.is_empty() {
        return Scan::Empty;
    }
    let blocks = match stage {
        Stage::Prefill => Some(0),
        Stage::Decode => request_blocks(prompt, shape.block_size.map(NonZeroU32::get)),
    };
    // Decode without request blocks (no block size) has no defined cost: the general way.
    let Some(blocks) = blocks else {
        return Scan::Declined;
    };
    let cap = u64::MAX - blocks.max(1);
    let exact_at_cap = stage == Stage::Decode && blocks >= 1;
    keys.clear();
    keys.resize(lanes.len(), UNDEFINED);
    let (mut lowest, mut any_fresh, mut any_field, mut any_stalled) = (UNDEFINED, false, false, 0);
    for (key, lane) in keys.iter_mut().zip(lanes) {
        let fresh = lane.received >= bound;
        let (backlog, defined_by) = if fresh {
            (lane.fresh, HAS_FIELD)
        } else {
            (lane.quiet, NOT_SILENT)
        };
        *key = if lane.flags & defined_by != 0 {
            backlog.min(cap)
        } else {
            UNDEFINED
        };
        any_fresh |= fresh;
        any_field |= fresh & (lane.flags & HAS_FIELD != 0);
        any_stalled |= lane.flags & STALLED;
        lowest = lowest.min(*key);
    }
    // A stalled lane under the stall judgement, or a lowest key clamping may have merged.
    if (any_stalled != 0 && any_fresh) || (lowest == cap && !exact_at_cap) {
        return Scan::Declined;
    }
    let turn = *cursor;
    *cursor = cursor.wrapping_add(1);
    if !any_field || lowest == UNDEFINED {
        let index = usize::try_from(turn % lanes.len() as u64).unwrap_or(0);
        return Scan::Chose(Selection {
            index,
            reason: SelectReason::RoundRobinStale,
        });
    }
    let ties = keys.iter().filter(|&&k| k == lowest).count() as u64;
    let nth = usize::try_from(turn % ties.max(1)).unwrap_or(0);
    let index = keys
        .iter()
        .enumerate()
        .filter(|&(_, &k)| k == lowest)
        .nth(nth)
        .map_or(0, |(i, _)| i);
    Scan::Chose(Selection {
        index,
        reason: SelectReason::Load,
    })
}

#[cfg(test)]
#[path = "lanes_tests.rs"]
mod tests;
