//! What the `kv-events` end-to-end tests observe of the router's KV index, and how they feed it.
//!
//! - [`KvView`]: one reading of `GET /admin/dynamo/workers` (the per-rank `kv` rows, the
//!   `kv-events` subscription rows) and `GET /metrics` (`continuum_dynamo_kv_events_total{result}`
//!   for every result label, the index gauges) taken together, so a failed wait prints all of it;
//! - [`wait_view`]: polls a [`KvView`] until a check passes, bounded by a deadline (the rows are
//!   republished by their shard at most every 200 ms, so every expectation is polled);
//! - [`kv_message`] / [`raw_message`]: the 4 frames of a `kv-events` message built with the
//!   router's own encoders (`continuum_core::kv::encode`, `continuum_core::dynamo_event`), the
//!   wire form a Dynamo 1.6.1 publisher sends;
//! - [`kv_yaml`]: the `dynamo:` section of a router with etcd discovery and the KV family on.
//!
//! Nothing here is timed: a wait only bounds how long a condition may take to become true.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::router::{RouterProcess, metric_value};

/// Every `result` label of `continuum_dynamo_kv_events_total`, in the router's order.
pub const OUTCOMES: [&str; 8] = [
    "applied",
    "replay",
    "gap",
    "over_capacity",
    "identity_mismatch",
    "other_tier",
    "parent_missing",
    "malformed",
];

/// A generous bound for one KV observation to become true.
pub const KV_WAIT: Duration = Duration::from_secs(15);

/// One admin `kv` row of a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvRow {
    /// Blocks the rank holds in the index.
    pub blocks: u64,
    /// The last event id applied or skipped for it.
    pub last_event_id: u64,
}

/// `(worker_id, dp_rank)`.
pub type RankKey = (u64, u32);

/// The router's KV state as its admin view and metrics show it, read back to back.
#[derive(Debug, Clone)]
pub struct KvView {
    /// `workers[].kv[]` by `(worker_id, dp_rank)`.
    pub rows: BTreeMap<RankKey, KvRow>,
    /// The decimal `worker_id` of every listed worker.
    pub workers: Vec<u64>,
    /// `kv_event_publishers`.
    pub publishers: u64,
    /// `subscriptions[]` rows of family `kv-events`: publisher id -> (state, shard).
    pub subscriptions: BTreeMap<u64, (String, u64)>,
    /// `continuum_dynamo_kv_events_total` per result label (absent = 0).
    pub events: BTreeMap<&'static str, u64>,
    /// `continuum_dynamo_kv_index_blocks`.
    pub index_blocks: Option<u64>,
    /// `continuum_dynamo_kv_index_ownerships`.
    pub index_ownerships: Option<u64>,
    /// `continuum_dynamo_kv_subscriptions{state="connected",transport="direct"}`.
    pub connected_gauge: Option<u64>,
    /// The admin body, for failure messages.
    pub admin: Value,
}

fn as_u64(v: &Value) -> Option<u64> {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

impl KvView {
    /// Reads the admin view, then the metrics.
    pub fn read(r: &RouterProcess) -> KvView {
        let admin = r.get("/admin/dynamo/workers").json();
        let text = r.metrics();
        KvView::parse(admin, &text)
    }

    /// Parses an admin body and a metrics text.
    pub fn parse(admin: Value, metrics: &str) -> KvView {
        let mut rows = BTreeMap::new();
        let mut workers = Vec::new();
        for w in admin["workers"].as_array().into_iter().flatten() {
            let Some(id) = as_u64(&w["worker_id"]) else {
                continue;
            };
            workers.push(id);
            for k in w["kv"].as_array().into_iter().flatten() {
                let rank = k["dp_rank"]
                    .as_u64()
                    .and_then(|r| u32::try_from(r).ok())
                    .unwrap_or_else(|| panic!("kv row without a dp_rank: {k}"));
                let row = KvRow {
                    blocks: k["blocks"]
                        .as_u64()
                        .unwrap_or_else(|| panic!("kv row without blocks: {k}")),
                    last_event_id: k["last_event_id"]
                        .as_u64()
                        .unwrap_or_else(|| panic!("kv row without last_event_id: {k}")),
                };
                assert!(
                    k["last_event_age_ms"].is_u64(),
                    "kv row without last_event_age_ms: {k}"
                );
                let prev = rows.insert((id, rank), row);
                assert!(prev.is_none(), "two kv rows for ({id}, {rank}): {admin:#}");
            }
        }
        let subscriptions = admin["subscriptions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["family"] == "kv-events")
            .filter_map(|s| {
                let id = s["publisher_id"].as_str()?.parse().ok()?;
                let state = s["state"].as_str()?.to_owned();
                Some((id, (state, s["shard"].as_u64()?)))
            })
            .collect();
        let events = OUTCOMES
            .iter()
            .map(|o| {
                let v = metric_value(
                    metrics,
                    "continuum_dynamo_kv_events_total",
                    &[("result", o)],
                )
                .unwrap_or(0.0);
                (*o, v as u64)
            })
            .collect();
        let gauge = |name: &str| metric_value(metrics, name, &[]).map(|v| v as u64);
        KvView {
            rows,
            workers,
            publishers: admin["kv_event_publishers"].as_u64().unwrap_or(0),
            subscriptions,
            events,
            index_blocks: gauge("continuum_dynamo_kv_index_blocks"),
            index_ownerships: gauge("continuum_dynamo_kv_index_ownerships"),
            connected_gauge: metric_value(
                metrics,
                "continuum_dynamo_kv_subscriptions",
                &[("state", "connected"), ("transport", "direct")],
            )
            .map(|v| v as u64),
            admin,
        }
    }

    /// The count of `result`.
    pub fn count(&self, result: &str) -> u64 {
        self.events.get(result).copied().unwrap_or(0)
    }

    /// Whether every result count equals `expected` (labels not named there must be 0).
    pub fn counts_are(&self, expected: &[(&str, u64)]) -> bool {
        OUTCOMES.iter().all(|o| {
            let want = expected.iter().find(|(l, _)| l == o).map_or(0, |(_, n)| *n);
            self.count(o) == want
        })
    }

    /// Whether every subscription of `ids` is listed and connected.
    pub fn connected(&self, ids: &[u64]) -> bool {
        ids.iter().all(|id| {
            self.subscriptions
                .get(id)
                .is_some_and(|(state, _)| state == "connected")
        })
    }

    /// A compact description for failure messages.
    pub fn describe(&self) -> String {
        format!(
            "rows={:?}\nevents={:?}\nindex_blocks={:?} index_ownerships={:?} \
             connected_gauge={:?} kv_event_publishers={} subscriptions={:?} workers={:?}",
            self.rows,
            self.events,
            self.index_blocks,
            self.index_ownerships,
            self.connected_gauge,
            self.publishers,
            self.subscriptions,
            self.workers
        )
    }
}

/// Polls [`KvView::read`] until `check` returns `Ok`; panics after `within` with the check's last
/// complaint, the last view and the router's stderr.
pub fn wait_view<T>(
    what: &str,
    r: &RouterProcess,
    within: Duration,
    mut check: impl FnMut(&KvView) -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        let v = KvView::read(r);
        match check(&v) {
            Ok(t) => return t,
            Err(why) => assert!(
                Instant::now() < deadline,
                "{what}: not reached within {within:?}: {why}\n{}\nrouter stderr:\n{}",
                v.describe(),
                r.stderr()
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `Ok(())` when `got == want`, else a message naming both.
pub fn same<T: PartialEq + std::fmt::Debug>(what: &str, got: T, want: T) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: expected {want:?}, observed {got:?}"))
    }
}

/// The 4 frames of a `kv-events` message from `publisher` with `sequence`, carrying `payload`
/// (a msgpack array of RouterEvent, or anything else) in the map encoding Dynamo sends.
pub fn raw_message(publisher: u64, sequence: u64, payload: &[u8]) -> [Vec<u8>; 4] {
    use continuum_core::discovery::{PublisherId, UnixMillis};
    use continuum_core::dynamo_event::{Encoding, EventEnvelope, Sequence, encode_message};
    let env = EventEnvelope {
        publisher_id: PublisherId::new(publisher),
        sequence: Sequence(sequence),
        published_at: UnixMillis(1_796_059_387_299),
        topic: b"kv-events",
        payload,
    };
    encode_message(&env, Encoding::Map).expect("envelope fits")
}

/// The 4 frames of a `kv-events` message carrying `events`, encoded as rmp-serde does.
pub fn kv_message(
    publisher: u64,
    sequence: u64,
    events: &[continuum_core::kv::encode::KvEventRef<'_>],
) -> [Vec<u8>; 4] {
    use continuum_core::kv::encode::{Encoding, encode_batch};
    let mut payload = Vec::new();
    encode_batch(events, Encoding::Map, &mut payload);
    raw_message(publisher, sequence, &payload)
}

/// The frames as slices, for [`super::zmq::ZmqPublisher::send`].
pub fn refs(frames: &[Vec<u8>]) -> Vec<&[u8]> {
    frames.iter().map(Vec::as_slice).collect()
}

/// The `dynamo:` section: etcd discovery of `namespaces` at `etcd`, direct subscriptions on
/// loopback, the KV family on, one shim pool per namespace `(namespace, backend)`.
pub fn kv_yaml(etcd: &str, pools: &[(&str, &str)]) -> String {
    let namespaces: Vec<&str> = pools.iter().map(|(ns, _)| *ns).collect();
    let mut y = format!(
        "dynamo:\n  enabled: true\n  discovery:\n    source: etcd\n    etcd:\n      endpoints: \
         [\"{etcd}\"]\n      namespaces: [{}]\n  load:\n    direct_allow_cidrs: [\"127.0.0.0/8\"]\n  \
         kv:\n    enabled: true\n  shim:\n    pools:\n",
        namespaces.join(", ")
    );
    for (ns, backend) in pools {
        y.push_str(&format!(
            "      - {{ namespace: {ns}, backends: [{backend}] }}\n"
        ));
    }
    y
}
