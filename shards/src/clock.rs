//! The data plane's monotonic clock as `continuum_core::clock::Instant`: time since a
//! process-wide origin fixed at first use. Core logic takes these instants as arguments; this is
//! the one place the shards read the OS clock for it.

use std::sync::OnceLock;
use std::time::Instant as StdInstant;

use continuum_core::clock::Instant;

static ORIGIN: OnceLock<StdInstant> = OnceLock::new();

/// Now, on the process clock.
pub(crate) fn now() -> Instant {
    let origin = *ORIGIN.get_or_init(StdInstant::now);
    Instant::from_origin(origin.elapsed())
}
