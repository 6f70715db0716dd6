//! Injected time. Core logic never reads the system clock; it receives a [`Clock`] so tests can
//! drive time by hand and the data plane can use a cheap per-shard coarse clock.

use std::time::Duration;

/// A monotonic instant expressed as the time since an arbitrary per-process origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(Duration);

impl Instant {
    /// The instant `d` after the clock's origin.
    pub const fn from_origin(d: Duration) -> Self {
        Self(d)
    }

    /// Time elapsed since the origin.
    pub const fn since_origin(self) -> Duration {
        self.0
    }

    /// `self - earlier`, saturating at zero.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// `self + d`, saturating.
    pub fn saturating_add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(d))
    }
}

/// A source of monotonic time.
pub trait Clock {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// A hand-driven clock for tests.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: std::cell::Cell<Duration>,
}

impl ManualClock {
    /// Advance the clock by `d`.
    pub fn advance(&self, d: Duration) {
        self.now.set(self.now.get().saturating_add(d));
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        Instant(self.now.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_advances_and_saturates() {
        let c = ManualClock::default();
        let a = c.now();
        c.advance(Duration::from_millis(5));
        let b = c.now();
        assert_eq!(b.saturating_since(a), Duration::from_millis(5));
        assert_eq!(a.saturating_since(b), Duration::ZERO);
    }
}
