//! Differential tests: a digest judges every load exactly as the rules judge the full load.

use std::time::Duration;

use crate::clock::Instant;
use crate::discovery::PublisherId;

use super::super::dispatch::Inflight;
use super::super::rules::{KeyLoad, Stage, Standing, classify, stage_backlog};
use super::super::store::KeyRead;
use super::super::{Sample, SampleView};
use super::{DigestStanding, FreshWindow, LoadDigest};

/// xorshift64*: a deterministic stream for the generated loads.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// A small value, often zero, sometimes huge (saturation).
fn value(state: &mut u64) -> u64 {
    match next(state) % 8 {
        0 => 0,
        1 => u64::MAX - next(state) % 3,
        _ => next(state) % 1000,
    }
}

fn field(state: &mut u64) -> Option<u64> {
    (!next(state).is_multiple_of(3)).then(|| value(state))
}

fn ms(state: &mut u64) -> Instant {
    Instant::from_origin(Duration::from_millis(next(state) % 10_000))
}

fn load(state: &mut u64) -> KeyLoad {
    let sample = (!next(state).is_multiple_of(4)).then(|| SampleView {
        sample: Sample {
            publisher_id: PublisherId::new(next(state)),
            sequence: next(state),
            active_decode_blocks: field(state),
            active_prefill_tokens: field(state),
            kv_used_blocks: field(state),
        },
        received_at: ms(state),
    });
    KeyLoad {
        read: KeyRead {
            sample,
            last_receipt: next(state).is_multiple_of(2).then(|| ms(state)),
        },
        inflight: Inflight {
            prefill_tokens: value(state),
            decode_blocks: value(state),
            stalled: next(state).is_multiple_of(3),
        },
    }
}

fn standing_of(s: Standing) -> DigestStanding {
    match s {
        Standing::Fresh(_) => DigestStanding::Fresh,
        Standing::Quiet => DigestStanding::Quiet,
        Standing::SilentWithLoad => DigestStanding::SilentWithLoad,
        Standing::Stalled => DigestStanding::Stalled,
    }
}

#[test]
fn digests_judge_every_load_as_the_rules_do() {
    let mut state = 0x9e37_79b9_7f4a_7c15;
    let mut seen = [0usize; 4];
    for _ in 0..20_000 {
        let l = load(&mut state);
        let d = LoadDigest::of(&l);
        let now = ms(&mut state);
        let max_age = Duration::from_millis(100 + next(&mut state) % 5_000);
        assert_eq!(
            d.is_fresh(max_age, now),
            l.fresh(max_age, now).is_some(),
            "{l:?}"
        );
        assert_eq!(d.stalled(), l.inflight.stalled);
        let window = FreshWindow::new(max_age, now);
        let fresh = d.is_fresh(max_age, now);
        for stage in [Stage::Prefill, Stage::Decode] {
            let f = d.stage_figures(stage);
            assert_eq!(f.received >= window.bound(), fresh, "{l:?}");
            assert_eq!(f.stalled, d.stalled());
            let b = d.backlog_of(d.standing_in(window, false), stage);
            let (backlog, fresh_field) = if fresh {
                (f.fresh_backlog, f.fresh_backlog.is_some())
            } else {
                (f.stale_backlog, false)
            };
            assert_eq!(
                (backlog, fresh_field),
                (b.backlog, b.fresh_field),
                "{l:?} {stage:?}"
            );
        }
        for judge in [false, true] {
            let standing = classify(&l, max_age, now, judge);
            let ds = d.standing(max_age, now, judge);
            assert_eq!(ds, standing_of(standing), "{l:?} judge {judge}");
            seen[ds as usize] += 1;
            for stage in [Stage::Prefill, Stage::Decode] {
                assert_eq!(
                    d.stage_backlog(stage, max_age, now, judge),
                    stage_backlog(standing, &l.inflight, stage),
                    "{l:?} {stage:?} judge {judge}"
                );
                let sampled = match (standing, stage) {
                    (Standing::Fresh(s), Stage::Prefill) => s.prefill_tokens().unwrap_or(0),
                    (Standing::Fresh(s), Stage::Decode) => s.decode_blocks().unwrap_or(0),
                    _ => 0,
                };
                let extra = match stage {
                    Stage::Prefill => l.inflight.prefill_tokens,
                    Stage::Decode => l.inflight.decode_blocks,
                };
                assert_eq!(d.other_stage(ds, stage), sampled.saturating_add(extra));
            }
        }
    }
    // Every standing was reached, so no branch went untested.
    assert!(seen.iter().all(|&n| n > 100), "{seen:?}");
}

#[test]
fn a_digest_is_smaller_than_the_load_it_digests() {
    assert!(std::mem::size_of::<LoadDigest>() <= 56);
    assert!(std::mem::size_of::<LoadDigest>() < std::mem::size_of::<KeyLoad>());
}
