//! Starting the shard threads: name, pin, build the runtime, bind, run.
//!
//! Shard 0 binds first; when the configured port is 0 the others then bind the port it got, so
//! every shard shares one SO_REUSEPORT group. Startup is synchronous for the caller:
//! [`spawn_shards`] returns only when every shard has bound its listener, or the first error
//! (pinning, runtime, bind) as a typed [`ShardSetError`], never a panic.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Instant;

use continuum_core::publish::SnapshotCell;
use crossbeam_channel::Receiver;
use monoio::net::{ListenerOpts, TcpListener};

use std::cell::{Cell, RefCell};

use super::{LocalSnapshot, Runner, Service};
use crate::dispatch::{Dispatcher, PickerEnv, PickerFactory};
use crate::ingest::Ingest;
use crate::mailbox::{self, MailboxReceiver, MailboxSender, ShardCommand};
use crate::metrics::{ControlStats, ShardMetrics};
use crate::notify::LocalSignal;
use crate::runtime::{self, DriverChoice, DriverKind};
use crate::signals::Signals;
use continuum_core::load::{DispatchLedger, LoadStore};

/// What to start.
#[derive(Debug, Clone)]
pub struct ShardSpec {
    /// Address every shard binds.
    pub bind: SocketAddr,
    /// CPU for each shard (`None`: not pinned); its length is the shard count.
    pub cpus: Vec<Option<usize>>,
    /// Which I/O drivers may be used.
    pub driver: DriverChoice,
    /// Builds each shard's worker picker at start (PICK-17: the KV-aware picker replaces the
    /// default here, without changes to the data plane); [`ShardSet::set_picker`] replaces it
    /// at run time (API-06).
    pub picker: PickerFactory,
    /// The dispatch gossip with the other router replicas (`dynamo.peers`; read at start).
    pub peers: continuum_core::config::peers::PeersConfig,
}

/// Why the shards could not start.
#[derive(Debug, thiserror::Error)]
pub enum ShardSetError {
    /// The OS refused a thread.
    #[error("cannot spawn thread shard-{shard}: {source}")]
    Spawn {
        /// Shard index.
        shard: usize,
        /// OS error.
        source: std::io::Error,
    },
    /// Pinning to the configured CPU failed.
    #[error("cannot pin shard-{shard} to CPU {cpu}: {source}")]
    Pin {
        /// Shard index.
        shard: usize,
        /// Requested CPU.
        cpu: usize,
        /// OS error.
        source: std::io::Error,
    },
    /// No runtime could be built, not even epoll.
    #[error("shard-{shard} cannot build a runtime: {source}")]
    Runtime {
        /// Shard index.
        shard: usize,
        /// OS error.
        source: std::io::Error,
    },
    /// The dispatch gossip's receiver could not start (`dynamo.peers.listen`).
    #[error("cannot receive the other replicas' dispatches: {0}")]
    Peers(std::io::Error),
    /// The listener could not be bound.
    #[error("shard-{shard} cannot bind {addr}: {source}")]
    Bind {
        /// Shard index.
        shard: usize,
        /// Address.
        addr: SocketAddr,
        /// OS error.
        source: std::io::Error,
    },
    /// A shard thread died during startup.
    #[error("shard-{shard} exited during startup")]
    Died {
        /// Shard index.
        shard: usize,
    },
    /// The mailbox socket pair could not be created.
    #[error("cannot create shard mailbox: {0}")]
    Mailbox(std::io::Error),
}

/// The running shards.
#[derive(Debug)]
pub struct ShardSet {
    mailboxes: Vec<MailboxSender>,
    exits: Receiver<usize>,
    threads: Vec<JoinHandle<()>>,
    /// Every shard's metrics, for scraping.
    pub metrics: Arc<[Arc<ShardMetrics>]>,
    /// The driver each shard got.
    pub drivers: Vec<DriverKind>,
    /// The address the shards listen on (the real port when 0 was configured).
    pub local_addr: SocketAddr,
    /// The factory of the active picker.
    picker: PickerFactory,
    /// What every shard reads (the broker slot is set here).
    #[cfg_attr(not(feature = "dynamo-event-bus"), allow(dead_code))]
    signals: Arc<Signals>,
}

impl ShardSet {
    /// Tell every shard to load the published snapshot.
    pub fn reload_all(&self) {
        for m in &self.mailboxes {
            let _ = m.send(ShardCommand::Reload);
        }
    }

    /// The event bus listener started, restarted or stopped (`bus`: its command API, `None`
    /// when none runs) or its broker sessions changed: every shard re-checks its pending
    /// broker subscriptions (BROKER-06/07).
    #[cfg(feature = "dynamo-event-bus")]
    pub fn set_event_bus(&self, bus: Option<continuum_bus::EventBus>) {
        self.signals.broker.set(bus);
        self.broker_sessions_changed();
    }

    /// The broker sessions changed: every shard re-checks its pending broker subscriptions and
    /// their carriers (BROKER-06/07, BROKER-09).
    pub fn broker_sessions_changed(&self) {
        for m in &self.mailboxes {
            let _ = m.send(ShardCommand::BrokerSessionsChanged);
        }
    }

    /// The active picker's factory (API-06 `picker()`).
    pub fn picker(&self) -> &PickerFactory {
        &self.picker
    }

    /// Replace the active picker on every shard (API-06 `set_picker()`): each shard builds its
    /// own from `factory` when its mailbox delivers the command, and its next pick uses it;
    /// requests already picked keep their workers.
    pub fn set_picker(&mut self, factory: PickerFactory) {
        for m in &self.mailboxes {
            let _ = m.send(ShardCommand::SetPicker(factory.clone()));
        }
        self.picker = factory;
    }

    /// Stop accepting everywhere, let in-flight requests finish until `deadline`, and wait for
    /// every shard thread to exit (up to one second past the deadline). Returns whether all did.
    pub fn drain(self, deadline: Instant) -> bool {
        for m in &self.mailboxes {
            let _ = m.send(ShardCommand::Drain { deadline });
        }
        let give_up = deadline + std::time::Duration::from_secs(1);
        let mut exited = 0;
        while exited < self.threads.len() {
            match self.exits.recv_deadline(give_up) {
                Ok(_) => exited += 1,
                Err(_) => return false,
            }
        }
        for t in self.threads {
            let _ = t.join();
        }
        true
    }
}

/// Start every shard; returns once all have bound.
pub fn spawn_shards(
    spec: &ShardSpec,
    cell: Arc<SnapshotCell>,
    control: Arc<ControlStats>,
    store: Arc<LoadStore>,
) -> Result<ShardSet, ShardSetError> {
    let count = spec.cpus.len().max(1);
    let ledgers: Vec<DispatchLedger> = (0..count).map(|_| DispatchLedger::new()).collect();
    let remote = DispatchLedger::new();
    let signals = Arc::new(Signals::new(store, &ledgers).with_peers(&spec.peers, &remote));
    if signals.peers.is_some() {
        crate::peers::spawn_receiver(signals.clone(), remote).map_err(ShardSetError::Peers)?;
    }
    let mut ledgers = ledgers.into_iter();
    let metrics: Arc<[Arc<ShardMetrics>]> =
        (0..count).map(|i| Arc::new(ShardMetrics::new(i))).collect();
    let (exit_tx, exits) = crossbeam_channel::unbounded();
    let mut set = ShardSet {
        mailboxes: Vec::with_capacity(count),
        exits,
        threads: Vec::with_capacity(count),
        metrics: metrics.clone(),
        drivers: Vec::with_capacity(count),
        local_addr: spec.bind,
        picker: spec.picker.clone(),
        signals: signals.clone(),
    };
    for id in 0..count {
        let ledger = ledgers.next().unwrap_or_default();
        let (tx, rx) = mailbox::mailbox().map_err(ShardSetError::Mailbox)?;
        let (ready_tx, ready_rx) = mpsc::channel();
        let start = ShardStart {
            id,
            cpu: spec.cpus.get(id).copied().flatten(),
            bind: set.local_addr,
            driver: spec.driver,
            cell: cell.clone(),
            metrics: metrics.clone(),
            control: control.clone(),
            signals: signals.clone(),
            ledger,
            picker: spec.picker.clone(),
            mailbox: rx,
            ready: ready_tx,
            exit: exit_tx.clone(),
        };
        let handle = std::thread::Builder::new()
            .name(format!("shard-{id}"))
            .spawn(move || shard_main(start))
            .map_err(|source| ShardSetError::Spawn { shard: id, source })?;
        set.threads.push(handle);
        set.mailboxes.push(tx);
        match ready_rx.recv() {
            Ok(Ok((addr, driver))) => {
                set.local_addr = addr;
                set.drivers.push(driver);
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(ShardSetError::Died { shard: id }),
        }
    }
    Ok(set)
}

struct ShardStart {
    id: usize,
    cpu: Option<usize>,
    bind: SocketAddr,
    driver: DriverChoice,
    cell: Arc<SnapshotCell>,
    metrics: Arc<[Arc<ShardMetrics>]>,
    control: Arc<ControlStats>,
    signals: Arc<Signals>,
    ledger: DispatchLedger,
    picker: PickerFactory,
    mailbox: MailboxReceiver,
    ready: mpsc::Sender<Result<(SocketAddr, DriverKind), ShardSetError>>,
    exit: crossbeam_channel::Sender<usize>,
}

fn shard_main(start: ShardStart) {
    let id = start.id;
    if let Some(cpu) = start.cpu
        && let Err(source) = pin_current_thread(cpu)
    {
        let _ = start.ready.send(Err(ShardSetError::Pin {
            shard: id,
            cpu,
            source,
        }));
        return;
    }
    let (mut rt, driver) = match runtime::build(start.driver) {
        Ok(r) => r,
        Err(source) => {
            let _ = start
                .ready
                .send(Err(ShardSetError::Runtime { shard: id, source }));
            return;
        }
    };
    tracing::info!(shard = id, cpu = ?start.cpu, %driver, "shard starting");
    let exit = start.exit.clone();
    rt.block_on(async move {
        let opts = ListenerOpts::new()
            .reuse_port(true)
            .reuse_addr(true)
            .backlog(4096);
        let listener = match TcpListener::bind_with_config(start.bind, &opts) {
            Ok(l) => l,
            Err(source) => {
                let _ = start.ready.send(Err(ShardSetError::Bind {
                    shard: id,
                    addr: start.bind,
                    source,
                }));
                return;
            }
        };
        let addr = listener.local_addr().unwrap_or(start.bind);
        let _ = start.ready.send(Ok((addr, driver)));
        let shard = build(
            id,
            start.cell,
            start.metrics,
            start.control,
            start.signals,
            start.ledger,
            &start.picker,
        );
        super::run(shard, listener, start.mailbox).await;
    });
    tracing::info!(shard = id, "shard exited");
    let _ = exit.send(id);
}

/// Assemble shard `id` on its own thread.
fn build(
    id: usize,
    cell: Arc<SnapshotCell>,
    all_metrics: Arc<[Arc<ShardMetrics>]>,
    control: Arc<ControlStats>,
    signals: Arc<Signals>,
    ledger: DispatchLedger,
    picker: &PickerFactory,
) -> Rc<Runner> {
    let metrics = all_metrics
        .get(id)
        .cloned()
        .unwrap_or_else(|| Arc::new(ShardMetrics::new(id)));
    let env = PickerEnv {
        shard: id,
        signals: signals.clone(),
    };
    let dispatch = Dispatcher::new(
        id,
        metrics.clone(),
        signals.clone(),
        ledger,
        picker.build(&env),
    );
    let service = Service {
        id,
        snapshot: RefCell::new(Rc::new(LocalSnapshot::new(cell.load()))),
        drain: LocalSignal::default(),
        metrics,
        all_metrics,
        control,
        signals: signals.clone(),
        dispatch,
    };
    Rc::new(Runner {
        service: Rc::new(service),
        cell,
        ingest: RefCell::new(Ingest::new(id, signals)),
        drain_deadline: Cell::new(None),
    })
}

/// Pin the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(std::io::ErrorKind::InvalidInput.into());
    }
    // SAFETY: `set` is a plain bit set initialised by CPU_ZERO before use; `cpu` is below
    // CPU_SETSIZE (checked above), so CPU_SET stays in bounds; sched_setaffinity only reads it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
