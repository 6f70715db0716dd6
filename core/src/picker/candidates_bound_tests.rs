//! Cell hints of a bound candidate table against the key lookups they replace, on a real
//! [`crate::load::LoadStore`] with in-flight tables: a hinted read equals the keyed read for
//! every rank, and stays equal after the store reassigns the hinted cell to another worker (the
//! stale hint must fall back, never read the newcomer's load).

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use crate::discovery::{InstanceId, PublisherId, Role};
use crate::load::{
    DispatchLedger, DispatchLoad, DispatchRole, InflightReader, LiveSet, LoadKey, LoadMemo,
    LoadStore, Sample,
};

use super::super::test_support::{fleet, worker};
use super::super::{LoadSource, StoreLoads};
use super::*;
use crate::clock::Instant;

fn at(ms: u64) -> Instant {
    Instant::from_origin(Duration::from_millis(ms))
}

fn sample(id: u64, decode: u64) -> Sample {
    Sample {
        publisher_id: PublisherId::new(id),
        sequence: 1,
        active_decode_blocks: Some(decode),
        active_prefill_tokens: Some(decode * 10),
        kv_used_blocks: None,
    }
}

/// Every rank of `table`'s model `m`, in table order.
fn ranks(table: &FleetCandidates) -> Vec<RankRef> {
    table
        .runs("m")
        .unwrap_or(&[])
        .iter()
        .flat_map(|r| r.ranks.iter().copied())
        .collect()
}

fn key(id: u64, rank: u32) -> LoadKey {
    LoadKey::new(InstanceId::new(id), rank)
}

#[test]
fn hinted_reads_equal_keyed_reads_and_a_reassigned_cell_is_never_read_through_a_stale_hint() {
    let now = at(10_000);
    let mut two_ranks = worker("a", 2, Role::Decode, "m");
    two_ranks.dp_size = Some(2);
    let first = Arc::new(fleet(vec![
        worker("a", 1, Role::Decode, "m"),
        two_ranks.clone(),
        worker("a", 3, Role::Prefill, "m"),
    ]));
    let store = LoadStore::new();
    store.set_live_and_retain(&LiveSet::from_fleet(&first));
    let mut ledger = DispatchLedger::new();
    {
        let view = store.view();
        for (k, decode) in [
            (key(1, 0), 5),
            (key(2, 0), 7),
            (key(2, 1), 9),
            (key(3, 0), 11),
        ] {
            view.apply(k, &sample(k.worker_id.get(), decode), at(9_900));
        }
        let load = DispatchLoad::for_role(DispatchRole::Aggregated, 640, Some(16));
        assert!(ledger.dispatch(&view, key(1, 0), load, at(9_950)).is_some());
        assert!(ledger.dispatch(&view, key(2, 1), load, at(9_950)).is_some());
    }
    let tables = [ledger.table()];
    let inflight = InflightReader::new(&tables);

    let memo = RefCell::new(LoadMemo::new());
    let table = FleetCandidates::build_bound(&first, &store.view());
    let unbound = FleetCandidates::build(&first);
    assert_eq!(unbound.bound_to(), None);
    assert_eq!(table.bound_to(), Some(store.view().generation()));
    let bound = ranks(&table);
    assert_eq!(bound.len(), 4);
    {
        let view = store.view();
        let loads = StoreLoads::new(&view, &inflight);
        for r in &bound {
            assert_eq!(r.card.slot, view.slot(r.key()).ok(), "{r:?}");
            let keyed = loads.key_load(r.key(), now);
            assert!(keyed.read.sample.is_some(), "{r:?}");
            assert_eq!(loads.rank_load(r.key(), r.card.slot, now), keyed, "{r:?}");
        }
        // The in-flight additions come through the hint too.
        let hinted = loads.rank_load(key(2, 1), bound[2].card.slot, now);
        assert!(hinted.inflight.decode_blocks > 0, "{hinted:?}");
        // And through the shard's memo, which now holds every rank's entry.
        let memoised = StoreLoads::memoised(&view, &inflight, &memo);
        for r in &bound {
            assert_eq!(
                memoised.rank_load(r.key(), r.card.slot, now),
                loads.key_load(r.key(), now)
            );
        }
    }

    // Worker 1 leaves and worker 4 arrives: the store hands worker 1's cell to worker 4.
    let second = Arc::new(fleet(vec![
        worker("a", 4, Role::Decode, "m"),
        two_ranks,
        worker("a", 3, Role::Prefill, "m"),
    ]));
    store.set_live_and_retain(&LiveSet::from_fleet(&second));
    let view = store.view();
    view.apply(key(4, 0), &sample(4, 1_000), at(9_990));
    let stale = bound[0];
    assert_eq!(stale.key(), key(1, 0));
    let reused = view.slot(key(4, 0)).ok();
    assert_eq!(
        reused.map(|s| s.slot),
        stale.card.slot.map(|s| s.slot),
        "the departed worker's cell went to the newcomer"
    );
    let loads = StoreLoads::new(&view, &inflight);
    let through_stale = loads.rank_load(stale.key(), stale.card.slot, now);
    assert_eq!(through_stale, loads.key_load(key(1, 0), now));
    let memoised = StoreLoads::memoised(&view, &inflight, &memo);
    assert_eq!(
        memoised.rank_load(stale.key(), stale.card.slot, now),
        through_stale,
        "the memo's entry for the old cell is not the departed worker's load"
    );
    assert_eq!(
        memoised.rank_load(key(4, 0), reused, now),
        loads.key_load(key(4, 0), now)
    );
    assert!(
        through_stale.read.sample.is_none(),
        "a departed worker has no load, whatever its old cell holds now: {through_stale:?}"
    );
    // Retained ranks keep their cells: the old hints still read them.
    for r in &bound[1..] {
        assert_eq!(
            loads.rank_load(r.key(), r.card.slot, now),
            loads.key_load(r.key(), now)
        );
    }
    // Rebinding the old table reads the new generation's cells.
    let rebound = table.rebound(&view);
    assert_eq!(rebound.bound_to(), Some(view.generation()));
    assert_ne!(rebound.bound_to(), table.bound_to());
    for (old, new) in bound.iter().zip(ranks(&rebound)) {
        assert_eq!(new.card.slot, view.slot(old.key()).ok());
    }
    assert_eq!(
        ranks(&rebound)[0].card.slot,
        None,
        "worker 1 has no cell now"
    );
}

#[test]
fn a_rank_card_copies_what_a_pick_reads_of_its_worker() {
    let mut w = worker("a", 9, Role::Aggregated, "m");
    w.block_size = Some(64);
    w.capacity.total_kv_blocks = Some(123);
    w.capacity.max_num_batched_tokens = None;
    let f = Arc::new(fleet(vec![w]));
    let table = FleetCandidates::build(&f);
    let [r] = ranks(&table)[..] else {
        panic!("one rank")
    };
    assert_eq!(r.card.instance_id, InstanceId::new(9));
    assert_eq!(r.card.block_size, Some(64));
    assert_eq!(r.card.total_kv_blocks, Some(123));
    assert_eq!(r.card.max_num_batched_tokens, None);
    assert_eq!(r.card.slot, None, "an unbound table has no hints");
}
