//! The cross-shard read side: state with one writer per shard that every shard reads.
//!
//! [`Signals`] holds the load store (one logical table of seqlock cells, written by the shard
//! owning each publisher's subscription), every shard's unanswered-dispatch summaries (written by
//! that shard's [`continuum_core::load::DispatchLedger`]), every shard's `kv_metrics` event
//! counters, every shard's subscription table, every shard's KV index read side ([`kv`]), the
//! hash-parity watchdog's verdicts ([`parity`]) and the event bus of the broker transport
//! ([`broker`]). Pickers on any shard read the store and all ledgers' tables at pick time; a
//! scrape or an admin request reads all of it.
//!
//! Invariants:
//! - each per-shard entry (`events[i]`, `tables[i]`, `inflight[i]`) has exactly one writer, shard
//!   `i`; readers never block a writer for longer than a copy (the tables' mutex is taken only on
//!   subscription state changes and by readers, never per message or per request);
//! - nothing here is reachable from the control thread except the store, which it gates by the
//!   live set (LOAD-STORE-15), and the broker slot, where it swaps the running listener's
//!   command API.

pub mod broker;
pub mod gossip;
pub mod kv;
pub mod parity;
pub mod subs;
pub mod suspects;

use std::sync::Arc;

use continuum_core::discovery::Family;
use continuum_core::load::metrics::LoadEventCounters;
use continuum_core::load::{DispatchLedger, InflightTable, LoadStore};

use kv::KvSignals;
use subs::{SubState, SubTable, Transport};

/// The signals every shard reads.
#[derive(Debug)]
pub struct Signals {
    /// The one logical load store.
    pub store: Arc<LoadStore>,
    /// `continuum_dynamo_load_events_total` counters, one writer shard each.
    pub events: Box<[LoadEventCounters]>,
    /// Subscription tables, one writer shard each.
    pub tables: Box<[Arc<SubTable>]>,
    /// Unanswered-dispatch summaries, one writer shard each (its `DispatchLedger`); pickers on
    /// every shard read all of them (LOAD-STORE-10).
    pub inflight: Box<[Arc<InflightTable>]>,
    /// Every shard's KV index read side, counters and rank rows.
    pub kv: KvSignals,
    /// The event bus the broker transport runs over, and its coverage.
    pub broker: broker::BrokerSignals,
    /// Workers whose `kv_metrics` connection dropped (issue 38): left out of picks while
    /// another worker can serve.
    pub suspects: suspects::Suspects,
    /// The dispatch gossip with the other router replicas (`dynamo.peers`), when on; its
    /// receiver's table is the last entry of `inflight`.
    pub peers: Option<gossip::PeersShared>,
}

impl Signals {
    /// State for one shard per ledger around `store`; shard `i` owns `ledgers[i]`.
    pub fn new(store: Arc<LoadStore>, ledgers: &[DispatchLedger]) -> Self {
        let shards = ledgers.len();
        Self {
            store,
            // At least one counter set, so `load_events` always has one to hand out.
            events: (0..shards.max(1))
                .map(|_| LoadEventCounters::new())
                .collect(),
            tables: (0..shards).map(|_| Arc::new(SubTable::default())).collect(),
            inflight: ledgers.iter().map(DispatchLedger::table).collect(),
            kv: KvSignals::new(shards),
            broker: broker::BrokerSignals::default(),
            suspects: suspects::Suspects::default(),
            peers: None,
        }
    }

    /// The same signals sharing dispatches with the other replicas of `config` (when it is on):
    /// `remote`'s table joins the tables every picker sums (the receiver thread writes it).
    pub fn with_peers(
        mut self,
        config: &continuum_core::config::peers::PeersConfig,
        remote: &DispatchLedger,
    ) -> Self {
        self.peers = gossip::PeersShared::new(config);
        if self.peers.is_some() {
            let mut tables = std::mem::take(&mut self.inflight).into_vec();
            tables.push(remote.table());
            self.inflight = tables.into_boxed_slice();
        }
        self
    }

    /// How many shards write here.
    pub fn shards(&self) -> usize {
        self.tables.len().max(1)
    }

    /// Shard `shard`'s load event counters (its own, as a writer; any, as a reader).
    pub fn load_events(&self, shard: usize) -> &LoadEventCounters {
        // `new` creates one counter set per shard (at least one), so the index is in range; a
        // mismatch would only misattribute counts, never fail. No division: the sinks call this
        // once per message.
        self.events.get(shard).unwrap_or(&self.events[0])
    }

    /// Shard `shard`'s subscription table.
    pub fn table(&self, shard: usize) -> Arc<SubTable> {
        self.tables.get(shard).cloned().unwrap_or_default()
    }

    /// Append the load family's metrics: `continuum_dynamo_load_events_total{result}` (summed
    /// over shards), `continuum_dynamo_load_subscriptions{state,transport}`,
    /// `continuum_dynamo_suspect_workers` and the per-worker gauges.
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        continuum_core::load::metrics::render_load_events(out, self.events.iter());
        for (family, name) in [
            (Family::KvMetrics, "continuum_dynamo_load_subscriptions"),
            (Family::KvEvents, "continuum_dynamo_kv_subscriptions"),
        ] {
            let counts = subs::counts(&self.tables, family);
            let _ = writeln!(
                out,
                "# HELP {name} {} subscriptions by state.\n# TYPE {name} gauge",
                family.topic()
            );
            for (transport, by_state) in Transport::ALL.iter().zip(counts) {
                for (state, n) in SubState::ALL.iter().zip(by_state) {
                    let _ = writeln!(
                        out,
                        "{name}{{state=\"{}\",transport=\"{}\"}} {n}",
                        state.as_str(),
                        transport.as_str()
                    );
                }
            }
        }
        let _ = writeln!(
            out,
            "# HELP continuum_dynamo_suspect_workers Workers whose kv_metrics connection dropped \
             and that have not published since: left out of picks while another worker serves.\n\
             # TYPE continuum_dynamo_suspect_workers gauge\n\
             continuum_dynamo_suspect_workers {}",
            self.suspects.len()
        );
        if let Some(p) = &self.peers {
            p.counters.render(out);
        }
        self.store.render_gauges(out, crate::clock::now());
        self.kv.render_metrics(out);
    }
}
