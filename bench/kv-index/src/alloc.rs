//! A counting global allocator: the bytes live right now and the allocations made so far, so the
//! bench can report what an index holds (the difference of two readings around building it) and
//! how often it allocates. Requested sizes are counted, the same rule for every index; the
//! allocator's own per-allocation overhead is not counted for anyone.
//!
//! A second live counter rounds every allocation up to the chunk glibc's malloc hands out for
//! it (request + 8-byte header, 16-byte aligned, at least 32 bytes): closer to the resident
//! memory of an index made of many small allocations. Reported as a detail, for every index.
//!
//! Cost: each thread adds to its own slot with a plain load and store (no locked instruction,
//! no shared cache line), so counting barely changes what it measures; a reading sums the slots.
//! Readings are taken at quiescent points (after the threads that allocated have synchronised
//! with the reader through a join, a channel or a lock), so every slot is up to date.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, AtomicU64, AtomicUsize, Ordering::Relaxed};

/// The system allocator with per-thread live-bytes and allocation counters.
pub(crate) struct Counting;

const SLOTS: usize = 256;

/// One cache line per thread: bytes allocated minus freed by it, and its allocation count.
#[repr(align(64))]
struct Slot {
    live: AtomicIsize,
    chunks: AtomicIsize,
    allocs: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)] // only to initialise the array below
const EMPTY: Slot = Slot {
    live: AtomicIsize::new(0),
    chunks: AtomicIsize::new(0),
    allocs: AtomicU64::new(0),
};
static SLOT: [Slot; SLOTS] = [EMPTY; SLOTS];
/// Slot 0 is shared (atomic adds) by threads past the first `SLOTS - 1` and by threads being
/// torn down; the others have one owner each.
static NEXT: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// This thread's slot, assigned at its first allocation. Const-initialised, no destructor:
    /// touching it never allocates.
    static MINE: Cell<usize> = const { Cell::new(0) };
}

/// The glibc chunk size of a `size`-byte request (an approximation; see the module docs).
fn chunk(size: usize) -> isize {
    ((size + 8 + 15) & !15).max(32) as isize
}

fn count(delta: isize, chunks: isize, alloc: bool) {
    let i = MINE
        .try_with(|m| {
            if m.get() == 0 {
                let n = NEXT.fetch_add(1, Relaxed);
                m.set(if n < SLOTS { n } else { usize::MAX });
            }
            m.get()
        })
        .unwrap_or(usize::MAX);
    if i < SLOTS {
        // Only this thread writes slot `i`: a plain read-modify-write is exact.
        let s = &SLOT[i];
        s.live.store(s.live.load(Relaxed) + delta, Relaxed);
        s.chunks.store(s.chunks.load(Relaxed) + chunks, Relaxed);
        if alloc {
            s.allocs.store(s.allocs.load(Relaxed) + 1, Relaxed);
        }
    } else {
        SLOT[0].live.fetch_add(delta, Relaxed);
        SLOT[0].chunks.fetch_add(chunks, Relaxed);
        if alloc {
            SLOT[0].allocs.fetch_add(1, Relaxed);
        }
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so `System`'s
// guarantees carry over; the counters have no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout, which satisfies `alloc`'s contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize, chunk(layout.size()), true);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as isize, chunk(layout.size()), true);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator with this layout.
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as isize), -chunk(layout.size()), false);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged; `ptr` was allocated by this allocator with `layout`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(
                new_size as isize - layout.size() as isize,
                chunk(new_size) - chunk(layout.size()),
                true,
            );
        }
        p
    }
}

/// Bytes currently allocated through the global allocator (all threads).
pub(crate) fn live_bytes() -> usize {
    SLOT.iter()
        .map(|s| s.live.load(Relaxed))
        .sum::<isize>()
        .max(0) as usize
}

/// [`live_bytes`] with every allocation rounded up to its malloc chunk.
pub(crate) fn live_chunk_bytes() -> usize {
    SLOT.iter()
        .map(|s| s.chunks.load(Relaxed))
        .sum::<isize>()
        .max(0) as usize
}

/// Allocations (and reallocations) made so far (all threads).
pub(crate) fn allocations() -> u64 {
    SLOT.iter().map(|s| s.allocs.load(Relaxed)).sum()
}
