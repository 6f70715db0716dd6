//! msgpack decoders of `EventEnvelope` and `ActiveLoad` (LOAD-ZMTP-04).
//!
//! Role: read both encodings rmp-serde produces for a Rust struct: the string-keyed map
//! (`to_vec_named`, what Dynamo 1.6.1 sends) and the positional array (`to_vec`), for N-2
//! compatibility.
//!
//! Invariants:
//! - map keys are field names (or, as serde accepts them, field indices); unknown keys and extra
//!   array elements are skipped; a key twice is `malformed`;
//! - `ActiveLoad`: `worker_id` is required, `dp_rank` defaults to 0, the three counters are
//!   `None` when nil or absent (older publishers send fewer fields);
//! - `EventEnvelope`: all five fields are required; `payload` is msgpack binary, borrowed;
//! - bytes after the value are `malformed`; nothing allocates; no input panics.

use super::msgpack::{Container, MsgpackError, Reader, short_eq};
use super::reject::{DynamoReject, Malformed};
use crate::discovery::ids::{InstanceId, PublisherId, UnixMillis};

/// Envelope field names, in declaration (array) order.
pub const ENVELOPE_FIELDS: [&str; 5] = [
    "publisher_id",
    "sequence",
    "published_at",
    "topic",
    "payload",
];
/// `ActiveLoad` field names, in declaration (array) order.
pub const ACTIVE_LOAD_FIELDS: [&str; 5] = [
    "worker_id",
    "dp_rank",
    "active_decode_blocks",
    "active_prefill_tokens",
    "kv_used_blocks",
];

/// A per-publisher message sequence number (frame 2 and the envelope's `sequence`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sequence(pub u64);

/// The event-plane envelope, borrowing `topic` and `payload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventEnvelope<'a> {
    /// Publisher incarnation id.
    pub publisher_id: PublisherId,
    /// Per-publisher sequence.
    pub sequence: Sequence,
    /// Unix milliseconds at publication.
    pub published_at: UnixMillis,
    /// Topic (bytes of a msgpack string).
    pub topic: &'a [u8],
    /// The encoded inner event.
    pub payload: &'a [u8],
}

/// A worker's load sample (Dynamo's `ActiveLoad`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActiveLoad {
    /// The worker (its instance id).
    pub worker_id: InstanceId,
    /// Data-parallel rank.
    pub dp_rank: u32,
    /// Scheduler-reported decode blocks.
    pub active_decode_blocks: Option<u64>,
    /// Scheduler-reported prefill tokens.
    pub active_prefill_tokens: Option<u64>,
    /// KV blocks in use on the worker.
    pub kv_used_blocks: Option<u64>,
}

/// Calls `field(index, reader)` for each known field of a map- or array-encoded struct whose
/// fields are `names`; skips the rest. Returns the bit set of fields seen.
fn read_struct<'a>(
    r: &mut Reader<'a>,
    what: &'static str,
    names: &[&'static str; 5],
    mut field: impl FnMut(usize, &mut Reader<'a>) -> Result<(), DynamoReject>,
) -> Result<u8, DynamoReject> {
    let broken = |error| Malformed::Msgpack { what, error };
    let mut seen = 0u8;
    match r.container().map_err(broken)? {
        Container::Array(n) => {
            for i in 0..n {
                if i < names.len() {
                    field(i, r)?;
                    seen |= 1 << i;
                } else {
                    r.skip().map_err(broken)?;
                }
            }
        }
        Container::Map(n) => {
            for pos in 0..n {
                // Publishers write fields in declaration order: try that name first.
                let idx = map_key(r, names, pos).map_err(broken)?;
                match idx {
                    Some(i) => {
                        if seen & (1 << i) != 0 {
                            let name = names.get(i).copied().unwrap_or(what);
                            return Err(Malformed::DuplicateField(name).into());
                        }
                        seen |= 1 << i;
                        field(i, r)?;
                    }
                    None => r.skip().map_err(broken)?,
                }
            }
        }
    }
    if r.remaining() != 0 {
        return Err(Malformed::TrailingBytes(what).into());
    }
    Ok(seen)
}

/// A map key: a field name, or a field index as serde accepts. `hint` is the key's position in
/// the map, checked first: a field written in declaration order costs one comparison.
fn map_key(
    r: &mut Reader<'_>,
    names: &[&'static str; 5],
    hint: usize,
) -> Result<Option<usize>, MsgpackError> {
    let mut probe = r.clone();
    if let Ok(k) = probe.str() {
        *r = probe;
        if names.get(hint).is_some_and(|n| short_eq(n.as_bytes(), k)) {
            return Ok(Some(hint));
        }
        return Ok(names.iter().position(|n| short_eq(n.as_bytes(), k)));
    }
    let mut probe = r.clone();
    if let Ok(i) = probe.u64() {
        *r = probe;
        return Ok(usize::try_from(i).ok().filter(|&i| i < names.len()));
    }
    // any other key type: skip it, the value is skipped by the caller
    r.skip()?;
    Ok(None)
}

fn field_err(field: &'static str) -> impl Fn(MsgpackError) -> DynamoReject {
    move |error| Malformed::Field { field, error }.into()
}

fn require(seen: u8, i: usize, names: &[&'static str; 5]) -> Result<(), DynamoReject> {
    if seen & (1 << i) == 0 {
        let name = names.get(i).copied().unwrap_or("?");
        return Err(Malformed::MissingField(name).into());
    }
    Ok(())
}

/// Decodes an `EventEnvelope` (map or array encoding).
pub fn decode_envelope(bytes: &[u8]) -> Result<EventEnvelope<'_>, DynamoReject> {
    let mut r = Reader::new(bytes);
    let mut ints = [0u64; 3];
    let mut topic: &[u8] = &[];
    let mut payload: &[u8] = &[];
    let names = &ENVELOPE_FIELDS;
    let seen = read_struct(&mut r, "EventEnvelope", names, |i, r| {
        let name = names.get(i).copied().unwrap_or("?");
        match i {
            3 => topic = r.str().map_err(field_err(name))?,
            4 => payload = r.bin().map_err(field_err(name))?,
            _ => {
                let v = r.u64().map_err(field_err(name))?;
                if let Some(slot) = ints.get_mut(i) {
                    *slot = v;
                }
            }
        }
        Ok(())
    })?;
    for i in 0..names.len() {
        require(seen, i, names)?;
    }
    let [publisher_id, sequence, published_at] = ints;
    Ok(EventEnvelope {
        publisher_id: PublisherId::new(publisher_id),
        sequence: Sequence(sequence),
        published_at: UnixMillis(published_at),
        topic,
        payload,
    })
}

/// Decodes an `ActiveLoad` (map or array encoding).
pub fn decode_active_load(bytes: &[u8]) -> Result<ActiveLoad, DynamoReject> {
    let mut r = Reader::new(bytes);
    let mut worker_id = 0u64;
    let mut dp_rank = 0u32;
    let mut opts: [Option<u64>; 3] = [None; 3];
    let names = &ACTIVE_LOAD_FIELDS;
    let seen = read_struct(&mut r, "ActiveLoad", names, |i, r| {
        let name = names.get(i).copied().unwrap_or("?");
        match i {
            0 => worker_id = r.u64().map_err(field_err(name))?,
            1 => {
                let v = r.u64().map_err(field_err(name))?;
                dp_rank = u32::try_from(v)
                    .map_err(|_| MsgpackError::OutOfRange)
                    .map_err(field_err(name))?;
            }
            _ => {
                let v = r.opt_u64().map_err(field_err(name))?;
                if let Some(slot) = opts.get_mut(i.wrapping_sub(2)) {
                    *slot = v;
                }
            }
        }
        Ok(())
    })?;
    require(seen, 0, names)?;
    let [active_decode_blocks, active_prefill_tokens, kv_used_blocks] = opts;
    Ok(ActiveLoad {
        worker_id: InstanceId::new(worker_id),
        dp_rank,
        active_decode_blocks,
        active_prefill_tokens,
        kv_used_blocks,
    })
}
