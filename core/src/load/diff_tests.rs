//! Unit tests of the best-effort rules with a `ManualClock`, and a differential test of the whole
//! store + ledgers + rules + selection pipeline against a naive reference model written straight
//! from the spec text (LOAD-STORE-07..13, PICK-05..08).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, Instant, ManualClock};
use crate::discovery::PublisherId;

use super::rules::{
    Candidate, Cost, KeyLoad, SelectReason, Stage, Standing, any_fresh, classify, select,
    stage_backlog,
};
use super::test_support::{key, sample, store_with, worker};
use super::{
    ApplyOutcome, DispatchId, DispatchLedger, DispatchLoad, DispatchRole, InflightReader,
    InflightTable, LoadKey, LoadMemo, LoadStore, LoadView, Sample, request_blocks,
};

const MAX_AGE: Duration = Duration::from_secs(3);
const BLOCK: Option<u32> = Some(16);

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// A store, two shards' ledgers and a hand-driven clock. Every read also goes through a load
/// memo, which must answer what the direct read answers (`super::memo`).
struct Rig {
    store: LoadStore,
    ledgers: Vec<DispatchLedger>,
    tables: Vec<Arc<InflightTable>>,
    clock: ManualClock,
    memo: RefCell<LoadMemo>,
}

impl Rig {
    fn new(keys: &[(u64, u32)]) -> Self {
        let store = store_with(keys.iter().map(|(w, n)| worker(*w, 0, *n)).collect());
        let ledgers = vec![DispatchLedger::new(), DispatchLedger::new()];
        let tables = ledgers.iter().map(DispatchLedger::table).collect();
        Self {
            store,
            ledgers,
            tables,
            clock: ManualClock::default(),
            memo: RefCell::new(LoadMemo::new()),
        }
    }

    /// One key's load, read directly and through the memo (asserted equal).
    fn read(&self, view: &LoadView<'_>, reader: &InflightReader<'_>, k: LoadKey) -> KeyLoad {
        let now = self.now();
        let direct = KeyLoad::assess(view, reader, k, now);
        if let Ok(slot) = view.slot(k) {
            let memoised = self.memo.borrow_mut().load(view, reader, slot, now);
            assert_eq!(memoised, Some(direct), "memoised read of {k:?} at {now:?}");
        }
        direct
    }

    fn now(&self) -> Instant {
        self.clock.now()
    }

    fn sample(&self, k: LoadKey, s: Sample) -> ApplyOutcome {
        self.store.apply(k, &s, self.now())
    }

    fn dispatch(&mut self, shard: usize, k: LoadKey, load: DispatchLoad) -> Option<DispatchId> {
        let now = self.now();
        let view = self.store.view();
        self.ledgers[shard].dispatch(&view, k, load, now)
    }

    fn finish(&mut self, shard: usize, id: DispatchId) {
        let now = self.now();
        let view = self.store.view();
        self.ledgers[shard].finish(&view, id, now);
    }

    /// Refreshes every shard (as each does before a pick or on its tick), then reads.
    fn loads(&mut self, keys: &[LoadKey]) -> Vec<KeyLoad> {
        let now = self.now();
        let view = self.store.view();
        for l in &mut self.ledgers {
            l.refresh(&view, now);
        }
        let reader = InflightReader::new(&self.tables);
        keys.iter().map(|k| self.read(&view, &reader, *k)).collect()
    }

    /// Reads without refreshing the writers (a reader on another shard between their ticks).
    fn loads_unrefreshed(&self, keys: &[LoadKey]) -> Vec<KeyLoad> {
        let view = self.store.view();
        let reader = InflightReader::new(&self.tables);
        keys.iter().map(|k| self.read(&view, &reader, *k)).collect()
    }

    fn standings(&mut self, keys: &[LoadKey]) -> Vec<Standing> {
        let now = self.now();
        let loads = self.loads(keys);
        let judge = any_fresh(&loads, MAX_AGE, now);
        loads
            .iter()
            .map(|l| classify(l, MAX_AGE, now, judge))
            .collect()
    }

    /// Decode selection with equal capacities (100 blocks) and 1-block requests.
    fn pick_decode(&mut self, keys: &[LoadKey], cursor: &mut u64) -> (usize, SelectReason) {
        let now = self.now();
        let loads = self.loads(keys);
        let judge = any_fresh(&loads, MAX_AGE, now);
        let cands: Vec<Candidate> = loads
            .iter()
            .map(|l| {
                let b = stage_backlog(classify(l, MAX_AGE, now, judge), &l.inflight, Stage::Decode);
                Candidate {
                    cost: b.backlog.and_then(|v| Cost::decode(v, 1, Some(100))),
                    fresh_field: b.fresh_field,
                }
            })
            .collect();
        let s = select(&cands, cursor).unwrap();
        (s.index, s.reason)
    }
}

fn aggregated(tokens: u64) -> DispatchLoad {
    DispatchLoad::for_role(DispatchRole::Aggregated, tokens, BLOCK)
}

#[test]
fn quiet_workers_compete_at_zero_plus_own_dispatches() {
    // LOAD-STORE-07, Q-06, LOAD-STORE-10
    let mut rig = Rig::new(&[(1, 1), (2, 1), (3, 1)]);
    let keys = [key(1, 0), key(2, 0), key(3, 0)];
    rig.sample(keys[0], sample(11, 1, Some(30), None));
    rig.sample(keys[1], sample(12, 1, Some(0), None));
    rig.clock.advance(secs(4)); // both samples stale now; 3 never published
    rig.sample(keys[0], sample(11, 2, Some(30), None)); // 1 fresh again with backlog 30
    let st = rig.standings(&keys);
    assert!(matches!(st[0], Standing::Fresh(_)));
    assert_eq!(
        (st[1], st[2]),
        (Standing::Quiet, Standing::Quiet),
        "published 0 / never published"
    );
    let mut cursor = 0;
    // Quiet workers cost 0: they win, and rotate on ties.
    let a = rig.pick_decode(&keys, &mut cursor);
    let b = rig.pick_decode(&keys, &mut cursor);
    assert_eq!([a.1, b.1], [SelectReason::Load; 2]);
    assert_eq!([a.0, b.0], [1, 2]);
    // Quiet workers are filled only up to the others' load by the router's own dispatches,
    // summed over both shards.
    for i in 0..30u64 {
        let k = keys[1 + (i % 2) as usize];
        rig.dispatch((i % 2) as usize, k, aggregated(16 * 2)); // 2 blocks each
    }
    let loads = rig.loads(&keys);
    assert_eq!(loads[1].inflight.decode_blocks, 30);
    assert_eq!(loads[1].inflight.prefill_tokens, 15 * 32);
    assert_eq!(rig.pick_decode(&keys, &mut cursor).0, 2, "28 < 30 and 30");
}

#[test]
fn silent_with_load_is_not_chosen_while_a_cost_is_defined() {
    // LOAD-STORE-08, PICK-06
    let mut rig = Rig::new(&[(1, 1), (2, 1)]);
    let keys = [key(1, 0), key(2, 0)];
    rig.sample(keys[0], sample(11, 1, None, Some(5))); // backlog in prefill tokens
    rig.clock.advance(secs(4));
    rig.sample(keys[1], sample(12, 1, Some(90), None));
    assert_eq!(rig.standings(&keys)[0], Standing::SilentWithLoad);
    let mut cursor = 0;
    for _ in 0..4 {
        assert_eq!(rig.pick_decode(&keys, &mut cursor), (1, SelectReason::Load));
    }
    // kv_used_blocks stands in for a nil active_decode_blocks (PICK-03) in the backlog test too.
    let kv_only = Sample {
        kv_used_blocks: Some(3),
        ..sample(11, 2, None, None)
    };
    rig.sample(keys[0], kv_only);
    rig.clock.advance(secs(4));
    rig.sample(keys[1], sample(12, 2, Some(90), None));
    assert_eq!(rig.standings(&keys)[0], Standing::SilentWithLoad);
}

#[test]
fn nothing_fresh_anywhere_rotates_over_all() {
    // LOAD-STORE-09, PICK-07
    let mut rig = Rig::new(&[(1, 1), (2, 1), (3, 1)]);
    let keys = [key(1, 0), key(2, 0), key(3, 0)];
    rig.sample(keys[0], sample(11, 1, Some(50), None));
    rig.sample(keys[1], sample(12, 1, Some(0), None));
    rig.clock.advance(secs(4));
    let mut cursor = 0;
    let picks: Vec<_> = (0..4)
        .map(|_| rig.pick_decode(&keys, &mut cursor))
        .collect();
    assert_eq!(
        picks,
        vec![
            (0, SelectReason::RoundRobinStale),
            (1, SelectReason::RoundRobinStale),
            (2, SelectReason::RoundRobinStale),
            (0, SelectReason::RoundRobinStale),
        ],
        "even the silent-with-load worker takes its turn"
    );
    // A dynamo.vllm prefill pool: fresh samples, all with nil prefill tokens.
    rig.sample(keys[0], sample(11, 2, None, None));
    let now = rig.now();
    let loads = rig.loads(&keys);
    let judge = any_fresh(&loads, MAX_AGE, now);
    let cands: Vec<Candidate> = loads
        .iter()
        .map(|l| {
            let b = stage_backlog(
                classify(l, MAX_AGE, now, judge),
                &l.inflight,
                Stage::Prefill,
            );
            Candidate {
                cost: b.backlog.and_then(|v| Cost::prefill(v, Some(8192))),
                fresh_field: b.fresh_field,
            }
        })
        .collect();
    assert!(cands.iter().all(|c| !c.fresh_field));
    assert_eq!(
        select(&cands, &mut 5).unwrap().reason,
        SelectReason::RoundRobinStale
    );
}

#[test]
fn dispatches_count_until_a_later_sample_or_thirty_seconds() {
    // LOAD-STORE-10
    let mut rig = Rig::new(&[(1, 1)]);
    let k = key(1, 0);
    rig.sample(k, sample(11, 1, Some(1), None));
    rig.dispatch(0, k, aggregated(40)); // same instant as the sample: not answered by it
    rig.clock.advance(secs(1));
    rig.dispatch(1, k, aggregated(20));
    let l = rig.loads(&[k])[0];
    assert_eq!(
        (l.inflight.prefill_tokens, l.inflight.decode_blocks),
        (60, 3 + 2)
    );
    rig.clock.advance(Duration::from_millis(500));
    rig.sample(k, sample(11, 2, Some(4), None)); // answers both
    assert_eq!(rig.loads(&[k])[0].inflight, Default::default());
    rig.dispatch(0, k, aggregated(16));
    rig.clock.advance(secs(30) - Duration::from_nanos(1));
    assert_eq!(
        rig.loads(&[k])[0].inflight.prefill_tokens,
        16,
        "just under 30 s"
    );
    rig.clock.advance(Duration::from_nanos(1));
    assert_eq!(
        rig.loads(&[k])[0].inflight.prefill_tokens,
        0,
        "expired at 30 s"
    );
    assert_eq!(rig.ledgers[0].tracked_keys(), 0, "pruned");
    // Readers on other shards correct summaries the writer has not yet refreshed.
    rig.dispatch(0, k, aggregated(16));
    rig.clock.advance(secs(1));
    rig.sample(k, sample(11, 3, Some(4), None));
    assert_eq!(
        rig.loads_unrefreshed(&[k])[0].inflight.prefill_tokens,
        0,
        "answered"
    );
    rig.dispatch(1, k, aggregated(16));
    rig.clock.advance(secs(31));
    assert_eq!(
        rig.loads_unrefreshed(&[k])[0].inflight.prefill_tokens,
        0,
        "expired"
    );
    assert_eq!(request_blocks(33, Some(16)), Some(3));
    assert_eq!(request_blocks(32, Some(16)), Some(2));
    assert_eq!(request_blocks(5, Some(0)), None);
}

#[test]
fn stall_after_five_seconds_until_a_sample_or_expiry() {
    // LOAD-STORE-11, Q-28
    let mut rig = Rig::new(&[(1, 1), (2, 1)]);
    let keys = [key(1, 0), key(2, 0)];
    let feed_other = |rig: &mut Rig, seq| {
        rig.sample(keys[1], sample(12, seq, Some(80), None));
    };
    feed_other(&mut rig, 1);
    rig.dispatch(0, keys[0], aggregated(17)); // 2 blocks: eligible
    rig.clock.advance(secs(5) - Duration::from_millis(1));
    feed_other(&mut rig, 2);
    assert_eq!(rig.standings(&keys)[0], Standing::Quiet, "4.999 s: not yet");
    rig.clock.advance(Duration::from_millis(1));
    feed_other(&mut rig, 3);
    assert_eq!(rig.standings(&keys)[0], Standing::Stalled);
    let mut cursor = 0;
    assert_eq!(
        rig.pick_decode(&keys, &mut cursor),
        (1, SelectReason::Load),
        "avoided"
    );
    rig.sample(keys[0], sample(11, 1, Some(0), None));
    assert!(
        matches!(rig.standings(&keys)[0], Standing::Fresh(_)),
        "a sample ends it"
    );
    // Until the request expires.
    rig.clock.advance(secs(1));
    rig.dispatch(1, keys[0], aggregated(32));
    rig.clock.advance(secs(29));
    feed_other(&mut rig, 4);
    assert_eq!(rig.standings(&keys)[0], Standing::Stalled, "29 s");
    rig.clock.advance(secs(1));
    feed_other(&mut rig, 5);
    assert_eq!(rig.standings(&keys)[0], Standing::Quiet, "expired at 30 s");
    // One block is not enough.
    rig.dispatch(0, keys[0], aggregated(16));
    rig.clock.advance(secs(6));
    feed_other(&mut rig, 6);
    assert_eq!(rig.standings(&keys)[0], Standing::Quiet);
}

/// The measured race on real mockers: the worker's last sample was taken while the request ran
/// (it shows its blocks); the request finishes; the worker's idle sample comes ~2 ms later. In
/// between, the finished request must not count against the worker (it is a credit off that
/// sample), on every shard's reader, writer refreshed or not; the next sample ends the credit.
#[test]
fn a_finished_answered_request_stops_counting_before_the_worker_s_next_sample() {
    let mut rig = Rig::new(&[(1, 1), (2, 1)]);
    let keys = [key(1, 0), key(2, 0)];
    rig.sample(keys[0], sample(11, 1, None, None));
    rig.sample(keys[1], sample(12, 1, Some(0), None));
    rig.clock.advance(Duration::from_millis(1));
    let id = rig.dispatch(0, keys[0], aggregated(640)).unwrap(); // 40 blocks of 16
    let other = rig.dispatch(1, keys[0], aggregated(320)).unwrap(); // 20 blocks, unanswered
    rig.clock.advance(Duration::from_millis(1));
    // The worker reports both requests running: 60 blocks, 960 prompt tokens in flight.
    let mut running = sample(11, 2, Some(60), Some(960));
    running.kv_used_blocks = Some(60);
    rig.sample(keys[0], running);
    rig.clock.advance(Duration::from_millis(1));
    let late = rig.dispatch(1, keys[0], aggregated(64)).unwrap(); // after the sample: unanswered
    let before = rig.loads(&keys)[0];
    assert_eq!(
        before
            .fresh(MAX_AGE, rig.now())
            .map(|s| s.sample.active_decode_blocks),
        Some(Some(60))
    );
    assert_eq!(
        before.inflight.decode_blocks, 4,
        "only the dispatch after the sample is added"
    );

    rig.clock.advance(Duration::from_millis(20));
    rig.finish(0, id);
    rig.finish(1, late); // unanswered at its finish: it keeps counting until answered
    for l in [rig.loads_unrefreshed(&keys)[0], rig.loads(&keys)[0]] {
        let s = l.fresh(MAX_AGE, rig.now()).expect("fresh").sample;
        assert_eq!(s.active_decode_blocks, Some(20), "{s:?}");
        assert_eq!(s.kv_used_blocks, Some(20), "{s:?}");
        assert_eq!(s.active_prefill_tokens, Some(320), "{s:?}");
        assert_eq!(l.inflight.decode_blocks, 4);
    }
    // The worker's next sample (taken after the finish) ends the credit: it is read as sent.
    rig.clock.advance(Duration::from_millis(2));
    let mut idle = sample(11, 3, Some(20), Some(320));
    idle.kv_used_blocks = Some(20);
    rig.sample(keys[0], idle);
    // (Unrefreshed, the late request that finished unanswered still floors: 20 + 4.)
    for (l, blocks) in [
        (rig.loads_unrefreshed(&keys)[0], 24),
        (rig.loads(&keys)[0], 20),
    ] {
        let s = l.fresh(MAX_AGE, rig.now()).expect("fresh").sample;
        assert_eq!(
            (s.active_decode_blocks, s.kv_used_blocks),
            (Some(blocks), Some(blocks))
        );
        assert_eq!(
            l.inflight.decode_blocks, 0,
            "the late dispatch is answered now"
        );
    }
    // A request that finishes after that sample credits again, against the new sample only.
    rig.clock.advance(Duration::from_millis(1));
    rig.finish(1, other);
    let s = rig.loads(&keys)[0]
        .fresh(MAX_AGE, rig.now())
        .expect("fresh")
        .sample;
    assert_eq!(s.active_decode_blocks, Some(0));
    assert_eq!(
        rig.loads(&keys)[1]
            .read
            .sample
            .map(|v| v.sample.active_decode_blocks),
        Some(Some(0))
    );
}

/// Real 1.6.1 mockers publish a sample as a request arrives, before it is scheduled: it answers
/// the dispatch but shows none of its blocks. The router's running request floors the sample's
/// blocks until it finishes; a sample showing more (another router's load) wins; a request
/// finished before any sample answered it never floors anything.
#[test]
fn a_running_request_floors_a_sample_taken_before_it_was_scheduled() {
    let mut rig = Rig::new(&[(1, 1), (2, 1)]);
    let keys = [key(1, 0), key(2, 0)];
    rig.sample(keys[0], sample(11, 1, Some(0), None));
    rig.sample(keys[1], sample(12, 1, Some(0), None));
    rig.clock.advance(Duration::from_millis(1));
    let id = rig.dispatch(0, keys[0], aggregated(640)).unwrap(); // 40 blocks of 16
    let gone = rig.dispatch(1, keys[1], aggregated(320)).unwrap();
    rig.finish(1, gone); // finished unanswered: it counts until answered, then leaves
    rig.clock.advance(Duration::from_millis(1));
    rig.sample(keys[0], sample(11, 2, Some(0), None)); // the arrival sample
    rig.sample(keys[1], sample(12, 2, Some(0), None));
    let decode = |l: &KeyLoad| l.read.sample.and_then(|s| s.sample.active_decode_blocks);
    // Another shard's reader before the writers refresh: answered records run on, including the
    // one that finished unanswered (an over-count until the refresh).
    let l = rig.loads_unrefreshed(&keys);
    assert_eq!(
        l[0].inflight.decode_blocks, 0,
        "answered by the arrival sample"
    );
    assert_eq!(decode(&l[0]), Some(40), "floored by the running request");
    assert_eq!((decode(&l[1]), l[1].inflight.decode_blocks), (Some(20), 0));
    let l = rig.loads(&keys);
    assert_eq!((decode(&l[0]), l[0].inflight.decode_blocks), (Some(40), 0));
    assert_eq!((decode(&l[1]), l[1].inflight.decode_blocks), (Some(0), 0));
    rig.clock.advance(Duration::from_millis(1));
    rig.sample(keys[0], sample(11, 3, Some(55), None));
    assert_eq!(
        decode(&rig.loads(&keys)[0]),
        Some(55),
        "a larger sample wins"
    );
    rig.clock.advance(Duration::from_millis(1));
    rig.finish(0, id);
    assert_eq!(
        decode(&rig.loads(&keys)[0]),
        Some(15),
        "floor gone, credit off the sample"
    );
}

#[test]
fn stall_ignores_pair_decode_and_finished_requests() {
    // LOAD-STORE-12
    let mut rig = Rig::new(&[(1, 1), (2, 1)]);
    let keys = [key(1, 0), key(2, 0)];
    let d = DispatchLoad::for_role(DispatchRole::PairDecode, 1000, BLOCK);
    assert_eq!(
        (d.prefill_tokens, d.decode_blocks, d.stall_eligible),
        (0, 63, false)
    );
    let p = DispatchLoad::for_role(DispatchRole::PairPrefill, 1000, BLOCK);
    assert_eq!(
        (p.prefill_tokens, p.decode_blocks, p.stall_eligible),
        (1000, 0, true)
    );
    rig.dispatch(0, keys[0], d);
    let id = rig.dispatch(1, keys[0], aggregated(100)).unwrap();
    rig.finish(1, id);
    rig.clock.advance(secs(6));
    rig.sample(keys[1], sample(12, 1, Some(10), None));
    let l = rig.loads(&keys)[0];
    assert!(!l.inflight.stalled);
    assert_eq!(
        l.inflight.decode_blocks,
        63 + 7,
        "finished requests still count as backlog"
    );
    assert_eq!(rig.standings(&keys)[0], Standing::Quiet);
}

#[test]
fn stall_judgement_is_ignored_when_nothing_is_fresh() {
    // LOAD-STORE-13
    let mut rig = Rig::new(&[(1, 1), (2, 1)]);
    let keys = [key(1, 0), key(2, 0)];
    rig.dispatch(0, keys[0], aggregated(100));
    rig.clock.advance(secs(6));
    assert!(rig.loads(&keys)[0].inflight.stalled);
    assert_eq!(rig.standings(&keys), vec![Standing::Quiet, Standing::Quiet]);
    rig.sample(keys[1], sample(12, 1, Some(10), None));
    assert_eq!(rig.standings(&keys)[0], Standing::Stalled);
}

#[test]
fn costs_compare_exactly_and_zero_capacity_is_undefined() {
    // PICK-01, PICK-06 ties, Q-47
    assert!(Cost::new(1, 3).unwrap() < Cost::new(1, 2).unwrap());
    assert_eq!(Cost::new(2, 4), Cost::new(1, 2));
    assert!(Cost::decode(5, 1, Some(0)).is_none() && Cost::prefill(5, None).is_none());
    let c = |n| Candidate {
        cost: Cost::new(n, 10),
        fresh_field: true,
    };
    let undefined = Candidate {
        cost: None,
        fresh_field: false,
    };
    let cands = [c(3), undefined, c(1), c(1)];
    let mut cur = 0;
    let picks: Vec<usize> = (0..3)
        .map(|_| select(&cands, &mut cur).unwrap().index)
        .collect();
    assert_eq!(picks, vec![2, 3, 2]);
    assert_eq!(select(&[], &mut cur), None);
    assert_eq!(SelectReason::RoundRobinStale.label(), "round_robin_stale");
}

// ---- differential test ----

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Copy)]
struct RefDispatch {
    key: usize,
    t: Instant,
    load: DispatchLoad,
    finished: bool,
    /// When it finished answered and unexpired: it is then a credit of its key.
    credited_at: Option<Instant>,
}

/// The spec, read literally, over the full history.
#[derive(Default)]
struct Model {
    held: HashMap<usize, (Sample, Instant)>,
    receipts: Vec<(usize, Instant)>,
    dispatches: Vec<RefDispatch>,
}

impl Model {
    fn apply(&mut self, k: usize, s: Sample, t: Instant) -> ApplyOutcome {
        if let Some((h, _)) = self.held.get(&k)
            && h.publisher_id == s.publisher_id
            && s.sequence <= h.sequence
        {
            return ApplyOutcome::Duplicate;
        }
        self.held.insert(k, (s, t));
        self.receipts.push((k, t));
        ApplyOutcome::Applied
    }

    /// Finishes dispatch `i` at `now`: answered before and not expired, it becomes a credit.
    fn finish(&mut self, i: usize, now: Instant) {
        let d = self.dispatches[i];
        let answered = self.receipts.iter().any(|(k, r)| *k == d.key && *r > d.t);
        let unexpired = now < d.t.saturating_add(super::DISPATCH_TTL);
        self.dispatches[i].finished = true;
        self.dispatches[i].credited_at = (answered && unexpired).then_some(now);
    }

    /// What finished on `k` since its last receipt: credits whose finish is after it.
    fn credit(&self, k: usize, stage: Stage) -> u64 {
        let last = self
            .receipts
            .iter()
            .filter(|(rk, _)| *rk == k)
            .map(|(_, r)| *r)
            .max();
        self.dispatches
            .iter()
            .filter(|d| d.key == k)
            .filter(|d| d.credited_at.is_some_and(|f| last.is_some_and(|r| r < f)))
            .map(|d| match stage {
                Stage::Prefill => d.load.prefill_tokens,
                Stage::Decode => d.load.decode_blocks,
            })
            .sum()
    }

    /// The blocks of `k`'s answered, unfinished, unexpired dispatches (the floor).
    fn running(&self, k: usize, now: Instant) -> u64 {
        self.dispatches
            .iter()
            .filter(|d| d.key == k && !d.finished)
            .filter(|d| self.receipts.iter().any(|(rk, r)| *rk == k && *r > d.t))
            .filter(|d| now < d.t.saturating_add(super::DISPATCH_TTL))
            .map(|d| d.load.decode_blocks)
            .sum()
    }

    fn counted(&self, d: &RefDispatch, now: Instant) -> bool {
        let answered = self.receipts.iter().any(|(k, r)| *k == d.key && *r > d.t);
        !answered && now < d.t.saturating_add(super::DISPATCH_TTL)
    }

    fn fresh(&self, k: usize, now: Instant) -> Option<Sample> {
        self.held
            .get(&k)
            .filter(|(_, r)| now.saturating_since(*r) <= MAX_AGE)
            .map(|(s, _)| *s)
    }

    /// (defined backlog, fresh_field) per candidate for a stage, from the definitions.
    fn judge(&self, n: usize, now: Instant, stage: Stage) -> Vec<(Option<u64>, bool)> {
        let any_fresh = (0..n).any(|k| self.fresh(k, now).is_some());
        (0..n)
            .map(|k| {
                let live: Vec<&RefDispatch> = self
                    .dispatches
                    .iter()
                    .filter(|d| d.key == k && self.counted(d, now))
                    .collect();
                let extra: u64 = live
                    .iter()
                    .map(|d| match stage {
                        Stage::Prefill => d.load.prefill_tokens,
                        Stage::Decode => d.load.decode_blocks,
                    })
                    .sum();
                let stalled = live.iter().any(|d| {
                    d.load.stall_eligible
                        && !d.finished
                        && now >= d.t.saturating_add(super::STALL_AFTER)
                });
                if any_fresh && stalled {
                    return (None, false);
                }
                // The sample less what finished since it (credits).
                let (pc, dc) = (
                    self.credit(k, Stage::Prefill),
                    self.credit(k, Stage::Decode),
                );
                // ... with the router's running requests' blocks as a floor under its blocks.
                let floor = self.running(k, now);
                let less = |v: Option<u64>, c: u64| v.map(|v| v.saturating_sub(c));
                let blocks = |v: Option<u64>| less(v, dc).map(|v| v.max(floor));
                let field = |s: &Sample| match stage {
                    Stage::Prefill => less(s.active_prefill_tokens, pc),
                    Stage::Decode => blocks(s.active_decode_blocks).or(blocks(s.kv_used_blocks)),
                };
                if let Some(s) = self.fresh(k, now) {
                    return (field(&s).map(|v| v + extra), field(&s).is_some());
                }
                match self.held.get(&k) {
                    Some((s, _)) => {
                        let d = blocks(s.active_decode_blocks)
                            .or(blocks(s.kv_used_blocks))
                            .unwrap_or(0);
                        let p = less(s.active_prefill_tokens, pc).unwrap_or(0);
                        if d > 0 || p > 0 {
                            (None, false)
                        } else {
                            (Some(extra), false)
                        }
                    }
                    None => (Some(extra), false),
                }
            })
            .collect()
    }

    fn select(
        judged: &[(Option<u64>, bool)],
        caps: &[u64],
        cursor: &mut u64,
    ) -> (usize, SelectReason) {
        let turn = *cursor;
        *cursor += 1;
        let costs: Vec<Option<(u64, u64)>> = judged
            .iter()
            .zip(caps)
            .map(|((b, _), c)| b.filter(|_| *c > 0).map(|b| (b, *c)))
            .collect();
        let defined: Vec<(usize, (u64, u64))> = costs
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.map(|c| (i, c)))
            .collect();
        if !judged.iter().any(|(_, f)| *f) || defined.is_empty() {
            return (
                (turn % judged.len() as u64) as usize,
                SelectReason::RoundRobinStale,
            );
        }
        let lt = |a: (u64, u64), b: (u64, u64)| {
            u128::from(a.0) * u128::from(b.1) < u128::from(b.0) * u128::from(a.1)
        };
        let mut best = defined[0].1;
        for (_, c) in &defined {
            if lt(*c, best) {
                best = *c;
            }
        }
        let ties: Vec<usize> = defined
            .iter()
            .filter(|(_, c)| !lt(*c, best) && !lt(best, *c))
            .map(|(i, _)| *i)
            .collect();
        (
            ties[(turn % ties.len() as u64) as usize],
            SelectReason::Load,
        )
    }
}

#[test]
fn differential_against_a_reference_model() {
    let layout = [(1u64, 2u32), (2, 1), (3, 1)];
    let keys = [key(1, 0), key(1, 1), key(2, 0), key(3, 0)];
    let decode_caps = [100u64, 100, 50, 200];
    let prefill_caps = [1000u64, 1000, 500, 0];
    let delays = [
        0u64, 1, 10, 500, 1_000, 2_500, 3_000, 4_000, 5_000, 6_000, 30_000,
    ];
    let mut checks = 0u32;
    let mut credited = 0u64;
    let mut floored = 0u64;
    for seed in 1..=60u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut rig = Rig::new(&layout);
        let mut model = Model::default();
        let mut seqs = [0u64; 4];
        let mut pids = [1u64, 2, 3, 4];
        let mut ids: Vec<(usize, DispatchId, usize)> = Vec::new();
        let (mut cur_real, mut cur_ref) = ([0u64; 2], [0u64; 2]);
        for _ in 0..300 {
            let now = rig.now();
            match rng.below(10) {
                0..=2 => {
                    let k = rng.below(4) as usize;
                    match rng.below(8) {
                        0 => pids[k] += 10,                                  // restarted publisher
                        1 => seqs[k] = seqs[k].saturating_sub(rng.below(3)), // duplicate
                        _ => seqs[k] += 1 + rng.below(2),
                    }
                    let pick = |rng: &mut Rng, hi| (rng.below(4) > 0).then(|| rng.below(hi));
                    let s = Sample {
                        publisher_id: PublisherId::new(pids[k]),
                        sequence: seqs[k],
                        active_decode_blocks: pick(&mut rng, 4),
                        active_prefill_tokens: pick(&mut rng, 3),
                        kv_used_blocks: pick(&mut rng, 5),
                    };
                    assert_eq!(
                        rig.sample(keys[k], s),
                        model.apply(k, s, now),
                        "seed {seed}"
                    );
                }
                3 => {
                    let pid = PublisherId::new(pids[rng.below(4) as usize]);
                    rig.store.discard_publisher(pid);
                    model.held.retain(|_, (s, _)| s.publisher_id != pid);
                }
                4..=5 => {
                    let k = rng.below(4) as usize;
                    let role = [
                        DispatchRole::Aggregated,
                        DispatchRole::PairPrefill,
                        DispatchRole::PairDecode,
                    ][rng.below(3) as usize];
                    let load = DispatchLoad::for_role(role, rng.below(60), BLOCK);
                    let shard = rng.below(2) as usize;
                    let id = rig.dispatch(shard, keys[k], load).unwrap();
                    ids.push((shard, id, model.dispatches.len()));
                    model.dispatches.push(RefDispatch {
                        key: k,
                        t: now,
                        load,
                        finished: false,
                        credited_at: None,
                    });
                }
                6 if !ids.is_empty() => {
                    let (shard, id, i) = ids.swap_remove(rng.below(ids.len() as u64) as usize);
                    rig.finish(shard, id);
                    model.finish(i, now);
                }
                _ => rig.clock.advance(Duration::from_millis(
                    delays[rng.below(delays.len() as u64) as usize],
                )),
            }
            // Compare every step: standings → stage backlogs → selections.
            let now = rig.now();
            credited += u64::from((0..4).any(|k| model.credit(k, Stage::Decode) > 0));
            floored += u64::from((0..4).any(|k| model.running(k, now) > 0));
            let loads = rig.loads(&keys);
            let judge = any_fresh(&loads, MAX_AGE, now);
            for (si, (stage, caps)) in
                [(Stage::Decode, decode_caps), (Stage::Prefill, prefill_caps)]
                    .into_iter()
                    .enumerate()
            {
                let real: Vec<(Option<u64>, bool)> = loads
                    .iter()
                    .map(|l| {
                        let b = stage_backlog(classify(l, MAX_AGE, now, judge), &l.inflight, stage);
                        (b.backlog, b.fresh_field)
                    })
                    .collect();
                let reference = model.judge(4, now, stage);
                assert_eq!(real, reference, "seed {seed} stage {stage:?} at {now:?}");
                let cands: Vec<Candidate> = real
                    .iter()
                    .zip(caps)
                    .map(|((b, f), c)| Candidate {
                        cost: b.and_then(|v| Cost::new(v, c)),
                        fresh_field: *f,
                    })
                    .collect();
                let s = select(&cands, &mut cur_real[si]).unwrap();
                let r = Model::select(&reference, &caps, &mut cur_ref[si]);
                assert_eq!((s.index, s.reason), r, "seed {seed} stage {stage:?}");
                checks += 1;
            }
        }
    }
    assert!(checks >= 36_000);
    // Finished requests must have been credited against stale samples in many steps.
    assert!(credited > 1_000, "{credited} steps with a credit");
    assert!(floored > 1_000, "{floored} steps with a floor");
}
