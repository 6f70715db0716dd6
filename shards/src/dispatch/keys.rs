//! Client API keys on the request path (`auth`): which key a request carries, and whether its
//! model, rate and concurrency budgets let it through.
//!
//! The key comes from `Authorization: Bearer <key>` (OpenAI clients) or `x-api-key: <key>`
//! (Anthropic clients); when both are sent the bearer token counts. A missing key is 401
//! `missing_api_key`, an unknown one 401 `invalid_api_key`; a model outside `allowed_models` is
//! 403 `model_not_allowed`; an exhausted rate is 429 `rate_limit_exceeded` with `retry-after`
//! (whole seconds, rounded up); `max_concurrent` in flight is 429
//! `too_many_concurrent_requests` with `retry-after: 1`. Refusals are counted per key name.
//!
//! Invariants: the model check runs before any budget is spent; the returned [`InFlight`] is
//! held for the whole request (the caller keeps it until the response is written).

use continuum_core::auth::{AuthTable, InFlight, KeyEntry, Refusal};

use crate::http::Request;
use crate::http::respond::LocalError;

/// The key `req` presents.
pub(crate) fn identify<'t>(auth: &'t AuthTable, req: &Request) -> Result<&'t KeyEntry, LocalError> {
    let presented = bearer(req).or_else(|| api_key_header(req));
    match presented {
        None => Err(LocalError::ApiKeyMissing),
        Some(k) => auth.identify(k).ok_or(LocalError::ApiKeyInvalid),
    }
}

fn bearer(req: &Request) -> Option<&[u8]> {
    let v = req.span(req.head.authorization.as_ref()?);
    let token = v
        .strip_prefix(b"Bearer ")
        .or_else(|| v.strip_prefix(b"bearer "))?
        .trim_ascii();
    (!token.is_empty()).then_some(token)
}

fn api_key_header(req: &Request) -> Option<&[u8]> {
    req.head
        .headers
        .iter()
        .find(|h| req.span(&h.name).eq_ignore_ascii_case(b"x-api-key"))
        .map(|h| req.span(&h.value).trim_ascii())
        .filter(|v| !v.is_empty())
}

/// Admit a request of `key` for `model` at `now_ns`: its model, then its rate, then its
/// concurrency.
pub(super) fn admit<'k>(
    key: &'k KeyEntry,
    model: &str,
    now_ns: u64,
) -> Result<InFlight<'k>, LocalError> {
    let refuse = |why: Refusal, e: LocalError| {
        key.state.refused(why);
        Err(e)
    };
    if !key.allows_model(model) {
        return refuse(Refusal::Model, LocalError::ModelNotAllowed);
    }
    if let Some(rate) = &key.config.rate
        && let Err(wait_ns) = key.state.try_rate(now_ns, rate)
    {
        let secs = u32::try_from(wait_ns.div_ceil(1_000_000_000)).unwrap_or(u32::MAX);
        return refuse(Refusal::RateLimited, LocalError::RateLimited(secs));
    }
    match key.state.enter(key.config.max_concurrent) {
        Some(slot) => {
            key.state.admitted();
            Ok(slot)
        }
        None => refuse(Refusal::Concurrency, LocalError::TooManyConcurrent),
    }
}
