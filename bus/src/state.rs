//! What the listener's tasks share: the config in force, the credential and session decisions
//! (`continuum_core::bus`), each session's end signal, and the counters. One mutex, held only for
//! a decision (never across an await); the listener is not on any client's request path.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use continuum_core::bus::credentials::Credentials;
use continuum_core::bus::sessions::{Sessions, connection_limit};
use continuum_core::config::dynamo::EventBusConfig;
use continuum_event_bus::code::Code;
use continuum_event_bus::ids::SessionId;
use tokio::sync::oneshot;

use continuum_core::bus::metrics::BusMetrics;

/// A source of 128 random bits for session ids (injected; the default draws from the TLS
/// provider's secure random).
pub type IdSource = Box<dyn FnMut() -> u128 + Send>;

pub(crate) struct Decisions {
    pub(crate) bus: EventBusConfig,
    pub(crate) credentials: Credentials,
    pub(crate) sessions: Sessions,
    /// How to end each active session (a newer session of its entry supersedes it).
    pub(crate) enders: HashMap<SessionId, oneshot::Sender<Code>>,
    /// Each active session's command link and streams.
    pub(crate) links: HashMap<SessionId, crate::link::Link>,
    pub(crate) ids: IdSource,
}

pub(crate) struct State {
    decisions: Mutex<Decisions>,
    pub(crate) metrics: Arc<BusMetrics>,
    connections: AtomicUsize,
    /// The connection limit in force (`4 × max_sessions`, at least 16, BUS-23).
    connection_limit: AtomicUsize,
    /// How long a commanded stream waits for its broker (BUS-33: 30 s).
    pub(crate) open_timeout: std::time::Duration,
    /// The listener's runtime, for timers the command API starts from other threads.
    runtime: std::sync::OnceLock<tokio::runtime::Handle>,
    /// Bumped whenever the set of sessions or their coverage changes (BUS-36's watch).
    pub(crate) sessions_changed: tokio::sync::watch::Sender<u64>,
}

impl State {
    pub(crate) fn new(
        bus: EventBusConfig,
        ids: IdSource,
        metrics: Arc<BusMetrics>,
        open_timeout: std::time::Duration,
    ) -> Self {
        let limit = connection_limit(bus.max_sessions);
        Self {
            decisions: Mutex::new(Decisions {
                credentials: Credentials::new(&bus, 0),
                sessions: Sessions::new(bus.max_sessions),
                bus,
                enders: HashMap::new(),
                links: HashMap::new(),
                ids,
            }),
            metrics,
            connections: AtomicUsize::new(0),
            connection_limit: AtomicUsize::new(limit),
            open_timeout,
            runtime: std::sync::OnceLock::new(),
            sessions_changed: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Tell the sessions watch that sessions or their coverage changed.
    pub(crate) fn sessions_changed(&self) {
        self.sessions_changed
            .send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Record the listener's runtime (once, when it starts).
    pub(crate) fn set_runtime(&self, handle: tokio::runtime::Handle) {
        let _ = self.runtime.set(handle);
    }

    /// The listener's runtime, once it runs.
    pub(crate) fn runtime(&self) -> Option<&tokio::runtime::Handle> {
        self.runtime.get()
    }

    /// See [`crate::Listener::reconfigure`].
    pub(crate) fn reconfigure(&self, bus: EventBusConfig) {
        let mut d = self.lock();
        let generation = d.credentials.ca_generation();
        d.credentials = d.credentials.reloaded(&bus, generation);
        d.sessions.set_max_sessions(bus.max_sessions);
        for (_, sid) in d.sessions.disallowed_by(&bus) {
            if let Some(end) = d.enders.remove(&sid) {
                let _ = end.send(Code::Forbidden);
            }
        }
        self.connection_limit
            .store(connection_limit(bus.max_sessions), Ordering::Relaxed);
        d.bus = bus;
    }

    /// The decisions, for one decision's time.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Decisions> {
        // A panic while holding it aborts the process (release builds abort on panic), so a
        // poisoned lock is only seen in tests; the state itself stays consistent per call.
        self.decisions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Take a connection slot, if one is free under the limit.
    pub(crate) fn connection_slot(self: &Arc<Self>) -> Option<ConnectionSlot> {
        let limit = self.connection_limit.load(Ordering::Relaxed);
        let taken = self
            .connections
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok();
        taken.then(|| ConnectionSlot(self.clone()))
    }
}

/// A held connection slot; freed on drop.
pub(crate) struct ConnectionSlot(Arc<State>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
    }
}
