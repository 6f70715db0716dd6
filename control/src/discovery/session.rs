//! One discovery session, generic over where the records come from.
//!
//! A session seeds (connect, authenticate, range-get every prefix at one revision), opens the
//! watches from revision + 1, and applies every event to the reducer until a stream ends
//! (DISC-ETCD-01..04). The seed runs under the fixed 30 s timeout; the watches have none
//! (DISC-ETCD-10). After each batch the reducer materialises and the view is handed to
//! `publish`, which skips it when it is the same `Arc` as before (DISC-ETCD-11).
//!
//! The source is a trait so sessions can be driven by a scripted source in unit tests (TEST-02)
//! and by etcd (`etcd.rs`) or the Dynamo file store in production.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use continuum_core::discovery::{FleetView, KvEvent, Reducer, UnixMillis};

/// The seed phase's fixed timeout (DISC-ETCD-10).
pub const SEED_TIMEOUT: Duration = Duration::from_secs(30);

/// After a batch, further batches arriving within this gap are applied before the view is
/// rebuilt, so a burst (a fleet starting, a rolling restart) costs one materialisation instead of
/// one per event.
pub const COALESCE_GAP: Duration = Duration::from_millis(20);
/// A burst is cut into views at least this often, so a steady stream of changes still publishes.
pub const COALESCE_MAX: Duration = Duration::from_millis(200);

/// One key change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The key now has this value.
    Put(Vec<u8>, Vec<u8>),
    /// The key is gone (deleted, or its lease expired).
    Delete(Vec<u8>),
}

/// Why a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    /// Could not connect, authenticate or seed.
    SeedFailed(String),
    /// The seed did not finish within [`SEED_TIMEOUT`].
    SeedTimeout,
    /// The watch start revision was compacted away.
    Compacted,
    /// The server cancelled a watch.
    Cancelled(String),
    /// The connection or stream broke.
    Disconnected(String),
    /// The supervisor asked the session to stop.
    Stopped,
    /// The server ended a Kubernetes watch when its `timeoutSeconds` was up: the normal cycle
    /// (DISC-K8S-POD-19), not a disconnection.
    WatchEnded,
}

impl std::fmt::Display for SessionEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionEnd::SeedFailed(e) => write!(f, "seed failed: {e}"),
            SessionEnd::SeedTimeout => write!(f, "seed timed out after {SEED_TIMEOUT:?}"),
            SessionEnd::Compacted => {
                f.write_str("watch revision compacted (resourceVersion expired)")
            }
            SessionEnd::Cancelled(r) => write!(f, "watch cancelled: {r}"),
            SessionEnd::Disconnected(e) => write!(f, "disconnected: {e}"),
            SessionEnd::Stopped => f.write_str("stopped"),
            SessionEnd::WatchEnded => f.write_str("the watch ended on time"),
        }
    }
}

/// A place sessions read records from.
#[allow(async_fn_in_trait)]
pub trait WatchSource {
    /// Connect and read every watched key at one revision.
    async fn seed(&mut self) -> Result<Vec<Change>, SessionEnd>;
    /// Open every watch from the seed revision + 1; returns once all are open.
    async fn open_watches(&mut self) -> Result<(), SessionEnd>;
    /// The next batch of changes, or why the watches ended.
    async fn next(&mut self) -> Result<Vec<Change>, SessionEnd>;
}

/// How a session went.
#[derive(Debug)]
pub struct SessionReport {
    /// Why it ended.
    pub end: SessionEnd,
    /// How long every watch was open (zero when the session never got that far).
    pub healthy_for: Duration,
}

/// The wall clock for `first_seen` / `last_updated`, as milliseconds since the Unix epoch.
pub fn wall_clock_now() -> UnixMillis {
    let ms = crate::clock::wall()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    UnixMillis(ms)
}

/// Run one session: seed, watch, apply until the source ends. `connected` is told when every
/// watch is open (true) and when the session ends (false).
pub async fn drive_session<S: WatchSource>(
    source: &mut S,
    reducer: &Mutex<Reducer>,
    mut publish: impl FnMut(Arc<FleetView>),
    mut connected: impl FnMut(bool),
) -> SessionReport {
    let seeded = tokio::time::timeout(SEED_TIMEOUT, async {
        let seed = source.seed().await?;
        source.open_watches().await?;
        Ok::<_, SessionEnd>(seed)
    })
    .await;
    let seed = match seeded {
        Ok(Ok(seed)) => seed,
        Ok(Err(end)) => {
            return SessionReport {
                end,
                healthy_for: Duration::ZERO,
            };
        }
        Err(_) => {
            return SessionReport {
                end: SessionEnd::SeedTimeout,
                healthy_for: Duration::ZERO,
            };
        }
    };
    let now = wall_clock_now();
    let view = {
        let mut r = lock(reducer);
        r.begin_resync();
        for c in &seed {
            apply(&mut r, c, now);
        }
        r.end_resync();
        r.materialize()
    };
    drop(seed);
    publish(view);
    let healthy_since = crate::clock::instant();
    connected(true);
    // Coalesce bursts (a fleet starting, a rolling restart): batches that follow each other within
    // `COALESCE_GAP` are applied before one view is built, and a long burst still publishes every
    // `COALESCE_MAX`. The pending `next()` future is kept across the wait, never dropped, so a
    // source that is not cancel-safe loses nothing.
    let mut dirty_since: Option<Instant> = None;
    let end = loop {
        let mut fut = std::pin::pin!(source.next());
        let outcome = loop {
            let Some(since) = dirty_since else {
                break fut.as_mut().await;
            };
            let wait = COALESCE_GAP.min(COALESCE_MAX.saturating_sub(since.elapsed()));
            match tokio::time::timeout(wait, fut.as_mut()).await {
                Ok(outcome) => break outcome,
                Err(_) => {
                    // The burst paused (or ran long): publish what has been applied so far and
                    // keep waiting on the same pending `next()`.
                    // Release the reducer before publishing: `publish` may lock it again.
                    let view = lock(reducer).materialize();
                    publish(view);
                    dirty_since = None;
                }
            }
        };
        match outcome {
            Ok(batch) => {
                apply_batch(reducer, &batch);
                dirty_since.get_or_insert_with(crate::clock::instant);
            }
            Err(end) => {
                if dirty_since.is_some() {
                    let view = lock(reducer).materialize();
                    publish(view);
                }
                break end;
            }
        }
    };
    connected(false);
    SessionReport {
        end,
        healthy_for: healthy_since.elapsed(),
    }
}

fn apply_batch(reducer: &Mutex<Reducer>, batch: &[Change]) {
    let now = wall_clock_now();
    let mut r = lock(reducer);
    for c in batch {
        apply(&mut r, c, now);
    }
}

fn apply(r: &mut Reducer, c: &Change, now: UnixMillis) {
    match c {
        Change::Put(k, v) => r.apply(KvEvent::Put { key: k, value: v }, now),
        Change::Delete(k) => r.apply(KvEvent::Delete { key: k }, now),
    }
}

/// Lock the reducer; a poisoned lock (a panic elsewhere, which release builds abort on anyway)
/// still yields the reducer.
pub fn lock(reducer: &Mutex<Reducer>) -> std::sync::MutexGuard<'_, Reducer> {
    reducer
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
