//! Differential test: [`LoadBasedPicker`] against a deliberately naive reference picker written
//! straight from the spec text (PICK-01..14, LOAD-STORE-07..13, DISC-MULTI-05..07, SHIM-06/07/12),
//! over seeded random fleets, load samples, in-flight backlogs and cursors.
//!
//! The reference shares no code with the picker or `load::rules`: it brute-forces every
//! `(namespace, worker, rank)` triple, sorts candidates explicitly, judges freshness, quiet,
//! silent-with-load and stalled candidates itself, and compares costs as exact fractions by
//! cross-multiplication.

use std::collections::BTreeSet;

use crate::clock::Instant;
use crate::discovery::{FleetView, Role, Worker};
use crate::load::Inflight;

use super::diff_support::{NAMESPACES, NOW_MS, Outcome, outcome_of, ranks};
use super::test_support::{MAX_AGE, MapLoads, Rng, at_ms, fleet, worker};
use super::{NoWorker, PickInput, PickScratch, PickerCursors, PromptTokens, pick_load_based};

#[derive(Clone, Copy, PartialEq, Eq)]
enum RefStage {
    Prefill,
    Decode,
}

/// The reference's view of one candidate: `(num, den)` when defined, and whether a fresh sample
/// carries the stage's field.
fn reference_cost(
    w: &Worker,
    rank: u32,
    loads: &MapLoads,
    stage: RefStage,
    prompt: u64,
    now: Instant,
    stall_judgement: bool,
) -> (Option<(u64, u64)>, bool) {
    let load = loads
        .0
        .get(&MapLoads::key(w.instance_id.get(), rank))
        .copied()
        .unwrap_or_default();
    let extra = match stage {
        RefStage::Prefill => load.inflight.prefill_tokens,
        RefStage::Decode => load.inflight.decode_blocks,
    };
    // LOAD-STORE-11/13: stalled candidates are undefined while some candidate is fresh.
    if stall_judgement && load.inflight.stalled {
        return (None, false);
    }
    let backlog = match load.read.sample {
        Some(s) if now.saturating_since(s.received_at) <= MAX_AGE => {
            let decode = s.sample.active_decode_blocks.or(s.sample.kv_used_blocks);
            let field = match stage {
                RefStage::Prefill => s.sample.active_prefill_tokens,
                RefStage::Decode => decode,
            };
            match field {
                Some(v) => (Some(v.saturating_add(extra)), true),
                None => (None, false),
            }
        }
        Some(s)
            if s.sample
                .active_decode_blocks
                .or(s.sample.kv_used_blocks)
                .unwrap_or(0)
                > 0
                || s.sample.active_prefill_tokens.unwrap_or(0) > 0 =>
        {
            (None, false) // silent with load
        }
        _ => (Some(extra), false), // quiet
    };
    let (Some(b), has_field) = backlog else {
        return (None, backlog.1);
    };
    let cost = match stage {
        RefStage::Prefill => w
            .capacity
            .max_num_batched_tokens
            .filter(|d| *d > 0)
            .map(|d| (b, d)),
        RefStage::Decode => match (w.block_size, w.capacity.total_kv_blocks) {
            (Some(bs), Some(total)) if bs > 0 && total > 0 => {
                let blocks = prompt.div_ceil(u64::from(bs));
                Some((b.saturating_add(blocks), total))
            }
            _ => None,
        },
    };
    (cost, has_field)
}

/// Selects among `(worker, rank)` candidates (already in candidate order) per PICK-06/07.
fn reference_select(
    cands: &[(&Worker, u32)],
    loads: &MapLoads,
    stage: RefStage,
    prompt: u64,
    now: Instant,
    cursor: &mut u64,
) -> Option<(usize, &'static str)> {
    if cands.is_empty() {
        return None;
    }
    let any_fresh = cands.iter().any(|(w, r)| {
        loads
            .0
            .get(&MapLoads::key(w.instance_id.get(), *r))
            .and_then(|l| l.read.sample)
            .is_some_and(|s| now.saturating_since(s.received_at) <= MAX_AGE)
    });
    let costs: Vec<(Option<(u64, u64)>, bool)> = cands
        .iter()
        .map(|(w, r)| reference_cost(w, *r, loads, stage, prompt, now, any_fresh))
        .collect();
    let turn = *cursor;
    *cursor = cursor.wrapping_add(1);
    let le = |a: (u64, u64), b: (u64, u64)| {
        u128::from(a.0) * u128::from(b.1) <= u128::from(b.0) * u128::from(a.1)
    };
    let defined: Vec<(usize, (u64, u64))> = costs
        .iter()
        .enumerate()
        .filter_map(|(i, (c, _))| c.map(|c| (i, c)))
        .collect();
    if costs.iter().any(|(_, f)| *f) && !defined.is_empty() {
        let minimal: Vec<usize> = defined
            .iter()
            .filter(|(_, c)| defined.iter().all(|(_, o)| le(*c, *o)))
            .map(|(i, _)| *i)
            .collect();
        let nth = usize::try_from(turn % minimal.len() as u64).ok()?;
        return Some((*minimal.get(nth)?, "load"));
    }
    let i = usize::try_from(turn % cands.len() as u64).ok()?;
    Some((i, "round_robin_stale"))
}

/// The naive reference picker.
fn reference_pick(
    f: &FleetView,
    loads: &MapLoads,
    allowed: &[&str],
    prompt: u64,
    now: Instant,
    cursors: &mut PickerCursors,
) -> Option<Outcome> {
    let serves = |w: &Worker| w.model.as_deref() == Some("m") && w.role != Role::Unknown;
    let has = |ns: &str, role: Role| {
        f.workers
            .iter()
            .any(|w| w.namespace == ns && serves(w) && w.role == role)
    };
    let mut decode: Vec<(&Worker, u32)> = Vec::new();
    for w in &f.workers {
        if !allowed.contains(&w.namespace.as_str()) || !serves(w) {
            continue;
        }
        let pool = has(&w.namespace, Role::Prefill) && has(&w.namespace, Role::Decode);
        if w.role == Role::Decode || (w.role == Role::Aggregated && !pool) {
            decode.extend(ranks(w).into_iter().map(|r| (w, r)));
        }
    }
    decode.sort_by(|a, b| {
        (&a.0.namespace, a.0.instance_id, a.1).cmp(&(&b.0.namespace, b.0.instance_id, b.1))
    });
    let (di, dreason) = reference_select(
        &decode,
        loads,
        RefStage::Decode,
        prompt,
        now,
        &mut cursors.decode,
    )?;
    let (dw, drank) = *decode.get(di)?;
    let mut out = Outcome {
        namespace: dw.namespace.clone(),
        decode: (dw.instance_id.get(), drank, dreason),
        prefill: None,
        prefill_event: "no_prefill_pool",
        headers: (dw.dp_size.map(|_| drank), None),
        kv: None,
    };
    if dw.role != Role::Decode {
        return Some(out);
    }
    let mut prefill: Vec<(&Worker, u32)> = f
        .workers
        .iter()
        .filter(|w| w.namespace == dw.namespace && serves(w) && w.role == Role::Prefill)
        .flat_map(|w| ranks(w).into_iter().map(move |r| (w, r)))
        .collect();
    prefill.sort_by_key(|(w, r)| (w.instance_id, *r));
    if let Some((pi, preason)) = reference_select(
        &prefill,
        loads,
        RefStage::Prefill,
        prompt,
        now,
        &mut cursors.prefill,
    ) {
        let (pw, prank) = *prefill.get(pi)?;
        out.prefill = Some((pw.instance_id.get(), prank, preason));
        out.prefill_event = preason;
        out.headers.1 = pw.dp_size.map(|_| prank);
    }
    Some(out)
}

/// How a generated fleet's workers declare their cost figures.
#[derive(Clone, Copy)]
enum Figures {
    /// Each its own (block size, capacity and batch size drawn per worker).
    Drawn,
    /// One set for all: every stage list has one cost shape, so the picker selects by its
    /// uniform scan (`super::lanes`) instead of costing each candidate.
    Shared,
}

fn random_worker(rng: &mut Rng, id: u64, figures: Figures) -> Worker {
    let ns = NAMESPACES[usize::try_from(rng.below(3)).unwrap_or(0)];
    let role = match rng.below(10) {
        0..=2 => Role::Prefill,
        3..=5 => Role::Decode,
        6..=8 => Role::Aggregated,
        _ => Role::Unknown,
    };
    let mut w = worker(ns, id, role, if rng.chance(90) { "m" } else { "x" });
    if rng.chance(3) {
        w.model = None;
    }
    w.block_size = match rng.below(20) {
        0 => None,
        1 => Some(0),
        2..=5 => Some(1 + u32::try_from(rng.below(64)).unwrap_or(0)),
        _ => Some(16),
    };
    w.capacity.total_kv_blocks = rng.opt(8, 2000);
    w.capacity.max_num_batched_tokens = rng.opt(8, 16_384);
    if let Figures::Shared = figures {
        w.block_size = Some(16);
        w.capacity.total_kv_blocks = Some(1000);
        w.capacity.max_num_batched_tokens = Some(8192);
    }
    w.dp_start_rank = (!rng.chance(60)).then(|| u32::try_from(rng.below(4)).unwrap_or(0));
    w.dp_size = match rng.below(20) {
        0 => Some(0),
        1..=9 => None,
        _ => Some(1 + u32::try_from(rng.below(3)).unwrap_or(0)),
    };
    w
}

fn random_loads(rng: &mut Rng, f: &FleetView) -> MapLoads {
    let mut l = MapLoads::default();
    for w in &f.workers {
        for r in ranks(w) {
            let id = w.instance_id.get();
            let age_ms = rng.below(7000);
            if !rng.chance(25) {
                let (d, p, k) = (rng.opt(30, 3000), rng.opt(30, 8000), rng.opt(30, 3000));
                l.sample(id, r, at_ms(NOW_MS - age_ms), d, p, k);
            }
            if rng.chance(50) {
                // A stall needs a dispatch unanswered for 5 s: no sample since (LOAD-STORE-11).
                let sample_old =
                    l.0.get(&MapLoads::key(id, r))
                        .is_none_or(|_| age_ms >= 5000);
                l.inflight(
                    id,
                    r,
                    Inflight {
                        prefill_tokens: rng.below(5000),
                        decode_blocks: rng.below(200),
                        stalled: sample_old && rng.chance(30),
                    },
                );
            }
        }
    }
    l
}

#[test]
fn differential_against_naive_reference() {
    differential(0x5EED_C0DE, Figures::Drawn);
}

#[test]
fn differential_against_naive_reference_with_shared_figures() {
    differential(0x0005_11A2_ED00, Figures::Shared);
}

fn differential(seed: u64, figures: Figures) {
    let mut rng = Rng::new(seed, 15);
    let now = at_ms(NOW_MS);
    let (mut picks, mut no_worker, mut prefills) = (0u32, 0u32, 0u32);
    let mut reasons: BTreeSet<(&'static str, &'static str)> = BTreeSet::new();
    let mut scratch = PickScratch::new();
    for case in 0..6000 {
        let n = rng.below(14);
        let mut ids: Vec<u64> = (1..=40).collect();
        let workers = (0..n)
            .map(|_| {
                let i = usize::try_from(rng.below(ids.len() as u64)).unwrap_or(0);
                let id = ids.swap_remove(i);
                random_worker(&mut rng, id, figures)
            })
            .collect();
        let f = std::sync::Arc::new(fleet(workers));
        // Half the cases pick through the fleet's candidate table, half scan the fleet.
        let table = super::FleetCandidates::build(&f);
        let table = rng.chance(50).then_some(&table);
        let loads = random_loads(&mut rng, &f);
        let mut allowed: Vec<&str> = NAMESPACES.into_iter().filter(|_| rng.chance(80)).collect();
        let start = PickerCursors {
            decode: rng.below(10),
            prefill: rng.below(10),
        };
        let (mut ours, mut theirs) = (start, start);
        for round in 0..3 {
            if round > 0 && rng.chance(30) {
                // Another namespace set with the same table: the scratch's kept candidate
                // lists must not answer for it.
                allowed = NAMESPACES.into_iter().filter(|_| rng.chance(70)).collect();
            }
            let prompt = rng.below(5000);
            let input = PickInput {
                fleet: &f,
                loads: &loads,
                model: "m",
                namespaces: &allowed,
                prompt_tokens: PromptTokens(prompt),
                now,
                max_staleness: MAX_AGE,
                prompt_blocks: &[],
                overlap: &super::NoOverlap,
                candidates: table,
            };
            let got = pick_load_based(&input, &mut ours, &mut scratch);
            let want = reference_pick(&f, &loads, &allowed, prompt, now, &mut theirs);
            let got = match got {
                Ok(p) => Some(outcome_of(&p)),
                Err(NoWorker) => None,
            };
            assert_eq!(
                got, want,
                "case {case} round {round}: fleet {f:#?}\nloads {loads:#?}"
            );
            assert_eq!(ours, theirs, "cursors, case {case} round {round}");
            match &got {
                None => no_worker += 1,
                Some(o) => {
                    picks += 1;
                    prefills += u32::from(o.prefill.is_some());
                    reasons.insert(("decode", o.decode.2));
                    reasons.insert(("prefill", o.prefill_event));
                }
            }
        }
    }
    // The generator must exercise every outcome.
    assert!(
        picks > 10_000 && no_worker > 500 && prefills > 3000,
        "{picks} {no_worker} {prefills}"
    );
    assert_eq!(reasons.len(), 5, "{reasons:?}");
}
