//! Where a proxied request's time goes, per shard (issue 37 item 6): histograms of the router's
//! own added time, the pick, the prompt pipeline, the upstream's time to first byte and, for
//! event streams, the time to the first event, each by route and dispatch path.
//!
//! Role: a request records its phase boundaries in a [`PhaseTimes`] as it goes (mostly clock
//! readings the dispatch takes anyway); when it ends, [`PhaseHistograms::record`] files each
//! phase it went through. Families (seconds):
//! - `continuum_router_added_seconds`: request head read → upstream request head written (the
//!   answering attempt's; earlier failed attempts count as router time);
//! - `continuum_pick_seconds` and `continuum_prompt_pipeline_seconds` (shim path only; the
//!   prompt pipeline only with `dynamo.kv`);
//! - `continuum_upstream_first_byte_seconds`: upstream request written → its response head read;
//! - `continuum_time_to_first_event_seconds`: request head read → first event of an event-stream
//!   answer written to the client.
//!
//! Invariants: as every shard counter, one writer (the shard thread; plain load + store, no
//! locked instruction, no line shared with another core), summed over shards on scrape; label
//! sets are closed (`route` of [`Route::ALL`], `path` `plain|shim`); a series appears once it
//! has a sample.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use continuum_core::route::Route;

use super::{add, bump};

/// Bucket upper bounds, seconds: from the router's own microseconds to a long generation.
const BOUNDS: [f64; 23] = [
    0.000_002_5,
    0.000_005,
    0.000_01,
    0.000_025,
    0.000_05,
    0.000_1,
    0.000_25,
    0.000_5,
    0.001,
    0.002_5,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    120.0,
];
/// [`BOUNDS`] in nanoseconds.
const BOUNDS_NS: [u64; BOUNDS.len()] = nanos(BOUNDS);

/// Each of `secs` in whole nanoseconds (rounded).
const fn nanos<const N: usize>(secs: [f64; N]) -> [u64; N] {
    let mut out = [0; N];
    let mut i = 0;
    while i < N {
        out[i] = (secs[i] * 1e9 + 0.5) as u64;
        i += 1;
    }
    out
}

/// Cells per series: the buckets (not cumulative; `+Inf` is the count), the sum (ns), the count.
const CELLS: usize = BOUNDS.len() + 2;
const ROUTES: usize = Route::ALL.len();

/// A phase of a proxied request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Request head read → upstream request head written.
    RouterAdded = 0,
    /// The pick (candidates, costs, the KV overlap).
    Pick = 1,
    /// The prompt pipeline (template render, tokenizing, block hashes).
    Prompt = 2,
    /// Upstream request written → upstream response head read.
    FirstByte = 3,
    /// Request head read → first event of an event stream written to the client.
    FirstEvent = 4,
}

impl Phase {
    /// Every phase, in cell order.
    pub(crate) const ALL: [Phase; 5] = [
        Phase::RouterAdded,
        Phase::Pick,
        Phase::Prompt,
        Phase::FirstByte,
        Phase::FirstEvent,
    ];

    fn name(self) -> &'static str {
        match self {
            Phase::RouterAdded => "continuum_router_added_seconds",
            Phase::Pick => "continuum_pick_seconds",
            Phase::Prompt => "continuum_prompt_pipeline_seconds",
            Phase::FirstByte => "continuum_upstream_first_byte_seconds",
            Phase::FirstEvent => "continuum_time_to_first_event_seconds",
        }
    }

    fn help(self) -> &'static str {
        match self {
            Phase::RouterAdded => {
                "Router-added time: request head read to the upstream request head written."
            }
            Phase::Pick => "Worker pick time (shim path).",
            Phase::Prompt => "Prompt pipeline time: render, tokenize, block hashes (dynamo.kv).",
            Phase::FirstByte => "Upstream request written to its response head read.",
            Phase::FirstEvent => {
                "Request head read to the first event of an event-stream answer written."
            }
        }
    }
}

/// How a request was dispatched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum DispatchPath {
    /// Model routing, no pins.
    #[default]
    Plain = 0,
    /// Pinned to picked workers through a shim replica.
    Shim = 1,
}

impl DispatchPath {
    const ALL: [DispatchPath; 2] = [DispatchPath::Plain, DispatchPath::Shim];

    fn label(self) -> &'static str {
        match self {
            DispatchPath::Plain => "plain",
            DispatchPath::Shim => "shim",
        }
    }
}

/// One request's phase boundaries, filled as it goes; `None` for a phase it never reached.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PhaseTimes {
    /// The prompt pipeline's duration.
    pub(crate) prompt: Option<Duration>,
    /// The pick's duration.
    pub(crate) pick: Option<Duration>,
    /// When the answering attempt's request head was written.
    pub(crate) sent: Option<Instant>,
    /// When that attempt's response head was read.
    pub(crate) head: Option<Instant>,
    /// When the first event of an event-stream answer was written to the client.
    pub(crate) first_event: Option<Instant>,
    /// The answering attempt's path.
    pub(crate) path: DispatchPath,
}

impl PhaseTimes {
    /// The first event of the answer is written now, `at()` (read only the first time).
    pub(crate) fn event_written(&mut self, at: impl FnOnce() -> Instant) {
        if self.first_event.is_none() {
            self.first_event = Some(at());
        }
    }
}

/// One shard's phase histograms.
#[derive(Debug)]
pub(crate) struct PhaseHistograms {
    /// `[phase][route][path][cell]`.
    cells: Box<[AtomicU64]>,
}

impl Default for PhaseHistograms {
    fn default() -> Self {
        let n = Phase::ALL.len() * ROUTES * DispatchPath::ALL.len() * CELLS;
        Self {
            cells: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

fn series(phase: Phase, route: Route, path: DispatchPath) -> usize {
    ((phase as usize * ROUTES + route as usize) * DispatchPath::ALL.len() + path as usize) * CELLS
}

impl PhaseHistograms {
    /// Count one sample of `phase`.
    pub(crate) fn observe(&self, phase: Phase, route: Route, path: DispatchPath, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let at = series(phase, route, path);
        let bucket = BOUNDS_NS.partition_point(|le| *le < ns);
        if let Some(c) = self
            .cells
            .get(at + bucket)
            .filter(|_| bucket < BOUNDS.len())
        {
            bump(c);
        }
        if let Some(c) = self.cells.get(at + BOUNDS.len()) {
            add(c, ns);
        }
        if let Some(c) = self.cells.get(at + BOUNDS.len() + 1) {
            bump(c);
        }
    }

    /// File every phase a request of `route` that began at `started` went through.
    pub(crate) fn record(&self, route: Route, started: Instant, t: &PhaseTimes) {
        let path = t.path;
        if let Some(d) = t.prompt {
            self.observe(Phase::Prompt, route, path, d);
        }
        if let Some(d) = t.pick {
            self.observe(Phase::Pick, route, path, d);
        }
        if let Some(sent) = t.sent {
            self.observe(
                Phase::RouterAdded,
                route,
                path,
                sent.saturating_duration_since(started),
            );
            if let Some(head) = t.head {
                self.observe(
                    Phase::FirstByte,
                    route,
                    path,
                    head.saturating_duration_since(sent),
                );
            }
        }
        if let Some(e) = t.first_event {
            self.observe(
                Phase::FirstEvent,
                route,
                path,
                e.saturating_duration_since(started),
            );
        }
    }

    fn load(&self, i: usize) -> u64 {
        self.cells.get(i).map_or(0, |c| c.load(Relaxed))
    }
}

/// Append every phase family, summed over `shards`.
pub(super) fn render<'a>(out: &mut String, shards: impl Iterator<Item = &'a PhaseHistograms>) {
    let shards: Vec<&PhaseHistograms> = shards.collect();
    let sum = |i: usize| -> u64 { shards.iter().map(|s| s.load(i)).sum() };
    for phase in Phase::ALL {
        let name = phase.name();
        let _ = writeln!(
            out,
            "# HELP {name} {}\n# TYPE {name} histogram",
            phase.help()
        );
        for route in Route::ALL {
            for path in DispatchPath::ALL {
                let at = series(phase, route, path);
                let count = sum(at + BOUNDS.len() + 1);
                if count == 0 {
                    continue;
                }
                let labels = format!("route=\"{}\",path=\"{}\"", route.label(), path.label());
                let mut cumulative = 0u64;
                for (b, le) in BOUNDS.iter().enumerate() {
                    cumulative += sum(at + b);
                    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
                }
                let _ = writeln!(
                    out,
                    "{name}_bucket{{{labels},le=\"+Inf\"}} {count}\n{name}_sum{{{labels}}} {}\n{name}_count{{{labels}}} {count}",
                    sum(at + BOUNDS.len()) as f64 / 1e9
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(shards: &[&PhaseHistograms]) -> String {
        let mut out = String::new();
        render(&mut out, shards.iter().copied());
        out
    }

    #[test]
    fn bounds_are_exact_in_nanoseconds_and_rise() {
        assert_eq!(BOUNDS_NS[0], 2_500);
        assert_eq!(BOUNDS_NS[8], 1_000_000);
        assert_eq!(BOUNDS_NS[BOUNDS.len() - 1], 120_000_000_000);
        for (s, ns) in BOUNDS.iter().zip(BOUNDS_NS) {
            assert_eq!((s * 1e9).round() as u64, ns);
        }
        assert!(BOUNDS_NS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_sample_lands_in_the_first_bucket_at_or_above_it_and_shards_sum() {
        let a = PhaseHistograms::default();
        let b = PhaseHistograms::default();
        let r = Route::ChatCompletions;
        // 7 µs: le=1e-05; exactly 10 µs: le=1e-05 too (le is inclusive); 200 s: only +Inf.
        a.observe(
            Phase::RouterAdded,
            r,
            DispatchPath::Plain,
            Duration::from_micros(7),
        );
        b.observe(
            Phase::RouterAdded,
            r,
            DispatchPath::Plain,
            Duration::from_micros(10),
        );
        b.observe(
            Phase::RouterAdded,
            r,
            DispatchPath::Plain,
            Duration::from_secs(200),
        );
        let text = rendered(&[&a, &b]);
        let line = |le: &str| {
            format!(
                "continuum_router_added_seconds_bucket{{route=\"chat_completions\",path=\"plain\",le=\"{le}\"}}"
            )
        };
        assert!(
            text.contains(&format!("{} 0\n", line("0.000005"))),
            "{text}"
        );
        assert!(text.contains(&format!("{} 2\n", line("0.00001"))), "{text}");
        assert!(text.contains(&format!("{} 2\n", line("120"))), "{text}");
        assert!(text.contains(&format!("{} 3\n", line("+Inf"))), "{text}");
        assert!(text.contains(
            "continuum_router_added_seconds_count{route=\"chat_completions\",path=\"plain\"} 3"
        ));
        assert!(text.contains(
            "continuum_router_added_seconds_sum{route=\"chat_completions\",path=\"plain\"} 200.000017"
        ), "{text}");
        // No sample, no series; every family still has its HELP and TYPE.
        assert!(!text.contains("path=\"shim\""), "{text}");
        for phase in Phase::ALL {
            assert!(text.contains(&format!("# TYPE {} histogram", phase.name())));
        }
    }

    #[test]
    fn a_request_files_each_phase_it_went_through() {
        let h = PhaseHistograms::default();
        let t0 = crate::clock::instant();
        let times = PhaseTimes {
            prompt: Some(Duration::from_micros(40)),
            pick: Some(Duration::from_micros(3)),
            sent: Some(t0 + Duration::from_micros(60)),
            head: Some(t0 + Duration::from_millis(20)),
            first_event: Some(t0 + Duration::from_millis(21)),
            path: DispatchPath::Shim,
        };
        h.record(Route::Messages, t0, &times);
        let text = rendered(&[&h]);
        let count = |name: &str| format!("{name}_count{{route=\"messages\",path=\"shim\"}} 1");
        for phase in Phase::ALL {
            assert!(text.contains(&count(phase.name())), "{phase:?}: {text}");
        }
        // 20 ms - 60 µs upstream: in le=0.025, not le=0.01.
        let le = |v: &str| {
            format!(
                "continuum_upstream_first_byte_seconds_bucket{{route=\"messages\",path=\"shim\",le=\"{v}\"}}"
            )
        };
        assert!(text.contains(&format!("{} 0\n", le("0.01"))), "{text}");
        assert!(text.contains(&format!("{} 1\n", le("0.025"))), "{text}");

        // A plain buffered request: no pick, prompt or event.
        let plain = PhaseHistograms::default();
        plain.record(
            Route::ChatCompletions,
            t0,
            &PhaseTimes {
                sent: Some(t0),
                head: Some(t0),
                ..PhaseTimes::default()
            },
        );
        let text = rendered(&[&plain]);
        assert!(text.contains(
            "continuum_router_added_seconds_count{route=\"chat_completions\",path=\"plain\"} 1"
        ));
        assert!(text.contains("continuum_upstream_first_byte_seconds_count{route=\"chat_completions\",path=\"plain\"} 1"));
        assert!(!text.contains("continuum_pick_seconds_count"), "{text}");
        assert!(
            !text.contains("continuum_time_to_first_event_seconds_count"),
            "{text}"
        );
    }

    #[test]
    fn the_first_event_is_kept() {
        let mut t = PhaseTimes::default();
        let t0 = crate::clock::instant();
        t.event_written(|| t0);
        t.event_written(|| panic!("read again"));
        assert_eq!(t.first_event, Some(t0));
    }
}
