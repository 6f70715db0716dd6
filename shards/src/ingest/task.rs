//! One subscription task: connect through a [`Connector`], run the session driver with the
//! family's sink, and reconnect with full-jitter backoff (500 ms..30 s, reset after a 30 s
//! session: LOAD-STORE-17, LOAD-ZMTP-17) until told to stop.
//!
//! A connector that cannot connect now (`transport: broker` with no broker covering the
//! namespace) leaves the subscription **pending**: the task waits for the connector to become
//! ready, without polling, then starts after a random jitter of up to [`PENDING_WAKE_JITTER`]
//! (BROKER-06/07). A session cut by its carrier (the broker session ended or drains) reconnects
//! after at most the backoff floor, without growing the backoff (BROKER-09).
//!
//! Invariants: the address connected is the one the control thread resolved and allowed (no
//! resolution here, CFG-20); a direct connect is bounded by [`CONNECT_TIMEOUT`] (LOAD-ZMTP-18);
//! the task reacts to its stop signal at every await.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use continuum_core::backoff::JitteredBackoff;
use continuum_core::discovery::PublisherId;
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use monoio::net::TcpStream;

use super::driver::{HANDSHAKE_TIMEOUT, SessionEnd, Sink, run_session};
use crate::clock;
use crate::notify::LocalSignal;
use crate::signals::subs::SubState;

/// TCP connect bound (LOAD-ZMTP-18).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Backoff floor (LOAD-STORE-17; `RECONNECT_INITIAL` of BROKER-09).
const BACKOFF_FLOOR: Duration = Duration::from_millis(500);
/// Backoff ceiling.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A session at least this long resets the backoff (LOAD-ZMTP-17).
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(30);
/// The most a pending subscription waits after its connector became ready, so that a broker
/// that connects does not get every pending stream at the same instant (BROKER-07).
pub(crate) const PENDING_WAKE_JITTER: Duration = Duration::from_millis(500);

/// How a subscription reaches its publisher (BROKER-02): a direct TCP connection
/// ([`DirectTcp`]) or a stream relayed by a broker over the event bus (`BrokerConnector`).
pub(crate) trait Connector {
    /// The connected byte stream.
    type Stream: AsyncReadRent + AsyncWriteRent;

    /// Whether a connect can be attempted now. A connector that is not ready leaves its
    /// subscription pending.
    fn ready(&self) -> bool {
        true
    }

    /// Resolves once [`Connector::ready`] holds (at once if it does).
    async fn until_ready(&self) {}

    /// Connect to the publisher.
    async fn connect(&self) -> Result<Self::Stream, SessionEnd>;

    /// Called once after every session end (or failed connect): whether the carrier, not the
    /// publisher, cut it (BROKER-09: reconnect after the floor delay, backoff not grown). May
    /// wait a bounded time to tell.
    async fn carrier_lost(&self) -> bool {
        false
    }
}

/// A direct TCP connection to the resolved, allowed address, bounded by [`CONNECT_TIMEOUT`],
/// with `TCP_NODELAY`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DirectTcp(pub(crate) SocketAddr);

impl Connector for DirectTcp {
    type Stream = TcpStream;

    async fn connect(&self) -> Result<TcpStream, SessionEnd> {
        match monoio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect_addr(self.0)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                Ok(s)
            }
            Ok(Err(e)) => Err(SessionEnd::Connect(e)),
            Err(_) => Err(SessionEnd::ConnectTimeout),
        }
    }
}

/// Shard-local xorshift64* state for backoff jitter (seeded per shard).
#[derive(Debug)]
pub(crate) struct Jitter(Cell<u64>);

impl Jitter {
    /// A generator seeded for shard `shard`.
    pub(crate) fn for_shard(shard: usize) -> Self {
        Self(Cell::new(
            0x9E37_79B9_7F4A_7C15 ^ (shard as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9),
        ))
    }

    /// A uniform random number in `[0, 1)`.
    pub(crate) fn unit(&self) -> f64 {
        let mut x = self.0.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0.set(x);
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Where one subscription runs and how it is told to stop.
#[derive(Debug)]
pub(crate) struct Spec {
    pub(crate) publisher: PublisherId,
    pub(crate) shard: usize,
    pub(crate) jitter: Rc<Jitter>,
    pub(crate) stop: LocalSignal,
}

/// Run one subscription until its stop signal fires.
pub(crate) async fn run<C: Connector, K: Sink>(connector: C, spec: Spec, mut sink: K) {
    let Spec {
        publisher,
        shard,
        jitter,
        stop,
    } = spec;
    let mut backoff = JitteredBackoff::new(BACKOFF_FLOOR, BACKOFF_MAX, BACKOFF_RESET_AFTER);
    loop {
        if !connector.ready() {
            sink.on_state(SubState::Pending);
            monoio::select! {
                _ = stop.wait() => return,
                _ = connector.until_ready() => {}
            }
            let wake = PENDING_WAKE_JITTER.mul_f64(jitter.unit());
            monoio::select! {
                _ = stop.wait() => return,
                _ = monoio::time::sleep(wake) => {}
            }
            continue;
        }
        sink.on_state(SubState::Connecting);
        let started = clock::instant();
        let ended = monoio::select! {
            _ = stop.wait() => return,
            ended = session(&connector, &mut sink) => ended,
        };
        let carrier_lost = monoio::select! {
            _ = stop.wait() => return,
            lost = connector.carrier_lost() => lost,
        };
        match &ended {
            // No covering broker after all: pending again, no backoff.
            Err(SessionEnd::Uncovered) if !connector.ready() => continue,
            Err(why @ (SessionEnd::Closed | SessionEnd::Io(_))) if !carrier_lost => {
                tracing::debug!(shard, %publisher, reason = %why, "publisher connection lost");
                sink.on_lost();
            }
            Err(why) => {
                tracing::debug!(shard, %publisher, reason = %why, carrier_lost, "subscription ended")
            }
            Ok(_) => {}
        }
        sink.on_state(SubState::Backoff);
        let delay = if carrier_lost {
            BACKOFF_FLOOR.mul_f64(jitter.unit())
        } else {
            backoff.session_ended(started.elapsed(), jitter.unit())
        };
        monoio::select! {
            _ = stop.wait() => return,
            _ = monoio::time::sleep(delay) => {}
        }
    }
}

async fn session<C: Connector, K: Sink>(connector: &C, sink: &mut K) -> Result<usize, SessionEnd> {
    let mut stream = connector.connect().await?;
    run_session(&mut stream, sink, HANDSHAKE_TIMEOUT).await
}
