//! The open-addressing tables the KV index is made of: [`NodeTable`] (one per table copy) and
//! [`KeyMap`] (one per rank, in the writer).
//!
//! Role:
//! - [`NodeTable`]: path hash → the node's owner set, stored *in the bucket* (24 bytes: path,
//!   one word, a tag and the owner count), so a lookup, an owner joining or leaving and a match
//!   step each usually cost one cache line. Most nodes' owners sit in one 64-slot word (one rank,
//!   or a few ranks of neighbouring slots): the set is that word and its word number (*inline*).
//!   A set spanning several words *spills* to a `words`-word chunk of a side arena (the bucket's
//!   word then holds the set's fingerprint, the XOR of [`Keyed::slot_mix`] over its slots, so a
//!   walk can tell an unchanged set without reading the chunk) and comes back inline as soon as
//!   it fits one word again; chunks are reused through a free list, so after warm-up no change
//!   allocates;
//! - [`KeyMap`]: a `u64 → u64` map (a rank's engine hash → path hash), 16-byte buckets.
//!
//! Both probe linearly, grow ×2 past [`NODE_LOAD`] / [`KEY_LOAD`] eighths of load and delete by
//! backward shift (no tombstones, so probe runs never degrade).
//!
//! Invariants:
//! - a bucket is empty iff its owner count (`NodeTable`) is 0, or its key is 0 (`KeyMap`; key 0
//!   itself is kept beside the buckets); an ownerless node is removed at once;
//! - a node's owner count is the number of set bits of its set; a spilled set has two or more
//!   non-zero words, its chunk belongs to no other node and its fingerprint is exact; free chunks
//!   are all zero;
//! - the bucket count is a power of two, above the entries by the maximum load, and every entry
//!   sits in the probe run from its home bucket with no empty bucket in between;
//! - both hash with a per-index secret key ([`Keyed`]), so fleet-chosen hashes cannot aim at
//!   one probe run; nothing here panics.

use std::hash::BuildHasher;

use super::keyed::Keyed;

/// A node's tag bit: its set is spilled (the rest is the chunk index), else inline (the rest is
/// its word number).
const SPILLED: u32 = 1 << 31;

/// One node's owner set, as read.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Owners<'a> {
    /// Every owner is in word `at`, whose bits are `bits`.
    Inline { at: usize, bits: u64 },
    /// Word `i` of the set is `chunk[i]`; `owners` bits are set, whose [`Keyed::slot_mix`]es
    /// XOR to `fp`.
    Spilled {
        chunk: &'a [u64],
        owners: u32,
        fp: u64,
    },
}

/// One bucket of a [`NodeTable`]: a node, or empty (`owners == 0`).
#[derive(Debug, Clone, Copy, Default)]
struct Node {
    path: u64,
    /// Inline: the owner word; spilled: the set's fingerprint (XOR of its slot mixes).
    bits: u64,
    /// Inline: the word number; spilled: [`SPILLED`] | chunk index.
    tag: u32,
    /// Owners (set bits); 0: an empty bucket.
    owners: u32,
}

/// The first bucket of `key`'s probe run in a table of `mask + 1` buckets.
fn home(keyed: Keyed, key: u64, mask: usize) -> usize {
    (keyed.hash_one(key) as usize) & mask
}

/// Whether an entry at `j` whose home is `home` may move back into the hole at `hole`: `home`
/// does not lie cyclically in `(hole, j]`.
fn may_fill(hole: usize, j: usize, home: usize, mask: usize) -> bool {
    (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask)
}

/// Whether `len + 1` entries overflow `max_load` eighths of `cap` buckets.
fn full(len: usize, cap: usize, max_load: usize) -> bool {
    (len + 1).saturating_mul(8) > cap.saturating_mul(max_load)
}

/// [`NodeTable`]'s maximum load, in eighths: low, since a walk's last lookup is a miss (whose
/// probe run grows as `1 / (1 - load)^2`) and a bucket is 24 bytes (measured: 6/8 cost the
/// walk's p99 ~30% where the table sat just under it; 5/8 and 4/8 lay the bench's tables out
/// alike).
const NODE_LOAD: usize = 5;

/// [`KeyMap`]'s maximum load, in eighths.
const KEY_LOAD: usize = 6;

/// Path hash → node (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct NodeTable {
    buckets: Vec<Node>,
    len: usize,
    keyed: Keyed,
    /// Words per spilled set (`words * 64` slots).
    words: usize,
    spill: Vec<u64>,
    spill_free: Vec<u32>,
}

impl NodeTable {
    pub(crate) fn new(keyed: Keyed) -> Self {
        Self {
            buckets: Vec::new(),
            len: 0,
            keyed,
            words: 1,
            spill: Vec::new(),
            spill_free: Vec::new(),
        }
    }

    /// Nodes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Words per owner set (slots `0..64 * words` are usable).
    pub(crate) fn words(&self) -> usize {
        self.words
    }

    /// The hash and fingerprint keys.
    pub(crate) fn keyed(&self) -> Keyed {
        self.keyed
    }

    fn mask(&self) -> usize {
        self.buckets.len().wrapping_sub(1)
    }

    /// The bucket of node `path`.
    #[inline]
    fn find(&self, path: u64) -> Option<usize> {
        self.probe(path).ok()
    }

    /// `Ok`: the bucket of node `path`; `Err`: the empty bucket ending its probe run (`None`: no
    /// buckets yet).
    #[inline]
    fn probe(&self, path: u64) -> Result<usize, Option<usize>> {
        if self.buckets.is_empty() {
            return Err(None);
        }
        let mask = self.mask();
        let mut i = home(self.keyed, path, mask);
        loop {
            let Some(b) = self.buckets.get(i) else {
                return Err(None);
            };
            if b.owners == 0 {
                return Err(Some(i));
            }
            if b.path == path {
                return Ok(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// Reads `path`'s home bucket (a plain load, to have it cached before a batch uses it).
    #[inline]
    pub(crate) fn touch(&self, path: u64) -> u64 {
        if self.buckets.is_empty() {
            return 0;
        }
        self.buckets
            .get(home(self.keyed, path, self.mask()))
            .map_or(0, |b| b.bits)
    }

    fn chunk(&self, c: u32) -> Option<&[u64]> {
        let at = (c as usize).checked_mul(self.words)?;
        self.spill.get(at..at.checked_add(self.words)?)
    }

    fn chunk_mut(&mut self, c: u32) -> Option<&mut [u64]> {
        let at = (c as usize).checked_mul(self.words)?;
        self.spill.get_mut(at..at.checked_add(self.words)?)
    }

    fn owners_of(&self, b: &Node) -> Option<Owners<'_>> {
        if b.tag & SPILLED == 0 {
            Some(Owners::Inline {
                at: b.tag as usize,
                bits: b.bits,
            })
        } else {
            self.chunk(b.tag & !SPILLED).map(|chunk| Owners::Spilled {
                chunk,
                owners: b.owners,
                fp: b.bits,
            })
        }
    }

    /// Node `path`'s owners.
    #[inline]
    pub(crate) fn get(&self, path: u64) -> Option<Owners<'_>> {
        let b = self.buckets.get(self.find(path)?)?;
        self.owners_of(b)
    }

    /// Node `path`'s owner count and whether `slot` is among its owners (`None`: no such node).
    pub(crate) fn owner_state(&self, path: u64, slot: u32) -> Option<(u32, bool)> {
        let b = self.buckets.get(self.find(path)?)?;
        let w = (slot / 64) as usize;
        let has = match self.owners_of(b)? {
            Owners::Inline { at, bits } => at == w && bits & bit(slot) != 0,
            Owners::Spilled { chunk, .. } => chunk.get(w).is_some_and(|x| x & bit(slot) != 0),
        };
        Some((b.owners, has))
    }

    /// Node `path`'s owner count (`None`: no such node).
    #[cfg(test)]
    pub(crate) fn owner_count(&self, path: u64) -> Option<u32> {
        self.find(path)
            .and_then(|i| self.buckets.get(i))
            .map(|b| b.owners)
    }

    /// Whether `slot` owns node `path` (tests).
    #[cfg(test)]
    pub(crate) fn contains(&self, path: u64, slot: u32) -> bool {
        let w = (slot / 64) as usize;
        match self.get(path) {
            Some(Owners::Inline { at, bits }) => at == w && bits & bit(slot) != 0,
            Some(Owners::Spilled { chunk, .. }) => chunk.get(w).is_some_and(|x| x & bit(slot) != 0),
            None => false,
        }
    }

    /// Adds `slot` to node `path`'s owners, creating the node; returns whether it was created.
    pub(crate) fn add(&mut self, path: u64, slot: u32) -> bool {
        let w = (slot / 64) as usize;
        if w >= self.words {
            return false;
        }
        let i = match self.probe(path) {
            Ok(i) => i,
            Err(vacant) => {
                let node = Node {
                    path,
                    bits: bit(slot),
                    tag: u32::try_from(w).unwrap_or(0),
                    owners: 1,
                };
                // The run's end, unless the table must grow first.
                let room = !full(self.len, self.buckets.len(), NODE_LOAD);
                match vacant
                    .filter(|_| room)
                    .and_then(|v| self.buckets.get_mut(v))
                {
                    Some(b) => {
                        *b = node;
                        self.len += 1;
                    }
                    None => self.insert(node),
                }
                return true;
            }
        };
        let Some(&b) = self.buckets.get(i) else {
            return false;
        };
        let mut next = b;
        if b.tag & SPILLED != 0 {
            let Some(x) = self.chunk_mut(b.tag & !SPILLED).and_then(|c| c.get_mut(w)) else {
                return false;
            };
            if *x & bit(slot) != 0 {
                return false;
            }
            *x |= bit(slot);
            next.bits ^= self.keyed.slot_mix(slot);
        } else if b.tag as usize == w {
            if b.bits & bit(slot) != 0 {
                return false;
            }
            next.bits |= bit(slot);
        } else {
            // A second word: spill.
            let c = self.take_chunk();
            if let Some(chunk) = self.chunk_mut(c) {
                if let Some(x) = chunk.get_mut(b.tag as usize) {
                    *x = b.bits;
                }
                if let Some(x) = chunk.get_mut(w) {
                    *x = bit(slot);
                }
            }
            next.tag = c | SPILLED;
            next.bits = word_mix(self.keyed, b.tag as usize, b.bits) ^ self.keyed.slot_mix(slot);
        }
        next.owners = b.owners.saturating_add(1);
        if let Some(b) = self.buckets.get_mut(i) {
            *b = next;
        }
        false
    }

    /// Removes `slot` from node `path`'s owners; returns whether the node went (no owner left).
    pub(crate) fn remove(&mut self, path: u64, slot: u32) -> bool {
        let w = (slot / 64) as usize;
        let Some(i) = self.find(path) else {
            return false;
        };
        let Some(&b) = self.buckets.get(i) else {
            return false;
        };
        let mut next = b;
        if b.tag & SPILLED == 0 {
            if b.tag as usize != w || b.bits & bit(slot) == 0 {
                return false;
            }
            next.bits &= !bit(slot);
        } else {
            let c = b.tag & !SPILLED;
            let mix = self.keyed.slot_mix(slot);
            let Some(chunk) = self.chunk_mut(c) else {
                return false;
            };
            let Some(x) = chunk.get_mut(w).filter(|x| **x & bit(slot) != 0) else {
                return false;
            };
            *x &= !bit(slot);
            next.bits ^= mix;
            // Back inline once the set fits one word.
            let mut live = chunk.iter().enumerate().filter(|(_, x)| **x != 0);
            let (first, second) = (live.next(), live.next());
            if second.is_none() {
                let (at, word) = first.map_or((0, 0), |(i, x)| (i, *x));
                chunk.fill(0);
                self.spill_free.push(c);
                next.tag = u32::try_from(at).unwrap_or(0);
                next.bits = word;
            }
        }
        next.owners = b.owners.saturating_sub(1);
        if next.owners == 0 {
            self.delete(i);
            return true;
        }
        if let Some(b) = self.buckets.get_mut(i) {
            *b = next;
        }
        false
    }

    fn insert(&mut self, node: Node) {
        if full(self.len, self.buckets.len(), NODE_LOAD) {
            self.grow();
        }
        let mask = self.mask();
        let mut i = home(self.keyed, node.path, mask);
        while let Some(b) = self.buckets.get_mut(i) {
            if b.owners == 0 {
                *b = node;
                self.len += 1;
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Empties bucket `i`, pulling later entries of its run back (backward shift).
    fn delete(&mut self, i: usize) {
        let mask = self.mask();
        self.len = self.len.saturating_sub(1);
        let mut hole = i;
        let mut j = (i + 1) & mask;
        while let Some(&b) = self.buckets.get(j) {
            if b.owners == 0 {
                break;
            }
            if may_fill(hole, j, home(self.keyed, b.path, mask), mask) {
                if let Some(h) = self.buckets.get_mut(hole) {
                    *h = b;
                }
                hole = j;
            }
            j = (j + 1) & mask;
        }
        if let Some(h) = self.buckets.get_mut(hole) {
            *h = Node::default();
        }
    }

    fn grow(&mut self) {
        let cap = (self.buckets.len() * 2).max(16);
        let old = std::mem::replace(&mut self.buckets, vec![Node::default(); cap]);
        self.len = 0;
        for b in old.into_iter().filter(|b| b.owners != 0) {
            self.insert(b);
        }
    }

    /// A zeroed spill chunk.
    fn take_chunk(&mut self) -> u32 {
        if let Some(c) = self.spill_free.pop() {
            return c;
        }
        let c = self.spill.len() / self.words;
        self.spill.resize(self.spill.len() + self.words, 0);
        u32::try_from(c).unwrap_or(0)
    }

    /// Re-lays spilled sets out at `words` words (more than now).
    pub(crate) fn widen(&mut self, words: usize) {
        if words <= self.words {
            return;
        }
        let chunks = self.spill.len() / self.words;
        let mut spill = vec![0u64; chunks.saturating_mul(words)];
        for (new, old) in spill
            .chunks_exact_mut(words)
            .zip(self.spill.chunks_exact(self.words))
        {
            if let Some(dst) = new.get_mut(..old.len()) {
                dst.copy_from_slice(old);
            }
        }
        self.spill = spill;
        self.words = words;
    }

    /// Every node's owner count (tests).
    #[cfg(test)]
    pub(crate) fn owner_counts(&self) -> impl Iterator<Item = u32> + '_ {
        self.buckets.iter().map(|b| b.owners).filter(|o| *o != 0)
    }
}

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

    /// Reads `key`'s home bucket (see [`NodeTable::touch`]).
    #[inline]
    pub(crate) fn touch(&self, key: u64) -> u64 {
        if self.buckets.is_empty() {
            return 0;
        }
        self.buckets
            .get(home(self.keyed, key, self.mask()))
            .map_or(0, |b| b.1)
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

/// The XOR of [`Keyed::slot_mix`] over the slots set in word `w` (bits `bits`).
pub(crate) fn word_mix(keyed: Keyed, w: usize, mut bits: u64) -> u64 {
    let base = u32::try_from(w).unwrap_or(0).wrapping_mul(64);
    let mut fp = 0;
    while bits != 0 {
        fp ^= keyed.slot_mix(base.wrapping_add(bits.trailing_zeros()));
        bits &= bits - 1;
    }
    fp
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};

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

    #[test]
    fn the_node_table_agrees_with_sets_and_spills_only_across_words() {
        let mut t = NodeTable::new(Keyed::random());
        t.widen(4);
        let mut want: Vec<BTreeSet<u32>> = vec![BTreeSet::new(); 600];
        let mut seed = 11;
        for step in 0..200_000 {
            let n = rnd(&mut seed) % 600;
            // Mostly one word, sometimes another.
            let slot = if rnd(&mut seed).is_multiple_of(8) {
                (rnd(&mut seed) % 256) as u32
            } else {
                (n % 4) as u32 * 64 + (rnd(&mut seed) % 8) as u32
            };
            let s = &mut want[n as usize];
            if rnd(&mut seed).is_multiple_of(2) {
                let created = t.add(n, slot);
                assert_eq!(created, s.is_empty(), "step {step}");
                s.insert(slot);
            } else {
                let gone = t.remove(n, slot);
                let had = s.remove(&slot);
                assert_eq!(gone, had && s.is_empty(), "step {step}");
            }
            if step == 100_000 {
                t.widen(8);
            }
            let s = &want[n as usize];
            for x in 0..512 {
                assert_eq!(t.contains(n, x), s.contains(&x), "step {step}");
            }
            let words: BTreeSet<u32> = s.iter().map(|x| x / 64).collect();
            let spilled = matches!(t.get(n), Some(Owners::Spilled { .. }));
            if let Some(Owners::Spilled { fp, owners, .. }) = t.get(n) {
                let k = t.keyed;
                assert_eq!(
                    fp,
                    s.iter().fold(0, |f, x| f ^ k.slot_mix(*x)),
                    "step {step}"
                );
                assert_eq!(owners as usize, s.len(), "step {step}");
            }
            assert_eq!(spilled, words.len() > 1, "step {step}");
            let count = t.owner_count(n);
            assert_eq!(
                count,
                (!s.is_empty()).then_some(s.len() as u32),
                "step {step}"
            );
        }
        let nodes = want.iter().filter(|s| !s.is_empty()).count();
        assert_eq!(t.len(), nodes);
        assert_eq!(t.owner_counts().count(), nodes);
    }
}
