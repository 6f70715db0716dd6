//! Load subscriptions on a shard: which publishers this shard owns, and the tasks that keep one
//! bounded ZMTP subscription per publisher.
//!
//! On every snapshot a shard reconciles: the fleet's admitted `kv_metrics` publishers
//! ([`continuum_core::subscriptions::admitted`], ascending ids, capped) whose stable hash names
//! this shard ([`continuum_core::subscriptions::shard_of`]) and whose address the control thread
//! resolved and allowed (CFG-20) get a task; a task whose publisher left, or whose address
//! decision changed (RELOAD-03), is stopped. A publisher whose address is refused or not yet
//! resolved is listed as `pending`.
//!
//! Invariants: at most one task per publisher id on the whole router (one owner shard); tasks
//! are shard-local and stop at the next await once told to (well inside the 5 s grace of
//! LOAD-STORE-16).

mod protocol;
pub mod status;
mod task;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use continuum_core::config::dynamo::LoadTransport;
use continuum_core::discovery::{Family, PublisherId};
use continuum_core::load::metrics::LoadEventCounters;
use continuum_core::load::{DispatchLedger, InflightTable, LoadStore};
use continuum_core::snapshot::RouterSnapshot;
use continuum_core::subscriptions::{admitted, shard_of};

use crate::shard::Shard;
use crate::signal::LocalSignal;
use status::{SubRow, SubState, SubTable};

struct Running {
    addr: SocketAddr,
    stop: LocalSignal,
}

/// Load-signal state shared by every shard (and the control thread, through the store).
#[derive(Debug)]
pub struct LoadShared {
    /// The one logical load store.
    pub store: Arc<LoadStore>,
    /// `continuum_dynamo_load_events_total` counters, one writer shard each.
    pub events: Box<[LoadEventCounters]>,
    /// Subscription tables, one writer shard each.
    pub tables: Box<[Arc<SubTable>]>,
    /// Unanswered-dispatch summaries, one writer shard each (its `DispatchLedger`); pickers on
    /// every shard read all of them (LOAD-STORE-10).
    pub inflight: Box<[Arc<InflightTable>]>,
}

impl LoadShared {
    /// State for one shard per ledger around `store`; shard `i` owns `ledgers[i]`.
    pub fn new(store: Arc<LoadStore>, ledgers: &[DispatchLedger]) -> Self {
        let shards = ledgers.len();
        Self {
            store,
            events: (0..shards).map(|_| LoadEventCounters::new()).collect(),
            tables: (0..shards).map(|_| Arc::new(SubTable::default())).collect(),
            inflight: ledgers.iter().map(DispatchLedger::table).collect(),
        }
    }
}

/// Append the load family's metrics: `continuum_dynamo_load_events_total{result}` (summed over
/// shards), `continuum_dynamo_load_subscriptions{state,transport}` and the per-worker gauges.
pub fn render_metrics(load: &LoadShared, out: &mut String) {
    use std::fmt::Write as _;
    continuum_core::load::metrics::render_load_events(out, load.events.iter());
    let counts = status::counts(&load.tables);
    let _ = writeln!(
        out,
        "# HELP continuum_dynamo_load_subscriptions kv_metrics subscriptions by state.\n\
         # TYPE continuum_dynamo_load_subscriptions gauge"
    );
    for (state, n) in SubState::ALL.iter().zip(counts) {
        let _ = writeln!(
            out,
            "continuum_dynamo_load_subscriptions{{state=\"{}\",transport=\"direct\"}} {n}",
            state.as_str()
        );
    }
    load.store.render_gauges(out);
}

/// The subscriptions one shard owns.
#[derive(Default)]
pub(crate) struct Subscriptions {
    running: HashMap<PublisherId, Running>,
}

impl std::fmt::Debug for Subscriptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriptions")
            .field("running", &self.running.len())
            .finish()
    }
}

impl Subscriptions {
    /// Bring the running tasks in line with `snap`.
    pub(crate) fn reconcile(&mut self, shard: &Rc<Shard>, snap: &Arc<RouterSnapshot>) {
        let table: &SubTable = &shard.subs_table;
        let shards = shard.all_metrics.len();
        let enabled = snap.config.dynamo.enabled;
        // `transport: broker` needs the event-bus tunnel, which this build does not have: such
        // subscriptions stay pending and never fall back to direct connections (BROKER-12).
        let direct = snap.config.dynamo.load.transport == LoadTransport::Direct;
        let mut wanted: HashMap<PublisherId, Option<SocketAddr>> = HashMap::new();
        if enabled {
            for p in admitted(&snap.fleet, Family::KvMetrics) {
                if shard_of(p.publisher_id, shards) != shard.id {
                    continue;
                }
                let addr = snap
                    .publisher_addrs
                    .get(&p.publisher_id)
                    .and_then(|r| r.as_ref().ok())
                    .copied()
                    .filter(|_| direct);
                wanted.insert(p.publisher_id, addr);
                // A running task keeps its row (and state); a new or re-addressed one starts over.
                let unchanged = self
                    .running
                    .get(&p.publisher_id)
                    .is_some_and(|r| Some(r.addr) == addr);
                if !unchanged {
                    table.upsert(SubRow {
                        family: p.family,
                        publisher_id: p.publisher_id,
                        namespace: p.namespace.clone(),
                        component: p.component.clone(),
                        state: if addr.is_some() {
                            SubState::Connecting
                        } else {
                            SubState::Pending
                        },
                        shard: shard.id,
                    });
                }
            }
        }
        // Stop what left or changed address.
        self.running.retain(|id, r| {
            let keep = wanted.get(id).copied().flatten() == Some(r.addr);
            if !keep {
                r.stop.fire();
                if !wanted.contains_key(id) {
                    table.remove(*id);
                }
            }
            keep
        });
        // Start what is new.
        for (id, addr) in wanted {
            let Some(addr) = addr else { continue };
            if self.running.contains_key(&id) {
                continue;
            }
            let stop = LocalSignal::default();
            monoio::spawn(task::run(shard.clone(), id, addr, stop.clone()));
            self.running.insert(id, Running { addr, stop });
        }
    }

    /// Stop every task (drain).
    pub(crate) fn stop_all(&mut self) {
        for (_, r) in self.running.drain() {
            r.stop.fire();
        }
    }
}
