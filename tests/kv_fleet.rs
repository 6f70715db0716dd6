//! The KV index fed by a REAL Dynamo 1.6.1 fleet: two `dynamo.mocker` workers (prefix caching
//! on, as by default, publishing `kv-events` on the ZMQ event plane) behind a direct-mode
//! frontend. Chat requests with a long shared system prompt go through the router; the worker it
//! pinned stores the prompt's complete blocks and announces them, and the router's index shows
//! them on that worker's rank, every event applied and none refused. SIGKILL that worker: when its
//! lease expires it leaves discovery, and its rank and ownerships leave the index.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo-kv")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::fleet::{Fleet, FleetSpec};
use common::kv::{KvView, RankKey, same, wait_view};
use common::{RouterProcess, chat};

const AGG: &str = "tiny-agg";
const TTL: u32 = 3;
const REQUESTS: usize = 3;
const MAX_TOKENS: u32 = 8;

/// A system prompt of several 64-token blocks, the same in every request.
fn system_prompt() -> String {
    (0..12)
        .map(|i| {
            format!(
                "Rule {i}: a router keeps the prefix cache of each worker warm, sends a request \
                 where its blocks already live, and never forgets a block it was told about. "
            )
        })
        .collect()
}

fn body(question: &str) -> Vec<u8> {
    serde_json::json!({
        "model": AGG,
        "messages": [
            {"role": "system", "content": system_prompt()},
            {"role": "user", "content": question},
        ],
        "max_tokens": MAX_TOKENS,
    })
    .to_string()
    .into_bytes()
}

fn router_for(fleet: &Fleet) -> RouterProcess {
    let mut cfg = fleet.router_config();
    assert!(
        cfg.extra_yaml.starts_with("dynamo:\n"),
        "{}",
        cfg.extra_yaml
    );
    cfg.extra_yaml.push_str("  kv:\n    enabled: true\n");
    RouterProcess::start(&cfg)
}

fn ownership_sum(v: &KvView) -> u64 {
    v.rows.values().map(|r| r.blocks).sum()
}

#[test]
fn a_real_mockers_kv_events_index_its_prompt_blocks_until_it_dies() {
    let fleet = Fleet::start(&FleetSpec::new().agg(AGG, 2).lease_ttl(TTL));
    let block_size = fleet.info.block_size;
    let workers: Vec<u64> = fleet.info.workers.iter().map(|w| w.instance_id).collect();
    assert_eq!(workers.len(), 2);
    let r = router_for(&fleet);

    // Both workers' kv-events publishers are discovered and subscribed.
    wait_view(
        "both kv-events publishers connected",
        &r,
        Duration::from_secs(30),
        |v| {
            same("kv_event_publishers", v.publishers, 2)?;
            let ids: Vec<u64> = v.subscriptions.keys().copied().collect();
            same("kv-events subscriptions", ids.len(), 2)?;
            same("all connected", v.connected(&ids), true)?;
            same("connected gauge", v.connected_gauge, Some(2))
        },
    );

    // Requests through the router; `x-backend` makes it name the worker it pinned.
    let mut served: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for i in 0..REQUESTS {
        // A question of a few blocks of its own after the shared prompt.
        let question: String = (0..48).map(|j| format!("case {i}.{j}, ")).collect();
        let resp = chat(
            r.addr(),
            &body(&format!("Question {i}: where should {question} go?")),
            &[("x-backend", "")],
        );
        assert_eq!(resp.status, 200, "request {i}: {}", resp.text());
        let worker: u64 = resp
            .header("x-continuum-worker-instance-id")
            .unwrap_or_else(|| panic!("request {i}: no worker named: {:?}", resp.headers))
            .parse()
            .unwrap();
        assert!(workers.contains(&worker), "{worker} not in {workers:?}");
        let prompt = resp.json()["usage"]["prompt_tokens"].as_u64().unwrap();
        assert!(
            prompt >= 3 * block_size,
            "the system prompt spans several blocks: {prompt} tokens"
        );
        served.entry(worker).or_default().push(prompt);
    }
    let (victim, prompts) = served
        .iter()
        .max_by_key(|(_, p)| p.len())
        .map(|(w, p)| (*w, p.clone()))
        .unwrap();
    // Its longest prompt's complete blocks, plus at least one block of its own per other
    // request it served (each question differs from its first tokens on).
    let min_blocks = prompts.iter().max().unwrap() / block_size + prompts.len() as u64 - 1;
    let victim_key: RankKey = (victim, 0);

    // The pinned worker's rank holds at least the complete blocks of its longest prompt; every
    // worker that served holds blocks; every event from the real mockers was applied.
    let before = wait_view(
        "the pinned worker's blocks indexed",
        &r,
        Duration::from_secs(20),
        |v| {
            let row = v
                .rows
                .get(&victim_key)
                .ok_or_else(|| format!("no kv row for the pinned worker {victim}"))?;
            // One stored event at least per request it served (event ids start at 1, gap-free).
            if row.blocks < min_blocks || row.last_event_id < prompts.len() as u64 {
                return Err(format!(
                    "row {row:?}, want at least {min_blocks} blocks and {} events",
                    prompts.len()
                ));
            }
            for w in served.keys() {
                if v.rows.get(&(*w, 0)).is_none_or(|r| r.blocks == 0) {
                    return Err(format!("worker {w} served but holds no blocks"));
                }
            }
            let applied = v.count("applied");
            if applied == 0 || !v.counts_are(&[("applied", applied)]) {
                return Err("every event applied, none refused".into());
            }
            same(
                "index_ownerships",
                v.index_ownerships,
                Some(ownership_sum(v)),
            )?;
            Ok(v.clone())
        },
    );
    let victim_blocks = before.rows[&victim_key].blocks;
    let nodes_before = before.index_blocks.unwrap();
    assert!(nodes_before >= victim_blocks, "{}", before.describe());
    assert!(
        nodes_before <= before.index_ownerships.unwrap(),
        "{}",
        before.describe()
    );
    eprintln!(
        "served {served:?}; victim {victim} holds {victim_blocks} blocks (>= {min_blocks}); {}",
        before.describe()
    );

    // SIGKILL the pinned worker: once its lease expires it leaves discovery, and its rank with it.
    let hex = fleet
        .info
        .workers
        .iter()
        .find(|w| w.instance_id == victim)
        .unwrap()
        .instance_id_hex
        .clone();
    let mut fleet = fleet;
    fleet.kill(&hex, "SIGKILL");
    let others: u64 = before
        .rows
        .iter()
        .filter(|(k, _)| k.0 != victim)
        .map(|(_, r)| r.blocks)
        .sum();
    let after = wait_view(
        "the killed worker's rank left the index",
        &r,
        Duration::from_secs(u64::from(TTL) + 20),
        |v| {
            same("killed worker listed", v.workers.contains(&victim), false)?;
            same(
                "killed worker's rows",
                v.rows.keys().any(|k| k.0 == victim),
                false,
            )?;
            same("kv_event_publishers", v.publishers, 1)?;
            same("connected gauge", v.connected_gauge, Some(1))?;
            same("index_ownerships", v.index_ownerships, Some(others))?;
            Ok(v.clone())
        },
    );
    // Nodes: the victim's shard loses every node only it held there. When no other rank shares
    // that shard's index, that is all of its nodes, so the gauge strictly falls.
    let nodes_after = after.index_blocks.unwrap();
    assert!(nodes_after <= nodes_before, "{}", after.describe());
    assert!(nodes_after <= others, "{}", after.describe());
    let shard_of_worker = |w: u64| -> Option<u64> {
        let id = fleet
            .info
            .workers
            .iter()
            .find(|x| x.instance_id == w)?
            .publishers
            .get("kv-events")?
            .publisher_id;
        before.subscriptions.get(&id).map(|(_, shard)| *shard)
    };
    let victim_shard = shard_of_worker(victim);
    let shares_shard = before
        .rows
        .iter()
        .any(|(k, r)| k.0 != victim && r.blocks > 0 && shard_of_worker(k.0) == victim_shard);
    if others == 0 || (victim_shard.is_some() && !shares_shard) {
        assert_eq!(
            nodes_after,
            nodes_before - victim_blocks,
            "the victim's nodes leave with it: {}",
            after.describe()
        );
    }
    // Nothing the dead worker's stream left behind was refused or replayed.
    assert!(
        after.counts_are(&[("applied", after.count("applied"))]),
        "{}",
        after.describe()
    );
    assert_eq!(r.get("/health").status, 200);
}
