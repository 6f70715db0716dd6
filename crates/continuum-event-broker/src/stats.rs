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
    sessions: AtomicI64,
    established: AtomicU64,
    streams: AtomicI64,
    refused: [AtomicU64; 3],
}

impl BrokerStats {
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
