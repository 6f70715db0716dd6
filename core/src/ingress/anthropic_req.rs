//! Anthropic Messages request → OpenAI chat completions request.
//!
//! Role: converts a `/v1/messages` (or `/anthropic/v1/messages`) body into a
//! `/v1/chat/completions` body for the replicas, and records what the answer conversion needs
//! ([`AnthropicContext`]).
//!
//! Invariants: the client's `model` is kept verbatim; system text becomes one leading `system`
//! message; `tool_result` blocks become `role: "tool"` messages placed before the rest of their
//! user turn (OpenAI requires them right after the assistant `tool_calls`); `tool_use` blocks
//! become `tool_calls` with the input serialised as a JSON string; client `nvext.token_data`
//! and pin fields never pass (they are not copied); unknown content block types are rejected
//! rather than silently dropped, except `thinking`/`redacted_thinking` in history.

use serde_json::{Map, Value, json};

use super::{IngressError, parse_object};

/// What the answer converters need to know about the original request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AnthropicContext {
    /// The client's model string (echoed in the answer).
    pub model: String,
    /// The client's stop sequences (to report `stop_sequence`).
    pub stop_sequences: Vec<String>,
    /// Whether the client asked for SSE.
    pub stream: bool,
}

/// A converted request.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertedRequest<C> {
    /// The chat completions body.
    pub chat: Value,
    /// The context for converting the answer.
    pub ctx: C,
}

/// Converts an Anthropic Messages body (bytes) into a chat completions body.
pub fn anthropic_to_chat(body: &[u8]) -> Result<ConvertedRequest<AnthropicContext>, IngressError> {
    anthropic_map_to_chat(&parse_object(body)?)
}

fn invalid(msg: impl Into<String>) -> IngressError {
    IngressError::InvalidRequest(msg.into())
}

/// Converts an already parsed Anthropic Messages body.
pub fn anthropic_map_to_chat(
    req: &Map<String, Value>,
) -> Result<ConvertedRequest<AnthropicContext>, IngressError> {
    let model = match req.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => return Err(invalid("`model` must be a non-empty string")),
    };
    let mut out = Map::new();
    out.insert("model".into(), Value::String(model.clone()));

    let mut messages = Vec::new();
    match req.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(Value::Array(blocks)) => {
            let mut texts = Vec::new();
            for b in blocks {
                match (b.get("type").and_then(Value::as_str), b.get("text")) {
                    (Some("text"), Some(Value::String(t))) => texts.push(t.as_str()),
                    _ => return Err(invalid("`system` blocks must be text blocks")),
                }
            }
            if !texts.is_empty() {
                messages.push(json!({"role": "system", "content": texts.join("\n")}));
            }
        }
        Some(_) => {
            return Err(invalid(
                "`system` must be a string or an array of text blocks",
            ));
        }
    }

    let Some(Value::Array(msgs)) = req.get("messages") else {
        return Err(invalid("`messages` must be an array"));
    };
    for (i, m) in msgs.iter().enumerate() {
        convert_message(m, i, &mut messages)?;
    }
    out.insert("messages".into(), Value::Array(messages));

    for key in ["max_tokens", "temperature", "top_p", "top_k"] {
        match req.get(key) {
            None | Some(Value::Null) => {}
            Some(v @ Value::Number(_)) => {
                out.insert(key.into(), v.clone());
            }
            Some(_) => return Err(invalid(format!("`{key}` must be a number"))),
        }
    }

    let mut stop_sequences = Vec::new();
    match req.get("stop_sequences") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            for s in a {
                match s {
                    Value::String(s) => stop_sequences.push(s.clone()),
                    _ => return Err(invalid("`stop_sequences` must be strings")),
                }
            }
            if !stop_sequences.is_empty() {
                out.insert("stop".into(), json!(stop_sequences));
            }
        }
        Some(_) => return Err(invalid("`stop_sequences` must be an array")),
    }

    let stream = match req.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid("`stream` must be a boolean")),
    };
    if stream {
        out.insert("stream".into(), Value::Bool(true));
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }

    let has_tools = convert_tools(req.get("tools"), &mut out)?;
    convert_tool_choice(req.get("tool_choice"), has_tools, &mut out)?;

    Ok(ConvertedRequest {
        chat: Value::Object(out),
        ctx: AnthropicContext {
            model,
            stop_sequences,
            stream,
        },
    })
}

fn convert_message(m: &Value, i: usize, out: &mut Vec<Value>) -> Result<(), IngressError> {
    let role = match m.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        _ => {
            return Err(invalid(format!(
                "messages[{i}].role must be \"user\" or \"assistant\""
            )));
        }
    };
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(b)) => b,
        _ => {
            return Err(invalid(format!(
                "messages[{i}].content must be a string or an array"
            )));
        }
    };
    let mut parts: Vec<Value> = Vec::new();
    let mut tool_calls: Vec<Value> = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let at = || format!("messages[{i}].content[{j}]");
        match b.get("type").and_then(Value::as_str) {
            Some("text") => {
                let Some(Value::String(t)) = b.get("text") else {
                    return Err(invalid(format!("{}.text must be a string", at())));
                };
                parts.push(json!({"type": "text", "text": t}));
            }
            Some("image") if role == "user" => parts.push(image_part(b, &at())?),
            Some("tool_use") if role == "assistant" => {
                let (Some(Value::String(id)), Some(Value::String(name))) =
                    (b.get("id"), b.get("name"))
                else {
                    return Err(invalid(format!("{}: tool_use needs `id` and `name`", at())));
                };
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                tool_calls.push(json!({
                    "id": id,
                    "type": "function",
                    "function": {"name": name, "arguments": super::to_string(&input)},
                }));
            }
            Some("tool_result") if role == "user" => {
                let Some(Value::String(id)) = b.get("tool_use_id") else {
                    return Err(invalid(format!(
                        "{}: tool_result needs `tool_use_id`",
                        at()
                    )));
                };
                let text = tool_result_text(b.get("content"), &at(), &mut parts)?;
                // Tool messages must directly follow the assistant turn: emit them first.
                out.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
            }
            Some("thinking" | "redacted_thinking") if role == "assistant" => {}
            Some(other) => {
                return Err(invalid(format!(
                    "{}: content block type {other:?} is not supported in a {role} message",
                    at()
                )));
            }
            None => return Err(invalid(format!("{}.type is missing", at()))),
        }
    }
    if role == "assistant" {
        let text: Vec<&str> = parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect();
        let mut msg = Map::new();
        msg.insert("role".into(), json!("assistant"));
        msg.insert(
            "content".into(),
            if text.is_empty() && !tool_calls.is_empty() {
                Value::Null
            } else {
                Value::String(text.concat())
            },
        );
        if !tool_calls.is_empty() {
            msg.insert("tool_calls".into(), Value::Array(tool_calls));
        }
        out.push(Value::Object(msg));
    } else if !parts.is_empty() || blocks.is_empty() {
        out.push(json!({"role": "user", "content": user_content(parts)}));
    }
    Ok(())
}

/// Text-only content collapses to a string (every chat template accepts one); otherwise parts.
fn user_content(parts: Vec<Value>) -> Value {
    if parts
        .iter()
        .all(|p| p.get("type").and_then(Value::as_str) == Some("text"))
    {
        let text: Vec<&str> = parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect();
        Value::String(text.join("\n"))
    } else {
        Value::Array(parts)
    }
}

fn image_part(b: &Value, at: &str) -> Result<Value, IngressError> {
    let src = b.get("source");
    let kind = src.and_then(|s| s.get("type")).and_then(Value::as_str);
    let url = match kind {
        Some("base64") => {
            let media = src
                .and_then(|s| s.get("media_type"))
                .and_then(Value::as_str);
            let data = src.and_then(|s| s.get("data")).and_then(Value::as_str);
            match (media, data) {
                (Some(m), Some(d)) => format!("data:{m};base64,{d}"),
                _ => {
                    return Err(invalid(format!(
                        "{at}: base64 image needs media_type and data"
                    )));
                }
            }
        }
        Some("url") => match src.and_then(|s| s.get("url")).and_then(Value::as_str) {
            Some(u) => u.to_owned(),
            None => return Err(invalid(format!("{at}: url image needs `url`"))),
        },
        _ => return Err(invalid(format!("{at}: image source must be base64 or url"))),
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

/// The text of a tool result; its images are appended to the user turn's `parts`.
fn tool_result_text(
    content: Option<&Value>,
    at: &str,
    parts: &mut Vec<Value>,
) -> Result<String, IngressError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(blocks)) => {
            let mut texts = Vec::new();
            for b in blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        texts.push(b.get("text").and_then(Value::as_str).unwrap_or_default())
                    }
                    Some("image") => parts.push(image_part(b, at)?),
                    _ => {
                        return Err(invalid(format!(
                            "{at}: tool_result content must be text or image"
                        )));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(invalid(format!(
            "{at}: tool_result content must be a string or an array"
        ))),
    }
}

fn convert_tools(
    tools: Option<&Value>,
    out: &mut Map<String, Value>,
) -> Result<bool, IngressError> {
    let list = match tools {
        None | Some(Value::Null) => return Ok(false),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(invalid("`tools` must be an array")),
    };
    let mut fns = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(other) => {
                return Err(invalid(format!(
                    "tools[{i}]: tool type {other:?} is not supported"
                )));
            }
        }
        let Some(Value::String(name)) = t.get("name") else {
            return Err(invalid(format!("tools[{i}].name must be a string")));
        };
        let mut f = Map::new();
        f.insert("name".into(), json!(name));
        if let Some(Value::String(d)) = t.get("description") {
            f.insert("description".into(), json!(d));
        }
        f.insert(
            "parameters".into(),
            t.get("input_schema")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"})),
        );
        fns.push(json!({"type": "function", "function": f}));
    }
    let any = !fns.is_empty();
    if any {
        out.insert("tools".into(), Value::Array(fns));
    }
    Ok(any)
}

fn convert_tool_choice(
    choice: Option<&Value>,
    has_tools: bool,
    out: &mut Map<String, Value>,
) -> Result<(), IngressError> {
    let Some(c) = choice.filter(|c| !c.is_null()) else {
        return Ok(());
    };
    let mapped = match c.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => match c.get("name").and_then(Value::as_str) {
            Some(n) => json!({"type": "function", "function": {"name": n}}),
            None => return Err(invalid("`tool_choice` of type tool needs `name`")),
        },
        _ => {
            return Err(invalid(
                "`tool_choice.type` must be auto, any, tool or none",
            ));
        }
    };
    if c.get("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true) && has_tools {
        out.insert("parallel_tool_calls".into(), Value::Bool(false));
    }
    if has_tools {
        out.insert("tool_choice".into(), mapped);
    }
    Ok(())
}
