//! Unit tests of [`super::index`] and the match walk of [`super::shared`]: one test per rule of
//! KV-IDX-06/07/08, each cap exactly at and one over.

use std::sync::Arc;

use super::budget::Budget;
use super::index::{Caps, IndexWriter, StoreResult, Upcoming, new_index, new_index_with_caps};
use super::shared::{IndexReader, IndexReaders, Merged};
use super::test_support::{blocks, eh, expect, key, matches, matches_of, prompt};
use super::{
    EngineHash, MAX_BLOCKS_PER_RANK, MAX_INDEX_BLOCKS, MAX_INDEX_OWNERSHIPS, MAX_OWNERS_PER_NODE,
    StoredBlock, TokensHash,
};
use crate::picker::{OverlapSource, PromptBlocks};

const A: &[u64] = &[11, 12, 13, 14, 15, 16];
const B: &[u64] = &[11, 12, 23, 24];
const C: &[u64] = &[31, 32, 33];

fn index(caps: Caps, nodes: usize, ownerships: usize) -> (IndexWriter, IndexReader, Arc<Budget>) {
    let budget = Arc::new(Budget::with_limits(nodes, ownerships));
    let (w, r) = new_index_with_caps(Arc::clone(&budget), caps);
    (w, r.handle(), budget)
}

fn roomy() -> (IndexWriter, IndexReader, Arc<Budget>) {
    index(Caps::DEFAULT, 1 << 20, 1 << 20)
}

fn applied(n: u32) -> StoreResult {
    StoreResult {
        applied: n,
        ..StoreResult::default()
    }
}

fn over(applied: u32, over: u32) -> StoreResult {
    StoreResult {
        applied,
        over_capacity: over,
        parent_missing: false,
    }
}

#[test]
fn contiguous_prefix_per_rank() {
    let (mut w, r, _) = roomy();
    let (ra, rb) = (key(1, 0), key(2, 0));
    assert!(matches(&r, &prompt(A)).is_empty(), "nothing stored yet");
    assert_eq!(w.store(ra, None, &blocks(A, 0, 1)), applied(6));
    assert_eq!(w.store(rb, None, &blocks(B, 0, 2)), applied(4));
    assert_eq!(matches(&r, &prompt(A)), expect(&[(ra, 6), (rb, 2)]));
    assert_eq!(matches(&r, &prompt(B)), expect(&[(ra, 2), (rb, 4)]));
    assert_eq!(matches(&r, &prompt(&A[..3])), expect(&[(ra, 3), (rb, 2)]));
    assert!(matches(&r, &prompt(C)).is_empty());
    assert!(matches(&r, &[]).is_empty());
    // A prompt that diverges after one block, and one longer than anything held.
    assert_eq!(matches(&r, &prompt(&[11, 99])), expect(&[(ra, 1), (rb, 1)]));
    let long: Vec<u64> = A.iter().copied().chain([17, 18]).collect();
    assert_eq!(matches(&r, &prompt(&long)), expect(&[(ra, 6), (rb, 2)]));
    assert_eq!((w.nodes(), w.ownerships()), (8, 10));

    // Each write is visible as soon as it is made.
    for round in 0..4u32 {
        let salt = 100 + u64::from(round);
        let rc = key(3, round);
        assert_eq!(matches(&r, &prompt(C)).len(), round as usize);
        w.store(rc, None, &blocks(C, 0, salt));
        assert_eq!(matches(&r, &prompt(C)).len(), round as usize + 1);
        assert_eq!(matches(&r, &prompt(A)), expect(&[(ra, 6), (rb, 2)]));
    }
}

#[test]
fn a_stored_chain_hangs_under_its_parent() {
    let (mut w, r, _) = roomy();
    let ra = key(1, 0);
    assert_eq!(w.store(ra, None, &blocks(&A[..2], 0, 1)), applied(2));
    assert_eq!(w.store(ra, Some(eh(A, 1, 1)), &blocks(A, 2, 1)), applied(4));
    assert_eq!(matches(&r, &prompt(A)), expect(&[(ra, 6)]));
    assert_eq!(w.rank_blocks(ra), 6);
}

#[test]
fn an_unknown_parent_applies_nothing() {
    let (mut w, r, b) = roomy();
    let (ra, rb) = (key(1, 0), key(2, 0));
    let missing = StoreResult {
        parent_missing: true,
        ..StoreResult::default()
    };
    // A rank never seen, and a parent only another rank holds.
    assert_eq!(w.store(ra, Some(EngineHash(7)), &blocks(A, 1, 1)), missing);
    w.store(rb, None, &blocks(A, 0, 2));
    assert_eq!(w.store(ra, Some(eh(A, 0, 2)), &blocks(A, 1, 1)), missing);
    w.store(ra, None, &blocks(C, 0, 1));
    assert_eq!(w.store(ra, Some(eh(A, 0, 1)), &blocks(A, 1, 1)), missing);
    assert_eq!(w.rank_blocks(ra), 3);
    assert_eq!(matches(&r, &prompt(A)), expect(&[(rb, 6)]));
    assert_eq!((b.nodes(), b.ownerships()), (9, 9));
}

#[test]
fn two_engine_hashes_on_one_node_are_reference_counted() {
    let (mut w, r, b) = roomy();
    let ra = key(1, 0);
    w.store(ra, None, &blocks(&A[..2], 0, 1));
    // The same path under other engine hashes (e.g. another engine-side salt).
    w.store(ra, None, &blocks(&A[..2], 0, 2));
    assert_eq!(w.rank_blocks(ra), 4);
    assert_eq!((w.nodes(), w.ownerships()), (2, 4));
    assert_eq!((b.nodes(), b.ownerships()), (2, 4));
    assert_eq!(w.remove(ra, &[eh(A, 1, 1), eh(A, 0, 2)]), 2);
    assert_eq!(
        matches(&r, &prompt(A)),
        expect(&[(ra, 2)]),
        "one ref left on each"
    );
    assert_eq!(w.remove(ra, &[eh(A, 1, 2)]), 1);
    assert_eq!(matches(&r, &prompt(A)), expect(&[(ra, 1)]));
    assert_eq!((w.nodes(), w.ownerships()), (1, 1));
    assert_eq!(w.remove(ra, &[eh(A, 0, 1), eh(A, 0, 1), EngineHash(5)]), 1);
    assert!(matches(&r, &prompt(A)).is_empty());
    assert_eq!((w.nodes(), w.ownerships(), w.ranks().count()), (0, 0, 0));
    assert_eq!((b.nodes(), b.ownerships()), (0, 0));
}

#[test]
fn removing_a_shared_node_keeps_the_other_ranks_match() {
    let (mut w, r, _) = roomy();
    let (ra, rb) = (key(1, 0), key(1, 1));
    w.store(ra, None, &blocks(A, 0, 1));
    w.store(rb, None, &blocks(A, 0, 2));
    assert_eq!(w.nodes(), 6);
    assert_eq!(w.remove(ra, &[eh(A, 3, 1)]), 1);
    // ra keeps blocks 0..3 and 4..6 but matches contiguously only 3.
    assert_eq!(matches(&r, &prompt(A)), expect(&[(ra, 3), (rb, 6)]));
    assert_eq!(w.nodes(), 6, "rb still owns block 3");
    assert_eq!(w.remove(rb, &[eh(A, 0, 2)]), 1);
    assert_eq!(
        matches(&r, &prompt(A)),
        expect(&[(ra, 3)]),
        "rb lost its first block"
    );
    assert_eq!(w.remove(rb, &[eh(A, 3, 2)]), 1);
    assert_eq!(w.nodes(), 5);
}

#[test]
fn restoring_a_held_block_is_a_no_op_and_a_reused_engine_hash_moves() {
    let (mut w, r, b) = roomy();
    let ra = key(1, 0);
    w.store(ra, None, &blocks(A, 0, 1));
    assert_eq!(w.store(ra, None, &blocks(A, 0, 1)), applied(6));
    assert_eq!((w.rank_blocks(ra), w.nodes(), b.ownerships()), (6, 6, 6));
    // The engine reuses the hash of A's first block for C's first block.
    let reused = [StoredBlock {
        block_hash: eh(A, 0, 1),
        tokens_hash: TokensHash(C[0]),
    }];
    assert_eq!(w.store(ra, None, &reused), applied(1));
    assert!(
        matches(&r, &prompt(A)).is_empty(),
        "A's first block is gone"
    );
    assert_eq!(matches(&r, &prompt(C)), expect(&[(ra, 1)]));
    assert_eq!((w.rank_blocks(ra), w.nodes(), b.nodes()), (6, 6, 6));
}

#[test]
fn clear_rank_clears_only_that_rank() {
    let (mut w, r, b) = roomy();
    let (ra, rb) = (key(1, 0), key(2, 0));
    w.store(ra, None, &blocks(A, 0, 1));
    w.store(ra, None, &blocks(A, 0, 9));
    w.store(rb, None, &blocks(B, 0, 2));
    assert_eq!(w.clear_rank(ra), 12);
    assert_eq!(w.clear_rank(ra), 0);
    assert_eq!(w.clear_rank(key(9, 9)), 0);
    assert_eq!(matches(&r, &prompt(A)), expect(&[(rb, 2)]));
    assert_eq!((w.nodes(), w.ownerships()), (4, 4));
    assert_eq!((b.nodes(), b.ownerships()), (4, 4));
    let ranks: Vec<_> = w.ranks().collect();
    assert_eq!(ranks, vec![(rb, 4)]);
}

#[test]
fn blocks_per_rank_cap_at_and_one_over() {
    let caps = Caps {
        blocks_per_rank: 3,
        owners_per_node: 8,
    };
    let (mut w, r, b) = index(caps, 100, 100);
    let (ra, rb) = (key(1, 0), key(2, 0));
    assert_eq!(w.store(ra, None, &blocks(&A[..3], 0, 1)), applied(3));
    assert_eq!(w.store(ra, Some(eh(A, 2, 1)), &blocks(A, 3, 1)), over(0, 3));
    // Re-storing held blocks needs no room.
    assert_eq!(w.store(ra, None, &blocks(&A[..3], 0, 1)), applied(3));
    assert_eq!(w.store(rb, None, &blocks(A, 0, 2)), over(3, 3));
    assert_eq!(matches(&r, &prompt(A)), expect(&[(ra, 3), (rb, 3)]));
    assert_eq!((b.nodes(), b.ownerships()), (3, 6));
    assert_eq!(w.remove(ra, &[eh(A, 2, 1)]), 1);
    assert_eq!(
        w.store(ra, None, &blocks(C, 0, 1)),
        over(1, 2),
        "room for one"
    );
}

#[test]
fn owners_per_node_cap_at_and_one_over() {
    let caps = Caps {
        blocks_per_rank: 100,
        owners_per_node: 2,
    };
    let (mut w, r, b) = index(caps, 100, 100);
    let (ra, rb, rc) = (key(1, 0), key(2, 0), key(3, 0));
    assert_eq!(w.store(ra, None, &blocks(A, 0, 1)), applied(6));
    assert_eq!(w.store(rb, None, &blocks(&A[..2], 0, 2)), applied(2));
    // The first block is full: the whole chain is refused, even blocks with room.
    assert_eq!(w.store(rc, None, &blocks(A, 0, 3)), over(0, 6));
    assert_eq!(w.rank_blocks(rc), 0);
    assert_eq!(w.ranks().count(), 2, "a refused rank is not kept");
    // A second engine hash of a rank already owning the node needs no owner room.
    assert_eq!(w.store(rb, None, &blocks(&A[..2], 0, 7)), applied(2));
    // Full at block 1 (ra, rb), room at block 2 (ra only) is never reached.
    assert_eq!(w.store(rc, None, &blocks(B, 0, 3)), over(0, 4));
    assert_eq!(w.store(rc, None, &blocks(C, 0, 3)), applied(3));
    assert_eq!(
        matches(&r, &prompt(A)),
        expect(&[(ra, 6), (rb, 2)]),
        "rc got nothing of A"
    );
    w.clear_rank(rb);
    assert_eq!(w.store(rc, None, &blocks(A, 0, 3)), applied(6));
    assert_eq!((b.nodes(), b.ownerships()), (9, 15));
}

#[test]
fn budget_node_cap_at_and_one_over() {
    let (mut w, r, b) = index(Caps::DEFAULT, 4, 100);
    let (ra, rb) = (key(1, 0), key(2, 0));
    assert_eq!(w.store(ra, None, &blocks(&A[..4], 0, 1)), applied(4));
    assert_eq!(b.nodes(), 4);
    assert_eq!(w.store(ra, Some(eh(A, 3, 1)), &blocks(A, 4, 1)), over(0, 2));
    // Blocks on existing nodes need no node.
    assert_eq!(w.store(rb, None, &blocks(A, 0, 2)), over(4, 2));
    assert_eq!(w.store(rb, None, &blocks(C, 0, 2)), over(0, 3));
    assert_eq!(matches(&r, &prompt(A)), expect(&[(ra, 4), (rb, 4)]));
    assert_eq!((b.nodes(), b.ownerships()), (4, 8));
    w.clear_rank(ra);
    assert_eq!(b.nodes(), 4, "rb still owns them");
    w.remove(rb, &[eh(A, 3, 2)]);
    assert_eq!(w.store(rb, None, &blocks(C, 0, 2)), over(1, 2));
}

#[test]
fn budget_ownership_cap_at_and_one_over() {
    let (mut w, _, b) = index(Caps::DEFAULT, 100, 5);
    let (ra, rb) = (key(1, 0), key(2, 0));
    assert_eq!(w.store(ra, None, &blocks(&A[..3], 0, 1)), applied(3));
    assert_eq!(w.store(rb, None, &blocks(A, 0, 2)), over(2, 4));
    assert_eq!(b.ownerships(), 5);
    assert_eq!(
        w.store(ra, None, &blocks(&A[..3], 0, 1)),
        applied(3),
        "held"
    );
    assert_eq!(w.store(ra, None, &blocks(&A[..1], 0, 5)), over(0, 1));
    assert_eq!(w.remove(rb, &[eh(A, 1, 2)]), 1);
    assert_eq!(w.store(ra, None, &blocks(&A[..1], 0, 5)), applied(1));
    assert_eq!((b.ownerships(), w.ownerships()), (5, 5));
}

#[test]
fn the_budget_is_shared_by_every_index_and_given_back_on_drop() {
    let budget = Arc::new(Budget::with_limits(5, 100));
    let (mut w1, _) = new_index(Arc::clone(&budget));
    let (mut w2, _) = new_index(Arc::clone(&budget));
    assert_eq!(
        w1.store(key(1, 0), None, &blocks(&A[..3], 0, 1)),
        applied(3)
    );
    // The same path in another shard's index is another node.
    assert_eq!(w2.store(key(2, 0), None, &blocks(A, 0, 1)), over(2, 4));
    assert_eq!((budget.nodes(), w1.nodes() + w2.nodes()), (5, 5));
    drop(w1);
    assert_eq!((budget.nodes(), budget.ownerships()), (2, 2));
    assert_eq!(w2.store(key(2, 0), None, &blocks(A, 0, 1)), over(5, 1));
}

#[test]
fn the_real_caps_are_wired() {
    let (w, _) = new_index(Arc::new(Budget::new()));
    assert_eq!(w.caps(), Caps::default());
    assert_eq!(
        (w.caps().blocks_per_rank, w.caps().owners_per_node),
        (MAX_BLOCKS_PER_RANK, MAX_OWNERS_PER_NODE)
    );
    assert_eq!(MAX_BLOCKS_PER_RANK, 262_144);
    assert_eq!(MAX_OWNERS_PER_NODE, 4096);
    let b = Budget::new();
    assert_eq!(
        (b.node_limit(), b.ownership_limit()),
        (MAX_INDEX_BLOCKS, MAX_INDEX_OWNERSHIPS)
    );
}

#[test]
fn the_real_owners_per_node_cap_at_and_one_over() {
    let (mut w, r) = new_index(Arc::new(Budget::new()));
    let root = blocks(&A[..1], 0, 0);
    for rank in 0..MAX_OWNERS_PER_NODE as u32 {
        assert_eq!(w.store(key(1, rank), None, &root), applied(1));
    }
    assert_eq!(w.store(key(2, 0), None, &root), over(0, 1));
    assert_eq!(matches(&r.handle(), &prompt(A)).len(), MAX_OWNERS_PER_NODE);
}

#[test]
fn the_real_blocks_per_rank_cap_at_and_one_over() {
    let (mut w, _) = new_index(Arc::new(Budget::new()));
    let ra = key(1, 0);
    // Root blocks with distinct tokens, one batch-sized store at a time.
    let mut next = 0u64;
    while w.rank_blocks(ra) < MAX_BLOCKS_PER_RANK {
        let chunk: Vec<StoredBlock> = (next..next + 8192)
            .map(|t| StoredBlock {
                block_hash: EngineHash(t),
                tokens_hash: TokensHash(t),
            })
            .collect();
        next += 8192;
        assert_eq!(w.store(ra, None, &chunk), applied(8192));
    }
    assert_eq!(w.rank_blocks(ra), MAX_BLOCKS_PER_RANK);
    let one = [StoredBlock {
        block_hash: EngineHash(next),
        tokens_hash: TokensHash(next),
    }];
    assert_eq!(w.store(ra, None, &one), over(0, 1));
    assert_eq!(
        w.store(key(1, 1), None, &one),
        applied(1),
        "another rank has room"
    );
}

/// Brute force: per rank, blocks held contiguously from the first of `hashes`.
fn brute(held: &[(u32, Vec<bool>)], depth: usize) -> Vec<(u32, u32)> {
    held.iter()
        .filter_map(|(rank, h)| {
            let n = h.iter().take(depth).take_while(|x| **x).count();
            (n > 0).then(|| (*rank, u32::try_from(n).unwrap_or(0)))
        })
        .collect()
}

#[test]
fn the_walk_agrees_with_brute_force_on_large_owner_sets_with_holes() {
    // 70 ranks on one 40-block path; rank i holds a prefix of length (i * 7) % 41 and, for
    // every fifth rank, a few blocks past a hole.
    let tokens: Vec<u64> = (0..40).map(|t| 1000 + t).collect();
    let (mut w, r, _) = roomy();
    let mut held = Vec::new();
    for i in 0..70u32 {
        let len = (i as usize * 7) % 41;
        let mut h = vec![false; 40];
        let rank = key(u64::from(i % 3), i);
        if len > 0 {
            w.store(rank, None, &blocks(&tokens[..len], 0, u64::from(i)));
            h[..len].iter_mut().for_each(|x| *x = true);
        }
        if i % 5 == 0 && len + 3 < 40 {
            // Blocks len+1..len+3 under a hole at len (stored, then the hole removed).
            let upto = len + 3;
            w.store(rank, None, &blocks(&tokens[..upto], 0, 500 + u64::from(i)));
            let holes: Vec<EngineHash> = (0..=len)
                .map(|d| eh(&tokens, d, 500 + u64::from(i)))
                .collect();
            w.remove(rank, &holes);
            h[len + 1..upto].iter_mut().for_each(|x| *x = true);
        }
        held.push((i, h));
    }
    for depth in [1, 2, 5, 17, 40] {
        let got: Vec<(u32, u32)> = matches(&r, &prompt(&tokens[..depth]))
            .into_iter()
            .map(|(k, n)| (k.dp_rank, n))
            .collect();
        let mut want = brute(&held, depth);
        want.sort_unstable();
        let mut got = got;
        got.sort_unstable();
        assert_eq!(got, want, "depth {depth}");
    }
}

#[test]
fn a_visit_that_reads_again_still_gets_whole_answers() {
    let (mut w, r, _) = roomy();
    w.store(key(1, 0), None, &blocks(A, 0, 1));
    w.store(key(2, 0), None, &blocks(B, 0, 1));
    let p = prompt(A);
    let mut inner = Vec::new();
    let outer = matches_of(|v| {
        r.find_matches(&p, &mut |k, n| {
            inner.push(matches(&r, &p));
            v(k, n);
        })
    });
    assert_eq!(outer, expect(&[(key(1, 0), 6), (key(2, 0), 2)]));
    assert!(inner.iter().all(|m| *m == outer));
}

#[test]
fn merged_is_the_disjoint_union_of_the_shards() {
    let budget = Arc::new(Budget::new());
    let (mut w1, r1) = new_index(Arc::clone(&budget));
    let (mut w2, r2) = new_index(Arc::clone(&budget));
    w1.store(key(1, 0), None, &blocks(A, 0, 1));
    w2.store(key(2, 0), None, &blocks(B, 0, 1));
    w2.store(key(2, 1), None, &blocks(C, 0, 1));
    let readers = [r1.handle(), r2.handle()];
    let readers_factory: &IndexReaders = &r1;
    let _ = readers_factory.clone().handle();
    let m = Merged(&readers);
    let p = prompt(A);
    let got = matches_of(|v| {
        m.find_matches(
            PromptBlocks {
                block_size: 16,
                hashes: &p,
            },
            v,
        )
    });
    assert_eq!(got, expect(&[(key(1, 0), 6), (key(2, 0), 2)]));
}

#[test]
fn one_owner_per_node_whatever_the_engine_hashes() {
    let (mut w, r, _) = roomy();
    let ra = key(1, 0);
    for round in 0..6u64 {
        w.store(ra, None, &blocks(A, 0, round));
        if round % 2 == 1 {
            w.remove(ra, &[eh(A, 0, round - 1)]);
        }
        assert_eq!(w.node_table().owner_counts().count(), w.nodes());
        assert_eq!(matches(&r, &prompt(A)).get(&ra).copied(), Some(6));
    }
    let own: u32 = w.node_table().owner_counts().sum();
    assert_eq!(own, 6, "one owner per node, any number of engine hashes");
}

#[test]
fn the_handles_cross_threads() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync + Clone>() {}
    send::<IndexWriter>();
    send::<IndexReader>();
    send_sync::<IndexReaders>();
    send_sync::<Arc<Budget>>();
}

#[test]
fn a_prefetch_changes_nothing_whatever_it_is_given() {
    let (mut w, r, budget) = roomy();
    let (ra, rb) = (key(1, 0), key(2, 0));
    let a = blocks(A, 0, 1);
    w.store(ra, None, &a);
    w.store(rb, None, &blocks(B, 0, 2));
    let before = (
        w.nodes(),
        w.ownerships(),
        budget.nodes(),
        matches(&r, &prompt(A)),
        matches(&r, &prompt(B)),
    );
    let many: Vec<EngineHash> = (0..10_000).map(EngineHash).collect();
    let long = blocks(&(0..5_000).collect::<Vec<u64>>(), 0, 9);
    let events = [
        // Held and not held, known and unknown ranks, a parent nobody holds, huge lists.
        Upcoming::Remove {
            rank: ra,
            hashes: &[a[2].block_hash, EngineHash(77)],
        },
        Upcoming::Remove {
            rank: key(9, 9),
            hashes: &many,
        },
        Upcoming::Store {
            rank: ra,
            parent: Some(a[5].block_hash),
            blocks: &long,
        },
        Upcoming::Store {
            rank: rb,
            parent: Some(EngineHash(12_345)),
            blocks: &a,
        },
        Upcoming::Store {
            rank: key(8, 1),
            parent: None,
            blocks: &[],
        },
    ];
    for _ in 0..3 {
        w.prefetch(events.iter().copied());
    }
    let after = (
        w.nodes(),
        w.ownerships(),
        budget.nodes(),
        matches(&r, &prompt(A)),
        matches(&r, &prompt(B)),
    );
    assert_eq!(before, after);
    assert_eq!(w.rank_blocks(ra), 6);
}

#[test]
fn owners_per_node_is_clamped_to_what_a_bucket_counts() {
    let huge = Caps {
        blocks_per_rank: 8,
        owners_per_node: usize::MAX,
    };
    let (w, _) = new_index_with_caps(Arc::new(Budget::new()), huge);
    assert_eq!(w.caps().owners_per_node, 65_535);
    let (w, _) = new_index_with_caps(Arc::new(Budget::new()), Caps::DEFAULT);
    assert_eq!(
        w.caps(),
        Caps::DEFAULT,
        "the spec's caps are below the clamp"
    );
}
