//! The machine's memory, measured before anything else runs, so that figures taken on different
//! machines can be read against each other: every index here is bound by cache misses once its
//! tables outgrow the caches, and by page walks on a cold call.
//!
//! Two numbers over a buffer far larger than any cache ([`BYTES`]): the latency of one load
//! whose address depends on the previous one (a pointer chase over a random cyclic permutation
//! of the buffer's cache lines), and the cost per load of [`LANES`] independent chases advanced
//! together (what a walk that loads its next buckets ahead can get at best).
//!
//! Invariant: bounded (a fixed number of loads; the buffer is allocated once and dropped).

use std::hint::black_box;
use std::time::Instant;

use crate::rng::Rng;

/// The probe buffer: 256 MiB.
const BYTES: usize = 256 << 20;
/// `u64`s per 64-byte line.
const LINE: usize = 8;
/// Independent chases of the parallel probe.
const LANES: usize = 16;
/// Loads timed by each probe.
const LOADS: usize = 1 << 20;

/// What [`probe`] measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Memory {
    /// One dependent random load, in ns.
    pub(crate) dependent_ns: f64,
    /// One load of [`LANES`] independent ones, in ns.
    pub(crate) parallel_ns: f64,
}

/// Runs both probes (about a second).
pub(crate) fn probe() -> Memory {
    let lines = BYTES / 64;
    // Sattolo's shuffle: one cycle through every line.
    let mut next: Vec<u32> = (0..lines as u32).collect();
    let mut rng = Rng::new(0x5EED);
    for i in (1..lines).rev() {
        let j = rng.below(i as u64) as usize;
        next.swap(i, j);
    }
    let mut buf = vec![0u64; lines * LINE];
    for (i, &n) in next.iter().enumerate() {
        buf[i * LINE] = u64::from(n);
    }
    drop(next);
    // Dependent.
    let mut p = 0usize;
    let t = Instant::now();
    for _ in 0..LOADS {
        p = buf[p * LINE] as usize;
    }
    let dependent_ns = t.elapsed().as_nanos() as f64 / LOADS as f64;
    black_box(p);
    // Parallel: LANES chases started far apart on the cycle.
    let mut at = [0usize; LANES];
    let mut q = p;
    for a in at.iter_mut() {
        for _ in 0..997 {
            q = buf[q * LINE] as usize;
        }
        *a = q;
    }
    let t = Instant::now();
    for _ in 0..LOADS / LANES {
        for a in at.iter_mut() {
            *a = buf[*a * LINE] as usize;
        }
    }
    let parallel_ns = t.elapsed().as_nanos() as f64 / LOADS as f64;
    black_box(at);
    Memory {
        dependent_ns,
        parallel_ns,
    }
}
