//! The listener's thread: bind, accept, hand each connection to [`crate::accept`], stop on
//! request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use continuum_core::config::dynamo::EventBusConfig;
use tokio::sync::oneshot;

use crate::state::{IdSource, State};
use continuum_core::bus::metrics::BusMetrics;

/// What a listener runs with.
pub struct Settings {
    /// Where to listen (`dynamo.event_bus.listen`).
    pub listen: SocketAddr,
    /// Its TLS ([`crate::tls::server_config`]).
    pub tls: Arc<rustls::ServerConfig>,
    /// The bus config in force.
    pub bus: EventBusConfig,
    /// Randomness for session and stream ids; `None`: the TLS provider's secure random.
    pub ids: Option<IdSource>,
    /// How long a commanded stream waits for its broker; `None`: 30 s (BUS-33).
    pub open_timeout: Option<std::time::Duration>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("listen", &self.listen)
            .finish_non_exhaustive()
    }
}

/// A running listener; dropping it stops it.
pub struct Listener {
    addr: SocketAddr,
    state: Arc<State>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// The bound address (BUS-36 `local_addr`).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Apply a reload of the bus config that keeps the address and TLS (BUS-31): credentials
    /// (what it removed is revoked, BUS-16), limits, and the sessions it no longer allows end
    /// `forbidden` (BUS-42). Heartbeat and idle settings apply to sessions opened after it.
    pub fn reconfigure(&self, bus: EventBusConfig) {
        self.state.reconfigure(bus);
    }

    /// The command API (BUS-33..36).
    pub fn bus(&self) -> crate::streams::EventBus {
        crate::streams::EventBus {
            state: self.state.clone(),
        }
    }

    /// Active sessions (BUS-36 `session_count`).
    pub fn session_count(&self) -> usize {
        self.state.lock().sessions.session_count()
    }

    /// Whether an active broker session declared `namespace` (BUS-36 `covers`).
    pub fn covers(&self, namespace: &str) -> bool {
        self.state.lock().sessions.covers(namespace)
    }

    /// Stop accepting, close every connection and wait for the thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn secure_ids() -> IdSource {
    let rng = rustls::crypto::ring::default_provider().secure_random;
    Box::new(move || {
        let mut b = [0u8; 16];
        // ring's system random does not fail on Linux; a failure leaves zeros, which the
        // session table still keeps unique per entry.
        let _ = rng.fill(&mut b);
        u128::from_be_bytes(b)
    })
}

/// Bind `settings.listen` (an error here is the caller's to report and retry, BUS-32) and run
/// the listener on a thread of its own.
pub fn spawn(settings: Settings, metrics: Arc<BusMetrics>) -> std::io::Result<Listener> {
    let std_listener = std::net::TcpListener::bind(settings.listen)?;
    std_listener.set_nonblocking(true)?;
    let addr = std_listener.local_addr()?;
    let (stop_tx, stop_rx) = oneshot::channel();
    let ids = settings.ids.unwrap_or_else(secure_ids);
    let open_timeout = settings
        .open_timeout
        .unwrap_or(crate::streams::OPEN_TIMEOUT);
    let state = Arc::new(State::new(settings.bus, ids, metrics, open_timeout));
    let acceptor = tokio_rustls::TlsAcceptor::from(settings.tls);
    let thread_state = state.clone();
    let thread = std::thread::Builder::new()
        .name("event-bus".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "event bus runtime failed to start");
                    return;
                }
            };
            let state = thread_state;
            state.set_runtime(rt.handle().clone());
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(std_listener) else {
                    tracing::error!("event bus listener socket unusable");
                    return;
                };
                let accept_loop = async {
                    loop {
                        let Ok((tcp, _peer)) = listener.accept().await else {
                            continue;
                        };
                        // Control lines and stream answers are small writes: without it each
                        // waits out the peer's delayed ACK (~40 ms per command seen in tests).
                        let _ = tcp.set_nodelay(true);
                        match state.connection_slot() {
                            Some(slot) => {
                                tokio::spawn(crate::accept::connection(
                                    tcp,
                                    acceptor.clone(),
                                    state.clone(),
                                    slot,
                                ));
                            }
                            None => state
                                .metrics
                                .refused(continuum_event_bus::code::Code::ConnectionLimit),
                        }
                    }
                };
                tokio::select! {
                    () = accept_loop => {}
                    _ = stop_rx => {}
                }
            });
        })?;
    Ok(Listener {
        addr,
        state,
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}
