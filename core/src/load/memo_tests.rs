//! Tests of the load memo: step by step against direct reads, over random samples, dispatches,
//! finishes, discards, re-keyed slots and clock steps that land on (and next to) every
//! time-dependent judgement, with the writers refreshed or not.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, ManualClock};
use crate::discovery::PublisherId;
use crate::load::GROUP_SHIFT;

use super::super::test_support::{key, sample, store_with, worker};
use super::super::{
    DispatchId, DispatchLedger, DispatchLoad, DispatchRole, InflightReader, InflightTable, LiveSet,
    LoadKey, LoadStore, ProbeSet, RankProbe, Renewed, SlotRef,
};
use super::*;

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// The probes of `keys` with hints rotating over current, old (maybe stale) and none, by
/// `turn`.
fn probe_set(
    view: &LoadView<'_>,
    keys: &[LoadKey],
    old: &[Option<SlotRef>],
    turn: usize,
) -> ProbeSet {
    let mut set = ProbeSet::new();
    for (i, (k, old)) in keys.iter().zip(old).enumerate() {
        set.push(RankProbe {
            key: *k,
            hint: match (i + turn) % 3 {
                0 => view.slot(*k).ok(),
                1 => *old,
                _ => None,
            },
        });
    }
    set
}

/// Every key's memoised load equals its direct read, and a set read equals the digests of the
/// direct hinted reads: for `kept` (sets read at earlier steps too, whose checks carry over)
/// and for a set built now.
fn compare(
    store: &LoadStore,
    tables: &[Arc<InflightTable>],
    (memo, kept): (&mut LoadMemo, &mut [ProbeSet]),
    (keys, old, turn): (&[LoadKey], &[Option<SlotRef>], usize),
    now: Instant,
    context: &str,
) {
    let view = store.view();
    let reader = InflightReader::new(tables);
    let mut fresh = probe_set(&view, keys, old, turn);
    for (i, set) in kept.iter_mut().chain([&mut fresh]).enumerate() {
        let direct: Vec<LoadDigest> = set
            .probes()
            .iter()
            .map(|p| LoadDigest::of(&KeyLoad::assess_hinted(&view, &reader, p.key, p.hint, now)))
            .collect();
        let before = set.answers().to_vec();
        let read = memo.refresh(&view, &reader, set, now).to_vec();
        assert_eq!(read, direct, "set {i} at {now:?} ({context})");
        // Every answer not reported renewed is the one before.
        if let Renewed::These(renewed) = set.renewed() {
            assert_eq!(
                before.len(),
                read.len(),
                "set {i}: a partial read keeps every answer"
            );
            for (j, (b, r)) in before.iter().zip(&read).enumerate() {
                if !renewed.contains(&(j as u32)) {
                    assert_eq!(b, r, "set {i} probe {j} changed unreported ({context})");
                }
            }
        }
        assert_eq!(set.answers(), direct, "set {i} answers ({context})");
    }
    for k in keys {
        let direct = KeyLoad::assess(&view, &reader, *k, now);
        let memoised = view
            .slot(*k)
            .ok()
            .and_then(|s| memo.load(&view, &reader, s, now));
        match view.slot(*k) {
            Ok(_) => assert_eq!(memoised, Some(direct), "{k:?} at {now:?} ({context})"),
            Err(_) => assert_eq!(direct, KeyLoad::default(), "{k:?} ({context})"),
        }
    }
}

#[test]
fn memoised_loads_equal_direct_loads_at_every_step() {
    // Delays (ms) around the 5 s stall onset and the 30 s expiry, so reads land exactly on,
    // just before and just after the instants an entry's validity ends.
    let delays = [
        0u64, 1, 7, 300, 1_000, 2_999, 3_000, 4_999, 5_000, 5_001, 25_000, 30_000,
    ];
    let mut total_misses = 0u64;
    let mut steps = 0u64;
    for seed in 1..=40u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let clock = ManualClock::default();
        let mut live = vec![worker(1, 0, 2), worker(2, 0, 1), worker(3, 0, 1)];
        let store = store_with(live.clone());
        let mut ledgers = [DispatchLedger::new(), DispatchLedger::new()];
        let tables: Vec<_> = ledgers.iter().map(DispatchLedger::table).collect();
        let mut memo = LoadMemo::new();
        let all = [key(1, 0), key(1, 1), key(2, 0), key(3, 0), key(4, 0)];
        // Hints from the first generation: stale once workers 2 and 4 leave and come back.
        let old: Vec<Option<SlotRef>> = all.iter().map(|k| store.view().slot(*k).ok()).collect();
        let mut sets: Vec<ProbeSet> = (0..3)
            .map(|turn| probe_set(&store.view(), &all, &old, turn))
            .collect();
        let mut seqs = [0u64; 5];
        let mut ids: Vec<(usize, DispatchId)> = Vec::new();
        for step in 0..400 {
            let now = clock.now();
            let k = rng.below(5) as usize;
            match rng.below(12) {
                0..=2 => {
                    seqs[k] += 1;
                    let pick = |rng: &mut Rng| (rng.below(3) > 0).then(|| rng.below(50));
                    let s = sample(10 + k as u64, seqs[k], pick(&mut rng), pick(&mut rng));
                    let _ = store.apply(all[k], &s, now);
                }
                3..=4 => {
                    let role = [
                        DispatchRole::Aggregated,
                        DispatchRole::PairPrefill,
                        DispatchRole::PairDecode,
                    ][rng.below(3) as usize];
                    let shard = rng.below(2) as usize;
                    let load = DispatchLoad::for_role(role, rng.below(80), Some(16));
                    let view = store.view();
                    if let Some(id) = ledgers[shard].dispatch(&view, all[k], load, now) {
                        ids.push((shard, id));
                    }
                }
                5 if !ids.is_empty() => {
                    let (shard, id) = ids.swap_remove(rng.below(ids.len() as u64) as usize);
                    ledgers[shard].finish(&store.view(), id, now);
                }
                6 => {
                    let shard = rng.below(2) as usize;
                    ledgers[shard].refresh(&store.view(), now);
                }
                7 => {
                    store.discard_publisher(PublisherId::new(10 + k as u64));
                }
                8 if rng.below(8) == 0 => {
                    // Workers 2 and 4 leave or join together: cells are freed and reassigned
                    // with new epochs.
                    if live.iter().any(|w| w.worker_id.get() == 4) {
                        live.retain(|w| w.worker_id.get() != 4);
                        live.retain(|w| w.worker_id.get() != 2);
                    } else {
                        live.push(worker(4, 0, 1));
                        live.push(worker(2, 0, 1));
                    }
                    store.set_live_and_retain(&LiveSet::new(live.clone()));
                }
                _ => clock.advance(Duration::from_millis(
                    delays[rng.below(delays.len() as u64) as usize],
                )),
            }
            compare(
                &store,
                &tables,
                (&mut memo, &mut sets),
                (&all, &old, step),
                clock.now(),
                &format!("seed {seed} step {step}"),
            );
            // A second read at the same instant with nothing written is answered from the memo.
            let misses = memo.misses();
            let view = store.view();
            let reader = InflightReader::new(&tables);
            for k in &all {
                if let Ok(s) = view.slot(*k) {
                    let direct = KeyLoad::assess(&view, &reader, *k, clock.now());
                    assert_eq!(memo.load(&view, &reader, s, clock.now()), Some(direct));
                }
            }
            assert_eq!(
                memo.misses(),
                misses,
                "seed {seed} step {step}: re-read unchanged cells"
            );
            steps += 1;
        }
        total_misses += memo.misses();
    }
    assert!(steps >= 16_000);
    assert!(
        total_misses > steps && total_misses < steps * 4,
        "{total_misses} cell reads in {steps} steps of five keys: changes and expiries re-read, the rest do not"
    );
}

#[test]
fn a_reassigned_cell_is_no_one_s_load() {
    let store = store_with(vec![worker(1, 0, 1)]);
    let ledger = DispatchLedger::new();
    let tables = vec![ledger.table()];
    let reader = InflightReader::new(&tables);
    let clock = ManualClock::default();
    let mut memo = LoadMemo::new();
    store.apply(key(1, 0), &sample(11, 1, Some(7), None), clock.now());
    let view = store.view();
    let old: SlotRef = view.slot(key(1, 0)).unwrap();
    let first = memo.load(&view, &reader, old, clock.now()).unwrap();
    assert_eq!(
        first.read.sample.unwrap().sample.active_decode_blocks,
        Some(7)
    );
    drop(view);
    // Worker 1 departs, worker 2 takes its cell.
    store.set_live_and_retain(&LiveSet::new(vec![worker(2, 0, 1)]));
    store.apply(key(2, 0), &sample(12, 1, Some(40), None), clock.now());
    let view = store.view();
    let new = view.slot(key(2, 0)).unwrap();
    assert_eq!(new.slot, old.slot, "the freed cell is reused");
    assert_eq!(
        memo.load(&view, &reader, old, clock.now()),
        None,
        "stale hint"
    );
    let l = memo.load(&view, &reader, new, clock.now()).unwrap();
    assert_eq!(l.read.sample.unwrap().sample.active_decode_blocks, Some(40));
}

/// Two stores of worker 1 whose cells have the same slot, epoch and stamp but hold different
/// samples (decode 7 and 40, received at `now`).
fn twin_stores(now: Instant) -> (LoadStore, LoadStore) {
    let (a, b) = (
        store_with(vec![worker(1, 0, 1)]),
        store_with(vec![worker(1, 0, 1)]),
    );
    a.apply(key(1, 0), &sample(11, 1, Some(7), None), now);
    b.apply(key(1, 0), &sample(11, 1, Some(40), None), now);
    (a, b)
}

/// The memo answers each of [`twin_stores`] from its own cells (it starts over on another
/// store); a set's checks likewise hold only for the store they were taken on, and only from
/// the time of its latest answer (a clock that went back reads again).
#[test]
fn another_store_with_the_same_cells_starts_over() {
    let clock = ManualClock::default();
    clock.advance(Duration::from_secs(10));
    let (a, b) = twin_stores(clock.now());
    let ledger = DispatchLedger::new();
    let tables = vec![ledger.table()];
    let reader = InflightReader::new(&tables);
    let mut memo = LoadMemo::new();
    let (va, vb) = (a.view(), b.view());
    let (sa, sb) = (va.slot(key(1, 0)).unwrap(), vb.slot(key(1, 0)).unwrap());
    assert_eq!(sa, sb, "same slot and epoch");
    assert_eq!(va.stamp(sa.slot), vb.stamp(sb.slot), "same stamp");
    let decode = |l: Option<KeyLoad>| l.and_then(|l| l.read.sample?.sample.active_decode_blocks);
    assert_eq!(decode(memo.load(&va, &reader, sa, clock.now())), Some(7));
    assert_eq!(decode(memo.load(&vb, &reader, sb, clock.now())), Some(40));
    assert_eq!(decode(memo.load(&va, &reader, sa, clock.now())), Some(7));
    // A set likewise: its checks hold only for the store and from the time they were taken.
    let mut set = probe_set(&va, &[key(1, 0)], &[None], 0);
    let direct =
        |v: &LoadView<'_>, now| vec![LoadDigest::of(&KeyLoad::assess(v, &reader, key(1, 0), now))];
    let now = clock.now();
    assert_eq!(memo.refresh(&va, &reader, &mut set, now), direct(&va, now));
    assert_eq!(memo.refresh(&vb, &reader, &mut set, now), direct(&vb, now));
    assert_ne!(direct(&va, now), direct(&vb, now));
    let misses = memo.misses();
    assert_eq!(memo.refresh(&vb, &reader, &mut set, now), direct(&vb, now));
    assert_eq!(memo.misses(), misses, "unchanged: answered from the set");
    let earlier = Instant::from_origin(Duration::from_secs(1));
    assert_eq!(
        memo.refresh(&vb, &reader, &mut set, earlier),
        direct(&vb, earlier)
    );
    assert_eq!(
        memo.misses(),
        misses + 1,
        "a clock that went back reads again"
    );
}

#[test]
fn an_entry_is_not_used_after_its_maximum_age_or_before_it_was_read() {
    let store = store_with(vec![worker(1, 0, 1)]);
    let ledger = DispatchLedger::new();
    let tables = vec![ledger.table()];
    let reader = InflightReader::new(&tables);
    let clock = ManualClock::default();
    clock.advance(Duration::from_secs(10));
    let mut memo = LoadMemo::new();
    store.apply(key(1, 0), &sample(11, 1, Some(7), None), clock.now());
    let view = store.view();
    let s = view.slot(key(1, 0)).unwrap();
    let _ = memo.load(&view, &reader, s, clock.now());
    let read_at = memo.entries[s.slot as usize].read_at;
    assert_eq!(
        memo.entries[s.slot as usize].until,
        read_at + duration_nanos(MAX_ENTRY_AGE),
        "nothing in flight: only the age cap ends it"
    );
    clock.advance(MAX_ENTRY_AGE);
    let _ = memo.load(&view, &reader, s, clock.now());
    assert!(
        memo.entries[s.slot as usize].read_at > read_at,
        "read again"
    );
    let earlier = Instant::from_origin(Duration::from_secs(1));
    let _ = memo.load(&view, &reader, s, earlier);
    assert_eq!(
        memo.entries[s.slot as usize].read_at,
        nanos(earlier),
        "a clock that went back reads again"
    );
}

/// A key that leaves and comes back between two reads of a set lands in a cell of another
/// group; the set must then follow that cell's group (a later sample there is seen while the
/// old cell's group stays unchanged).
#[test]
fn a_probe_whose_key_moved_to_another_group_follows_its_new_cell() {
    let clock = ManualClock::default();
    let fillers: Vec<_> = (100..140).map(|id| worker(id, 0, 1)).collect();
    let with = |extra: &[u64]| {
        let mut live = fillers.clone();
        live.extend(extra.iter().map(|&id| worker(id, 0, 1)));
        LiveSet::new(live)
    };
    // Worker 50 takes the first cell (keys get cells in key order).
    let store = LoadStore::new();
    store.set_live_and_retain(&with(&[50]));
    let ledger = DispatchLedger::new();
    let tables = vec![ledger.table()];
    let reader = InflightReader::new(&tables);
    let mut memo = LoadMemo::new();
    let old = store.view().slot(key(50, 0)).unwrap();
    let mut set = probe_set(&store.view(), &[key(50, 0)], &[Some(old)], 1);
    let direct = |now| {
        let view = store.view();
        vec![LoadDigest::of(&KeyLoad::assess(
            &view,
            &reader,
            key(50, 0),
            now,
        ))]
    };
    store.apply(key(50, 0), &sample(11, 1, Some(5), None), clock.now());
    for _ in 0..2 {
        // The first read answers every probe, the second loads the group stamps.
        let view = store.view();
        assert_eq!(
            memo.refresh(&view, &reader, &mut set, clock.now()),
            direct(clock.now())
        );
    }
    // Worker 50 leaves, then returns with worker 20: worker 20 (first in key order) takes the
    // freed first cell, worker 50 a new cell past the fillers, in another group.
    store.set_live_and_retain(&with(&[]));
    store.set_live_and_retain(&with(&[20, 50]));
    let new = store.view().slot(key(50, 0)).unwrap();
    assert_ne!(new.slot >> GROUP_SHIFT, old.slot >> GROUP_SHIFT);
    store.apply(key(50, 0), &sample(11, 2, Some(6), None), clock.now());
    let view = store.view();
    assert_eq!(
        memo.refresh(&view, &reader, &mut set, clock.now()),
        direct(clock.now())
    );
    drop(view);
    for decode in 7..10 {
        clock.advance(Duration::from_millis(1));
        store.apply(
            key(50, 0),
            &sample(11, decode, Some(decode), None),
            clock.now(),
        );
        let view = store.view();
        assert_eq!(
            memo.refresh(&view, &reader, &mut set, clock.now()),
            direct(clock.now()),
            "a sample in the new cell's group"
        );
    }
}
