//! [`SimFleet`]: starts, inspects, grows, thins out and stops a simulated fleet.
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
//! - [`SimFleet::add_worker`] brings a worker in while the fleet runs in the same order as
//!   [`SimFleet::start`]: its publisher listens and the shim accepts pins to it before its
//!   records appear in the file store; its ids continue the fleet's sequences;
//! - dropping the fleet stops the runtime (closing every socket), deletes every file it wrote and,
//!   when the root was a temporary directory of its own, the directory too.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
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
    roster: RwLock<Roster>,
    files: Mutex<HashMap<u64, Vec<PathBuf>>>,
    publishers: Mutex<HashMap<u64, AbortHandle>>,
    shims: Vec<(String, SocketAddr)>,
    /// Each namespace's shim state, in spec order.
    namespaces: Vec<Arc<Namespace>>,
    /// (worker id base, publisher id base).
    id_bases: (u64, u64),
    /// Workers created so far (the next one is number `created + 1` of the sequences).
    created: AtomicU64,
    publish: PublishCfg,
    handle: Handle,
    epoch: Instant,
    shutdown: Option<oneshot::Sender<()>>,
    runtime: Option<JoinHandle<()>>,
}

/// Every worker ever created (killed ones included), in creation order, and by instance id.
#[derive(Debug, Default)]
struct Roster {
    workers: Vec<Arc<Worker>>,
    by_id: HashMap<u64, usize>,
}

/// Worker numbers stay below 2^24 (the room [`id_bases`] leaves in both id sequences).
const MAX_WORKERS: u64 = 1 << 24;

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
        let created = AtomicU64::new(workers.len() as u64);

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
        let publish = PublishCfg {
            interval: spec.publish_interval,
            fields: spec.load_fields,
            epoch,
        };
        let mut fleet = SimFleet {
            root: root.clone(),
            own_root,
            store: None,
            roster: RwLock::new(Roster {
                workers: workers.clone(),
                by_id,
            }),
            files: Mutex::default(),
            publishers: Mutex::default(),
            shims,
            namespaces: Vec::with_capacity(spec.namespaces.len()),
            id_bases: (worker_base, publisher_base),
            created,
            publish,
            handle: handle.clone(),
            epoch,
            shutdown: Some(shutdown),
            runtime: Some(runtime),
            spec,
        };
        {
            let mut pubs = fleet
                .publishers
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for (w, l) in workers.iter().zip(pub_listeners) {
                let task = handle.spawn(publisher::run(w.clone(), l, publish));
                pubs.insert(w.info.instance_id.get(), task.abort_handle());
            }
        }
        let shim_cfg = ShimCfg {
            latency: fleet.spec.latency,
            block_size: fleet.spec.block_size,
            completion_tokens: fleet.spec.completion_tokens,
        };
        for (ns, l) in fleet.spec.namespaces.iter().zip(shim_listeners) {
            let state = Arc::new(Namespace::new(
                ns.name.clone(),
                ns.models
                    .iter()
                    .map(|m| {
                        let disagg = matches!(m.topology, Topology::Disaggregated { .. });
                        (m.name.clone(), disagg)
                    })
                    .collect(),
                workers
                    .iter()
                    .filter(|w| w.info.namespace == ns.name)
                    .cloned(),
            ));
            handle.spawn(shim::serve(l, state.clone(), shim_cfg));
            fleet.namespaces.push(state);
        }

        // Register last: every advertised endpoint is already listening. Each file is recorded
        // as soon as it exists, so a failure part way leaves nothing behind (Drop removes it).
        fleet.store = Some(FileStore::open(&root, fleet.spec.ttl)?);
        for w in &workers {
            fleet.register(&w.info)?;
        }
        Ok(fleet)
    }

    /// Writes `w`'s three records (its request plane at its namespace's shim), recording each
    /// file as soon as it exists.
    fn register(&self, w: &WorkerInfo) -> Result<(), SimError> {
        let shim = self.shim_addr(&w.namespace).unwrap_or(w.publisher_addr);
        for (key, value) in self.records(w, &shim.to_string()) {
            let store = self.store.as_ref().ok_or(SimError::Stopped)?;
            let path = store.put(&key, value.as_bytes())?;
            self.files
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(w.instance_id.get())
                .or_default()
                .push(path);
        }
        Ok(())
    }

    /// Adds one worker serving `model` in `role` to `namespace` while the fleet runs, as a
    /// worker started later joins a real fleet: its `kv_metrics` publisher listens (publishing
    /// like every other worker's), the shim accepts pins to it, then its three records appear
    /// in the file store and are kept alive with the others. Its ids continue the fleet's
    /// sequences; its `dp_size` is the model's.
    ///
    /// Errors: a namespace or model the spec does not have, a role the model's topology has not
    /// (aggregated, or prefill and decode), the id space used up, or a socket or file that
    /// could not be set up (then nothing of the worker is left registered).
    pub fn add_worker(
        &self,
        namespace: &str,
        model: &str,
        role: Role,
    ) -> Result<Arc<WorkerInfo>, SimError> {
        let (ns_index, ns) = self
            .spec
            .namespaces
            .iter()
            .enumerate()
            .find(|(_, n)| n.name == namespace)
            .ok_or_else(|| SimError::Spec(format!("no namespace {namespace:?} in the fleet")))?;
        let m = ns
            .models
            .iter()
            .find(|m| m.name == model)
            .ok_or_else(|| SimError::Spec(format!("no model {model:?} in {namespace:?}")))?;
        let fits = matches!(
            (m.topology, role),
            (Topology::Aggregated { .. }, Role::Aggregated)
                | (Topology::Disaggregated { .. }, Role::Prefill | Role::Decode)
        );
        if !fits {
            return Err(SimError::Spec(format!(
                "model {model:?} has no {role:?} workers"
            )));
        }
        let state = self
            .namespaces
            .get(ns_index)
            .ok_or(SimError::Stopped)?
            .clone();
        if self.store.is_none() {
            return Err(SimError::Stopped);
        }
        let n = self.created.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= MAX_WORKERS {
            return Err(SimError::Spec(format!(
                "the fleet has created {MAX_WORKERS} workers, its id space"
            )));
        }
        let listener = bind("a kv_metrics publisher")?;
        let addr = listener
            .local_addr()
            .map_err(SimError::io("reading a publisher address"))?;
        let (worker_base, publisher_base) = self.id_bases;
        let worker = Arc::new(Worker::new(WorkerInfo {
            namespace: namespace.to_owned(),
            component: component_of(role).to_owned(),
            model: model.to_owned(),
            role,
            instance_id: InstanceId::new(worker_base + n),
            dp_size: m.dp_size,
            publisher_id: PublisherId::new(publisher_base + n),
            publisher_addr: addr,
        }));
        let id = worker.info.instance_id;
        let task = self
            .handle
            .spawn(publisher::run(worker.clone(), listener, self.publish));
        self.publishers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.get(), task.abort_handle());
        {
            let mut r = self.roster.write().unwrap_or_else(PoisonError::into_inner);
            let index = r.workers.len();
            r.workers.push(worker.clone());
            r.by_id.insert(id.get(), index);
        }
        state.join(worker.clone());
        if let Err(e) = self.register(&worker.info) {
            let _ = self.kill(id);
            return Err(e);
        }
        Ok(worker.info.clone())
    }

    /// Requests the shims refused because their pin named a worker that had been killed (the
    /// failures churn causes a router that picked it just before it left), over all namespaces.
    pub fn departed_refusals(&self) -> u64 {
        self.namespaces.iter().map(|n| n.departed_refusals()).sum()
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
    /// prefill before decode; workers added by [`SimFleet::add_worker`] follow.
    pub fn workers(&self) -> Vec<Arc<WorkerInfo>> {
        self.roster()
            .workers
            .iter()
            .map(|w| w.info.clone())
            .collect()
    }

    fn roster(&self) -> std::sync::RwLockReadGuard<'_, Roster> {
        self.roster.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The live workers serving `model` in `role`.
    pub fn workers_of(&self, model: &str, role: Role) -> Vec<Arc<WorkerInfo>> {
        self.roster()
            .workers
            .iter()
            .filter(|w| w.alive() && w.info.model == model && w.info.role == role)
            .map(|w| w.info.clone())
            .collect()
    }

    /// Every worker's counters now.
    pub fn stats(&self) -> Vec<WorkerStats> {
        let now = self.epoch.elapsed();
        self.roster().workers.iter().map(|w| w.stats(now)).collect()
    }

    /// Kills worker `id`: its files go, its publisher stops, the shim refuses it.
    pub fn kill(&self, id: InstanceId) -> Result<(), SimError> {
        let w = {
            let r = self.roster();
            r.by_id
                .get(&id.get())
                .and_then(|i| r.workers.get(*i))
                .cloned()
                .ok_or(SimError::NoSuchWorker(id.get()))?
        };
        if !w.kill() {
            return Err(SimError::NoSuchWorker(id.get()));
        }
        if let Some(ns) = self.namespaces.iter().find(|n| n.name == w.info.namespace) {
            ns.leave(id.get());
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
