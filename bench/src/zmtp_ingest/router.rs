//! The router's path under test: the bounded sans-IO [`ZmtpSub`] fed from a 2 KiB read buffer,
//! `decode_kv_metrics` per message, exactly as `shards/src/subscribe/protocol.rs` does it (minus
//! the load store, which the baseline does not have either).
//!
//! Two I/O layers drive the same feed loop ([`feed_all`]): a monoio runtime on the calling thread
//! (like a shard: io_uring when the kernel allows it, epoll otherwise) and a plain blocking
//! `std::net::TcpStream` loop, so the report shows the state machine's cost with and without an
//! async runtime around it.
//!
//! Invariants: one 2 KiB buffer per subscription, reused for every read; nothing allocated per
//! message by this module; every loop ends after `total` messages, at EOF, on an error, or at the
//! deadline (checked once per read).

use std::io::Read;
use std::net::SocketAddr;
use std::time::Instant;

use continuum_core::zmtp::limits::{READ_BUFFER_BYTES, read_buffer_after};
use continuum_core::zmtp::{Event, ZmtpLimits, ZmtpSub};
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};

use super::{IngestError, Tally, pin_to_cpu};

/// The topic of the load family.
const TOPIC: &[u8] = b"kv_metrics";

/// Feeds one read's bytes to the state machine until they are consumed, counting every event.
fn feed_all(zmtp: &mut ZmtpSub, mut input: &[u8], tally: &mut Tally) -> Result<(), IngestError> {
    while !input.is_empty() && !tally.done() {
        let progress = zmtp.feed(input)?;
        let consumed = progress.consumed;
        let had_event = progress.event.is_some();
        let mut ready = false;
        match progress.event {
            Some(Event::Message(m)) => tally.on_message(m.frames()),
            Some(Event::Ready(_)) => ready = true,
            Some(Event::Dropped(_)) => tally.dropped += 1,
            None => {}
        }
        if ready {
            tally.on_ready(zmtp.buffered_capacity());
        }
        if consumed == 0 && !had_event {
            break;
        }
        input = input.get(consumed..).unwrap_or(&[]);
    }
    Ok(())
}

/// Which monoio driver the runtime got.
pub(super) fn monoio_driver_name(
    rt: &monoio::FusionRuntime<monoio::IoUringDriver, monoio::LegacyDriver>,
) -> &'static str {
    match rt {
        monoio::FusionRuntime::Uring(_) => "io_uring",
        monoio::FusionRuntime::Legacy(_) => "epoll",
    }
}

/// Receives `total` messages from `addr` on a monoio runtime built on this thread (pinned to
/// `cpu` if given). Returns the tally and the driver name.
pub(super) fn run_monoio(
    addr: SocketAddr,
    total: u64,
    deadline: Instant,
    cpu: Option<usize>,
) -> Result<(Tally, &'static str), IngestError> {
    if let Some(cpu) = cpu {
        pin_to_cpu(cpu);
    }
    let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .build()
        .map_err(|source| IngestError::Io {
            what: "building the monoio runtime",
            source,
        })?;
    let driver = monoio_driver_name(&rt);
    let tally = rt.block_on(async move {
        let io = |what: &'static str| move |source| IngestError::Io { what, source };
        let mut stream = monoio::net::TcpStream::connect(addr)
            .await
            .map_err(io("connecting to the publisher"))?;
        stream.set_nodelay(true).map_err(io("nodelay"))?;
        let mut zmtp = ZmtpSub::new(ZmtpLimits::KV_METRICS, &[TOPIC])?;
        let mut tally = Tally::new(total);
        let mut buf: Vec<u8> = Vec::with_capacity(READ_BUFFER_BYTES);
        let mut out: Vec<u8> = Vec::with_capacity(64);
        while !tally.done() {
            if Instant::now() >= deadline {
                return Err(tally.timeout("router (monoio)"));
            }
            if !zmtp.outgoing().is_empty() {
                out.clear();
                out.extend_from_slice(zmtp.outgoing());
                let n = out.len();
                let (res, back) = stream.write_all(out).await;
                out = back;
                res.map_err(io("writing the handshake"))?;
                zmtp.consume_outgoing(n);
            }
            buf.clear();
            let (res, back) = stream.read(buf).await;
            buf = back;
            match res {
                Ok(0) => return Err(tally.eof("router (monoio)")),
                Ok(n) => {
                    feed_all(&mut zmtp, &buf, &mut tally)?;
                    // The production policy (shards/src/subscribe/protocol.rs): 2 KiB when
                    // quiet, growing under a backlog.
                    let next = read_buffer_after(buf.capacity(), n);
                    if next != buf.capacity() {
                        buf = Vec::with_capacity(next);
                    }
                }
                Err(source) => {
                    return Err(IngestError::Io {
                        what: "reading (monoio)",
                        source,
                    });
                }
            }
        }
        tally.finish(zmtp.buffered_capacity());
        Ok(tally)
    })?;
    Ok((tally, driver))
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
    let mut zmtp = ZmtpSub::new(ZmtpLimits::KV_METRICS, &[TOPIC])?;
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
            Ok(n) => feed_all(&mut zmtp, buf.get(..n).unwrap_or(&[]), &mut tally)?,
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
