//! Micro-measurements of the data-path costs quoted in `docs/decisions.md`. Ignored by default; run
//! `cargo test --release -p continuum-core --lib load::bench_tests -- --ignored --nocapture`.
#![allow(clippy::disallowed_methods)] // timing tests of the store under real threads

use std::hint::black_box;
use std::time::{Duration, Instant as WallInstant};

use super::rules::KeyLoad;
use super::test_support::{key, sample, store_with, worker};
use super::{DispatchLedger, InflightReader, LiveSet, LoadStore, MAX_LOAD_KEYS, instant};
use crate::discovery::PublisherId;

fn per_op(n: u64, f: impl FnMut(u64)) -> Duration {
    let mut f = f;
    let start = WallInstant::now();
    for i in 0..n {
        f(i);
    }
    start.elapsed() / u32::try_from(n).unwrap_or(u32::MAX)
}

fn measure(label: &str, workers: u32, ranks: u32) {
    let store = store_with(
        (0..workers)
            .map(|w| worker(u64::from(w) + 1, 0, ranks))
            .collect(),
    );
    let keys = u64::from(workers * ranks);
    let k = |i: u64| {
        key(
            i % u64::from(workers) + 1,
            u32::try_from(i / u64::from(workers) % u64::from(ranks)).unwrap_or(0),
        )
    };
    let n = 2_000_000u64;
    let apply = per_op(n, |i| {
        black_box(store.apply(k(i), &sample(1, i + 1, Some(i), None), instant(i)));
    });
    let view = store.view();
    let fresh_view = per_op(n, |i| {
        black_box(view.fresh(k(i), Duration::from_secs(3), instant(i)));
    });
    drop(view);
    let fresh_store = per_op(n, |i| {
        black_box(store.fresh(k(i), Duration::from_secs(3), instant(i)));
    });
    let ledgers = [
        DispatchLedger::new(),
        DispatchLedger::new(),
        DispatchLedger::new(),
        DispatchLedger::new(),
    ];
    let tables: Vec<_> = ledgers.iter().map(DispatchLedger::table).collect();
    let reader = InflightReader::new(&tables);
    let view = store.view();
    let assess = per_op(n, |i| {
        black_box(KeyLoad::assess(&view, &reader, k(i), instant(i)));
    });
    drop(view);
    let discard = per_op(20, |_| {
        black_box(store.discard_publisher(PublisherId::new(99)));
    });
    eprintln!(
        "{label}: {keys} keys: apply {apply:?}, fresh (pinned view) {fresh_view:?}, fresh (store) \
         {fresh_store:?}, assess over 4 shard tables {assess:?}, discard_publisher scan {discard:?}"
    );
}

#[test]
#[ignore = "timing; run in release"]
fn bench_data_path_costs() {
    measure("small", 64, 1);
    measure("large", 8192, 8);
    let full = u32::try_from(MAX_LOAD_KEYS).unwrap_or(0);
    let s = LoadStore::new();
    let start = WallInstant::now();
    s.set_live_and_retain(&LiveSet::new(vec![worker(1, 0, full)]));
    let first = start.elapsed();
    let start = WallInstant::now();
    s.set_live_and_retain(&LiveSet::new(vec![
        worker(1, 0, full / 2),
        worker(2, 0, full / 2),
    ]));
    let churn = start.elapsed();
    eprintln!(
        "set_live_and_retain at 65,536 keys: first {first:?}, half departed/half new {churn:?}"
    );
}
