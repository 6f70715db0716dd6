//! Unit tests of `core::ingress`: anthropic resp.
use serde_json::{Value, json};

use crate::ingress::IngressError;
use crate::ingress::anthropic_req::AnthropicContext;
use crate::ingress::anthropic_resp::{chat_to_anthropic, map_stop_reason};

fn ctx() -> AnthropicContext {
    AnthropicContext {
        model: "claude-client-name".into(),
        stop_sequences: vec!["END".into()],
        stream: false,
    }
}

fn chat(message: Value, finish: Value, extra: Value) -> Vec<u8> {
    let mut choice = json!({"index":0,"message":message,"finish_reason":finish});
    if let Value::Object(m) = extra {
        for (k, v) in m {
            choice[k] = v;
        }
    }
    serde_json::to_vec(&json!({
        "id":"chatcmpl-abc123","object":"chat.completion","created":1741569952,
        "model":"Qwen/Qwen3-0.6B","choices":[choice],
        "usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29}
    }))
    .unwrap()
}

#[test]
fn text_answer() {
    let a = chat_to_anthropic(
        &chat(
            json!({"role":"assistant","content":"Hello!"}),
            json!("stop"),
            json!({}),
        ),
        &ctx(),
    )
    .unwrap();
    assert_eq!(
        a,
        json!({
            "id":"msg_abc123","type":"message","role":"assistant","model":"claude-client-name",
            "content":[{"type":"text","text":"Hello!"}],
            "stop_reason":"end_turn","stop_sequence":null,
            "usage":{"input_tokens":19,"output_tokens":10}
        })
    );
}

#[test]
fn tool_calls_answer() {
    let a = chat_to_anthropic(
        &chat(
            json!({"role":"assistant","content":"Let me check.","tool_calls":[
                {"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"location\":\"Paris\"}"}},
                {"id":"call_2","type":"function","function":{"name":"get_time","arguments":""}}
            ]}),
            json!("tool_calls"),
            json!({}),
        ),
        &ctx(),
    )
    .unwrap();
    assert_eq!(
        a["content"],
        json!([
            {"type":"text","text":"Let me check."},
            {"type":"tool_use","id":"call_1","name":"get_weather","input":{"location":"Paris"}},
            {"type":"tool_use","id":"call_2","name":"get_time","input":{}}
        ])
    );
    assert_eq!(a["stop_reason"], "tool_use");
}

#[test]
fn every_stop_reason() {
    let cases = [
        (json!("stop"), json!({}), "end_turn", Value::Null),
        (json!("length"), json!({}), "max_tokens", Value::Null),
        (json!("tool_calls"), json!({}), "tool_use", Value::Null),
        (json!("function_call"), json!({}), "tool_use", Value::Null),
        (json!("content_filter"), json!({}), "refusal", Value::Null),
        (json!(null), json!({}), "end_turn", Value::Null),
        (
            json!("stop"),
            json!({"stop_reason":"END"}),
            "stop_sequence",
            json!("END"),
        ),
        // a matched string the client did not ask for (e.g. an EOS string) is a normal end
        (
            json!("stop"),
            json!({"stop_reason":"</s>"}),
            "end_turn",
            Value::Null,
        ),
        (
            json!("stop"),
            json!({"stop_reason":151645}),
            "end_turn",
            Value::Null,
        ),
    ];
    for (finish, extra, want, seq) in cases {
        let a = chat_to_anthropic(
            &chat(
                json!({"role":"assistant","content":"x"}),
                finish.clone(),
                extra,
            ),
            &ctx(),
        )
        .unwrap();
        assert_eq!(a["stop_reason"], want, "{finish}");
        assert_eq!(a["stop_sequence"], seq, "{finish}");
    }
    // tool calls with finish_reason "stop" (some backends) still mean tool_use
    assert_eq!(
        map_stop_reason(Some("stop"), None, true, &ctx()).0,
        "tool_use"
    );
}

#[test]
fn empty_content_and_model_fallback() {
    let a = chat_to_anthropic(
        &chat(
            json!({"role":"assistant","content":null}),
            json!("length"),
            json!({}),
        ),
        &AnthropicContext::default(),
    )
    .unwrap();
    assert_eq!(a["content"], json!([]));
    assert_eq!(a["model"], "Qwen/Qwen3-0.6B");
}

#[test]
fn malformed_upstream() {
    let bad_args = chat(
        json!({"role":"assistant","tool_calls":[{"id":"c","type":"function",
               "function":{"name":"f","arguments":"{not json"}}]}),
        json!("tool_calls"),
        json!({}),
    );
    for body in [
        bad_args,
        b"{}".to_vec(),
        b"nope".to_vec(),
        br#"{"choices":[]}"#.to_vec(),
    ] {
        assert!(matches!(
            chat_to_anthropic(&body, &ctx()),
            Err(IngressError::MalformedUpstream(_))
        ));
    }
}
