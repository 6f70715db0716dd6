//! The control thread's clocks: the one module of `control` that reads the OS clock
//! (`clippy.toml` disallows `Instant::now` and `SystemTime::now` everywhere else).

use std::time::{Instant, SystemTime};

/// The monotonic clock (deadlines, health intervals).
#[allow(clippy::disallowed_methods)] // the clock module: the one reader of the OS clock
pub(crate) fn instant() -> Instant {
    Instant::now()
}

/// The wall clock (record timestamps, file-store expiry).
#[allow(clippy::disallowed_methods)] // the clock module: the one reader of the OS clock
pub(crate) fn wall() -> SystemTime {
    SystemTime::now()
}

/// The process clock as `continuum_core::clock::Instant`, the form core logic takes its time in,
/// and back: the shards' one timeline, so the control thread's instants compare with theirs.
pub(crate) use continuum_shards::clock::{now, to_std};
