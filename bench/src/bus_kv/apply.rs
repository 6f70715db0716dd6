//! The receiving side of `bus-kv`: a session-driver sink that does what the router's `kv-events`
//! sink does with each message — decode the frames and envelope, check the publisher id, decode
//! the `RouterEvent` batch, apply it to a KV index through the pure handler rules
//! (`continuum_core::kv::handler`), which a picker on another shard sees as it is applied — so a
//! message counts only once it is applied. In a paced run it also records each message's
//! event-to-visible time: from the publisher's stamp to the end of its application.
//!
//! Invariants: the batch buffer is reused; nothing else is allocated per message; outcomes other
//! than `applied` are counted as anomalies (the stream has none, so any means the figures are
//! not of a clean run).

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use continuum_core::dynamo_event::{EventFamily, decode_event};
use continuum_core::kv::Outcome;
use continuum_core::kv::budget::Budget;
use continuum_core::kv::event::KvBatch;
use continuum_core::kv::handler::{LiveGate, OutcomeCounts, Subscription};
use continuum_core::kv::index::{IndexWriter, new_index};
use continuum_core::kv::shared::IndexReaders;
use continuum_core::load::{LiveSet, LiveWorker};
use continuum_core::zmtp::{DropReason, ZmtpLimits};
use continuum_shards::ingest::driver::Sink;
use hdrhistogram::Histogram;

use super::stream::{PUBLISHER, WORKER};
use crate::zmtp_ingest::{IngestError, ThreadClock};

const TOPICS: &[&[u8]] = &[b"kv-events"];

/// Where a paced run's send stamps are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stamps<'a> {
    /// The publisher's clock origin.
    pub(crate) base: Instant,
    /// `sent[i]`: nanoseconds after `base` when message `i` (sequence `i + 1`) was written.
    pub(crate) sent: &'a [AtomicU64],
}

/// Applies every message to an index; counts, times and (paced) records latencies.
pub(crate) struct Applier<'a> {
    writer: IndexWriter,
    _readers: IndexReaders,
    gate: LiveGate,
    sub: Subscription,
    batch: KvBatch,
    counts: OutcomeCounts,
    total: u64,
    received: u64,
    anomalies: u64,
    start: Option<(Instant, ThreadClock)>,
    end: Option<(Instant, u64)>,
    stamps: Option<Stamps<'a>>,
    latency: Histogram<u64>,
}

impl std::fmt::Debug for Applier<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applier")
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

/// What one receiving run measured.
#[derive(Debug, Clone)]
pub(crate) struct Applied {
    /// Messages received.
    pub(crate) messages: u64,
    /// Events applied to the index.
    pub(crate) events: u64,
    /// Messages or events that were not a clean apply.
    pub(crate) anomalies: u64,
    /// Wall time and receiving-thread CPU over messages 2..=M.
    pub(crate) interval: Option<(Duration, u64)>,
    /// Event-to-visible times of a paced run, in microseconds.
    pub(crate) latency: Option<Histogram<u64>>,
}

impl Applied {
    /// Messages per second over messages 2..=M.
    pub(crate) fn rate(&self) -> Option<f64> {
        let (wall, _) = self.interval?;
        Some(self.messages.saturating_sub(1) as f64 / wall.as_secs_f64().max(1e-9))
    }

    /// Receiving-thread CPU per message over messages 2..=M, in nanoseconds.
    pub(crate) fn cpu_per_msg_ns(&self) -> Option<f64> {
        let (_, cpu) = self.interval?;
        Some(cpu as f64 / self.messages.saturating_sub(1).max(1) as f64)
    }
}

impl<'a> Applier<'a> {
    /// A receiver of `total` messages; `stamps` for a paced run.
    pub(crate) fn new(total: u64, stamps: Option<Stamps<'a>>) -> Result<Self, IngestError> {
        let (writer, readers) = new_index(Arc::new(Budget::default()));
        // 1 µs to 60 s, 3 significant digits.
        let latency = Histogram::new_with_bounds(1, 60_000_000, 3)
            .map_err(|e| IngestError::Setup(format!("histogram: {e}")))?;
        Ok(Self {
            writer,
            _readers: readers,
            gate: LiveGate::from_live(LiveSet::new([LiveWorker::new(WORKER, "bench", 0, 1)])),
            sub: Subscription::new(None),
            batch: KvBatch::new(),
            counts: OutcomeCounts::default(),
            total,
            received: 0,
            anomalies: 0,
            start: None,
            end: None,
            stamps,
            latency,
        })
    }

    /// What was measured.
    pub(crate) fn finish(self) -> Applied {
        Applied {
            messages: self.received,
            events: self
                .counts
                .0
                .get(Outcome::Applied.index())
                .copied()
                .unwrap_or(0),
            anomalies: self.anomalies
                + self
                    .counts
                    .0
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != Outcome::Applied.index())
                    .map(|(_, n)| n)
                    .sum::<u64>(),
            interval: self
                .start
                .zip(self.end)
                .map(|((t0, _), (t1, cpu))| (t1.saturating_duration_since(t0), cpu)),
            latency: self.stamps.is_some().then_some(self.latency),
        }
    }

    fn apply(&mut self, frames: &[&[u8]]) -> Option<u64> {
        let ev = decode_event(frames, &EventFamily::KV_EVENTS).ok()?;
        if ev.frame.publisher_id != PUBLISHER {
            return None;
        }
        let sequence = ev.envelope.sequence.0;
        self.batch.decode(ev.envelope.payload).ok()?;
        self.sub.apply_batch(
            &mut self.writer,
            &self.gate,
            &self.batch,
            // Event times only age rows (admin view); the bench has none.
            continuum_core::clock::Instant::default(),
            &mut self.counts,
        );
        Some(sequence)
    }
}

impl Sink for Applier<'_> {
    fn limits(&self) -> ZmtpLimits {
        ZmtpLimits::KV_EVENTS
    }

    fn topics(&self) -> &[&'static [u8]] {
        TOPICS
    }

    fn on_connect(&mut self) {}

    fn on_message(&mut self, frames: &[&[u8]]) -> ControlFlow<()> {
        self.received += 1;
        match self.apply(frames) {
            Some(sequence) => {
                if let Some(s) = self.stamps {
                    let i = usize::try_from(sequence.saturating_sub(1)).unwrap_or(usize::MAX);
                    if let Some(sent) = s.sent.get(i).map(|a| a.load(Ordering::Acquire)) {
                        let now = u64::try_from(s.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
                        let _ = self
                            .latency
                            .record((now.saturating_sub(sent) / 1000).max(1));
                    }
                }
            }
            None => self.anomalies += 1,
        }
        // Messages 2..=M: the first one's arrival starts the clocks.
        if self.received == 1 {
            self.start = Some((Instant::now(), ThreadClock::now()));
        } else if self.received >= self.total {
            let cpu = self.start.map_or(0, |(_, c)| c.elapsed_ns());
            self.end = Some((Instant::now(), cpu));
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    fn on_dropped(&mut self, _reason: DropReason) {
        self.anomalies += 1;
    }

    fn on_refused(&mut self) {
        self.anomalies += 1;
    }
}
