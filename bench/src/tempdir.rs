//! A private scratch directory for configs, logs and wrk output.
//!
//! Invariant: everything the bench writes lives under one fresh directory
//! in the system temp dir, removed on drop; nothing is written to the repo.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::BenchError;

/// A directory deleted (recursively) when dropped.
#[derive(Debug)]
pub(crate) struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `$TMPDIR/continuum-bench-<pid>-<nanos>`.
    pub(crate) fn new() -> Result<Self, BenchError> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path =
            std::env::temp_dir().join(format!("continuum-bench-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&path)
            .map_err(BenchError::io(format!("creating {}", path.display())))?;
        Ok(Self { path })
    }

    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `contents` to `name` inside the directory, returns its path.
    pub(crate) fn write(&self, name: &str, contents: &str) -> Result<PathBuf, BenchError> {
        let p = self.path.join(name);
        std::fs::write(&p, contents).map_err(BenchError::io(format!("writing {}", p.display())))?;
        Ok(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
