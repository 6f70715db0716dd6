//! Unit tests of [`super::handler`]: one per rule of KV-IDX-05 and -09..11.

use std::sync::Arc;
use std::time::Duration;

use super::budget::Budget;
use super::encode::{Encoding, KvDataRef, KvEventRef, encode_batch};
use super::event::{KvBatch, KvData, KvEvent, Tier};
use super::handler::{LiveGate, OutcomeCounts, Subscription};
use super::index::{Caps, IndexWriter, new_index, new_index_with_caps};
use super::shared::IndexReader;
use super::test_support::{blocks, eh, expect, key, matches, prompt};
use super::{EngineHash, MAX_CURSORS_PER_SUBSCRIPTION, Outcome, StoredBlock};
use crate::clock::Instant;
use crate::discovery::{Capacity, FleetView, InstanceId, Role, UnixMillis, Worker};
use crate::load::{LiveSet, LiveWorker, LoadKey};

const A: &[u64] = &[11, 12, 13, 14];
const B: &[u64] = &[21, 22, 23];

fn at(s: u64) -> Instant {
    Instant::from_origin(Duration::from_secs(s))
}

fn worker(id: u64, dp: Option<(u32, u32)>) -> Worker {
    Worker {
        namespace: "ns".to_owned(),
        instance_id: InstanceId::new(id),
        component: "backend".to_owned(),
        endpoint: "generate".to_owned(),
        role: Role::Aggregated,
        model: Some("m".to_owned()),
        block_size: Some(16),
        capacity: Capacity {
            total_kv_blocks: None,
            max_num_batched_tokens: None,
            max_num_seqs: None,
            context_length: None,
        },
        dp_start_rank: dp.map(|d| d.0),
        dp_size: dp.map(|d| d.1),
        disaggregated_endpoint: None,
        card: None,
        first_seen: UnixMillis(0),
        last_updated: UnixMillis(0),
        transport: None,
    }
}

/// Workers 1 (rank 0) and 2 (ranks 0..2).
fn gate() -> LiveGate {
    LiveGate::from_live(LiveSet::new([
        LiveWorker::new(InstanceId::new(1), "ns", 0, 1),
        LiveWorker::new(InstanceId::new(2), "ns", 0, 2),
    ]))
}

struct Rig {
    w: IndexWriter,
    r: IndexReader,
    sub: Subscription,
    gate: LiveGate,
    counts: OutcomeCounts,
}

impl Rig {
    fn new(sub: Subscription) -> Self {
        let (w, r) = new_index(Arc::new(Budget::new()));
        Self::with(w, r.handle(), sub)
    }

    fn with(w: IndexWriter, r: IndexReader, sub: Subscription) -> Self {
        Self {
            w,
            r,
            sub,
            gate: gate(),
            counts: OutcomeCounts::default(),
        }
    }

    /// Applies one event and returns the outcomes it counted, as `(outcome, count)` pairs.
    fn ev(
        &mut self,
        rank: LoadKey,
        id: u64,
        tier: Tier,
        data: KvData,
        blocks: &[StoredBlock],
        hashes: &[EngineHash],
    ) -> Vec<Outcome> {
        let before = self.counts;
        let ev = KvEvent {
            worker: rank.worker_id,
            dp_rank: rank.dp_rank,
            event_id: id,
            tier,
            data,
        };
        self.sub.apply_event(
            &mut self.w,
            &self.gate,
            &ev,
            blocks,
            hashes,
            at(id),
            &mut self.counts,
        );
        Outcome::ALL
            .into_iter()
            .filter(|o| self.counts.get(*o) > before.get(*o))
            .collect()
    }

    fn store(
        &mut self,
        rank: LoadKey,
        id: u64,
        parent: Option<EngineHash>,
        b: &[StoredBlock],
    ) -> Vec<Outcome> {
        let data = KvData::Stored {
            parent,
            blocks: 0..0,
        };
        self.ev(rank, id, Tier::Device, data, b, &[])
    }

    fn remove(&mut self, rank: LoadKey, id: u64, h: &[EngineHash]) -> Vec<Outcome> {
        self.ev(
            rank,
            id,
            Tier::Device,
            KvData::Removed { hashes: 0..0 },
            &[],
            h,
        )
    }

    fn cursor(&self, rank: LoadKey) -> Option<(u64, Instant)> {
        self.sub
            .ranks()
            .find(|(k, ..)| *k == rank)
            .map(|(_, id, t)| (id, t))
    }
}

#[test]
fn the_first_event_starts_the_cursor_and_replays_are_skipped() {
    let mut rig = Rig::new(Subscription::new(None));
    let ra = key(1, 0);
    assert_eq!(rig.store(ra, 5, None, &blocks(A, 0, 1)), [Outcome::Applied]);
    assert_eq!(rig.cursor(ra), Some((5, at(5))));
    // A replay of 5 and an older event change nothing, whatever they carry.
    assert_eq!(rig.remove(ra, 5, &[eh(A, 0, 1)]), [Outcome::Replay]);
    assert_eq!(
        rig.ev(ra, 3, Tier::Device, KvData::Cleared, &[], &[]),
        [Outcome::Replay]
    );
    assert_eq!(rig.cursor(ra), Some((5, at(5))));
    assert_eq!(matches(&rig.r, &prompt(A)), expect(&[(ra, 4)]));
    assert_eq!(rig.remove(ra, 6, &[eh(A, 3, 1)]), [Outcome::Applied]);
    assert_eq!(rig.cursor(ra), Some((6, at(6))));
    assert_eq!(matches(&rig.r, &prompt(A)), expect(&[(ra, 3)]));
}

#[test]
fn a_gap_clears_only_that_rank_then_applies_the_event() {
    let mut rig = Rig::new(Subscription::new(None));
    let (ra, rb) = (key(2, 0), key(2, 1));
    rig.store(ra, 1, None, &blocks(A, 0, 1));
    rig.store(rb, 1, None, &blocks(A, 0, 2));
    // Event 2 of ra was lost.
    assert_eq!(
        rig.store(ra, 3, None, &blocks(B, 0, 1)),
        [Outcome::Applied, Outcome::Gap]
    );
    assert_eq!(rig.w.rank_blocks(ra), 3, "only the new chain");
    assert_eq!(matches(&rig.r, &prompt(A)), expect(&[(rb, 4)]));
    assert_eq!(matches(&rig.r, &prompt(B)), expect(&[(ra, 3)]));
    assert_eq!(rig.cursor(ra), Some((3, at(3))));
    // What hung under the cleared blocks no longer has a parent.
    assert_eq!(
        rig.store(
            ra,
            5,
            Some(eh(A, 3, 1)),
            &blocks(&[11, 12, 13, 14, 15], 4, 1)
        ),
        [Outcome::Gap, Outcome::ParentMissing]
    );
    assert_eq!(rig.w.rank_blocks(ra), 0);
    assert_eq!(rig.cursor(ra), Some((5, at(5))), "the cursor moves on");
    assert_eq!(rig.counts.get(Outcome::Gap), 2);
    assert_eq!(rig.w.rank_blocks(rb), 4);
}

#[test]
fn cleared_clears_the_rank() {
    let mut rig = Rig::new(Subscription::new(None));
    let (ra, rb) = (key(2, 0), key(1, 0));
    rig.store(ra, 1, None, &blocks(A, 0, 1));
    rig.store(rb, 1, None, &blocks(A, 0, 2));
    assert_eq!(
        rig.ev(ra, 2, Tier::Device, KvData::Cleared, &[], &[]),
        [Outcome::Applied]
    );
    assert_eq!(matches(&rig.r, &prompt(A)), expect(&[(rb, 4)]));
    assert_eq!(rig.cursor(ra), Some((2, at(2))));
}

#[test]
fn the_identity_gate_refuses_dead_workers_undeclared_ranks_and_other_sources() {
    let mut rig = Rig::new(Subscription::new(None));
    let b = blocks(A, 0, 1);
    assert_eq!(
        rig.store(key(3, 0), 1, None, &b),
        [Outcome::IdentityMismatch],
        "not live"
    );
    assert_eq!(
        rig.store(key(1, 1), 1, None, &b),
        [Outcome::IdentityMismatch],
        "rank 1"
    );
    assert_eq!(
        rig.store(key(2, 2), 1, None, &b),
        [Outcome::IdentityMismatch],
        "rank 2"
    );
    assert_eq!(rig.sub.cursor_count(), 0);
    assert!(matches(&rig.r, &prompt(A)).is_empty());

    let mut rig = Rig::new(Subscription::new(Some(key(2, 1))));
    assert_eq!(rig.sub.source(), Some(key(2, 1)));
    assert_eq!(
        rig.store(key(2, 0), 1, None, &b),
        [Outcome::IdentityMismatch],
        "live, not the source"
    );
    assert_eq!(rig.store(key(2, 1), 1, None, &b), [Outcome::Applied]);
    assert_eq!(matches(&rig.r, &prompt(A)), expect(&[(key(2, 1), 4)]));
}

#[test]
fn the_gate_reads_the_declared_dp_ranks_of_the_fleet() {
    let view = FleetView {
        workers: vec![
            worker(1, None),
            worker(2, Some((2, 3))),
            worker(3, Some((0, 0))),
        ],
        publishers: Vec::new(),
    };
    let g = LiveGate::from_fleet(&view);
    assert!(g.admits(key(1, 0)));
    assert!(!g.admits(key(1, 1)));
    assert!(!g.admits(key(2, 1)));
    assert!(g.admits(key(2, 2)) && g.admits(key(2, 4)));
    assert!(!g.admits(key(2, 5)));
    assert!(
        g.admits(key(3, 0)) && !g.admits(key(3, 1)),
        "size 0 reads as 1"
    );
    assert!(!g.admits(key(4, 0)));
}

#[test]
fn other_tiers_are_counted_not_indexed_and_move_the_cursor() {
    let mut rig = Rig::new(Subscription::new(None));
    let ra = key(1, 0);
    let data = || KvData::Stored {
        parent: None,
        blocks: 0..0,
    };
    assert_eq!(
        rig.ev(ra, 1, Tier::Other, data(), &blocks(A, 0, 1), &[]),
        [Outcome::OtherTier]
    );
    assert_eq!(rig.cursor(ra), Some((1, at(1))));
    assert!(matches(&rig.r, &prompt(A)).is_empty());
    // The device event numbered after it is in order: no gap, applied.
    assert_eq!(rig.store(ra, 2, None, &blocks(B, 0, 1)), [Outcome::Applied]);
    assert_eq!(
        rig.ev(ra, 3, Tier::Other, data(), &blocks(A, 0, 1), &[]),
        [Outcome::OtherTier]
    );
    assert!(matches(&rig.r, &prompt(A)).is_empty());
    // Reusing an other-tier event's id is a replay.
    assert_eq!(rig.store(ra, 3, None, &blocks(A, 0, 1)), [Outcome::Replay]);
    assert_eq!(
        rig.store(ra, 4, None, &blocks(A, 0, 1)),
        [Outcome::Applied],
        "no gap"
    );
}

#[test]
fn the_cursor_cap_at_and_one_over() {
    let mut rig = Rig::new(Subscription::with_max_cursors(None, 2));
    let b = blocks(A, 0, 1);
    assert_eq!(rig.store(key(2, 0), 1, None, &b), [Outcome::Applied]);
    assert_eq!(rig.store(key(2, 1), 1, None, &b), [Outcome::Applied]);
    assert_eq!(rig.store(key(1, 0), 1, None, &b), [Outcome::OverCapacity]);
    assert_eq!(rig.w.rank_blocks(key(1, 0)), 0);
    assert_eq!(rig.sub.cursor_count(), 2);
    assert_eq!(
        rig.remove(key(2, 0), 2, &[]),
        [Outcome::Applied],
        "known ranks go on"
    );
    rig.sub.retain_live(&mut rig.w, &LiveGate::default());
    assert_eq!(
        rig.store(key(1, 0), 2, None, &b),
        [Outcome::Applied],
        "room again"
    );
}

#[test]
fn the_real_cursor_cap_at_and_one_over() {
    let mut rig = Rig::new(Subscription::new(None));
    rig.gate = LiveGate::from_live(LiveSet::new([LiveWorker::new(
        InstanceId::new(1),
        "ns",
        0,
        5000,
    )]));
    let n = MAX_CURSORS_PER_SUBSCRIPTION as u32;
    for rank in 0..n {
        assert_eq!(rig.remove(key(1, rank), 1, &[]), [Outcome::Applied]);
    }
    assert_eq!(rig.remove(key(1, n), 1, &[]), [Outcome::OverCapacity]);
    assert_eq!(rig.sub.cursor_count(), 4096);
}

#[test]
fn a_refused_block_makes_the_event_over_capacity_and_moves_the_cursor() {
    let caps = Caps {
        blocks_per_rank: 2,
        owners_per_node: 8,
    };
    let (w, r) = new_index_with_caps(Arc::new(Budget::new()), caps);
    let mut rig = Rig::with(w, r.handle(), Subscription::new(None));
    let ra = key(1, 0);
    assert_eq!(
        rig.store(ra, 1, None, &blocks(A, 0, 1)),
        [Outcome::OverCapacity]
    );
    assert_eq!(matches(&rig.r, &prompt(A)), expect(&[(ra, 2)]));
    assert_eq!(rig.cursor(ra), Some((1, at(1))));
    assert_eq!(
        rig.store(ra, 2, None, &blocks(&A[..2], 0, 1)),
        [Outcome::Applied]
    );
}

#[test]
fn clear_all_drops_every_rank_and_cursor() {
    let mut rig = Rig::new(Subscription::new(None));
    rig.store(key(1, 0), 7, None, &blocks(A, 0, 1));
    rig.store(key(2, 1), 9, None, &blocks(B, 0, 1));
    assert_eq!(rig.sub.clear_all(&mut rig.w), 7);
    assert_eq!(rig.sub.cursor_count(), 0);
    assert!(matches(&rig.r, &prompt(A)).is_empty() && matches(&rig.r, &prompt(B)).is_empty());
    // A restarted publisher numbers from the start again.
    assert_eq!(
        rig.store(key(1, 0), 1, None, &blocks(A, 0, 1)),
        [Outcome::Applied]
    );
}

#[test]
fn retain_live_clears_the_ranks_of_departed_workers() {
    let mut rig = Rig::new(Subscription::new(None));
    rig.store(key(1, 0), 1, None, &blocks(A, 0, 1));
    rig.store(key(2, 0), 1, None, &blocks(A, 0, 2));
    rig.store(key(2, 1), 1, None, &blocks(B, 0, 2));
    let only_1 = LiveGate::from_live(LiveSet::new([LiveWorker::new(
        InstanceId::new(1),
        "ns",
        0,
        1,
    )]));
    assert_eq!(rig.sub.retain_live(&mut rig.w, &only_1), 2);
    assert_eq!(matches(&rig.r, &prompt(A)), expect(&[(key(1, 0), 4)]));
    assert!(matches(&rig.r, &prompt(B)).is_empty());
    let left: Vec<LoadKey> = rig.sub.ranks().map(|(k, ..)| k).collect();
    assert_eq!(left, [key(1, 0)]);
    assert_eq!(rig.w.ranks().count(), 1);
}

#[test]
fn apply_batch_applies_a_decoded_payload_in_order() {
    let (mut w, r) = new_index(Arc::new(Budget::new()));
    let r = r.handle();
    let mut sub = Subscription::new(None);
    let mut counts = OutcomeCounts::default();
    let stored = blocks(A, 0, 1);
    let gone = [eh(A, 3, 1)];
    let ev = |id, dp_rank, tier, data| KvEventRef {
        worker: InstanceId::new(2),
        dp_rank,
        event_id: id,
        tier,
        data,
    };
    let events = [
        ev(
            1,
            0,
            Tier::Device,
            KvDataRef::Stored {
                parent: None,
                blocks: &stored,
            },
        ),
        ev(2, 0, Tier::Device, KvDataRef::Removed { hashes: &gone }),
        ev(
            1,
            1,
            Tier::Device,
            KvDataRef::Stored {
                parent: None,
                blocks: &stored,
            },
        ),
        ev(2, 1, Tier::Other, KvDataRef::Cleared),
        ev(2, 0, Tier::Device, KvDataRef::Cleared),
        ev(1, 7, Tier::Device, KvDataRef::Cleared),
    ];
    let mut payload = Vec::new();
    encode_batch(&events, Encoding::Map, &mut payload);
    let mut batch = KvBatch::new();
    assert!(batch.decode(&payload).is_ok());
    sub.apply_batch(&mut w, &gate(), &batch, at(1), &mut counts);
    assert_eq!(
        matches(&r, &prompt(A)),
        expect(&[(key(2, 0), 3), (key(2, 1), 4)])
    );
    let mut want = OutcomeCounts::default();
    for o in [
        Outcome::Applied,
        Outcome::Applied,
        Outcome::Applied,
        Outcome::OtherTier,
        Outcome::Replay,
        Outcome::IdentityMismatch,
    ] {
        want.add(o);
    }
    assert_eq!(counts, want);
}
