//! Command-line parsing and the `config` subcommands.
//!
//! This is the one module that writes to stdout: its output is the command's result.

use std::path::PathBuf;
use std::process::ExitCode;

use continuum_core::config::report;

use crate::config_file::{ProcessEnv, read};

/// Usage text.
pub(crate) const USAGE: &str = "usage:
  continuum-router --config FILE            serve (also: run --config FILE)
  continuum-router demo [--port N] [--workers N]
                                            serve in front of a simulated Dynamo fleet on loopback
                                            (N aggregated workers, default 3)
  continuum-router config validate --config FILE
  continuum-router config show --config FILE
  continuum-router version                  the version and the features this binary was built with";

/// Most aggregated workers `demo --workers` accepts (the router subscribes to at most 1,024
/// publishers per family; more still register and serve).
pub(crate) const MAX_DEMO_WORKERS: usize = 10_000;

/// A parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Command {
    Run { config: PathBuf },
    Demo { port: u16, workers: usize },
    Validate { config: PathBuf },
    Show { config: PathBuf },
    Version,
    Help,
}

/// A command-line error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CliError {
    #[error("missing --config FILE")]
    MissingConfig,
    #[error("unexpected argument `{0}`")]
    Unexpected(String),
    #[error("--port needs a number from 1 to 65535")]
    BadPort,
    #[error("--workers needs a number from 1 to {MAX_DEMO_WORKERS}")]
    BadWorkers,
}

/// Parse the arguments after the program name.
pub(crate) fn parse(args: impl Iterator<Item = String>) -> Result<Command, CliError> {
    let args: Vec<String> = args.collect();
    let mut words = Vec::new();
    let mut config = None;
    let mut port = None;
    let mut workers = None;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--config" | "-c" => {
                config = args.get(i + 1).map(PathBuf::from);
                i += 1;
            }
            "--port" => {
                let p = args
                    .get(i + 1)
                    .and_then(|p| p.parse::<u16>().ok())
                    .filter(|p| *p > 0);
                port = Some(p.ok_or(CliError::BadPort)?);
                i += 1;
            }
            "--workers" => {
                let n = args
                    .get(i + 1)
                    .and_then(|n| n.parse::<usize>().ok())
                    .filter(|n| (1..=MAX_DEMO_WORKERS).contains(n));
                workers = Some(n.ok_or(CliError::BadWorkers)?);
                i += 1;
            }
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            w if w.starts_with("--config=") => config = Some(PathBuf::from(&w[9..])),
            w => words.push(w.to_string()),
        }
        i += 1;
    }
    let need = |c: Option<PathBuf>| c.ok_or(CliError::MissingConfig);
    match words
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] | ["run"] => Ok(Command::Run {
            config: need(config)?,
        }),
        ["demo"] => Ok(Command::Demo {
            port: port.unwrap_or(8080),
            workers: workers.unwrap_or(3),
        }),
        ["config", "validate"] => Ok(Command::Validate {
            config: need(config)?,
        }),
        ["config", "show"] => Ok(Command::Show {
            config: need(config)?,
        }),
        ["help"] => Ok(Command::Help),
        ["version"] => Ok(Command::Version),
        [first, ..] => Err(CliError::Unexpected((*first).to_string())),
    }
}

/// `continuum-router version`: the version, then the optional features built in (an operator's
/// check that a binary is the official release build, BUILD-03).
fn version_text(build: continuum_core::config::Build) -> String {
    let features: Vec<&str> = build
        .features()
        .into_iter()
        .filter_map(|(name, built)| built.then_some(name))
        .collect();
    let features = if features.is_empty() {
        "none (plain routing only; scripts/build-release.sh builds the release binary)".to_string()
    } else {
        features.join(" ")
    };
    format!(
        "continuum-router {}\nfeatures: {features}",
        env!("CARGO_PKG_VERSION")
    )
}

/// Write a command's result to stdout. A reader that went away (`| head`) is its choice, not an
/// error: the write stops quietly instead of panicking (which `print!` does, and which the
/// release profile's `panic = "abort"` turns into SIGABRT).
fn out(text: &str) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    let _ = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
}

/// Run a parsed command.
pub(crate) fn execute(cmd: Command) -> ExitCode {
    match cmd {
        Command::Help => {
            out(&format!("{USAGE}\n"));
            ExitCode::SUCCESS
        }
        Command::Version => {
            out(&format!("{}\n", version_text(continuum_control::BUILD)));
            ExitCode::SUCCESS
        }
        Command::Run { config } => crate::serve::run_file(&config),
        #[cfg(feature = "demo")]
        Command::Demo { port, workers } => crate::demo::run(port, workers),
        #[cfg(not(feature = "demo"))]
        Command::Demo { .. } => {
            eprintln!(
                "error: this build has no demo; build with `--features demo` (deploy/demo.sh does)"
            );
            ExitCode::from(2)
        }
        Command::Validate { config } => {
            let text = match read(&config) {
                Ok(t) => t,
                Err(code) => return code,
            };
            let result = continuum_control::load_config(&text, &ProcessEnv);
            match &result {
                Ok(l) => out(&report::render_lines(&[], &l.warnings)),
                Err(e) => out(&report::render_lines(&e.errors, &e.warnings)),
            }
            match result {
                Ok(_) => {
                    out(&format!("{}: valid\n", config.display()));
                    ExitCode::SUCCESS
                }
                Err(_) => ExitCode::from(1),
            }
        }
        Command::Show { config } => {
            let text = match read(&config) {
                Ok(t) => t,
                Err(code) => return code,
            };
            match continuum_control::load_config(&text, &ProcessEnv) {
                Ok(l) => {
                    // What this build switched off (CFG-04) is shown off; say why on stderr.
                    eprint!("{}", report::render_lines(&[], &l.warnings));
                    out(&l.config.show_masked());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprint!("{}", report::render_lines(&e.errors, &e.warnings));
                    ExitCode::from(1)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Command, CliError> {
        parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn parses_commands() {
        assert_eq!(
            p(&["--config", "a.yaml"]),
            Ok(Command::Run {
                config: "a.yaml".into()
            })
        );
        assert_eq!(
            p(&["run", "--config=a.yaml"]),
            Ok(Command::Run {
                config: "a.yaml".into()
            })
        );
        assert_eq!(
            p(&["demo"]),
            Ok(Command::Demo {
                port: 8080,
                workers: 3
            })
        );
        assert_eq!(
            p(&["demo", "--port", "9000", "--workers", "50"]),
            Ok(Command::Demo {
                port: 9000,
                workers: 50
            })
        );
        assert_eq!(p(&["demo", "--workers", "0"]), Err(CliError::BadWorkers));
        assert_eq!(p(&["demo", "--workers", "x"]), Err(CliError::BadWorkers));
        assert_eq!(
            p(&["config", "validate", "--config", "x"]),
            Ok(Command::Validate { config: "x".into() })
        );
        assert_eq!(
            p(&["config", "show", "-c", "x"]),
            Ok(Command::Show { config: "x".into() })
        );
        assert_eq!(p(&[]), Err(CliError::MissingConfig));
        assert_eq!(p(&["demo", "--port", "0"]), Err(CliError::BadPort));
        assert_eq!(
            p(&["frobnicate"]),
            Err(CliError::Unexpected("frobnicate".into()))
        );
        assert_eq!(p(&["version"]), Ok(Command::Version));
        assert_eq!(p(&["--version"]), Ok(Command::Version));
    }

    #[test]
    fn version_names_the_features_built_in() {
        let full = version_text(continuum_core::config::Build::FULL);
        assert!(full.starts_with("continuum-router "), "{full}");
        assert!(
            full.ends_with("features: dynamo dynamo-kv dynamo-event-bus"),
            "{full}"
        );
        let none = version_text(continuum_core::config::Build {
            dynamo: false,
            dynamo_kv: false,
            event_bus: false,
        });
        assert!(none.contains("features: none"), "{none}");
        let kv = version_text(continuum_core::config::Build {
            dynamo: true,
            dynamo_kv: true,
            event_bus: false,
        });
        assert!(kv.ends_with("features: dynamo dynamo-kv"), "{kv}");
    }
}
