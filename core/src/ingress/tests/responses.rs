//! Unit tests of `core::ingress`: responses.
use serde_json::json;

use crate::ingress::IngressError;
use crate::ingress::responses::{chat_to_responses, responses_to_chat};

#[test]
fn string_input_with_instructions() {
    let r = responses_to_chat(
        br#"{"model":"gpt-4.1","instructions":"Talk like a pirate.",
             "input":"Are semicolons optional in JavaScript?","max_output_tokens":64,
             "temperature":0.5,"stream":true,"store":false,"nvext":{"token_data":[1]}}"#,
    )
    .unwrap();
    assert_eq!(
        r.chat,
        json!({"model":"gpt-4.1",
               "messages":[{"role":"system","content":"Talk like a pirate."},
                           {"role":"user","content":"Are semicolons optional in JavaScript?"}],
               "max_tokens":64,"temperature":0.5,"stream":true,
               "stream_options":{"include_usage":true}})
    );
    assert!(r.ctx.stream);
    assert_eq!(r.ctx.model, "gpt-4.1");
}

#[test]
fn items_tools_and_function_calls() {
    let body = json!({
        "model":"m",
        "input":[
            {"role":"developer","content":"Be brief."},
            {"role":"user","content":[
                {"type":"input_text","text":"what is in this image?"},
                {"type":"input_image","image_url":"https://example.com/a.jpg","detail":"low"}]},
            {"type":"message","role":"assistant","content":[{"type":"output_text","text":"A cat."}]},
            {"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Oslo\"}"},
            {"type":"function_call","call_id":"call_2","name":"get_time","arguments":"{}"},
            {"type":"function_call_output","call_id":"call_1","output":"-3C"},
            {"type":"function_call_output","call_id":"call_2","output":"noon"}
        ],
        "tools":[{"type":"function","name":"get_weather","description":"d",
                  "parameters":{"type":"object"},"strict":true}],
        "tool_choice":{"type":"function","name":"get_weather"},
        "text":{"format":{"type":"json_schema","name":"w","schema":{"type":"object"},"strict":true}}
    });
    let c = responses_to_chat(&serde_json::to_vec(&body).unwrap())
        .unwrap()
        .chat;
    assert_eq!(
        c["messages"],
        json!([
            {"role":"system","content":"Be brief."},
            {"role":"user","content":[
                {"type":"text","text":"what is in this image?"},
                {"type":"image_url","image_url":{"url":"https://example.com/a.jpg","detail":"low"}}]},
            {"role":"assistant","content":"A cat.","tool_calls":[
                {"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}},
                {"id":"call_2","type":"function","function":{"name":"get_time","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"call_1","content":"-3C"},
            {"role":"tool","tool_call_id":"call_2","content":"noon"}
        ])
    );
    assert_eq!(
        c["tools"],
        json!([{"type":"function","function":{"name":"get_weather","description":"d",
                "parameters":{"type":"object"},"strict":true}}])
    );
    assert_eq!(
        c["tool_choice"],
        json!({"type":"function","function":{"name":"get_weather"}})
    );
    assert_eq!(
        c["response_format"],
        json!({"type":"json_schema","json_schema":{"name":"w","schema":{"type":"object"},"strict":true}})
    );
}

#[test]
fn rejects_stateful_and_unsupported() {
    for b in [
        json!({"model":"m","input":"x","previous_response_id":"resp_1"}),
        json!({"model":"m","input":"x","tools":[{"type":"web_search_preview"}]}),
        json!({"model":"m","input":[{"type":"file_search_call"}]}),
        json!({"model":"m"}),
        json!({"input":"x"}),
    ] {
        let e = responses_to_chat(&serde_json::to_vec(&b).unwrap()).unwrap_err();
        assert!(matches!(e, IngressError::InvalidRequest(_)), "{b}");
    }
}

#[test]
fn buffered_answer() {
    let ctx = responses_to_chat(br#"{"model":"gpt-4.1","input":"hi","instructions":"x"}"#)
        .unwrap()
        .ctx;
    let chat = br#"{"id":"chatcmpl-r1","object":"chat.completion","created":1741476542,
        "model":"Qwen/Qwen3","choices":[{"index":0,"finish_reason":"tool_calls",
        "message":{"role":"assistant","content":"Sure.","tool_calls":[{"id":"call_9","type":"function",
        "function":{"name":"f","arguments":"{\"a\":1}"}}]}}],
        "usage":{"prompt_tokens":36,"completion_tokens":87,"total_tokens":123,
                 "prompt_tokens_details":{"cached_tokens":32}}}"#;
    let r = chat_to_responses(chat, &ctx).unwrap();
    assert_eq!(r["id"], "resp_r1");
    assert_eq!(r["object"], "response");
    assert_eq!(r["created_at"], 1741476542);
    assert_eq!(r["status"], "completed");
    assert_eq!(r["model"], "gpt-4.1");
    assert_eq!(r["instructions"], "x");
    assert_eq!(
        r["output"],
        json!([
            {"type":"message","id":"msg_r1","status":"completed","role":"assistant",
             "content":[{"type":"output_text","text":"Sure.","annotations":[]}]},
            {"type":"function_call","id":"fc_r1_0","call_id":"call_9","name":"f",
             "arguments":"{\"a\":1}","status":"completed"}
        ])
    );
    assert_eq!(
        r["usage"],
        json!({"input_tokens":36,"input_tokens_details":{"cached_tokens":32},"output_tokens":87,
               "output_tokens_details":{"reasoning_tokens":0},"total_tokens":123})
    );

    let long = br#"{"id":"chatcmpl-r2","choices":[{"index":0,"finish_reason":"length",
        "message":{"role":"assistant","content":"abc"}}]}"#;
    let r = chat_to_responses(long, &ctx).unwrap();
    assert_eq!(r["status"], "incomplete");
    assert_eq!(
        r["incomplete_details"],
        json!({"reason":"max_output_tokens"})
    );
    assert!(matches!(
        chat_to_responses(b"{}", &ctx),
        Err(IngressError::MalformedUpstream(_))
    ));
}
