//! Unit tests of `core::ingress`: anthropic stream.
use serde_json::{Value, json};

use super::{feed_split, parse_events, splits};
use crate::ingress::IngressError;
use crate::ingress::anthropic_req::AnthropicContext;
use crate::ingress::anthropic_stream::AnthropicStream;
use crate::ingress::errors::ClassifiedError;

fn ctx() -> AnthropicContext {
    AnthropicContext {
        model: "claude-3-5-haiku".into(),
        stop_sequences: vec!["END".into()],
        stream: true,
    }
}

fn chunk(delta: Value, finish: Value) -> String {
    let c = json!({"id":"chatcmpl-s1","object":"chat.completion.chunk","created":1,
                   "model":"Qwen/Qwen3-0.6B",
                   "choices":[{"index":0,"delta":delta,"finish_reason":finish}]});
    format!("data: {c}\n\n")
}

/// A vLLM/Dynamo-shaped stream: text, two tool calls (arguments split), usage chunk, [DONE].
fn tool_stream() -> Vec<u8> {
    let mut s = String::new();
    s += &chunk(json!({"role":"assistant","content":""}), Value::Null);
    s += &chunk(json!({"content":"Let me "}), Value::Null);
    s += &chunk(json!({"content":"check."}), Value::Null);
    s += &chunk(
        json!({"tool_calls":[{"index":0,"id":"call_a","type":"function",
                              "function":{"name":"get_weather","arguments":""}}]}),
        Value::Null,
    );
    s += &chunk(
        json!({"tool_calls":[{"index":0,"function":{"arguments":"{\"location\":"}}]}),
        Value::Null,
    );
    s += &chunk(
        json!({"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}),
        Value::Null,
    );
    s += &chunk(
        json!({"tool_calls":[{"index":1,"id":"call_b","type":"function",
                              "function":{"name":"get_time","arguments":"{}"}}]}),
        Value::Null,
    );
    s += &chunk(json!({}), json!("tool_calls"));
    s += "data: {\"id\":\"chatcmpl-s1\",\"object\":\"chat.completion.chunk\",\"created\":1,\
          \"model\":\"Qwen/Qwen3-0.6B\",\"choices\":[],\
          \"usage\":{\"prompt_tokens\":42,\"completion_tokens\":17,\"total_tokens\":59}}\r\n\r\n";
    s += "data: [DONE]\n\n";
    s.into_bytes()
}

fn run_whole(input: &[u8]) -> Vec<u8> {
    let mut st = AnthropicStream::new(ctx());
    let mut out = st.feed(input).unwrap();
    out.extend(st.finish().unwrap());
    assert!(st.is_done());
    out
}

#[test]
fn tool_stream_events() {
    let ev = parse_events(&run_whole(&tool_stream()));
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    for (n, d) in &ev {
        assert_eq!(d["type"], json!(n));
    }
    assert_eq!(
        ev[0].1["message"],
        json!({"id":"msg_s1","type":"message","role":"assistant","model":"claude-3-5-haiku",
               "content":[],"stop_reason":null,"stop_sequence":null,
               "usage":{"input_tokens":0,"output_tokens":0}})
    );
    assert_eq!(ev[1].1["content_block"], json!({"type":"text","text":""}));
    assert_eq!(
        ev[2].1["delta"],
        json!({"type":"text_delta","text":"Let me "})
    );
    assert_eq!(
        ev[5].1,
        json!({"type":"content_block_start","index":1,"content_block":
               {"type":"tool_use","id":"call_a","name":"get_weather","input":{}}})
    );
    assert_eq!(
        ev[6].1["delta"],
        json!({"type":"input_json_delta","partial_json":"{\"location\":"})
    );
    let joined: String = [&ev[6].1, &ev[7].1]
        .iter()
        .map(|e| e["delta"]["partial_json"].as_str().unwrap())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&joined).unwrap(),
        json!({"location":"Paris"})
    );
    assert_eq!(ev[9].1["index"], 2);
    assert_eq!(ev[9].1["content_block"]["id"], "call_b");
    assert_eq!(
        ev[12].1,
        json!({"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},
               "usage":{"input_tokens":42,"output_tokens":17}})
    );
}

#[test]
fn byte_by_byte_and_random_splits_are_identical() {
    let input = tool_stream();
    let whole = run_whole(&input);
    let mut st = AnthropicStream::new(ctx());
    let mut one = Vec::new();
    for b in &input {
        one.extend(st.feed(std::slice::from_ref(b)).unwrap());
    }
    one.extend(st.finish().unwrap());
    assert_eq!(one, whole);
    for seed in 1..40u64 {
        let mut st = AnthropicStream::new(ctx());
        let mut out = feed_split(&input, &splits(input.len(), seed), |b| st.feed(b).unwrap());
        out.extend(st.finish().unwrap());
        assert_eq!(out, whole, "seed {seed}");
    }
}

#[test]
fn every_stop_reason_streaming() {
    let cases = [
        ("stop", json!({}), "end_turn", Value::Null),
        ("length", json!({}), "max_tokens", Value::Null),
        ("content_filter", json!({}), "refusal", Value::Null),
        (
            "stop",
            json!({"stop_reason":"END"}),
            "stop_sequence",
            json!("END"),
        ),
    ];
    for (finish, extra, want, seq) in cases {
        let mut c = json!({"id":"chatcmpl-x","choices":[{"index":0,"delta":{"content":"hi"},
                          "finish_reason":finish}]});
        if let Value::Object(m) = extra {
            for (k, v) in m {
                c["choices"][0][k] = v;
            }
        }
        let input = format!("data: {c}\n\ndata: [DONE]\n\n");
        let ev = parse_events(&run_whole(input.as_bytes()));
        let md = &ev[ev.len() - 2].1;
        assert_eq!(md["delta"]["stop_reason"], want);
        assert_eq!(md["delta"]["stop_sequence"], seq);
        assert_eq!(md["usage"], json!({"input_tokens":0,"output_tokens":0}));
    }
}

#[test]
fn eof_without_done_after_finish_completes() {
    let input = chunk(json!({"content":"a"}), json!("stop"));
    let ev = parse_events(&run_whole(input.as_bytes()));
    assert_eq!(ev.last().unwrap().0, "message_stop");
}

#[test]
fn eof_before_finish_is_an_error_event() {
    let input = chunk(json!({"content":"a"}), Value::Null);
    let ev = parse_events(&run_whole(input.as_bytes()));
    let (name, body) = ev.last().unwrap();
    assert_eq!(name, "error");
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "api_error");
}

#[test]
fn empty_stream_done_only() {
    let ev = parse_events(&run_whole(b"data: [DONE]\n\n"));
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["message_start", "message_delta", "message_stop"]);
}

#[test]
fn in_stream_error_is_relayed_and_ends() {
    let mut input = chunk(json!({"content":"partial"}), Value::Null).into_bytes();
    input.extend_from_slice(
        b"event: error\ndata: {\"error\":{\"message\":\"Prefill worker ID required in Direct routing mode\"}}\n\n",
    );
    input.extend(chunk(json!({"content":"ignored"}), json!("stop")).into_bytes());
    let mut st = AnthropicStream::new(ctx());
    let mut out = st.feed(&input).unwrap();
    assert!(st.is_done());
    out.extend(st.finish().unwrap());
    let ev = parse_events(&out);
    let (name, body) = ev.last().unwrap();
    assert_eq!(name, "error");
    assert_eq!(
        body["error"]["message"],
        "Prefill worker ID required in Direct routing mode"
    );
    assert!(!ev.iter().any(|(n, _)| n == "message_stop"));
}

#[test]
fn cap_and_fail() {
    let mut st = AnthropicStream::with_cap(ctx(), 64);
    let big = chunk(json!({"content":"x".repeat(200)}), Value::Null);
    let err = st.feed(big.as_bytes()).unwrap_err();
    assert_eq!(err, IngressError::LineTooLong { cap: 64 });
    let out = st.fail(&ClassifiedError::from(&err));
    let ev = parse_events(&out);
    assert_eq!(ev[0].1["error"]["type"], "api_error");
    assert!(st.fail(&ClassifiedError::from(&err)).is_empty());
}

#[test]
fn interleaved_tool_deltas_rejected() {
    let mut s = chunk(
        json!({"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{"}}]}),
        Value::Null,
    );
    s += &chunk(
        json!({"tool_calls":[{"index":1,"id":"b","function":{"name":"g","arguments":"{"}}]}),
        Value::Null,
    );
    s += &chunk(
        json!({"tool_calls":[{"index":0,"function":{"arguments":"}"}}]}),
        Value::Null,
    );
    let mut st = AnthropicStream::new(ctx());
    assert!(matches!(
        st.feed(s.as_bytes()),
        Err(IngressError::MalformedUpstream(_))
    ));
}

#[test]
fn malformed_chunk() {
    let mut st = AnthropicStream::new(ctx());
    assert!(matches!(
        st.feed(b"data: {oops\n\n"),
        Err(IngressError::MalformedUpstream(_))
    ));
}

#[test]
fn text_after_tool_opens_a_new_block() {
    let mut s = chunk(
        json!({"tool_calls":[{"index":0,"id":"t","function":{"name":"f","arguments":"{}"}}]}),
        Value::Null,
    );
    s += &chunk(json!({"content":"after"}), json!("stop"));
    s += "data: [DONE]\n\n";
    let ev = parse_events(&run_whole(s.as_bytes()));
    let starts: Vec<(u64, &str)> = ev
        .iter()
        .filter(|(n, _)| n == "content_block_start")
        .map(|(_, d)| {
            (
                d["index"].as_u64().unwrap(),
                d["content_block"]["type"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(starts, [(0, "tool_use"), (1, "text")]);
    let stops = ev.iter().filter(|(n, _)| n == "content_block_stop").count();
    assert_eq!(stops, 2);
    assert_eq!(ev[ev.len() - 2].1["delta"]["stop_reason"], "tool_use");
}

/// Found by `fuzz/` (target `ingress`): a malformed event followed, in the same read, by a
/// non-UTF-8 one gave a different error (and lost the bytes converted before it) than the same
/// input split between the two. The output is a function of the whole input only.
#[test]
fn an_error_mid_batch_gives_the_same_output_however_the_input_is_split() {
    let mut input = chunk(json!({"role":"assistant","content":"Hi"}), Value::Null).into_bytes();
    input.extend_from_slice(b"data: {\"id\":\"x\",\"bad\"}]}\n\n");
    input.extend_from_slice(b"data: [D\x01\x00\xff\xff\n\n");
    let run = |parts: &[&[u8]]| {
        let mut st = AnthropicStream::new(ctx());
        let mut out = Vec::new();
        for p in parts {
            match st.feed(p) {
                Ok(b) => out.extend(b),
                Err(e) => {
                    out.extend(st.fail(&ClassifiedError::from(&e)));
                    return out;
                }
            }
        }
        out.extend(st.finish().unwrap());
        out
    };
    let whole = run(&[&input]);
    for cut in 0..=input.len() {
        assert_eq!(run(&[&input[..cut], &input[cut..]]), whole, "cut at {cut}");
    }
    let text = String::from_utf8_lossy(&whole);
    assert!(
        text.contains("\"Hi\""),
        "the text before the error is sent: {text}"
    );
    assert!(
        text.contains("SSE chunk"),
        "the first error is reported: {text}"
    );
}
