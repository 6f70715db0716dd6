//! Loom models of the node table's reader/writer protocol ([`super::Nodes`], compiled only under
//! `cfg(all(test, loom))`).
//!
//! Role: exhaustive checks, under the memory model loom implements (every interleaving up to the
//! preemption bound, and for each `Relaxed`/`Acquire` load every store coherence lets it read),
//! of what `nodes.rs` promises readers:
//! - **a node present throughout a read is found**, while a deletion shifts it back along its
//!   probe run (the shift epoch): three nodes share one home bucket, the writer deletes the first
//!   and the reader looks up the third, which moves two buckets back;
//! - **a node is read whole** (the bucket's version): the writer adds an owner to a node (its
//!   word and its owner count change together) and the reader's view of it always has as many
//!   owners as bits; likewise for a spilled set, whose chunk the reader copies and checks.
//!
//! Negative controls: a reader that trusts a miss without rechecking the epoch, and one that
//! keeps a bucket read without rechecking its version. Loom must fail each with the matching
//! assertion, which shows the models can see the races the real protocol prevents. As in
//! `load/seqcell_loom.rs` (loom 0.7's partial-order reduction and a main-thread reader explore
//! too little): the main thread only builds the table, spawns and joins, and the writer is
//! spawned before the reader.
//!
//! Run (release: loom is slow unoptimised):
//! `CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" cargo test -p continuum-core --release --lib loom_models`

use std::collections::BTreeSet;
use std::sync::Arc;

use loom::thread;

use super::*;
use crate::loom_support::explore;

/// `n` distinct paths whose home bucket is `at` in a table of 16 buckets.
fn paths_at(keyed: Keyed, at: usize, n: usize) -> Vec<u64> {
    (1u64..)
        .filter(|p| home(keyed, *p, 15) == at)
        .take(n)
        .collect()
}

/// A lookup as a reader makes it: `(found, owners, bits)`.
type Lookup = fn(&Nodes, u64) -> Option<(u32, u64)>;

/// The real reader: [`Nodes::get`] from a fresh epoch.
fn get_real(n: &Nodes, path: u64) -> Option<(u32, u64)> {
    let mut epoch = n.epoch();
    let seen = n.get(path, &mut epoch)?;
    Some((meta_owners(seen.meta), seen.bits))
}

/// Broken: trusts a miss without rechecking the shift epoch.
fn get_trusting_misses(n: &Nodes, path: u64) -> Option<(u32, u64)> {
    match n.probe(path) {
        Ok(Some(seen)) => Some((meta_owners(seen.meta), seen.bits)),
        _ => None,
    }
}

/// Broken: reads a bucket's words once, without the version recheck.
fn get_unversioned(n: &Nodes, path: u64) -> Option<(u32, u64)> {
    let mask = n.mask();
    let mut i = home(n.keyed, path, mask);
    for _ in 0..n.buckets.len() {
        let b = n.buckets.get(i)?;
        let m = b.meta.load(Ordering::Acquire);
        let p = b.path.load(Ordering::Relaxed);
        let bits = b.bits.load(Ordering::Relaxed);
        if meta_owners(m) == 0 {
            return None;
        }
        if p == path {
            return Some((meta_owners(m), bits));
        }
        i = (i + 1) & mask;
    }
    None
}

/// Model (a): nodes A, B, X share home bucket 3 (so they sit in 3, 4, 5); the writer deletes A
/// (B and X shift back) while the reader looks X up. Returns what the reader saw.
fn shifting(get: Lookup) -> (usize, BTreeSet<Option<(u32, u64)>>) {
    explore(Some(2), move || {
        let (mut w, _shared) = NodeWriter::new(Keyed::random());
        let p = paths_at(w.cur.keyed, 3, 3);
        let (a, b, x) = (p[0], p[1], p[2]);
        for path in [a, b, x] {
            w.add(path, 0);
        }
        let nodes = Arc::clone(&w.cur);
        let writer = thread::spawn(move || {
            assert!(w.remove(a, 0), "A had one owner");
            w
        });
        let reader = thread::spawn(move || get(&nodes, x));
        let w = writer.join().unwrap_or_else(|_| panic!("writer panicked"));
        let got = reader.join().unwrap_or_else(|_| panic!("reader panicked"));
        assert_eq!(got, Some((1, 1)), "X, present throughout, was not found");
        assert_eq!(w.owner_state(b, 0), Some((1, true)));
        got
    })
}

#[test]
fn loom_models_a_shifting_node_is_found() {
    let (runs, seen) = shifting(get_real);
    assert!(runs > 100, "loom explored only {runs} executions");
    assert_eq!(seen.len(), 1);
}

#[test]
fn loom_models_a_miss_trusted_without_the_epoch_is_caught() {
    let msg = crate::loom_support::must_fail("shift epoch", || {
        shifting(get_trusting_misses);
    });
    assert!(msg.contains("was not found"), "{msg}");
}

/// Model (b): node X has slot 0; the writer adds slot 1 (its word and its owner count change
/// together) while the reader reads X. Returns what the reader saw.
fn growing(get: Lookup) -> (usize, BTreeSet<Option<(u32, u64)>>) {
    explore(Some(2), move || {
        let (mut w, _shared) = NodeWriter::new(Keyed::random());
        let x = paths_at(w.cur.keyed, 7, 1)[0];
        w.add(x, 0);
        let nodes = Arc::clone(&w.cur);
        let writer = thread::spawn(move || {
            w.add(x, 1);
        });
        let reader = thread::spawn(move || get(&nodes, x));
        writer.join().unwrap_or_else(|_| panic!("writer panicked"));
        let got = reader.join().unwrap_or_else(|_| panic!("reader panicked"));
        let (owners, bits) = got.unwrap_or_else(|| panic!("X not found"));
        assert_eq!(
            owners,
            bits.count_ones(),
            "torn node: {owners} owners, bits {bits:#b}"
        );
        got
    })
}

#[test]
fn loom_models_a_node_is_read_whole() {
    let (runs, seen) = growing(get_real);
    assert!(runs > 10, "loom explored only {runs} executions");
    // Both states are reachable: before the add and after it.
    assert_eq!(seen, [Some((1, 0b1)), Some((2, 0b11))].into());
}

#[test]
fn loom_models_an_unversioned_read_is_caught() {
    let msg = crate::loom_support::must_fail("bucket version", || {
        growing(get_unversioned);
    });
    assert!(msg.contains("torn node"), "{msg}");
}

/// Model (c): node X's set spans two words (spilled: slots 0 and 64); the writer adds slot 65
/// while the reader reads X and copies its chunk: what it keeps has the owner count, the
/// fingerprint and the bits of one state.
#[test]
fn loom_models_a_spilled_set_is_read_whole() {
    let (runs, seen) = explore(Some(2), || {
        let (mut w, _shared) = NodeWriter::new(Keyed::random());
        w.widen(2);
        let x = paths_at(w.cur.keyed, 9, 1)[0];
        w.add(x, 0);
        w.add(x, 64);
        let nodes = Arc::clone(&w.cur);
        let writer = thread::spawn(move || {
            w.add(x, 65);
        });
        let reader = thread::spawn(move || {
            let mut epoch = nodes.epoch();
            loop {
                let seen = nodes
                    .get(x, &mut epoch)
                    .unwrap_or_else(|| panic!("X not found"));
                let Owners::Spilled { owners, fp, seen } = seen.owners() else {
                    panic!("X is spilled throughout");
                };
                let mut words = [0u64; 2];
                if nodes.chunk_into(&seen, 0, 2, &mut words) {
                    let k = nodes.keyed();
                    let mine = k.word_mix(0, words[0]) ^ k.word_mix(1, words[1]);
                    let count = words[0].count_ones() + words[1].count_ones();
                    assert_eq!((count, mine), (owners, fp), "torn spilled set {words:?}");
                    return words;
                }
            }
        });
        writer.join().unwrap_or_else(|_| panic!("writer panicked"));
        reader.join().unwrap_or_else(|_| panic!("reader panicked"))
    });
    assert!(runs > 10, "loom explored only {runs} executions");
    assert_eq!(seen, [[1, 1], [1, 0b11]].into());
}
