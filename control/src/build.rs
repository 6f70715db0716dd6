//! The features this binary was compiled with, and the one config loader every entry point uses
//! (`config validate`, startup, reload), so a config needing a feature the build lacks is refused
//! the same way everywhere (BUILD-01..03).

use continuum_core::config::{Build, Config, ConfigErrors, EnvLookup, Warning};

/// This build's features.
pub const BUILD: Build = Build {
    dynamo: cfg!(feature = "dynamo"),
    dynamo_kv: cfg!(feature = "dynamo-kv"),
};

/// Parse and validate `text`, then refuse what this build cannot do ([`Config::check_build`]).
pub fn load_config(
    text: &str,
    env: &dyn EnvLookup,
) -> Result<(Config, Vec<Warning>), ConfigErrors> {
    let (config, warnings) = Config::from_yaml(text, env)?;
    let errors = config.check_build(BUILD);
    if errors.is_empty() {
        Ok((config, warnings))
    } else {
        Err(ConfigErrors { errors, warnings })
    }
}
