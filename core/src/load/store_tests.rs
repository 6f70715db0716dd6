//! Unit tests of the cursor-to-store path, the gate, the cap, retention and the gauges.

use std::time::Duration;

use crate::discovery::{Capacity, UnixMillis};
use crate::discovery::{FleetView, InstanceId, PublisherId, Role, Worker};

use super::metrics::LoadEventResult;
use super::test_support::{at_ms, key, sample, store_with, worker};
use super::{
    ApplyOutcome, CursorVerdict, LiveSet, LiveWorker, LoadStore, MAX_LOAD_KEYS, Refusal, Sample,
    StalenessOutOfRange, SubscriptionCursor,
};

const MS: Duration = Duration::from_millis(1);

#[test]
fn per_key_sequence_check_and_restarted_publisher_override() {
    // LOAD-STORE-02
    let s = store_with(vec![worker(7, 0, 2)]);
    let k = key(7, 1);
    assert_eq!(
        s.apply(k, &sample(1, 10, Some(4), None), at_ms(0)),
        ApplyOutcome::Applied
    );
    assert_eq!(
        s.apply(k, &sample(1, 10, Some(9), None), at_ms(1)),
        ApplyOutcome::Duplicate
    );
    assert_eq!(
        s.apply(k, &sample(1, 3, Some(9), None), at_ms(2)),
        ApplyOutcome::Duplicate
    );
    assert_eq!(
        s.last(k).map(|v| v.sample.active_decode_blocks),
        Some(Some(4))
    );
    assert_eq!(
        s.apply(k, &sample(1, 11, Some(5), None), at_ms(3)),
        ApplyOutcome::Applied
    );
    // A restarted publisher replaces the value whatever its (lower) sequence.
    assert_eq!(
        s.apply(k, &sample(2, 1, Some(6), None), at_ms(4)),
        ApplyOutcome::Applied
    );
    let v = s.last(k).unwrap();
    assert_eq!(
        (v.sample.publisher_id, v.sample.sequence),
        (PublisherId::new(2), 1)
    );
    assert_eq!(
        s.apply(k, &sample(2, 1, Some(0), None), at_ms(5)),
        ApplyOutcome::Duplicate
    );
    // Other ranks are independent.
    assert_eq!(
        s.apply(key(7, 0), &sample(2, 1, Some(0), None), at_ms(5)),
        ApplyOutcome::Applied
    );
    assert_eq!(ApplyOutcome::Duplicate.result(), LoadEventResult::Duplicate);
    assert_eq!(ApplyOutcome::Applied.result().label(), "applied");
}

#[test]
fn freshness_is_by_receipt_time_within_max_age() {
    // LOAD-STORE-03/04/05
    let s = store_with(vec![worker(7, 0, 1)]);
    let k = key(7, 0);
    assert_eq!(
        s.fresh(k, Duration::from_secs(3), at_ms(0)),
        None,
        "never published"
    );
    s.apply(k, &sample(1, 1, Some(3), None), at_ms(1000));
    let got = s.fresh(k, Duration::from_secs(3), at_ms(4000)).unwrap();
    assert_eq!(got.received_at, at_ms(1000));
    assert!(
        s.fresh(k, Duration::from_secs(3), at_ms(4001)).is_none(),
        "one ms past max_age"
    );
    assert!(
        s.fresh(k, Duration::from_secs(3), at_ms(500)).is_some(),
        "receipt after now: age 0"
    );
    assert_eq!(s.max_staleness(), Duration::from_secs(3));
    assert!(s.fresh_default(k, at_ms(4000)).is_some());
    assert!(s.fresh_default(k, at_ms(4001)).is_none());
    s.set_max_staleness(Duration::from_millis(100)).unwrap();
    assert!(s.fresh_default(k, at_ms(1100)).is_some());
    assert!(
        s.fresh_default(k, at_ms(1101)).is_none(),
        "hot-reloaded immediately"
    );
    assert_eq!(
        s.set_max_staleness(99 * MS),
        Err(StalenessOutOfRange(99 * MS))
    );
    assert!(s.set_max_staleness(Duration::from_secs(301)).is_err());
    s.set_max_staleness(Duration::from_secs(300)).unwrap();
    assert!(s.fresh_default(k, at_ms(301_000)).is_some());
}

#[test]
fn gate_refuses_unknown_workers_and_undeclared_ranks() {
    // LOAD-ZMTP-10
    let s = store_with(vec![worker(7, 4, 2)]);
    let smp = sample(1, 1, Some(1), None);
    let refused = ApplyOutcome::Refused(Refusal::IdentityMismatch);
    assert_eq!(s.apply(key(8, 0), &smp, at_ms(0)), refused, "not live");
    assert_eq!(
        s.apply(key(7, 3), &smp, at_ms(0)),
        refused,
        "below dp_start_rank"
    );
    assert_eq!(
        s.apply(key(7, 6), &smp, at_ms(0)),
        refused,
        "beyond start+size"
    );
    assert_eq!(s.apply(key(7, 4), &smp, at_ms(0)), ApplyOutcome::Applied);
    assert_eq!(s.apply(key(7, 5), &smp, at_ms(0)), ApplyOutcome::Applied);
    assert_eq!(refused.result(), LoadEventResult::IdentityMismatch);
    let empty = LoadStore::new();
    assert_eq!(
        empty.apply(key(7, 4), &smp, at_ms(0)),
        refused,
        "no live set yet"
    );
}

#[test]
fn cursor_gap_discards_every_rank_of_the_publisher_then_applies() {
    // LOAD-STORE-01/14, Q-22
    let s = store_with(vec![worker(7, 0, 2), worker(9, 0, 1)]);
    let mut cur = SubscriptionCursor::new();
    let feed = |cur: &mut SubscriptionCursor, k, smp: Sample, t| match cur.admit(smp.sequence) {
        CursorVerdict::Duplicate => None,
        CursorVerdict::AfterGap => {
            let n = s.discard_publisher(smp.publisher_id);
            Some((n, s.apply(k, &smp, t)))
        }
        CursorVerdict::InOrder => Some((0, s.apply(k, &smp, t))),
    };
    assert_eq!(
        feed(&mut cur, key(7, 0), sample(1, 1, Some(5), None), at_ms(0)),
        Some((0, ApplyOutcome::Applied))
    );
    assert_eq!(
        feed(&mut cur, key(7, 1), sample(1, 2, Some(5), None), at_ms(0)),
        Some((0, ApplyOutcome::Applied))
    );
    s.apply(key(9, 0), &sample(2, 1, Some(5), None), at_ms(0));
    assert_eq!(
        feed(&mut cur, key(7, 1), sample(1, 2, Some(5), None), at_ms(1)),
        None,
        "duplicate"
    );
    // Sequence 3 missed: both ranks of publisher 1 are discarded, then 4 applies to rank 1.
    assert_eq!(
        feed(&mut cur, key(7, 1), sample(1, 4, Some(0), None), at_ms(2)),
        Some((2, ApplyOutcome::Applied))
    );
    assert!(
        s.last(key(7, 0)).is_none(),
        "rank 0 discarded: now reads as never published"
    );
    assert_eq!(s.last(key(7, 1)).unwrap().sample.sequence, 4);
    assert!(
        s.last(key(9, 0)).is_some(),
        "another publisher's samples stay"
    );
    // On connect: reset and discard (LOAD-STORE-14 (a)).
    cur.reset();
    assert_eq!(s.discard_publisher(PublisherId::new(1)), 1);
    assert_eq!(s.discard_publisher(PublisherId::new(1)), 0);
    assert_eq!(
        feed(&mut cur, key(7, 0), sample(1, 1, Some(2), None), at_ms(3)),
        Some((0, ApplyOutcome::Applied))
    );
    // A discarded key keeps its receipt time (it answers earlier dispatches) but no sample.
    s.discard_publisher(PublisherId::new(1));
    let r = s.view().read(key(7, 0));
    assert_eq!((r.sample, r.last_receipt), (None, Some(at_ms(3))));
}

#[test]
fn cap_exactly_at_and_one_over() {
    // LOAD-STORE-18, LOAD-ZMTP-11
    let full = u32::try_from(MAX_LOAD_KEYS).unwrap();
    let s = LoadStore::new();
    let rep = s.set_live_and_retain(&LiveSet::new(vec![worker(1, 0, full)]));
    assert_eq!((rep.keys, rep.over_capacity), (MAX_LOAD_KEYS, 0));
    let smp = sample(1, 1, Some(1), None);
    assert_eq!(
        s.apply(key(1, full - 1), &smp, at_ms(0)),
        ApplyOutcome::Applied,
        "the 65,536th key"
    );
    assert_eq!(s.apply(key(1, 0), &smp, at_ms(0)), ApplyOutcome::Applied);
    // One more live key: refused as over_capacity, existing keys keep their samples.
    let rep = s.set_live_and_retain(&LiveSet::new(vec![worker(0, 0, 1), worker(1, 0, full)]));
    assert_eq!(
        (rep.keys, rep.retained, rep.over_capacity),
        (MAX_LOAD_KEYS, MAX_LOAD_KEYS, 1)
    );
    let over = ApplyOutcome::Refused(Refusal::OverCapacity);
    assert_eq!(
        s.apply(key(0, 0), &smp, at_ms(1)),
        over,
        "a lower id does not evict held keys"
    );
    assert_eq!(over.result(), LoadEventResult::OverCapacity);
    assert!(s.last(key(1, full - 1)).is_some());
    // A single worker declaring one rank too many: its last rank is over capacity.
    let s = LoadStore::new();
    let rep = s.set_live_and_retain(&LiveSet::new(vec![worker(5, 0, full + 1)]));
    assert_eq!((rep.keys, rep.over_capacity), (MAX_LOAD_KEYS, 1));
    assert_eq!(s.apply(key(5, full), &smp, at_ms(0)), over);
    assert_eq!(
        s.apply(key(5, full - 1), &smp, at_ms(0)),
        ApplyOutcome::Applied
    );
    assert_eq!(
        s.apply(key(5, full + 1), &smp, at_ms(0)),
        ApplyOutcome::Refused(Refusal::IdentityMismatch)
    );
    // A huge declared range is bounded, not enumerated.
    let s = LoadStore::new();
    let rep = s.set_live_and_retain(&LiveSet::new(vec![worker(6, 0, u32::MAX)]));
    assert_eq!(
        (rep.keys, rep.over_capacity),
        (MAX_LOAD_KEYS, MAX_LOAD_KEYS)
    );
    // After a departure frees room, the refused key is admitted.
    let s2 = LoadStore::new();
    s2.set_live_and_retain(&LiveSet::new(vec![worker(0, 0, 1), worker(1, 0, full)]));
    assert_eq!(s2.apply(key(1, full - 1), &smp, at_ms(0)), over);
    s2.set_live_and_retain(&LiveSet::new(vec![worker(1, 0, full)]));
    assert_eq!(
        s2.apply(key(1, full - 1), &smp, at_ms(0)),
        ApplyOutcome::Applied
    );
}

fn render(s: &LoadStore) -> String {
    render_at(s, at_ms(0))
}

fn render_at(s: &LoadStore, now: crate::clock::Instant) -> String {
    let mut out = String::new();
    s.render_gauges(&mut out, now);
    out
}

#[test]
fn set_live_and_retain_removes_samples_and_series_in_one_step() {
    // LOAD-STORE-15, LOAD-MET-01/02/03
    let s = LoadStore::new();
    s.set_live_and_retain(&LiveSet::new(vec![
        LiveWorker::new(InstanceId::new(0xab), "prod", 0, 2),
        LiveWorker::new(InstanceId::new(0xcd), "canary", 0, 1),
    ]));
    let full = Sample {
        kv_used_blocks: Some(7),
        ..sample(1, 1, Some(3), Some(100))
    };
    s.apply(key(0xab, 1), &full, at_ms(0));
    s.apply(key(0xcd, 0), &sample(2, 1, None, None), at_ms(0));
    let out = render(&s);
    assert!(out.contains(
        "continuum_dynamo_worker_active_decode_blocks{namespace=\"prod\",worker=\"ab\",dp_rank=\"1\"} 3\n"
    ));
    assert!(out.contains(
        "continuum_dynamo_worker_active_prefill_tokens{namespace=\"prod\",worker=\"ab\",dp_rank=\"1\"} 100\n"
    ));
    assert!(out.contains(
        "continuum_dynamo_worker_kv_used_blocks{namespace=\"prod\",worker=\"ab\",dp_rank=\"1\"} 7\n"
    ));
    assert!(
        !out.contains("_blocks{namespace=\"canary\",worker=\"cd\"")
            && !out.contains("_tokens{namespace=\"canary\",worker=\"cd\""),
        "all-nil sample: no series (LOAD-MET-02)"
    );
    // Every sampled rank has an age, the all-nil one too; as of the scrape's clock.
    assert!(out.contains(
        "continuum_dynamo_worker_load_sample_age_seconds{namespace=\"canary\",worker=\"cd\",dp_rank=\"0\"} 0\n"
    ));
    let later = render_at(&s, at_ms(2_500));
    assert!(later.contains(
        "continuum_dynamo_worker_load_sample_age_seconds{namespace=\"prod\",worker=\"ab\",dp_rank=\"1\"} 2.5\n"
    ), "{later}");
    assert!(
        !out.contains("worker=\"ab\",dp_rank=\"0\""),
        "rank 0 of ab never published"
    );
    let view_before = s.view();
    let rep = s.set_live_and_retain(&LiveSet::new(vec![LiveWorker::new(
        InstanceId::new(0xcd),
        "canary",
        0,
        1,
    )]));
    assert_eq!((rep.removed, rep.retained, rep.keys), (2, 1, 1));
    // Gate, sample and series are gone in the same call.
    assert!(!render(&s).contains("worker=\"ab\""));
    assert!(s.last(key(0xab, 1)).is_none());
    assert_eq!(
        s.apply(key(0xab, 1), &full, at_ms(1)),
        ApplyOutcome::Refused(Refusal::IdentityMismatch)
    );
    // A view pinned before the change sees nothing of the departed worker and cannot write it.
    assert!(view_before.read(key(0xab, 1)).sample.is_none());
    assert_eq!(
        view_before.apply(key(0xab, 1), &full, at_ms(1)),
        ApplyOutcome::Refused(Refusal::IdentityMismatch)
    );
    // The slot is reused by a newcomer without leaking the old sample.
    s.set_live_and_retain(&LiveSet::new(vec![
        worker(0xee, 0, 2),
        LiveWorker::new(InstanceId::new(0xcd), "canary", 0, 1),
    ]));
    assert!(s.last(key(0xee, 0)).is_none() && s.last(key(0xee, 1)).is_none());
    assert!(view_before.read(key(0xab, 1)).sample.is_none());
    assert_eq!(s.samples_held(), 1, "only cd's sample is held");
    // Returning worker starts empty.
    s.set_live_and_retain(&LiveSet::new(vec![LiveWorker::new(
        InstanceId::new(0xab),
        "prod",
        0,
        2,
    )]));
    assert!(s.last(key(0xab, 1)).is_none());
}

#[test]
fn live_set_from_fleet_uses_declared_ranks_and_defaults() {
    // Q-45, PICK-04: ranks dp_start_rank..+dp_size; undeclared means rank 0.
    let mk = |ns: &str, id: u64, start, size| Worker {
        namespace: ns.into(),
        instance_id: InstanceId::new(id),
        component: "decode".into(),
        endpoint: "generate".into(),
        role: Role::Decode,
        model: None,
        block_size: None,
        capacity: Capacity::default(),
        dp_start_rank: start,
        dp_size: size,
        disaggregated_endpoint: None,
        card: None,
        first_seen: UnixMillis(0),
        last_updated: UnixMillis(0),
        transport: None,
    };
    let view = FleetView {
        workers: vec![
            mk("a", 2, Some(4), Some(2)),
            mk("a", 1, None, None),
            mk("b", 3, None, Some(0)),
            mk("c", 2, Some(9), Some(9)),
        ],
        publishers: vec![],
    };
    let live = LiveSet::from_fleet(&view);
    let ids: Vec<u64> = live.workers().iter().map(|w| w.worker_id.get()).collect();
    assert_eq!(
        ids,
        vec![1, 2, 3],
        "sorted, a repeated id keeps its first occurrence"
    );
    let w2 = live.worker(InstanceId::new(2)).unwrap();
    assert!(!w2.has_rank(3) && w2.has_rank(4) && w2.has_rank(5) && !w2.has_rank(6));
    assert_eq!(&*w2.namespace, "a");
    let w1 = live.worker(InstanceId::new(1)).unwrap();
    assert!(w1.has_rank(0) && !w1.has_rank(1));
    assert!(
        live.worker(InstanceId::new(3)).unwrap().has_rank(0),
        "size 0 read as 1"
    );
    let s = LoadStore::new();
    assert_eq!(s.set_live_and_retain(&live).keys, 4);
    assert_eq!(s.key_count(), 4);
}
