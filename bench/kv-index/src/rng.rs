//! The bench's one source of randomness: SplitMix64, seeded from `--seed`, so a seed names one
//! trace exactly (same seed, same events, on any machine).

/// SplitMix64 (Steele, Lea, Flood 2014): 64-bit state, full period, good enough to shape a trace.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A generator for the sub-stream `(a, b, c)` of `seed`: the same content whatever order the
    /// trace asks for it in.
    pub(crate) fn keyed(seed: u64, a: u64, b: u64, c: u64) -> Self {
        let mut r = Self(seed ^ mix(a.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        r.0 ^= mix(b ^ 0xD1B5_4A32_D192_ED03);
        r.0 ^= mix(c.wrapping_add(0x8CB9_2BA7_2F3D_8DD7));
        r
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in `0..n` (`n > 0`; Lemire's multiply-shift, bias below 2^-32 for our `n`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64) < p * (1u64 << 53) as f64
    }
}

/// The SplitMix64 finaliser.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A `BuildHasher` for keys that are already hashes (block hashes, rank indexes): one multiply.
/// The generator's own tables only; neither index under test uses it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PreHashed;

#[derive(Debug, Default)]
pub(crate) struct PreHasher(u64);

impl std::hash::BuildHasher for PreHashed {
    type Hasher = PreHasher;
    fn build_hasher(&self) -> PreHasher {
        PreHasher(0)
    }
}

impl std::hash::Hasher for PreHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01B3);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0 ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_below_stays_in_range() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..1000 {
            let x = a.below(13);
            assert_eq!(x, b.below(13));
            assert!(x < 13);
        }
        assert_eq!(
            Rng::keyed(1, 2, 3, 4).next_u64(),
            Rng::keyed(1, 2, 3, 4).next_u64()
        );
        assert_ne!(
            Rng::keyed(1, 2, 3, 4).next_u64(),
            Rng::keyed(1, 2, 3, 5).next_u64()
        );
    }
}
