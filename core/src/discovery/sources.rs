//! EventSource records (`v1/event_sources/...`, Dynamo 1.6.1+): which worker rank a `kv-events`
//! publisher reports for.
//!
//! Role: read one untrusted EventSource value into an [`EventSource`]. Dynamo writes one next to
//! each kv-events channel, under the same key suffix:
//! `{"type":"EventSource","topic":"kv-events","publisher_id":<id>,"scope":{..},
//!   "metadata":{"worker":{"worker_id":<id>,"dp_rank":<n>},"publisher_id":<id>,..}}`.
//! The join to the channel (by key suffix) is the join's business ([`super::join`]).
//!
//! Invariants:
//! - the record names exactly the publisher of its key: `publisher_id` must be present and equal
//!   the key's, and `metadata.publisher_id`, when present, too; `topic` must be `kv-events`;
//! - `worker_id` is an exact u64 (number, or hex string as every id, Q-46) and `dp_rank` an
//!   integer in `0..=u32::MAX`; anything else makes the whole record malformed, never a guess
//!   (the ingest gates events on this identity, KV-IDX-09);
//! - namespace and scope come from the key, never from the payload (DISC-MULTI-04); unknown
//!   fields (`recovery_target`, `kv_state_endpoint`, ...) are skipped without building a tree.

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::fleet::{EventSource, Family};
use super::ids::{InstanceId, PublisherId};
use super::records::{MalformedReason, SourceError, expect_object, type_is};

/// The top-level fields read; `scope` and everything else are skipped.
#[derive(Deserialize)]
struct SourceFields<'a> {
    #[serde(rename = "type", default)]
    kind: Option<Value>,
    #[serde(default)]
    topic: Option<Value>,
    #[serde(default)]
    publisher_id: Option<Value>,
    #[serde(default, borrow)]
    metadata: Option<&'a RawValue>,
}

/// The `metadata` fields read; `recovery_target` and the rest are skipped.
#[derive(Deserialize)]
struct MetadataFields<'a> {
    #[serde(default, borrow)]
    worker: Option<&'a RawValue>,
    #[serde(default)]
    publisher_id: Option<Value>,
}

#[derive(Deserialize)]
struct WorkerFields {
    #[serde(default)]
    worker_id: Option<Value>,
    #[serde(default)]
    dp_rank: Option<Value>,
}

/// Whether a source key's topic is one whose sources the router reads (`kv-events` only); the
/// reducer skips the others silently, as it skips channels of unsubscribed topics (LOAD-CHAN-08).
pub fn is_read_topic(key_topic: &str) -> bool {
    Family::from_topic(key_topic) == Some(Family::KvEvents)
}

/// Parses an EventSource record whose key names publisher `key_publisher`.
pub fn parse_event_source(
    key_publisher: PublisherId,
    value: &[u8],
) -> Result<EventSource, MalformedReason> {
    expect_object(value)?;
    let rec: SourceFields<'_> = serde_json::from_slice(value).map_err(|_| MalformedReason::Json)?;
    type_is(rec.kind.as_ref(), "EventSource")?;
    if !matches!(&rec.topic, Some(Value::String(t)) if t == Family::KvEvents.topic()) {
        return Err(SourceError::Topic.into());
    }
    let top =
        PublisherId::from_json(rec.publisher_id.as_ref()).map_err(SourceError::PublisherId)?;
    same_publisher(key_publisher, top)?;
    let meta: MetadataFields<'_> = object(rec.metadata, SourceError::NoMetadata)?;
    match &meta.publisher_id {
        None | Some(Value::Null) => {}
        Some(v) => {
            let inner =
                PublisherId::from_json(Some(v)).map_err(SourceError::MetadataPublisherId)?;
            same_publisher(key_publisher, inner)?;
        }
    }
    let worker: WorkerFields = object(meta.worker, SourceError::NoWorker)?;
    let worker_id =
        InstanceId::from_json(worker.worker_id.as_ref()).map_err(SourceError::WorkerId)?;
    let dp_rank = worker
        .dp_rank
        .as_ref()
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or(SourceError::DpRank)?;
    Ok(EventSource { worker_id, dp_rank })
}

/// Reads a nested object's fields; `missing` when it is absent, `null`, not an object or not
/// readable (a repeated field).
fn object<'a, T: Deserialize<'a>>(
    raw: Option<&'a RawValue>,
    missing: SourceError,
) -> Result<T, SourceError> {
    match raw {
        Some(raw) if raw.get().starts_with('{') => {
            serde_json::from_str(raw.get()).map_err(|_| missing)
        }
        _ => Err(missing),
    }
}

fn same_publisher(key: PublisherId, found: PublisherId) -> Result<(), SourceError> {
    if key == found {
        Ok(())
    } else {
        Err(SourceError::PublisherMismatch { key, found })
    }
}
