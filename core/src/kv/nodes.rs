//! The KV index's node table: one copy, written in place by the index's writer while readers on
//! other threads walk it (KV-IDX-06/07).
//!
//! Role: path hash → the node's owner set, in an open-addressing table of 24-byte buckets (path,
//! one word, and a `meta` word holding the tag, the owner count and the bucket's version), so a
//! lookup, an owner joining or leaving and a match step each usually cost one cache line. Most
//! nodes' owners sit in one 64-slot word (one rank, or a few ranks of neighbouring slots): the set
//! is that word and its word number (*inline*). A set spanning several words *spills* to a
//! `words`-word chunk of a side arena (the bucket's word then holds the set's fingerprint, the
//! XOR of [`Keyed::word_mix`] over its words, so a walk can tell an unchanged set without reading
//! the chunk) and comes back inline as soon as it fits one word again. Chunks are reused through
//! a free list; a full arena is doubled by a rebuild (as a full table is grown), so after warm-up
//! no change allocates. [`Nodes`] is what readers hold (through an `ArcSwap`, replaced only when the table
//! grows or its sets widen); [`NodeWriter`] is the single writer's handle on it.
//!
//! Concurrency argument (atomics only; the crate forbids `unsafe`):
//! - **a bucket is a seqlock**: its version is the low 16 bits of `meta`, odd while the writer
//!   rewrites the bucket (or the spilled chunk it names); the writer stores the odd version, an
//!   `Release` fence, the words, then the next even version with `Release`; a reader loads `meta`
//!   (`Acquire`), the words (and, when it needs them, the chunk's), an `Acquire` fence and `meta`
//!   again, and keeps what it read only if both loads are the same even value (Boehm's
//!   fence-based seqlock, as `crate::load::seqcell`). So a reader never sees a torn node: each
//!   node it uses is one state the writer left it in. The version wraps at 2^16 writes of one
//!   bucket, far more than the writer makes while one reader reads a bucket (nanoseconds);
//! - **deletion shifts entries back** (no tombstones, so probe runs never degrade). While entries
//!   move, a reader probing through the hole could stop early and miss a node that is present
//!   throughout. So the table has a *shift epoch*, odd while a deletion moves entries (a deletion
//!   whose next bucket is empty moves none and leaves it alone): a reader trusts a miss only if
//!   the epoch it loaded before the probe (`Acquire`) is even and equal to the one it loads after
//!   an `Acquire` fence; otherwise it waits for an even epoch and probes again. A hit needs no such
//!   check (the writer writes an entry into its new bucket before it vacates the old one, and the
//!   bucket's version covers the copy). A walk loads the epoch once at its start and rechecks it
//!   only at a miss;
//! - **growing and widening build a new table** and publish it with one `ArcSwap::store`; a reader
//!   on the old one sees the state of the moment of the copy, the old one is freed with its last
//!   reader, and the writer writes only the new one from then on;
//! - a reader that meets a write or a shift in progress waits for it to end (spinning, then
//!   yielding, as `crate::load::seqcell`'s readers do; the writer never waits, so it ends). A node
//!   that changed under a read, or a miss that a finished shift may have caused, is read again
//!   up to [`MAX_RETRIES`] times (each one a write the writer completed meanwhile); past that the
//!   reader treats the node as absent (a shorter match for one request, never a wrong owner);
//! - what readers see is per node, not per batch: a store or removal of many blocks becomes
//!   visible block by block (as in Dynamo's own concurrent indexes). A reader's walk therefore
//!   reports each rank's contiguous run as it stood at the moments it looked at each block.
//!
//! Invariants:
//! - a bucket is empty iff its owner count is 0; an ownerless node is removed at once;
//! - a node's owner count is the number of set bits of its set; a spilled set has two or more
//!   non-zero words, its chunk belongs to no other node and its fingerprint is exact; free chunks
//!   are all zero;
//! - the bucket count is a power of two, above the entries by the maximum load, and every entry
//!   sits in the probe run from its home bucket with no empty bucket in between (between two
//!   writer operations);
//! - both hashing and fingerprints use a per-index secret key ([`Keyed`]), so fleet-chosen hashes
//!   cannot aim at one probe run; nothing here panics.

use std::fmt;
use std::sync::Arc;

#[cfg(loom)]
use loom::{
    hint::spin_loop,
    sync::atomic::{AtomicU64, Ordering, fence},
    thread::yield_now,
};
#[cfg(not(loom))]
use std::{
    hint::spin_loop,
    sync::atomic::{AtomicU64, Ordering, fence},
    thread::yield_now,
};

use arc_swap::ArcSwap;

use super::arena::{bit, full, home, may_fill};
use super::keyed::Keyed;

/// A node's tag bit: its set is spilled (the rest is the chunk index), else inline (the rest is
/// its word number).
const SPILLED: u32 = 1 << 31;

/// The version bits of `meta`.
const SEQ: u64 = 0xFFFF;

/// The table's maximum load, in eighths: low, since a walk's last lookup is a miss (whose probe
/// run grows as `1 / (1 - load)^2`) and a bucket is 24 bytes.
const NODE_LOAD: usize = 5;

/// Times a reader re-reads one bucket (or re-probes after a shift) before it gives up on it.
pub(crate) const MAX_RETRIES: u32 = 256;

/// Spins before a waiting reader yields its time slice.
const SPINS_BEFORE_YIELD: u32 = 64;

/// Chunks of a table's first spill arena; an arena that fills is doubled by a rebuild.
const FIRST_CHUNKS: usize = 64;

/// The largest owner count a bucket holds (16 bits); caps above it are clamped by the index.
pub(crate) const MAX_BUCKET_OWNERS: usize = 0xFFFF;

fn meta(tag: u32, owners: u32) -> u64 {
    (u64::from(tag) << 32) | (u64::from(owners.min(0xFFFF)) << 16)
}

fn meta_tag(m: u64) -> u32 {
    (m >> 32) as u32
}

fn meta_owners(m: u64) -> u32 {
    ((m >> 16) & 0xFFFF) as u32
}

fn backoff(spins: &mut u32) {
    if *spins < SPINS_BEFORE_YIELD {
        spin_loop();
    } else {
        yield_now();
    }
    *spins = spins.saturating_add(1);
}

#[derive(Debug)]
struct Bucket {
    path: AtomicU64,
    /// Inline: the owner word; spilled: the set's fingerprint.
    bits: AtomicU64,
    /// Tag (high 32 bits), owner count (bits 16..32), version (low 16 bits).
    meta: AtomicU64,
}

impl Bucket {
    fn empty() -> Self {
        Self {
            path: AtomicU64::new(0),
            bits: AtomicU64::new(0),
            meta: AtomicU64::new(0),
        }
    }
}

/// The shift epoch, alone on its cache line (the writer stores it; readers load it at misses).
#[derive(Debug)]
#[repr(align(64))]
struct Epoch(AtomicU64);

/// The spill arena of one table version: `chunks` chunks of `words` words, allocated with the
/// version and never moved (a full arena is replaced by a rebuild, as a full table is).
struct Spill {
    words: usize,
    arena: Box<[AtomicU64]>,
}

impl Spill {
    fn new(words: usize, chunks: usize) -> Self {
        Self {
            words,
            arena: (0..words.saturating_mul(chunks))
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    /// Chunks the arena holds.
    fn capacity(&self) -> usize {
        self.arena.len() / self.words
    }

    #[inline]
    fn chunk(&self, c: u32) -> Option<&[AtomicU64]> {
        let at = (c as usize).checked_mul(self.words)?;
        self.arena.get(at..at.checked_add(self.words)?)
    }

    /// Words allocated.
    fn allocated(&self) -> usize {
        self.arena.len()
    }
}

/// A node as one reader saw it: one state of its bucket (path, word and meta read inside one even
/// version).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    at: usize,
    bits: u64,
    meta: u64,
}

/// One node's owner set, as read.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Owners {
    /// Every owner is in word `at`, whose bits are `bits`.
    Inline { at: usize, bits: u64 },
    /// A spilled set of `owners` slots whose words' [`Keyed::word_mix`]es XOR to `fp`; its words are
    /// read with [`Nodes::chunk_into`].
    Spilled { owners: u32, fp: u64, seen: Seen },
}

impl Seen {
    pub(crate) fn owners(&self) -> Owners {
        let tag = meta_tag(self.meta);
        if tag & SPILLED == 0 {
            Owners::Inline {
                at: tag as usize,
                bits: self.bits,
            }
        } else {
            Owners::Spilled {
                owners: meta_owners(self.meta),
                fp: self.bits,
                seen: *self,
            }
        }
    }
}

/// One version of the node table, as readers hold it.
pub(crate) struct Nodes {
    buckets: Box<[Bucket]>,
    keyed: Keyed,
    spill: Spill,
    shifts: Epoch,
}

impl fmt::Debug for Nodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nodes")
            .field("buckets", &self.buckets.len())
            .field("words", &self.spill.words)
            .finish_non_exhaustive()
    }
}

impl Nodes {
    fn new(keyed: Keyed, cap: usize, words: usize, chunks: usize) -> Self {
        Self {
            buckets: (0..cap).map(|_| Bucket::empty()).collect(),
            keyed,
            spill: Spill::new(words.max(1), chunks),
            shifts: Epoch(AtomicU64::new(0)),
        }
    }

    fn mask(&self) -> usize {
        self.buckets.len().wrapping_sub(1)
    }

    /// Words per spilled set (slots `0..64 * words` are usable).
    pub(crate) fn words(&self) -> usize {
        self.spill.words
    }

    /// The hash and fingerprint keys.
    pub(crate) fn keyed(&self) -> Keyed {
        self.keyed
    }

    /// Bytes of this version's buckets (what a walk probes).
    #[inline]
    pub(crate) fn bucket_bytes(&self) -> usize {
        self.buckets.len() * std::mem::size_of::<Bucket>()
    }

    /// Bytes this version holds (buckets and spill arena).
    pub(crate) fn bytes(&self) -> usize {
        self.bucket_bytes() + self.spill.allocated() * 8
    }

    /// The shift epoch once even (a reader's starting point for [`Self::get`]).
    pub(crate) fn epoch(&self) -> u64 {
        let mut spins = 0;
        loop {
            let e = self.shifts.0.load(Ordering::Acquire);
            if e & 1 == 0 {
                return e;
            }
            // A shift is in progress: the writer finishes it without waiting for anyone.
            backoff(&mut spins);
        }
    }

    /// Bucket `b` read once: `(path, bits, meta)` if the read fell inside one even version.
    #[inline(always)]
    fn read_once(b: &Bucket) -> Option<(u64, u64, u64)> {
        let m1 = b.meta.load(Ordering::Acquire);
        let path = b.path.load(Ordering::Relaxed);
        let bits = b.bits.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        let m2 = b.meta.load(Ordering::Relaxed);
        (m1 & 1 == 0 && m1 == m2).then_some((path, bits, m1))
    }

    /// Bucket `i` read inside one even version: `(path, bits, meta)` (`None`: no such bucket).
    #[inline(always)]
    fn read(&self, i: usize) -> Option<(u64, u64, u64)> {
        let b = self.buckets.get(i)?;
        match Self::read_once(b) {
            Some(r) => Some(r),
            None => Self::read_again(b),
        }
    }

    /// [`Self::read`] after a torn read: waits for the writer's write to end.
    #[cold]
    #[inline(never)]
    fn read_again(b: &Bucket) -> Option<(u64, u64, u64)> {
        let mut spins = 0;
        loop {
            // A write is in progress or just happened: the writer finishes each write without
            // waiting for anyone, so this ends (as `crate::load::seqcell`'s reads do).
            backoff(&mut spins);
            if let Some(r) = Self::read_once(b) {
                return Some(r);
            }
        }
    }

    /// One probe for `path`: `Ok(Some)` found, `Ok(None)` reached an empty bucket, `Err` a bucket
    /// could not be read.
    #[inline(always)]
    fn probe(&self, path: u64) -> Result<Option<Seen>, ()> {
        if self.buckets.is_empty() {
            return Ok(None);
        }
        let mask = self.mask();
        let mut i = home(self.keyed, path, mask);
        for _ in 0..self.buckets.len() {
            let (p, bits, m) = self.read(i).ok_or(())?;
            if meta_owners(m) == 0 {
                return Ok(None);
            }
            if p == path {
                return Ok(Some(Seen {
                    at: i,
                    bits,
                    meta: m,
                }));
            }
            i = (i + 1) & mask;
        }
        Ok(None)
    }

    /// Node `path` as this reader sees it; `epoch` is the even shift epoch the reader last
    /// trusted (from [`Self::epoch`]) and is moved on when a miss makes it look again.
    #[inline]
    pub(crate) fn get(&self, path: u64, epoch: &mut u64) -> Option<Seen> {
        match self.probe(path) {
            Ok(Some(seen)) => Some(seen),
            _ => self.get_after_miss(path, epoch),
        }
    }

    /// [`Self::get`] once a probe missed (or could not read a bucket): the miss stands if no
    /// deletion moved entries since the reader's epoch, else the probe runs again.
    #[cold]
    #[inline(never)]
    fn get_after_miss(&self, path: u64, epoch: &mut u64) -> Option<Seen> {
        for _ in 0..MAX_RETRIES {
            fence(Ordering::Acquire);
            let now = self.shifts.0.load(Ordering::Relaxed);
            if now == *epoch && now & 1 == 0 {
                return None;
            }
            // A deletion moved entries since the reader last looked: probe again once it is done.
            *epoch = self.epoch();
            if let Ok(Some(seen)) = self.probe(path) {
                return Some(seen);
            }
        }
        None
    }

    /// Copies words `lo..hi` of the spilled set `seen` names into `out` (`out[0]` is word `lo`);
    /// `false` if the node changed since `seen` (read it again).
    pub(crate) fn chunk_into(&self, seen: &Seen, lo: usize, hi: usize, out: &mut [u64]) -> bool {
        let tag = meta_tag(seen.meta);
        let Some(chunk) = self.spill.chunk(tag & !SPILLED) else {
            return false;
        };
        let (Some(src), Some(dst)) = (chunk.get(lo..hi), out.get_mut(..hi.saturating_sub(lo)))
        else {
            return false;
        };
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.load(Ordering::Relaxed);
        }
        fence(Ordering::Acquire);
        self.buckets
            .get(seen.at)
            .is_some_and(|b| b.meta.load(Ordering::Relaxed) == seen.meta)
    }

    /// Asks the CPU to start loading `path`'s home bucket (a hint: nothing is read).
    #[inline(always)]
    pub(crate) fn prefetch(&self, path: u64) {
        if let Some(b) = self.buckets.get(home(self.keyed, path, self.mask())) {
            continuum_prefetch::read(b);
        }
    }

    /// Loads `path`'s home bucket (to have it cached before a batch uses it).
    #[inline]
    pub(crate) fn touch(&self, path: u64) -> u64 {
        self.buckets
            .get(home(self.keyed, path, self.mask()))
            .map_or(0, |b| b.bits.load(Ordering::Relaxed))
    }
}

/// A bucket's contents, as the writer handles them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Entry {
    path: u64,
    bits: u64,
    tag: u32,
    owners: u32,
}

/// The index writer's handle on its node table (`Send`, one per index).
pub(crate) struct NodeWriter {
    cur: Arc<Nodes>,
    shared: Arc<ArcSwap<Nodes>>,
    len: usize,
    /// Chunks handed out so far (free ones included).
    chunks: u32,
    spill_free: Vec<u32>,
}

impl fmt::Debug for NodeWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeWriter")
            .field("len", &self.len)
            .field("nodes", &self.cur)
            .finish_non_exhaustive()
    }
}

impl NodeWriter {
    /// An empty table and the publication point readers load it from.
    pub(crate) fn new(keyed: Keyed) -> (Self, Arc<ArcSwap<Nodes>>) {
        let cur = Arc::new(Nodes::new(keyed, 0, 1, 0));
        let shared = Arc::new(ArcSwap::new(Arc::clone(&cur)));
        let w = Self {
            cur,
            shared: Arc::clone(&shared),
            len: 0,
            chunks: 0,
            spill_free: Vec::new(),
        };
        (w, shared)
    }

    /// Nodes (tests).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Words per spilled set.
    pub(crate) fn words(&self) -> usize {
        self.cur.words()
    }

    /// The current version (what readers load).
    pub(crate) fn nodes(&self) -> &Nodes {
        &self.cur
    }

    /// See [`Nodes::touch`].
    #[inline]
    pub(crate) fn touch(&self, path: u64) -> u64 {
        self.cur.touch(path)
    }

    /// See [`Nodes::prefetch`].
    #[inline]
    pub(crate) fn prefetch(&self, path: u64) {
        self.cur.prefetch(path);
    }

    /// The writer's own read of bucket `i` (nobody else writes, so no version check).
    fn entry(&self, i: usize) -> Entry {
        self.cur.buckets.get(i).map_or(Entry::default(), |b| {
            let m = b.meta.load(Ordering::Relaxed);
            Entry {
                path: b.path.load(Ordering::Relaxed),
                bits: b.bits.load(Ordering::Relaxed),
                tag: meta_tag(m),
                owners: meta_owners(m),
            }
        })
    }

    /// `Ok`: the bucket of node `path`; `Err`: the empty bucket ending its probe run (`None`: no
    /// buckets).
    fn probe(&self, path: u64) -> Result<usize, Option<usize>> {
        let n = &self.cur;
        if n.buckets.is_empty() {
            return Err(None);
        }
        let mask = n.mask();
        let mut i = home(n.keyed, path, mask);
        for _ in 0..n.buckets.len() {
            let Some(b) = n.buckets.get(i) else {
                return Err(None);
            };
            if meta_owners(b.meta.load(Ordering::Relaxed)) == 0 {
                return Err(Some(i));
            }
            if b.path.load(Ordering::Relaxed) == path {
                return Ok(i);
            }
            i = (i + 1) & mask;
        }
        Err(None)
    }

    /// Marks bucket `i` as being written (odd version); returns its meta before.
    fn hold(&self, i: usize) -> u64 {
        let Some(b) = self.cur.buckets.get(i) else {
            return 0;
        };
        let m = b.meta.load(Ordering::Relaxed);
        b.meta
            .store((m & !SEQ) | (m.wrapping_add(1) & SEQ), Ordering::Relaxed);
        // Orders the odd version before the stores below for any reader that sees one of them.
        fence(Ordering::Release);
        m
    }

    /// Writes `e` into bucket `i` held with [`Self::hold`] (whose meta was `was`) and releases it.
    fn release(&self, i: usize, was: u64, e: Entry) {
        let Some(b) = self.cur.buckets.get(i) else {
            return;
        };
        b.path.store(e.path, Ordering::Relaxed);
        b.bits.store(e.bits, Ordering::Relaxed);
        b.meta.store(
            meta(e.tag, e.owners) | (was.wrapping_add(2) & SEQ),
            Ordering::Release,
        );
    }

    fn write(&self, i: usize, e: Entry) {
        let was = self.hold(i);
        self.release(i, was, e);
    }

    fn chunk(&self, c: u32) -> Option<&[AtomicU64]> {
        self.cur.spill.chunk(c)
    }

    /// Node `path`'s owner count and whether `slot` is among its owners (`None`: no such node).
    pub(crate) fn owner_state(&self, path: u64, slot: u32) -> Option<(u32, bool)> {
        let e = self.entry(self.probe(path).ok()?);
        let w = (slot / 64) as usize;
        let has = if e.tag & SPILLED == 0 {
            e.tag as usize == w && e.bits & bit(slot) != 0
        } else {
            self.chunk(e.tag & !SPILLED)
                .and_then(|c| c.get(w))
                .is_some_and(|x| x.load(Ordering::Relaxed) & bit(slot) != 0)
        };
        Some((e.owners, has))
    }

    /// Adds `slot` to node `path`'s owners, creating the node; returns whether it was created.
    pub(crate) fn add(&mut self, path: u64, slot: u32) -> bool {
        let w = (slot / 64) as usize;
        if w >= self.words() {
            return false;
        }
        if self.spill_free.is_empty() && self.chunks as usize >= self.cur.spill.capacity() {
            // A spill below must find a chunk: grow the arena first (bucket indices change).
            let chunks = (self.cur.spill.capacity() * 2).max(FIRST_CHUNKS);
            self.rebuild(self.cur.buckets.len(), self.words(), chunks);
        }
        let i = match self.probe(path) {
            Ok(i) => i,
            Err(vacant) => {
                let e = Entry {
                    path,
                    bits: bit(slot),
                    tag: u32::try_from(w).unwrap_or(0),
                    owners: 1,
                };
                let room = !full(self.len, self.cur.buckets.len(), NODE_LOAD);
                match vacant.filter(|_| room) {
                    Some(v) => {
                        self.write(v, e);
                        self.len += 1;
                    }
                    None => {
                        self.grow();
                        self.insert(e);
                    }
                }
                return true;
            }
        };
        let b = self.entry(i);
        let mut next = b;
        let keyed = self.cur.keyed;
        if b.tag & SPILLED != 0 {
            let Some(x) = self.chunk(b.tag & !SPILLED).and_then(|c| c.get(w)) else {
                return false;
            };
            let old = x.load(Ordering::Relaxed);
            if old & bit(slot) != 0 {
                return false;
            }
            next.bits ^= keyed.word_mix(w, old) ^ keyed.word_mix(w, old | bit(slot));
            next.owners = b.owners.saturating_add(1);
            let was = self.hold(i);
            x.store(old | bit(slot), Ordering::Relaxed);
            self.release(i, was, next);
            return false;
        }
        if b.tag as usize == w {
            if b.bits & bit(slot) != 0 {
                return false;
            }
            next.bits |= bit(slot);
            next.owners = b.owners.saturating_add(1);
            self.write(i, next);
            return false;
        }
        // A second word: spill. The chunk is free (so no reader uses it) until the bucket names it.
        let c = self.take_chunk();
        if let Some(chunk) = self.chunk(c) {
            if let Some(x) = chunk.get(b.tag as usize) {
                x.store(b.bits, Ordering::Relaxed);
            }
            if let Some(x) = chunk.get(w) {
                x.store(bit(slot), Ordering::Relaxed);
            }
        }
        next.tag = c | SPILLED;
        next.bits = keyed.word_mix(b.tag as usize, b.bits) ^ keyed.word_mix(w, bit(slot));
        next.owners = b.owners.saturating_add(1);
        // `hold`'s fence also orders the chunk's stores before the bucket's new contents.
        self.write(i, next);
        false
    }

    /// Removes `slot` from node `path`'s owners; returns whether the node went (no owner left).
    pub(crate) fn remove(&mut self, path: u64, slot: u32) -> bool {
        let w = (slot / 64) as usize;
        let Ok(i) = self.probe(path) else {
            return false;
        };
        let b = self.entry(i);
        let mut next = b;
        next.owners = b.owners.saturating_sub(1);
        if b.tag & SPILLED == 0 {
            if b.tag as usize != w || b.bits & bit(slot) == 0 {
                return false;
            }
            if next.owners == 0 {
                self.delete(i);
                return true;
            }
            next.bits &= !bit(slot);
            self.write(i, next);
            return false;
        }
        let c = b.tag & !SPILLED;
        let keyed = self.cur.keyed;
        let Some(chunk) = self.chunk(c) else {
            return false;
        };
        let Some(x) = chunk.get(w) else {
            return false;
        };
        let old = x.load(Ordering::Relaxed);
        if old & bit(slot) == 0 {
            return false;
        }
        // Back inline once the set fits one word (only possible from 64 owners down: the other
        // words are not read before).
        let inline = (next.owners <= 64)
            .then(|| {
                let mut live = chunk
                    .iter()
                    .enumerate()
                    .map(|(k, x)| {
                        (
                            k,
                            if k == w {
                                old & !bit(slot)
                            } else {
                                x.load(Ordering::Relaxed)
                            },
                        )
                    })
                    .filter(|(_, x)| *x != 0);
                let (first, second) = (live.next(), live.next());
                second.is_none().then_some(first)
            })
            .flatten();
        let was = self.hold(i);
        if let Some(first) = inline {
            let (at, word) = first.map_or((0, 0), |(k, x)| (k, x));
            next.tag = u32::try_from(at).unwrap_or(0);
            next.bits = word;
            self.release(i, was, next);
            // No reader can name the chunk any more without seeing the bucket's new version.
            for x in chunk {
                x.store(0, Ordering::Relaxed);
            }
            self.spill_free.push(c);
        } else {
            x.store(old & !bit(slot), Ordering::Relaxed);
            next.bits ^= keyed.word_mix(w, old) ^ keyed.word_mix(w, old & !bit(slot));
            self.release(i, was, next);
        }
        false
    }

    /// Inserts `e` (absent) at the end of its probe run; the table has room.
    fn insert(&mut self, e: Entry) {
        if let Err(Some(v)) = self.probe(e.path) {
            self.write(v, e);
            self.len += 1;
        }
    }

    /// Empties bucket `i`, pulling later entries of its run back (backward shift, under the
    /// shift epoch when anything moves).
    fn delete(&mut self, i: usize) {
        let mask = self.cur.mask();
        self.len = self.len.saturating_sub(1);
        let next = (i + 1) & mask;
        if self.entry(next).owners == 0 {
            self.write(i, Entry::default());
            return;
        }
        let epoch = &self.cur.shifts.0;
        let e = epoch.load(Ordering::Relaxed);
        epoch.store(e.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        let mut hole = i;
        let mut j = next;
        for _ in 0..self.cur.buckets.len() {
            let b = self.entry(j);
            if b.owners == 0 {
                break;
            }
            if may_fill(hole, j, home(self.cur.keyed, b.path, mask), mask) {
                // Into the hole first, out of its old bucket after: a reader finds it in one.
                self.write(hole, b);
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.write(hole, Entry::default());
        epoch.store(e.wrapping_add(2), Ordering::Release);
    }

    /// A zeroed spill chunk (the arena has one: `add` grows it first when needed).
    fn take_chunk(&mut self) -> u32 {
        if let Some(c) = self.spill_free.pop() {
            return c;
        }
        let c = self.chunks;
        self.chunks = self.chunks.saturating_add(1);
        c
    }

    /// Twice the buckets (at least 16), published.
    fn grow(&mut self) {
        let cap = (self.cur.buckets.len() * 2).max(16);
        self.rebuild(cap, self.words(), self.cur.spill.capacity());
    }

    /// Re-lays spilled sets out at `words` words (more than now), published.
    pub(crate) fn widen(&mut self, words: usize) {
        if words > self.words() {
            self.rebuild(self.cur.buckets.len(), words, self.cur.spill.capacity());
        }
    }

    /// A new version with `cap` buckets, `words`-word sets and room for `chunks` spilled sets (at
    /// least the chunks handed out so far), holding every node, published. Every spilled set
    /// keeps its chunk number (and the free list stays as it is): chunks are handed out in the
    /// order sets spill, which for a prompt's blocks is mostly their order in the prompt, so a
    /// match walk reads them at rising addresses, which the hardware prefetcher follows
    /// (re-packing them in bucket order, which is hash order, scattered them).
    fn rebuild(&mut self, cap: usize, words: usize, chunks: usize) {
        let old = Arc::clone(&self.cur);
        let chunks = chunks.max(self.chunks as usize);
        self.cur = Arc::new(Nodes::new(old.keyed, cap, words, chunks));
        self.len = 0;
        for b in old.buckets.iter() {
            let m = b.meta.load(Ordering::Relaxed);
            if meta_owners(m) == 0 {
                continue;
            }
            let e = Entry {
                path: b.path.load(Ordering::Relaxed),
                bits: b.bits.load(Ordering::Relaxed),
                tag: meta_tag(m),
                owners: meta_owners(m),
            };
            if e.tag & SPILLED != 0
                && let (Some(from), Some(to)) = (
                    old.spill.chunk(e.tag & !SPILLED),
                    self.chunk(e.tag & !SPILLED),
                )
            {
                for (t, f) in to.iter().zip(from) {
                    t.store(f.load(Ordering::Relaxed), Ordering::Relaxed);
                }
            }
            self.insert(e);
        }
        self.shared.store(Arc::clone(&self.cur));
    }

    /// Every node's owner count (tests).
    #[cfg(test)]
    pub(crate) fn owner_counts(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.cur.buckets.len())
            .map(|i| self.entry(i).owners)
            .filter(|o| *o != 0)
    }
}

#[cfg(all(test, not(loom)))]
mod tests;

#[cfg(test)]
#[cfg(loom)]
#[path = "nodes_loom.rs"]
mod loom_models;
