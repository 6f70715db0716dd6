//! Attempts: one request sent to one backend replica, and the plain-routing loop over replicas.
//!
//! [`Dispatcher::send_to`] takes a pooled keep-alive connection (or connects, bounded by
//! the backend's `upstream_connect` timeout), writes the request head — client `x-dynamo-*` and pin aliases
//! dropped, hop-by-hop headers dropped, the picker's pins written after them (SHIM-09) — and the
//! body (coalesced behind the head up to [`COALESCE_BODY`]), then relays the answer. A reused
//! connection the backend had closed is replaced by a fresh one once. Every other failure is
//! returned as one classified [`DispatchError`], counted once under its upstream class.
//!
//! [`Dispatcher::plain`] rotates over the model's replicas with the shard's cursor, skipping
//! replicas that are ejected or unhealthy ([`choose`](mod@choose)); a retryable failure (connect: nothing
//! was sent) moves to the next untried replica up to `connect_retries` times, each retry within
//! the shard's retry budget. Every attempt's result is reported to the replica's shared health.

use std::time::Instant;

use continuum_core::auth::Refusal;
use continuum_core::config::{BackendConfig, BackendUrl, UpstreamTimeouts};
use continuum_core::headers::{self, RequestHeaderFate};
use continuum_core::health::FailureEffect;
use continuum_core::snapshot::{BackendIdx, ModelRoute, RouterSnapshot};
use continuum_core::upstream::{DispatchError, ErrorKind, Phase};

use super::choose::{self, Chosen, NoReplica, Tried, choose, verdict};
use super::conn::{self, PoolKey, UpConn};
use super::exchange::{Answer, Attempt, Body, Exchange, FailureHandling};
use super::upstream::Timing;
use super::{Dispatcher, Ingress, convert, relay};
use crate::clock;
use crate::http::respond::LocalError;
use crate::http::{Outcome, push_decimal, write_lent};

/// Bodies up to this size are copied behind the request head and sent in one write.
const COALESCE_BODY: usize = 64 * 1024;

impl Dispatcher {
    /// Plain model routing: the model's weighted rotation, retryable failures moving to the next
    /// replica up to `connect_retries` times. The first attempt begins at `first` (the caller's
    /// clock reading); each retry reads the clock again.
    pub(super) async fn plain(
        &self,
        snap: &RouterSnapshot,
        ex: &mut Exchange<'_>,
        route: Option<&ModelRoute>,
        attempt: &Attempt<'_>,
        first: Instant,
    ) -> Outcome {
        let Some(route) = route else {
            return ex.local_error(LocalError::ModelNotFound);
        };
        // A converted answer is rendered in the client's protocol, errors included: hold them.
        let attempt = &Attempt {
            on_failure: if ex.convert.is_some() || ex.ingress == Ingress::Responses {
                FailureHandling::Hold
            } else {
                attempt.on_failure
            },
            // Plain routing never sends the shim body (KV-PICK-11: no token_data on fallback).
            body: None,
            ..*attempt
        };
        let attempts = 1 + snap.config.server.connect_retries as usize;
        let start = self.next_cursor(route.slot);
        let mut tried = Tried::default();
        let mut last = LocalError::UpstreamUnavailable;
        for n in 0..attempts {
            let begun = if n == 0 { first } else { clock::instant() };
            let now = clock::ms_at(begun);
            let chosen = match choose(snap, &route.replicas, start, &mut tried, now, ex.key) {
                Ok(c) => c,
                Err(NoReplica::Unhealthy) if n == 0 => {
                    return ex.local_error(LocalError::NoHealthyUpstream);
                }
                Err(NoReplica::NotAllowed) => {
                    if let Some(k) = ex.key {
                        k.state.refused(Refusal::Backend);
                    }
                    return ex.local_error(LocalError::BackendNotAllowed);
                }
                Err(_) => break,
            };
            if n > 0 && !self.retry_allowed() {
                break;
            }
            let idx = chosen.idx;
            let result = self.send_to(snap, ex, idx, attempt, begun).await;
            self.report(snap, chosen, &result);
            match plain_step(result) {
                PlainStep::Answered(outcome) => return outcome,
                PlainStep::RelayHeld(status) => {
                    let Some(backend) = snap.backend(idx) else {
                        return ex.local_error(LocalError::UpstreamUnavailable);
                    };
                    return relay::write_held(ex, status, backend, attempt);
                }
                PlainStep::NextReplica(e) => last = e,
                PlainStep::Answer(e) => return ex.local_error(e),
                PlainStep::Abort => return Outcome::aborted(),
            }
        }
        ex.local_error(last)
    }

    /// Whether the retry budget allows one more attempt; counts it when it does.
    pub(super) fn retry_allowed(&self) -> bool {
        let sec = clock::now_ms() / 1000;
        if self.budget.borrow_mut().try_retry(sec) {
            self.metrics.upstream_retry();
            true
        } else {
            self.metrics.retry_denied();
            false
        }
    }

    /// Report an attempt's result to the replica's shared health, logging an ejection.
    pub(super) fn report(
        &self,
        snap: &RouterSnapshot,
        chosen: Chosen<'_>,
        result: &Result<Answer, DispatchError>,
    ) {
        let idx = chosen.idx;
        let mut now = 0;
        let clock_ms = || {
            now = clock::now_ms();
            now
        };
        match choose::report(snap, chosen, verdict(result), clock_ms) {
            Some(FailureEffect::Ejected { until_ms }) => {
                let name = snap.backend(idx).map_or("", |b| b.name.0.as_str());
                tracing::warn!(
                    shard = self.shard,
                    backend = name,
                    ejected_for_ms = until_ms.saturating_sub(now),
                    "backend replica ejected after consecutive failures"
                );
            }
            Some(FailureEffect::Capped) => {
                let name = snap.backend(idx).map_or("", |b| b.name.0.as_str());
                tracing::debug!(
                    backend = name,
                    "backend replica kept: ejecting it would exceed max_ejection_percent"
                );
            }
            Some(FailureEffect::Counted) | None => {}
        }
    }

    /// One attempt on backend `idx`, begun at `begun` (the request's start for a first attempt):
    /// a pooled or new connection, the head and body, then the relay. A retryable error means
    /// nothing was sent.
    pub(super) async fn send_to(
        &self,
        snap: &RouterSnapshot,
        ex: &mut Exchange<'_>,
        idx: BackendIdx,
        attempt: &Attempt<'_>,
        begun: Instant,
    ) -> Result<Answer, DispatchError> {
        let (Some(backend), Some(addr)) = (snap.backend(idx), snap.backend_addr(idx)) else {
            return Err(DispatchError::CONNECT);
        };
        let body = match attempt_body(ex, backend, attempt) {
            Ok(b) => b,
            Err(outcome) => return Ok(Answer::Done(outcome)),
        };
        let timeouts = &backend.timeouts;
        let tls = snap.backend_tls(idx);
        let key = PoolKey::new(addr, tls);
        // Idle age against the request's start: at most that much older than now, far below the
        // pool's 30 s limit, and a stale connection is replaced anyway.
        let pooled = self.pool.borrow_mut().checkout(key, ex.started);
        for slot in [pooled, None] {
            let reused = slot.is_some();
            let mut up = match slot {
                Some(s) => s,
                None => match conn::connect(addr, tls, connect_timeout(timeouts, ex.started)).await
                {
                    Ok(s) => s,
                    Err(e) => {
                        self.metrics.dispatch_failed(e);
                        return Err(e);
                    }
                },
            };
            let result = match send_request(
                ex,
                &mut up,
                &backend.url,
                body,
                attempt,
                timeouts,
                reused.then_some(begun),
            )
            .await
            {
                Ok(()) => {
                    let sent = clock::instant();
                    ex.times.sent = Some(sent);
                    let timing = Timing::new(timeouts, ex.started, sent);
                    relay::relay(&timing, ex, &mut up, backend, attempt, reused)
                        .await
                        .map(|answer| (answer, timing.sent()))
                }
                Err(e) => Err(e),
            };
            match result {
                Ok(((answer, reusable), sent)) => {
                    if reusable {
                        // Idle since the request was written, for all the pool knows: an age
                        // that only errs old (a stream longer than the pool's limit costs one
                        // connect later), without another clock reading.
                        self.pool.borrow_mut().checkin(key, up, sent);
                    }
                    return Ok(answer);
                }
                // A pooled connection the backend had closed: once more on a fresh one.
                Err(e) if retry_on_fresh_connection(e) => continue,
                Err(e) => {
                    self.metrics.dispatch_failed(e);
                    return Err(e);
                }
            }
        }
        self.metrics.dispatch_failed(DispatchError::CONNECT);
        Err(DispatchError::CONNECT)
    }
}

/// The connect timeout, shortened to what is left of the request's deadline.
fn connect_timeout(t: &UpstreamTimeouts, started: Instant) -> std::time::Duration {
    within_deadline(t.connect, t, started)
}

/// `limit`, cut to what is left of the request's deadline (when one is set).
fn within_deadline(
    limit: std::time::Duration,
    t: &UpstreamTimeouts,
    started: Instant,
) -> std::time::Duration {
    match t.deadline {
        None => limit,
        Some(d) => limit.min((started + d).saturating_duration_since(clock::instant())),
    }
}

/// What the plain loop does after one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PlainStep {
    /// The client has its answer.
    Answered(Outcome),
    /// Relay the held non-2xx answer (converted ingresses hold every failure).
    RelayHeld(u16),
    /// Nothing was sent: try the next replica; answer with this if none is left.
    NextReplica(LocalError),
    /// Answer the client with this local error.
    Answer(LocalError),
    /// The client saw part of an answer (or left): close its connection.
    Abort,
}

/// The plain loop's decision for one attempt's result.
pub(super) fn plain_step(result: Result<Answer, DispatchError>) -> PlainStep {
    match result {
        Ok(Answer::Done(outcome)) => PlainStep::Answered(outcome),
        Ok(Answer::Held(status)) => PlainStep::RelayHeld(status),
        Err(e) if e.retryable => PlainStep::NextReplica(LocalError::of_dispatch(e)),
        Err(e) if e.answerable() => PlainStep::Answer(LocalError::of_dispatch(e)),
        Err(_) => PlainStep::Abort,
    }
}

/// Whether a failure on one connection is retried once on a fresh one: a reused connection the
/// backend had closed before any response byte (nothing can have been processed).
pub(super) fn retry_on_fresh_connection(e: DispatchError) -> bool {
    e.retryable && e.kind == ErrorKind::Closed
}

/// The body an attempt sends to `backend`: the attempt's own ([`Body::Shim`] on a shim attempt
/// with `token_data`), else the request's, converted per backend.
pub(super) fn attempt_body(
    ex: &mut Exchange<'_>,
    backend: &BackendConfig,
    attempt: &Attempt<'_>,
) -> Result<Body, Outcome> {
    match attempt.body {
        Some(b) => Ok(b),
        None => convert::for_backend(ex, backend),
    }
}

/// Write the request head and body to `up`.
/// Write the request within the first-byte timeout (and the request's deadline): a backend that
/// does not take the request in that time is a timeout in [`Phase::Request`], not an exchange
/// that waits for it forever. The write is not cancelled on time-out but cut short under it
/// ([`conn::SocketAbort`]), so every buffer it borrowed (the client's body among them) comes
/// back intact.
async fn send_request(
    ex: &mut Exchange<'_>,
    up: &mut UpConn,
    url: &BackendUrl,
    body: Body,
    attempt: &Attempt<'_>,
    timeouts: &UpstreamTimeouts,
    pooled_at: Option<Instant>,
) -> Result<(), DispatchError> {
    let reused = pooled_at.is_some();
    let by = write_by(timeouts, ex.started, pooled_at);
    let abort = up.abort_handle();
    let timer = ex.req.timer.clone();
    let write = write_request(ex, up, url, body, attempt);
    let mut write = std::pin::pin!(write);
    match timer.until(by, write.as_mut()).await {
        Ok(Ok(())) => Ok(()),
        // A pooled connection the backend had closed: retryable on a fresh one.
        Ok(Err(_)) => Err(DispatchError::closed(Phase::Request, reused)),
        Err(_) => {
            abort.abort();
            let _ = write.await;
            Err(DispatchError::new(ErrorKind::Timeout, Phase::Request))
        }
    }
}

/// When the request must be written: the first-byte timeout from when the write begins, within
/// the request's deadline. On a pooled connection (`pooled_at`: when the attempt began, the
/// request's own clock reading for a first attempt) the write begins as the attempt does; after
/// a connect, which may have taken a while, it counts from a fresh reading.
fn write_by(t: &UpstreamTimeouts, started: Instant, pooled_at: Option<Instant>) -> Instant {
    let begins = pooled_at.unwrap_or_else(clock::instant);
    let by = begins + t.first_byte;
    t.deadline.map_or(by, |d| by.min(started + d))
}

async fn write_request(
    ex: &mut Exchange<'_>,
    up: &mut UpConn,
    url: &BackendUrl,
    body: Body,
    attempt: &Attempt<'_>,
) -> std::io::Result<()> {
    build_upstream_head(ex, url, body, attempt);
    let all = 0..ex.bufs.out.len();
    write_lent(up, &mut ex.bufs.out, all).await?;
    if ex.bytes(body).len() > COALESCE_BODY {
        ex.write_body_to(up, body).await?;
    }
    Ok(())
}

/// Write the upstream request head (and a small body) into the exchange's upstream buffer.
pub(super) fn build_upstream_head(
    ex: &mut Exchange<'_>,
    url: &BackendUrl,
    body: Body,
    attempt: &Attempt<'_>,
) {
    let body_len = ex.bytes(body).len();
    let mut stripped = 0u64;
    let mut out = std::mem::take(&mut ex.bufs.out);
    out.clear();
    let req = &*ex.req;
    let path = ex.upstream_path(body).unwrap_or_else(|| req.path());
    out.extend_from_slice(b"POST ");
    out.extend_from_slice(url.base_path.as_bytes());
    out.extend_from_slice(path);
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    let bracket = url.host.contains(':');
    if bracket {
        out.push(b'[');
    }
    out.extend_from_slice(url.host.as_bytes());
    out.extend_from_slice(if bracket { b"]:" } else { b":" });
    push_decimal(&mut out, u64::from(url.port));
    out.extend_from_slice(b"\r\ncontent-length: ");
    push_decimal(&mut out, body_len as u64);
    out.extend_from_slice(b"\r\n");
    let connection = req
        .head
        .connection
        .as_ref()
        .map_or(&b""[..], |r| req.span(r));
    for h in &req.head.headers {
        let name = req.span(&h.name);
        match headers::request_header_fate(name, connection) {
            RequestHeaderFate::Forward => {
                if name.eq_ignore_ascii_case(b"expect") {
                    continue;
                }
                // The router's own credential is not the backend's business.
                if ex.key.is_some()
                    && (name.eq_ignore_ascii_case(b"authorization")
                        || name.eq_ignore_ascii_case(b"x-api-key"))
                {
                    continue;
                }
                out.extend_from_slice(name);
                out.extend_from_slice(b": ");
                out.extend_from_slice(req.span(&h.value));
                out.extend_from_slice(b"\r\n");
            }
            RequestHeaderFate::DropPin => stripped += 1,
            RequestHeaderFate::DropHop => {}
        }
    }
    // The picker's pins, after every client pin was dropped above (SHIM-09).
    if let Some(pins) = &attempt.pins {
        pins.write_to(&mut out);
    }
    out.extend_from_slice(b"\r\n");
    if body_len <= COALESCE_BODY {
        out.extend_from_slice(ex.bytes(body));
    }
    ex.bufs.out = out;
    if stripped > 0 {
        ex.req.pins_stripped = stripped;
    }
}
