//! Suspect workers: workers whose `kv_metrics` publisher connection dropped (EOF or reset), so
//! their process is most likely gone although their lease has not expired yet (issue 38).
//!
//! Role: the one cross-shard list the pickers consult to leave such workers out while another
//! worker can serve (the shards' fleet filter), and the re-pick after a dead pinned
//! worker reads to tell which pin was the dead one. Written by the shard owning the worker's
//! `kv_metrics` subscription (marked when its session ends with the connection closed or reset,
//! cleared when it completes a handshake again or applies a sample); a worker that leaves the
//! fleet stays listed harmlessly until its subscription stops, which clears it.
//!
//! Invariants:
//! - readers take no lock: a pick reads [`Suspects::version`] (one atomic load) and only when it
//!   changed the list itself (one `ArcSwap` load); writers serialise on a mutex no reader takes,
//!   only on those rare connection events, never per message or per request;
//! - the list is bounded ([`MAX_SUSPECTS`]; the oldest mark goes first) and holds each id once;
//! - `version` changes exactly when the list does, after the new list is visible.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use continuum_core::discovery::InstanceId;

/// The most workers held suspect at once (a fleet-wide outage beyond this many is left to the
/// leases): the oldest mark is dropped first.
pub const MAX_SUSPECTS: usize = 1024;

/// The suspect workers (module docs).
#[derive(Debug, Default)]
pub struct Suspects {
    list: ArcSwap<Vec<InstanceId>>,
    version: AtomicU64,
    write: Mutex<()>,
}

impl Suspects {
    /// Bumped after every change of the list (0: never changed).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The current list.
    pub fn list(&self) -> Arc<Vec<InstanceId>> {
        self.list.load_full()
    }

    /// Whether `id` is suspect now.
    pub fn contains(&self, id: InstanceId) -> bool {
        self.version() != 0 && self.list.load().contains(&id)
    }

    /// How many workers are suspect now.
    pub fn len(&self) -> usize {
        self.list.load().len()
    }

    /// Whether no worker is suspect.
    pub fn is_empty(&self) -> bool {
        self.list.load().is_empty()
    }

    /// Marks `ids` suspect; whether the list changed.
    pub fn mark(&self, ids: &[InstanceId]) -> bool {
        self.update(|list| {
            let mut changed = false;
            for id in ids {
                if !list.contains(id) {
                    if list.len() >= MAX_SUSPECTS {
                        list.remove(0);
                    }
                    list.push(*id);
                    changed = true;
                }
            }
            changed
        })
    }

    /// Lifts the mark of `ids`; whether the list changed. Free when none is listed.
    pub fn clear(&self, ids: &[InstanceId]) -> bool {
        if ids.is_empty() || !self.list.load().iter().any(|id| ids.contains(id)) {
            return false;
        }
        self.update(|list| {
            let before = list.len();
            list.retain(|id| !ids.contains(id));
            list.len() != before
        })
    }

    fn update(&self, f: impl FnOnce(&mut Vec<InstanceId>) -> bool) -> bool {
        let _w = self.write.lock().unwrap_or_else(PoisonError::into_inner);
        let mut list = Vec::clone(&self.list.load());
        if !f(&mut list) {
            return false;
        }
        self.list.store(Arc::new(list));
        self.version.fetch_add(1, Ordering::Release);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> InstanceId {
        InstanceId::new(n)
    }

    #[test]
    fn marks_and_clears_bump_the_version_only_on_change() {
        let s = Suspects::default();
        assert_eq!((s.version(), s.is_empty()), (0, true));
        assert!(!s.contains(id(1)));
        assert!(s.mark(&[id(1), id(2)]));
        let v = s.version();
        assert!(v > 0);
        assert!(!s.mark(&[id(2)]), "already listed");
        assert_eq!(s.version(), v);
        assert!(s.contains(id(1)) && s.contains(id(2)) && !s.contains(id(3)));
        assert!(!s.clear(&[id(3)]));
        assert_eq!(s.version(), v);
        assert!(s.clear(&[id(1)]));
        assert!(s.version() > v);
        assert_eq!(*s.list(), vec![id(2)]);
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn the_list_is_bounded_and_drops_the_oldest() {
        let s = Suspects::default();
        for n in 0..(MAX_SUSPECTS as u64 + 10) {
            s.mark(&[id(n)]);
        }
        assert_eq!(s.len(), MAX_SUSPECTS);
        assert!(!s.contains(id(9)), "the oldest marks went first");
        assert!(s.contains(id(10)) && s.contains(id(MAX_SUSPECTS as u64 + 9)));
    }
}
