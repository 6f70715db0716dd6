//! Ingest: the ZMTP subscriptions one shard owns, one bounded session per publisher, one sink
//! per event family.
//!
//! On every snapshot a shard reconciles each family it subscribes to: the fleet's admitted
//! publishers ([`continuum_core::subscriptions::admitted`], ascending ids, capped) whose stable
//! hash names this shard ([`continuum_core::subscriptions::shard_of`]) get a task ([`task::run`]:
//! connector, backoff, the generic [`driver`]) with the family's sink (`kv_metrics`:
//! [`load_sink`]; `kv-events`, with the `dynamo-kv` feature and `dynamo.kv.enabled`: `kv_sink`,
//! writing the shard's KV index through `kv`). The connector follows `dynamo.load.transport`:
//! `direct` dials the address the control thread resolved and allowed (CFG-20; a publisher whose
//! address is refused or not yet resolved is listed as `pending`), `broker` opens an event-bus
//! stream to the advertised endpoint (`broker`, feature `dynamo-event-bus`; pending while no
//! broker covers the namespace). A task whose publisher left, or whose route changed (address
//! decision, RELOAD-03; transport, RELOAD-17), is stopped; a restarted `kv-events` subscription
//! keeps its per-rank cursors (BROKER-13), a departed one clears its ranks.
//!
//! Invariants: at most one task per (family, publisher id) on the whole router (one owner
//! shard); tasks are shard-local and stop at the next await once told to (well inside the 5 s
//! grace of LOAD-STORE-16).

#[cfg(feature = "dynamo-event-bus")]
mod broker;
pub mod driver;
#[cfg(feature = "dynamo-kv")]
mod kv;
#[cfg(feature = "dynamo-kv")]
mod kv_sink;
mod load_sink;
mod task;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use continuum_core::config::dynamo::LoadTransport;
use continuum_core::discovery::{Family, PublisherId};
use continuum_core::snapshot::RouterSnapshot;
use continuum_core::subscriptions::{admitted, shard_of};

use crate::notify::{LocalEpoch, LocalSignal};
use crate::signals::Signals;
use crate::signals::subs::{SubRow, SubState, Transport};
use task::{Connector, DirectTcp, Jitter, Spec};

/// The families this build subscribes to, in reconcile order.
#[cfg(feature = "dynamo-kv")]
const FAMILIES: [Family; 2] = [Family::KvMetrics, Family::KvEvents];
#[cfg(not(feature = "dynamo-kv"))]
const FAMILIES: [Family; 1] = [Family::KvMetrics];

/// How often the KV upkeep runs (down-time clearing, admin rows).
#[cfg(feature = "dynamo-kv")]
const KV_TICK: std::time::Duration = std::time::Duration::from_millis(250);

/// How a subscription reaches its publisher; a change restarts its task (RELOAD-03,
/// RELOAD-17).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    /// TCP to the resolved, allowed address.
    Direct(SocketAddr),
    /// Through a broker, to the advertised endpoint (namespace, host, port).
    #[cfg(feature = "dynamo-event-bus")]
    Broker(String, String, u16),
}

struct Running {
    route: Route,
    stop: LocalSignal,
}

/// The subscriptions one shard owns.
pub(crate) struct Ingest {
    shard: usize,
    signals: Arc<Signals>,
    jitter: Rc<Jitter>,
    /// Moves whenever the broker sessions change (the pending broker subscriptions wait on it).
    broker_epoch: Rc<LocalEpoch>,
    running: HashMap<(Family, PublisherId), Running>,
    /// The shard's KV writer side, created when the KV family is first enabled.
    #[cfg(feature = "dynamo-kv")]
    kv: Option<(kv::SharedKv, LocalSignal)>,
}

impl std::fmt::Debug for Ingest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ingest")
            .field("shard", &self.shard)
            .field("running", &self.running.len())
            .finish()
    }
}

impl Ingest {
    /// Shard `shard`'s subscriptions, reporting into `signals`.
    pub(crate) fn new(shard: usize, signals: Arc<Signals>) -> Self {
        Self {
            shard,
            signals,
            jitter: Rc::new(Jitter::for_shard(shard)),
            broker_epoch: Rc::new(LocalEpoch::default()),
            running: HashMap::new(),
            #[cfg(feature = "dynamo-kv")]
            kv: None,
        }
    }

    /// Whether `snap` subscribes to `family` at all, and over which transport.
    fn family_policy(snap: &RouterSnapshot, family: Family) -> (bool, Transport) {
        let d = &snap.config.dynamo;
        let transport = match d.load.transport {
            LoadTransport::Direct => Transport::Direct,
            LoadTransport::Broker => Transport::Broker,
        };
        match family {
            Family::KvMetrics => (d.enabled, transport),
            Family::KvEvents => (
                cfg!(feature = "dynamo-kv") && d.enabled && d.kv.enabled,
                transport,
            ),
        }
    }

    /// Where `p`'s subscription connects, or `None` (pending): direct, the address the control
    /// thread resolved and allowed; through a broker, the advertised endpoint. A build without
    /// the event bus has no broker route: such subscriptions stay pending and never fall back to
    /// direct connections (BROKER-12).
    fn route(
        snap: &RouterSnapshot,
        p: &continuum_core::discovery::Publisher,
        transport: Transport,
    ) -> Option<Route> {
        match transport {
            Transport::Direct => snap
                .publisher_addrs
                .get(&p.publisher_id)
                .and_then(|r| r.as_ref().ok())
                .copied()
                .map(Route::Direct),
            #[cfg(feature = "dynamo-event-bus")]
            Transport::Broker => Some(Route::Broker(
                p.namespace.clone(),
                p.tcp.host.clone(),
                p.tcp.port,
            )),
            #[cfg(not(feature = "dynamo-event-bus"))]
            Transport::Broker => None,
        }
    }

    /// The broker sessions (or the listener) changed: pending broker subscriptions re-check.
    pub(crate) fn broker_sessions_changed(&self) {
        self.broker_epoch.bump();
    }

    /// The shard's KV state, created (with its upkeep task) on first use.
    #[cfg(feature = "dynamo-kv")]
    fn kv(&mut self) -> Option<kv::SharedKv> {
        if self.kv.is_none() {
            let state = kv::ShardKv::new(self.shard, self.signals.clone())?;
            let stop = LocalSignal::default();
            monoio::spawn(kv_upkeep(Rc::downgrade(&state), stop.clone()));
            self.kv = Some((state, stop));
        }
        self.kv.as_ref().map(|(k, _)| k.clone())
    }

    /// Bring the KV state in line with `snap` before the tasks are reconciled: the live gate
    /// follows the fleet; switching the family off clears the index.
    #[cfg(feature = "dynamo-kv")]
    fn reconcile_kv(&mut self, snap: &RouterSnapshot) {
        let (enabled, _) = Self::family_policy(snap, Family::KvEvents);
        if enabled {
            if let Some(k) = self.kv() {
                k.borrow_mut().set_fleet(&snap.fleet);
            }
        } else if let Some((k, _)) = &self.kv {
            k.borrow_mut().close_all();
        }
    }

    /// Bring the running tasks in line with `snap`.
    pub(crate) fn reconcile(&mut self, snap: &Arc<RouterSnapshot>) {
        #[cfg(feature = "dynamo-kv")]
        self.reconcile_kv(snap);
        let table = self.signals.table(self.shard);
        let shards = self.signals.shards();
        let mut wanted: HashMap<(Family, PublisherId), Option<Route>> = HashMap::new();
        for family in FAMILIES {
            let (enabled, transport) = Self::family_policy(snap, family);
            if !enabled {
                continue;
            }
            for p in admitted(&snap.fleet, family) {
                if shard_of(p.publisher_id, shards) != self.shard {
                    continue;
                }
                let route = Self::route(snap, p, transport);
                let key = (family, p.publisher_id);
                // Every subscription that runs (or is about to) is tracked with its registered
                // source, which may arrive or change after the channel (KV-IDX-09). A tracked
                // subscription keeps its cursors across a transport switch (BROKER-13).
                #[cfg(feature = "dynamo-kv")]
                if family == Family::KvEvents
                    && route.is_some()
                    && let Some((k, _)) = &self.kv
                {
                    k.borrow_mut()
                        .open(p.publisher_id, kv_source(p), crate::clock::now());
                }
                // A running task keeps its row (and state); a new or re-routed one starts over.
                let unchanged = self
                    .running
                    .get(&key)
                    .is_some_and(|r| Some(&r.route) == route.as_ref());
                if !unchanged {
                    table.upsert(SubRow {
                        family: p.family,
                        publisher_id: p.publisher_id,
                        namespace: p.namespace.clone(),
                        component: p.component.clone(),
                        state: match route {
                            Some(Route::Direct(_)) => SubState::Connecting,
                            _ => SubState::Pending,
                        },
                        shard: self.shard,
                        transport,
                        broker: None,
                    });
                }
                wanted.insert(key, route);
            }
        }
        // Stop what left or changed route.
        let mut closed = Vec::new();
        self.running.retain(|key, r| {
            let keep = wanted.get(key).and_then(Option::as_ref) == Some(&r.route);
            if !keep {
                r.stop.fire();
                if !wanted.contains_key(key) {
                    table.remove(key.0, key.1);
                    closed.push(*key);
                }
            }
            keep
        });
        #[cfg(feature = "dynamo-kv")]
        if let Some((k, _)) = &self.kv {
            for (family, id) in &closed {
                if *family == Family::KvEvents {
                    k.borrow_mut().close(*id);
                }
            }
        }
        drop(closed);
        // Start what is new.
        for ((family, id), route) in wanted {
            let Some(route) = route else { continue };
            if self.running.contains_key(&(family, id)) {
                continue;
            }
            let stop = LocalSignal::default();
            let spec = Spec {
                publisher: id,
                shard: self.shard,
                jitter: self.jitter.clone(),
                stop: stop.clone(),
            };
            let started = match &route {
                Route::Direct(addr) => self.spawn(family, DirectTcp(*addr), spec),
                #[cfg(feature = "dynamo-event-bus")]
                Route::Broker(namespace, host, port) => {
                    let connector = broker::BrokerConnector::new(
                        broker::BrokerRoute {
                            target: continuum_bus::ZmqTarget {
                                namespace: namespace.clone(),
                                host: host.clone(),
                                port: *port,
                            },
                            family,
                            publisher: id,
                        },
                        self.signals.clone(),
                        self.broker_epoch.clone(),
                        table.clone(),
                    );
                    self.spawn(family, connector, spec)
                }
            };
            if started {
                self.running.insert((family, id), Running { route, stop });
            }
        }
    }

    /// Start `spec`'s subscription of `family` over `connector`; `false` when this build (or
    /// the shard's KV state) cannot run it.
    fn spawn<C: Connector + 'static>(&mut self, family: Family, connector: C, spec: Spec) -> bool {
        let id = spec.publisher;
        match family {
            Family::KvMetrics => {
                let sink = load_sink::LoadSink::new(id, self.shard, self.signals.clone());
                monoio::spawn(task::run(connector, spec, sink));
                true
            }
            #[cfg(feature = "dynamo-kv")]
            Family::KvEvents => {
                // Tracked (`ShardKv::open`) in `reconcile`, with its source.
                let Some(k) = self.kv() else { return false };
                let sink = kv_sink::KvSink::new(id, k, self.signals.table(self.shard));
                monoio::spawn(task::run(connector, spec, sink));
                true
            }
            #[cfg(not(feature = "dynamo-kv"))]
            Family::KvEvents => {
                drop((connector, spec));
                false
            }
        }
    }

    /// Stop every task (drain).
    pub(crate) fn stop_all(&mut self) {
        for (_, r) in self.running.drain() {
            r.stop.fire();
        }
        #[cfg(feature = "dynamo-kv")]
        if let Some((_, stop)) = &self.kv {
            stop.fire();
        }
    }
}

/// The KV upkeep of one shard, until its stop signal fires or its state is gone.
#[cfg(feature = "dynamo-kv")]
async fn kv_upkeep(state: std::rc::Weak<std::cell::RefCell<kv::ShardKv>>, stop: LocalSignal) {
    loop {
        monoio::select! {
            _ = stop.wait() => return,
            _ = monoio::time::sleep(KV_TICK) => {}
        }
        let Some(k) = state.upgrade() else { return };
        k.borrow_mut().tick(crate::clock::now());
    }
}

/// The `(worker, dp_rank)` a kv-events publisher registered for (`v1/event_sources`, 1.6.1).
#[cfg(feature = "dynamo-kv")]
fn kv_source(p: &continuum_core::discovery::Publisher) -> Option<continuum_core::load::LoadKey> {
    p.source.map(|s| continuum_core::load::LoadKey {
        worker_id: s.worker_id,
        dp_rank: s.dp_rank,
    })
}

#[cfg(test)]
#[path = "route_tests.rs"]
mod route_tests;
