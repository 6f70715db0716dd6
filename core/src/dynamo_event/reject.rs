//! The result classes of a refused Dynamo event-plane message (LOAD-ZMTP-05..10, OBS-04).
//!
//! Role: one typed reason per refusal, each mapping to exactly one
//! `continuum_dynamo_load_events_total{result}` label through [`DynamoReject::result_label`].
//!
//! Invariant: the label set is closed: `malformed`, `unknown_version`, `topic_mismatch`,
//! `oversized`, `identity_mismatch`.

use thiserror::Error;

use super::msgpack::MsgpackError;
use crate::discovery::ids::{InstanceId, PublisherId};

/// Why a message is `malformed` (LOAD-ZMTP-06).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Malformed {
    /// Not exactly 4 frames.
    #[error("{0} frames, expected 4")]
    FrameCount(usize),
    /// Frame 1 or 2 is not 8 bytes.
    #[error("frame {frame} is {len} bytes, expected 8")]
    IdFrameLength {
        /// 1 (publisher_id) or 2 (sequence).
        frame: u8,
        /// Its length.
        len: usize,
    },
    /// Frame 3 is shorter than its 5-byte header.
    #[error("frame 3 is {0} bytes, shorter than its header")]
    ShortHeader(usize),
    /// Frame 3's `payload_len` differs from the bytes that follow the header.
    #[error("payload_len {declared} but {actual} bytes follow")]
    PayloadLength {
        /// Declared `payload_len`.
        declared: u32,
        /// Bytes after the header.
        actual: usize,
    },
    /// The msgpack structure itself is broken (not a map or array, truncated, too deep).
    #[error("{what}: {error}")]
    Msgpack {
        /// The struct being decoded.
        what: &'static str,
        /// The reader's error.
        error: MsgpackError,
    },
    /// A field of the wrong type or out of range.
    #[error("field {field}: {error}")]
    Field {
        /// Field name.
        field: &'static str,
        /// The reader's error.
        error: MsgpackError,
    },
    /// A required field is absent.
    #[error("missing field {0}")]
    MissingField(&'static str),
    /// A field appears twice in a map.
    #[error("duplicate field {0}")]
    DuplicateField(&'static str),
    /// Bytes after the msgpack value.
    #[error("{0}: trailing bytes")]
    TrailingBytes(&'static str),
    /// Frame 2 and the envelope carry different sequences.
    #[error("frame sequence {frame} but envelope sequence {envelope}")]
    SequenceMismatch {
        /// Frame 2.
        frame: u64,
        /// Envelope `sequence`.
        envelope: u64,
    },
}

/// Where a topic did not match the subscription (LOAD-ZMTP-08).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicSource {
    /// ZMQ frame 0.
    Frame,
    /// The envelope's `topic` field.
    Envelope,
}

/// Which identity check failed (LOAD-ZMTP-10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityMismatch {
    /// Frame 1 and the envelope `publisher_id` differ.
    FrameVsEnvelope {
        /// Frame 1.
        frame: PublisherId,
        /// Envelope.
        envelope: PublisherId,
    },
    /// The message's publisher is not the discovery record's.
    Record {
        /// The discovery record's publisher id.
        expected: PublisherId,
        /// The message's.
        got: PublisherId,
    },
    /// The sample's `worker_id` is not in the registry snapshot.
    UnknownWorker(InstanceId),
}

/// A refused message and its result class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum DynamoReject {
    /// `malformed` (LOAD-ZMTP-06).
    #[error("malformed: {0}")]
    Malformed(Malformed),
    /// `unknown_version`: frame 3's version byte is not 1 (LOAD-ZMTP-07).
    #[error("unknown frame version {0}")]
    UnknownVersion(u8),
    /// `topic_mismatch` (LOAD-ZMTP-08).
    #[error("topic mismatch in {0:?}")]
    TopicMismatch(TopicSource),
    /// `oversized`: declared `payload_len` over the family cap, refused before parsing
    /// (LOAD-ZMTP-09).
    #[error("declared payload {declared} bytes over {limit}")]
    Oversized {
        /// Declared `payload_len`.
        declared: u32,
        /// The cap.
        limit: u32,
    },
    /// `identity_mismatch` (LOAD-ZMTP-10).
    #[error("identity mismatch: {0:?}")]
    IdentityMismatch(IdentityMismatch),
}

impl DynamoReject {
    /// The `continuum_dynamo_load_events_total{result}` label (OBS-04).
    pub const fn result_label(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "malformed",
            Self::UnknownVersion(_) => "unknown_version",
            Self::TopicMismatch(_) => "topic_mismatch",
            Self::Oversized { .. } => "oversized",
            Self::IdentityMismatch(_) => "identity_mismatch",
        }
    }
}

impl From<Malformed> for DynamoReject {
    fn from(m: Malformed) -> Self {
        Self::Malformed(m)
    }
}
