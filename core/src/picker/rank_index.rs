//! A pick's index from `(worker, dp_rank)` to the positions of its candidates, so the overlap
//! the KV index reports per rank reaches its candidate in O(1) instead of through a sort of
//! every match and a binary search per candidate (issue 11, item 7).
//!
//! Invariants: rebuilt with the candidate list into reused buffers (no allocation once they
//! have grown), each rebuild with a serial of its own ([`Positions::serial`]); a key's bucket
//! holds its first position and every position names its key's first (`head`); open addressing
//! with linear probing, at most half the buckets used, so every probe run ends at an empty
//! bucket; buckets are chosen by a splitmix64 mix of the key and a per-index secret
//! from `std`'s `RandomState`, so fleet-chosen worker ids cannot build long probe runs. The
//! secret only places entries in this private table: picks stay deterministic.

use std::hash::BuildHasher as _;

use crate::load::{LoadKey, mix_key as mix};

use super::positions::Positions;

/// No position (a `head` entry past a rebuild that stopped early).
const NONE: u32 = u32::MAX;

/// `(worker, dp_rank)` → candidate positions.
#[derive(Debug)]
pub(super) struct RankIndex {
    seed: u64,
    /// `1 + candidate position` of a key's first position, or 0 when empty.
    buckets: Vec<u32>,
    /// Per position, the key's first position.
    head: Vec<u32>,
    /// Which rebuild this is.
    serial: u64,
    keys: Vec<LoadKey>,
}

impl Default for RankIndex {
    fn default() -> Self {
        Self {
            seed: std::collections::hash_map::RandomState::new().hash_one(0x7261_6e6b_u64),
            buckets: Vec::new(),
            head: Vec::new(),
            serial: 0,
            keys: Vec::new(),
        }
    }
}

impl RankIndex {
    /// Index `keys` (candidate `i` has key `keys[i]`; a key may repeat).
    pub(super) fn rebuild(&mut self, keys: impl Iterator<Item = LoadKey>) {
        self.serial = self.serial.wrapping_add(1);
        self.keys.clear();
        self.keys.extend(keys);
        let n = self.keys.len().saturating_mul(2).max(8).next_power_of_two();
        self.buckets.clear();
        self.buckets.resize(n, 0);
        self.head.clear();
        self.head.resize(self.keys.len(), NONE);
        let mask = n - 1;
        for (pos, &key) in self.keys.iter().enumerate() {
            let Ok(tag) = u32::try_from(pos + 1) else {
                break;
            };
            let mut i = mix(key, self.seed) & mask;
            loop {
                match self.buckets.get(i).copied() {
                    Some(0) => {
                        if let Some(b) = self.buckets.get_mut(i) {
                            *b = tag;
                        }
                        if let Some(h) = self.head.get_mut(pos) {
                            *h = tag - 1;
                        }
                        break;
                    }
                    Some(b) if self.keys.get(b as usize - 1) == Some(&key) => {
                        if let Some(h) = self.head.get_mut(pos) {
                            *h = b - 1;
                        }
                        break;
                    }
                    Some(_) => i = (i + 1) & mask,
                    None => break,
                }
            }
        }
    }

    /// Each position's first position with the same key (itself when it is the first), index
    /// for index.
    pub(super) fn heads(&self) -> &[u32] {
        &self.head
    }
}

impl Positions for RankIndex {
    fn serial(&self) -> u64 {
        self.serial
    }

    fn first(&self, key: LoadKey) -> Option<u32> {
        let n = self.buckets.len();
        if n == 0 {
            return None;
        }
        let mask = n - 1;
        let mut i = mix(key, self.seed) & mask;
        for _ in 0..n {
            let pos = self.buckets.get(i)?.checked_sub(1)?;
            if self.keys.get(pos as usize) == Some(&key) {
                return Some(pos);
            }
            i = (i + 1) & mask;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::InstanceId;

    fn key(w: u64, r: u32) -> LoadKey {
        LoadKey::new(InstanceId::new(w), r)
    }

    /// The positions whose head is `k`'s first position.
    fn positions(ix: &RankIndex, k: LoadKey) -> Vec<usize> {
        let Some(first) = ix.first(k) else {
            return Vec::new();
        };
        let heads = ix.heads().iter().enumerate();
        heads
            .filter(|(_, h)| **h == first)
            .map(|(p, _)| p)
            .collect()
    }

    #[test]
    fn every_position_of_a_key_and_nothing_else() {
        let mut ix = RankIndex::default();
        assert!(positions(&ix, key(1, 0)).is_empty(), "never built");
        for n in [0u64, 1, 5, 300, 2000] {
            // Keys with repeats (every 7th key repeats an earlier one) and high-bit ids.
            let mut keys: Vec<LoadKey> = Vec::new();
            for i in 0..n {
                let k = match keys.get(i.saturating_sub(3) as usize) {
                    Some(earlier) if i % 7 == 6 => *earlier,
                    Some(earlier) if i % 11 == 10 => *earlier,
                    _ => key(i << 33 | i, (i % 3) as u32),
                };
                keys.push(k);
            }
            let repeats = keys.len() - keys.iter().collect::<std::collections::BTreeSet<_>>().len();
            assert!(
                n < 300 || repeats > n as usize / 10,
                "n={n}: {repeats} repeats"
            );
            ix.rebuild(keys.iter().copied());
            for (p, k) in keys.iter().enumerate() {
                let want: Vec<usize> = keys
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| *x == k)
                    .map(|(i, _)| i)
                    .collect();
                assert_eq!(positions(&ix, *k), want, "n={n} p={p}");
                assert_eq!(
                    ix.heads().get(p).map(|&h| h as usize),
                    want.first().copied()
                );
            }
            assert!(positions(&ix, key(u64::MAX, 9)).is_empty());
        }
    }
}
