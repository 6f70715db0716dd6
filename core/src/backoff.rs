//! Reconnect backoff policies, pure: the caller supplies the session durations and, for jitter, a
//! random value; nothing here sleeps or reads a clock.
//!
//! - [`DoublingBackoff`]: discovery watchers (DISC-ETCD-05/06). The delay starts at `initial`,
//!   doubles after every session that ended too soon, is capped at `max`, and returns to
//!   `initial` only after a session that stayed healthy for at least the reset threshold
//!   (`max` for etcd, measured from the moment every watch was open).
//! - [`JitteredBackoff`]: subscriptions (LOAD-STORE-17, LOAD-ZMTP-17): full jitter over an
//!   exponential ceiling, reset after a session of at least the reset threshold.
//!
//! Invariants: every delay lies in `initial..=max`; doubling saturates instead of overflowing.

use std::time::Duration;

/// Doubling backoff with a reset after a long enough session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoublingBackoff {
    initial: Duration,
    max: Duration,
    reset_after: Duration,
    next: Duration,
}

impl DoublingBackoff {
    /// A policy starting at `initial`, capped at `max`, reset by sessions of `reset_after` or
    /// longer. `max` below `initial` is raised to `initial`.
    pub fn new(initial: Duration, max: Duration, reset_after: Duration) -> Self {
        let max = max.max(initial);
        Self {
            initial,
            max,
            reset_after,
            next: initial,
        }
    }

    /// A session ended after being healthy for `healthy_for` (zero if it never got healthy).
    /// Returns how long to wait before the next attempt.
    pub fn session_ended(&mut self, healthy_for: Duration) -> Duration {
        if healthy_for >= self.reset_after {
            self.next = self.initial;
        }
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        delay
    }

    /// The delay the next failure would wait (for status displays).
    pub fn peek(&self) -> Duration {
        self.next
    }
}

/// Full-jitter exponential backoff (`delay = random(0..=ceiling)`, ceiling doubling from
/// `floor` to `max`), with the delay never below `floor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitteredBackoff {
    floor: Duration,
    max: Duration,
    reset_after: Duration,
    ceiling: Duration,
}

impl JitteredBackoff {
    /// A policy between `floor` and `max`, reset by sessions of `reset_after` or longer.
    pub fn new(floor: Duration, max: Duration, reset_after: Duration) -> Self {
        let max = max.max(floor);
        Self {
            floor,
            max,
            reset_after,
            ceiling: floor,
        }
    }

    /// A session ended after `lasted`; `unit` is a uniform random number in `[0, 1)` supplied by
    /// the caller. Returns the delay before reconnecting.
    pub fn session_ended(&mut self, lasted: Duration, unit: f64) -> Duration {
        if lasted >= self.reset_after {
            self.ceiling = self.floor;
        }
        let unit = if unit.is_finite() {
            unit.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let delay = self.ceiling.mul_f64(unit).max(self.floor);
        self.ceiling = self.ceiling.saturating_mul(2).min(self.max);
        delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubling_doubles_caps_and_resets_only_after_a_long_session() {
        let mut b = DoublingBackoff::new(500 * MS, 4000 * MS, 4000 * MS);
        let d: Vec<_> = (0..6).map(|_| b.session_ended(Duration::ZERO)).collect();
        assert_eq!(
            d,
            [
                500 * MS,
                1000 * MS,
                2000 * MS,
                4000 * MS,
                4000 * MS,
                4000 * MS
            ]
        );
        // A session shorter than `max` keeps the doubled delay (DISC-ETCD-06).
        assert_eq!(b.session_ended(3999 * MS), 4000 * MS);
        // One that lasted `max` resets to `initial`.
        assert_eq!(b.session_ended(4000 * MS), 500 * MS);
        assert_eq!(b.session_ended(Duration::ZERO), 1000 * MS);
    }

    #[test]
    fn doubling_never_overflows() {
        let mut b = DoublingBackoff::new(Duration::MAX / 2, Duration::MAX, Duration::MAX);
        for _ in 0..4 {
            assert!(b.session_ended(Duration::ZERO) <= Duration::MAX);
        }
    }

    #[test]
    fn jitter_stays_within_floor_and_ceiling() {
        let mut b = JitteredBackoff::new(500 * MS, 30_000 * MS, Duration::from_secs(30));
        assert_eq!(b.session_ended(Duration::ZERO, 0.0), 500 * MS);
        assert_eq!(b.session_ended(Duration::ZERO, 1.0), 1000 * MS);
        assert_eq!(b.session_ended(Duration::ZERO, 0.5), 1000 * MS);
        for _ in 0..10 {
            let d = b.session_ended(Duration::ZERO, 0.999);
            assert!(d >= 500 * MS && d <= 30_000 * MS, "{d:?}");
        }
        assert_eq!(b.session_ended(Duration::from_secs(30), 1.0), 500 * MS);
        assert_eq!(b.session_ended(Duration::ZERO, f64::NAN), 500 * MS);
    }
}
