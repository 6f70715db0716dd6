//! The router's path under test: the shards' own session driver
//! (`continuum_shards::ingest::driver::run_session`: the bounded sans-IO [`ZmtpSub`] fed from a
//! 2 KiB read buffer) with the tally as its sink, `decode_kv_metrics` per message (minus the
//! load store, which the baseline does not have either).
//!
//! Two I/O layers drive the same feed loop (`driver::feed`): the driver on a monoio runtime on
//! the calling thread (like a shard: io_uring when the kernel allows it, epoll otherwise) and a
//! plain blocking `std::net::TcpStream` loop, so the report shows the state machine's cost with
//! and without an async runtime around it.
//!
//! Invariants: one 2 KiB buffer per subscription, reused for every read; nothing allocated per
//! message by this module; every loop ends after `total` messages, at EOF, on an error, or at the
//! deadline (checked once per read).

use std::io::Read;
use std::net::SocketAddr;
use std::time::Instant;

use std::ops::ControlFlow;

use continuum_core::zmtp::limits::READ_BUFFER_BYTES;
use continuum_core::zmtp::{DropReason, ZmtpLimits, ZmtpSub};
use continuum_shards::ingest::driver::{HANDSHAKE_TIMEOUT, SessionEnd, Sink, feed, run_session};
use monoio::io::{AsyncReadRent, AsyncWriteRent};

use super::{IngestError, Tally, pin_to_cpu};

/// The topic of the load family.
const TOPICS: &[&[u8]] = &[b"kv_metrics"];

/// The tally as the driver's sink: the same `Sink` interface the shards' `kv_metrics` sink
/// implements, so the bench runs the production session loop.
impl Sink for Tally {
    fn limits(&self) -> ZmtpLimits {
        ZmtpLimits::KV_METRICS
    }

    fn topics(&self) -> &[&'static [u8]] {
        TOPICS
    }

    fn on_connect(&mut self) {}

    fn on_ready(&mut self, buffered_capacity: usize) {
        Tally::on_ready(self, buffered_capacity);
    }

    fn on_message(&mut self, frames: &[&[u8]]) -> ControlFlow<()> {
        Tally::on_message(self, frames);
        if self.done() {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }

    fn on_dropped(&mut self, _reason: DropReason) {
        self.dropped += 1;
    }

    fn on_refused(&mut self) {}
}

/// Receives `total` messages from `addr` on a monoio runtime built on this thread (pinned to
/// `cpu` if given). Returns the tally and the driver name.
pub(crate) fn run_monoio(
    addr: SocketAddr,
    total: u64,
    deadline: Instant,
    cpu: Option<usize>,
) -> Result<(Tally, &'static str), IngestError> {
    if let Some(cpu) = cpu {
        pin_to_cpu(cpu);
    }
    let (mut rt, driver) = shard_runtime()?;
    let tally = rt.block_on(async move {
        let io = |what: &'static str| move |source| IngestError::Io { what, source };
        let mut stream = monoio::net::TcpStream::connect(addr)
            .await
            .map_err(io("connecting to the publisher"))?;
        stream.set_nodelay(true).map_err(io("nodelay"))?;
        drive(&mut stream, total, deadline, "router (monoio)").await
    })?;
    Ok((tally, driver))
}

/// The shards' own runtime (io_uring with DEFER_TASKRUN when the kernel allows it, with the
/// timer the session driver's handshake bound needs) and its driver's name.
pub(crate) fn shard_runtime()
-> Result<(continuum_shards::runtime::ShardRuntime, &'static str), IngestError> {
    let (rt, kind) = continuum_shards::runtime::build(
        continuum_shards::runtime::DriverChoice::Best,
    )
    .map_err(|source| IngestError::Io {
        what: "building the monoio runtime",
        source,
    })?;
    let driver = match kind {
        continuum_shards::runtime::DriverKind::Epoll => "epoll",
        _ => "io_uring",
    };
    Ok((rt, driver))
}

/// Receives `total` messages over `stream` with the shards' session driver
/// (`continuum_shards::ingest::driver`: 2 KiB reads when quiet, growing under a backlog, exactly
/// as a shard runs a subscription) on the current monoio runtime, by `deadline`. `side` names
/// the subscriber in errors.
pub(crate) async fn drive<S: AsyncReadRent + AsyncWriteRent>(
    stream: &mut S,
    total: u64,
    deadline: Instant,
    side: &'static str,
) -> Result<Tally, IngestError> {
    let mut tally = Tally::new(total);
    let left = deadline.saturating_duration_since(Instant::now());
    let session = run_session(stream, &mut tally, HANDSHAKE_TIMEOUT);
    let idle = match monoio::time::timeout(left, session).await {
        Err(_) => return Err(tally.timeout(side)),
        Ok(Ok(idle)) => idle,
        Ok(Err(SessionEnd::Closed)) => return Err(tally.eof(side)),
        Ok(Err(SessionEnd::Refused(why))) => return Err(IngestError::Setup(why)),
        Ok(Err(SessionEnd::Io(source) | SessionEnd::Connect(source))) => {
            return Err(IngestError::Io {
                what: "reading",
                source,
            });
        }
        Ok(Err(SessionEnd::ConnectTimeout)) => return Err(tally.timeout(side)),
        // Connectors' outcomes; the bench hands the driver a connected stream.
        Ok(Err(e @ (SessionEnd::Uncovered | SessionEnd::Broker(_)))) => {
            return Err(IngestError::Setup(e.to_string()));
        }
    };
    tally.finish(idle);
    Ok(tally)
}

/// Read buffer of the diagnostic run: 8x the spec's, to show what the 2 KiB reads cost in
/// syscalls. Not what the router does.
pub(super) const DIAGNOSTIC_READ_BYTES: usize = 8 * READ_BUFFER_BYTES;

/// Receives `total` messages from `addr` with blocking reads of `N` bytes on this thread (pinned
/// to `cpu` if given). `N` is [`READ_BUFFER_BYTES`] except in the diagnostic run.
pub(super) fn run_blocking<const N: usize>(
    addr: SocketAddr,
    total: u64,
    deadline: Instant,
    cpu: Option<usize>,
) -> Result<Tally, IngestError> {
    use std::io::Write;
    if let Some(cpu) = cpu {
        pin_to_cpu(cpu);
    }
    let io = |what: &'static str| move |source| IngestError::Io { what, source };
    let mut stream =
        std::net::TcpStream::connect(addr).map_err(io("connecting to the publisher"))?;
    stream.set_nodelay(true).map_err(io("nodelay"))?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(std::time::Duration::from_millis(1));
    stream
        .set_read_timeout(Some(left))
        .map_err(io("read timeout"))?;
    let mut zmtp = ZmtpSub::new(ZmtpLimits::KV_METRICS, TOPICS)?;
    let mut tally = Tally::new(total);
    let mut buf = [0u8; N];
    while !tally.done() {
        if Instant::now() >= deadline {
            return Err(tally.timeout("router (blocking)"));
        }
        if !zmtp.outgoing().is_empty() {
            let n = zmtp.outgoing().len();
            stream
                .write_all(zmtp.outgoing())
                .map_err(io("writing the handshake"))?;
            zmtp.consume_outgoing(n);
        }
        match stream.read(&mut buf) {
            Ok(0) => return Err(tally.eof("router (blocking)")),
            Ok(n) => {
                let _ = feed(&mut zmtp, buf.get(..n).unwrap_or(&[]), &mut tally)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(IngestError::Io {
                    what: "reading (blocking)",
                    source,
                });
            }
        }
    }
    tally.finish(zmtp.buffered_capacity());
    Ok(tally)
}
