//! The compact form of a key's load that stage selection reads (issue 11, "pick at scale").
//!
//! Role: a [`KeyLoad`] is 128 bytes (the store's whole read: publisher, sequence, three
//! optional fields, receipt times, and the in-flight sums), but a stage's selection reads five
//! numbers and a few flags of it. [`LoadDigest`] keeps exactly those: the corrected stage fields,
//! the sample's receipt time, whether it shows backlog, the in-flight additions and the stall
//! flag. The load memo keeps one per cell beside the full load, so a pick over a thousand
//! candidates streams 56-byte digests instead of copying 128-byte loads.
//!
//! Invariants: for every load `l`, judgement, stage, `max_age` and `now`,
//! `LoadDigest::of(&l).stage_backlog(stage, max_age, now, judge)` equals
//! `stage_backlog(classify(&l, max_age, now, judge), &l.inflight, stage)`,
//! `LoadDigest::of(&l).is_fresh(..)` equals `l.fresh(..).is_some()`, and
//! `LoadDigest::of(&l).other_stage(..)` equals the KV picker's reading of the other stage's
//! backlog in the same load (the differential test in `digest_tests.rs` checks all three over
//! random loads).

use std::time::Duration;

use crate::clock::Instant;

use super::nanos;
use super::rules::{KeyLoad, Stage, StageBacklog};

const SAMPLE: u8 = 1;
const DECODE: u8 = 1 << 1;
const PREFILL: u8 = 1 << 2;
const BACKLOG: u8 = 1 << 3;
const STALLED: u8 = 1 << 4;

/// What stage selection reads of one key's load (module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadDigest {
    /// The sample's receipt time (meaningful with a sample).
    received_at: Instant,
    /// The corrected decode field (`active_decode_blocks`, else `kv_used_blocks`; with `DECODE`).
    decode: u64,
    /// The corrected `active_prefill_tokens` (with `PREFILL`).
    prefill: u64,
    /// Unanswered blocks.
    inflight_decode: u64,
    /// Unanswered prompt tokens.
    inflight_prefill: u64,
    flags: u8,
}

/// The receipt times a pick counts as fresh, worked out once per pick: a sample received at
/// `r` is fresh at `now` under `max_age` when `now - r <= max_age` (saturating), that is when
/// `r >= now - max_age`, or always when `now < max_age`. One comparison per candidate instead of
/// a saturating subtraction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreshWindow {
    /// The earliest fresh receipt time; `None`: every receipt time is fresh.
    since: Option<Instant>,
}

impl FreshWindow {
    /// The window of `max_age` ending at `now`.
    pub fn new(max_age: Duration, now: Instant) -> Self {
        Self {
            since: now.checked_sub(max_age),
        }
    }

    /// The window as a bound on [`StageFigures::received`]: a sample is fresh exactly when its
    /// figure is at least the bound.
    #[inline]
    pub fn bound(&self) -> u64 {
        self.since.map_or(1, |s| nanos(s).saturating_add(1))
    }
}

/// What a stage's cost reads of a digest, with freshness left to the pick (one comparison
/// with [`FreshWindow::bound`]) and the stall judgement to the caller: with `fresh` the
/// standing [`DigestStanding::Fresh`], else `Quiet` or `SilentWithLoad`, a digest's
/// [`LoadDigest::backlog_of`] is `fresh_backlog` (with `fresh_field` its `is_some()`) or
/// `stale_backlog` (never a fresh field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageFigures {
    /// The sample's receipt time in ns plus one; 0 without a sample (never fresh).
    pub received: u64,
    /// The backlog when the sample is fresh: its stage field plus the in-flight addition, or
    /// `None` when the sample lacks the field.
    pub fresh_backlog: Option<u64>,
    /// The backlog when it is not: the in-flight addition, or `None` when the last sample
    /// showed backlog (silent with load).
    pub stale_backlog: Option<u64>,
    /// The in-flight stall flag.
    pub stalled: bool,
}

/// How a digested candidate stands ([`super::rules::Standing`] without the sample).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DigestStanding {
    /// A fresh sample.
    Fresh,
    /// No fresh sample and no backlog shown by the last one.
    Quiet,
    /// No fresh sample; the last one showed backlog.
    SilentWithLoad,
    /// Stalled under the stall judgement.
    Stalled,
}

impl LoadDigest {
    /// The digest of `load`.
    pub fn of(load: &KeyLoad) -> Self {
        let mut d = Self {
            inflight_decode: load.inflight.decode_blocks,
            inflight_prefill: load.inflight.prefill_tokens,
            flags: if load.inflight.stalled { STALLED } else { 0 },
            ..Self::default()
        };
        if let Some(s) = load.read.sample {
            d.flags |= SAMPLE;
            d.received_at = s.received_at;
            if let Some(v) = s.decode_blocks() {
                d.flags |= DECODE;
                d.decode = v;
            }
            if let Some(v) = s.prefill_tokens() {
                d.flags |= PREFILL;
                d.prefill = v;
            }
            if s.shows_backlog() {
                d.flags |= BACKLOG;
            }
        }
        d
    }

    fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// Whether the key has a sample received within `max_age` of `now`.
    pub fn is_fresh(&self, max_age: Duration, now: Instant) -> bool {
        self.is_fresh_in(FreshWindow::new(max_age, now))
    }

    /// Whether the key has a sample received in `window`.
    #[inline]
    pub fn is_fresh_in(&self, window: FreshWindow) -> bool {
        self.has(SAMPLE) && window.since.is_none_or(|since| self.received_at >= since)
    }

    /// The in-flight stall flag (LOAD-STORE-11).
    pub fn stalled(&self) -> bool {
        self.has(STALLED)
    }

    /// The standing ([`super::rules::classify`]).
    pub fn standing(&self, max_age: Duration, now: Instant, judge: bool) -> DigestStanding {
        self.standing_in(FreshWindow::new(max_age, now), judge)
    }

    /// The standing with freshness judged by `window` (as [`LoadDigest::standing`] with the
    /// window's `max_age` and `now`).
    #[inline]
    pub fn standing_in(&self, window: FreshWindow, judge: bool) -> DigestStanding {
        if judge && self.stalled() {
            DigestStanding::Stalled
        } else if self.is_fresh_in(window) {
            DigestStanding::Fresh
        } else if self.has(SAMPLE) && self.has(BACKLOG) {
            DigestStanding::SilentWithLoad
        } else {
            DigestStanding::Quiet
        }
    }

    /// The fresh sample's field of `stage`, if any.
    fn field(&self, stage: Stage) -> Option<u64> {
        match stage {
            Stage::Prefill => self.has(PREFILL).then_some(self.prefill),
            Stage::Decode => self.has(DECODE).then_some(self.decode),
        }
    }

    /// The in-flight addition of `stage`.
    pub fn inflight(&self, stage: Stage) -> u64 {
        match stage {
            Stage::Prefill => self.inflight_prefill,
            Stage::Decode => self.inflight_decode,
        }
    }

    /// The figures of `stage` ([`StageFigures`]).
    pub fn stage_figures(&self, stage: Stage) -> StageFigures {
        let extra = self.inflight(stage);
        StageFigures {
            received: if self.has(SAMPLE) {
                nanos(self.received_at).saturating_add(1)
            } else {
                0
            },
            fresh_backlog: self.field(stage).map(|v| v.saturating_add(extra)),
            stale_backlog: (!(self.has(SAMPLE) && self.has(BACKLOG))).then_some(extra),
            stalled: self.stalled(),
        }
    }

    /// The stage backlog ([`super::rules::stage_backlog`] of the classified load).
    pub fn stage_backlog(
        &self,
        stage: Stage,
        max_age: Duration,
        now: Instant,
        judge: bool,
    ) -> StageBacklog {
        self.backlog_of(self.standing(max_age, now, judge), stage)
    }

    /// The stage backlog of a candidate standing `standing`.
    pub fn backlog_of(&self, standing: DigestStanding, stage: Stage) -> StageBacklog {
        let extra = self.inflight(stage);
        let (backlog, fresh_field) = match standing {
            DigestStanding::Fresh => {
                let field = self.field(stage);
                (field.map(|v| v.saturating_add(extra)), field.is_some())
            }
            DigestStanding::Quiet => (Some(extra), false),
            DigestStanding::SilentWithLoad | DigestStanding::Stalled => (None, false),
        };
        StageBacklog {
            backlog,
            fresh_field,
        }
    }

    /// The other stage's backlog as the KV cost reads it: the fresh sample's field (0 without
    /// one) plus the in-flight addition.
    pub fn other_stage(&self, standing: DigestStanding, stage: Stage) -> u64 {
        let sampled = match standing {
            DigestStanding::Fresh => self.field(stage).unwrap_or(0),
            _ => 0,
        };
        sampled.saturating_add(self.inflight(stage))
    }
}

#[cfg(test)]
#[path = "digest_tests.rs"]
mod tests;
