//! Per-shard counters, merged only when `/metrics` is scraped.
//!
//! Every counter a request touches lives in its shard's [`ShardMetrics`] and has exactly one
//! writer, the shard thread, which increments with a plain relaxed load + store (no locked
//! read-modify-write, no cache line shared with another core). A scrape on any shard reads all
//! shards' cells with relaxed loads and sums them; a scrape may be a few increments behind, never
//! torn within a cell.
//!
//! Label sets are closed: routes (`continuum_core::route::Route`) and upstream error classes
//! (`continuum_core::upstream::UpstreamErrorClass`) are enums, statuses are integers in
//! 100..=599.

mod bus;
pub(crate) mod dynamo;
pub(crate) mod kv_select;
pub(crate) mod phases;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use continuum_core::artifacts::ArtifactResult;
use continuum_core::auth::{AuthTable, KeyEntry, Refusal};
use continuum_core::discovery::DiscoveryEventKind;
use continuum_core::health::{HealthState, HealthTable};
use continuum_core::route::Route;
use continuum_core::snapshot::BackendIdx;
use continuum_core::upstream::{DispatchError, UpstreamErrorClass};

const ROUTES: usize = Route::ALL.len();
const STATUSES: usize = 500; // 100..=599
/// Latency bucket upper bounds, seconds.
const BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
    30.0, 120.0,
];
const BUCKET_US: [u64; 16] = [
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    5_000_000,
    30_000_000,
    120_000_000,
];

/// Count one on a single-writer counter.
pub(super) fn bump(c: &AtomicU64) {
    add(c, 1);
}

fn add(c: &AtomicU64, n: u64) {
    // Single writer: a plain load + store is enough and avoids a locked instruction.
    c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
}

/// Counters and gauges of one shard.
#[derive(Debug)]
pub struct ShardMetrics {
    shard: usize,
    requests: Box<[AtomicU64]>,
    latency_buckets: Box<[AtomicU64]>,
    latency_sum_us: [AtomicU64; ROUTES],
    latency_count: [AtomicU64; ROUTES],
    upstream_errors: [AtomicU64; UpstreamErrorClass::ALL.len()],
    upstream_retries: AtomicU64,
    retries_denied: AtomicU64,
    /// Requests without a usable API key: missing, invalid.
    auth_failures: [AtomicU64; 2],
    pins_stripped: AtomicU64,
    connections_accepted: AtomicU64,
    connections_open: AtomicU64,
    inflight: AtomicU64,
    /// The shim path's counters.
    pub(crate) dynamo: dynamo::DynamoCounters,
    /// `continuum_dynamo_kv_selection_total{result}` of this shard (KV-PICK-09).
    pub(crate) kv_selection: kv_select::KvSelectionCounters,
    /// Where proxied requests' time goes ([`phases`]).
    pub(crate) phases: phases::PhaseHistograms,
}

impl ShardMetrics {
    /// Zeroed metrics for shard `shard`.
    pub fn new(shard: usize) -> Self {
        Self {
            shard,
            requests: (0..ROUTES * STATUSES).map(|_| AtomicU64::new(0)).collect(),
            latency_buckets: (0..ROUTES * BUCKETS.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            latency_sum_us: Default::default(),
            latency_count: Default::default(),
            upstream_errors: Default::default(),
            upstream_retries: AtomicU64::new(0),
            retries_denied: AtomicU64::new(0),
            auth_failures: Default::default(),
            pins_stripped: AtomicU64::new(0),
            connections_accepted: AtomicU64::new(0),
            connections_open: AtomicU64::new(0),
            inflight: AtomicU64::new(0),
            dynamo: Default::default(),
            kv_selection: Default::default(),
            phases: Default::default(),
        }
    }

    /// Record one finished request.
    pub fn request_done(&self, route: Route, status: u16, elapsed: Duration) {
        let r = route as usize;
        if (100..600).contains(&status) {
            bump(&self.requests[r * STATUSES + usize::from(status - 100)]);
        }
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        if let Some(b) = BUCKET_US.iter().position(|le| us <= *le) {
            bump(&self.latency_buckets[r * BUCKETS.len() + b]);
        }
        add(&self.latency_sum_us[r], us);
        bump(&self.latency_count[r]);
    }

    /// Record an upstream failure.
    pub fn upstream_error(&self, class: UpstreamErrorClass) {
        bump(&self.upstream_errors[class as usize]);
    }

    /// Record a dispatch failure under its upstream class (a client that left counts nothing).
    pub fn dispatch_failed(&self, e: DispatchError) {
        if let Some(class) = e.class() {
            self.upstream_error(class);
        }
    }

    /// Record a retry on another replica.
    pub fn upstream_retry(&self) {
        bump(&self.upstream_retries);
    }

    /// Record a request refused for its API key.
    pub(crate) fn auth_failed(&self, why: AuthFailure) {
        bump(&self.auth_failures[why as usize]);
    }

    /// Record a retry the retry budget refused.
    pub fn retry_denied(&self) {
        bump(&self.retries_denied);
    }

    /// Record client pin headers removed from one request.
    pub fn pins_stripped(&self, n: u64) {
        add(&self.pins_stripped, n);
    }

    /// A connection was accepted.
    pub fn connection_opened(&self) {
        bump(&self.connections_accepted);
        bump(&self.connections_open);
    }

    /// A connection closed.
    pub fn connection_closed(&self) {
        let c = &self.connections_open;
        c.store(c.load(Relaxed).saturating_sub(1), Relaxed);
    }

    /// A request started (gauge of in-flight requests).
    pub fn inflight_inc(&self) {
        bump(&self.inflight);
    }

    /// A request finished.
    pub fn inflight_dec(&self) {
        let c = &self.inflight;
        c.store(c.load(Relaxed).saturating_sub(1), Relaxed);
    }

    /// Requests in flight on this shard.
    pub fn inflight(&self) -> u64 {
        self.inflight.load(Relaxed)
    }
}

/// Counters written by the control thread.
#[derive(Debug, Default)]
pub struct ControlStats {
    /// Reloads applied.
    pub reloads_applied: AtomicU64,
    /// Reloads rejected (invalid file, unreadable file).
    pub reloads_rejected: AtomicU64,
    /// Generation of the published snapshot.
    pub generation: AtomicU64,
    /// 1 while every discovery watch is open, else 0 (OBS-03).
    pub discovery_connected: AtomicU64,
    /// Discovery events by kind, in `DiscoveryEventKind::ALL` order (OBS-02).
    pub discovery_events: [AtomicU64; DiscoveryEventKind::ALL.len()],
    /// `continuum_dynamo_kv_artifacts_total{result}`, in `ArtifactResult::ALL` order (OBS-11).
    pub kv_artifacts: [AtomicU64; ArtifactResult::ALL.len()],
    /// The event bus listener's counters (its thread writes them).
    pub bus: std::sync::Arc<continuum_core::bus::metrics::BusMetrics>,
}

/// Append each backend's health: `continuum_backend_health{backend,state}` (1 for its current
/// state) and `continuum_upstream_ejections_total{backend}`. Backend names come from the config.
pub fn render_health(out: &mut String, health: &HealthTable, now_ms: u64) {
    let _ = writeln!(
        out,
        "# HELP continuum_backend_health Backend replica health (1 for the current state).
         # TYPE continuum_backend_health gauge"
    );
    for i in 0..health.len() {
        let (Some(name), Some(h)) = (health.name(i), health.get(BackendIdx(i as u32))) else {
            continue;
        };
        let now = h.state(now_ms);
        for state in HealthState::ALL {
            let _ = writeln!(
                out,
                "continuum_backend_health{{backend=\"{name}\",state=\"{}\"}} {}",
                state.label(),
                u8::from(state == now)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP continuum_upstream_ejections_total Outlier ejections of a backend replica.
         # TYPE continuum_upstream_ejections_total counter"
    );
    for i in 0..health.len() {
        if let (Some(name), Some(h)) = (health.name(i), health.get(BackendIdx(i as u32))) {
            let _ = writeln!(
                out,
                "continuum_upstream_ejections_total{{backend=\"{name}\"}} {}",
                h.ejections()
            );
        }
    }
}

/// Why a request had no usable API key (`continuum_auth_failures_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuthFailure {
    /// No key sent.
    Missing = 0,
    /// A key no configured digest matches.
    Invalid = 1,
}

/// Append each client key's counters: `continuum_key_requests_total{key}` (admitted),
/// `continuum_key_refusals_total{key,reason}` and `continuum_key_inflight{key}`. Key names come
/// from the config (a closed set).
pub fn render_keys(out: &mut String, auth: &AuthTable) {
    per_key(
        out,
        auth,
        ("continuum_key_requests_total", "counter"),
        "Requests admitted per client API key.",
        |k| k.state.admitted_total(),
    );
    let _ = writeln!(
        out,
        "# HELP continuum_key_refusals_total Requests refused per client API key and reason.\n\
         # TYPE continuum_key_refusals_total counter"
    );
    for k in auth.keys() {
        for why in Refusal::ALL {
            let _ = writeln!(
                out,
                "continuum_key_refusals_total{{key=\"{}\",reason=\"{}\"}} {}",
                k.config.name,
                why.label(),
                k.state.refused_total(why)
            );
        }
    }
    per_key(
        out,
        auth,
        ("continuum_key_inflight", "gauge"),
        "Requests in flight per client API key.",
        |k| u64::from(k.state.inflight()),
    );
}

/// One family with one series per key: `(name, type)`, its help, its value per key.
fn per_key(
    out: &mut String,
    auth: &AuthTable,
    (name, kind): (&str, &str),
    help: &str,
    value: impl Fn(&KeyEntry) -> u64,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for k in auth.keys() {
        let _ = writeln!(out, "{name}{{key=\"{}\"}} {}", k.config.name, value(k));
    }
}

/// Render every family in the Prometheus text format.
pub fn render(shards: &[std::sync::Arc<ShardMetrics>], control: &ControlStats) -> String {
    let mut out = String::with_capacity(4096);
    render_requests(&mut out, shards);
    render_latency(&mut out, shards);
    phases::render(&mut out, shards.iter().map(|s| &s.phases));
    let _ = writeln!(
        out,
        "# HELP continuum_upstream_errors_total Upstream failures by class.\n\
         # TYPE continuum_upstream_errors_total counter"
    );
    for class in UpstreamErrorClass::ALL {
        let v: u64 = shards
            .iter()
            .map(|s| s.upstream_errors[class as usize].load(Relaxed))
            .sum();
        let _ = writeln!(
            out,
            "continuum_upstream_errors_total{{class=\"{}\"}} {v}",
            class.label()
        );
    }
    simple(
        &mut out,
        "continuum_upstream_retries_total",
        "counter",
        "Attempts retried on another replica (connect retries and unified fallbacks).",
        shards
            .iter()
            .map(|s| s.upstream_retries.load(Relaxed))
            .sum(),
    );
    let _ = writeln!(
        out,
        "# HELP continuum_auth_failures_total Requests refused for their API key (auth on).\n\
         # TYPE continuum_auth_failures_total counter"
    );
    for (i, reason) in ["missing", "invalid"].iter().enumerate() {
        let v: u64 = shards
            .iter()
            .map(|s| s.auth_failures[i].load(Relaxed))
            .sum();
        let _ = writeln!(
            out,
            "continuum_auth_failures_total{{reason=\"{reason}\"}} {v}"
        );
    }
    simple(
        &mut out,
        "continuum_upstream_retries_denied_total",
        "counter",
        "Retries not made because the retry budget (server.retry_budget) was spent.",
        shards.iter().map(|s| s.retries_denied.load(Relaxed)).sum(),
    );
    simple(
        &mut out,
        "continuum_client_pin_headers_stripped_total",
        "counter",
        "Client-sent x-dynamo-* (and alias) headers removed before dispatch.",
        shards.iter().map(|s| s.pins_stripped.load(Relaxed)).sum(),
    );
    dynamo::render(&mut out, shards.iter().map(|s| &s.dynamo));
    kv_select::render(
        &mut out,
        shards.iter().map(|s| &s.kv_selection),
        &control.kv_artifacts,
    );
    per_shard(
        &mut out,
        shards,
        "continuum_shard_connections_accepted_total",
        "counter",
        "Connections accepted per shard.",
        |s| &s.connections_accepted,
    );
    per_shard(
        &mut out,
        shards,
        "continuum_shard_connections_open",
        "gauge",
        "Open client connections per shard.",
        |s| &s.connections_open,
    );
    per_shard(
        &mut out,
        shards,
        "continuum_shard_inflight_requests",
        "gauge",
        "Requests in flight per shard.",
        |s| &s.inflight,
    );
    let _ = writeln!(
        out,
        "# HELP continuum_config_reloads_total Config reloads by outcome.\n\
         # TYPE continuum_config_reloads_total counter\n\
         continuum_config_reloads_total{{result=\"applied\"}} {}\n\
         continuum_config_reloads_total{{result=\"rejected\"}} {}",
        control.reloads_applied.load(Relaxed),
        control.reloads_rejected.load(Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP continuum_dynamo_discovery_events_total Discovery events by kind.\n\
         # TYPE continuum_dynamo_discovery_events_total counter"
    );
    for (kind, cell) in DiscoveryEventKind::ALL
        .iter()
        .zip(&control.discovery_events)
    {
        let _ = writeln!(
            out,
            "continuum_dynamo_discovery_events_total{{kind=\"{}\"}} {}",
            kind.as_str(),
            cell.load(Relaxed)
        );
    }
    simple(
        &mut out,
        "continuum_dynamo_discovery_connected",
        "gauge",
        "1 while every discovery watch is open.",
        control.discovery_connected.load(Relaxed),
    );
    bus::render(&mut out, &control.bus);
    simple(
        &mut out,
        "continuum_config_generation",
        "gauge",
        "Generation of the published router snapshot.",
        control.generation.load(Relaxed),
    );
    out
}

fn simple(out: &mut String, name: &str, kind: &str, help: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
    );
}

fn per_shard(
    out: &mut String,
    shards: &[std::sync::Arc<ShardMetrics>],
    name: &str,
    kind: &str,
    help: &str,
    cell: impl Fn(&ShardMetrics) -> &AtomicU64,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for s in shards {
        let _ = writeln!(
            out,
            "{name}{{shard=\"{}\"}} {}",
            s.shard,
            cell(s).load(Relaxed)
        );
    }
}

fn render_requests(out: &mut String, shards: &[std::sync::Arc<ShardMetrics>]) {
    let _ = writeln!(
        out,
        "# HELP continuum_http_requests_total Requests answered, by route and status.\n\
         # TYPE continuum_http_requests_total counter"
    );
    for route in Route::ALL {
        for status in 0..STATUSES {
            let i = route as usize * STATUSES + status;
            let v: u64 = shards.iter().map(|s| s.requests[i].load(Relaxed)).sum();
            if v > 0 {
                let _ = writeln!(
                    out,
                    "continuum_http_requests_total{{route=\"{}\",status=\"{}\"}} {v}",
                    route.label(),
                    status + 100
                );
            }
        }
    }
}

fn render_latency(out: &mut String, shards: &[std::sync::Arc<ShardMetrics>]) {
    let name = "continuum_http_request_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Time from request head to the last response byte.\n# TYPE {name} histogram"
    );
    for route in Route::ALL {
        let r = route as usize;
        let count: u64 = shards
            .iter()
            .map(|s| s.latency_count[r].load(Relaxed))
            .sum();
        if count == 0 {
            continue;
        }
        let mut cumulative = 0u64;
        for (b, le) in BUCKETS.iter().enumerate() {
            cumulative += shards
                .iter()
                .map(|s| s.latency_buckets[r * BUCKETS.len() + b].load(Relaxed))
                .sum::<u64>();
            let _ = writeln!(
                out,
                "{name}_bucket{{route=\"{}\",le=\"{le}\"}} {cumulative}",
                route.label()
            );
        }
        let sum_us: u64 = shards
            .iter()
            .map(|s| s.latency_sum_us[r].load(Relaxed))
            .sum();
        let _ = writeln!(
            out,
            "{name}_bucket{{route=\"{l}\",le=\"+Inf\"}} {count}\n{name}_sum{{route=\"{l}\"}} {}\n{name}_count{{route=\"{l}\"}} {count}",
            sum_us as f64 / 1e6,
            l = route.label()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn merges_shards_at_scrape() {
        let a = Arc::new(ShardMetrics::new(0));
        let b = Arc::new(ShardMetrics::new(1));
        a.request_done(Route::ChatCompletions, 200, Duration::from_micros(300));
        b.request_done(Route::ChatCompletions, 200, Duration::from_millis(2));
        b.request_done(Route::Other, 404, Duration::from_micros(10));
        b.upstream_error(UpstreamErrorClass::Connect);
        let c = ControlStats::default();
        c.generation.store(3, Relaxed);
        let text = render(&[a, b], &c);
        assert!(text.contains(
            "continuum_http_requests_total{route=\"chat_completions\",status=\"200\"} 2"
        ));
        assert!(text.contains("continuum_http_requests_total{route=\"other\",status=\"404\"} 1"));
        assert!(text.contains("continuum_upstream_errors_total{class=\"connect\"} 1"));
        assert!(text.contains("continuum_http_request_duration_seconds_bucket{route=\"chat_completions\",le=\"0.0005\"} 1"));
        assert!(text.contains("continuum_http_request_duration_seconds_bucket{route=\"chat_completions\",le=\"0.0025\"} 2"));
        assert!(text.contains(
            "continuum_http_request_duration_seconds_count{route=\"chat_completions\"} 2"
        ));
        assert!(text.contains("continuum_config_generation 3"));
        assert!(!text.contains("status=\"500\""));
    }
}
