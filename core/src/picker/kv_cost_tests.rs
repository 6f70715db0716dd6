//! Unit tests of the KV cost and its softmax (KV-PICK-01/03, Q-24): the formula worked by hand,
//! and [`softmax_sample_index`] against values recorded from upstream `softmax_sample_index`
//! (dynamo-kv-router 1.6.1, run unchanged in a scratch crate outside this repository).

use crate::config::dynamo::KvConfig;

use super::{KvParams, KvRequest, KvTerms, decode_cost_blocks, kv_cost, softmax_sample_index};

fn params(credit: f64, scale: f64, temperature: f64) -> KvParams {
    KvParams {
        overlap_score_credit: credit,
        prefill_load_scale: scale,
        temperature,
    }
}

/// KV-PICK-01 step by step as the spec writes it, `cached_tokens` included (saturating).
fn verbatim_cost(p: &KvParams, isl: u64, bs: u32, overlap: u32, t: KvTerms) -> Option<f64> {
    if bs == 0 {
        return None;
    }
    let cached_tokens = u64::from(overlap).saturating_mul(u64::from(bs)).min(isl);
    let raw_prefill_tokens = t
        .active_prefill_tokens
        .saturating_add(isl - cached_tokens)
        .saturating_add(cached_tokens);
    let raw_prefill_blocks = raw_prefill_tokens as f64 / f64::from(bs);
    let adjusted_prefill =
        (raw_prefill_blocks - p.overlap_score_credit * f64::from(overlap)).max(0.0);
    let request_blocks = isl.div_ceil(u64::from(bs));
    let decode_cost_blocks = t
        .active_decode_blocks
        .saturating_add(request_blocks.saturating_sub(u64::from(overlap)));
    let cost = p.prefill_load_scale * adjusted_prefill + decode_cost_blocks as f64;
    (!cost.is_nan()).then_some(cost)
}

#[test]
fn the_per_request_form_is_the_verbatim_formula_to_the_bit() {
    // Every edge the saturating steps have: empty and full prompts, prompts shorter than a
    // block, overlaps beyond the prompt, backlogs at and near `u64::MAX`, odd and huge block
    // sizes, NaN and zero tunables.
    let isls = [0, 1, 15, 16, 17, 1_000_003, u64::MAX - 1, u64::MAX];
    let sizes = [0, 1, 3, 16, 64, 48, u32::MAX];
    let overlaps = [0, 1, 7, 62_500, u32::MAX];
    let backlogs = [0, 5, 1 << 40, u64::MAX - 16, u64::MAX];
    let tunables = [
        params(1.0, 1.0, 0.0),
        params(0.5, 2.0, 0.0),
        params(0.0, 0.25, 0.0),
        params(f64::NAN, 1.0, 0.0),
        params(1.0, f64::INFINITY, 0.0),
    ];
    let mut costed = 0;
    for p in &tunables {
        for isl in isls {
            for bs in sizes {
                let request = KvRequest::new(isl, bs);
                assert_eq!(request.is_some(), bs > 0);
                for overlap in overlaps {
                    for (prefill, decode) in backlogs.iter().zip(backlogs.iter().rev()) {
                        let t = KvTerms {
                            active_prefill_tokens: *prefill,
                            active_decode_blocks: *decode,
                        };
                        let want = verbatim_cost(p, isl, bs, overlap, t);
                        let got = request.and_then(|r| r.cost(p, overlap, t));
                        assert_eq!(
                            got.map(f64::to_bits),
                            want.map(f64::to_bits),
                            "isl {isl} bs {bs} overlap {overlap} terms {t:?} params {p:?}"
                        );
                        assert_eq!(kv_cost(p, isl, bs, overlap, t), want);
                        let blocks = decode_cost_blocks(isl, bs, overlap, *decode);
                        if let Some(r) = request {
                            assert_eq!(r.decode_cost_blocks(overlap, *decode), blocks);
                        } else {
                            assert_eq!(blocks, *decode);
                        }
                        costed += usize::from(want.is_some());
                    }
                }
            }
        }
    }
    assert!(costed > 3_000, "only {costed} inputs had a cost");
}

#[test]
fn kv_pick_01_cost_is_the_verbatim_formula() {
    let p = params(1.0, 1.0, 0.0);
    let t = |prefill, decode| KvTerms {
        active_prefill_tokens: prefill,
        active_decode_blocks: decode,
    };
    // cached = min(3*16, 100) = 48; raw = 40 + 52 + 48 = 140; 140/16 = 8.75; credit 3 -> 5.75;
    // decode = 7 + (ceil(100/16) = 7) - 3 = 11; cost = 5.75 + 11.
    assert_eq!(kv_cost(&p, 100, 16, 3, t(40, 7)), Some(16.75));
    // f64 division. 17 tokens are 1.0625 prefill blocks (not 1) and 2 new blocks.
    assert_eq!(kv_cost(&p, 17, 16, 0, t(0, 0)), Some(3.0625));
    // Overlap beyond the request: cached = min(64, 20) = 20; raw 20/16 = 1.25 - 4 -> 0; decode
    // max(0, 2 - 4) = 0.
    assert_eq!(kv_cost(&p, 20, 16, 4, t(0, 0)), Some(0.0));
    // Weights: raw 96/16 = 6; credit 0.5*2 = 1 -> 5; scale 2 -> 10; decode 10 + 4 - 2 = 12.
    assert_eq!(
        kv_cost(&params(0.5, 2.0, 0.0), 64, 16, 2, t(32, 10)),
        Some(22.0)
    );
    // A credit of 0 ignores overlap in the prefill term; the decode term still drops the held
    // blocks: 64/16 = 4; decode 0 + 4 - 4 = 0.
    assert_eq!(
        kv_cost(&params(0.0, 1.0, 0.0), 64, 16, 4, t(0, 0)),
        Some(4.0)
    );
    // An empty prompt costs only the backlog: 32/16 = 2 + 5.
    assert_eq!(kv_cost(&p, 0, 16, 0, t(32, 5)), Some(7.0));
    // Saturating integers never panic.
    assert!(kv_cost(&p, u64::MAX, 1, u32::MAX, t(u64::MAX, u64::MAX)).is_some());
    assert_eq!(kv_cost(&p, 100, 0, 0, t(0, 0)), None);
    // NaN tunables (never validated in) give no cost rather than a NaN.
    assert_eq!(
        kv_cost(&params(1.0, f64::NAN, 0.0), 100, 16, 1, t(0, 0)),
        None
    );
    // Defaults come from the configuration.
    let c = KvConfig {
        overlap_score_credit: 1.5,
        prefill_load_scale: 0.25,
        router_temperature: 0.5,
        ..KvConfig::default()
    };
    assert_eq!(KvParams::from(&c), params(1.5, 0.25, 0.5));
    assert_eq!(KvParams::default(), params(1.0, 1.0, 0.0));
}

/// Values recorded from upstream `softmax_sample_index` (1.6.1), run in a scratch crate:
/// `(costs, temperature, sample, row, probabilities)`.
type Recorded = (&'static [f64], f64, f64, usize, &'static [f64]);

#[rustfmt::skip]
const UPSTREAM_SOFTMAX: &[Recorded] = &[
    (&[1.0, 2.0, 3.0], 1.0, 0.0, 0, &[0.506480391055654, 0.3071958857184984, 0.1863237232258476]),
    (&[1.0, 2.0, 3.0], 1.0, 0.5, 0, &[0.506480391055654, 0.3071958857184984, 0.1863237232258476]),
    (&[1.0, 2.0, 3.0], 1.0, 0.6, 1, &[0.506480391055654, 0.3071958857184984, 0.1863237232258476]),
    (&[1.0, 2.0, 3.0], 1.0, 0.9, 2, &[0.506480391055654, 0.3071958857184984, 0.1863237232258476]),
    (&[1.0, 2.0, 3.0], 1.0, 0.999999999999, 2, &[0.506480391055654, 0.3071958857184984, 0.1863237232258476]),
    (&[1.0, 2.0, 3.0], 0.1, 0.99, 0, &[0.9932623568421745, 0.006692549116589288, 4.5094041236354885e-5]),
    (&[1.0, 2.0, 3.0], 0.1, 0.999999, 2, &[0.9932623568421745, 0.006692549116589288, 4.5094041236354885e-5]),
    (&[1.0, 2.0, 3.0], 10.0, 0.34, 0, &[0.35013186144895325, 0.33305572906545156, 0.3168124094855952]),
    (&[1.0, 2.0, 3.0], 10.0, 0.67, 1, &[0.35013186144895325, 0.33305572906545156, 0.3168124094855952]),
    (&[5.0, 5.0, 5.0, 5.0], 0.5, 0.0, 0, &[0.25, 0.25, 0.25, 0.25]),
    (&[5.0, 5.0, 5.0, 5.0], 0.5, 0.25, 0, &[0.25, 0.25, 0.25, 0.25]),
    (&[5.0, 5.0, 5.0, 5.0], 0.5, 0.2500001, 1, &[0.25, 0.25, 0.25, 0.25]),
    (&[5.0, 5.0, 5.0, 5.0], 0.5, 0.75, 2, &[0.25, 0.25, 0.25, 0.25]),
    (&[5.0, 5.0, 5.0, 5.0], 0.5, 0.999999, 3, &[0.25, 0.25, 0.25, 0.25]),
    (&[7.0], 1.0, 0.999, 0, &[1.0]),
    (&[3.0, 1.0, 1.0, 9.0], 1.0, 0.3, 1, &[0.24749918249440156, 0.3177952409322493, 0.3177952409322493, 0.11691033564109976]),
    (&[3.0, 1.0, 1.0, 9.0], 1.0, 0.5, 1, &[0.24749918249440156, 0.3177952409322493, 0.3177952409322493, 0.11691033564109976]),
    (&[3.0, 1.0, 1.0, 9.0], 1.0, 0.8, 2, &[0.24749918249440156, 0.3177952409322493, 0.3177952409322493, 0.11691033564109976]),
    (&[3.0, 1.0, 1.0, 9.0], 1.0, 0.97, 3, &[0.24749918249440156, 0.3177952409322493, 0.3177952409322493, 0.11691033564109976]),
    (&[3.0, 1.0, 1.0, 9.0], 0.01, 0.499, 1, &[6.943971932433792e-12, 0.499999999996528, 0.499999999996528, 1.860037987997502e-44]),
    (&[3.0, 1.0, 1.0, 9.0], 0.01, 0.501, 2, &[6.943971932433792e-12, 0.499999999996528, 0.499999999996528, 1.860037987997502e-44]),
    (&[0.0, 1e300, -1e300], 1.0, 0.5, 2, &[0.3071958857184984, 0.1863237232258476, 0.506480391055654]),
    (&[0.0, 1.7e308, -1.7e308], 1.0, 0.2, 0, &[0.3071958857184984, 0.1863237232258476, 0.506480391055654]),
    (&[0.0, 1.7e308, -1.7e308], 1.0, 0.9, 2, &[0.3071958857184984, 0.1863237232258476, 0.506480391055654]),
    (&[-f64::INFINITY, 0.0, 1.0], 1.0, 0.5, 2, &[f64::NAN, f64::NAN, f64::NAN]),
    (&[0.0, 1.0, f64::INFINITY], 1.0, 0.5, 2, &[f64::NAN, f64::NAN, f64::NAN]),
    (&[0.0, 1.0, f64::INFINITY], 1.0, 0.0, 2, &[f64::NAN, f64::NAN, f64::NAN]),
    (&[1e18, 1.0000000000000041e18, 2e18], 0.5, 0.6, 1, &[0.468310530833483, 0.46831053083347907, 0.06337893833303787]),
    (&[12.5, 4.0625, 4.0625, 100.0, 0.0], 2.0, 0.41, 1, &[0.2084930448720324, 0.21747701847334217, 0.21747701847334217, 0.1346132271920921, 0.2219396909891911]),
    (&[12.5, 4.0625, 4.0625, 100.0, 0.0], 2.0, 0.93, 4, &[0.2084930448720324, 0.21747701847334217, 0.21747701847334217, 0.1346132271920921, 0.2219396909891911]),
    (&[12.5, 4.0625, 4.0625, 100.0, 0.0], 100.0, 0.6, 2, &[0.2002311803720917, 0.20040019672427714, 0.20040019672427714, 0.1984868003359877, 0.20048162584336626]),
    (&[2.0, 1.0], 1.0, 1.0, 1, &[0.2689414213699951, 0.7310585786300049]),
    (&[2.0, 1.0], 1.0, 0.2689414213699951, 0, &[0.2689414213699951, 0.7310585786300049]),
    (&[2.0, 1.0], 1.0, 0.2689414213699952, 1, &[0.2689414213699951, 0.7310585786300049]),
    (&[2.0, 1.0], 1.0, 0.26894142136999, 0, &[0.2689414213699951, 0.7310585786300049]),
    (&[1.0, 2.0], 1.0, 0.7310585786300049, 0, &[0.7310585786300049, 0.2689414213699951]),
    (&[1.0, 2.0], 1.0, 0.731058578630005, 1, &[0.7310585786300049, 0.2689414213699951]),
    (&[1.0, f64::NAN, 2.0], 1.0, 0.5, 2, &[f64::NAN, f64::NAN, f64::NAN]),
    (&[1.0, 2.0, 3.0], 1.0, -0.5, 0, &[0.506480391055654, 0.3071958857184984, 0.1863237232258476]),
    (&[1.0, 2.0, 3.0], 1.0, 1.5, 2, &[0.506480391055654, 0.3071958857184984, 0.1863237232258476]),
];

#[test]
fn kv_pick_03_softmax_matches_upstream_recordings() {
    let mut probabilities = Vec::new();
    for (n, &(costs, temperature, sample, row, want)) in UPSTREAM_SOFTMAX.iter().enumerate() {
        let got = softmax_sample_index(costs, temperature, sample, &mut probabilities);
        assert_eq!(
            got,
            Some(row),
            "case {n}: {costs:?} t={temperature} s={sample}"
        );
        assert_eq!(probabilities.len(), want.len(), "case {n}");
        for (g, w) in probabilities.iter().zip(want) {
            assert!(
                g == w || (g.is_nan() && w.is_nan()),
                "case {n}: {probabilities:?}"
            );
        }
    }
    assert!(UPSTREAM_SOFTMAX.len() >= 30);
    assert_eq!(
        softmax_sample_index(&[], 1.0, 0.5, &mut probabilities),
        None
    );
}
