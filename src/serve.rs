//! Starting the router: config → first snapshot → shards → control thread → wait for drain.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use continuum_control::{ControlParams, ExitReason, Loaded};
use continuum_core::config::{Config, ShardCount, report};
use continuum_core::discovery::FleetView;
use continuum_core::load::LoadStore;
use continuum_core::publish::SnapshotCell;
use continuum_core::snapshot::RouterSnapshot;
use continuum_shards::metrics::ControlStats;
use continuum_shards::runtime::DriverChoice;
use continuum_shards::{ShardSpec, spawn_shards};

use crate::config_file::{ProcessEnv, read};

/// Serve from a config file.
pub(crate) fn run_file(path: &Path) -> ExitCode {
    let text = match read(path) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let loaded = match continuum_control::load_config(&text, &ProcessEnv) {
        Ok(l) => {
            for w in &l.warnings {
                tracing::warn!(%w, "config warning");
            }
            l
        }
        Err(e) => {
            eprint!("{}", report::render_lines(&e.errors, &e.warnings));
            eprintln!("error: {} is invalid; not starting", path.display());
            return ExitCode::from(1);
        }
    };
    match start(loaded, text, Some(path.to_path_buf()), |_| {}) {
        Ok(ExitReason::Drained) => ExitCode::SUCCESS,
        Ok(ExitReason::DrainTimedOut) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::from(1)
        }
    }
}

/// Start shards and control for `config`; `on_ready` sees the listening address. Blocks until
/// the control thread returns.
pub(crate) fn start(
    Loaded { config, tls, .. }: Loaded,
    text: String,
    path: Option<std::path::PathBuf>,
    on_ready: impl FnOnce(std::net::SocketAddr),
) -> Result<ExitReason, String> {
    match continuum_shards::limits::raise_open_files_limit() {
        Ok(l) if l.after < 4096 => tracing::warn!(
            soft = l.after,
            hard = l.hard,
            "open-files limit is low: each kv_metrics publisher, client and upstream connection \
             holds a descriptor; raise the hard limit (LimitNOFILE) for large fleets"
        ),
        Ok(l) => tracing::info!(before = l.before, now = l.after, "open-files limit"),
        Err(e) => tracing::warn!(error = %e, "cannot read or raise the open-files limit"),
    }
    let config = Arc::new(config);
    let addrs = continuum_control::resolve_blocking(&config);
    let cell = Arc::new(SnapshotCell::new(RouterSnapshot::build(
        1,
        config.clone(),
        addrs,
        tls,
        Arc::new(FleetView::default()),
        Arc::default(),
        None,
    )));
    let stats = Arc::new(ControlStats::default());
    stats
        .generation
        .store(1, std::sync::atomic::Ordering::Relaxed);
    // Signal handlers go in before any shard serves.
    let prepared = continuum_control::prepare().map_err(|e| e.to_string())?;
    let spec = ShardSpec {
        bind: config.server.bind_address,
        cpus: shard_cpus(&config),
        driver: DriverChoice::from_env_value(std::env::var("CONTINUUM_DRIVER").ok().as_deref()),
        picker: continuum_shards::picker_for(&config),
        peers: config.dynamo.peers.clone(),
    };
    let load_store = Arc::new(LoadStore::new());
    if let Err(e) = load_store.set_max_staleness(config.dynamo.load.max_staleness) {
        tracing::warn!(error = %e, "load.max_staleness not applied");
    }
    let shards = spawn_shards(&spec, cell.clone(), stats.clone(), load_store.clone())
        .map_err(|e| e.to_string())?;
    tracing::info!(
        addr = %shards.local_addr,
        shards = shards.drivers.len(),
        drivers = ?shards.drivers,
        "listening on http://{}", shards.local_addr
    );
    on_ready(shards.local_addr);
    let control_cpu = config.server.control_cpu;
    let params = ControlParams {
        config_path: path,
        config,
        config_text: text,
        cell,
        shards,
        stats,
        load_store,
        picker_for: continuum_shards::picker_for,
    };
    let handle =
        continuum_control::spawn(prepared, params, control_cpu).map_err(|e| e.to_string())?;
    match handle.join() {
        Ok(Ok(reason)) => Ok(reason),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the control thread panicked".into()),
    }
}

/// CPU of each shard: `shards: N` shards over `cpu_affinity` round robin (unpinned when empty);
/// `auto` is one shard per affinity CPU, or per available CPU when none is given.
fn shard_cpus(config: &Config) -> Vec<Option<usize>> {
    let s = &config.server;
    let count = match s.shards {
        ShardCount::Fixed(n) => n.get(),
        ShardCount::Auto if !s.cpu_affinity.is_empty() => s.cpu_affinity.len(),
        ShardCount::Auto => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    (0..count)
        .map(|i| {
            if s.cpu_affinity.is_empty() {
                None
            } else {
                s.cpu_affinity.get(i % s.cpu_affinity.len()).copied()
            }
        })
        .collect()
}
