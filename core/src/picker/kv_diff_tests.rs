//! Differential test: [`KvAwarePicker`] against a deliberately naive reference written straight
//! from the spec text (KV-PICK-01..08, Q-24/26, DISC-MULTI-08, PICK-04..14, LOAD-STORE-07..13,
//! SHIM-12), over seeded random fleets, load samples, in-flight backlogs, overlaps, prompt block
//! sets, tunables, temperatures and cursors.
//!
//! The reference shares no code with the picker, `kv_cost` or `load::rules`: it brute-forces
//! every `(namespace, worker, rank)`, judges freshness, quiet, silent-with-load and stalled ranks
//! itself, evaluates the formula line by line in wide integers and f64, samples its own softmax
//! (`exp(-(cost - min) / (range * t))`), and picks a pair's decode side with its own load-only
//! fractions compared by cross-multiplication.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

use crate::clock::Instant;
use crate::discovery::{FleetView, Role, Worker};
use crate::load::Inflight;

use super::diff_support::{NAMESPACES, NOW_MS, Outcome, outcome_of, ranks};
use super::kv_aware_tests::{HASHES, MapOverlap};
use super::test_support::{MAX_AGE, MapLoads, Rng, at_ms, fleet, worker};
use super::{
    KvAwarePicker, KvParams, LoadBasedPicker, NoWorker, PickInput, PickerCursors, Picks,
    PromptBlocks, PromptTokens, UnitSource, WorkerPicker,
};

/// Samples shared by the picker's source and the reference.
#[derive(Debug, Clone)]
struct Shared(Arc<Mutex<VecDeque<f64>>>);

impl UnitSource for Shared {
    fn next_unit(&mut self) -> f64 {
        self.0
            .lock()
            .map(|mut q| q.pop_front().unwrap_or(0.5))
            .unwrap_or(0.5)
    }
}

fn is_fresh(at: Instant, now: Instant) -> bool {
    now.saturating_since(at) <= MAX_AGE
}

/// The spec's formula, line by line.
fn reference_cost(p: &KvParams, isl: u64, bs: u32, overlap: u32, prefill: u64, decode: u64) -> f64 {
    let (isl, bs128, ov) = (u128::from(isl), u128::from(bs), u128::from(overlap));
    let cached_tokens = (ov * bs128).min(isl);
    let raw_prefill_tokens = u128::from(prefill) + (isl - cached_tokens) + cached_tokens;
    let raw_prefill_blocks = raw_prefill_tokens as f64 / f64::from(bs);
    let overlap_credit_blocks = p.overlap_score_credit * f64::from(overlap);
    let diff = raw_prefill_blocks - overlap_credit_blocks;
    let adjusted_prefill = if diff > 0.0 { diff } else { 0.0 };
    let new_blocks = i128::try_from(isl.div_ceil(bs128)).unwrap_or(0) - i128::from(overlap);
    let decode_cost_blocks = (i128::from(decode) + new_blocks.max(0)) as f64;
    p.prefill_load_scale * adjusted_prefill + decode_cost_blocks
}

struct Case<'a> {
    f: &'a FleetView,
    loads: &'a MapLoads,
    overlap: &'a MapOverlap,
    allowed: &'a [&'a str],
    isl: u64,
    blocks: &'a [(u32, usize)],
    params: KvParams,
    now: Instant,
}

/// The naive reference: `None` when no worker can be picked.
fn reference_pick(
    c: &Case<'_>,
    cursors: &mut PickerCursors,
    draws: &mut VecDeque<f64>,
) -> Option<Outcome> {
    let serves = |w: &Worker| w.model.as_deref() == Some("m") && w.role != Role::Unknown;
    let has = |ns: &str, role: Role| {
        c.f.workers
            .iter()
            .any(|w| w.namespace == ns && serves(w) && w.role == role)
    };
    let pool = |ns: &str| has(ns, Role::Prefill) && has(ns, Role::Decode);
    let mut cands: Vec<(&Worker, u32)> = Vec::new();
    for w in &c.f.workers {
        if !c.allowed.contains(&w.namespace.as_str()) || !serves(w) {
            continue;
        }
        let take = if pool(&w.namespace) {
            w.role == Role::Prefill
        } else {
            w.role == Role::Decode || w.role == Role::Aggregated
        };
        if take {
            cands.extend(ranks(w).into_iter().map(|r| (w, r)));
        }
    }
    if cands.is_empty() {
        return None;
    }
    cands.sort_by(|a, b| {
        (&a.0.namespace, a.0.instance_id, a.1).cmp(&(&b.0.namespace, b.0.instance_id, b.1))
    });
    // Overlap: the first entry of the worker's block size, the largest report, capped.
    let overlap_of = |w: &Worker, r: u32| -> u32 {
        let Some(bs) = w.block_size else { return 0 };
        let Some(&(_, len)) = c.blocks.iter().find(|(s, _)| *s == bs) else {
            return 0;
        };
        if len == 0 {
            return 0;
        }
        let best = c
            .overlap
            .0
            .iter()
            .filter(|(s, id, rank, _)| *s == bs && *id == w.instance_id.get() && *rank == r)
            .map(|e| e.3)
            .max()
            .unwrap_or(0);
        best.min(u32::try_from(len).unwrap_or(u32::MAX))
    };
    let load = |w: &Worker, r: u32| {
        c.loads
            .0
            .get(&MapLoads::key(w.instance_id.get(), r))
            .copied()
            .unwrap_or_default()
    };
    let mut costs: Vec<Option<f64>> = vec![None; cands.len()];
    for prefill_group in [true, false] {
        let members: Vec<usize> = (0..cands.len())
            .filter(|&i| (cands[i].0.role == Role::Prefill) == prefill_group)
            .collect();
        let any_fresh = members.iter().any(|&i| {
            let l = load(cands[i].0, cands[i].1);
            l.read
                .sample
                .is_some_and(|s| is_fresh(s.received_at, c.now))
        });
        // (standing, own field, other field) per member.
        let field = |l: &crate::load::rules::KeyLoad| -> (Option<u64>, Option<u64>) {
            let Some(s) = l.read.sample else {
                return (None, None);
            };
            let decode = s.sample.active_decode_blocks.or(s.sample.kv_used_blocks);
            let prefill = s.sample.active_prefill_tokens;
            if prefill_group {
                (prefill, decode)
            } else {
                (decode, prefill)
            }
        };
        let fresh_with_field = |i: usize| {
            let l = load(cands[i].0, cands[i].1);
            let stalled = any_fresh && l.inflight.stalled;
            !stalled
                && l.read
                    .sample
                    .is_some_and(|s| is_fresh(s.received_at, c.now))
                && field(&l).0.is_some()
        };
        let with_backlog = members.iter().any(|&i| fresh_with_field(i));
        for &i in &members {
            let (w, r) = cands[i];
            let l = load(w, r);
            let (own_extra, other_extra) = if prefill_group {
                (l.inflight.prefill_tokens, l.inflight.decode_blocks)
            } else {
                (l.inflight.decode_blocks, l.inflight.prefill_tokens)
            };
            let terms = if !with_backlog {
                Some((0, 0))
            } else if fresh_with_field(i) {
                let (own, other) = field(&l);
                Some((
                    own.unwrap_or(0) + own_extra,
                    other.unwrap_or(0) + other_extra,
                ))
            } else {
                let stalled = any_fresh && l.inflight.stalled;
                let fresh = l
                    .read
                    .sample
                    .is_some_and(|s| is_fresh(s.received_at, c.now));
                let shows_load = l.read.sample.is_some_and(|s| {
                    s.sample
                        .active_decode_blocks
                        .or(s.sample.kv_used_blocks)
                        .unwrap_or(0)
                        > 0
                        || s.sample.active_prefill_tokens.unwrap_or(0) > 0
                });
                (!stalled && !fresh && !shows_load).then_some((own_extra, other_extra))
            };
            let Some((own, other)) = terms else { continue };
            let (prefill, decode) = if prefill_group {
                (own, other)
            } else {
                (other, own)
            };
            let bs = w.block_size.unwrap_or(0);
            if bs > 0 {
                costs[i] = Some(reference_cost(
                    &c.params,
                    c.isl,
                    bs,
                    overlap_of(w, r),
                    prefill,
                    decode,
                ));
            }
        }
    }
    let has_prefill = cands.iter().any(|(w, _)| w.role == Role::Prefill);
    let cursor = if has_prefill {
        &mut cursors.prefill
    } else {
        &mut cursors.decode
    };
    let turn = *cursor;
    *cursor = cursor.wrapping_add(1);
    let defined: Vec<(usize, f64)> = costs
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.map(|c| (i, c)))
        .collect();
    let (index, reason) = if defined.is_empty() {
        (
            usize::try_from(turn % cands.len() as u64).ok()?,
            "round_robin_stale",
        )
    } else if c.params.temperature > 0.0 {
        let lo = defined.iter().map(|d| d.1).fold(f64::INFINITY, f64::min);
        let hi = defined
            .iter()
            .map(|d| d.1)
            .fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = if lo == hi {
            vec![1.0; defined.len()]
        } else {
            defined
                .iter()
                .map(|d| (-(d.1 - lo) / ((hi - lo) * c.params.temperature)).exp())
                .collect()
        };
        let total: f64 = weights.iter().sum();
        let sample = draws.pop_front().unwrap_or(0.5);
        let mut acc = 0.0;
        let mut row = defined.len() - 1;
        for (k, w) in weights.iter().enumerate() {
            acc += w / total;
            if sample <= acc {
                row = k;
                break;
            }
        }
        (defined[row].0, "kv_aware")
    } else {
        let lo = defined.iter().map(|d| d.1).fold(f64::INFINITY, f64::min);
        let ties: Vec<usize> = defined.iter().filter(|d| d.1 == lo).map(|d| d.0).collect();
        let nth = usize::try_from(turn % ties.len() as u64).ok()?;
        (ties[nth], "kv_aware")
    };
    let (w, r) = cands[index];
    let kv = Some((overlap_of(w, r), w.block_size.unwrap_or(0)));
    let header = |w: &Worker, r: u32| w.dp_size.map(|_| r);
    if w.role != Role::Prefill {
        return Some(Outcome {
            namespace: w.namespace.clone(),
            decode: (w.instance_id.get(), r, reason),
            prefill: None,
            prefill_event: "no_prefill_pool",
            headers: (header(w, r), None),
            kv,
        });
    }
    let (dw, dr, dreason) = reference_pair_decode(c, &w.namespace, &mut cursors.decode)?;
    Some(Outcome {
        namespace: w.namespace.clone(),
        decode: (dw.instance_id.get(), dr, dreason),
        prefill: Some((w.instance_id.get(), r, reason)),
        prefill_event: reason,
        headers: (header(dw, dr), header(w, r)),
        kv,
    })
}

/// PICK-01/03/05..08 for the decode workers of `ns`.
fn reference_pair_decode<'f>(
    c: &Case<'f>,
    ns: &str,
    cursor: &mut u64,
) -> Option<(&'f Worker, u32, &'static str)> {
    let mut cands: Vec<(&Worker, u32)> = c
        .f
        .workers
        .iter()
        .filter(|w| w.namespace == ns && w.model.as_deref() == Some("m") && w.role == Role::Decode)
        .flat_map(|w| ranks(w).into_iter().map(move |r| (w, r)))
        .collect();
    cands.sort_by_key(|(w, r)| (w.instance_id, *r));
    if cands.is_empty() {
        return None;
    }
    let load = |w: &Worker, r: u32| {
        c.loads
            .0
            .get(&MapLoads::key(w.instance_id.get(), r))
            .copied()
            .unwrap_or_default()
    };
    let any_fresh = cands.iter().any(|(w, r)| {
        load(w, *r)
            .read
            .sample
            .is_some_and(|s| is_fresh(s.received_at, c.now))
    });
    let mut field_seen = false;
    let fracs: Vec<Option<(u64, u64)>> = cands
        .iter()
        .map(|(w, r)| {
            let l = load(w, *r);
            if any_fresh && l.inflight.stalled {
                return None;
            }
            let backlog = match l.read.sample {
                Some(s) if is_fresh(s.received_at, c.now) => {
                    let v = s.sample.active_decode_blocks.or(s.sample.kv_used_blocks)?;
                    field_seen = true;
                    v + l.inflight.decode_blocks
                }
                Some(s)
                    if s.sample
                        .active_decode_blocks
                        .or(s.sample.kv_used_blocks)
                        .unwrap_or(0)
                        > 0
                        || s.sample.active_prefill_tokens.unwrap_or(0) > 0 =>
                {
                    return None;
                }
                _ => l.inflight.decode_blocks,
            };
            let bs = u64::from(w.block_size.filter(|b| *b > 0)?);
            let total = w.capacity.total_kv_blocks.filter(|t| *t > 0)?;
            Some((backlog + c.isl.div_ceil(bs), total))
        })
        .collect();
    let turn = *cursor;
    *cursor = cursor.wrapping_add(1);
    let le = |a: (u64, u64), b: (u64, u64)| {
        u128::from(a.0) * u128::from(b.1) <= u128::from(b.0) * u128::from(a.1)
    };
    let defined: Vec<(usize, (u64, u64))> = fracs
        .iter()
        .enumerate()
        .filter_map(|(i, f)| f.map(|f| (i, f)))
        .collect();
    if field_seen && !defined.is_empty() {
        let min: Vec<usize> = defined
            .iter()
            .filter(|(_, a)| defined.iter().all(|(_, b)| le(*a, *b)))
            .map(|(i, _)| *i)
            .collect();
        let (w, r) = cands[min[usize::try_from(turn % min.len() as u64).ok()?]];
        return Some((w, r, "load"));
    }
    let (w, r) = cands[usize::try_from(turn % cands.len() as u64).ok()?];
    Some((w, r, "round_robin_stale"))
}

fn random_worker(rng: &mut Rng, id: u64) -> Worker {
    let ns = rng.pick(&NAMESPACES);
    let role = match rng.below(10) {
        0..=2 => Role::Prefill,
        3..=5 => Role::Decode,
        6..=8 => Role::Aggregated,
        _ => Role::Unknown,
    };
    let mut w = worker(ns, id, role, if rng.chance(92) { "m" } else { "x" });
    w.block_size = match rng.below(20) {
        0 => None,
        1 => Some(0),
        2..=6 => Some(32),
        7 => Some(1 + u32::try_from(rng.below(40)).unwrap_or(0)),
        _ => Some(16),
    };
    w.capacity.total_kv_blocks = rng.opt(5, 400);
    w.dp_start_rank = (!rng.chance(60)).then(|| u32::try_from(rng.below(4)).unwrap_or(0));
    w.dp_size = match rng.below(20) {
        0 => Some(0),
        1..=11 => None,
        _ => Some(1 + u32::try_from(rng.below(3)).unwrap_or(0)),
    };
    w
}

fn random_loads(rng: &mut Rng, f: &FleetView, vllm: bool) -> MapLoads {
    let mut l = MapLoads::default();
    for w in &f.workers {
        for r in ranks(w) {
            let id = w.instance_id.get();
            let age_ms = rng.pick(&[0, 500, 2999, 3000, 3001, 6000]);
            if !rng.chance(25) {
                let d = if vllm { None } else { rng.opt(30, 40) };
                let p = if vllm {
                    None
                } else {
                    rng.opt(30, 8).map(|v| v * 16)
                };
                let k = rng.opt(30, 40);
                l.sample(id, r, at_ms(NOW_MS - age_ms), d, p, k);
            }
            if rng.chance(40) {
                let sample_old =
                    l.0.get(&MapLoads::key(id, r))
                        .is_none_or(|_| age_ms >= 5000);
                l.inflight(
                    id,
                    r,
                    Inflight {
                        prefill_tokens: rng.below(4) * 16,
                        decode_blocks: rng.below(6),
                        stalled: sample_old && rng.chance(30),
                    },
                );
            }
        }
    }
    l
}

fn random_overlap(rng: &mut Rng, f: &FleetView) -> MapOverlap {
    let mut o = MapOverlap::default();
    for w in &f.workers {
        for r in ranks(w) {
            for bs in [16, 32, w.block_size.unwrap_or(16)] {
                if rng.chance(35) {
                    let blocks = u32::try_from(rng.below(12)).unwrap_or(0);
                    o.0.push((bs, w.instance_id.get(), r, blocks));
                }
            }
        }
    }
    o
}

#[test]
fn differential_against_naive_reference() {
    let mut rng = Rng::new(0x00C0_FFEE_4B1D, 20);
    let now = at_ms(NOW_MS);
    let (mut picks, mut no_worker, mut pairs, mut sampled, mut load_only) = (0, 0, 0, 0, 0);
    let mut reasons: BTreeSet<(&'static str, &'static str)> = BTreeSet::new();
    for case in 0..5000 {
        let n = rng.below(12);
        let mut ids: Vec<u64> = (1..=30).collect();
        let workers = (0..n)
            .map(|_| {
                let i = usize::try_from(rng.below(ids.len() as u64)).unwrap_or(0);
                random_worker(&mut rng, ids.swap_remove(i))
            })
            .collect();
        let f = std::sync::Arc::new(fleet(workers));
        // Half the cases pick through the fleet's candidate table, half scan the fleet.
        let table = super::FleetCandidates::build(&f);
        let table = rng.chance(50).then_some(&table);
        let vllm = rng.chance(30);
        let loads = random_loads(&mut rng, &f, vllm);
        let overlap = random_overlap(&mut rng, &f);
        let mut allowed: Vec<&str> = NAMESPACES.into_iter().filter(|_| rng.chance(85)).collect();
        let params = KvParams {
            overlap_score_credit: rng.pick(&[0.0, 0.5, 1.0, 1.5, 3.0]),
            prefill_load_scale: rng.pick(&[0.0, 0.5, 1.0, 2.0]),
            temperature: if rng.chance(70) {
                0.0
            } else {
                rng.pick(&[0.25, 1.0, 5.0])
            },
        };
        let start = PickerCursors {
            decode: rng.below(10),
            prefill: rng.below(10),
        };
        let samples: VecDeque<f64> = (0..8)
            .map(|_| (rng.next() >> 11) as f64 / 9_007_199_254_740_992.0)
            .collect();
        let shared = Shared(Arc::new(Mutex::new(samples.clone())));
        let mut ours = KvAwarePicker::new(params, Box::new(shared.clone())).with_cursors(start);
        let mut load_based = LoadBasedPicker::with_cursors(start);
        let mut theirs = start;
        let mut draws = samples;
        for round in 0..3 {
            if round > 0 && rng.chance(30) {
                // Another namespace set with the same table: the picker's kept candidate list
                // must not answer for it.
                allowed = NAMESPACES.into_iter().filter(|_| rng.chance(70)).collect();
            }
            let isl = rng.below(300);
            let mut sizes: Vec<(u32, usize)> = Vec::new();
            for bs in [16, 32, 7] {
                if rng.chance(60) {
                    sizes.push((bs, usize::try_from(rng.below(17)).unwrap_or(0)));
                }
            }
            let prompt: Vec<PromptBlocks<'_>> = sizes
                .iter()
                .map(|&(block_size, len)| PromptBlocks {
                    block_size,
                    hashes: &HASHES[..len],
                })
                .collect();
            let input = PickInput {
                fleet: &f,
                loads: &loads,
                model: "m",
                namespaces: &allowed,
                prompt_tokens: PromptTokens(isl),
                now,
                max_staleness: MAX_AGE,
                prompt_blocks: &prompt,
                overlap: &overlap,
                candidates: table,
            };
            let mut out = Picks::new(1);
            let got = match ours.pick(&input, &mut out) {
                Ok(()) => out.first().map(outcome_of),
                Err(NoWorker) => None,
            };
            let want = if prompt.is_empty() {
                load_only += 1;
                let mut lb = Picks::new(1);
                load_based
                    .pick(&input, &mut lb)
                    .ok()
                    .and_then(|()| lb.first().map(outcome_of))
            } else {
                let c = Case {
                    f: &f,
                    loads: &loads,
                    overlap: &overlap,
                    allowed: &allowed,
                    isl,
                    blocks: &sizes,
                    params,
                    now,
                };
                reference_pick(&c, &mut theirs, &mut draws)
            };
            if prompt.is_empty() {
                theirs = load_based.cursors();
            } else {
                load_based = LoadBasedPicker::with_cursors(theirs);
            }
            assert_eq!(
                got, want,
                "case {case} round {round}: {params:?} isl {isl} sizes {sizes:?}\nfleet {f:#?}\nloads {loads:#?}\noverlap {overlap:?}"
            );
            assert_eq!(ours.cursors(), theirs, "cursors, case {case} round {round}");
            let left = shared.0.lock().map(|q| q.len()).unwrap_or(0);
            assert_eq!(left, draws.len(), "draws, case {case} round {round}");
            match &got {
                None => no_worker += 1,
                Some(o) => {
                    picks += 1;
                    pairs += u32::from(o.prefill.is_some());
                    sampled += u32::from(params.temperature > 0.0 && o.kv.is_some());
                    reasons.insert(("decode", o.decode.2));
                    reasons.insert(("prefill", o.prefill_event));
                }
            }
        }
    }
    // The generator must exercise every outcome.
    assert!(
        picks > 8000 && no_worker > 500 && pairs > 2000 && sampled > 1500 && load_only > 500,
        "{picks} {no_worker} {pairs} {sampled} {load_only}"
    );
    assert_eq!(reasons.len(), 7, "{reasons:?}");
}
