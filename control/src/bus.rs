//! The event bus listener's supervisor (BUS-31, BUS-32, RELOAD-18): starts the listener when the
//! config enables it, applies a reload live, restarts it when its address or TLS changes, and
//! retries a start that failed every 30 s. It never touches discovery or the registry.
//!
//! Reload classes (Q-03's missing table, settled here): `enabled`, `listen` and the TLS files
//! (`tls.cert`, `tls.key`, `tls.client_ca`, compared by content) restart the listener, which closes
//! every connection; `brokers`, `max_sessions` and `max_streams_per_session`,
//! `max_session_buffer_bytes`, `heartbeat_interval` and `idle_timeout` apply live: credentials at
//! once (a removed one revoked, sessions no longer allowed ended `forbidden`), limits for what
//! comes next, heartbeat and idle settings for sessions opened after the reload.
//!
//! In a build without the `dynamo-event-bus` feature it does nothing; such a build runs a config
//! that enables the bus with the bus switched off and a warning (`Config::fit_build`, CFG-04).

use std::sync::Arc;

use continuum_core::bus::metrics::BusMetrics;
use continuum_core::config::Config;

/// How long after a failed start the supervisor tries again (BUS-32).
#[cfg(feature = "dynamo-event-bus")]
pub(crate) const RETRY: std::time::Duration = std::time::Duration::from_secs(30);

/// The listener and what it was started with.
#[derive(Debug)]
pub(crate) struct BusSupervisor {
    metrics: Arc<BusMetrics>,
    retry_at: Option<tokio::time::Instant>,
    /// Moves whenever the listener starts, restarts or stops.
    generation: u64,
    /// The generation the shards were last handed.
    handed: u64,
    #[cfg(feature = "dynamo-event-bus")]
    running: Option<running::Running>,
}

impl BusSupervisor {
    /// A supervisor whose listener counts into `metrics`.
    pub(crate) fn new(metrics: Arc<BusMetrics>) -> Self {
        Self {
            metrics,
            retry_at: None,
            generation: 0,
            handed: 0,
            #[cfg(feature = "dynamo-event-bus")]
            running: None,
        }
    }

    /// Hand the shards the running listener's command API (or its absence) if the listener
    /// changed since the last call (BROKER-06); returns the new listener's sessions watch then
    /// (`Some(None)`: no listener runs), `None` when nothing changed.
    pub(crate) fn hand_to(
        &mut self,
        shards: &continuum_shards::ShardSet,
    ) -> Option<Option<tokio::sync::watch::Receiver<u64>>> {
        if self.generation == self.handed {
            return None;
        }
        self.handed = self.generation;
        #[cfg(feature = "dynamo-event-bus")]
        {
            let bus = self.running.as_ref().map(|r| r.listener.bus());
            let sessions = bus
                .as_ref()
                .map(continuum_bus::EventBus::subscribe_sessions);
            shards.set_event_bus(bus);
            Some(sessions)
        }
        #[cfg(not(feature = "dynamo-event-bus"))]
        {
            let _ = shards;
            Some(None)
        }
    }

    /// When to call [`BusSupervisor::reconcile`] again after a failed start.
    pub(crate) fn retry_at(&self) -> Option<tokio::time::Instant> {
        self.retry_at
    }

    /// Make the listener match `config`.
    pub(crate) fn reconcile(&mut self, config: &Config) {
        self.retry_at = None;
        #[cfg(feature = "dynamo-event-bus")]
        match running::reconcile(&mut self.running, config, &self.metrics) {
            Ok(changed) => {
                if changed {
                    self.generation += 1;
                }
            }
            Err(e) => {
                // A failed restart has stopped the old listener.
                self.generation += 1;
                tracing::warn!(error = %e, retry_in_s = RETRY.as_secs(), "event bus listener failed to start; retrying");
                self.retry_at = Some(tokio::time::Instant::now() + RETRY);
            }
        }
        #[cfg(not(feature = "dynamo-event-bus"))]
        let _ = (config, &self.metrics);
    }
}

#[cfg(feature = "dynamo-event-bus")]
mod running {
    use std::net::SocketAddr;
    use std::sync::Arc;

    use continuum_core::bus::metrics::BusMetrics;
    use continuum_core::config::Config;

    /// What a restart is decided by: the address and the TLS files' contents.
    #[derive(Debug, PartialEq, Eq)]
    struct Key {
        listen: SocketAddr,
        cert: Vec<u8>,
        key: Vec<u8>,
        client_ca: Option<Vec<u8>>,
    }

    #[derive(Debug)]
    pub(super) struct Running {
        key: Key,
        pub(super) listener: continuum_bus::Listener,
    }

    /// Read a TLS file; the error names the key's path only as `tls.key` (it is masked like a
    /// secret everywhere else).
    fn read(path: &str, what: &str, show_path: bool) -> Result<Vec<u8>, String> {
        std::fs::read(path).map_err(|e| {
            if show_path {
                format!("cannot read {what} {path}: {}", e.kind())
            } else {
                format!("cannot read {what}: {}", e.kind())
            }
        })
    }

    pub(super) fn reconcile(
        running: &mut Option<Running>,
        config: &Config,
        metrics: &Arc<BusMetrics>,
    ) -> Result<bool, String> {
        let bus = &config.dynamo.event_bus;
        let (true, Some(listen), Some(tls)) = (bus.enabled, bus.listen, bus.tls.as_ref()) else {
            let stopped = running.take().is_some();
            if stopped {
                tracing::info!("event bus listener stopped");
            }
            return Ok(stopped);
        };
        let key = Key {
            listen,
            cert: read(&tls.cert, "tls.cert", true)?,
            key: read(tls.key.expose(), "tls.key", false)?,
            client_ca: tls
                .client_ca
                .as_deref()
                .map(|p| read(p, "tls.client_ca", true))
                .transpose()?,
        };
        if let Some(r) = running.as_ref()
            && r.key == key
        {
            r.listener.reconfigure(bus.clone());
            return Ok(false);
        }
        let server =
            continuum_bus::tls::server_config(&key.cert, &key.key, key.client_ca.as_deref())
                .map_err(|e| e.to_string())?;
        // The old listener goes first: the new one may bind the same port.
        if running.take().is_some() {
            tracing::info!("event bus listener restarting (address or TLS changed)");
        }
        let listener = continuum_bus::spawn(
            continuum_bus::Settings {
                listen,
                tls: server,
                bus: bus.clone(),
                ids: None,
                open_timeout: None,
            },
            metrics.clone(),
        )
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        tracing::info!(addr = %listener.local_addr(), "event bus listener started");
        *running = Some(Running { key, listener });
        Ok(true)
    }
}
