//! OpenAI chat completion (buffered) → Anthropic Messages response.
//!
//! Role: turns the replica's JSON answer into the body the `anthropic` client expects.
//!
//! Invariants: `id` is `msg_` + the upstream id; `model` is the client's model string (falls
//! back to the upstream one); text precedes `tool_use` blocks; tool arguments must parse as a
//! JSON object (empty arguments mean `{}`), otherwise [`IngressError::MalformedUpstream`];
//! `stop_reason` is always set in a buffered answer (see [`map_stop_reason`]).

use serde_json::{Map, Value, json};

use super::anthropic_req::AnthropicContext;
use super::{IngressError, parse_upstream};

fn malformed(msg: impl Into<String>) -> IngressError {
    IngressError::MalformedUpstream(msg.into())
}

/// Maps an OpenAI `finish_reason` to Anthropic `(stop_reason, stop_sequence)`.
///
/// `matched` is the upstream choice's vLLM-style `stop_reason` (the matched stop string), if
/// any; it becomes `stop_sequence` when it is one of the client's stop sequences.
pub fn map_stop_reason(
    finish_reason: Option<&str>,
    matched: Option<&str>,
    had_tool_calls: bool,
    ctx: &AnthropicContext,
) -> (&'static str, Option<String>) {
    match finish_reason {
        Some("length") => ("max_tokens", None),
        Some("tool_calls" | "function_call") => ("tool_use", None),
        Some("content_filter") => ("refusal", None),
        _ if had_tool_calls => ("tool_use", None),
        _ => match matched {
            Some(s) if ctx.stop_sequences.iter().any(|x| x == s) => {
                ("stop_sequence", Some(s.to_owned()))
            }
            _ => ("end_turn", None),
        },
    }
}

/// Parses tool call arguments into an Anthropic `input` object.
pub fn parse_tool_input(arguments: &str) -> Result<Value, IngressError> {
    if arguments.trim().is_empty() {
        return Ok(json!({}));
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(malformed("tool call arguments are not a JSON object")),
        Err(e) => Err(malformed(format!("tool call arguments are not JSON: {e}"))),
    }
}

/// Anthropic usage from an OpenAI `usage` object (missing counts are 0).
pub fn map_usage(usage: Option<&Value>) -> Value {
    let n = |k: &str| {
        usage
            .and_then(|u| u.get(k))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    json!({"input_tokens": n("prompt_tokens"), "output_tokens": n("completion_tokens")})
}

/// Converts a buffered chat completion body into an Anthropic Messages body.
pub fn chat_to_anthropic(body: &[u8], ctx: &AnthropicContext) -> Result<Value, IngressError> {
    chat_map_to_anthropic(&parse_upstream(body)?, ctx)
}

/// Converts an already parsed chat completion.
pub fn chat_map_to_anthropic(
    resp: &Map<String, Value>,
    ctx: &AnthropicContext,
) -> Result<Value, IngressError> {
    let id = resp.get("id").and_then(Value::as_str).unwrap_or("unknown");
    let choice = resp
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| malformed("no choices"))?;
    let message = choice
        .get("message")
        .ok_or_else(|| malformed("choice has no message"))?;

    let mut content = Vec::new();
    if let Some(Value::String(t)) = message.get("content")
        && !t.is_empty()
    {
        content.push(json!({"type": "text", "text": t}));
    }
    let mut had_tools = false;
    if let Some(Value::Array(calls)) = message.get("tool_calls") {
        for c in calls {
            let f = c
                .get("function")
                .ok_or_else(|| malformed("tool call has no function"))?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| malformed("tool call has no name"))?;
            let args = f.get("arguments").and_then(Value::as_str).unwrap_or("");
            let call_id = c.get("id").and_then(Value::as_str).unwrap_or(name);
            content.push(json!({
                "type": "tool_use",
                "id": call_id,
                "name": name,
                "input": parse_tool_input(args)?,
            }));
            had_tools = true;
        }
    }
    let (stop_reason, stop_sequence) = map_stop_reason(
        choice.get("finish_reason").and_then(Value::as_str),
        choice.get("stop_reason").and_then(Value::as_str),
        had_tools,
        ctx,
    );
    let model = if ctx.model.is_empty() {
        resp.get("model")
            .and_then(Value::as_str)
            .unwrap_or_default()
    } else {
        ctx.model.as_str()
    };
    Ok(json!({
        "id": message_id(id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": map_usage(resp.get("usage")),
    }))
}

/// `msg_` + the upstream id without its `chatcmpl-` prefix.
pub fn message_id(upstream: &str) -> String {
    format!(
        "msg_{}",
        upstream.strip_prefix("chatcmpl-").unwrap_or(upstream)
    )
}
