//! Encoders of `ActiveLoad`, `EventEnvelope` and the 4-frame message, for tests and benchmarks.
//!
//! Role: produce what a Dynamo publisher sends, byte for byte as rmp-serde does (smallest
//! integer and length forms, `None` as nil): [`Encoding::Map`] is `rmp_serde::to_vec_named`
//! (Dynamo 1.6.1's wire form), [`Encoding::Array`] is `rmp_serde::to_vec`.
//!
//! Invariant: `decode(encode(x)) == x` for every value, and `encode(decode(captured)) ==
//! captured` for the Dynamo 1.6.1 captures (LOAD-ZMTP-19).

use thiserror::Error;

use super::envelope::{ACTIVE_LOAD_FIELDS, ActiveLoad, ENVELOPE_FIELDS, EventEnvelope};
use super::frame::FRAME_VERSION;
use super::msgpack::{
    write_array_len, write_bin, write_map_len, write_opt_u64, write_str, write_u64,
};

/// How a struct is laid out in msgpack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// String-keyed map (`rmp_serde::to_vec_named`).
    Map,
    /// Positional array (`rmp_serde::to_vec`).
    Array,
}

/// Why a message cannot be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum EncodeError {
    /// The envelope does not fit the u32 `payload_len`.
    #[error("envelope of {0} bytes does not fit payload_len")]
    TooLarge(usize),
}

/// A struct header: a map of `n` entries, or an array of `n` elements.
pub(crate) fn header(out: &mut Vec<u8>, enc: Encoding, n: usize) {
    match enc {
        Encoding::Map => write_map_len(out, n),
        Encoding::Array => write_array_len(out, n),
    }
}

/// A field name (map encoding only).
pub(crate) fn key(out: &mut Vec<u8>, enc: Encoding, name: &str) {
    if enc == Encoding::Map {
        write_str(out, name.as_bytes());
    }
}

/// Appends an `ActiveLoad`.
pub fn encode_active_load(load: &ActiveLoad, enc: Encoding, out: &mut Vec<u8>) {
    let [w, d, a, p, k] = ACTIVE_LOAD_FIELDS;
    header(out, enc, ACTIVE_LOAD_FIELDS.len());
    key(out, enc, w);
    write_u64(out, load.worker_id.get());
    key(out, enc, d);
    write_u64(out, u64::from(load.dp_rank));
    key(out, enc, a);
    write_opt_u64(out, load.active_decode_blocks);
    key(out, enc, p);
    write_opt_u64(out, load.active_prefill_tokens);
    key(out, enc, k);
    write_opt_u64(out, load.kv_used_blocks);
}

/// Appends an `EventEnvelope`.
pub fn encode_envelope(env: &EventEnvelope<'_>, enc: Encoding, out: &mut Vec<u8>) {
    let [id, seq, at, topic, payload] = ENVELOPE_FIELDS;
    header(out, enc, ENVELOPE_FIELDS.len());
    key(out, enc, id);
    write_u64(out, env.publisher_id.get());
    key(out, enc, seq);
    write_u64(out, env.sequence.0);
    key(out, enc, at);
    write_u64(out, env.published_at.0);
    key(out, enc, topic);
    write_str(out, env.topic);
    key(out, enc, payload);
    write_bin(out, env.payload);
}

/// The 4 frames of a message carrying `env`: its topic, publisher id and sequence in frames
/// 0..2, then `version | payload_len | envelope`.
pub fn encode_message(env: &EventEnvelope<'_>, enc: Encoding) -> Result<[Vec<u8>; 4], EncodeError> {
    let mut envelope = Vec::with_capacity(64 + env.topic.len() + env.payload.len());
    encode_envelope(env, enc, &mut envelope);
    let len = u32::try_from(envelope.len()).map_err(|_| EncodeError::TooLarge(envelope.len()))?;
    let mut f3 = Vec::with_capacity(5 + envelope.len());
    f3.push(FRAME_VERSION);
    f3.extend_from_slice(&len.to_be_bytes());
    f3.extend_from_slice(&envelope);
    Ok([
        env.topic.to_vec(),
        env.publisher_id.get().to_be_bytes().to_vec(),
        env.sequence.0.to_be_bytes().to_vec(),
        f3,
    ])
}
