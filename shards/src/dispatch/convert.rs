//! The converted ingresses on the data plane (INGRESS-01/02/05..07). Anthropic Messages: the
//! client body is converted to a chat completions body before the pick (so workers are picked
//! from the final body), sent to `/v1/chat/completions`, and the answer is converted back,
//! buffered or as an Anthropic SSE stream, with errors in the Anthropic shape. Responses: passed
//! through to backends that serve `/v1/responses` (`responses_api: native`), converted to chat
//! for the others (`responses_api: chat`), per attempt, so a pool may mix both.
//!
//! The conversions themselves are `continuum_core::ingress` (pure); this module only moves
//! bytes: it reads the upstream body with the relay's framing state and writes the converted
//! bytes to the client, one converted piece per upstream read (chunked framing for HTTP/1.1
//! clients, close-delimited for HTTP/1.0).
//!
//! Invariants:
//! - a conversion's context lives in `Exchange::convert` for exactly the attempt it applies
//!   to (set before the attempt's head is written);
//! - a buffered answer is read whole, bounded by [`MAX_CONVERTED_BODY`] (beyond: 502);
//! - once the converted stream has started, every failure (upstream cut, timeout, malformed
//!   chunk, conversion error) ends it with one Anthropic `error` event and a clean end of the
//!   HTTP body: the client's parser sees a well-formed stream that says what went wrong;
//! - non-2xx answers never reach here: they are held and rendered by the relay
//!   ([`upstream_error`]).

use std::io::Write as _;

use super::conn::UpConn;
use continuum_core::config::{BackendConfig, ResponsesApi};
use continuum_core::ingress::IngressError;
use continuum_core::ingress::anthropic_req::anthropic_to_chat;
use continuum_core::ingress::anthropic_stream::AnthropicStream;
use continuum_core::ingress::errors::{ClassifiedError, ErrorClass};
use continuum_core::ingress::responses::responses_to_chat;
use continuum_core::ingress::responses_stream::ResponsesStream;

use continuum_core::upstream::{DispatchError, ErrorKind};

use super::Ingress;
use super::exchange::{Answer, Attempt, Body, Conversion, Exchange};
use super::upstream::{
    BodyState, Framing, ParsedHead, Timing, end_head, hold, read_continued, write_client,
};
use crate::http::Outcome;
use crate::http::respond::{self, Persistence};

/// A streaming converter.
enum StreamConv {
    Anthropic(AnthropicStream),
    Responses(ResponsesStream),
}

impl StreamConv {
    fn new(conv: Conversion) -> Self {
        match conv {
            Conversion::Anthropic(ctx) => StreamConv::Anthropic(AnthropicStream::new(ctx)),
            Conversion::Responses(ctx) => StreamConv::Responses(ResponsesStream::new(ctx)),
        }
    }

    fn feed(&mut self, bytes: &[u8]) -> Result<Vec<u8>, IngressError> {
        match self {
            StreamConv::Anthropic(s) => s.feed(bytes),
            StreamConv::Responses(s) => s.feed(bytes),
        }
    }

    fn finish(&mut self) -> Result<Vec<u8>, IngressError> {
        match self {
            StreamConv::Anthropic(s) => s.finish(),
            StreamConv::Responses(s) => s.finish(),
        }
    }

    fn fail(&mut self, err: &ClassifiedError) -> Vec<u8> {
        match self {
            StreamConv::Anthropic(s) => s.fail(err),
            StreamConv::Responses(s) => s.fail(err),
        }
    }

    fn is_done(&self) -> bool {
        match self {
            StreamConv::Anthropic(s) => s.is_done(),
            StreamConv::Responses(s) => s.is_done(),
        }
    }
}

/// The body to send to `backend`: a Responses request to a `responses_api: chat` backend is
/// converted to chat (once per request; [`Body::Alt`], sent to `/v1/chat/completions`,
/// [`Exchange::upstream_path`]) with its answer converted back; every other attempt sends the
/// prepared body unchanged. An unconvertible body is answered here (400).
pub(super) fn for_backend(ex: &mut Exchange<'_>, backend: &BackendConfig) -> Result<Body, Outcome> {
    if ex.ingress != Ingress::Responses {
        return Ok(ex.body);
    }
    if backend.responses_api == ResponsesApi::Native {
        ex.convert = None;
        return Ok(ex.body);
    }
    if ex.responses_ctx.is_none() {
        match responses_to_chat(ex.bytes(ex.body)) {
            Ok(conv) => {
                ex.bufs.alt.clear();
                if serde_json::to_writer(&mut ex.bufs.alt, &conv.chat).is_err() {
                    ex.bufs.alt.clear();
                }
                ex.responses_ctx = Some(conv.ctx);
            }
            Err(e) => {
                let err = ClassifiedError::from(&e);
                return Err(answer(ex, &err, &err.responses_body()));
            }
        }
    }
    ex.convert = ex.responses_ctx.clone().map(Conversion::Responses);
    Ok(Body::Alt)
}

/// Write `body` as the error response for `err`.
fn answer(ex: &mut Exchange<'_>, err: &ClassifiedError, body: &[u8]) -> Outcome {
    let keep_alive = ex.req.head.keep_alive;
    ex.sink.buf.clear();
    respond::write_response(
        &mut ex.sink.buf,
        err.status(),
        "application/json",
        body,
        Persistence::of(keep_alive, ex.req.head.http10),
        respond::BodyMode::Full,
    );
    Outcome {
        status: err.status(),
        keep_alive,
    }
}

/// Largest buffered chat answer converted (the whole body is needed to convert it).
pub(super) const MAX_CONVERTED_BODY: usize = 16 * 1024 * 1024;

/// Convert the Anthropic body into a chat body (the exchange's prepared body); remember how to
/// convert the answer. An invalid body is answered here (400, Anthropic shape).
pub(super) fn prepare_messages(ex: &mut Exchange<'_>) -> Result<(), Outcome> {
    match anthropic_to_chat(ex.bytes(ex.body)) {
        Ok(conv) => {
            ex.bufs.prepared.clear();
            if serde_json::to_writer(&mut ex.bufs.prepared, &conv.chat).is_err() {
                ex.bufs.prepared.clear();
            }
            ex.body = Body::Prepared;
            ex.convert = Some(Conversion::Anthropic(conv.ctx));
            Ok(())
        }
        Err(e) => {
            let err = ClassifiedError::from(&e);
            Err(answer(ex, &err, &err.anthropic_body()))
        }
    }
}

/// The classified error of a non-2xx upstream answer, keeping the upstream's message
/// (`error.message`, or `message`, or the text itself, shortened).
pub(super) fn upstream_error(status: u16, body: &[u8]) -> ClassifiedError {
    let class = match status {
        400 | 422 => ErrorClass::InvalidRequest,
        401 => ErrorClass::Authentication,
        403 => ErrorClass::Permission,
        404 => ErrorClass::NotFound,
        413 => ErrorClass::RequestTooLarge,
        429 => ErrorClass::RateLimited,
        // 529: Dynamo 1.7's admission gate (`continuum_core::shim::OVERLOADED`).
        503 | 529 => ErrorClass::Overloaded,
        504 | 408 => ErrorClass::UpstreamTimeout,
        500 => ErrorClass::Internal,
        _ => ErrorClass::UpstreamProtocol,
    };
    let v: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let msg = v
        .as_ref()
        .and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.get("message"))
                .or_else(|| v.get("error"))
        })
        .and_then(|m| m.as_str().map(str::to_owned))
        .unwrap_or_else(|| {
            let text = String::from_utf8_lossy(body);
            text.chars().take(512).collect()
        });
    ClassifiedError::new(class, msg)
}

/// Relay a 2xx chat answer converted for the client.
pub(super) async fn relay_converted(
    ex: &mut Exchange<'_>,
    up: &mut UpConn,
    parsed: &ParsedHead,
    timing: &Timing,
    backend: &BackendConfig,
    attempt: &Attempt<'_>,
    conv: Conversion,
) -> Result<(Answer, bool), DispatchError> {
    if !conv.stream() {
        return buffered(ex, up, parsed, timing, backend, attempt, &conv).await;
    }
    let chunked = !ex.req.head.http10;
    let keep_alive = ex.req.head.keep_alive && chunked;
    ex.sink.buf.clear();
    ex.sink.buf.extend_from_slice(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n",
    );
    if chunked {
        ex.sink
            .buf
            .extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    end_head(ex, backend, attempt, keep_alive);
    let head_len = ex.sink.buf.len();
    let mut conv = StreamConv::new(conv);
    let mut body = BodyState::new(parsed, true);
    let mut plain = Vec::new();
    let first = parsed.head_len..ex.bufs.ubuf.len();
    let mut failed = None;
    match body.forward(&ex.bufs.ubuf[first], &mut plain) {
        Ok(_) => feed(&mut conv, &plain, &mut ex.sink.buf, chunked, &mut failed),
        Err(_) => failed = Some(ErrorClass::UpstreamProtocol),
    }
    if ex.sink.buf.len() > head_len {
        ex.times.event_written(crate::clock::instant);
    }
    write_client(ex).await?;
    while failed.is_none() && !body.done && !conv.is_done() {
        ex.bufs.ubuf.clear();
        match read_continued(ex, up, timing.body_by()).await {
            Ok(Ok(n)) if n > 0 => {}
            Ok(Ok(_)) if parsed.framing == Framing::UntilClose => break,
            Err(e) if e.kind == ErrorKind::Timeout => {
                failed = Some(ErrorClass::UpstreamTimeout);
                break;
            }
            _ => {
                failed = Some(ErrorClass::UpstreamProtocol);
                break;
            }
        }
        plain.clear();
        ex.sink.buf.clear();
        match body.forward(&ex.bufs.ubuf, &mut plain) {
            Ok(_) => feed(&mut conv, &plain, &mut ex.sink.buf, chunked, &mut failed),
            Err(_) => failed = Some(ErrorClass::UpstreamProtocol),
        }
        if !ex.sink.buf.is_empty() {
            ex.times.event_written(crate::clock::instant);
        }
        write_client(ex).await?;
    }
    ex.sink.buf.clear();
    let tail = match failed {
        Some(class) => conv.fail(&ClassifiedError::new(
            class,
            "the upstream stream ended abnormally",
        )),
        None => match conv.finish() {
            Ok(t) => t,
            Err(e) => conv.fail(&ClassifiedError::from(&e)),
        },
    };
    emit(&mut ex.sink.buf, &tail, chunked);
    if chunked {
        ex.sink.buf.extend_from_slice(b"0\r\n\r\n");
    }
    write_client(ex).await?;
    let reusable = failed.is_none()
        && body.done
        && parsed.upstream_keep_alive
        && parsed.framing != Framing::UntilClose;
    Ok((
        Answer::Done(Outcome {
            status: 200,
            keep_alive: keep_alive && failed.is_none(),
        }),
        reusable,
    ))
}

/// Feed upstream bytes to the converter and frame its output; a conversion error is recorded in
/// `failed` (the caller ends the stream with an error event).
fn feed(
    conv: &mut StreamConv,
    bytes: &[u8],
    out: &mut Vec<u8>,
    chunked: bool,
    failed: &mut Option<ErrorClass>,
) {
    if bytes.is_empty() {
        return;
    }
    match conv.feed(bytes) {
        Ok(piece) => emit(out, &piece, chunked),
        Err(e) => *failed = Some(e.class()),
    }
}

fn emit(out: &mut Vec<u8>, bytes: &[u8], chunked: bool) {
    if bytes.is_empty() {
        return;
    }
    if chunked {
        let _ = write!(out, "{:x}\r\n", bytes.len());
        out.extend_from_slice(bytes);
        out.extend_from_slice(b"\r\n");
    } else {
        out.extend_from_slice(bytes);
    }
}

async fn buffered(
    ex: &mut Exchange<'_>,
    up: &mut UpConn,
    parsed: &ParsedHead,
    timing: &Timing,
    backend: &BackendConfig,
    attempt: &Attempt<'_>,
    conv: &Conversion,
) -> Result<(Answer, bool), DispatchError> {
    let reusable = hold(ex, up, parsed, timing, MAX_CONVERTED_BODY).await?;
    let (status, body) = match conv.buffered(&ex.bufs.held) {
        Ok(v) => (200, serde_json::to_vec(&v).unwrap_or_default()),
        Err(e) => {
            let err = ClassifiedError::from(&e);
            (err.status(), conv.error_body(&err))
        }
    };
    let keep_alive = ex.req.head.keep_alive;
    ex.sink.buf.clear();
    let _ = write!(
        ex.sink.buf,
        "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        respond::reason(status),
        body.len()
    );
    end_head(ex, backend, attempt, keep_alive);
    ex.sink.buf.extend_from_slice(&body);
    Ok((Answer::Done(Outcome { status, keep_alive }), reusable))
}
