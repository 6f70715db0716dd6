//! The `kubernetes` (metadata) discovery source, the pure part: `DynamoWorkerMetadata`
//! resources joined with EndpointSlice readiness, turned into the record diffs the etcd reducer
//! consumes (DISC-K8S-META-01..23).
//!
//! The watcher (in `control/`) lists and watches both collections, reads each resource with
//! [`read_resource`] and each slice with [`slice_facts`], and feeds them to one [`MetaJoin`]
//! for its lifetime. The join answers every change with [`RecordChange`]s: puts of records
//! that appeared or changed and deletes of keys no resource supplies any more. A re-list
//! ([`MetaJoin::replace_all`]) gives the whole state instead, which the watcher feeds as an etcd
//! resync (begin, put everything, end), so what vanished during the gap is deleted.
//!
//! Invariants:
//! - a resource's records are supplied exactly while it is held and some selected slice lists
//!   its Pod ready (DISC-K8S-META-05, -13);
//! - a modified resource or slice sends only what changed (DISC-K8S-META-14, -15);
//! - a key several resources supply stays until the last of them goes; its value is the one of
//!   the first supplier by name (DISC-K8S-META-17);
//! - a rejected update of a held resource with the same `uid` keeps its last valid records
//!   (DISC-K8S-META-18); a rejection is reported once per (uid, resourceVersion, kind);
//! - at most [`MAX_RESOURCES`] resources and [`MAX_TOTAL_RECORD_BYTES`] of records are held;
//!   beyond either, new resources are rejected as `malformed` (DISC-K8S-META-23); at most
//!   [`MAX_SLICES`] slices are held, the rest refused.

mod resource;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

pub use resource::{
    Body, MAX_ENTRIES_PER_RESOURCE, MAX_KEY_BYTES, MAX_META_TOKEN, MAX_SLICE_ENDPOINTS,
    NamespaceFilter, ObjectError, Record, Resource, SliceError, SliceFacts, object_name,
    read_resource, slice_facts,
};

use super::diag::DiscoveryEventKind;

/// Most resources held (DISC-K8S-META-20, -23).
pub const MAX_RESOURCES: usize = 16_384;
/// Most EndpointSlices held (DISC-K8S-META-20).
pub const MAX_SLICES: usize = 16_384;
/// Most record bytes (keys and values) held over all resources (DISC-K8S-META-23).
pub const MAX_TOTAL_RECORD_BYTES: usize = 256 * 1024 * 1024;
/// Resources asked for per list page (DISC-K8S-META-20).
pub const RESOURCE_PAGE: u32 = 32;
/// EndpointSlices asked for per list page (DISC-K8S-META-20).
pub const SLICE_PAGE: u32 = 500;
/// The EndpointSlices whose endpoints say which workers are ready (DISC-K8S-META-05).
pub const SLICE_SELECTOR: &str =
    "nvidia.com/dynamo-discovery-backend=kubernetes,nvidia.com/dynamo-discovery-enabled=true";

/// The resources' collection path in `namespace`.
pub fn resources_path(namespace: &str) -> String {
    format!("/apis/nvidia.com/v1alpha1/namespaces/{namespace}/dynamoworkermetadatas")
}

/// The EndpointSlices' collection path in `namespace`.
pub fn slices_path(namespace: &str) -> String {
    format!("/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices")
}

/// A record key (`v1/...`).
pub type KeyBytes = Box<[u8]>;
/// A record value, shared between the resource that supplies it and the join's state.
pub type ValueBytes = Arc<[u8]>;
/// Every supplied key with its value, in key order: what a re-list feeds.
pub type State = Vec<(KeyBytes, ValueBytes)>;
/// Per key, the value each supplying resource (by name) gives it.
type Suppliers = BTreeMap<String, ValueBytes>;

/// One change for the reducer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordChange {
    /// The key now has this value.
    Put(Box<[u8]>, Arc<[u8]>),
    /// No resource supplies the key any more.
    Delete(Box<[u8]>),
}

/// A resource or slice the join did not take, to be logged and counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The resource or slice name.
    pub name: String,
    /// The counter it goes to.
    pub kind: DiscoveryEventKind,
    /// Why.
    pub reason: String,
}

#[derive(Debug, Clone)]
struct Held {
    uid: String,
    records: Arc<[Record]>,
    bytes: usize,
}

type Mark = (String, String, DiscoveryEventKind);

/// The caps a join enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most resources held.
    pub resources: usize,
    /// Most record bytes held.
    pub bytes: usize,
    /// Most slices held.
    pub slices: usize,
}

impl Default for Limits {
    /// The spec's: [`MAX_RESOURCES`], [`MAX_TOTAL_RECORD_BYTES`], [`MAX_SLICES`].
    fn default() -> Self {
        Self {
            resources: MAX_RESOURCES,
            bytes: MAX_TOTAL_RECORD_BYTES,
            slices: MAX_SLICES,
        }
    }
}

/// The join. One per watcher, kept across re-lists.
#[derive(Debug, Default)]
pub struct MetaJoin {
    limits: Limits,
    held: BTreeMap<String, Held>,
    bytes: usize,
    /// The last rejection reported per resource name.
    marks: BTreeMap<String, Mark>,
    /// Ready Pod names per slice.
    slices: BTreeMap<String, BTreeSet<String>>,
    /// Per Pod, how many slices list it ready.
    ready: BTreeMap<String, usize>,
    /// Per key, the value each supplying resource gives it.
    supply: BTreeMap<KeyBytes, Suppliers>,
    rejections: Vec<Rejection>,
}

impl MetaJoin {
    /// An empty join with the spec's caps.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty join with other caps (tests).
    pub fn with_limits(limits: Limits) -> Self {
        Self {
            limits,
            ..Self::default()
        }
    }

    /// Its caps.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Resources held (valid records kept).
    pub fn resources(&self) -> usize {
        self.held.len()
    }

    /// Record bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Slices held.
    pub fn slices(&self) -> usize {
        self.slices.len()
    }

    /// Keys supplied to the reducer now.
    pub fn keys(&self) -> usize {
        self.supply.len()
    }

    /// What was rejected since the last call.
    pub fn take_rejections(&mut self) -> Vec<Rejection> {
        std::mem::take(&mut self.rejections)
    }

    /// Every key and value supplied now (the state a re-list feeds).
    pub fn state(&self) -> State {
        self.supply
            .iter()
            .filter_map(|(k, s)| Some((k.clone(), effective(s)?.clone())))
            .collect()
    }

    fn is_ready(&self, name: &str) -> bool {
        self.ready.get(name).is_some_and(|n| *n > 0)
    }

    /// A resource was added or modified.
    pub fn upsert(&mut self, r: Resource) -> Vec<RecordChange> {
        let mut out = Vec::new();
        match r.body {
            Body::Valid(records) => {
                let size: usize = records.iter().map(Record::size).sum();
                let old = self.held.get(&r.name);
                let old_bytes = old.map_or(0, |h| h.bytes);
                let lim = self.limits;
                let over = if old.is_none() && self.held.len() >= lim.resources {
                    Some(format!("more than {} resources", lim.resources))
                } else if self.bytes - old_bytes + size > lim.bytes {
                    Some(format!("records over the {}-byte total", lim.bytes))
                } else {
                    None
                };
                if let Some(reason) = over {
                    // Caps are not content: counted every time, never marked.
                    self.rejections.push(Rejection {
                        name: r.name.clone(),
                        kind: DiscoveryEventKind::Malformed,
                        reason,
                    });
                    self.drop_other_incarnation(&r.name, &r.uid, &mut out);
                    return out;
                }
                self.marks.remove(&r.name);
                let old = self.held.insert(
                    r.name.clone(),
                    Held {
                        uid: r.uid,
                        records: records.clone(),
                        bytes: size,
                    },
                );
                self.bytes = self.bytes - old_bytes + size;
                if self.is_ready(&r.name) {
                    let old = old.map(|h| h.records);
                    self.resupply(&r.name, old.as_deref().unwrap_or(&[]), &records, &mut out);
                }
            }
            Body::Bad { kind, reason } => {
                self.reject(&r.name, &r.uid, &r.version, kind, reason);
                if kind == DiscoveryEventKind::Refused {
                    self.remove(&r.name, &mut out);
                } else {
                    self.drop_other_incarnation(&r.name, &r.uid, &mut out);
                }
            }
        }
        out
    }

    /// A resource was deleted.
    pub fn remove_resource(&mut self, name: &str) -> Vec<RecordChange> {
        let mut out = Vec::new();
        self.marks.remove(name);
        self.remove(name, &mut out);
        out
    }

    /// A slice was added or modified.
    pub fn upsert_slice(&mut self, s: SliceFacts) -> Vec<RecordChange> {
        let mut out = Vec::new();
        if !self.slices.contains_key(&s.name) && self.slices.len() >= self.limits.slices {
            self.rejections.push(Rejection {
                name: s.name,
                kind: DiscoveryEventKind::Refused,
                reason: format!("more than {} EndpointSlices", self.limits.slices),
            });
            return out;
        }
        let old = self
            .slices
            .insert(s.name, s.ready.clone())
            .unwrap_or_default();
        self.apply_readiness(&old, &s.ready, &mut out);
        out
    }

    /// A slice was deleted.
    pub fn remove_slice(&mut self, name: &str) -> Vec<RecordChange> {
        let mut out = Vec::new();
        if let Some(old) = self.slices.remove(name) {
            self.apply_readiness(&old, &BTreeSet::new(), &mut out);
        }
        out
    }

    /// A re-list: the listed resources (in list order, which is name order) and slices replace
    /// everything. Returns the whole state to feed as a resync.
    pub fn replace_all(&mut self, resources: Vec<Resource>, slices: Vec<SliceFacts>) -> State {
        let old_held = std::mem::take(&mut self.held);
        let old_marks = std::mem::take(&mut self.marks);
        self.bytes = 0;
        self.slices.clear();
        self.ready.clear();
        self.supply.clear();
        for r in resources {
            if self.held.contains_key(&r.name) {
                continue; // a list names each object once; a repeat is ignored
            }
            if let Some(mark) = old_marks.get(&r.name) {
                self.marks.insert(r.name.clone(), mark.clone());
            }
            let carried = match &r.body {
                Body::Bad { kind, .. } if *kind != DiscoveryEventKind::Refused => {
                    old_held.get(&r.name).filter(|h| h.uid == r.uid).cloned()
                }
                _ => None,
            };
            let name = r.name.clone();
            // Nothing is ready yet: this holds or rejects, and supplies nothing.
            let _ = self.upsert(r);
            if let (Some(h), false) = (carried, self.held.contains_key(&name)) {
                // DISC-K8S-META-18 across a re-list: the last valid records stay, caps allowing.
                if self.held.len() < self.limits.resources
                    && self.bytes + h.bytes <= self.limits.bytes
                {
                    self.bytes += h.bytes;
                    self.held.insert(name, h);
                }
            }
        }
        for s in slices {
            let _ = self.upsert_slice(s);
        }
        self.state()
    }

    fn reject(
        &mut self,
        name: &str,
        uid: &str,
        version: &str,
        kind: DiscoveryEventKind,
        reason: String,
    ) {
        let mark = (uid.to_owned(), version.to_owned(), kind);
        if self.marks.get(name) == Some(&mark) {
            return;
        }
        if self.marks.len() < self.limits.resources || self.marks.contains_key(name) {
            self.marks.insert(name.to_owned(), mark);
        }
        self.rejections.push(Rejection {
            name: name.to_owned(),
            kind,
            reason,
        });
    }

    /// A rejected update: a held resource of the same uid keeps its records; one of another
    /// uid (an earlier incarnation of the name) goes.
    fn drop_other_incarnation(&mut self, name: &str, uid: &str, out: &mut Vec<RecordChange>) {
        if self.held.get(name).is_some_and(|h| h.uid != uid) {
            self.remove(name, out);
        }
    }

    fn remove(&mut self, name: &str, out: &mut Vec<RecordChange>) {
        if let Some(h) = self.held.remove(name) {
            self.bytes -= h.bytes;
            if self.is_ready(name) {
                self.resupply(name, &h.records, &[], out);
            }
        }
    }

    fn apply_readiness(
        &mut self,
        old: &BTreeSet<String>,
        new: &BTreeSet<String>,
        out: &mut Vec<RecordChange>,
    ) {
        for pod in old.difference(new) {
            let n = self.ready.entry(pod.clone()).or_default();
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.ready.remove(pod);
                if let Some(h) = self.held.get(pod) {
                    let recs = h.records.clone();
                    self.resupply(pod, &recs, &[], out);
                }
            }
        }
        for pod in new.difference(old) {
            let n = self.ready.entry(pod.clone()).or_default();
            *n += 1;
            if *n == 1
                && let Some(h) = self.held.get(pod)
            {
                let recs = h.records.clone();
                self.resupply(pod, &[], &recs, out);
            }
        }
    }

    /// Move `name`'s supply from `old` to `new` (both sorted by key), emitting what changed.
    fn resupply(
        &mut self,
        name: &str,
        old: &[Record],
        new: &[Record],
        out: &mut Vec<RecordChange>,
    ) {
        let new_keys: BTreeSet<&[u8]> = new.iter().map(|r| &*r.key).collect();
        for r in old.iter().filter(|r| !new_keys.contains(&*r.key)) {
            let Some(s) = self.supply.get_mut(&r.key) else {
                continue;
            };
            let before = effective(s).cloned();
            s.remove(name);
            match effective(s) {
                None => {
                    self.supply.remove(&r.key);
                    out.push(RecordChange::Delete(r.key.clone()));
                }
                Some(after) if before.as_deref() != Some(&**after) => {
                    out.push(RecordChange::Put(r.key.clone(), after.clone()));
                }
                Some(_) => {}
            }
        }
        for r in new {
            let s = self.supply.entry(r.key.clone()).or_default();
            let before = effective(s).cloned();
            s.insert(name.to_owned(), r.value.clone());
            if let Some(after) = effective(s)
                && before.as_deref() != Some(&**after)
            {
                out.push(RecordChange::Put(r.key.clone(), after.clone()));
            }
        }
    }
}

/// The value a key has: its first supplier's by name.
fn effective(s: &Suppliers) -> Option<&ValueBytes> {
    s.values().next()
}

#[cfg(test)]
mod diff_tests;
#[cfg(test)]
mod fixture_tests;
#[cfg(test)]
mod tests;
