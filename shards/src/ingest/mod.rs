//! Ingest: the ZMTP subscriptions one shard owns, one bounded session per publisher, one sink
//! per event family.
//!
//! On every snapshot a shard reconciles each family it subscribes to: the fleet's admitted
//! publishers ([`continuum_core::subscriptions::admitted`], ascending ids, capped) whose stable
//! hash names this shard ([`continuum_core::subscriptions::shard_of`]) and whose address the
//! control thread resolved and allowed (CFG-20) get a task ([`task::run`]: connector, backoff,
//! the generic [`driver`]) with the family's sink (`kv_metrics`: [`load_sink`]; `kv-events`,
//! with the `dynamo-kv` feature and `dynamo.kv.enabled`: `kv_sink`, writing the shard's KV index
//! through `kv`); a task whose
//! publisher left, or whose address decision changed (RELOAD-03), is stopped. A publisher whose
//! address is refused or not yet resolved is listed as `pending`.
//!
//! Invariants: at most one task per (family, publisher id) on the whole router (one owner
//! shard); tasks are shard-local and stop at the next await once told to (well inside the 5 s
//! grace of LOAD-STORE-16).

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

use crate::notify::LocalSignal;
use crate::signals::Signals;
use crate::signals::subs::{SubRow, SubState};
use task::{DirectTcp, Jitter, Spec};

/// The families this build subscribes to, in reconcile order.
#[cfg(feature = "dynamo-kv")]
const FAMILIES: [Family; 2] = [Family::KvMetrics, Family::KvEvents];
#[cfg(not(feature = "dynamo-kv"))]
const FAMILIES: [Family; 1] = [Family::KvMetrics];

/// How often the KV upkeep runs (down-time clearing, admin rows).
#[cfg(feature = "dynamo-kv")]
const KV_TICK: std::time::Duration = std::time::Duration::from_millis(250);

struct Running {
    addr: SocketAddr,
    stop: LocalSignal,
}

/// The subscriptions one shard owns.
pub(crate) struct Ingest {
    shard: usize,
    signals: Arc<Signals>,
    jitter: Rc<Jitter>,
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
            running: HashMap::new(),
            #[cfg(feature = "dynamo-kv")]
            kv: None,
        }
    }

    /// Whether `snap` subscribes to `family` at all, and whether its publishers may be reached
    /// directly. `transport: broker` needs the event-bus tunnel, which this build does not have:
    /// such subscriptions stay pending and never fall back to direct connections (BROKER-12).
    fn family_policy(snap: &RouterSnapshot, family: Family) -> (bool, bool) {
        let d = &snap.config.dynamo;
        match family {
            Family::KvMetrics => (d.enabled, d.load.transport == LoadTransport::Direct),
            Family::KvEvents => (
                cfg!(feature = "dynamo-kv") && d.enabled && d.kv.enabled,
                d.load.transport == LoadTransport::Direct,
            ),
        }
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
        let mut wanted: HashMap<(Family, PublisherId), Option<SocketAddr>> = HashMap::new();
        for family in FAMILIES {
            let (enabled, direct) = Self::family_policy(snap, family);
            if !enabled {
                continue;
            }
            for p in admitted(&snap.fleet, family) {
                if shard_of(p.publisher_id, shards) != self.shard {
                    continue;
                }
                let addr = snap
                    .publisher_addrs
                    .get(&p.publisher_id)
                    .and_then(|r| r.as_ref().ok())
                    .copied()
                    .filter(|_| direct);
                let key = (family, p.publisher_id);
                wanted.insert(key, addr);
                // Every subscription that runs (or is about to) is tracked with its registered
                // source, which may arrive or change after the channel (KV-IDX-09).
                #[cfg(feature = "dynamo-kv")]
                if family == Family::KvEvents
                    && addr.is_some()
                    && let Some((k, _)) = &self.kv
                {
                    k.borrow_mut()
                        .open(p.publisher_id, kv_source(p), crate::clock::now());
                }
                // A running task keeps its row (and state); a new or re-addressed one starts over.
                let unchanged = self.running.get(&key).is_some_and(|r| Some(r.addr) == addr);
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
                        shard: self.shard,
                    });
                }
            }
        }
        // Stop what left or changed address.
        let mut closed = Vec::new();
        self.running.retain(|key, r| {
            let keep = wanted.get(key).copied().flatten() == Some(r.addr);
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
        for ((family, id), addr) in wanted {
            let Some(addr) = addr else { continue };
            if self.running.contains_key(&(family, id)) {
                continue;
            }
            let stop = LocalSignal::default();
            let spec = Spec {
                publisher: id,
                addr,
                shard: self.shard,
                jitter: self.jitter.clone(),
                stop: stop.clone(),
            };
            match family {
                Family::KvMetrics => {
                    let sink = load_sink::LoadSink::new(id, self.shard, self.signals.clone());
                    monoio::spawn(task::run(DirectTcp, spec, sink));
                }
                #[cfg(feature = "dynamo-kv")]
                Family::KvEvents => {
                    // Tracked (`ShardKv::open`) in the loop above, with its source.
                    let Some(k) = self.kv() else { continue };
                    let sink = kv_sink::KvSink::new(id, k, table.clone());
                    monoio::spawn(task::run(DirectTcp, spec, sink));
                }
                #[cfg(not(feature = "dynamo-kv"))]
                Family::KvEvents => continue,
            }
            self.running.insert((family, id), Running { addr, stop });
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
