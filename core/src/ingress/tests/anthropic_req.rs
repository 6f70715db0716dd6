//! Unit tests of `core::ingress`: anthropic req.
use serde_json::{Value, json};

use crate::ingress::IngressError;
use crate::ingress::anthropic_req::anthropic_to_chat;

fn conv(v: Value) -> Value {
    anthropic_to_chat(&serde_json::to_vec(&v).unwrap())
        .unwrap()
        .chat
}

#[test]
fn docs_basic_request() {
    let r = anthropic_to_chat(
        br#"{"model":"claude-sonnet-4-20250514","max_tokens":1024,
             "messages":[{"role":"user","content":"Hello, Claude"}]}"#,
    )
    .unwrap();
    assert_eq!(
        r.chat,
        json!({"model":"claude-sonnet-4-20250514","max_tokens":1024,
               "messages":[{"role":"user","content":"Hello, Claude"}]})
    );
    assert_eq!(r.ctx.model, "claude-sonnet-4-20250514");
    assert!(!r.ctx.stream);
}

#[test]
fn system_sampling_stop_stream_metadata() {
    let r = anthropic_to_chat(
        &serde_json::to_vec(&json!({
            "model": "Qwen/Qwen3-0.6B",
            "max_tokens": 256,
            "system": [{"type":"text","text":"You are terse."},
                       {"type":"text","text":"Answer in French.","cache_control":{"type":"ephemeral"}}],
            "messages": [{"role":"user","content":[{"type":"text","text":"Hi"}]}],
            "temperature": 0.2, "top_p": 0.9, "top_k": 40,
            "stop_sequences": ["\n\nHuman:", "END"],
            "stream": true,
            "metadata": {"user_id": "u-1"},
            "nvext": {"token_data": [1, 2, 3]}
        }))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        r.chat,
        json!({
            "model": "Qwen/Qwen3-0.6B",
            "max_tokens": 256,
            "messages": [
                {"role":"system","content":"You are terse.\nAnswer in French."},
                {"role":"user","content":"Hi"}
            ],
            "temperature": 0.2, "top_p": 0.9, "top_k": 40,
            "stop": ["\n\nHuman:", "END"],
            "stream": true,
            "stream_options": {"include_usage": true}
        })
    );
    assert_eq!(r.ctx.stop_sequences, vec!["\n\nHuman:", "END"]);
    assert!(r.ctx.stream);
}

#[test]
fn images_base64_and_url() {
    let c = conv(json!({
        "model":"m","max_tokens":10,
        "messages":[{"role":"user","content":[
            {"type":"image","source":{"type":"base64","media_type":"image/jpeg","data":"/9j/4AAQ"}},
            {"type":"image","source":{"type":"url","url":"https://example.com/cat.png"}},
            {"type":"text","text":"What is in these images?"}
        ]}]
    }));
    assert_eq!(
        c["messages"][0]["content"],
        json!([
            {"type":"image_url","image_url":{"url":"data:image/jpeg;base64,/9j/4AAQ"}},
            {"type":"image_url","image_url":{"url":"https://example.com/cat.png"}},
            {"type":"text","text":"What is in these images?"}
        ])
    );
}

#[test]
fn tool_round_trip_history() {
    let c = conv(json!({
        "model": "m", "max_tokens": 1024,
        "tools": [{
            "name": "get_weather",
            "description": "Get the current weather in a given location",
            "input_schema": {"type":"object","properties":{"location":{"type":"string"}},"required":["location"]}
        }],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
        "messages": [
            {"role":"user","content":"What is the weather like in San Francisco?"},
            {"role":"assistant","content":[
                {"type":"thinking","thinking":"need weather","signature":"sig"},
                {"type":"text","text":"<thinking>I need to use get_weather</thinking>"},
                {"type":"tool_use","id":"toolu_01A09q90qw90lq917835lq9","name":"get_weather",
                 "input":{"location":"San Francisco, CA"}}
            ]},
            {"role":"user","content":[
                {"type":"tool_result","tool_use_id":"toolu_01A09q90qw90lq917835lq9",
                 "content":[{"type":"text","text":"15 degrees"}]},
                {"type":"text","text":"Thanks"}
            ]}
        ]
    }));
    assert_eq!(
        c["tools"],
        json!([{"type":"function","function":{
            "name":"get_weather",
            "description":"Get the current weather in a given location",
            "parameters":{"type":"object","properties":{"location":{"type":"string"}},"required":["location"]}
        }}])
    );
    assert_eq!(c["tool_choice"], json!("required"));
    assert_eq!(c["parallel_tool_calls"], json!(false));
    assert_eq!(
        c["messages"],
        json!([
            {"role":"user","content":"What is the weather like in San Francisco?"},
            {"role":"assistant","content":"<thinking>I need to use get_weather</thinking>",
             "tool_calls":[{"id":"toolu_01A09q90qw90lq917835lq9","type":"function",
                "function":{"name":"get_weather","arguments":"{\"location\":\"San Francisco, CA\"}"}}]},
            {"role":"tool","tool_call_id":"toolu_01A09q90qw90lq917835lq9","content":"15 degrees"},
            {"role":"user","content":"Thanks"}
        ])
    );
}

#[test]
fn assistant_tool_only_has_null_content_and_tool_result_only_user_turn() {
    let c = conv(json!({
        "model":"m","max_tokens":5,
        "messages":[
            {"role":"user","content":"x"},
            {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}
        ]
    }));
    assert_eq!(c["messages"][1]["content"], Value::Null);
    assert_eq!(c["messages"].as_array().unwrap().len(), 3);
    assert_eq!(
        c["messages"][2],
        json!({"role":"tool","tool_call_id":"t1","content":"ok"})
    );
}

#[test]
fn tool_choice_variants() {
    let base = |tc: Value| {
        conv(json!({"model":"m","max_tokens":1,"messages":[],
                    "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":tc}))
    };
    assert_eq!(base(json!({"type":"auto"}))["tool_choice"], json!("auto"));
    assert_eq!(base(json!({"type":"none"}))["tool_choice"], json!("none"));
    assert_eq!(
        base(json!({"type":"tool","name":"f"}))["tool_choice"],
        json!({"type":"function","function":{"name":"f"}})
    );
    assert!(
        base(json!({"type":"auto"}))
            .get("parallel_tool_calls")
            .is_none()
    );
}

#[test]
fn rejects_invalid_requests() {
    let bad = [
        json!({"max_tokens":1,"messages":[]}),
        json!({"model":"m","messages":"hi"}),
        json!({"model":"m","messages":[{"role":"system","content":"x"}]}),
        json!({"model":"m","messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}),
        json!({"model":"m","messages":[],"tools":[{"type":"web_search_20250305","name":"web_search"}]}),
        json!({"model":"m","messages":[],"stop_sequences":"x"}),
        json!({"model":"m","messages":[],"max_tokens":"10"}),
    ];
    for b in bad {
        let e = anthropic_to_chat(&serde_json::to_vec(&b).unwrap()).unwrap_err();
        assert!(matches!(e, IngressError::InvalidRequest(_)), "{b}: {e:?}");
    }
    assert!(matches!(
        anthropic_to_chat(b"{not json"),
        Err(IngressError::InvalidJson(_))
    ));
    assert!(matches!(
        anthropic_to_chat(b"[1]"),
        Err(IngressError::InvalidJson(_))
    ));
}
