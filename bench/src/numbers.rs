//! Small statistics and number formatting shared by the reports of
//! the Dynamo benchmarks: medians, latencies in microseconds with a unit,
//! and signed differences.
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
}
