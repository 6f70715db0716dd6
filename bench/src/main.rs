//! `continuum-bench`: benchmarks of continuum-router, each reported as a
//! ratio against a baseline measured in the same command.
//!
//! Subcommands: `http-hop` (router hop vs nginx hop, see `hop`), `fleet-hop`
//! (router vs direct-to-frontend on a real Dynamo fleet, see `fleet_hop`),
//! `sim-hop` (the same on the simulated fleet at 10, 100 and 1,000 workers,
//! see `sim_hop`), `soak` (the router at ~80% of its maximum rate for minutes on the simulated
//! fleet while workers join and leave: RSS drift, descriptors, subscriptions, errors; see
//! `soak`), `kv-route` (the router's KV-aware picks against Dynamo's
//! own KV router on a real fleet: cached share, balance, TTFT; see
//! `kv_route`), `aiperf` (NVIDIA's AIPerf through the router vs Dynamo's KV-routing frontend
//! on a real fleet: TTFT, ITL, request latency; see `aiperf`), `resync`
//! (discovery resync time and registry memory, see `resync`), `zmtp-ingest`
//! (the router's kv_metrics SUB path vs the zeromq crate, see `zmtp_ingest`), `bus-relay` (one
//! stream through the event bus listener vs direct TCP, and the listener's memory per idle
//! session and stream, see `bus_relay`), `bus-kv` (kv-events applied to a KV index through the
//! bus vs direct: throughput, event-to-visible latency, broker CPU and memory, see `bus_kv`),
//! `faults` (fault injection on a real fleet under a streaming chat load: workers, frontends and
//! etcd killed, stopped or compacted, reload storms; see `faults`), `pick` (one worker pick at
//! 10, 100 and 1,000 workers vs round-robin, see `pick`), `prompt` (the prompt pipeline per request vs `tokenizers` on the
//! whole prompt, see `prompt`) and `backend` (the fast canned OpenAI-ish backend the hop benchmark
//! spawns).
//! Invariant: the report goes to stdout, progress and diagnostics to
//! stderr; nothing is written outside a temp dir; exit code 0 only if the
//! baseline was measured.
#![allow(clippy::disallowed_methods)] // benchmarks measure wall and CPU time of real processes

mod aiperf;
mod alloc;
mod backend;
mod bus_kv;
mod bus_relay;
mod child;
mod cli;
mod cpu;
mod error;
mod faults;
mod fleet_hop;
mod fleet_rows;
mod hop;
mod hop_run;
mod kv_route;
mod numbers;
mod pick;
mod probe;
mod prompt;
mod report;
mod resync;
mod router_probe;
mod servers;
mod shim_load;
mod signals;
mod sim_hop;
mod soak;
mod tempdir;
mod usage;
mod wrk;
mod zmtp_ingest;

use std::io::Write;
use std::process::ExitCode;

use error::BenchError;

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ BenchError::Usage(_)) => {
            eprintln!("continuum-bench: {e}");
            ExitCode::from(2)
        }
        Err(BenchError::Interrupted) => {
            eprintln!("continuum-bench: interrupted; children stopped, temp dir removed");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("continuum-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), BenchError> {
    match cli::parse(std::env::args().skip(1))? {
        cli::Command::Help => {
            writeln!(std::io::stdout(), "{}", usage::USAGE).map_err(BenchError::io("writing usage"))
        }
        cli::Command::Backend { port } => backend::run(port),
        cli::Command::Resync(opts) => write!(std::io::stdout(), "{}", resync::run(opts))
            .map_err(BenchError::io("writing report")),
        cli::Command::ZmtpIngest(opts) => {
            let report = zmtp_ingest::run(opts)?;
            write!(std::io::stdout(), "{report}").map_err(BenchError::io("writing report"))
        }
        cli::Command::BusRelay(opts) => {
            let report = bus_relay::run(opts)?;
            write!(std::io::stdout(), "{report}").map_err(BenchError::io("writing report"))
        }
        cli::Command::BusKv(opts) => {
            let report =
                bus_kv::run(opts).map_err(|e| BenchError::stage(error::Stage::BusKv, e))?;
            write!(std::io::stdout(), "{report}").map_err(BenchError::io("writing report"))
        }
        cli::Command::Pick(opts) => {
            let report = pick::run(opts)?;
            write!(std::io::stdout(), "{}", report.render())
                .map_err(BenchError::io("writing report"))
        }
        cli::Command::Prompt(opts) => write!(std::io::stdout(), "{}", prompt::run(&opts)?)
            .map_err(BenchError::io("writing report")),
        cli::Command::HttpHop(opts) => {
            signals::install();
            hop::run(&opts)
        }
        cli::Command::FleetHop(opts) => {
            signals::install();
            fleet_hop::run(&opts)
        }
        cli::Command::SimHop(opts) => {
            signals::install();
            sim_hop::run(&opts)
        }
        cli::Command::KvRoute(opts) => {
            signals::install();
            kv_route::run(&opts)
        }
        cli::Command::Soak(opts) => {
            signals::install();
            soak::run(&opts)
        }
        cli::Command::Aiperf(opts) => {
            signals::install();
            aiperf::run(&opts)
        }
        cli::Command::Faults(opts) => {
            signals::install();
            faults::run(&opts)
        }
    }
}
