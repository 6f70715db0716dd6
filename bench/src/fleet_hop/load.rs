//! One measured wrk run of `fleet-hop`, with the CPU of the router, the
//! frontend, the mocker workers, wrk and the rest of the machine sampled
//! around it, and the direct pins of the fleet's workers. The request and the
//! Lua scripts are [`crate::shim_load`]'s.
//!
//! Invariants: CPU is read from `/proc` just before and just after the
//! measured run, never during it; the warm-up run is never measured.

use std::time::Instant;

use super::fleet::Worker;
use super::report::Sample;
use crate::cpu::{self, CpuTime};
use crate::error::BenchError;
use crate::shim_load::{self, Path};
use crate::tempdir::TempDir;
use crate::wrk::WrkRun;

/// The pin headers of each direct request variant, one per worker.
pub(crate) fn direct_pins(workers: &[Worker]) -> Vec<Vec<(&'static str, String)>> {
    shim_load::decimal_pins(workers.iter().map(|w| w.instance_id))
}

/// The processes whose CPU a run samples.
#[derive(Debug, Clone)]
pub(crate) struct Pids {
    /// The router, if it runs.
    pub(crate) router: Option<i32>,
    /// The frontend.
    pub(crate) frontend: i32,
    /// The mocker workers.
    pub(crate) workers: Vec<i32>,
}

/// CPU of every sampled process at one instant.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    router: CpuTime,
    frontend: CpuTime,
    workers: CpuTime,
    machine: CpuTime,
    reaped: CpuTime,
}

impl Pids {
    fn snapshot(&self) -> Result<Snapshot, BenchError> {
        let mut workers = CpuTime::default();
        for &pid in &self.workers {
            let t = cpu::tree(pid)?;
            workers.user += t.user;
            workers.system += t.system;
        }
        Ok(Snapshot {
            router: self.router.map(cpu::tree).transpose()?.unwrap_or_default(),
            frontend: cpu::tree(self.frontend)?,
            workers,
            machine: cpu::machine_busy()?,
            reaped: cpu::reaped_children(),
        })
    }
}

/// Runs `run` for `warmup_secs` unmeasured (if > 0), then for `secs`
/// measured, sampling CPU around the measured run.
pub(crate) fn measure(
    mut run: WrkRun<'_>,
    warmup_secs: u64,
    secs: u64,
    dir: &TempDir,
    pids: &Pids,
    path: Path,
    round: u32,
) -> Result<Sample, BenchError> {
    if warmup_secs > 0 {
        run.secs = warmup_secs;
        run.run(dir)?;
    }
    run.secs = secs;
    let before = pids.snapshot()?;
    let t0 = Instant::now();
    let wrk = run.run(dir)?;
    let elapsed = t0.elapsed().as_secs_f64();
    let after = pids.snapshot()?;
    let router_cpu = after.router.since(before.router);
    let frontend_cpu = after.frontend.since(before.frontend);
    let workers_cpu = after.workers.since(before.workers);
    let wrk_cpu = after.reaped.since(before.reaped);
    let other = cpu::rest(
        after.machine.since(before.machine),
        &[router_cpu, frontend_cpu, workers_cpu, wrk_cpu],
    );
    Ok(Sample {
        path,
        round,
        wrk,
        elapsed,
        router_cpu,
        router_ran: pids.router.is_some(),
        frontend_cpu,
        workers_cpu,
        wrk_cpu,
        other_cpu: other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_pins_follow_the_fleet_order() {
        let pins = direct_pins(&[
            Worker {
                instance_id: 545_958_299_087_899_693,
                pid: 1,
            },
            Worker {
                instance_id: 7,
                pid: 2,
            },
        ]);
        assert_eq!(pins.len(), 2);
        assert_eq!(
            pins[0],
            vec![
                (shim_load::WORKER_PIN, "545958299087899693".to_owned()),
                (shim_load::DP_RANK_PIN, "0".to_owned())
            ]
        );
        assert_eq!(pins[1][0].1, "7");
    }
}
