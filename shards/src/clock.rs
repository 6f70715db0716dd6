//! The data plane's clocks: the one module of `shards` that reads the OS clock (`clippy.toml`
//! disallows `Instant::now` and `SystemTime::now` everywhere else).
//!
//! [`now`] is the monotonic clock as `continuum_core::clock::Instant` (time since a process-wide
//! origin fixed at first use), the form core logic takes its time in; [`instant`] is the same
//! clock as a `std::time::Instant`, for deadlines and elapsed times of the I/O code.

use std::sync::OnceLock;
use std::time::Instant as StdInstant;

use continuum_core::clock::Instant;

static ORIGIN: OnceLock<StdInstant> = OnceLock::new();

/// Now, on the process clock (the one timeline of the process: the control thread reads it
/// too).
pub fn now() -> Instant {
    at(instant())
}

/// `at` (a `std` instant of this process) on the process clock, without another clock reading.
pub(crate) fn at(at: StdInstant) -> Instant {
    let origin = *ORIGIN.get_or_init(instant);
    Instant::from_origin(at.saturating_duration_since(origin))
}

/// A process-clock instant as a `std` instant (to sleep until it).
pub fn to_std(at: Instant) -> StdInstant {
    let origin = *ORIGIN.get_or_init(instant);
    origin + at.since_origin()
}

/// Now, as a `std` instant (deadlines, elapsed times).
#[allow(clippy::disallowed_methods)] // the clock module: the one reader of the OS clock
pub(crate) fn instant() -> StdInstant {
    StdInstant::now()
}

/// Now as milliseconds on the process clock: the timeline of the shared replica health
/// (`continuum_core::health`), which the control thread's health checker reads too.
pub fn now_ms() -> u64 {
    u64::try_from(now().since_origin().as_millis()).unwrap_or(u64::MAX)
}

/// `at` (a `std` instant of this process, e.g. a request's start) as milliseconds on the process
/// clock: the same timeline as [`now_ms`], without another clock reading.
pub(crate) fn ms_at(at: StdInstant) -> u64 {
    let origin = *ORIGIN.get_or_init(instant);
    u64::try_from(at.saturating_duration_since(origin).as_millis()).unwrap_or(u64::MAX)
}

/// `at` (a `std` instant of this process, e.g. a request's start) as nanoseconds on the process
/// clock (the client keys' rate budgets), without another clock reading.
pub(crate) fn ns_at(at: StdInstant) -> u64 {
    let origin = *ORIGIN.get_or_init(instant);
    u64::try_from(at.saturating_duration_since(origin).as_nanos()).unwrap_or(u64::MAX)
}

/// Seconds since the Unix epoch on the wall clock (a chat template's `strftime_now`).
#[allow(clippy::disallowed_methods)] // the clock module: the one reader of the OS clock
pub(crate) fn unix_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
