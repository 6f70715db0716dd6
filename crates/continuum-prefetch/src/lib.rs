//! A cache-prefetch hint, safe to call: [`read`] asks the CPU to start loading the cache line of a
//! value the caller will read soon, without waiting for it.
//!
//! Role: the KV index's match walk knows every bucket it will look up before it looks (each is
//! the home bucket of one of the prompt's block hashes), so it asks for the next ones while it
//! works on the current one and the cache misses of a walk overlap. A plain load would do the
//! same only while the CPU's reorder window reaches it; a prefetch instruction retires at once.
//! `continuum-core` forbids `unsafe`, and the intrinsic is an `unsafe` function, hence this crate.
//!
//! Invariants: [`read`] has no effect on the program's behaviour (the architectures define the
//! prefetch instructions as hints that never fault, and the address comes from a live
//! reference); on targets without a stable prefetch intrinsic it does nothing.

#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]

/// Hints that `value`'s cache line will be read soon (into every cache level).
#[inline(always)]
pub fn read<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        let p: *const T = value;
        // SAFETY: `_mm_prefetch` is `unsafe` only because it is a `target_feature(sse)` function;
        // SSE is part of the x86_64 baseline, and PREFETCHT0 reads nothing and never faults (the
        // address is a live reference's in any case).
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = value;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_prefetch_changes_nothing() {
        let v = [1u64, 2, 3];
        for x in &v {
            super::read(x);
        }
        assert_eq!(v, [1, 2, 3]);
    }
}
