//! The broker's counters, read by its `/metrics` and by tests: sessions and streams now, sessions
//! established, and streams refused by reason. Labels are closed sets (reasons), never stream,
//! target or router strings.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

use continuum_event_bus::message::CloseReason;

/// Every reason a `subscribe` can be refused, in counter order.
pub const REFUSALS: [CloseReason; 3] = [
    CloseReason::TargetNotAdvertised,
    CloseReason::Draining,
    CloseReason::Refused,
];

/// The counters.
#[derive(Debug, Default)]
pub struct BrokerStats {
    advertised: AtomicU64,
    sessions: AtomicI64,
    established: AtomicU64,
    streams: AtomicI64,
    refused: [AtomicU64; 3],
}

impl BrokerStats {
    #[cfg(feature = "daemon")]
    pub(crate) fn advertised(&self, n: usize) {
        self.advertised
            .store(u64::try_from(n).unwrap_or(u64::MAX), Relaxed);
    }

    pub(crate) fn session_up(&self) {
        self.sessions.fetch_add(1, Relaxed);
        self.established.fetch_add(1, Relaxed);
    }

    pub(crate) fn session_down(&self) {
        self.sessions.fetch_sub(1, Relaxed);
    }

    pub(crate) fn stream_up(&self) {
        self.streams.fetch_add(1, Relaxed);
    }

    pub(crate) fn stream_down(&self) {
        self.streams.fetch_sub(1, Relaxed);
    }

    pub(crate) fn refused(&self, reason: CloseReason) {
        if let Some(i) = REFUSALS.iter().position(|r| *r == reason)
            && let Some(c) = self.refused.get(i)
        {
            c.fetch_add(1, Relaxed);
        }
    }

    /// Sessions welcomed and not ended (0 or 1).
    pub fn sessions(&self) -> i64 {
        self.sessions.load(Relaxed)
    }

    /// Sessions welcomed since start.
    pub fn established(&self) -> u64 {
        self.established.load(Relaxed)
    }

    /// Streams being relayed.
    pub fn streams(&self) -> i64 {
        self.streams.load(Relaxed)
    }

    /// `subscribe`s refused with `reason`.
    pub fn refusals(&self, reason: CloseReason) -> u64 {
        REFUSALS
            .iter()
            .position(|r| *r == reason)
            .and_then(|i| self.refused.get(i))
            .map_or(0, |c| c.load(Relaxed))
    }
}

/// The Prometheus text of `stats`.
pub fn render(stats: &BrokerStats) -> String {
    use std::fmt::Write as _;
    let mut r = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: String| {
        let _ = writeln!(
            r,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    };
    metric(
        "continuum_event_broker_sessions",
        "gauge",
        "Sessions with the router's event bus that are up (0 or 1).",
        stats.sessions().to_string(),
    );
    metric(
        "continuum_event_broker_sessions_established_total",
        "counter",
        "Sessions the router welcomed.",
        stats.established().to_string(),
    );
    metric(
        "continuum_event_broker_streams",
        "gauge",
        "Publishers being relayed.",
        stats.streams().to_string(),
    );
    metric(
        "continuum_event_broker_advertised_publishers",
        "gauge",
        "Publishers discovery advertises (what may be relayed).",
        stats.advertised.load(Relaxed).to_string(),
    );
    let _ = writeln!(
        r,
        "# HELP continuum_event_broker_refusals_total Subscribes refused, by reason.\n\
         # TYPE continuum_event_broker_refusals_total counter"
    );
    for reason in REFUSALS {
        let word = match reason {
            CloseReason::TargetNotAdvertised => "target_not_advertised",
            CloseReason::Draining => "draining",
            _ => "refused",
        };
        let _ = writeln!(
            r,
            "continuum_event_broker_refusals_total{{reason=\"{word}\"}} {}",
            stats.refusals(reason)
        );
    }
    r
}

#[cfg(feature = "daemon")]
/// The answer to a request on the metrics port: `/metrics`, or `/healthz` (200 while a session
/// with the router is up, 503 otherwise: a readiness probe).
pub fn answer<B>(
    req: &http::Request<B>,
    stats: &BrokerStats,
) -> http::Response<http_body_util::Full<bytes::Bytes>> {
    let (status, body) = match req.uri().path() {
        "/metrics" => (http::StatusCode::OK, render(stats)),
        "/healthz" if stats.sessions() > 0 => (http::StatusCode::OK, "ok\n".to_owned()),
        "/healthz" => (
            http::StatusCode::SERVICE_UNAVAILABLE,
            "no session with the router\n".to_owned(),
        ),
        _ => (http::StatusCode::NOT_FOUND, "not found\n".to_owned()),
    };
    let mut resp = http::Response::new(http_body_util::Full::new(bytes::Bytes::from(body)));
    *resp.status_mut() = status;
    resp
}
