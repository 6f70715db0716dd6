//! [`scan_uniform`] against the general way (every lane costed into the shared rules, the stall
//! judgement applied, [`select`]) over seeded random uniform lane lists, with backlogs drawn near
//! the clamping cap and `u64::MAX`, stalled and silent lanes, and random cursors.

use std::num::{NonZeroU32, NonZeroU64};

use super::{Lane, LaneCost, Scan, Shape, scan_uniform};
use crate::load::rules::{Candidate, Stage, select};
use crate::load::{StageFigures, request_blocks};
use crate::rng::SplitMix64;

/// The general way, as `select_stage` runs it when the scan declines.
fn general(
    lanes: &[Lane],
    (stage, bound, prompt): (Stage, u64, u64),
    cursor: &mut u64,
) -> Option<usize> {
    let mut cost = LaneCost::new(bound, prompt, stage);
    let mut judge = false;
    let mut candidates: Vec<Candidate> = lanes
        .iter()
        .map(|l| {
            let (c, fresh) = cost.of(l);
            judge |= fresh;
            c
        })
        .collect();
    for (c, l) in candidates.iter_mut().zip(lanes) {
        if judge && l.flags & super::STALLED != 0 {
            *c = Candidate {
                cost: None,
                fresh_field: false,
            };
        }
    }
    select(&candidates, cursor).map(|s| s.index)
}

/// A backlog: small and tie-prone, or near the clamping cap and `u64::MAX`.
fn backlog(rng: &mut SplitMix64, blocks: u64) -> u64 {
    match rng.next_u64() % 8 {
        0 => u64::MAX - rng.next_u64() % 3,
        1 => (u64::MAX - blocks.max(1))
            .saturating_sub(rng.next_u64() % 3)
            .saturating_add(1),
        _ => rng.next_u64() % 6,
    }
}

fn lane(rng: &mut SplitMix64, den: u64, block_size: Option<NonZeroU32>, blocks: u64) -> Lane {
    let pick = |rng: &mut SplitMix64, one_in: u64| rng.next_u64().is_multiple_of(one_in);
    let figures = StageFigures {
        received: rng.next_u64() % 4,
        fresh_backlog: (!pick(rng, 5)).then(|| backlog(rng, blocks)),
        stale_backlog: (!pick(rng, 5)).then(|| backlog(rng, blocks)),
        stalled: pick(rng, 12),
    };
    Lane::of(figures, NonZeroU64::new(den), block_size)
}

#[test]
fn the_uniform_scan_selects_as_the_general_way_or_declines() {
    let mut rng = SplitMix64::new(0x1a_4e5);
    let (mut chose, mut declined) = (0, 0);
    for case in 0..20_000 {
        let stage = if case % 2 == 0 {
            Stage::Decode
        } else {
            Stage::Prefill
        };
        let den = 1 + rng.next_u64() % 4;
        let block_size = NonZeroU32::new(1 + (rng.next_u64() % 3) as u32 * 15);
        let prompt = match rng.next_u64() % 3 {
            0 => 0,
            1 => 1 + rng.next_u64() % 100,
            _ => u64::MAX - rng.next_u64() % 2,
        };
        let blocks = request_blocks(prompt, block_size.map(NonZeroU32::get)).unwrap_or(0);
        let n = 1 + (rng.next_u64() % 12) as usize;
        let lanes: Vec<Lane> = (0..n)
            .map(|_| lane(&mut rng, den, block_size, blocks))
            .collect();
        let shape = Shape::of(&lanes).expect("one shape");
        let bound = rng.next_u64() % 5;
        let start = rng.next_u64() % 7;
        let (mut fast, mut slow) = (start, start);
        let mut keys = Vec::new();
        let args = (stage, bound, prompt);
        match scan_uniform(&lanes, shape, args, &mut fast, &mut keys) {
            Scan::Chose(sel) => {
                chose += 1;
                assert_eq!(
                    Some(sel.index),
                    general(&lanes, args, &mut slow),
                    "{lanes:?}"
                );
                assert_eq!(fast, slow, "the cursor advanced once");
            }
            Scan::Declined => {
                declined += 1;
                assert_eq!(fast, start, "a declined scan leaves the cursor");
                let stalled_judged = lanes.iter().any(|l| l.flags & super::STALLED != 0)
                    && lanes.iter().any(|l| l.received >= bound);
                let cap = u64::MAX - blocks.max(1);
                let near_cap = lanes.iter().any(|l| l.fresh.max(l.quiet) >= cap);
                assert!(
                    stalled_judged || near_cap,
                    "declined without cause: {lanes:?}"
                );
            }
            Scan::Empty => panic!("lanes were not empty"),
        }
    }
    // Both outcomes are exercised, the scan mostly deciding.
    assert!(
        chose > 10_000 && declined > 500,
        "{chose} chosen, {declined} declined"
    );
}

#[test]
fn lanes_of_two_denominators_or_block_sizes_have_no_shape() {
    let figures = StageFigures {
        received: 1,
        fresh_backlog: Some(1),
        stale_backlog: Some(0),
        stalled: false,
    };
    let bs = NonZeroU32::new(16);
    let a = Lane::of(figures, NonZeroU64::new(10), bs);
    let b = Lane::of(figures, NonZeroU64::new(20), bs);
    let c = Lane::of(figures, NonZeroU64::new(10), NonZeroU32::new(32));
    let none = Lane::of(figures, None, bs);
    assert!(Shape::of(&[a, a]).is_some());
    assert_eq!(Shape::of(&[a, b]), None);
    assert_eq!(Shape::of(&[a, c]), None);
    assert_eq!(
        Shape::of(&[none, none]),
        None,
        "no denominator: no cost to compare"
    );
    assert_eq!(Shape::of(&[]), None);
}

#[test]
fn an_empty_list_is_empty_and_keeps_the_cursor() {
    let shape = Shape::of(&[Lane::of(
        StageFigures {
            received: 0,
            fresh_backlog: None,
            stale_backlog: None,
            stalled: false,
        },
        NonZeroU64::new(1),
        NonZeroU32::new(16),
    )])
    .expect("a shape");
    let mut cursor = 3;
    let scan = scan_uniform(
        &[],
        shape,
        (Stage::Decode, 0, 1),
        &mut cursor,
        &mut Vec::new(),
    );
    assert_eq!((scan, cursor), (Scan::Empty, 3));
}
