//! Prepare: the request body as it will be sent, and what routing needs from it.
//!
//! An Anthropic Messages body is converted to chat first (so workers are picked from the final
//! body, INGRESS-02); then one bounded walk (`continuum_core::json_scan::request_fields`) finds
//! the top-level `model`, `stream` and `prompt` and says whether the body carries `nvext` or a
//! client pin field. Only then is it parsed, stripped and re-serialised (INGRESS-04,
//! KV-PICK-11); otherwise it is forwarded byte for byte. A completions body without a usable
//! `prompt` (absent, `""`, `[]`, or neither a string nor an array) is answered 400 here.
//!
//! Invariant: after [`prepare`], `ex.body` names a body with no client pin field and no
//! `nvext.token_data`, and the returned range is its `model` string (still escaped).

use std::ops::Range;

use continuum_core::json_scan;
use continuum_core::shim::RequestMode;

use super::Ingress;
use super::convert;
use super::exchange::{Body, Exchange};
use crate::http::Outcome;
use crate::http::respond::LocalError;

/// What routing needs from a prepared body.
#[derive(Debug, Clone)]
pub(super) struct Prepared {
    /// The raw (still escaped) `model` string in `ex.bytes(ex.body)`.
    pub(super) model: Range<usize>,
    /// Buffered or streaming.
    pub(super) mode: RequestMode,
}

/// Prepare `ex`'s body; an unusable body is answered here (400, in the client's shape).
pub(super) fn prepare(ex: &mut Exchange<'_>) -> Result<Prepared, Outcome> {
    if ex.ingress == Ingress::Messages {
        convert::prepare_messages(ex)?;
    }
    let mut sanitized = false;
    loop {
        let fields = match json_scan::request_fields(ex.bytes(ex.body)) {
            Ok(f) => f,
            Err(e) => return Err(ex.local_error(scan_error(e))),
        };
        if fields.needs_sanitize && !sanitized {
            if let Err(e) = sanitize(ex) {
                return Err(ex.local_error(e));
            }
            sanitized = true;
            continue;
        }
        let Some(model) = fields.model else {
            return Err(ex.local_error(LocalError::BadRequest("request body has no `model`")));
        };
        if ex.ingress == Ingress::Completions
            && let Err(e) = check_prompt(ex.bytes(ex.body), fields.prompt)
        {
            return Err(ex.local_error(e));
        }
        let mode = if fields.stream {
            RequestMode::Streaming
        } else {
            RequestMode::Buffered
        };
        return Ok(Prepared { model, mode });
    }
}

/// A completions body must carry a non-empty `prompt` string or array (the frontend checks the
/// array's elements; so does the prompt pipeline when it reads them).
fn check_prompt(body: &[u8], prompt: Option<Range<usize>>) -> Result<(), LocalError> {
    let Some(raw) = prompt.and_then(|r| body.get(r)) else {
        return Err(LocalError::BadRequest(
            "completions request body has no `prompt`",
        ));
    };
    let empty = LocalError::BadRequest("`prompt` is empty");
    match raw.first() {
        Some(b'"') if raw == b"\"\"" => Err(empty),
        Some(b'[')
            if raw
                .get(1..raw.len() - 1)
                .is_some_and(|r| r.trim_ascii().is_empty()) =>
        {
            Err(empty)
        }
        Some(b'"' | b'[') => Ok(()),
        _ => Err(LocalError::BadRequest(
            "`prompt` must be a string or an array (of strings, token ids or token-id arrays)",
        )),
    }
}

fn scan_error(e: json_scan::ScanError) -> LocalError {
    match e {
        json_scan::ScanError::DuplicateKey => {
            LocalError::BadRequest("request body has a routing field more than once")
        }
        json_scan::ScanError::NotABool => {
            LocalError::BadRequest("request body has a non-boolean `stream`")
        }
        _ => LocalError::BadRequest("request body is not a JSON object with a string `model`"),
    }
}

/// Remove client pin fields and `nvext.token_data` (INGRESS-04, KV-PICK-11): the body is
/// parsed, stripped and re-serialised into the prepared buffer. Only bodies that carry such a
/// field get here.
fn sanitize(ex: &mut Exchange<'_>) -> Result<(), LocalError> {
    let mut v: serde_json::Value = serde_json::from_slice(ex.bytes(ex.body)).map_err(|_| {
        LocalError::BadRequest("request body is not a JSON object with a string `model`")
    })?;
    if continuum_core::ingress::sanitize::strip_client_pins_value(&mut v) {
        ex.req.pins_stripped += 1;
    }
    ex.bufs.prepared.clear();
    serde_json::to_writer(&mut ex.bufs.prepared, &v)
        .map_err(|_| LocalError::BadRequest("request body"))?;
    ex.body = Body::Prepared;
    Ok(())
}
