//! Dynamo discovery on the control thread: a supervisor that runs at most one watcher task,
//! restarts it as reloads require, and feeds every new fleet view to the control loop.
//!
//! The watcher task owns a session loop (`session.rs`) over a source (`etcd.rs`, the Dynamo
//! file store in `file.rs`, or the Kubernetes metadata source in `kube_meta.rs`), with the
//! doubling backoff of DISC-ETCD-05/06 between sessions; the Pod source (`kube_pods.rs`) has a
//! loop of its own, as it feeds no reducer. It never publishes a snapshot itself:
//! it sends [`FleetUpdate`]s tagged with its epoch, and the control loop, the one writer of the
//! snapshot cell, ignores updates from a replaced watcher.
//!
//! Invariants:
//! - one reducer per watcher, reused across reconnects (DISC-ETCD-07); carried over to the next
//!   watcher only where the reload class says so (RELOAD-06/07);
//! - stopping a watcher waits at most [`STOP_GRACE`] and then aborts it (RELOAD-10);
//! - reducer diagnostics become log lines here, and their kinds `discovery_events` counts.

#[cfg(feature = "dynamo")]
pub mod etcd;
#[cfg(feature = "dynamo")]
pub mod file;
#[cfg(feature = "dynamo")]
pub mod kube_client;
#[cfg(feature = "dynamo")]
pub mod kube_meta;
#[cfg(feature = "dynamo")]
pub mod kube_pods;
pub mod plan;
pub mod session;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use continuum_core::backoff::DoublingBackoff;
use continuum_core::config::dynamo::Backoff;
use continuum_core::discovery::{DiscoveryEventKind, EventCounts, FleetView, Level, Reducer};
use continuum_shards::metrics::ControlStats;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub use plan::{
    DiscoveryPlan, FilePlan, NotRunnable, Registry, RestartReason, Transition, classify, plan_for,
    plan_for_discovery,
};

/// Grace a stopping watcher gets before it is aborted (RELOAD-10).
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// A fleet view from a watcher.
#[derive(Debug)]
pub struct FleetUpdate {
    /// Which watcher sent it.
    pub epoch: u64,
    /// The view.
    pub fleet: Arc<FleetView>,
}

struct Running {
    plan: DiscoveryPlan,
    epoch: u64,
    task: JoinHandle<()>,
    stop: watch::Sender<bool>,
    reducer: Arc<Mutex<Reducer>>,
}

/// Runs and replaces the watcher.
pub struct Supervisor {
    running: Option<Running>,
    epoch: u64,
    updates: mpsc::UnboundedSender<FleetUpdate>,
    stats: Arc<ControlStats>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl Supervisor {
    /// A supervisor sending views on `updates`.
    pub fn new(updates: mpsc::UnboundedSender<FleetUpdate>, stats: Arc<ControlStats>) -> Self {
        Self {
            running: None,
            epoch: 0,
            updates,
            stats,
        }
    }

    /// The epoch of the running watcher (updates with another epoch are stale).
    pub fn epoch(&self) -> Option<u64> {
        self.running.as_ref().map(|r| r.epoch)
    }

    /// Move to `plan`. `boot` marks the first call (a start at boot is not a restart). Returns
    /// `true` when the registry must be cleared now.
    pub fn reconcile(&mut self, plan: Option<DiscoveryPlan>, boot: bool) -> bool {
        let old = self.running.as_ref().map(|r| &r.plan);
        match classify(old, plan.as_ref()) {
            Transition::Keep => false,
            Transition::Stop => {
                tracing::info!("dynamo discovery disabled: watcher stopped, registry cleared");
                self.stop_running();
                true
            }
            Transition::Restart(reason, registry) => {
                let Some(plan) = plan else { return false };
                let carried = match registry {
                    Registry::KeepUntilResync => self.running.as_ref().map(|r| r.reducer.clone()),
                    Registry::Reset => None,
                };
                self.stop_running();
                if !boot {
                    tracing::info!(
                        reason = reason.as_str(),
                        "dynamo discovery watcher restarting"
                    );
                    self.stats.discovery_events[kind_index(DiscoveryEventKind::Restart)]
                        .fetch_add(1, Ordering::Relaxed);
                }
                let reducer = carried.unwrap_or_else(|| Arc::new(Mutex::new(Reducer::new())));
                self.start(plan, reducer);
                registry == Registry::Reset
            }
        }
    }

    fn start(&mut self, plan: DiscoveryPlan, reducer: Arc<Mutex<Reducer>>) {
        self.epoch += 1;
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run_watcher(
            plan.clone(),
            reducer.clone(),
            self.epoch,
            self.updates.clone(),
            self.stats.clone(),
            stop_rx,
        ));
        self.running = Some(Running {
            plan,
            epoch: self.epoch,
            task,
            stop,
            reducer,
        });
    }

    fn stop_running(&mut self) {
        if let Some(r) = self.running.take() {
            let _ = r.stop.send(true);
            self.stats.discovery_connected.store(0, Ordering::Relaxed);
            let mut task = r.task;
            tokio::spawn(async move {
                if tokio::time::timeout(STOP_GRACE, &mut task).await.is_err() {
                    task.abort();
                }
            });
        }
    }

    /// Stop the watcher (shutdown): waits at most [`STOP_GRACE`].
    pub async fn shutdown(&mut self) {
        if let Some(r) = self.running.take() {
            let _ = r.stop.send(true);
            let mut task = r.task;
            if tokio::time::timeout(STOP_GRACE, &mut task).await.is_err() {
                task.abort();
            }
        }
    }
}

fn kind_index(kind: DiscoveryEventKind) -> usize {
    DiscoveryEventKind::ALL
        .iter()
        .position(|k| *k == kind)
        .unwrap_or(0)
}

/// Log the reducer's diagnostics and add its new counts to the metrics.
fn report(reducer: &Mutex<Reducer>, seen: &mut EventCounts, stats: &ControlStats) {
    let (diags, counts) = {
        let mut r = session::lock(reducer);
        (r.drain_diagnostics(), r.counts())
    };
    for d in diags {
        match d.level() {
            Level::Debug => tracing::debug!(kind = d.event_kind().map(|k| k.as_str()), "{d}"),
            Level::Warn => tracing::warn!(kind = d.event_kind().map(|k| k.as_str()), "{d}"),
        }
    }
    for kind in DiscoveryEventKind::ALL {
        let delta = counts.get(kind).saturating_sub(seen.get(kind));
        if delta > 0 {
            stats.discovery_events[kind_index(kind)].fetch_add(delta, Ordering::Relaxed);
        }
    }
    *seen = counts;
}

async fn run_watcher(
    plan: DiscoveryPlan,
    reducer: Arc<Mutex<Reducer>>,
    epoch: u64,
    updates: mpsc::UnboundedSender<FleetUpdate>,
    stats: Arc<ControlStats>,
    mut stop: watch::Receiver<bool>,
) {
    #[cfg(feature = "dynamo")]
    match &plan {
        DiscoveryPlan::KubernetesPods(cfg) => {
            return run_pods_watcher(cfg, epoch, &updates, &stats, &mut stop).await;
        }
        DiscoveryPlan::KubernetesMetadata(cfg) => {
            let mut views = ViewSender::new(epoch, &updates, &stats, &reducer);
            return run_meta_watcher(cfg, &reducer, &mut views, &stats, &mut stop).await;
        }
        DiscoveryPlan::Etcd(_) | DiscoveryPlan::File(_) => {}
    }
    // The file source has no backoff setting of its own: it uses the documented default.
    let b = match &plan {
        DiscoveryPlan::Etcd(cfg) => cfg.watch_reconnect_backoff,
        DiscoveryPlan::File(_) => Backoff::default(),
        DiscoveryPlan::KubernetesPods(cfg) | DiscoveryPlan::KubernetesMetadata(cfg) => {
            cfg.watch_reconnect_backoff
        }
    };
    let mut backoff = DoublingBackoff::new(b.initial, b.max, b.max);
    let mut views = ViewSender::new(epoch, &updates, &stats, &reducer);
    loop {
        let outcome = {
            let mut publish = |view: Arc<FleetView>| views.send(view);
            run_session(&plan, &reducer, &mut publish, &stats, &mut stop).await
        };
        stats.discovery_connected.store(0, Ordering::Relaxed);
        let Some(report_) = outcome else { return };
        views.report();
        let delay = backoff.session_ended(report_.healthy_for);
        tracing::warn!(
            end = %report_.end,
            healthy_for = ?report_.healthy_for,
            retry_in = ?delay,
            "dynamo discovery session ended; full resync after backoff"
        );
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Sends a watcher's views to the control loop, each once, after reporting the reducer's
/// diagnostics.
struct ViewSender<'a> {
    epoch: u64,
    updates: &'a mpsc::UnboundedSender<FleetUpdate>,
    stats: &'a ControlStats,
    reducer: &'a Mutex<Reducer>,
    seen: EventCounts,
    last: Option<Arc<FleetView>>,
}

impl<'a> ViewSender<'a> {
    fn new(
        epoch: u64,
        updates: &'a mpsc::UnboundedSender<FleetUpdate>,
        stats: &'a ControlStats,
        reducer: &'a Mutex<Reducer>,
    ) -> Self {
        Self {
            epoch,
            updates,
            stats,
            reducer,
            seen: session::lock(reducer).counts(),
            last: None,
        }
    }

    fn report(&mut self) {
        report(self.reducer, &mut self.seen, self.stats);
    }

    fn send(&mut self, view: Arc<FleetView>) {
        self.report();
        if self.last.as_ref().is_some_and(|l| Arc::ptr_eq(l, &view)) {
            return;
        }
        self.last = Some(view.clone());
        let _ = self.updates.send(FleetUpdate {
            epoch: self.epoch,
            fleet: view,
        });
    }
}

/// The `kubernetes` (metadata) watcher: sessions of one [`kube_meta::MetaSource`] through the
/// etcd session driver, with the Pod source's backoff rule (a session that lasted
/// `min(backoff.max, watch_timeout)` from its connect resets it, DISC-K8S-POD-19 via -26) and
/// `connected` kept at 1 through a watch the server ended on time.
#[cfg(feature = "dynamo")]
async fn run_meta_watcher(
    cfg: &continuum_core::config::dynamo::KubernetesConfig,
    reducer: &Mutex<Reducer>,
    views: &mut ViewSender<'_>,
    stats: &Arc<ControlStats>,
    stop: &mut watch::Receiver<bool>,
) {
    let b = cfg.watch_reconnect_backoff;
    let mut backoff = DoublingBackoff::new(b.initial, b.max, b.max.min(cfg.watch_timeout));
    let mut source = kube_meta::MetaSource::new(cfg.clone(), stats.clone());
    loop {
        let started = crate::clock::instant();
        let report_ = {
            let publish = |view: Arc<FleetView>| views.send(view);
            // Only "up" is passed on: how a session ended decides "down" below.
            let connected = |up: bool| {
                if up {
                    stats.discovery_connected.store(1, Ordering::Relaxed);
                }
            };
            tokio::select! {
                r = session::drive_session(&mut source, reducer, publish, connected) => r,
                _ = stop.changed() => return,
            }
        };
        views.report();
        let delay = backoff.session_ended(started.elapsed());
        if report_.end == session::SessionEnd::WatchEnded {
            tracing::debug!(retry_in = ?delay, "metadata watch ended on time; listing both again");
        } else {
            stats.discovery_connected.store(0, Ordering::Relaxed);
            tracing::warn!(
                end = %report_.end,
                healthy_for = ?report_.healthy_for,
                retry_in = ?delay,
                "Kubernetes metadata discovery session ended; full re-list of both after backoff"
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return,
        }
    }
}

/// One session of the plan's source; `None` when the supervisor stopped it.
#[cfg(feature = "dynamo")]
async fn run_session(
    plan: &DiscoveryPlan,
    reducer: &Mutex<Reducer>,
    publish: &mut impl FnMut(Arc<FleetView>),
    stats: &ControlStats,
    stop: &mut watch::Receiver<bool>,
) -> Option<session::SessionReport> {
    match plan {
        DiscoveryPlan::Etcd(cfg) => {
            let mut source = etcd::EtcdSource::new(cfg.clone());
            until_stopped(&mut source, reducer, publish, stats, stop).await
        }
        DiscoveryPlan::File(cfg) => {
            let mut source = file::FileSource::new(cfg.clone());
            until_stopped(&mut source, reducer, publish, stats, stop).await
        }
        // Run by their own watchers, never here.
        DiscoveryPlan::KubernetesPods(_) | DiscoveryPlan::KubernetesMetadata(_) => {
            let _ = stop.changed().await;
            None
        }
    }
}

/// What a pods session reports goes to the control loop and the metrics.
#[cfg(feature = "dynamo")]
struct PodsSink<'a> {
    epoch: u64,
    updates: &'a mpsc::UnboundedSender<FleetUpdate>,
    stats: &'a ControlStats,
    last: Option<Arc<FleetView>>,
}

#[cfg(feature = "dynamo")]
impl kube_pods::PodSink for PodsSink<'_> {
    fn publish(&mut self, view: Arc<FleetView>) {
        if self.last.as_deref() == Some(&*view) {
            return;
        }
        self.last = Some(view.clone());
        let _ = self.updates.send(FleetUpdate {
            epoch: self.epoch,
            fleet: view,
        });
    }

    fn connected(&mut self, up: bool) {
        self.stats
            .discovery_connected
            .store(u64::from(up), Ordering::Relaxed);
    }

    fn count(&mut self, kind: DiscoveryEventKind, n: u64) {
        if n > 0 {
            self.stats.discovery_events[kind_index(kind)].fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// The `kubernetes_pods` watcher: sessions with the shared backoff, reset by a session that
/// lasted `min(backoff.max, watch_timeout)` (DISC-K8S-POD-19); a watch that ended on time keeps
/// `connected` at 1 while the next list runs.
#[cfg(feature = "dynamo")]
async fn run_pods_watcher(
    cfg: &continuum_core::config::dynamo::KubernetesConfig,
    epoch: u64,
    updates: &mpsc::UnboundedSender<FleetUpdate>,
    stats: &ControlStats,
    stop: &mut watch::Receiver<bool>,
) {
    let b = cfg.watch_reconnect_backoff;
    let mut backoff = DoublingBackoff::new(b.initial, b.max, b.max.min(cfg.watch_timeout));
    let mut state = kube_pods::PodsState::default();
    let mut sink = PodsSink {
        epoch,
        updates,
        stats,
        last: None,
    };
    loop {
        let report = tokio::select! {
            r = kube_pods::run_session(cfg, &mut state, &mut sink) => r,
            _ = stop.changed() => return,
        };
        let delay = backoff.session_ended(report.healthy_for);
        if report.end != session::SessionEnd::WatchEnded {
            // Whatever the session got to, it is over (a normal end keeps `connected`).
            stats.discovery_connected.store(0, Ordering::Relaxed);
        }
        if report.end == session::SessionEnd::WatchEnded {
            tracing::debug!(healthy_for = ?report.healthy_for, retry_in = ?delay, "Pod watch ended on time; listing again");
        } else {
            tracing::warn!(
                end = %report.end,
                healthy_for = ?report.healthy_for,
                retry_in = ?delay,
                "Kubernetes Pod discovery session ended; full re-list after backoff"
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return,
        }
    }
}

#[cfg(feature = "dynamo")]
async fn until_stopped<S: session::WatchSource>(
    source: &mut S,
    reducer: &Mutex<Reducer>,
    publish: &mut impl FnMut(Arc<FleetView>),
    stats: &ControlStats,
    stop: &mut watch::Receiver<bool>,
) -> Option<session::SessionReport> {
    tokio::select! {
        r = session::drive_session(
            source,
            reducer,
            publish,
            |c| stats.discovery_connected.store(u64::from(c), Ordering::Relaxed),
        ) => Some(r),
        _ = stop.changed() => None,
    }
}

/// Without the `dynamo` feature no source exists: wait for the stop.
#[cfg(not(feature = "dynamo"))]
async fn run_session(
    plan: &DiscoveryPlan,
    reducer: &Mutex<Reducer>,
    publish: &mut impl FnMut(Arc<FleetView>),
    stats: &ControlStats,
    stop: &mut watch::Receiver<bool>,
) -> Option<session::SessionReport> {
    let _ = (plan, reducer, publish, stats);
    let _ = stop.changed().await;
    None
}
