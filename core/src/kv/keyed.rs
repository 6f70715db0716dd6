//! The per-index secret hashing of the KV index's tables: [`Keyed`] builds the hasher of every
//! table keyed by fleet-chosen values (path hashes, engine hashes, ranks) and mixes owner slots
//! into set fingerprints.
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
    /// The fingerprint contribution of one owner slot (see the match walk).
    pub(crate) fn slot_mix(self, slot: u32) -> u64 {
        mix64(u64::from(slot).wrapping_add(self.k0))
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
