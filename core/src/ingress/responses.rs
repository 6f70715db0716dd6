//! OpenAI Responses (`/v1/responses`) ⇄ chat completions, for replicas without native support.
//!
//! Role: [`responses_to_chat`] turns a Responses request into a chat body;
//! [`chat_to_responses`] turns the buffered chat answer into a Responses object. Native
//! passthrough lives in [`super::sanitize::responses_passthrough`].
//!
//! Invariants: the client's `model` is kept verbatim; `instructions` become the first `system`
//! message; consecutive `function_call` items merge into one assistant `tool_calls` message;
//! stateful features (`previous_response_id`, `conversation`) and non-function tools are
//! rejected as invalid requests, never silently ignored; ids are derived from the upstream id.

use serde_json::{Map, Value, json};

use super::anthropic_req::ConvertedRequest;
use super::{IngressError, parse_object, parse_upstream};

/// What the answer converters need to know about the original Responses request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResponsesContext {
    /// The client's model string.
    pub model: String,
    /// Whether the client asked for SSE.
    pub stream: bool,
    /// Echoed request fields (`instructions`, `temperature`, `top_p`, `max_output_tokens`,
    /// `tools`, `tool_choice`, `metadata`, `parallel_tool_calls`).
    pub echo: Map<String, Value>,
}

fn invalid(msg: impl Into<String>) -> IngressError {
    IngressError::InvalidRequest(msg.into())
}

/// Converts a Responses request body into a chat completions body.
pub fn responses_to_chat(body: &[u8]) -> Result<ConvertedRequest<ResponsesContext>, IngressError> {
    let req = parse_object(body)?;
    let model = match req.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => return Err(invalid("`model` must be a non-empty string")),
    };
    for key in ["previous_response_id", "conversation"] {
        if req.get(key).is_some_and(|v| !v.is_null()) {
            return Err(invalid(format!("`{key}` is not supported by this router")));
        }
    }
    let mut out = Map::new();
    out.insert("model".into(), json!(model));
    let mut messages = Vec::new();
    match req.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(_) => return Err(invalid("`instructions` must be a string")),
    }
    match req.get("input") {
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for (i, it) in items.iter().enumerate() {
                convert_item(it, i, &mut messages)?;
            }
        }
        _ => return Err(invalid("`input` must be a string or an array of items")),
    }
    out.insert("messages".into(), Value::Array(messages));
    for (from, to) in [
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
    ] {
        match req.get(from) {
            None | Some(Value::Null) => {}
            Some(v @ Value::Number(_)) => {
                out.insert(to.into(), v.clone());
            }
            Some(_) => return Err(invalid(format!("`{from}` must be a number"))),
        }
    }
    if let Some(Value::Bool(p)) = req.get("parallel_tool_calls") {
        out.insert("parallel_tool_calls".into(), json!(p));
    }
    let stream = req.get("stream").and_then(Value::as_bool).unwrap_or(false);
    if stream {
        out.insert("stream".into(), json!(true));
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    convert_tools(&req, &mut out)?;
    convert_text_format(&req, &mut out)?;

    let mut echo = Map::new();
    for key in [
        "instructions",
        "temperature",
        "top_p",
        "max_output_tokens",
        "tools",
        "tool_choice",
        "metadata",
        "parallel_tool_calls",
    ] {
        if let Some(v) = req.get(key) {
            echo.insert(key.into(), v.clone());
        }
    }
    Ok(ConvertedRequest {
        chat: Value::Object(out),
        ctx: ResponsesContext {
            model,
            stream,
            echo,
        },
    })
}

fn convert_item(it: &Value, i: usize, out: &mut Vec<Value>) -> Result<(), IngressError> {
    let kind = it.get("type").and_then(Value::as_str);
    match kind {
        None | Some("message") => {
            let role = match it.get("role").and_then(Value::as_str) {
                Some("developer" | "system") => "system",
                Some(r @ ("user" | "assistant")) => r,
                _ => return Err(invalid(format!("input[{i}].role is invalid"))),
            };
            let content = match it.get("content") {
                Some(Value::String(s)) => Value::String(s.clone()),
                Some(Value::Array(parts)) => content_parts(parts, i)?,
                _ => return Err(invalid(format!("input[{i}].content is invalid"))),
            };
            out.push(json!({"role": role, "content": content}));
        }
        Some("function_call") => {
            let (Some(id), Some(name)) = (
                it.get("call_id").and_then(Value::as_str),
                it.get("name").and_then(Value::as_str),
            ) else {
                return Err(invalid(format!(
                    "input[{i}]: function_call needs call_id and name"
                )));
            };
            let args = it.get("arguments").and_then(Value::as_str).unwrap_or("{}");
            let call = json!({"id": id, "type": "function",
                              "function": {"name": name, "arguments": args}});
            let merged = match out.last_mut() {
                Some(Value::Object(last))
                    if last.get("role").and_then(Value::as_str) == Some("assistant") =>
                {
                    match last.get_mut("tool_calls") {
                        Some(Value::Array(calls)) => {
                            calls.push(call.clone());
                            true
                        }
                        _ => {
                            last.insert("tool_calls".into(), json!([call.clone()]));
                            true
                        }
                    }
                }
                _ => false,
            };
            if !merged {
                out.push(
                    json!({"role": "assistant", "content": Value::Null, "tool_calls": [call]}),
                );
            }
        }
        Some("function_call_output") => {
            let Some(id) = it.get("call_id").and_then(Value::as_str) else {
                return Err(invalid(format!(
                    "input[{i}]: function_call_output needs call_id"
                )));
            };
            let output = match it.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(v) => super::to_string(v),
                None => String::new(),
            };
            out.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
        }
        Some("reasoning") => {}
        Some(other) => {
            return Err(invalid(format!(
                "input[{i}]: item type {other:?} is not supported"
            )));
        }
    }
    Ok(())
}

fn content_parts(parts: &[Value], i: usize) -> Result<Value, IngressError> {
    let mut out = Vec::with_capacity(parts.len());
    let mut all_text = true;
    for p in parts {
        match p.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text") => {
                let t = p.get("text").and_then(Value::as_str).unwrap_or_default();
                out.push(json!({"type": "text", "text": t}));
            }
            Some("input_image") => {
                let Some(url) = p.get("image_url").and_then(Value::as_str) else {
                    return Err(invalid(format!("input[{i}]: input_image needs image_url")));
                };
                all_text = false;
                let mut iu = json!({"url": url});
                if let Some(d) = p.get("detail") {
                    iu["detail"] = d.clone();
                }
                out.push(json!({"type": "image_url", "image_url": iu}));
            }
            Some("refusal") => {
                let t = p.get("refusal").and_then(Value::as_str).unwrap_or_default();
                out.push(json!({"type": "text", "text": t}));
            }
            other => {
                return Err(invalid(format!(
                    "input[{i}]: content type {other:?} is not supported"
                )));
            }
        }
    }
    if all_text {
        let text: Vec<&str> = out
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect();
        return Ok(Value::String(text.join("\n")));
    }
    Ok(Value::Array(out))
}

fn convert_tools(
    req: &Map<String, Value>,
    out: &mut Map<String, Value>,
) -> Result<(), IngressError> {
    let mut any = false;
    if let Some(Value::Array(tools)) = req.get("tools") {
        let mut fns = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(invalid(format!(
                    "tools[{i}]: only function tools are supported"
                )));
            }
            let Some(name) = t.get("name").and_then(Value::as_str) else {
                return Err(invalid(format!("tools[{i}].name must be a string")));
            };
            let mut f = Map::new();
            f.insert("name".into(), json!(name));
            for k in ["description", "parameters", "strict"] {
                if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
                    f.insert(k.into(), v.clone());
                }
            }
            fns.push(json!({"type": "function", "function": f}));
        }
        any = !fns.is_empty();
        if any {
            out.insert("tools".into(), Value::Array(fns));
        }
    }
    match req.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(_) if !any => {}
        Some(Value::String(s)) => {
            out.insert("tool_choice".into(), json!(s));
        }
        Some(c) if c.get("type").and_then(Value::as_str) == Some("function") => {
            let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
            out.insert(
                "tool_choice".into(),
                json!({"type": "function", "function": {"name": name}}),
            );
        }
        Some(_) => return Err(invalid("`tool_choice` is not supported")),
    }
    Ok(())
}

fn convert_text_format(
    req: &Map<String, Value>,
    out: &mut Map<String, Value>,
) -> Result<(), IngressError> {
    let Some(fmt) = req.get("text").and_then(|t| t.get("format")) else {
        return Ok(());
    };
    match fmt.get("type").and_then(Value::as_str) {
        Some("text") | None => {}
        Some("json_object") => {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some("json_schema") => {
            let mut js = Map::new();
            for k in ["name", "schema", "strict", "description"] {
                if let Some(v) = fmt.get(k) {
                    js.insert(k.into(), v.clone());
                }
            }
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": js}),
            );
        }
        Some(other) => {
            return Err(invalid(format!(
                "text.format type {other:?} is not supported"
            )));
        }
    }
    Ok(())
}

/// `resp_` + the upstream id without its `chatcmpl-` prefix.
pub fn response_id(upstream: &str) -> String {
    format!(
        "resp_{}",
        upstream.strip_prefix("chatcmpl-").unwrap_or(upstream)
    )
}

/// Responses usage from an OpenAI `usage` object.
pub fn map_usage(usage: Option<&Value>) -> Value {
    let n = |k: &str| {
        usage
            .and_then(|u| u.get(k))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let cached = usage
        .and_then(|u| u.get("prompt_tokens_details"))
        .and_then(|d| d.get("cached_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let (i, o) = (n("prompt_tokens"), n("completion_tokens"));
    json!({
        "input_tokens": i,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": o,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": i + o,
    })
}

/// Builds a Responses object from its parts (shared by the buffered and streaming paths).
pub fn response_object(
    ctx: &ResponsesContext,
    id: &str,
    created_at: u64,
    status: &str,
    output: Vec<Value>,
    usage: Option<Value>,
    finish_reason: Option<&str>,
) -> Value {
    let mut r = Map::new();
    r.insert("id".into(), json!(id));
    r.insert("object".into(), json!("response"));
    r.insert("created_at".into(), json!(created_at));
    r.insert("status".into(), json!(status));
    r.insert("error".into(), Value::Null);
    let incomplete = match finish_reason {
        Some("length") => json!({"reason": "max_output_tokens"}),
        Some("content_filter") => json!({"reason": "content_filter"}),
        _ => Value::Null,
    };
    r.insert("incomplete_details".into(), incomplete);
    r.insert("model".into(), json!(ctx.model));
    r.insert("output".into(), Value::Array(output));
    r.insert("parallel_tool_calls".into(), json!(true));
    r.insert("tool_choice".into(), json!("auto"));
    r.insert("tools".into(), json!([]));
    r.insert("metadata".into(), json!({}));
    for (k, v) in &ctx.echo {
        if !v.is_null() {
            r.insert(k.clone(), v.clone());
        }
    }
    for k in ["instructions", "temperature", "top_p", "max_output_tokens"] {
        r.entry(k).or_insert(Value::Null);
    }
    r.insert("usage".into(), usage.unwrap_or(Value::Null));
    Value::Object(r)
}

/// The status for a finish reason.
pub fn status_of(finish_reason: Option<&str>) -> &'static str {
    match finish_reason {
        Some("length" | "content_filter") => "incomplete",
        _ => "completed",
    }
}

/// Converts a buffered chat completion into a Responses object.
pub fn chat_to_responses(body: &[u8], ctx: &ResponsesContext) -> Result<Value, IngressError> {
    let resp = parse_upstream(body)?;
    let upstream_id = resp.get("id").and_then(Value::as_str).unwrap_or("unknown");
    let id = response_id(upstream_id);
    let created = resp.get("created").and_then(Value::as_u64).unwrap_or(0);
    let choice = resp
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| IngressError::MalformedUpstream("no choices".into()))?;
    let message = choice
        .get("message")
        .ok_or_else(|| IngressError::MalformedUpstream("choice has no message".into()))?;
    let finish = choice.get("finish_reason").and_then(Value::as_str);
    let mut output = Vec::new();
    if let Some(Value::String(t)) = message.get("content")
        && !t.is_empty()
    {
        output.push(message_item(&id, 0, t, "completed"));
    }
    if let Some(Value::Array(calls)) = message.get("tool_calls") {
        for (k, c) in calls.iter().enumerate() {
            let f = c.get("function");
            let name = f
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            let args = f
                .and_then(|f| f.get("arguments"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let call_id = c.get("id").and_then(Value::as_str).unwrap_or(name);
            output.push(function_call_item(&id, k, call_id, name, args, "completed"));
        }
    }
    Ok(response_object(
        ctx,
        &id,
        created,
        status_of(finish),
        output,
        Some(map_usage(resp.get("usage"))),
        finish,
    ))
}

/// The id of the `k`-th message item of a response: `msg_<id>`, then `msg_<id>_<k>`.
pub fn message_item_id(resp_id: &str, k: usize) -> String {
    let base = resp_id.strip_prefix("resp_").unwrap_or(resp_id);
    if k == 0 {
        format!("msg_{base}")
    } else {
        format!("msg_{base}_{k}")
    }
}

/// An assistant `message` output item (the `k`-th of its response) with one `output_text` part.
pub fn message_item(resp_id: &str, k: usize, text: &str, status: &str) -> Value {
    json!({
        "type": "message",
        "id": message_item_id(resp_id, k),
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    })
}

/// A `function_call` output item.
pub fn function_call_item(
    resp_id: &str,
    k: usize,
    call_id: &str,
    name: &str,
    arguments: &str,
    status: &str,
) -> Value {
    json!({
        "type": "function_call",
        "id": format!("fc_{}_{k}", resp_id.strip_prefix("resp_").unwrap_or(resp_id)),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    })
}
