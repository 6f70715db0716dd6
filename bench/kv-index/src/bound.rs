//! The bound of figure (1): about the least work a hashed index that meets KV-IDX-06 does per
//! block event, timed on the same window in the same turns, so that the figure-1 rates can be
//! read against what the machine allows, not only against each other.
//!
//! Role: [`Bound`] keeps only what KV-IDX-06 cannot do without: per rank, a map from engine hash
//! to the block's path hash (a `removed` event names engine hashes, so every index must look
//! them up), and per path hash the number of ranks holding it (the node a stored block joins and
//! a removed one leaves). Both are `std` `HashMap`s (SwissTable) with a one-multiply hasher. It
//! has no owner sets (a count instead), no second copy and no publish (no reader on another core
//! could use it), no caps and no budget; an index that answers `find_matches` on other cores does
//! all of this and more. It is not a lower bound for every layout: a tree whose nodes sit in the
//! order a chain was stored in (RadixTree) can come out a little ahead of it. Nothing reads it.
//!
//! Invariant: after the trace it holds exactly the trace's `(rank, engine hash)` pairs, so its
//! entry count equals our ownerships (the report checks it).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use continuum_core::kv::{TokensHash, path_hash};
use continuum_core::picker::BlockHash;

use crate::trace::{Envelope, Events, Op};

/// A one-multiply hasher (the fold of foldhash / aHash's fallback): about the least a hashed
/// lookup can cost. Fixed key: the bench's input is its own, not the fleet's.
#[derive(Debug, Default)]
pub(crate) struct Fold(u64);

impl Hasher for Fold {
    /// Byte by byte (the maps here hash only `u64` keys, through [`Hasher::write_u64`]).
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, x: u64) {
        let p = u128::from(self.0 ^ x) * 0x9E37_79B9_7F4A_7C15_u128;
        self.0 = (p as u64) ^ ((p >> 64) as u64);
    }

    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type Build = BuildHasherDefault<Fold>;

/// The least-work index (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Bound {
    /// Per rank index: engine hash → path hash.
    keys: Vec<HashMap<u64, u64, Build>>,
    /// Path hash → ranks holding it.
    nodes: HashMap<u64, u32, Build>,
}

impl Bound {
    /// Applies one envelope (a `stored` under a parent the rank lacks changes nothing).
    #[inline]
    pub(crate) fn apply(&mut self, ev: &Events, e: &Envelope) {
        let r = e.rank as usize;
        if self.keys.len() <= r {
            self.keys.resize_with(r + 1, HashMap::default);
        }
        let Self { keys, nodes } = self;
        let Some(keys) = keys.get_mut(r) else {
            return;
        };
        for op in ev.ops(e) {
            match *op {
                Op::Store { parent, start, len } => {
                    let mut prev = match parent {
                        None => None,
                        Some(p) => match keys.get(&p) {
                            Some(&x) => Some(BlockHash(x)),
                            None => continue,
                        },
                    };
                    for b in ev.stored(start, len) {
                        let path = path_hash(prev, TokensHash(b.tokens));
                        match keys.insert(b.engine, path.0) {
                            Some(old) if old == path.0 => {}
                            old => {
                                if let Some(o) = old {
                                    leave(nodes, o);
                                }
                                *nodes.entry(path.0).or_insert(0) += 1;
                            }
                        }
                        prev = Some(path);
                    }
                }
                Op::Remove { start, len } => {
                    for h in ev.removed(start, len) {
                        if let Some(p) = keys.remove(h) {
                            leave(nodes, p);
                        }
                    }
                }
            }
        }
    }

    /// `(rank, engine hash)` pairs held.
    pub(crate) fn ownerships(&self) -> usize {
        self.keys.iter().map(HashMap::len).sum()
    }

    /// Distinct path hashes held.
    pub(crate) fn blocks(&self) -> usize {
        self.nodes.len()
    }
}

/// One rank lets go of `path`.
fn leave(nodes: &mut HashMap<u64, u32, Build>, path: u64) {
    if let Some(c) = nodes.get_mut(&path) {
        *c -= 1;
        if *c == 0 {
            nodes.remove(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Block;

    fn b(engine: u64, tokens: u64) -> Block {
        Block { engine, tokens }
    }

    /// Two ranks share a prefix; a removal, a parent the rank lacks and an engine hash reused for
    /// another block move the counts as the rule says.
    #[test]
    fn counts_follow_stores_and_removals() {
        let ev = Events {
            envelopes: Vec::new(),
            stored: vec![b(1, 10), b(2, 20), b(1, 10), b(3, 30), b(9, 90), b(3, 40)],
            removed: vec![2, 7],
            ops: vec![
                Op::Store {
                    parent: None,
                    start: 0,
                    len: 2,
                },
                Op::Store {
                    parent: None,
                    start: 2,
                    len: 1,
                },
                Op::Store {
                    parent: Some(1),
                    start: 3,
                    len: 1,
                },
                Op::Store {
                    parent: Some(5),
                    start: 4,
                    len: 1,
                },
                Op::Remove { start: 0, len: 2 },
                Op::Store {
                    parent: Some(1),
                    start: 5,
                    len: 1,
                },
            ],
        };
        let env = |rank, start, len| Envelope { rank, start, len };
        let mut bound = Bound::default();
        bound.apply(&ev, &env(0, 0, 1));
        bound.apply(&ev, &env(1, 1, 2));
        // Rank 0: 1 -> 2; rank 1: 1 -> 3; the store under engine hash 5 is dropped.
        bound.apply(&ev, &env(1, 3, 1));
        assert_eq!((bound.ownerships(), bound.blocks()), (4, 3));
        // Rank 0 lets go of 2 (7 it never held): block 2 has no owner left.
        bound.apply(&ev, &env(0, 4, 1));
        assert_eq!((bound.ownerships(), bound.blocks()), (3, 2));
        // Rank 1 reuses engine hash 3 for another block under 1: the old block loses its owner.
        bound.apply(&ev, &env(1, 5, 1));
        assert_eq!((bound.ownerships(), bound.blocks()), (3, 2));
    }
}
