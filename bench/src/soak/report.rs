//! The figures and verdicts of `soak`: the router's samples (RSS, descriptors, `kv_metrics`
//! subscriptions by state, workers listed) and the load's tally, judged against stated
//! tolerances.
//!
//! Invariants: pure functions over [`Sample`]s and a [`Tally`]; only samples taken after the
//! warm-up are judged; a figure that cannot be computed (no samples, unreadable `/proc`) is
//! `n/a` and its verdict is MISS, never a made-up PASS; churn errors are never more than the
//! sim's own count of pins refused because they named a departed worker.

use std::io::Write;

use super::client::{DECODE_FAILED, Tally};
use crate::numbers::{latency, median, per};
use crate::sim_hop::router::SubCounts;

/// RSS drift tolerance, MiB (PASS when within this OR within [`RSS_DRIFT_PCT`]).
pub(crate) const RSS_DRIFT_MIB: f64 = 8.0;
/// RSS drift tolerance, percent of the first quarter's median.
pub(crate) const RSS_DRIFT_PCT: f64 = 5.0;
/// Descriptors: `fds - fleet size` may move within a band this wide over the run.
pub(crate) const FD_BAND: i64 = 16;
/// Subscriptions (all states) and workers listed: within fleet size ± this.
pub(crate) const FLEET_SLACK: i64 = 2;
/// The achieved rate must be at least this share of the target.
pub(crate) const RATE_SHARE: f64 = 0.95;

/// One sample of the router, taken every `--sample-secs`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample {
    /// Seconds since the soak's load started.
    pub(crate) at: f64,
    /// `VmRSS` of `/proc/<pid>/status`, KiB.
    pub(crate) rss_kib: Option<u64>,
    /// Entries of `/proc/<pid>/fd`.
    pub(crate) fds: Option<usize>,
    /// `continuum_dynamo_load_subscriptions` by state.
    pub(crate) subs: Option<SubCounts>,
    /// Workers `/admin/dynamo/workers` lists.
    pub(crate) listed: Option<usize>,
    /// The sim's live workers at that moment.
    pub(crate) live: usize,
    /// The router's CPU seconds since the soak's load started.
    pub(crate) cpu: Option<f64>,
}

/// Subscriptions in every state.
pub(crate) fn total(s: SubCounts) -> u64 {
    s.pending + s.connecting + s.connected + s.backoff
}

/// `VmRSS` in KiB of a `/proc/<pid>/status` text.
pub(crate) fn vm_rss_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line["VmRSS:".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The RSS drift: the median of the last quarter of `rss` (KiB, in sample order) minus the
/// median of the first quarter, in MiB and in percent of the first; `None` with fewer than 2
/// values.
pub(crate) fn rss_drift(rss: &[u64]) -> Option<Drift> {
    if rss.len() < 2 {
        return None;
    }
    let q = (rss.len() / 4).max(1);
    let mib = |v: &[u64]| median(v.iter().map(|k| *k as f64 / 1024.0).collect());
    let first = mib(&rss[..q]);
    let last = mib(&rss[rss.len() - q..]);
    Some(Drift {
        first,
        last,
        per_quarter: q,
    })
}

/// First and last quarter medians of the router's RSS.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Drift {
    /// Median of the first quarter, MiB.
    pub(crate) first: f64,
    /// Median of the last quarter, MiB.
    pub(crate) last: f64,
    /// Samples per quarter.
    pub(crate) per_quarter: usize,
}

impl Drift {
    /// last - first, MiB.
    pub(crate) fn mib(&self) -> f64 {
        self.last - self.first
    }

    /// last - first, percent of first.
    pub(crate) fn pct(&self) -> f64 {
        100.0 * per(self.mib(), self.first)
    }

    /// Within the tolerance (either bound).
    pub(crate) fn ok(&self) -> bool {
        self.mib() <= RSS_DRIFT_MIB || self.pct() <= RSS_DRIFT_PCT
    }
}

/// Requests split by cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Causes {
    /// `disaggregated_decode_failed` answers the sim's departed refusals account for.
    pub(crate) churn: u64,
    /// Every other failure.
    pub(crate) other: u64,
    /// Pins to departed workers the sim refused that never reached a client as an error (the
    /// router recovered them).
    pub(crate) recovered: u64,
}

/// Splits the tally's failures: a `disaggregated_decode_failed` answer is churn's when the sim
/// refused at least as many pins naming a departed worker (`departed`) over the load.
pub(crate) fn causes(t: &Tally, departed: u64) -> Causes {
    let churn = t.decode_failed.min(departed);
    Causes {
        churn,
        other: t.failed() - churn,
        recovered: departed - churn,
    }
}

/// Everything the verdicts need.
#[derive(Debug, Clone)]
pub(crate) struct Soaked {
    /// Fleet size held by the churn.
    pub(crate) workers: usize,
    /// Target rate, requests per second.
    pub(crate) rate: f64,
    /// The load's wall seconds.
    pub(crate) secs: f64,
    /// The load's tally.
    pub(crate) tally: Tally,
    /// Pins the sim refused because they named a departed worker, over the load.
    pub(crate) departed: u64,
    /// Joins and leaves done, and churn steps that failed (with the first reason).
    pub(crate) joined: u64,
    /// Workers killed.
    pub(crate) left: u64,
    /// Failed churn steps and the first reason.
    pub(crate) churn_failures: (u64, Option<String>),
    /// Every sample, in order.
    pub(crate) samples: Vec<Sample>,
    /// Samples before this many seconds are the warm-up.
    pub(crate) warmup_secs: f64,
}

fn verdict(ok: bool) -> &'static str {
    if ok { "PASS" } else { "MISS" }
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("n/a".to_owned(), |v| v.to_string())
}

/// `min..max` of `v`, or `n/a`.
fn range<T: Ord + Copy + std::fmt::Display>(v: &[T]) -> String {
    match (v.iter().min(), v.iter().max()) {
        (Some(a), Some(b)) => format!("{a}..{b}"),
        _ => "n/a".to_owned(),
    }
}

/// Prints the samples (at most `max_rows`, evenly thinned, the last always), then the figures
/// and verdicts. Returns whether every verdict passed.
pub(crate) fn render(out: &mut impl Write, s: &Soaked, max_rows: usize) -> std::io::Result<bool> {
    writeln!(
        out,
        "\n{:>7}  {:>8}  {:>5}  {:>29}  {:>6}  {:>4}  {:>9}",
        "t (s)", "RSS MiB", "fds", "subs conn/pend/connecting/back", "listed", "live", "rtr cpu %"
    )?;
    let step = s.samples.len().div_ceil(max_rows.max(1)).max(1);
    let mut prev_cpu: Option<(f64, f64)> = None;
    for (i, x) in s.samples.iter().enumerate() {
        let cpu_pct = match (prev_cpu, x.cpu) {
            (Some((t0, c0)), Some(c)) if x.at > t0 => {
                format!("{:.0}", 100.0 * (c - c0) / (x.at - t0))
            }
            _ => "-".to_owned(),
        };
        if let Some(c) = x.cpu {
            prev_cpu = Some((x.at, c));
        }
        if i % step != 0 && i + 1 != s.samples.len() {
            continue;
        }
        let subs = x.subs.map_or("n/a".to_owned(), |c| {
            format!(
                "{}/{}/{}/{}",
                c.connected, c.pending, c.connecting, c.backoff
            )
        });
        let warm = if x.at < s.warmup_secs {
            " (warm-up)"
        } else {
            ""
        };
        writeln!(
            out,
            "{:>7.1}  {:>8}  {:>5}  {:>29}  {:>6}  {:>4}  {:>9}{warm}",
            x.at,
            x.rss_kib
                .map_or("n/a".to_owned(), |k| format!("{:.1}", k as f64 / 1024.0)),
            opt(x.fds),
            subs,
            opt(x.listed),
            x.live,
            cpu_pct,
        )?;
    }
    if step > 1 {
        writeln!(out, "(one sample in {step} of {} shown)", s.samples.len())?;
    }

    let t = &s.tally;
    let c = causes(t, s.departed);
    let n = s.workers as i64;
    writeln!(out)?;
    let achieved = per(t.sent as f64, s.secs);
    writeln!(
        out,
        "load: {} requests in {:.1} s = {achieved:.0} req/s (target {:.0}); {} started more \
         than 1 ms late ({:.2}%)",
        t.sent,
        s.secs,
        s.rate,
        t.late,
        100.0 * per(t.late as f64, t.sent as f64),
    )?;
    writeln!(
        out,
        "latency (from when each request was due): p50 {}, p99 {}, p99.9 {}, max {}",
        latency(t.latency.value_at_quantile(0.50) as f64),
        latency(t.latency.value_at_quantile(0.99) as f64),
        latency(t.latency.value_at_quantile(0.999) as f64),
        latency(t.latency.max() as f64),
    )?;
    let other: Vec<String> = t.other.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    writeln!(
        out,
        "requests: ok {}, errors {} = churn {} + other {} (502 {DECODE_FAILED} {}, other \
         statuses {}, transport {})",
        t.ok,
        t.failed(),
        c.churn,
        c.other,
        t.decode_failed,
        if other.is_empty() {
            "none".to_owned()
        } else {
            other.join(", ")
        },
        t.transport,
    )?;
    writeln!(
        out,
        "churn: {} joined, {} left; the sim refused {} pin(s) to a departed worker (each a \
         churn error unless the router recovered it: {} recovered); {:.2} churn errors per \
         departure",
        s.joined,
        s.left,
        s.departed,
        c.recovered,
        per(c.churn as f64, s.left as f64),
    )?;
    if let (n @ 1.., Some(why)) = (s.churn_failures.0, &s.churn_failures.1) {
        writeln!(
            out,
            "churn: WARNING: {n} churn step(s) failed, first: {why}"
        )?;
    }
    for e in &t.errors {
        writeln!(out, "error sample: {e}")?;
    }

    let judged: Vec<&Sample> = s.samples.iter().filter(|x| x.at >= s.warmup_secs).collect();
    let rss: Vec<u64> = judged.iter().filter_map(|x| x.rss_kib).collect();
    let drift = rss_drift(&rss);
    let fds: Vec<i64> = judged
        .iter()
        .filter_map(|x| x.fds.map(|f| f as i64))
        .collect();
    let offsets: Vec<i64> = fds.iter().map(|f| f - n).collect();
    let fd_ok = !offsets.is_empty()
        && offsets.iter().max().unwrap_or(&0) - offsets.iter().min().unwrap_or(&0) <= FD_BAND;
    let totals: Vec<i64> = judged
        .iter()
        .filter_map(|x| x.subs.map(|c| total(c) as i64))
        .collect();
    let connected: Vec<i64> = judged
        .iter()
        .filter_map(|x| x.subs.map(|c| c.connected as i64))
        .collect();
    let listed: Vec<i64> = judged
        .iter()
        .filter_map(|x| x.listed.map(|l| l as i64))
        .collect();
    let near = |v: &[i64]| !v.is_empty() && v.iter().all(|x| (x - n).abs() <= FLEET_SLACK);
    let subs_ok = near(&totals)
        && judged.len() == totals.len()
        && connected.iter().all(|x| *x >= n - FLEET_SLACK);
    let listed_ok = near(&listed) && judged.len() == listed.len();
    writeln!(
        out,
        "judged: {} samples from {:.0} s on (the first {:.0} s are the warm-up)",
        judged.len(),
        s.warmup_secs,
        s.warmup_secs,
    )?;
    match drift {
        Some(d) => writeln!(
            out,
            "router RSS: median of the first {q} judged samples {:.1} MiB, of the last {q} {:.1} \
             MiB: drift {:+.2} MiB ({:+.2}%)",
            d.first,
            d.last,
            d.mib(),
            d.pct(),
            q = d.per_quarter,
        )?,
        None => writeln!(out, "router RSS: n/a (fewer than 2 judged samples)")?,
    }
    writeln!(
        out,
        "router fds: {} (fleet size {n}: fds - fleet {}); subscriptions (all states) {}, \
         connected {}; workers listed {}",
        range(&fds),
        range(&offsets),
        range(&totals),
        range(&connected),
        range(&listed),
    )?;
    let rate_ok = achieved >= RATE_SHARE * s.rate;
    let checks = [
        (
            format!("RSS drift <= {RSS_DRIFT_PCT:.0}% or <= {RSS_DRIFT_MIB:.0} MiB"),
            drift.is_some_and(|d| d.ok()),
            drift.map_or("n/a".to_owned(), |d| {
                format!("{:+.2} MiB, {:+.2}%", d.mib(), d.pct())
            }),
        ),
        (
            format!("fds within fleet size + a constant (band <= {FD_BAND})"),
            fd_ok,
            format!("fds - fleet {}", range(&offsets)),
        ),
        (
            format!(
                "subscriptions within fleet size +/- {FLEET_SLACK}, connected >= fleet - {FLEET_SLACK}"
            ),
            subs_ok,
            format!(
                "{} (connected {}) vs {n}",
                range(&totals),
                range(&connected)
            ),
        ),
        (
            format!("workers listed within fleet size +/- {FLEET_SLACK}"),
            listed_ok,
            format!("{} vs {n}", range(&listed)),
        ),
        (
            "0 non-churn errors".to_owned(),
            c.other == 0,
            format!("{} (churn {})", c.other, c.churn),
        ),
        (
            format!("rate held (>= {:.0}% of target)", RATE_SHARE * 100.0),
            rate_ok,
            format!("{achieved:.0} of {:.0} req/s", s.rate),
        ),
    ];
    let mut all = true;
    for (what, ok, got) in &checks {
        all &= *ok;
        writeln!(out, "target: {what}: {} ({got})", verdict(*ok))?;
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: f64, rss_mib: u64, fds: usize, connected: u64, listed: usize) -> Sample {
        Sample {
            at,
            rss_kib: Some(rss_mib * 1024),
            fds: Some(fds),
            subs: Some(SubCounts {
                connected,
                ..SubCounts::default()
            }),
            listed: Some(listed),
            live: 10,
            cpu: Some(at / 2.0),
        }
    }

    #[test]
    fn rss_and_drift() {
        let status = "Name:\tx\nVmPeak:\t  9000 kB\nVmRSS:\t   40960 kB\nVmData: 1 kB\n";
        assert_eq!(vm_rss_kib(status), Some(40960));
        assert_eq!(vm_rss_kib("nothing"), None);
        assert!(rss_drift(&[1024]).is_none());
        // 8 samples: quarters of 2; medians 40 and 48 MiB.
        let kib: Vec<u64> = [40, 40, 41, 42, 44, 46, 48, 48]
            .iter()
            .map(|m| m * 1024)
            .collect();
        let d = rss_drift(&kib).unwrap();
        assert_eq!((d.first, d.last, d.per_quarter), (40.0, 48.0, 2));
        assert_eq!((d.mib(), d.pct()), (8.0, 20.0));
        assert!(d.ok(), "8 MiB is within the MiB bound");
        let d = rss_drift(&[400 * 1024, 430 * 1024]).unwrap();
        assert!(!d.ok(), "30 MiB and 7.5% exceed both bounds");
        let d = rss_drift(&[400 * 1024, 415 * 1024]).unwrap();
        assert!(d.ok(), "3.75% is within the percent bound");
    }

    #[test]
    fn churn_errors_are_bounded_by_the_sims_departed_refusals() {
        let mut t = Tally {
            decode_failed: 7,
            transport: 1,
            ..Tally::default()
        };
        t.other.insert("503 no_worker".into(), 2);
        assert_eq!(
            causes(&t, 5),
            Causes {
                churn: 5,
                other: 5,
                recovered: 0
            }
        );
        assert_eq!(
            causes(&t, 9),
            Causes {
                churn: 7,
                other: 3,
                recovered: 2
            }
        );
    }

    fn soaked(samples: Vec<Sample>, tally: Tally) -> Soaked {
        Soaked {
            workers: 10,
            rate: 100.0,
            secs: 10.0,
            tally,
            departed: 3,
            joined: 9,
            left: 9,
            churn_failures: (0, None),
            samples,
            warmup_secs: 2.0,
        }
    }

    #[test]
    fn a_steady_run_passes_and_a_leaky_one_does_not() {
        let ok_tally = Tally {
            sent: 1000,
            ok: 997,
            decode_failed: 3,
            ..Tally::default()
        };
        let steady: Vec<Sample> = (0..12)
            .map(|i| {
                sample(
                    f64::from(i),
                    40,
                    60 + (i % 2) as usize,
                    10 + (i % 2) as u64,
                    10,
                )
            })
            .collect();
        let mut out = Vec::new();
        assert!(render(&mut out, &soaked(steady.clone(), ok_tally.clone()), 40).unwrap());
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("errors 3 = churn 3 + other 0"), "{text}");
        assert!(
            text.contains("target: 0 non-churn errors: PASS (0 (churn 3))"),
            "{text}"
        );
        assert!(text.contains("judged: 10 samples from 2 s on"), "{text}");
        assert!(text.contains("fds - fleet 50..51"), "{text}");
        assert!(text.contains("0.33 churn errors per departure"), "{text}");
        assert!(!text.contains("MISS"), "{text}");

        let leaky: Vec<Sample> = (0..12)
            .map(|i| {
                sample(
                    f64::from(i),
                    40 + 4 * i as u64,
                    60 + 3 * i as usize,
                    10 + i as u64,
                    10,
                )
            })
            .collect();
        let mut bad = ok_tally;
        bad.transport = 1;
        bad.sent = 500;
        let mut out = Vec::new();
        assert!(!render(&mut out, &soaked(leaky, bad), 5).unwrap());
        let text = String::from_utf8(out).unwrap();
        for what in [
            "RSS drift",
            "fds within",
            "subscriptions within",
            "0 non-churn errors: MISS",
            "rate held",
        ] {
            assert!(
                text.lines().any(|l| l.contains(what) && l.contains("MISS")),
                "{what}: {text}"
            );
        }
        assert!(
            text.contains("workers listed within fleet size +/- 2: PASS"),
            "{text}"
        );
        assert!(text.contains("(one sample in 3 of 12 shown)"), "{text}");
    }
}
