//! Replica health shared by every shard and the control thread: passive outlier ejection with a
//! half-open trial (a circuit breaker per replica), and the verdict of the active health checker.
//!
//! Role: one [`ReplicaHealth`] per configured backend replica, made of atomics, so evidence seen
//! by one shard protects every other shard at once without a lock on the request path:
//! - a shard reads [`ReplicaHealth::admit`] (loads only, plus one compare-and-swap while a trial
//!   is open) before it sends to a replica;
//! - it reports each attempt's outcome ([`ReplicaHealth::succeeded`], [`HealthTable::failed`]);
//!   a success on a replica with no failure streak writes nothing;
//! - the active checker (control thread) reports its verdicts ([`ReplicaHealth::set_active`]).
//!
//! State machine of one replica (Envoy's outlier detection, with Hystrix's half-open trial):
//! - **closed**: traffic flows; each failure extends a streak that any success resets;
//! - **ejected** after `consecutive_failures` in a row, for `base_ejection × n` (n = how many
//!   times it was ejected without a quiet `max_ejection` since, capped at `max_ejection`), unless
//!   that would take more than `max_ejection_percent` of a pool it belongs to out of rotation, or
//!   the last replica of one;
//! - **half-open** when the ejection time ends, or earlier when the active checker sees the
//!   replica pass `healthy_threshold` probes in a row: exactly one request at a time is let
//!   through as a trial; its success closes the breaker, its failure ejects again for longer.
//!   A replica is therefore never re-admitted on the strength of one ordinary success while it
//!   keeps failing.
//!
//! The active verdict is separate: a replica the checker marked unhealthy is out of rotation
//! whatever its passive state, and back when the checker marks it healthy.
//!
//! Invariants:
//! - ejections are serialised by one mutex taken only when a streak crosses the threshold (never
//!   on a success or an admission), so two shards can never eject the last replicas of a pool
//!   together; every replica in a group of `n` counts as out while it is ejected, half-open or
//!   actively unhealthy, and an ejection that would leave no replica of any of its groups in
//!   rotation, or more than `max(1, ⌊n × max_ejection_percent / 100⌋)` out, is refused;
//! - times are milliseconds on one process-wide monotonic timeline, passed in by the caller;
//!   `0` means "not ejected", so an ejection always ends at 1 ms or later;
//! - a trial slot is always given back: [`Trial`] releases it when dropped unreported.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use crate::config::{BackendIdx, OutlierPolicy};

/// One replica's shared health.
#[derive(Debug, Default)]
pub struct ReplicaHealth {
    /// The active checker marked it unhealthy.
    active_down: AtomicBool,
    /// When the ejection ends (ms on the shared timeline); 0: not ejected.
    ejected_until: AtomicU64,
    /// The consecutive failures since the last success or ejection.
    streak: AtomicU32,
    /// How many times it was ejected in a row (the ejection-time multiplier).
    level: AtomicU32,
    /// When the breaker last closed (ms), for the decay of `level`.
    closed_at: AtomicU64,
    /// A half-open trial request is in flight.
    trial: AtomicBool,
    /// Ejections so far (`continuum_upstream_ejections_total`).
    ejections: AtomicU64,
}

/// Whether a replica may receive the next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// In rotation.
    Open,
    /// Half-open: this request is the one trial; report its outcome.
    Trial,
    /// Ejected (or half-open with its trial in flight).
    Ejected,
    /// The active checker marked it unhealthy.
    Unhealthy,
}

/// The replica's state as operators see it (`continuum_backend_health{state}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthState {
    /// In rotation.
    Healthy,
    /// Ejected by passive outlier detection.
    Ejected,
    /// Ejection over, waiting for a trial request to succeed.
    HalfOpen,
    /// Failed its active health checks.
    Unhealthy,
}

impl HealthState {
    /// Every state, in label order.
    pub const ALL: [HealthState; 4] = [
        HealthState::Healthy,
        HealthState::Ejected,
        HealthState::HalfOpen,
        HealthState::Unhealthy,
    ];

    /// The metric label.
    pub const fn label(self) -> &'static str {
        match self {
            HealthState::Healthy => "healthy",
            HealthState::Ejected => "ejected",
            HealthState::HalfOpen => "half_open",
            HealthState::Unhealthy => "unhealthy",
        }
    }
}

/// What a reported failure did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureEffect {
    /// Counted in the streak; below the threshold.
    Counted,
    /// The replica was ejected until the given time (ms).
    Ejected {
        /// When the ejection ends.
        until_ms: u64,
    },
    /// The threshold was reached but ejecting would take too much of a pool out of rotation.
    Capped,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl ReplicaHealth {
    /// Whether the replica may take a request at `now_ms`. A [`Admission::Trial`] must be
    /// reported (or dropped) through [`Trial`].
    pub fn admit(&self, now_ms: u64) -> Admission {
        if self.active_down.load(Ordering::Relaxed) {
            return Admission::Unhealthy;
        }
        let until = self.ejected_until.load(Ordering::Acquire);
        if until == 0 {
            return Admission::Open;
        }
        if now_ms < until {
            return Admission::Ejected;
        }
        match self
            .trial
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => Admission::Trial,
            Err(_) => Admission::Ejected,
        }
    }

    /// The operator view at `now_ms`.
    pub fn state(&self, now_ms: u64) -> HealthState {
        if self.active_down.load(Ordering::Relaxed) {
            return HealthState::Unhealthy;
        }
        match self.ejected_until.load(Ordering::Acquire) {
            0 => HealthState::Healthy,
            until if now_ms < until => HealthState::Ejected,
            _ => HealthState::HalfOpen,
        }
    }

    /// Whether it counts as out of rotation for the ejection cap.
    fn out(&self) -> bool {
        self.active_down.load(Ordering::Relaxed) || self.ejected_until.load(Ordering::Acquire) != 0
    }

    /// An attempt on the replica succeeded (a response head below 500 arrived). Closes the
    /// breaker when this was the trial (`trial_ended_ms`: when it ended), and otherwise only
    /// resets a running streak (no time needed, so a caller reads no clock for it).
    pub fn succeeded(&self, trial_ended_ms: Option<u64>) {
        if self.streak.load(Ordering::Relaxed) != 0 {
            self.streak.store(0, Ordering::Relaxed);
        }
        if let Some(now_ms) = trial_ended_ms {
            self.closed_at.store(now_ms.max(1), Ordering::Relaxed);
            self.ejected_until.store(0, Ordering::Release);
            self.trial.store(false, Ordering::Release);
        }
    }

    /// The active checker's verdict changed (thresholds crossed). Passing also ends a running
    /// ejection early: the replica turns half-open, and its next request is the trial.
    pub fn set_active(&self, healthy: bool, now_ms: u64) {
        self.active_down.store(!healthy, Ordering::Relaxed);
        if healthy {
            let _ = self
                .ejected_until
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |until| {
                    (until > now_ms.max(1)).then_some(now_ms.max(1))
                });
        }
    }

    /// Whether the active checker has it down.
    pub fn actively_down(&self) -> bool {
        self.active_down.load(Ordering::Relaxed)
    }

    /// Ejections so far.
    pub fn ejections(&self) -> u64 {
        self.ejections.load(Ordering::Relaxed)
    }

    /// Eject now (the caller holds the ejection lock and checked the cap).
    fn eject(&self, now_ms: u64, policy: &OutlierPolicy) -> u64 {
        let quiet = now_ms.saturating_sub(self.closed_at.load(Ordering::Relaxed));
        let level = if self.level.load(Ordering::Relaxed) == 0 || quiet >= ms(policy.max_ejection) {
            1
        } else {
            self.level.load(Ordering::Relaxed).saturating_add(1)
        };
        self.level.store(level, Ordering::Relaxed);
        let time = ms(policy.base_ejection)
            .saturating_mul(u64::from(level))
            .min(ms(policy.max_ejection));
        let until = now_ms.saturating_add(time.max(1)).max(1);
        self.streak.store(0, Ordering::Relaxed);
        self.ejected_until.store(until, Ordering::Release);
        self.ejections.fetch_add(1, Ordering::Relaxed);
        until
    }
}

/// A trial request's slot: released when dropped unless the outcome was reported.
#[derive(Debug)]
pub struct Trial<'h> {
    health: &'h ReplicaHealth,
    reported: bool,
}

impl<'h> Trial<'h> {
    /// Hold the trial slot `admit` just granted on `health`.
    pub fn new(health: &'h ReplicaHealth) -> Self {
        Self {
            health,
            reported: false,
        }
    }

    /// The outcome was reported (success or failure).
    pub fn reported(mut self) {
        self.reported = true;
    }
}

impl Drop for Trial<'_> {
    fn drop(&mut self) {
        if !self.reported {
            // The request ended without an outcome (the client left): free the slot, the
            // replica stays half-open for the next request.
            self.health.trial.store(false, Ordering::Release);
        }
    }
}

/// A replica's identity across snapshots: its backend name and resolved address.
pub type ReplicaKey = (String, Option<std::net::SocketAddr>);

/// The health of every backend of one snapshot, by [`BackendIdx`], and the groups they are
/// capped in. A backend keeps its [`ReplicaHealth`] into the next snapshot while its name and
/// address stay the same ([`HealthTable::carried`]).
#[derive(Debug, Default)]
pub struct HealthTable {
    keys: Vec<ReplicaKey>,
    replicas: Vec<Arc<ReplicaHealth>>,
    /// For each backend, the groups (pools) it belongs to, as indices into `groups`.
    member_of: Vec<Vec<u32>>,
    groups: Vec<Vec<BackendIdx>>,
    eject_lock: Arc<Mutex<()>>,
}

impl HealthTable {
    /// A table over `replicas` (by backend index) with the given pools (each a set of backend
    /// indices that serve the same traffic: a model's replicas, a shim pool). Ejections in every
    /// table sharing `eject_lock` are serialised.
    fn new(
        keys: Vec<ReplicaKey>,
        replicas: Vec<Arc<ReplicaHealth>>,
        groups: Vec<Vec<BackendIdx>>,
        eject_lock: Arc<Mutex<()>>,
    ) -> Self {
        let mut member_of = vec![Vec::new(); replicas.len()];
        for (g, members) in groups.iter().enumerate() {
            for m in members {
                if let Some(list) = member_of.get_mut(m.0 as usize) {
                    let g = u32::try_from(g).unwrap_or(u32::MAX);
                    if !list.contains(&g) {
                        list.push(g);
                    }
                }
            }
        }
        Self {
            keys,
            replicas,
            member_of,
            groups,
            eject_lock,
        }
    }

    /// The table for backends `keys` (by index) in `groups`, keeping the state of every backend
    /// `previous` has under the same key (and its ejection lock); others start healthy.
    pub fn carried(
        previous: Option<&HealthTable>,
        keys: Vec<ReplicaKey>,
        groups: Vec<Vec<BackendIdx>>,
    ) -> Self {
        let replicas = keys
            .iter()
            .map(|key| {
                previous
                    .and_then(|p| p.keys.iter().position(|k| k == key))
                    .and_then(|i| previous.and_then(|p| p.replicas.get(i)).cloned())
                    .unwrap_or_default()
            })
            .collect();
        let lock = previous.map_or_else(Arc::default, |p| p.eject_lock.clone());
        Self::new(keys, replicas, groups, lock)
    }

    /// The name of backend `idx` (as configured).
    pub fn name(&self, idx: usize) -> Option<&str> {
        self.keys.get(idx).map(|k| k.0.as_str())
    }

    /// The health of backend `idx`.
    pub fn get(&self, idx: BackendIdx) -> Option<&ReplicaHealth> {
        self.replicas.get(idx.0 as usize).map(|r| &**r)
    }

    /// The shared handle of backend `idx`'s health (for the active checker, which outlives
    /// snapshots).
    pub fn shared(&self, idx: BackendIdx) -> Option<Arc<ReplicaHealth>> {
        self.replicas.get(idx.0 as usize).cloned()
    }

    /// How many backends it covers.
    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    /// Whether it covers none.
    pub fn is_empty(&self) -> bool {
        self.replicas.is_empty()
    }

    /// An attempt on `idx` failed at `now_ms` (connect failure, timeout, reset, 5xx). Counts the
    /// streak and ejects at the threshold within the cap; a failed trial ejects again at once.
    pub fn failed(
        &self,
        idx: BackendIdx,
        now_ms: u64,
        policy: &OutlierPolicy,
        trial: bool,
    ) -> FailureEffect {
        let Some(r) = self.get(idx) else {
            return FailureEffect::Counted;
        };
        if trial {
            // Already counted as out: no cap to check.
            let _guard = self
                .eject_lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let until = r.eject(now_ms, policy);
            r.trial.store(false, Ordering::Release);
            return FailureEffect::Ejected { until_ms: until };
        }
        let streak = r.streak.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        if streak < policy.consecutive_failures || r.ejected_until.load(Ordering::Acquire) != 0 {
            return FailureEffect::Counted;
        }
        let _guard = self
            .eject_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if r.ejected_until.load(Ordering::Acquire) != 0 {
            return FailureEffect::Counted; // another shard ejected it meanwhile
        }
        if !self.may_eject(idx, policy.max_ejection_percent) {
            return FailureEffect::Capped;
        }
        FailureEffect::Ejected {
            until_ms: r.eject(now_ms, policy),
        }
    }

    /// Whether taking `idx` out keeps every group it belongs to within the cap.
    fn may_eject(&self, idx: BackendIdx, max_percent: u8) -> bool {
        let Some(groups) = self.member_of.get(idx.0 as usize) else {
            return false;
        };
        // A backend in no pool takes no traffic that ejection could protect.
        !groups.is_empty()
            && groups.iter().all(|&g| {
                let members = &self.groups[g as usize];
                let n = members.len();
                let out = members
                    .iter()
                    .filter(|m| **m != idx && self.get(**m).is_some_and(ReplicaHealth::out))
                    .count();
                let allowed = (n * usize::from(max_percent) / 100).max(1);
                out + 1 < n && out < allowed
            })
    }
}

/// The status code of an HTTP/1.x response whose first line is complete in `buf` (`None`
/// while it is incomplete); an `Err` when it is not an HTTP/1.x status line. The active
/// checker's one parse of what a backend answers.
pub fn probe_status(buf: &[u8]) -> Result<Option<u16>, ProbeError> {
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return if buf.len() > MAX_STATUS_LINE {
            Err(ProbeError::Malformed)
        } else {
            Ok(None)
        };
    };
    if end > MAX_STATUS_LINE {
        return Err(ProbeError::Malformed);
    }
    let line = &buf[..end];
    let rest = line
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| line.strip_prefix(b"HTTP/1.0 "))
        .ok_or(ProbeError::Malformed)?;
    match rest {
        // Three digits, the first not 0 (status codes are 100..=999).
        [a @ b'1'..=b'9', b, c, tail @ ..]
            if [b, c].iter().all(|d| d.is_ascii_digit())
                && (tail.is_empty() || tail[0] == b' ') =>
        {
            Ok(Some(
                u16::from(a - b'0') * 100 + u16::from(b - b'0') * 10 + u16::from(c - b'0'),
            ))
        }
        _ => Err(ProbeError::Malformed),
    }
}

/// Longest status line the checker waits for.
pub const MAX_STATUS_LINE: usize = 1024;

/// A probe answer that is not HTTP/1.x.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// Not an HTTP/1.x status line (or longer than [`MAX_STATUS_LINE`]).
    #[error("not an HTTP/1.x status line")]
    Malformed,
}

#[cfg(test)]
mod tests;
