//! `bus-relay`'s memory figures: the bytes the listener holds per idle broker session and per
//! idle data stream, against the BUS-28 budget.
//!
//! Counted with the bench's allocator: the process's live bytes before and after opening N
//! sessions (N broker entries, one TLS + HTTP/2 connection each) and then M streams (placed by
//! the listener across the sessions, each relaying an idle TCP target), minus what the two other
//! parties allocated on their own threads: the brokers (one tokio current-thread runtime on one
//! thread, the idle targets' acceptor included) and the stream holder (this thread: the
//! `BusStream`s and the runtime that opened them). What is left is the listener's: its thread,
//! its state, and the streams' pipes.
//!
//! Invariants: every wait is bounded by the deadline; the brokers' thread ends when this returns.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use continuum_bus::{BusStream, ZmqTarget};
use continuum_event_bus::message::Topic;
use tokio::sync::{mpsc, oneshot, watch};

use continuum_event_broker::{Advertised, Dial};

use super::RelayError;
use super::setup::{self, Budget};
use crate::alloc::{live_bytes, thread_net_bytes};

/// What the figures found.
pub(crate) struct Figures {
    sessions: usize,
    streams: usize,
    /// The listener's bytes per idle session.
    listener_per_session: f64,
    /// The brokers' bytes per idle session (their side, for scale).
    broker_per_session: f64,
    /// The listener's bytes per idle stream.
    listener_per_stream: f64,
    /// The holder's bytes per idle stream (a shard's side).
    holder_per_stream: f64,
    /// The brokers' bytes per idle stream (their side, for scale).
    broker_per_stream: f64,
    /// BUS-28's per-stream, per-direction budget.
    stream_budget: u64,
    /// The per-session budget.
    session_budget: u64,
}

/// A request to the brokers' thread.
enum Ask {
    /// Open every session, each relaying only the idle target.
    Open,
    /// Answer with the thread's net allocated bytes.
    Net(oneshot::Sender<i64>),
}

/// The brokers' thread: an idle TCP target (accepts and holds every connection), and on
/// [`Ask::Open`] every session; ends when `asks` closes.
fn brokers(
    dials: Vec<Dial>,
    mut asks: mpsc::Receiver<Ask>,
    target_port: oneshot::Sender<u16>,
) -> Result<(), RelayError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| RelayError::Io {
            what: "the brokers' runtime",
            source,
        })?;
    rt.block_on(async move {
        let idle = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|source| RelayError::Io {
                what: "binding the idle target",
                source,
            })?;
        let port = idle
            .local_addr()
            .map_err(|source| RelayError::Io {
                what: "the idle target's address",
                source,
            })?
            .port();
        let _ = target_port.send(port);
        let acceptor = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = idle.accept().await {
                held.push(s);
            }
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        while let Some(ask) = asks.recv().await {
            match ask {
                Ask::Net(tx) => {
                    let _ = tx.send(thread_net_bytes());
                }
                Ask::Open => {
                    let advertised = Arc::new(Advertised::from_entries([(
                        setup::NAMESPACE.to_owned(),
                        "127.0.0.1".to_owned(),
                        port,
                        Topic::KvEvents,
                    )]));
                    // Read at each subscribe; nothing updates it here.
                    let (_, advertised) = watch::channel(advertised);
                    for dial in dials.clone() {
                        let (advertised, drain) = (advertised.clone(), stop_rx.clone());
                        tokio::spawn(continuum_event_broker::run(
                            dial,
                            advertised,
                            drain,
                            Arc::default(),
                        ));
                    }
                }
            }
        }
        drop(stop_tx);
        acceptor.abort();
        Ok(())
    })
}

/// Asks the brokers' thread for its net bytes.
async fn broker_net(asks: &mpsc::Sender<Ask>) -> Result<i64, RelayError> {
    let (tx, rx) = oneshot::channel();
    asks.send(Ask::Net(tx))
        .await
        .map_err(|_| RelayError::Setup("the brokers' thread ended".into()))?;
    rx.await
        .map_err(|_| RelayError::Setup("the brokers' thread ended".into()))
}

/// Live bytes, the brokers' net bytes and this thread's, after a settling pause.
async fn reading(asks: &mpsc::Sender<Ask>) -> Result<(i64, i64, i64), RelayError> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    let broker = broker_net(asks).await?;
    let live = i64::try_from(live_bytes()).unwrap_or(i64::MAX);
    Ok((live, broker, thread_net_bytes()))
}

/// Opens `sessions` idle sessions, then `streams` idle streams, and measures.
pub(crate) fn measure(
    sessions: usize,
    streams: usize,
    deadline: Instant,
) -> Result<Figures, RelayError> {
    let setup = setup::start(sessions, Budget::Default)?;
    let dials = (0..sessions).map(|i| setup.dial(i)).collect();
    let (asks_tx, asks_rx) = mpsc::channel(4);
    let (port_tx, port_rx) = oneshot::channel();
    let brokers = std::thread::spawn(move || brokers(dials, asks_rx, port_tx));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| RelayError::Io {
            what: "the holder's runtime",
            source,
        })?;
    let api = setup.listener.bus();
    let left = deadline.saturating_duration_since(Instant::now());
    let measured = rt.block_on(async {
        tokio::time::timeout(left, async {
            let port = port_rx
                .await
                .map_err(|_| RelayError::Setup("the brokers' thread ended".into()))?;
            let mut held: Vec<BusStream> = Vec::with_capacity(streams);
            let before = reading(&asks_tx).await?;
            asks_tx
                .send(Ask::Open)
                .await
                .map_err(|_| RelayError::Setup("the brokers' thread ended".into()))?;
            while api.session_count() < sessions {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let with_sessions = reading(&asks_tx).await?;
            for _ in 0..streams {
                // Distinct targets (host names differ), one idle TCP target behind them all.
                let target = ZmqTarget {
                    namespace: setup::NAMESPACE.to_owned(),
                    host: "127.0.0.1".to_owned(),
                    port,
                };
                held.push(api.open_stream(&target, Topic::KvEvents)?.wait().await?);
            }
            let with_streams = reading(&asks_tx).await?;
            drop(held);
            Ok::<_, RelayError>((before, with_sessions, with_streams))
        })
        .await
        .map_err(|_| RelayError::Timeout("opening idle sessions and streams"))?
    });
    drop(asks_tx);
    let _ = brokers.join();
    let (before, with_sessions, with_streams) = measured?;
    let listener_share =
        |a: (i64, i64, i64), b: (i64, i64, i64)| (b.0 - a.0) - (b.1 - a.1) - (b.2 - a.2);
    let per = |bytes: i64, n: usize| bytes as f64 / n.max(1) as f64;
    let figures = Figures {
        sessions,
        streams,
        listener_per_session: per(listener_share(before, with_sessions), sessions),
        broker_per_session: per(with_sessions.1 - before.1, sessions),
        listener_per_stream: per(listener_share(with_sessions, with_streams), streams),
        holder_per_stream: per(with_streams.2 - with_sessions.2, streams),
        broker_per_stream: per(with_streams.1 - with_sessions.1, streams),
        stream_budget: setup.bus.per_stream_buffer_bytes(),
        session_budget: setup.bus.max_session_buffer_bytes,
    };
    setup.listener.stop();
    Ok(figures)
}

/// Appends the memory lines to the report.
pub(crate) fn render(f: &Figures, r: &mut String) {
    let _ = writeln!(
        r,
        "memory (live bytes, the brokers' and the holder's own allocations taken out):"
    );
    let _ = writeln!(
        r,
        "  per idle session ({n} sessions, default budget): listener {l:.0} B ({pct:.3}% of the \
         {b} MiB session budget); each broker's own side {k:.0} B",
        n = f.sessions,
        l = f.listener_per_session,
        pct = 100.0 * f.listener_per_session / f.session_budget.max(1) as f64,
        b = f.session_budget >> 20,
        k = f.broker_per_session,
    );
    let both = 2 * f.stream_budget;
    let _ = writeln!(
        r,
        "  per idle stream ({n} streams): listener {l:.0} B, the holder (a shard) {h:.0} B; \
         BUS-28 budget {both} B per stream (2 x {b} B): {verdict}; the broker's side {k:.0} B",
        n = f.streams,
        l = f.listener_per_stream,
        h = f.holder_per_stream,
        k = f.broker_per_stream,
        b = f.stream_budget,
        verdict = if f.listener_per_stream + f.holder_per_stream <= both as f64 {
            "within"
        } else {
            "OVER"
        },
    );
}
