//! The features this binary was compiled with, and the one config loader every entry point uses
//! (`config validate`, startup, reload), so a config needing a feature the build lacks, or
//! naming trust anchors that cannot be loaded, is refused the same way everywhere (BUILD-01..03).

use continuum_core::config::{Build, Config, ConfigErrors, EnvLookup, Warning};
use continuum_core::tls::BackendTlsTable;

/// This build's features.
pub const BUILD: Build = Build {
    dynamo: cfg!(feature = "dynamo"),
    dynamo_kv: cfg!(feature = "dynamo-kv"),
    event_bus: cfg!(feature = "dynamo-event-bus"),
};

/// A config that validated, with what loading it read.
#[derive(Debug)]
pub struct Loaded {
    /// The validated config.
    pub config: Config,
    /// The TLS context of each `https://` backend (indexed like `config.backends`).
    pub tls: BackendTlsTable,
    /// What validation advises.
    pub warnings: Vec<Warning>,
}

/// Parse and validate `text`, refuse what this build cannot do ([`Config::check_build`]), then
/// load the `https://` backends' trust anchors ([`crate::tls::load`]).
pub fn load_config(text: &str, env: &dyn EnvLookup) -> Result<Loaded, ConfigErrors> {
    let (config, warnings) = Config::from_yaml(text, env)?;
    let errors = config.check_build(BUILD);
    if !errors.is_empty() {
        return Err(ConfigErrors { errors, warnings });
    }
    match crate::tls::load(&config) {
        Ok(tls) => Ok(Loaded {
            config,
            tls,
            warnings,
        }),
        Err(errors) => Err(ConfigErrors { errors, warnings }),
    }
}
