//! Building a shard's monoio runtime through an explicit fallback chain.
//!
//! 1. io_uring with `SINGLE_ISSUER | DEFER_TASKRUN` (the fastest driver measured here: task work
//!    runs only when the shard waits, on its own thread);
//! 2. plain io_uring;
//! 3. epoll (monoio's legacy driver).
//!
//! Each step actually builds the ring: monoio's own probe can pass while ring creation still
//! fails (low memlock, seccomp), so the probe is not trusted. The shard logs which driver it got.

use std::fmt;

use monoio::time::TimeDriver;
use monoio::{FusionRuntime, IoUringDriver, LegacyDriver, RuntimeBuilder};

/// The runtime type every shard runs.
pub type ShardRuntime = FusionRuntime<TimeDriver<IoUringDriver>, TimeDriver<LegacyDriver>>;

/// Which I/O driver a shard ended up with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverKind {
    /// io_uring with SINGLE_ISSUER and DEFER_TASKRUN.
    UringDeferTaskrun,
    /// io_uring without setup flags.
    Uring,
    /// epoll.
    Epoll,
}

impl fmt::Display for DriverKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DriverKind::UringDeferTaskrun => "io_uring+defer_taskrun",
            DriverKind::Uring => "io_uring",
            DriverKind::Epoll => "epoll",
        })
    }
}

/// Which drivers the chain may try (operators and tests can force the fallback).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DriverChoice {
    /// Try the whole chain.
    #[default]
    Best,
    /// Skip io_uring entirely.
    EpollOnly,
}

impl DriverChoice {
    /// Read from `CONTINUUM_DRIVER` (`epoll` forces the legacy driver).
    pub fn from_env_value(v: Option<&str>) -> Self {
        match v {
            Some("epoll") => DriverChoice::EpollOnly,
            _ => DriverChoice::Best,
        }
    }
}

/// Ring size per shard.
const URING_ENTRIES: u32 = 1024;

/// Build the runtime on the calling thread (the ring is bound to its creator under
/// SINGLE_ISSUER). Returns the runtime and the driver it got, or the epoll build error.
pub fn build(choice: DriverChoice) -> std::io::Result<(ShardRuntime, DriverKind)> {
    if choice == DriverChoice::Best {
        let mut urb = io_uring::IoUring::builder();
        urb.setup_single_issuer().setup_defer_taskrun();
        match RuntimeBuilder::<IoUringDriver>::new()
            .uring_builder(urb)
            .with_entries(URING_ENTRIES)
            .enable_timer()
            .build()
        {
            Ok(rt) => return Ok((FusionRuntime::Uring(rt), DriverKind::UringDeferTaskrun)),
            Err(e) => tracing::debug!(error = %e, "io_uring with DEFER_TASKRUN unavailable"),
        }
        match RuntimeBuilder::<IoUringDriver>::new()
            .with_entries(URING_ENTRIES)
            .enable_timer()
            .build()
        {
            Ok(rt) => return Ok((FusionRuntime::Uring(rt), DriverKind::Uring)),
            Err(e) => tracing::debug!(error = %e, "io_uring unavailable"),
        }
    }
    let rt = RuntimeBuilder::<LegacyDriver>::new()
        .enable_timer()
        .build()?;
    Ok((FusionRuntime::Legacy(rt), DriverKind::Epoll))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_choice_builds_a_working_runtime() {
        for choice in [DriverChoice::Best, DriverChoice::EpollOnly] {
            let (mut rt, kind) = build(choice).unwrap();
            if choice == DriverChoice::EpollOnly {
                assert_eq!(kind, DriverKind::Epoll);
            }
            let v = rt.block_on(async {
                monoio::time::sleep(std::time::Duration::from_millis(1)).await;
                7
            });
            assert_eq!(v, 7);
        }
    }

    #[test]
    fn driver_choice_from_env() {
        assert_eq!(
            DriverChoice::from_env_value(Some("epoll")),
            DriverChoice::EpollOnly
        );
        assert_eq!(DriverChoice::from_env_value(None), DriverChoice::Best);
    }
}
