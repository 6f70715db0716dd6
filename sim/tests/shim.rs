//! The shim's pin contract, case by case, against the answers of the real
//! `dynamo.frontend --router-mode direct` 1.6.1 (`shared/fixtures/README.md`), buffered and
//! streamed; and that only served requests count as picks.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::TcpStream;

use common::{Resp, chat, request};
use continuum_sim::{
    DP_RANK_HEADER, FAILED_TO_GENERATE, LatencyModel, PREFILL_DP_RANK_HEADER, PREFILL_HEADER, Role,
    SimFleet, SimSpec, WORKER_HEADER,
};

const AGG: &str = "demo-agg";
const DISAGG: &str = "demo-disagg";
const DP: &str = "demo-dp";

fn fleet() -> SimFleet {
    SimFleet::start(
        SimSpec::builder()
            .namespace("demo")
            .aggregated(AGG, 2)
            .disaggregated(DISAGG, 1, 2)
            .aggregated(DP, 1)
            .dp_size(2)
            .latency(LatencyModel::ZERO)
            .completion_tokens(4)
            .build(),
    )
    .unwrap()
}

fn assert_invalid(r: &Resp, what: &str) {
    assert_eq!(r.status, 400, "{what}: {}", r.text());
    assert_eq!(
        r.json(),
        serde_json::json!({"message": "Invalid request", "type": "Bad Request", "code": 400}),
        "{what}"
    );
}

fn assert_failed(r: &Resp, what: &str) {
    assert_eq!(r.status, 500, "{what}: {}", r.text());
    let v = r.json();
    assert_eq!(
        (v["message"].as_str(), v["code"].as_u64()),
        (Some(FAILED_TO_GENERATE), Some(500)),
        "{what}"
    );
}

fn assert_completion(r: &Resp, model: &str, what: &str) {
    assert_eq!(r.status, 200, "{what}: {}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"), "{what}");
    let v = r.json();
    assert_eq!(v["object"], "chat.completion", "{what}");
    assert_eq!(v["model"], model, "{what}");
    assert_eq!(
        v["choices"][0]["message"]["content"], "The simulated fleet answers",
        "{what}"
    );
    assert_eq!(v["usage"]["completion_tokens"], 4, "{what}");
}

fn assert_stream(r: &Resp, what: &str) {
    assert_eq!(r.status, 200, "{what}: {}", r.text());
    assert_eq!(
        r.header("content-type"),
        Some("text/event-stream"),
        "{what}"
    );
    let text = r.text();
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("{what}: {e:?}"))
        })
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{what}: {text}");
    let chunks: Vec<serde_json::Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "The simulated fleet answers", "{what}");
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk"),
        "{what}"
    );
    // include_usage: a last chunk with no choices and the usage.
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], serde_json::json!([]), "{what}");
    assert_eq!(usage["usage"]["completion_tokens"], 4, "{what}");
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        "stop",
        "{what}"
    );
}

fn id(fleet: &SimFleet, model: &str, role: Role) -> String {
    fleet.workers_of(model, role)[0].instance_id.to_string()
}

#[test]
fn aggregated_pins() {
    let fleet = fleet();
    let shim = fleet.shim_addr("demo").unwrap();
    let agg = fleet.workers_of(AGG, Role::Aggregated)[0].clone();
    let dec = agg.instance_id.to_string();
    for stream in [false, true] {
        let ok = chat(shim, AGG, stream, &[(WORKER_HEADER, &dec)]);
        if stream {
            assert_stream(&ok, "agg stream, decimal id");
        } else {
            assert_completion(&ok, AGG, "agg, decimal id");
        }
        let hex = agg.instance_id.hex();
        let hex0x = format!("0x{hex}");
        let other_model = id(&fleet, DISAGG, Role::Decode);
        let unknown = (agg.instance_id.get() ^ 0xffff).to_string();
        for (value, what) in [
            (None, "no id"),
            (Some(hex.as_str()), "hex id"),
            (Some(hex0x.as_str()), "0x id"),
            (Some("worker-1"), "garbage id"),
            (Some(""), "empty id"),
            (Some("-1"), "negative id"),
            (Some("18446744073709551616"), "id past u64"),
            (Some(unknown.as_str()), "unknown id"),
            (Some(other_model.as_str()), "another model's worker"),
        ] {
            let headers: Vec<(&str, &str)> =
                value.map(|v| (WORKER_HEADER, v)).into_iter().collect();
            // JSON even for stream: true.
            assert_invalid(
                &chat(shim, AGG, stream, &headers),
                &format!("agg stream={stream}, {what}"),
            );
        }
        // A prefill pin on an aggregated model is ignored.
        let p = id(&fleet, DISAGG, Role::Prefill);
        let r = chat(
            shim,
            AGG,
            stream,
            &[(WORKER_HEADER, &dec), (PREFILL_HEADER, &p)],
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let r = chat(shim, "no-such-model", false, &[(WORKER_HEADER, &dec)]);
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.json()["code"], 404);

    // Served requests are picks; rejected ones are not.
    let picks = |f: &SimFleet| {
        f.stats()
            .iter()
            .find(|s| s.info.instance_id == agg.instance_id)
            .unwrap()
            .picks
    };
    assert_eq!(picks(&fleet), 4);

    // A killed worker's pin is refused like an unknown one.
    fleet.kill(agg.instance_id).unwrap();
    assert_invalid(
        &chat(shim, AGG, false, &[(WORKER_HEADER, &dec)]),
        "killed worker",
    );
    assert_eq!(picks(&fleet), 4);
}

#[test]
fn disaggregated_pins() {
    let fleet = fleet();
    let shim = fleet.shim_addr("demo").unwrap();
    let d = id(&fleet, DISAGG, Role::Decode);
    let p = id(&fleet, DISAGG, Role::Prefill);
    let p_hex = fleet.workers_of(DISAGG, Role::Prefill)[0].instance_id.hex();
    let agg = id(&fleet, AGG, Role::Aggregated);
    for stream in [false, true] {
        let ok = chat(
            shim,
            DISAGG,
            stream,
            &[(WORKER_HEADER, &d), (PREFILL_HEADER, &p)],
        );
        if stream {
            assert_stream(&ok, "disagg stream");
        } else {
            assert_completion(&ok, DISAGG, "disagg");
        }
        let s = format!("stream={stream}");
        assert_failed(
            &chat(shim, DISAGG, stream, &[(WORKER_HEADER, &d)]),
            &format!("{s}, decode only"),
        );
        assert_failed(&chat(shim, DISAGG, stream, &[]), &format!("{s}, no pins"));
        // A prefill id in hex is not read as one: with a hex letter it is no id at all (ignored,
        // as 1.6.1's parse); all digits, it is the decimal id of no worker (invalid). Fleet ids are
        // random, so the hex form of one is all digits now and then.
        let hex_pin = chat(
            shim,
            DISAGG,
            stream,
            &[(WORKER_HEADER, &d), (PREFILL_HEADER, &p_hex)],
        );
        if p_hex.bytes().all(|b| b.is_ascii_digit()) {
            assert_invalid(&hex_pin, &format!("{s}, all-digit hex prefill id"));
        } else {
            assert_failed(&hex_pin, &format!("{s}, hex prefill id (ignored)"));
        }
        for (decode, prefill, what) in [
            (p.as_str(), d.as_str(), "swapped ids"),
            (d.as_str(), "12345", "unknown prefill"),
            (d.as_str(), agg.as_str(), "aggregated worker as prefill"),
            ("12345", p.as_str(), "unknown decode"),
            (agg.as_str(), p.as_str(), "another model's worker as decode"),
        ] {
            let r = chat(
                shim,
                DISAGG,
                stream,
                &[(WORKER_HEADER, decode), (PREFILL_HEADER, prefill)],
            );
            assert_invalid(&r, &format!("{s}, {what}"));
        }
        assert_invalid(
            &chat(shim, DISAGG, stream, &[(PREFILL_HEADER, &p)]),
            &format!("{s}, prefill only"),
        );
    }
    let stats = fleet.stats();
    let picks = |id: &str| {
        stats
            .iter()
            .find(|s| s.info.instance_id.to_string() == id)
            .unwrap()
            .picks
    };
    assert_eq!((picks(&d), picks(&p)), (2, 2));
    assert!(stats.iter().all(|s| s.active == 0));
}

#[test]
fn data_parallel_ranks() {
    let fleet = fleet();
    let shim = fleet.shim_addr("demo").unwrap();
    let w = id(&fleet, DP, Role::Aggregated);
    for (rank, ok) in [
        (None, true),
        (Some("0"), true),
        (Some("1"), true),
        (Some("2"), false),
        (Some("x"), false),
        (Some("0x1"), false),
    ] {
        let mut headers = vec![(WORKER_HEADER, w.as_str())];
        headers.extend(rank.map(|r| (DP_RANK_HEADER, r)));
        let r = chat(shim, DP, false, &headers);
        if ok {
            assert_completion(&r, DP, &format!("rank {rank:?}"));
        } else {
            assert_invalid(&r, &format!("rank {rank:?}"));
        }
    }
    // The prefill rank header is checked against the prefill worker (dp_size 1: only 0).
    let d = id(&fleet, DISAGG, Role::Decode);
    let p = id(&fleet, DISAGG, Role::Prefill);
    let r = chat(
        shim,
        DISAGG,
        false,
        &[
            (WORKER_HEADER, &d),
            (PREFILL_HEADER, &p),
            (PREFILL_DP_RANK_HEADER, "0"),
        ],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = chat(
        shim,
        DISAGG,
        false,
        &[
            (WORKER_HEADER, &d),
            (PREFILL_HEADER, &p),
            (PREFILL_DP_RANK_HEADER, "1"),
        ],
    );
    assert_invalid(&r, "prefill rank 1 of 1");
}

#[test]
fn models_responses_and_keep_alive() {
    let fleet = fleet();
    let shim = fleet.shim_addr("demo").unwrap();
    let models = request(shim, "GET", "/v1/models", &[], b"").json();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [AGG, DISAGG, DP]);
    assert_eq!(request(shim, "GET", "/health", &[], b"").status, 200);
    assert_eq!(request(shim, "GET", "/nope", &[], b"").status, 404);
    assert_eq!(
        request(shim, "GET", "/v1/chat/completions", &[], b"").status,
        405
    );
    assert_invalid(
        &request(shim, "POST", "/v1/chat/completions", &[], b"not json"),
        "not JSON",
    );

    // The Responses API, buffered and streamed, under the same pins.
    let w = id(&fleet, AGG, Role::Aggregated);
    let body = format!(r#"{{"model":"{AGG}","input":"hi","max_output_tokens":2}}"#);
    let r = request(
        shim,
        "POST",
        "/v1/responses",
        &[(WORKER_HEADER, &w)],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(
        (v["object"].as_str(), v["status"].as_str()),
        (Some("response"), Some("completed"))
    );
    assert_eq!(v["output"][0]["content"][0]["text"], "The simulated");
    let body = format!(r#"{{"model":"{AGG}","input":"hi","stream":true}}"#);
    let r = request(
        shim,
        "POST",
        "/v1/responses",
        &[(WORKER_HEADER, &w)],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200);
    let text = r.text();
    assert!(text.starts_with("event: response.created\n"), "{text}");
    assert!(
        text.trim_end().lines().rev().nth(1) == Some("event: response.completed"),
        "{text}"
    );
    assert_invalid(
        &request(shim, "POST", "/v1/responses", &[], body.as_bytes()),
        "responses, no pin",
    );

    // Two requests on one keep-alive connection, the second one chunked.
    let mut conn = TcpStream::connect(shim).unwrap();
    let body = common::chat_body(AGG, false);
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: sim\r\n{WORKER_HEADER}: {w}\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    assert_completion(
        &common::exchange(&mut conn, &head, &body),
        AGG,
        "first on the connection",
    );
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: sim\r\n{WORKER_HEADER}: {w}\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    let mut chunked = format!("{:x}\r\n", body.len()).into_bytes();
    chunked.extend_from_slice(&body);
    chunked.extend_from_slice(b"\r\n0\r\n\r\n");
    assert_completion(
        &common::exchange(&mut conn, &head, &chunked),
        AGG,
        "second, chunked",
    );
}

#[test]
fn max_tokens_limits_the_completion() {
    let fleet = fleet();
    let shim = fleet.shim_addr("demo").unwrap();
    let w = id(&fleet, AGG, Role::Aggregated);
    let body = format!(r#"{{"model":"{AGG}","messages":[],"max_tokens":1}}"#);
    let r = request(
        shim,
        "POST",
        "/v1/chat/completions",
        &[(WORKER_HEADER, &w)],
        body.as_bytes(),
    );
    let v = r.json();
    assert_eq!(v["choices"][0]["message"]["content"], "The");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}
