//! The router-wide KV-index budget (KV-IDX-08): one [`Budget`] shared by every shard's index.
//!
//! Role: the caps on nodes and on `(rank, block)` ownerships hold for the whole router, not per
//! shard, while each shard's index has its own single writer. Writers reserve from two atomic
//! counters before they allocate and release on removal; [`Budget::nodes`] and
//! [`Budget::ownerships`] are the current totals for gauges.
//!
//! Invariants:
//! - a counter never exceeds its limit: a reservation is one compare-and-swap that grants at most
//!   what is left, never more (so `nodes() <= node_limit()` and `ownerships() <=
//!   ownership_limit()` at every instant);
//! - every grant is released exactly once by the writer that got it (on removal, or unused at
//!   the end of the call that reserved it); a release never wraps below zero;
//! - the counters carry no data between threads, so `Relaxed` suffices: the single-atomic
//!   read-modify-write order is what keeps the cap.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{MAX_INDEX_BLOCKS, MAX_INDEX_OWNERSHIPS};

/// The shared caps and their current use.
#[derive(Debug)]
pub struct Budget {
    node_limit: usize,
    ownership_limit: usize,
    nodes: AtomicUsize,
    ownerships: AtomicUsize,
}

impl Default for Budget {
    fn default() -> Self {
        Self::new()
    }
}

impl Budget {
    /// The KV-IDX-08 caps: [`MAX_INDEX_BLOCKS`] nodes, [`MAX_INDEX_OWNERSHIPS`] ownerships.
    pub const fn new() -> Self {
        Self::with_limits(MAX_INDEX_BLOCKS, MAX_INDEX_OWNERSHIPS)
    }

    /// Other caps (tests, fuzzing).
    pub const fn with_limits(nodes: usize, ownerships: usize) -> Self {
        Self {
            node_limit: nodes,
            ownership_limit: ownerships,
            nodes: AtomicUsize::new(0),
            ownerships: AtomicUsize::new(0),
        }
    }

    /// Nodes held by all indexes now.
    pub fn nodes(&self) -> usize {
        self.nodes.load(Ordering::Relaxed)
    }

    /// Ownerships held by all indexes now.
    pub fn ownerships(&self) -> usize {
        self.ownerships.load(Ordering::Relaxed)
    }

    /// The node cap.
    pub fn node_limit(&self) -> usize {
        self.node_limit
    }

    /// The ownership cap.
    pub fn ownership_limit(&self) -> usize {
        self.ownership_limit
    }

    /// Reserves up to `want` nodes; returns how many were granted (0 at the cap).
    pub(crate) fn reserve_nodes(&self, want: usize) -> usize {
        reserve(&self.nodes, self.node_limit, want)
    }

    /// Reserves up to `want` ownerships; returns how many were granted (0 at the cap).
    pub(crate) fn reserve_ownerships(&self, want: usize) -> usize {
        reserve(&self.ownerships, self.ownership_limit, want)
    }

    /// Gives back `n` reserved nodes.
    pub(crate) fn release_nodes(&self, n: usize) {
        release(&self.nodes, n);
    }

    /// Gives back `n` reserved ownerships.
    pub(crate) fn release_ownerships(&self, n: usize) {
        release(&self.ownerships, n);
    }
}

fn reserve(counter: &AtomicUsize, limit: usize, want: usize) -> usize {
    if want == 0 {
        return 0;
    }
    let mut granted = 0;
    // `fetch_update` retries only on contention; the closure always returns `Some`, so the
    // result is never an error.
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
        granted = want.min(limit.saturating_sub(used));
        Some(used + granted)
    });
    granted
}

fn release(counter: &AtomicUsize, n: usize) {
    if n == 0 {
        return;
    }
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
        Some(used.saturating_sub(n))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_stop_exactly_at_the_limit() {
        let b = Budget::with_limits(3, 5);
        assert_eq!(b.reserve_nodes(2), 2);
        assert_eq!(b.reserve_nodes(2), 1, "only one left");
        assert_eq!(b.reserve_nodes(1), 0, "at the cap");
        assert_eq!(b.nodes(), 3);
        b.release_nodes(1);
        assert_eq!(b.reserve_nodes(9), 1);
        assert_eq!(b.reserve_ownerships(5), 5);
        assert_eq!(b.reserve_ownerships(1), 0);
        b.release_ownerships(5);
        assert_eq!(b.ownerships(), 0);
        b.release_ownerships(1);
        assert_eq!(b.ownerships(), 0, "never below zero");
    }

    #[test]
    fn default_is_the_kv_idx_08_caps() {
        let b = Budget::default();
        assert_eq!(b.node_limit(), 1_048_576);
        assert_eq!(b.ownership_limit(), 8_388_608);
    }

    #[test]
    fn concurrent_reservations_never_pass_the_cap() {
        let b = std::sync::Arc::new(Budget::with_limits(1000, 1000));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let b = std::sync::Arc::clone(&b);
                std::thread::spawn(move || (0..600).map(|_| b.reserve_nodes(1)).sum::<usize>())
            })
            .collect();
        let total: usize = threads.into_iter().map(|t| t.join().unwrap_or(0)).sum();
        assert_eq!(total, 1000);
        assert_eq!(b.nodes(), 1000);
    }
}
