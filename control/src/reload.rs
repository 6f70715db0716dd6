//! The control loop: signals, config-file polling, reload and drain.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use continuum_core::config::{Config, EnvLookup};
use continuum_core::publish::SnapshotCell;
use continuum_core::snapshot::RouterSnapshot;
use continuum_shards::metrics::ControlStats;
use continuum_shards::{PickerFactory, ShardSet};
use tokio::signal::unix::{SignalKind, signal};

use crate::artifacts::{KvArtifacts, LoadDone};
use crate::discovery::{self, NotRunnable, Supervisor};
use crate::health::HealthChecks;
use crate::resolve::{Looked, Publishers, resolve_blocking};
use continuum_core::discovery::FleetView;
use continuum_core::load::{LiveSet, LoadStore};
use continuum_core::snapshot::PublisherAddrs;
use continuum_core::subscriptions::ConnectPolicy;
use continuum_core::tls::BackendTlsTable;

/// How often the config file's metadata is checked for a change.
const FILE_POLL: Duration = Duration::from_secs(1);

/// Everything the control thread takes over.
#[derive(Debug)]
pub struct ControlParams {
    /// Config file to watch; `None` for an embedded config (demo), which never reloads.
    pub config_path: Option<PathBuf>,
    /// The config the running snapshot was built from.
    pub config: Arc<Config>,
    /// The file text it was parsed from (to ignore touches that change nothing).
    pub config_text: String,
    /// The publication point.
    pub cell: Arc<SnapshotCell>,
    /// The running shards.
    pub shards: ShardSet,
    /// Counters the control thread writes.
    pub stats: Arc<ControlStats>,
    /// The load store: the control thread sets its live set on every new fleet
    /// (`set_live_and_retain`, LOAD-STORE-15) and its staleness on reload (RELOAD-02).
    pub load_store: Arc<LoadStore>,
    /// Which picker a config asks for (`continuum_shards::picker_for` in the router): on every
    /// applied reload whose answer differs from the active picker, the shards' picker is
    /// replaced before the new snapshot is published (API-06).
    pub picker_for: fn(&Config) -> PickerFactory,
}

/// Why the control thread returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReason {
    /// SIGTERM or SIGINT; every shard drained in time.
    Drained,
    /// SIGTERM or SIGINT; some shard was still busy at the deadline.
    DrainTimedOut,
}

/// The control thread could not start.
#[derive(Debug, thiserror::Error)]
pub enum ControlRunError {
    /// The OS refused the thread.
    #[error("cannot spawn the control thread: {0}")]
    Spawn(std::io::Error),
    /// The tokio runtime or a signal handler could not be set up.
    #[error("cannot start the control runtime: {0}")]
    Runtime(std::io::Error),
}

/// The control runtime with its signal handlers installed, built before any shard serves so a
/// signal that arrives the moment the router is reachable is never lost to the default action.
#[derive(Debug)]
pub struct Prepared {
    rt: tokio::runtime::Runtime,
    signals: Signals,
}

#[derive(Debug)]
struct Signals {
    hup: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

/// Build the control runtime and install the SIGHUP/SIGTERM/SIGINT handlers. Call before the
/// shards start.
pub fn prepare() -> Result<Prepared, ControlRunError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ControlRunError::Runtime)?;
    let signals = {
        let _guard = rt.enter();
        Signals {
            hup: signal(SignalKind::hangup()).map_err(ControlRunError::Runtime)?,
            term: signal(SignalKind::terminate()).map_err(ControlRunError::Runtime)?,
            int: signal(SignalKind::interrupt()).map_err(ControlRunError::Runtime)?,
        }
    };
    Ok(Prepared { rt, signals })
}

/// Start the control thread on a [`prepare`]d runtime. Join the handle to wait for the drain.
pub fn spawn(
    prepared: Prepared,
    params: ControlParams,
    cpu: Option<usize>,
) -> Result<std::thread::JoinHandle<Result<ExitReason, ControlRunError>>, ControlRunError> {
    std::thread::Builder::new()
        .name("ctl".into())
        .spawn(move || {
            if let Some(cpu) = cpu
                && let Err(e) = pin(cpu)
            {
                tracing::warn!(cpu, error = %e, "cannot pin the control thread");
            }
            let Prepared { rt, signals } = prepared;
            rt.block_on(run(params, signals))
        })
        .map_err(ControlRunError::Spawn)
}

/// Pin through the shards crate's helper, the one place that holds the `unsafe` libc call.
fn pin(cpu: usize) -> std::io::Result<()> {
    continuum_shards::pin_current_thread(cpu)
}

struct EnvVars;

impl EnvLookup for EnvVars {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
}

async fn file_stamp(path: &PathBuf) -> Option<FileStamp> {
    let m = tokio::fs::metadata(path).await.ok()?;
    Some(FileStamp {
        modified: m.modified().ok(),
        len: m.len(),
    })
}

struct State {
    params: ControlParams,
    stamp: Option<FileStamp>,
    /// Resolved backend addresses of the running config.
    addrs: Vec<Option<std::net::SocketAddr>>,
    /// The TLS contexts of the running config's https backends.
    tls: BackendTlsTable,
    /// The latest fleet view from discovery (empty when off).
    fleet: Arc<FleetView>,
    /// Resolved, policy-checked addresses of the fleet's admitted publishers.
    publisher_addrs: Arc<PublisherAddrs>,
    discovery: Supervisor,
    /// The active health checks of the running snapshot's backends.
    health: HealthChecks,
    /// The publishers' addresses and their lookups (in the background).
    publishers: Publishers,
    /// The KV supervisor: per-model prompt pipelines, loaded in the background.
    kv: KvArtifacts,
    /// The event bus listener (started, reconfigured and retried here; BUS-31, BUS-32).
    bus: crate::bus::BusSupervisor,
}

impl State {
    /// Build and publish the next snapshot from the running config, addresses and fleet; then
    /// ring every shard.
    fn publish(&mut self) -> u64 {
        let generation = self.params.cell.generation() + 1;
        // Backends that stay (same name and address) keep their health (ejections, verdicts).
        let previous = self.params.cell.load();
        self.params.cell.publish(
            RouterSnapshot::build(
                generation,
                self.params.config.clone(),
                self.addrs.clone(),
                self.tls.clone(),
                self.fleet.clone(),
                self.publisher_addrs.clone(),
                Some(&previous),
            )
            .with_load_slots(&self.params.load_store.view())
            .with_prompts(self.kv.table()),
        );
        self.params.shards.reload_all();
        self.params
            .stats
            .generation
            .store(generation, Ordering::Relaxed);
        self.health.reconcile(&self.params.cell.load());
        generation
    }

    /// Replace the shards' picker when the running config asks for another one (API-06).
    fn select_picker(&mut self) {
        let params = &mut self.params;
        select_picker(&mut params.shards, &params.config, params.picker_for);
    }

    /// Admit exactly the fleet's live (worker, rank) keys to the load store and drop departed
    /// workers' samples and gauge series in the same step (LOAD-STORE-15).
    fn retain_live(&self) {
        let report = self
            .params
            .load_store
            .set_live_and_retain(&LiveSet::from_fleet(&self.fleet));
        tracing::debug!(?report, "load store live set updated");
    }

    /// The fleet's publishers' addresses from what is known now (CFG-20); host names not
    /// looked up yet follow when their lookups end. Returns whether the addresses changed.
    fn refresh_publishers(&mut self) -> bool {
        let policy = ConnectPolicy::new(self.params.config.dynamo.load.direct_allow_cidrs.clone());
        let next = self.publishers.refresh(&self.fleet, &policy);
        if next == *self.publisher_addrs {
            return false;
        }
        self.publisher_addrs = Arc::new(next);
        true
    }

    /// Start, stop or restart discovery for the running config. Returns whether the fleet was
    /// cleared (and so needs publishing).
    fn reconcile_discovery(&mut self, boot: bool) -> bool {
        let plan = match discovery::plan_for(&self.params.config) {
            Ok(p) => p,
            Err(NotRunnable::FeatureMissing) => {
                tracing::warn!(
                    "dynamo.enabled is set but this binary was built without the `dynamo` feature: discovery is disabled"
                );
                None
            }
            Err(NotRunnable::MissingSetting(field)) => {
                tracing::warn!(field, "discovery needs this setting: discovery is disabled");
                None
            }
        };
        let clear = self.discovery.reconcile(plan, boot);
        if clear && !self.fleet.workers.is_empty() {
            self.fleet = Arc::new(FleetView::default());
            return true;
        }
        false
    }
}

/// Replace `shards`' picker when `config` asks for another one than the active one (API-06).
/// The mailbox delivers the replacement before the next snapshot's `Reload`, so the first
/// request of the new config already picks with it. Returns whether it replaced the picker.
fn select_picker(
    shards: &mut ShardSet,
    config: &Config,
    picker_for: fn(&Config) -> PickerFactory,
) -> bool {
    let want = picker_for(config);
    if want.same_as(shards.picker()) {
        return false;
    }
    let active = shards.picker().name();
    tracing::info!(
        from = active,
        to = want.name(),
        "replacing the worker picker"
    );
    shards.set_picker(want);
    true
}

async fn run(params: ControlParams, signals: Signals) -> Result<ExitReason, ControlRunError> {
    let Signals {
        mut hup,
        mut term,
        mut int,
    } = signals;
    params
        .stats
        .generation
        .store(params.cell.generation(), Ordering::Relaxed);
    // No baseline stamp: the first poll compares the file's text with the text the running
    // config came from, so an edit made while the router was starting is not missed.
    let (updates_tx, mut updates) = tokio::sync::mpsc::unbounded_channel();
    let (looked_tx, mut looked) = tokio::sync::mpsc::unbounded_channel::<Looked>();
    let (loaded_tx, mut loaded) = tokio::sync::mpsc::unbounded_channel::<LoadDone>();
    let discovery = Supervisor::new(updates_tx, params.stats.clone());
    let kv = KvArtifacts::new(loaded_tx, params.stats.clone());
    let bus_metrics = params.stats.bus.clone();
    let (addrs, tls) = {
        let first = params.cell.load();
        (first.backend_addrs.clone(), first.backend_tls.clone())
    };
    let mut st = State {
        params,
        stamp: None,
        addrs,
        tls,
        fleet: Arc::new(FleetView::default()),
        publisher_addrs: Arc::default(),
        discovery,
        health: HealthChecks::default(),
        publishers: Publishers::new(looked_tx),
        kv,
        bus: crate::bus::BusSupervisor::new(bus_metrics),
    };
    st.health.reconcile(&st.params.cell.load());
    st.reconcile_discovery(true);
    st.bus.reconcile(&st.params.config);
    let mut poll = tokio::time::interval(FILE_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The running listener's broker sessions: every change wakes the shards' pending broker
    // subscriptions (BROKER-06/07).
    let mut bus_sessions: Option<tokio::sync::watch::Receiver<u64>> = None;
    loop {
        if let Some(next) = st.bus.hand_to(&st.params.shards) {
            bus_sessions = next;
        }
        tokio::select! {
            () = sessions_changed(&mut bus_sessions) => st.params.shards.broker_sessions_changed(),
            _ = hup.recv() => {
                tracing::info!("SIGHUP: reloading config");
                reload(&mut st, Trigger::Signal).await;
            }
            _ = poll.tick() => {
                if let Some(p) = &st.params.config_path {
                    let now = file_stamp(p).await;
                    if now.is_some() && now != st.stamp {
                        st.stamp = now;
                        reload(&mut st, Trigger::FileChanged).await;
                    }
                }
            }
            Some(update) = updates.recv() => {
                if st.discovery.epoch() == Some(update.epoch) && !Arc::ptr_eq(&update.fleet, &st.fleet) {
                    st.fleet = update.fleet;
                    st.retain_live();
                    st.refresh_publishers();
                    st.kv.refresh(&st.fleet, &st.params.config.dynamo.kv);
                    let generation = st.publish();
                    tracing::debug!(generation, workers = st.fleet.workers.len(), "fleet view published");
                }
            }
            Some(round) = looked.recv() => {
                if st.publishers.absorb(round) && st.refresh_publishers() {
                    let generation = st.publish();
                    tracing::debug!(generation, unresolved = st.publishers.unresolved(), "publisher lookups done: addresses published");
                }
            }
            Some(done) = loaded.recv() => {
                let result = st.kv.absorb(done);
                if st.kv.refresh(&st.fleet, &st.params.config.dynamo.kv) {
                    let generation = st.publish();
                    tracing::info!(generation, "prompt pipelines published");
                }
                // Counted once published: `loaded` in the metrics means the shards have it.
                st.kv.count(result);
            }
            _ = sleep_until_opt(st.kv.retry_at().map(|at| tokio::time::Instant::from_std(crate::clock::to_std(at)))) => {
                if st.kv.refresh(&st.fleet, &st.params.config.dynamo.kv) {
                    st.publish();
                }
            }
            _ = sleep_until_opt(st.bus.retry_at()) => st.bus.reconcile(&st.params.config),
            _ = sleep_until_opt(st.publishers.retry_at()) => {
                st.publishers.retry_failed();
                if st.refresh_publishers() {
                    st.publish();
                }
            }
            _ = term.recv() => return Ok(drain(st, "SIGTERM").await),
            _ = int.recv() => return Ok(drain(st, "SIGINT").await),
        }
    }
}

/// Resolves when the watched sessions change; never without a listener (or once it is gone).
async fn sessions_changed(sessions: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    if let Some(rx) = sessions {
        if rx.changed().await.is_ok() {
            return;
        }
        *sessions = None;
    }
    std::future::pending::<()>().await;
}

/// Sleep until `at`; never, when `None`.
async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    Signal,
    FileChanged,
}

async fn reload(st: &mut State, trigger: Trigger) {
    let Some(path) = st.params.config_path.clone() else {
        tracing::info!("embedded config: nothing to reload");
        return;
    };
    let stats = &st.params.stats;
    let text = match tokio::fs::read_to_string(&path).await {
        Ok(t) => t,
        Err(e) => {
            stats.reloads_rejected.fetch_add(1, Ordering::Relaxed);
            tracing::error!(path = %path.display(), error = %e, "config reload rejected: cannot read file; keeping the running config");
            return;
        }
    };
    if trigger == Trigger::FileChanged && text == st.params.config_text {
        return;
    }
    let crate::build::Loaded { config, tls, .. } = match crate::build::load_config(&text, &EnvVars)
    {
        Ok(l) => {
            for w in &l.warnings {
                tracing::warn!(%w, "config warning");
            }
            l
        }
        Err(errors) => {
            stats.reloads_rejected.fetch_add(1, Ordering::Relaxed);
            for e in &errors.errors {
                tracing::error!(%e, "config error");
            }
            tracing::error!(
                errors = errors.errors.len(),
                "config reload rejected; keeping the running config"
            );
            return;
        }
    };
    report_restart_only(&st.params.config, &config);
    let config = Arc::new(config);
    let for_resolve = config.clone();
    let addrs = match tokio::task::spawn_blocking(move || resolve_blocking(&for_resolve)).await {
        Ok(a) => a,
        Err(_) => vec![None; config.backends.len()],
    };
    st.params.config = config;
    st.params.config_text = text;
    st.addrs = addrs;
    st.tls = tls;
    st.select_picker();
    if st.reconcile_discovery(false) {
        st.retain_live();
    }
    st.bus.reconcile(&st.params.config);
    if let Err(e) = st
        .params
        .load_store
        .set_max_staleness(st.params.config.dynamo.load.max_staleness)
    {
        tracing::warn!(error = %e, "load.max_staleness not applied");
    }
    // RELOAD-03: a new connect policy re-checks every publisher (from the addresses already
    // found: no lookup); the shards restart exactly the subscriptions whose decision changed.
    st.refresh_publishers();
    st.kv.refresh(&st.fleet, &st.params.config.dynamo.kv);
    let generation = st.publish();
    st.params
        .stats
        .reloads_applied
        .fetch_add(1, Ordering::Relaxed);
    tracing::info!(generation, "config reload applied");
}

fn report_restart_only(old_config: &Config, new_config: &Config) {
    let (old, new) = (&old_config.server, &new_config.server);
    let fields = [
        ("server.bind_address", old.bind_address != new.bind_address),
        ("server.shards", old.shards != new.shards),
        ("server.cpu_affinity", old.cpu_affinity != new.cpu_affinity),
        ("server.control_cpu", old.control_cpu != new.control_cpu),
        (
            "dynamo.peers",
            old_config.dynamo.peers != new_config.dynamo.peers,
        ),
    ];
    for (field, changed) in fields {
        if changed {
            tracing::warn!(
                field,
                "changed in the config file but needs a restart; the running value stays"
            );
        }
    }
}

async fn drain(mut st: State, why: &str) -> ExitReason {
    st.discovery.shutdown().await;
    let params = st.params;
    let timeout = params.config.server.drain_timeout;
    tracing::info!(
        signal = why,
        ?timeout,
        "draining: no new connections, finishing in-flight requests"
    );
    if params.shards.drain(crate::clock::instant() + timeout) {
        tracing::info!("drained");
        ExitReason::Drained
    } else {
        tracing::warn!("drain deadline passed with requests still in flight");
        ExitReason::DrainTimedOut
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use continuum_core::config::{Config, NoEnv};
    use continuum_core::discovery::FleetView;
    use continuum_core::load::LoadStore;
    use continuum_core::picker::LoadBasedPicker;
    use continuum_core::publish::SnapshotCell;
    use continuum_core::snapshot::RouterSnapshot;
    use continuum_shards::metrics::ControlStats;
    use continuum_shards::runtime::DriverChoice;
    use continuum_shards::{PickerFactory, ShardSpec, load_based_picker, spawn_shards};

    use super::select_picker;

    static BUILT: AtomicU64 = AtomicU64::new(0);

    /// A test mapping: `connect_retries: 7` asks for the "counted" picker, anything else for the
    /// default (the router's own mapping is `continuum_shards::picker_for`).
    fn picker_for(config: &Config) -> PickerFactory {
        if config.server.connect_retries == 7 {
            PickerFactory::new("counted", |_env| {
                BUILT.fetch_add(1, Ordering::Relaxed);
                Box::new(LoadBasedPicker::new())
            })
        } else {
            load_based_picker()
        }
    }

    fn config(retries: u32) -> Config {
        let yaml = format!(
            "server:\n  bind_address: \"127.0.0.1:0\"\n  shards: 2\n  connect_retries: {retries}\n\
             backends: []\n"
        );
        Config::from_yaml(&yaml, &NoEnv).unwrap().0
    }

    #[test]
    fn a_reload_that_asks_for_another_picker_replaces_it_on_every_shard() {
        let first = config(1);
        let cell = Arc::new(SnapshotCell::new(RouterSnapshot::build(
            1,
            Arc::new(first.clone()),
            Vec::new(),
            Arc::default(),
            Arc::new(FleetView::default()),
            Arc::default(),
            None,
        )));
        let spec = ShardSpec {
            bind: first.server.bind_address,
            cpus: vec![None, None],
            driver: DriverChoice::Best,
            picker: picker_for(&first),
            peers: Default::default(),
        };
        let stats = Arc::new(ControlStats::default());
        let mut shards = spawn_shards(&spec, cell, stats, Arc::new(LoadStore::new())).unwrap();
        // The same answer: nothing is replaced.
        assert!(!select_picker(&mut shards, &config(1), picker_for));
        assert_eq!(shards.picker().name(), "load_based");
        // A config that asks for another picker: every shard builds one.
        assert!(select_picker(&mut shards, &config(7), picker_for));
        assert_eq!(shards.picker().name(), "counted");
        let deadline = crate::clock::instant() + std::time::Duration::from_secs(10);
        while BUILT.load(Ordering::Relaxed) < 2 {
            assert!(
                crate::clock::instant() < deadline,
                "both shards build the new picker"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // Reloading the same choice again rebuilds nothing.
        assert!(!select_picker(&mut shards, &config(7), picker_for));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(BUILT.load(Ordering::Relaxed), 2);
        // And back.
        assert!(select_picker(&mut shards, &config(1), picker_for));
        assert_eq!(shards.picker().name(), "load_based");
        assert!(shards.drain(crate::clock::instant() + std::time::Duration::from_secs(2)));
    }
}
