//! One shard's state and its main loop: accept, serve, obey the mailbox, drain.
//!
//! Everything here is shard-local (`Rc`, `RefCell`, `Cell`). The snapshot is held as an
//! `Rc<Arc<RouterSnapshot>>`: a request clones the `Rc` (a non-atomic increment), so requests on
//! different cores never touch the shared `Arc` counter, and a request keeps the snapshot it
//! started with even if a reload lands mid-request.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use continuum_core::publish::SnapshotCell;
use continuum_core::snapshot::RouterSnapshot;
use monoio::io::AsyncReadRent;
use monoio::net::{TcpListener, UnixStream};

use crate::conn;
use crate::mailbox::{MailboxReceiver, ShardCommand};
use crate::metrics::{ControlStats, ShardMetrics};
use crate::proxy::Pool;
use crate::signal::LocalSignal;
use crate::subscribe::status::SubTable;
use crate::subscribe::{LoadShared, Subscriptions};
use continuum_core::load::DispatchLedger;
use continuum_core::load::metrics::LoadEventCounters;
use continuum_core::picker::{PickScratch, PickerCursors, WorkerPicker};

/// A snapshot as a shard holds it: requests clone the `Rc` around it (non-atomic), never the
/// `Arc` inside (whose counter every core would contend on).
#[derive(Debug)]
pub(crate) struct LocalSnapshot(Arc<RouterSnapshot>);

impl std::ops::Deref for LocalSnapshot {
    type Target = RouterSnapshot;

    fn deref(&self) -> &RouterSnapshot {
        &self.0
    }
}

/// A shard's state, shared by its tasks.
#[derive(Debug)]
pub(crate) struct Shard {
    pub(crate) id: usize,
    cell: Arc<SnapshotCell>,
    snapshot: RefCell<Rc<LocalSnapshot>>,
    cursors: RefCell<Vec<usize>>,
    pub(crate) pool: RefCell<Pool>,
    pub(crate) metrics: Arc<ShardMetrics>,
    pub(crate) all_metrics: Arc<[Arc<ShardMetrics>]>,
    pub(crate) control: Arc<ControlStats>,
    drain: LocalSignal,
    drain_deadline: Cell<Option<Instant>>,
    /// Load-signal state shared with every shard.
    pub(crate) load: Arc<LoadShared>,
    /// This shard's subscription table (a row per owned publisher).
    pub(crate) subs_table: Arc<SubTable>,
    /// The subscription tasks this shard runs.
    subs: RefCell<Subscriptions>,
    /// xorshift state for backoff jitter (seeded per shard).
    rng: Cell<u64>,
    /// The worker picker (PICK-17: replaceable behind the trait).
    pub(crate) picker: Box<dyn WorkerPicker>,
    /// This shard's picker cursors, scratch space and dispatch ledger.
    pub(crate) pick_state: RefCell<PickState>,
    /// Rotation over each namespace's shim replicas (one cursor for all pools).
    shim_cursor: Cell<usize>,
}

/// The shard-local state one pick reads and writes.
#[derive(Debug)]
pub(crate) struct PickState {
    pub(crate) cursors: PickerCursors,
    pub(crate) scratch: PickScratch,
    pub(crate) ledger: DispatchLedger,
    /// When the ledger was last refreshed by a pick.
    pub(crate) refreshed: Option<continuum_core::clock::Instant>,
}

/// A pick refreshes the shard's dispatch ledger (a walk over every key it has dispatched to) at
/// most this often: at 1,000 workers the walk costs about as much as the pick itself
/// (`continuum-bench pick`, rows `pick p/d` and `refresh+p/d`), and between refreshes other
/// shards' readers already correct answered and expired records themselves.
pub(crate) const PICK_REFRESH_EVERY: std::time::Duration = std::time::Duration::from_millis(1);

impl PickState {
    /// Refresh the ledger if the last refresh is older than [`PICK_REFRESH_EVERY`].
    pub(crate) fn refresh_ledger(
        &mut self,
        view: &continuum_core::load::LoadView<'_>,
        now: continuum_core::clock::Instant,
    ) {
        let due = self
            .refreshed
            .is_none_or(|t| now.saturating_since(t) >= PICK_REFRESH_EVERY);
        if due {
            self.ledger.refresh(view, now);
            self.refreshed = Some(now);
        }
    }
}

impl Shard {
    pub(crate) fn new(
        id: usize,
        cell: Arc<SnapshotCell>,
        all_metrics: Arc<[Arc<ShardMetrics>]>,
        control: Arc<ControlStats>,
        load: Arc<LoadShared>,
        ledger: DispatchLedger,
        picker: Box<dyn WorkerPicker>,
    ) -> Self {
        let snapshot = RefCell::new(Rc::new(LocalSnapshot(cell.load())));
        let metrics = all_metrics
            .get(id)
            .cloned()
            .unwrap_or_else(|| Arc::new(ShardMetrics::new(id)));
        Self {
            id,
            cell,
            snapshot,
            cursors: RefCell::new(Vec::new()),
            pool: RefCell::new(Pool::default()),
            metrics,
            all_metrics,
            control,
            drain: LocalSignal::default(),
            drain_deadline: Cell::new(None),
            subs_table: load.tables.get(id).cloned().unwrap_or_default(),
            load,
            subs: RefCell::new(Subscriptions::default()),
            rng: Cell::new(
                0x9E37_79B9_7F4A_7C15 ^ (id as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9),
            ),
            picker,
            pick_state: RefCell::new(PickState {
                // Start each shard's cursors apart so shards do not round-robin in lockstep.
                cursors: PickerCursors {
                    decode: id as u64,
                    prefill: id as u64,
                },
                scratch: PickScratch::new(),
                ledger,
                refreshed: None,
            }),
            shim_cursor: Cell::new(id),
        }
    }

    /// The next position in a shim pool's replica rotation.
    pub(crate) fn next_shim_cursor(&self) -> usize {
        let v = self.shim_cursor.get();
        self.shim_cursor.set(v.wrapping_add(1));
        v
    }

    /// The snapshot new requests use.
    pub(crate) fn snapshot(&self) -> Rc<LocalSnapshot> {
        self.snapshot.borrow().clone()
    }

    /// This shard's `continuum_dynamo_load_events_total` counters.
    pub(crate) fn load_events(&self) -> &LoadEventCounters {
        // `spawn_shards` creates one counter set per shard, so the index is in range; a
        // mismatch would only misattribute counts, never fail.
        let n = self.load.events.len().max(1);
        &self.load.events[self.id % n]
    }

    /// A uniform random number in `[0, 1)` for backoff jitter (xorshift64*, shard-local).
    pub(crate) fn random_unit(&self) -> f64 {
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Load the published snapshot if it is newer than ours, and reconcile subscriptions.
    fn reload(self: &Rc<Self>) {
        let next = self.cell.load();
        if next.generation != self.snapshot.borrow().generation {
            self.subs.borrow_mut().reconcile(self, &next);
            tracing::debug!(
                shard = self.id,
                generation = next.generation,
                "snapshot loaded"
            );
            *self.snapshot.borrow_mut() = Rc::new(LocalSnapshot(next));
            self.cursors.borrow_mut().clear();
        }
    }

    /// The rotation position for the next request of route `slot`, advancing the cursor.
    pub(crate) fn next_cursor(&self, slot: usize) -> usize {
        let mut cursors = self.cursors.borrow_mut();
        if cursors.len() <= slot {
            // Start each shard at a different position so shards do not move in lockstep.
            cursors.resize(slot + 1, self.id);
        }
        let v = cursors[slot];
        cursors[slot] = v.wrapping_add(1);
        v
    }

    /// Whether the shard is draining.
    pub(crate) fn draining(&self) -> bool {
        self.drain.is_fired()
    }

    fn start_drain(&self, deadline: Instant) {
        self.drain_deadline.set(Some(deadline));
        self.drain.fire();
        self.subs.borrow_mut().stop_all();
    }
}

/// Run the shard until it has drained.
pub(crate) async fn run(shard: Rc<Shard>, listener: TcpListener, mailbox: MailboxReceiver) {
    match UnixStream::from_std(mailbox.doorbell) {
        Ok(doorbell) => {
            monoio::spawn(mailbox_loop(shard.clone(), doorbell, mailbox.rx));
        }
        Err(e) => tracing::error!(shard = shard.id, error = %e, "mailbox doorbell unusable"),
    }
    monoio::spawn(housekeeping(shard.clone()));
    // Subscriptions for the fleet already in the first snapshot.
    let first = shard.cell.load();
    shard.subs.borrow_mut().reconcile(&shard, &first);
    loop {
        monoio::select! {
            _ = shard.drain.wait() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    monoio::spawn(conn::serve(shard.clone(), stream, peer));
                }
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    tracing::warn!(shard = shard.id, error = %e, "accept failed");
                    monoio::time::sleep(Duration::from_millis(20)).await;
                }
            },
        }
    }
    close_listener(listener);
    let deadline = shard.drain_deadline.get().unwrap_or_else(Instant::now);
    while shard.metrics.inflight() > 0 && Instant::now() < deadline {
        monoio::time::sleep(Duration::from_millis(5)).await;
    }
    let left = shard.metrics.inflight();
    if left > 0 {
        tracing::warn!(shard = shard.id, in_flight = left, "drain deadline passed");
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
/// pick refreshes them (answered and expired records leave, stalls are judged on time).
async fn housekeeping(shard: Rc<Shard>) {
    while !shard.draining() {
        monoio::time::sleep(LEDGER_REFRESH).await;
        let view = shard.load.store.view();
        shard
            .pick_state
            .borrow_mut()
            .ledger
            .refresh(&view, crate::clock::now());
    }
}

async fn mailbox_loop(
    shard: Rc<Shard>,
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
            shard.start_drain(Instant::now() + Duration::from_secs(5));
            return;
        }
        while let Ok(cmd) = rx.try_recv() {
            match cmd {
                ShardCommand::Reload => shard.reload(),
                ShardCommand::Drain { deadline } => shard.start_drain(deadline),
            }
        }
    }
}
