//! Unit tests of `core::ingress`: responses stream.
use serde_json::{Value, json};

use super::{feed_split, parse_events, splits};
use crate::ingress::responses::ResponsesContext;
use crate::ingress::responses_stream::ResponsesStream;

fn ctx() -> ResponsesContext {
    ResponsesContext {
        model: "gpt-4.1".into(),
        stream: true,
        echo: serde_json::Map::new(),
    }
}

fn chunk(delta: Value, finish: Value) -> String {
    let c = json!({"id":"chatcmpl-z","object":"chat.completion.chunk","created":5,"model":"q",
                   "choices":[{"index":0,"delta":delta,"finish_reason":finish}]});
    format!("data: {c}\n\n")
}

fn input() -> Vec<u8> {
    let mut s = String::new();
    s += &chunk(json!({"role":"assistant","content":""}), Value::Null);
    s += &chunk(json!({"content":"Hel"}), Value::Null);
    s += &chunk(json!({"content":"lo"}), Value::Null);
    s += &chunk(
        json!({"tool_calls":[{"index":0,"id":"call_1","function":{"name":"f","arguments":"{\"a\""}}]}),
        Value::Null,
    );
    s += &chunk(
        json!({"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]}),
        Value::Null,
    );
    s += &chunk(json!({}), json!("tool_calls"));
    s += "data: {\"id\":\"chatcmpl-z\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\n";
    s += "data: [DONE]\n\n";
    s.into_bytes()
}

fn run(input: &[u8]) -> Vec<u8> {
    let mut st = ResponsesStream::new(ctx());
    let mut out = st.feed(input).unwrap();
    out.extend(st.finish().unwrap());
    out
}

#[test]
fn event_sequence() {
    let ev = parse_events(&run(&input()));
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, (n, d)) in ev.iter().enumerate() {
        assert_eq!(d["type"], json!(n));
        assert_eq!(d["sequence_number"], i);
    }
    assert_eq!(ev[0].1["response"]["status"], "in_progress");
    assert_eq!(ev[4].1["delta"], "Hel");
    assert_eq!(ev[4].1["item_id"], "msg_z");
    assert_eq!(ev[6].1["text"], "Hello");
    assert_eq!(ev[9].1["output_index"], 1);
    assert_eq!(ev[12].1["arguments"], "{\"a\":1}");
    let done = &ev[14].1["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["content"][0]["text"], "Hello");
    assert_eq!(done["output"][1]["call_id"], "call_1");
    assert_eq!(done["usage"]["total_tokens"], 7);
}

#[test]
fn splits_are_identical() {
    let inp = input();
    let whole = run(&inp);
    for seed in 1..30u64 {
        let mut st = ResponsesStream::new(ctx());
        let mut out = feed_split(&inp, &splits(inp.len(), seed), |b| st.feed(b).unwrap());
        out.extend(st.finish().unwrap());
        assert_eq!(out, whole, "seed {seed}");
    }
}

#[test]
fn length_is_incomplete_and_error_fails() {
    let s = chunk(json!({"content":"x"}), json!("length")) + "data: [DONE]\n\n";
    let ev = parse_events(&run(s.as_bytes()));
    assert_eq!(ev.last().unwrap().0, "response.incomplete");
    assert_eq!(
        ev.last().unwrap().1["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );

    let s =
        chunk(json!({"content":"x"}), Value::Null) + "data: {\"error\":{\"message\":\"boom\"}}\n\n";
    let ev = parse_events(&run(s.as_bytes()));
    let n = ev.len();
    assert_eq!(ev[n - 2].0, "error");
    assert_eq!(ev[n - 2].1["message"], "boom");
    assert_eq!(ev[n - 1].0, "response.failed");
    assert_eq!(ev[n - 1].1["response"]["status"], "failed");
}

#[test]
fn message_items_have_distinct_ids() {
    let mut s = chunk(json!({"content":"a"}), Value::Null);
    s += &chunk(
        json!({"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":"{}"}}]}),
        Value::Null,
    );
    s += &chunk(json!({"content":"b"}), json!("stop"));
    s += "data: [DONE]\n\n";
    let ev = parse_events(&run(s.as_bytes()));
    let done = &ev.last().unwrap().1["response"]["output"];
    assert_eq!(done[0]["id"], "msg_z");
    assert_eq!(done[1]["id"], "fc_z_0");
    assert_eq!(done[2]["id"], "msg_z_1");
    assert_eq!(done[2]["content"][0]["text"], "b");
    let deltas: Vec<&Value> = ev
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| &d["item_id"])
        .collect();
    assert_eq!(deltas, [&json!("msg_z"), &json!("msg_z_1")]);
}
