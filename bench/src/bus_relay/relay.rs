//! One publisher relayed through the event bus, as `transport: broker` runs it: the router's
//! listener (`continuum_bus`, its own thread, pinned with the router), the broker
//! (`continuum-event-broker`'s library on its own thread, pinned with the publisher) advertising
//! the publisher, and the router side opening the stream and reading its Unix socket on the
//! shards' runtime. `bus-relay` (kv_metrics) and `bus-kv` (kv-events applied to an index) both
//! run their bus sides through [`relayed`].
//!
//! Invariants: every thread ends by the caller's deadline (the broker stops once the receiver
//! returns); the listener stops before [`relayed`] returns; CPU figures are per thread, from
//! `/proc/self/task/*/stat`.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use continuum_bus::{EventBus, Topic, ZmqTarget};
use monoio::io::AsyncReadRentExt as _;

use super::RelayError;
use super::setup::{self, Budget};
use crate::zmtp_ingest::publisher::Published;
use crate::zmtp_ingest::{ThreadClock, pin_to_cpu};

/// What a relayed run measured besides the receiver's own figures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RelayCost {
    /// The publisher's figures.
    pub(crate) published: Published,
    /// CPU of the listener thread over the run, in nanoseconds.
    pub(crate) listener_cpu_ns: u64,
    /// CPU of the broker thread over the run, in nanoseconds.
    pub(crate) broker_cpu_ns: u64,
    /// The per-stream, per-direction HTTP/2 window under `budget`.
    pub(crate) window_bytes: u64,
}

/// Runs `publish` (on its own thread, pinned to the cluster's CPU; it accepts on `publisher`)
/// relayed by a broker through a listener with `budget` into `receive` (on its own thread,
/// pinned to the router's CPU; it gets the command API and the publisher's port). Returns what
/// `receive` returned and the relay's cost.
pub(crate) fn relayed<T, P, R>(
    budget: Budget,
    cpus: Option<(usize, usize)>,
    topic: Topic,
    publisher: &TcpListener,
    publish: P,
    receive: R,
) -> Result<(T, RelayCost), RelayError>
where
    T: Send,
    P: FnOnce(Option<usize>) -> Result<Published, RelayError> + Send,
    R: FnOnce(&EventBus, u16) -> Result<T, RelayError> + Send,
{
    let (recv_cpu, pub_cpu) = cpus.map_or((None, None), |(r, p)| (Some(r), Some(p)));
    let port = publisher
        .local_addr()
        .map_err(|source| RelayError::Io {
            what: "the publisher's address",
            source,
        })?
        .port();
    let setup = setup::start(1, budget)?;
    // The thread names itself once it runs.
    let bus_tid = (0..200)
        .find_map(|_| {
            setup::thread_id("event-bus").or_else(|| {
                std::thread::sleep(Duration::from_millis(5));
                None
            })
        })
        .ok_or_else(|| RelayError::Setup("no event-bus thread".into()))?;
    // The router's threads (listener and shard) on one CPU, the cluster's (publisher and broker)
    // on the other, as a router node and the cluster it relays from.
    if let Some(cpu) = recv_cpu {
        setup::pin_thread(bus_tid, cpu);
    }
    let api = setup.listener.bus();
    let dial = setup.dial(0);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let bus_cpu_before = setup::thread_cpu_ns(bus_tid).unwrap_or(0);
    let (received, published, broker_cpu) = std::thread::scope(|s| {
        let publisher = s.spawn(move || publish(pub_cpu));
        let broker = s.spawn(move || {
            if let Some(cpu) = pub_cpu {
                pin_to_cpu(cpu);
            }
            let clock = ThreadClock::now();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|source| RelayError::Io {
                    what: "the broker's runtime",
                    source,
                })?;
            let advertised = continuum_event_broker::Advertised::from_entries([(
                setup::NAMESPACE.to_owned(),
                "127.0.0.1".to_owned(),
                port,
                topic,
            )]);
            let (_drain_tx, drain) = tokio::sync::watch::channel(false);
            rt.block_on(async {
                tokio::select! {
                    () = continuum_event_broker::run(
                        dial,
                        tokio::sync::watch::channel(std::sync::Arc::new(advertised)).1,
                        drain,
                        std::sync::Arc::default(),
                    ) => {}
                    _ = stop_rx => {}
                }
            });
            Ok::<u64, RelayError>(clock.elapsed_ns())
        });
        let receiver = s.spawn(move || {
            if let Some(cpu) = recv_cpu {
                pin_to_cpu(cpu);
            }
            let result = receive(&api, port);
            let _ = stop_tx.send(());
            result
        });
        (
            join(receiver, "receiver").and_then(|r| r),
            join(publisher, "publisher").and_then(|r| r),
            join(broker, "broker").and_then(|r| r),
        )
    });
    let listener_cpu_ns = setup::thread_cpu_ns(bus_tid)
        .unwrap_or(0)
        .saturating_sub(bus_cpu_before);
    let window_bytes = setup.bus.per_stream_buffer_bytes() / 4;
    setup.listener.stop();
    Ok((
        received?,
        RelayCost {
            published: published?,
            listener_cpu_ns,
            broker_cpu_ns: broker_cpu?,
            window_bytes,
        },
    ))
}

/// On the shards' runtime: once a broker covers the namespace, opens a `topic` stream to the
/// publisher on `port` and returns the stream's socket, its status byte read.
pub(crate) async fn open_relayed(
    api: &EventBus,
    port: u16,
    topic: Topic,
    deadline: Instant,
) -> Result<monoio::net::UnixStream, RelayError> {
    while !api.covers(setup::NAMESPACE) {
        if Instant::now() >= deadline {
            return Err(RelayError::Timeout("the broker's session"));
        }
        monoio::time::sleep(Duration::from_millis(5)).await;
    }
    let target = ZmqTarget {
        namespace: setup::NAMESPACE.to_owned(),
        host: "127.0.0.1".to_owned(),
        port,
    };
    // HTTP/2 ends on the listener's thread; the shard reads the stream from a socket whose first
    // byte says whether it opened.
    let io = |what: &'static str| move |source| RelayError::Io { what, source };
    let sock = api
        .open_stream(&target, topic)?
        .into_socket()
        .map_err(io("the stream's socket"))?;
    sock.set_nonblocking(true)
        .map_err(io("the stream's socket"))?;
    let mut sock = monoio::net::UnixStream::from_std(sock).map_err(io("the stream's socket"))?;
    let (res, status) = sock.read_exact(vec![0u8; 1]).await;
    res.map_err(io("the stream's status"))?;
    continuum_bus::open_status(status.first().copied().unwrap_or(u8::MAX))?;
    Ok(sock)
}

fn join<T>(h: std::thread::ScopedJoinHandle<'_, T>, what: &'static str) -> Result<T, RelayError> {
    h.join().map_err(|_| RelayError::Panicked(what))
}
