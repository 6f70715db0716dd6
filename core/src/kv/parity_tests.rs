//! Tests of the hash-parity watchdog: verdicts against a scripted oracle (each rule and its
//! boundary), and against the real index (a rank that stored the prompt under the router's
//! hashes is a hit, one that stored it under drifted hashes a miss).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::super::budget::Budget;
use super::super::index::new_index;
use super::super::shared::Merged;
use super::super::test_support::{blocks, key, prompt};
use super::*;

fn at(ms: u64) -> Instant {
    Instant::from_origin(Duration::from_millis(ms))
}

/// An oracle whose holdings and event times the test sets.
#[derive(Default)]
struct Script {
    held: RefCell<BTreeSet<(LoadKey, BlockHash)>>,
    events: RefCell<BTreeMap<LoadKey, Instant>>,
}

impl Oracle for Script {
    fn holds(&self, rank: LoadKey, block: BlockHash) -> bool {
        self.held.borrow().contains(&(rank, block))
    }
    fn last_event(&self, rank: LoadKey) -> Option<Instant> {
        self.events.borrow().get(&rank).copied()
    }
}

fn run(p: &mut Predictions, now: Instant, o: &dyn Oracle) -> Vec<(String, Verdict)> {
    let mut out = Vec::new();
    p.check(now, o, &mut |m, v| out.push((m.to_owned(), v)));
    out
}

#[test]
fn a_held_block_is_a_hit_at_once_and_leaves() {
    let (o, mut p) = (Script::default(), Predictions::new());
    assert!(p.post("m", key(1, 0), BlockHash(7), at(0)));
    assert!(run(&mut p, at(1), &o).is_empty(), "nothing held yet");
    assert_eq!(p.len(), 1);
    o.held.borrow_mut().insert((key(1, 0), BlockHash(7)));
    assert_eq!(run(&mut p, at(2), &o), vec![("m".to_owned(), Verdict::Hit)]);
    assert!(p.is_empty());
    assert!(run(&mut p, at(3), &o).is_empty(), "settled once");
}

#[test]
fn the_block_on_another_rank_is_not_a_hit() {
    let (o, mut p) = (Script::default(), Predictions::new());
    p.post("m", key(1, 0), BlockHash(7), at(0));
    o.held.borrow_mut().insert((key(1, 1), BlockHash(7)));
    o.held.borrow_mut().insert((key(2, 0), BlockHash(7)));
    assert!(run(&mut p, at(1), &o).is_empty());
    assert_eq!(p.len(), 1);
}

#[test]
fn a_miss_needs_both_the_wait_and_events_since_the_pick() {
    let posted = at(1_000);
    let miss_at = posted.saturating_add(MISS_AFTER);
    let just_before = at(1_000 + MISS_AFTER.as_millis() as u64 - 1);
    let (o, mut p) = (Script::default(), Predictions::new());
    p.post("m", key(1, 0), BlockHash(7), posted);
    // Events from before the pick do not count as flowing since.
    o.events.borrow_mut().insert(key(1, 0), at(999));
    assert!(
        run(&mut p, miss_at, &o).is_empty(),
        "no event since the pick"
    );
    // An event at the very instant of the pick is not after it either.
    o.events.borrow_mut().insert(key(1, 0), posted);
    assert!(run(&mut p, miss_at, &o).is_empty());
    o.events.borrow_mut().insert(key(1, 0), at(1_001));
    assert!(run(&mut p, just_before, &o).is_empty(), "too early");
    assert_eq!(
        run(&mut p, miss_at, &o),
        vec![("m".to_owned(), Verdict::Miss)]
    );
    assert!(p.is_empty());
}

#[test]
fn a_silent_rank_is_dropped_without_a_verdict() {
    let (o, mut p) = (Script::default(), Predictions::new());
    p.post("m", key(1, 0), BlockHash(7), at(0));
    let before = at(GIVE_UP_AFTER.as_millis() as u64 - 1);
    assert!(run(&mut p, before, &o).is_empty());
    assert_eq!(p.len(), 1, "kept until the give-up time");
    assert!(run(&mut p, at(0).saturating_add(GIVE_UP_AFTER), &o).is_empty());
    assert!(p.is_empty(), "dropped, no verdict");
}

#[test]
fn verdicts_come_in_posting_order_with_their_model() {
    let (o, mut p) = (Script::default(), Predictions::new());
    p.post("a", key(1, 0), BlockHash(1), at(0));
    p.post("b", key(2, 0), BlockHash(2), at(0));
    p.post("a", key(3, 0), BlockHash(3), at(0));
    p.post("c", key(4, 0), BlockHash(4), at(0));
    o.held.borrow_mut().insert((key(3, 0), BlockHash(3)));
    o.held.borrow_mut().insert((key(1, 0), BlockHash(1)));
    o.events.borrow_mut().insert(key(2, 0), at(5));
    let v = run(&mut p, at(0).saturating_add(MISS_AFTER), &o);
    assert_eq!(
        v,
        vec![
            ("a".to_owned(), Verdict::Hit),
            ("b".to_owned(), Verdict::Miss),
            ("a".to_owned(), Verdict::Hit),
        ]
    );
    assert_eq!(p.len(), 1, "c's rank is silent: still waiting");
}

#[test]
fn the_ring_and_the_model_table_are_bounded() {
    let mut p = Predictions::new();
    for i in 0..PENDING {
        assert!(p.post("m", key(i as u64, 0), BlockHash(1), at(0)));
    }
    assert!(!p.post("m", key(999, 0), BlockHash(1), at(0)), "ring full");
    assert_eq!(p.len(), PENDING);

    // Models come and go: names no waiting prediction uses are forgotten, so a long-lived
    // shard keeps checking new models after more than MAX_MODELS have passed.
    let (o, mut p) = (Script::default(), Predictions::new());
    o.held.borrow_mut().insert((key(1, 0), BlockHash(1)));
    for i in 0..2 * MAX_MODELS {
        assert!(
            p.post(&format!("m{i}"), key(1, 0), BlockHash(1), at(0)),
            "model {i}"
        );
        // One that waits across every check, so compaction has a name to keep and remap.
        if i == 0 {
            assert!(p.post("waiting", key(9, 0), BlockHash(9), at(0)));
        }
        let v = run(&mut p, at(1), &o);
        assert_eq!(v, vec![(format!("m{i}"), Verdict::Hit)]);
    }
    o.held.borrow_mut().insert((key(9, 0), BlockHash(9)));
    assert_eq!(
        run(&mut p, at(2), &o),
        vec![("waiting".to_owned(), Verdict::Hit)],
        "the waiting prediction kept its model through the compactions"
    );
}

#[test]
fn a_model_warns_once_when_misses_keep_coming() {
    let mut m = ModelParity::default();
    for _ in 0..WARN_STREAK - 1 {
        assert!(!m.record(Verdict::Miss));
    }
    // A hit resets the streak.
    assert!(!m.record(Verdict::Hit));
    assert_eq!(m.streak(), 0);
    for i in 1..=WARN_STREAK {
        assert_eq!(m.record(Verdict::Miss), i == WARN_STREAK, "miss {i}");
    }
    for _ in 0..3 * WARN_STREAK {
        assert!(!m.record(Verdict::Miss), "warned once only");
    }
    m.record(Verdict::Hit);
    for _ in 0..2 * WARN_STREAK {
        assert!(!m.record(Verdict::Miss), "not again after a hit either");
    }
    assert_eq!(m.hits, 2);
    assert_eq!(
        m.misses,
        u64::from(WARN_STREAK - 1 + 4 * WARN_STREAK + 2 * WARN_STREAK)
    );
}

/// The index as the oracle: every shard's readers for `holds`, event times by hand.
struct Indexed<'a> {
    merged: Merged<'a>,
    events: BTreeMap<LoadKey, Instant>,
}

impl Oracle for Indexed<'_> {
    fn holds(&self, rank: LoadKey, block: BlockHash) -> bool {
        self.merged.holds(rank, block)
    }
    fn last_event(&self, rank: LoadKey) -> Option<Instant> {
        self.events.get(&rank).copied()
    }
}

#[test]
fn against_the_index_the_router_s_hashes_hit_and_drifted_ones_miss() {
    let budget = Arc::new(Budget::new());
    // Two shard indexes: the ranks live in different ones.
    let (mut w0, r0) = new_index(Arc::clone(&budget));
    let (mut w1, r1) = new_index(budget);
    let readers = [r0.handle(), r1.handle()];
    // The router's view of a 6-block prompt (tokens hashes 100..106).
    let tokens: Vec<u64> = (100..106).collect();
    let predicted = *prompt(&tokens).last().expect("blocks");
    let (good, drifted, prefix_only) = (key(1, 0), key(2, 0), key(3, 0));

    let mut p = Predictions::new();
    for rank in [good, drifted, prefix_only] {
        p.post("llama", rank, predicted, at(0));
    }
    // The engine of `good` stores the prompt as the router hashed it; `drifted`'s engine hashes
    // its tokens differently (a salt, a template or block-size drift: other tokens hashes);
    // `prefix_only` stores the first half only.
    w0.store(good, None, &blocks(&tokens, 0, 1));
    let other: Vec<u64> = tokens.iter().map(|t| t ^ 0xdead_beef).collect();
    w1.store(drifted, None, &blocks(&other, 0, 2));
    w1.store(prefix_only, None, &blocks(&tokens[..3], 0, 3));

    let events: BTreeMap<LoadKey, Instant> = [good, drifted, prefix_only]
        .into_iter()
        .map(|k| (k, at(50)))
        .collect();
    let o = Indexed {
        merged: Merged(&readers),
        events,
    };
    assert_eq!(
        run(&mut p, at(100), &o),
        vec![("llama".to_owned(), Verdict::Hit)],
        "the good rank at once; the others wait for MISS_AFTER"
    );
    let v = run(&mut p, at(0).saturating_add(MISS_AFTER), &o);
    assert_eq!(
        v,
        vec![
            ("llama".to_owned(), Verdict::Miss),
            ("llama".to_owned(), Verdict::Miss)
        ]
    );
    // Only the whole chain holds the deepest node: a rank holding a prefix holds that prefix's
    // nodes, not the predicted one.
    assert!(!Merged(&readers).holds(prefix_only, predicted));
    assert!(Merged(&readers).holds(good, prompt(&tokens)[2]));
    assert!(Merged(&readers).holds(prefix_only, prompt(&tokens)[2]));
}
