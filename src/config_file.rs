//! Reading the config file the commands name: the file itself, and the process environment its
//! `${NAME}` references are filled from. A leaf: the commands (`cli`) and the server start
//! (`serve`) both read through it.

use std::path::Path;
use std::process::ExitCode;

use continuum_core::config::EnvLookup;

/// The process environment, for `${NAME}` interpolation.
pub(crate) struct ProcessEnv;

impl EnvLookup for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

/// Read a config file, reporting failure as exit status 1.
pub(crate) fn read(path: &Path) -> Result<String, ExitCode> {
    std::fs::read_to_string(path).map_err(|e| {
        eprintln!("error: cannot read {}: {e}", path.display());
        ExitCode::from(1)
    })
}
