//! One subscription task: connect through a [`Connector`], run the session driver with the
//! family's sink, and reconnect with full-jitter backoff (500 ms..30 s, reset after a 30 s
//! session: LOAD-STORE-17, LOAD-ZMTP-17) until told to stop.
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
/// Backoff floor (LOAD-STORE-17).
const BACKOFF_FLOOR: Duration = Duration::from_millis(500);
/// Backoff ceiling.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A session at least this long resets the backoff (LOAD-ZMTP-17).
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(30);

/// How a subscription reaches its publisher: a direct TCP connection today, the event-bus
/// broker's tunnel later (BROKER-02).
pub(crate) trait Connector {
    /// The connected byte stream.
    type Stream: AsyncReadRent + AsyncWriteRent;

    /// Connect to the publisher at `addr`.
    async fn connect(&self, addr: SocketAddr) -> Result<Self::Stream, SessionEnd>;
}

/// A direct TCP connection, bounded by [`CONNECT_TIMEOUT`], with `TCP_NODELAY`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DirectTcp;

impl Connector for DirectTcp {
    type Stream = TcpStream;

    async fn connect(&self, addr: SocketAddr) -> Result<TcpStream, SessionEnd> {
        match monoio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect_addr(addr)).await {
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
    pub(crate) addr: SocketAddr,
    pub(crate) shard: usize,
    pub(crate) jitter: Rc<Jitter>,
    pub(crate) stop: LocalSignal,
}

/// Run one subscription until its stop signal fires.
pub(crate) async fn run<C: Connector, K: Sink>(connector: C, spec: Spec, mut sink: K) {
    let Spec {
        publisher,
        addr,
        shard,
        jitter,
        stop,
    } = spec;
    let mut backoff = JitteredBackoff::new(BACKOFF_FLOOR, BACKOFF_MAX, BACKOFF_RESET_AFTER);
    loop {
        sink.on_state(SubState::Connecting);
        let started = clock::instant();
        let ended = monoio::select! {
            _ = stop.wait() => return,
            ended = session(&connector, addr, &mut sink) => ended,
        };
        if let Err(why) = ended {
            tracing::debug!(shard, %publisher, reason = %why, "subscription ended");
        }
        sink.on_state(SubState::Backoff);
        let delay = backoff.session_ended(started.elapsed(), jitter.unit());
        monoio::select! {
            _ = stop.wait() => return,
            _ = monoio::time::sleep(delay) => {}
        }
    }
}

async fn session<C: Connector, K: Sink>(
    connector: &C,
    addr: SocketAddr,
    sink: &mut K,
) -> Result<usize, SessionEnd> {
    let mut stream = connector.connect(addr).await?;
    run_session(&mut stream, sink, HANDSHAKE_TIMEOUT).await
}
