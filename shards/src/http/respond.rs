//! Writing locally generated responses (errors, health, models, metrics) into a buffer.
//!
//! Error bodies follow the OpenAI shape `{"error":{"message","type","code"}}` so official
//! clients surface them. Messages are fixed strings or escaped through `serde_json`, never raw
//! client input.

use std::io::Write as _;

use continuum_core::ingress::errors::{ClassifiedError, ErrorClass};

/// A local error the router answers itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LocalError {
    BadRequest(&'static str),
    Unauthorized,
    Forbidden,
    /// `auth` is on and the request carries no API key.
    ApiKeyMissing,
    /// The API key is not configured (or was revoked by a reload).
    ApiKeyInvalid,
    /// The key may not use the request's model.
    ModelNotAllowed,
    /// The key may not reach any backend that serves the request.
    BackendNotAllowed,
    /// The key is over its request rate; retry after this many seconds.
    RateLimited(u32),
    /// The key is at its `max_concurrent`.
    TooManyConcurrent,
    NotFound,
    MethodNotAllowed,
    ModelNotFound,
    Timeout,
    BodyTooLarge,
    HeadersTooLarge,
    UpstreamUnavailable,
    /// Every replica that could serve the request failed its active health checks.
    NoHealthyUpstream,
    UpstreamTimeout,
    UpstreamProtocol,
    Draining,
}

impl LocalError {
    /// The answer to a dispatch failure the router can still answer (no answer started).
    pub(crate) fn of_dispatch(e: continuum_core::upstream::DispatchError) -> Self {
        use continuum_core::upstream::ErrorKind;
        match e.kind {
            ErrorKind::Timeout => LocalError::UpstreamTimeout,
            ErrorKind::Protocol => LocalError::UpstreamProtocol,
            _ => LocalError::UpstreamUnavailable,
        }
    }
}

impl LocalError {
    /// The seconds a client should wait before retrying (the `retry-after` header), if any.
    pub(crate) fn retry_after(self) -> Option<u32> {
        match self {
            LocalError::RateLimited(secs) => Some(secs.max(1)),
            LocalError::TooManyConcurrent => Some(1),
            _ => None,
        }
    }

    pub(crate) fn status(self) -> u16 {
        match self {
            LocalError::BadRequest(_) => 400,
            LocalError::Unauthorized | LocalError::ApiKeyMissing | LocalError::ApiKeyInvalid => 401,
            LocalError::Forbidden | LocalError::ModelNotAllowed | LocalError::BackendNotAllowed => {
                403
            }
            LocalError::RateLimited(_) | LocalError::TooManyConcurrent => 429,
            LocalError::NotFound | LocalError::ModelNotFound => 404,
            LocalError::MethodNotAllowed => 405,
            LocalError::Timeout => 408,
            LocalError::BodyTooLarge => 413,
            LocalError::HeadersTooLarge => 431,
            LocalError::UpstreamUnavailable | LocalError::UpstreamProtocol => 502,
            LocalError::Draining | LocalError::NoHealthyUpstream => 503,
            LocalError::UpstreamTimeout => 504,
        }
    }

    fn parts(self) -> (&'static str, &'static str, &'static str) {
        match self {
            LocalError::BadRequest(m) => (m, "invalid_request_error", "bad_request"),
            LocalError::Unauthorized => (
                "missing or invalid admin bearer token",
                "authentication_error",
                "unauthorized",
            ),
            LocalError::Forbidden => (
                "admin routes answer loopback peers only",
                "permission_error",
                "forbidden",
            ),
            LocalError::ApiKeyMissing => (
                "no API key: send it as `Authorization: Bearer <key>` or `x-api-key: <key>`",
                "invalid_request_error",
                "missing_api_key",
            ),
            LocalError::ApiKeyInvalid => (
                "incorrect API key provided",
                "invalid_request_error",
                "invalid_api_key",
            ),
            LocalError::ModelNotAllowed => (
                "this API key may not use the requested model",
                "permission_error",
                "model_not_allowed",
            ),
            LocalError::BackendNotAllowed => (
                "this API key may not use any backend that serves the requested model",
                "permission_error",
                "backend_not_allowed",
            ),
            LocalError::RateLimited(_) => (
                "rate limit reached for this API key: retry after the time in Retry-After",
                "requests",
                "rate_limit_exceeded",
            ),
            LocalError::TooManyConcurrent => (
                "this API key has its maximum of concurrent requests in flight",
                "requests",
                "too_many_concurrent_requests",
            ),
            LocalError::NotFound => ("no such route", "invalid_request_error", "not_found"),
            LocalError::MethodNotAllowed => (
                "method not allowed on this route",
                "invalid_request_error",
                "method_not_allowed",
            ),
            LocalError::ModelNotFound => (
                "the model does not exist or no backend serves it",
                "invalid_request_error",
                "model_not_found",
            ),
            LocalError::Timeout => (
                "request head not received in time",
                "invalid_request_error",
                "request_timeout",
            ),
            LocalError::BodyTooLarge => (
                "request body exceeds the configured limit",
                "invalid_request_error",
                "body_too_large",
            ),
            LocalError::HeadersTooLarge => (
                "request headers exceed the configured limit",
                "invalid_request_error",
                "headers_too_large",
            ),
            LocalError::UpstreamUnavailable => (
                "no backend replica could be reached",
                "upstream_error",
                "upstream_unavailable",
            ),
            LocalError::NoHealthyUpstream => (
                "every backend replica that serves this request is failing its health checks",
                "upstream_error",
                "no_healthy_upstream",
            ),
            LocalError::UpstreamTimeout => (
                "the backend did not answer in time",
                "upstream_error",
                "upstream_timeout",
            ),
            LocalError::UpstreamProtocol => (
                "the backend sent an invalid response",
                "upstream_error",
                "upstream_protocol_error",
            ),
            LocalError::Draining => (
                "the router is shutting down",
                "service_unavailable",
                "draining",
            ),
        }
    }
}

pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "",
    }
}

/// What happens to the connection after a response, and how the response says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Persistence {
    /// Close after this response (`connection: close`).
    Close,
    /// Keep open; HTTP/1.1 default, nothing to say.
    KeepAlive,
    /// Keep open for an HTTP/1.0 client, which must be told (`connection: keep-alive`).
    KeepAliveHttp10,
}

impl Persistence {
    /// The policy for a client that asked `keep_alive` over HTTP/1.0 (`http10`) or 1.1.
    pub(crate) fn of(keep_alive: bool, http10: bool) -> Self {
        match (keep_alive, http10) {
            (false, _) => Persistence::Close,
            (true, false) => Persistence::KeepAlive,
            (true, true) => Persistence::KeepAliveHttp10,
        }
    }

    /// The header line announcing it (empty when nothing needs saying).
    pub(crate) fn header(self) -> &'static str {
        match self {
            Persistence::Close => "connection: close\r\n",
            Persistence::KeepAlive => "",
            Persistence::KeepAliveHttp10 => "connection: keep-alive\r\n",
        }
    }
}

/// Whether a response carries its body (`HEAD` requests get the head only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyMode {
    Full,
    HeadOnly,
}

/// Append a complete response with a body.
pub(crate) fn write_response(
    out: &mut Vec<u8>,
    status: u16,
    content_type: &str,
    body: &[u8],
    persistence: Persistence,
    mode: BodyMode,
) {
    let _ = write!(
        out,
        "HTTP/1.1 {status} {}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n{}\r\n",
        reason(status),
        body.len(),
        persistence.header(),
    );
    if mode == BodyMode::Full {
        out.extend_from_slice(body);
    }
}

/// Which protocol's error body a request gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorShape {
    /// `{"error":{"message","type","code"}}` (chat completions, Responses, router routes).
    OpenAi,
    /// `{"type":"error","error":{"type","message"}}` (Anthropic Messages, INGRESS-06).
    Anthropic,
}

impl ErrorShape {
    /// The shape of `route`'s errors.
    pub(crate) fn of(route: continuum_core::route::Route) -> Self {
        match route {
            continuum_core::route::Route::Messages => ErrorShape::Anthropic,
            _ => ErrorShape::OpenAi,
        }
    }
}

impl LocalError {
    /// The protocol-independent class of this error.
    pub(crate) fn class(self) -> ErrorClass {
        match self.status() {
            401 => ErrorClass::Authentication,
            403 => ErrorClass::Permission,
            404 => ErrorClass::NotFound,
            413 => ErrorClass::RequestTooLarge,
            429 => ErrorClass::RateLimited,
            502 => ErrorClass::UpstreamProtocol,
            503 => ErrorClass::Overloaded,
            504 => ErrorClass::UpstreamTimeout,
            _ => ErrorClass::InvalidRequest,
        }
    }
}

/// Append an error response in `shape`.
pub(crate) fn write_error_shaped(
    out: &mut Vec<u8>,
    err: LocalError,
    shape: ErrorShape,
    persistence: Persistence,
) {
    let start = out.len();
    match shape {
        ErrorShape::OpenAi => write_error(out, err, persistence),
        ErrorShape::Anthropic => {
            let body = ClassifiedError::new(err.class(), err.parts().0).anthropic_body();
            write_response(
                out,
                err.status(),
                "application/json",
                &body,
                persistence,
                BodyMode::Full,
            );
        }
    }
    if let Some(secs) = err.retry_after() {
        insert_header(out, start, &format!("retry-after: {secs}\r\n"));
    }
}

/// Insert `line` (ending in CRLF) at the end of the response head that starts at `start`.
fn insert_header(out: &mut Vec<u8>, start: usize, line: &str) {
    if let Some(end) = memchr::memmem::find(&out[start..], b"\r\n\r\n") {
        let at = start + end + 2;
        out.splice(at..at, line.bytes());
    }
}

/// The body of a classified error in `shape`.
pub(crate) fn classified_body(err: &ClassifiedError, shape: ErrorShape) -> Vec<u8> {
    match shape {
        ErrorShape::OpenAi => err.openai_body(),
        ErrorShape::Anthropic => err.anthropic_body(),
    }
}

/// Append an error response in the OpenAI error shape.
pub(crate) fn write_error(out: &mut Vec<u8>, err: LocalError, persistence: Persistence) {
    let (message, kind, code) = err.parts();
    let body = serde_json::json!({"error": {"message": message, "type": kind, "code": code}});
    let body = body.to_string();
    write_response(
        out,
        err.status(),
        "application/json",
        body.as_bytes(),
        persistence,
        BodyMode::Full,
    );
}

/// Append a classified error of the shim path (an OpenAI-shaped `body` built by
/// `continuum_core::ingress::errors`) with the routing path header.
pub(crate) fn write_classified(
    out: &mut Vec<u8>,
    status: u16,
    body: &[u8],
    routing: continuum_core::headers::RoutingHeaders<'_>,
    persistence: Persistence,
) {
    let _ = write!(
        out,
        "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        reason(status),
        body.len(),
    );
    routing.write_to(out, continuum_core::headers::Disclosure::PathOnly);
    out.extend_from_slice(persistence.header().as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_has_openai_shape_and_framing() {
        let mut out = Vec::new();
        write_error(&mut out, LocalError::BodyTooLarge, Persistence::Close);
        let text = String::from_utf8(out).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 413 Content Too Large\r\n"));
        assert!(head.contains("connection: close"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "body_too_large");
    }
}
