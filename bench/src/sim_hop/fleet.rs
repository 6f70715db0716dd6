//! The simulated fleet of `sim-hop`: a `continuum_sim::SimFleet` of N
//! aggregated workers started inside the bench process (its own threads),
//! the open-file budget it and the router need, the check that the sim shim
//! accepts the bench's pins for every worker, and per-worker pick counts.
//!
//! Invariants: the fleet answers at once (`LatencyModel::ZERO`) with a small
//! completion, so what is measured is the router, not the simulated engine;
//! the bench process is pinned to the load CPU before the first fleet starts,
//! so the sim's threads inherit that CPU; dropping a [`Sim`] stops the fleet
//! and removes its file store.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use continuum_sim::{LatencyModel, Role, SimFleet, SimSpec};

use crate::error::BenchError;
use crate::shim_load;

/// The simulated Dynamo namespace (one shim).
pub(crate) const NAMESPACE: &str = "sim";
/// The aggregated model every worker serves.
pub(crate) const MODEL: &str = "sim-agg";

/// What went wrong with the simulated fleet or the bench's own process.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SimHopError {
    /// `SimFleet::start` failed.
    #[error("the simulated fleet of {workers} workers did not start: {source}")]
    Start {
        /// Fleet size.
        workers: usize,
        /// Why.
        #[source]
        source: continuum_sim::SimError,
    },
    /// The fleet has no shim for [`NAMESPACE`].
    #[error("the simulated fleet has no shim for namespace {NAMESPACE}")]
    NoShim,
    /// A request pinned by the bench was not answered 200 by the sim shim.
    #[error("the sim shim did not answer a request pinned with {pins} with 200: {detail}")]
    PinnedRequest {
        /// The pin headers.
        pins: String,
        /// The last outcome.
        detail: String,
    },
    /// The bench cannot get enough file descriptors for the fleet.
    #[error(
        "the bench needs about {need} open files for {workers} simulated workers (a listener \
         and the router's connection per kv_metrics publisher, plus wrk and the shim), but its \
         hard RLIMIT_NOFILE is {hard}; raise it (ulimit -Hn) or pass smaller --workers"
    )]
    FdLimit {
        /// Fleet size.
        workers: usize,
        /// Descriptors needed, roughly.
        need: u64,
        /// The hard limit.
        hard: u64,
    },
    /// The bench could not pin itself.
    #[error("pinning the bench (and so the sim) to CPU {cpu}: {source}")]
    Pin {
        /// The CPU.
        cpu: usize,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl From<SimHopError> for crate::error::BenchError {
    fn from(e: SimHopError) -> Self {
        Self::stage(crate::error::Stage::SimHop, e)
    }
}

/// The spec of a fleet of `workers` aggregated workers answering at once
/// with `tokens` completion tokens; `publish` is the periodic `kv_metrics`
/// interval (`None`: on load changes only).
pub(crate) fn spec(workers: usize, tokens: u32, publish: Option<Duration>) -> SimSpec {
    SimSpec::builder()
        .namespace(NAMESPACE)
        .aggregated(MODEL, workers)
        .latency(LatencyModel::ZERO)
        .completion_tokens(tokens)
        .publish_interval(publish)
        .build()
}

/// Descriptors the bench process needs for a fleet of `workers` under
/// `connections` wrk connections: per worker a publisher listener and the
/// router's subscription socket accepted by it, plus the shim's
/// connections (wrk's and the router's upstream ones) and some slack.
pub(crate) fn bench_fds_needed(workers: usize, connections: u32) -> u64 {
    2 * workers as u64 + 4 * u64::from(connections) + 256
}

/// Descriptors the router needs: one per kv_metrics subscription, plus
/// client and upstream connections and its own files.
pub(crate) fn router_fds_needed(workers: usize, connections: u32) -> u64 {
    workers as u64 + 2 * u64::from(connections) + 128
}

/// This process's RLIMIT_NOFILE as (soft, hard).
pub(crate) fn nofile() -> (u64, u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the rlimit we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return (0, 0);
    }
    (r.rlim_cur, r.rlim_max)
}

/// Raises this process's soft RLIMIT_NOFILE to `want` (the sim does the
/// same); errors when the hard limit is below it.
pub(crate) fn ensure_nofile(workers: usize, want: u64) -> Result<(), BenchError> {
    let (soft, hard) = nofile();
    if soft >= want {
        return Ok(());
    }
    if hard < want {
        return Err(SimHopError::FdLimit {
            workers,
            need: want,
            hard,
        }
        .into());
    }
    let r = libc::rlimit {
        rlim_cur: want,
        rlim_max: hard,
    };
    // SAFETY: setrlimit only reads the rlimit we pass.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
        return Err(BenchError::io("raising RLIMIT_NOFILE")(
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Pins the calling thread (the driver's only one, before any fleet starts)
/// to `cpu`; the sim's threads, created later, inherit the mask.
pub(crate) fn pin_self(cpu: usize) -> Result<(), BenchError> {
    // SAFETY: cpu_set_t is a plain bitmask; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= usize::try_from(libc::CPU_SETSIZE).unwrap_or(0) {
        return Err(SimHopError::Pin {
            cpu,
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        }
        .into());
    }
    // SAFETY: `cpu` is below CPU_SETSIZE, so the bit is inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    if unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(SimHopError::Pin {
            cpu,
            source: std::io::Error::last_os_error(),
        }
        .into());
    }
    Ok(())
}

/// A running simulated fleet and what the bench needs of it.
#[derive(Debug)]
pub(crate) struct Sim {
    fleet: SimFleet,
    shim: SocketAddr,
    ids: Vec<u64>,
}

impl Sim {
    /// Starts the fleet of `spec`.
    pub(crate) fn start(spec: SimSpec) -> Result<Self, BenchError> {
        let workers = spec.worker_count();
        let fleet =
            SimFleet::start(spec).map_err(|source| SimHopError::Start { workers, source })?;
        let shim = fleet.shim_addr(NAMESPACE).ok_or(SimHopError::NoShim)?;
        let ids = fleet
            .workers_of(MODEL, Role::Aggregated)
            .iter()
            .map(|w| w.instance_id.get())
            .collect();
        Ok(Self { fleet, shim, ids })
    }

    /// The fleet.
    pub(crate) fn fleet(&self) -> &SimFleet {
        &self.fleet
    }

    /// The shim's address.
    pub(crate) fn shim(&self) -> SocketAddr {
        self.shim
    }

    /// The workers' instance ids, in creation order.
    pub(crate) fn ids(&self) -> &[u64] {
        &self.ids
    }

    /// Requests the shim has served on each worker so far, in [`ids`](Self::ids) order.
    pub(crate) fn picks(&self) -> Vec<u64> {
        let stats = self.fleet.stats();
        self.ids
            .iter()
            .map(|id| {
                stats
                    .iter()
                    .find(|s| s.info.instance_id.get() == *id)
                    .map_or(0, |s| s.picks)
            })
            .collect()
    }

    /// Waits until the shim answers a request pinned with each of `pins`
    /// with 200, so the direct baseline measures successes.
    pub(crate) fn check_direct(
        &self,
        pins: &[Vec<(&'static str, String)>],
        body: &str,
        deadline: Instant,
    ) -> Result<(), BenchError> {
        shim_load::await_pinned(
            self.shim.port(),
            pins,
            body,
            deadline,
            Duration::from_millis(100),
            |pins, detail| SimHopError::PinnedRequest { pins, detail }.into(),
        )
    }
}

/// Element-wise `after - before` of two pick snapshots.
pub(crate) fn delta(after: &[u64], before: &[u64]) -> Vec<u64> {
    after
        .iter()
        .zip(before)
        .map(|(a, b)| a.saturating_sub(*b))
        .collect()
}

/// Element-wise sum into `acc` (grown to fit).
pub(crate) fn accumulate(acc: &mut Vec<u64>, add: &[u64]) {
    if acc.len() < add.len() {
        acc.resize(add.len(), 0);
    }
    for (a, b) in acc.iter_mut().zip(add) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_is_a_zero_latency_aggregated_fleet() {
        let s = spec(1000, 4, None);
        assert!(s.validate().is_ok());
        assert_eq!(s.worker_count(), 1000);
        assert_eq!(s.latency, LatencyModel::ZERO);
        assert_eq!((s.completion_tokens, s.publish_interval), (4, None));
        assert_eq!(s.namespaces[0].name, NAMESPACE);
        assert_eq!(s.namespaces[0].models[0].name, MODEL);
    }

    #[test]
    fn fd_budgets_grow_with_the_fleet() {
        assert_eq!(bench_fds_needed(1000, 8), 2288);
        assert_eq!(router_fds_needed(1000, 8), 1144);
        let (soft, hard) = nofile();
        assert!(soft > 0 && hard >= soft);
        assert!(ensure_nofile(1, 16).is_ok());
    }

    #[test]
    fn pick_deltas_accumulate() {
        let d = delta(&[5, 9, 3], &[1, 9, 4]);
        assert_eq!(d, vec![4, 0, 0]);
        let mut acc = Vec::new();
        accumulate(&mut acc, &d);
        accumulate(&mut acc, &[1, 1, 1]);
        assert_eq!(acc, vec![5, 1, 1]);
    }
}
