//! A pick's index from `(worker, dp_rank)` to the positions of its candidates, so the overlap
//! the KV index reports per rank reaches its candidate in O(1) instead of through a sort of
//! every match and a binary search per candidate (issue 11, item 7).
//!
//! Invariants: rebuilt per pick into reused buffers (no allocation once they have grown);
//! open addressing with linear probing, at most half the buckets used, so every probe run ends
//! at an empty bucket; buckets are chosen by a splitmix64 mix of the key and a per-index secret
//! from `std`'s `RandomState`, so fleet-chosen worker ids cannot build long probe runs. The
//! secret only places entries in this private table: picks stay deterministic.

use std::hash::BuildHasher as _;

use crate::load::{LoadKey, mix_key as mix};

/// `(worker, dp_rank)` → candidate positions.
#[derive(Debug)]
pub(super) struct RankIndex {
    seed: u64,
    /// `1 + candidate position`, or 0 when empty.
    buckets: Vec<u32>,
    keys: Vec<LoadKey>,
}

impl Default for RankIndex {
    fn default() -> Self {
        Self {
            seed: std::collections::hash_map::RandomState::new().hash_one(0x7261_6e6b_u64),
            buckets: Vec::new(),
            keys: Vec::new(),
        }
    }
}

impl RankIndex {
    /// Index `keys` (candidate `i` has key `keys[i]`; a key may repeat).
    pub(super) fn rebuild(&mut self, keys: impl Iterator<Item = LoadKey>) {
        self.keys.clear();
        self.keys.extend(keys);
        let n = self.keys.len().saturating_mul(2).max(8).next_power_of_two();
        self.buckets.clear();
        self.buckets.resize(n, 0);
        let mask = n - 1;
        for (pos, &key) in self.keys.iter().enumerate() {
            let Ok(tag) = u32::try_from(pos + 1) else {
                break;
            };
            let mut i = mix(key, self.seed) & mask;
            while self.buckets.get(i).is_some_and(|&b| b != 0) {
                i = (i + 1) & mask;
            }
            if let Some(b) = self.buckets.get_mut(i) {
                *b = tag;
            }
        }
    }

    /// Calls `f(position)` for every candidate whose key is `key`.
    pub(super) fn each(&self, key: LoadKey, f: &mut dyn FnMut(usize)) {
        let n = self.buckets.len();
        if n == 0 {
            return;
        }
        let mask = n - 1;
        let mut i = mix(key, self.seed) & mask;
        for _ in 0..n {
            let Some(&tag) = self.buckets.get(i) else {
                return;
            };
            let Some(pos) = (tag as usize).checked_sub(1) else {
                return;
            };
            if self.keys.get(pos) == Some(&key) {
                f(pos);
            }
            i = (i + 1) & mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::InstanceId;

    fn key(w: u64, r: u32) -> LoadKey {
        LoadKey::new(InstanceId::new(w), r)
    }

    fn positions(ix: &RankIndex, k: LoadKey) -> Vec<usize> {
        let mut out = Vec::new();
        ix.each(k, &mut |p| out.push(p));
        out.sort_unstable();
        out
    }

    #[test]
    fn every_position_of_a_key_and_nothing_else() {
        let mut ix = RankIndex::default();
        assert!(positions(&ix, key(1, 0)).is_empty(), "never built");
        for n in [0u64, 1, 5, 300, 2000] {
            // Keys with repeats (every 7th key repeats an earlier one) and high-bit ids.
            let keys: Vec<LoadKey> = (0..n)
                .map(|i| {
                    if i % 7 == 6 {
                        key(i - 3, 0)
                    } else {
                        key(i << 33 | i, (i % 3) as u32)
                    }
                })
                .collect();
            ix.rebuild(keys.iter().copied());
            for (p, k) in keys.iter().enumerate() {
                let want: Vec<usize> = keys
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| *x == k)
                    .map(|(i, _)| i)
                    .collect();
                assert_eq!(positions(&ix, *k), want, "n={n} p={p}");
            }
            assert!(positions(&ix, key(u64::MAX, 9)).is_empty());
        }
    }
}
