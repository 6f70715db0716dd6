//! The active health checker: one probe task per backend with a `health_check`, run on the
//! control thread's runtime, off the request path.
//!
//! Each task sends `GET <base path><path>` on a fresh connection every `interval` and counts a
//! probe as passed when a 2xx status line arrives within `timeout` (connect and, for an
//! `https://` backend, the TLS handshake under the backend's own trust included). After
//! `unhealthy_threshold` failed probes in a row the replica leaves rotation on every shard
//! (`ReplicaHealth::set_active(false)`); after `healthy_threshold` passes in a row it comes back.
//! Passes also end a passive ejection early, which turns the replica half-open (its next
//! request is the trial): only passes counted since that ejection began do so, so an ejected
//! replica whose health endpoint never failed still waits `healthy_threshold` probes.
//!
//! Invariants:
//! - [`HealthChecks::reconcile`] runs after every publication: a task runs exactly for each
//!   backend of the running snapshot with a health check and a resolved address, and is
//!   restarted when its backend's name, address, URL path or check settings change;
//! - a backend without a health check is never left actively down by an earlier config;
//! - probes are bounded: one connection at a time per backend, [`MAX_STATUS_LINE`] bytes read.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use continuum_core::config::{BackendConfig, HealthCheck};
use continuum_core::health::{MAX_STATUS_LINE, ReplicaHealth, probe_status};
use continuum_core::snapshot::{BackendIdx, RouterSnapshot};
use continuum_core::tls::{TlsId, UpstreamTls};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// What identifies one probe task: a change restarts it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ProbeKey {
    name: String,
    addr: SocketAddr,
    target: String,
    host: String,
    tls: Option<TlsId>,
    check: HealthCheckKey,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct HealthCheckKey {
    interval_ms: u128,
    timeout_ms: u128,
    healthy: u32,
    unhealthy: u32,
}

/// The running probe tasks.
#[derive(Debug, Default)]
pub(crate) struct HealthChecks {
    tasks: HashMap<ProbeKey, JoinHandle<()>>,
}

impl Drop for HealthChecks {
    fn drop(&mut self) {
        for (_, t) in self.tasks.drain() {
            t.abort();
        }
    }
}

impl HealthChecks {
    /// Run exactly the probes `snap` asks for.
    pub(crate) fn reconcile(&mut self, snap: &RouterSnapshot) {
        let mut wanted: HashMap<ProbeKey, (HealthCheck, Arc<ReplicaHealth>, Option<UpstreamTls>)> =
            HashMap::new();
        for (i, b) in snap.config.backends.iter().enumerate() {
            let idx = BackendIdx(u32::try_from(i).unwrap_or(u32::MAX));
            let Some(health) = snap.health.shared(idx) else {
                continue;
            };
            match (&b.health_check, snap.backend_addr(idx)) {
                (Some(hc), Some(addr)) if b.enabled => {
                    let tls = snap.backend_tls(idx).cloned();
                    wanted.insert(
                        probe_key(b, hc, addr, tls.as_ref()),
                        (hc.clone(), health, tls),
                    );
                }
                _ => {
                    // Unchecked now: an earlier config's verdict must not keep it out.
                    if health.actively_down() {
                        health.set_active(true, continuum_shards::clock::now_ms());
                    }
                }
            }
        }
        self.tasks.retain(|key, task| {
            let keep = wanted.contains_key(key) && !task.is_finished();
            if !keep {
                task.abort();
            }
            keep
        });
        for (key, (hc, health, tls)) in wanted {
            if self.tasks.contains_key(&key) {
                continue;
            }
            let probe = Probe {
                addr: key.addr,
                request: probe_request(&key.target, &key.host),
                name: key.name.clone(),
                tls,
            };
            self.tasks.insert(key, tokio::spawn(run(probe, hc, health)));
        }
    }

    /// How many probe tasks run.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.tasks.len()
    }
}

fn probe_key(
    b: &BackendConfig,
    hc: &HealthCheck,
    addr: SocketAddr,
    tls: Option<&UpstreamTls>,
) -> ProbeKey {
    let host = if b.url.host.contains(':') {
        format!("[{}]:{}", b.url.host, b.url.port)
    } else {
        format!("{}:{}", b.url.host, b.url.port)
    };
    ProbeKey {
        name: b.name.0.clone(),
        addr,
        target: format!("{}{}", b.url.base_path, hc.path),
        host,
        tls: tls.map(|t| t.id),
        check: HealthCheckKey {
            interval_ms: hc.interval.as_millis(),
            timeout_ms: hc.timeout.as_millis(),
            healthy: hc.healthy_threshold,
            unhealthy: hc.unhealthy_threshold,
        },
    }
}

fn probe_request(target: &str, host: &str) -> Vec<u8> {
    format!(
        "GET {target} HTTP/1.1\r\nhost: {host}\r\nuser-agent: continuum-router-health-check\r\n\
         accept: */*\r\nconnection: close\r\n\r\n"
    )
    .into_bytes()
}

#[derive(Debug)]
struct Probe {
    addr: SocketAddr,
    request: Vec<u8>,
    name: String,
    tls: Option<UpstreamTls>,
}

/// Why a probe failed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ProbeFailure {
    Timeout,
    Connect,
    /// The TLS handshake failed (certificate not trusted, wrong name, no common protocol),
    /// with rustls' reason.
    Tls(String),
    Io,
    Malformed,
    Status(u16),
}

impl Probe {
    /// One probe: connect (and handshake), ask, read the status line.
    async fn once(&self) -> Result<(), ProbeFailure> {
        let s = TcpStream::connect(self.addr)
            .await
            .map_err(|_| ProbeFailure::Connect)?;
        match &self.tls {
            None => ask(s, &self.request).await,
            Some(t) => {
                let s = tokio_rustls::TlsConnector::from(t.config.clone())
                    .connect(t.server_name.clone(), s)
                    .await
                    .map_err(|e| ProbeFailure::Tls(e.to_string()))?;
                ask(s, &self.request).await
            }
        }
    }
}

/// Send the probe request on `s` and read the status line.
async fn ask<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    request: &[u8],
) -> Result<(), ProbeFailure> {
    s.write_all(request).await.map_err(|_| ProbeFailure::Io)?;
    let mut buf = vec![0u8; MAX_STATUS_LINE + 2];
    let mut len = 0;
    loop {
        let n = s
            .read(&mut buf[len..])
            .await
            .map_err(|_| ProbeFailure::Io)?;
        if n == 0 {
            return Err(ProbeFailure::Io);
        }
        len += n;
        match probe_status(&buf[..len]) {
            Ok(Some(status)) if (200..300).contains(&status) => return Ok(()),
            Ok(Some(status)) => return Err(ProbeFailure::Status(status)),
            Ok(None) if len < buf.len() => {}
            _ => return Err(ProbeFailure::Malformed),
        }
    }
}

/// The streaks of one replica's probes, and what crossing a threshold does.
#[derive(Debug, Default)]
struct Streaks {
    passes: u32,
    failures: u32,
    /// The replica's ejection count when the pass streak started.
    ejections_seen: u64,
}

/// What one probe result changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    None,
    Down,
    /// Back in rotation (or an ejection ended early).
    Up,
}

impl Streaks {
    fn passed(&mut self, hc: &HealthCheck, h: &ReplicaHealth, now_ms: u64) -> Change {
        self.failures = 0;
        if h.ejections() != self.ejections_seen {
            // A new ejection: only passes from here on can end it.
            self.ejections_seen = h.ejections();
            self.passes = 0;
        }
        self.passes = self.passes.saturating_add(1);
        let ejected = h.state(now_ms) == continuum_core::health::HealthState::Ejected;
        if self.passes >= hc.healthy_threshold && (h.actively_down() || ejected) {
            h.set_active(true, now_ms);
            return Change::Up;
        }
        Change::None
    }

    fn failed(&mut self, hc: &HealthCheck, h: &ReplicaHealth, now_ms: u64) -> Change {
        self.passes = 0;
        self.failures = self.failures.saturating_add(1);
        if self.failures >= hc.unhealthy_threshold && !h.actively_down() {
            h.set_active(false, now_ms);
            return Change::Down;
        }
        Change::None
    }
}

async fn run(probe: Probe, hc: HealthCheck, health: Arc<ReplicaHealth>) {
    let mut tick = tokio::time::interval(hc.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut streaks = Streaks {
        ejections_seen: health.ejections(),
        ..Streaks::default()
    };
    loop {
        tick.tick().await;
        let result = match tokio::time::timeout(hc.timeout, probe.once()).await {
            Ok(r) => r,
            Err(_) => Err(ProbeFailure::Timeout),
        };
        let now = continuum_shards::clock::now_ms();
        match result {
            Ok(()) => {
                if streaks.passed(&hc, &health, now) == Change::Up {
                    tracing::info!(
                        backend = probe.name,
                        passes = streaks.passes,
                        "health check passing: backend replica back in rotation"
                    );
                }
            }
            Err(why) => {
                if streaks.failed(&hc, &health, now) == Change::Down {
                    tracing::warn!(
                        backend = probe.name,
                        failures = streaks.failures,
                        reason = ?why,
                        "health check failing: backend replica out of rotation"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
