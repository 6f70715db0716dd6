//! Streaming: OpenAI chat SSE chunks → Anthropic Messages SSE events.
//!
//! Role: an incremental state machine. [`AnthropicStream::feed`] takes upstream bytes split
//! anywhere and returns the Anthropic event bytes they complete; [`AnthropicStream::finish`]
//! closes the stream at upstream EOF.
//!
//! Event order (what the `anthropic` client's accumulator expects): `message_start`, then for
//! each content block `content_block_start`, `content_block_delta`*, `content_block_stop`, then
//! `message_delta` (stop reason, usage) and `message_stop`. Text and each tool call are separate
//! blocks with increasing `index`.
//!
//! Invariants: output depends only on the concatenated input; at most one block is open; an
//! upstream `error` (JSON with an `error` key or an `event: error`) inside the open stream is
//! relayed as an Anthropic `error` event and ends the stream (INGRESS-07); after the end, input
//! is ignored; an upstream EOF before any `finish_reason` ends with an `error` event rather than
//! a clean `message_stop`, so truncation is never disguised as success.

use serde_json::{Value, json};

use super::IngressError;
use super::anthropic_req::AnthropicContext;
use super::anthropic_resp::{map_stop_reason, map_usage, message_id};
use super::chunk_walk::{self, ChunkSink, WalkState};
use super::errors::ClassifiedError;
use super::sse::event_bytes;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Text(u64),
    Tool { index: u64, upstream: u64 },
}

/// The converter state for one response stream.
#[derive(Debug)]
pub struct AnthropicStream {
    ctx: AnthropicContext,
    walk: WalkState,
    started: bool,
    next_index: u64,
    open: Option<Open>,
    closed_tools: Vec<u64>,
    id: String,
    matched_stop: Option<String>,
    had_tools: bool,
}

impl AnthropicStream {
    /// A converter with the default 1 MiB line cap.
    pub fn new(ctx: AnthropicContext) -> Self {
        Self::with_cap(ctx, super::sse::DEFAULT_LINE_CAP)
    }

    /// A converter with a custom cap for a pending SSE line/event.
    pub fn with_cap(ctx: AnthropicContext, cap: usize) -> Self {
        Self {
            ctx,
            walk: WalkState::new(cap),
            started: false,
            next_index: 0,
            open: None,
            closed_tools: Vec::new(),
            id: String::new(),
            matched_stop: None,
            had_tools: false,
        }
    }

    /// Whether the Anthropic stream has ended (`message_stop` or `error` emitted).
    pub fn is_done(&self) -> bool {
        self.walk.done
    }

    /// Feeds upstream bytes; returns the Anthropic SSE bytes they complete.
    ///
    /// On `Err`, the caller should send [`AnthropicStream::fail`] output and close.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<u8>, IngressError> {
        chunk_walk::feed(self, bytes)
    }

    /// Upstream EOF: completes the stream if it has not ended yet.
    pub fn finish(&mut self) -> Result<Vec<u8>, IngressError> {
        chunk_walk::finish(self)
    }

    /// Ends the stream with an Anthropic `error` event (nothing if already ended).
    pub fn fail(&mut self, err: &ClassifiedError) -> Vec<u8> {
        chunk_walk::fail(self, err)
    }

    fn close_block(&mut self, out: &mut Vec<u8>) {
        if let Some(open) = self.open.take() {
            let index = match open {
                Open::Text(i) => i,
                Open::Tool { index, upstream } => {
                    self.closed_tools.push(upstream);
                    index
                }
            };
            out.extend(event_bytes(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }
}

impl ChunkSink for AnthropicStream {
    fn walk(&mut self) -> &mut WalkState {
        &mut self.walk
    }

    fn finish_reason(&mut self, reason: &str, choice: &Value) {
        self.walk.finish_reason = Some(reason.to_owned());
        if let Some(Value::String(s)) = choice.get("stop_reason") {
            self.matched_stop = Some(s.clone());
        }
    }

    fn error_events(&mut self, err: &ClassifiedError, out: &mut Vec<u8>) {
        out.extend(err.anthropic_sse_event());
    }

    fn start(&mut self, chunk: &Value, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        self.id = message_id(chunk.get("id").and_then(Value::as_str).unwrap_or("unknown"));
        let model = if self.ctx.model.is_empty() {
            chunk
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or_default()
        } else {
            self.ctx.model.as_str()
        };
        let input = chunk
            .get("usage")
            .and_then(|u| u.get("prompt_tokens"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let msg = json!({"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": Value::Null, "stop_sequence": Value::Null,
            "usage": {"input_tokens": input, "output_tokens": 0},
        }});
        out.extend(event_bytes("message_start", &msg));
    }

    fn text(&mut self, t: &str, out: &mut Vec<u8>) {
        let index = match self.open {
            Some(Open::Text(i)) => i,
            _ => {
                self.close_block(out);
                let i = self.next_index;
                self.next_index += 1;
                self.open = Some(Open::Text(i));
                out.extend(event_bytes(
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": i,
                            "content_block": {"type": "text", "text": ""}}),
                ));
                i
            }
        };
        out.extend(event_bytes(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "text_delta", "text": t}}),
        ));
    }

    fn tool_delta(&mut self, c: &Value, pos: u64, out: &mut Vec<u8>) -> Result<(), IngressError> {
        let upstream = c.get("index").and_then(Value::as_u64).unwrap_or(pos);
        let f = c.get("function");
        let args = f
            .and_then(|f| f.get("arguments"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let index = match self.open {
            Some(Open::Tool { index, upstream: u }) if u == upstream => index,
            _ => {
                if self.closed_tools.contains(&upstream) {
                    return Err(IngressError::MalformedUpstream(
                        "interleaved tool call deltas".into(),
                    ));
                }
                self.close_block(out);
                let i = self.next_index;
                self.next_index += 1;
                self.open = Some(Open::Tool { index: i, upstream });
                self.had_tools = true;
                let name = f
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let id = match c.get("id").and_then(Value::as_str) {
                    Some(id) => id.to_owned(),
                    None => format!("toolu_{}_{upstream}", self.id),
                };
                out.extend(event_bytes(
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": i,
                            "content_block": {"type": "tool_use", "id": id, "name": name,
                                              "input": {}}}),
                ));
                i
            }
        };
        if !args.is_empty() {
            out.extend(event_bytes(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": args}}),
            ));
        }
        Ok(())
    }

    fn complete(&mut self, out: &mut Vec<u8>) {
        if self.walk.done {
            return;
        }
        self.start(&Value::Null, out);
        self.close_block(out);
        let (reason, seq) = map_stop_reason(
            self.walk.finish_reason.as_deref(),
            self.matched_stop.as_deref(),
            self.had_tools,
            &self.ctx,
        );
        out.extend(event_bytes(
            "message_delta",
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": seq},
                    "usage": map_usage(self.walk.usage.as_ref())}),
        ));
        out.extend(event_bytes(
            "message_stop",
            &json!({"type": "message_stop"}),
        ));
        self.walk.done = true;
    }
}
