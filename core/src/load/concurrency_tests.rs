//! Real threads: one writer per structure, readers that must never see a torn value and must
//! eventually see the last one. Bounded in iterations and in wall time.
#![allow(clippy::disallowed_methods)] // real threads run for a bounded wall time

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant as WallInstant};

use super::test_support::{key, store_with, worker};
use super::{DispatchLedger, DispatchLoad, InflightReader, LoadStore, Sample, instant};
use crate::discovery::PublisherId;

const WRITES: u64 = 60_000;
const KEYS: u32 = 4;
const WALL_LIMIT: Duration = Duration::from_secs(60);

/// A sample whose fields are all functions of `seq`, so a torn read is detectable.
fn coherent(seq: u64) -> Sample {
    Sample {
        publisher_id: PublisherId::new(seq % 3 + 1),
        sequence: seq,
        active_decode_blocks: (!seq.is_multiple_of(5)).then_some(seq),
        active_prefill_tokens: Some(seq.wrapping_mul(3)),
        kv_used_blocks: Some(seq ^ 0x5555_aaaa_5555_aaaa),
    }
}

#[test]
fn readers_never_observe_a_torn_sample_and_see_the_latest() {
    let store = Arc::new(store_with(vec![worker(42, 0, KEYS)]));
    let done = Arc::new(AtomicBool::new(false));
    let start = WallInstant::now();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (store, done) = (Arc::clone(&store), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut last_seen = [0u64; KEYS as usize];
                let mut reads = 0u64;
                loop {
                    let finished = done.load(Ordering::Acquire);
                    let view = store.view();
                    for r in 0..KEYS {
                        let Some(v) = view.read(key(42, r)).sample else {
                            continue;
                        };
                        let seq = v.sample.sequence;
                        assert_eq!(v.sample, coherent(seq), "torn sample at seq {seq}");
                        assert_eq!(v.received_at, instant(seq), "torn receipt at seq {seq}");
                        assert_eq!(
                            u64::from(r),
                            seq % u64::from(KEYS),
                            "sample in the wrong key"
                        );
                        assert!(seq >= last_seen[r as usize], "went back in time");
                        last_seen[r as usize] = seq;
                        reads += 1;
                    }
                    if finished || start.elapsed() > WALL_LIMIT {
                        break;
                    }
                }
                (last_seen, reads)
            })
        })
        .collect();
    for seq in 1..=WRITES {
        let k = key(42, u32::try_from(seq % u64::from(KEYS)).unwrap());
        // Publisher ids rotate, so every write replaces (restarted-publisher rule).
        store.apply(k, &coherent(seq), instant(seq));
    }
    done.store(true, Ordering::Release);
    for h in readers {
        let (last_seen, reads) = h.join().unwrap();
        assert!(reads > 0);
        for r in 0..u64::from(KEYS) {
            assert_eq!(
                last_seen[r as usize],
                WRITES - (WRITES + u64::from(KEYS) - r) % u64::from(KEYS),
                "latest of rank {r}"
            );
        }
    }
    assert!(start.elapsed() < WALL_LIMIT, "bounded");
}

#[test]
fn inflight_summaries_are_never_torn_across_threads() {
    let store: Arc<LoadStore> = Arc::new(store_with(vec![worker(1, 0, 1)]));
    let mut ledger = DispatchLedger::new();
    let tables = vec![ledger.table()];
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (store, done, tables) = (Arc::clone(&store), Arc::clone(&done), tables.clone());
        std::thread::spawn(move || {
            let reader = InflightReader::new(&tables);
            let mut max = 0;
            let start = WallInstant::now();
            loop {
                let finished = done.load(Ordering::Acquire);
                let view = store.view();
                let read = view.read(key(1, 0));
                let inf = reader.inflight(&view, key(1, 0), &read, instant(0));
                assert_eq!(inf.prefill_tokens, 2 * inf.decode_blocks, "torn summary");
                max = max.max(inf.decode_blocks);
                if finished || start.elapsed() > WALL_LIMIT {
                    return max;
                }
            }
        })
    };
    let load = DispatchLoad {
        prefill_tokens: 2,
        decode_blocks: 1,
        stall_eligible: false,
    };
    let n = 20_000u64;
    for _ in 0..n {
        let view = store.view();
        ledger.dispatch(&view, key(1, 0), load, instant(0));
    }
    done.store(true, Ordering::Release);
    let max = reader.join().unwrap();
    // The ledger merges beyond MAX_RECORDS_PER_KEY, so the sums stay exact.
    assert_eq!(max, n, "the reader saw the final sum");
}
