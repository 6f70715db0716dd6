//! The one publication point for router snapshots.
//!
//! [`SnapshotCell`] holds the current `Arc<RouterSnapshot>` in a single `ArcSwap` (one per
//! consistent snapshot, never two that must agree) and a generation counter. The control thread
//! is the only writer: it stores the snapshot first and bumps the generation second, so a reader
//! that observes generation `g` always loads a snapshot of generation `>= g` (API-07).
//! Readers never lock; shards load the `Arc` once per publication, not per request.
//!
//! The cell is generic over its payload ([`PublishCell`], of any [`Generation`]; [`SnapshotCell`]
//! is the router's one instance) so that the protocol can be model-checked with loom on a tiny
//! payload: `publish_loom.rs` checks API-07, `mailbox_loom.rs` the shard's wake-up after a
//! publication (both `RUSTFLAGS="--cfg loom"`). Under `cfg(loom)` the generation is a loom
//! atomic and the `ArcSwap` is replaced by a model of an atomic pointer (see `Slot` there); a
//! normal build is the `ArcSwap` and `std` atomic, unchanged.

use std::sync::Arc;

#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};

use crate::snapshot::RouterSnapshot;

/// The slot holding the current payload.
#[cfg(not(loom))]
type Slot<T> = arc_swap::ArcSwap<T>;

/// A payload that carries the generation it was published under.
pub trait Generation {
    /// The generation of this payload; strictly increasing across publications.
    fn generation(&self) -> u64;
}

impl Generation for RouterSnapshot {
    fn generation(&self) -> u64 {
        self.generation
    }
}

/// The router's published snapshot and its generation.
pub type SnapshotCell = PublishCell<RouterSnapshot>;

/// A published payload and its generation.
#[derive(Debug)]
pub struct PublishCell<T> {
    current: Slot<T>,
    generation: AtomicU64,
}

impl<T: Generation> PublishCell<T> {
    /// A cell holding `initial`.
    pub fn new(initial: T) -> Self {
        let generation = AtomicU64::new(initial.generation());
        Self {
            current: Slot::from_pointee(initial),
            generation,
        }
    }

    /// The current payload.
    pub fn load(&self) -> Arc<T> {
        self.current.load_full()
    }

    /// The generation of the latest publication.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Publish `next`: swap the payload, then publish its generation. The caller (the control
    /// thread, the only writer) guarantees `next.generation()` exceeds the current one.
    pub fn publish(&self, next: T) {
        let generation = next.generation();
        self.current.store(Arc::new(next));
        self.generation.store(generation, Ordering::Release);
    }
}

/// Loom's stand-in for `ArcSwap`: an atomic pointer modelled as a loom atomic index into the
/// list of every payload ever stored. Stores are `Release` and loads `Acquire`, the weakest
/// orderings an atomic pointer swap can offer (`ArcSwap` swaps `SeqCst`), so whatever the models
/// prove holds a fortiori for it; and, unlike a lock, a loom atomic lets a load that is not
/// ordered after a store return an older payload, which is what a misordered publication shows.
/// The list is a `std` mutex never held across a loom operation: loom runs one thread at a time,
/// so it is never contended, and an index is only read after the push that created it.
#[cfg(loom)]
#[derive(Debug)]
struct Slot<T> {
    stored: std::sync::Mutex<Vec<Arc<T>>>,
    current: loom::sync::atomic::AtomicUsize,
}

#[cfg(loom)]
impl<T> Slot<T> {
    fn from_pointee(initial: T) -> Self {
        Self {
            stored: std::sync::Mutex::new(vec![Arc::new(initial)]),
            current: loom::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn stored(&self) -> std::sync::MutexGuard<'_, Vec<Arc<T>>> {
        self.stored
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn load_full(&self) -> Arc<T> {
        let i = self.current.load(Ordering::Acquire);
        Arc::clone(&self.stored()[i])
    }

    fn store(&self, next: Arc<T>) {
        let i = {
            let mut stored = self.stored();
            stored.push(next);
            stored.len() - 1
        };
        self.current.store(i, Ordering::Release);
    }
}

#[cfg(test)]
#[cfg(loom)]
#[path = "publish_loom.rs"]
mod loom_models;

#[cfg(test)]
#[cfg(loom)]
#[path = "mailbox_loom.rs"]
mod mailbox_loom_models;
