//! SIGINT/SIGTERM handling for the driver, so Ctrl-C still runs every
//! destructor (children torn down, temp dir removed).
//!
//! Invariant: the handler only stores to an atomic (async-signal-safe);
//! every wait loop of the driver polls [`interrupted`] and unwinds with
//! [`BenchError::Interrupted`](crate::error::BenchError::Interrupted).

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Routes SIGINT and SIGTERM to the flag. Call once, before spawning.
pub(crate) fn install() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `on_signal` is async-signal-safe (one atomic store).
        unsafe { libc::signal(sig, handler) };
    }
}

/// Whether SIGINT or SIGTERM has arrived.
pub(crate) fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}
