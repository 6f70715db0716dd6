//! `continuum-event-broker`: the in-cluster side of the event bus (BROKER). It runs where the
//! Dynamo workers' ZMQ publishers are reachable, dials **out** to the router's event bus listener
//! (the router never dials it, BUS-06), and relays, byte for byte, the publishers the router asks
//! for, but only those its discovery advertises (BROKER-14).
//!
//! Layers: [`advertised`] (what may be relayed), [`session`] (one control session: hello,
//! commands, heartbeats, draining), `relay` (one data stream), [`stats`] (counters and the
//! metrics port's answers), and [`run`], which keeps a session up with doubling backoff until
//! drained; `config` (the `--config` file) and `daemon` (discovery, TLS, signals, the metrics
//! port; feature `daemon`, on by default) make the process the binary runs.
//!
//! Invariants: the broker opens no listening port towards the router; every buffer is bounded
//! (a relay holds one read and one body chunk per direction); the token is never logged.

pub mod advertised;
mod body;
#[cfg(feature = "daemon")]
pub mod config;
#[cfg(feature = "daemon")]
pub mod daemon;
mod relay;
pub mod session;
pub mod stats;

use std::sync::Arc;
use std::time::Duration;

use continuum_core::backoff::DoublingBackoff;
use tokio::sync::watch;

pub use advertised::Advertised;
pub use session::{Dial, SessionError};
pub use stats::BrokerStats;

/// The first reconnect delay, doubled after each failed dial up to [`RECONNECT_MAX`].
pub const RECONNECT_INITIAL: Duration = Duration::from_millis(500);
/// The longest reconnect delay.
pub const RECONNECT_MAX: Duration = Duration::from_secs(30);
/// A session that lasted this long resets the backoff.
const HEALTHY_AFTER: Duration = Duration::from_secs(30);

/// Whether `drain` asks to drain: it turned true, or its sender is gone (whoever could have told
/// the broker to keep going has).
pub(crate) fn draining(drain: &watch::Receiver<bool>) -> bool {
    *drain.borrow() || drain.has_changed().is_err()
}

/// Keeps a session with the router up until `drain` asks to drain ([`draining`]) and the session
/// has drained (or none is up). Returns then.
pub async fn run(
    dial: Dial,
    advertised: watch::Receiver<Arc<Advertised>>,
    mut drain: watch::Receiver<bool>,
    stats: Arc<BrokerStats>,
) {
    let mut backoff = DoublingBackoff::new(RECONNECT_INITIAL, RECONNECT_MAX, HEALTHY_AFTER);
    loop {
        if draining(&drain) {
            return;
        }
        // tokio's clock: the runtime's, which tests can pause.
        let began = tokio::time::Instant::now();
        let err = match session::run(&dial, &advertised, &mut drain, &stats).await {
            Ok(()) => return,
            Err(e) => e,
        };
        let delay = backoff.session_ended(began.elapsed());
        tracing::warn!(error = %err, retry_in_ms = delay.as_millis() as u64, "event bus session ended");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = drain.changed() => {}
        }
    }
}
