//! A counting global allocator: how many bytes are live, so benchmarks can report the memory a
//! structure holds, and how many allocations each thread made, so they can report allocations
//! per operation. Counting is one or two relaxed atomic adds and one or two thread-local adds
//! per (de)allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The system allocator with a live-bytes counter and a per-thread allocation counter.
pub(crate) struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Allocations (including reallocations) made by this thread. Const-initialised and without
    /// a destructor, so touching it never allocates.
    static THREAD_ALLOCS: Cell<u64> = const { Cell::new(0) };
    /// Bytes this thread allocated minus bytes it freed (whoever allocated them): a thread's own
    /// share of the live bytes, as long as what it allocates is freed on it.
    static THREAD_NET: Cell<i64> = const { Cell::new(0) };
}

fn count_allocation() {
    // `try_with` fails only while the thread is being torn down; that allocation goes uncounted
    // (rare, and never inside a measured loop).
    let _ = THREAD_ALLOCS.try_with(|c| c.set(c.get().wrapping_add(1)));
}

fn count_net(delta: i64) {
    let _ = THREAD_NET.try_with(|c| c.set(c.get().wrapping_add(delta)));
}

fn signed(size: usize) -> i64 {
    i64::try_from(size).unwrap_or(i64::MAX)
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so `System`'s
// guarantees carry over; the counters have no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout, which satisfies `alloc`'s contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Relaxed);
            count_allocation();
            count_net(signed(layout.size()));
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc`/`realloc` of this allocator with this layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
        count_net(-signed(layout.size()));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged; `ptr` was allocated by this allocator with `layout`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Relaxed);
            LIVE.fetch_add(new_size, Relaxed);
            count_allocation();
            count_net(signed(new_size) - signed(layout.size()));
        }
        p
    }
}

/// Bytes currently allocated through the global allocator.
pub(crate) fn live_bytes() -> usize {
    LIVE.load(Relaxed)
}

/// The calling thread's allocated minus freed bytes so far (see `THREAD_NET`).
pub(crate) fn thread_net_bytes() -> i64 {
    THREAD_NET.try_with(Cell::get).unwrap_or(0)
}

/// Allocations made by the calling thread so far.
pub(crate) fn thread_allocations() -> u64 {
    THREAD_ALLOCS.try_with(Cell::get).unwrap_or(0)
}
