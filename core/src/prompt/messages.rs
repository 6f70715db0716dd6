//! The message and tool rewrites the Dynamo 1.6.1 frontend applies before rendering.
//!
//! Role: reproduce dynamo-renderer 8.0.3 (`template/oai.rs`, used by dynamo-llm 1.6.1) on the
//! parsed JSON: text-only content-part arrays joined with "\n" (unless the template needs arrays,
//! then strings become one text part), `image_url`/`video_url`/`audio_url` parts replaced by
//! bare `{"type": image|video|audio}` placeholders, JSON-string tool-call `arguments` parsed into
//! objects (unless the template branches on `arguments is string`), legacy `function_call`
//! arguments always parsed, assistant `reasoning_content` injected as `<think>…</think>` when the
//! template does not read it, and tool schemas back-filled (`description: ""`, parameters
//! `type: object` / `properties: {}`).
//!
//! Invariants: pure functions over `serde_json::Value`; malformed shapes are left as they are
//! (the template then decides), never a panic.

use serde_json::{Map, Value};

const MEDIA_CONVERSIONS: [(&str, &str); 3] = [
    ("image_url", "image"),
    ("video_url", "video"),
    ("audio_url", "audio"),
];

/// 1.6.1 `may_be_fix_msg_content` without an image-placeholder family (mixed arrays stay arrays).
pub(crate) fn fix_content(messages: &mut [Value], preserve_arrays: bool) {
    for msg in messages {
        let Some(content) = msg.get_mut("content") else {
            continue;
        };
        match content {
            Value::String(_) if preserve_arrays => {
                let text = content.take();
                let mut part = Map::new();
                part.insert("type".into(), Value::String("text".into()));
                part.insert("text".into(), text);
                *content = Value::Array(vec![Value::Object(part)]);
            }
            Value::Array(parts) => {
                for part in parts.iter_mut() {
                    let ty = part.get("type").and_then(Value::as_str).unwrap_or("");
                    if let Some((_, target)) = MEDIA_CONVERSIONS.iter().find(|(src, _)| *src == ty)
                    {
                        let mut m = Map::new();
                        m.insert("type".into(), Value::String((*target).into()));
                        *part = Value::Object(m);
                    }
                }
                let text_only = !parts.is_empty()
                    && parts
                        .iter()
                        .all(|p| p.get("type").and_then(Value::as_str) == Some("text"));
                if text_only && !preserve_arrays {
                    let mut joined = String::new();
                    let mut first = true;
                    for text in parts.iter().filter_map(|p| p.get("text")?.as_str()) {
                        if !first {
                            joined.push('\n');
                        }
                        joined.push_str(text);
                        first = false;
                    }
                    *content = Value::String(joined);
                }
            }
            _ => {}
        }
    }
}

fn parse_string_arguments(function: &mut Value) {
    if let Some(args) = function.get_mut("arguments")
        && let Some(s) = args.as_str()
        && let Ok(parsed) = serde_json::from_str::<Value>(s)
    {
        *args = parsed;
    }
}

/// 1.6.1 `normalize_tool_calls_arguments_in_messages`.
pub(crate) fn parse_tool_call_arguments(messages: &mut [Value]) {
    for msg in messages {
        if let Some(calls) = msg.get_mut("tool_calls").and_then(Value::as_array_mut) {
            for call in calls {
                if let Some(function) = call.get_mut("function")
                    && function.is_object()
                {
                    parse_string_arguments(function);
                }
            }
        }
    }
}

/// 1.6.1 `normalize_function_call_arguments_in_messages` (legacy `function_call`).
pub(crate) fn parse_function_call_arguments(messages: &mut [Value]) {
    for msg in messages {
        if let Some(function) = msg.get_mut("function_call")
            && function.is_object()
        {
            parse_string_arguments(function);
        }
    }
}

/// 1.6.1 `inject_reasoning_content_into_messages`.
pub(crate) fn inject_reasoning(messages: &mut [Value]) {
    for msg in messages {
        if msg.get("role").and_then(Value::as_str) != Some("assistant") {
            continue;
        }
        let reasoning = match msg.get("reasoning_content") {
            Some(Value::String(s)) if !s.is_empty() => format!("<think>{s}</think>"),
            Some(Value::Array(segments)) => {
                let mut r = String::new();
                for s in segments
                    .iter()
                    .filter_map(Value::as_str)
                    .filter(|s| !s.is_empty())
                {
                    r.push_str("<think>");
                    r.push_str(s);
                    r.push_str("</think>");
                }
                if r.is_empty() {
                    continue;
                }
                r
            }
            _ => continue,
        };
        let Some(obj) = msg.as_object_mut() else {
            continue;
        };
        match obj.get_mut("content") {
            Some(Value::String(s)) if !s.is_empty() => {
                *s = format!("{reasoning}{s}");
            }
            None | Some(Value::Null) | Some(Value::String(_)) => {
                obj.insert("content".into(), Value::String(reasoning));
            }
            Some(Value::Array(parts)) => {
                let mut part = Map::new();
                part.insert("type".into(), Value::String("text".into()));
                part.insert("text".into(), Value::String(reasoning));
                parts.insert(0, Value::Object(part));
            }
            Some(_) => continue,
        }
        obj.remove("reasoning_content");
    }
}

/// 1.6.1 `may_be_fix_tool_schema`: a non-array `tools` becomes an empty list.
pub(crate) fn fix_tool_schema(tools: &Value) -> Value {
    let mut out = Vec::new();
    for tool in tools.as_array().map(Vec::as_slice).unwrap_or(&[]) {
        let mut tool = tool.clone();
        if let Some(function) = tool.get_mut("function").and_then(Value::as_object_mut) {
            if !matches!(function.get("description"), Some(Value::String(_))) {
                function.insert("description".into(), Value::String(String::new()));
            }
            if let Some(params) = function
                .get_mut("parameters")
                .and_then(Value::as_object_mut)
            {
                if !params.contains_key("type") {
                    params.insert("type".into(), Value::String("object".into()));
                }
                if !params.contains_key("properties") {
                    params.insert("properties".into(), Value::Object(Map::new()));
                }
            }
        }
        out.push(tool);
    }
    Value::Array(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_parts_join_with_newline_and_media_become_placeholders() {
        let mut m = vec![
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]}),
            json!({"role": "user", "content": []}),
        ];
        fix_content(&mut m, false);
        assert_eq!(m[0]["content"], "a\nb");
        assert_eq!(m[1]["content"][1], json!({"type": "image"}));
        assert_eq!(m[2]["content"], json!([]));
        let mut m = vec![json!({"role": "user", "content": "s"})];
        fix_content(&mut m, true);
        assert_eq!(m[0]["content"], json!([{"type": "text", "text": "s"}]));
    }

    #[test]
    fn reasoning_and_arguments() {
        let mut m = vec![
            json!({"role": "assistant", "content": "x", "reasoning_content": "r",
            "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\": 1}"}}]}),
        ];
        inject_reasoning(&mut m);
        parse_tool_call_arguments(&mut m);
        assert_eq!(m[0]["content"], "<think>r</think>x");
        assert!(m[0].get("reasoning_content").is_none());
        assert_eq!(
            m[0]["tool_calls"][0]["function"]["arguments"],
            json!({"a": 1})
        );
    }

    #[test]
    fn tool_schema_backfill() {
        let t = fix_tool_schema(
            &json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]),
        );
        assert_eq!(t[0]["function"]["description"], "");
        assert_eq!(
            t[0]["function"]["parameters"],
            json!({"type": "object", "properties": {}})
        );
    }
}
