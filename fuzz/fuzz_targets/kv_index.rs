//! Fuzz the KV-overlap index (`kv::index::IndexWriter` and `kv::shared::IndexReader`): two shard
//! indexes on one small shared `Budget`, driven by a sequence of ops read from the input.
//!
//! Input layout: 2 bytes of caps (blocks per rank 1..=8, owners per node 1..=4, budget nodes
//! 1..=16, budget ownerships 1..=32; with bit 5 of the first byte set, a *wide* input: 160 ranks
//! instead of 6 and caps and budgets scaled up, so an index holds more than 64 ranks and owner
//! sets spill past one bitset word), then ops, each an op byte and its operands:
//! `store rank parent n tokens… hashes…`, `remove rank n hashes…`, `clear rank`,
//! `prefetch rank parent n hashes…` (the batch hint), `find rank-set len tokens…`. Engine hashes come from a space of 16 values so re-stores,
//! reused hashes, two hashes on one node, unknown parents and unknown removals are all common.
//!
//! Asserts, beyond "does not panic":
//! - the budget's counts are the sum of the two indexes' and never exceed its limits;
//! - an index's ownerships are the sum of its ranks' blocks, each within the per-rank cap;
//! - a store applies and refuses at most its blocks, and nothing with `parent_missing`;
//! - a prefetch changes nothing (the budget, the ranks' blocks);
//! - `find_matches` visits a rank at most once, with 1..=prompt length blocks, never more than
//!   the rank holds (writes are visible as made), and only ranks of the index read.
#![no_main]

use std::collections::BTreeMap;
use std::sync::Arc;

use continuum_core::discovery::InstanceId;
use continuum_core::kv::budget::Budget;
use continuum_core::kv::index::{Caps, IndexWriter, Upcoming, new_index_with_caps};
use continuum_core::kv::shared::IndexReader;
use continuum_core::kv::{EngineHash, StoredBlock, TokensHash, path_hash};
use continuum_core::load::LoadKey;
use continuum_core::picker::BlockHash;
use libfuzzer_sys::fuzz_target;

/// Ranks of a narrow input (every owner set fits one 64-slot word).
const RANKS: u32 = 6;
/// Ranks of a wide input: 80 per index, so owner sets spill past one word.
const WIDE_RANKS: u32 = 160;

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn next(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }
}

fn rank(b: u8, ranks: u32) -> LoadKey {
    let r = u32::from(b) % ranks;
    LoadKey::new(InstanceId::new(u64::from(r % 3)), r)
}

/// Ranks live in index `dp_rank % 2`.
fn shard(k: LoadKey) -> usize {
    (k.dp_rank % 2) as usize
}

struct Rig {
    budget: Arc<Budget>,
    caps: Caps,
    writers: [IndexWriter; 2],
    readers: [IndexReader; 2],
}

impl Rig {
    fn check(&self) {
        let b = &self.budget;
        let (n, o) = (
            self.writers[0].nodes() + self.writers[1].nodes(),
            self.writers[0].ownerships() + self.writers[1].ownerships(),
        );
        assert_eq!(
            (b.nodes(), b.ownerships()),
            (n, o),
            "budget = sum of the indexes"
        );
        assert!(
            n <= b.node_limit() && o <= b.ownership_limit(),
            "budget over its limits"
        );
        for w in &self.writers {
            let mut sum = 0;
            for (k, blocks) in w.ranks() {
                assert!(
                    blocks >= 1 && blocks <= self.caps.blocks_per_rank,
                    "{k:?}: {blocks}"
                );
                assert_eq!(w.rank_blocks(k), blocks);
                sum += blocks;
            }
            assert_eq!(sum, w.ownerships());
            assert!(w.nodes() <= w.ownerships());
        }
    }
}

fn path(tokens: &[u64]) -> Vec<BlockHash> {
    let mut parent = None;
    tokens
        .iter()
        .map(|t| {
            let h = path_hash(parent, TokensHash(*t));
            parent = Some(h);
            h
        })
        .collect()
}

/// Up to `n` engine hashes from the next bytes (16 distinct values, so events collide).
fn engine_hashes(input: &mut Bytes<'_>, n: u8) -> Vec<EngineHash> {
    (0..n)
        .filter_map(|_| input.next())
        .map(|b| EngineHash(u64::from(b % 16)))
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let mut input = Bytes(data);
    let (Some(c0), Some(c1)) = (input.next(), input.next()) else {
        return;
    };
    // Bit 5 of the first byte: a wide input (many ranks per index, big budgets).
    let wide = c0 & 0x20 != 0;
    let (ranks, scale) = if wide { (WIDE_RANKS, 16) } else { (RANKS, 1) };
    let caps = Caps {
        blocks_per_rank: 1 + usize::from(c0 % 8),
        owners_per_node: 1 + usize::from((c0 >> 3) % 4) * if wide { 40 } else { 1 },
    };
    let budget = Arc::new(Budget::with_limits(
        (1 + usize::from(c1 % 16)) * scale,
        1 + usize::from((c1 >> 4) * 2) * scale,
    ));
    let (w0, r0) = new_index_with_caps(Arc::clone(&budget), caps);
    let (w1, r1) = new_index_with_caps(Arc::clone(&budget), caps);
    let mut rig = Rig {
        budget,
        caps,
        writers: [w0, w1],
        readers: [r0.handle(), r1.handle()],
    };
    while let Some(op) = input.next() {
        match op % 5 {
            0 => {
                let (Some(r), Some(p), Some(n)) = (input.next(), input.next(), input.next()) else {
                    break;
                };
                let k = rank(r, ranks);
                let parent = (p % 3 != 0).then(|| EngineHash(u64::from(p % 16)));
                let n = usize::from(n % 7);
                let mut blocks = Vec::with_capacity(n);
                for _ in 0..n {
                    let Some(b) = input.next() else { break };
                    blocks.push(StoredBlock {
                        block_hash: EngineHash(u64::from(b % 16)),
                        tokens_hash: TokensHash(u64::from(b >> 6)),
                    });
                }
                let before = rig.writers[shard(k)].rank_blocks(k);
                let res = rig.writers[shard(k)].store(k, parent, &blocks);
                let total = res.applied as usize + res.over_capacity as usize;
                assert!(total <= blocks.len(), "{res:?} for {} blocks", blocks.len());
                if res.parent_missing {
                    assert_eq!(total, 0, "{res:?}");
                    assert_eq!(rig.writers[shard(k)].rank_blocks(k), before);
                } else {
                    assert_eq!(total, blocks.len(), "{res:?}");
                }
            }
            1 => {
                let (Some(r), Some(n)) = (input.next(), input.next()) else {
                    break;
                };
                let k = rank(r, ranks);
                let hashes = engine_hashes(&mut input, n % 5);
                let before = rig.writers[shard(k)].rank_blocks(k);
                let gone = rig.writers[shard(k)].remove(k, &hashes) as usize;
                assert!(gone <= hashes.len());
                assert_eq!(rig.writers[shard(k)].rank_blocks(k), before - gone);
            }
            2 => {
                let Some(r) = input.next() else { break };
                let k = rank(r, ranks);
                let before = rig.writers[shard(k)].rank_blocks(k);
                assert_eq!(rig.writers[shard(k)].clear_rank(k) as usize, before);
                assert_eq!(rig.writers[shard(k)].rank_blocks(k), 0);
            }
            3 => {
                let (Some(r), Some(p), Some(n)) = (input.next(), input.next(), input.next()) else {
                    break;
                };
                let k = rank(r, ranks);
                let hashes = engine_hashes(&mut input, n % 9);
                let blocks: Vec<StoredBlock> = hashes
                    .iter()
                    .map(|&h| StoredBlock {
                        block_hash: h,
                        tokens_hash: TokensHash(h.0 >> 2),
                    })
                    .collect();
                let parent = (p % 3 != 0).then(|| EngineHash(u64::from(p % 16)));
                let w = &rig.writers[shard(k)];
                let before: BTreeMap<LoadKey, usize> = w.ranks().collect();
                let (nodes, owns) = (rig.budget.nodes(), rig.budget.ownerships());
                w.prefetch(
                    [
                        Upcoming::Remove { rank: k, hashes: &hashes },
                        Upcoming::Store { rank: k, parent, blocks: &blocks },
                    ]
                    .into_iter(),
                );
                let after: BTreeMap<LoadKey, usize> = w.ranks().collect();
                assert_eq!(before, after, "a prefetch changed the ranks");
                assert_eq!((nodes, owns), (rig.budget.nodes(), rig.budget.ownerships()));
            }
            _ => {
                let Some(len) = input.next() else { break };
                let tokens: Vec<u64> = (0..len % 8)
                    .filter_map(|_| input.next())
                    .map(|b| u64::from(b % 4))
                    .collect();
                let hashes = path(&tokens);
                for (s, (r, w)) in rig.readers.iter().zip(&rig.writers).enumerate() {
                    let held: BTreeMap<LoadKey, usize> = w.ranks().collect();
                    let mut seen = BTreeMap::new();
                    r.find_matches(&hashes, &mut |k, n| {
                        assert!(seen.insert(k, n).is_none(), "{k:?} visited twice");
                        assert_eq!(shard(k), s, "{k:?} read from another index");
                        assert!(n >= 1 && n as usize <= hashes.len(), "{k:?}: {n}");
                        let had = held.get(&k).copied().unwrap_or(0);
                        assert!(n as usize <= had, "{k:?}: {n} blocks, held {had}");
                    });
                }
            }
        }
        rig.check();
    }
});
