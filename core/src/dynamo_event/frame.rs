//! The 4-frame Dynamo event-plane message (LOAD-ZMTP-03, -05..10).
//!
//! Role: split `[topic][publisher_id u64 BE][sequence u64 BE][version u8 | payload_len u32 BE |
//! payload]` into a borrowed [`DynamoFrame`], then (with [`decode_event`] and
//! [`decode_kv_metrics`]) the envelope and the `ActiveLoad` sample, classifying every refusal.
//! The envelope-against-frames check ([`EventEnvelope::check_frame`]) lives here too: this layer
//! builds on [`super::envelope`], never the reverse.
//!
//! Invariants:
//! - checks run in this order: frame count, frame-0 topic, id frame lengths, header length,
//!   version, declared `payload_len` against the family cap (before any parsing), then
//!   `payload_len` against the bytes present;
//! - nothing here allocates: frames and payloads are borrowed from the caller's buffer.

use super::envelope::{ActiveLoad, EventEnvelope, Sequence, decode_active_load, decode_envelope};
use super::msgpack::short_eq;
use super::reject::{DynamoReject, IdentityMismatch, Malformed, TopicSource};
use crate::discovery::ids::{InstanceId, PublisherId, UnixMillis};
use crate::zmtp::limits::{
    FRAME3_HEADER_BYTES, KV_EVENTS_MAX_PAYLOAD_BYTES, KV_METRICS_MAX_PAYLOAD_BYTES,
};

/// The only frame-3 version Dynamo sends (LOAD-ZMTP-07).
pub const FRAME_VERSION: u8 = 1;

/// One subscribed topic and its declared-payload cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventFamily {
    /// The bare topic: the SUB filter, frame 0 and the envelope `topic` (LOAD-ZMTP-01).
    pub topic: &'static [u8],
    /// Largest declared `payload_len`.
    pub max_payload_bytes: u32,
}

impl EventFamily {
    /// `kv_metrics`: ActiveLoad samples, 16 KiB payload cap (LOAD-ZMTP-09).
    pub const KV_METRICS: Self = Self {
        topic: b"kv_metrics",
        max_payload_bytes: KV_METRICS_MAX_PAYLOAD_BYTES,
    };
    /// `kv-events`: RouterEvent batches, 1 MiB frames (KV-IDX-04).
    pub const KV_EVENTS: Self = Self {
        topic: b"kv-events",
        max_payload_bytes: KV_EVENTS_MAX_PAYLOAD_BYTES,
    };
}

/// The frame layer of a message, borrowed from its frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DynamoFrame<'a> {
    /// Frame 0.
    pub topic: &'a [u8],
    /// Frame 1.
    pub publisher_id: PublisherId,
    /// Frame 2.
    pub sequence: Sequence,
    /// The msgpack `EventEnvelope` after frame 3's header.
    pub payload: &'a [u8],
}

fn u64_frame(f: &[u8], frame: u8) -> Result<u64, DynamoReject> {
    let b: [u8; 8] = f.try_into().map_err(|_| Malformed::IdFrameLength {
        frame,
        len: f.len(),
    })?;
    Ok(u64::from_be_bytes(b))
}

/// Checks the frame layer of `frames` for `family`.
pub fn parse_frames<'a>(
    frames: &[&'a [u8]],
    family: &EventFamily,
) -> Result<DynamoFrame<'a>, DynamoReject> {
    let &[topic, f1, f2, f3] = frames else {
        return Err(Malformed::FrameCount(frames.len()).into());
    };
    if !short_eq(topic, family.topic) {
        return Err(DynamoReject::TopicMismatch(TopicSource::Frame));
    }
    let publisher_id = PublisherId::new(u64_frame(f1, 1)?);
    let sequence = Sequence(u64_frame(f2, 2)?);
    let Some((header, payload)) = f3.split_at_checked(FRAME3_HEADER_BYTES) else {
        return Err(Malformed::ShortHeader(f3.len()).into());
    };
    let &[version, l0, l1, l2, l3] = header else {
        return Err(Malformed::ShortHeader(f3.len()).into());
    };
    if version != FRAME_VERSION {
        return Err(DynamoReject::UnknownVersion(version));
    }
    let declared = u32::from_be_bytes([l0, l1, l2, l3]);
    if declared > family.max_payload_bytes {
        return Err(DynamoReject::Oversized {
            declared,
            limit: family.max_payload_bytes,
        });
    }
    if payload.len() != declared as usize {
        return Err(Malformed::PayloadLength {
            declared,
            actual: payload.len(),
        }
        .into());
    }
    Ok(DynamoFrame {
        topic,
        publisher_id,
        sequence,
        payload,
    })
}

impl EventEnvelope<'_> {
    /// `identity_mismatch` if the envelope's publisher id is not frame 1's; `malformed` if its
    /// sequence is not frame 2's.
    pub fn check_frame(&self, frame: &DynamoFrame<'_>) -> Result<(), DynamoReject> {
        if self.publisher_id != frame.publisher_id {
            return Err(DynamoReject::IdentityMismatch(
                IdentityMismatch::FrameVsEnvelope {
                    frame: frame.publisher_id,
                    envelope: self.publisher_id,
                },
            ));
        }
        if self.sequence != frame.sequence {
            return Err(Malformed::SequenceMismatch {
                frame: frame.sequence.0,
                envelope: self.sequence.0,
            }
            .into());
        }
        Ok(())
    }
}

/// A message whose frames and envelope agree, with its payload still encoded (generic over the
/// payload type: `ActiveLoad` for `kv_metrics`, RouterEvents for `kv-events`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DynamoEvent<'a> {
    /// The frame layer.
    pub frame: DynamoFrame<'a>,
    /// The decoded envelope.
    pub envelope: EventEnvelope<'a>,
}

/// Frames, then envelope, then the envelope's topic, publisher id and sequence against the
/// frames.
pub fn decode_event<'a>(
    frames: &[&'a [u8]],
    family: &EventFamily,
) -> Result<DynamoEvent<'a>, DynamoReject> {
    let frame = parse_frames(frames, family)?;
    let envelope = decode_envelope(frame.payload)?;
    if !short_eq(envelope.topic, family.topic) {
        return Err(DynamoReject::TopicMismatch(TopicSource::Envelope));
    }
    envelope.check_frame(&frame)?;
    Ok(DynamoEvent { frame, envelope })
}

/// A decoded `kv_metrics` sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadSample {
    /// Publisher incarnation (frame 1 = envelope).
    pub publisher_id: PublisherId,
    /// Sequence (frame 2 = envelope).
    pub sequence: Sequence,
    /// Envelope `published_at`.
    pub published_at: UnixMillis,
    /// The sample.
    pub load: ActiveLoad,
}

impl LoadSample {
    /// `identity_mismatch` unless the sample comes from the discovery record's publisher.
    pub fn check_publisher(&self, expected: PublisherId) -> Result<(), DynamoReject> {
        if self.publisher_id == expected {
            return Ok(());
        }
        Err(DynamoReject::IdentityMismatch(IdentityMismatch::Record {
            expected,
            got: self.publisher_id,
        }))
    }

    /// `identity_mismatch` unless `known` says the sample's worker is in the registry snapshot.
    pub fn check_worker(&self, known: impl FnOnce(InstanceId) -> bool) -> Result<(), DynamoReject> {
        if known(self.load.worker_id) {
            return Ok(());
        }
        Err(DynamoReject::IdentityMismatch(
            IdentityMismatch::UnknownWorker(self.load.worker_id),
        ))
    }
}

/// The whole `kv_metrics` chain: frames, envelope, consistency, `ActiveLoad`.
pub fn decode_kv_metrics(frames: &[&[u8]]) -> Result<LoadSample, DynamoReject> {
    let ev = decode_event(frames, &EventFamily::KV_METRICS)?;
    let load = decode_active_load(ev.envelope.payload)?;
    Ok(LoadSample {
        publisher_id: ev.frame.publisher_id,
        sequence: ev.frame.sequence,
        published_at: ev.envelope.published_at,
        load,
    })
}
