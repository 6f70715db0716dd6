//! The ZMTP side of one `kv_metrics` subscription: drive the sans-IO [`ZmtpSub`] over the
//! socket, decode each message (`continuum_core::dynamo_event`), check identities, dedup and
//! apply the sample to the shared load store, counting every outcome.
//!
//! Invariants:
//! - a fixed 2 KiB read buffer per subscription (LOAD-ZMTP-15), bytes fed to the state machine
//!   without copying, nothing allocated per message;
//! - on every connect the cursor resets and the publisher's held samples are discarded, and on
//!   every sequence gap again (LOAD-STORE-14, Q-22);
//! - a protocol violation ends the session as `transport_refused` (LOAD-ZMTP-16); a bad message
//!   only drops that message, counted by its class (LOAD-ZMTP-05).

use std::rc::Rc;

use continuum_core::discovery::PublisherId;
use continuum_core::dynamo_event::{DynamoReject, decode_kv_metrics};
use continuum_core::load::metrics::LoadEventResult;
use continuum_core::load::{CursorVerdict, LoadKey, Sample, SubscriptionCursor};
use continuum_core::zmtp::limits::{READ_BUFFER_BYTES, read_buffer_after};
use continuum_core::zmtp::{DropReason, Event, ZmtpLimits, ZmtpSub};
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

use super::status::SubState;
use super::task::SessionEnd;
use crate::shard::Shard;

/// The topic of the load family (LOAD-ZMTP-01).
const TOPIC: &[u8] = b"kv_metrics";
/// Time a peer gets to complete the ZMTP handshake (greeting and READY) after the TCP connect: a
/// peer that never sends READY, or drips it byte by byte, is refused (LOAD-ZMTP-16) rather than
/// holding the subscription.
pub(crate) const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Run the protocol on a connected stream until it ends.
pub(super) async fn run(
    shard: &Rc<Shard>,
    publisher: PublisherId,
    mut stream: TcpStream,
) -> Result<(), SessionEnd> {
    let events = shard.load_events();
    let store = &shard.load.store;
    shard.subs_table.set_state(publisher, SubState::Connecting);
    let mut zmtp = ZmtpSub::new(ZmtpLimits::KV_METRICS, &[TOPIC])
        .map_err(|e| SessionEnd::Refused(e.to_string()))?;
    // LOAD-STORE-14 (a): a connect may follow missed changes.
    let mut cursor = SubscriptionCursor::new();
    store.discard_publisher(publisher);
    let mut buf: Vec<u8> = Vec::with_capacity(READ_BUFFER_BYTES);
    let mut out: Vec<u8> = Vec::with_capacity(64);
    let handshake_deadline = std::time::Instant::now() + HANDSHAKE_TIMEOUT;
    loop {
        // Send whatever the state machine queued (greeting, READY, subscription, PONG).
        if !zmtp.outgoing().is_empty() {
            out.clear();
            out.extend_from_slice(zmtp.outgoing());
            let n = out.len();
            let (res, back) = stream.write_all(out).await;
            out = back;
            res.map_err(SessionEnd::Io)?;
            zmtp.consume_outgoing(n);
        }
        buf.clear();
        let (res, back) = if zmtp.is_ready() {
            stream.read(buf).await
        } else {
            let left = handshake_deadline.saturating_duration_since(std::time::Instant::now());
            match monoio::time::timeout(left, stream.read(buf)).await {
                Ok(r) => r,
                Err(_) => {
                    events.record(LoadEventResult::TransportRefused);
                    return Err(SessionEnd::Refused("handshake timed out".into()));
                }
            }
        };
        buf = back;
        let read = match res {
            Ok(0) => return Err(SessionEnd::Closed),
            Ok(n) => n,
            Err(e) => return Err(SessionEnd::Io(e)),
        };
        let mut input: &[u8] = &buf;
        while !input.is_empty() {
            let progress = match zmtp.feed(input) {
                Ok(p) => p,
                Err(e) => {
                    events.record(LoadEventResult::TransportRefused);
                    return Err(SessionEnd::Refused(e.to_string()));
                }
            };
            let consumed = progress.consumed;
            match progress.event {
                Some(Event::Ready(_)) => shard.subs_table.set_state(publisher, SubState::Connected),
                Some(Event::Message(m)) => {
                    let result = on_message(shard, publisher, &mut cursor, m.frames());
                    events.record(result);
                }
                Some(Event::Dropped(DropReason::Oversized { .. })) => {
                    events.record(LoadEventResult::Oversized);
                }
                Some(Event::Dropped(_)) => events.record(LoadEventResult::Malformed),
                None => {}
            }
            if consumed == 0 && progress.event.is_none() {
                break;
            }
            input = input.get(consumed..).unwrap_or(&[]);
        }
        resize_for_traffic(&mut buf, read);
    }
}

/// Resize the read buffer to the traffic (`read_buffer_after`): reallocates only on a change of
/// regime, so a quiet subscription holds the 2 KiB of LOAD-ZMTP-15.
fn resize_for_traffic(buf: &mut Vec<u8>, read: usize) {
    let next = read_buffer_after(buf.capacity(), read);
    if next != buf.capacity() {
        *buf = Vec::with_capacity(next);
    }
}

/// Decode, check and apply one message; the outcome label.
fn on_message(
    shard: &Shard,
    publisher: PublisherId,
    cursor: &mut SubscriptionCursor,
    frames: &[&[u8]],
) -> LoadEventResult {
    let sample = match decode_kv_metrics(frames) {
        Ok(s) => s,
        Err(e) => return reject_label(&e),
    };
    if sample.check_publisher(publisher).is_err() {
        return LoadEventResult::IdentityMismatch;
    }
    let store = &shard.load.store;
    match cursor.admit(sample.sequence.0) {
        CursorVerdict::Duplicate => return LoadEventResult::Duplicate,
        CursorVerdict::AfterGap => {
            // LOAD-STORE-14 (b), Q-22: a missed change may hide behind the gap.
            store.discard_publisher(publisher);
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
    store.apply(key, &s, crate::clock::now()).result()
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
