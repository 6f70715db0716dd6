//! `continuum-router`: the process entry point.
//!
//! Threads: `main` parses the command line, loads the config, publishes the first snapshot and
//! starts the shards (`shard-N`, pinned per `server.cpu_affinity`) and the control thread
//! (`ctl`); then it waits for the control thread, which returns after a SIGTERM drain.
//!
//! Commands:
//! - `continuum-router --config FILE` (or `run --config FILE`): serve;
//! - `continuum-router demo [--port N] [--workers N]`: serve with an embedded config in front of
//!   an in-process simulated Dynamo fleet on loopback (`continuum_sim`);
//! - `continuum-router config validate --config FILE`: print every error and warning, exit 0
//!   when valid and 1 when not;
//! - `continuum-router config show --config FILE`: print the effective config, secrets masked.

mod cli;
mod config_file;
#[cfg(feature = "demo")]
mod demo;
mod serve;

use std::process::ExitCode;

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CONTINUUM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal as _;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    match cli::parse(std::env::args().skip(1)) {
        Ok(cmd) => cli::execute(cmd),
        Err(e) => {
            eprintln!("error: {e}\n\n{}", cli::USAGE);
            ExitCode::from(2)
        }
    }
}
