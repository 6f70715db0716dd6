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

    /// `self - d`, `None` before the origin.
    pub fn checked_sub(self, d: Duration) -> Option<Instant> {
        self.0.checked_sub(d).map(Instant)
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

/// Days since 1970-01-01 (negative before) to the proleptic Gregorian `(year, month, day)`
/// (H. Hinnant's civil-calendar algorithm). No overflow for |z| < 2^50.
pub fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The inverse of [`civil_from_days`].
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_days_round_trip_and_known_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_790), (2026, 12, 3));
        for z in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
    }

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
