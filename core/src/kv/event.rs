//! The sans-IO decoder of a `kv-events` payload (KV-IDX-04, -05): the envelope's `payload`, a
//! msgpack array of Dynamo 1.6.1 `RouterEvent`s, into a reusable [`KvBatch`].
//!
//! Role: read `RouterEvent { worker_id, storage_tier, residency_domain, event: KvCacheEvent {
//! event_id, data, dp_rank } }` with `data` one of `{"stored": {parent_hash, start_position,
//! blocks: [{block_hash, tokens_hash, mm_extra_info}]}}`, `{"removed": {block_hashes}}` or
//! `"cleared"`, as rmp-serde writes and reads them (`dynamo-kv-router` 1.6.1 `protocols.rs`). The
//! caller gets flat [`KvEvent`]s whose stored blocks and removed hashes are ranges into two
//! batch-owned arrays ([`KvBatch::blocks`], [`KvBatch::hashes`]).
//!
//! Encodings, as rmp-serde accepts them:
//! - every struct as a string-keyed map (`to_vec_named`, what 1.6.1 sends) or a positional array
//!   (`to_vec`); map keys are field names or field indices; unknown keys and extra array
//!   elements are skipped (bounded by [`crate::dynamo_event::msgpack::MAX_DEPTH`]); a key twice
//!   is malformed;
//! - enums externally tagged: a variant name (or index) alone for unit variants, or a one-entry
//!   map `{variant: value}` (a unit variant's value then nil); anything else is malformed, and so
//!   is an unknown variant;
//! - integers in any msgpack integer form; negative, too large for the field, or not an integer
//!   at all is malformed.
//!
//! Defaults, as upstream serde applies them: `storage_tier` absent is `device`
//! (`#[serde(default)]`, `StorageTier::Device` is `#[default]`); `dp_rank` absent is 0
//! (`#[serde(default)]`); `parent_hash` and `start_position` (`Option`) nil or absent are `None`;
//! `residency_domain`, `state_source`, `session_id` and `mm_extra_info` are skipped whatever
//! they hold. Required: `worker_id`, `event`, `event_id`, `data`, `blocks`, `block_hash`,
//! `tokens_hash`, `block_hashes`.
//!
//! Invariants:
//! - every declared length is checked against the bytes left before it is used, then the event
//!   count against [`MAX_BATCH_EVENTS`] and the stored blocks plus removed hashes of the whole
//!   batch against [`MAX_BATCH_BLOCKS`], before anything is reserved; the batch's arrays grow only
//!   when needed and never beyond those caps, and are reused by the next [`KvBatch::decode`];
//! - a refused payload leaves the batch empty; bytes after the array are malformed;
//! - no input panics.

use std::ops::Range;

use thiserror::Error;

use super::{EngineHash, MAX_BATCH_BLOCKS, MAX_BATCH_EVENTS, Outcome, StoredBlock, TokensHash};
use crate::discovery::ids::InstanceId;
use crate::dynamo_event::msgpack::{Container, MsgpackError, Reader, short_eq};

/// `RouterEvent` fields, in declaration (array) order.
pub const ROUTER_EVENT_FIELDS: [&str; 6] = [
    "worker_id",
    "storage_tier",
    "residency_domain",
    "event",
    "state_source",
    "session_id",
];
/// `KvCacheEvent` fields, in declaration order.
pub const CACHE_EVENT_FIELDS: [&str; 3] = ["event_id", "data", "dp_rank"];
/// `KvCacheStoreData` fields, in declaration order.
pub const STORE_FIELDS: [&str; 3] = ["parent_hash", "start_position", "blocks"];
/// `KvCacheStoredBlockData` fields, in declaration order.
pub const BLOCK_FIELDS: [&str; 3] = ["block_hash", "tokens_hash", "mm_extra_info"];
/// `KvCacheRemoveData` fields.
pub const REMOVE_FIELDS: [&str; 1] = ["block_hashes"];
/// `KvCacheEventData` variants, in declaration (index) order.
pub const DATA_VARIANTS: [&str; 3] = ["stored", "removed", "cleared"];
/// `StorageTier` variants, in declaration (index) order.
pub const TIER_VARIANTS: [&str; 4] = ["device", "host_pinned", "disk", "external"];

/// The storage tier of an event: only `device` is indexed (KV-IDX-05).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// GPU memory (`device`, also when absent).
    Device,
    /// `host_pinned`, `disk` or `external`: counted as `other_tier`, not indexed.
    Other,
}

/// What an event does to its rank's cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvData {
    /// Blocks stored as a chain under `parent` (`None`: from the root).
    Stored {
        /// `parent_hash`.
        parent: Option<EngineHash>,
        /// The blocks, in chain order: a range for [`KvBatch::blocks`].
        blocks: Range<u32>,
    },
    /// Blocks evicted, by engine hash.
    Removed {
        /// The hashes: a range for [`KvBatch::hashes`].
        hashes: Range<u32>,
    },
    /// Every block of the rank dropped.
    Cleared,
}

/// One decoded `RouterEvent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEvent {
    /// `worker_id`.
    pub worker: InstanceId,
    /// `event.dp_rank`.
    pub dp_rank: u32,
    /// `event.event_id`.
    pub event_id: u64,
    /// `storage_tier`.
    pub tier: Tier,
    /// `event.data`.
    pub data: KvData,
}

/// Why a payload does not decode (`malformed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum KvMalformed {
    /// A sequence (the batch, `blocks`, `block_hashes`) that is not a msgpack array.
    #[error("{0}: not an array")]
    NotAnArray(&'static str),
    /// A value of the wrong type, out of range, truncated or nested too deep, in `what` (a
    /// struct or field name).
    #[error("{what}: {error}")]
    Msgpack {
        /// The struct or field being read.
        what: &'static str,
        /// The reader's error.
        error: MsgpackError,
    },
    /// A required field is absent.
    #[error("missing field {0}")]
    MissingField(&'static str),
    /// A field appears twice in a map.
    #[error("duplicate field {0}")]
    DuplicateField(&'static str),
    /// An enum (`data`, `storage_tier`) names a variant that does not exist.
    #[error("{0}: unknown variant")]
    UnknownVariant(&'static str),
    /// An enum neither a variant name nor a one-entry map, a data-carrying variant given bare,
    /// or a unit variant's map value not nil.
    #[error("{0}: not an externally tagged variant")]
    VariantShape(&'static str),
    /// Bytes after the batch's array.
    #[error("trailing bytes after the batch")]
    TrailingBytes,
}

/// Why [`KvBatch::decode`] refused a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum KvDecodeError {
    /// The payload does not decode.
    #[error("malformed kv-events payload: {0}")]
    Malformed(#[from] KvMalformed),
    /// More events than [`MAX_BATCH_EVENTS`].
    #[error("{count} events in one batch, over {MAX_BATCH_EVENTS}")]
    TooManyEvents {
        /// The declared event count.
        count: usize,
    },
    /// More stored blocks plus removed hashes than [`MAX_BATCH_BLOCKS`].
    #[error("{count} blocks in one batch, over {MAX_BATCH_BLOCKS}")]
    TooManyBlocks {
        /// Blocks and hashes of the batch up to and including the refused array.
        count: usize,
    },
}

impl KvDecodeError {
    /// The `continuum_dynamo_kv_events_total{result}` class of the whole payload.
    pub const fn outcome(&self) -> Outcome {
        match self {
            Self::Malformed(_) => Outcome::Malformed,
            Self::TooManyEvents { .. } | Self::TooManyBlocks { .. } => Outcome::OverCapacity,
        }
    }
}

/// A decoded batch, reused from payload to payload.
#[derive(Debug, Clone, Default)]
pub struct KvBatch {
    events: Vec<KvEvent>,
    blocks: Vec<StoredBlock>,
    hashes: Vec<EngineHash>,
}

fn bad(what: &'static str) -> impl Fn(MsgpackError) -> KvDecodeError {
    move |error| KvMalformed::Msgpack { what, error }.into()
}

/// A batch index as `u32` (below [`MAX_BATCH_BLOCKS`] by construction).
fn at(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Makes room for `extra` more elements, `v.len() + extra <= cap` checked by the caller:
/// doubling, never past `cap`.
fn grow<T>(v: &mut Vec<T>, extra: usize, cap: usize) {
    let need = v.len().saturating_add(extra);
    if need > v.capacity() {
        let target = need.max(v.capacity().saturating_mul(2)).min(cap).max(need);
        v.reserve_exact(target - v.len());
    }
}

/// A struct's shape: its name, field names in declaration order, and the bit set of fields
/// serde requires.
struct Shape {
    what: &'static str,
    names: &'static [&'static str],
    required: u8,
}

const ROUTER_EVENT: Shape = Shape {
    what: "RouterEvent",
    names: &ROUTER_EVENT_FIELDS,
    required: 1 << 0 | 1 << 3,
};
const CACHE_EVENT: Shape = Shape {
    what: "KvCacheEvent",
    names: &CACHE_EVENT_FIELDS,
    required: 1 << 0 | 1 << 1,
};
const STORE: Shape = Shape {
    what: "KvCacheStoreData",
    names: &STORE_FIELDS,
    required: 1 << 2,
};
const BLOCK: Shape = Shape {
    what: "KvCacheStoredBlockData",
    names: &BLOCK_FIELDS,
    required: 1 << 0 | 1 << 1,
};
const REMOVE: Shape = Shape {
    what: "KvCacheRemoveData",
    names: &REMOVE_FIELDS,
    required: 1 << 0,
};

/// An identifier (field or variant) as serde reads it: a string, binary, or an index.
#[derive(Clone, Copy)]
enum Ident<'a> {
    Name(&'a [u8]),
    Index(u64),
}

fn ident<'a>(r: &mut Reader<'a>, what: &'static str) -> Result<Ident<'a>, KvDecodeError> {
    for read in [Reader::str, Reader::bin] {
        let mut probe = r.clone();
        match read(&mut probe) {
            Ok(s) => {
                *r = probe;
                return Ok(Ident::Name(s));
            }
            Err(MsgpackError::UnexpectedType(_)) => {}
            Err(error) => return Err(KvMalformed::Msgpack { what, error }.into()),
        }
    }
    r.u64().map(Ident::Index).map_err(bad(what))
}

/// The position of `id` among `names`; `hint` (the key's position in its map) is tried first,
/// so fields written in declaration order cost one comparison each.
fn lookup(id: Ident<'_>, names: &[&str], hint: usize) -> Option<usize> {
    match id {
        Ident::Name(k) => {
            if names.get(hint).is_some_and(|n| short_eq(n.as_bytes(), k)) {
                return Some(hint);
            }
            names.iter().position(|n| short_eq(n.as_bytes(), k))
        }
        Ident::Index(i) => usize::try_from(i).ok().filter(|&i| i < names.len()),
    }
}

/// Calls `field(index, reader)` for each known field of a map- or array-encoded struct, skips
/// the rest, then checks the required ones were seen.
fn read_struct<'a>(
    r: &mut Reader<'a>,
    shape: &Shape,
    mut field: impl FnMut(usize, &mut Reader<'a>) -> Result<(), KvDecodeError>,
) -> Result<(), KvDecodeError> {
    let skip = bad(shape.what);
    let mut seen = 0u8;
    match r.container().map_err(bad(shape.what))? {
        Container::Array(n) => {
            for i in 0..n {
                if i < shape.names.len() {
                    seen |= 1 << i;
                    field(i, r)?;
                } else {
                    r.skip().map_err(&skip)?;
                }
            }
        }
        Container::Map(n) => {
            for pos in 0..n {
                match lookup(ident(r, shape.what)?, shape.names, pos) {
                    Some(i) => {
                        if seen & (1 << i) != 0 {
                            let name = shape.names.get(i).copied().unwrap_or(shape.what);
                            return Err(KvMalformed::DuplicateField(name).into());
                        }
                        seen |= 1 << i;
                        field(i, r)?;
                    }
                    None => r.skip().map_err(&skip)?,
                }
            }
        }
    }
    let missing = shape.required & !seen;
    if missing != 0 {
        let i = missing.trailing_zeros() as usize;
        let name = shape.names.get(i).copied().unwrap_or(shape.what);
        return Err(KvMalformed::MissingField(name).into());
    }
    Ok(())
}

/// How an externally tagged enum value was written.
enum Tag {
    /// The variant alone (a unit variant).
    Bare(usize),
    /// `{variant: value}`; the reader is at the value.
    Wrapped(usize),
}

fn read_tag(r: &mut Reader<'_>, what: &'static str, names: &[&str]) -> Result<Tag, KvDecodeError> {
    let variant = |r: &mut Reader<'_>| {
        lookup(ident(r, what)?, names, usize::MAX).ok_or(KvMalformed::UnknownVariant(what).into())
    };
    let mut probe = r.clone();
    match probe.container() {
        Ok(Container::Map(1)) => {
            *r = probe;
            variant(r).map(Tag::Wrapped)
        }
        Ok(_) => Err(KvMalformed::VariantShape(what).into()),
        Err(MsgpackError::UnexpectedType(_)) => variant(r).map(Tag::Bare),
        Err(error) => Err(KvMalformed::Msgpack { what, error }.into()),
    }
}

/// A unit variant: bare, or wrapped with a nil value.
fn unit(r: &mut Reader<'_>, tag: Tag, what: &'static str) -> Result<usize, KvDecodeError> {
    match tag {
        Tag::Bare(i) => Ok(i),
        Tag::Wrapped(i) => {
            if r.nil().map_err(bad(what))? {
                Ok(i)
            } else {
                Err(KvMalformed::VariantShape(what).into())
            }
        }
    }
}

fn read_u32(r: &mut Reader<'_>, what: &'static str) -> Result<u32, KvDecodeError> {
    let v = r.u64().map_err(bad(what))?;
    u32::try_from(v).map_err(|_| bad(what)(MsgpackError::OutOfRange))
}

fn read_tier(r: &mut Reader<'_>) -> Result<Tier, KvDecodeError> {
    let what = "storage_tier";
    let tag = read_tag(r, what, &TIER_VARIANTS)?;
    Ok(match unit(r, tag, what)? {
        0 => Tier::Device,
        _ => Tier::Other,
    })
}

impl KvBatch {
    /// An empty batch; it allocates on its first events.
    pub const fn new() -> Self {
        Self {
            events: Vec::new(),
            blocks: Vec::new(),
            hashes: Vec::new(),
        }
    }

    /// Decodes `payload` (an envelope's `payload`: a msgpack array of `RouterEvent`) in place of
    /// the previous content. On error the batch is empty.
    pub fn decode(&mut self, payload: &[u8]) -> Result<(), KvDecodeError> {
        self.clear();
        let r = self.decode_all(payload);
        if r.is_err() {
            self.clear();
        }
        r
    }

    /// The events, in payload order.
    pub fn events(&self) -> &[KvEvent] {
        &self.events
    }

    /// The stored blocks of a [`KvData::Stored`] range (empty for a range not from this batch).
    pub fn blocks(&self, range: Range<u32>) -> &[StoredBlock] {
        self.blocks
            .get(range.start as usize..range.end as usize)
            .unwrap_or(&[])
    }

    /// The engine hashes of a [`KvData::Removed`] range (empty for a range not from this batch).
    pub fn hashes(&self, range: Range<u32>) -> &[EngineHash] {
        self.hashes
            .get(range.start as usize..range.end as usize)
            .unwrap_or(&[])
    }

    /// Stored blocks plus removed hashes in the batch: what [`MAX_BATCH_BLOCKS`] bounds.
    pub fn block_count(&self) -> usize {
        self.blocks.len() + self.hashes.len()
    }

    /// Room held for `(events, stored blocks, removed hashes)`: never above [`MAX_BATCH_EVENTS`],
    /// [`MAX_BATCH_BLOCKS`], [`MAX_BATCH_BLOCKS`].
    pub fn capacities(&self) -> (usize, usize, usize) {
        (
            self.events.capacity(),
            self.blocks.capacity(),
            self.hashes.capacity(),
        )
    }

    fn clear(&mut self) {
        self.events.clear();
        self.blocks.clear();
        self.hashes.clear();
    }

    fn decode_all(&mut self, payload: &[u8]) -> Result<(), KvDecodeError> {
        let mut r = Reader::new(payload);
        let n = self.array(&mut r, "events")?;
        if n > MAX_BATCH_EVENTS {
            return Err(KvDecodeError::TooManyEvents { count: n });
        }
        grow(&mut self.events, n, MAX_BATCH_EVENTS);
        for _ in 0..n {
            let ev = self.router_event(&mut r)?;
            self.events.push(ev);
        }
        if r.remaining() != 0 {
            return Err(KvMalformed::TrailingBytes.into());
        }
        Ok(())
    }

    /// An array header of `n` elements (checked against the bytes left by the reader).
    fn array(&self, r: &mut Reader<'_>, what: &'static str) -> Result<usize, KvDecodeError> {
        match r.container().map_err(bad(what))? {
            Container::Array(n) => Ok(n),
            Container::Map(_) => Err(KvMalformed::NotAnArray(what).into()),
        }
    }

    /// An array of `n` more blocks or hashes, against the batch's cap.
    fn block_array(&self, r: &mut Reader<'_>, what: &'static str) -> Result<usize, KvDecodeError> {
        let n = self.array(r, what)?;
        let count = self.block_count().saturating_add(n);
        if count > MAX_BATCH_BLOCKS {
            return Err(KvDecodeError::TooManyBlocks { count });
        }
        Ok(n)
    }

    fn router_event(&mut self, r: &mut Reader<'_>) -> Result<KvEvent, KvDecodeError> {
        let mut ev = KvEvent {
            worker: InstanceId::new(0),
            dp_rank: 0,
            event_id: 0,
            tier: Tier::Device,
            data: KvData::Cleared,
        };
        // `worker_id` and `event` are required: `read_struct` refuses a struct without them.
        read_struct(r, &ROUTER_EVENT, |i, r| {
            match i {
                0 => ev.worker = InstanceId::new(r.u64().map_err(bad("worker_id"))?),
                1 => ev.tier = read_tier(r)?,
                3 => self.cache_event(r, &mut ev)?,
                _ => {
                    let name = ROUTER_EVENT_FIELDS.get(i).copied().unwrap_or("RouterEvent");
                    r.skip().map_err(bad(name))?;
                }
            }
            Ok(())
        })?;
        Ok(ev)
    }

    fn cache_event(&mut self, r: &mut Reader<'_>, ev: &mut KvEvent) -> Result<(), KvDecodeError> {
        read_struct(r, &CACHE_EVENT, |i, r| {
            match i {
                0 => ev.event_id = r.u64().map_err(bad("event_id"))?,
                1 => ev.data = self.data(r)?,
                _ => ev.dp_rank = read_u32(r, "dp_rank")?,
            }
            Ok(())
        })
    }

    fn data(&mut self, r: &mut Reader<'_>) -> Result<KvData, KvDecodeError> {
        let what = "data";
        match read_tag(r, what, &DATA_VARIANTS)? {
            Tag::Wrapped(0) => self.stored(r),
            Tag::Wrapped(1) => self.removed(r),
            tag @ (Tag::Wrapped(_) | Tag::Bare(2)) => unit(r, tag, what).map(|_| KvData::Cleared),
            Tag::Bare(_) => Err(KvMalformed::VariantShape(what).into()),
        }
    }

    fn stored(&mut self, r: &mut Reader<'_>) -> Result<KvData, KvDecodeError> {
        let mut parent = None;
        let mut blocks = 0..0;
        read_struct(r, &STORE, |i, r| {
            match i {
                0 => parent = r.opt_u64().map_err(bad("parent_hash"))?.map(EngineHash),
                1 => {
                    if !r.nil().map_err(bad("start_position"))? {
                        read_u32(r, "start_position")?;
                    }
                }
                _ => blocks = self.blocks_array(r)?,
            }
            Ok(())
        })?;
        Ok(KvData::Stored { parent, blocks })
    }

    fn blocks_array(&mut self, r: &mut Reader<'_>) -> Result<Range<u32>, KvDecodeError> {
        let n = self.block_array(r, "blocks")?;
        grow(&mut self.blocks, n, MAX_BATCH_BLOCKS);
        let start = at(self.blocks.len());
        for _ in 0..n {
            let mut b = StoredBlock {
                block_hash: EngineHash(0),
                tokens_hash: TokensHash(0),
            };
            read_struct(r, &BLOCK, |i, r| {
                match i {
                    0 => b.block_hash = EngineHash(r.u64().map_err(bad("block_hash"))?),
                    1 => b.tokens_hash = TokensHash(r.u64().map_err(bad("tokens_hash"))?),
                    _ => r.skip().map_err(bad("mm_extra_info"))?,
                }
                Ok(())
            })?;
            self.blocks.push(b);
        }
        Ok(start..at(self.blocks.len()))
    }

    fn removed(&mut self, r: &mut Reader<'_>) -> Result<KvData, KvDecodeError> {
        let mut hashes = 0..0;
        read_struct(r, &REMOVE, |_, r| {
            let n = self.block_array(r, "block_hashes")?;
            grow(&mut self.hashes, n, MAX_BATCH_BLOCKS);
            let start = at(self.hashes.len());
            for _ in 0..n {
                let h = r.u64().map_err(bad("block_hashes"))?;
                self.hashes.push(EngineHash(h));
            }
            hashes = start..at(self.hashes.len());
            Ok(())
        })?;
        Ok(KvData::Removed { hashes })
    }
}
