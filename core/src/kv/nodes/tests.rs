//! The node table against a model of sets, and readers walking it while the writer churns.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering as O};

use super::*;

fn rnd(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Node `path`'s owner slots as a reader reads them (`None`: absent).
fn read_set(n: &Nodes, path: u64) -> Option<BTreeSet<u32>> {
    let mut epoch = n.epoch();
    // A spilled set whose node changes while its chunk is copied is read again (the writer
    // moves on, so this ends).
    loop {
        let seen = n.get(path, &mut epoch)?;
        match seen.owners() {
            Owners::Inline { at, bits } => return Some(slots(at, bits)),
            Owners::Spilled { owners, fp, seen } => {
                let mut words = vec![0; n.words()];
                if !n.chunk_into(&seen, 0, n.words(), &mut words) {
                    continue;
                }
                let set: BTreeSet<u32> = words
                    .iter()
                    .enumerate()
                    .flat_map(|(w, x)| slots(w, *x))
                    .collect();
                assert_eq!(set.len(), owners as usize, "owner count of a whole read");
                let k = n.keyed();
                let mixes = words.iter().enumerate().map(|(w, x)| k.word_mix(w, *x));
                assert_eq!(mixes.fold(0, |f, m| f ^ m), fp);
                return Some(set);
            }
        }
    }
}

fn slots(w: usize, mut bits: u64) -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    while bits != 0 {
        out.insert(w as u32 * 64 + bits.trailing_zeros());
        bits &= bits - 1;
    }
    out
}

#[test]
fn the_node_table_agrees_with_sets_and_spills_only_across_words() {
    let (mut t, shared) = NodeWriter::new(Keyed::random());
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
        let nodes = shared.load();
        let got = read_set(&nodes, n);
        assert_eq!(got.as_ref(), (!s.is_empty()).then_some(s), "step {step}");
        for x in [slot, slot ^ 1, 300] {
            let st = t.owner_state(n, x);
            assert_eq!(
                st,
                (!s.is_empty()).then(|| (s.len() as u32, s.contains(&x))),
                "step {step}"
            );
        }
        let words: BTreeSet<u32> = s.iter().map(|x| x / 64).collect();
        let spilled = t.probe(n).is_ok_and(|i| t.entry(i).tag & SPILLED != 0);
        assert_eq!(spilled, words.len() > 1, "step {step}");
    }
    let nodes = want.iter().filter(|s| !s.is_empty()).count();
    assert_eq!(t.len(), nodes);
    assert_eq!(t.owner_counts().count(), nodes);
    // Every free chunk is zero (a spill takes it as it is).
    for &c in &t.spill_free {
        let chunk = t.chunk(c).unwrap_or(&[]);
        assert!(chunk.iter().all(|x| x.load(O::Relaxed) == 0), "chunk {c}");
    }
}

/// A rebuild (growth, widening, a full arena doubled) keeps every spilled set in its chunk, with
/// its words, and the free list as it was: sets spilled in prompt order stay at rising
/// addresses, the order a match walk reads them in.
#[test]
fn a_rebuild_keeps_every_spilled_set_in_its_chunk() {
    let (mut t, shared) = NodeWriter::new(Keyed::random());
    t.widen(2);
    let chunk_of = |t: &NodeWriter, path: u64| {
        let e = t.entry(t.probe(path).unwrap_or(usize::MAX));
        (e.tag & SPILLED != 0).then_some(e.tag & !SPILLED)
    };
    // Nodes 1..=100 spill in order (slots 0 and 64); a few come back inline and free theirs.
    for path in 1..=100u64 {
        t.add(path, 0);
        t.add(path, 64 + (path % 8) as u32);
    }
    for path in (10..=100u64).step_by(10) {
        t.remove(path, 0);
    }
    let before: Vec<Option<u32>> = (1..=100u64).map(|p| chunk_of(&t, p)).collect();
    let spilled: Vec<u32> = before.iter().flatten().copied().collect();
    assert!(
        spilled.windows(2).all(|w| w[0] < w[1]),
        "chunks follow the spill order"
    );
    let free = t.spill_free.clone();
    assert_eq!(free.len(), 10);
    // Growth (thousands of inline nodes), widening, and more spills than the arena holds.
    for path in 1_000..5_000u64 {
        t.add(path, 3);
    }
    t.widen(4);
    let extra: Vec<u64> = (10_000..10_200u64).collect();
    for &path in &extra {
        t.add(path, 1);
        t.add(path, 200);
    }
    for (path, c) in (1..=100u64).zip(&before) {
        assert_eq!(chunk_of(&t, path), *c, "node {path} moved");
        let want: BTreeSet<u32> = match c {
            Some(_) => [0, 64 + (path % 8) as u32].into(),
            None => [64 + (path % 8) as u32].into(),
        };
        assert_eq!(read_set(&shared.load(), path), Some(want), "node {path}");
    }
    // The freed chunks were reused first, then new ones handed out in order.
    let reused: BTreeSet<u32> = extra
        .iter()
        .take(10)
        .filter_map(|&p| chunk_of(&t, p))
        .collect();
    assert_eq!(reused, free.iter().copied().collect());
    let later: Vec<u32> = extra
        .iter()
        .skip(10)
        .filter_map(|&p| chunk_of(&t, p))
        .collect();
    assert!(later.windows(2).all(|w| w[0] < w[1]));
}

/// Readers look up a fixed set of nodes (never removed, their owner sets fixed, some spilled)
/// while the writer adds and removes thousands of others that share their probe runs, so
/// entries keep shifting back past them and the table grows under them: every read must find
/// every fixed node with exactly its set. A stress test of the whole protocol on real threads
/// (growth and republication included); the races inside one shift or one bucket write last
/// nanoseconds and are what the loom models (`nodes_loom.rs`) prove, with negative controls:
/// with the epoch or the version check removed, this test still passes on this machine.
#[test]
fn readers_find_every_node_present_throughout_while_the_writer_churns() {
    const FIXED: u64 = 200;
    let (mut t, shared) = NodeWriter::new(Keyed::random());
    t.widen(2);
    let fixed_set = |p: u64| -> BTreeSet<u32> {
        if p.is_multiple_of(3) {
            [p as u32 % 64, 64 + p as u32 % 64].into() // spilled
        } else {
            [p as u32 % 64].into()
        }
    };
    for p in 1..=FIXED {
        for s in fixed_set(p) {
            t.add(p, s);
        }
    }
    let stop = AtomicBool::new(false);
    let reads = std::thread::scope(|sc| {
        let readers: Vec<_> = (0..2)
            .map(|r| {
                let (shared, stop) = (&shared, &stop);
                sc.spawn(move || {
                    let mut n = 0u64;
                    let mut p = 1 + r;
                    while !stop.load(O::Relaxed) && n < 5_000_000 {
                        let nodes = shared.load();
                        let got = read_set(&nodes, p);
                        assert_eq!(got, Some(fixed_set(p)), "fixed node {p}");
                        p = p % FIXED + 1;
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let mut seed = 5;
        let mut live: Vec<u64> = Vec::new();
        for round in 0..1_000_000u64 {
            if live.len() < 4_900 && !rnd(&mut seed).is_multiple_of(3) || live.is_empty() {
                let p = 1_000 + round;
                let s = (rnd(&mut seed) % 128) as u32;
                t.add(p, s);
                if rnd(&mut seed).is_multiple_of(4) {
                    t.add(p, (s + 64) % 128); // a spilled one now and then
                }
                live.push(p);
            } else {
                let i = (rnd(&mut seed) as usize) % live.len();
                let p = live.swap_remove(i);
                while t.owner_state(p, 0).is_some() {
                    let st = (0..128).find(|&s| t.owner_state(p, s).is_some_and(|x| x.1));
                    match st {
                        Some(s) => {
                            t.remove(p, s);
                        }
                        None => break,
                    }
                }
            }
        }
        stop.store(true, O::Relaxed);
        readers
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a reader panicked")))
            .sum::<u64>()
    });
    assert!(reads > 0);
    for p in 1..=FIXED {
        assert_eq!(read_set(&shared.load(), p), Some(fixed_set(p)));
    }
}
