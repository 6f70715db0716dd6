//! The candidate table against the fleet scan it replaces: for random fleets (several
//! namespaces and models, every role, undeclared and declared ranks, unsorted model names) and
//! random candidate-namespace sets, [`visit_ranks`] and [`visit_namespace_ranks`] yield the same
//! ranks, in the same order, with the same pool flags, with and without the table.

use std::ops::ControlFlow;
use std::sync::Arc;

use crate::discovery::{FleetView, Role, Worker};

use super::super::test_support::{MapLoads, Rng, fleet, worker as model_worker};
use super::super::{NoOverlap, PickInput, PromptTokens};
use super::*;
use crate::clock::Instant;

fn worker(rng: &mut Rng, id: u64) -> Worker {
    let namespaces = ["a", "b", "c"];
    let models = ["m1", "m2", "zz"];
    let roles = [Role::Prefill, Role::Decode, Role::Aggregated, Role::Unknown];
    let mut w = model_worker(
        namespaces[rng.below(3) as usize],
        id,
        roles[rng.below(4) as usize],
        models[rng.below(3) as usize],
    );
    if !rng.chance(90) {
        w.model = None;
    }
    if rng.chance(30) {
        w.dp_size = Some(rng.below(4) as u32);
        w.dp_start_rank = rng.chance(50).then(|| rng.below(8) as u32);
    }
    w
}

fn input<'a>(
    f: &'a FleetView,
    loads: &'a MapLoads,
    model: &'a str,
    namespaces: &'a Vec<&'a str>,
    candidates: Option<&'a FleetCandidates>,
) -> PickInput<'a> {
    PickInput {
        fleet: f,
        loads,
        model,
        namespaces,
        prompt_tokens: PromptTokens(100),
        now: Instant::default(),
        max_staleness: std::time::Duration::from_secs(1),
        prompt_blocks: &[],
        overlap: &NoOverlap,
        candidates,
    }
}

fn all(i: &PickInput<'_>) -> Vec<(RankRef, bool)> {
    let mut out = Vec::new();
    visit_ranks(i, &|_, _| true, &mut |r, pool| {
        out.push((r, pool));
        ControlFlow::Continue(())
    });
    out
}

fn in_namespace(i: &PickInput<'_>, start: usize, role: Role) -> Vec<RankRef> {
    let mut out = Vec::new();
    visit_namespace_ranks(i, start, role, &mut |r| {
        out.push(r);
        ControlFlow::Continue(())
    });
    out
}

/// The ranks a stage filter keeps.
fn wanted(i: &PickInput<'_>, wants: &dyn Fn(Role, bool) -> bool) -> Vec<(RankRef, bool)> {
    let mut out = Vec::new();
    visit_ranks(i, wants, &mut |r, pool| {
        out.push((r, pool));
        ControlFlow::Continue(())
    });
    out
}

#[test]
fn the_table_yields_what_the_scan_yields() {
    let mut rng = Rng::new(7, 0);
    let loads = MapLoads::default();
    for case in 0..300 {
        let n = rng.below(40);
        let f = Arc::new(fleet((0..n).map(|i| worker(&mut rng, i + 1)).collect()));
        let table = FleetCandidates::build(&f);
        assert!(table.is_for(&f));
        let namespaces: Vec<&str> = ["a", "b", "c"]
            .into_iter()
            .filter(|_| rng.chance(70))
            .collect();
        for model in ["m1", "m2", "zz", "none"] {
            let scan = input(&f, &loads, model, &namespaces, None);
            let tab = input(&f, &loads, model, &namespaces, Some(&table));
            assert_eq!(all(&tab), all(&scan), "case {case} model {model}");
            let starts: Vec<usize> = (0..f.workers.len())
                .filter(|&i| i == 0 || f.workers[i - 1].namespace != f.workers[i].namespace)
                .collect();
            let stage = |role: Role, pool: bool| {
                role == Role::Decode || (role == Role::Aggregated && !pool)
            };
            let got = wanted(&tab, &stage);
            assert_eq!(
                got,
                wanted(&scan, &stage),
                "case {case} model {model} stage"
            );
            let want: Vec<_> = all(&scan)
                .into_iter()
                .filter(|(r, pool)| stage(r.role, *pool))
                .collect();
            assert_eq!(
                got, want,
                "case {case} model {model}: the filter keeps exactly its ranks"
            );
            for s in starts {
                for role in [Role::Prefill, Role::Decode, Role::Aggregated] {
                    assert_eq!(
                        in_namespace(&tab, s, role),
                        in_namespace(&scan, s, role),
                        "case {case} model {model} run {s} {role:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_table_answers_only_for_its_own_fleet() {
    let mut rng = Rng::new(3, 0);
    let a = Arc::new(fleet((0..5).map(|i| worker(&mut rng, i + 1)).collect()));
    let b = Arc::new(FleetView::clone(&a));
    let table = FleetCandidates::build(&a);
    assert!(table.is_for(&a));
    assert!(!table.is_for(&b), "an equal view elsewhere is another view");
}

#[test]
fn a_model_with_more_ranks_than_a_stage_holds_is_scanned() {
    let mut big = model_worker("a", 1, Role::Aggregated, "m");
    big.dp_size = Some(u32::try_from(MAX_CANDIDATES).unwrap_or(u32::MAX));
    let other = model_worker("b", 2, Role::Decode, "m");
    let small = model_worker("b", 3, Role::Decode, "s");
    let f = Arc::new(fleet(vec![big, other, small]));
    let table = FleetCandidates::build(&f);
    assert!(table.runs("m").is_none(), "over the cap: not tabulated");
    assert_eq!(table.runs("s").map(<[_]>::len), Some(1));
    let loads = MapLoads::default();
    let namespaces = vec!["a", "b"];
    let scan = input(&f, &loads, "m", &namespaces, None);
    let tab = input(&f, &loads, "m", &namespaces, Some(&table));
    let (t, s) = (all(&tab), all(&scan));
    assert_eq!(t.len(), MAX_CANDIDATES + 1);
    assert_eq!(t, s);
}

/// A worker the stage does not want is skipped whole, however many ranks it declares: a pool's
/// prefill worker declaring 2^32 - 1 ranks costs the decode stage one check, not 4 billion.
#[test]
fn an_unwanted_worker_s_ranks_are_never_listed() {
    let mut huge = model_worker("a", 1, Role::Prefill, "m");
    huge.dp_size = Some(u32::MAX);
    let decode = model_worker("a", 2, Role::Decode, "m");
    let f = Arc::new(fleet(vec![huge, decode]));
    let table = FleetCandidates::build(&f);
    assert!(table.runs("m").is_none(), "over the cap: scanned");
    let loads = MapLoads::default();
    let namespaces = vec!["a"];
    let scan = input(&f, &loads, "m", &namespaces, None);
    let checks = std::cell::Cell::new(0u64);
    let decode_only = |role: Role, _pool: bool| {
        checks.set(checks.get() + 1);
        role == Role::Decode
    };
    let got = wanted(&scan, &decode_only);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0.worker, 1);
    assert!(
        checks.get() <= 2,
        "one check per worker, not per rank: {}",
        checks.get()
    );
    let ranks = in_namespace(&scan, 0, Role::Decode);
    assert_eq!(ranks.len(), 1);
    // Both pickers pick the decode worker of that pool.
    let mut cursors = super::super::PickerCursors::default();
    let pick = super::super::pick_load_based(&scan, &mut cursors, &mut Default::default())
        .expect("a decode worker");
    assert_eq!(pick.decode.instance_id.get(), 2);
}
