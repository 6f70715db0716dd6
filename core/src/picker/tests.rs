//! Unit tests of the load-only picker, one or more per rule (PICK-01..14/17, DISC-MULTI-05..07,
//! SHIM-07/12).

use std::sync::Arc;

use crate::discovery::{FleetView, InstanceId, Role};
use crate::headers::PinHeaders;
use crate::load::{
    DispatchLedger, DispatchLoad, DispatchRole, Inflight, InflightReader, LiveSet, LoadStore,
};

use super::test_support::{MAX_AGE, MapLoads, at_ms, fleet, worker};
use super::{
    Chosen, LoadBasedPicker, NamespaceSet, NoOverlap, NoWorker, Pick, PickInput, PickScratch,
    PickerCursors, Picks, PromptTokens, SelectionEvent, SelectionReason, SelectionRole,
    WorkerPicker, estimate_prompt_tokens, pick_load_based,
};

const NOW: u64 = 10_000;
const FRESH: u64 = 9_000;
const STALE: u64 = 1_000;

fn pick<'f>(
    f: &'f FleetView,
    loads: &'f MapLoads,
    ns: &'f dyn NamespaceSet,
    prompt: u64,
    cursors: &mut PickerCursors,
) -> Result<Pick<'f>, NoWorker> {
    let input = PickInput {
        fleet: f,
        loads,
        model: "m",
        namespaces: ns,
        prompt_tokens: PromptTokens(prompt),
        now: at_ms(NOW),
        max_staleness: MAX_AGE,
        prompt_blocks: &[],
        overlap: &NoOverlap,
        candidates: None,
    };
    pick_load_based(&input, cursors, &mut PickScratch::new())
}

fn ids(f: &FleetView, loads: &MapLoads, ns: &dyn NamespaceSet, n: usize) -> Vec<u64> {
    let mut c = PickerCursors::default();
    (0..n)
        .map(|_| pick(f, loads, ns, 64, &mut c).map_or(0, |p| p.decode.instance_id.get()))
        .collect()
}

fn fresh_decode(l: &mut MapLoads, id: u64, blocks: u64) {
    l.sample(id, 0, at_ms(FRESH), Some(blocks), Some(0), None);
}

fn prefill_id(p: &Pick<'_>) -> Option<u64> {
    p.prefill.map(|c| c.instance_id.get())
}

#[test]
fn pick_01_decode_cost_counts_request_blocks_over_capacity() {
    let mut a = worker("ns", 1, Role::Decode, "m");
    a.capacity.total_kv_blocks = Some(100);
    let mut b = worker("ns", 2, Role::Decode, "m");
    b.capacity.total_kv_blocks = Some(10);
    let f = fleet(vec![a, b]);
    let mut l = MapLoads::default();
    fresh_decode(&mut l, 1, 10);
    fresh_decode(&mut l, 2, 0);
    let mut c = PickerCursors::default();
    // 64 tokens / 16 = 4 blocks: (10+4)/100 < (0+4)/10.
    let p = pick(&f, &l, &["ns"], 64, &mut c).unwrap();
    assert_eq!(p.decode.instance_id.get(), 1);
    assert_eq!(p.decode.reason, SelectionReason::Load);
    // An empty prompt: 10/100 > 0/10.
    let p = pick(&f, &l, &["ns"], 0, &mut c).unwrap();
    assert_eq!(p.decode.instance_id.get(), 2);
    // ceil: 17 tokens are 2 blocks: (10+2)/100 = 0.12 < (0+2)/10 = 0.2.
    let p = pick(&f, &l, &["ns"], 17, &mut c).unwrap();
    assert_eq!(p.decode.instance_id.get(), 1);
}

#[test]
fn pick_01_prefill_cost_is_tokens_over_batched_tokens() {
    let mut p1 = worker("ns", 1, Role::Prefill, "m");
    p1.capacity.max_num_batched_tokens = Some(1000);
    let mut p2 = worker("ns", 2, Role::Prefill, "m");
    p2.capacity.max_num_batched_tokens = Some(8000);
    let f = fleet(vec![p1, p2, worker("ns", 3, Role::Decode, "m")]);
    let mut l = MapLoads::default();
    l.sample(1, 0, at_ms(FRESH), None, Some(500), None);
    l.sample(2, 0, at_ms(FRESH), None, Some(1000), None);
    let mut c = PickerCursors::default();
    let p = pick(&f, &l, &["ns"], 64, &mut c).unwrap();
    assert_eq!(p.decode.instance_id.get(), 3);
    assert_eq!(prefill_id(&p), Some(2));
    assert_eq!(p.prefill.map(|c| c.reason), Some(SelectionReason::Load));
}

#[test]
fn pick_02_estimate_is_a_character_word_heuristic() {
    assert_eq!(estimate_prompt_tokens(b""), PromptTokens(0));
    // 11 characters -> 3; 2 words -> 3.
    assert_eq!(estimate_prompt_tokens(b"hello world"), PromptTokens(3));
    // 11 characters -> 3; 6 words -> 8.
    assert_eq!(estimate_prompt_tokens(b"a b c d e f"), PromptTokens(8));
    // Five Hangul syllables count one each.
    assert_eq!(
        estimate_prompt_tokens("안녕하세요".as_bytes()),
        PromptTokens(5)
    );
    // Invalid UTF-8 never fails.
    assert_eq!(estimate_prompt_tokens(&[0xff, 0x80]), PromptTokens(2));
    let long = "the quick brown fox ".repeat(100);
    let (a, b) = (long.as_bytes(), &long.as_bytes()[..1000]);
    assert!(estimate_prompt_tokens(a) >= estimate_prompt_tokens(b));
    assert_eq!(estimate_prompt_tokens(a), PromptTokens(534));
}

#[test]
fn pick_03_kv_used_blocks_replaces_nil_active_decode_blocks() {
    let f = fleet(vec![
        worker("ns", 1, Role::Decode, "m"),
        worker("ns", 2, Role::Decode, "m"),
    ]);
    let mut l = MapLoads::default();
    l.sample(1, 0, at_ms(FRESH), None, None, Some(500));
    l.sample(2, 0, at_ms(FRESH), None, None, Some(100));
    assert_eq!(ids(&f, &l, &["ns"], 3), vec![2, 2, 2]);
    // A present active_decode_blocks wins over kv_used_blocks.
    l.sample(2, 0, at_ms(FRESH), Some(900), None, Some(100));
    assert_eq!(ids(&f, &l, &["ns"], 2), vec![1, 1]);
}

#[test]
fn pick_04_one_candidate_per_dp_rank() {
    let mut w = worker("ns", 1, Role::Decode, "m");
    w.dp_start_rank = Some(2);
    w.dp_size = Some(3);
    let f = fleet(vec![w]);
    let mut l = MapLoads::default();
    for (rank, blocks) in [(2, 50), (3, 10), (4, 30)] {
        l.sample(1, rank, at_ms(FRESH), Some(blocks), None, None);
    }
    let mut c = PickerCursors::default();
    let p = pick(&f, &l, &["ns"], 64, &mut c).unwrap();
    assert_eq!(
        (p.decode.dp_rank, p.dp_rank_headers.decode_rank),
        (3, Some(3))
    );
    // Without fresh samples every rank takes its turn.
    let stale = MapLoads::default();
    let ranks: Vec<u32> = (0..4)
        .map(|_| {
            pick(&f, &stale, &["ns"], 64, &mut c)
                .unwrap()
                .decode
                .dp_rank
        })
        .collect();
    assert_eq!(ranks, vec![3, 4, 2, 3]);
}

#[test]
fn pick_05_undefined_costs_are_never_chosen() {
    // Prefill: a fresh sample without the field, and a zero capacity, are undefined.
    let mut zero = worker("ns", 3, Role::Prefill, "m");
    zero.capacity.max_num_batched_tokens = Some(0);
    let f = fleet(vec![
        worker("ns", 1, Role::Prefill, "m"),
        worker("ns", 2, Role::Prefill, "m"),
        zero,
        worker("ns", 9, Role::Decode, "m"),
    ]);
    let mut l = MapLoads::default();
    l.sample(1, 0, at_ms(FRESH), None, Some(4000), None);
    l.sample(2, 0, at_ms(FRESH), Some(0), None, None);
    l.sample(3, 0, at_ms(FRESH), None, Some(0), None);
    let mut c = PickerCursors::default();
    for _ in 0..4 {
        let p = pick(&f, &l, &["ns"], 64, &mut c).unwrap();
        assert_eq!(prefill_id(&p), Some(1));
    }
}

#[test]
fn pick_05_silent_with_load_is_undefined_and_quiet_competes_at_zero() {
    let f = fleet(vec![
        worker("ns", 1, Role::Decode, "m"),
        worker("ns", 2, Role::Decode, "m"),
    ]);
    let mut l = MapLoads::default();
    l.sample(1, 0, at_ms(STALE), Some(5), None, None);
    fresh_decode(&mut l, 2, 900);
    assert_eq!(ids(&f, &l, &["ns"], 3), vec![2, 2, 2]);
    // The last sample showed no backlog: quiet, backlog 0, so it wins against 900.
    l.sample(1, 0, at_ms(STALE), Some(0), Some(0), None);
    assert_eq!(ids(&f, &l, &["ns"], 2), vec![1, 1]);
    // Never published: quiet as well.
    l.0.remove(&MapLoads::key(1, 0));
    assert_eq!(ids(&f, &l, &["ns"], 2), vec![1, 1]);
}

#[test]
fn pick_06_lowest_defined_cost_with_rotating_ties() {
    let f = fleet(vec![
        worker("ns", 1, Role::Decode, "m"),
        worker("ns", 2, Role::Decode, "m"),
        worker("ns", 3, Role::Decode, "m"),
    ]);
    let mut l = MapLoads::default();
    fresh_decode(&mut l, 1, 10);
    fresh_decode(&mut l, 2, 50);
    fresh_decode(&mut l, 3, 10);
    assert_eq!(ids(&f, &l, &["ns"], 4), vec![1, 3, 1, 3]);
}

#[test]
fn pick_07_round_robin_over_all_when_nothing_is_fresh() {
    let f = fleet(vec![
        worker("ns", 1, Role::Decode, "m"),
        worker("ns", 2, Role::Decode, "m"),
        worker("ns", 3, Role::Decode, "m"),
    ]);
    let mut l = MapLoads::default();
    l.sample(1, 0, at_ms(STALE), Some(7), None, None); // silent with load: still in the rotation
    l.sample(2, 0, at_ms(STALE), Some(0), None, None);
    let mut c = PickerCursors::default();
    let got: Vec<(u64, SelectionReason)> = (0..4)
        .map(|_| {
            let p = pick(&f, &l, &["ns"], 64, &mut c).unwrap();
            (p.decode.instance_id.get(), p.decode.reason)
        })
        .collect();
    let rr = SelectionReason::RoundRobinStale;
    assert_eq!(got, vec![(1, rr), (2, rr), (3, rr), (1, rr)]);
}

#[test]
fn pick_07_vllm_prefill_pool_rotates() {
    let f = fleet(vec![
        worker("ns", 1, Role::Prefill, "m"),
        worker("ns", 2, Role::Prefill, "m"),
        worker("ns", 3, Role::Decode, "m"),
    ]);
    let mut l = MapLoads::default();
    // dynamo.vllm: nil active_prefill_tokens on fresh samples.
    l.sample(1, 0, at_ms(FRESH), None, None, Some(3));
    l.sample(2, 0, at_ms(FRESH), None, None, Some(300));
    fresh_decode(&mut l, 3, 0);
    let mut c = PickerCursors::default();
    let got: Vec<Option<u64>> = (0..3)
        .map(|_| prefill_id(&pick(&f, &l, &["ns"], 64, &mut c).unwrap()))
        .collect();
    assert_eq!(got, vec![Some(1), Some(2), Some(1)]);
    let p = pick(&f, &l, &["ns"], 64, &mut c).unwrap();
    assert_eq!(
        p.prefill.map(|c| c.reason),
        Some(SelectionReason::RoundRobinStale)
    );
    assert_eq!(p.decode.reason, SelectionReason::Load);
}

#[test]
fn pick_08_unanswered_dispatches_and_stalls_feed_costs() {
    let f = fleet(vec![
        worker("ns", 1, Role::Decode, "m"),
        worker("ns", 2, Role::Decode, "m"),
    ]);
    let mut l = MapLoads::default();
    fresh_decode(&mut l, 1, 0);
    fresh_decode(&mut l, 2, 5);
    assert_eq!(ids(&f, &l, &["ns"], 1), vec![1]);
    let backlog = Inflight {
        decode_blocks: 20,
        ..Inflight::default()
    };
    l.inflight(1, 0, backlog);
    assert_eq!(ids(&f, &l, &["ns"], 2), vec![2, 2]);
    // A quiet worker is filled by its in-flight additions too.
    l.0.remove(&MapLoads::key(1, 0));
    l.inflight(1, 0, backlog);
    assert_eq!(ids(&f, &l, &["ns"], 1), vec![2]);
    // Stalled: excluded while another has a defined cost.
    let stalled = Inflight {
        stalled: true,
        ..Inflight::default()
    };
    l.inflight(1, 0, stalled);
    fresh_decode(&mut l, 2, 900);
    assert_eq!(ids(&f, &l, &["ns"], 2), vec![2, 2]);
    // Nothing fresh: the stall judgement is ignored and the rotation includes it (LOAD-STORE-13).
    l.sample(2, 0, at_ms(STALE), Some(0), None, None);
    assert_eq!(ids(&f, &l, &["ns"], 2), vec![1, 2]);
}

#[test]
fn pick_09_events_cover_both_roles_with_closed_labels() {
    let f = fleet(vec![
        worker("ns", 1, Role::Prefill, "m"),
        worker("ns", 2, Role::Decode, "m"),
        worker("agg", 3, Role::Aggregated, "m"),
    ]);
    let mut l = MapLoads::default();
    l.sample(1, 0, at_ms(FRESH), None, Some(0), None);
    fresh_decode(&mut l, 2, 0);
    let mut c = PickerCursors::default();
    let p = pick(&f, &l, &["ns"], 64, &mut c).unwrap();
    let ev = |role, reason| SelectionEvent { role, reason };
    assert_eq!(
        p.events(),
        [
            ev(SelectionRole::Decode, SelectionReason::Load),
            ev(SelectionRole::Prefill, SelectionReason::Load)
        ]
    );
    let p = pick(&f, &l, &["agg"], 64, &mut c).unwrap();
    assert_eq!(
        p.events(),
        [
            ev(SelectionRole::Decode, SelectionReason::RoundRobinStale),
            ev(SelectionRole::Prefill, SelectionReason::NoPrefillPool)
        ]
    );
    let labels: Vec<_> = p
        .events()
        .iter()
        .map(|e| (e.role.label(), e.reason.label()))
        .collect();
    assert_eq!(
        labels,
        vec![
            ("decode", "round_robin_stale"),
            ("prefill", "no_prefill_pool")
        ]
    );
    assert_eq!(SelectionReason::Load.label(), "load");
}

#[test]
fn pick_10_no_capacity_fleet_round_robins() {
    let bare = |id| {
        let mut w = worker("ns", id, Role::Aggregated, "m");
        w.capacity = Default::default();
        w.block_size = None;
        w
    };
    let f = fleet(vec![bare(1), bare(2)]);
    let mut l = MapLoads::default();
    fresh_decode(&mut l, 1, 900);
    fresh_decode(&mut l, 2, 0);
    let mut c = PickerCursors::default();
    let got: Vec<(u64, SelectionReason)> = (0..3)
        .map(|_| {
            let p = pick(&f, &l, &["ns"], 64, &mut c).unwrap();
            (p.decode.instance_id.get(), p.decode.reason)
        })
        .collect();
    let rr = SelectionReason::RoundRobinStale;
    assert_eq!(got, vec![(1, rr), (2, rr), (1, rr)]);
}

#[test]
fn pick_11_12_aggregated_excluded_next_to_a_prefill_decode_pool() {
    let f = fleet(vec![
        worker("ns", 1, Role::Prefill, "m"),
        worker("ns", 2, Role::Decode, "m"),
        worker("ns", 3, Role::Aggregated, "m"),
    ]);
    let mut l = MapLoads::default();
    fresh_decode(&mut l, 2, 999);
    fresh_decode(&mut l, 3, 0);
    let mut c = PickerCursors::default();
    for _ in 0..5 {
        let p = pick(&f, &l, &["ns"], 64, &mut c).unwrap();
        assert_eq!(p.decode.instance_id.get(), 2);
        assert_eq!(prefill_id(&p), Some(1));
    }
}

#[test]
fn pick_13_decode_and_aggregated_compete_elsewhere() {
    let f = fleet(vec![
        worker("ns", 2, Role::Decode, "m"),
        worker("ns", 3, Role::Aggregated, "m"),
    ]);
    let mut l = MapLoads::default();
    fresh_decode(&mut l, 2, 999);
    fresh_decode(&mut l, 3, 0);
    assert_eq!(ids(&f, &l, &["ns"], 2), vec![3, 3]);
    fresh_decode(&mut l, 3, 999);
    fresh_decode(&mut l, 2, 0);
    assert_eq!(ids(&f, &l, &["ns"], 2), vec![2, 2]);
}

#[test]
fn pick_14_aggregated_pick_never_gets_a_prefill() {
    // A namespace with prefill and aggregated workers but no decode worker.
    let f = fleet(vec![
        worker("ns", 1, Role::Prefill, "m"),
        worker("ns", 3, Role::Aggregated, "m"),
        worker("pd", 4, Role::Prefill, "m"),
        worker("pd", 5, Role::Decode, "m"),
    ]);
    let mut l = MapLoads::default();
    fresh_decode(&mut l, 3, 0);
    fresh_decode(&mut l, 5, 500);
    let mut c = PickerCursors::default();
    for _ in 0..3 {
        let p = pick(&f, &l, &["ns", "pd"], 64, &mut c).unwrap();
        assert_eq!((p.namespace, p.decode.instance_id.get()), ("ns", 3));
        assert_eq!(p.prefill, None);
        assert_eq!(p.pin_headers().prefill, None);
        assert_eq!(p.events()[1].reason, SelectionReason::NoPrefillPool);
    }
    assert_eq!(c.prefill, 0, "no prefill selection ran");
}

#[test]
fn shim_07_decode_without_prefill_pool_is_pinned_alone() {
    let f = fleet(vec![
        worker("ns", 2, Role::Decode, "m"),
        worker("other", 1, Role::Prefill, "m"),
    ]);
    let l = MapLoads::default();
    let mut c = PickerCursors::default();
    let p = pick(&f, &l, &["ns", "other"], 64, &mut c).unwrap();
    assert_eq!((p.decode.instance_id.get(), p.prefill), (2, None));
    assert_eq!(p.events()[1].reason, SelectionReason::NoPrefillPool);
}

#[test]
fn disc_multi_05_only_candidate_namespaces() {
    let f = fleet(vec![
        worker("a", 1, Role::Decode, "m"),
        worker("b", 2, Role::Decode, "m"),
    ]);
    let mut l = MapLoads::default();
    fresh_decode(&mut l, 1, 0);
    fresh_decode(&mut l, 2, 900);
    assert_eq!(ids(&f, &l, &["b"], 2), vec![2, 2]);
    let owned: Vec<String> = vec!["a".into()];
    assert_eq!(ids(&f, &l, &owned, 1), vec![1]);
    let arcs: Vec<Arc<str>> = vec![Arc::from("c")];
    let mut c = PickerCursors::default();
    assert_eq!(pick(&f, &l, &arcs, 64, &mut c), Err(NoWorker));
    assert_eq!(c, PickerCursors::default());
}

#[test]
fn disc_multi_06_07_decode_across_namespaces_then_prefill_inside() {
    let f = fleet(vec![
        worker("a", 1, Role::Prefill, "m"),
        worker("a", 2, Role::Decode, "m"),
        worker("b", 3, Role::Prefill, "m"),
        worker("b", 4, Role::Decode, "m"),
    ]);
    let mut l = MapLoads::default();
    l.sample(1, 0, at_ms(FRESH), None, Some(0), None);
    fresh_decode(&mut l, 2, 900);
    l.sample(3, 0, at_ms(FRESH), None, Some(8000), None);
    fresh_decode(&mut l, 4, 0);
    let mut c = PickerCursors::default();
    let p = pick(&f, &l, &["a", "b"], 64, &mut c).unwrap();
    assert_eq!(p.namespace, "b");
    assert_eq!(p.decode.instance_id.get(), 4);
    assert_eq!(
        prefill_id(&p),
        Some(3),
        "the idler prefill of `a` is not eligible"
    );
}

#[test]
fn unknown_workers_and_other_models_are_never_candidates() {
    let mut none = worker("ns", 4, Role::Decode, "m");
    none.model = None;
    let f = fleet(vec![
        worker("ns", 1, Role::Unknown, "m"),
        worker("ns", 2, Role::Decode, "other"),
        worker("ns", 3, Role::Prefill, "m"),
        none,
    ]);
    let l = MapLoads::default();
    let mut c = PickerCursors::default();
    assert_eq!(pick(&f, &l, &["ns"], 64, &mut c), Err(NoWorker));
    let f = fleet(vec![
        worker("ns", 1, Role::Unknown, "m"),
        worker("ns", 5, Role::Decode, "m"),
    ]);
    assert_eq!(ids(&f, &l, &["ns"], 3), vec![5, 5, 5]);
}

#[test]
fn shim_12_rank_headers_exactly_when_dp_size_is_declared() {
    let mut p = worker("ns", 1, Role::Prefill, "m");
    p.dp_size = Some(1);
    let d = worker("ns", 2, Role::Decode, "m");
    let f = fleet(vec![p, d]);
    let l = MapLoads::default();
    let mut c = PickerCursors::default();
    let got = pick(&f, &l, &["ns"], 64, &mut c).unwrap();
    assert_eq!(got.dp_rank_headers.decode_rank, None);
    assert_eq!(got.dp_rank_headers.prefill_rank, Some(0));
    assert_eq!(
        got.pin_headers(),
        PinHeaders {
            worker: 2,
            worker_rank: None,
            prefill: Some(1),
            prefill_rank: Some(0),
        }
    );
    assert_eq!(
        got.prefill,
        Some(Chosen {
            instance_id: InstanceId::new(1),
            dp_rank: 0,
            reason: SelectionReason::RoundRobinStale,
        })
    );
}

#[test]
fn pick_17_picker_is_replaceable_behind_the_trait() {
    #[derive(Debug)]
    struct First;
    impl WorkerPicker for First {
        fn name(&self) -> &'static str {
            "first"
        }

        fn pick<'f>(&mut self, input: &PickInput<'f>, out: &mut Picks<'f>) -> Result<(), NoWorker> {
            out.clear();
            let w = input.fleet.workers.first().ok_or(NoWorker)?;
            out.push(Pick {
                namespace: &w.namespace,
                decode: Chosen {
                    instance_id: w.instance_id,
                    dp_rank: 0,
                    reason: SelectionReason::Load,
                },
                prefill: None,
                dp_rank_headers: Default::default(),
                kv: None,
            });
            Ok(())
        }
    }
    let f = fleet(vec![
        worker("ns", 1, Role::Decode, "m"),
        worker("ns", 2, Role::Decode, "m"),
    ]);
    let mut l = MapLoads::default();
    fresh_decode(&mut l, 1, 900);
    let input = PickInput {
        fleet: &f,
        loads: &l,
        model: "m",
        namespaces: &["ns"],
        prompt_tokens: PromptTokens(64),
        now: at_ms(NOW),
        max_staleness: MAX_AGE,
        prompt_blocks: &[],
        overlap: &NoOverlap,
        candidates: None,
    };
    let mut pickers: [Box<dyn WorkerPicker>; 2] =
        [Box::new(LoadBasedPicker::new()), Box::new(First)];
    let got: Vec<u64> = pickers
        .iter_mut()
        .map(|p| {
            let mut out = Picks::new(1);
            p.pick(&input, &mut out).unwrap();
            assert_eq!(out.len(), 1);
            out.first().unwrap().decode.instance_id.get()
        })
        .collect();
    assert_eq!(got, vec![2, 1]);
}

#[test]
fn store_loads_reads_the_real_store_and_ledgers() {
    let f = fleet(vec![
        worker("ns", 1, Role::Aggregated, "m"),
        worker("ns", 2, Role::Aggregated, "m"),
    ]);
    let store = LoadStore::new();
    store.set_live_and_retain(&LiveSet::from_fleet(&f));
    let now = at_ms(NOW);
    for id in [1, 2] {
        let s = crate::load::Sample {
            publisher_id: crate::discovery::PublisherId::new(id),
            sequence: 1,
            active_decode_blocks: Some(10),
            active_prefill_tokens: Some(0),
            kv_used_blocks: None,
        };
        store.apply(MapLoads::key(id, 0), &s, at_ms(FRESH));
    }
    let mut ledger = DispatchLedger::new();
    let tables = vec![ledger.table()];
    let load = DispatchLoad::for_role(DispatchRole::Aggregated, 640, Some(16));
    {
        let view = store.view();
        ledger.dispatch(&view, MapLoads::key(1, 0), load, now);
    }
    let view = store.view();
    let reader = InflightReader::new(&tables);
    let loads = super::StoreLoads::new(&view, &reader);
    let input = PickInput {
        fleet: &f,
        loads: &loads,
        model: "m",
        namespaces: &["ns"],
        prompt_tokens: PromptTokens(64),
        now,
        max_staleness: MAX_AGE,
        prompt_blocks: &[],
        overlap: &NoOverlap,
        candidates: None,
    };
    let mut c = PickerCursors::default();
    let mut s = PickScratch::new();
    for _ in 0..3 {
        let p = pick_load_based(&input, &mut c, &mut s).unwrap();
        assert_eq!(
            p.decode.instance_id.get(),
            2,
            "worker 1 carries 40 unanswered blocks"
        );
    }
}

#[test]
fn ordered_candidates_are_the_pick_then_its_namespace_by_cost() {
    // Three decode workers in "a" with backlogs 900, 300 and 500, an aggregated one in "b" at
    // 950: the pick is the cheapest of all (2); alternates come from its namespace only.
    let f = fleet(vec![
        worker("a", 1, Role::Decode, "m"),
        worker("a", 2, Role::Decode, "m"),
        worker("a", 3, Role::Decode, "m"),
        worker("a", 4, Role::Prefill, "m"),
        worker("b", 5, Role::Aggregated, "m"),
    ]);
    let mut l = MapLoads::default();
    fresh_decode(&mut l, 1, 900);
    fresh_decode(&mut l, 2, 300);
    fresh_decode(&mut l, 3, 500);
    fresh_decode(&mut l, 5, 950);
    let input = PickInput {
        fleet: &f,
        loads: &l,
        model: "m",
        namespaces: &["a", "b"],
        prompt_tokens: PromptTokens(64),
        now: at_ms(NOW),
        max_staleness: MAX_AGE,
        prompt_blocks: &[],
        overlap: &NoOverlap,
        candidates: None,
    };
    let mut p = LoadBasedPicker::new();
    let mut out = Picks::new(4);
    p.pick(&input, &mut out).unwrap();
    let decode: Vec<u64> = out.iter().map(|p| p.decode.instance_id.get()).collect();
    assert_eq!(
        decode,
        vec![2, 3, 1],
        "pick, then its namespace ascending by cost"
    );
    let first = *out.first().unwrap();
    for alt in out.iter() {
        assert_eq!(alt.namespace, "a");
        assert_eq!(
            alt.prefill, first.prefill,
            "alternates keep the pick's prefill"
        );
    }
    // Asking for one candidate gives exactly the single pick, and the same one.
    let mut one = Picks::new(1);
    LoadBasedPicker::new().pick(&input, &mut one).unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one.first().unwrap().decode, first.decode);
    // Limits are clamped to 1..=MAX_PICKS.
    assert_eq!(Picks::new(0).limit(), 1);
    assert_eq!(Picks::new(99).limit(), super::MAX_PICKS);
}

#[test]
fn a_preview_picks_as_the_next_pick_and_leaves_the_picker_alone() {
    use super::{BlockHash, KvAwarePicker, KvParams, PromptBlocks, SplitMix64};
    // Three tied workers: only the cursor tells them apart.
    let f = fleet(vec![
        worker("ns", 1, Role::Aggregated, "m"),
        worker("ns", 2, Role::Aggregated, "m"),
        worker("ns", 3, Role::Aggregated, "m"),
    ]);
    let l = MapLoads::default();
    let hashes = [BlockHash(7), BlockHash(8)];
    let blocks = [PromptBlocks {
        block_size: 16,
        hashes: &hashes,
    }];
    for kv in [false, true] {
        let input = PickInput {
            fleet: &f,
            loads: &l,
            model: "m",
            namespaces: &["ns"],
            prompt_tokens: PromptTokens(40),
            now: at_ms(NOW),
            max_staleness: MAX_AGE,
            prompt_blocks: if kv { &blocks } else { &[] },
            overlap: &NoOverlap,
            candidates: None,
        };
        let cursors = PickerCursors {
            decode: 1,
            prefill: 0,
        };
        let mut p: Box<dyn WorkerPicker> = if kv {
            Box::new(
                KvAwarePicker::new(KvParams::default(), Box::new(SplitMix64::new(3)))
                    .with_cursors(cursors),
            )
        } else {
            Box::new(LoadBasedPicker::with_cursors(cursors))
        };
        let mut out = Picks::new(1);
        for _ in 0..4 {
            // However often it is previewed, the next real pick is the previewed one.
            let previewed: Vec<u64> = (0..3)
                .map(|_| {
                    let mut copy = p.preview().unwrap();
                    copy.pick(&input, &mut out).unwrap();
                    out.first().unwrap().decode.instance_id.get()
                })
                .collect();
            p.pick(&input, &mut out).unwrap();
            let real = out.first().unwrap().decode.instance_id.get();
            assert_eq!(previewed, vec![real; 3], "kv: {kv}");
        }
    }
}

#[test]
fn a_kept_candidate_list_answers_only_for_its_table_model_and_namespace() {
    // One scratch across picks, as a shard holds it: the decode and prefill lists it keeps
    // from one pick must not answer for another model, another table or another namespace.
    // Fleet 1 has decode worker 7 where fleet 0 has 1.
    let fleets = [1, 7].map(|first| {
        Arc::new(fleet(vec![
            worker("a", first, Role::Decode, "m"),
            worker("a", 2, Role::Prefill, "m"),
            worker("a", 3, Role::Aggregated, "n"),
            worker("b", 4, Role::Aggregated, "m"),
            worker("b", 5, Role::Decode, "n"),
            worker("b", 6, Role::Prefill, "n"),
        ]))
    });
    let mut l = MapLoads::default();
    for id in 1..=7 {
        fresh_decode(&mut l, id, 10 * id % 70);
    }
    let tables = fleets.each_ref().map(super::FleetCandidates::build);
    let mut s = PickScratch::new();
    let mut c = PickerCursors::default();
    let mut run = |model: &str, ns: &[&str], table: usize| {
        let input = PickInput {
            fleet: &fleets[table],
            loads: &l,
            model,
            namespaces: &ns,
            prompt_tokens: PromptTokens(64),
            now: at_ms(NOW),
            max_staleness: MAX_AGE,
            prompt_blocks: &[],
            overlap: &NoOverlap,
            candidates: Some(&tables[table]),
        };
        let p = pick_load_based(&input, &mut c, &mut s).unwrap();
        (p.decode.instance_id.get(), prefill_id(&p))
    };
    for table in [0, 0, 1, 1, 0] {
        let first = [1, 7][table];
        assert_eq!(run("m", &["a", "b"], table), (first, Some(2)));
        assert_eq!(run("n", &["a", "b"], table), (3, None));
        assert_eq!(run("n", &["b"], table), (5, Some(6)));
        assert_eq!(run("m", &["b"], table), (4, None));
        assert_eq!(run("m", &["a", "b"], table), (first, Some(2)));
    }
}

#[test]
fn a_view_without_avoided_workers_never_picks_them_even_round_robin() {
    // Issue 38: the shard picks from `FleetView::without` after a dead pinned worker (or while
    // a worker's publisher is gone). Nothing fresh: PICK-07 would round-robin over all three.
    let full = fleet(vec![
        worker("ns", 1, Role::Prefill, "m"),
        worker("ns", 2, Role::Decode, "m"),
        worker("ns", 3, Role::Decode, "m"),
        worker("ns", 4, Role::Prefill, "m"),
    ]);
    assert!(
        full.without(&[InstanceId::new(9)]).is_none(),
        "nothing to leave out"
    );
    let f = full
        .without(&[InstanceId::new(2), InstanceId::new(1), InstanceId::new(9)])
        .unwrap();
    assert_eq!(
        f.workers
            .iter()
            .map(|w| w.instance_id.get())
            .collect::<Vec<_>>(),
        [3, 4],
        "the kept workers in order"
    );
    let l = MapLoads::default();
    let mut c = PickerCursors::default();
    for _ in 0..6 {
        let p = pick(&f, &l, &["ns"], 64, &mut c).unwrap();
        assert_eq!((p.decode.instance_id.get(), prefill_id(&p)), (3, Some(4)));
    }
    // Every decode worker avoided: no worker, and the caller keeps its first answer.
    let none = full
        .without(&[InstanceId::new(2), InstanceId::new(3)])
        .unwrap();
    assert_eq!(
        pick(&none, &l, &["ns"], 64, &mut c).map(|p| p.decode.instance_id),
        Err(NoWorker)
    );
}
