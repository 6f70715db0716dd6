//! The one publication point for router snapshots.
//!
//! [`SnapshotCell`] holds the current `Arc<RouterSnapshot>` in a single `ArcSwap` (one per
//! consistent snapshot, never two that must agree) and a generation counter. The control thread
//! is the only writer: it stores the snapshot first and bumps the generation second, so a reader
//! that observes generation `g` always loads a snapshot of generation `>= g` (API-07).
//! Readers never lock; shards load the `Arc` once per publication, not per request.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

use crate::snapshot::RouterSnapshot;

/// The published snapshot and its generation.
#[derive(Debug)]
pub struct SnapshotCell {
    current: ArcSwap<RouterSnapshot>,
    generation: AtomicU64,
}

impl SnapshotCell {
    /// A cell holding `initial`.
    pub fn new(initial: RouterSnapshot) -> Self {
        let generation = AtomicU64::new(initial.generation);
        Self {
            current: ArcSwap::from_pointee(initial),
            generation,
        }
    }

    /// The current snapshot.
    pub fn load(&self) -> Arc<RouterSnapshot> {
        self.current.load_full()
    }

    /// The generation of the latest publication.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Publish `next`: swap the snapshot, then publish its generation. The caller (the control
    /// thread, the only writer) guarantees `next.generation` exceeds the current one.
    pub fn publish(&self, next: RouterSnapshot) {
        let generation = next.generation;
        self.current.store(Arc::new(next));
        self.generation.store(generation, Ordering::Release);
    }
}
