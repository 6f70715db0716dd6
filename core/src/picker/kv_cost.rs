//! Dynamo's KV-overlap cost and its softmax sampling (KV-PICK-01/03, Q-24), and the injected
//! randomness the sampling draws from.
//!
//! Role: the arithmetic of the KV-aware picker, free of fleet and load concepts:
//! - [`kv_cost`]: upstream `worker_logit`'s cost for one rank, in the spec's **verbatim** form
//!   (KV-PICK-01) with f64 division (Q-24), not 1.6.1's extended one (no decay, tiers, shared
//!   cache or active-request weight); [`KvRequest`] is the same cost with what a request shares
//!   across ranks worked out once (what a pick over hundreds of ranks uses);
//! - [`softmax_sample_index`]: behaves exactly as upstream `softmax_sample_index` (min/max
//!   normalisation, the magnitude rescale when the cost range is not finite, a uniform row set
//!   when every cost is equal, a cumulative walk taking the first row with `sample <=
//!   cumulative`, the last row as fallback), with the same floating-point operation order so that
//!   equal inputs give equal rows;
//! - [`UnitSource`](crate::rng::UnitSource): where a sample in `[0, 1)` comes from. `core` reads no clock and no OS
//!   randomness: the caller injects a source, e.g. [`SplitMix64`](crate::rng::SplitMix64) seeded by the shard.
//!
//! Invariants: every function here is total (no panic on any input, NaN included) and allocation
//! free apart from growing the caller's `probabilities` buffer.

use crate::config::dynamo::KvConfig;

/// The KV cost's tunables (`dynamo.kv.*`, KV-PICK-16).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvParams {
    /// `overlap_score_credit`: blocks credited per block of prefix overlap.
    pub overlap_score_credit: f64,
    /// `prefill_load_scale`: the weight of the prefill term.
    pub prefill_load_scale: f64,
    /// `router_temperature`: 0 picks the minimum cost; above 0 samples the softmax.
    pub temperature: f64,
}

impl Default for KvParams {
    fn default() -> Self {
        Self::from(&KvConfig::default())
    }
}

impl From<&KvConfig> for KvParams {
    fn from(c: &KvConfig) -> Self {
        Self {
            overlap_score_credit: c.overlap_score_credit,
            prefill_load_scale: c.prefill_load_scale,
            temperature: c.router_temperature,
        }
    }
}

/// The backlog terms of one rank's cost (0 each when its stage competes without backlog,
/// KV-PICK-05).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvTerms {
    /// `active_prefill_tokens`.
    pub active_prefill_tokens: u64,
    /// `active_decode_blocks`.
    pub active_decode_blocks: u64,
}

/// The KV-PICK-01 cost of a rank with block size `block_size` holding `overlap_blocks` prefix
/// blocks of an `isl`-token request, verbatim:
///
/// ```text
/// cached_tokens         = min(overlap_blocks * bs, isl)
/// raw_prefill_tokens    = active_prefill_tokens + (isl - cached_tokens) + cached_tokens
/// raw_prefill_blocks    = raw_prefill_tokens / bs                      (f64 division, Q-24)
/// overlap_credit_blocks = overlap_score_credit * overlap_blocks
/// adjusted_prefill      = max(0, raw_prefill_blocks - overlap_credit_blocks)
/// decode_cost_blocks    = active_decode_blocks + max(0, ceil(isl / bs) - overlap_blocks)
/// cost                  = prefill_load_scale * adjusted_prefill + decode_cost_blocks
/// ```
///
/// Integer steps saturate. `None` for a zero block size or a NaN result (NaN tunables).
pub fn kv_cost(
    params: &KvParams,
    isl: u64,
    block_size: u32,
    overlap_blocks: u32,
    terms: KvTerms,
) -> Option<f64> {
    KvRequest::new(isl, block_size)?.cost(params, overlap_blocks, terms)
}

/// KV-PICK-01's `decode_cost_blocks = active_decode_blocks + max(0, ceil(isl / bs) -
/// overlap_blocks)`, saturating: the blocks the rank holds once this request decodes there
/// (upstream's `potential_decode_blocks`). A zero `block_size` counts no request blocks.
pub fn decode_cost_blocks(
    isl: u64,
    block_size: u32,
    overlap_blocks: u32,
    active_decode_blocks: u64,
) -> u64 {
    match KvRequest::new(isl, block_size) {
        Some(r) => r.decode_cost_blocks(overlap_blocks, active_decode_blocks),
        None => active_decode_blocks,
    }
}

/// An `isl`-token request as [`kv_cost`] sees it at one non-zero block size: what the cost of
/// every rank of that block size shares, worked out once per pick rather than per rank (a pick
/// costs hundreds of ranks, nearly always of one block size).
///
/// [`KvRequest::cost`] is [`kv_cost`]'s formula with `cached_tokens` cancelled:
/// `(active_prefill_tokens ⊕ (isl - cached_tokens)) ⊕ cached_tokens` (⊕: saturating addition)
/// equals `active_prefill_tokens ⊕ isl` for every `cached_tokens ≤ isl`, because the two
/// unsaturated sums are equal and either both exceed `u64::MAX` or neither does. Every other
/// step, and the order of the floating-point operations, is the formula's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvRequest {
    isl: u64,
    block_size: u32,
    /// `ceil(isl / block_size)`.
    request_blocks: u64,
}

impl KvRequest {
    /// The request at `block_size`; `None` for a zero block size (no cost).
    pub fn new(isl: u64, block_size: u32) -> Option<Self> {
        (block_size > 0).then(|| Self {
            isl,
            block_size,
            request_blocks: isl.div_ceil(u64::from(block_size)),
        })
    }

    /// The block size.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// [`decode_cost_blocks`] of a rank holding `overlap_blocks` with `active_decode_blocks`.
    pub fn decode_cost_blocks(&self, overlap_blocks: u32, active_decode_blocks: u64) -> u64 {
        let new_blocks = self
            .request_blocks
            .saturating_sub(u64::from(overlap_blocks));
        active_decode_blocks.saturating_add(new_blocks)
    }

    /// [`kv_cost`] of a rank holding `overlap_blocks` with `terms` (`None` for a NaN result).
    pub fn cost(&self, params: &KvParams, overlap_blocks: u32, terms: KvTerms) -> Option<f64> {
        let raw_prefill_tokens = terms.active_prefill_tokens.saturating_add(self.isl);
        let raw_prefill_blocks = raw_prefill_tokens as f64 / f64::from(self.block_size);
        let overlap_credit_blocks = params.overlap_score_credit * f64::from(overlap_blocks);
        let adjusted_prefill = (raw_prefill_blocks - overlap_credit_blocks).max(0.0);
        let decode_cost_blocks =
            self.decode_cost_blocks(overlap_blocks, terms.active_decode_blocks) as f64;
        let cost = params.prefill_load_scale * adjusted_prefill + decode_cost_blocks;
        (!cost.is_nan()).then_some(cost)
    }
}

/// Samples a row of `costs` from the softmax of their negated, min/max-normalised values at
/// `temperature`, with `sample` in `[0, 1)`, exactly as upstream `softmax_sample_index`.
/// `probabilities` is scratch space (its contents are overwritten). `None` only for empty
/// `costs`. A zero temperature is the caller's argmin case (upstream never samples with it);
/// here it still returns a row, without panicking.
pub fn softmax_sample_index(
    costs: &[f64],
    temperature: f64,
    sample: f64,
    probabilities: &mut Vec<f64>,
) -> Option<usize> {
    let last = costs.len().checked_sub(1)?;
    let mut lowest = f64::INFINITY;
    let mut highest = f64::NEG_INFINITY;
    for &c in costs {
        lowest = lowest.min(c);
        highest = highest.max(c);
    }
    probabilities.clear();
    if lowest == highest {
        let share = 1.0 / costs.len() as f64;
        probabilities.resize(costs.len(), share);
    } else {
        // A range that overflows is rescaled by the largest magnitude first.
        let magnitude = if (highest - lowest).is_finite() {
            1.0
        } else {
            lowest.abs().max(highest.abs())
        };
        let lowest_scaled = lowest / magnitude;
        let factor = -1.0 / ((highest / magnitude - lowest_scaled) * temperature);
        let shift = lowest_scaled * factor;
        for &c in costs {
            probabilities.push((c / magnitude * factor - shift).exp());
        }
    }
    let total: f64 = probabilities.iter().sum();
    for p in probabilities.iter_mut() {
        *p /= total;
    }
    let mut cumulative = 0.0;
    for (row, p) in probabilities.iter().enumerate() {
        cumulative += p;
        if sample <= cumulative {
            return Some(row);
        }
    }
    Some(last)
}
