//! Property tests (API-09, DISC-ETCD-04/11): the view is a function of the held records, not of
//! the order they arrived in, and an idempotent resync returns the pointer-equal view.
//!
//! A small deterministic generator (xorshift) drives the cases so the crate needs no extra
//! dependency; every case is reproducible from its seed.

use std::sync::Arc;

use super::fleet::FleetView;
use super::reducer::Reducer;
use super::test_support::{Kv, Rng, card, card_json, channel, del, endpoint, put, source};

const NAMESPACES: [&str; 2] = ["ns", "ns.two"];
const COMPONENTS: [&str; 3] = ["prefill", "decode", "backend"];
const ROLES: [Option<&str>; 5] = [
    None,
    Some("prefill"),
    Some("decode"),
    Some("aggregated"),
    Some("x"),
];

/// A random record; small id spaces make duplicates, conflicts and overwrites frequent.
fn record(rng: &mut Rng) -> Kv {
    let ns = NAMESPACES[rng.below(2) as usize];
    let comp = COMPONENTS[rng.below(3) as usize];
    let id = 1 + rng.below(6);
    match rng.below(6) {
        0 | 1 => {
            let mut kv = endpoint(ns, comp, "generate", id);
            if rng.below(4) == 0 {
                // Another key claiming the same id.
                kv.0 = format!("v1/instances/{ns}/{comp}/generate/{:x}", id + 100);
            }
            kv
        }
        2 => endpoint(ns, comp, "load_metrics", id),
        3 => {
            let model = ["a", "b"][rng.below(2) as usize];
            card(ns, comp, id, card_json(model, ROLES[rng.below(5) as usize]))
        }
        4 => {
            // Event sources, now and then naming another publisher than their key (malformed).
            let pid = 1 + rng.below(5);
            let mut kv = source(ns, comp, pid, 1 + rng.below(6), rng.below(2) as u32);
            if rng.below(4) == 0 {
                kv.1 = kv.1.replacen(
                    &format!("\"publisher_id\":{pid}"),
                    &format!("\"publisher_id\":{}", pid + 1),
                    1,
                );
            }
            kv
        }
        _ => {
            let topic =
                ["kv_metrics", "kv-events", "active_sequences_events"][rng.below(3) as usize];
            let ep = ["tcp://10.0.0.1:1", "tcp://10.0.0.2:2", "ipc://x"][rng.below(3) as usize];
            channel(ns, comp, topic, 1 + rng.below(5), ep)
        }
    }
}

/// The final etcd contents after a random history of puts and deletes, and that history.
fn history(rng: &mut Rng) -> (Vec<Kv>, Vec<(bool, Kv)>) {
    let mut ops = Vec::new();
    let mut state: std::collections::BTreeMap<String, String> = Default::default();
    for _ in 0..(5 + rng.below(40)) {
        if !state.is_empty() && rng.below(5) == 0 {
            let i = rng.below(state.len() as u64) as usize;
            if let Some(k) = state.keys().nth(i).cloned() {
                state.remove(&k);
                ops.push((false, (k, String::new())));
            }
        } else {
            let kv = record(rng);
            state.insert(kv.0.clone(), kv.1.clone());
            ops.push((true, kv));
        }
    }
    (state.into_iter().collect(), ops)
}

fn fresh(kvs: &[Kv]) -> Arc<FleetView> {
    let mut r = Reducer::new();
    for kv in kvs {
        put(&mut r, kv);
    }
    r.materialize()
}

#[test]
fn snapshot_order_does_not_matter_and_equals_the_incremental_view() {
    for seed in 1..=300u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let (snapshot, ops) = history(&mut rng);

        // Incremental: the history, materialising now and then.
        let mut inc = Reducer::new();
        for (is_put, kv) in &ops {
            if *is_put {
                put(&mut inc, kv);
            } else {
                del(&mut inc, &kv.0);
            }
            if rng.below(3) == 0 {
                inc.materialize();
            }
        }
        let incremental = inc.materialize();

        // From empty, in two random orders.
        let mut a = snapshot.clone();
        rng.shuffle(&mut a);
        let mut b = snapshot.clone();
        rng.shuffle(&mut b);
        let (va, vb) = (fresh(&a), fresh(&b));
        assert_eq!(va, vb, "seed {seed}: order changed the view");
        assert_eq!(
            *va, *incremental,
            "seed {seed}: incremental differs from snapshot"
        );

        // Resync of the same data, in yet another order: pointer-equal (DISC-ETCD-11).
        inc.begin_resync();
        let mut c = snapshot.clone();
        rng.shuffle(&mut c);
        for kv in &c {
            put(&mut inc, kv);
        }
        inc.end_resync();
        assert!(
            Arc::ptr_eq(&incremental, &inc.materialize()),
            "seed {seed}: resync bumped"
        );

        // Resync onto a smaller snapshot equals a fresh reducer on that snapshot.
        let keep: Vec<Kv> = snapshot
            .iter()
            .filter(|_| rng.below(2) == 0)
            .cloned()
            .collect();
        inc.begin_resync();
        for kv in &keep {
            put(&mut inc, kv);
        }
        inc.end_resync();
        assert_eq!(
            *inc.materialize(),
            *fresh(&keep),
            "seed {seed}: resync kept stale records"
        );
    }
}
