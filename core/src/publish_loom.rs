//! Loom model of snapshot publication through [`super::PublishCell`] (compiled only under
//! `cfg(all(test, loom))`).
//!
//! Role: checks API-07 over every interleaving and every value loom's memory model lets the
//! loads return: the control thread publishes generation 2 then 3 with the real
//! [`PublishCell::publish`]; a reader calls the real [`PublishCell::generation`] then
//! [`PublishCell::load`] twice and asserts that a reader that observed generation `g` loads a
//! payload of generation `>= g`, and that the generations it observes never go back.
//!
//! Negative controls, each one line away from `publish`, which loom must catch: the generation
//! stored before the payload, and the generation stored `Relaxed` (with the payload slot
//! modelled as an atomic pointer, a reader that saw the new generation without synchronising may
//! still load the old payload).
//!
//! As in `seqcell_loom.rs` (loom 0.7 explores almost nothing when the reader is the model's main
//! thread, tokio-rs/loom#392): the main thread only spawns and joins, the writer is spawned
//! first, and the positive model asserts that loom reached the interesting outcomes (a payload
//! newer than the generation read just before it, every generation, both loads).
//!
//! Run: `CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" cargo test -p continuum-core --release --lib loom_models`

use std::collections::BTreeSet;

use loom::sync::Arc;
use loom::thread;

use super::{Generation, Ordering, PublishCell};
use crate::loom_support::Outcomes;

/// The models' payload: just a generation.
#[derive(Debug)]
pub(super) struct Snap(pub(super) u64);

impl Generation for Snap {
    fn generation(&self) -> u64 {
        self.0
    }
}

/// How the control thread publishes.
type Publish = fn(&PublishCell<Snap>, Snap);

/// What one reader saw: `(generation, loaded payload's generation)` per read.
type Seen = Vec<(u64, u64)>;

/// The real publication.
fn publish_real(cell: &PublishCell<Snap>, next: Snap) {
    cell.publish(next);
}

/// BROKEN: the generation is published before the payload.
fn publish_generation_first(cell: &PublishCell<Snap>, next: Snap) {
    cell.generation.store(next.0, Ordering::Release);
    cell.current.store(std::sync::Arc::new(next));
}

/// BROKEN: the generation is stored `Relaxed`, so it does not carry the payload store with it.
fn publish_relaxed(cell: &PublishCell<Snap>, next: Snap) {
    let generation = next.0;
    cell.current.store(std::sync::Arc::new(next));
    cell.generation.store(generation, Ordering::Relaxed);
}

/// Control publishes 2 then 3 with `publish`; a reader reads twice; returns the number of
/// executions and the set of what the reader saw. Panics (under loom) on a violation.
fn model(publish: Publish) -> (usize, BTreeSet<Seen>) {
    let seen = Outcomes::new();
    let sink = seen.handle();
    let mut builder = loom::model::Builder::new();
    // Larger than the preemptions of any execution here, so nothing is pruned; unlike `None`, a
    // bound also makes loom add bounded DPOR's conservative backtracking points, which explore
    // more executions and make up for part of what loom#392 misses.
    builder.preemption_bound = Some(100);
    builder.check(move || {
        let cell = Arc::new(PublishCell::new(Snap(1)));
        let control = {
            let cell = cell.clone();
            thread::spawn(move || {
                publish(&cell, Snap(2));
                publish(&cell, Snap(3));
            })
        };
        let reader = {
            let cell = cell.clone();
            thread::spawn(move || {
                let mut last = 0;
                (0..2)
                    .map(|_| {
                        let g = cell.generation();
                        let loaded = cell.load().generation();
                        assert!(
                            loaded >= g,
                            "API-07 violated: saw generation {g}, loaded snapshot {loaded}"
                        );
                        assert!(g >= last, "generation went back: {g} after {last}");
                        last = g;
                        (g, loaded)
                    })
                    .collect::<Seen>()
            })
        };
        control
            .join()
            .unwrap_or_else(|_| panic!("control panicked"));
        let out = reader.join().unwrap_or_else(|_| panic!("reader panicked"));
        assert_eq!((cell.generation(), cell.load().0), (3, 3));
        sink.record(out);
    });
    seen.take()
}

/// Runs a model that must fail; returns its panic message.
fn must_fail(publish: Publish) -> String {
    crate::loom_support::must_fail("publication", || {
        model(publish);
    })
}

#[test]
fn loom_models_publication_generation_never_ahead_of_snapshot() {
    let (runs, seen) = model(publish_real);
    eprintln!("{runs} executions, outcomes {seen:?}");
    assert!(runs > 100, "loom explored only {runs} executions");
    let reads: BTreeSet<(u64, u64)> = seen.iter().flatten().copied().collect();
    for g in 1..=3 {
        assert!(reads.contains(&(g, g)), "never read generation {g}");
    }
    for (g, loaded) in [(1, 2), (1, 3), (2, 3)] {
        assert!(
            reads.contains(&(g, loaded)),
            "never loaded snapshot {loaded} after reading generation {g}"
        );
    }
}

#[test]
fn loom_models_negative_generation_published_first() {
    let msg = must_fail(publish_generation_first);
    assert!(
        msg.contains("API-07 violated"),
        "failed for another reason: {msg}"
    );
}

#[test]
fn loom_models_negative_generation_published_relaxed() {
    let msg = must_fail(publish_relaxed);
    assert!(
        msg.contains("API-07 violated"),
        "failed for another reason: {msg}"
    );
}
