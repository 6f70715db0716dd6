//! Loom models of the seqlock cells of [`super::SeqTable`] (compiled only under
//! `cfg(all(test, loom))`).
//!
//! Role: exhaustive checks, under the memory model loom implements (every interleaving up to the
//! preemption bound, and for each `Relaxed`/`Acquire` load every store coherence lets it read),
//! of the invariants stated in `seqcell.rs`:
//! - a reader never returns a torn value: the writers here only ever store `[v; W]`, so a read
//!   whose words differ mixes two writes;
//! - reads are monotone per reader, and an aborted update (`f` returns `false`) is never visible;
//! - concurrent writers are serialised by the version `compare_exchange`: no increment is lost;
//! - a read that follows a stamp load returns that write or a later one, and stamps never go
//!   back (what the load memo relies on, `super::memo`);
//! - a group stamp never runs ahead of the cell stamps it counts (what the probe sets rely on to
//!   skip unchanged groups, `super::probes`).
//!
//! Negative controls: four broken copies of the protocol, each one line away from the real one
//! (reader without its `Acquire` fence; writer releasing the version `Relaxed`; writers taking the
//! cell with a plain load and store instead of the CAS; a `Relaxed` group increment). Loom must fail each with the matching
//! assertion, which shows the models can see the bugs the real orderings prevent.
//!
//! Loom 0.7's partial-order reduction misses interleavings when a thread's store follows its own
//! load of the same atomic (tokio-rs/loom#392; every `update` does this) and explores almost
//! nothing when the model's main thread is the reader. So: the main thread only spawns and
//! joins, writers are spawned before readers (loom first runs them in that order and the readers'
//! loads then find every race with the writers' stores), and each positive model also runs with
//! [`read_counting`], a copy of [`SeqTable::read`] that counts retries without adding any loom
//! operation (so loom explores exactly the same executions, which the test checks), and asserts
//! that loom reached every outcome the protocol allows, overlapped reads (retries) included.
//!
//! Run (release: loom is slow unoptimised):
//! `CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" cargo test -p continuum-core --release --lib loom_models`

use std::collections::BTreeSet;

use loom::sync::Arc;
use loom::thread;

use super::*;
use crate::loom_support::explore;

/// The multi-word cell width the models use.
const W: usize = 3;

/// A reader under test: returns the words and counts its retries.
type Reader = fn(&SeqTable<W>, &mut u32) -> [u64; W];

/// Runs a model that must fail; returns its panic message.
fn must_fail(preemption_bound: Option<usize>, f: impl Fn() + Send + Sync + 'static) -> String {
    crate::loom_support::must_fail("seqlock", || {
        explore(preemption_bound, f);
    })
}

/// A table whose chunk is allocated before any thread starts: chunk allocation is the control
/// path's, and the `OnceLock` publication is std's (loom rejects loom atomics created in one
/// thread and reached from another through a non-loom `OnceLock`).
fn table() -> Arc<SeqTable<W>> {
    let t = Arc::new(SeqTable::<W>::new());
    assert_eq!(t.update(0, true, |_| (false, ())), Some(()));
    t
}

/// Stores `[v; W]` in slot 0 through the real writer.
fn write(t: &SeqTable<W>, v: u64) {
    assert_eq!(
        t.update(0, false, |d| {
            *d = [v; W];
            (true, ())
        }),
        Some(())
    );
}

/// Adds one to slot 0 through the real writer (a read-modify-write under the cell).
fn increment(t: &SeqTable<W>) {
    t.update(0, false, |d| {
        *d = [d[0] + 1; W];
        (true, ())
    });
}

/// The real reader (it does not report retries).
fn read_real(t: &SeqTable<W>, _retries: &mut u32) -> [u64; W] {
    t.read(0)
}

/// [`SeqTable::read`] line for line, plus a retry counter that is not a loom operation.
fn read_counting(t: &SeqTable<W>, retries: &mut u32) -> [u64; W] {
    let Some(cell) = t.cell(0) else {
        return [0; W];
    };
    let mut spins = 0;
    loop {
        let v1 = cell.version.load(Ordering::Acquire);
        if v1 & 1 == 0 {
            let data: [u64; W] = std::array::from_fn(|i| cell.words[i].load(Ordering::Relaxed));
            fence(Ordering::Acquire);
            if cell.version.load(Ordering::Relaxed) == v1 {
                return data;
            }
        }
        *retries += 1;
        backoff(&mut spins);
    }
}

/// Checks one read: not torn, not an aborted write, not older than `last`.
fn check(data: [u64; W], last: &mut u64) {
    assert!(data.iter().all(|&x| x == data[0]), "torn read: {data:?}");
    assert!(data[0] <= 2, "an aborted update became visible: {data:?}");
    assert!(data[0] >= *last, "read went back: {data:?} after {last}");
    *last = data[0];
}

/// Reads slot 0 `n` times with `read`, checking each read; returns the values and whether any
/// read retried.
fn reads(t: &SeqTable<W>, read: Reader, n: usize) -> (Vec<u64>, bool) {
    let (mut last, mut retries) = (0, 0);
    let values = (0..n)
        .map(|_| {
            check(read(t, &mut retries), &mut last);
            last
        })
        .collect();
    (values, retries > 0)
}

/// Model (a): one writer stores `[1; W]`, runs an aborted update that scribbles `[9; W]` on its
/// copy, stores `[2; W]`; a reader reads twice. Preemption bound 2 (about 130,000 executions;
/// bound 3 explores about 720,000 in some 40 s and reaches no new outcome).
fn one_writer(read: Reader) -> (usize, BTreeSet<(Vec<u64>, bool)>) {
    explore(Some(2), move || {
        let t = table();
        let w = {
            let t = t.clone();
            thread::spawn(move || {
                write(&t, 1);
                t.update(0, false, |d| {
                    *d = [9; W];
                    (false, ())
                });
                write(&t, 2);
            })
        };
        let r = {
            let t = t.clone();
            thread::spawn(move || reads(&t, read, 2))
        };
        w.join().unwrap_or_else(|_| panic!("writer panicked"));
        let out = r.join().unwrap_or_else(|_| panic!("reader panicked"));
        assert_eq!(t.read(0), [2; W]);
        out
    })
}

/// Spawns two writers that each increment slot 0 once.
fn incrementers(t: &Arc<SeqTable<W>>) -> Vec<thread::JoinHandle<()>> {
    (0..2)
        .map(|_| {
            let t = t.clone();
            thread::spawn(move || increment(&t))
        })
        .collect()
}

/// Model (b): two writers each increment the cell; a reader reads twice. Preemption bound 1:
/// from 2 on, loom's scheduler lets the two waiting threads hand the processor to each other
/// forever while the holder is preempted, and reports a livelock that no fair scheduler has.
fn two_writers(read: Reader) -> (usize, BTreeSet<(Vec<u64>, bool)>) {
    explore(Some(1), move || {
        let t = table();
        let writers = incrementers(&t);
        let r = {
            let t = t.clone();
            thread::spawn(move || reads(&t, read, 2))
        };
        for w in writers {
            w.join().unwrap_or_else(|_| panic!("writer panicked"));
        }
        let out = r.join().unwrap_or_else(|_| panic!("reader panicked"));
        assert_eq!(t.read(0), [2; W], "an increment was lost");
        out
    })
}

/// Model (c): two writers each increment the cell (its data then equals its write count); a
/// reader loads the stamp, reads the cell, loads the stamp again. The read is never older than
/// the first stamp and the stamps never go back. Preemption bound 1 (as model (b)).
#[test]
fn loom_models_stamps_never_run_ahead_of_the_data() {
    let (runs, seen) = explore(Some(1), move || {
        let t = table();
        let writers = incrementers(&t);
        let r = {
            let t = t.clone();
            thread::spawn(move || {
                let before = t.stamp(0);
                let data = t.read(0);
                let after = t.stamp(0);
                assert!(
                    data[0] >= u64::from(before),
                    "read {data:?} after stamp {before}"
                );
                assert!(after >= before, "stamp went back: {before} then {after}");
                (before, data[0])
            })
        };
        for w in writers {
            w.join().unwrap_or_else(|_| panic!("writer panicked"));
        }
        let out = r.join().unwrap_or_else(|_| panic!("reader panicked"));
        assert_eq!(t.stamp(0), 2, "the last write's stamp");
        out
    });
    assert!(runs > 1000, "loom explored only {runs} executions");
    for stamp in 0..=2 {
        assert!(
            seen.iter().any(|&(s, _)| s == stamp),
            "never loaded stamp {stamp}: {seen:?}"
        );
    }
    assert!(
        seen.iter().any(|&(s, d)| d > u64::from(s)),
        "no read ever ran ahead of its stamp: {seen:?}"
    );
}

/// Checks that both readers made loom explore the same executions, and that the counting one
/// reached every pair of values a monotone reader can see, with and without retries.
fn assert_covered(
    real: (usize, BTreeSet<(Vec<u64>, bool)>),
    counting: (usize, BTreeSet<(Vec<u64>, bool)>),
) {
    eprintln!("{} executions, outcomes {:?}", real.0, counting.1);
    assert!(real.0 > 1000, "loom explored only {} executions", real.0);
    assert_eq!(
        real.0, counting.0,
        "the two readers were explored differently"
    );
    let values: BTreeSet<_> = counting.1.iter().map(|(v, _)| v.clone()).collect();
    for a in 0..=2 {
        for b in a..=2 {
            assert!(values.contains(&vec![a, b]), "never read {a} then {b}");
        }
    }
    assert!(
        counting.1.iter().any(|o| o.1),
        "no read ever overlapped a write"
    );
}

#[test]
fn loom_models_one_writer_one_reader() {
    assert_covered(one_writer(read_real), one_writer(read_counting));
}

#[test]
fn loom_models_two_writers_one_reader() {
    assert_covered(two_writers(read_real), two_writers(read_counting));
}

/// [`SeqTable::read`] without the `Acquire` fence between the data loads and the version re-load.
fn read_without_fence(t: &SeqTable<W>, _retries: &mut u32) -> [u64; W] {
    let Some(cell) = t.cell(0) else {
        return [0; W];
    };
    let mut spins = 0;
    loop {
        let v1 = cell.version.load(Ordering::Acquire);
        if v1 & 1 == 0 {
            let data: [u64; W] = std::array::from_fn(|i| cell.words[i].load(Ordering::Relaxed));
            // BROKEN: fence(Ordering::Acquire) removed.
            if cell.version.load(Ordering::Relaxed) == v1 {
                return data;
            }
        }
        backoff(&mut spins);
    }
}

/// How a broken writer takes and releases the cell.
#[derive(Debug, Clone, Copy)]
enum BrokenWriter {
    /// The final even version is stored `Relaxed` instead of `Release`.
    RelaxedRelease,
    /// The cell is taken with a load and a store instead of one `compare_exchange`.
    NoCas,
}

/// [`SeqTable::update`] with one defect; always stores `[d[0] + 1; W]`.
fn broken_increment(t: &SeqTable<W>, how: BrokenWriter) {
    let Some(cell) = t.cell(0) else {
        return;
    };
    let mut spins = 0;
    let v = loop {
        let v = cell.version.load(Ordering::Relaxed);
        if v & 1 == 0 {
            match how {
                BrokenWriter::RelaxedRelease => {
                    if cell
                        .version
                        .compare_exchange_weak(v, v + 1, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        break v;
                    }
                }
                BrokenWriter::NoCas => {
                    // BROKEN: two writers can both see `v` even and both take the cell.
                    cell.version.store(v + 1, Ordering::Relaxed);
                    break v;
                }
            }
        }
        backoff(&mut spins);
    };
    fence(Ordering::Release);
    let next = cell.words[0].load(Ordering::Relaxed) + 1;
    for w in &cell.words {
        w.store(next, Ordering::Relaxed);
    }
    let release = match how {
        BrokenWriter::RelaxedRelease => Ordering::Relaxed, // BROKEN: must be Release.
        BrokenWriter::NoCas => Ordering::Release,
    };
    cell.version.store(v + 2, release);
}

/// One writer (`write`) and one reader (`read`, twice), the shape of model (a).
fn writer_then_reader(write: fn(&SeqTable<W>), read: Reader) -> String {
    must_fail(Some(2), move || {
        let t = table();
        let w = {
            let t = t.clone();
            thread::spawn(move || write(&t))
        };
        let r = {
            let t = t.clone();
            thread::spawn(move || reads(&t, read, 2))
        };
        w.join().unwrap_or_else(|_| panic!("writer panicked"));
        r.join().unwrap_or_else(|_| panic!("reader panicked"));
    })
}

#[test]
fn loom_models_negative_reader_without_acquire_fence_tears() {
    let msg = writer_then_reader(|t| write(t, 1), read_without_fence);
    assert!(
        msg.contains("torn read"),
        "failed for another reason: {msg}"
    );
}

#[test]
fn loom_models_negative_writer_relaxed_release_tears() {
    let msg = writer_then_reader(
        |t| broken_increment(t, BrokenWriter::RelaxedRelease),
        read_real,
    );
    assert!(
        msg.contains("torn read"),
        "failed for another reason: {msg}"
    );
}

#[test]
fn loom_models_negative_writers_without_cas_lose_an_increment() {
    let msg = must_fail(Some(1), || {
        let t = table();
        let writers: Vec<_> = (0..2)
            .map(|_| {
                let t = t.clone();
                thread::spawn(move || broken_increment(&t, BrokenWriter::NoCas))
            })
            .collect();
        for w in writers {
            w.join().unwrap_or_else(|_| panic!("writer panicked"));
        }
        assert_eq!(t.read(0), [2; W], "an increment was lost");
    });
    assert!(
        msg.contains("an increment was lost"),
        "failed for another reason: {msg}"
    );
}

/// Writes `[1; W]` into `slot` as [`SeqTable::update`] does, except that the group increment is
/// `Relaxed` when `broken` (it must be `Release`).
fn group_write(t: &SeqTable<W>, slot: u32, broken: bool) {
    if !broken {
        t.update(slot, false, |d| {
            *d = [1; W];
            (true, ())
        });
        return;
    }
    let (Some(cell), Some(stamp), Some(group)) = (
        t.cell(slot),
        t.stamps.get(slot as usize),
        t.groups.get(slot as usize >> GROUP_SHIFT),
    ) else {
        return;
    };
    let mut spins = 0;
    let v = loop {
        let v = cell.version.load(Ordering::Relaxed);
        if v & 1 == 0
            && cell
                .version
                .compare_exchange_weak(v, v + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            break v;
        }
        backoff(&mut spins);
    };
    fence(Ordering::Release);
    for w in &cell.words {
        w.store(1, Ordering::Relaxed);
    }
    stamp.store(((v + 2) >> 1) as u32, Ordering::Release);
    cell.version.store(v + 2, Ordering::Release);
    group.fetch_add(1, Ordering::Relaxed); // BROKEN: must be Release.
}

/// Two writers each write one cell of the one group (slots 0 and 1, `group_write`); a reader
/// loads the group stamp, both cells' stamps, then the group stamp again, and checks that every
/// write the group stamp counts has its cell stamp visible and that the group stamp never goes
/// back. Returns (group stamp, sum of cell stamps) per execution.
fn group_model(broken: bool) -> (usize, BTreeSet<(u32, u32)>) {
    explore(Some(1), move || {
        let t = table();
        let writers: Vec<_> = (0..2u32)
            .map(|slot| {
                let t = t.clone();
                thread::spawn(move || group_write(&t, slot, broken))
            })
            .collect();
        let r = {
            let t = t.clone();
            thread::spawn(move || {
                let g = t.groups().get(0);
                let cells = t.stamp(0) + t.stamp(1);
                let again = t.groups().get(0);
                assert!(cells >= g, "group stamp {g} ahead of cell stamps {cells}");
                assert!(again >= g, "group stamp went back: {g} then {again}");
                (g, cells)
            })
        };
        for w in writers {
            w.join().unwrap_or_else(|_| panic!("writer panicked"));
        }
        let out = r.join().unwrap_or_else(|_| panic!("reader panicked"));
        assert_eq!(t.groups().get(0), 2, "a group increment was lost");
        out
    })
}

/// Model (d): group stamps never run ahead of the cell stamps they count (what the probe sets
/// rely on to skip unchanged groups, `super::probes`), and loom reached every group stamp and a
/// cell stamp ahead of its group's (a write between its two stores).
#[test]
fn loom_models_group_stamps_never_run_ahead_of_the_cell_stamps() {
    let (runs, seen) = group_model(false);
    assert!(runs > 100, "loom explored only {runs} executions");
    for g in 0..=2 {
        assert!(
            seen.iter().any(|&(s, _)| s == g),
            "never loaded group stamp {g}: {seen:?}"
        );
    }
    assert!(
        seen.iter().any(|&(g, c)| c > g),
        "never saw a cell stamp ahead of its group's: {seen:?}"
    );
}

#[test]
fn loom_models_negative_relaxed_group_increment_runs_ahead() {
    let msg = crate::loom_support::must_fail("seqlock", || {
        group_model(true);
    });
    assert!(
        msg.contains("ahead of cell stamps"),
        "failed for another reason: {msg}"
    );
}
