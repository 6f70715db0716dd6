//! Streaming: OpenAI chat SSE chunks → Responses SSE events.
//!
//! Role: incremental state machine like [`super::anthropic_stream::AnthropicStream`], producing
//! `response.created`, `response.in_progress`, per output item `response.output_item.added`,
//! (`response.content_part.added`, `response.output_text.delta`*, `response.output_text.done`,
//! `response.content_part.done`) or (`response.function_call_arguments.delta`*,
//! `response.function_call_arguments.done`), `response.output_item.done`, and finally
//! `response.completed` (or `response.incomplete` on `length`/`content_filter`).
//!
//! Invariants: `sequence_number` increases by one per event from 0; output depends only on the
//! concatenated input; at most one output item is open; an upstream in-stream error becomes a
//! Responses `error` event followed by `response.failed` and ends the stream; EOF before a
//! `finish_reason` also fails the stream.

use serde_json::{Value, json};

use super::IngressError;
use super::chunk_walk::{self, ChunkSink, WalkState};
use super::errors::ClassifiedError;
use super::responses::{
    ResponsesContext, function_call_item, map_usage, message_item, message_item_id, response_id,
    response_object, status_of,
};
use super::sse::event_bytes;

#[derive(Debug)]
enum Item {
    Text(String),
    Tool {
        upstream: u64,
        call_id: String,
        name: String,
        args: String,
    },
}

/// The converter state for one Responses stream.
#[derive(Debug)]
pub struct ResponsesStream {
    ctx: ResponsesContext,
    walk: WalkState,
    seq: u64,
    started: bool,
    id: String,
    created_at: u64,
    items: Vec<Value>,
    open: Option<Item>,
    closed_tools: Vec<u64>,
    tool_count: usize,
    text_count: usize,
}

impl ResponsesStream {
    /// A converter with the default 1 MiB line cap.
    pub fn new(ctx: ResponsesContext) -> Self {
        Self::with_cap(ctx, super::sse::DEFAULT_LINE_CAP)
    }

    /// A converter with a custom cap.
    pub fn with_cap(ctx: ResponsesContext, cap: usize) -> Self {
        Self {
            ctx,
            walk: WalkState::new(cap),
            seq: 0,
            started: false,
            id: String::new(),
            created_at: 0,
            items: Vec::new(),
            open: None,
            closed_tools: Vec::new(),
            tool_count: 0,
            text_count: 0,
        }
    }

    /// Whether the stream has ended.
    pub fn is_done(&self) -> bool {
        self.walk.done
    }

    /// Feeds upstream bytes; returns the Responses SSE bytes they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<u8>, IngressError> {
        chunk_walk::feed(self, bytes)
    }

    /// Upstream EOF.
    pub fn finish(&mut self) -> Result<Vec<u8>, IngressError> {
        chunk_walk::finish(self)
    }

    /// Ends the stream with an `error` event and `response.failed` (nothing if ended).
    pub fn fail(&mut self, err: &ClassifiedError) -> Vec<u8> {
        chunk_walk::fail(self, err)
    }

    fn next_seq(&mut self) -> u64 {
        let s = self.seq;
        self.seq += 1;
        s
    }

    fn emit(&mut self, kind: &str, mut body: Value, out: &mut Vec<u8>) {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.next_seq());
        out.extend(event_bytes(kind, &body));
    }

    fn output_index(&self) -> usize {
        self.items.len()
    }

    fn tool_item_id(&self) -> String {
        format!(
            "fc_{}_{}",
            self.id.strip_prefix("resp_").unwrap_or(&self.id),
            self.tool_count
        )
    }

    fn close_item(&mut self, out: &mut Vec<u8>) {
        let oi = self.output_index();
        match self.open.take() {
            None => {}
            Some(Item::Text(text)) => {
                let item = message_item(&self.id, self.text_count, &text, "completed");
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                self.emit(
                    "response.output_text.done",
                    json!({"item_id": item["id"], "output_index": oi, "content_index": 0,
                           "text": text, "logprobs": []}),
                    out,
                );
                self.emit(
                    "response.content_part.done",
                    json!({"item_id": item["id"], "output_index": oi, "content_index": 0,
                           "part": part}),
                    out,
                );
                self.emit(
                    "response.output_item.done",
                    json!({"output_index": oi, "item": item}),
                    out,
                );
                self.items.push(item);
                self.text_count += 1;
            }
            Some(Item::Tool {
                upstream,
                call_id,
                name,
                args,
            }) => {
                let item = function_call_item(
                    &self.id,
                    self.tool_count,
                    &call_id,
                    &name,
                    &args,
                    "completed",
                );
                self.emit(
                    "response.function_call_arguments.done",
                    json!({"item_id": item["id"], "output_index": oi, "arguments": args}),
                    out,
                );
                self.emit(
                    "response.output_item.done",
                    json!({"output_index": oi, "item": item}),
                    out,
                );
                self.items.push(item);
                self.closed_tools.push(upstream);
                self.tool_count += 1;
            }
        }
    }
}

impl ChunkSink for ResponsesStream {
    fn walk(&mut self) -> &mut WalkState {
        &mut self.walk
    }

    fn error_events(&mut self, err: &ClassifiedError, out: &mut Vec<u8>) {
        out.extend(err.responses_sse_event(self.next_seq()));
        if self.started {
            let mut r = response_object(
                &self.ctx,
                &self.id,
                self.created_at,
                "failed",
                std::mem::take(&mut self.items),
                None,
                None,
            );
            r["error"] = json!({"code": err.class.code(), "message": err.message});
            self.emit("response.failed", json!({"response": r}), out);
        }
    }

    fn start(&mut self, chunk: &Value, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        self.id = response_id(chunk.get("id").and_then(Value::as_str).unwrap_or("unknown"));
        self.created_at = chunk.get("created").and_then(Value::as_u64).unwrap_or(0);
        let r = response_object(
            &self.ctx,
            &self.id,
            self.created_at,
            "in_progress",
            Vec::new(),
            None,
            None,
        );
        self.emit("response.created", json!({"response": r.clone()}), out);
        self.emit("response.in_progress", json!({"response": r}), out);
    }

    fn text(&mut self, t: &str, out: &mut Vec<u8>) {
        if !matches!(self.open, Some(Item::Text(_))) {
            self.close_item(out);
            let item = message_item(&self.id, self.text_count, "", "in_progress");
            let mut added = item.clone();
            added["content"] = json!([]);
            let oi = self.output_index();
            self.emit(
                "response.output_item.added",
                json!({"output_index": oi, "item": added}),
                out,
            );
            self.emit(
                "response.content_part.added",
                json!({"item_id": item["id"], "output_index": oi, "content_index": 0,
                       "part": {"type": "output_text", "text": "", "annotations": []}}),
                out,
            );
            self.open = Some(Item::Text(String::new()));
        }
        if let Some(Item::Text(acc)) = &mut self.open {
            acc.push_str(t);
        }
        let oi = self.output_index();
        let item_id = message_item_id(&self.id, self.text_count);
        self.emit(
            "response.output_text.delta",
            json!({"item_id": item_id, "output_index": oi, "content_index": 0, "delta": t,
                   "logprobs": []}),
            out,
        );
    }

    fn tool_delta(&mut self, c: &Value, pos: u64, out: &mut Vec<u8>) -> Result<(), IngressError> {
        let upstream = c.get("index").and_then(Value::as_u64).unwrap_or(pos);
        let f = c.get("function");
        let args = f
            .and_then(|f| f.get("arguments"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let same = matches!(&self.open, Some(Item::Tool { upstream: u, .. }) if *u == upstream);
        if !same {
            if self.closed_tools.contains(&upstream) {
                return Err(IngressError::MalformedUpstream(
                    "interleaved tool call deltas".into(),
                ));
            }
            self.close_item(out);
            let name = f
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let call_id = match c.get("id").and_then(Value::as_str) {
                Some(id) => id.to_owned(),
                None => format!("call_{}_{upstream}", self.id),
            };
            let item =
                function_call_item(&self.id, self.tool_count, &call_id, name, "", "in_progress");
            let oi = self.output_index();
            self.emit(
                "response.output_item.added",
                json!({"output_index": oi, "item": item}),
                out,
            );
            self.open = Some(Item::Tool {
                upstream,
                call_id,
                name: name.to_owned(),
                args: String::new(),
            });
        }
        if !args.is_empty() {
            if let Some(Item::Tool { args: acc, .. }) = &mut self.open {
                acc.push_str(args);
            }
            let oi = self.output_index();
            let item_id = self.tool_item_id();
            self.emit(
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": oi, "delta": args}),
                out,
            );
        }
        Ok(())
    }

    fn complete(&mut self, out: &mut Vec<u8>) {
        if self.walk.done {
            return;
        }
        self.start(&Value::Null, out);
        self.close_item(out);
        let finish = self.walk.finish_reason.clone();
        let status = status_of(finish.as_deref());
        let r = response_object(
            &self.ctx,
            &self.id,
            self.created_at,
            status,
            std::mem::take(&mut self.items),
            Some(map_usage(self.walk.usage.as_ref())),
            finish.as_deref(),
        );
        let kind = if status == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        self.emit(kind, json!({"response": r}), out);
        self.walk.done = true;
    }
}
