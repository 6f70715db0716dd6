//! The KV index end to end from captured Dynamo 1.6.1 `kv-events`: discovery (a real etcd seeded
//! from the capture's registrations) names four kv-events publishers (three workers, one of them
//! with two data-parallel ranks), each one a REAL libzmq PUB socket (pyzmq) here; the router's
//! own bounded ZMTP client subscribes to each on the shard its publisher id names, and the
//! captured messages, replayed in capture order, build the index a small reference model computes
//! from `decoded.jsonl`: per rank the blocks held and the last event id, and the index's nodes
//! (one per distinct path of `tokens_hash` from the root, per shard) and ownerships. Then the
//! handler rules on top: a replay changes nothing, a publisher or a worker leaving discovery takes
//! its ranks with it, a `cleared` event empties its rank, a gap clears the rank before applying,
//! a stored event under a parent the rank lacks is refused.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo-kv")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use common::etcd::{EtcdServer, read_dump};
use common::kv::{KV_WAIT, KvRow, KvView, RankKey, kv_message, kv_yaml, refs, same, wait_view};
use common::zmq::ZmqPublisher;
use common::{RouterConfig, RouterProcess};
use continuum_core::discovery::{InstanceId, PublisherId};
use continuum_core::kv::encode::{KvDataRef, KvEventRef};
use continuum_core::kv::event::Tier;
use continuum_core::kv::{EngineHash, StoredBlock, TokensHash};
use continuum_core::subscriptions::shard_of;
use serde_json::Value;

const KV_FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/fixtures/dynamo-1.6.1/kv-events"
);
/// The shard count of the synthesised-capture test (one publisher).
const SHARDS: usize = 2;
const SUBSCRIBED_WITHIN: Duration = Duration::from_secs(15);

fn fixture(name: &str) -> String {
    let p = format!("{KV_FIXTURES}/{name}");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

fn jsonl(name: &str) -> Vec<Value> {
    fixture(name)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{name}: {e}: {l}")))
        .collect()
}

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex {s}");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// One captured kv-events publisher (`sources.json`).
#[derive(Debug, Clone)]
struct Source {
    /// The hex suffix of its etcd keys.
    key_suffix: String,
    /// The endpoint it had at capture time (how `raw-frames.jsonl` names it).
    endpoint: String,
    publisher_id: u64,
    namespace: String,
    worker_id: u64,
    dp_rank: u32,
}

fn sources() -> Vec<Source> {
    let v: Value = serde_json::from_str(&fixture("sources.json")).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| Source {
            key_suffix: s["key_suffix"].as_str().unwrap().to_owned(),
            endpoint: s["endpoint"].as_str().unwrap().to_owned(),
            publisher_id: s["publisher_id"].as_u64().unwrap(),
            namespace: s["ns"].as_str().unwrap().to_owned(),
            worker_id: s["worker_id"].as_u64().unwrap(),
            dp_rank: u32::try_from(s["dp_rank"].as_u64().unwrap()).unwrap(),
        })
        .collect()
}

/// One captured message: the endpoint it came from and its 4 frames (`raw/NNNN.fK.bin`).
#[derive(Debug, Clone)]
struct Captured {
    n: u64,
    endpoint: String,
    frames: Vec<Vec<u8>>,
}

fn captured_messages() -> Vec<Captured> {
    jsonl("raw-frames.jsonl")
        .iter()
        .map(|m| {
            let n = m["n"].as_u64().unwrap();
            let frames: Vec<Vec<u8>> = (0..4)
                .map(|k| {
                    let p = format!("{KV_FIXTURES}/raw/{n:04}.f{k}.bin");
                    std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
                })
                .collect();
            // The binary files and the JSON capture agree (a broken fixture fails here).
            let hex: Vec<Vec<u8>> = m["frames_hex"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| unhex(h.as_str().unwrap()))
                .collect();
            assert_eq!(
                frames, hex,
                "raw/{n:04}.f*.bin differ from raw-frames.jsonl"
            );
            Captured {
                n,
                endpoint: m["endpoint"].as_str().unwrap().to_owned(),
                frames,
            }
        })
        .collect()
}

/// The reference model of the index: per rank, each held engine hash and the node it names (the
/// path of `tokens_hash` from the root, spelled out, not hashed), and the rank's last event id.
#[derive(Debug, Clone, Default)]
struct Reference {
    ranks: BTreeMap<RankKey, RankModel>,
    events: u64,
}

#[derive(Debug, Clone, Default)]
struct RankModel {
    held: BTreeMap<u64, Vec<u64>>,
    last_event_id: u64,
}

impl Reference {
    /// Applies one decoded RouterEvent (`decoded.jsonl`'s `router_event`) of a gap-free,
    /// device-tier capture whose every parent is held.
    fn apply(&mut self, ev: &Value) {
        assert_eq!(ev["storage_tier"], "device", "{ev}");
        let worker = ev["worker_id"].as_u64().unwrap();
        let e = &ev["event"];
        let rank = u32::try_from(e["dp_rank"].as_u64().unwrap()).unwrap();
        let id = e["event_id"].as_u64().unwrap();
        let m = self.ranks.entry((worker, rank)).or_default();
        assert_eq!(id, m.last_event_id + 1, "the capture is gap-free: {ev}");
        m.last_event_id = id;
        self.events += 1;
        let data = &e["data"];
        if data == "cleared" {
            m.held.clear();
        } else if let Some(s) = data.get("stored") {
            let mut path = match s["parent_hash"].as_u64() {
                None => Vec::new(),
                Some(p) => m
                    .held
                    .get(&p)
                    .unwrap_or_else(|| panic!("the capture's parent {p} is held: {ev}"))
                    .clone(),
            };
            for b in s["blocks"].as_array().unwrap() {
                path.push(b["tokens_hash"].as_u64().unwrap());
                m.held
                    .insert(b["block_hash"].as_u64().unwrap(), path.clone());
            }
        } else if let Some(r) = data.get("removed") {
            for h in r["block_hashes"].as_array().unwrap() {
                m.held.remove(&h.as_u64().unwrap());
            }
        } else {
            panic!("unknown event data {data}");
        }
    }

    fn replay(events: &[Value]) -> Reference {
        let mut r = Reference::default();
        for ev in events {
            r.apply(ev);
        }
        r
    }

    /// The admin rows the router should show.
    fn rows(&self) -> BTreeMap<RankKey, KvRow> {
        self.ranks
            .iter()
            .map(|(k, m)| {
                (
                    *k,
                    KvRow {
                        blocks: m.held.len() as u64,
                        last_event_id: m.last_event_id,
                    },
                )
            })
            .collect()
    }

    /// Nodes of the whole router: each shard's index holds one node per distinct path among
    /// the ranks it is fed (`shard_of_rank`), and the gauge sums the shards.
    fn nodes(&self, shard_of_rank: &BTreeMap<RankKey, usize>) -> u64 {
        let mut per_shard: BTreeMap<usize, BTreeSet<&Vec<u64>>> = BTreeMap::new();
        let mut hashes: BTreeMap<usize, BTreeSet<u64>> = BTreeMap::new();
        for (k, m) in &self.ranks {
            let shard = shard_of_rank[k];
            per_shard.entry(shard).or_default().extend(m.held.values());
            hashes.entry(shard).or_default().extend(m.held.keys());
        }
        // The mocker's block_hash is the path hash: distinct live hashes = distinct paths.
        for (shard, paths) in &per_shard {
            assert_eq!(
                paths.len(),
                hashes[shard].len(),
                "block_hash is not one-to-one with the token path on shard {shard}"
            );
        }
        per_shard.values().map(|p| p.len() as u64).sum()
    }

    fn ownerships(&self) -> u64 {
        self.ranks.values().map(|m| m.held.len() as u64).sum()
    }

    fn max_rank_blocks(&self) -> u64 {
        self.ranks
            .values()
            .map(|m| m.held.len() as u64)
            .max()
            .unwrap_or(0)
    }
}

/// `Ok` when the view shows exactly `model`'s rows and gauges and `counts` events.
fn matches_model(
    v: &KvView,
    model: &Reference,
    shard_of_rank: &BTreeMap<RankKey, usize>,
    counts: &[(&str, u64)],
) -> Result<(), String> {
    same("kv rows", &v.rows, &model.rows())?;
    if !v.counts_are(counts) {
        return Err(format!(
            "kv events: expected {counts:?}, observed {:?}",
            v.events
        ));
    }
    same(
        "continuum_dynamo_kv_index_blocks",
        v.index_blocks,
        Some(model.nodes(shard_of_rank)),
    )?;
    same(
        "continuum_dynamo_kv_index_ownerships",
        v.index_ownerships,
        Some(model.ownerships()),
    )
}

/// `v1/instances` and `v1/mdc` of every captured worker, the event sources, and every
/// kv-events channel rewritten to point at `endpoint_of[key_suffix]`.
fn seed(etcd: &EtcdServer, endpoint_of: &BTreeMap<String, String>) {
    let dump = read_dump(Path::new(&format!(
        "{KV_FIXTURES}/etcd-dump-with-event-sources.txt"
    )));
    let mut channels = 0;
    for (k, v) in dump {
        let registration = (k.starts_with("v1/instances/") && k.contains("/backend/generate/"))
            || k.starts_with("v1/mdc/")
            || k.starts_with("v1/event_sources/");
        if registration {
            etcd.put(&k, &v);
        } else if k.starts_with("v1/event_channels/") && k.contains("/topic/kv-events/") {
            let suffix = k.rsplit('/').next().unwrap();
            let mut rec: Value = serde_json::from_str(&v).unwrap();
            rec["transport"]["config"]["endpoint"] = endpoint_of[suffix].clone().into();
            etcd.put(&k, &rec.to_string());
            channels += 1;
        }
    }
    assert_eq!(
        channels,
        endpoint_of.len(),
        "every captured publisher has a channel"
    );
}

/// The smallest shard count from 2 that spreads `publishers` over more than one shard, so each
/// shard's index holds its own copy of a shared prefix and the node gauge sums them.
fn spreading_shards(publishers: &[u64]) -> usize {
    (2..=8)
        .find(|n| {
            let used: BTreeSet<usize> = publishers
                .iter()
                .map(|id| shard_of(PublisherId::new(*id), *n))
                .collect();
            used.len() > 1
        })
        .expect("some shard count up to 8 spreads the publishers")
}

fn router(
    etcd: &EtcdServer,
    shards: usize,
    pools: &[(&str, &str)],
    models: &[(&str, &str)],
) -> RouterProcess {
    let mut cfg = RouterConfig {
        shards: shards.to_string(),
        ..RouterConfig::default()
    };
    for (backend, model) in models {
        cfg = cfg.backend(backend, "http://127.0.0.1:9", &[model]);
    }
    cfg.extra_yaml = kv_yaml(&etcd.endpoint(), pools);
    RouterProcess::start(&cfg)
}

/// Waits until the router subscribed to every publisher with the bare `kv-events` topic.
fn wait_all_subscribed(r: &RouterProcess, pubs: &mut BTreeMap<String, ZmqPublisher>) {
    for (endpoint, p) in pubs.iter_mut() {
        assert_eq!(
            p.wait_subscribed(SUBSCRIBED_WITHIN).as_deref(),
            Some("kv-events"),
            "no kv-events subscription at the publisher captured as {endpoint}; stderr:\n{}",
            r.stderr()
        );
    }
}

#[test]
fn captured_kv_events_from_real_libzmq_publishers_build_the_reference_index() {
    let sources = sources();
    assert_eq!(sources.len(), 4, "four captured publishers");
    let messages = captured_messages();
    let decoded = jsonl("decoded.jsonl");
    let events: Vec<Value> = decoded.iter().map(|d| d["router_event"].clone()).collect();
    // The capture's messages and decoded events line up (n, and the rank each came from).
    let in_messages: BTreeSet<u64> = decoded.iter().map(|d| d["n"].as_u64().unwrap()).collect();
    assert_eq!(
        in_messages,
        messages.iter().map(|m| m.n).collect::<BTreeSet<_>>()
    );
    for d in &decoded {
        let m = messages
            .iter()
            .find(|m| Some(m.n) == d["n"].as_u64())
            .unwrap();
        let s = sources.iter().find(|s| s.endpoint == m.endpoint).unwrap();
        let e = &d["router_event"];
        assert_eq!(e["worker_id"].as_u64(), Some(s.worker_id), "{d}");
        assert_eq!(
            e["event"]["dp_rank"].as_u64(),
            Some(u64::from(s.dp_rank)),
            "{d}"
        );
        assert_eq!(m.frames[1], s.publisher_id.to_be_bytes(), "message {}", m.n);
    }
    let model = Reference::replay(&events);
    assert_eq!(model.ranks.len(), 4, "one rank per publisher: {model:?}");

    let etcd = EtcdServer::start();
    let mut pubs: BTreeMap<String, ZmqPublisher> = sources
        .iter()
        .map(|s| (s.endpoint.clone(), ZmqPublisher::start()))
        .collect();
    let endpoint_of: BTreeMap<String, String> = sources
        .iter()
        .map(|s| (s.key_suffix.clone(), pubs[&s.endpoint].endpoint()))
        .collect();
    seed(&etcd, &endpoint_of);
    let ids: Vec<u64> = sources.iter().map(|s| s.publisher_id).collect();
    let shards = spreading_shards(&ids);
    let r = router(
        &etcd,
        shards,
        &[("agg", "fe-agg"), ("aggdp", "fe-aggdp")],
        &[("fe-agg", "tiny-agg"), ("fe-aggdp", "tiny-dp")],
    );
    wait_all_subscribed(&r, &mut pubs);

    // Every publisher is listed (no address) and connected, on the shard its hash names.
    let v = wait_view("every kv-events subscription connected", &r, KV_WAIT, |v| {
        same("admin subscriptions connected", v.connected(&ids), true)?;
        same("connected gauge", v.connected_gauge, Some(4)).map(|()| v.clone())
    });
    assert_eq!(v.publishers, 4, "{}", v.describe());
    let mut shard_of_rank = BTreeMap::new();
    for s in &sources {
        let shard = shard_of(PublisherId::new(s.publisher_id), shards);
        assert_eq!(
            v.subscriptions[&s.publisher_id].1,
            shard as u64,
            "{}",
            v.describe()
        );
        shard_of_rank.insert((s.worker_id, s.dp_rank), shard);
    }
    let admin = v.admin.to_string();
    assert!(
        !admin.contains("tcp://") && pubs.values().all(|p| !admin.contains(&p.port.to_string())),
        "the admin view leaks a publisher address: {admin}"
    );
    // Nothing is indexed before the first message.
    assert!(v.rows.is_empty(), "{}", v.describe());
    assert!(v.counts_are(&[]), "{}", v.describe());

    // Every captured message, in capture order, through the publisher it came from.
    for m in &messages {
        let p = pubs
            .get_mut(&m.endpoint)
            .unwrap_or_else(|| panic!("message {} from an unknown endpoint {}", m.n, m.endpoint));
        p.send(&refs(&m.frames));
    }
    let n_events = model.events;
    assert_eq!(n_events, events.len() as u64);
    let v = wait_view("the replayed capture indexed", &r, KV_WAIT, |v| {
        matches_model(v, &model, &shard_of_rank, &[("applied", n_events)]).map(|()| v.clone())
    });
    assert!(
        v.index_blocks.unwrap() >= model.max_rank_blocks(),
        "{}",
        v.describe()
    );
    // The shared system prompt lives on two shards: the gauge counts it once per shard.
    let one_index = model.nodes(&shard_of_rank.keys().map(|k| (*k, 0)).collect());
    assert!(
        model.nodes(&shard_of_rank) > one_index,
        "the publishers' shards {shard_of_rank:?} share no prefix"
    );
    eprintln!(
        "reference: {} events, rows {:?}, shards {:?}, {} nodes, {} ownerships",
        n_events,
        model.rows(),
        shard_of_rank,
        model.nodes(&shard_of_rank),
        model.ownerships()
    );

    // Already-sent messages again: each of their events is a replay, and nothing moves.
    let again: Vec<&Captured> = messages.iter().filter(|m| m.n == 13 || m.n == 16).collect();
    let replayed: u64 = decoded
        .iter()
        .filter(|d| again.iter().any(|m| Some(m.n) == d["n"].as_u64()))
        .count() as u64;
    assert_eq!(replayed, 3, "message 13 carries 2 events, 16 one");
    for m in &again {
        pubs.get_mut(&m.endpoint).unwrap().send(&refs(&m.frames));
    }
    wait_view("replays counted, index unchanged", &r, KV_WAIT, |v| {
        matches_model(
            v,
            &model,
            &shard_of_rank,
            &[("applied", n_events), ("replay", replayed)],
        )
    });

    // The DP worker's card declares ranks 0 and 1 (data_parallel_start_rank 0, size 2): an
    // event for its rank 2, even from its own rank-0 publisher, is refused and indexes nothing.
    let dp0 = sources
        .iter()
        .find(|s| s.namespace == "aggdp" && s.dp_rank == 0)
        .unwrap();
    let b = [StoredBlock {
        block_hash: EngineHash(7),
        tokens_hash: TokensHash(7),
    }];
    let rank2 = KvEventRef {
        worker: InstanceId::new(dp0.worker_id),
        dp_rank: 2,
        event_id: 1,
        tier: Tier::Device,
        data: KvDataRef::Stored {
            parent: None,
            blocks: &b,
        },
    };
    pubs.get_mut(&dp0.endpoint)
        .unwrap()
        .send(&refs(&kv_message(dp0.publisher_id, 1000, &[rank2])));
    let counts = [
        ("applied", n_events),
        ("replay", replayed),
        ("identity_mismatch", 1),
    ];
    wait_view("an undeclared dp rank refused", &r, KV_WAIT, |v| {
        matches_model(v, &model, &shard_of_rank, &counts)
    });

    // Rank 1 is declared and live, but `v1/event_sources` registers it to the other publisher:
    // the rank-0 publisher may not write it (KV-IDX-09).
    let forged = KvEventRef {
        dp_rank: 1,
        event_id: 1000,
        ..rank2
    };
    pubs.get_mut(&dp0.endpoint).unwrap().send(&refs(&kv_message(
        dp0.publisher_id,
        1001,
        &[forged],
    )));
    let counts = [
        ("applied", n_events),
        ("replay", replayed),
        ("identity_mismatch", 2),
    ];
    wait_view(
        "another publisher's registered rank refused",
        &r,
        KV_WAIT,
        |v| matches_model(v, &model, &shard_of_rank, &counts),
    );

    // The publisher of the DP worker's rank 1 leaves discovery: that rank goes, rank 0 stays.
    let rank1 = sources
        .iter()
        .find(|s| s.namespace == "aggdp" && s.dp_rank == 1)
        .unwrap();
    let mut model = model;
    model.ranks.remove(&(rank1.worker_id, 1));
    assert!(model.ranks.contains_key(&(rank1.worker_id, 0)));
    let deleted = etcd.delete(&format!(
        "v1/event_channels/namespace/aggdp/component/backend/endpoint/generate/topic/kv-events/{}",
        rank1.key_suffix
    ));
    assert_eq!(deleted, 1);
    wait_view("the departed publisher's rank cleared", &r, KV_WAIT, |v| {
        same("kv_event_publishers", v.publishers, 3)?;
        same("connected gauge", v.connected_gauge, Some(3))?;
        same(
            "its subscription row",
            v.subscriptions.contains_key(&rank1.publisher_id),
            false,
        )?;
        matches_model(v, &model, &shard_of_rank, &counts)
    });

    // Worker A (the agg worker with the most events) leaves discovery: its rank goes, the rest
    // stays, and the gauges fall to what is left.
    let a = sources
        .iter()
        .find(|s| s.key_suffix == "17beee254453c3")
        .unwrap();
    let before = model.nodes(&shard_of_rank);
    model.ranks.remove(&(a.worker_id, 0));
    assert!(model.nodes(&shard_of_rank) < before);
    let deleted = etcd.delete(&format!(
        "v1/instances/agg/backend/generate/{:x}",
        a.worker_id
    ));
    assert_eq!(deleted, 1);
    let v = wait_view("the departed worker's rank cleared", &r, KV_WAIT, |v| {
        same("worker listed", v.workers.contains(&a.worker_id), false)?;
        matches_model(v, &model, &shard_of_rank, &counts).map(|()| v.clone())
    });
    assert!(
        !v.rows.keys().any(|(w, _)| *w == a.worker_id),
        "{}",
        v.describe()
    );
    assert_eq!(r.get("/health").status, 200);
}

/// Worker 4242 (0x1092, the synthesised capture's) as the captured agg worker A registered,
/// with its kv-events channel for `publisher` at `endpoint`.
fn seed_synth_worker(etcd: &EtcdServer, publisher: u64, endpoint: &str) {
    const TEMPLATE: &str = "6a6ca22d7a7ef009";
    const WORKER: u64 = 4242;
    let dump = read_dump(Path::new(&format!(
        "{KV_FIXTURES}/etcd-dump-with-event-sources.txt"
    )));
    let get = |key: &str| -> Value {
        let v = &dump.iter().find(|(k, _)| k == key).unwrap().1;
        serde_json::from_str(v).unwrap()
    };
    for kind in ["instances", "mdc"] {
        let mut rec = get(&format!("v1/{kind}/agg/backend/generate/{TEMPLATE}"));
        rec["instance_id"] = WORKER.into();
        etcd.put(
            &format!("v1/{kind}/agg/backend/generate/{WORKER:x}"),
            &rec.to_string(),
        );
    }
    let mut ch = get(
        "v1/event_channels/namespace/agg/component/backend/endpoint/generate/topic/kv-events/17beee254453c3",
    );
    ch["instance_id"] = publisher.into();
    ch["transport"]["config"]["endpoint"] = endpoint.into();
    etcd.put(
        &format!(
            "v1/event_channels/namespace/agg/component/backend/endpoint/generate/topic/kv-events/{publisher:x}"
        ),
        &ch.to_string(),
    );
}

#[test]
fn a_cleared_event_empties_its_rank_and_gaps_and_missing_parents_follow_the_rules() {
    let frames: Vec<Vec<Vec<u8>>> = jsonl("synth-cleared.raw-frames.jsonl")
        .iter()
        .map(|m| {
            m["frames_hex"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| unhex(h.as_str().unwrap()))
                .collect()
        })
        .collect();
    let decoded = jsonl("synth-cleared.decoded.jsonl");
    assert_eq!(
        frames.len(),
        decoded.len(),
        "one event per synthesised message"
    );
    let publisher = decoded[0]["publisher_id"].as_u64().unwrap();
    let worker = decoded[0]["router_event"]["worker_id"].as_u64().unwrap();
    assert_eq!(worker, 4242);
    // The frames name the publisher the decoded file does.
    assert_eq!(frames[0][1], publisher.to_be_bytes());

    let etcd = EtcdServer::start();
    let mut p = ZmqPublisher::start();
    seed_synth_worker(&etcd, publisher, &p.endpoint());
    let r = router(
        &etcd,
        SHARDS,
        &[("agg", "fe-agg")],
        &[("fe-agg", "tiny-agg")],
    );
    assert_eq!(
        p.wait_subscribed(SUBSCRIBED_WITHIN).as_deref(),
        Some("kv-events")
    );
    wait_view("subscription connected", &r, KV_WAIT, |v| {
        same("connected", v.connected(&[publisher]), true)
    });
    let shard_of_rank =
        BTreeMap::from([((worker, 0), shard_of(PublisherId::new(publisher), SHARDS))]);

    // Message by message: the rows and gauges follow the reference model at every step.
    let mut model = Reference::default();
    let mut saw_cleared = false;
    for (i, (f, d)) in frames.iter().zip(&decoded).enumerate() {
        model.apply(&d["router_event"]);
        p.send(&refs(f));
        let applied = i as u64 + 1;
        wait_view(&format!("synthesised message {i}"), &r, KV_WAIT, |v| {
            matches_model(v, &model, &shard_of_rank, &[("applied", applied)])
        });
        if d["router_event"]["event"]["data"] == "cleared" {
            assert_eq!(
                model.rows()[&(worker, 0)].blocks,
                0,
                "cleared leaves nothing"
            );
            saw_cleared = true;
        }
    }
    assert!(saw_cleared, "the synthesised capture has a cleared event");
    let last = model.ranks[&(worker, 0)].last_event_id;
    assert_eq!(model.rows()[&(worker, 0)].blocks, 1, "{model:?}");

    // A gap (last + 3): the rank is cleared, then the event applied: only its blocks remain.
    let block = |h: u64| StoredBlock {
        block_hash: EngineHash(h),
        tokens_hash: TokensHash(h.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
    };
    let gap_blocks = [block(9001), block(9002)];
    let gap_id = last + 3;
    let ev = KvEventRef {
        worker: InstanceId::new(worker),
        dp_rank: 0,
        event_id: gap_id,
        tier: Tier::Device,
        data: KvDataRef::Stored {
            parent: None,
            blocks: &gap_blocks,
        },
    };
    p.send(&refs(&kv_message(publisher, 100, &[ev])));
    let applied = decoded.len() as u64 + 1;
    wait_view("a gap clears the rank, then applies", &r, KV_WAIT, |v| {
        same(
            "row",
            v.rows.get(&(worker, 0)).copied(),
            Some(KvRow {
                blocks: 2,
                last_event_id: gap_id,
            }),
        )?;
        same("index_blocks", v.index_blocks, Some(2))?;
        same("index_ownerships", v.index_ownerships, Some(2))?;
        same(
            "counts",
            v.counts_are(&[("applied", applied), ("gap", 1)]),
            true,
        )
    });

    // A stored event under a parent the rank does not hold: refused, the cursor moves on.
    let orphan = [block(9100)];
    let ev = KvEventRef {
        worker: InstanceId::new(worker),
        dp_rank: 0,
        event_id: gap_id + 1,
        tier: Tier::Device,
        data: KvDataRef::Stored {
            parent: Some(EngineHash(0x0bad_0bad)),
            blocks: &orphan,
        },
    };
    p.send(&refs(&kv_message(publisher, 101, &[ev])));
    wait_view("a missing parent is refused", &r, KV_WAIT, |v| {
        same(
            "row",
            v.rows.get(&(worker, 0)).copied(),
            Some(KvRow {
                blocks: 2,
                last_event_id: gap_id + 1,
            }),
        )?;
        same("index_blocks", v.index_blocks, Some(2))?;
        same(
            "counts",
            v.counts_are(&[("applied", applied), ("gap", 1), ("parent_missing", 1)]),
            true,
        )
    });

    // A child of a held block is applied under it (the chain continues from 9002).
    let child = [block(9003)];
    let ev = KvEventRef {
        worker: InstanceId::new(worker),
        dp_rank: 0,
        event_id: gap_id + 2,
        tier: Tier::Device,
        data: KvDataRef::Stored {
            parent: Some(EngineHash(9002)),
            blocks: &child,
        },
    };
    p.send(&refs(&kv_message(publisher, 102, &[ev])));
    wait_view("a child of a held block applied", &r, KV_WAIT, |v| {
        same(
            "row",
            v.rows.get(&(worker, 0)).copied(),
            Some(KvRow {
                blocks: 3,
                last_event_id: gap_id + 2,
            }),
        )?;
        same("index_blocks", v.index_blocks, Some(3))?;
        same(
            "counts",
            v.counts_are(&[("applied", applied + 1), ("gap", 1), ("parent_missing", 1)]),
            true,
        )
    });
}
