//! The event bus listener's counters: refusals and closes by code (a closed label set, BUS-37),
//! and the sessions gauge (`continuum_dynamo_event_bus_sessions`). Written by the listener's
//! thread, rendered with the rest of `/metrics`.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use continuum_event_bus::code::Code;

/// Counters shared by the listener's tasks and whoever renders them.
#[derive(Debug, Default)]
pub struct BusMetrics {
    refused: [AtomicU64; Code::ALL.len()],
    sessions: AtomicI64,
    /// Data-stream bytes the listener took from brokers (`direction="in"`).
    bytes_in: AtomicU64,
    /// Data-stream bytes handed to brokers (`direction="out"`).
    bytes_out: AtomicU64,
}

impl BusMetrics {
    /// One refusal or close with `code`.
    pub fn refused(&self, code: Code) {
        if let Some(i) = Code::ALL.iter().position(|c| *c == code) {
            self.refused[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How many refusals or closes had `code`.
    pub fn refused_total(&self, code: Code) -> u64 {
        Code::ALL
            .iter()
            .position(|c| *c == code)
            .map_or(0, |i| self.refused[i].load(Ordering::Relaxed))
    }

    /// Every code's word and count, in `Code::ALL` order (the metric's closed label set).
    pub fn each_refusal(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Code::ALL
            .iter()
            .zip(&self.refused)
            .map(|(c, n)| (c.as_str(), n.load(Ordering::Relaxed)))
    }

    /// Data-stream bytes taken from brokers.
    pub fn stream_bytes_in(&self) -> u64 {
        self.bytes_in.load(Ordering::Relaxed)
    }

    /// Data-stream bytes handed to brokers.
    pub fn stream_bytes_out(&self) -> u64 {
        self.bytes_out.load(Ordering::Relaxed)
    }

    /// `n` bytes taken from a broker's stream.
    pub fn relayed_in(&self, n: usize) {
        self.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// `n` bytes handed to a broker's stream.
    pub fn relayed_out(&self, n: usize) {
        self.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Active sessions.
    pub fn sessions(&self) -> i64 {
        self.sessions.load(Ordering::Relaxed)
    }

    /// A session opened.
    pub fn session_opened(&self) {
        self.sessions.fetch_add(1, Ordering::Relaxed);
    }

    /// A session ended.
    pub fn session_closed(&self) {
        self.sessions.fetch_sub(1, Ordering::Relaxed);
    }
}
