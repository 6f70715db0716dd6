//! Typed errors of the bench driver and backend.
//!
//! Invariant: every failure the driver can report names the component
//! (`what`) it concerns, so a failed run says which process misbehaved.

use std::io;
use std::process::ExitStatus;

/// Everything that can go wrong while benchmarking.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BenchError {
    /// The command line could not be understood.
    #[error("{0}\n\n{usage}", usage = crate::usage::USAGE)]
    Usage(#[from] crate::usage::UsageError),
    /// An I/O operation of the driver itself failed.
    #[error("{context}: {source}")]
    Io {
        /// What the driver was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A child process could not be started.
    #[error("could not start {what} ({program}): {source}")]
    Spawn {
        /// Role of the child (backend, nginx, router, wrk).
        what: &'static str,
        /// Program that was executed.
        program: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A child exited while it was expected to keep running.
    #[error("{what} exited early ({status}){log}")]
    ExitedEarly {
        /// Role of the child.
        what: &'static str,
        /// How it exited.
        status: ExitStatus,
        /// Tail of its log, prefixed with a newline, or empty.
        log: String,
    },
    /// A child never passed its readiness probe.
    #[error("{what} not ready after {secs} s: {detail}{log}")]
    NotReady {
        /// Role of the child.
        what: &'static str,
        /// How long the driver waited.
        secs: u64,
        /// Last probe outcome.
        detail: String,
        /// Tail of its log, prefixed with a newline, or empty.
        log: String,
    },
    /// wrk ran but did not succeed.
    #[error("wrk failed ({status}): {stderr}")]
    WrkFailed {
        /// How wrk exited.
        status: String,
        /// What wrk printed on stderr.
        stderr: String,
    },
    /// wrk's report lacked a field the driver needs.
    #[error("could not find {field} in wrk output:\n{output}")]
    WrkParse {
        /// The missing or malformed field.
        field: &'static str,
        /// The full wrk stdout.
        output: String,
    },
    /// `/proc/<pid>/stat` could not be read or parsed.
    #[error("cannot read CPU times of pid {pid} from /proc")]
    ProcStat {
        /// The process that was sampled.
        pid: i32,
    },
    /// SIGINT or SIGTERM arrived; the run was abandoned and cleaned up.
    #[error("interrupted")]
    Interrupted,
    /// A benchmark's own failure (its error type converts itself: `error` names no benchmark, so
    /// no benchmark module depends on another through it).
    #[error("{stage}{source}")]
    Stage {
        /// Which benchmark.
        stage: Stage,
        /// Its error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// `prompt` could not set up its pipeline or workload.
    #[error("prompt: {0}")]
    Setup(String),
    /// The backend's runtime could not be built or its socket bound.
    #[error("backend: {0}")]
    Backend(io::Error),
}

/// The benchmark a [`BenchError::Stage`] comes from; displayed as its message's prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// `zmtp-ingest` could not measure its baseline.
    ZmtpIngest,
    /// `pick` could not measure.
    Pick,
    /// `fleet-hop`'s fleet could not be started or described.
    Fleet,
    /// `sim-hop`'s simulated fleet could not be started or checked.
    SimHop,
    /// `kv-route` could not measure its baseline.
    KvRoute,
    /// `aiperf` failed (its errors say so themselves).
    Aiperf,
    /// `faults`: some scenarios did not run.
    Faults,
    /// `bus-relay` could not measure.
    BusRelay,
    /// `bus-kv` could not measure.
    BusKv,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::ZmtpIngest => "zmtp-ingest: ",
            Stage::Pick => "pick: ",
            Stage::Fleet => "fleet: ",
            Stage::SimHop => "sim-hop: ",
            Stage::KvRoute => "kv-route: ",
            Stage::Aiperf => "",
            Stage::Faults => "faults: ",
            Stage::BusRelay => "bus-relay: ",
            Stage::BusKv => "bus-kv: ",
        })
    }
}

impl BenchError {
    /// A benchmark's own error, under its stage.
    pub(crate) fn stage(
        stage: Stage,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Stage {
            stage,
            source: Box::new(source),
        }
    }

    /// Wraps an I/O error with what the driver was doing.
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> Self {
        let context = context.into();
        move |source| Self::Io { context, source }
    }
}
