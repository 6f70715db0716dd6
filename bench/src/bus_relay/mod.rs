//! `bus-relay`: the event bus's data path against a direct connection (issue 34's goals: one
//! data stream relayed through the listener into a shard's ZMTP driver at ≥ 0.8x the bytes per
//! second of the same driver on a direct loopback TCP connection; the listener's memory per idle
//! session and per idle stream within the BUS-28 budget).
//!
//! One run, on loopback, in one process. The publisher is `zmtp-ingest`'s raw ZMTP PUB peer
//! (`kv_metrics` messages of the real Dynamo shape, large batched writes). Sides, each a fresh
//! publisher and M messages:
//! - **direct**: the shards' session driver (`continuum_shards::ingest::driver::run_session`) on
//!   the shards' runtime, connected to the publisher over TCP, as `transport: direct` runs it;
//! - **bus**: the broker (`continuum-event-broker`'s library, TLS 1.3 + HTTP/2 over loopback)
//!   relays the publisher on a data stream through the router's listener (`continuum_bus`, its own
//!   thread), which hands the stream over as a Unix socket (`BusStream::into_socket`), and the same
//!   driver reads that socket on the same runtime; once with the default per-stream budget and
//!   once with the largest.
//!
//! Figures cover messages 2..=M at the receiver: wall time (bytes per second), the receiving
//! (shard) thread's CPU, the listener thread's CPU (`/proc/self/task/*/stat`), the broker's and
//! the publisher's. Then [`memory`]: bytes held per idle session and per idle stream.
//!
//! On a machine where the router, the broker and the publisher share two cores, the wall-clock
//! ratio is bounded by everyone's CPU, not the router's; the report therefore also gives the
//! router-side capacity: messages per CPU-second of the busier router thread (listener or
//! shard) against the direct shard's.
//!
//! Invariants: every thread ends by the run's deadline; the router's threads (the receiving
//! shard and the listener) are pinned to CPU 0 and the cluster's (publisher, broker) to CPU 1
//! when there are at least two.

pub(crate) mod memory;
pub(crate) mod relay;
pub(crate) mod setup;

use std::fmt::Write as _;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use continuum_event_bus::message::Topic;

use crate::zmtp_ingest::publisher::{self, Published, Template};
use crate::zmtp_ingest::router::{drive, run_monoio, shard_runtime};
use crate::zmtp_ingest::{IngestError, Tally};
use setup::Budget;

/// Options of `bus-relay`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RelayOptions {
    /// Messages per side (M).
    pub(crate) messages: u64,
    /// Seconds each side may take.
    pub(crate) timeout_secs: u64,
    /// Idle sessions in the memory figure.
    pub(crate) sessions: usize,
    /// Idle streams in the memory figure.
    pub(crate) streams: usize,
}

impl Default for RelayOptions {
    fn default() -> Self {
        Self {
            messages: 2_000_000,
            timeout_secs: 60,
            sessions: 64,
            streams: 512,
        }
    }
}

/// Most messages `--messages` accepts.
pub(crate) const MAX_MESSAGES: u64 = publisher::MAX_MESSAGES;
/// Messages per publisher write.
const BATCH: usize = 1024;

/// Why a part of the run failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RelayError {
    /// Certificates, configs or the bench's own plumbing.
    #[error("setup: {0}")]
    Setup(String),
    /// A socket or runtime operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The publisher or the receiving driver failed.
    #[error(transparent)]
    Ingest(#[from] IngestError),
    /// The router could not open the stream.
    #[error("open_stream: {0}")]
    Open(#[from] continuum_bus::BusStreamError),
    /// The deadline passed first.
    #[error("{0}: the deadline passed")]
    Timeout(&'static str),
    /// A thread of the run panicked.
    #[error("the {0} thread panicked")]
    Panicked(&'static str),
}

impl From<RelayError> for crate::error::BenchError {
    fn from(e: RelayError) -> Self {
        Self::stage(crate::error::Stage::BusRelay, e)
    }
}

/// The two CPUs of a run: the receiver's, and everyone else's.
type Cpus = Option<(usize, usize)>;

/// One side's figures.
struct Side {
    name: String,
    tally: Tally,
    published: Published,
    /// CPU of the listener thread and of the broker thread (bus sides only).
    relay_cpu_ns: Option<(u64, u64)>,
}

fn direct(opts: RelayOptions, template: &Template, cpus: Cpus) -> Result<Side, RelayError> {
    let deadline = Instant::now() + Duration::from_secs(opts.timeout_secs);
    let (recv_cpu, pub_cpu) = split(cpus);
    let listener = bind()?;
    let addr = local(&listener)?;
    let (tally, published) = std::thread::scope(|s| {
        let publisher = s
            .spawn(|| publisher::run(&listener, template, opts.messages, BATCH, deadline, pub_cpu));
        let receiver = s.spawn(|| run_monoio(addr, opts.messages, deadline, recv_cpu));
        (
            join(receiver, "receiver").and_then(|r| Ok(r?)),
            join(publisher, "publisher").and_then(|r| Ok(r?)),
        )
    });
    let (tally, driver) = tally?;
    Ok(Side {
        name: format!("direct TCP ({driver})"),
        tally,
        published: published?,
        relay_cpu_ns: None,
    })
}

fn bus(
    opts: RelayOptions,
    template: &Template,
    cpus: Cpus,
    budget: Budget,
) -> Result<Side, RelayError> {
    let deadline = Instant::now() + Duration::from_secs(opts.timeout_secs);
    let listener = bind()?;
    let ((tally, driver), cost) = relay::relayed(
        budget,
        cpus,
        Topic::KvMetrics,
        &listener,
        |cpu| {
            Ok(publisher::run(
                &listener,
                template,
                opts.messages,
                BATCH,
                deadline,
                cpu,
            )?)
        },
        |api, port| receive(api, port, opts.messages, deadline),
    )?;
    Ok(Side {
        name: format!(
            "bus, {} ({} KiB windows; {driver})",
            budget.label(),
            cost.window_bytes >> 10
        ),
        tally,
        published: cost.published,
        relay_cpu_ns: Some((cost.listener_cpu_ns, cost.broker_cpu_ns)),
    })
}

/// The shard's side of a bus run: opens a `kv_metrics` stream to the publisher on `port` and
/// runs the driver over it.
fn receive(
    api: &continuum_bus::EventBus,
    port: u16,
    total: u64,
    deadline: Instant,
) -> Result<(Tally, &'static str), RelayError> {
    let (mut rt, driver) = shard_runtime()?;
    let tally = rt.block_on(async move {
        let mut sock = relay::open_relayed(api, port, Topic::KvMetrics, deadline).await?;
        Ok::<Tally, RelayError>(drive(&mut sock, total, deadline, "router over the bus").await?)
    })?;
    Ok((tally, driver))
}

fn split(cpus: Cpus) -> (Option<usize>, Option<usize>) {
    cpus.map_or((None, None), |(r, p)| (Some(r), Some(p)))
}

fn bind() -> Result<TcpListener, RelayError> {
    TcpListener::bind("127.0.0.1:0").map_err(|source| RelayError::Io {
        what: "binding the publisher",
        source,
    })
}

fn local(l: &TcpListener) -> Result<std::net::SocketAddr, RelayError> {
    l.local_addr().map_err(|source| RelayError::Io {
        what: "the publisher's address",
        source,
    })
}

fn join<T>(h: std::thread::ScopedJoinHandle<'_, T>, what: &'static str) -> Result<T, RelayError> {
    h.join().map_err(|_| RelayError::Panicked(what))
}

/// Runs every side and the memory figures, and renders the report.
pub(crate) fn run(opts: RelayOptions) -> Result<String, RelayError> {
    let template = Template::new()?;
    let ncpu = std::thread::available_parallelism().map_or(1, usize::from);
    let cpus = (ncpu >= 2).then_some((0, 1));
    let mut sides = Vec::new();
    eprintln!("bus-relay: direct: {} messages ...", opts.messages);
    sides.push(direct(opts, &template, cpus)?);
    for budget in [Budget::Default, Budget::Largest] {
        eprintln!(
            "bus-relay: bus, {}: {} messages ...",
            budget.label(),
            opts.messages
        );
        sides.push(bus(opts, &template, cpus, budget)?);
    }
    eprintln!(
        "bus-relay: memory of {} idle sessions and {} idle streams ...",
        opts.sessions, opts.streams
    );
    let deadline = Instant::now() + Duration::from_secs(opts.timeout_secs);
    let mem = memory::measure(opts.sessions, opts.streams, deadline)?;
    Ok(render(opts, &template, cpus, &sides, &mem))
}

fn render(
    opts: RelayOptions,
    template: &Template,
    cpus: Cpus,
    sides: &[Side],
    mem: &memory::Figures,
) -> String {
    let mut r = String::new();
    let len = template.wire.len();
    let _ = writeln!(
        r,
        "bus-relay: {m} kv_metrics messages per side, {len} B each on the wire ({mb:.0} MB), from \
         zmtp-ingest's raw ZMTP PUB peer ({BATCH} messages per write) into the shards' ZMTP \
         driver on the shards' runtime",
        m = opts.messages,
        mb = (opts.messages * len as u64) as f64 / 1e6,
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
        "figures over messages 2..=M; cpu ns/msg per thread (shard = the receiving driver)\n"
    );
    let _ = writeln!(
        r,
        "{:<52} {:>9} {:>9} {:>10} {:>11} {:>10} {:>10}",
        "side", "MB/s", "msgs/s", "shard ns", "listener ns", "broker ns", "pub ns"
    );
    let per = |ns: u64, msgs: u64| ns as f64 / msgs.max(1) as f64;
    // (MB/s, shard ns/msg, the busier router thread's ns/msg)
    let mut rates = Vec::new();
    for side in sides {
        let Some(m) = side.tally.measured() else {
            let _ = writeln!(r, "{:<52} not measured (no complete interval)", side.name);
            rates.push(None);
            continue;
        };
        let mbps = m.rate() * len as f64 / 1e6;
        let listener_ns = side
            .relay_cpu_ns
            .map_or(0.0, |(l, _)| per(l, side.published.messages));
        rates.push(Some((
            mbps,
            m.cpu_per_msg_ns(),
            m.cpu_per_msg_ns().max(listener_ns),
        )));
        let (listener, broker) =
            side.relay_cpu_ns
                .map_or(("-".to_owned(), "-".to_owned()), |(l, b)| {
                    let msgs = side.published.messages;
                    (
                        format!("{:.1}", per(l, msgs)),
                        format!("{:.1}", per(b, msgs)),
                    )
                });
        let _ = writeln!(
            r,
            "{:<52} {:>9.1} {:>9.0} {:>10.1} {:>11} {:>10} {:>10.1}",
            side.name,
            mbps,
            m.rate(),
            m.cpu_per_msg_ns(),
            listener,
            broker,
            per(side.published.cpu_ns, side.published.messages),
        );
        if side.tally.anomalies() > 0 {
            let _ = writeln!(
                r,
                "  WARNING: {} messages rejected, dropped or out of sequence: not a clean stream",
                side.tally.anomalies()
            );
        }
    }
    let _ = writeln!(r);
    if let Some(Some((base, base_cpu, _))) = rates.first() {
        for (side, rate) in sides.iter().zip(&rates).skip(1) {
            if let Some((mbps, cpu, busier)) = rate {
                let _ = writeln!(
                    r,
                    "{}/direct: throughput {:.2}x (goal >= 0.8x), shard CPU per message {:.2}x, \
                     router-side capacity {:.2}x (messages per CPU-second of the busier router \
                     thread)",
                    side.name,
                    mbps / base.max(1e-9),
                    cpu / base_cpu.max(1e-9),
                    base_cpu / busier.max(1e-9),
                );
            }
        }
    }
    memory::render(mem, &mut r);
    r
}
