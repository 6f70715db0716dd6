//! [`SimFleet`]: starts, inspects, thins out and stops a simulated fleet.
//!
//! Role: binds every socket (one PUB listener per worker, one shim listener per namespace),
//! starts the simulator's runtime thread (`sim-rt`, one tokio current-thread runtime serving
//! every publisher, subscriber and shim connection, so 1,000 workers cost tasks, not threads),
//! then registers every worker in the file store (`sim-store` keeps the files alive).
//!
//! Invariants:
//! - a worker's records are written only once its publisher socket is bound, so every
//!   advertised `tcp://` endpoint accepts connections;
//! - ids are unique: worker instance ids have bit 62 set, publisher ids stay below 2^53 (like
//!   Dynamo's), and both count up from a seeded base;
//! - [`SimFleet::kill`] deletes the worker's three files, stops its publisher (closing every
//!   subscriber connection) and makes the shim refuse pins to it; requests already running on it
//!   finish;
//! - dropping the fleet stops the runtime (closing every socket), deletes every file it wrote and,
//!   when the root was a temporary directory of its own, the directory too.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use continuum_core::discovery::{InstanceId, PublisherId, Role};
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::AbortHandle;

use crate::error::SimError;
use crate::publisher::{self, PublishCfg};
use crate::records::{WorkerRecord, component_of};
use crate::shim::{self, Namespace, ShimCfg};
use crate::spec::{SimSpec, Topology};
use crate::store::FileStore;
use crate::worker::{Worker, WorkerInfo, WorkerStats};

/// A running simulated fleet. See the module docs.
#[derive(Debug)]
pub struct SimFleet {
    spec: SimSpec,
    root: PathBuf,
    own_root: bool,
    store: Option<FileStore>,
    workers: Vec<Arc<Worker>>,
    by_id: HashMap<u64, usize>,
    files: Mutex<HashMap<u64, Vec<PathBuf>>>,
    publishers: Mutex<HashMap<u64, AbortHandle>>,
    shims: Vec<(String, SocketAddr)>,
    epoch: Instant,
    shutdown: Option<oneshot::Sender<()>>,
    runtime: Option<JoinHandle<()>>,
}

/// One worker to create.
struct Planned {
    namespace: usize,
    model: String,
    role: Role,
    dp_size: u32,
}

impl SimFleet {
    /// Starts the fleet described by `spec`: sockets, runtime, then registrations.
    pub fn start(spec: SimSpec) -> Result<SimFleet, SimError> {
        spec.validate()?;
        let count = spec.worker_count();
        raise_fd_limit(u64::try_from(count).unwrap_or(u64::MAX).saturating_mul(4) + 256);
        let (root, own_root) = match &spec.root {
            Some(r) => (r.clone(), false),
            None => (temp_root()?, true),
        };
        let epoch = Instant::now();
        let (worker_base, publisher_base) = id_bases(spec.seed.unwrap_or_else(clock_seed));

        let plan = plan(&spec);
        let mut workers = Vec::with_capacity(plan.len());
        let mut pub_listeners = Vec::with_capacity(plan.len());
        for (i, p) in plan.into_iter().enumerate() {
            let listener = bind("a kv_metrics publisher")?;
            let addr = listener
                .local_addr()
                .map_err(SimError::io("reading a publisher address"))?;
            let n = i as u64 + 1;
            let info = WorkerInfo {
                namespace: spec.namespaces[p.namespace].name.clone(),
                component: component_of(p.role).to_owned(),
                model: p.model,
                role: p.role,
                instance_id: InstanceId::new(worker_base + n),
                dp_size: p.dp_size,
                publisher_id: PublisherId::new(publisher_base + n),
                publisher_addr: addr,
            };
            workers.push(Arc::new(Worker::new(info)));
            pub_listeners.push(listener);
        }
        let by_id = workers
            .iter()
            .enumerate()
            .map(|(i, w)| (w.info.instance_id.get(), i))
            .collect();

        let mut shim_listeners = Vec::with_capacity(spec.namespaces.len());
        let mut shims = Vec::with_capacity(spec.namespaces.len());
        for ns in &spec.namespaces {
            let l = bind("the shim")?;
            let addr = l
                .local_addr()
                .map_err(SimError::io("reading the shim address"))?;
            shims.push((ns.name.clone(), addr));
            shim_listeners.push(l);
        }

        let (handle, shutdown, runtime) = start_runtime()?;
        let mut fleet = SimFleet {
            root: root.clone(),
            own_root,
            store: None,
            by_id,
            files: Mutex::default(),
            publishers: Mutex::default(),
            shims,
            epoch,
            shutdown: Some(shutdown),
            runtime: Some(runtime),
            workers,
            spec,
        };
        let cfg = PublishCfg {
            interval: fleet.spec.publish_interval,
            fields: fleet.spec.load_fields,
            epoch,
        };
        {
            let mut pubs = fleet
                .publishers
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for (w, l) in fleet.workers.iter().zip(pub_listeners) {
                let task = handle.spawn(publisher::run(w.clone(), l, cfg));
                pubs.insert(w.info.instance_id.get(), task.abort_handle());
            }
        }
        let shim_cfg = ShimCfg {
            latency: fleet.spec.latency,
            block_size: fleet.spec.block_size,
            completion_tokens: fleet.spec.completion_tokens,
        };
        for (ns, l) in fleet.spec.namespaces.iter().zip(shim_listeners) {
            let state = Namespace {
                name: ns.name.clone(),
                models: ns
                    .models
                    .iter()
                    .map(|m| {
                        let disagg = matches!(m.topology, Topology::Disaggregated { .. });
                        (m.name.clone(), disagg)
                    })
                    .collect(),
                workers: fleet
                    .workers
                    .iter()
                    .filter(|w| w.info.namespace == ns.name)
                    .map(|w| (w.info.instance_id.get(), w.clone()))
                    .collect(),
            };
            handle.spawn(shim::serve(l, Arc::new(state), shim_cfg));
        }

        // Register last: every advertised endpoint is already listening. Each file is recorded
        // as soon as it exists, so a failure part way leaves nothing behind (Drop removes it).
        fleet.store = Some(FileStore::open(&root, fleet.spec.ttl)?);
        for w in &fleet.workers {
            let shim = fleet
                .shim_addr(&w.info.namespace)
                .unwrap_or(w.info.publisher_addr);
            for (key, value) in fleet.records(&w.info, &shim.to_string()) {
                let store = fleet.store.as_ref().ok_or(SimError::Stopped)?;
                let path = store.put(&key, value.as_bytes())?;
                fleet
                    .files
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(w.info.instance_id.get())
                    .or_default()
                    .push(path);
            }
        }
        Ok(fleet)
    }

    /// The three records of `w`, its request plane put at `request_plane`.
    fn records(&self, w: &WorkerInfo, request_plane: &str) -> [(String, String); 3] {
        let endpoint = format!("tcp://{}", w.publisher_addr);
        WorkerRecord {
            namespace: &w.namespace,
            component: &w.component,
            model: &w.model,
            role: w.role,
            instance_id: w.instance_id,
            dp_size: w.dp_size,
            block_size: self.spec.block_size,
            total_kv_blocks: self.spec.total_kv_blocks,
            request_plane,
            publisher_id: w.publisher_id,
            publisher_endpoint: &endpoint,
        }
        .all()
    }

    /// The file-store root (`dynamo.discovery.file.root`, Dynamo's `DYN_FILE_KV`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The spec the fleet was started with.
    pub fn spec(&self) -> &SimSpec {
        &self.spec
    }

    /// Namespaces and their shims' addresses, in spec order.
    pub fn shims(&self) -> &[(String, SocketAddr)] {
        &self.shims
    }

    /// The shim of `namespace`.
    pub fn shim_addr(&self, namespace: &str) -> Option<SocketAddr> {
        self.shims
            .iter()
            .find(|(n, _)| n == namespace)
            .map(|(_, a)| *a)
    }

    /// Every worker (killed ones included), in creation order: namespace, then model, then
    /// prefill before decode.
    pub fn workers(&self) -> Vec<Arc<WorkerInfo>> {
        self.workers.iter().map(|w| w.info.clone()).collect()
    }

    /// The live workers serving `model` in `role`.
    pub fn workers_of(&self, model: &str, role: Role) -> Vec<Arc<WorkerInfo>> {
        self.workers
            .iter()
            .filter(|w| w.alive() && w.info.model == model && w.info.role == role)
            .map(|w| w.info.clone())
            .collect()
    }

    /// Every worker's counters now.
    pub fn stats(&self) -> Vec<WorkerStats> {
        let now = self.epoch.elapsed();
        self.workers.iter().map(|w| w.stats(now)).collect()
    }

    /// Kills worker `id`: its files go, its publisher stops, the shim refuses it.
    pub fn kill(&self, id: InstanceId) -> Result<(), SimError> {
        let w = self
            .by_id
            .get(&id.get())
            .and_then(|i| self.workers.get(*i))
            .ok_or(SimError::NoSuchWorker(id.get()))?;
        if !w.kill() {
            return Err(SimError::NoSuchWorker(id.get()));
        }
        if let Some(task) = self
            .publishers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id.get())
        {
            task.abort();
        }
        let paths = self
            .files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id.get())
            .unwrap_or_default();
        match &self.store {
            Some(store) => store.remove(&paths),
            None => Err(SimError::Stopped),
        }
    }
}

impl Drop for SimFleet {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.runtime.take() {
            let _ = t.join();
        }
        if let Some(store) = self.store.take() {
            let paths: Vec<PathBuf> = self
                .files
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .drain()
                .flat_map(|(_, p)| p)
                .collect();
            let _ = store.remove(&paths);
        }
        if self.own_root {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// The workers of `spec` in creation order.
fn plan(spec: &SimSpec) -> Vec<Planned> {
    let mut out = Vec::with_capacity(spec.worker_count());
    for (n, ns) in spec.namespaces.iter().enumerate() {
        for m in &ns.models {
            let roles: Vec<(Role, usize)> = match m.topology {
                Topology::Aggregated { workers } => vec![(Role::Aggregated, workers)],
                Topology::Disaggregated { prefill, decode } => {
                    vec![(Role::Prefill, prefill), (Role::Decode, decode)]
                }
            };
            for (role, count) in roles {
                out.extend((0..count).map(|_| Planned {
                    namespace: n,
                    model: m.name.clone(),
                    role,
                    dp_size: m.dp_size,
                }));
            }
        }
    }
    out
}

fn bind(what: &str) -> Result<TcpListener, SimError> {
    let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .map_err(SimError::io(format!("binding {what} on 127.0.0.1")))?;
    l.set_nonblocking(true)
        .map_err(SimError::io(format!("making {what} non-blocking")))?;
    Ok(l)
}

/// The runtime thread: a current-thread runtime running until the shutdown signal.
fn start_runtime() -> Result<(Handle, oneshot::Sender<()>, JoinHandle<()>), SimError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(SimError::io("building the simulator runtime"))?;
    let handle = rt.handle().clone();
    let (tx, rx) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("sim-rt".into())
        .spawn(move || {
            let _ = rt.block_on(rx);
            // Dropping the runtime cancels every task and closes every socket.
            drop(rt);
        })
        .map_err(SimError::io("spawning the simulator runtime thread"))?;
    Ok((handle, tx, thread))
}

fn clock_seed() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 40)
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// (worker id base, publisher id base): room for 2^24 workers each.
fn id_bases(seed: u64) -> (u64, u64) {
    let worker = (splitmix(seed) & 0x3fff_ffff_ff00_0000) | (1 << 62);
    let publisher = (splitmix(seed ^ 0x5eed) & 0x000f_ffff_ff00_0000) | (1 << 52);
    (worker, publisher)
}

/// A fresh `$TMPDIR/continuum-sim-<pid>-<n>` directory.
fn temp_root() -> Result<PathBuf, SimError> {
    let base = std::env::temp_dir();
    let seed = clock_seed();
    for n in 0..100u64 {
        let p = base.join(format!(
            "continuum-sim-{}-{:x}",
            std::process::id(),
            splitmix(seed ^ n) & 0xffff_ffff
        ));
        match std::fs::create_dir(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(SimError::store(&p)(e)),
        }
    }
    Err(SimError::Spec(
        "could not create a temporary file-store root".into(),
    ))
}

/// Raises the soft open-file limit to `want` (at most the hard limit): 1,000 workers need a
/// listener each, plus the subscribers' connections.
fn raise_fd_limit(want: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes into the `rlimit` we own and reads nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 || r.rlim_cur >= want {
        return;
    }
    r.rlim_cur = want.min(r.rlim_max);
    // SAFETY: `setrlimit` only reads the `rlimit` we pass.
    let _ = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_bases_keep_ids_apart() {
        for seed in [0, 1, u64::MAX, 0x1234_5678] {
            let (w, p) = id_bases(seed);
            assert!(w >> 62 == 1 && w & 0xff_ffff == 0, "{w:x}");
            assert!(
                (1 << 52..1 << 53).contains(&p) && p & 0xff_ffff == 0,
                "{p:x}"
            );
        }
    }
}
