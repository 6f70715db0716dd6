//! Unit tests of conditional disaggregation (KV-PICK-12..15, Q-25): the decode score, the
//! effective-input policy, the decode gate, and the picks the KV-aware picker makes with it.

use crate::config::dynamo::ConditionalDisaggregation;
use crate::discovery::{FleetView, Role};
use crate::load::Inflight;

use super::kv_aware_tests::{FRESH, MapOverlap, blocks16, input, params, pick_one, picker};
use super::test_support::{MapLoads, at_ms, fleet, worker};
use super::{
    BypassDecision, ConditionalDisagg, DecodeRank, EFF_ISL_THRESHOLD, KvAwarePicker, KvOutcome,
    KvTerms, SelectionEvent, SelectionReason, SelectionRole, conditional_decode_cost,
    decide_bypass,
};

const GATE_OFF: ConditionalDisagg = ConditionalDisagg {
    decode_busy_threshold: None,
};

fn gate(threshold: f64) -> ConditionalDisagg {
    ConditionalDisagg {
        decode_busy_threshold: Some(threshold),
    }
}

fn rank(overlap_blocks: u32, sampled: Option<u64>, total: Option<u64>) -> DecodeRank {
    DecodeRank {
        block_size: 16,
        overlap_blocks,
        sampled_blocks: sampled,
        total_kv_blocks: total,
    }
}

/// A pool in `ns`: prefill worker 1, decode workers 2 and 3 (block size 16, 1000 blocks each).
fn pool() -> FleetView {
    fleet(vec![
        worker("ns", 1, Role::Prefill, "m"),
        worker("ns", 2, Role::Decode, "m"),
        worker("ns", 3, Role::Decode, "m"),
    ])
}

/// Fresh samples: the prefill worker idle, decode worker 2 at `d2` blocks, 3 at `d3`.
fn loads(d2: u64, d3: u64) -> MapLoads {
    let mut l = MapLoads::default();
    l.sample(1, 0, at_ms(FRESH), Some(0), Some(0), None);
    l.sample(2, 0, at_ms(FRESH), Some(d2), None, None);
    l.sample(3, 0, at_ms(FRESH), Some(d3), None, None);
    l
}

fn conditional(c: Option<ConditionalDisagg>) -> KvAwarePicker {
    picker(params(1.0, 1.0, 0.0)).with_conditional(c)
}

#[test]
fn kv_pick_12_decode_score_subtracts_the_overlap_credit_from_decode_cost() {
    let p = params(1.0, 1.0, 0.0);
    let terms = KvTerms {
        active_prefill_tokens: 500,
        active_decode_blocks: 15,
    };
    // decode_cost_blocks = 15 + (10 - 8) = 17; credit 8 -> 9 (the prefill backlog plays no part).
    assert_eq!(conditional_decode_cost(&p, 160, 16, 8, terms), Some(9.0));
    // Clamped at zero when the credit exceeds the decode cost.
    let idle = KvTerms::default();
    assert_eq!(conditional_decode_cost(&p, 160, 16, 10, idle), Some(0.0));
    // A half credit: 0 + 2 - 4 -> 0; 17 - 4 = 13.
    assert_eq!(
        conditional_decode_cost(&params(0.5, 1.0, 0.0), 160, 16, 8, terms),
        Some(13.0)
    );
    assert_eq!(conditional_decode_cost(&p, 160, 0, 8, terms), None);
    assert_eq!(
        conditional_decode_cost(&params(f64::NAN, 1.0, 0.0), 160, 16, 8, terms),
        None
    );
}

#[test]
fn kv_pick_12_pool_decode_ranks_compete_on_the_conditional_score() {
    let f = pool();
    // Decode worker 2 is busier (15 vs 10 blocks) but holds 8 of the 10 prompt blocks.
    let l = loads(15, 10);
    let ov = MapOverlap(vec![(16, 2, 0, 8)]);
    // 1,000 tokens (63 blocks, 8 held: 872 new, 87 %): the policy declines, the pair stays.
    let b = blocks16(10);
    let i = input(&f, &l, &["ns"], 1000, &b, &ov);
    // Off (KV-PICK-06): load-only decode, the less loaded worker 3.
    let off = pick_one(&mut conditional(None), &i).unwrap();
    assert_eq!(off.decode.instance_id.get(), 3);
    assert_eq!(off.decode.reason, SelectionReason::Load);
    // On: 15 + (63 - 8) - 8 = 62 against 10 + 63 = 73: worker 2, still paired with prefill 1.
    let mut p = conditional(Some(GATE_OFF));
    let on = pick_one(&mut p, &i).unwrap();
    assert_eq!(on.decode.instance_id.get(), 2);
    assert_eq!(on.decode.reason, SelectionReason::KvAware);
    assert_eq!(on.prefill.map(|c| c.instance_id.get()), Some(1));
    assert_eq!(p.last_bypass(), Some(BypassDecision::DeclinedByPolicy));
    assert!(!on.is_conditional_bypass());
}

#[test]
fn kv_pick_12_small_mostly_cached_requests_prefill_on_the_decode_worker() {
    let f = pool();
    let l = loads(15, 10);
    let ov = MapOverlap(vec![(16, 2, 0, 8)]);
    let b = blocks16(10);
    // 160 tokens, 128 cached on worker 2: 32 new tokens (20 %).
    let i = input(&f, &l, &["ns"], 160, &b, &ov);
    let mut p = conditional(Some(GATE_OFF));
    let k = pick_one(&mut p, &i).unwrap();
    assert_eq!(p.last_bypass(), Some(BypassDecision::AllowedGateDisabled));
    assert!(k.is_conditional_bypass());
    assert_eq!(k.decode.instance_id.get(), 2);
    assert_eq!(k.decode.reason, SelectionReason::ConditionalBypass);
    assert_eq!(k.prefill, None);
    assert_eq!(
        k.kv,
        Some(KvOutcome {
            overlap_blocks: 8,
            block_size: 16
        })
    );
    // KV-PICK-14: only the decode worker is pinned.
    let pins = k.pin_headers();
    assert_eq!(
        (pins.worker, pins.prefill, pins.prefill_rank),
        (2, None, None)
    );
    let both = [SelectionRole::Decode, SelectionRole::Prefill].map(|role| SelectionEvent {
        role,
        reason: SelectionReason::ConditionalBypass,
    });
    assert_eq!(k.events(), both);
}

#[test]
fn kv_pick_12_the_policy_follows_upstream_isl_bounding() {
    let p = params(1.0, 1.0, 0.0);
    let allow = |isl, overlap| decide_bypass(&GATE_OFF, &p, isl, rank(overlap, None, None));
    // No overlap: the whole prompt is new (100 % >= 70 %).
    assert_eq!(allow(160, 0), BypassDecision::DeclinedByPolicy);
    // 32 of 160 new (20 %).
    assert_eq!(allow(160, 8), BypassDecision::AllowedGateDisabled);
    // Exactly 70 % new is not below the ratio: 112 of 160 (3 blocks cached = 48 tokens).
    assert_eq!(allow(160, 3), BypassDecision::DeclinedByPolicy);
    // 2,048 new tokens or more never bypass, however much is cached (2,048 of 10,240: 20 %).
    let isl = 10_240;
    let cached_blocks = u32::try_from((isl - EFF_ISL_THRESHOLD) / 16).unwrap();
    assert_eq!(allow(isl, cached_blocks), BypassDecision::DeclinedByPolicy);
    assert_eq!(
        allow(isl, cached_blocks + 1),
        BypassDecision::AllowedGateDisabled
    );
    // The cache credit is weighted by overlap_score_credit, as upstream's cached tokens: 6 blocks
    // at full credit leave 64 of 160 new (40 %), at half credit 112 (70 %).
    assert_eq!(allow(160, 6), BypassDecision::AllowedGateDisabled);
    let half = params(0.5, 1.0, 0.0);
    assert_eq!(
        decide_bypass(&GATE_OFF, &half, 160, rank(6, None, None)),
        BypassDecision::DeclinedByPolicy
    );
    // Degenerate inputs decide without panicking.
    let nan = params(f64::NAN, 1.0, 0.0);
    assert_eq!(
        decide_bypass(&GATE_OFF, &nan, 160, rank(8, None, None)),
        BypassDecision::DeclinedByPolicy
    );
    assert_eq!(allow(0, 0), BypassDecision::AllowedGateDisabled);
    let no_size = DecodeRank {
        block_size: 0,
        ..rank(8, None, None)
    };
    assert_eq!(
        decide_bypass(&GATE_OFF, &p, 160, no_size),
        BypassDecision::DeclinedByPolicy
    );
}

#[test]
fn kv_pick_13_decode_busy_threshold_gates_the_bypass() {
    let p = params(1.0, 1.0, 0.0);
    // Expected active blocks: 15 sampled + (10 - 8) new = 17 of 1000.
    let decide = |t: f64, sampled, total| decide_bypass(&gate(t), &p, 160, rank(8, sampled, total));
    assert_eq!(
        decide(0.017, Some(15), Some(1000)),
        BypassDecision::AllowedNotBusy
    );
    assert_eq!(
        decide(0.016, Some(15), Some(1000)),
        BypassDecision::DeniedBusy
    );
    // Without a sample or capacity the bypass is refused.
    assert_eq!(
        decide(1.0, None, Some(1000)),
        BypassDecision::DeniedBusyUnknown
    );
    assert_eq!(
        decide(1.0, Some(15), None),
        BypassDecision::DeniedBusyUnknown
    );
    assert_eq!(
        decide(1.0, Some(15), Some(0)),
        BypassDecision::DeniedBusyUnknown
    );
    assert_eq!(
        decide(f64::NAN, Some(15), Some(1000)),
        BypassDecision::DeniedBusyUnknown
    );
    // The gate never turns a declined request into a bypass.
    assert_eq!(
        decide_bypass(&gate(1.0), &p, 160, rank(0, Some(0), Some(1000))),
        BypassDecision::DeclinedByPolicy
    );
}

#[test]
fn kv_pick_13_the_gate_reads_the_fresh_sample_and_unanswered_blocks() {
    let f = pool();
    let ov = MapOverlap(vec![(16, 2, 0, 8)]);
    let b = blocks16(10);
    // Worker 2: 15 sampled + 3 unanswered + 2 new = 20 blocks.
    let mut l = loads(15, 40);
    l.inflight(
        2,
        0,
        Inflight {
            decode_blocks: 3,
            ..Inflight::default()
        },
    );
    let i = input(&f, &l, &["ns"], 160, &b, &ov);
    let mut p = conditional(Some(gate(0.02)));
    assert!(pick_one(&mut p, &i).unwrap().is_conditional_bypass());
    let mut p = conditional(Some(gate(0.019)));
    let k = pick_one(&mut p, &i).unwrap();
    assert_eq!(p.last_bypass(), Some(BypassDecision::DeniedBusy));
    assert_eq!(k.prefill.map(|c| c.instance_id.get()), Some(1));
    assert_eq!(k.decode.instance_id.get(), 2);
    // No decode sample at all: the ranks compete without backlog and the gate refuses.
    let mut quiet = MapLoads::default();
    quiet.sample(1, 0, at_ms(FRESH), Some(0), Some(0), None);
    let i = input(&f, &quiet, &["ns"], 160, &b, &ov);
    let mut p = conditional(Some(gate(1.0)));
    let k = pick_one(&mut p, &i).unwrap();
    assert_eq!(p.last_bypass(), Some(BypassDecision::DeniedBusyUnknown));
    assert!(k.prefill.is_some());
    // The same fleet without the gate bypasses.
    let mut p = conditional(Some(GATE_OFF));
    assert!(pick_one(&mut p, &i).unwrap().is_conditional_bypass());
}

#[test]
fn q_25_a_bypass_still_sends_the_decode_rank_header() {
    let mut d = worker("ns", 2, Role::Decode, "m");
    d.dp_size = Some(2);
    let f = fleet(vec![worker("ns", 1, Role::Prefill, "m"), d]);
    let mut l = MapLoads::default();
    l.sample(1, 0, at_ms(FRESH), Some(0), Some(0), None);
    l.sample(2, 0, at_ms(FRESH), Some(50), None, None);
    l.sample(2, 1, at_ms(FRESH), Some(0), None, None);
    let ov = MapOverlap(vec![(16, 2, 1, 8)]);
    let b = blocks16(10);
    let i = input(&f, &l, &["ns"], 160, &b, &ov);
    let k = pick_one(&mut conditional(Some(GATE_OFF)), &i).unwrap();
    assert!(k.is_conditional_bypass());
    let pins = k.pin_headers();
    assert_eq!((pins.worker, pins.worker_rank), (2, Some(1)));
    assert_eq!((pins.prefill, pins.prefill_rank), (None, None));
}

#[test]
fn kv_pick_15_off_by_default_and_aggregated_fleets_are_untouched() {
    assert_eq!(
        ConditionalDisagg::from_config(&ConditionalDisaggregation::default()),
        None
    );
    let on = ConditionalDisaggregation {
        enabled: true,
        decode_busy_threshold: Some(0.5),
    };
    assert_eq!(ConditionalDisagg::from_config(&on), Some(gate(0.5)));
    // An aggregated namespace prefills locally anyway: the pick is the usual kv_aware one.
    let f = fleet(vec![
        worker("ns", 1, Role::Aggregated, "m"),
        worker("ns", 2, Role::Aggregated, "m"),
    ]);
    let l = loads(0, 0);
    let ov = MapOverlap(vec![(16, 2, 0, 8)]);
    let b = blocks16(10);
    let i = input(&f, &l, &["ns"], 160, &b, &ov);
    let mut p = conditional(Some(GATE_OFF));
    let k = pick_one(&mut p, &i).unwrap();
    assert_eq!(k.decode.reason, SelectionReason::KvAware);
    assert!(!k.is_conditional_bypass());
    assert_eq!(p.last_bypass(), None);
}
