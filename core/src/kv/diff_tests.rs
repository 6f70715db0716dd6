//! Differential test: [`Subscription`] + [`IndexWriter`] + [`Merged`] readers against a
//! deliberately naive reference written from the spec text (KV-IDX-05..11), over seeded random
//! event streams.
//!
//! The reference shares nothing with the index but [`path_hash`]: per rank a map from engine hash
//! to the token path of its block; nodes, owners, budget use and matches are recomputed by brute
//! force from those maps on every question. Streams come from simulated engines (one per rank,
//! LRU caches over prompts that share prefixes, evicting leaves), mixed with the faults the
//! handler must absorb: gaps, replays, duplicate and re-salted stores, unknown removals, unknown
//! parents, middle evictions, `cleared`, other tiers, dead workers, undeclared ranks, wrong
//! sources, publisher restarts (`clear_all`) and live-set changes (`retain_live`). Two shards
//! share one small budget; caps are small so every one of them is reached. After every batch:
//! outcome counts, cursors, per-rank blocks and node/ownership counts; at most batches (writes
//! are visible as made): `find_matches` of every prompt prefix and of random probes, merged over
//! both shards, against the reference.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::budget::Budget;
use super::event::{KvData, KvEvent, Tier};
use super::handler::{LiveGate, OutcomeCounts, Subscription};
use super::index::{Caps, IndexWriter, new_index_with_caps};
use super::shared::{IndexReader, Merged};
use super::test_support::{key, matches_of, prompt};
use super::{EngineHash, Outcome, StoredBlock, TokensHash, path_hash};
use crate::clock::Instant;
use crate::discovery::InstanceId;
use crate::load::{LiveSet, LiveWorker, LoadKey};
use crate::picker::{BlockHash, OverlapSource, Positions, PromptBlocks, RankPositions};

/// splitmix64: a tiny seeded generator (no dependency).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % (n.max(1) as u64)) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

const STREAMS: u64 = 10_000;
const STEPS: usize = 24;

/// The path hash of a token path.
fn hash_of(path: &[u64]) -> BlockHash {
    let mut h = None;
    for t in path {
        h = Some(path_hash(h, TokensHash(*t)));
    }
    h.unwrap_or(BlockHash(0))
}

// ---------------------------------------------------------------- the reference

/// One shard's index as the spec states it: per rank, engine hash → token path (with the path's
/// hash, computed once, so the brute force stays fast enough).
#[derive(Clone, Default)]
struct RefShard {
    ranks: BTreeMap<LoadKey, BTreeMap<u64, (Vec<u64>, BlockHash)>>,
}

impl RefShard {
    fn nodes(&self) -> usize {
        let mut all: Vec<BlockHash> = self
            .ranks
            .values()
            .flat_map(|m| m.values().map(|v| v.1))
            .collect();
        all.sort_unstable();
        all.dedup();
        all.len()
    }

    fn entries(&self) -> usize {
        self.ranks.values().map(BTreeMap::len).sum()
    }

    fn owners(&self, path: &[u64]) -> usize {
        self.ranks
            .values()
            .filter(|m| m.values().any(|p| p.0 == path))
            .count()
    }
}

struct RefWorld {
    shards: [RefShard; 2],
    caps: Caps,
    node_limit: usize,
    own_limit: usize,
}

impl RefWorld {
    fn total_nodes(&self) -> usize {
        self.shards.iter().map(RefShard::nodes).sum()
    }

    fn total_entries(&self) -> usize {
        self.shards.iter().map(RefShard::entries).sum()
    }

    /// `(applied, refused, parent missing)`.
    fn store(
        &mut self,
        shard: usize,
        rank: LoadKey,
        parent: Option<EngineHash>,
        blocks: &[StoredBlock],
    ) -> (usize, usize, bool) {
        let mut path = match parent {
            None => Vec::new(),
            Some(p) => match self.shards[shard]
                .ranks
                .get(&rank)
                .and_then(|m| m.get(&p.0))
            {
                Some(path) => path.0.clone(),
                None => return (0, 0, true),
            },
        };
        let mut applied = 0;
        for (i, b) in blocks.iter().enumerate() {
            path.push(b.tokens_hash.0);
            let held = self.shards[shard]
                .ranks
                .get(&rank)
                .and_then(|m| m.get(&b.block_hash.0));
            if held.is_some_and(|h| h.0 == path) {
                applied += 1;
                continue;
            }
            if let Some(m) = self.shards[shard].ranks.get_mut(&rank) {
                m.remove(&b.block_hash.0);
            }
            let mine = self.shards[shard].ranks.get(&rank);
            let count = mine.map_or(0, BTreeMap::len);
            let owns = mine.is_some_and(|m| m.values().any(|p| p.0 == path));
            let owners = self.shards[shard].owners(&path);
            let refused = count >= self.caps.blocks_per_rank
                || self.total_entries() >= self.own_limit
                || (!owns && owners >= self.caps.owners_per_node)
                || (!owns && owners == 0 && self.total_nodes() >= self.node_limit);
            if refused {
                self.prune(shard);
                return (applied, blocks.len() - i, false);
            }
            self.shards[shard]
                .ranks
                .entry(rank)
                .or_default()
                .insert(b.block_hash.0, (path.clone(), hash_of(&path)));
            applied += 1;
        }
        self.prune(shard);
        (applied, 0, false)
    }

    fn remove(&mut self, shard: usize, rank: LoadKey, hashes: &[EngineHash]) {
        if let Some(m) = self.shards[shard].ranks.get_mut(&rank) {
            for h in hashes {
                m.remove(&h.0);
            }
        }
        self.prune(shard);
    }

    fn clear(&mut self, shard: usize, rank: LoadKey) {
        self.shards[shard].ranks.remove(&rank);
    }

    fn prune(&mut self, shard: usize) {
        self.shards[shard].ranks.retain(|_, m| !m.is_empty());
    }
}

/// The reference's state at a checkpoint, with each rank's held path hashes.
struct RefSnapshot(Vec<(LoadKey, BTreeSet<BlockHash>)>);

impl RefSnapshot {
    fn of(world: &RefWorld) -> Self {
        Self(
            world
                .shards
                .iter()
                .flat_map(|s| s.ranks.iter())
                .map(|(k, m)| (*k, m.values().map(|p| p.1).collect()))
                .collect(),
        )
    }

    fn matches(&self, prompt: &[BlockHash]) -> BTreeMap<LoadKey, u32> {
        self.0
            .iter()
            .filter_map(|(k, held)| {
                let n = prompt.iter().take_while(|h| held.contains(h)).count();
                (n > 0).then_some((*k, n as u32))
            })
            .collect()
    }
}

/// The handler rules as the spec states them, for one subscription.
#[derive(Default)]
struct RefSub {
    source: Option<LoadKey>,
    cursors: BTreeMap<LoadKey, u64>,
    max_cursors: usize,
}

/// A live worker: `(dp start, dp size)`.
type Live = BTreeMap<u64, (u32, u32)>;

fn admits(live: &Live, k: LoadKey) -> bool {
    live.get(&k.worker_id.get())
        .is_some_and(|&(s, n)| k.dp_rank >= s && k.dp_rank - s < n)
}

/// One event to send: what both sides are given.
#[derive(Clone)]
struct Ev {
    rank: LoadKey,
    id: u64,
    tier: Tier,
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Stored(Option<EngineHash>, Vec<StoredBlock>),
    Removed(Vec<EngineHash>),
    Cleared,
}

fn ref_event(
    world: &mut RefWorld,
    sub: &mut RefSub,
    shard: usize,
    live: &Live,
    ev: &Ev,
    counts: &mut [u64; 8],
) {
    let mut count = |o: Outcome| counts[o as usize] += 1;
    if !admits(live, ev.rank) || sub.source.is_some_and(|s| s != ev.rank) {
        return count(Outcome::IdentityMismatch);
    }
    match sub.cursors.get(&ev.rank) {
        Some(&c) if ev.id <= c => return count(Outcome::Replay),
        Some(&c) if ev.id > c + 1 => {
            world.clear(shard, ev.rank);
            count(Outcome::Gap);
        }
        None if sub.cursors.len() >= sub.max_cursors => return count(Outcome::OverCapacity),
        _ => {}
    }
    sub.cursors.insert(ev.rank, ev.id);
    if ev.tier == Tier::Other {
        return count(Outcome::OtherTier);
    }
    match &ev.kind {
        Kind::Stored(parent, blocks) => {
            let (_, refused, missing) = world.store(shard, ev.rank, *parent, blocks);
            count(if missing {
                Outcome::ParentMissing
            } else if refused > 0 {
                Outcome::OverCapacity
            } else {
                Outcome::Applied
            });
        }
        Kind::Removed(h) => {
            world.remove(shard, ev.rank, h);
            count(Outcome::Applied);
        }
        Kind::Cleared => {
            world.clear(shard, ev.rank);
            count(Outcome::Applied);
        }
    }
}

// ---------------------------------------------------------------- the simulated engines

/// One rank's engine: an LRU cache of blocks (token path, engine hash, last use).
struct Engine {
    rank: LoadKey,
    salt: u64,
    cap: usize,
    cache: Vec<(Vec<u64>, EngineHash, u64)>,
    next_id: u64,
}

impl Engine {
    fn engine_hash(&self, path: &[u64], salt: u64) -> EngineHash {
        let h = hash_of(path).0;
        EngineHash(if salt == 0 {
            h
        } else {
            h ^ salt.wrapping_mul(0xA24B_AED4_963E_E407)
        })
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn find(&self, path: &[u64]) -> Option<usize> {
        self.cache.iter().position(|(p, ..)| p == path)
    }

    /// A request for `prompt`: the stored event, then the removal its evictions cause.
    fn request(&mut self, prompt: &[u64], tick: u64, rng: &mut Rng) -> Vec<Ev> {
        let mut k = 0;
        while k < prompt.len() {
            match self.find(&prompt[..=k]) {
                Some(i) => self.cache[i].2 = tick,
                None => break,
            }
            k += 1;
        }
        let mut out = Vec::new();
        if k < prompt.len() {
            let parent = k
                .checked_sub(1)
                .and_then(|j| self.find(&prompt[..=j]))
                .map(|i| self.cache[i].1);
            let salt = if rng.chance(10) {
                self.salt + 1
            } else {
                self.salt
            };
            let blocks: Vec<StoredBlock> = (k..prompt.len())
                .map(|j| StoredBlock {
                    block_hash: self.engine_hash(&prompt[..=j], salt),
                    tokens_hash: TokensHash(prompt[j]),
                })
                .collect();
            for (j, b) in (k..).zip(&blocks) {
                self.cache.push((prompt[..=j].to_vec(), b.block_hash, tick));
            }
            let id = self.id();
            out.push(self.ev(id, Kind::Stored(parent, blocks)));
        }
        let mut gone = Vec::new();
        while self.cache.len() > self.cap {
            // The least recently used leaf (no cached block extends it).
            let leaf = (0..self.cache.len())
                .filter(|&i| {
                    let p = &self.cache[i].0;
                    !self
                        .cache
                        .iter()
                        .any(|(q, ..)| q.len() == p.len() + 1 && q.starts_with(p))
                })
                .min_by_key(|&i| self.cache[i].2);
            let Some(i) = leaf else { break };
            gone.push(self.cache.remove(i).1);
        }
        if !gone.is_empty() {
            let id = self.id();
            out.push(self.ev(id, Kind::Removed(gone)));
        }
        out
    }

    fn ev(&self, id: u64, kind: Kind) -> Ev {
        Ev {
            rank: self.rank,
            id,
            tier: Tier::Device,
            kind,
        }
    }
}

// ---------------------------------------------------------------- one stream

struct Worker {
    id: u64,
    start: u32,
    size: u32,
    shard: usize,
    engines: Vec<Engine>,
    sub: Subscription,
    rsub: RefSub,
}

fn gate_of(live: &Live) -> LiveGate {
    LiveGate::from_live(LiveSet::new(
        live.iter()
            .map(|(&id, &(s, n))| LiveWorker::new(InstanceId::new(id), "ns", s, n)),
    ))
}

struct Stream {
    rng: Rng,
    world: RefWorld,
    writers: Vec<IndexWriter>,
    readers: Vec<IndexReader>,
    budget: Arc<Budget>,
    workers: Vec<Worker>,
    live: Live,
    gate: LiveGate,
    /// Prompts with their path hashes.
    prompts: Vec<(Vec<BlockHash>, Vec<u64>)>,
    counts: OutcomeCounts,
    rcounts: [u64; 8],
    history: Vec<(usize, Vec<Ev>)>,
    snapshot: RefSnapshot,
    tick: u64,
    /// A candidate list for `find_positions` (changed now and then) and the position maps
    /// kept across probes, as a picker keeps them across picks.
    cands: Cands,
    positions: RankPositions,
}

/// A candidate list: some of the stream's ranks (some twice) and a rank no index holds.
struct Cands {
    serial: u64,
    keys: Vec<LoadKey>,
}

impl Positions for Cands {
    fn serial(&self) -> u64 {
        self.serial
    }

    fn first(&self, key: LoadKey) -> Option<u32> {
        let p = self.keys.iter().position(|k| *k == key)?;
        u32::try_from(p).ok()
    }
}

impl Stream {
    fn new(seed: u64) -> Self {
        let mut rng = Rng(seed);
        // One stream in ten is wide: many ranks on few nodes, so the walk sees big owner sets.
        let wide = rng.chance(10);
        let scale = if wide { 6 } else { 1 };
        let caps = Caps {
            blocks_per_rank: 3 + rng.below(14),
            owners_per_node: 1 + rng.below(4 * scale),
        };
        let (node_limit, own_limit) = (5 + rng.below(30 * scale), 6 + rng.below(40 * scale));
        let budget = Arc::new(Budget::with_limits(node_limit, own_limit));
        let (mut writers, mut readers) = (Vec::new(), Vec::new());
        for _ in 0..2 {
            let (w, r) = new_index_with_caps(Arc::clone(&budget), caps);
            writers.push(w);
            readers.push(r.handle());
        }
        let max_cursors = 1 + rng.below(4 * scale);
        let mut workers = Vec::new();
        let mut live = Live::new();
        for id in 1..=2 + rng.below(2 * scale / 2 + 1) as u64 {
            let (start, size) = (rng.below(2) as u32, 1 + rng.below(3 + scale / 2) as u32);
            let source = (size == 1 && rng.chance(40)).then(|| key(id, start));
            let engines = (start..start + size)
                .map(|r| Engine {
                    rank: key(id, r),
                    salt: if rng.chance(30) { 0 } else { rng.next() | 2 },
                    cap: 2 + rng.below(8),
                    cache: Vec::new(),
                    next_id: rng.below(5) as u64,
                })
                .collect();
            workers.push(Worker {
                id,
                start,
                size,
                shard: (id % 2) as usize,
                engines,
                sub: Subscription::with_max_cursors(source, max_cursors),
                rsub: RefSub {
                    source,
                    cursors: BTreeMap::new(),
                    max_cursors,
                },
            });
            live.insert(id, (start, size));
        }
        let prompts = (0..4 + rng.below(4))
            .map(|_| {
                let len = 1 + rng.below(6);
                // A small alphabet: prompts share prefixes across ranks.
                let p: Vec<u64> = (0..len).map(|_| 1 + rng.below(3) as u64).collect();
                (prompt(&p), p)
            })
            .collect();
        let world = RefWorld {
            shards: [RefShard::default(), RefShard::default()],
            caps,
            node_limit,
            own_limit,
        };
        let snapshot = RefSnapshot::of(&world);
        let gate = gate_of(&live);
        Self {
            rng,
            world,
            writers,
            readers,
            budget,
            workers,
            live,
            gate,
            prompts,
            counts: OutcomeCounts::default(),
            rcounts: [0; 8],
            history: Vec::new(),
            snapshot,
            tick: 0,
            cands: Cands {
                serial: 0,
                keys: Vec::new(),
            },
            positions: RankPositions::default(),
        }
    }

    /// Sends `events` through worker `wi`'s subscription on both sides.
    fn send(&mut self, wi: usize, events: Vec<Ev>) {
        let now = Instant::from_origin(Duration::from_millis(self.tick));
        let w = &mut self.workers[wi];
        let writer = &mut self.writers[w.shard];
        for ev in &events {
            let (data, blocks, hashes): (KvData, &[StoredBlock], &[EngineHash]) = match &ev.kind {
                Kind::Stored(p, b) => (
                    KvData::Stored {
                        parent: *p,
                        blocks: 0..0,
                    },
                    b,
                    &[],
                ),
                Kind::Removed(h) => (KvData::Removed { hashes: 0..0 }, &[], h),
                Kind::Cleared => (KvData::Cleared, &[], &[]),
            };
            let kv = KvEvent {
                worker: ev.rank.worker_id,
                dp_rank: ev.rank.dp_rank,
                event_id: ev.id,
                tier: ev.tier,
                data,
            };
            w.sub.apply_event(
                writer,
                &self.gate,
                &kv,
                blocks,
                hashes,
                now,
                &mut self.counts,
            );
            ref_event(
                &mut self.world,
                &mut w.rsub,
                w.shard,
                &self.live,
                ev,
                &mut self.rcounts,
            );
        }
        if self.history.len() < 64 {
            self.history.push((wi, events));
        }
    }

    fn step(&mut self) {
        self.tick += 1;
        let wi = self.rng.below(self.workers.len());
        let ei = self.rng.below(self.workers[wi].engines.len());
        let roll = self.rng.below(100);
        let tick = self.tick;
        let e = &mut self.workers[wi].engines[ei];
        let events = match roll {
            0..=49 => {
                let p = self.prompts[self.rng.below(self.prompts.len())].1.clone();
                e.request(&p, tick, &mut self.rng)
            }
            50..=56 => {
                // A middle eviction: a hole under cached children.
                if e.cache.is_empty() {
                    Vec::new()
                } else {
                    let i = self.rng.below(e.cache.len());
                    let h = e.cache.remove(i).1;
                    let id = e.id();
                    vec![e.ev(id, Kind::Removed(vec![h]))]
                }
            }
            57..=60 => {
                let id = e.id();
                vec![e.ev(
                    id,
                    Kind::Removed(vec![
                        EngineHash(self.rng.next()),
                        EngineHash(self.rng.next()),
                    ]),
                )]
            }
            61..=63 => {
                let id = e.id();
                let b = StoredBlock {
                    block_hash: EngineHash(self.rng.next()),
                    tokens_hash: TokensHash(1),
                };
                vec![e.ev(id, Kind::Stored(Some(EngineHash(self.rng.next())), vec![b]))]
            }
            64..=66 => {
                e.cache.clear();
                let id = e.id();
                vec![e.ev(id, Kind::Cleared)]
            }
            67..=69 => {
                let id = e.id();
                let mut ev = e.ev(
                    id,
                    Kind::Stored(
                        None,
                        vec![StoredBlock {
                            block_hash: EngineHash(9),
                            tokens_hash: TokensHash(2),
                        }],
                    ),
                );
                ev.tier = Tier::Other;
                vec![ev]
            }
            70..=73 => {
                // A replay of something already sent, on the subscription it came from.
                if let Some((w, evs)) = self
                    .history
                    .get(self.rng.below(self.history.len()))
                    .cloned()
                {
                    return self.send(w, evs);
                }
                Vec::new()
            }
            74..=76 => {
                e.next_id += 1 + self.rng.below(3) as u64;
                Vec::new()
            }
            77..=79 => {
                // The whole cached chain of the first prompt again: a duplicate store.
                let p = self.prompts[0].1.clone();
                let blocks: Vec<StoredBlock> = (0..p.len())
                    .filter_map(|j| e.find(&p[..=j]).map(|i| (j, i)))
                    .map(|(j, i)| StoredBlock {
                        block_hash: e.cache[i].1,
                        tokens_hash: TokensHash(p[j]),
                    })
                    .collect();
                let id = e.id();
                vec![e.ev(id, Kind::Stored(None, blocks))]
            }
            80..=83 => {
                // A rank the worker does not declare, a dead worker, or another worker's rank.
                let id = e.id();
                let mut ev = e.ev(id, Kind::Removed(Vec::new()));
                let w = &self.workers[wi];
                ev.rank = match self.rng.below(3) {
                    0 => key(w.id, w.start + w.size),
                    1 => key(99, 0),
                    _ if w.rsub.source.is_some() => key(w.id % 3 + 1, 0),
                    _ => ev.rank,
                };
                vec![ev]
            }
            84..=86 => {
                // The publisher restarts.
                let w = &mut self.workers[wi];
                for e in &mut w.engines {
                    e.cache.clear();
                    e.next_id = 0;
                }
                w.sub.clear_all(&mut self.writers[w.shard]);
                for k in std::mem::take(&mut w.rsub.cursors).into_keys() {
                    self.world.clear(w.shard, k);
                }
                self.history.retain(|(h, _)| *h != wi);
                Vec::new()
            }
            87..=89 => {
                // The worker leaves the live set, or comes back.
                let w = &self.workers[wi];
                if self.live.remove(&w.id).is_none() {
                    self.live.insert(w.id, (w.start, w.size));
                }
                self.gate = gate_of(&self.live);
                for w in &mut self.workers {
                    w.sub.retain_live(&mut self.writers[w.shard], &self.gate);
                    let live = &self.live;
                    let world = &mut self.world;
                    let shard = w.shard;
                    w.rsub.cursors.retain(|k, _| {
                        let keep = admits(live, *k);
                        if !keep {
                            world.clear(shard, *k);
                        }
                        keep
                    });
                }
                Vec::new()
            }
            _ => {
                let p = self.prompts[self.rng.below(self.prompts.len())].1.clone();
                let mut evs = e.request(&p, tick, &mut self.rng);
                if self.rng.chance(50) {
                    let p = self.prompts[self.rng.below(self.prompts.len())].1.clone();
                    evs.extend(e.request(&p, tick, &mut self.rng));
                }
                evs
            }
        };
        if !events.is_empty() {
            self.send(wi, events);
        }
    }

    fn check(&mut self, seed: u64, step: usize) {
        let at = format!("seed {seed} step {step}");
        assert_eq!(self.counts.0, self.rcounts, "{at}: outcome counts");
        for w in &self.workers {
            let got: Vec<(LoadKey, u64)> = w.sub.ranks().map(|(k, id, _)| (k, id)).collect();
            let want: Vec<(LoadKey, u64)> = w.rsub.cursors.iter().map(|(k, v)| (*k, *v)).collect();
            assert_eq!(got, want, "{at}: cursors of worker {}", w.id);
        }
        for (s, (w, r)) in self.writers.iter().zip(&self.world.shards).enumerate() {
            let mut got: Vec<(LoadKey, usize)> = w.ranks().collect();
            got.sort_unstable();
            let want: Vec<(LoadKey, usize)> = r.ranks.iter().map(|(k, m)| (*k, m.len())).collect();
            assert_eq!(got, want, "{at}: blocks per rank, shard {s}");
            assert_eq!(
                (w.nodes(), w.ownerships()),
                (r.nodes(), r.entries()),
                "{at}: shard {s}"
            );
        }
        assert_eq!(
            (self.budget.nodes(), self.budget.ownerships()),
            (self.world.total_nodes(), self.world.total_entries()),
            "{at}: budget"
        );
    }

    fn checkpoint(&mut self, seed: u64, step: usize) {
        self.snapshot = RefSnapshot::of(&self.world);
        self.probe(seed, step);
    }

    /// A new candidate list: each rank of the stream with probability 3/4, shuffled by the
    /// rng, one repeated, and a rank no index holds.
    fn new_cands(&mut self) {
        let mut keys: Vec<LoadKey> = Vec::new();
        for w in &self.workers {
            for e in &w.engines {
                if self.rng.chance(75) {
                    let at = self.rng.below(keys.len() + 1);
                    keys.insert(at, e.rank);
                }
            }
        }
        if let Some(k) = keys.first().copied() {
            keys.push(k);
        }
        keys.insert(self.rng.below(keys.len() + 1), key(999, 0));
        self.cands = Cands {
            serial: self.cands.serial + 1,
            keys,
        };
    }

    fn probe(&mut self, seed: u64, step: usize) {
        if self.cands.keys.is_empty() || self.rng.chance(20) {
            self.new_cands();
        }
        let len = 1 + self.rng.below(7);
        let random: Vec<u64> = (0..len).map(|_| 1 + self.rng.below(3) as u64).collect();
        let random = (prompt(&random), random);
        let merged = Merged(&self.readers);
        for (hashes, p) in self.prompts.iter().chain([&random]) {
            let got = matches_of(|v| {
                merged.find_matches(
                    PromptBlocks {
                        block_size: 16,
                        hashes,
                    },
                    v,
                )
            });
            assert_eq!(
                got,
                self.snapshot.matches(hashes),
                "seed {seed} step {step}: prompt {p:?}"
            );
            // The same matches as candidate positions, through the kept position maps.
            let mut by_position = BTreeMap::new();
            let prompt = PromptBlocks {
                block_size: 16,
                hashes,
            };
            merged.find_positions(prompt, &self.cands, &mut self.positions, &mut |p, n| {
                assert!(by_position.insert(p, n).is_none(), "position {p} twice");
            });
            let want: BTreeMap<u32, u32> = got
                .iter()
                .filter_map(|(k, n)| Some((self.cands.first(*k)?, *n)))
                .collect();
            assert_eq!(
                by_position, want,
                "seed {seed} step {step}: positions of prompt {p:?}"
            );
            // And written by position into a dense array (the picker's way).
            let mut best = vec![0_u32; self.cands.keys.len()];
            merged.fill_positions(prompt, &self.cands, &mut self.positions, &mut best);
            let dense: BTreeMap<u32, u32> = (0_u32..)
                .zip(&best)
                .filter(|(_, n)| **n > 0)
                .map(|(p, n)| (p, *n))
                .collect();
            assert_eq!(
                dense, want,
                "seed {seed} step {step}: filled positions of prompt {p:?}"
            );
        }
    }
}

#[test]
fn index_and_handler_agree_with_the_reference_over_random_streams() {
    let mut seen = [0u64; 8];
    for seed in 0..STREAMS {
        let mut s = Stream::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x5EED);
        for step in 0..STEPS {
            s.step();
            s.check(seed, step);
            if s.rng.chance(70) {
                // Writes are visible as made: the readers agree with the reference now.
                s.checkpoint(seed, step);
            }
        }
        for (a, b) in seen.iter_mut().zip(s.rcounts) {
            *a += b;
        }
    }
    // Every outcome but `malformed` (the decoder's) was exercised, many times over.
    for o in Outcome::ALL {
        if o != Outcome::Malformed {
            assert!(
                seen[o.index()] > 1000,
                "{} only {} times",
                o.label(),
                seen[o.index()]
            );
        }
    }
}
