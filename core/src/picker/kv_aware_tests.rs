//! Unit tests of the KV-aware picker, one or more per rule (KV-PICK-01..09, Q-26, DISC-MULTI-08,
//! PICK-04/11..14, SHIM-12). The formula by hand and the recorded upstream softmax are in
//! `kv_cost_tests.rs`.

use std::collections::VecDeque;

use crate::discovery::{FleetView, InstanceId, Role};
use crate::load::{Inflight, LoadKey};

use super::test_support::{MAX_AGE, MapLoads, at_ms, fleet, worker};
use super::{
    BlockHash, KvAwarePicker, KvOutcome, KvParams, KvScratch, KvStatus, KvTerms, LoadBasedPicker,
    NamespaceSet, NoOverlap, NoWorker, OverlapSource, Pick, PickInput, PickerCursors, Picks,
    PromptBlocks, PromptTokens, SelectionReason, SplitMix64, UnitSource, WorkerPicker,
    score_candidates,
};

pub(super) const NOW: u64 = 10_000;
pub(super) const FRESH: u64 = 9_000;
const STALE: u64 = 1_000;

pub(super) const HASHES: [BlockHash; 16] = {
    let mut h = [BlockHash(0); 16];
    let mut i = 0;
    while i < 16 {
        h[i] = BlockHash(0xC0DE_0000 + i as u64);
        i += 1;
    }
    h
};

/// Overlap held in a list: `(block_size, instance, rank, blocks)`, reported for prompts of that
/// block size (unclamped, as a misbehaving source could).
#[derive(Debug, Default, Clone)]
pub(super) struct MapOverlap(pub(super) Vec<(u32, u64, u32, u32)>);

impl OverlapSource for MapOverlap {
    fn find_matches(&self, prompt: PromptBlocks<'_>, visit: &mut dyn FnMut(LoadKey, u32)) {
        for &(bs, id, rank, blocks) in &self.0 {
            if bs == prompt.block_size && blocks > 0 {
                visit(LoadKey::new(InstanceId::new(id), rank), blocks);
            }
        }
    }
}

/// Scripted samples; counts the draws.
#[derive(Debug)]
struct Script(VecDeque<f64>, usize);

impl UnitSource for Script {
    fn next_unit(&mut self) -> f64 {
        self.1 += 1;
        self.0.pop_front().unwrap_or(0.0)
    }
}

pub(super) fn params(credit: f64, scale: f64, temperature: f64) -> KvParams {
    KvParams {
        overlap_score_credit: credit,
        prefill_load_scale: scale,
        temperature,
    }
}

pub(super) fn picker(p: KvParams) -> KvAwarePicker {
    KvAwarePicker::new(p, Box::new(SplitMix64::new(7)))
}

pub(super) fn blocks16(n: usize) -> [PromptBlocks<'static>; 1] {
    [PromptBlocks {
        block_size: 16,
        hashes: &HASHES[..n],
    }]
}

pub(super) fn input<'f>(
    f: &'f FleetView,
    loads: &'f MapLoads,
    ns: &'f dyn NamespaceSet,
    isl: u64,
    blocks: &'f [PromptBlocks<'f>],
    overlap: &'f dyn OverlapSource,
) -> PickInput<'f> {
    PickInput {
        fleet: f,
        loads,
        model: "m",
        namespaces: ns,
        prompt_tokens: PromptTokens(isl),
        now: at_ms(NOW),
        max_staleness: MAX_AGE,
        prompt_blocks: blocks,
        overlap,
        candidates: None,
    }
}

pub(super) fn pick_one<'f>(
    p: &mut KvAwarePicker,
    input: &PickInput<'f>,
) -> Result<Pick<'f>, NoWorker> {
    let mut out = Picks::new(1);
    p.pick(input, &mut out)?;
    out.first().copied().ok_or(NoWorker)
}

fn decode_ids(p: &mut KvAwarePicker, input: &PickInput<'_>, n: usize) -> Vec<(u64, u32)> {
    (0..n)
        .map(|_| {
            pick_one(p, input).map_or((0, 0), |k| (k.decode.instance_id.get(), k.decode.dp_rank))
        })
        .collect()
}

fn prefill_id(p: &Pick<'_>) -> Option<u64> {
    p.prefill.map(|c| c.instance_id.get())
}

#[test]
fn kv_pick_01_picker_scores_each_rank_with_its_overlap() {
    // Aggregated: the rank holding 4 of the 8 prompt blocks wins; the numbers are in the scores.
    let f = fleet(vec![
        worker("ns", 1, Role::Aggregated, "m"),
        worker("ns", 2, Role::Aggregated, "m"),
    ]);
    let mut l = MapLoads::default();
    l.sample(1, 0, at_ms(FRESH), Some(10), Some(0), None);
    l.sample(2, 0, at_ms(FRESH), Some(2), Some(0), None);
    let ov = MapOverlap(vec![(16, 1, 0, 4)]);
    let b = blocks16(8);
    let i = input(&f, &l, &["ns"], 130, &b, &ov);
    let mut s = KvScratch::new();
    let scored = score_candidates(&i, &params(1.0, 1.0, 0.0), &mut s);
    // Worker 1: raw 130/16 = 8.125 - 4 = 4.125; decode 10 + 9 - 4 = 15 -> 19.125.
    // Worker 2: 8.125; decode 2 + 9 = 11 -> 19.125 as well: a tie.
    assert_eq!(scored.len(), 2);
    assert_eq!(scored[0].overlap_blocks, 4);
    assert_eq!(scored[0].cost, Some(19.125));
    assert_eq!(scored[1].overlap_blocks, 0);
    assert_eq!(scored[1].cost, Some(19.125));
    assert_eq!(scored[0].status, KvStatus::Backlog);
    // A higher credit breaks the tie towards the overlap.
    let mut p = picker(params(1.5, 1.0, 0.0));
    let k = pick_one(&mut p, &i).unwrap();
    assert_eq!(k.decode.instance_id.get(), 1);
    assert_eq!(k.decode.reason, SelectionReason::KvAware);
    assert_eq!(
        k.kv,
        Some(KvOutcome {
            overlap_blocks: 4,
            block_size: 16
        })
    );
}

#[test]
fn kv_pick_02_minimum_cost_with_cursor_rotated_ties() {
    let f = fleet(vec![
        worker("ns", 1, Role::Aggregated, "m"),
        worker("ns", 2, Role::Aggregated, "m"),
        worker("ns", 3, Role::Aggregated, "m"),
    ]);
    let mut l = MapLoads::default();
    for id in 1..=3 {
        l.sample(
            id,
            0,
            at_ms(FRESH),
            Some(if id == 2 { 50 } else { 5 }),
            None,
            None,
        );
    }
    let b = blocks16(4);
    let i = input(&f, &l, &["ns"], 64, &b, &NoOverlap);
    let mut p = picker(params(1.0, 1.0, 0.0));
    // 1 and 3 tie; the decode cursor (an aggregated stage) rotates over them, one step per pick.
    assert_eq!(
        decode_ids(&mut p, &i, 4),
        vec![(1, 0), (3, 0), (1, 0), (3, 0)]
    );
    assert_eq!(
        p.cursors(),
        PickerCursors {
            decode: 4,
            prefill: 0
        }
    );
    // The cursor is the caller's: starting at 1 starts with the second tie.
    let mut p = picker(params(1.0, 1.0, 0.0)).with_cursors(PickerCursors {
        decode: 1,
        prefill: 9,
    });
    assert_eq!(decode_ids(&mut p, &i, 2), vec![(3, 0), (1, 0)]);
    assert_eq!(p.cursors().prefill, 9);
}

#[test]
fn kv_pick_03_positive_temperature_samples_with_one_draw_per_pick() {
    // Costs 4 (worker 1, 1 block held) and 5 (worker 2): softmax at t = 1 gives
    // [0.7310585786300049, 0.2689414213699951] (recorded above for costs [1, 2]).
    let f = fleet(vec![
        worker("ns", 1, Role::Aggregated, "m"),
        worker("ns", 2, Role::Aggregated, "m"),
    ]);
    let l = MapLoads::default();
    let ov = MapOverlap(vec![(16, 1, 0, 1)]);
    let b = blocks16(2);
    let i = input(&f, &l, &["ns"], 32, &b, &ov);
    let mut s = KvScratch::new();
    let costs: Vec<_> = score_candidates(&i, &params(1.0, 1.0, 1.0), &mut s)
        .iter()
        .map(|c| c.cost)
        .collect();
    // 1: 32/16 - 1 = 1, decode 2 - 1 = 1 -> 2. 2: 2 + 2 = 4. Range 2, so the same as [1, 2] at
    // t = 1 after normalisation.
    assert_eq!(costs, vec![Some(2.0), Some(4.0)]);
    let script = Script(
        VecDeque::from([0.5, 0.8, 0.7310585786300049, 0.731058578630005]),
        0,
    );
    let mut p = KvAwarePicker::new(params(1.0, 1.0, 1.0), Box::new(script));
    assert_eq!(
        decode_ids(&mut p, &i, 4),
        vec![(1, 0), (2, 0), (1, 0), (2, 0)]
    );
    assert_eq!(p.cursors().decode, 4);
    // The seeded generator stays in [0, 1) and is reproducible.
    let mut g = SplitMix64::new(42);
    let mut h = SplitMix64::new(42);
    for _ in 0..10_000 {
        let u = g.next_unit();
        assert!((0.0..1.0).contains(&u));
        assert_eq!(u, h.next_unit());
    }
}

#[test]
fn kv_pick_04_fresh_backlog_ranks_and_quiet_ranks_compete_others_are_excluded() {
    // A prefill pool: 1 fresh with backlog, 2 quiet, 3 fresh without the field, 4 silent with
    // load, 5 stalled.
    let f = fleet(vec![
        worker("ns", 1, Role::Prefill, "m"),
        worker("ns", 2, Role::Prefill, "m"),
        worker("ns", 3, Role::Prefill, "m"),
        worker("ns", 4, Role::Prefill, "m"),
        worker("ns", 5, Role::Prefill, "m"),
        worker("ns", 9, Role::Decode, "m"),
    ]);
    let mut l = MapLoads::default();
    l.sample(1, 0, at_ms(FRESH), Some(3), Some(160), None);
    l.sample(2, 0, at_ms(STALE), Some(0), Some(0), None);
    l.inflight(
        2,
        0,
        Inflight {
            prefill_tokens: 320,
            decode_blocks: 1,
            stalled: false,
        },
    );
    l.sample(3, 0, at_ms(FRESH), Some(0), None, Some(0));
    l.sample(4, 0, at_ms(STALE), None, Some(99), None);
    l.inflight(
        5,
        0,
        Inflight {
            prefill_tokens: 16,
            decode_blocks: 0,
            stalled: true,
        },
    );
    // Everyone except 1 holds the whole prompt: only 1 and 2 compete anyway.
    let ov = MapOverlap(vec![(16, 3, 0, 4), (16, 4, 0, 4), (16, 5, 0, 4)]);
    let b = blocks16(4);
    let i = input(&f, &l, &["ns"], 64, &b, &ov);
    let mut s = KvScratch::new();
    let scored = score_candidates(&i, &params(1.0, 1.0, 0.0), &mut s);
    let status: Vec<_> = scored.iter().map(|c| c.status).collect();
    assert_eq!(
        status,
        vec![
            KvStatus::Backlog,
            KvStatus::Backlog,
            KvStatus::NoStageField,
            KvStatus::SilentWithLoad,
            KvStatus::Stalled,
        ]
    );
    // 1: (160 + 64)/16 = 14 + decode 3 + 4 = 21. 2 (quiet, in-flight only): (320 + 64)/16 = 24
    // + 1 + 4 = 29.
    assert_eq!(
        scored[0].terms,
        KvTerms {
            active_prefill_tokens: 160,
            active_decode_blocks: 3
        }
    );
    assert_eq!(scored[0].cost, Some(21.0));
    assert_eq!(scored[1].cost, Some(29.0));
    assert!(scored[2..].iter().all(|c| c.cost.is_none()));
    let mut p = picker(params(1.0, 1.0, 0.0));
    let k = pick_one(&mut p, &i).unwrap();
    assert_eq!(prefill_id(&k), Some(1));
    assert_eq!(k.prefill.map(|c| c.reason), Some(SelectionReason::KvAware));
    assert_eq!(
        p.cursors(),
        PickerCursors {
            decode: 1,
            prefill: 1
        }
    );
}

#[test]
fn kv_pick_05_without_a_fresh_backlog_all_ranks_compete_on_overlap_and_size_only() {
    // dynamo.vllm: nil active_prefill_tokens everywhere. Worker 2 is heavily loaded and has
    // unanswered dispatches, worker 3 is silent with load and stalled: no backlog terms apply,
    // so the overlap decides and ties rotate.
    let f = fleet(vec![
        worker("ns", 1, Role::Prefill, "m"),
        worker("ns", 2, Role::Prefill, "m"),
        worker("ns", 3, Role::Prefill, "m"),
        worker("ns", 9, Role::Decode, "m"),
    ]);
    let mut l = MapLoads::default();
    l.sample(1, 0, at_ms(FRESH), None, None, Some(10));
    l.sample(2, 0, at_ms(FRESH), None, None, Some(900));
    l.inflight(
        2,
        0,
        Inflight {
            prefill_tokens: 50_000,
            decode_blocks: 500,
            stalled: false,
        },
    );
    l.sample(3, 0, at_ms(STALE), None, None, Some(900));
    l.inflight(
        3,
        0,
        Inflight {
            prefill_tokens: 64,
            decode_blocks: 0,
            stalled: true,
        },
    );
    let ov = MapOverlap(vec![(16, 2, 0, 3), (16, 3, 0, 3)]);
    let b = blocks16(4);
    let i = input(&f, &l, &["ns"], 64, &b, &ov);
    let mut s = KvScratch::new();
    let scored = score_candidates(&i, &params(1.0, 1.0, 0.0), &mut s);
    assert!(scored.iter().all(|c| c.status == KvStatus::NoBacklog));
    assert!(scored.iter().all(|c| c.terms == KvTerms::default()));
    // 1: 4 + 4 = 8. 2, 3: (4 - 3) + (4 - 3) = 2.
    let costs: Vec<_> = scored.iter().map(|c| c.cost).collect();
    assert_eq!(costs, vec![Some(8.0), Some(2.0), Some(2.0)]);
    let mut p = picker(params(1.0, 1.0, 0.0));
    let got: Vec<_> = (0..4)
        .map(|_| pick_one(&mut p, &i).ok().and_then(|k| prefill_id(&k)))
        .collect();
    assert_eq!(got, vec![Some(2), Some(3), Some(2), Some(3)]);
    // Every one of them is a KV-aware selection.
    let k = pick_one(&mut p, &i).unwrap();
    assert_eq!(k.prefill.map(|c| c.reason), Some(SelectionReason::KvAware));
}

#[test]
fn kv_pick_06_decode_side_of_a_pair_keeps_the_load_rules() {
    let mut d1 = worker("ns", 8, Role::Decode, "m");
    d1.capacity.total_kv_blocks = Some(100);
    let f = fleet(vec![
        worker("ns", 1, Role::Prefill, "m"),
        d1,
        worker("ns", 9, Role::Decode, "m"),
    ]);
    let mut l = MapLoads::default();
    // Decode 8: (10 + 4)/100; decode 9: (50 + 4)/1000: 9 is cheaper by the load-only cost even
    // though it holds less.
    l.sample(8, 0, at_ms(FRESH), Some(10), Some(0), None);
    l.sample(9, 0, at_ms(FRESH), Some(50), Some(0), None);
    let ov = MapOverlap(vec![(16, 8, 0, 4)]);
    let b = blocks16(4);
    let i = input(&f, &l, &["ns"], 64, &b, &ov);
    let mut p = picker(params(1.0, 1.0, 0.0));
    let k = pick_one(&mut p, &i).unwrap();
    assert_eq!(k.decode.instance_id.get(), 9);
    assert_eq!(k.decode.reason, SelectionReason::Load);
    assert_eq!(prefill_id(&k), Some(1));
    let events = k.events();
    assert_eq!(events[0].reason, SelectionReason::Load);
    assert_eq!(events[1].reason, SelectionReason::KvAware);
    assert_eq!(
        k.kv,
        Some(KvOutcome {
            overlap_blocks: 0,
            block_size: 16
        })
    );
    // No fresh decode sample: the decode cursor rotates (round_robin_stale).
    let l = MapLoads::default();
    let i = input(&f, &l, &["ns"], 64, &b, &ov);
    let mut p = picker(params(1.0, 1.0, 0.0));
    let got = decode_ids(&mut p, &i, 2);
    assert_eq!(got, vec![(8, 0), (9, 0)]);
    let k = pick_one(&mut p, &i).unwrap();
    assert_eq!(k.decode.reason, SelectionReason::RoundRobinStale);
}

#[test]
fn kv_pick_07_aggregated_backlog_uses_decode_blocks_plus_prefill_tokens_when_present() {
    let f = fleet(vec![
        worker("ns", 1, Role::Aggregated, "m"),
        worker("ns", 2, Role::Aggregated, "m"),
        worker("ns", 3, Role::Aggregated, "m"),
    ]);
    let mut l = MapLoads::default();
    // dynamo.vllm: kv_used_blocks stands in for active_decode_blocks, no prefill tokens.
    l.sample(1, 0, at_ms(FRESH), None, None, Some(30));
    // A sample with both fields.
    l.sample(2, 0, at_ms(FRESH), Some(6), Some(48), Some(999));
    l.inflight(
        2,
        0,
        Inflight {
            prefill_tokens: 16,
            decode_blocks: 2,
            stalled: false,
        },
    );
    // Fresh but without a decode field: excluded (KV-PICK-04 for the aggregated stage).
    l.sample(3, 0, at_ms(FRESH), None, Some(0), None);
    let b = blocks16(2);
    let i = input(&f, &l, &["ns"], 32, &b, &NoOverlap);
    let mut s = KvScratch::new();
    let scored = score_candidates(&i, &params(1.0, 1.0, 0.0), &mut s);
    assert_eq!(
        scored[0].terms,
        KvTerms {
            active_prefill_tokens: 0,
            active_decode_blocks: 30
        }
    );
    assert_eq!(
        scored[1].terms,
        KvTerms {
            active_prefill_tokens: 64,
            active_decode_blocks: 8
        }
    );
    // 1: 32/16 = 2 + 30 + 2 = 34. 2: (64 + 32)/16 = 6 + 8 + 2 = 16.
    assert_eq!(scored[0].cost, Some(34.0));
    assert_eq!(scored[1].cost, Some(16.0));
    assert_eq!(scored[2].status, KvStatus::NoStageField);
    let mut p = picker(params(1.0, 1.0, 0.0));
    let k = pick_one(&mut p, &i).unwrap();
    assert_eq!(k.decode.instance_id.get(), 2);
    assert_eq!(k.prefill, None);
    assert_eq!(k.events()[0].reason, SelectionReason::KvAware);
    assert_eq!(k.events()[1].reason, SelectionReason::NoPrefillPool);
}

#[test]
fn kv_pick_08_prefill_ranks_only_pair_with_decode_workers_of_their_namespace() {
    // Namespace "agg": prefill beside aggregated, no decode: evaluated as aggregated, the
    // prefill worker is not a candidate even though it holds the whole prompt.
    let f = fleet(vec![
        worker("agg", 1, Role::Prefill, "m"),
        worker("agg", 2, Role::Aggregated, "m"),
    ]);
    let l = MapLoads::default();
    let ov = MapOverlap(vec![(16, 1, 0, 4)]);
    let b = blocks16(4);
    let i = input(&f, &l, &["agg"], 64, &b, &ov);
    let mut s = KvScratch::new();
    let scored = score_candidates(&i, &params(1.0, 1.0, 0.0), &mut s);
    assert_eq!(scored.len(), 1);
    assert_eq!(scored[0].role, Role::Aggregated);
    let mut p = picker(params(1.0, 1.0, 0.0));
    let k = pick_one(&mut p, &i).unwrap();
    assert_eq!((k.decode.instance_id.get(), k.prefill), (2, None));
    assert_eq!(k.pin_headers().prefill, None);
    // A pool namespace: aggregated workers are never candidates (PICK-12), the decode side is a
    // decode worker.
    let f = fleet(vec![
        worker("pool", 1, Role::Prefill, "m"),
        worker("pool", 2, Role::Aggregated, "m"),
        worker("pool", 3, Role::Decode, "m"),
    ]);
    let ov = MapOverlap(vec![(16, 2, 0, 4)]);
    let i = input(&f, &l, &["pool"], 64, &b, &ov);
    let scored = score_candidates(&i, &params(1.0, 1.0, 0.0), &mut s);
    assert_eq!(scored.len(), 1);
    assert_eq!(scored[0].role, Role::Prefill);
    for _ in 0..3 {
        let k = pick_one(&mut p, &i).unwrap();
        assert_eq!((k.decode.instance_id.get(), prefill_id(&k)), (3, Some(1)));
    }
    // Only decode workers (no prefill): they prefill themselves and compete with the formula.
    let f = fleet(vec![
        worker("d", 4, Role::Decode, "m"),
        worker("d", 5, Role::Decode, "m"),
    ]);
    let ov = MapOverlap(vec![(16, 5, 0, 2)]);
    let i = input(&f, &l, &["d"], 64, &b, &ov);
    let k = pick_one(&mut p, &i).unwrap();
    assert_eq!((k.decode.instance_id.get(), k.prefill), (5, None));
    assert_eq!(k.decode.reason, SelectionReason::KvAware);
}

#[test]
fn disc_multi_08_prefill_scored_across_namespaces_then_decode_inside_the_winner() {
    let f = fleet(vec![
        worker("a", 1, Role::Prefill, "m"),
        worker("a", 2, Role::Decode, "m"),
        worker("b", 3, Role::Prefill, "m"),
        worker("b", 4, Role::Decode, "m"),
        worker("c", 5, Role::Prefill, "m"),
        worker("c", 6, Role::Decode, "m"),
    ]);
    let mut l = MapLoads::default();
    // b's decode worker is the busiest; the load-only picker would never choose b.
    l.sample(2, 0, at_ms(FRESH), Some(0), Some(0), None);
    l.sample(4, 0, at_ms(FRESH), Some(900), Some(0), None);
    // c holds more, but c is not a candidate namespace.
    let ov = MapOverlap(vec![(16, 3, 0, 3), (16, 5, 0, 4)]);
    let b = blocks16(4);
    let ns = ["a", "b"];
    let i = input(&f, &l, &ns, 64, &b, &ov);
    let mut p = picker(params(1.0, 1.0, 0.0));
    let k = pick_one(&mut p, &i).unwrap();
    assert_eq!(k.namespace, "b");
    assert_eq!((k.decode.instance_id.get(), prefill_id(&k)), (4, Some(3)));
    assert_eq!(
        k.kv,
        Some(KvOutcome {
            overlap_blocks: 3,
            block_size: 16
        })
    );
}

#[test]
fn mixed_pool_and_aggregated_namespaces_compete_in_one_kv_stage() {
    // "pool" (prefill + decode) and "agg" (aggregated only): their prefilling ranks compete on
    // the formula; the winner decides the shape of the pick. The prefill cursor indexes the
    // stage because it holds a prefill rank.
    let f = fleet(vec![
        worker("agg", 1, Role::Aggregated, "m"),
        worker("pool", 2, Role::Prefill, "m"),
        worker("pool", 3, Role::Decode, "m"),
    ]);
    let l = MapLoads::default();
    let b = blocks16(4);
    let ov = MapOverlap(vec![(16, 1, 0, 4)]);
    let i = input(&f, &l, &["agg", "pool"], 64, &b, &ov);
    let mut p = picker(params(1.0, 1.0, 0.0));
    let k = pick_one(&mut p, &i).unwrap();
    assert_eq!(
        (k.namespace, k.decode.instance_id.get(), k.prefill),
        ("agg", 1, None)
    );
    assert_eq!(
        p.cursors(),
        PickerCursors {
            decode: 0,
            prefill: 1
        }
    );
    let ov = MapOverlap(vec![(16, 2, 0, 4)]);
    let i = input(&f, &l, &["agg", "pool"], 64, &b, &ov);
    let k = pick_one(&mut p, &i).unwrap();
    assert_eq!(
        (k.namespace, k.decode.instance_id.get(), prefill_id(&k)),
        ("pool", 3, Some(2))
    );
    assert_eq!(
        p.cursors(),
        PickerCursors {
            decode: 1,
            prefill: 2
        }
    );
    // Equal costs rotate over both kinds.
    let i = input(&f, &l, &["agg", "pool"], 64, &b, &NoOverlap);
    let got: Vec<_> = (0..4)
        .map(|_| pick_one(&mut p, &i).map(|k| k.namespace).unwrap_or(""))
        .collect();
    assert_eq!(got, vec!["agg", "pool", "agg", "pool"]);
}

#[test]
fn no_prompt_blocks_behaves_exactly_like_the_load_based_picker() {
    let mut d = worker("a", 4, Role::Decode, "m");
    d.dp_size = Some(2);
    let f = fleet(vec![
        worker("a", 1, Role::Prefill, "m"),
        worker("a", 2, Role::Prefill, "m"),
        worker("a", 3, Role::Decode, "m"),
        d,
        worker("b", 5, Role::Aggregated, "m"),
        worker("b", 6, Role::Aggregated, "m"),
    ]);
    let mut l = MapLoads::default();
    l.sample(3, 0, at_ms(FRESH), Some(10), Some(5), None);
    l.sample(4, 1, at_ms(FRESH), Some(10), Some(5), None);
    l.sample(6, 0, at_ms(STALE), Some(10), Some(5), None);
    let ov = MapOverlap(vec![(16, 1, 0, 4)]);
    for want in [1, 3] {
        let start = PickerCursors {
            decode: 5,
            prefill: 2,
        };
        let mut kv = picker(params(1.0, 1.0, 1.0)).with_cursors(start);
        let mut lb = LoadBasedPicker::with_cursors(start);
        for round in 0..12 {
            let i = input(&f, &l, &["a", "b"], 40 + round * 7, &[], &ov);
            let (mut x, mut y) = (Picks::new(want), Picks::new(want));
            assert_eq!(kv.pick(&i, &mut x), lb.pick(&i, &mut y));
            let x: Vec<_> = x.iter().copied().collect();
            let y: Vec<_> = y.iter().copied().collect();
            assert_eq!(x, y, "round {round}");
            assert!(x.iter().all(|k| k.kv.is_none()));
            assert_eq!(kv.cursors(), lb.cursors());
        }
    }
    assert_eq!(picker(KvParams::default()).name(), "kv_aware");
}

#[test]
fn a_block_size_without_hashes_has_no_overlap() {
    let mut w32 = worker("ns", 2, Role::Aggregated, "m");
    w32.block_size = Some(32);
    let mut none = worker("ns", 3, Role::Aggregated, "m");
    none.block_size = None;
    let f = fleet(vec![worker("ns", 1, Role::Aggregated, "m"), w32, none]);
    let l = MapLoads::default();
    // The source would report worker 2 and 3 for 16-token hashes; only 16 is supplied, and
    // the 32-token entry has no hashes.
    let ov = MapOverlap(vec![
        (16, 1, 0, 1),
        (16, 2, 0, 4),
        (16, 3, 0, 4),
        (32, 2, 0, 2),
    ]);
    let b = [
        PromptBlocks {
            block_size: 16,
            hashes: &HASHES[..4],
        },
        PromptBlocks {
            block_size: 32,
            hashes: &[],
        },
    ];
    let i = input(&f, &l, &["ns"], 64, &b, &ov);
    let mut s = KvScratch::new();
    let scored = score_candidates(&i, &params(1.0, 1.0, 0.0), &mut s);
    let overlap: Vec<_> = scored.iter().map(|c| c.overlap_blocks).collect();
    assert_eq!(overlap, vec![1, 0, 0]);
    // 2: 64/32 = 2 + 2 = 4. 3: no block size, no cost.
    assert_eq!(scored[1].cost, Some(4.0));
    assert_eq!(
        (scored[2].status, scored[2].cost),
        (KvStatus::NoBlockSize, None)
    );
    // With 32-token hashes, worker 2 is credited from them only.
    let b = [
        PromptBlocks {
            block_size: 32,
            hashes: &HASHES[..2],
        },
        PromptBlocks {
            block_size: 16,
            hashes: &HASHES[..4],
        },
    ];
    let i = input(&f, &l, &["ns"], 64, &b, &ov);
    let scored = score_candidates(&i, &params(1.0, 1.0, 0.0), &mut s);
    let overlap: Vec<_> = scored.iter().map(|c| c.overlap_blocks).collect();
    assert_eq!(overlap, vec![1, 2, 0]);
}

#[test]
fn every_candidate_of_a_reported_rank_gets_its_overlap() {
    // One instance id in two namespaces is two candidates of one `(worker, rank)` key; the
    // source reports the key once, and both candidates (and only they) take its overlap.
    let f = fleet(vec![
        worker("a", 1, Role::Aggregated, "m"),
        worker("a", 2, Role::Aggregated, "m"),
        worker("b", 1, Role::Aggregated, "m"),
        worker("b", 3, Role::Aggregated, "m"),
    ]);
    let l = MapLoads::default();
    let ov = MapOverlap(vec![(16, 1, 0, 2), (16, 3, 0, 1)]);
    let b = blocks16(3);
    let i = input(&f, &l, &["a", "b"], 48, &b, &ov);
    let mut s = KvScratch::new();
    let got: Vec<(u64, u32)> = score_candidates(&i, &params(1.0, 1.0, 0.0), &mut s)
        .iter()
        .map(|c| (c.instance_id.get(), c.overlap_blocks))
        .collect();
    assert_eq!(got, [(1, 2), (2, 0), (1, 2), (3, 1)]);
}

#[test]
fn overlap_takes_the_largest_report_capped_at_the_prompt() {
    let f = fleet(vec![worker("ns", 1, Role::Aggregated, "m")]);
    let l = MapLoads::default();
    // Two shards report the same rank; one claims more blocks than the prompt has.
    let ov = MapOverlap(vec![(16, 1, 0, 2), (16, 1, 0, 9)]);
    let b = blocks16(3);
    let i = input(&f, &l, &["ns"], 48, &b, &ov);
    let mut s = KvScratch::new();
    assert_eq!(
        score_candidates(&i, &params(1.0, 1.0, 0.0), &mut s)[0].overlap_blocks,
        3
    );
}

#[test]
fn pick_04_and_shim_12_dp_ranks_are_candidates_with_headers() {
    let mut w = worker("ns", 1, Role::Prefill, "m");
    w.dp_start_rank = Some(4);
    w.dp_size = Some(2);
    let f = fleet(vec![w, worker("ns", 2, Role::Decode, "m")]);
    let l = MapLoads::default();
    let ov = MapOverlap(vec![(16, 1, 5, 3)]);
    let b = blocks16(4);
    let i = input(&f, &l, &["ns"], 64, &b, &ov);
    let mut p = picker(params(1.0, 1.0, 0.0));
    let k = pick_one(&mut p, &i).unwrap();
    assert_eq!(k.prefill.map(|c| c.dp_rank), Some(5));
    assert_eq!(k.dp_rank_headers.prefill_rank, Some(5));
    assert_eq!(k.dp_rank_headers.decode_rank, None);
    // Aggregated dp ranks: header present exactly when declared, rank 0 included.
    let mut a = worker("ns", 3, Role::Aggregated, "m");
    a.dp_size = Some(2);
    let f = fleet(vec![a]);
    let ov = MapOverlap(vec![(16, 3, 0, 1)]);
    let i = input(&f, &l, &["ns"], 64, &b, &ov);
    let k = pick_one(&mut p, &i).unwrap();
    assert_eq!(
        (k.decode.dp_rank, k.dp_rank_headers.decode_rank),
        (0, Some(0))
    );
}

#[test]
fn nothing_to_pick_and_nothing_costed() {
    let f = fleet(vec![worker("ns", 1, Role::Prefill, "m")]);
    let l = MapLoads::default();
    let b = blocks16(1);
    let mut p = picker(params(1.0, 1.0, 0.0));
    // A prefill worker alone is no candidate.
    assert_eq!(
        pick_one(&mut p, &input(&f, &l, &["ns"], 16, &b, &NoOverlap)),
        Err(NoWorker)
    );
    assert_eq!(
        pick_one(&mut p, &input(&f, &l, &["x"], 16, &b, &NoOverlap)),
        Err(NoWorker)
    );
    // No rank has a block size: the cursor rotates over all (round_robin_stale).
    let mut a = worker("ns", 1, Role::Aggregated, "m");
    a.block_size = None;
    let mut c = worker("ns", 2, Role::Aggregated, "m");
    c.block_size = Some(0);
    let f = fleet(vec![a, c]);
    let i = input(&f, &l, &["ns"], 16, &b, &NoOverlap);
    let got = decode_ids(&mut p, &i, 3);
    assert_eq!(got, vec![(1, 0), (2, 0), (1, 0)]);
    let k = pick_one(&mut p, &i).unwrap();
    assert_eq!(k.decode.reason, SelectionReason::RoundRobinStale);
    assert_eq!(
        k.kv,
        Some(KvOutcome {
            overlap_blocks: 0,
            block_size: 0
        })
    );
}

#[test]
fn alternates_follow_the_pick() {
    let f = fleet(vec![
        worker("ns", 1, Role::Aggregated, "m"),
        worker("ns", 2, Role::Aggregated, "m"),
        worker("ns", 3, Role::Aggregated, "m"),
        worker("other", 4, Role::Aggregated, "m"),
    ]);
    let l = MapLoads::default();
    let ov = MapOverlap(vec![(16, 1, 0, 1), (16, 3, 0, 3), (16, 4, 0, 2)]);
    let b = blocks16(4);
    let i = input(&f, &l, &["ns", "other"], 64, &b, &ov);
    let mut p = picker(params(1.0, 1.0, 0.0));
    let mut out = Picks::new(4);
    p.pick(&i, &mut out).unwrap();
    let got: Vec<_> = out
        .iter()
        .map(|k| (k.decode.instance_id.get(), k.kv.map(|o| o.overlap_blocks)))
        .collect();
    // 3 wins; then ns's others by cost (1 before 2); "other" never.
    assert_eq!(got, vec![(3, Some(3)), (1, Some(1)), (2, Some(0))]);
    // A pair's alternates are the load-ranked decode workers with the same prefill.
    let f = fleet(vec![
        worker("ns", 1, Role::Prefill, "m"),
        worker("ns", 2, Role::Decode, "m"),
        worker("ns", 3, Role::Decode, "m"),
    ]);
    let mut l = MapLoads::default();
    l.sample(2, 0, at_ms(FRESH), Some(90), Some(0), None);
    l.sample(3, 0, at_ms(FRESH), Some(10), Some(0), None);
    let i = input(&f, &l, &["ns"], 64, &b, &NoOverlap);
    let mut out = Picks::new(3);
    p.pick(&i, &mut out).unwrap();
    let got: Vec<_> = out
        .iter()
        .map(|k| (k.decode.instance_id.get(), prefill_id(k)))
        .collect();
    assert_eq!(got, vec![(3, Some(1)), (2, Some(1))]);
}
