//! The generated trace both indexes are fed: multi-turn conversations with shared system
//! prompts, routed over `ranks` `(worker, dp_rank)`s, each rank an LRU cache of
//! `rank_capacity` blocks whose evictions become `removed` events.
//!
//! Shape (all counts in 64-token blocks; `Shape` holds the numbers):
//! - `sys_prompts` system prompts of `sys_blocks` blocks, shared by every conversation that
//!   picks one (uniformly);
//! - a conversation has 1..=`max_turns` turns (uniform); turn 1's prompt is the system prompt
//!   plus `first_user_blocks` user blocks (8K tokens in all by default); every later prompt is the
//!   previous one plus the `resp_blocks` response blocks decoded at the previous turn plus
//!   `user_blocks` new user blocks;
//! - `active` conversations are open at once; each request is the next turn of a uniformly
//!   chosen open one; turn 1 goes to a uniformly random rank, a later turn to the rank of the
//!   previous turn with probability `sticky`, else to a random rank;
//! - a rank serving a prompt stores the blocks it does not hold after the longest prefix it does
//!   hold (one `stored` event whose parent is that prefix's last block), then decodes
//!   `resp_blocks` blocks, one `stored` event each (as an engine does, one per filled block);
//! - each rank's cache is an LRU over blocks where a block is always more recent than its
//!   children (a request touches its prefix root last, new blocks go in just behind their
//!   parent), so evictions take leaves first, as vLLM frees a request's blocks tail first; the
//!   blocks evicted to make room for an allocation are one `removed` event, sent before the
//!   `stored` event that needed the room;
//! - the events one rank emits for one engine step are one envelope: the prefill's `removed` +
//!   `stored`, then each decode block's `removed` + `stored`.
//!
//! Hashes are Dynamo's: `tokens_hash` = XXH3-64 (seed 1337) of the block's 64 token ids as LE
//! u32, the engine's `block_hash` = the chained sequence hash ([`continuum_core::kv::path_hash`]),
//! as the 1.6.1 mocker reports it. Token ids come from [`Rng::keyed`] per block, so the trace is a
//! pure function of the seed and the shape.
//!
//! The main trace ends when the `conversations`-th conversation would start. Its first part
//! (until the caches are 98% full) is the fill, the rest the measured window. From the final
//! state come the `find_matches` queries (with the exact answer, from the LRU states), then a
//! tail of further envelopes, each with the prompt prefix it makes visible, for figure (4).

use std::collections::HashMap;

use continuum_core::kv::{HASH_SEED, TokensHash, path_hash};
use continuum_core::picker::BlockHash;

use crate::rng::{PreHashed, Rng};

/// Tokens per block (the workers' `kv_cache_block_size`).
pub(crate) const BLOCK_TOKENS: usize = 64;
/// Blocks of a `find_matches` query (an 8K-token prompt).
pub(crate) const QUERY_BLOCKS: usize = 128;
/// The vocabulary token ids are drawn from.
const VOCAB: u64 = 151_936;

/// The numbers of the trace (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct Shape {
    pub(crate) ranks: u32,
    pub(crate) dp: u32,
    pub(crate) shards: u32,
    pub(crate) conversations: u32,
    pub(crate) active: u32,
    pub(crate) rank_capacity: u32,
    pub(crate) seed: u64,
    pub(crate) sys_prompts: u32,
    pub(crate) sys_blocks: u32,
    pub(crate) first_user_blocks: u32,
    pub(crate) resp_blocks: u32,
    pub(crate) user_blocks: u32,
    pub(crate) max_turns: u32,
    pub(crate) sticky: f64,
    pub(crate) queries: u32,
    pub(crate) tail_envelopes: u32,
}

impl Shape {
    /// The longest prompt plus its response: a rank's cache must hold one request whole.
    pub(crate) fn longest_request(&self) -> u32 {
        self.sys_blocks
            + self.first_user_blocks
            + (self.max_turns - 1) * (self.resp_blocks + self.user_blocks)
            + self.resp_blocks
    }
}

/// One block: the engine's hash and the tokens' hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Block {
    pub(crate) engine: u64,
    pub(crate) tokens: u64,
}

/// One event; blocks and hashes live in the owning [`Events`]' arenas.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    /// `stored`: `Events::stored[start..start + len]` under `parent`.
    Store {
        parent: Option<u64>,
        start: u32,
        len: u32,
    },
    /// `removed`: `Events::removed[start..start + len]`.
    Remove { start: u32, len: u32 },
}

/// The events one rank emits for one engine step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Envelope {
    pub(crate) rank: u32,
    pub(crate) start: u32,
    pub(crate) len: u32,
}

/// A run of envelopes with their arenas.
#[derive(Debug, Default)]
pub(crate) struct Events {
    pub(crate) envelopes: Vec<Envelope>,
    pub(crate) ops: Vec<Op>,
    pub(crate) stored: Vec<Block>,
    pub(crate) removed: Vec<u64>,
}

impl Events {
    pub(crate) fn ops(&self, e: &Envelope) -> &[Op] {
        &self.ops[e.start as usize..(e.start + e.len) as usize]
    }

    pub(crate) fn stored(&self, start: u32, len: u32) -> &[Block] {
        &self.stored[start as usize..(start + len) as usize]
    }

    pub(crate) fn removed(&self, start: u32, len: u32) -> &[u64] {
        &self.removed[start as usize..(start + len) as usize]
    }

    /// Block events (stored blocks + removed hashes) of `envelopes`.
    pub(crate) fn block_events(&self, envelopes: &[Envelope]) -> (u64, u64) {
        let (mut s, mut r) = (0u64, 0u64);
        for e in envelopes {
            for op in self.ops(e) {
                match *op {
                    Op::Store { len, .. } => s += u64::from(len),
                    Op::Remove { len, .. } => r += u64::from(len),
                }
            }
        }
        (s, r)
    }

    fn push_op(&mut self, op: Op) {
        self.ops.push(op);
    }

    fn close_envelope(&mut self, rank: u32, first_op: usize) -> bool {
        let len = self.ops.len() - first_op;
        if len == 0 {
            return false;
        }
        self.envelopes.push(Envelope {
            rank,
            start: first_op as u32,
            len: len as u32,
        });
        true
    }
}

/// One `(worker, dp_rank)`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rank {
    pub(crate) worker_id: u64,
    pub(crate) dp_rank: u32,
    pub(crate) shard: u32,
}

/// A `find_matches` query and its exact answer.
#[derive(Debug)]
pub(crate) struct Query {
    pub(crate) blocks: Vec<Block>,
    /// `(rank, blocks held contiguously from the first)` for every rank holding the first block,
    /// by rank.
    pub(crate) truth: Vec<(u32, u32)>,
}

/// What one tail envelope makes visible: `rank` holds `path` whole once it is applied.
#[derive(Debug)]
pub(crate) struct Visible {
    pub(crate) rank: u32,
    pub(crate) path: Vec<Block>,
}

/// Figures about the trace, for the report.
#[derive(Debug, Default, Clone)]
pub(crate) struct Stats {
    pub(crate) requests: u64,
    pub(crate) conversations: u64,
    /// Whether any rank evicted during the main trace.
    pub(crate) evicted: bool,
    /// Whether the window starts at 98% full (else: at the middle of the trace).
    pub(crate) steady: bool,
    pub(crate) ownerships: u64,
    /// Distinct blocks summed over shards (a node per shard that holds it: our node count).
    pub(crate) shard_nodes: u64,
    /// Distinct blocks over the whole fleet.
    pub(crate) distinct: u64,
}

/// The whole generated input.
#[derive(Debug)]
pub(crate) struct Trace {
    pub(crate) shape: Shape,
    pub(crate) ranks: Vec<Rank>,
    pub(crate) main: Events,
    /// The first envelope of the measured window.
    pub(crate) split: usize,
    pub(crate) queries: Vec<Query>,
    pub(crate) tail: Events,
    /// One per tail envelope.
    pub(crate) visible: Vec<Visible>,
    pub(crate) stats: Stats,
    pub(crate) source: Source,
}

/// What ran, for the report's trace line.
#[derive(Debug, Clone)]
pub(crate) struct MooncakeInfo {
    pub(crate) path: String,
    /// Requests in the file.
    pub(crate) lines: usize,
    /// Requests replayed per copy.
    pub(crate) requests: usize,
    pub(crate) workers: u32,
    pub(crate) duplicate: u32,
    /// Served prompts (all copies) cut to the rank capacity.
    pub(crate) cut: u64,
    /// Router blocks of the longest replayed prompt before that cut.
    pub(crate) longest: u64,
}

/// Where the requests came from.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// [`generate`]d from the [`Shape`].
    Generated,
    /// Replayed from a Mooncake trace file.
    Mooncake(MooncakeInfo),
}

/// The ranks: `ranks / dp` workers of `dp` ranks each, with etcd-lease-like ids, each worker's
/// ranks on the shard `continuum_core::subscriptions::shard_of` gives its publisher.
pub(crate) fn ranks(ranks: u32, dp: u32, shards: u32, seed: u64) -> Vec<Rank> {
    (0..ranks)
        .map(|r| {
            let w = u64::from(r / dp);
            // 0x1a... like a lease id; never 0.
            let worker_id = (Rng::keyed(seed, 9, w, 0).next_u64() >> 8) | (1 << 52);
            let shard = continuum_core::subscriptions::shard_of(
                continuum_core::discovery::ids::PublisherId::new(worker_id),
                shards as usize,
            ) as u32;
            Rank {
                worker_id,
                dp_rank: r % dp,
                shard,
            }
        })
        .collect()
}

/// Generates the trace for `shape`.
pub(crate) fn generate(shape: &Shape) -> Trace {
    let ranks = ranks(shape.ranks, shape.dp, shape.shards, shape.seed);
    let mut g = Gen::new(shape, &ranks);
    let mut main = Events::default();
    let full = u64::from(shape.ranks) * u64::from(shape.rank_capacity) * 98 / 100;
    let mut split = None;
    while g.step(&mut main, None) {
        if split.is_none() && g.fleet.resident >= full {
            split = Some(main.envelopes.len());
        }
    }
    let steady = split.is_some();
    let split = split.unwrap_or(main.envelopes.len() / 2);
    let stats = Stats {
        requests: g.requests,
        conversations: g.started,
        evicted: g.fleet.evicted,
        steady,
        ownerships: g.fleet.resident,
        shard_nodes: g.fleet.distinct().0,
        distinct: g.fleet.distinct().1,
    };
    let queries = g.queries();
    let mut tail = Events::default();
    let mut visible = Vec::new();
    while visible.len() < shape.tail_envelopes as usize {
        g.open_more();
        g.step(&mut tail, Some(&mut visible));
    }
    Trace {
        shape: shape.clone(),
        ranks,
        main,
        split,
        queries,
        tail,
        visible,
        stats,
        source: Source::Generated,
    }
}

/// `tokens_hash` of one block, as Dynamo computes it.
pub(crate) fn tokens_hash(rng: &mut Rng) -> u64 {
    let mut bytes = [0u8; BLOCK_TOKENS * 4];
    for c in bytes.chunks_exact_mut(4) {
        c.copy_from_slice(&(rng.below(VOCAB) as u32).to_le_bytes());
    }
    xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, HASH_SEED)
}

/// The block after `parent` whose tokens come from `rng`.
pub(crate) fn next_block(parent: Option<u64>, rng: &mut Rng) -> Block {
    block_after(parent, tokens_hash(rng))
}

/// The block whose tokens hash to `tokens` after `parent`: its engine hash is the chained
/// sequence hash.
pub(crate) fn block_after(parent: Option<u64>, tokens: u64) -> Block {
    let engine = path_hash(parent.map(BlockHash), TokensHash(tokens)).0;
    Block { engine, tokens }
}

struct Conv {
    id: u64,
    sys: u32,
    turns: u32,
    done: u32,
    rank: u32,
    /// The conversation's own blocks (after the system prompt), generated as needed.
    blocks: Vec<Block>,
}

struct Gen<'a> {
    shape: &'a Shape,
    rng: Rng,
    sys: Vec<Vec<Block>>,
    open: Vec<Conv>,
    next_id: u64,
    started: u64,
    requests: u64,
    /// Further conversations may open (false once the main trace's budget is spent).
    more: bool,
    fleet: Fleet<'a>,
    path: Vec<Block>,
}

/// The ranks' caches and who owns what: serves requests into events (shared by the generated
/// and the Mooncake trace, so both emit events by the same rules).
pub(crate) struct Fleet<'a> {
    ranks: &'a [Rank],
    cap: usize,
    lrus: Vec<Lru>,
    pub(crate) resident: u64,
    pub(crate) evicted: bool,
    /// Owners per `(shard, block)` and per block.
    shard_owned: HashMap<(u32, u64), u32, PreHashed>,
    owned: HashMap<u64, u32, PreHashed>,
}

impl std::fmt::Debug for Fleet<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("ranks", &self.ranks.len())
            .field("resident", &self.resident)
            .finish_non_exhaustive()
    }
}

impl<'a> Gen<'a> {
    fn new(shape: &'a Shape, ranks: &'a [Rank]) -> Self {
        let sys = (0..shape.sys_prompts)
            .map(|s| {
                let mut v: Vec<Block> = Vec::with_capacity(shape.sys_blocks as usize);
                for i in 0..shape.sys_blocks {
                    let mut rng = Rng::keyed(shape.seed, 1, u64::from(s), u64::from(i));
                    v.push(next_block(v.last().map(|b| b.engine), &mut rng));
                }
                v
            })
            .collect();
        let mut g = Gen {
            shape,
            rng: Rng::new(shape.seed),
            sys,
            open: Vec::new(),
            next_id: 0,
            started: 0,
            requests: 0,
            more: true,
            fleet: Fleet::new(ranks, shape.rank_capacity),
            path: Vec::new(),
        };
        for _ in 0..shape.active.min(shape.conversations) {
            let c = g.new_conv();
            g.open.push(c);
        }
        g
    }

    fn new_conv(&mut self) -> Conv {
        let id = self.next_id;
        self.next_id += 1;
        self.started += 1;
        Conv {
            id,
            sys: self.rng.below(u64::from(self.shape.sys_prompts)) as u32,
            turns: 1 + self.rng.below(u64::from(self.shape.max_turns)) as u32,
            done: 0,
            rank: 0,
            blocks: Vec::new(),
        }
    }

    /// Past the main trace: conversations keep opening.
    fn open_more(&mut self) {
        self.more = true;
        while self.open.len() < self.shape.active as usize {
            let c = self.new_conv();
            self.open.push(c);
        }
    }

    /// Serves one request; false once the main trace's conversation budget is spent.
    fn step(&mut self, out: &mut Events, visible: Option<&mut Vec<Visible>>) -> bool {
        if self.open.is_empty() {
            return false;
        }
        let shape = self.shape;
        let slot = self.rng.below(self.open.len() as u64) as usize;
        let rank = {
            let sticky = self.open[slot].done > 0 && self.rng.chance(shape.sticky);
            if sticky {
                self.open[slot].rank
            } else {
                self.rng.below(u64::from(shape.ranks)) as u32
            }
        };
        let (prompt_conv, resp) = {
            let c = &self.open[slot];
            let p = shape.first_user_blocks + c.done * (shape.resp_blocks + shape.user_blocks);
            (p as usize, shape.resp_blocks as usize)
        };
        self.extend_conv(slot, prompt_conv + resp);
        let mut path = std::mem::take(&mut self.path);
        path.clear();
        let c = &self.open[slot];
        path.extend_from_slice(&self.sys[c.sys as usize]);
        path.extend_from_slice(&c.blocks[..prompt_conv + resp]);
        let prompt = path.len() - resp;
        self.fleet.serve(rank, &path, prompt, out, visible);
        self.path = path;
        self.requests += 1;
        let c = &mut self.open[slot];
        c.rank = rank;
        c.done += 1;
        if c.done == c.turns {
            if self.more && self.started < u64::from(shape.conversations) {
                self.open[slot] = self.new_conv();
            } else if self.more {
                // The main trace ends here, with its open conversations left open.
                self.more = false;
                self.open.swap_remove(slot);
                return false;
            } else {
                self.open.swap_remove(slot);
            }
        }
        true
    }

    fn extend_conv(&mut self, slot: usize, len: usize) {
        let seed = self.shape.seed;
        let parent0 = {
            let c = &self.open[slot];
            self.sys[c.sys as usize].last().map(|b| b.engine)
        };
        let c = &mut self.open[slot];
        while c.blocks.len() < len {
            let i = c.blocks.len() as u64;
            let mut rng = Rng::keyed(seed, 2, c.id, i);
            let parent = c.blocks.last().map(|b| b.engine).or(parent0);
            c.blocks.push(next_block(parent, &mut rng));
        }
    }

    /// `queries` prompts of `QUERY_BLOCKS` blocks: three in four the first blocks of an open
    /// conversation (its turn-1 prompt), one in four a new conversation (its system prompt only
    /// is anywhere), each with its exact answer.
    fn queries(&mut self) -> Vec<Query> {
        let shape = self.shape;
        let mut truth = self.fleet.truth();
        let mut out = Vec::with_capacity(shape.queries as usize);
        let user = QUERY_BLOCKS - shape.sys_blocks as usize;
        for q in 0..shape.queries {
            let mut blocks: Vec<Block> = Vec::with_capacity(QUERY_BLOCKS);
            if q % 4 == 3 || self.open.is_empty() {
                let sys = self.rng.below(u64::from(shape.sys_prompts)) as usize;
                blocks.extend_from_slice(&self.sys[sys]);
                for i in 0..user {
                    let mut rng = Rng::keyed(shape.seed, 3, u64::from(q), i as u64);
                    let parent = blocks.last().map(|b| b.engine);
                    blocks.push(next_block(parent, &mut rng));
                }
            } else {
                let slot = self.rng.below(self.open.len() as u64) as usize;
                self.extend_conv(slot, user);
                let c = &self.open[slot];
                blocks.extend_from_slice(&self.sys[c.sys as usize]);
                blocks.extend_from_slice(&c.blocks[..user]);
            }
            let truth = truth.answer(&blocks);
            out.push(Query { blocks, truth });
        }
        out
    }
}

impl<'a> Fleet<'a> {
    /// Every rank empty, each holding at most `cap` blocks.
    pub(crate) fn new(ranks: &'a [Rank], cap: u32) -> Self {
        Fleet {
            ranks,
            cap: cap as usize,
            lrus: (0..ranks.len()).map(|_| Lru::new(cap)).collect(),
            resident: 0,
            evicted: false,
            shard_owned: HashMap::with_hasher(PreHashed),
            owned: HashMap::with_hasher(PreHashed),
        }
    }

    /// Distinct blocks summed over shards, and over the fleet.
    pub(crate) fn distinct(&self) -> (u64, u64) {
        (self.shard_owned.len() as u64, self.owned.len() as u64)
    }

    /// Rank `rank` serves `path[..prompt]` and decodes `path[prompt..]`.
    pub(crate) fn serve(
        &mut self,
        rank: u32,
        path: &[Block],
        prompt: usize,
        out: &mut Events,
        mut visible: Option<&mut Vec<Visible>>,
    ) {
        let cap = self.cap;
        let first_op = out.ops.len();
        let held = {
            let lru = &self.lrus[rank as usize];
            path[..prompt]
                .iter()
                .take_while(|b| lru.contains(b.engine))
                .count()
        };
        for b in path[..held].iter().rev() {
            self.lrus[rank as usize].touch(b.engine);
        }
        let need = prompt - held;
        if need > 0 {
            self.evict(
                rank,
                (self.lrus[rank as usize].len() + need).saturating_sub(cap),
                out,
            );
            let start = out.stored.len() as u32;
            for i in held..prompt {
                let parent = i.checked_sub(1).map(|p| path[p].engine);
                self.insert(rank, parent, path[i].engine);
                out.stored.push(path[i]);
            }
            out.push_op(Op::Store {
                parent: held.checked_sub(1).map(|p| path[p].engine),
                start,
                len: need as u32,
            });
        }
        if out.close_envelope(rank, first_op)
            && let Some(v) = visible.as_deref_mut()
        {
            v.push(Visible {
                rank,
                path: path[..prompt].to_vec(),
            });
        }
        for i in prompt..path.len() {
            let first_op = out.ops.len();
            let b = path[i];
            if self.lrus[rank as usize].contains(b.engine) {
                continue;
            }
            let over = (self.lrus[rank as usize].len() + 1).saturating_sub(cap);
            self.evict(rank, over, out);
            self.insert(rank, Some(path[i - 1].engine), b.engine);
            let start = out.stored.len() as u32;
            out.stored.push(b);
            out.push_op(Op::Store {
                parent: Some(path[i - 1].engine),
                start,
                len: 1,
            });
            out.close_envelope(rank, first_op);
            if let Some(v) = visible.as_deref_mut() {
                v.push(Visible {
                    rank,
                    path: path[..=i].to_vec(),
                });
            }
        }
    }

    fn evict(&mut self, rank: u32, n: usize, out: &mut Events) {
        if n == 0 {
            return;
        }
        self.evicted = true;
        let start = out.removed.len() as u32;
        for _ in 0..n {
            let Some(h) = self.lrus[rank as usize].pop_lru() else {
                break;
            };
            out.removed.push(h);
            self.disown(rank, h);
        }
        let len = out.removed.len() as u32 - start;
        if len > 0 {
            out.push_op(Op::Remove { start, len });
        }
    }

    fn insert(&mut self, rank: u32, parent: Option<u64>, h: u64) {
        self.lrus[rank as usize].insert_behind(parent, h);
        self.resident += 1;
        let shard = self.ranks[rank as usize].shard;
        *self.shard_owned.entry((shard, h)).or_insert(0) += 1;
        *self.owned.entry(h).or_insert(0) += 1;
    }

    fn disown(&mut self, rank: u32, h: u64) {
        self.resident -= 1;
        let shard = self.ranks[rank as usize].shard;
        dec(&mut self.shard_owned, &(shard, h));
        dec(&mut self.owned, &h);
    }

    /// The exact-answer oracle of the current state.
    pub(crate) fn truth(&self) -> Truth {
        let mut holders: HashMap<u64, Vec<u32>, PreHashed> = HashMap::with_hasher(PreHashed);
        for (r, lru) in self.lrus.iter().enumerate() {
            for h in lru.hashes() {
                holders.entry(h).or_default().push(r as u32);
            }
        }
        Truth {
            holders,
            depth: vec![0; self.lrus.len()],
            touched: Vec::new(),
        }
    }
}

/// Which ranks hold each block (a snapshot of a [`Fleet`]), to answer queries exactly.
#[derive(Debug)]
pub(crate) struct Truth {
    holders: HashMap<u64, Vec<u32>, PreHashed>,
    depth: Vec<u32>,
    touched: Vec<u32>,
}

impl Truth {
    /// `(rank, blocks held contiguously from the first)` for every rank holding `blocks[0]`, by
    /// rank.
    pub(crate) fn answer(&mut self, blocks: &[Block]) -> Vec<(u32, u32)> {
        let (depth, touched) = (&mut self.depth, &mut self.touched);
        for (i, b) in blocks.iter().enumerate() {
            let Some(hs) = self.holders.get(&b.engine) else {
                break;
            };
            let mut any = false;
            for &r in hs {
                let d = &mut depth[r as usize];
                if *d as usize == i {
                    if i == 0 {
                        touched.push(r);
                    }
                    *d += 1;
                    any = true;
                }
            }
            if !any {
                break;
            }
        }
        touched.sort_unstable();
        let truth = touched.iter().map(|&r| (r, depth[r as usize])).collect();
        for &r in touched.iter() {
            depth[r as usize] = 0;
        }
        touched.clear();
        truth
    }
}

/// Decrements `k`'s count, removing it at zero.
fn dec<K: std::hash::Hash + Eq>(m: &mut HashMap<K, u32, PreHashed>, k: &K) {
    match m.get_mut(k) {
        Some(c) if *c > 1 => *c -= 1,
        Some(_) => {
            m.remove(k);
        }
        None => {}
    }
}

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Slot {
    hash: u64,
    /// Towards the most recent end.
    newer: u32,
    /// Towards the least recent end.
    older: u32,
}

/// One rank's cache: an intrusive recency list over a slab, indexed by block hash.
struct Lru {
    cap: usize,
    map: HashMap<u64, u32, PreHashed>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    newest: u32,
    oldest: u32,
}

impl Lru {
    fn new(cap: u32) -> Self {
        Self {
            cap: cap as usize,
            map: HashMap::with_hasher(PreHashed),
            slots: Vec::new(),
            free: Vec::new(),
            newest: NIL,
            oldest: NIL,
        }
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    fn contains(&self, h: u64) -> bool {
        self.map.contains_key(&h)
    }

    fn hashes(&self) -> impl Iterator<Item = u64> + '_ {
        self.map.keys().copied()
    }

    fn unlink(&mut self, i: u32) {
        let Slot { newer, older, .. } = self.slots[i as usize];
        if newer == NIL {
            self.newest = older;
        } else {
            self.slots[newer as usize].older = older;
        }
        if older == NIL {
            self.oldest = newer;
        } else {
            self.slots[older as usize].newer = newer;
        }
    }

    /// Links `i` just older than `at` (`NIL`: as the newest).
    fn link_behind(&mut self, i: u32, at: u32) {
        let older = if at == NIL {
            self.newest
        } else {
            self.slots[at as usize].older
        };
        self.slots[i as usize].newer = at;
        self.slots[i as usize].older = older;
        if at == NIL {
            self.newest = i;
        } else {
            self.slots[at as usize].older = i;
        }
        if older == NIL {
            self.oldest = i;
        } else {
            self.slots[older as usize].newer = i;
        }
    }

    fn touch(&mut self, h: u64) {
        if let Some(&i) = self.map.get(&h) {
            self.unlink(i);
            self.link_behind(i, NIL);
        }
    }

    /// Adds `h` just older than `parent` (the newest without a parent).
    fn insert_behind(&mut self, parent: Option<u64>, h: u64) {
        debug_assert!(self.map.len() < self.cap, "room is made before inserting");
        let at = parent
            .and_then(|p| self.map.get(&p).copied())
            .unwrap_or(NIL);
        let slot = Slot {
            hash: h,
            newer: NIL,
            older: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        self.link_behind(i, at);
        self.map.insert(h, i);
    }

    fn pop_lru(&mut self) -> Option<u64> {
        let i = self.oldest;
        if i == NIL {
            return None;
        }
        self.unlink(i);
        self.free.push(i);
        let h = self.slots[i as usize].hash;
        self.map.remove(&h);
        Some(h)
    }
}

/// The exact answer by brute force: per rank (its held engine hashes), how many of the prompt's
/// first blocks it holds contiguously; ranks holding none left out. The reference the trace
/// tests check `Query::truth` against.
#[cfg(test)]
pub(crate) fn naive_truth(
    held: &[std::collections::HashSet<u64>],
    blocks: &[Block],
) -> Vec<(u32, u32)> {
    held.iter()
        .enumerate()
        .filter_map(|(r, s)| {
            let d = blocks.iter().take_while(|b| s.contains(&b.engine)).count();
            (d > 0).then_some((r as u32, d as u32))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Shape {
        Shape {
            ranks: 8,
            dp: 2,
            shards: 2,
            conversations: 200,
            active: 16,
            rank_capacity: 400,
            seed: 3,
            sys_prompts: 2,
            sys_blocks: 4,
            first_user_blocks: 12,
            resp_blocks: 2,
            user_blocks: 2,
            max_turns: 3,
            sticky: 0.8,
            queries: 40,
            tail_envelopes: 30,
        }
    }

    #[test]
    fn lru_evicts_leaves_first() {
        let mut l = Lru::new(3);
        l.insert_behind(None, 1);
        l.insert_behind(Some(1), 2);
        l.insert_behind(Some(2), 3);
        // 3 is a leaf and the oldest; touching the path root-last keeps it so.
        l.touch(3);
        l.touch(2);
        l.touch(1);
        assert_eq!(l.pop_lru(), Some(3));
        assert_eq!(l.pop_lru(), Some(2));
        assert_eq!(l.pop_lru(), Some(1));
        assert_eq!(l.pop_lru(), None);
    }

    /// Replaying the events into a plain per-rank set gives back the LRU states: every `stored`
    /// has its parent, every `removed` hash is held, and the truth of each query is that state's.
    #[test]
    fn events_replay_to_the_generator_state() {
        let t = generate(&small());
        assert!(t.stats.evicted);
        let mut held: Vec<std::collections::HashSet<u64>> = vec![Default::default(); 8];
        for e in &t.main.envelopes {
            for op in t.main.ops(e) {
                let set = &mut held[e.rank as usize];
                match *op {
                    Op::Store { parent, start, len } => {
                        if let Some(p) = parent {
                            assert!(set.contains(&p), "parent held");
                        }
                        for b in t.main.stored(start, len) {
                            assert!(set.insert(b.engine), "not stored twice");
                        }
                    }
                    Op::Remove { start, len } => {
                        for h in t.main.removed(start, len) {
                            assert!(set.remove(h), "removed hash held");
                        }
                    }
                }
            }
        }
        for s in &held {
            assert!(s.len() <= 400);
        }
        assert_eq!(
            held.iter().map(|s| s.len() as u64).sum::<u64>(),
            t.stats.ownerships
        );
        for q in &t.queries {
            assert_eq!(q.blocks.len(), QUERY_BLOCKS);
            assert_eq!(q.truth, naive_truth(&held, &q.blocks));
        }
        assert!(t.visible.len() >= 30);
        assert_eq!(t.visible.len(), t.tail.envelopes.len());
    }

    #[test]
    fn same_seed_same_trace() {
        let (a, b) = (generate(&small()), generate(&small()));
        assert_eq!(a.main.stored, b.main.stored);
        assert_eq!(a.main.removed, b.main.removed);
        assert_eq!(a.split, b.split);
    }
}
