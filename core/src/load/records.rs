//! One pool of doubly linked lists: the dispatch ledger's per-key record queues share its nodes.
//!
//! Role: a [`super::DispatchLedger`] keeps, per key, its dispatch records in time order. With a
//! queue per key, every key's own peak had to be reached before the ledger stopped allocating,
//! and a picker that favours a few quiet keys keeps setting new per-key peaks long after warm-up.
//! Here every key's list draws from one pool, so the ledger allocates only when the number of
//! records held by the whole shard passes its own peak.
//!
//! Invariants:
//! - a node is in at most one list, or free (its value `None`); a removed node's index reads as
//!   absent ([`ListPool::get`] is `None`) until a later push reuses it;
//! - a [`List`] is only ever passed to the pool that filled it, and an index only with the list
//!   holding it (callers keep both; a debug check catches a mismatch in tests);
//! - no operation panics; pushes allocate only when no node is free, removals never do.

/// Index of a node in a [`ListPool`].
pub(crate) type NodeIx = u32;

const NIL: NodeIx = NodeIx::MAX;

#[derive(Debug)]
struct Node<T> {
    value: Option<T>,
    prev: NodeIx,
    next: NodeIx,
}

/// The ends and length of one list of a [`ListPool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct List {
    head: NodeIx,
    tail: NodeIx,
    len: usize,
}

impl List {
    /// An empty list.
    pub(crate) const fn new() -> Self {
        Self {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    /// Nodes in the list.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the list holds nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first node.
    pub(crate) fn front(&self) -> Option<NodeIx> {
        (self.head != NIL).then_some(self.head)
    }

    /// The last node.
    pub(crate) fn back(&self) -> Option<NodeIx> {
        (self.tail != NIL).then_some(self.tail)
    }
}

/// Nodes shared by many [`List`]s, with a free list.
#[derive(Debug)]
pub(crate) struct ListPool<T> {
    nodes: Vec<Node<T>>,
    /// First free node (chained through `next`).
    free: NodeIx,
}

impl<T> ListPool<T> {
    /// An empty pool.
    pub(crate) const fn new() -> Self {
        Self {
            nodes: Vec::new(),
            free: NIL,
        }
    }

    /// The value at `at`, if a list holds it.
    pub(crate) fn get(&self, at: NodeIx) -> Option<&T> {
        self.nodes.get(at as usize)?.value.as_ref()
    }

    /// The value at `at`, if a list holds it.
    pub(crate) fn get_mut(&mut self, at: NodeIx) -> Option<&mut T> {
        self.nodes.get_mut(at as usize)?.value.as_mut()
    }

    /// The node after `at` in its list.
    pub(crate) fn next(&self, at: NodeIx) -> Option<NodeIx> {
        let n = self.nodes.get(at as usize)?;
        (n.value.is_some() && n.next != NIL).then_some(n.next)
    }

    /// The node before `at` in its list.
    pub(crate) fn prev(&self, at: NodeIx) -> Option<NodeIx> {
        let n = self.nodes.get(at as usize)?;
        (n.value.is_some() && n.prev != NIL).then_some(n.prev)
    }

    /// Appends `value` to `list`; its node's index, or `None` (nothing stored) when the pool
    /// has no index left.
    pub(crate) fn push_back(&mut self, list: &mut List, value: T) -> Option<NodeIx> {
        let at = if let Some(node) = self.nodes.get_mut(self.free as usize) {
            let at = self.free;
            self.free = node.next;
            node.value = Some(value);
            node.prev = list.tail;
            node.next = NIL;
            at
        } else {
            let at = NodeIx::try_from(self.nodes.len())
                .ok()
                .filter(|at| *at != NIL)?;
            self.nodes.push(Node {
                value: Some(value),
                prev: list.tail,
                next: NIL,
            });
            at
        };
        match self.nodes.get_mut(list.tail as usize) {
            Some(tail) => tail.next = at,
            None => list.head = at,
        }
        list.tail = at;
        list.len += 1;
        Some(at)
    }

    /// Unlinks node `at` from `list` (which must hold it) and returns its value.
    pub(crate) fn remove(&mut self, list: &mut List, at: NodeIx) -> Option<T> {
        let node = self.nodes.get_mut(at as usize)?;
        let value = node.value.take()?;
        let (prev, next) = (node.prev, node.next);
        node.next = self.free;
        node.prev = NIL;
        self.free = at;
        match self.nodes.get_mut(prev as usize) {
            Some(p) => p.next = next,
            None => {
                debug_assert_eq!(list.head, at, "node removed through another list");
                list.head = next;
            }
        }
        match self.nodes.get_mut(next as usize) {
            Some(n) => n.prev = prev,
            None => list.tail = prev,
        }
        list.len = list.len.saturating_sub(1);
        Some(value)
    }

    /// Removes the first node of `list` and returns its value.
    pub(crate) fn pop_front(&mut self, list: &mut List) -> Option<T> {
        let at = list.front()?;
        self.remove(list, at)
    }

    /// Empties `list`, returning its nodes to the pool.
    pub(crate) fn clear(&mut self, list: &mut List) {
        while self.pop_front(list).is_some() {}
        *list = List::new();
    }

    /// Nodes allocated (held or free).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    fn items(pool: &ListPool<u64>, list: &List) -> Vec<u64> {
        let mut out = Vec::new();
        let mut at = list.front();
        while let Some(i) = at {
            out.extend(pool.get(i).copied());
            at = pool.next(i);
        }
        let mut back = Vec::new();
        let mut at = list.back();
        while let Some(i) = at {
            back.extend(pool.get(i).copied());
            at = pool.prev(i);
        }
        back.reverse();
        assert_eq!(out, back, "forward and backward walks agree");
        assert_eq!(out.len(), list.len());
        out
    }

    /// Three lists in one pool against three `VecDeque`s under a deterministic mix of pushes,
    /// front pops, removals from the middle and clears; removed indices read as absent.
    #[test]
    fn lists_in_one_pool_match_separate_deques() {
        let mut pool = ListPool::new();
        let mut lists = [List::new(); 3];
        let mut ixs: [Vec<NodeIx>; 3] = Default::default();
        let mut refs: [VecDeque<u64>; 3] = Default::default();
        let mut state = 7_u64;
        for step in 0..20_000_u64 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            let r = state >> 33;
            let l = (r % 3) as usize;
            match (r >> 2) % 8 {
                0..=3 => {
                    let at = pool.push_back(&mut lists[l], step).expect("index");
                    ixs[l].push(at);
                    refs[l].push_back(step);
                }
                4 | 5 => {
                    let got = pool.pop_front(&mut lists[l]);
                    assert_eq!(got, refs[l].pop_front());
                    if got.is_some() {
                        let at = ixs[l].remove(0);
                        assert_eq!(pool.get(at), None, "a removed node reads as absent");
                    }
                }
                6 if !ixs[l].is_empty() => {
                    let i = ((r >> 5) as usize) % ixs[l].len();
                    let at = ixs[l].remove(i);
                    assert_eq!(pool.remove(&mut lists[l], at), refs[l].remove(i));
                    assert_eq!(pool.remove(&mut lists[l], at), None, "only once");
                }
                7 if step % 97 == 0 => {
                    pool.clear(&mut lists[l]);
                    ixs[l].clear();
                    refs[l].clear();
                }
                _ => {}
            }
            if step % 1_000 == 0 {
                for (list, want) in lists.iter().zip(&refs) {
                    assert_eq!(items(&pool, list), want.iter().copied().collect::<Vec<_>>());
                }
            }
        }
        for (list, want) in lists.iter().zip(&refs) {
            assert_eq!(items(&pool, list), want.iter().copied().collect::<Vec<_>>());
        }
        let held: usize = lists.iter().map(List::len).sum();
        assert!(pool.capacity() >= held);
    }

    /// Once the pool has held `n` nodes, any lists holding at most `n` in total allocate no more
    /// nodes, however the records move between them.
    #[test]
    fn a_pool_reuses_freed_nodes_across_lists() {
        let mut pool = ListPool::new();
        let mut a = List::new();
        let mut b = List::new();
        for v in 0..64 {
            pool.push_back(&mut a, v);
        }
        let peak = pool.capacity();
        for round in 0..100 {
            let (from, to) = if round % 2 == 0 {
                (&mut a, &mut b)
            } else {
                (&mut b, &mut a)
            };
            while let Some(v) = pool.pop_front(from) {
                pool.push_back(to, v);
            }
        }
        assert_eq!(pool.capacity(), peak, "no node allocated after the peak");
        assert_eq!(a.len() + b.len(), 64);
    }
}
