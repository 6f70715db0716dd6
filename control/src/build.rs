//! The features this binary was compiled with, and the one config loader every entry point uses
//! (`config validate`, startup, reload): a config validates the same in every build, what this
//! build lacks is switched off with a warning the same way everywhere (CFG-04), and trust anchors
//! that cannot be loaded are refused everywhere.

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

/// Parse and validate `text`, switch off what this build lacks with a warning each
/// ([`Config::fit_build`]), then load the `https://` backends' trust anchors
/// ([`crate::tls::load`]).
pub fn load_config(text: &str, env: &dyn EnvLookup) -> Result<Loaded, ConfigErrors> {
    let (config, mut warnings) = Config::from_yaml(text, env)?;
    let (config, unbuilt) = config.fit_build(BUILD);
    warnings.extend(unbuilt);
    match crate::tls::load(&config) {
        Ok(tls) => Ok(Loaded {
            config,
            tls,
            warnings,
        }),
        Err(errors) => Err(ConfigErrors { errors, warnings }),
    }
}
