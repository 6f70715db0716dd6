//! Relaying one upstream response to the client.
//!
//! The response head is parsed once, filtered (hop-by-hop, framing and `x-dynamo-*` headers are
//! dropped; `x-backend` is added only when the client asked) and written together with the body
//! bytes that arrived with it. The body is then copied read-for-write: each upstream read is
//! written to the client before the next read, so a slow client slows the backend (backpressure)
//! and nothing is buffered beyond one read. Chunked bodies pass through with their chunk
//! boundaries intact (an SSE event leaves as soon as it arrives); a decoder only tracks where the
//! body ends.

use std::io::Write as _;

use super::conn::UpConn;
use continuum_core::config::BackendConfig;
use continuum_core::headers;

use continuum_core::http1::request::Method;
use continuum_core::upstream::{DispatchError, ErrorKind, Phase};

use super::exchange::{Answer, Attempt, Exchange, FailureHandling};
use super::upstream::{
    BodyState, Framing, MAX_RESPONSE_HEAD, ParsedHead, Timing, UPSTREAM_BUF, end_head, hold,
    parse_head, read_continued, read_upstream, write_client,
};
use crate::clock;
use crate::http::respond;
use crate::http::{Outcome, push_decimal};
use crate::metrics::phases::DispatchPath;

/// Largest non-2xx body held back for the shim decision (error bodies are small; a larger one
/// is treated as an unusable answer).
const MAX_HELD_BODY: usize = 256 * 1024;

/// Relay the response on `up` (`reused`: a pooled connection). Returns the answer and whether
/// `up` can be pooled.
pub(super) async fn relay(
    timing: &Timing,
    ex: &mut Exchange<'_>,
    up: &mut UpConn,
    backend: &BackendConfig,
    attempt: &Attempt<'_>,
    reused: bool,
) -> Result<(Answer, bool), DispatchError> {
    ex.bufs.ubuf.clear();
    if ex.bufs.ubuf.capacity() < UPSTREAM_BUF {
        ex.bufs.ubuf.reserve(UPSTREAM_BUF);
    }
    // Read until a complete (non-1xx) response head is buffered.
    let mut first_read = true;
    let parsed = loop {
        if ex.bufs.ubuf.len() == ex.bufs.ubuf.capacity() {
            if ex.bufs.ubuf.len() >= MAX_RESPONSE_HEAD {
                return Err(DispatchError::new(ErrorKind::Protocol, Phase::Head));
            }
            ex.bufs.ubuf.reserve(UPSTREAM_BUF);
        }
        let nothing_yet = ex.bufs.ubuf.is_empty();
        // Only the response's first read goes without an immediate ACK (see read_upstream).
        let read = if first_read {
            read_upstream(ex, up, timing.head_by()).await?
        } else {
            read_continued(ex, up, timing.head_by()).await?
        };
        first_read = false;
        match read {
            Ok(n) if n > 0 => {}
            // EOF or reset before any response byte: a pooled connection the backend closed.
            _ if nothing_yet => return Err(DispatchError::closed(Phase::Head, reused)),
            _ => return Err(DispatchError::new(ErrorKind::Reset, Phase::Head)),
        }
        match parse_head(
            &ex.bufs.ubuf,
            ex.req.head.method == Method::Head,
            &mut ex.bufs.resp_spans,
        )? {
            None => continue,
            Some(p) if (100..200).contains(&p.status) => {
                ex.bufs.ubuf.drain(..p.head_len);
                if let Some(p) = parse_head(
                    &ex.bufs.ubuf,
                    ex.req.head.method == Method::Head,
                    &mut ex.bufs.resp_spans,
                )? && !(100..200).contains(&p.status)
                {
                    break p;
                }
            }
            Some(p) => break p,
        }
    };
    let head_at = clock::instant();
    ex.times.head = Some(head_at);
    ex.times.path = if attempt.pins.is_some() {
        DispatchPath::Shim
    } else {
        DispatchPath::Plain
    };
    if attempt.on_failure == FailureHandling::Hold && !(200..300).contains(&parsed.status) {
        let reusable = hold(ex, up, &parsed, timing, MAX_HELD_BODY).await?;
        return Ok((Answer::Held(parsed.status), reusable));
    }
    if let Some(ctx) = ex.convert.clone() {
        return super::convert::relay_converted(ex, up, &parsed, timing, backend, attempt, ctx)
            .await;
    }
    // An HTTP/1.0 client cannot read chunked framing: decode it and delimit by close instead.
    let dechunk = ex.req.head.http10 && parsed.framing == Framing::Chunked;
    let keep_alive = ex.req.head.keep_alive && parsed.framing != Framing::UntilClose && !dechunk;
    let events = write_client_head(ex, &parsed, backend, keep_alive, dechunk, attempt);
    let mut reusable = parsed.upstream_keep_alive;
    // Body bytes that came with the head.
    let first = parsed.head_len..ex.bufs.ubuf.len();
    let mut body = BodyState::new(&parsed, dechunk);
    let head_len = ex.sink.buf.len();
    let consumed = body.forward(&ex.bufs.ubuf[first.clone()], &mut ex.sink.buf)?;
    if consumed < first.len() {
        reusable = false; // bytes beyond the response: do not trust this connection
    }
    if events && ex.sink.buf.len() > head_len {
        ex.times.event_written(|| head_at);
    }
    write_client(ex).await?;
    // From here on the client has part of the answer: nothing can be retried or answered any
    // more, and a failure closes the client connection mid-body.
    while !body.done {
        ex.bufs.ubuf.clear();
        match read_continued(ex, up, timing.body_by()).await {
            Ok(Ok(n)) if n > 0 => {}
            Ok(Ok(_)) if parsed.framing == Framing::UntilClose => break,
            Ok(_) => return Err(DispatchError::new(ErrorKind::Reset, Phase::Body)),
            Err(e) => return Err(e.in_body()),
        }
        ex.sink.buf.clear();
        let forwarded = body
            .forward(&ex.bufs.ubuf, &mut ex.sink.buf)
            .map_err(DispatchError::in_body)?;
        if forwarded < ex.bufs.ubuf.len() {
            reusable = false;
        }
        if events && !ex.sink.buf.is_empty() {
            ex.times.event_written(clock::instant);
        }
        write_client(ex).await?;
    }
    let reusable = reusable && parsed.framing != Framing::UntilClose;
    Ok((
        Answer::Done(Outcome {
            status: parsed.status,
            keep_alive,
        }),
        reusable,
    ))
}

/// Write a held answer to `ex.sink.buf` as a complete response with the routing headers, for the
/// connection's writer to send.
pub(super) fn write_held(
    ex: &mut Exchange<'_>,
    status: u16,
    backend: &BackendConfig,
    attempt: &Attempt<'_>,
) -> Outcome {
    let keep_alive = ex.req.head.keep_alive;
    if ex.convert.is_some() {
        // The client speaks another protocol: its own error shape, the upstream message kept.
        let err = super::convert::upstream_error(status, &ex.bufs.held);
        ex.bufs.held = respond::classified_body(&err, ex.shape);
        ex.bufs.held_type.clear();
        ex.bufs.held_type.extend_from_slice(b"application/json");
    }
    ex.sink.buf.clear();
    let _ = write!(
        ex.sink.buf,
        "HTTP/1.1 {status} {}\r\ncontent-length: {}\r\n",
        respond::reason(status),
        ex.bufs.held.len()
    );
    if !ex.bufs.held_type.is_empty() {
        ex.sink.buf.extend_from_slice(b"content-type: ");
        ex.sink.buf.extend_from_slice(&ex.bufs.held_type);
        ex.sink.buf.extend_from_slice(b"\r\n");
    }
    end_head(ex, backend, attempt, keep_alive);
    if ex.req.head.method != Method::Head {
        ex.sink.buf.extend_from_slice(&ex.bufs.held);
    }
    Outcome { status, keep_alive }
}

/// Write the client-facing response head into `ex.sink.buf` (cleared first). Returns whether the
/// answer is a 2xx event stream (`content-type: text/event-stream`), whose first body bytes are
/// its first event (`continuum_time_to_first_event_seconds`), read in the same pass.
fn write_client_head(
    ex: &mut Exchange<'_>,
    p: &ParsedHead,
    backend: &BackendConfig,
    keep_alive: bool,
    dechunk: bool,
    attempt: &Attempt<'_>,
) -> bool {
    ex.sink.buf.clear();
    let reason = &ex.bufs.ubuf[p.reason.clone()];
    ex.sink.buf.extend_from_slice(b"HTTP/1.1 ");
    push_decimal(&mut ex.sink.buf, u64::from(p.status));
    ex.sink.buf.push(b' ');
    if reason.is_empty() {
        ex.sink
            .buf
            .extend_from_slice(respond::reason(p.status).as_bytes());
    } else {
        ex.sink.buf.extend_from_slice(reason);
    }
    ex.sink.buf.extend_from_slice(b"\r\n");
    let connection = p.connection.clone().map_or(&b""[..], |r| &ex.bufs.ubuf[r]);
    let mut events = false;
    for h in &ex.bufs.resp_spans {
        let name = &ex.bufs.ubuf[h.name.clone()];
        if headers::response_header_relayable(name, connection) {
            let value = &ex.bufs.ubuf[h.value.clone()];
            events |= name.eq_ignore_ascii_case(b"content-type")
                && value
                    .get(..17)
                    .is_some_and(|v| v.eq_ignore_ascii_case(b"text/event-stream"));
            ex.sink.buf.extend_from_slice(name);
            ex.sink.buf.extend_from_slice(b": ");
            ex.sink.buf.extend_from_slice(value);
            ex.sink.buf.extend_from_slice(b"\r\n");
        }
    }
    match p.framing {
        Framing::Length(n) => {
            ex.sink.buf.extend_from_slice(b"content-length: ");
            push_decimal(&mut ex.sink.buf, n);
            ex.sink.buf.extend_from_slice(b"\r\n");
        }
        Framing::Chunked if !dechunk => ex
            .sink
            .buf
            .extend_from_slice(b"transfer-encoding: chunked\r\n"),
        Framing::Chunked => {}
        Framing::Empty => {
            if p.status != 204 && p.status != 304 {
                ex.sink.buf.extend_from_slice(b"content-length: 0\r\n");
            }
        }
        Framing::UntilClose => {}
    }
    end_head(ex, backend, attempt, keep_alive);
    events && (200..300).contains(&p.status)
}
