//! The shard's KV writer side: what reaches the index, what clears it, and the admin rows.

use std::sync::Arc;
use std::time::Duration;

use continuum_core::clock::Instant;
use continuum_core::discovery::{InstanceId, PublisherId};
use continuum_core::dynamo_event::Encoding;
use continuum_core::kv::encode::{KvDataRef, KvEventRef, encode_batch};
use continuum_core::kv::event::{KvBatch, Tier};
use continuum_core::kv::handler::LiveGate;
use continuum_core::kv::{EngineHash, Outcome, StoredBlock, TokensHash, path_hash};
use continuum_core::load::{DispatchLedger, LiveSet, LiveWorker, LoadKey, LoadStore};
use continuum_core::picker::{BlockHash, OverlapSource, PromptBlocks};

use super::{DOWN_CLEARS_AFTER, ShardKv, SharedKv};
use crate::signals::Signals;

const WORKER: u64 = 0x1a7f2b;

fn signals() -> Arc<Signals> {
    let ledgers = [DispatchLedger::new()];
    Arc::new(Signals::new(Arc::new(LoadStore::new()), &ledgers))
}

fn at(secs: u64) -> Instant {
    Instant::from_origin(Duration::from_secs(1000 + secs))
}

fn gate(ranks: u32) -> LiveGate {
    LiveGate::from_live(LiveSet::new([LiveWorker::new(
        InstanceId::new(WORKER),
        "ns",
        0,
        ranks,
    )]))
}

/// A chain of `n` blocks from the root, engine hash = path hash (as the 1.6.1 mocker).
fn chain(n: u64, salt: u64) -> (Vec<StoredBlock>, Vec<BlockHash>) {
    let mut parent = None;
    let mut blocks = Vec::new();
    let mut paths = Vec::new();
    for i in 0..n {
        let p = path_hash(parent, TokensHash(salt * 1000 + i + 1));
        blocks.push(StoredBlock {
            block_hash: EngineHash(p.0),
            tokens_hash: TokensHash(salt * 1000 + i + 1),
        });
        paths.push(p);
        parent = Some(p);
    }
    (blocks, paths)
}

fn stored_batch(rank: u32, event_id: u64, blocks: &[StoredBlock]) -> KvBatch {
    let ev = KvEventRef {
        worker: InstanceId::new(WORKER),
        dp_rank: rank,
        event_id,
        tier: Tier::Device,
        data: KvDataRef::Stored {
            parent: None,
            blocks,
        },
    };
    let mut payload = Vec::new();
    encode_batch(&[ev], Encoding::Map, &mut payload);
    let mut batch = KvBatch::new();
    batch.decode(&payload).expect("valid batch");
    batch
}

fn overlap(signals: &Signals, paths: &[BlockHash]) -> Vec<(LoadKey, u32)> {
    let handles = signals.kv.handles();
    let merged = continuum_core::kv::shared::Merged(&handles);
    let mut out = Vec::new();
    merged.find_matches(
        PromptBlocks {
            block_size: 64,
            hashes: paths,
        },
        &mut |k, n| out.push((k, n)),
    );
    out.sort_by_key(|(k, _)| k.dp_rank);
    out
}

fn setup() -> (Arc<Signals>, SharedKv, PublisherId) {
    let signals = signals();
    let kv = ShardKv::new(0, signals.clone()).expect("first writer");
    let id = PublisherId::new(7);
    kv.borrow_mut().set_gate(gate(2));
    kv.borrow_mut().open(id, None, at(0));
    (signals, kv, id)
}

#[test]
fn a_batch_is_visible_to_readers_and_counted_once_applied() {
    let (signals, kv, id) = setup();
    let (blocks, paths) = chain(4, 1);
    kv.borrow_mut()
        .apply(id, &stored_batch(1, 1, &blocks), at(1));
    let key = LoadKey {
        worker_id: InstanceId::new(WORKER),
        dp_rank: 1,
    };
    assert_eq!(overlap(&signals, &paths), vec![(key, 4)]);
    assert_eq!(overlap(&signals, &paths[..2]), vec![(key, 2)]);
    assert_eq!(signals.kv.events(0).get(Outcome::Applied), 1);
    // The first rows are published at once; the writer is handed out only once.
    let rows = signals.kv.ranks_of(InstanceId::new(WORKER));
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].blocks, rows[0].last_event_id), (4, 1));
    assert!(ShardKv::new(0, signals.clone()).is_none());
    assert_eq!(signals.kv.budget.nodes(), 4);
}

#[test]
fn a_rank_the_gate_does_not_admit_is_refused_and_a_departed_worker_is_cleared() {
    let (signals, kv, id) = setup();
    let (blocks, paths) = chain(3, 2);
    // dp_rank 2 is not declared (ranks 0..2).
    kv.borrow_mut()
        .apply(id, &stored_batch(2, 1, &blocks), at(1));
    assert_eq!(signals.kv.events(0).get(Outcome::IdentityMismatch), 1);
    assert!(overlap(&signals, &paths).is_empty());
    kv.borrow_mut()
        .apply(id, &stored_batch(0, 1, &blocks), at(2));
    assert_eq!(overlap(&signals, &paths).len(), 1);
    // The worker leaves the live set: its ranks are cleared for every reader.
    kv.borrow_mut().set_gate(LiveGate::default());
    assert!(overlap(&signals, &paths).is_empty());
    assert_eq!(signals.kv.budget.ownerships(), 0);
    assert!(
        signals
            .kv
            .ranks_of(InstanceId::new(WORKER))
            .iter()
            .all(|r| r.blocks == 0)
    );
}

#[test]
fn a_subscription_down_for_more_than_a_minute_loses_its_ranks() {
    let (signals, kv, id) = setup();
    let (blocks, paths) = chain(2, 3);
    kv.borrow_mut().set_connected(id, true, at(1));
    kv.borrow_mut()
        .apply(id, &stored_batch(0, 1, &blocks), at(1));
    kv.borrow_mut().set_connected(id, false, at(10));
    // Still connected-enough: down for exactly the limit keeps the blocks.
    let limit = DOWN_CLEARS_AFTER.as_secs();
    kv.borrow_mut().tick(at(10 + limit));
    assert_eq!(overlap(&signals, &paths).len(), 1);
    // A reconnect attempt that fails again does not restart the clock.
    kv.borrow_mut().set_connected(id, false, at(30));
    kv.borrow_mut().tick(at(11 + limit));
    assert!(overlap(&signals, &paths).is_empty());
    assert_eq!(signals.kv.budget.nodes(), 0);
}

#[test]
fn a_reconnect_in_time_keeps_the_blocks() {
    let (signals, kv, id) = setup();
    let (blocks, paths) = chain(2, 4);
    kv.borrow_mut()
        .apply(id, &stored_batch(0, 1, &blocks), at(1));
    kv.borrow_mut().set_connected(id, false, at(10));
    kv.borrow_mut().set_connected(id, true, at(50));
    kv.borrow_mut().tick(at(200));
    assert_eq!(overlap(&signals, &paths).len(), 1);
}

#[test]
fn closing_a_subscription_clears_what_it_fed_and_only_that() {
    let (signals, kv, id) = setup();
    let other = PublisherId::new(8);
    kv.borrow_mut().open(other, None, at(0));
    let (a, pa) = chain(3, 5);
    let (b, pb) = chain(2, 6);
    kv.borrow_mut().apply(id, &stored_batch(0, 1, &a), at(1));
    kv.borrow_mut().apply(other, &stored_batch(1, 1, &b), at(1));
    kv.borrow_mut().close(id);
    assert!(overlap(&signals, &pa).is_empty());
    assert_eq!(overlap(&signals, &pb).len(), 1);
    // A batch for a closed subscription changes nothing.
    kv.borrow_mut().apply(id, &stored_batch(0, 2, &a), at(2));
    assert!(overlap(&signals, &pa).is_empty());
    kv.borrow_mut().close_all();
    assert!(overlap(&signals, &pb).is_empty());
    assert_eq!(signals.kv.budget.ownerships(), 0);
}

#[test]
fn a_registered_source_confines_its_publisher_and_a_new_source_starts_over() {
    let (signals, kv, id) = setup();
    let rank0 = LoadKey {
        worker_id: InstanceId::new(WORKER),
        dp_rank: 0,
    };
    kv.borrow_mut().open(id, Some(rank0), at(0));
    let (blocks, paths) = chain(2, 7);
    // Rank 1 is declared by the worker but is not this publisher's registered source.
    kv.borrow_mut()
        .apply(id, &stored_batch(1, 1, &blocks), at(1));
    assert_eq!(signals.kv.events(0).get(Outcome::IdentityMismatch), 1);
    kv.borrow_mut()
        .apply(id, &stored_batch(0, 1, &blocks), at(1));
    assert_eq!(overlap(&signals, &paths), vec![(rank0, 2)]);
    // The same source again keeps everything.
    kv.borrow_mut().open(id, Some(rank0), at(2));
    assert_eq!(overlap(&signals, &paths), vec![(rank0, 2)]);
    // A different registration clears what the old one fed.
    let rank1 = LoadKey {
        dp_rank: 1,
        ..rank0
    };
    kv.borrow_mut().open(id, Some(rank1), at(3));
    assert!(overlap(&signals, &paths).is_empty());
    kv.borrow_mut()
        .apply(id, &stored_batch(1, 5, &blocks), at(4));
    assert_eq!(overlap(&signals, &paths), vec![(rank1, 2)]);
}
