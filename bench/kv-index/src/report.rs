//! The plain-text report: one row per figure with ours, each baseline, the ratio and the
//! target's verdict.
//!
//! A ratio is how many times better ours is than that baseline: ours / theirs for a rate,
//! theirs / ours for a time or a size. A "≥ Nx theirs" target is checked against the stronger
//! baseline of the row (the one with the smaller ratio).

use std::fmt::Write as _;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    /// Events per second.
    Rate,
    /// Nanoseconds, shown in microseconds.
    Nanos,
    /// Bytes.
    Bytes,
}

impl Unit {
    fn higher_is_better(self) -> bool {
        self == Unit::Rate
    }

    pub(crate) fn fmt(self, v: f64) -> String {
        if !v.is_finite() {
            return "n/a".into();
        }
        match self {
            Unit::Rate => format!("{:.2} M/s", v / 1e6),
            Unit::Nanos if v < 10_000.0 => format!("{:.2} us", v / 1e3),
            Unit::Nanos if v < 1_000_000.0 => format!("{:.1} us", v / 1e3),
            Unit::Nanos => format!("{:.2} ms", v / 1e6),
            Unit::Bytes => format!("{v:.1} B"),
        }
    }
}

/// A target on ours: an absolute bound and/or a ratio to the stronger baseline.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    pub(crate) text: &'static str,
    /// At least this (a rate) or at most this (a time or size).
    pub(crate) bound: Option<f64>,
    /// At least this many times better than the stronger baseline.
    pub(crate) ratio: Option<f64>,
}

#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) label: String,
    pub(crate) unit: Unit,
    pub(crate) ours: Option<f64>,
    pub(crate) crtc: Option<f64>,
    pub(crate) radix: Option<f64>,
    pub(crate) target: Option<Target>,
}

impl Row {
    pub(crate) fn ratio(&self, theirs: Option<f64>) -> Option<f64> {
        let (o, t) = (self.ours?, theirs?);
        let r = if self.unit.higher_is_better() {
            o / t
        } else {
            t / o
        };
        r.is_finite().then_some(r)
    }

    fn verdict(&self) -> String {
        let Some(t) = self.target else {
            return String::new();
        };
        let Some(o) = self.ours else {
            return "not measured".into();
        };
        let mut misses = Vec::new();
        if let Some(b) = t.bound {
            let ok = if self.unit.higher_is_better() {
                o >= b
            } else {
                o <= b
            };
            if !ok {
                let off = if self.unit.higher_is_better() {
                    format!("{:.0}% short", 100.0 * (1.0 - o / b))
                } else {
                    format!("{:.0}% over", 100.0 * (o / b - 1.0))
                };
                misses.push(format!(
                    "{} vs {} ({off})",
                    self.unit.fmt(o),
                    self.unit.fmt(b)
                ));
            }
        }
        if let Some(want) = t.ratio {
            let (cr, rr) = (self.ratio(self.crtc), self.ratio(self.radix));
            let worst = match (cr, rr) {
                (Some(a), Some(b)) if b < a => Some((b, "RadixTree")),
                (Some(a), _) => Some((a, "CRTC")),
                (None, Some(b)) => Some((b, "RadixTree")),
                (None, None) => None,
            };
            match worst {
                Some((r, name)) if r < want => {
                    misses.push(format!("{r:.2}x < {want:.0}x {name}"));
                }
                Some(_) => {}
                None => misses.push("no baseline".into()),
            }
        }
        if misses.is_empty() {
            "met".into()
        } else {
            format!("MISSED: {}", misses.join("; "))
        }
    }
}

fn opt(unit: Unit, v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| unit.fmt(v))
}

fn ratio_text(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{r:.2}x"))
}

/// The table of `rows`.
pub(crate) fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<44} {:>11} {:>11} {:>8} {:>11} {:>8}  {:<28} verdict",
        "figure", "ours", "CRTC", "ratio", "RadixTree", "ratio", "target"
    );
    let _ = writeln!(s, "{}", "-".repeat(140));
    for r in rows {
        let _ = writeln!(
            s,
            "{:<44} {:>11} {:>11} {:>8} {:>11} {:>8}  {:<28} {}",
            r.label,
            opt(r.unit, r.ours),
            opt(r.unit, r.crtc),
            ratio_text(r.ratio(r.crtc)),
            opt(r.unit, r.radix),
            ratio_text(r.ratio(r.radix)),
            r.target.map_or("", |t| t.text),
            r.verdict()
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_and_verdicts() {
        let row = Row {
            label: "x".into(),
            unit: Unit::Nanos,
            ours: Some(2_000.0),
            crtc: Some(10_000.0),
            radix: Some(3_000.0),
            target: Some(Target {
                text: "",
                bound: Some(5_000.0),
                ratio: Some(2.0),
            }),
        };
        assert_eq!(row.ratio(row.crtc), Some(5.0));
        assert_eq!(row.verdict(), "MISSED: 1.50x < 2x RadixTree");
        let rate = Row {
            unit: Unit::Rate,
            ours: Some(4e6),
            crtc: Some(1e6),
            radix: None,
            target: Some(Target {
                text: "",
                bound: Some(5e6),
                ratio: Some(2.0),
            }),
            ..row
        };
        assert_eq!(rate.verdict(), "MISSED: 4.00 M/s vs 5.00 M/s (20% short)");
    }
}
