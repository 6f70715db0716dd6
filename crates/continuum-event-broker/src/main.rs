//! `continuum-event-broker`: the in-cluster event broker's process.
//!
//! ```text
//! continuum-event-broker --config FILE                   run until SIGTERM/SIGINT (then drain)
//! continuum-event-broker config validate --config FILE   report every problem, exit 1 if any
//! ```
//!
//! The token comes from `router.token_file` or `$CONTINUUM_BROKER_TOKEN`, never from the command
//! line (where `ps` would show it). Exit status: 0 after a drain, 1 on a config or start error, 2
//! on a usage error.

use std::process::ExitCode;
use std::sync::Arc;

use continuum_core::config::EnvLookup;
use continuum_core::config::report::render_lines;
use continuum_event_broker::config::{BrokerConfig, parse};
use continuum_event_broker::{BrokerStats, daemon};

const USAGE: &str = "usage:
  continuum-event-broker --config FILE
  continuum-event-broker config validate --config FILE";

struct ProcessEnv;

impl EnvLookup for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

enum Command {
    Run(String),
    Validate(String),
}

fn command(args: &[String]) -> Option<Command> {
    match args {
        [flag, file] if flag == "--config" => Some(Command::Run(file.clone())),
        [c, v, flag, file] if c == "config" && v == "validate" && flag == "--config" => {
            Some(Command::Validate(file.clone()))
        }
        _ => None,
    }
}

fn load(path: &str) -> Result<(BrokerConfig, String), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}\n"))?;
    match parse(&text, &ProcessEnv, &|f| std::fs::read_to_string(f)) {
        Ok((config, warnings)) => Ok((config, render_lines(&[], &warnings))),
        Err(errors) => Err(render_lines(&errors, &[])),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = command(&args) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    match cmd {
        Command::Validate(path) => match load(&path) {
            Ok((_, warnings)) => {
                eprint!("{warnings}");
                ExitCode::SUCCESS
            }
            Err(report) => {
                eprint!("{report}");
                ExitCode::FAILURE
            }
        },
        Command::Run(path) => {
            let (config, warnings) = match load(&path) {
                Ok(c) => c,
                Err(report) => {
                    eprint!("{report}");
                    return ExitCode::FAILURE;
                }
            };
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .with_writer(std::io::stderr)
                .init();
            for w in warnings.lines() {
                tracing::warn!("config {w}");
            }
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(serve(config)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn serve(config: BrokerConfig) -> Result<(), daemon::StartError> {
    let stats = Arc::new(BrokerStats::default());
    let dial = daemon::dial(&config)?;
    if let Some(addr) = config.metrics_listen {
        daemon::serve_metrics(addr, stats.clone()).await?;
    }
    let advertised = daemon::discover(&config, stats.clone())?;
    let drain = daemon::drain_on_signals();
    tracing::info!(
        id = %config.id,
        router = %config.address,
        namespaces = ?config.namespaces,
        "event broker started"
    );
    continuum_event_broker::run(dial, advertised, drain, stats).await;
    tracing::info!("drained; exiting");
    Ok(())
}
