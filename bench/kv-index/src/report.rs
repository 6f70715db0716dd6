//! The plain-text report: one row per figure with ours, each of Dynamo's indexes ([`Baseline`])
//! with its ratio, and the target's verdict (`PASS`, or `MISS` and why), then one line per
//! target.
//!
//! A ratio is how many times better ours is than that baseline: ours / theirs for a rate,
//! theirs / ours for a time or a size. A "≥ Nx" target is checked against the strongest
//! baseline of the set it names ([`Against`]): the one with the smallest ratio.

use std::fmt::Write as _;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    /// Events per second.
    Rate,
    /// Nanoseconds, shown in microseconds.
    Nanos,
    /// Bytes.
    Bytes,
    /// A ratio of two of the same figure (a speedup).
    Factor,
}

impl Unit {
    fn higher_is_better(self) -> bool {
        matches!(self, Unit::Rate | Unit::Factor)
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
            Unit::Factor => format!("{v:.2}x"),
        }
    }
}

/// Dynamo's indexes, in column order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Baseline {
    /// `ConcurrentRadixTreeCompressed` in a `ThreadPoolIndexer` lane.
    Crtc,
    /// `PositionalIndexer` (the "Flash" indexer) in a lane, strided search.
    FlashStrided,
    /// The same, binary search.
    FlashBinary,
    /// `RadixTree`, single-threaded (no readers on other threads).
    Radix,
}

impl Baseline {
    pub(crate) const ALL: [Baseline; 4] = [
        Baseline::Crtc,
        Baseline::FlashStrided,
        Baseline::FlashBinary,
        Baseline::Radix,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Baseline::Crtc => "CRTC",
            Baseline::FlashStrided => "Flash str.",
            Baseline::FlashBinary => "Flash bin.",
            Baseline::Radix => "RadixTree",
        }
    }

    /// Whether it serves readers on other threads while it applies.
    fn concurrent(self) -> bool {
        self != Baseline::Radix
    }
}

/// Which baselines a ratio target is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Against {
    /// Those that serve readers on other threads (CRTC and the Flash lanes).
    Concurrent,
    /// Every one, the RadixTree included.
    All,
}

/// A target on ours: an absolute bound and/or a ratio to the strongest baseline of a set.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    pub(crate) text: &'static str,
    /// At least this (a rate) or at most this (a time or size).
    pub(crate) bound: Option<f64>,
    /// At least this many times better than the strongest baseline of `against`.
    pub(crate) ratio: Option<f64>,
    pub(crate) against: Against,
}

#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) label: String,
    pub(crate) unit: Unit,
    pub(crate) ours: Option<f64>,
    /// In [`Baseline::ALL`] order.
    pub(crate) theirs: [Option<f64>; 4],
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
            return "MISS: not measured".into();
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
            let worst = Baseline::ALL
                .iter()
                .zip(self.theirs)
                .filter(|(b, _)| t.against == Against::All || b.concurrent())
                .filter_map(|(b, v)| Some((self.ratio(v)?, b.name())))
                .min_by(|a, b| a.0.total_cmp(&b.0));
            match worst {
                Some((r, name)) if r < want => {
                    misses.push(format!("{r:.2}x < {want:.1}x {name}"));
                }
                Some(_) => {}
                None => misses.push("no baseline".into()),
            }
        }
        if misses.is_empty() {
            "PASS".into()
        } else {
            format!("MISS: {}", misses.join("; "))
        }
    }
}

fn opt(unit: Unit, v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| unit.fmt(v))
}

fn ratio_text(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{r:.2}x"))
}

/// The table of `rows`, then one line per target.
pub(crate) fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = write!(s, "{:<44} {:>11}", "figure", "ours");
    for b in Baseline::ALL {
        let _ = write!(s, " {:>11} {:>7}", b.name(), "ratio");
    }
    let _ = writeln!(s, "  {:<24} verdict", "target");
    let _ = writeln!(s, "{}", "-".repeat(180));
    for r in rows {
        let _ = write!(s, "{:<44} {:>11}", r.label, opt(r.unit, r.ours));
        for v in r.theirs {
            let _ = write!(s, " {:>11} {:>7}", opt(r.unit, v), ratio_text(r.ratio(v)));
        }
        let _ = writeln!(
            s,
            "  {:<24} {}",
            r.target.map_or("", |t| t.text),
            r.verdict()
        );
    }
    let _ = writeln!(s, "\ntargets:");
    for r in rows {
        if let Some(t) = r.target {
            let v = r.verdict();
            let (why, word) = v
                .strip_prefix("MISS: ")
                .map_or(("", "PASS"), |why| (why, "MISS"));
            let _ = writeln!(
                s,
                "  {} {}: ours {}{}{} {word}",
                r.label,
                t.text,
                opt(r.unit, r.ours),
                if why.is_empty() { "" } else { "; " },
                why
            );
        }
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
            theirs: [Some(10_000.0), Some(8_000.0), None, Some(3_000.0)],
            target: Some(Target {
                text: "",
                bound: Some(5_000.0),
                ratio: Some(2.0),
                against: Against::All,
            }),
        };
        assert_eq!(row.ratio(row.theirs[0]), Some(5.0));
        assert_eq!(row.verdict(), "MISS: 1.50x < 2.0x RadixTree");
        // Against the concurrent ones only, the RadixTree does not count.
        let concurrent = Row {
            target: row.target.map(|t| Target {
                against: Against::Concurrent,
                ..t
            }),
            ..row.clone()
        };
        assert_eq!(concurrent.verdict(), "PASS");
        let rate = Row {
            unit: Unit::Rate,
            ours: Some(4e6),
            theirs: [Some(1e6), Some(5e6), None, None],
            target: Some(Target {
                text: "",
                bound: None,
                ratio: Some(1.0),
                against: Against::Concurrent,
            }),
            ..row
        };
        assert_eq!(rate.verdict(), "MISS: 0.80x < 1.0x Flash str.");
        let t = table(&[rate]);
        assert!(
            t.contains("targets:\n  x : ours 4.00 M/s; 0.80x < 1.0x Flash str. MISS\n"),
            "{t}"
        );
    }
}
