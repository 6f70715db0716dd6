//! Parsing of the three record kinds found under the watched prefixes.
//!
//! Role: turn one untrusted etcd value into a typed record: an Endpoint record
//! ([`InstanceRecord`]), a Model record ([`CardRecord`]) or an EventChannel record
//! ([`ChannelClass`]); EventSource records are read by `discovery::sources`, whose errors ([`SourceError`]) live here. Shapes follow ai-dynamo/dynamo `DiscoveryInstance`, `ModelDeploymentCard`,
//! `ModelRuntimeConfig` and `EventTransport`.
//!
//! Invariants:
//! - every field is optional and unknown fields are ignored (DISC-REC-13/14); only a missing or
//!   invalid `instance_id`, invalid JSON, a non-object value or a foreign `type` reject a record;
//! - typed card fields are read one by one, so a bad field only blanks that field and the card is
//!   kept whole (DISC-REC-16/17); the card is wrapped in an `Arc` here, once (DISC-REC-19);
//! - ids are exact u64 (numbers) or hex (strings);
//! - the namespace inside a payload is never read (DISC-MULTI-04).

use std::io;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use thiserror::Error;

use super::MAX_RETAINED_CARD_BYTES;
use super::fleet::{
    Capacity, CardJson, DisaggregatedEndpoint, Family, RequestTransport, TcpTarget,
};
use super::ids::{IdError, InstanceId, PublisherId};
use super::keys::KeyError;

/// Why a record was skipped as malformed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MalformedReason {
    /// The key under a watched prefix does not follow its layout.
    #[error("bad key: {0}")]
    Key(#[from] KeyError),
    /// The value exceeds `MAX_RECORD_BYTES` and was not parsed (DISC-MEM-02).
    #[error("value of {0} bytes exceeds MAX_RECORD_BYTES")]
    TooLarge(usize),
    /// The value is not JSON.
    #[error("value is not valid JSON")]
    Json,
    /// The value is JSON but not an object.
    #[error("value is not a JSON object")]
    NotObject,
    /// The `type` tag names another record kind.
    #[error("record type {0:?} does not belong under this prefix")]
    ForeignType(String),
    /// `instance_id` is missing or not an id.
    #[error("instance_id: {0}")]
    Id(IdError),
    /// An event channel without a usable `transport` object.
    #[error("event channel has no transport kind")]
    NoTransport,
    /// A `Zmq` channel whose endpoint is not `tcp://host:port`.
    #[error("event channel endpoint is not tcp://host:port")]
    NotTcp,
    /// The channel's `topic` differs from the topic in its key.
    #[error("event channel topic differs from its key")]
    TopicMismatch,
    /// An event-source record that cannot be trusted (see [`SourceError`]).
    #[error("event source {0}")]
    Source(#[from] SourceError),
}

/// Why an EventSource record is malformed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SourceError {
    /// `topic` is missing or is not `kv-events`.
    #[error("topic is not kv-events")]
    Topic,
    /// The top-level `publisher_id` is missing or not an id.
    #[error("publisher_id: {0}")]
    PublisherId(IdError),
    /// `metadata.publisher_id` is present but not an id.
    #[error("metadata.publisher_id: {0}")]
    MetadataPublisherId(IdError),
    /// A `publisher_id` of the value names another publisher than the key.
    #[error("publisher_id {found} differs from the key's {key}")]
    PublisherMismatch {
        /// The publisher id of the key.
        key: PublisherId,
        /// The publisher id found in the value.
        found: PublisherId,
    },
    /// `metadata` is missing, not an object, or repeats a field.
    #[error("metadata is missing or not an object")]
    NoMetadata,
    /// `metadata.worker` is missing, not an object, or repeats a field.
    #[error("metadata.worker is missing or not an object")]
    NoWorker,
    /// `metadata.worker.worker_id` is missing or not an id.
    #[error("metadata.worker.worker_id: {0}")]
    WorkerId(IdError),
    /// `metadata.worker.dp_rank` is missing or not an integer in `0..=u32::MAX`.
    #[error("metadata.worker.dp_rank is missing or not a u32")]
    DpRank,
}

/// What about a channel the router does not support (LOAD-CHAN-07, Q-20).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unsupported {
    /// A transport kind other than `Zmq` (`ZmqBroker`, `Nats`, anything unknown).
    Transport(String),
    /// A scope kind other than `namespace`, `component`, `endpoint`.
    ScopeKind(String),
}

/// A parsed Endpoint record (`v1/instances/...`).
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceRecord {
    /// The claimed instance id (from the value, DISC-DUP-01).
    pub instance_id: InstanceId,
    /// `component`, empty when absent.
    pub component: String,
    /// `endpoint`, empty when absent.
    pub endpoint: String,
    /// Request-plane transport, internal.
    pub transport: Option<RequestTransport>,
}

/// The card's `worker_type` claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerTypeClaim {
    /// No `worker_type` field: upstream's default, aggregated.
    Absent,
    /// `prefill` (any case).
    Prefill,
    /// `decode` (any case).
    Decode,
    /// `aggregated` (any case).
    Aggregated,
    /// Any other value, including upstream's `encode`: no role claim (DISC-REC-15).
    Unrecognised,
}

/// The typed fields of a model card.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CardFields {
    /// `display_name`.
    pub display_name: Option<String>,
    /// `worker_type`.
    pub worker_type: Option<WorkerTypeClaim>,
    /// `kv_cache_block_size`.
    pub block_size: Option<u32>,
    /// `runtime_config` capacity figures.
    pub capacity: Capacity,
    /// `runtime_config.data_parallel_start_rank`.
    pub dp_start_rank: Option<u32>,
    /// `runtime_config.data_parallel_size`.
    pub dp_size: Option<u32>,
    /// `runtime_config.disaggregated_endpoint`.
    pub disaggregated_endpoint: Option<DisaggregatedEndpoint>,
    /// Release-version strings found in the card, `(field, value)` (DISC-REC-18).
    pub versions: Vec<(String, String)>,
    /// Names of typed fields present with a type or range that could not be read.
    pub bad_fields: Vec<&'static str>,
    /// The card carries a non-empty `model_suffix` (a LoRA card, DISC-REC-07).
    pub lora_suffix: bool,
}

impl CardFields {
    /// The claim as read, `Absent` when the field is missing.
    pub fn claim(&self) -> WorkerTypeClaim {
        self.worker_type.unwrap_or(WorkerTypeClaim::Absent)
    }
}

/// A parsed Model record (`v1/mdc/...`).
#[derive(Debug, Clone, PartialEq)]
pub struct CardRecord {
    /// The claimed instance id.
    pub instance_id: InstanceId,
    /// `component`; empty for legacy cards (DISC-REC-06).
    pub component: String,
    /// `endpoint`; empty for legacy cards.
    pub endpoint: String,
    /// A non-empty `model_suffix` (record, card or key): a LoRA card, never joined (DISC-REC-07).
    pub lora: bool,
    /// Typed fields.
    pub fields: CardFields,
    /// The opaque card, dropped above `MAX_RETAINED_CARD_BYTES` (DISC-MEM-03).
    pub card: Option<CardJson>,
    /// Whether the opaque card was dropped for its size.
    pub card_dropped: bool,
    /// Whether the record carried a `card_json` at all; without one the worker has no card.
    pub has_card_json: bool,
}

impl CardRecord {
    /// Whether the card is legacy-unscoped (empty component and endpoint).
    pub fn is_legacy(&self) -> bool {
        self.component.is_empty() && self.endpoint.is_empty()
    }
}

/// The outcome of classifying an EventChannel record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelClass {
    /// A direct `Zmq` channel with a `tcp://` endpoint on a subscribed topic.
    Subscribe {
        /// Topic family.
        family: Family,
        /// Publisher id from the value.
        publisher_id: PublisherId,
        /// Where to connect.
        tcp: TcpTarget,
    },
    /// A topic the router does not subscribe to: skipped with no log and no count (LOAD-CHAN-08).
    Silent,
    /// Skipped, logged once, counted `unsupported`.
    Unsupported(Unsupported),
    /// Skipped, logged once, counted `malformed`.
    Malformed(MalformedReason),
}

/// Shortens an untrusted string for diagnostics (at most 128 bytes, on a char boundary).
pub fn clip(s: &str) -> String {
    const MAX: usize = 128;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", s.get(..end).unwrap_or(""))
}

/// The top-level fields of the small records (Endpoint, EventChannel) the router reads; anything
/// else in the record is skipped without building a tree.
#[derive(Deserialize)]
struct RecordFields {
    #[serde(rename = "type", default)]
    kind: Option<Value>,
    #[serde(default)]
    instance_id: Option<Value>,
    #[serde(default)]
    component: Option<Value>,
    #[serde(default)]
    endpoint: Option<Value>,
    #[serde(default)]
    transport: Option<Value>,
    #[serde(default)]
    topic: Option<Value>,
    #[serde(default)]
    scope: Option<Value>,
}

/// Parse a record's top-level fields; a value that is not a JSON object is refused as such (a
/// derived struct would otherwise also accept an array).
fn record_fields(value: &[u8]) -> Result<RecordFields, MalformedReason> {
    expect_object(value)?;
    serde_json::from_slice(value).map_err(|_| MalformedReason::Json)
}

/// Refuses a value that does not start like a JSON object: `NotObject` when it is other JSON,
/// `Json` when it is not JSON at all.
pub(super) fn expect_object(value: &[u8]) -> Result<(), MalformedReason> {
    let first = value.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'{') {
        return Ok(());
    }
    Err(
        if serde_json::from_slice::<serde::de::IgnoredAny>(value).is_ok() {
            MalformedReason::NotObject
        } else {
            MalformedReason::Json
        },
    )
}

pub(super) fn type_is(kind: Option<&Value>, expected: &str) -> Result<(), MalformedReason> {
    match kind {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(t)) if t == expected => Ok(()),
        Some(Value::String(t)) => Err(MalformedReason::ForeignType(clip(t))),
        Some(_) => Err(MalformedReason::ForeignType(String::from("<non-string>"))),
    }
}

fn string_of(v: Option<Value>) -> String {
    match v {
        Some(Value::String(s)) => s,
        _ => String::new(),
    }
}

/// Parses an Endpoint record (DISC-REC-02/11).
pub fn parse_instance(value: &[u8]) -> Result<InstanceRecord, MalformedReason> {
    let rec = record_fields(value)?;
    type_is(rec.kind.as_ref(), "Endpoint")?;
    let instance_id =
        InstanceId::from_json(rec.instance_id.as_ref()).map_err(MalformedReason::Id)?;
    let transport = match &rec.transport {
        Some(Value::Object(t)) => t.iter().next().map(|(kind, v)| match (kind.as_str(), v) {
            ("tcp", Value::String(addr)) => RequestTransport::Tcp(addr.clone()),
            _ => RequestTransport::Other {
                kind: kind.clone(),
                value: v.to_string(),
            },
        }),
        _ => None,
    };
    Ok(InstanceRecord {
        instance_id,
        component: string_of(rec.component),
        endpoint: string_of(rec.endpoint),
        transport,
    })
}

/// The Model record's own fields; `card_json` is kept as raw text, everything else in the record
/// is skipped without building a tree.
#[derive(Deserialize)]
struct ModelRecordFields<'a> {
    #[serde(rename = "type", default)]
    kind: Option<Value>,
    #[serde(default)]
    instance_id: Option<Value>,
    #[serde(default)]
    component: Option<Value>,
    #[serde(default)]
    endpoint: Option<Value>,
    #[serde(default)]
    model_suffix: Option<Value>,
    #[serde(default, borrow)]
    card_json: Option<&'a RawValue>,
}

/// The card fields the router reads; the rest of the card is skipped while parsing.
#[derive(Deserialize, Default)]
struct CardTypedFields {
    #[serde(default)]
    display_name: Option<Value>,
    #[serde(default)]
    worker_type: Option<Value>,
    #[serde(default)]
    kv_cache_block_size: Option<Value>,
    #[serde(default)]
    context_length: Option<Value>,
    #[serde(default)]
    runtime_config: Option<Value>,
    #[serde(default)]
    model_suffix: Option<Value>,
    #[serde(default)]
    dynamo_version: Option<Value>,
    #[serde(default)]
    runtime_version: Option<Value>,
    #[serde(default)]
    version: Option<Value>,
    #[serde(default)]
    release: Option<Value>,
}

impl CardTypedFields {
    /// The present fields as a small object, for the lenient per-field readers.
    fn into_map(self) -> Value {
        let mut m = Map::new();
        let pairs = [
            ("display_name", self.display_name),
            ("worker_type", self.worker_type),
            ("kv_cache_block_size", self.kv_cache_block_size),
            ("context_length", self.context_length),
            ("runtime_config", self.runtime_config),
            ("model_suffix", self.model_suffix),
            ("dynamo_version", self.dynamo_version),
            ("runtime_version", self.runtime_version),
            ("version", self.version),
            ("release", self.release),
        ];
        for (k, v) in pairs {
            if let Some(v) = v {
                m.insert(k.to_owned(), v);
            }
        }
        Value::Object(m)
    }
}

/// The typed fields of a card given as JSON text: only the fields the router reads are
/// materialised. A card that is not an object, or that the typed pass cannot read (e.g. a
/// duplicated field), falls back to the full lenient reading of a parsed tree.
fn card_fields_of_text(text: &str) -> CardFields {
    if !text.trim_start().starts_with('{') {
        let mut f = CardFields::default();
        f.bad_fields.push("card_json");
        return f;
    }
    match serde_json::from_str::<CardTypedFields>(text) {
        Ok(t) => card_fields(&t.into_map()),
        Err(_) => serde_json::from_str::<Value>(text)
            .map(|v| card_fields(&v))
            .unwrap_or_else(|_| {
                let mut f = CardFields::default();
                f.bad_fields.push("card_json");
                f
            }),
    }
}

/// Parses a Model record (DISC-REC-03/06/07/13..19). `key_suffix` is the LoRA suffix segment of
/// the key, if any. The card is kept as its JSON text (a string-encoded legacy card is decoded
/// first), sized by that text against `MAX_RETAINED_CARD_BYTES`, and wrapped in an `Arc` once.
pub fn parse_card(value: &[u8], key_suffix: bool) -> Result<CardRecord, MalformedReason> {
    let rec: ModelRecordFields<'_> = match serde_json::from_slice(value) {
        Ok(r) => r,
        Err(e) if e.classify() == serde_json::error::Category::Data => {
            return Err(MalformedReason::NotObject);
        }
        Err(_) => return Err(MalformedReason::Json),
    };
    type_is(rec.kind.as_ref(), "Model")?;
    let instance_id =
        InstanceId::from_json(rec.instance_id.as_ref()).map_err(MalformedReason::Id)?;
    let card: Option<Box<RawValue>> = match rec.card_json {
        None => None,
        Some(raw) if raw.get() == "null" => None,
        Some(raw) if raw.get().starts_with('"') => serde_json::from_str::<String>(raw.get())
            .ok()
            .and_then(|text| RawValue::from_string(text).ok()),
        Some(raw) => Some(raw.to_owned()),
    };
    let has_card_json = card.is_some();
    let fields = card
        .as_deref()
        .map(|c| card_fields_of_text(c.get()))
        .unwrap_or_default();
    let lora = key_suffix || nonempty_str(rec.model_suffix.as_ref()) || fields.lora_suffix;
    let (card, card_dropped) = match card {
        Some(c) if c.get().len() > MAX_RETAINED_CARD_BYTES => (None, true),
        Some(c) => (Some(CardJson::new(c)), false),
        None => (None, false),
    };
    Ok(CardRecord {
        instance_id,
        component: string_of(rec.component),
        endpoint: string_of(rec.endpoint),
        lora,
        fields,
        card,
        card_dropped,
        has_card_json,
    })
}

fn nonempty_str(v: Option<&Value>) -> bool {
    matches!(v, Some(Value::String(s)) if !s.is_empty())
}

struct CountingWriter(usize);

impl io::Write for CountingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 = self.0.saturating_add(buf.len());
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The compact JSON size of a value, computed without allocating the text.
pub fn json_len(v: &Value) -> usize {
    let mut w = CountingWriter(0);
    match serde_json::to_writer(&mut w, v) {
        Ok(()) => w.0,
        Err(_) => usize::MAX,
    }
}

/// Reads the typed card fields leniently.
pub fn card_fields(card: &Value) -> CardFields {
    let mut f = CardFields::default();
    let Value::Object(card) = card else {
        f.bad_fields.push("card_json");
        return f;
    };
    f.lora_suffix = nonempty_str(card.get("model_suffix"));
    f.display_name = typed(card, "display_name", &mut f.bad_fields, |v| {
        v.as_str().map(str::to_owned)
    });
    f.worker_type = typed(card, "worker_type", &mut f.bad_fields, |v| {
        v.as_str().map(worker_type_claim)
    });
    f.block_size = typed(card, "kv_cache_block_size", &mut f.bad_fields, as_u32);
    let top_context = typed(card, "context_length", &mut f.bad_fields, Value::as_u64);
    match card.get("runtime_config") {
        Some(Value::Object(rc)) => {
            let bad = &mut f.bad_fields;
            f.capacity = Capacity {
                total_kv_blocks: typed(rc, "total_kv_blocks", bad, Value::as_u64),
                max_num_batched_tokens: typed(rc, "max_num_batched_tokens", bad, Value::as_u64),
                max_num_seqs: typed(rc, "max_num_seqs", bad, Value::as_u64),
                context_length: typed(rc, "context_length", bad, Value::as_u64).or(top_context),
            };
            f.dp_start_rank = typed(rc, "data_parallel_start_rank", bad, as_u32);
            f.dp_size = typed(rc, "data_parallel_size", bad, as_u32);
            f.disaggregated_endpoint =
                typed(rc, "disaggregated_endpoint", bad, disaggregated_endpoint);
        }
        None | Some(Value::Null) => f.capacity.context_length = top_context,
        Some(_) => {
            f.bad_fields.push("runtime_config");
            f.capacity.context_length = top_context;
        }
    }
    for name in ["dynamo_version", "runtime_version", "version", "release"] {
        if let Some(Value::String(v)) = card.get(name) {
            f.versions.push((name.to_owned(), clip(v)));
        }
    }
    f
}

/// Reads one field: absent or `null` gives `None`; a present value `read` rejects is recorded.
fn typed<T>(
    map: &Map<String, Value>,
    name: &'static str,
    bad: &mut Vec<&'static str>,
    read: impl FnOnce(&Value) -> Option<T>,
) -> Option<T> {
    match map.get(name) {
        None | Some(Value::Null) => None,
        Some(v) => {
            let out = read(v);
            if out.is_none() {
                bad.push(name);
            }
            out
        }
    }
}

fn as_u32(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

fn disaggregated_endpoint(v: &Value) -> Option<DisaggregatedEndpoint> {
    match v {
        Value::String(s) => Some(DisaggregatedEndpoint::Path(s.clone())),
        Value::Object(o) => Some(DisaggregatedEndpoint::Bootstrap {
            host: o
                .get("bootstrap_host")
                .and_then(Value::as_str)
                .map(str::to_owned),
            port: o
                .get("bootstrap_port")
                .and_then(Value::as_u64)
                .and_then(|p| u16::try_from(p).ok()),
        }),
        _ => None,
    }
}

/// Maps a `worker_type` string, case-insensitively, to a claim.
pub fn worker_type_claim(s: &str) -> WorkerTypeClaim {
    if s.eq_ignore_ascii_case("prefill") {
        WorkerTypeClaim::Prefill
    } else if s.eq_ignore_ascii_case("decode") {
        WorkerTypeClaim::Decode
    } else if s.eq_ignore_ascii_case("aggregated") {
        WorkerTypeClaim::Aggregated
    } else {
        WorkerTypeClaim::Unrecognised
    }
}

/// Classifies an EventChannel record (LOAD-CHAN-04..08, Q-20). `key_topic` is the decoded topic
/// of its key; topics other than `kv_metrics` and `kv-events` are skipped before parsing.
pub fn classify_channel(key_topic: &str, value: &[u8]) -> ChannelClass {
    let Some(family) = Family::from_topic(key_topic) else {
        return ChannelClass::Silent;
    };
    let rec = match record_fields(value)
        .and_then(|r| type_is(r.kind.as_ref(), "EventChannel").map(|()| r))
    {
        Ok(r) => r,
        Err(r) => return ChannelClass::Malformed(r),
    };
    match &rec.topic {
        Some(Value::String(t)) if t != key_topic => {
            return ChannelClass::Malformed(MalformedReason::TopicMismatch);
        }
        _ => {}
    }
    if let Some(kind) = rec.scope.as_ref().and_then(|s| s.get("kind")) {
        let known = matches!(kind.as_str(), Some("namespace" | "component" | "endpoint"));
        if !known {
            let what = kind
                .as_str()
                .map_or_else(|| String::from("<non-string>"), clip);
            return ChannelClass::Unsupported(Unsupported::ScopeKind(what));
        }
    }
    let publisher_id = match PublisherId::from_json(rec.instance_id.as_ref()) {
        Ok(id) => id,
        Err(e) => return ChannelClass::Malformed(MalformedReason::Id(e)),
    };
    let Some(transport) = rec.transport.as_ref().and_then(Value::as_object) else {
        return ChannelClass::Malformed(MalformedReason::NoTransport);
    };
    match transport.get("kind").and_then(Value::as_str) {
        Some("Zmq") => {}
        Some(other) => return ChannelClass::Unsupported(Unsupported::Transport(clip(other))),
        None => return ChannelClass::Malformed(MalformedReason::NoTransport),
    }
    let endpoint = transport
        .get("config")
        .and_then(|c| c.get("endpoint"))
        .and_then(Value::as_str);
    match endpoint.and_then(parse_tcp) {
        Some(tcp) => ChannelClass::Subscribe {
            family,
            publisher_id,
            tcp,
        },
        None => ChannelClass::Malformed(MalformedReason::NotTcp),
    }
}

/// Parses `tcp://host:port` (IPv6 in brackets); wildcard hosts and port 0 are refused.
pub fn parse_tcp(endpoint: &str) -> Option<TcpTarget> {
    let rest = endpoint.strip_prefix("tcp://")?;
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        (host, after.strip_prefix(':')?)
    } else {
        let (host, port) = rest.rsplit_once(':')?;
        if host.contains(':') {
            return None;
        }
        (host, port)
    };
    if host.is_empty() || host == "*" || host.contains(['/', ' ']) {
        return None;
    }
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let port: u16 = port.parse().ok()?;
    if port == 0 {
        return None;
    }
    Some(TcpTarget {
        host: host.to_owned(),
        port,
    })
}

#[cfg(test)]
#[path = "records_tests.rs"]
mod tests;
