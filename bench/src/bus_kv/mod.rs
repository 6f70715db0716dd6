//! `bus-kv`: `kv-events` through the event bus against a direct connection, applied to a KV
//! index as the router applies them (issue 35's goals: apply throughput through the broker at
//! ≥ 0.8x direct, event-to-visible p99 at most 1 ms above direct; the broker's CPU per relayed
//! message; broker and router memory per idle relayed subscription).
//!
//! One run, on loopback, in one process. The publisher is a raw ZMTP PUB peer writing the
//! [`stream`] (stores and evictions of one worker rank, contiguous event ids); the receiver is
//! the shards' session driver on the shards' runtime with a sink ([`apply`]) that decodes,
//! checks and applies every batch to a KV index (visible to other shards as applied). Sides:
//! - **throughput**: M messages as fast as they go, direct TCP, then through the bus (the broker
//!   library, the listener, the stream's socket: `bus_relay::relay`) with the default per-stream
//!   budget and with the largest;
//! - **latency**: N messages paced at R per second, direct and through the bus (default budget):
//!   event-to-visible time from the publisher's write to the end of its application;
//! - **memory**: `bus_relay`'s idle-session and idle-stream figures (listener, shard, broker).
//!
//! Invariants: every thread ends by the run's deadline; the router's threads are pinned to
//! CPU 0 and the cluster's (publisher, broker) to CPU 1 when there are at least two.

mod apply;
mod stream;

use std::fmt::Write as _;
use std::net::TcpListener;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use continuum_bus::Topic;
use continuum_shards::ingest::driver::{HANDSHAKE_TIMEOUT, run_session};

use crate::bus_relay::RelayError;
use crate::bus_relay::relay::{self, RelayCost};
use crate::bus_relay::setup::Budget;
use crate::zmtp_ingest::pin_to_cpu;
use crate::zmtp_ingest::router::shard_runtime;
use apply::{Applied, Applier, Stamps};
use stream::{KvStream, Pace};

/// Options of `bus-kv`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KvBusOptions {
    /// Messages per throughput side (M).
    pub(crate) messages: u64,
    /// Messages per latency side (N).
    pub(crate) paced: u64,
    /// Messages per second of the latency sides (R).
    pub(crate) rate: u64,
    /// Seconds each side may take.
    pub(crate) timeout_secs: u64,
    /// Idle sessions in the memory figure.
    pub(crate) sessions: usize,
    /// Idle streams in the memory figure.
    pub(crate) streams: usize,
}

impl Default for KvBusOptions {
    fn default() -> Self {
        Self {
            messages: 200_000,
            paced: 4_000,
            rate: 2_000,
            timeout_secs: 60,
            sessions: 16,
            streams: 128,
        }
    }
}

/// Most messages `--messages` accepts: the whole stream is encoded in memory first (~660 B a
/// message, so at most ~660 MB).
pub(crate) const MAX_MESSAGES: u64 = 1_000_000;

/// The two CPUs of a run: the receiver's, and everyone else's.
type Cpus = Option<(usize, usize)>;

/// One side's figures.
struct Side {
    name: String,
    applied: Applied,
    relay: Option<RelayCost>,
}

fn bind() -> Result<TcpListener, RelayError> {
    TcpListener::bind("127.0.0.1:0").map_err(|source| RelayError::Io {
        what: "binding the publisher",
        source,
    })
}

/// Runs the driver with an [`Applier`] over `stream` until `total` messages are applied.
async fn drive<S>(
    stream: &mut S,
    total: u64,
    stamps: Option<Stamps<'_>>,
    deadline: Instant,
) -> Result<Applied, RelayError>
where
    S: monoio::io::AsyncReadRent + monoio::io::AsyncWriteRent,
{
    let mut sink = Applier::new(total, stamps)?;
    let left = deadline.saturating_duration_since(Instant::now());
    match monoio::time::timeout(left, run_session(stream, &mut sink, HANDSHAKE_TIMEOUT)).await {
        Ok(Ok(_)) => Ok(sink.finish()),
        Ok(Err(e)) => Err(RelayError::Setup(format!(
            "the receiving session ended: {e}"
        ))),
        Err(_) => Err(RelayError::Timeout("the receiver")),
    }
}

fn direct(
    kv: &KvStream,
    pace: Pace<'_>,
    cpus: Cpus,
    deadline: Instant,
) -> Result<Side, RelayError> {
    let (recv_cpu, pub_cpu) = cpus.map_or((None, None), |(r, p)| (Some(r), Some(p)));
    let listener = bind()?;
    let addr = listener.local_addr().map_err(|source| RelayError::Io {
        what: "the publisher's address",
        source,
    })?;
    let stamps = stamps_of(pace);
    let total = kv.len();
    let (applied, published) = std::thread::scope(|s| {
        let publisher = s.spawn(|| stream::publish(&listener, kv, pace, deadline, pub_cpu));
        let receiver = s.spawn(move || {
            if let Some(cpu) = recv_cpu {
                pin_to_cpu(cpu);
            }
            let (mut rt, _) = shard_runtime()?;
            rt.block_on(async move {
                let mut tcp = monoio::net::TcpStream::connect(addr)
                    .await
                    .map_err(|source| RelayError::Io {
                        what: "connecting to the publisher",
                        source,
                    })?;
                let _ = tcp.set_nodelay(true);
                drive(&mut tcp, total, stamps, deadline).await
            })
        });
        (
            receiver
                .join()
                .map_err(|_| RelayError::Panicked("receiver")),
            publisher
                .join()
                .map_err(|_| RelayError::Panicked("publisher")),
        )
    });
    let applied = applied??;
    published??;
    Ok(Side {
        name: "direct TCP".into(),
        applied,
        relay: None,
    })
}

fn bus(
    kv: &KvStream,
    pace: Pace<'_>,
    budget: Budget,
    cpus: Cpus,
    deadline: Instant,
) -> Result<Side, RelayError> {
    let listener = bind()?;
    let stamps = stamps_of(pace);
    let total = kv.len();
    let (applied, cost) = relay::relayed(
        budget,
        cpus,
        Topic::KvEvents,
        &listener,
        |cpu| Ok(stream::publish(&listener, kv, pace, deadline, cpu)?),
        |api, port| {
            let (mut rt, _) = shard_runtime()?;
            rt.block_on(async move {
                let mut sock = relay::open_relayed(api, port, Topic::KvEvents, deadline).await?;
                drive(&mut sock, total, stamps, deadline).await
            })
        },
    )?;
    Ok(Side {
        name: format!(
            "bus, {} ({} KiB windows)",
            budget.label(),
            cost.window_bytes >> 10
        ),
        applied,
        relay: Some(cost),
    })
}

fn stamps_of<'a>(pace: Pace<'a>) -> Option<Stamps<'a>> {
    match pace {
        Pace::Flat => None,
        Pace::Every { base, sent, .. } => Some(Stamps { base, sent }),
    }
}

/// Runs every side and the memory figures, and renders the report.
pub(crate) fn run(opts: KvBusOptions) -> Result<String, RelayError> {
    let ncpu = std::thread::available_parallelism().map_or(1, usize::from);
    let cpus = (ncpu >= 2).then_some((0, 1));
    let timeout = Duration::from_secs(opts.timeout_secs);
    eprintln!(
        "bus-kv: encoding {} + {} messages ...",
        opts.messages, opts.paced
    );
    let flat = KvStream::new(opts.messages)?;
    let paced = KvStream::new(opts.paced)?;
    let mut throughput = Vec::new();
    eprintln!("bus-kv: throughput, direct ...");
    throughput.push(direct(&flat, Pace::Flat, cpus, Instant::now() + timeout)?);
    for budget in [Budget::Default, Budget::Largest] {
        eprintln!("bus-kv: throughput, bus, {} ...", budget.label());
        throughput.push(bus(
            &flat,
            Pace::Flat,
            budget,
            cpus,
            Instant::now() + timeout,
        )?);
    }
    let period = Duration::from_nanos(1_000_000_000 / opts.rate.max(1));
    let mut latency = Vec::new();
    for through_bus in [false, true] {
        eprintln!(
            "bus-kv: latency, {} ({} messages at {}/s) ...",
            if through_bus { "bus" } else { "direct" },
            opts.paced,
            opts.rate
        );
        let sent: Vec<AtomicU64> = (0..paced.len()).map(|_| AtomicU64::new(0)).collect();
        let pace = Pace::Every {
            period,
            base: Instant::now(),
            sent: &sent,
        };
        let deadline = Instant::now() + timeout;
        latency.push(if through_bus {
            bus(&paced, pace, Budget::Default, cpus, deadline)?
        } else {
            direct(&paced, pace, cpus, deadline)?
        });
    }
    eprintln!(
        "bus-kv: memory of {} idle sessions and {} idle streams ...",
        opts.sessions, opts.streams
    );
    let mem =
        crate::bus_relay::memory::measure(opts.sessions, opts.streams, Instant::now() + timeout)?;
    let mut r = String::new();
    render_throughput(&mut r, &flat, cpus, &throughput);
    render_latency(&mut r, &paced, opts.rate, &latency);
    crate::bus_relay::memory::render(&mem, &mut r);
    Ok(r)
}

fn render_throughput(r: &mut String, kv: &KvStream, cpus: Cpus, sides: &[Side]) {
    let _ = writeln!(
        r,
        "bus-kv: {m} kv-events messages per side ({b:.1} MB on the wire; each stores {blocks} \
         blocks and, past the first {window}, evicts {blocks}), decoded, checked and applied to \
         a KV index with the router's rules (visible to other shards as applied)",
        m = kv.len(),
        b = kv.bytes() as f64 / 1e6,
        blocks = stream::BLOCKS,
        window = stream::WINDOW,
    );
    let _ = match cpus {
        Some((rc, pc)) => writeln!(
            r,
            "pinning: the router's threads (shard, listener) on CPU {rc}; the cluster's \
             (publisher, broker) on CPU {pc}"
        ),
        None => writeln!(r, "pinning: none (fewer than 2 CPUs)"),
    };
    let _ = writeln!(
        r,
        "figures over messages 2..=M; cpu ns per message per thread (shard = the applying driver)\n"
    );
    let _ = writeln!(
        r,
        "{:<40} {:>9} {:>10} {:>10} {:>11} {:>10}",
        "side", "msgs/s", "events/s", "shard ns", "listener ns", "broker ns"
    );
    let mut base: Option<(f64, f64)> = None;
    let mut ratios = Vec::new();
    for side in sides {
        let a = &side.applied;
        let (Some(rate), Some(cpu)) = (a.rate(), a.cpu_per_msg_ns()) else {
            let _ = writeln!(r, "{:<40} not measured", side.name);
            continue;
        };
        let events = rate * a.events as f64 / a.messages.max(1) as f64;
        let per = |ns: u64| ns as f64 / a.messages.max(1) as f64;
        let (listener, broker) = side.relay.map_or(("-".into(), "-".into()), |c| {
            (
                format!("{:.0}", per(c.listener_cpu_ns)),
                format!("{:.0}", per(c.broker_cpu_ns)),
            )
        });
        let _ = writeln!(
            r,
            "{:<40} {:>9.0} {:>10.0} {:>10.0} {:>11} {:>10}",
            side.name, rate, events, cpu, listener, broker
        );
        if a.anomalies > 0 {
            let _ = writeln!(
                r,
                "  WARNING: {} messages or events were not a clean apply",
                a.anomalies
            );
        }
        match (base, side.relay) {
            (None, _) => base = Some((rate, cpu)),
            (Some((base_rate, base_cpu)), Some(c)) => ratios.push(format!(
                "{}/direct: apply throughput {:.2}x (goal >= 0.8x), broker CPU per relayed \
                 message {:.2}x the direct shard's per applied message, shard CPU per message \
                 {:.2}x",
                side.name,
                rate / base_rate.max(1e-9),
                per(c.broker_cpu_ns) / base_cpu.max(1e-9),
                cpu / base_cpu.max(1e-9),
            )),
            _ => {}
        }
    }
    let _ = writeln!(r);
    for line in ratios {
        let _ = writeln!(r, "{line}");
    }
}

fn render_latency(r: &mut String, kv: &KvStream, rate: u64, sides: &[Side]) {
    let _ = writeln!(
        r,
        "\nevent-to-visible: {} messages at {rate}/s, from the publisher's write to the end of \
         its application to the index (µs)\n",
        kv.len()
    );
    let _ = writeln!(
        r,
        "{:<40} {:>8} {:>8} {:>8} {:>8}",
        "side", "p50", "p99", "p99.9", "max"
    );
    let mut p99s = Vec::new();
    for side in sides {
        let Some(h) = side.applied.latency.as_ref().filter(|h| !h.is_empty()) else {
            let _ = writeln!(r, "{:<40} not measured", side.name);
            continue;
        };
        let _ = writeln!(
            r,
            "{:<40} {:>8} {:>8} {:>8} {:>8}",
            side.name,
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999),
            h.max()
        );
        p99s.push(h.value_at_quantile(0.99));
    }
    if let [direct, bus] = p99s[..] {
        let delta = bus as f64 - direct as f64;
        let _ = writeln!(
            r,
            "\nbus/direct: event-to-visible p99 {:.2}x, {:+.0} µs (goal <= +1000 µs)",
            bus as f64 / (direct as f64).max(1.0),
            delta
        );
    }
    let _ = writeln!(r);
}
