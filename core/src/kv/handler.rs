//! The per-subscription rules between a decoded `kv-events` batch and the shard's index
//! (KV-IDX-05, -09..12).
//!
//! Role: [`Subscription`] is the state of one kv-events subscription: its registered source (if
//! the publisher declared one under `v1/event_sources`) and one `event_id` cursor per
//! `(worker, dp_rank)` it has heard from. [`Subscription::apply_batch`] decides each event's one
//! [`Outcome`] and applies what passes to the [`IndexWriter`]; the caller publishes afterwards.
//!
//! Rules, checked in this order per event:
//! 1. identity (KV-IDX-09): the rank must be admitted by the [`LiveGate`] (a live worker and one
//!    of its declared dp ranks) and, with a registered source, be that source; else
//!    `identity_mismatch`;
//! 2. cursor (KV-IDX-10/11): `event_id <= cursor` is a `replay` (skipped); `event_id > cursor + 1`
//!    is a gap: every block of that rank is cleared, `gap` is counted as well, then the event is
//!    applied. Never anything like a snapshot request (KV-IDX-12): the index refills from the
//!    root. A rank's first event starts its cursor, unless the subscription already has
//!    [`MAX_CURSORS_PER_SUBSCRIPTION`] cursors (`over_capacity`, nothing applied);
//! 3. tier (KV-IDX-05): a non-device event is `other_tier`: counted and not indexed, but it
//!    moves the cursor (a publisher numbers all its events with one counter, so skipping it
//!    would make the next device event look like a gap);
//! 4. apply: `stored` is `applied`, or `parent_missing`, or `over_capacity` when any block was
//!    refused; `removed` and `cleared` are `applied`. The cursor moves to the event (with its
//!    arrival time) whatever step 4 decided.
//!
//! Invariants: exactly one of applied / replay / over_capacity / identity_mismatch / other_tier /
//! parent_missing per event (plus `gap` for the events that found one); at most the cursor cap
//! of cursors; a rank without a cursor has no blocks from this subscription.

use std::collections::BTreeMap;

use super::event::{KvBatch, KvData, KvEvent, Tier};
use super::index::{IndexWriter, Upcoming};
use super::{EngineHash, MAX_CURSORS_PER_SUBSCRIPTION, Outcome, StoredBlock};
use crate::clock::Instant;
use crate::discovery::FleetView;
use crate::load::{LiveSet, LoadKey};

/// Which `(worker, dp_rank)` may feed the index: live workers and their declared ranks
/// (`dp_start_rank .. dp_start_rank + dp_size`, default `0..1`), as [`LiveSet`] reads them.
#[derive(Debug, Clone, Default)]
pub struct LiveGate {
    live: LiveSet,
}

impl LiveGate {
    /// The workers of `view`.
    pub fn from_fleet(view: &FleetView) -> Self {
        Self::from_live(LiveSet::from_fleet(view))
    }

    /// An already derived live set.
    pub fn from_live(live: LiveSet) -> Self {
        Self { live }
    }

    /// Whether events of `key` are accepted.
    pub fn admits(&self, key: LoadKey) -> bool {
        self.live
            .worker(key.worker_id)
            .is_some_and(|w| w.has_rank(key.dp_rank))
    }
}

/// Events per [`Outcome`], indexed by [`Outcome::index`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutcomeCounts(pub [u64; 8]);

impl OutcomeCounts {
    /// Counts one `o`.
    pub fn add(&mut self, o: Outcome) {
        if let Some(c) = self.0.get_mut(o.index()) {
            *c = c.saturating_add(1);
        }
    }

    /// The count of `o`.
    pub fn get(&self, o: Outcome) -> u64 {
        self.0.get(o.index()).copied().unwrap_or(0)
    }
}

/// One rank's cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cursor {
    last_event_id: u64,
    last_event_at: Instant,
}

/// The state of one kv-events subscription.
#[derive(Debug, Clone)]
pub struct Subscription {
    source: Option<LoadKey>,
    cursors: BTreeMap<LoadKey, Cursor>,
    max_cursors: usize,
}

impl Subscription {
    /// A subscription; `source` is the `(worker, dp_rank)` the publisher registered, if any.
    pub fn new(source: Option<LoadKey>) -> Self {
        Self::with_max_cursors(source, MAX_CURSORS_PER_SUBSCRIPTION)
    }

    /// Another cursor cap (tests, fuzzing).
    pub fn with_max_cursors(source: Option<LoadKey>, max_cursors: usize) -> Self {
        Self {
            source,
            cursors: BTreeMap::new(),
            max_cursors,
        }
    }

    /// The registered source.
    pub fn source(&self) -> Option<LoadKey> {
        self.source
    }

    /// Cursors held.
    pub fn cursor_count(&self) -> usize {
        self.cursors.len()
    }

    /// Applies every event of `batch` in order, counting one outcome per event in `counts`.
    pub fn apply_batch(
        &mut self,
        w: &mut IndexWriter,
        gate: &LiveGate,
        batch: &KvBatch,
        now: Instant,
        counts: &mut OutcomeCounts,
    ) {
        // Ask for the lines the batch's events will touch first, so their misses overlap (a hint
        // only: the rules below still decide what is applied).
        w.prefetch(batch.events().iter().filter_map(|ev| {
            let rank = LoadKey::new(ev.worker, ev.dp_rank);
            match &ev.data {
                KvData::Stored { parent, blocks } => Some(Upcoming::Store {
                    rank,
                    parent: *parent,
                    blocks: batch.blocks(blocks.clone()),
                }),
                KvData::Removed { hashes } => Some(Upcoming::Remove {
                    rank,
                    hashes: batch.hashes(hashes.clone()),
                }),
                KvData::Cleared => None,
            }
        }));
        for ev in batch.events() {
            let (blocks, hashes) = match &ev.data {
                KvData::Stored { blocks, .. } => (batch.blocks(blocks.clone()), &[][..]),
                KvData::Removed { hashes } => (&[][..], batch.hashes(hashes.clone())),
                KvData::Cleared => (&[][..], &[][..]),
            };
            self.apply_event(w, gate, ev, blocks, hashes, now, counts);
        }
    }

    /// Applies one event whose stored blocks or removed hashes are given apart (the batch's).
    #[allow(clippy::too_many_arguments)]
    pub fn apply_event(
        &mut self,
        w: &mut IndexWriter,
        gate: &LiveGate,
        ev: &KvEvent,
        blocks: &[StoredBlock],
        hashes: &[EngineHash],
        now: Instant,
        counts: &mut OutcomeCounts,
    ) {
        let key = LoadKey::new(ev.worker, ev.dp_rank);
        if !gate.admits(key) || self.source.is_some_and(|s| s != key) {
            counts.add(Outcome::IdentityMismatch);
            return;
        }
        match self.cursors.get(&key) {
            Some(c) if ev.event_id <= c.last_event_id => {
                counts.add(Outcome::Replay);
                return;
            }
            Some(c) if ev.event_id > c.last_event_id.saturating_add(1) => {
                w.clear_rank(key);
                counts.add(Outcome::Gap);
            }
            Some(_) => {}
            None if self.cursors.len() >= self.max_cursors => {
                counts.add(Outcome::OverCapacity);
                return;
            }
            None => {}
        }
        self.cursors.insert(
            key,
            Cursor {
                last_event_id: ev.event_id,
                last_event_at: now,
            },
        );
        // Other tiers share the publisher's numbering (one counter per publisher), so they move
        // the cursor; only the device tier is indexed (KV-IDX-05).
        if ev.tier != Tier::Device {
            counts.add(Outcome::OtherTier);
            return;
        }
        let outcome = match &ev.data {
            KvData::Stored { parent, .. } => {
                let r = w.store(key, *parent, blocks);
                if r.parent_missing {
                    Outcome::ParentMissing
                } else if r.over_capacity > 0 {
                    Outcome::OverCapacity
                } else {
                    Outcome::Applied
                }
            }
            KvData::Removed { .. } => {
                w.remove(key, hashes);
                Outcome::Applied
            }
            KvData::Cleared => {
                w.clear_rank(key);
                Outcome::Applied
            }
        };
        counts.add(outcome);
    }

    /// Clears every rank this subscription fed and forgets its cursors (the publisher left or
    /// restarted, or the subscription was down too long: the caller decides). Returns the
    /// blocks cleared.
    pub fn clear_all(&mut self, w: &mut IndexWriter) -> u32 {
        let mut n = 0u32;
        for key in std::mem::take(&mut self.cursors).into_keys() {
            n = n.saturating_add(w.clear_rank(key));
        }
        n
    }

    /// Clears the ranks `gate` no longer admits and drops their cursors (KV-IDX-09, with
    /// `set_live_and_retain`). Returns how many ranks were dropped.
    pub fn retain_live(&mut self, w: &mut IndexWriter, gate: &LiveGate) -> u32 {
        let mut n = 0u32;
        self.cursors.retain(|key, _| {
            if gate.admits(*key) {
                return true;
            }
            w.clear_rank(*key);
            n = n.saturating_add(1);
            false
        });
        n
    }

    /// Every cursor, by rank: `(rank, last event_id, when that event arrived)` (admin view).
    pub fn ranks(&self) -> impl Iterator<Item = (LoadKey, u64, Instant)> + '_ {
        self.cursors
            .iter()
            .map(|(k, c)| (*k, c.last_event_id, c.last_event_at))
    }
}
