//! Metrics hooks of the load store: per-key gauges and the `load_events_total` counters.
//!
//! Role: [`LoadStore::render_gauges`] renders the three per-key gauges from the store itself, so a
//! series exists exactly while its key is live and its last sample carries the field, and each
//! live key's sample age (`continuum_dynamo_worker_load_sample_age_seconds`, the freshness an
//! operator alerts on; the clock is the caller's);
//! [`LoadEventCounters`] are per-shard single-writer counters that [`render_load_events`] merges
//! at scrape time; [`ApplyOutcome::result`] and [`Refusal::result`] map the store's outcomes to
//! their `result` label. This module builds on `store`, never the reverse.
//!
//! Invariants:
//! - gauge labels are bounded by fleet size: `namespace`, `worker` (lowercase hex, LOAD-MET-01),
//!   `dp_rank` (decimal); a nil field creates no series (LOAD-MET-02); a departed worker has no
//!   series from the moment `set_live_and_retain` returns (LOAD-MET-03); a discarded sample has
//!   none either (nothing is known about the key);
//! - the `result` label set is closed ([`LoadEventResult::ALL`], OBS-04 plus `duplicate` and
//!   `applied`, Q-21);
//! - a counter has one writer (its shard): increments are a relaxed load and store, no locked
//!   read-modify-write; a scrape reads each cell once and may be a few increments behind.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::store::{ApplyOutcome, LoadStore, Refusal};
use crate::clock::Instant;

/// The `result` label of `continuum_dynamo_load_events_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoadEventResult {
    /// The sample was stored (Q-21's success label).
    Applied,
    /// Dropped by the subscription cursor or the per-key sequence check (LOAD-STORE-01/02).
    Duplicate,
    /// Wrong frame count, id frame size or msgpack (LOAD-ZMTP-06).
    Malformed,
    /// Frame version not 1 (LOAD-ZMTP-07).
    UnknownVersion,
    /// Frame 0 or envelope topic not `kv_metrics` (LOAD-ZMTP-08).
    TopicMismatch,
    /// Declared payload above 16 KiB (LOAD-ZMTP-09).
    Oversized,
    /// Publisher ids disagree or the worker/rank is not live (LOAD-ZMTP-10).
    IdentityMismatch,
    /// The store is at its key cap (LOAD-ZMTP-11).
    OverCapacity,
    /// ZMTP protocol violation (LOAD-ZMTP-16).
    TransportRefused,
}

impl LoadEventResult {
    /// Every label, in rendering order.
    pub const ALL: [LoadEventResult; 9] = [
        LoadEventResult::Applied,
        LoadEventResult::Duplicate,
        LoadEventResult::Malformed,
        LoadEventResult::UnknownVersion,
        LoadEventResult::TopicMismatch,
        LoadEventResult::Oversized,
        LoadEventResult::IdentityMismatch,
        LoadEventResult::OverCapacity,
        LoadEventResult::TransportRefused,
    ];

    /// The label value.
    pub const fn label(self) -> &'static str {
        match self {
            LoadEventResult::Applied => "applied",
            LoadEventResult::Duplicate => "duplicate",
            LoadEventResult::Malformed => "malformed",
            LoadEventResult::UnknownVersion => "unknown_version",
            LoadEventResult::TopicMismatch => "topic_mismatch",
            LoadEventResult::Oversized => "oversized",
            LoadEventResult::IdentityMismatch => "identity_mismatch",
            LoadEventResult::OverCapacity => "over_capacity",
            LoadEventResult::TransportRefused => "transport_refused",
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

/// One shard's `load_events_total` cells. Only that shard increments them.
#[derive(Debug, Default)]
pub struct LoadEventCounters {
    cells: [AtomicU64; 9],
}

impl LoadEventCounters {
    /// Zeroed counters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one event. Single writer: a relaxed load and store.
    pub fn record(&self, result: LoadEventResult) {
        self.add(result, 1);
    }

    /// Counts `n` events.
    pub fn add(&self, result: LoadEventResult, n: u64) {
        if let Some(c) = self.cells.get(result.index()) {
            c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
        }
    }

    /// The current count of one label on this shard.
    pub fn get(&self, result: LoadEventResult) -> u64 {
        self.cells
            .get(result.index())
            .map_or(0, |c| c.load(Relaxed))
    }
}

/// Renders `continuum_dynamo_load_events_total`, summed over shards, every label always present.
pub fn render_load_events<'a>(
    out: &mut String,
    shards: impl IntoIterator<Item = &'a LoadEventCounters> + Clone,
) {
    let _ = writeln!(
        out,
        "# HELP continuum_dynamo_load_events_total kv_metrics messages by outcome.\n\
         # TYPE continuum_dynamo_load_events_total counter"
    );
    for r in LoadEventResult::ALL {
        let total = shards
            .clone()
            .into_iter()
            .fold(0u64, |acc, s| acc.wrapping_add(s.get(r)));
        let _ = writeln!(
            out,
            "continuum_dynamo_load_events_total{{result=\"{}\"}} {total}",
            r.label()
        );
    }
}

impl ApplyOutcome {
    /// The `result` label to count.
    pub const fn result(self) -> LoadEventResult {
        match self {
            ApplyOutcome::Applied => LoadEventResult::Applied,
            ApplyOutcome::Duplicate => LoadEventResult::Duplicate,
            ApplyOutcome::Refused(r) => r.result(),
        }
    }
}

impl Refusal {
    /// The `result` label to count.
    pub const fn result(self) -> LoadEventResult {
        match self {
            Refusal::IdentityMismatch => LoadEventResult::IdentityMismatch,
            Refusal::OverCapacity => LoadEventResult::OverCapacity,
        }
    }
}

/// Gauge names and help, in rendering order.
const GAUGES: [(&str, &str); 3] = [
    (
        "continuum_dynamo_worker_active_decode_blocks",
        "active_decode_blocks of the last kv_metrics sample per worker rank.",
    ),
    (
        "continuum_dynamo_worker_active_prefill_tokens",
        "active_prefill_tokens of the last kv_metrics sample per worker rank.",
    ),
    (
        "continuum_dynamo_worker_kv_used_blocks",
        "kv_used_blocks of the last kv_metrics sample per worker rank.",
    ),
];

/// Append `v` to `out` escaped as a Prometheus label value.
pub fn escape_label(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// `name{namespace="ns",worker="<hex>",dp_rank="<n>"}`, the series of a worker rank (LOAD-MET-01).
fn series(out: &mut String, name: &str, ns: &str, key: super::LoadKey) {
    let _ = write!(out, "{name}{{namespace=\"");
    escape_label(out, ns);
    let _ = write!(
        out,
        "\",worker=\"{:x}\",dp_rank=\"{}\"}}",
        key.worker_id.get(),
        key.dp_rank
    );
}

/// The freshness gauge: seconds since the last applied sample per worker rank.
const AGE: (&str, &str) = (
    "continuum_dynamo_worker_load_sample_age_seconds",
    "Seconds since this router applied the last kv_metrics sample of the worker rank (fresh while at most dynamo.load.max_staleness).",
);

impl LoadStore {
    /// Renders the per-key gauges of the current generation (Prometheus text), the ages as of
    /// `now`. Scrape path: allocates only by growing `out`.
    pub fn render_gauges(&self, out: &mut String, now: Instant) {
        let view = self.view();
        // Every rank with a sample has an age (not a sample field: LOAD-MET-02 does not apply).
        let (name, help) = AGE;
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (e, ns) in view.entries() {
            let Some(s) = view.read_entry(e).sample else {
                continue;
            };
            let age = now.saturating_since(s.received_at).as_secs_f64();
            series(out, name, ns, e.key);
            let _ = writeln!(out, " {age}");
        }
        for (g, (name, help)) in GAUGES.iter().enumerate() {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (e, ns) in view.entries() {
                let Some(s) = view.read_entry(e).sample else {
                    continue;
                };
                let value = match g {
                    0 => s.sample.active_decode_blocks,
                    1 => s.sample.active_prefill_tokens,
                    _ => s.sample.kv_used_blocks,
                };
                let Some(v) = value else {
                    continue;
                };
                series(out, name, ns, e.key);
                let _ = writeln!(out, " {v}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_merge_over_shards_with_closed_labels() {
        let a = LoadEventCounters::new();
        let b = LoadEventCounters::new();
        a.record(LoadEventResult::Applied);
        a.record(LoadEventResult::Applied);
        b.record(LoadEventResult::Applied);
        b.add(LoadEventResult::OverCapacity, 5);
        let mut out = String::new();
        render_load_events(&mut out, [&a, &b]);
        assert!(out.contains("continuum_dynamo_load_events_total{result=\"applied\"} 3\n"));
        assert!(out.contains("{result=\"over_capacity\"} 5\n"));
        assert!(out.contains("{result=\"transport_refused\"} 0\n"));
        assert_eq!(out.lines().filter(|l| !l.starts_with('#')).count(), 9);
    }

    #[test]
    fn label_values_escape() {
        let mut s = String::new();
        escape_label(&mut s, "a\"b\\c\nd");
        assert_eq!(s, "a\\\"b\\\\c\\nd");
    }
}
