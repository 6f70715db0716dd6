//! The writer-side map of the KV index ([`KeyMap`], one per rank: engine hash → path hash) and the
//! probing helpers it shares with the node table ([`super::nodes`]).
//!
//! Role: [`KeyMap`] is a `u64 → u64` open-addressing map of 16-byte buckets that probes linearly,
//! grows ×2 past [`KEY_LOAD`] eighths of load and deletes by backward shift (no tombstones, so
//! probe runs never degrade). [`bit`] is the owner-set helper of the node table.
//!
//! Invariants:
//! - a bucket is empty iff its key is 0 (key 0 itself is kept beside the buckets);
//! - the bucket count is a power of two, above the entries by the maximum load, and every entry
//!   sits in the probe run from its home bucket with no empty bucket in between;
//! - it hashes with a per-index secret key ([`Keyed`]), so fleet-chosen hashes cannot aim at one
//!   probe run; nothing here panics.

use std::hash::BuildHasher;

use super::keyed::Keyed;

/// The first bucket of `key`'s probe run in a table of `mask + 1` buckets.
pub(crate) fn home(keyed: Keyed, key: u64, mask: usize) -> usize {
    (keyed.hash_one(key) as usize) & mask
}

/// Whether an entry at `j` whose home is `home` may move back into the hole at `hole`: `home`
/// does not lie cyclically in `(hole, j]`.
pub(crate) fn may_fill(hole: usize, j: usize, home: usize, mask: usize) -> bool {
    (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask)
}

/// Whether `len + 1` entries overflow `max_load` eighths of `cap` buckets.
pub(crate) fn full(len: usize, cap: usize, max_load: usize) -> bool {
    (len + 1).saturating_mul(8) > cap.saturating_mul(max_load)
}

/// [`KeyMap`]'s maximum load, in eighths.
const KEY_LOAD: usize = 6;

/// A `u64 → u64` map (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct KeyMap {
    /// `(key, value)`; key 0: empty.
    buckets: Vec<(u64, u64)>,
    len: usize,
    /// The value of key 0.
    zero: Option<u64>,
    keyed: Keyed,
}

impl KeyMap {
    pub(crate) fn new(keyed: Keyed) -> Self {
        Self {
            buckets: Vec::new(),
            len: 0,
            zero: None,
            keyed,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len + usize::from(self.zero.is_some())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn mask(&self) -> usize {
        self.buckets.len().wrapping_sub(1)
    }

    fn find(&self, key: u64) -> Option<usize> {
        if self.buckets.is_empty() {
            return None;
        }
        let mask = self.mask();
        let mut i = home(self.keyed, key, mask);
        loop {
            let &(k, _) = self.buckets.get(i)?;
            if k == 0 {
                return None;
            }
            if k == key {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// Reads `key`'s home bucket (a plain load, to have it cached before a batch uses it).
    #[inline]
    pub(crate) fn touch(&self, key: u64) -> u64 {
        if self.buckets.is_empty() {
            return 0;
        }
        self.buckets
            .get(home(self.keyed, key, self.mask()))
            .map_or(0, |b| b.1)
    }

    /// Asks the CPU for `key`'s home bucket (a hint: nothing is read).
    #[inline]
    pub(crate) fn prefetch(&self, key: u64) {
        if let Some(b) = self.buckets.get(home(self.keyed, key, self.mask())) {
            continuum_prefetch::read(b);
        }
    }

    pub(crate) fn get(&self, key: u64) -> Option<u64> {
        if key == 0 {
            return self.zero;
        }
        self.buckets.get(self.find(key)?).map(|b| b.1)
    }

    /// Maps `key` to `value` (replacing its value).
    pub(crate) fn insert(&mut self, key: u64, value: u64) {
        if key == 0 {
            self.zero = Some(value);
            return;
        }
        if full(self.len, self.buckets.len(), KEY_LOAD) {
            self.grow();
        }
        let mask = self.mask();
        let mut i = home(self.keyed, key, mask);
        while let Some(b) = self.buckets.get_mut(i) {
            if b.0 == 0 || b.0 == key {
                if b.0 == 0 {
                    self.len += 1;
                }
                *b = (key, value);
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Unmaps `key`; returns its value.
    pub(crate) fn remove(&mut self, key: u64) -> Option<u64> {
        if key == 0 {
            return self.zero.take();
        }
        let i = self.find(key)?;
        let value = self.buckets.get(i)?.1;
        let mask = self.mask();
        self.len = self.len.saturating_sub(1);
        let mut hole = i;
        let mut j = (i + 1) & mask;
        while let Some(&b) = self.buckets.get(j) {
            if b.0 == 0 {
                break;
            }
            if may_fill(hole, j, home(self.keyed, b.0, mask), mask) {
                if let Some(h) = self.buckets.get_mut(hole) {
                    *h = b;
                }
                hole = j;
            }
            j = (j + 1) & mask;
        }
        if let Some(h) = self.buckets.get_mut(hole) {
            *h = (0, 0);
        }
        Some(value)
    }

    fn grow(&mut self) {
        let cap = (self.buckets.len() * 2).max(16);
        let old = std::mem::replace(&mut self.buckets, vec![(0, 0); cap]);
        self.len = 0;
        for (k, v) in old.into_iter().filter(|b| b.0 != 0) {
            self.insert(k, v);
        }
    }

    /// Every `(key, value)`.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.zero
            .map(|v| (0, v))
            .into_iter()
            .chain(self.buckets.iter().copied().filter(|b| b.0 != 0))
    }
}

/// The bit of `slot` in its word.
pub(crate) fn bit(slot: u32) -> u64 {
    1u64 << (slot % 64)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn rnd(seed: &mut u64) -> u64 {
        *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    #[test]
    fn the_key_map_agrees_with_a_map_through_inserts_and_removes() {
        let mut t = KeyMap::new(Keyed::random());
        let mut m = HashMap::new();
        let mut seed = 3;
        for step in 0..200_000u64 {
            // Few distinct keys (0 among them), so runs collide and backward shifts happen.
            let key = rnd(&mut seed) % 5000;
            if rnd(&mut seed).is_multiple_of(3) {
                assert_eq!(t.remove(key), m.remove(&key), "step {step}");
            } else {
                t.insert(key, step);
                m.insert(key, step);
            }
            if step % 997 == 0 {
                for k in 0..5000 {
                    assert_eq!(t.get(k), m.get(&k).copied(), "step {step} key {k}");
                }
            }
        }
        assert_eq!(t.len(), m.len());
        assert_eq!(t.iter().count(), m.len());
    }
}
