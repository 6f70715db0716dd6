//! Injected randomness: what `core` draws from instead of OS randomness.
//!
//! Role: [`UnitSource`] is the seam a caller fills (softmax sampling in the KV picker, KV-PICK-03);
//! [`SplitMix64`] is the small seedable generator the shards seed and tests reuse. A leaf module:
//! it imports nothing from the crate, so both `load` and `picker` (and their tests) can use it.
//!
//! Invariants: deterministic for a given seed; no clock, no OS entropy.

use std::fmt;

/// A source of uniform samples in `[0, 1)` for softmax sampling (KV-PICK-03). Injected so that
/// `core` stays free of clocks and OS randomness and tests are reproducible.
pub trait UnitSource: fmt::Debug + Send {
    /// The next sample, in `[0, 1)`.
    fn next_unit(&mut self) -> f64;
}

/// A tiny seedable generator (splitmix64): 53 random bits per sample. Not cryptographic; the
/// caller supplies the seed (e.g. per shard).
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub const fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl UnitSource for SplitMix64 {
    fn next_unit(&mut self) -> f64 {
        // The top 53 bits scaled by 2^-53: exactly representable, always below 1.
        (self.next_u64() >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
    }
}
