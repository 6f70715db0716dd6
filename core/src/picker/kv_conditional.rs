//! Conditional disaggregation (`dynamo.kv.conditional_disaggregation`, KV-PICK-12..15, Q-25):
//! upstream `--router-conditional-disagg` as the router applies it to a prefill/decode pool.
//!
//! Role: the arithmetic and the decision, free of fleet walking (the picker, `kv_aware`, calls
//! them for the pool's decode ranks and for the one it chose):
//! - [`conditional_decode_cost`]: a decode rank's score `max(0, decode_cost_blocks -
//!   overlap_credit_blocks)` (KV-PICK-12), with both terms exactly as KV-PICK-01 defines them, so
//!   overlap is subtracted from the request's blocks and credited again (Q-25's first point;
//!   upstream 1.6.1 `worker_logit`'s decode branch does the same with `potential_decode_blocks`);
//! - [`decide_bypass`]: whether the chosen decode rank prefills locally, with no remote prefill.
//!   First upstream 1.6.1's default policy (`isl_bounding`): the effective input
//!   `isl - min(isl, credit * overlap_blocks * bs)` must be below [`EFF_ISL_THRESHOLD`] tokens
//!   **and** below [`EFF_ISL_RATIO_THRESHOLD`] of the prompt. Then, only when
//!   `decode_busy_threshold` is set (KV-PICK-13), the decode gate: the rank's expected active
//!   blocks (its fresh sample's decode blocks, the router's unanswered blocks and this request's
//!   new blocks) must be ≤ `threshold * total_kv_blocks`; without a fresh sample carrying decode
//!   blocks, or without a positive `total_kv_blocks`, the bypass is refused. Without a
//!   threshold the gate is off, as upstream (`bypass_allowed_decode_gate_disabled`).
//!
//! Invariants: every function is total (no panic on any input, NaN included: a NaN or negative
//! product never allows a bypass it would not allow at zero credit); no allocation, no clock.

use crate::config::dynamo::ConditionalDisaggregation;

use super::kv_cost::{KvParams, KvRequest, KvTerms, decode_cost_blocks};

/// Upstream 1.6.1 `DEFAULT_CONDITIONAL_DISAGG_EFF_ISL_THRESHOLD`: a bypass needs fewer net-new
/// prompt tokens than this.
pub const EFF_ISL_THRESHOLD: u64 = 2048;

/// Upstream 1.6.1 `DEFAULT_CONDITIONAL_DISAGG_EFF_ISL_RATIO_THRESHOLD`: a bypass needs the
/// net-new tokens to be less than this fraction of the prompt.
pub const EFF_ISL_RATIO_THRESHOLD: f64 = 0.7;

/// Conditional disaggregation switched on, with its decode gate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConditionalDisagg {
    /// `decode_busy_threshold`: a fraction of `total_kv_blocks` (0..=1, validated by the
    /// config); `None` leaves the gate off.
    pub decode_busy_threshold: Option<f64>,
}

impl ConditionalDisagg {
    /// The setting of a config: `None` unless `enabled` (the default, KV-PICK-15).
    pub fn from_config(c: &ConditionalDisaggregation) -> Option<Self> {
        c.enabled.then_some(ConditionalDisagg {
            decode_busy_threshold: c.decode_busy_threshold,
        })
    }
}

/// A decode rank's conditional-disaggregation score (KV-PICK-12): `max(0, decode_cost_blocks -
/// overlap_score_credit * overlap_blocks)`. `None` for a zero block size or a NaN result.
pub fn conditional_decode_cost(
    params: &KvParams,
    isl: u64,
    block_size: u32,
    overlap_blocks: u32,
    terms: KvTerms,
) -> Option<f64> {
    conditional_request_cost(
        params,
        &KvRequest::new(isl, block_size)?,
        overlap_blocks,
        terms,
    )
}

/// [`conditional_decode_cost`] of a rank holding `overlap_blocks` for `request`.
pub(super) fn conditional_request_cost(
    params: &KvParams,
    request: &KvRequest,
    overlap_blocks: u32,
    terms: KvTerms,
) -> Option<f64> {
    let decode = request.decode_cost_blocks(overlap_blocks, terms.active_decode_blocks);
    let credit = params.overlap_score_credit * f64::from(overlap_blocks);
    // `f64::max` would turn a NaN into 0: refuse it first.
    let cost = decode as f64 - credit;
    (!cost.is_nan()).then_some(cost.max(0.0))
}

/// How [`decide_bypass`] decided, named after upstream's `decode_gate_decision` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BypassDecision {
    /// The effective-input policy wants remote prefill.
    DeclinedByPolicy,
    /// Bypass: the policy allows it and no `decode_busy_threshold` is set.
    AllowedGateDisabled,
    /// No bypass: the threshold is set but the rank has no fresh decode sample, or no capacity.
    DeniedBusyUnknown,
    /// No bypass: the rank's expected active blocks exceed the threshold.
    DeniedBusy,
    /// Bypass: the expected active blocks are within the threshold.
    AllowedNotBusy,
}

impl BypassDecision {
    /// Whether the decode worker prefills locally.
    pub const fn bypass(self) -> bool {
        matches!(
            self,
            BypassDecision::AllowedGateDisabled | BypassDecision::AllowedNotBusy
        )
    }
}

/// What [`decide_bypass`] knows about the chosen decode rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeRank {
    /// Its block size (0: none declared; no bypass).
    pub block_size: u32,
    /// Prompt-prefix blocks it holds.
    pub overlap_blocks: u32,
    /// Its fresh sample's decode blocks plus the router's unanswered blocks; `None` without a
    /// fresh sample carrying decode blocks.
    pub sampled_blocks: Option<u64>,
    /// Its `total_kv_blocks`; `None` (or 0) when unknown.
    pub total_kv_blocks: Option<u64>,
}

/// Whether the chosen decode rank of an `isl`-token request prefills locally (module docs).
pub fn decide_bypass(
    cond: &ConditionalDisagg,
    params: &KvParams,
    isl: u64,
    rank: DecodeRank,
) -> BypassDecision {
    if rank.block_size == 0 || !isl_allows_bypass(params, isl, rank) {
        return BypassDecision::DeclinedByPolicy;
    }
    let Some(threshold) = cond.decode_busy_threshold else {
        return BypassDecision::AllowedGateDisabled;
    };
    let (Some(sampled), Some(total)) = (rank.sampled_blocks, rank.total_kv_blocks) else {
        return BypassDecision::DeniedBusyUnknown;
    };
    if total == 0 || threshold.is_nan() {
        return BypassDecision::DeniedBusyUnknown;
    }
    let expected = decode_cost_blocks(isl, rank.block_size, rank.overlap_blocks, sampled);
    // Upstream: busy when `potential_decode_blocks > threshold * total_kv_blocks`.
    if expected as f64 > threshold * total as f64 {
        BypassDecision::DeniedBusy
    } else {
        BypassDecision::AllowedNotBusy
    }
}

/// Upstream 1.6.1 `IslBoundingPolicy`: the net-new tokens after the decode rank's weighted
/// cache credit stay under [`EFF_ISL_THRESHOLD`] and under [`EFF_ISL_RATIO_THRESHOLD`] of the
/// prompt.
fn isl_allows_bypass(params: &KvParams, isl: u64, rank: DecodeRank) -> bool {
    let credit =
        params.overlap_score_credit * f64::from(rank.overlap_blocks) * f64::from(rank.block_size);
    // `as` saturates and maps NaN to 0: a broken credit counts as no cache hit.
    let cached = (credit.max(0.0) as u64).min(isl);
    let eff_isl = isl - cached;
    if eff_isl >= EFF_ISL_THRESHOLD {
        return false;
    }
    (eff_isl as f64 / isl.max(1) as f64) < EFF_ISL_RATIO_THRESHOLD
}
