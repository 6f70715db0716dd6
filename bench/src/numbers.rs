//! Small statistics and number formatting shared by the reports of
//! `fleet-hop`, `sim-hop` and `http-hop`: medians, latencies in microseconds with a
//! unit, signed differences, and the spread of per-worker counts.
//!
//! Invariant: pure functions; an empty input gives NaN (printed as `NaN`),
//! never a made-up zero.

/// The median of `v` (mean of the two middle values for an even length).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// `num / den`, or NaN unless `den` is positive.
pub(crate) fn per(num: f64, den: f64) -> f64 {
    if den > 0.0 { num / den } else { f64::NAN }
}

/// Microseconds with a unit: `850us`, `1.503ms`, `2.000s`.
pub(crate) fn latency(us: f64) -> String {
    if us < 1e3 {
        format!("{us:.0}us")
    } else if us < 1e6 {
        format!("{:.3}ms", us / 1e3)
    } else {
        format!("{:.3}s", us / 1e6)
    }
}

/// A latency difference with its sign: `+80us`, `-1.200ms`.
pub(crate) fn signed_us(us: f64) -> String {
    let sign = if us < 0.0 { "-" } else { "+" };
    format!("{sign}{}", latency(us.abs()))
}

/// How evenly a count is spread over workers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Spread {
    /// Workers counted.
    pub(crate) workers: usize,
    /// Sum of the counts.
    pub(crate) total: u64,
    /// Smallest count.
    pub(crate) min: u64,
    /// Largest count.
    pub(crate) max: u64,
    /// Standard deviation over the mean (population), in percent.
    pub(crate) cv_pct: f64,
}

impl Spread {
    /// The spread of `counts`; `None` when there are none.
    pub(crate) fn of(counts: &[u64]) -> Option<Spread> {
        let min = *counts.iter().min()?;
        let max = *counts.iter().max()?;
        let total: u64 = counts.iter().sum();
        let n = counts.len() as f64;
        let mean = total as f64 / n;
        let var = counts
            .iter()
            .map(|&c| (c as f64 - mean).powi(2))
            .sum::<f64>()
            / n;
        let cv_pct = if mean > 0.0 {
            100.0 * var.sqrt() / mean
        } else {
            f64::NAN
        };
        Some(Spread {
            workers: counts.len(),
            total,
            min,
            max,
            cv_pct,
        })
    }

    /// Largest over smallest count (infinite when some worker got none).
    pub(crate) fn max_over_min(&self) -> f64 {
        if self.min == 0 {
            f64::INFINITY
        } else {
            self.max as f64 / self.min as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_latencies() {
        assert_eq!(median(vec![3.0, 1.0]), 2.0);
        assert_eq!(median(vec![3.0, 1.0, 7.0]), 3.0);
        assert!(median(Vec::new()).is_nan());
        assert_eq!(latency(850.4), "850us");
        assert_eq!(latency(1503.0), "1.503ms");
        assert_eq!(latency(2e6), "2.000s");
        assert_eq!(signed_us(-1200.0), "-1.200ms");
        assert_eq!(signed_us(80.0), "+80us");
    }

    #[test]
    fn spread_of_counts() {
        let s = Spread::of(&[10, 10, 10, 10]).unwrap();
        assert_eq!((s.min, s.max, s.total, s.workers), (10, 10, 40, 4));
        assert!(s.cv_pct.abs() < 1e-12 && (s.max_over_min() - 1.0).abs() < 1e-12);
        let s = Spread::of(&[5, 15]).unwrap();
        assert!((s.cv_pct - 50.0).abs() < 1e-9, "{s:?}");
        assert!((s.max_over_min() - 3.0).abs() < 1e-12);
        assert!(Spread::of(&[0, 4]).unwrap().max_over_min().is_infinite());
        assert!(Spread::of(&[]).is_none());
    }
}
