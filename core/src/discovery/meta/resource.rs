//! Reading one `DynamoWorkerMetadata` resource and one EndpointSlice (DISC-K8S-META-04..06,
//! -09, -11, -18; Q-34).
//!
//! A resource's `spec.data` maps (`endpoints`, `model_cards`, `event_channels`,
//! `event_sources`) are keyed by the etcd key suffix of each record, so a record becomes the
//! etcd key `v1/instances/<key>`, `v1/mdc/<key>`, `v1/event_channels/<key>` or
//! `v1/event_sources/<key>` with the value's JSON text exactly as the server sent it: the etcd
//! reducer sees the same bytes an etcd fleet stores (DISC-K8S-META-01).
//!
//! Invariants: pure and total; every length is checked before anything is kept; a resource is
//! either accepted whole ([`Body::Valid`]) or rejected whole with its kind ([`Body::Bad`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::super::diag::DiscoveryEventKind;
use super::super::ids::{InstanceId, id_from_json, parse_hex_u64};
use super::super::keys::{
    CARDS_PREFIX, CHANNELS_PREFIX, INSTANCES_PREFIX, SOURCES_PREFIX, namespace_prefixes,
};
use super::super::pod_hash::hash_pod_name;
use super::super::pods::MAX_NAME;

/// Most records (all four maps together) one resource may carry; a worker registers a dozen.
pub const MAX_ENTRIES_PER_RESOURCE: usize = 1024;
/// Longest map key (etcd key suffix) kept.
pub const MAX_KEY_BYTES: usize = 1024;
/// Most endpoints one EndpointSlice may list (the API server's own limit is 1000).
pub const MAX_SLICE_ENDPOINTS: usize = 1000;
/// Longest `uid` or `resourceVersion` kept.
pub const MAX_META_TOKEN: usize = 256;

/// One record of a resource: its etcd key and the value's JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// `v1/<keyspace>/<map key>`.
    pub key: Box<[u8]>,
    /// The value as the server sent it.
    pub value: Arc<[u8]>,
}

impl Record {
    /// Key and value bytes together: what the size cap counts.
    pub fn size(&self) -> usize {
        self.key.len() + self.value.len()
    }
}

/// What a resource says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// Every check passed: these records (only those of the configured Dynamo namespaces),
    /// sorted by key.
    Valid(Arc<[Record]>),
    /// Rejected whole.
    Bad {
        /// `malformed`, `mismatch` or `refused`.
        kind: DiscoveryEventKind,
        /// Why, for the log.
        reason: String,
    },
}

/// One resource as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// `metadata.name` (the worker Pod's name).
    pub name: String,
    /// `metadata.uid` (empty when absent).
    pub uid: String,
    /// `metadata.resourceVersion` (empty when absent).
    pub version: String,
    /// Its records, or why there are none.
    pub body: Body,
}

impl Resource {
    /// Bytes of its records (0 when rejected).
    pub fn size(&self) -> usize {
        match &self.body {
            Body::Valid(r) => r.iter().map(Record::size).sum(),
            Body::Bad { .. } => 0,
        }
    }
}

/// Why an object could not be read at all (not even named).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// Not an object with a `metadata` object.
    #[error("not a Kubernetes object: {0}")]
    NotAnObject(String),
    /// `metadata.name` is missing, empty, not a string or longer than [`MAX_NAME`].
    #[error("the object has no usable name")]
    NoName,
}

/// Which records the configured Dynamo namespaces accept (DISC-K8S-META-06): the key must
/// start with one of the namespace's etcd prefixes, the ones the etcd source watches. For
/// instances and cards that is the first path segment; 1.6.1's event-channel and event-source
/// paths are scoped (`namespace/<ns>/component/...`), so it is the segment after `namespace`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceFilter {
    prefixes: Vec<[String; 4]>,
}

impl NamespaceFilter {
    /// The filter for these Dynamo namespaces.
    pub fn new(dynamo_namespaces: &[String]) -> Self {
        Self {
            prefixes: dynamo_namespaces
                .iter()
                .map(|ns| namespace_prefixes(ns))
                .collect(),
        }
    }

    fn accepts(&self, space: usize, key: &[u8]) -> bool {
        self.prefixes
            .iter()
            .any(|p| key.starts_with(p[space].as_bytes()))
    }
}

#[derive(Deserialize)]
struct Top<'a> {
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(borrow, default)]
    spec: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Spec<'a> {
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
}

type Map<'a> = Option<Vec<(String, &'a RawValue)>>;

#[derive(Deserialize)]
struct Data<'a> {
    #[serde(borrow, default, deserialize_with = "entries")]
    endpoints: Map<'a>,
    #[serde(borrow, default, deserialize_with = "entries")]
    model_cards: Map<'a>,
    #[serde(borrow, default, deserialize_with = "entries")]
    event_channels: Map<'a>,
    #[serde(borrow, default, deserialize_with = "entries")]
    event_sources: Map<'a>,
}

/// A JSON object (or `null`) as its entries in document order, at most
/// [`MAX_ENTRIES_PER_RESOURCE`] + 1 of them kept (one more says "too many").
fn entries<'de, D>(d: D) -> Result<Map<'de>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Map<'de>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object or null")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D2: serde::Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_any(self)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut m: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some((k, v)) = m.next_entry::<String, &'de RawValue>()? {
                if out.len() > MAX_ENTRIES_PER_RESOURCE {
                    continue; // already too many: read on without keeping
                }
                out.push((k, v));
            }
            Ok(Some(out))
        }
    }
    d.deserialize_option(V)
}

#[derive(Deserialize)]
struct IdOnly {
    #[serde(default)]
    instance_id: Option<Value>,
}

/// `metadata.name`, `uid`, `resourceVersion` and the name of the owning Pod, if any.
fn identity(meta: Option<&Value>) -> Result<(String, String, String, Option<String>), ObjectError> {
    let meta = meta
        .filter(|m| m.is_object())
        .ok_or_else(|| ObjectError::NotAnObject("no metadata object".into()))?;
    let name = match meta.get("name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() && n.len() <= MAX_NAME => n.to_owned(),
        _ => return Err(ObjectError::NoName),
    };
    let token = |k: &str| {
        meta.get(k)
            .and_then(Value::as_str)
            .filter(|s| s.len() <= MAX_META_TOKEN)
            .unwrap_or("")
            .to_owned()
    };
    let owner = meta
        .get("ownerReferences")
        .and_then(Value::as_array)
        .and_then(|refs| {
            refs.iter()
                .find(|r| r.get("kind").and_then(Value::as_str) == Some("Pod"))
        })
        .map(|r| {
            r.get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .chars()
                .take(MAX_NAME + 1)
                .collect()
        });
    Ok((name, token("uid"), token("resourceVersion"), owner))
}

/// The name of an object (for a `DELETED` event, whose object may be anything).
pub fn object_name(object: &str) -> Result<String, ObjectError> {
    #[derive(Deserialize)]
    struct MetaOnly {
        #[serde(default)]
        metadata: Option<Value>,
    }
    let m: MetaOnly =
        serde_json::from_str(object).map_err(|e| ObjectError::NotAnObject(e.to_string()))?;
    identity(m.metadata.as_ref()).map(|(name, ..)| name)
}

/// Read one `DynamoWorkerMetadata` object (its JSON text). `Err` only when it cannot even be
/// named; every other flaw is a [`Body::Bad`] of the named resource.
pub fn read_resource(object: &str, filter: &NamespaceFilter) -> Result<Resource, ObjectError> {
    let top: Top<'_> =
        serde_json::from_str(object).map_err(|e| ObjectError::NotAnObject(e.to_string()))?;
    let (name, uid, version, owner) = identity(top.metadata.as_ref())?;
    let body = body(&name, owner.as_deref(), top.spec, filter);
    Ok(Resource {
        name,
        uid,
        version,
        body,
    })
}

fn bad(kind: DiscoveryEventKind, reason: impl Into<String>) -> Body {
    Body::Bad {
        kind,
        reason: reason.into(),
    }
}

fn body(
    name: &str,
    owner: Option<&str>,
    spec: Option<&RawValue>,
    filter: &NamespaceFilter,
) -> Body {
    // Container mode (DISC-K8S-META-11): one resource per container, named `<pod>-<container>`;
    // only the one named like its Pod (pod mode, or the main container) is accepted.
    if let Some(owner) = owner
        && owner != name
    {
        return bad(
            DiscoveryEventKind::Refused,
            format!("owned by Pod {owner:?}: container discovery mode is not supported"),
        );
    }
    let Some(spec) = spec.filter(|s| s.get().starts_with('{')) else {
        return bad(DiscoveryEventKind::Malformed, "spec is not an object");
    };
    let data = match serde_json::from_str::<Spec<'_>>(spec.get()) {
        Ok(Spec { data: Some(d) }) if d.get().starts_with('{') => d,
        Ok(_) => return bad(DiscoveryEventKind::Malformed, "spec.data is not an object"),
        Err(e) => return bad(DiscoveryEventKind::Malformed, format!("spec: {e}")),
    };
    let data: Data<'_> = match serde_json::from_str(data.get()) {
        Ok(d) => d,
        Err(e) => return bad(DiscoveryEventKind::Malformed, format!("spec.data: {e}")),
    };
    let maps = [
        (INSTANCES_PREFIX, data.endpoints, true),
        (CARDS_PREFIX, data.model_cards, true),
        (CHANNELS_PREFIX, data.event_channels, false),
        // Q-34 reads "parsed and ignored"; 1.6.1 maps kv-events publishers to their
        // (worker, dp_rank) here, as etcd's `v1/event_sources/` does, so they are fed on too.
        (SOURCES_PREFIX, data.event_sources, false),
    ];
    let total: usize = maps.iter().map(|m| m.1.as_ref().map_or(0, Vec::len)).sum();
    if total > MAX_ENTRIES_PER_RESOURCE {
        return bad(
            DiscoveryEventKind::Malformed,
            format!("more than {MAX_ENTRIES_PER_RESOURCE} records"),
        );
    }
    let id = hash_pod_name(name);
    let mut records = Vec::with_capacity(total);
    for (space, (prefix, map, checked)) in maps.into_iter().enumerate() {
        for (k, v) in map.unwrap_or_default() {
            if k.is_empty() || k.len() > MAX_KEY_BYTES {
                return bad(
                    DiscoveryEventKind::Malformed,
                    format!("a record key is empty or longer than {MAX_KEY_BYTES} bytes"),
                );
            }
            if checked && let Err(why) = check_id(&k, v, id) {
                return bad(
                    DiscoveryEventKind::Mismatch,
                    format!("{prefix}{k}: {why} (the Pod name gives {id})"),
                );
            }
            let mut key = Vec::with_capacity(prefix.len() + k.len());
            key.extend_from_slice(prefix.as_bytes());
            key.extend_from_slice(k.as_bytes());
            if !filter.accepts(space, &key) {
                continue;
            }
            records.push(Record {
                key: key.into_boxed_slice(),
                value: Arc::from(v.get().as_bytes()),
            });
        }
    }
    records.sort_by(|a, b| a.key.cmp(&b.key));
    records.dedup_by(|a, b| a.key == b.key);
    Body::Valid(records.into())
}

/// DISC-K8S-META-09: the id in the key's fourth segment and the value's `instance_id` are both
/// `id`.
fn check_id(key: &str, value: &RawValue, id: InstanceId) -> Result<(), String> {
    let seg = key
        .split('/')
        .nth(3)
        .ok_or_else(|| "the key has no id segment".to_owned())?;
    let in_key = parse_hex_u64(seg).map_err(|_| format!("key id {seg:?} is not hex"))?;
    if in_key != id.get() {
        return Err(format!("key id {in_key:x}"));
    }
    let v: IdOnly =
        serde_json::from_str(value.get()).map_err(|_| "the value is not an object".to_owned())?;
    let in_value = id_from_json(v.instance_id.as_ref())
        .map_err(|e| format!("value instance_id unreadable: {e}"))?;
    if in_value != id.get() {
        return Err(format!("value instance_id {in_value}"));
    }
    Ok(())
}

/// What the join reads of one EndpointSlice: its name and the Pods it lists ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceFacts {
    /// `metadata.name`.
    pub name: String,
    /// `targetRef.name` of every endpoint with `conditions.ready: true` (DISC-K8S-META-05).
    pub ready: BTreeSet<String>,
}

/// Why an EndpointSlice was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SliceError {
    /// No name, or not an object.
    #[error(transparent)]
    Object(#[from] ObjectError),
    /// `endpoints` is not an array, or has more than [`MAX_SLICE_ENDPOINTS`] entries.
    #[error("endpoints is not an array of at most {MAX_SLICE_ENDPOINTS}")]
    Endpoints,
}

/// Read one EndpointSlice object. An endpoint counts only with `conditions.ready` exactly
/// `true` (absent or `null` is not ready) and a `targetRef.name`.
pub fn slice_facts(slice: &Value) -> Result<SliceFacts, SliceError> {
    if !slice.is_object() {
        return Err(ObjectError::NotAnObject("not an object".into()).into());
    }
    let (name, ..) = identity(slice.get("metadata"))?;
    let endpoints = match slice.get("endpoints") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(a)) if a.len() <= MAX_SLICE_ENDPOINTS => a.as_slice(),
        Some(_) => return Err(SliceError::Endpoints),
    };
    let ready = endpoints
        .iter()
        .filter(|e| {
            e.get("conditions")
                .and_then(|c| c.get("ready"))
                .and_then(Value::as_bool)
                == Some(true)
        })
        .filter_map(|e| e.get("targetRef")?.get("name")?.as_str())
        .filter(|n| !n.is_empty() && n.len() <= MAX_NAME)
        .map(str::to_owned)
        .collect();
    Ok(SliceFacts { name, ready })
}
