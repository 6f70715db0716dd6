//! One shard's KV writer side: its index writer, the live-identity gate, and the state of every
//! `kv-events` subscription the shard owns (KV-IDX-05..11).
//!
//! The sinks of this shard's subscriptions share one [`ShardKv`] (the shard is single-threaded,
//! so an `Rc<RefCell<_>>` and never a lock): each decoded batch goes through the pure rules of
//! [`continuum_core::kv::handler`] into the shard's index writer, whose changes another shard's
//! picker sees as they are made (block by block; each node whole, `continuum_core::kv::nodes`).
//!
//! Clearing rules (all of a subscription's ranks): its publisher left the fleet or restarted
//! under a new publisher id (the old subscription closes), or it has been down for more than
//! [`DOWN_CLEARS_AFTER`]; a rank whose worker left the live set is cleared by the gate
//! (KV-IDX-09). A gap clears only its rank (the handler).
//!
//! Invariants: only this shard writes its index; nothing here blocks or allocates per block;
//! the admin rows ([`crate::signals::kv::RankRow`]) are republished at most every
//! [`ROWS_EVERY`] and after every clear.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use continuum_core::clock::Instant;
use continuum_core::discovery::{FleetView, PublisherId};
use continuum_core::kv::Outcome;
use continuum_core::kv::event::KvBatch;
use continuum_core::kv::handler::{LiveGate, OutcomeCounts, Subscription};
use continuum_core::kv::index::IndexWriter;
use continuum_core::load::LoadKey;

use crate::signals::Signals;
use crate::signals::kv::{ROWS_EVERY, RankRow};

/// A subscription down (not connected, or pending for want of a broker) for longer than this
/// loses its ranks' blocks, with a `warn` (`KV_EVENTS_STALE_AFTER` of BROKER-10).
pub(crate) const DOWN_CLEARS_AFTER: Duration = Duration::from_secs(60);

/// A shard's KV writer state, shared by its sinks.
pub(crate) type SharedKv = Rc<RefCell<ShardKv>>;

struct SubEntry {
    sub: Subscription,
    /// Since when the subscription has not been connected (`None`: connected).
    down_since: Option<Instant>,
}

/// One shard's index writer and subscriptions.
pub(crate) struct ShardKv {
    shard: usize,
    writer: IndexWriter,
    gate: LiveGate,
    subs: HashMap<PublisherId, SubEntry>,
    signals: Arc<Signals>,
    rows_at: Option<Instant>,
    rows_dirty: bool,
}

impl std::fmt::Debug for ShardKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardKv")
            .field("shard", &self.shard)
            .field("subscriptions", &self.subs.len())
            .finish_non_exhaustive()
    }
}

impl ShardKv {
    /// Shard `shard`'s state, taking its index writer from `signals` (`None` if already taken).
    pub(crate) fn new(shard: usize, signals: Arc<Signals>) -> Option<SharedKv> {
        let writer = signals.kv.take_writer(shard)?;
        Some(Rc::new(RefCell::new(Self {
            shard,
            writer,
            gate: LiveGate::default(),
            subs: HashMap::new(),
            signals,
            rows_at: None,
            rows_dirty: false,
        })))
    }

    /// Start tracking `publisher`'s subscription (`source`: its registered `(worker, dp_rank)`,
    /// when the fleet declares one). A subscription already tracked keeps its cursors, unless
    /// its registered source changed: then what it fed is cleared and it starts over.
    pub(crate) fn open(&mut self, publisher: PublisherId, source: Option<LoadKey>, now: Instant) {
        if let Some(e) = self.subs.get_mut(&publisher) {
            if e.sub.source() == source {
                return;
            }
            e.sub.clear_all(&mut self.writer);
            e.sub = Subscription::new(source);
            self.rows_dirty = true;
            self.publish_rows(None);
            return;
        }
        self.subs.insert(
            publisher,
            SubEntry {
                sub: Subscription::new(source),
                down_since: Some(now),
            },
        );
    }

    /// Stop tracking `publisher` and clear every rank it fed (the publisher left or restarted).
    pub(crate) fn close(&mut self, publisher: PublisherId) {
        if let Some(mut e) = self.subs.remove(&publisher) {
            e.sub.clear_all(&mut self.writer);
            self.rows_dirty = true;
            self.publish_rows(None);
        }
    }

    /// Clear everything (the KV family was switched off, or the shard drains).
    pub(crate) fn close_all(&mut self) {
        let ids: Vec<PublisherId> = self.subs.keys().copied().collect();
        for id in ids {
            self.close(id);
        }
    }

    /// The fleet changed: rebuild the live gate and clear ranks of departed workers (KV-IDX-09).
    pub(crate) fn set_fleet(&mut self, fleet: &FleetView) {
        self.set_gate(LiveGate::from_fleet(fleet));
    }

    /// Replace the live gate, clearing the ranks it no longer admits.
    pub(crate) fn set_gate(&mut self, gate: LiveGate) {
        self.gate = gate;
        let mut cleared = 0;
        for e in self.subs.values_mut() {
            cleared += e.sub.retain_live(&mut self.writer, &self.gate);
        }
        if cleared > 0 {
            self.rows_dirty = true;
            self.publish_rows(None);
        }
    }

    /// Apply one decoded batch of `publisher`'s; the outcome counts go to the shard's counters.
    pub(crate) fn apply(&mut self, publisher: PublisherId, batch: &KvBatch, now: Instant) {
        let mut counts = OutcomeCounts::default();
        if let Some(e) = self.subs.get_mut(&publisher) {
            e.sub
                .apply_batch(&mut self.writer, &self.gate, batch, now, &mut counts);
            self.rows_dirty = true;
        }
        let events = self.signals.kv.events(self.shard);
        for o in Outcome::ALL {
            events.add(o, counts.get(o));
        }
        self.publish_rows(Some(now));
    }

    /// Count one message-level refusal (it never reached the handler).
    pub(crate) fn refused(&self, outcome: Outcome) {
        self.signals.kv.events(self.shard).add(outcome, 1);
    }

    /// `publisher`'s subscription connected (`true`) or went down (`false`).
    pub(crate) fn set_connected(&mut self, publisher: PublisherId, up: bool, now: Instant) {
        if let Some(e) = self.subs.get_mut(&publisher) {
            match (up, e.down_since) {
                (true, _) => e.down_since = None,
                (false, None) => e.down_since = Some(now),
                (false, Some(_)) => {}
            }
        }
    }

    /// Periodic upkeep: clear subscriptions down for more than [`DOWN_CLEARS_AFTER`] and
    /// republish the rows if due.
    pub(crate) fn tick(&mut self, now: Instant) {
        let mut cleared = false;
        for (publisher, e) in &mut self.subs {
            if let Some(since) = e.down_since
                && now.saturating_since(since) > DOWN_CLEARS_AFTER
                && e.sub.ranks().next().is_some()
            {
                let ranks = e.sub.ranks().count();
                e.sub.clear_all(&mut self.writer);
                cleared = true;
                tracing::warn!(
                    shard = self.shard,
                    %publisher,
                    ranks,
                    down_s = DOWN_CLEARS_AFTER.as_secs(),
                    "kv-events subscription not connected (or pending) for too long: its ranks were cleared from the index"
                );
            }
        }
        if cleared {
            self.rows_dirty = true;
            self.publish_rows(None);
        } else {
            self.publish_rows(Some(now));
        }
    }

    /// Republish the admin rows: now when `due_at` is `None`, else if [`ROWS_EVERY`] passed.
    fn publish_rows(&mut self, due_at: Option<Instant>) {
        if !self.rows_dirty {
            return;
        }
        if let (Some(now), Some(last)) = (due_at, self.rows_at)
            && now.saturating_since(last) < ROWS_EVERY
        {
            return;
        }
        let mut rows = Vec::new();
        for e in self.subs.values() {
            for (key, last_event_id, last_event_at) in e.sub.ranks() {
                rows.push(RankRow {
                    key,
                    blocks: self.writer.rank_blocks(key),
                    last_event_id,
                    last_event_at,
                });
            }
        }
        if let Some(slot) = self.signals.kv.rows.get(self.shard) {
            slot.store(Arc::new(rows));
        }
        self.rows_at = due_at.or(self.rows_at);
        self.rows_dirty = false;
    }
}

#[cfg(test)]
#[path = "kv_tests.rs"]
mod tests;
