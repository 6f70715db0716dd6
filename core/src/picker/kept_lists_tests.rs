//! Differential test of the kept pick state: a shard's picker keeps its stage lists, their
//! probe sets' answers and the cost lanes derived from them across picks, and reads loads
//! through the shard's memo; every pick must equal a pick from scratch (new lists, direct reads)
//! with the same cursors, step by step, while samples, dispatches, finishes and the clock move
//! (across freshness, stall and expiry instants) and cells are reassigned.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;
use crate::discovery::{FleetView, InstanceId, PublisherId, Role};
use crate::load::{
    DEFAULT_MAX_STALENESS, DispatchId, DispatchLedger, DispatchLoad, DispatchRole, InflightReader,
    LiveSet, LoadKey, LoadMemo, LoadStore, Sample,
};

use super::test_support::{Rng, fleet, worker};
use super::{
    FleetCandidates, LoadBasedPicker, LoadSource, NoOverlap, PickInput, Picks, PromptTokens,
    StoreLoads, WorkerPicker,
};

/// The id of candidate worker `n` (1..=10): candidates are every seventh id, so that the store,
/// which hands out cells in key order, spreads them over several cell groups with the other
/// model's workers in between.
fn id(n: u64) -> u64 {
    n * 7
}

/// Two namespaces of model `m`: "a" with decode (one of two ranks), prefill and aggregated
/// workers, "b" aggregated only; capacities and block sizes differ per worker, one has none.
/// Between them, workers of model `other` (never candidates, but their cells are written too).
fn workers(with_newcomer: bool) -> Vec<crate::discovery::Worker> {
    let mut w = Vec::new();
    for n in 1..=10u64 {
        let (ns, role) = match n {
            1..=3 => ("a", Role::Decode),
            4..=5 => ("a", Role::Prefill),
            6 => ("a", Role::Aggregated),
            _ => ("b", Role::Aggregated),
        };
        if n == 9 && !with_newcomer {
            continue;
        }
        let mut x = worker(ns, id(n), role, "m");
        x.block_size = [Some(16), Some(32), Some(16), None][(n % 4) as usize];
        x.capacity.total_kv_blocks = Some(500 + 250 * (n % 3));
        x.capacity.max_num_batched_tokens = [Some(4096), Some(8192), Some(0)][(n % 3) as usize];
        if n == 2 {
            x.dp_size = Some(2);
        }
        w.push(x);
    }
    w.extend(
        (1..id(10))
            .filter(|i| i % 7 != 0)
            .map(|i| worker("b", i, Role::Aggregated, "other")),
    );
    w
}

/// The sampled keys: every candidate rank, and every fifth worker of the other model.
fn keys() -> Vec<LoadKey> {
    let mut k: Vec<LoadKey> = (1..=10)
        .map(|n| LoadKey::new(InstanceId::new(id(n)), 0))
        .collect();
    k.push(LoadKey::new(InstanceId::new(id(2)), 1));
    k.extend(
        (1..id(10))
            .filter(|i| i % 7 != 0 && i % 5 == 0)
            .map(|i| LoadKey::new(InstanceId::new(i), 0)),
    );
    k
}

fn input<'a>(
    f: &'a FleetView,
    loads: &'a dyn LoadSource,
    table: &'a FleetCandidates,
    prompt: PromptTokens,
    now: Instant,
) -> PickInput<'a> {
    PickInput {
        fleet: f,
        loads,
        model: "m",
        namespaces: &["a", "b"],
        prompt_tokens: prompt,
        now,
        max_staleness: DEFAULT_MAX_STALENESS,
        prompt_blocks: &[],
        overlap: &NoOverlap,
        candidates: Some(table),
    }
}

#[test]
fn kept_lists_through_the_memo_pick_as_a_pick_from_scratch() {
    let delays = [0u64, 1, 50, 400, 1_000, 2_999, 3_000, 3_001, 5_000, 30_000];
    let mut picks = 0u64;
    let mut by_load = 0u64;
    let mut spread = 0usize;
    for seed in 1..=12u64 {
        let mut rng = Rng::new(seed, 10);
        let mut now = Instant::from_origin(Duration::from_secs(100));
        let mut present = true;
        let mut f = Arc::new(fleet(workers(present)));
        let store = LoadStore::new();
        store.set_live_and_retain(&LiveSet::from_fleet(&f));
        let mut ledgers = [DispatchLedger::new(), DispatchLedger::new()];
        let tables: Vec<_> = ledgers.iter().map(DispatchLedger::table).collect();
        let memo = RefCell::new(LoadMemo::new());
        let mut table = FleetCandidates::build_bound(&f, &store.view());
        let view = store.view();
        let groups: std::collections::BTreeSet<u32> = (1..=10)
            .filter_map(|n| view.slot(LoadKey::new(InstanceId::new(id(n)), 0)).ok())
            .map(|s| s.slot >> crate::load::GROUP_SHIFT)
            .collect();
        spread = spread.max(groups.len());
        drop(view);
        let mut kept = LoadBasedPicker::new();
        let all = keys();
        let mut seqs = vec![0u64; all.len()];
        let mut ids: Vec<(usize, DispatchId)> = Vec::new();
        for step in 0..400 {
            let k = rng.below(all.len() as u64) as usize;
            match rng.below(10) {
                0..=3 => {
                    seqs[k] += 1;
                    let s = Sample {
                        publisher_id: PublisherId::new(100 + k as u64),
                        sequence: seqs[k],
                        active_decode_blocks: rng.opt(25, 400),
                        active_prefill_tokens: rng.opt(25, 400),
                        kv_used_blocks: rng.opt(25, 400),
                    };
                    let _ = store.apply(all[k], &s, now);
                }
                4..=5 => {
                    let role = rng.pick(&[
                        DispatchRole::Aggregated,
                        DispatchRole::PairPrefill,
                        DispatchRole::PairDecode,
                    ]);
                    let shard = rng.below(2) as usize;
                    let load = DispatchLoad::for_role(role, rng.below(2_000), Some(16));
                    if let Some(id) = ledgers[shard].dispatch(&store.view(), all[k], load, now) {
                        ids.push((shard, id));
                    }
                }
                6 if !ids.is_empty() => {
                    let (shard, id) = ids.swap_remove(rng.below(ids.len() as u64) as usize);
                    ledgers[shard].finish(&store.view(), id, now);
                }
                7 if rng.below(6) == 0 => {
                    // Worker 9 leaves or returns: its cell is freed or reassigned, the fleet
                    // and the candidate table change.
                    present = !present;
                    f = Arc::new(fleet(workers(present)));
                    store.set_live_and_retain(&LiveSet::from_fleet(&f));
                    table = FleetCandidates::build_bound(&f, &store.view());
                }
                _ => {
                    let d = rng.pick(&delays);
                    now = now.saturating_add(Duration::from_millis(d));
                }
            }
            let view = store.view();
            let reader = InflightReader::new(&tables);
            let memoised = StoreLoads::memoised(&view, &reader, &memo);
            let direct = StoreLoads::new(&view, &reader);
            let prompt = PromptTokens(1 + rng.below(3_000));
            let mut fresh = LoadBasedPicker::with_cursors(kept.cursors());
            // One candidate (the choice alone) or two (every cost kept for the runner-up).
            let want = 1 + step % 2;
            let (mut a, mut b) = (Picks::new(want), Picks::new(want));
            let got = kept.pick(&input(&f, &memoised, &table, prompt, now), &mut a);
            let want = fresh.pick(&input(&f, &direct, &table, prompt, now), &mut b);
            let context = format!("seed {seed} step {step}");
            assert_eq!(got, want, "{context}");
            let (a, b): (Vec<_>, Vec<_>) = (a.iter().collect(), b.iter().collect());
            assert_eq!(a, b, "{context}");
            assert_eq!(kept.cursors(), fresh.cursors(), "{context}");
            picks += 1;
            by_load += a.first().map_or(0, |p| {
                u64::from(p.decode.reason == super::SelectionReason::Load)
            });
        }
    }
    // Both selection rules were exercised: by cost and round-robin.
    assert!(
        by_load > picks / 5 && by_load < picks,
        "{by_load} of {picks} by load"
    );
}
