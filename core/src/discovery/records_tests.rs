//! Unit tests of record parsing (DISC-REC-02/03/05/07/13..18, LOAD-CHAN-04..08).

use serde_json::json;

use super::*;
use crate::discovery::fleet::Role;

#[test]
fn endpoint_record_of_the_design_document_parses() {
    let v = br#"{"type":"Endpoint","namespace":"dynamo","component":"prefill","endpoint":"generate","instance_id":7465265302745285,"transport":{"tcp":"10.0.0.4:31000/1a7f2b/dynamo/prefill/generate"},"device_type":"cuda","request_plane_codec":"msgpack"}"#;
    let r = parse_instance(v).unwrap();
    assert_eq!(r.instance_id, InstanceId::new(7_465_265_302_745_285));
    assert_eq!(r.component, "prefill");
    assert_eq!(r.endpoint, "generate");
    assert!(matches!(r.transport, Some(RequestTransport::Tcp(_))));
}

#[test]
fn endpoint_record_failures_are_typed() {
    assert_eq!(parse_instance(b"{not json"), Err(MalformedReason::Json));
    assert_eq!(parse_instance(b"[1]"), Err(MalformedReason::NotObject));
    assert_eq!(
        parse_instance(br#"{"component":"x"}"#),
        Err(MalformedReason::Id(IdError::Missing))
    );
    assert_eq!(
        parse_instance(br#"{"type":"Model","instance_id":1}"#),
        Err(MalformedReason::ForeignType("Model".into()))
    );
    // N-2: only the id is required; unknown fields are ignored.
    let r = parse_instance(br#"{"instance_id":"ff","future_field":{"x":[1]}}"#).unwrap();
    assert_eq!(r.instance_id, InstanceId::new(255));
    assert_eq!(r.component, "");
    assert_eq!(r.transport, None);
}

#[test]
fn model_record_of_the_design_document_parses() {
    let v = br#"{"type":"Model","namespace":"dynamo","component":"prefill","endpoint":"generate","instance_id":7465265302745285,"card_json":{"display_name":"Qwen/Qwen3-32B","worker_type":"Prefill","kv_cache_block_size":64,"runtime_config":{"total_kv_blocks":12000,"max_num_batched_tokens":8192,"max_num_seqs":256,"context_length":32768,"data_parallel_start_rank":0,"data_parallel_size":1,"disaggregated_endpoint":"dynamo/decode/generate"}}}"#;
    let r = parse_card(v, false).unwrap();
    let f = &r.fields;
    assert_eq!(f.display_name.as_deref(), Some("Qwen/Qwen3-32B"));
    assert_eq!(f.claim(), WorkerTypeClaim::Prefill);
    assert_eq!(f.block_size, Some(64));
    assert_eq!(f.capacity.total_kv_blocks, Some(12000));
    assert_eq!(f.capacity.max_num_batched_tokens, Some(8192));
    assert_eq!(f.capacity.max_num_seqs, Some(256));
    assert_eq!(f.capacity.context_length, Some(32768));
    assert_eq!(f.dp_start_rank, Some(0));
    assert_eq!(f.dp_size, Some(1));
    assert_eq!(
        f.disaggregated_endpoint,
        Some(DisaggregatedEndpoint::Path("dynamo/decode/generate".into()))
    );
    assert!(f.bad_fields.is_empty());
    assert!(!r.lora && !r.is_legacy() && r.has_card_json);
    assert!(r.card.is_some());
}

#[test]
fn bad_typed_fields_blank_only_themselves() {
    let card = json!({"display_name": 5, "worker_type": "decode", "kv_cache_block_size": "64",
                      "runtime_config": {"total_kv_blocks": -1, "max_num_seqs": 8,
                                         "data_parallel_size": 1e2,
                                         "disaggregated_endpoint": {"bootstrap_host": "h",
                                                                    "bootstrap_port": 7}}});
    let f = card_fields(&card);
    assert_eq!(f.display_name, None);
    assert_eq!(f.claim(), WorkerTypeClaim::Decode);
    assert_eq!(f.block_size, None);
    assert_eq!(f.capacity.total_kv_blocks, None);
    assert_eq!(f.capacity.max_num_seqs, Some(8));
    assert_eq!(f.dp_size, None);
    assert_eq!(
        f.bad_fields,
        vec![
            "display_name",
            "kv_cache_block_size",
            "total_kv_blocks",
            "data_parallel_size"
        ]
    );
    assert_eq!(
        f.disaggregated_endpoint,
        Some(DisaggregatedEndpoint::Bootstrap {
            host: Some("h".into()),
            port: Some(7)
        })
    );
    assert_eq!(card_fields(&json!([1])).bad_fields, vec!["card_json"]);
    assert_eq!(
        card_fields(&json!({"runtime_config": 3})).bad_fields,
        vec!["runtime_config"]
    );
}

#[test]
fn worker_type_strings_match_upstream_case_insensitively() {
    assert_eq!(worker_type_claim("Prefill"), WorkerTypeClaim::Prefill);
    assert_eq!(worker_type_claim("DECODE"), WorkerTypeClaim::Decode);
    assert_eq!(worker_type_claim("aggregated"), WorkerTypeClaim::Aggregated);
    assert_eq!(worker_type_claim("encode"), WorkerTypeClaim::Unrecognised);
    assert_eq!(
        worker_type_claim("prefill-ish"),
        WorkerTypeClaim::Unrecognised
    );
    assert_eq!(Role::Unknown.as_str(), "unknown");
}

#[test]
fn lora_is_detected_in_record_card_or_key() {
    let rec = br#"{"instance_id":1,"model_suffix":"adapter","card_json":{}}"#;
    assert!(parse_card(rec, false).unwrap().lora);
    let in_card = br#"{"instance_id":1,"card_json":{"model_suffix":"a"}}"#;
    assert!(parse_card(in_card, false).unwrap().lora);
    let empty = br#"{"instance_id":1,"model_suffix":"","card_json":{"model_suffix":""}}"#;
    assert!(!parse_card(empty, false).unwrap().lora);
    assert!(parse_card(br#"{"instance_id":1}"#, true).unwrap().lora);
}

#[test]
fn legacy_cards_and_stringified_cards() {
    let legacy = br#"{"instance_id":"1a","card_json":"{\"display_name\":\"m\"}"}"#;
    let r = parse_card(legacy, false).unwrap();
    assert!(r.is_legacy());
    assert_eq!(r.fields.display_name.as_deref(), Some("m"));
    let none = parse_card(
        br#"{"instance_id":1,"component":"c","endpoint":"generate"}"#,
        false,
    )
    .unwrap();
    assert!(!none.has_card_json && none.card.is_none());
}

#[test]
fn version_strings_are_collected() {
    let f = card_fields(&json!({"dynamo_version": "1.6.1", "release": "r", "version": 3}));
    assert_eq!(
        f.versions,
        vec![
            ("dynamo_version".to_owned(), "1.6.1".to_owned()),
            ("release".to_owned(), "r".to_owned())
        ]
    );
}

#[test]
fn oversized_opaque_card_is_dropped_but_fields_kept() {
    // The compact card is {"display_name":"m","worker_type":"decode","pad":"<n x>"}.
    let head = r#"{"display_name":"m","worker_type":"decode","pad":""}"#.len();
    let at = |n: usize| {
        let pad = "x".repeat(n);
        let card = json!({"display_name": "m", "worker_type": "decode", "pad": pad});
        let rec = json!({"instance_id": 1, "card_json": card}).to_string();
        parse_card(rec.as_bytes(), false).unwrap()
    };
    let exact = at(MAX_RETAINED_CARD_BYTES - head);
    assert!(exact.card.is_some() && !exact.card_dropped);
    let over = at(MAX_RETAINED_CARD_BYTES - head + 1);
    assert!(over.card.is_none() && over.card_dropped);
    assert_eq!(over.fields.claim(), WorkerTypeClaim::Decode);
    assert_eq!(over.fields.display_name.as_deref(), Some("m"));
}

#[test]
fn channel_record_of_the_design_document_subscribes() {
    let v = br#"{"type":"EventChannel","scope":{"kind":"endpoint","endpoint":{"namespace":"dynamo","component":"decode","name":"generate"}},"topic":"kv_metrics","instance_id":2046539,"transport":{"kind":"Zmq","config":{"endpoint":"tcp://10.0.0.7:41000"}}}"#;
    assert_eq!(
        classify_channel("kv_metrics", v),
        ChannelClass::Subscribe {
            family: Family::KvMetrics,
            publisher_id: PublisherId::new(2_046_539),
            tcp: TcpTarget {
                host: "10.0.0.7".into(),
                port: 41000
            },
        }
    );
}

fn chan(transport: serde_json::Value) -> Vec<u8> {
    json!({"type":"EventChannel","scope":{"kind":"namespace","name":"n"},"topic":"kv-events",
           "instance_id":"ab","transport":transport})
    .to_string()
    .into_bytes()
}

#[test]
fn channel_classes_follow_q20() {
    let unsupported = |t| ChannelClass::Unsupported(Unsupported::Transport(String::from(t)));
    let broker =
        chan(json!({"kind":"ZmqBroker","config":{"xsub_endpoints":[],"xpub_endpoints":[]}}));
    assert_eq!(
        classify_channel("kv-events", &broker),
        unsupported("ZmqBroker")
    );
    let nats = chan(json!({"kind":"Nats","config":{"subject_prefix":"x"}}));
    assert_eq!(classify_channel("kv-events", &nats), unsupported("Nats"));
    let odd = chan(json!({"kind":"Carrier","config":{}}));
    assert_eq!(classify_channel("kv-events", &odd), unsupported("Carrier"));
    let ipc = chan(json!({"kind":"Zmq","config":{"endpoint":"ipc:///tmp/x"}}));
    assert_eq!(
        classify_channel("kv-events", &ipc),
        ChannelClass::Malformed(MalformedReason::NotTcp)
    );
    let no_transport = br#"{"topic":"kv-events","instance_id":1}"#;
    assert_eq!(
        classify_channel("kv-events", no_transport),
        ChannelClass::Malformed(MalformedReason::NoTransport)
    );
    let no_id =
        br#"{"topic":"kv-events","transport":{"kind":"Zmq","config":{"endpoint":"tcp://h:1"}}}"#;
    assert_eq!(
        classify_channel("kv-events", no_id),
        ChannelClass::Malformed(MalformedReason::Id(IdError::Missing))
    );
    let scope = br#"{"scope":{"kind":"galaxy"},"instance_id":1}"#;
    assert_eq!(
        classify_channel("kv_metrics", scope),
        ChannelClass::Unsupported(Unsupported::ScopeKind("galaxy".into()))
    );
    let topic = br#"{"topic":"kv-events","instance_id":1}"#;
    assert_eq!(
        classify_channel("kv_metrics", topic),
        ChannelClass::Malformed(MalformedReason::TopicMismatch)
    );
    // Unsubscribed topics are silent even when the value is garbage.
    assert_eq!(
        classify_channel("active_sequences_events", b"\xff"),
        ChannelClass::Silent
    );
    assert_eq!(
        classify_channel("forward-pass-metrics", b"{}"),
        ChannelClass::Silent
    );
}

#[test]
fn tcp_endpoints_parse_strictly() {
    let ok = |s: &str, h: &str, p: u16| {
        assert_eq!(
            parse_tcp(s),
            Some(TcpTarget {
                host: h.into(),
                port: p
            }),
            "{s}"
        );
    };
    ok("tcp://127.0.0.1:45827", "127.0.0.1", 45827);
    ok("tcp://[::1]:5", "::1", 5);
    ok("tcp://worker-0.svc:65535", "worker-0.svc", 65535);
    for bad in [
        "tcp://*:5555",
        "tcp://h:0",
        "tcp://h:65536",
        "tcp://h",
        "tcp://:1",
        "tcp://h:+1",
        "tcp://::1:5",
        "TCP://h:1",
        "tcp://h:1/x",
        "udp://h:1",
        "",
        "tcp://[::1]5",
    ] {
        assert_eq!(parse_tcp(bad), None, "{bad}");
    }
}
