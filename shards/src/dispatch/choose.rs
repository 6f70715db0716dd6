//! Choosing the replica of each attempt by its shared health, and reporting what the attempt
//! showed about it.
//!
//! [`choose`] walks a rotation (a model's weighted replicas, a shim pool) from the shard's
//! cursor and takes the first replica that is in rotation or half-open with its trial slot free
//! (`continuum_core::health`), skipping the replicas this request already tried. When every
//! untried replica is passively ejected, the first attempt still goes to one of them (Envoy's
//! panic routing: ejection never empties a pool, even if two shards' ejections raced the cap);
//! replicas the active checker marked unhealthy are never chosen, so a pool that is all
//! unhealthy answers at once.
//!
//! [`report`] maps an attempt's result onto the health model: connect failures, timeouts,
//! resets, bad framing and 5xx answers are failures; a response head below 500 is a success; a
//! client that left says nothing about the replica.
//!
//! A client key's `allowed_backends` filter the rotation first: a replica it may not reach is
//! never chosen, and a rotation it may reach none of is [`NoReplica::NotAllowed`].
//!
//! Invariants: choosing reads only atomics (one compare-and-swap while a trial is open); a
//! granted trial is held in the returned [`Chosen`] and given back when it is dropped
//! unreported; a replica appears at most once among a request's attempts.

use continuum_core::auth::KeyEntry;
use continuum_core::health::{Admission, FailureEffect, Trial};
use continuum_core::snapshot::{BackendIdx, RouterSnapshot};
use continuum_core::upstream::{DispatchError, ErrorKind};

use super::exchange::Answer;

/// At most this many replicas are remembered as tried (a request makes few attempts).
pub(super) const MAX_TRIED: usize = 10;

/// The replicas one request already sent to.
#[derive(Debug, Default)]
pub(super) struct Tried {
    list: [Option<BackendIdx>; MAX_TRIED],
    n: usize,
}

impl Tried {
    fn contains(&self, idx: BackendIdx) -> bool {
        self.list[..self.n].contains(&Some(idx))
    }

    fn push(&mut self, idx: BackendIdx) {
        if self.n < MAX_TRIED {
            self.list[self.n] = Some(idx);
            self.n += 1;
        }
    }

    /// Whether nothing was tried yet.
    pub(super) fn is_empty(&self) -> bool {
        self.n == 0
    }
}

/// The replica of one attempt.
#[derive(Debug)]
pub(super) struct Chosen<'s> {
    pub(super) idx: BackendIdx,
    /// The half-open trial this attempt is, if it is one.
    trial: Option<Trial<'s>>,
}

/// Why no replica was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NoReplica {
    /// Every replica was tried already.
    Exhausted,
    /// Every untried replica failed its active health checks (or is ejected, on a retry).
    Unhealthy,
    /// The client's key may reach none of the replicas.
    NotAllowed,
}

/// Choose the replica for the next attempt from `replicas`, starting at `start`, among those
/// `key` may reach (all without a key).
pub(super) fn choose<'s>(
    snap: &'s RouterSnapshot,
    replicas: &[BackendIdx],
    start: usize,
    tried: &mut Tried,
    now_ms: u64,
    key: Option<&KeyEntry>,
) -> Result<Chosen<'s>, NoReplica> {
    let n = replicas.len();
    let mut fallback = None;
    let mut untried = false;
    let mut allowed = false;
    for k in 0..n {
        let idx = replicas[(start.wrapping_add(k)) % n];
        if key.is_some_and(|k| !k.allows_backend(idx)) {
            continue;
        }
        allowed = true;
        if tried.contains(idx) {
            continue;
        }
        untried = true;
        let Some(h) = snap.health.get(idx) else {
            tried.push(idx);
            return Ok(Chosen { idx, trial: None });
        };
        match h.admit(now_ms) {
            Admission::Open => {
                tried.push(idx);
                return Ok(Chosen { idx, trial: None });
            }
            Admission::Trial => {
                tried.push(idx);
                return Ok(Chosen {
                    idx,
                    trial: Some(Trial::new(h)),
                });
            }
            Admission::Ejected => {
                if fallback.is_none() {
                    fallback = Some(idx);
                }
            }
            Admission::Unhealthy => {}
        }
    }
    match fallback {
        // Panic routing: the first attempt of a request whose pool is all ejected.
        Some(idx) if tried.is_empty() => {
            tried.push(idx);
            Ok(Chosen { idx, trial: None })
        }
        _ if untried => Err(NoReplica::Unhealthy),
        _ if !allowed && n > 0 => Err(NoReplica::NotAllowed),
        _ => Err(NoReplica::Exhausted),
    }
}

/// What one attempt's result says about its replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    Success,
    Failure,
    /// Nothing (the client left, or the router answered without the replica's fault).
    Unknown,
}

/// The verdict on an attempt's result.
pub(super) fn verdict(result: &Result<Answer, DispatchError>) -> Verdict {
    match result {
        Ok(Answer::Done(o)) if o.status >= 500 => Verdict::Failure,
        Ok(Answer::Held(status)) if *status >= 500 => Verdict::Failure,
        Ok(_) => Verdict::Success,
        Err(e) => match e.kind {
            ErrorKind::ClientGone => Verdict::Unknown,
            ErrorKind::Connect
            | ErrorKind::Tls
            | ErrorKind::Timeout
            | ErrorKind::Reset
            | ErrorKind::Closed
            | ErrorKind::Protocol => Verdict::Failure,
        },
    }
}

/// Report the attempt on `chosen` to the shared health: returns the ejection it caused, if any.
/// `now_ms` is called only when the report needs the time (a failure, or a trial's end).
pub(super) fn report(
    snap: &RouterSnapshot,
    chosen: Chosen<'_>,
    verdict: Verdict,
    now_ms: impl FnOnce() -> u64,
) -> Option<FailureEffect> {
    let Chosen { idx, trial } = chosen;
    let health = snap.health.get(idx)?;
    let is_trial = trial.is_some();
    match verdict {
        // The trial slot, if any, is freed when `trial` drops.
        Verdict::Unknown => None,
        Verdict::Success => {
            // Only a trial's end is timed: a plain success reads no clock.
            health.succeeded(is_trial.then(now_ms));
            if let Some(t) = trial {
                t.reported();
            }
            None
        }
        Verdict::Failure => {
            // Outlier ejection off: the replica is never ejected, so never on trial either.
            let policy = snap.backend(idx).and_then(|b| b.outlier)?;
            let effect = snap.health.failed(idx, now_ms(), &policy, is_trial);
            if let Some(t) = trial {
                t.reported();
            }
            Some(effect)
        }
    }
}

#[cfg(test)]
mod tests;
