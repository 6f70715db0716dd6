//! The `kv_metrics` sink: decode each message (`continuum_core::dynamo_event`), check its
//! identities, dedup by sequence and apply the sample to the shared load store, counting every
//! outcome in `continuum_dynamo_load_events_total{result}` (LOAD-ZMTP-05..10, LOAD-STORE-14).
//!
//! Invariants:
//! - on every connect the cursor resets and the publisher's held samples are discarded, and on
//!   every sequence gap again (LOAD-STORE-14, Q-22);
//! - nothing is allocated per message; the sink writes only its own shard's counters and table
//!   row and the store cells of the keys its publisher reports;
//! - when the connection ends by itself (EOF or reset) the workers whose samples this publisher
//!   sent are marked suspect ([`crate::signals::suspects`], issue 38) until it completes a
//!   handshake again, sends a sample, or its subscription stops.

use std::ops::ControlFlow;
use std::sync::Arc;

use continuum_core::discovery::{Family, InstanceId, PublisherId};
use continuum_core::dynamo_event::{DynamoReject, decode_kv_metrics};
use continuum_core::load::metrics::{LoadEventCounters, LoadEventResult};
use continuum_core::load::{CursorVerdict, LoadKey, Sample, SubscriptionCursor};
use continuum_core::zmtp::{DropReason, ZmtpLimits};

use super::driver::Sink;
use crate::signals::Signals;
use crate::signals::subs::{SubState, SubTable};

/// The topic of the load family (LOAD-ZMTP-01).
const TOPICS: &[&[u8]] = &[b"kv_metrics"];

/// One `kv_metrics` subscription's sink.
#[derive(Debug)]
pub(crate) struct LoadSink {
    publisher: PublisherId,
    shard: usize,
    signals: Arc<Signals>,
    table: Arc<SubTable>,
    cursor: SubscriptionCursor,
    /// The workers this publisher's samples named (a publisher serves one worker, each of its
    /// dp ranks a key); at most [`MAX_SEEN`].
    seen: Vec<InstanceId>,
    /// Whether this sink marked `seen` suspect and has not cleared them since.
    suspected: bool,
}

/// The most workers one `kv_metrics` publisher is remembered for (it serves one).
const MAX_SEEN: usize = 4;

impl LoadSink {
    /// The sink of `publisher`'s subscription on shard `shard`.
    pub(crate) fn new(publisher: PublisherId, shard: usize, signals: Arc<Signals>) -> Self {
        Self {
            publisher,
            shard,
            table: signals.table(shard),
            signals,
            cursor: SubscriptionCursor::new(),
            seen: Vec::new(),
            suspected: false,
        }
    }

    /// The publisher answers again: its workers are no longer suspect.
    fn vouch(&mut self) {
        if self.suspected {
            self.suspected = false;
            self.signals.suspects.clear(&self.seen);
        }
    }

    fn events(&self) -> &LoadEventCounters {
        self.signals.load_events(self.shard)
    }

    /// Decode, check and apply one message; the outcome label.
    fn apply(&mut self, frames: &[&[u8]]) -> LoadEventResult {
        let sample = match decode_kv_metrics(frames) {
            Ok(s) => s,
            Err(e) => return reject_label(&e),
        };
        if sample.check_publisher(self.publisher).is_err() {
            return LoadEventResult::IdentityMismatch;
        }
        let store = &self.signals.store;
        match self.cursor.admit(sample.sequence.0) {
            CursorVerdict::Duplicate => return LoadEventResult::Duplicate,
            CursorVerdict::AfterGap => {
                // LOAD-STORE-14 (b), Q-22: a missed change may hide behind the gap.
                store.discard_publisher(self.publisher);
            }
            CursorVerdict::InOrder => {}
        }
        let key = LoadKey {
            worker_id: sample.load.worker_id,
            dp_rank: sample.load.dp_rank,
        };
        let s = Sample {
            publisher_id: sample.publisher_id,
            sequence: sample.sequence.0,
            active_decode_blocks: sample.load.active_decode_blocks,
            active_prefill_tokens: sample.load.active_prefill_tokens,
            kv_used_blocks: sample.load.kv_used_blocks,
        };
        let applied = store.apply(key, &s, crate::clock::now());
        if !self.seen.contains(&key.worker_id) && self.seen.len() < MAX_SEEN {
            self.seen.push(key.worker_id);
        }
        self.vouch();
        applied.result()
    }
}

impl Sink for LoadSink {
    fn limits(&self) -> ZmtpLimits {
        ZmtpLimits::KV_METRICS
    }

    fn topics(&self) -> &[&'static [u8]] {
        TOPICS
    }

    fn on_connect(&mut self) {
        // LOAD-STORE-14 (a): a connect may follow missed changes.
        self.cursor = SubscriptionCursor::new();
        self.signals.store.discard_publisher(self.publisher);
    }

    fn on_ready(&mut self, _buffered_capacity: usize) {
        self.vouch();
    }

    fn on_lost(&mut self) {
        if !self.seen.is_empty() {
            self.signals.suspects.mark(&self.seen);
            self.suspected = true;
        }
    }

    fn on_state(&mut self, state: SubState) {
        self.table
            .set_state(Family::KvMetrics, self.publisher, state);
    }

    fn on_message(&mut self, frames: &[&[u8]]) -> ControlFlow<()> {
        let result = self.apply(frames);
        self.events().record(result);
        ControlFlow::Continue(())
    }

    fn on_dropped(&mut self, reason: DropReason) {
        self.events().record(match reason {
            DropReason::Oversized { .. } => LoadEventResult::Oversized,
            _ => LoadEventResult::Malformed,
        });
    }

    fn on_refused(&mut self) {
        self.events().record(LoadEventResult::TransportRefused);
    }
}

impl Drop for LoadSink {
    /// The subscription stopped (its publisher record went, or the router shuts down): whatever
    /// it marked is for the fleet view to judge now.
    fn drop(&mut self) {
        self.vouch();
    }
}

fn reject_label(e: &DynamoReject) -> LoadEventResult {
    match e {
        DynamoReject::Malformed(_) => LoadEventResult::Malformed,
        DynamoReject::UnknownVersion(_) => LoadEventResult::UnknownVersion,
        DynamoReject::TopicMismatch(_) => LoadEventResult::TopicMismatch,
        DynamoReject::Oversized { .. } => LoadEventResult::Oversized,
        DynamoReject::IdentityMismatch(_) => LoadEventResult::IdentityMismatch,
    }
}
