//! `select` against a naive reference: the rule as PICK-06/07 state it, pass by pass.

use crate::rng::SplitMix64;

use super::{Candidate, Cost, SelectReason, Selection, select};

/// PICK-06/07 read literally: with a fresh stage field somewhere, the `turn`-th (mod ties) of
/// the candidates at the lowest defined cost; else (or with no defined cost) round-robin.
fn reference(candidates: &[Candidate], turn: u64) -> Selection {
    let best = candidates
        .iter()
        .any(|c| c.fresh_field)
        .then(|| candidates.iter().filter_map(|c| c.cost).min())
        .flatten();
    let Some(best) = best else {
        return Selection {
            index: (turn % candidates.len() as u64) as usize,
            reason: SelectReason::RoundRobinStale,
        };
    };
    let tied: Vec<usize> = (0..candidates.len())
        .filter(|&i| candidates[i].cost == Some(best))
        .collect();
    Selection {
        index: tied[(turn % tied.len() as u64) as usize],
        reason: SelectReason::Load,
    }
}

#[test]
fn select_agrees_with_the_reference_and_advances_the_cursor_once() {
    let mut rng = SplitMix64::new(7);
    let mut next = move || rng.next_u64();
    let mut reasons = [0usize; 2];
    let mut tie_turns = 0;
    for _ in 0..20_000 {
        let n = 1 + (next() % 12) as usize;
        let candidates: Vec<Candidate> = (0..n)
            .map(|_| Candidate {
                // Few distinct values and two capacities, so costs tie often, also across
                // fractions (1/2 = 2/4).
                cost: (!next().is_multiple_of(4)).then(|| {
                    let den = [2, 4][(next() % 2) as usize];
                    Cost::new(next() % 3, den).unwrap()
                }),
                fresh_field: !next().is_multiple_of(3),
            })
            .collect();
        let turn = next() % 50;
        let mut cursor = turn;
        let got = select(&candidates, &mut cursor).unwrap();
        let want = reference(&candidates, turn);
        assert_eq!(got, want, "{candidates:?} turn {turn}");
        assert_eq!(cursor, turn + 1);
        reasons[usize::from(got.reason == SelectReason::Load)] += 1;
        let best = candidates.get(got.index).and_then(|c| c.cost);
        let tied = candidates.iter().filter(|c| c.cost == best).count();
        tie_turns += usize::from(got.reason == SelectReason::Load && tied > 1);
    }
    assert!(reasons.iter().all(|&r| r > 1_000), "{reasons:?}");
    assert!(tie_turns > 1_000, "{tie_turns}");
    assert_eq!(select(&[], &mut 0), None);
}
