//! Decoders (and test encoders) of Dynamo's ZMQ event-plane messages (LOAD-ZMTP-03..11, -19).
//!
//! Role: a complete ZMTP message from [`crate::zmtp`] is split into its 4 frames
//! ([`frame::parse_frames`]), its msgpack `EventEnvelope` ([`envelope::decode_envelope`]) and,
//! for `kv_metrics`, the `ActiveLoad` sample ([`envelope::decode_active_load`]); every refusal is
//! a typed [`reject::DynamoReject`] with its `load_events_total{result}` label. The discovery
//! record and registry checks stay with the caller ([`frame::LoadSample::check_publisher`],
//! [`frame::LoadSample::check_worker`]).
//!
//! Invariants:
//! - the declared `payload_len` is checked against the family cap before anything is parsed;
//! - decoding borrows from the frames and never allocates; every msgpack length is bounded by
//!   the bytes present; no input panics;
//! - both rmp-serde struct encodings (named map, positional array) are accepted.

pub mod encode;
pub mod envelope;
pub mod frame;
pub mod msgpack;
pub mod reject;

#[cfg(test)]
mod decode_tests;
#[cfg(test)]
mod fixture_tests;
#[cfg(test)]
mod msgpack_tests;

pub use encode::{EncodeError, Encoding, encode_active_load, encode_envelope, encode_message};
pub use envelope::{ActiveLoad, EventEnvelope, Sequence, decode_active_load, decode_envelope};
pub use frame::{
    DynamoEvent, DynamoFrame, EventFamily, LoadSample, decode_event, decode_kv_metrics,
    parse_frames,
};
pub use reject::{DynamoReject, IdentityMismatch, Malformed, TopicSource};
