//! The per-index secret hashing of the KV index's tables: [`Keyed`] builds the hasher of every
//! table keyed by fleet-chosen values (path hashes, engine hashes, ranks) and mixes owner-set
//! words into set fingerprints.
//!
//! Role: a leaf shared by the node tables ([`super::arena`]), the read side ([`super::shared`])
//! and the writer ([`super::index`]).
//!
//! Invariants: the keys are drawn once per index from `std`'s `RandomState` and never leave it
//! (`Debug` hides them), so no fleet input can aim many keys at one bucket or steer a
//! fingerprint; every function is total.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};

/// A hash-table key builder seeded per index: a folded 64×64→128-bit multiply with secret keys
/// (the construction of foldhash / aHash's fallback).
#[derive(Clone, Copy)]
pub(crate) struct Keyed {
    k0: u64,
    k1: u64,
}

impl fmt::Debug for Keyed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Keyed(<secret>)")
    }
}

impl Keyed {
    /// The fingerprint contribution of word `w` of an owner set holding `bits` (see the match
    /// walk): 0 for an empty word, else the splitmix64 finaliser of the word under a secret key
    /// of its own (a bijection of the word for each `w`). A set's fingerprint is the XOR over its
    /// words, so it is computed and updated per word, not per owner.
    #[inline]
    pub(crate) fn word_mix(self, w: usize, bits: u64) -> u64 {
        if bits == 0 {
            return 0;
        }
        // Word `w`'s key: an odd multiple of the odd secret `k1`, so distinct for every word (one
        // multiply where a second finaliser would cost three: the finaliser after it mixes).
        let key = self
            .k1
            .wrapping_mul((w as u64).wrapping_mul(2).wrapping_add(1));
        mix64(bits ^ key)
    }

    /// Fresh secret keys.
    pub(crate) fn random() -> Self {
        let s = RandomState::new();
        let k0 = s.hash_one(0x243F_6A88_85A3_08D3_u64);
        let k1 = s.hash_one(k0) | 1;
        Self { k0, k1 }
    }
}

/// The splitmix64 finaliser (a bijection of `u64`).
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// The hasher [`Keyed`] builds.
#[derive(Debug)]
pub(crate) struct KeyedHasher {
    state: u64,
    k1: u64,
}

impl BuildHasher for Keyed {
    type Hasher = KeyedHasher;

    fn build_hasher(&self) -> KeyedHasher {
        KeyedHasher {
            state: self.k0,
            k1: self.k1,
        }
    }
}

impl Hasher for KeyedHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.state = fold(self.state ^ x, self.k1);
    }

    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }

    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }

    fn finish(&self) -> u64 {
        self.state
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn an_empty_word_adds_nothing_to_a_fingerprint_and_others_differ_by_word_and_bits() {
        let k = Keyed::random();
        assert_eq!(k.word_mix(0, 0), 0);
        assert_eq!(k.word_mix(17, 0), 0);
        // The same bits in another word, and other bits in the same word, mix differently (all
        // distinct over a few thousand pairs: a collision here would mean a broken mix).
        let mut pairs = HashSet::new();
        for w in 0..64 {
            for b in 0..64u64 {
                pairs.extend([(w, 1u64 << b), (w, (1u64 << b) | 1), (w, u64::MAX >> b)]);
            }
        }
        let mixes: HashSet<u64> = pairs.iter().map(|&(w, bits)| k.word_mix(w, bits)).collect();
        assert_eq!(
            mixes.len(),
            pairs.len(),
            "two (word, bits) pairs mixed alike"
        );
        assert!(!mixes.contains(&0));
    }

    #[test]
    fn the_per_word_fingerprint_follows_single_bit_changes_incrementally() {
        // What the node table does: a set's fingerprint is updated word by word as owners come
        // and go; it must equal the fingerprint recomputed from the words, whatever the order.
        let k = Keyed::random();
        let mut words = [0u64; 4];
        let mut fp = 0u64;
        let mut seed = 7u64;
        for _ in 0..10_000 {
            seed = mix64(seed.wrapping_add(1));
            let (w, bit) = ((seed % 4) as usize, 1u64 << ((seed >> 8) % 64));
            let old = words[w];
            words[w] ^= bit;
            fp ^= k.word_mix(w, old) ^ k.word_mix(w, words[w]);
            let whole = words
                .iter()
                .enumerate()
                .fold(0, |f, (w, x)| f ^ k.word_mix(w, *x));
            assert_eq!(fp, whole);
        }
    }
}
