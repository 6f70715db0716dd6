//! The `kv-events` sink: decode each message (frames and envelope through
//! `continuum_core::dynamo_event`, the RouterEvent batch through `continuum_core::kv::event`),
//! check the publisher id, and hand the batch to the shard's [`super::kv::ShardKv`], counting every outcome
//! in `continuum_dynamo_kv_events_total{result}` (KV-IDX-04/05, OBS-10).
//!
//! Invariants: the batch buffer is reused across messages and never grows beyond the batch caps
//! (128 events, 8192 blocks); a refused message counts one event of its outcome and changes
//! nothing else; the state changes the task reports drive the down-time clock of the
//! subscription (`DOWN_CLEARS_AFTER`).

use std::ops::ControlFlow;
use std::sync::Arc;

use continuum_core::discovery::{Family, PublisherId};
use continuum_core::dynamo_event::{DynamoReject, EventFamily, decode_event};
use continuum_core::kv::Outcome;
use continuum_core::kv::event::KvBatch;
use continuum_core::zmtp::{DropReason, ZmtpLimits};

use super::driver::Sink;
use super::kv::SharedKv;
use crate::signals::subs::{SubState, SubTable};

/// The topic of the KV family.
const TOPICS: &[&[u8]] = &[b"kv-events"];

/// One `kv-events` subscription's sink.
pub(crate) struct KvSink {
    publisher: PublisherId,
    kv: SharedKv,
    table: Arc<SubTable>,
    batch: KvBatch,
}

impl std::fmt::Debug for KvSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvSink")
            .field("publisher", &self.publisher)
            .finish_non_exhaustive()
    }
}

impl KvSink {
    /// The sink of `publisher`'s subscription, writing into `kv`.
    pub(crate) fn new(publisher: PublisherId, kv: SharedKv, table: Arc<SubTable>) -> Self {
        Self {
            publisher,
            kv,
            table,
            batch: KvBatch::new(),
        }
    }

    fn apply(&mut self, frames: &[&[u8]]) -> Result<(), Outcome> {
        let ev = decode_event(frames, &EventFamily::KV_EVENTS).map_err(|e| reject_outcome(&e))?;
        if ev.frame.publisher_id != self.publisher {
            return Err(Outcome::IdentityMismatch);
        }
        self.batch
            .decode(ev.envelope.payload)
            .map_err(|e| e.outcome())?;
        self.kv
            .borrow_mut()
            .apply(self.publisher, &self.batch, crate::clock::now());
        Ok(())
    }
}

impl Sink for KvSink {
    fn limits(&self) -> ZmtpLimits {
        ZmtpLimits::KV_EVENTS
    }

    fn topics(&self) -> &[&'static [u8]] {
        TOPICS
    }

    fn on_connect(&mut self) {
        // Cursors survive a reconnect on purpose: the publisher's event ids continue, and a
        // message missed while disconnected shows up as a gap that clears its rank (KV-IDX-11).
    }

    fn on_state(&mut self, state: SubState) {
        self.table
            .set_state(Family::KvEvents, self.publisher, state);
        self.kv.borrow_mut().set_connected(
            self.publisher,
            state == SubState::Connected,
            crate::clock::now(),
        );
    }

    fn on_message(&mut self, frames: &[&[u8]]) -> ControlFlow<()> {
        if let Err(outcome) = self.apply(frames) {
            self.kv.borrow().refused(outcome);
        }
        ControlFlow::Continue(())
    }

    fn on_dropped(&mut self, reason: DropReason) {
        self.kv.borrow().refused(match reason {
            DropReason::Oversized { .. } => Outcome::OverCapacity,
            _ => Outcome::Malformed,
        });
    }

    fn on_refused(&mut self) {
        self.kv.borrow().refused(Outcome::Malformed);
    }
}

fn reject_outcome(e: &DynamoReject) -> Outcome {
    match e {
        DynamoReject::Oversized { .. } => Outcome::OverCapacity,
        DynamoReject::IdentityMismatch(_) => Outcome::IdentityMismatch,
        DynamoReject::Malformed(_)
        | DynamoReject::UnknownVersion(_)
        | DynamoReject::TopicMismatch(_) => Outcome::Malformed,
    }
}
