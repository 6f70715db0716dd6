//! Fixed-capacity tables of seqlock cells built from atomics only (the crate forbids `unsafe`).
//!
//! Role: the storage under [`super::LoadStore`] and [`super::InflightTable`]. A table holds up to
//! [`MAX_LOAD_KEYS`] cells in 64 lazily allocated chunks of 1024; a cell is a version word plus
//! `W` data words, aligned to a 64-byte cache line so that cells written by different shards never
//! share a line.
//!
//! Invariants:
//! - the version is even when the cell is stable and odd while a writer holds it; writers take it
//!   with one `compare_exchange` (even→odd) and release it with one `Release` store, so concurrent
//!   writers are serialised and a reader retries any read that overlapped a write (Boehm's
//!   fence-based seqlock: `Acquire` version load, `Relaxed` data loads, `Acquire` fence, `Relaxed`
//!   version re-load);
//! - a chunk, once allocated, is never freed or moved; readers find unallocated chunks as all-zero
//!   cells and never allocate;
//! - no operation panics: slots outside the table read as zero and refuse writes;
//! - every table also holds a dense array of **stamps**, one `u32` per cell (allocated with the
//!   table: 256 KiB, so a stamp is one indexed load away from the table): a write that stores its
//!   changes also stores the cell's new write count there (`Release`, after its data and before
//!   it releases the cell, so stamps of successive writes land in write order). A reader that
//!   loads a stamp (`Acquire`) and then reads the cell gets that write or a later one, so a reader
//!   that remembers the stamp it loaded before a read knows, while the stamp is unchanged, that no
//!   write has completed since (up to wrap-around after 2^32 writes of one cell, which is why the
//!   memo that relies on this caps its entries' age, `super::memo`). Checking many cells for
//!   change touches a few cache lines of stamps instead of one line per cell;
//! - every table also holds one **group stamp** per [`GROUP`] consecutive cells: after a write
//!   that stores its changes has published its stamp and released its cell, it adds one to its
//!   group's stamp (`fetch_add`, `Release`). A reader that loads a group stamp (`Acquire`) then
//!   loads the group's cell stamps sees every stamp of the writes that group stamp counts, so a
//!   reader that checked a group's cells after loading its group stamp knows, while the group
//!   stamp is unchanged, that none of those cells' stamps changed since (a write whose group
//!   increment it has not seen yet is one still in progress). A pick checks a few hundred group
//!   stamps instead of one stamp per candidate (`super::probes`).
//!
//! Checked by the loom models in `seqcell_loom.rs` (`RUSTFLAGS="--cfg loom"`, see there). Under
//! loom the atomics, the fence and the spin hints below are loom's (a loom spin hint yields to
//! loom's scheduler, so a waiting thread lets the holder progress) and a table is one chunk of
//! two cells; a normal build uses the `std` items of the same names, unchanged.

use std::sync::OnceLock;

#[cfg(loom)]
use loom::{
    hint::spin_loop,
    sync::atomic::{AtomicU32, AtomicU64, Ordering, fence},
    thread::yield_now,
};
#[cfg(not(loom))]
use std::{
    hint::spin_loop,
    sync::atomic::{AtomicU32, AtomicU64, Ordering, fence},
    thread::yield_now,
};

#[cfg(not(loom))]
use super::MAX_LOAD_KEYS;

/// Cells per chunk.
#[cfg(not(loom))]
const CHUNK: usize = 1024;
/// Chunks per table.
#[cfg(not(loom))]
const CHUNKS: usize = MAX_LOAD_KEYS / CHUNK;
/// Under loom every atomic is a model object that each `Acquire` fence scans: keep tables tiny.
#[cfg(loom)]
const CHUNK: usize = 2;
#[cfg(loom)]
const CHUNKS: usize = 1;
/// Spins before a waiting reader or writer yields its time slice.
const SPINS_BEFORE_YIELD: u32 = 64;

#[derive(Debug)]
#[repr(align(64))]
struct Cell<const W: usize> {
    version: AtomicU64,
    words: [AtomicU64; W],
}

impl<const W: usize> Cell<W> {
    fn new() -> Self {
        Self {
            version: AtomicU64::new(0),
            words: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// A table's dense stamp array ([`SeqTable::stamps`]): loads as [`SeqTable::stamp`] does.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Stamps<'a>(&'a [AtomicU32]);

impl Stamps<'_> {
    /// The stamp at `slot` (a cell's, [`SeqTable::stamp`], or a group's).
    #[inline]
    pub(crate) fn get(self, slot: u32) -> u32 {
        self.0
            .get(slot as usize)
            .map_or(0, |s| s.load(Ordering::Acquire))
    }
}

/// Cells per group stamp is `1 << GROUP_SHIFT` (module docs).
#[cfg(not(loom))]
pub(crate) const GROUP_SHIFT: u32 = 4;
/// Under loom both cells of the one chunk share a group.
#[cfg(loom)]
pub(crate) const GROUP_SHIFT: u32 = 1;
/// Cells per group stamp.
pub(crate) const GROUP: usize = 1 << GROUP_SHIFT;

/// A table of `MAX_LOAD_KEYS` seqlock cells of `W` words (`CHUNK * CHUNKS` under loom).
#[derive(Debug)]
pub(crate) struct SeqTable<const W: usize> {
    chunks: Box<[OnceLock<Box<[Cell<W>]>>]>,
    /// One stamp per cell of every chunk (module docs).
    stamps: Box<[AtomicU32]>,
    /// One stamp per [`GROUP`] cells (module docs).
    groups: Box<[AtomicU32]>,
}

fn backoff(spins: &mut u32) {
    *spins = spins.saturating_add(1);
    if *spins < SPINS_BEFORE_YIELD {
        spin_loop();
    } else {
        yield_now();
    }
}

impl<const W: usize> SeqTable<W> {
    /// An empty table; no cell memory is allocated until a chunk is first written.
    pub(crate) fn new() -> Self {
        Self {
            chunks: (0..CHUNKS).map(|_| OnceLock::new()).collect(),
            stamps: (0..CHUNK * CHUNKS).map(|_| AtomicU32::new(0)).collect(),
            groups: (0..(CHUNK * CHUNKS).div_ceil(GROUP))
                .map(|_| AtomicU32::new(0))
                .collect(),
        }
    }

    fn cell(&self, slot: u32) -> Option<&Cell<W>> {
        let slot = slot as usize;
        self.chunks.get(slot / CHUNK)?.get()?.get(slot % CHUNK)
    }

    fn cell_or_alloc(&self, slot: u32) -> Option<&Cell<W>> {
        let slot = slot as usize;
        self.chunks
            .get(slot / CHUNK)?
            .get_or_init(|| (0..CHUNK).map(|_| Cell::new()).collect())
            .get(slot % CHUNK)
    }

    /// The cell's stamp (module docs): how many writes stored changes in it, modulo 2^32; 0 for
    /// a never-written cell or a slot outside the table. Load it *before* reading the cell.
    pub(crate) fn stamp(&self, slot: u32) -> u32 {
        self.stamps
            .get(slot as usize)
            .map_or(0, |s| s.load(Ordering::Acquire))
    }

    /// The table's stamps, to load many of them without going through the table each time.
    pub(crate) fn stamps(&self) -> Stamps<'_> {
        Stamps(&self.stamps)
    }

    /// The group stamps (module docs): group `g` counts the writes that stored changes in cells
    /// `g * GROUP .. (g + 1) * GROUP`, modulo 2^32. Load one *before* checking its cells.
    pub(crate) fn groups(&self) -> Stamps<'_> {
        Stamps(&self.groups)
    }

    /// A consistent copy of the cell's words; all zero for a never-written cell.
    pub(crate) fn read(&self, slot: u32) -> [u64; W] {
        let Some(cell) = self.cell(slot) else {
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
            backoff(&mut spins);
        }
    }

    /// Runs `f` on the cell's words while holding the cell; `f` returns whether to store its
    /// changes, plus a result. `None` if `slot` is outside the table.
    ///
    /// `alloc` allocates the chunk if needed (control path); the data path passes `false` and a
    /// missing chunk then reads as "no such slot".
    pub(crate) fn update<R>(
        &self,
        slot: u32,
        alloc: bool,
        f: impl FnOnce(&mut [u64; W]) -> (bool, R),
    ) -> Option<R> {
        let cell = if alloc {
            self.cell_or_alloc(slot)?
        } else {
            self.cell(slot)?
        };
        let stamp = self.stamps.get(slot as usize)?;
        let mut spins = 0;
        let v = loop {
            let v = cell.version.load(Ordering::Relaxed);
            if v & 1 == 0
                && cell
                    .version
                    .compare_exchange_weak(
                        v,
                        v.wrapping_add(1),
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                break v;
            }
            backoff(&mut spins);
        };
        // Orders the odd version before the data stores for any reader that sees one of them.
        fence(Ordering::Release);
        let mut data: [u64; W] = std::array::from_fn(|i| cell.words[i].load(Ordering::Relaxed));
        let (write, result) = f(&mut data);
        if write {
            for (w, d) in cell.words.iter().zip(data) {
                w.store(d, Ordering::Relaxed);
            }
            // The write count (version / 2), published after the data and while the cell is
            // still held, so stamps of successive writes are stored in write order.
            let count = (v.wrapping_add(2) >> 1) as u32;
            stamp.store(count, Ordering::Release);
            cell.version.store(v.wrapping_add(2), Ordering::Release);
            if let Some(g) = self.groups.get(slot as usize >> GROUP_SHIFT) {
                g.fetch_add(1, Ordering::Release);
            }
        } else {
            // Nothing changed: restoring the even version lets overlapping readers succeed.
            cell.version.store(v, Ordering::Release);
        }
        Some(result)
    }
}

#[cfg(test)]
#[cfg(loom)]
#[path = "seqcell_loom.rs"]
mod loom_models;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn unwritten_cells_read_zero_and_out_of_range_refuses() {
        let t = SeqTable::<3>::new();
        assert_eq!(t.read(5), [0; 3]);
        assert_eq!(
            t.update(5, false, |_| (true, ())),
            None,
            "no chunk, no alloc"
        );
        assert_eq!(t.update(MAX_LOAD_KEYS as u32, true, |_| (true, ())), None);
        assert_eq!(t.read(u32::MAX), [0; 3]);
    }

    #[test]
    fn update_writes_and_reject_leaves_data() {
        let t = SeqTable::<2>::new();
        t.update(1500, true, |w| {
            *w = [7, 8];
            (true, ())
        });
        assert_eq!(t.read(1500), [7, 8]);
        t.update(1500, false, |w| {
            w[0] = 99;
            (false, ())
        });
        assert_eq!(t.read(1500), [7, 8], "an aborted update stores nothing");
        assert_eq!(
            std::mem::size_of::<Cell<7>>(),
            64,
            "one cache line per store cell"
        );
    }
}
