//! One shard: its handles and its run loop (accept, mailbox, drain).
//!
//! The shard composes what the other modules own: the [`Service`] its connections are served by
//! (the snapshot in force, the drain signal, the counters and the [`Dispatcher`]), and the
//! [`Ingest`] subscriptions the run loop reconciles on every snapshot. It owns no pool and no
//! subscription itself.
//!
//! Everything here is shard-local (`Rc`, `RefCell`, `Cell`). The snapshot is held as an
//! `Rc<LocalSnapshot>`: a request clones the `Rc` (a non-atomic increment), so requests on
//! different cores never touch the shared `Arc` counter, and a request keeps the snapshot it
//! started with even if a reload lands mid-request.

mod service;
pub(crate) mod spawn;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use continuum_core::publish::SnapshotCell;
use continuum_core::snapshot::RouterSnapshot;
use monoio::io::AsyncReadRent;
use monoio::net::{TcpListener, UnixStream};

use crate::clock;
use crate::dispatch::{Dispatcher, PickerEnv};
use crate::ingest::Ingest;
use crate::mailbox::{MailboxReceiver, ShardCommand};
use crate::metrics::{ControlStats, ShardMetrics};
use crate::notify::LocalSignal;
use crate::signals::Signals;

/// A snapshot as a shard holds it: requests clone the `Rc` around it (non-atomic), never the
/// `Arc` inside (whose counter every core would contend on).
#[derive(Debug)]
pub(crate) struct LocalSnapshot {
    snap: Arc<RouterSnapshot>,
    /// The shortest limit a connection's waits use under this config (`ReadLimits::timer_floor`),
    /// worked out once per snapshot.
    timer_floor: Duration,
}

impl LocalSnapshot {
    pub(crate) fn new(snap: Arc<RouterSnapshot>) -> Self {
        let timer_floor = timer_floor(&snap);
        Self { snap, timer_floor }
    }

    /// See [`LocalSnapshot::timer_floor`](field@LocalSnapshot::timer_floor).
    pub(crate) fn timer_floor(&self) -> Duration {
        self.timer_floor
    }
}

impl std::ops::Deref for LocalSnapshot {
    type Target = RouterSnapshot;

    fn deref(&self) -> &RouterSnapshot {
        &self.snap
    }
}

/// The shortest limit any wait of a connection uses under `snap`'s config: the header and
/// keep-alive reads, and every backend's first-byte and idle timeouts (the upstream write is
/// bounded by first-byte too). A request deadline shrinks below it and then re-arms the timer.
fn timer_floor(snap: &RouterSnapshot) -> Duration {
    let server = &snap.config.server;
    let upstream = std::iter::once(&server.upstream)
        .chain(snap.config.backends.iter().map(|b| &b.timeouts))
        .flat_map(|t| [t.first_byte, t.idle]);
    [server.header_read_timeout, server.keepalive_timeout]
        .into_iter()
        .chain(upstream)
        .min()
        .unwrap_or(server.keepalive_timeout)
}

/// What a shard's connections are served by.
#[derive(Debug)]
pub(crate) struct Service {
    id: usize,
    snapshot: RefCell<Rc<LocalSnapshot>>,
    drain: LocalSignal,
    metrics: Arc<ShardMetrics>,
    all_metrics: Arc<[Arc<ShardMetrics>]>,
    control: Arc<ControlStats>,
    signals: Arc<Signals>,
    dispatch: Dispatcher,
}

impl Service {
    /// The snapshot new requests use.
    fn snapshot(&self) -> Rc<LocalSnapshot> {
        self.snapshot.borrow().clone()
    }
}

/// The run loop's own state (private to this module: no other module sees it).
struct Runner {
    service: Rc<Service>,
    cell: Arc<SnapshotCell>,
    ingest: RefCell<Ingest>,
    drain_deadline: Cell<Option<Instant>>,
}

impl Runner {
    /// Load the published snapshot if it is newer than ours, and reconcile subscriptions.
    fn reload(&self) {
        let next = self.cell.load();
        let s = &self.service;
        if next.generation != s.snapshot.borrow().generation {
            self.ingest.borrow_mut().reconcile(&next);
            tracing::debug!(
                shard = s.id,
                generation = next.generation,
                "snapshot loaded"
            );
            *s.snapshot.borrow_mut() = Rc::new(LocalSnapshot::new(next));
            s.dispatch.on_snapshot();
        }
    }

    fn start_drain(&self, deadline: Instant) {
        self.drain_deadline.set(Some(deadline));
        self.service.drain.fire();
        self.ingest.borrow_mut().stop_all();
    }

    fn obey(&self, cmd: ShardCommand) {
        match cmd {
            ShardCommand::Reload => self.reload(),
            ShardCommand::Drain { deadline } => self.start_drain(deadline),
            ShardCommand::BrokerSessionsChanged => self.ingest.borrow().broker_sessions_changed(),
            ShardCommand::SetPicker(factory) => {
                let env = PickerEnv {
                    shard: self.service.id,
                    signals: self.service.signals.clone(),
                };
                self.service.dispatch.set_picker(factory.build(&env));
            }
        }
    }
}

/// Run the shard until it has drained.
async fn run(shard: Rc<Runner>, listener: TcpListener, mailbox: MailboxReceiver) {
    let id = shard.service.id;
    match UnixStream::from_std(mailbox.doorbell) {
        Ok(doorbell) => {
            monoio::spawn(mailbox_loop(shard.clone(), doorbell, mailbox.rx));
        }
        Err(e) => tracing::error!(shard = id, error = %e, "mailbox doorbell unusable"),
    }
    monoio::spawn(housekeeping(shard.service.clone()));
    // Subscriptions for the fleet already in the first snapshot.
    let first = shard.cell.load();
    shard.ingest.borrow_mut().reconcile(&first);
    let service = shard.service.clone();
    loop {
        monoio::select! {
            _ = service.drain.wait() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let service = service.clone();
                    monoio::spawn(async move {
                        crate::http::conn::serve(&*service, stream, peer).await;
                    });
                }
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    tracing::warn!(shard = id, error = %e, "accept failed");
                    monoio::time::sleep(Duration::from_millis(20)).await;
                }
            },
        }
    }
    close_listener(listener);
    let deadline = shard.drain_deadline.get().unwrap_or_else(clock::instant);
    while service.metrics.inflight() > 0 && clock::instant() < deadline {
        monoio::time::sleep(Duration::from_millis(5)).await;
    }
    let left = service.metrics.inflight();
    if left > 0 {
        tracing::warn!(shard = id, in_flight = left, "drain deadline passed");
    }
}

/// Stop listening now. Dropping the listener is not enough under io_uring: the abandoned accept
/// operation still holds the descriptor until it completes, so the socket would keep accepting
/// into its backlog during the drain. `shutdown` takes it out of LISTEN at once (Linux).
fn close_listener(listener: TcpListener) {
    use std::os::fd::AsRawFd;
    let fd = listener.as_raw_fd();
    // SAFETY: `fd` is the listener's open descriptor, alive for this call since `listener` is
    // still owned here; shutdown only changes the socket's state.
    let rc = unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "listener shutdown");
    }
    drop(listener);
}

/// How often a shard republishes its unanswered-dispatch summaries when it is not picking.
const LEDGER_REFRESH: Duration = Duration::from_millis(500);

/// Periodic shard-local upkeep: keep the dispatch ledger's published summaries exact while no
/// pick refreshes them (answered and expired records leave, stalls are judged on time), and
/// settle the hash-parity watchdog's predictions.
async fn housekeeping(service: Rc<Service>) {
    while !service.drain.is_fired() {
        monoio::time::sleep(LEDGER_REFRESH).await;
        service.dispatch.refresh_ledger();
        service.dispatch.check_predictions();
    }
}

async fn mailbox_loop(
    shard: Rc<Runner>,
    mut doorbell: UnixStream,
    rx: crossbeam_channel::Receiver<ShardCommand>,
) {
    let mut buf = Vec::with_capacity(64);
    loop {
        let (res, b) = doorbell.read(buf).await;
        buf = b;
        buf.clear();
        if !matches!(res, Ok(n) if n > 0) {
            // The control thread is gone: nothing will ever ask us to drain. Drain now so the
            // process does not outlive its control plane.
            shard.start_drain(clock::instant() + Duration::from_secs(5));
            return;
        }
        while let Ok(cmd) = rx.try_recv() {
            shard.obey(cmd);
        }
    }
}
