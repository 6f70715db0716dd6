//! The discovery reducer: etcd events in, immutable fleet views out.
//!
//! Role: hold every record under the watched prefixes by etcd key, apply puts and deletes, run
//! clear-and-resync passes and materialise [`FleetView`]s. It is a pure, deterministic state
//! machine (API-09): no I/O, no clock (time is passed in), no randomness, no logging (typed
//! [`Diagnostic`]s and [`EventCounts`] instead).
//!
//! Invariants:
//! - caps are checked before parsing: a new key beyond `MAX_RECORDS_PER_KEYSPACE` is refused (one
//!   diagnostic per keyspace and pass; event sources are a keyspace of their own), a value above
//!   `MAX_RECORD_BYTES` is never parsed;
//! - an event source only ever annotates the kv-events publisher of the channel key with its
//!   suffix: it creates no publisher, and a malformed or deleted one leaves `source: None`;
//! - a put whose bytes equal the held value changes nothing (heartbeats, idempotent resyncs);
//! - a resync keeps `first_seen` per worker; keys absent from the new pass are gone at its end
//!   (DISC-ETCD-04/07); no view is built from a half-applied pass;
//! - [`Reducer::materialize`] returns the previous `Arc` (pointer-equal) whenever the view did not
//!   change, so callers bump the generation only on `!Arc::ptr_eq` (DISC-ETCD-11, API-08).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::diag::{Diagnostic, EventCounts, Sink};
use super::fleet::{EventSource, Family, FleetView};
use super::held::{ChannelRec, Held, HeldMap, Memo, Slot, ValueDigest};
use super::ids::{InstanceId, UnixMillis};
use super::join::{JoinMemory, build_view};
use super::keys::{Keyspace, RecordKey, keyspace_of, parse_key};
use super::mixed::MixedTracker;
use super::records::{
    CardRecord, ChannelClass, InstanceRecord, MalformedReason, classify_channel, clip, parse_card,
    parse_instance,
};
use super::sources::{is_read_topic, parse_event_source};
use super::{MAX_RECORD_BYTES, MAX_RECORDS_PER_KEYSPACE};

/// One etcd watch or range-get event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvEvent<'a> {
    /// A key was created or updated.
    Put {
        /// Raw key.
        key: &'a [u8],
        /// Raw value.
        value: &'a [u8],
    },
    /// A key was deleted (including lease expiry).
    Delete {
        /// Raw key.
        key: &'a [u8],
    },
}

const KEYSPACES: usize = Keyspace::ALL.len();

/// The reducer. Create one per watcher and reuse it across reconnects (DISC-ETCD-07).
#[derive(Debug)]
pub struct Reducer {
    pub(crate) instances: HeldMap<InstanceRecord>,
    pub(crate) cards: HeldMap<CardRecord>,
    pub(crate) channels: HeldMap<ChannelRec>,
    pub(crate) sources: HeldMap<EventSource>,
    pub(crate) memo: BTreeMap<InstanceId, Memo>,
    epoch: u64,
    live: [usize; KEYSPACES],
    cap_logged: [bool; KEYSPACES],
    in_resync: bool,
    dirty: bool,
    last: Arc<FleetView>,
    pub(crate) join_memory: JoinMemory,
    mixed: MixedTracker,
    pub(crate) sink: Sink,
}

impl Default for Reducer {
    fn default() -> Self {
        Self::new()
    }
}

impl Reducer {
    /// An empty reducer whose first view is empty.
    pub fn new() -> Self {
        Self {
            instances: BTreeMap::new(),
            cards: BTreeMap::new(),
            channels: BTreeMap::new(),
            sources: BTreeMap::new(),
            memo: BTreeMap::new(),
            epoch: 0,
            live: [0; KEYSPACES],
            cap_logged: [false; KEYSPACES],
            in_resync: false,
            dirty: false,
            last: Arc::new(FleetView::default()),
            join_memory: JoinMemory::default(),
            mixed: MixedTracker::default(),
            sink: Sink::default(),
        }
    }

    /// Applies one event observed at wall-clock time `now`.
    pub fn apply(&mut self, ev: KvEvent<'_>, now: UnixMillis) {
        match ev {
            KvEvent::Put { key, value } => self.put(key, value, now),
            KvEvent::Delete { key } => self.delete(key),
        }
    }

    /// Starts a resync pass: every held record becomes stale until a put of the new range-get
    /// refreshes it (DISC-ETCD-04). Views are not rebuilt until [`Reducer::end_resync`].
    pub fn begin_resync(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
        self.live = [0; KEYSPACES];
        self.in_resync = true;
    }

    /// Ends a resync pass: records the pass did not put again are dropped, as if the reducer had
    /// been cleared first; `first_seen` of surviving workers is kept (DISC-ETCD-07).
    pub fn end_resync(&mut self) {
        let epoch = self.epoch;
        let mut removed = sweep(&mut self.instances, epoch);
        removed |= sweep(&mut self.cards, epoch);
        removed |= sweep(&mut self.channels, epoch);
        removed |= sweep(&mut self.sources, epoch);
        self.dirty |= removed;
        self.in_resync = false;
        self.cap_logged = [false; KEYSPACES];
    }

    /// Whether a resync pass is open.
    pub fn in_resync(&self) -> bool {
        self.in_resync
    }

    /// The current fleet view. Returns the previous `Arc` (pointer-equal) when nothing changed,
    /// and during an open resync pass.
    pub fn materialize(&mut self) -> Arc<FleetView> {
        if self.in_resync || !self.dirty {
            return Arc::clone(&self.last);
        }
        self.dirty = false;
        let view = build_view(
            &self.instances,
            &self.cards,
            &self.channels,
            &self.sources,
            &mut self.memo,
            &mut self.join_memory,
            &mut self.sink,
        );
        if view != *self.last {
            self.mixed.observe(&view, &mut self.sink);
            self.last = Arc::new(view);
        }
        Arc::clone(&self.last)
    }

    /// Takes the pending diagnostics (bounded, see `MAX_PENDING_DIAGNOSTICS`).
    pub fn drain_diagnostics(&mut self) -> Vec<Diagnostic> {
        self.sink.drain()
    }

    /// Monotonic counters per event kind.
    pub fn counts(&self) -> EventCounts {
        self.sink.counts()
    }

    /// Diagnostics dropped because nobody drained them.
    pub fn dropped_diagnostics(&self) -> u64 {
        self.sink.dropped()
    }

    /// Keys held in one keyspace (stale keys of an open resync included).
    pub fn held(&self, keyspace: Keyspace) -> usize {
        match keyspace {
            Keyspace::Instances => self.instances.len(),
            Keyspace::Cards => self.cards.len(),
            Keyspace::Channels => self.channels.len(),
            Keyspace::Sources => self.sources.len(),
        }
    }

    fn put(&mut self, key: &[u8], value: &[u8], now: UnixMillis) {
        let Some(space) = keyspace_of(key) else {
            return; // foreign keys are ignored
        };
        let digest = if value.len() > MAX_RECORD_BYTES {
            ValueDigest::Oversize(value.len())
        } else {
            ValueDigest::Hash(xxhash_rust::xxh3::xxh3_128(value))
        };
        let epoch = self.epoch;
        let idx = space.index();
        // Unchanged bytes: only refresh the pass marker (heartbeat or idempotent resync).
        let existing = match space {
            Keyspace::Instances => self
                .instances
                .get_mut(key)
                .map(|h| refresh(h, digest, epoch)),
            Keyspace::Cards => self.cards.get_mut(key).map(|h| refresh(h, digest, epoch)),
            Keyspace::Channels => self
                .channels
                .get_mut(key)
                .map(|h| refresh(h, digest, epoch)),
            Keyspace::Sources => self.sources.get_mut(key).map(|h| refresh(h, digest, epoch)),
        };
        let was_live = match existing {
            Some(Refresh::Same { was_live }) => {
                if !was_live {
                    self.bump_live(idx);
                }
                return;
            }
            Some(Refresh::Changed { was_live }) => was_live,
            None => {
                if self.live.get(idx).copied().unwrap_or(0) >= MAX_RECORDS_PER_KEYSPACE {
                    self.refuse_at_cap(space);
                    return;
                }
                false
            }
        };
        if !was_live {
            self.bump_live(idx);
        }
        let parsed_key = parse_key(key);
        match space {
            Keyspace::Instances => {
                let slot = instance_slot(parsed_key, value, digest, key);
                if let Slot::Used { namespace, rec } = &slot {
                    Memo::for_worker(&mut self.memo, namespace, rec.instance_id, now);
                }
                self.store(space, key, digest, now, slot);
            }
            Keyspace::Cards => {
                let slot = card_slot(parsed_key, value, digest, key, &mut self.sink);
                self.store(space, key, digest, now, slot);
            }
            Keyspace::Channels => {
                let slot = channel_slot(parsed_key, value, digest, key);
                self.store(space, key, digest, now, slot);
            }
            Keyspace::Sources => {
                let slot = source_slot(parsed_key, value, digest, key);
                self.store(space, key, digest, now, slot);
            }
        }
    }

    fn store<T>(
        &mut self,
        space: Keyspace,
        key: &[u8],
        digest: ValueDigest,
        now: UnixMillis,
        slot: Slot<T>,
    ) where
        Self: StoreIn<T>,
    {
        let held = Held {
            digest,
            epoch: self.epoch,
            changed_at: now,
            slot,
        };
        let new_why = match &held.slot {
            Slot::Skipped { why } => why.clone(),
            Slot::Used { .. } => None,
        };
        let new_used = held.slot.is_used();
        let old = self.map_for(space).insert(key.to_vec(), held);
        let (old_used, old_why) = match &old {
            Some(Held {
                slot: Slot::Skipped { why },
                ..
            }) => (false, why.clone()),
            Some(_) => (true, None),
            None => (false, None),
        };
        if let Some(d) = new_why
            && old_why.as_ref() != Some(&d)
        {
            self.sink.push(d);
        }
        self.dirty |= old_used || new_used;
    }

    fn delete(&mut self, key: &[u8]) {
        let Some(space) = keyspace_of(key) else {
            return;
        };
        let epoch = self.epoch;
        let removed = match space {
            Keyspace::Instances => self
                .instances
                .remove(key)
                .map(|h| (h.epoch, h.slot.is_used())),
            Keyspace::Cards => self.cards.remove(key).map(|h| (h.epoch, h.slot.is_used())),
            Keyspace::Channels => self
                .channels
                .remove(key)
                .map(|h| (h.epoch, h.slot.is_used())),
            Keyspace::Sources => self
                .sources
                .remove(key)
                .map(|h| (h.epoch, h.slot.is_used())),
        };
        if let Some((held_epoch, used)) = removed {
            if held_epoch == epoch
                && let Some(n) = self.live.get_mut(space.index())
            {
                *n = n.saturating_sub(1);
            }
            self.dirty |= used;
        }
    }

    fn bump_live(&mut self, idx: usize) {
        if let Some(n) = self.live.get_mut(idx) {
            *n += 1;
        }
    }

    fn refuse_at_cap(&mut self, space: Keyspace) {
        if let Some(logged) = self.cap_logged.get_mut(space.index())
            && !*logged
        {
            *logged = true;
            self.sink.push(Diagnostic::CapReached { keyspace: space });
        }
    }
}

/// Lets `store` pick the map of a record type without duplicating its body.
pub(crate) trait StoreIn<T> {
    fn map_for(&mut self, space: Keyspace) -> &mut HeldMap<T>;
}

impl StoreIn<InstanceRecord> for Reducer {
    fn map_for(&mut self, _: Keyspace) -> &mut HeldMap<InstanceRecord> {
        &mut self.instances
    }
}

impl StoreIn<CardRecord> for Reducer {
    fn map_for(&mut self, _: Keyspace) -> &mut HeldMap<CardRecord> {
        &mut self.cards
    }
}

impl StoreIn<ChannelRec> for Reducer {
    fn map_for(&mut self, _: Keyspace) -> &mut HeldMap<ChannelRec> {
        &mut self.channels
    }
}

impl StoreIn<EventSource> for Reducer {
    fn map_for(&mut self, _: Keyspace) -> &mut HeldMap<EventSource> {
        &mut self.sources
    }
}

enum Refresh {
    Same { was_live: bool },
    Changed { was_live: bool },
}

fn refresh<T>(held: &mut Held<T>, digest: ValueDigest, epoch: u64) -> Refresh {
    let was_live = held.epoch == epoch;
    if held.digest == digest {
        held.epoch = epoch;
        Refresh::Same { was_live }
    } else {
        Refresh::Changed { was_live }
    }
}

fn sweep<T>(map: &mut HeldMap<T>, epoch: u64) -> bool {
    let mut removed_used = false;
    map.retain(|_, h| {
        let keep = h.epoch == epoch;
        if !keep && h.slot.is_used() {
            removed_used = true;
        }
        keep
    });
    removed_used
}

/// A key as diagnostics show it (lossy UTF-8, clipped); built only when a diagnostic is.
fn shown(key: &[u8]) -> String {
    clip(&String::from_utf8_lossy(key))
}

fn malformed<T>(key: &[u8], reason: MalformedReason) -> Slot<T> {
    Slot::Skipped {
        why: Some(Diagnostic::Malformed {
            key: shown(key),
            reason,
        }),
    }
}

fn oversize(digest: ValueDigest) -> Option<MalformedReason> {
    match digest {
        ValueDigest::Oversize(n) => Some(MalformedReason::TooLarge(n)),
        ValueDigest::Hash(_) => None,
    }
}

fn instance_slot(
    key: Result<RecordKey, super::keys::KeyError>,
    value: &[u8],
    digest: ValueDigest,
    raw_key: &[u8],
) -> Slot<InstanceRecord> {
    let namespace = match key {
        Ok(RecordKey::Instance { namespace, .. }) => namespace,
        Ok(_) => return Slot::Skipped { why: None },
        Err(e) => return malformed(raw_key, e.into()),
    };
    if let Some(r) = oversize(digest) {
        return malformed(raw_key, r);
    }
    match parse_instance(value) {
        // Only `generate` endpoints materialise workers (DISC-REC-08).
        Ok(rec) if rec.endpoint == "generate" => Slot::Used { namespace, rec },
        Ok(_) => Slot::Skipped { why: None },
        Err(r) => malformed(raw_key, r),
    }
}

fn card_slot(
    key: Result<RecordKey, super::keys::KeyError>,
    value: &[u8],
    digest: ValueDigest,
    raw_key: &[u8],
    sink: &mut Sink,
) -> Slot<CardRecord> {
    let (namespace, suffix) = match key {
        Ok(RecordKey::Card { namespace, suffix }) => (namespace, suffix),
        Ok(_) => return Slot::Skipped { why: None },
        Err(e) => return malformed(raw_key, e.into()),
    };
    if let Some(r) = oversize(digest) {
        return malformed(raw_key, r);
    }
    match parse_card(value, suffix.is_some()) {
        // LoRA adapter cards never join (DISC-REC-07).
        Ok(rec) if rec.lora => Slot::Skipped { why: None },
        Ok(rec) => {
            if !rec.fields.bad_fields.is_empty() {
                sink.push(Diagnostic::CardFieldsIgnored {
                    key: shown(raw_key),
                    fields: rec.fields.bad_fields.clone(),
                });
            }
            if rec.card_dropped {
                sink.push(Diagnostic::CardDropped {
                    key: shown(raw_key),
                });
            }
            Slot::Used { namespace, rec }
        }
        Err(r) => malformed(raw_key, r),
    }
}

fn channel_slot(
    key: Result<RecordKey, super::keys::KeyError>,
    value: &[u8],
    digest: ValueDigest,
    raw_key: &[u8],
) -> Slot<ChannelRec> {
    let (namespace, scope, topic) = match key {
        Ok(RecordKey::Channel {
            namespace,
            scope,
            topic,
            ..
        }) => (namespace, scope, topic),
        Ok(_) => return Slot::Skipped { why: None },
        Err(e) => return malformed(raw_key, e.into()),
    };
    if Family::from_topic(&topic).is_none() {
        return Slot::Skipped { why: None }; // LOAD-CHAN-08: silently
    }
    if let Some(r) = oversize(digest) {
        return malformed(raw_key, r);
    }
    match classify_channel(&topic, value) {
        ChannelClass::Subscribe {
            family,
            publisher_id,
            tcp,
        } => Slot::Used {
            namespace,
            rec: ChannelRec {
                scope,
                family,
                publisher_id,
                tcp,
            },
        },
        ChannelClass::Silent => Slot::Skipped { why: None },
        ChannelClass::Unsupported(what) => Slot::Skipped {
            why: Some(Diagnostic::Unsupported {
                key: shown(raw_key),
                what,
            }),
        },
        ChannelClass::Malformed(r) => malformed(raw_key, r),
    }
}

fn source_slot(
    key: Result<RecordKey, super::keys::KeyError>,
    value: &[u8],
    digest: ValueDigest,
    raw_key: &[u8],
) -> Slot<EventSource> {
    let (namespace, topic, publisher_id) = match key {
        Ok(RecordKey::EventSource {
            namespace,
            topic,
            publisher_id,
            ..
        }) => (namespace, topic, publisher_id),
        Ok(_) => return Slot::Skipped { why: None },
        Err(e) => return malformed(raw_key, e.into()),
    };
    if !is_read_topic(&topic) {
        return Slot::Skipped { why: None }; // as channels of other topics (LOAD-CHAN-08)
    }
    if let Some(r) = oversize(digest) {
        return malformed(raw_key, r);
    }
    match parse_event_source(publisher_id, value) {
        Ok(rec) => Slot::Used { namespace, rec },
        Err(r) => malformed(raw_key, r),
    }
}

#[cfg(test)]
#[path = "reducer_tests.rs"]
mod tests;
