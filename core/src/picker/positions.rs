//! Where a pick's candidates sit, as an overlap source's parts number their ranks (issue 11,
//! "pick at scale").
//!
//! Role: an index reports the ranks that hold a prompt's blocks by its own rank *slots*; the KV
//! stage needs each as a position in its candidate list. Looking every reported rank up by key
//! (a hash probe per rank, per pick) cost more than the match walk itself when most of the fleet
//! holds part of the prompt. [`RankPositions`] keeps, per part of a source (one shard's index),
//! the slot → position map, rebuilt only when that part's slot → rank map (its *layout* stamp)
//! or the candidate list ([`Positions::serial`]) changed.
//!
//! Invariants:
//! - a map is used only for the part (by number), layout and candidate serial it was built
//!   for; a layout stamp names one slot → rank map of its part (it counts the changes of that
//!   map, and every copy of a part replays the same changes);
//! - a slot maps to the *first* position of its rank's key ([`Positions::first`]); callers walk
//!   the key's further positions themselves;
//! - rebuilding allocates only when the part has more slots than ever before.

use crate::load::LoadKey;

/// A candidate list's positions by key.
pub trait Positions {
    /// Unique per candidate list (changes whenever the list does).
    fn serial(&self) -> u64;

    /// The first position of `key`, if it is a candidate.
    fn first(&self, key: LoadKey) -> Option<u32>;
}

/// No position (slot not mapped).
const NONE: u32 = u32::MAX;

/// One part's slot → position map (module docs).
#[derive(Debug, Default)]
pub struct PartPositions {
    part: u64,
    layout: u64,
    serial: u64,
    built: bool,
    of_slot: Vec<u32>,
}

impl PartPositions {
    /// Makes the map current for part `part` at `layout` and `positions`, rebuilding it from
    /// `rank_of` (each of the part's `slots` slots' rank) when it was built for anything else.
    pub fn ensure(
        &mut self,
        (part, layout, slots): (u64, u64, usize),
        rank_of: impl Fn(u32) -> Option<LoadKey>,
        positions: &dyn Positions,
    ) {
        let serial = positions.serial();
        if self.built && self.part == part && self.layout == layout && self.serial == serial {
            return;
        }
        self.of_slot.clear();
        self.of_slot.extend((0..slots).map(|s| {
            let slot = u32::try_from(s).unwrap_or(u32::MAX);
            rank_of(slot)
                .and_then(|k| positions.first(k))
                .unwrap_or(NONE)
        }));
        (self.part, self.layout, self.serial, self.built) = (part, layout, serial, true);
    }

    /// The first position of the rank in `slot`, if it is a candidate.
    #[inline]
    pub fn get(&self, slot: u32) -> Option<u32> {
        self.of_slot
            .get(slot as usize)
            .copied()
            .filter(|&p| p != NONE)
    }
}

/// The maps of every part of one source, by part index.
#[derive(Debug, Default)]
pub struct RankPositions {
    parts: Vec<PartPositions>,
}

impl RankPositions {
    /// The map of part `i` (created empty on first use).
    pub fn part(&mut self, i: usize) -> Option<&mut PartPositions> {
        if self.parts.len() <= i {
            self.parts.resize_with(i + 1, PartPositions::default);
        }
        self.parts.get_mut(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::InstanceId;
    use std::cell::Cell;

    struct List {
        serial: u64,
        keys: Vec<LoadKey>,
        lookups: Cell<usize>,
    }

    impl Positions for List {
        fn serial(&self) -> u64 {
            self.serial
        }

        fn first(&self, key: LoadKey) -> Option<u32> {
            self.lookups.set(self.lookups.get() + 1);
            let p = self.keys.iter().position(|k| *k == key)?;
            u32::try_from(p).ok()
        }
    }

    fn key(id: u64) -> LoadKey {
        LoadKey::new(InstanceId::new(id), 0)
    }

    #[test]
    fn a_map_is_rebuilt_exactly_when_its_part_layout_or_list_changes() {
        let slots = [Some(key(7)), None, Some(key(3)), Some(key(9))];
        let rank_of = |s: u32| slots.get(s as usize).copied().flatten();
        let mut list = List {
            serial: 1,
            keys: vec![key(3), key(7)],
            lookups: Cell::new(0),
        };
        let mut map = PartPositions::default();
        map.ensure((10, 5, 4), rank_of, &list);
        let got: Vec<_> = (0..5).map(|s| map.get(s)).collect();
        assert_eq!(got, [Some(1), None, Some(0), None, None]);
        let built = list.lookups.get();
        map.ensure((10, 5, 4), rank_of, &list);
        assert_eq!(list.lookups.get(), built, "current: not rebuilt");
        for (part, layout) in [(11, 5), (11, 6)] {
            map.ensure((part, layout, 4), rank_of, &list);
            assert!(list.lookups.get() > built, "part {part} layout {layout}");
        }
        let built = list.lookups.get();
        list.serial = 2;
        list.keys = vec![key(9)];
        map.ensure((11, 6, 4), rank_of, &list);
        assert!(list.lookups.get() > built, "another list");
        assert_eq!(map.get(3), Some(0));
        assert_eq!(map.get(0), None);
    }
}
