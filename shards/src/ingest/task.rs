//! One subscription task: connect, speak ZMTP, hand samples to the load store, and reconnect
//! with full-jitter backoff (500 ms..30 s, reset after a 30 s session: LOAD-STORE-17,
//! LOAD-ZMTP-17) until told to stop.
//!
//! Invariants: the address connected is the one the control thread resolved and allowed (no
//! resolution here, CFG-20); connect is bounded by [`CONNECT_TIMEOUT`] (LOAD-ZMTP-18); the task
//! reacts to its stop signal at every await.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use continuum_core::backoff::JitteredBackoff;
use continuum_core::discovery::PublisherId;
use monoio::net::TcpStream;

use super::status::SubState;
use crate::shard::Shard;
use crate::signal::LocalSignal;

/// TCP connect bound (LOAD-ZMTP-18).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Backoff floor (LOAD-STORE-17).
const BACKOFF_FLOOR: Duration = Duration::from_millis(500);
/// Backoff ceiling.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A session at least this long resets the backoff (LOAD-ZMTP-17).
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(30);

/// Run the subscription of `publisher` at `addr` until `stop` fires.
pub(super) async fn run(
    shard: Rc<Shard>,
    publisher: PublisherId,
    addr: SocketAddr,
    stop: LocalSignal,
) {
    let mut backoff = JitteredBackoff::new(BACKOFF_FLOOR, BACKOFF_MAX, BACKOFF_RESET_AFTER);
    loop {
        shard.subs_table.set_state(publisher, SubState::Connecting);
        let started = Instant::now();
        let ended = monoio::select! {
            _ = stop.wait() => return,
            ended = session(&shard, publisher, addr) => ended,
        };
        if let Err(why) = ended {
            tracing::debug!(shard = shard.id, %publisher, reason = %why, "load subscription ended");
        }
        shard.subs_table.set_state(publisher, SubState::Backoff);
        let delay = backoff.session_ended(started.elapsed(), shard.random_unit());
        monoio::select! {
            _ = stop.wait() => return,
            _ = monoio::time::sleep(delay) => {}
        }
    }
}

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionEnd {
    #[error("connect failed: {0}")]
    Connect(std::io::Error),
    #[error("connect timed out")]
    ConnectTimeout,
    #[error("connection closed")]
    Closed,
    #[error("I/O error: {0}")]
    Io(std::io::Error),
    #[error("protocol refused: {0}")]
    Refused(String),
}

async fn session(
    shard: &Rc<Shard>,
    publisher: PublisherId,
    addr: SocketAddr,
) -> Result<(), SessionEnd> {
    let stream = match monoio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect_addr(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(SessionEnd::Connect(e)),
        Err(_) => return Err(SessionEnd::ConnectTimeout),
    };
    let _ = stream.set_nodelay(true);
    super::protocol::run(shard, publisher, stream).await
}
