//! The simulator's errors.
//!
//! Role: one [`SimError`] for everything that can go wrong while starting, running or stopping a
//! simulated fleet. Invariant: every I/O error says what was being done (`what`), so a failed
//! start names the socket or file at fault.

use std::path::PathBuf;

use thiserror::Error;

/// Why the simulator could not do what was asked.
#[derive(Debug, Error)]
pub enum SimError {
    /// The spec cannot describe a fleet (empty, duplicated names, zero ranks...).
    #[error("invalid fleet spec: {0}")]
    Spec(String),
    /// A socket, thread or runtime could not be set up.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file-store record could not be written or removed.
    #[error("file store {path}: {source}")]
    Store {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// No live worker has this instance id.
    #[error("no live worker {0:x}")]
    NoSuchWorker(u64),
    /// The fleet's runtime thread is gone.
    #[error("the simulator runtime has stopped")]
    Stopped,
}

impl SimError {
    /// An `Io` error mapper naming `what` was being done.
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SimError {
        let what = what.into();
        move |source| SimError::Io { what, source }
    }

    /// A `Store` error mapper naming the file.
    pub(crate) fn store(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> SimError {
        let path = path.to_path_buf();
        move |source| SimError::Store { path, source }
    }
}
