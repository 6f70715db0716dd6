//! The `kv-events` stream `bus-kv` publishes, and its publisher: a raw ZMTP PUB peer (the
//! handshake of `zmtp_ingest`'s) writing pre-encoded messages of the real Dynamo shape (4 frames
//! around a msgpack `RouterEvent` batch, map encoding, built with the router's own encoders).
//!
//! Message `i` (sequence `i + 1`) stores a chain of [`BLOCKS`] new blocks for one worker rank
//! and, once [`WINDOW`] messages are stored, removes the blocks message `i - WINDOW` stored, as a
//! worker's cache fills and evicts: the index holds a steady `WINDOW × BLOCKS` blocks, and event
//! ids are contiguous, so every event is applied (none is a replay or a gap).
//!
//! Invariants: the whole stream is encoded before the clock starts; the paced publisher stamps
//! each message's send time (nanoseconds after a shared base) in `sent[i]` before writing it;
//! every blocking call has a timeout at the run's deadline.

use std::io::Write as _;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use continuum_core::discovery::{InstanceId, PublisherId, UnixMillis};
use continuum_core::dynamo_event::{Encoding, EventEnvelope, Sequence, encode_message};
use continuum_core::kv::encode::{KvDataRef, KvEventRef, encode_batch};
use continuum_core::kv::event::Tier;
use continuum_core::kv::{EngineHash, StoredBlock, TokensHash};
use continuum_core::zmtp::wire;

use crate::zmtp_ingest::publisher::{Published, close, handshake};
use crate::zmtp_ingest::{IngestError, ThreadClock, pin_to_cpu};

/// The publisher incarnation every message carries.
pub(crate) const PUBLISHER: PublisherId = PublisherId::new(0x5eed_cafe_0001);
/// The worker whose rank 0 the events describe.
pub(crate) const WORKER: InstanceId = InstanceId::new(0x6a6c_a22d_4998_ac0b);
/// Blocks each message stores.
pub(crate) const BLOCKS: u64 = 4;
/// Messages whose blocks stay stored.
pub(crate) const WINDOW: u64 = 64;
/// Bytes per publisher write in the throughput run.
const WRITE: usize = 256 << 10;

/// Every message of a run, encoded back to back.
#[derive(Debug)]
pub(crate) struct KvStream {
    wire: Vec<u8>,
    /// `ends[i]`: where message `i` ends in `wire`.
    ends: Vec<usize>,
}

fn hash(n: u64) -> u64 {
    // splitmix64: distinct, well spread, never 0 for these inputs in practice.
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

fn blocks_of(message: u64) -> Vec<StoredBlock> {
    (0..BLOCKS)
        .map(|k| {
            let n = message * BLOCKS + k;
            StoredBlock {
                block_hash: EngineHash(hash(n)),
                tokens_hash: TokensHash(hash(n ^ 0x5555_5555_5555_5555)),
            }
        })
        .collect()
}

impl KvStream {
    /// Encodes `messages` messages.
    pub(crate) fn new(messages: u64) -> Result<Self, IngestError> {
        let cap = usize::try_from(messages).unwrap_or(usize::MAX);
        let mut wire_bytes = Vec::with_capacity(cap.saturating_mul(320));
        let mut ends = Vec::with_capacity(cap);
        let mut payload = Vec::with_capacity(512);
        let mut event_id = 0u64;
        for i in 0..messages {
            let stored = blocks_of(i);
            let evicted: Vec<EngineHash> = i
                .checked_sub(WINDOW)
                .map(|old| blocks_of(old).iter().map(|b| b.block_hash).collect())
                .unwrap_or_default();
            let mut events = Vec::with_capacity(2);
            event_id += 1;
            events.push(KvEventRef {
                worker: WORKER,
                dp_rank: 0,
                event_id,
                tier: Tier::Device,
                data: KvDataRef::Stored {
                    parent: None,
                    blocks: &stored,
                },
            });
            if !evicted.is_empty() {
                event_id += 1;
                events.push(KvEventRef {
                    worker: WORKER,
                    dp_rank: 0,
                    event_id,
                    tier: Tier::Device,
                    data: KvDataRef::Removed { hashes: &evicted },
                });
            }
            payload.clear();
            encode_batch(&events, Encoding::Map, &mut payload);
            let env = EventEnvelope {
                publisher_id: PUBLISHER,
                sequence: Sequence(i + 1),
                published_at: UnixMillis(1_796_056_139_389),
                topic: b"kv-events",
                payload: &payload,
            };
            let frames = encode_message(&env, Encoding::Map)
                .map_err(|e| IngestError::Setup(format!("encoding message {i}: {e}")))?;
            let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            wire::message(&refs, &mut wire_bytes);
            ends.push(wire_bytes.len());
        }
        Ok(Self {
            wire: wire_bytes,
            ends,
        })
    }

    /// Messages in the stream.
    pub(crate) fn len(&self) -> u64 {
        self.ends.len() as u64
    }

    /// Bytes on the wire.
    pub(crate) fn bytes(&self) -> usize {
        self.wire.len()
    }

    fn message(&self, i: usize) -> &[u8] {
        let start = i
            .checked_sub(1)
            .and_then(|p| self.ends.get(p))
            .copied()
            .unwrap_or(0);
        let end = self.ends.get(i).copied().unwrap_or(start);
        self.wire.get(start..end).unwrap_or(&[])
    }
}

/// How the publisher sends.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Pace<'a> {
    /// As fast as the subscriber reads, in large writes.
    Flat,
    /// One message per `period` from `base`, stamping each send in `sent` (ns after `base`).
    Every {
        period: Duration,
        base: Instant,
        sent: &'a [AtomicU64],
    },
}

/// Accepts one subscriber on `listener`, handshakes as a PUB and writes `stream` at `pace`, then
/// closes in order. Pins itself to `cpu` if given.
pub(crate) fn publish(
    listener: &TcpListener,
    stream: &KvStream,
    pace: Pace<'_>,
    deadline: Instant,
    cpu: Option<usize>,
) -> Result<Published, IngestError> {
    if let Some(cpu) = cpu {
        pin_to_cpu(cpu);
    }
    let io = |what: &'static str| move |source| IngestError::Io { what, source };
    let mut sock = handshake(listener, deadline)?;
    let clock = ThreadClock::now();
    let total = stream.ends.len();
    match pace {
        Pace::Flat => {
            for chunk in stream.wire.chunks(WRITE) {
                if Instant::now() >= deadline {
                    return Err(IngestError::Timeout {
                        side: "publisher",
                        got: 0,
                        want: stream.len(),
                    });
                }
                sock.write_all(chunk).map_err(io("publishing"))?;
            }
        }
        Pace::Every { period, base, sent } => {
            // The first message goes one period after the handshake, so the subscriber has its
            // READY and its subscription out.
            let start = Instant::now() + period;
            for i in 0..total {
                let at = start + period.saturating_mul(u32::try_from(i).unwrap_or(u32::MAX));
                if at >= deadline {
                    return Err(IngestError::Timeout {
                        side: "publisher",
                        got: i as u64,
                        want: stream.len(),
                    });
                }
                std::thread::sleep(at.saturating_duration_since(Instant::now()));
                let now = u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX);
                if let Some(slot) = sent.get(i) {
                    slot.store(now, Ordering::Release);
                }
                sock.write_all(stream.message(i))
                    .map_err(io("publishing"))?;
            }
        }
    }
    let cpu_ns = clock.elapsed_ns();
    close(sock, deadline);
    Ok(Published {
        messages: stream.len(),
        cpu_ns,
    })
}

#[cfg(test)]
mod tests {
    use continuum_core::dynamo_event::{EventFamily, decode_event};
    use continuum_core::kv::event::{KvBatch, KvData};
    use continuum_core::zmtp::{Event, ZmtpLimits, ZmtpSub};

    use super::*;

    #[test]
    fn the_stream_decodes_to_contiguous_stores_and_evictions() {
        let s = KvStream::new(WINDOW + 3).unwrap();
        // A subscriber's state machine past its handshake reads the stream back.
        let mut sub = ZmtpSub::new(ZmtpLimits::KV_EVENTS, &[b"kv-events"]).unwrap();
        let mut input: Vec<u8> = wire::peer_greeting(1).to_vec();
        wire::command(
            b"READY",
            &wire::metadata(&[(b"Socket-Type", b"PUB")]),
            &mut input,
        );
        input.extend_from_slice(&s.wire);
        let mut rest = &input[..];
        let mut batch = KvBatch::new();
        let (mut messages, mut next_id, mut removed) = (0u64, 1u64, 0u64);
        while !rest.is_empty() {
            let p = sub.feed(rest).unwrap();
            let had_event = p.event.is_some();
            if let Some(Event::Message(m)) = p.event {
                let ev = decode_event(m.frames(), &EventFamily::KV_EVENTS).unwrap();
                assert_eq!(ev.frame.publisher_id, PUBLISHER);
                batch.decode(ev.envelope.payload).unwrap();
                for e in batch.events() {
                    assert_eq!(e.event_id, next_id, "contiguous event ids");
                    next_id += 1;
                    if matches!(e.data, KvData::Removed { .. }) {
                        removed += 1;
                    }
                }
                messages += 1;
            }
            if p.consumed == 0 && !had_event {
                break;
            }
            rest = &rest[p.consumed..];
        }
        assert_eq!(messages, WINDOW + 3);
        assert_eq!(removed, 3, "one eviction per message past the window");
    }
}
