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

static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Now as `continuum_core::clock::Instant` (time since this module's first use), the form core
/// logic takes its time in.
pub(crate) fn now() -> continuum_core::clock::Instant {
    let origin = *ORIGIN.get_or_init(instant);
    continuum_core::clock::Instant::from_origin(origin.elapsed())
}

/// A core instant from [`now`] as a `std` instant (to sleep until it).
pub(crate) fn to_std(at: continuum_core::clock::Instant) -> Instant {
    let origin = *ORIGIN.get_or_init(instant);
    origin + at.since_origin()
}
