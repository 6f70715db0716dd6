//! The walk over upstream chat-completion SSE chunks shared by the stream converters.
//!
//! Role: both [`super::anthropic_stream::AnthropicStream`] and
//! [`super::responses_stream::ResponsesStream`] read the same upstream stream: SSE events framed
//! by a bounded [`SseFramer`], `[DONE]`, error chunks, the first chunk (ids), usage, the first
//! choice's text and tool-call deltas, and its `finish_reason`. This module does that walk once and
//! calls a [`ChunkSink`] for each step; each converter only decides what to emit.
//!
//! Invariants: after the sink reports it is done, input is ignored; the converted output is a
//! function of the concatenated input only (an error keeps the bytes converted before it for
//! `fail`, which sends them first); an upstream `error` chunk (an
//! `error` key or `event: error`) ends the stream through [`fail`]; an upstream EOF
//! before any `finish_reason` fails the stream rather than completing it.

use serde_json::Value;

use super::IngressError;
use super::errors::{ClassifiedError, ErrorClass};
use super::sse::{SseEvent, SseFramer};

/// The state the walk itself keeps, embedded in each converter.
#[derive(Debug)]
pub(crate) struct WalkState {
    /// Bounded SSE framing of the upstream bytes.
    pub(crate) framer: SseFramer,
    /// The converted stream has ended; later input is ignored.
    pub(crate) done: bool,
    /// The first choice's `finish_reason`, once seen.
    pub(crate) finish_reason: Option<String>,
    /// The last usage object seen.
    pub(crate) usage: Option<Value>,
    /// Bytes converted by the call that then failed, owed to the client ahead of the error event
    /// (so the output does not depend on how the input was split).
    pub(crate) pending: Vec<u8>,
}

impl WalkState {
    /// A fresh state whose framer holds at most `cap` bytes of a pending line or event.
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            framer: SseFramer::new(cap),
            done: false,
            finish_reason: None,
            usage: None,
            pending: Vec::new(),
        }
    }
}

/// What a stream converter does at each step of the chunk walk.
pub(crate) trait ChunkSink {
    /// The walk's state inside the converter.
    fn walk(&mut self) -> &mut WalkState;
    /// The first chunk arrived (idempotent).
    fn start(&mut self, chunk: &Value, out: &mut Vec<u8>);
    /// A non-empty text delta.
    fn text(&mut self, text: &str, out: &mut Vec<u8>);
    /// The `pos`-th tool-call delta of a chunk.
    fn tool_delta(&mut self, call: &Value, pos: u64, out: &mut Vec<u8>)
    -> Result<(), IngressError>;
    /// The choice carries a `finish_reason`.
    fn finish_reason(&mut self, reason: &str, _choice: &Value) {
        self.walk().finish_reason = Some(reason.to_owned());
    }
    /// End the stream successfully.
    fn complete(&mut self, out: &mut Vec<u8>);
    /// The protocol's events that end a stream with `err` (called once, by [`fail`]).
    fn error_events(&mut self, err: &ClassifiedError, out: &mut Vec<u8>);
}

/// Converts the events framed before a framing error (`framed`), in order, stopping at the
/// first error; on an error the bytes converted so far are kept in [`WalkState::pending`] for
/// the converter's `fail` to send first.
fn convert_events<S: ChunkSink>(
    sink: &mut S,
    events: Vec<SseEvent>,
    framed: Result<(), IngressError>,
) -> Result<Vec<u8>, IngressError> {
    let mut out = Vec::new();
    let mut result = framed;
    for e in events {
        if let Err(err) = on_event(sink, e, &mut out) {
            result = Err(err);
            break;
        }
    }
    match result {
        Ok(()) => Ok(out),
        Err(err) => {
            sink.walk().pending.extend(out);
            Err(err)
        }
    }
}

/// Feeds upstream bytes through the sink's framer; returns the converted bytes they complete.
pub(crate) fn feed<S: ChunkSink>(sink: &mut S, bytes: &[u8]) -> Result<Vec<u8>, IngressError> {
    let mut events = Vec::new();
    let framed = sink.walk().framer.push(bytes, &mut events);
    convert_events(sink, events, framed)
}

/// Ends the stream with `err`: the bytes converted before a failed call first, then the sink's
/// error events; only the bytes owed when the stream had already ended.
pub(crate) fn fail<S: ChunkSink>(sink: &mut S, err: &ClassifiedError) -> Vec<u8> {
    let walk = sink.walk();
    let mut out = std::mem::take(&mut walk.pending);
    if walk.done {
        return out;
    }
    walk.done = true;
    sink.error_events(err, &mut out);
    out
}

/// Upstream EOF: flushes the framer and ends the stream if it has not ended yet.
pub(crate) fn finish<S: ChunkSink>(sink: &mut S) -> Result<Vec<u8>, IngressError> {
    let mut events = Vec::new();
    let framed = sink.walk().framer.finish(&mut events);
    let mut out = convert_events(sink, events, framed)?;
    if !sink.walk().done {
        if sink.walk().finish_reason.is_some() {
            sink.complete(&mut out);
        } else {
            let err = ClassifiedError::new(
                ErrorClass::UpstreamProtocol,
                "upstream stream ended before a finish_reason",
            );
            out.extend(fail(sink, &err));
        }
    }
    Ok(out)
}

fn on_event<S: ChunkSink>(
    sink: &mut S,
    e: SseEvent,
    out: &mut Vec<u8>,
) -> Result<(), IngressError> {
    if sink.walk().done {
        return Ok(());
    }
    if e.data.trim() == "[DONE]" {
        sink.complete(out);
        return Ok(());
    }
    let chunk: Value = serde_json::from_str(&e.data)
        .map_err(|err| IngressError::MalformedUpstream(format!("SSE chunk: {err}")))?;
    if e.event.as_deref() == Some("error") || chunk.get("error").is_some() {
        out.extend(fail(sink, &upstream_error(&chunk)));
        return Ok(());
    }
    sink.start(&chunk, out);
    if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
        sink.walk().usage = Some(u.clone());
    }
    let Some(choice) = chunk
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
    else {
        return Ok(());
    };
    if let Some(delta) = choice.get("delta") {
        if let Some(Value::String(t)) = delta.get("content")
            && !t.is_empty()
        {
            sink.text(t, out);
        }
        if let Some(Value::Array(calls)) = delta.get("tool_calls") {
            for (k, c) in calls.iter().enumerate() {
                sink.tool_delta(c, k as u64, out)?;
            }
        }
    }
    if let Some(Value::String(f)) = choice.get("finish_reason") {
        sink.finish_reason(f, choice);
    }
    Ok(())
}

/// Classifies an upstream in-stream error chunk.
fn upstream_error(chunk: &Value) -> ClassifiedError {
    let e = chunk.get("error").unwrap_or(chunk);
    let message = match e {
        Value::String(s) => s.clone(),
        _ => e
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| super::to_string(e), str::to_owned),
    };
    ClassifiedError::new(ErrorClass::Internal, message)
}
