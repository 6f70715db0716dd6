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
    #[error("{0}\n\n{usage}", usage = crate::cli::USAGE)]
    Usage(#[from] UsageError),
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
    /// `zmtp-ingest` could not measure its baseline.
    #[error("zmtp-ingest: {0}")]
    Ingest(#[from] crate::zmtp_ingest::IngestError),
    /// `pick` could not measure.
    #[error("pick: {0}")]
    Pick(#[from] crate::pick::PickError),
    /// `fleet-hop`'s fleet could not be started or described.
    #[error("fleet: {0}")]
    Fleet(#[from] crate::fleet_hop::FleetError),
    /// `sim-hop`'s simulated fleet could not be started or checked.
    #[error("sim-hop: {0}")]
    SimHop(#[from] crate::sim_hop::SimHopError),
    /// `kv-route` could not measure its baseline.
    #[error("kv-route: {0}")]
    KvRoute(#[from] crate::kv_route::KvRouteError),
    /// `aiperf` failed.
    #[error(transparent)]
    Aiperf(#[from] crate::aiperf::AiperfError),
    /// `prompt` could not set up its pipeline or workload.
    #[error("prompt: {0}")]
    Setup(String),
    /// The backend's runtime could not be built or its socket bound.
    #[error("backend: {0}")]
    Backend(io::Error),
}

/// A malformed command line.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UsageError {
    /// No subcommand was given.
    #[error("missing subcommand")]
    MissingCommand,
    /// The subcommand is unknown.
    #[error("unknown subcommand `{0}`")]
    UnknownCommand(String),
    /// A flag is unknown for this subcommand.
    #[error("unknown flag `{0}`")]
    UnknownFlag(String),
    /// A flag that needs a value was last on the line.
    #[error("flag `{0}` needs a value")]
    MissingValue(String),
    /// A flag's value did not parse or is out of range.
    #[error("bad value `{value}` for `{flag}`: {reason}")]
    BadValue {
        /// The flag.
        flag: String,
        /// The value given.
        value: String,
        /// Why it was rejected.
        reason: &'static str,
    },
}

impl BenchError {
    /// Wraps an I/O error with what the driver was doing.
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> Self {
        let context = context.into();
        move |source| Self::Io { context, source }
    }
}
