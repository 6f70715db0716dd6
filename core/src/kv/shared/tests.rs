//! Readers on other threads while the writer works: what a read may and may not see.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::super::budget::Budget;
use super::super::index::new_index;
use super::super::test_support::{blocks, key, prompt};
use super::*;

const L: usize = 48;
/// Ranks per group: two groups of 40 give 80 slots, so the shared nodes' sets spill.
const GROUP: u32 = 40;
const BATCHES: usize = 400;

/// After batch `k`, group 1 holds `f(k)` blocks of the chain and group 2 `L - f(k)`.
fn f(k: usize) -> usize {
    (k * 13) % (L + 1)
}

fn target(g: usize, k: usize) -> usize {
    if g == 0 { f(k) } else { L - f(k) }
}

/// Each rank's run as a reader reports it lies between the lengths it had before and after the
/// batches that ran during the read (a batch moves a rank's chain one block at a time, stores
/// growing it and removals cutting its tail), so no read ever sees a state the writer did not
/// pass through: no rank under another's name, nothing invented, no run beyond what the rank
/// held. Real threads, whole walks; a torn bucket lasts nanoseconds, and the version check that
/// prevents it is proven by the loom models (`nodes_loom.rs`), not by this test.
#[test]
fn readers_see_only_states_the_writer_passed_through() {
    let tokens: Vec<u64> = (0..L as u64).map(|t| 7000 + t).collect();
    let p = prompt(&tokens);
    let (mut w, readers) = new_index(Arc::new(Budget::new()));
    let salted: Vec<Vec<_>> = (0..2 * GROUP)
        .map(|s| blocks(&tokens, 0, u64::from(s)))
        .collect();
    // Batches completed; a reader loads it before and after its read.
    let done = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let reads: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let readers = readers.clone();
                let (p, stop, done) = (&p, &stop, &done);
                s.spawn(move || {
                    let r = readers.handle();
                    let mut reads = 0usize;
                    let mut distinct = BTreeMap::new();
                    while !stop.load(Ordering::Relaxed) && reads < 2_000_000 {
                        let before = done.load(Ordering::Acquire);
                        let mut got: BTreeMap<LoadKey, u32> = BTreeMap::new();
                        r.find_matches(p, &mut |k, n| {
                            assert!(got.insert(k, n).is_none(), "{k:?} reported twice");
                        });
                        let after = done.load(Ordering::Acquire);
                        // Batch `before - 1` was done when the read began; batches
                        // `before..=after` may have run during it (batch `after` perhaps in part).
                        for g in 0..2usize {
                            let mut ts = vec![before.checked_sub(1).map_or(0, |k| target(g, k))];
                            ts.extend((before..=after.min(BATCHES - 1)).map(|k| target(g, k)));
                            let (lo, hi) = (
                                *ts.iter().min().unwrap_or(&0),
                                *ts.iter().max().unwrap_or(&0),
                            );
                            for rank in 0..GROUP {
                                let n = got.get(&key(g as u64 + 1, rank)).copied().unwrap_or(0);
                                assert!(
                                    (lo..=hi).contains(&(n as usize)),
                                    "group {g} rank {rank}: {n} blocks, outside {lo}..={hi} \
                                     (batches {before}..={after})"
                                );
                            }
                        }
                        assert!(
                            got.keys()
                                .all(|k| k.worker_id.get() <= 2 && k.dp_rank < GROUP),
                            "a rank nobody stored: {got:?}"
                        );
                        *distinct.entry(got.len()).or_insert(0) += 1;
                        reads += 1;
                        if reads.is_multiple_of(16) {
                            std::thread::yield_now();
                        }
                    }
                    reads
                })
            })
            .collect();
        let mut len = [[0usize; GROUP as usize]; 2];
        for k in 0..BATCHES {
            for g in 0..2 {
                let t = target(g, k);
                for rank in 0..GROUP {
                    let at = &mut len[g][rank as usize];
                    let rk = key(g as u64 + 1, rank);
                    let chain = &salted[g * GROUP as usize + rank as usize];
                    if t < *at {
                        // The tail last first, so the run shrinks one block at a time only at
                        // the first removal; later ones are below it already.
                        let gone: Vec<_> = chain[t..*at].iter().map(|b| b.block_hash).collect();
                        w.remove(rk, &gone);
                    } else if t > *at {
                        let parent = at.checked_sub(1).map(|i| chain[i].block_hash);
                        w.store(rk, parent, &chain[*at..t]);
                    }
                    *at = t;
                }
            }
            done.store(k + 1, Ordering::Release);
        }
        stop.store(true, Ordering::Relaxed);
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a reader panicked")))
            .sum()
    });
    assert!(reads > 0);
}

/// A slot freed while a reader still holds the slot map naming its rank is not given to another
/// rank until that reader is done.
#[test]
fn a_freed_slot_waits_for_the_readers_of_its_old_name() {
    let (mut w, readers) = new_index(Arc::new(Budget::new()));
    let r = readers.handle();
    let (ra, rb) = (key(1, 0), key(2, 0));
    let a = blocks(&[5, 6], 0, 1);
    w.store(ra, None, &a);
    let slot_a = w.slot_of(ra);
    assert!(slot_a.is_some());
    let mut inside = None;
    r.find_matches(&prompt(&[5, 6]), &mut |_, _| {
        // This read holds the map naming `ra`: the slot must not go to `rb` now.
        w.clear_rank(ra);
        w.store(rb, None, &blocks(&[5, 6], 0, 2));
        inside = w.slot_of(rb);
    });
    assert!(inside.is_some());
    assert_ne!(
        inside, slot_a,
        "slot reused while a reader held its old name"
    );
    // Once no reader holds it, the slot is reused (lowest first).
    w.clear_rank(rb);
    let rc = key(3, 0);
    w.store(rc, None, &blocks(&[5], 0, 3));
    assert_eq!(w.slot_of(rc), slot_a);
    let mut seen = Vec::new();
    r.find_matches(&prompt(&[5]), &mut |k, n| seen.push((k, n)));
    assert_eq!(seen, vec![(rc, 1)]);
}
