//! A per-shard cache of token ids per prompt segment (the text between added/special tokens).
//!
//! Role: multi-turn chats re-send the whole conversation, so most segments of a prompt were
//! tokenized for an earlier turn. A [`SegmentCache`] remembers `segment text -> token ids`.
//!
//! Design: one cache per shard, `&mut self`, no locks. Keyed by a seeded XXH3-64 of the text
//! (the seed is chosen by the owner so clients cannot aim collisions), but each slot stores the
//! text and a hit compares it exactly: a collision is a miss (the new entry replaces the old),
//! never wrong ids. Bounded in bytes (text + ids + a fixed per-entry overhead); eviction is
//! CLOCK (a referenced bit per slot, cleared by the sweeping hand; an unreferenced slot is
//! evicted). Segments larger than 1/8 of the budget are not cached. Steady-state hits allocate
//! nothing.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Bytes charged per entry beyond its text and ids (slot, map entry, allocator headers).
const ENTRY_OVERHEAD: usize = 64;

/// A hasher for keys that already are uniform 64-bit hashes.
#[derive(Debug, Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

#[derive(Debug)]
struct Slot {
    key: u64,
    text: Box<str>,
    ids: Box<[u32]>,
    referenced: bool,
}

impl Slot {
    fn cost(&self) -> usize {
        self.text.len() + self.ids.len() * 4 + ENTRY_OVERHEAD
    }
}

/// Hit/miss/eviction counters of a [`SegmentCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentCacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that had to tokenize.
    pub misses: u64,
    /// Entries dropped to make room.
    pub evictions: u64,
}

/// Segment text -> token ids, bounded in bytes, CLOCK eviction. See the module docs.
#[derive(Debug)]
pub struct SegmentCache {
    map: HashMap<u64, usize, BuildHasherDefault<PassThrough>>,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    hand: usize,
    bytes: usize,
    capacity_bytes: usize,
    seed: u64,
    stats: SegmentCacheStats,
}

impl SegmentCache {
    /// A cache of at most `capacity_bytes`, hashing keys with `seed`.
    pub fn new(capacity_bytes: usize, seed: u64) -> Self {
        Self {
            map: HashMap::default(),
            slots: Vec::new(),
            free: Vec::new(),
            hand: 0,
            bytes: 0,
            capacity_bytes,
            seed,
            stats: SegmentCacheStats::default(),
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> SegmentCacheStats {
        self.stats
    }

    /// Bytes currently charged.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Entries currently held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn key(&self, text: &str) -> u64 {
        xxhash_rust::xxh3::xxh3_64_with_seed(text.as_bytes(), self.seed)
    }

    /// Appends the ids of `text` to `out`: from the cache if it holds exactly `text`, else from
    /// `encode` (whose result is then cached).
    pub fn extend_or_encode<E>(
        &mut self,
        text: &str,
        out: &mut Vec<u32>,
        encode: impl FnOnce(&str) -> Result<Vec<u32>, E>,
    ) -> Result<(), E> {
        let key = self.key(text);
        if let Some(&i) = self.map.get(&key)
            && let Some(Some(slot)) = self.slots.get_mut(i)
            && &*slot.text == text
        {
            slot.referenced = true;
            out.extend_from_slice(&slot.ids);
            self.stats.hits += 1;
            return Ok(());
        }
        self.stats.misses += 1;
        let ids = encode(text)?;
        out.extend_from_slice(&ids);
        self.insert(key, text, ids);
        Ok(())
    }

    /// Whether the cache holds exactly `text` (no counters change, nothing is marked).
    pub fn contains(&self, text: &str) -> bool {
        self.map
            .get(&self.key(text))
            .and_then(|&i| self.slots.get(i))
            .is_some_and(|s| s.as_ref().is_some_and(|s| &*s.text == text))
    }

    /// Remember `ids` as the token ids of `text`, encoded elsewhere (the shard's background
    /// encoder) by the same tokenizer as every other entry of this cache.
    pub fn insert_encoded(&mut self, text: &str, ids: Vec<u32>) {
        if !self.contains(text) {
            let key = self.key(text);
            self.insert(key, text, ids);
        }
    }

    fn remove_slot(&mut self, i: usize) {
        if let Some(slot) = self.slots.get_mut(i).and_then(Option::take) {
            self.bytes -= slot.cost();
            if self.map.get(&slot.key) == Some(&i) {
                self.map.remove(&slot.key);
            }
            self.free.push(i);
        }
    }

    fn insert(&mut self, key: u64, text: &str, ids: Vec<u32>) {
        let slot = Slot {
            key,
            text: text.into(),
            ids: ids.into_boxed_slice(),
            referenced: false,
        };
        let cost = slot.cost();
        if cost > self.capacity_bytes / 8 {
            return;
        }
        // A colliding key: the old entry makes way.
        if let Some(&old) = self.map.get(&key) {
            self.remove_slot(old);
        }
        // CLOCK sweep: at most two passes (the first may only clear referenced bits).
        let mut steps = 0usize;
        while self.bytes + cost > self.capacity_bytes && steps < 2 * self.slots.len() + 1 {
            steps += 1;
            if self.slots.is_empty() {
                break;
            }
            self.hand %= self.slots.len();
            let i = self.hand;
            self.hand += 1;
            let evict = match self.slots.get_mut(i) {
                Some(Some(s)) if s.referenced => {
                    s.referenced = false;
                    false
                }
                Some(Some(_)) => true,
                _ => false,
            };
            if evict {
                self.remove_slot(i);
                self.stats.evictions += 1;
            }
        }
        if self.bytes + cost > self.capacity_bytes {
            return;
        }
        self.bytes += cost;
        let i = match self.free.pop() {
            Some(i) => {
                if let Some(s) = self.slots.get_mut(i) {
                    *s = Some(slot);
                }
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        self.map.insert(key, i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(t: &str) -> Result<Vec<u32>, ()> {
        Ok(t.bytes().map(u32::from).collect())
    }

    #[test]
    fn hit_miss_and_bound() {
        let mut c = SegmentCache::new(4096, 7);
        let mut out = Vec::new();
        c.extend_or_encode("hello", &mut out, enc).unwrap();
        c.extend_or_encode("hello", &mut out, |_| Err(())).unwrap();
        assert_eq!(out, [104, 101, 108, 108, 111, 104, 101, 108, 108, 111]);
        assert_eq!(c.stats().hits, 1);
        for i in 0..1000 {
            c.extend_or_encode(&format!("segment number {i}"), &mut out, enc)
                .unwrap();
            assert!(c.bytes() <= 4096);
        }
        assert!(c.stats().evictions > 0);
        // Too large to cache: encoded every time.
        let big = "x".repeat(1000);
        c.extend_or_encode(&big, &mut out, enc).unwrap();
        let misses = c.stats().misses;
        c.extend_or_encode(&big, &mut out, enc).unwrap();
        assert_eq!(c.stats().misses, misses + 1);
    }

    #[test]
    fn colliding_keys_never_return_wrong_ids() {
        // Force every key to collide by using a cache whose slots we pre-fill under the same key.
        let mut c = SegmentCache::new(1 << 20, 1);
        let mut out = Vec::new();
        c.extend_or_encode("a", &mut out, enc).unwrap();
        let key_a = c.key("a");
        // Re-key the stored "a" entry under the key of "b" to simulate a collision.
        let i = c.map.remove(&key_a).unwrap();
        let key_b = c.key("b");
        if let Some(Some(s)) = c.slots.get_mut(i) {
            s.key = key_b;
        }
        c.map.insert(key_b, i);
        out.clear();
        c.extend_or_encode("b", &mut out, enc).unwrap();
        assert_eq!(out, [98]);
        out.clear();
        c.extend_or_encode("b", &mut out, |_| Err(())).unwrap();
        assert_eq!(out, [98]);
    }
}
